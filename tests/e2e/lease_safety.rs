//! End-to-end: a Lease is judged with its elector's own timing, on the real
//! control plane with real client-go candidates (`testenv/peers`) at
//! OpenShift's library-go timings (lease 137 s, renew deadline 107 s, retry
//! 26 s). A holder that still renews under the identity of a dead pod keeps
//! its Lease; a dead one loses it once it has missed its own renewals.
//! Leases that are nobody's application lock are never written, a release
//! writes what client-go's release writes, and `--delete-pod` deletes only a
//! pod the Lease names by name. Each is checked against the audit log.

use std::time::{Duration, Instant};

use crate::support::lease::*;
use crate::support::*;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::Api;
use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testenv::kubelet;
use lock_janitor_testenv::peers::Peer;

/// OpenShift's library-go defaults: lease, renew deadline, retry period.
const LIBRARY_GO: [Duration; 3] = [
    Duration::from_secs(137),
    Duration::from_secs(107),
    Duration::from_secs(26),
];
/// A candidate with the same lease that retries every 2 s.
const EAGER: [Duration; 3] = [
    Duration::from_secs(137),
    Duration::from_secs(107),
    Duration::from_secs(2),
];

/// The leader's pod is marked Failed while its process, elsewhere, goes on
/// renewing the Lease every 26 s under the same identity. The janitor must
/// not release it: a second candidate (2 s retry) never leads, and the
/// audit log shows no write of the janitor. (Released 5 s after the death
/// before the renewal rule followed the holder's own period.)
#[tokio::test]
async fn a_slow_renewer_under_a_dead_pods_identity_keeps_its_lease() {
    let s = scenario("slow-renewer").await;
    s.pod("op-a").await;
    s.pod("op-b").await;
    let kc = s.cp.kubeconfig_path();
    let mut a =
        Peer::elect_with(kc, s.cp.dir(), &s.ns, "op-a", "op-lease", LIBRARY_GO).expect("peer a");
    a.wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    s.label("op-lease").await;
    let j = s.janitor().await;
    let b = Peer::elect_with(kc, s.cp.dir(), &s.ns, "op-b", "op-lease", EAGER).expect("peer b");
    wait_for("op-b trying", Duration::from_secs(30), || async {
        b.logs()
            .contains("Attempting to acquire leader lease")
            .then_some(())
    })
    .await;

    // The pod object says Failed; the process (outside this pod) renews on.
    kubelet::set_failed(&s.client, &s.ns, "op-a", "Evicted", "test")
        .await
        .unwrap();
    let died = Timestamp::now();
    // Two renewals after the death: past any window the janitor could have
    // used had it ignored them (26 s and 52 s later).
    let last = s
        .renewed_times("op-lease", 2, Duration::from_secs(90))
        .await;
    assert!(last > died, "renewed after the death");
    // And one of the janitor's own judgements after that.
    let sweeps = j.logs().matches("resync sweep done").count();
    wait_for(
        "a sweep after the renewals",
        Duration::from_secs(30),
        || async { (j.logs().matches("resync sweep done").count() > sweeps + 1).then_some(()) },
    )
    .await;

    assert!(
        s.lease_writes().is_empty(),
        "the janitor wrote the Lease of a live renewer: {:#?}\n{}",
        s.lease_writes(),
        j.logs()
    );
    assert!(!b.is_leading(), "a second leader: {}", b.logs());
    assert!(a.is_leading(), "{}", a.logs());
    assert!(s.identity("op-lease").await.starts_with("op-a_"));
    let m = j.metrics().await;
    assert_eq!(
        sample(
            &m,
            "lock_janitor_reclaims_total",
            &[("kind", "lease"), ("lock", "op-lease")]
        ),
        None,
        "{m}"
    );
}

/// The same timings with the holder really dead (its process killed when
/// its pod fails): the janitor releases the Lease once the holder has
/// missed 2.5 of its 26 s renew periods since its last renewal, and the
/// waiting candidate leads long before the 137 s lease runs out (alone, it
/// would wait for the whole lease after the last renewal).
#[tokio::test]
async fn a_dead_slow_renewer_is_released_once_it_missed_its_renewals() {
    let s = scenario("dead-slow-renewer").await;
    s.pod("op-a").await;
    s.pod("op-b").await;
    let kc = s.cp.kubeconfig_path();
    let mut a =
        Peer::elect_with(kc, s.cp.dir(), &s.ns, "op-a", "op-lease", LIBRARY_GO).expect("peer a");
    a.wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    s.label("op-lease").await;
    let j = s.janitor().await;
    let mut b = Peer::elect_with(kc, s.cp.dir(), &s.ns, "op-b", "op-lease", EAGER).expect("peer b");
    // The janitor sees two renewals: it has learnt the 26 s period.
    s.renewed_times("op-lease", 2, Duration::from_secs(90))
        .await;

    a.kill();
    let last_renewal = s.renew_time("op-lease").await.expect("renewed");
    kubelet::set_failed(&s.client, &s.ns, "op-a", "Evicted", "test")
        .await
        .unwrap();
    let died = Instant::now();
    b.wait_leading(Duration::from_secs(137))
        .await
        .unwrap_or_else(|e| panic!("{e}\njanitor:\n{}", j.logs()));
    let took = died.elapsed();
    eprintln!(
        "op-b leads {:.1}s after op-a's death (library-go timings, lease 137 s)",
        took.as_secs_f64()
    );
    assert!(
        took <= Duration::from_secs(90),
        "took {took:?}\n{}",
        j.logs()
    );

    // One release, made after the holder had missed its renewals: 2.5 x
    // 26 s after its last one.
    let writes = s.lease_writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(
        (writes[0].verb.as_str(), writes[0].code),
        ("update", Some(200))
    );
    let released: Timestamp = writes[0]
        .received
        .as_deref()
        .expect("timestamp")
        .parse()
        .unwrap();
    let waited = released.duration_since(last_renewal);
    assert!(
        waited >= SignedDuration::from_secs(64),
        "released {waited:?} after the last renewal"
    );
}

/// Leases that are nobody's application lock, even opted in and naming a
/// dead pod: Coordinated Leader Election (spec.strategy), a node heartbeat
/// in kube-node-lease, an API server identity in kube-system, and a held
/// Lease without renewTime. Reported unmanageable with their reason word,
/// never written; a plain stale Lease beside them is released, with the
/// body client-go's release sends (the audit log's request).
#[tokio::test]
async fn leases_that_are_no_application_lock_are_never_written() {
    let s = scenario("never-touched").await;
    let suffix = s.ns.clone();
    let node_ns = "kube-node-lease";
    let sys_ns = "kube-system";
    let heartbeat = format!("hb-{suffix}");
    let identity_lease = format!("apiserver-{suffix}");
    let identity_pod = format!("idp-{suffix}");
    for (ns, pod) in [
        (s.ns.as_str(), "op-c"),
        (s.ns.as_str(), "op-d"),
        (s.ns.as_str(), "op-e"),
        (node_ns, heartbeat.as_str()),
        (sys_ns, identity_pod.as_str()),
    ] {
        running_pod(&s.client, ns, pod, &s.node).await;
    }
    let at = MicroTime(Timestamp::now());
    let labeled = || {
        Some(
            [(WATCH_LABEL.0.to_string(), WATCH_LABEL.1.to_string())]
                .into_iter()
                .collect(),
        )
    };
    let create = |ns: &str, name: &str, spec: LeaseSpec| {
        let api: Api<Lease> = Api::namespaced(s.client.clone(), ns);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: labeled(),
                ..Default::default()
            },
            spec: Some(spec),
        };
        let name = name.to_owned();
        async move {
            api.create(&PostParams::default(), &lease)
                .await
                .unwrap_or_else(|e| panic!("create lease {name}: {e}"))
        }
    };
    let held = |identity: &str| LeaseSpec {
        holder_identity: Some(identity.into()),
        lease_duration_seconds: Some(10),
        acquire_time: Some(at.clone()),
        renew_time: Some(at.clone()),
        lease_transitions: Some(3),
        ..Default::default()
    };
    let cle = create(
        &s.ns,
        "cle",
        LeaseSpec {
            strategy: Some("OldestEmulationVersion".into()),
            preferred_holder: Some("op-e".into()),
            ..held("op-c")
        },
    )
    .await;
    assert_eq!(
        cle.spec.as_ref().and_then(|s| s.strategy.as_deref()),
        Some("OldestEmulationVersion"),
        "the API server keeps spec.strategy (CoordinatedLeaderElection gate)"
    );
    create(
        &s.ns,
        "no-renew",
        LeaseSpec {
            renew_time: None,
            ..held("op-d")
        },
    )
    .await;
    create(&s.ns, "plain", held("op-e")).await;
    create(node_ns, &heartbeat, held(&heartbeat)).await;
    create(sys_ns, &identity_lease, held(&identity_pod)).await;
    for (ns, pod) in [
        (s.ns.as_str(), "op-c"),
        (s.ns.as_str(), "op-d"),
        (s.ns.as_str(), "op-e"),
        (node_ns, heartbeat.as_str()),
        (sys_ns, identity_pod.as_str()),
    ] {
        kubelet::set_failed(&s.client, ns, pod, "Evicted", "test")
            .await
            .unwrap();
    }

    let kc = kubeconfig_as(s.cp, JANITOR_USER);
    let j = Janitor::start(
        &kc,
        &[
            "--namespace",
            &s.ns,
            "--namespace",
            node_ns,
            "--namespace",
            sys_ns,
            "--resync",
            "2s",
            "--lock-kinds",
            "lease",
        ],
    )
    .await;
    wait_for("plain released", Duration::from_secs(30), || async {
        s.identity("plain").await.is_empty().then_some(())
    })
    .await;
    for (ns, name, word) in [
        (s.ns.as_str(), "cle", "CoordinatedLeaderElection"),
        (s.ns.as_str(), "no-renew", "NoRenewTime"),
        (node_ns, heartbeat.as_str(), "NodeHeartbeat"),
        (sys_ns, identity_lease.as_str(), "ApiServerIdentity"),
    ] {
        let ev = wait_event(&s.client, ns, "UnmanageableLock", name).await;
        let note = ev.note.unwrap_or_default();
        assert!(note.contains(&format!("({word})")), "{name}: {note}");
    }
    // A few more judgements, then the audit log: one write, the release.
    let sweeps = j.logs().matches("resync sweep done").count();
    wait_for("two more lease sweeps", Duration::from_secs(30), || async {
        (j.logs().matches("resync sweep done").count() >= sweeps + 6).then_some(())
    })
    .await;
    let writes: Vec<AuditEvent> = lock_janitor_testenv::audit::read(s.cp.audit_log_path())
        .into_iter()
        .filter(|e| {
            e.effective_user() == JANITOR_USER
                && e.resource.as_deref() == Some("leases")
                && [s.ns.as_str(), node_ns, sys_ns].contains(&e.namespace.as_deref().unwrap_or(""))
                && !matches!(e.verb.as_str(), "get" | "list" | "watch")
        })
        .collect();
    let names: Vec<&str> = writes.iter().filter_map(|e| e.name.as_deref()).collect();
    assert_eq!(names, ["plain"], "{writes:#?}");
    // client-go's release, whole: exactly these spec fields (no holder at
    // all: the Java client takes only that at once), the transitions kept,
    // metadata (labels) as it was.
    let body = writes[0].request_object.as_ref().expect("request body");
    let spec = body["spec"].as_object().expect("spec");
    let mut keys: Vec<&str> = spec.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "acquireTime",
            "leaseDurationSeconds",
            "leaseTransitions",
            "renewTime"
        ],
        "{body}"
    );
    assert_eq!(spec.get("holderIdentity"), None);
    assert_eq!(spec["leaseDurationSeconds"], 1);
    assert_eq!(spec["leaseTransitions"], 3);
    assert_eq!(body["metadata"]["labels"][WATCH_LABEL.0], WATCH_LABEL.1);
    // The others are as they were.
    let cle_now = s.leases().get("cle").await.unwrap().spec.unwrap();
    assert_eq!(cle_now.holder_identity.as_deref(), Some("op-c"));
    assert_eq!(cle_now.preferred_holder.as_deref(), Some("op-e"));
}

/// `--delete-pod` after a Lease release deletes the dead pod only when the
/// Lease names it by its pod name; a pod matched by its spec.hostname alone
/// may be another app's, and stays.
#[tokio::test]
async fn delete_pod_deletes_only_a_pod_named_by_the_lease() {
    let s = scenario("lease-delete-pod").await;
    s.pod("named").await;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let by_host: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "other-app", "namespace": s.ns},
        "spec": {"nodeName": s.node, "hostname": "host-x",
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &by_host).await.unwrap();
    kubelet::set_running(&s.client, &s.ns, "other-app")
        .await
        .unwrap();
    s.lease_lasting("l-named", "named", 1, 10, true).await;
    s.lease_lasting("l-host", "host-x", 1, 10, true).await;
    for pod in ["named", "other-app"] {
        kubelet::set_failed(&s.client, &s.ns, pod, "Evicted", "test")
            .await
            .unwrap();
    }
    let kc = kubeconfig_as(s.cp, JANITOR_USER);
    let j = Janitor::start(
        &kc,
        &[
            "--namespace",
            &s.ns,
            "--resync",
            "2s",
            "--lock-kinds",
            "lease",
            "--delete-pod",
        ],
    )
    .await;
    for l in ["l-named", "l-host"] {
        wait_for(
            &format!("{l} released"),
            Duration::from_secs(30),
            || async { s.identity(l).await.is_empty().then_some(()) },
        )
        .await;
    }
    wait_for("the named pod deleted", Duration::from_secs(30), || async {
        pods.get_opt("named")
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    let p = pods.get("other-app").await.expect("other-app stays");
    assert!(p.metadata.deletion_timestamp.is_none());
    assert!(
        j.logs().contains("matched the Lease by hostname only"),
        "{}",
        j.logs()
    );
    let deletes = writes_by(s.cp, JANITOR_USER, &s.ns)
        .into_iter()
        .filter(|e| e.resource.as_deref() == Some("pods") && e.verb == "delete")
        .filter_map(|e| e.name)
        .collect::<Vec<_>>();
    assert_eq!(deletes, ["named"]);
}
