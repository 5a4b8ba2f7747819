//! End-to-end: Lease locks on the real control plane. A real candidate
//! (controller-runtime's Lease lock driven by client-go's elector, in
//! `testenv/peers`) with a 60 s lease leads within seconds of its leader's
//! death with the janitor; every verdict row on the real API server; and the
//! audit log shows the janitor never updates a Lease whose holder may run,
//! never deletes one, and never releases one that changed after it was
//! judged.

use std::time::{Duration, Instant};

use crate::support::lease::*;
use crate::support::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use lock_janitor_testenv::kubelet;
use lock_janitor_testenv::peers::Peer;

/// The leader's pod is evicted: the janitor releases its Lease and the
/// waiting controller-runtime candidate, whose lease lasts 60 s, leads at
/// its next 2 s retry. Said with the Events and metrics of a ConfigMap
/// reclaim, with kind="lease"; the takeover is tracked.
#[tokio::test]
async fn real_candidate_leads_within_seconds_after_its_leaders_eviction() {
    let s = scenario("lease-failover").await;
    s.pod("op-a").await;
    s.pod("op-b").await;
    let kc = s.cp.kubeconfig_path();
    let lease_for = Duration::from_secs(60);
    let mut a = Peer::elect(kc, s.cp.dir(), &s.ns, "op-a", "op-lease", lease_for).expect("peer a");
    a.wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let identity = s.identity("op-lease").await;
    assert!(
        identity.starts_with("op-a_"),
        "controller-runtime identity: {identity}"
    );
    s.label("op-lease").await;
    let j = s.janitor().await;
    let mut b = Peer::elect(kc, s.cp.dir(), &s.ns, "op-b", "op-lease", lease_for).expect("peer b");
    let trying = tokio::time::timeout(Duration::from_secs(30), async {
        while !b.logs().contains("Attempting to acquire leader lease") {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert!(
        trying.await.is_ok(),
        "the candidate is not trying: {}",
        b.logs()
    );
    assert!(!b.is_leading(), "{}", b.logs());
    // The janitor learns a's 2 s renew period (two gaps).
    s.renewed_times("op-lease", 3, Duration::from_secs(30))
        .await;

    // The kubelet evicts op-a: its process is gone, its status Failed.
    a.kill();
    let renewed = s
        .leases()
        .get("op-lease")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.renew_time)
        .expect("renewed")
        .0;
    kubelet::set_failed(
        &s.client,
        &s.ns,
        "op-a",
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .unwrap();
    let evicted = Instant::now();
    b.wait_leading(Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("{e}\njanitor:\n{}", j.logs()));
    let took = evicted.elapsed();
    eprintln!(
        "op-b leads {:.1}s after op-a's eviction (lease 60s)",
        took.as_secs_f64()
    );
    // Before the lease could have expired by itself: the janitor released it.
    assert!(
        Timestamp::now() < renewed + SignedDuration::from_secs(60),
        "op-b led only after the lease expired ({took:?})"
    );
    assert!(s.identity("op-lease").await.starts_with("op-b_"));

    // One release, guarded by the resourceVersion judged; never a delete.
    let writes = s.lease_writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(
        (writes[0].verb.as_str(), writes[0].code),
        ("update", Some(200)),
        "{writes:#?}"
    );
    reclaimed_and_taken_over(&s, &j, "Released this Lease").await;
    wait_for("the takeover measured", Duration::from_secs(30), || async {
        let m = j.metrics().await;
        (sample(&m, "lock_janitor_takeover_seconds_count", &[]) == Some(1.0)).then_some(())
    })
    .await;
}

/// Every verdict row on the real API server: stale ones (Failed with each
/// reason, Succeeded) are released; everything else is left alone, and the
/// untouchable ones are reported.
#[tokio::test]
async fn every_lease_verdict_end_to_end() {
    let s = scenario("lease-verdicts").await;
    let cr = |host: &str| format!("{host}_0c3e5a12-4b1f-4a2e-9d7c-1f2e3d4c5b6a");
    // Stale: released.
    for (pod, how) in [
        ("evicted", "Evicted"),
        ("shutdown", "Terminated"),
        ("failed", "Error"),
        ("done", "Succeeded"),
    ] {
        s.pod(pod).await;
        // 10 s: with no renewal observed, released 5 s after the death
        // (half the lease), before it expires.
        s.lease_lasting(&format!("l-{pod}"), &cr(pod), 1, 10, true)
            .await;
        match how {
            "Succeeded" => kubelet::set_succeeded(&s.client, &s.ns, pod)
                .await
                .map(|_| ()),
            r => kubelet::set_failed(&s.client, &s.ns, pod, r, "test")
                .await
                .map(|_| ()),
        }
        .unwrap();
    }
    // Held or free: never written.
    s.pod("running").await;
    s.lease("l-running", &cr("running"), 1, true).await;
    s.pod("terminating").await;
    s.lease("l-terminating", "terminating", 1, true).await;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    pods.delete("terminating", &Default::default())
        .await
        .unwrap();
    s.lease("l-released", "", 1, true).await;
    s.pod("expired").await;
    s.lease("l-expired", "expired", 7200, true).await;
    kubelet::set_failed(&s.client, &s.ns, "expired", "Evicted", "test")
        .await
        .unwrap();
    s.lease("l-nobody", "nobody-here", 1, true).await;
    // Replaced by a new pod of the same name that renews it: that pod runs.
    s.pod("replaced").await;
    kubelet::set_failed(&s.client, &s.ns, "replaced", "Evicted", "test")
        .await
        .unwrap();
    kubelet::force_delete_pod(&s.client, &s.ns, "replaced")
        .await
        .unwrap();
    s.pod("replaced").await;
    s.lease("l-replaced", "replaced", 1, true).await;
    // Renewed after its pod died (opted in afterwards): something runs.
    s.pod("renewer").await;
    kubelet::set_failed(&s.client, &s.ns, "renewer", "Evicted", "test")
        .await
        .unwrap();
    s.lease("l-renewed", "renewer", -5, false).await;
    s.label("l-renewed").await;
    // Ambiguous: two pods match (by name, and by spec.hostname).
    s.pod("twin").await;
    kubelet::set_failed(&s.client, &s.ns, "twin", "Evicted", "test")
        .await
        .unwrap();
    let twin: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "twin-b", "namespace": s.ns},
        "spec": {"nodeName": s.node, "hostname": "twin",
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &twin).await.unwrap();
    kubelet::set_running(&s.client, &s.ns, "twin-b")
        .await
        .unwrap();
    s.lease("l-twin", "twin", 1, true).await;
    // Unmanageable: an identity that names no pod.
    s.lease("l-ip", "10.0.0.7:8443", 1, true).await;

    let j = s.janitor().await;
    for pod in ["evicted", "shutdown", "failed", "done"] {
        let lease = format!("l-{pod}");
        wait_for(
            &format!("{lease} released"),
            Duration::from_secs(30),
            || async { s.identity(&lease).await.is_empty().then_some(()) },
        )
        .await;
    }
    wait_event(&s.client, &s.ns, "AmbiguousLock", "l-twin").await;
    wait_event(&s.client, &s.ns, "UnmanageableLock", "l-ip").await;
    // Two more sweeps of the Leases' scope find nothing else to release.
    let sweeps = |j: &Janitor| j.logs().matches("resync sweep done").count();
    let before = sweeps(&j);
    wait_for("two more lease sweeps", Duration::from_secs(30), || async {
        (sweeps(&j) >= before + 2).then_some(())
    })
    .await;
    for reason in ["Evicted", "Shutdown", "Failed"] {
        metrics_reclaimed(&j, &[("kind", "lease"), ("reason", reason)], 1.0).await;
    }
    let m = metrics_reclaimed(&j, &[("kind", "lease"), ("reason", "Succeeded")], 1.0).await;
    let count = |state: &str| {
        sample(
            &m,
            "lock_janitor_locks",
            &[("kind", "lease"), ("state", state)],
        )
    };
    // Released now: the four stale ones, l-released, l-expired; held:
    // running, terminating, nobody, replaced, renewed.
    assert_eq!(count("held"), Some(11.0), "{m}");
    assert_eq!(count("ambiguous"), Some(1.0), "{m}");
    assert_eq!(count("unmanageable"), Some(1.0), "{m}");
    for reason in ["Evicted", "Shutdown", "Failed", "Succeeded"] {
        assert!(
            sample(
                &m,
                "lock_janitor_reclaims_total",
                &[("kind", "lease"), ("reason", reason)]
            ) == Some(1.0),
            "{reason}: {m}"
        );
    }
    // Exactly four writes, all updates of the stale ones; nothing deleted.
    let writes = s.lease_writes();
    let mut names: Vec<&str> = writes.iter().filter_map(|e| e.name.as_deref()).collect();
    names.sort();
    assert_eq!(
        names,
        ["l-done", "l-evicted", "l-failed", "l-shutdown"],
        "{writes:#?}"
    );
    assert!(
        writes
            .iter()
            .all(|e| e.verb == "update" && e.code == Some(200)),
        "{writes:#?}"
    );
    // The released ones look as client-go's own release.
    let l = s.leases().get("l-evicted").await.unwrap().spec.unwrap();
    assert_eq!(l.lease_duration_seconds, Some(1));
    assert_eq!(l.holder_identity.as_deref(), Some(""));
    for held in [
        "l-running",
        "l-terminating",
        "l-nobody",
        "l-replaced",
        "l-renewed",
        "l-twin",
        "l-ip",
    ] {
        assert!(!s.identity(held).await.is_empty(), "{held} was released");
    }
}

/// The janitor's library as it runs, for the Leases of this namespace, as
/// the janitor's user.
async fn lease_context(s: &Scenario) -> std::sync::Arc<lock_janitor::controller::Context> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig_as(s.cp, JANITOR_USER)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    lock_janitor::controller::Context::new(
        Client::try_from(config).unwrap(),
        lock_janitor::shared::Shared::new().unwrap(),
        lock_janitor::controller::Settings {
            selector: lock_janitor::selector::Selector::parse(lock_janitor::DEFAULT_SELECTOR)
                .unwrap(),
            namespaces: vec![s.ns.clone()],
            dry_run: false,
            delete_pod: false,
            policy: lock_janitor::verdict::Policy {
                owner_gone_grace: Duration::from_secs(30),
            },
            resync: Duration::from_secs(60),
            takeover_timeout: Duration::from_secs(300),
            kinds: vec![lock_janitor::lock::LockKind::Lease],
        },
    )
}

/// A Lease "op-lease" lasting 10 s, renewed a second ago by the pod "dead",
/// which has just failed; the janitor's library for it.
async fn dead_holders_lease(
    prefix: &str,
) -> (
    Scenario,
    std::sync::Arc<lock_janitor::controller::Context>,
    lock_janitor::lock::LockKey,
) {
    let s = scenario(prefix).await;
    s.pod("dead").await;
    s.lease_lasting("op-lease", "dead", 1, 10, true).await;
    kubelet::set_failed(&s.client, &s.ns, "dead", "Evicted", "test")
        .await
        .unwrap();
    let ctx = lease_context(&s).await;
    let key = lock_janitor::lock::LockKey::lease(s.ns.clone(), "op-lease");
    (s, ctx, key)
}

/// Every release follows a live read of the Lease and a live list of the
/// pods its identity names, whatever the watch's copy says: a copy that
/// lags behind a candidate's takeover frees nothing, and a holder recreated
/// under its name is seen and holds it.
#[tokio::test]
async fn a_lease_copy_behind_the_lease_frees_nothing() {
    use lock_janitor::verdict::LockState;
    let (s, ctx, key) = dead_holders_lease("lease-copy").await;
    ctx.shared.readiness.expect(0);
    let copy = std::sync::Arc::new(s.leases().get("op-lease").await.unwrap());
    wait_for(
        "the Lease judged stale",
        Duration::from_secs(20),
        || async {
            let j = ctx.judge_live(&key).await.unwrap().expect("opted in");
            (j.verdict.state() == LockState::Stale).then_some(())
        },
    )
    .await;

    // The Lease moved on since the copy: a live candidate took it.
    s.pod("live").await;
    let mut taken = s.leases().get("op-lease").await.unwrap();
    taken.spec.as_mut().unwrap().holder_identity = Some("live".into());
    s.leases()
        .replace("op-lease", &PostParams::default(), &taken)
        .await
        .unwrap();
    let audit = || lock_janitor_testenv::audit::read(s.cp.audit_log_path());
    let gets_before = s.janitor_requests(&audit(), "get", "leases");
    ctx.memory.suspect(&key);
    lock_janitor::controller::reconcile(copy.clone(), ctx.clone(), Default::default())
        .await
        .unwrap();
    assert_eq!(
        s.identity("op-lease").await,
        "live",
        "the new holder keeps it"
    );

    // The dead holder is made again under its name, Running, and the Lease
    // handed back to it: judged held from the live list of pods.
    kubelet::force_delete_pod(&s.client, &s.ns, "dead")
        .await
        .unwrap();
    s.pod("dead").await;
    let mut back = s.leases().get("op-lease").await.unwrap();
    back.spec.as_mut().unwrap().holder_identity = Some("dead".into());
    s.leases()
        .replace("op-lease", &PostParams::default(), &back)
        .await
        .unwrap();
    ctx.memory.suspect(&key);
    lock_janitor::controller::reconcile(copy, ctx.clone(), Default::default())
        .await
        .unwrap();
    assert_eq!(s.identity("op-lease").await, "dead");
    let audit = audit();
    assert!(
        s.janitor_requests(&audit, "get", "leases") >= gets_before + 2,
        "each judgement read the Lease live"
    );
    let writes = s.lease_writes();
    assert!(writes.is_empty(), "nothing written: {writes:#?}");
}

/// The release never happens if the Lease changed after it was judged: a
/// candidate takes it between the judgement and the update (409), and the
/// library says so; the new holder keeps it.
#[tokio::test]
async fn lease_changed_after_judgement_is_not_released() {
    use lock_janitor::reclaim::Freed;
    let (s, ctx, key) = dead_holders_lease("lease-race").await;
    // Held for the renewal window after the death (5 s: half the 10 s
    // lease, no renewal observed), then stale.
    let judged = wait_for(
        "the lease judged stale",
        Duration::from_secs(20),
        || async {
            let j = ctx.judge_live(&key).await.unwrap().expect("lease exists");
            (j.verdict.state() == lock_janitor::verdict::LockState::Stale).then_some(j)
        },
    )
    .await;

    // Meanwhile a live candidate takes the Lease over.
    s.pod("live").await;
    let mut taken = s.leases().get("op-lease").await.unwrap();
    taken.spec.as_mut().unwrap().holder_identity = Some("live".into());
    s.leases()
        .replace("op-lease", &PostParams::default(), &taken)
        .await
        .unwrap();

    assert!(matches!(
        ctx.reclaimer.reclaim(&judged, |_| false).await.0.freed,
        Some(Freed::Changed(_))
    ));
    assert_eq!(
        s.identity("op-lease").await,
        "live",
        "the new holder keeps it"
    );
    let writes = s.lease_writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(
        (writes[0].verb.as_str(), writes[0].code),
        ("update", Some(409))
    );
    // And judged again: held by the live pod.
    assert_eq!(
        ctx.judge_live(&key).await.unwrap().unwrap().verdict.state(),
        lock_janitor::verdict::LockState::Held
    );
}

/// The holder is read again after the intent Event, the last request
/// before the release: a holder made again under its name between the
/// judgement and the write (a StatefulSet pod; a client-go elector that
/// uses its pod name as identity takes the Lease for its own) stops it.
/// The Lease did not change, so its resourceVersion cannot: nothing is
/// written, and the Lease is judged again (held by the new pod). (Before,
/// the release went through on the judgement's read.)
#[tokio::test]
async fn a_holder_made_again_after_the_judgement_stops_the_release() {
    use lock_janitor::reclaim::Freed;
    use lock_janitor::verdict::LockState;
    let (s, ctx, key) = dead_holders_lease("lease-reread").await;
    let judged = wait_for(
        "the lease judged stale",
        Duration::from_secs(20),
        || async {
            let j = ctx.judge_live(&key).await.unwrap().expect("lease exists");
            (j.verdict.state() == LockState::Stale).then_some(j)
        },
    )
    .await;
    kubelet::force_delete_pod(&s.client, &s.ns, "dead")
        .await
        .unwrap();
    s.pod("dead").await;

    let (done, error) = ctx.reclaimer.reclaim(&judged, |_| false).await;
    assert!(error.is_none(), "{error:?}");
    assert!(
        matches!(done.freed, Some(Freed::Changed(_))),
        "{:?}",
        done.freed
    );
    assert_eq!(s.identity("op-lease").await, "dead", "still held");
    let writes = s.lease_writes();
    assert!(writes.is_empty(), "nothing written: {writes:#?}");
    assert_eq!(
        ctx.judge_live(&key).await.unwrap().unwrap().verdict.state(),
        LockState::Held
    );
}

/// `scan` reports Lease locks beside ConfigMap locks (kind "lease"), and
/// `label --apply` opts in exactly the Leases whose holder identity names
/// one pod of their namespace; a second run writes nothing.
#[tokio::test]
async fn scan_and_label_see_lease_locks() {
    let s = scenario("lease-scan").await;
    s.pod("op-a").await;
    s.lease_lasting(
        "op-lease",
        "op-a_0c3e5a12-4b1f-4a2e-9d7c-1f2e3d4c5b6a",
        1,
        10,
        false,
    )
    .await;
    kubelet::set_failed(&s.client, &s.ns, "op-a", "Evicted", "test")
        .await
        .unwrap();
    // Not lock-shaped: names no pod here (a node's heartbeat looks so).
    s.lease("node-like", "worker-7", 1, false).await;
    s.lease("an-ip", "10.0.0.7:8443", 1, false).await;
    // scan as the janitor's identity (it reads only); label as an admin
    // (the janitor itself is not granted patch on Leases: it never labels
    // one).
    let kc = kubeconfig_as(s.cp, JANITOR_USER);
    let admin = s.cp.kubeconfig_path().to_path_buf();
    let run_as = |kc: &std::path::Path, args: Vec<String>| {
        let out = std::process::Command::new(janitor_bin())
            .args(&args)
            .env("KUBECONFIG", kc)
            .output()
            .expect("run lock-janitor");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let scan = || {
        run_as(
            &kc,
            vec![
                "scan".into(),
                "-n".into(),
                s.ns.clone(),
                "-o".into(),
                "json".into(),
            ],
        )
    };
    // Held for the renewal window after the death (half the 10 s lease),
    // then stale: exit 3.
    let (code, out, err) = wait_for(
        "scan finds the stale Lease",
        Duration::from_secs(20),
        || async {
            let r = scan();
            (r.0 == Some(3)).then_some(r)
        },
    )
    .await;
    assert_eq!(code, Some(3), "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = report["items"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["spec"]["lockKind"], "lease");
    assert_eq!(rows[0]["metadata"]["name"], "op-lease");
    assert_eq!(rows[0]["spec"]["labeled"], false);
    assert_eq!(rows[0]["status"]["verdict"], "stale:Evicted", "{out}");
    assert_eq!(rows[0]["spec"]["holder"]["name"], "op-a");

    let label = |apply: bool| {
        let mut a = vec!["label".to_string(), "-n".into(), s.ns.clone()];
        if apply {
            a.push("--apply".into());
        }
        run_as(&admin, a)
    };
    let (code, out, err) = label(true);
    assert_eq!(code, Some(0), "{out}{err}");
    // The table's row: NAMESPACE NAME HOLDER RESULT.
    assert!(
        out.lines().any(|l| l.split_whitespace().eq([
            s.ns.as_str(),
            "lease/op-lease",
            "op-a",
            "labeled"
        ])),
        "{out}"
    );
    let (code, out, err) = label(true);
    assert_eq!(code, Some(0), "{out}{err}");
    // The summary is on stderr.
    assert!(err.contains("0 labeled, 1 unchanged"), "{out}{err}");
    let patches: Vec<_> = lock_janitor_testenv::audit::read(s.cp.audit_log_path())
        .into_iter()
        .filter(|e| {
            e.namespace.as_deref() == Some(s.ns.as_str())
                && e.resource.as_deref() == Some("leases")
                && e.verb == "patch"
        })
        .collect();
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!(patches[0].name.as_deref(), Some("op-lease"));
    assert_eq!(patches[0].code, Some(200));
    assert!(s.lease_writes().is_empty(), "the janitor's identity wrote");
    for other in ["node-like", "an-ip"] {
        let l = s.leases().get(other).await.unwrap();
        assert!(
            l.metadata.labels.unwrap_or_default().is_empty(),
            "{other} was labeled"
        );
    }
}

/// Eight Leases whose holders died together are judged side by side, each
/// from its own live list of the namespace's pods: each judgement gets the
/// pods its own identity names, by name or `spec.hostname` (a live pod that
/// takes a dead holder's hostname makes that one Lease ambiguous, no other).
#[tokio::test]
async fn leases_judged_side_by_side_each_see_the_pods_they_name() {
    use lock_janitor::verdict::Verdict;
    let s = scenario("lease-shared-list").await;
    let ctx = lease_context(&s).await;
    let holders: Vec<String> = (0..8).map(|i| format!("holder-{i}")).collect();
    for h in &holders {
        s.pod(h).await;
        s.lease_lasting(&format!("l-{h}"), h, 1, 10, true).await;
    }
    for i in 0..20 {
        s.pod(&format!("bystander-{i}")).await;
    }
    for h in &holders {
        kubelet::set_failed(&s.client, &s.ns, h, "Evicted", "test")
            .await
            .unwrap();
    }
    // A live pod whose hostname is holder-3's.
    let twin: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "twin-of-3", "namespace": s.ns},
        "spec": {"nodeName": s.node, "hostname": "holder-3",
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(s.client.clone(), &s.ns)
        .create(&PostParams::default(), &twin)
        .await
        .unwrap();
    kubelet::set_running(&s.client, &s.ns, "twin-of-3")
        .await
        .unwrap();

    let keys: Vec<_> = holders
        .iter()
        .map(|h| lock_janitor::lock::LockKey::lease(s.ns.clone(), format!("l-{h}")))
        .collect();
    let judged = futures::future::join_all(keys.iter().map(|key| ctx.judge_live(key))).await;
    for (h, j) in holders.iter().zip(judged) {
        let j = j.unwrap().expect("opted in");
        if h == "holder-3" {
            let Verdict::AmbiguousHolders(names) = &j.verdict else {
                panic!("{h}: {:?}", j.verdict)
            };
            assert_eq!(names, &["holder-3".to_string(), "twin-of-3".to_string()]);
        } else {
            let holder = j.holder.as_ref().expect("one matching pod");
            assert_eq!(holder.metadata.name.as_deref(), Some(h.as_str()));
            assert!(
                !matches!(j.verdict, Verdict::AmbiguousHolders(_)),
                "{h}: {:?}",
                j.verdict
            );
        }
    }
    assert!(s.lease_writes().is_empty(), "judging writes nothing");
}

/// A Lease takeover is timed from the new holder's `spec.acquireTime`, not
/// from its latest renewal when the follower happens to look (its first
/// look is 2 s after the release): a holder that takes the Lease at once
/// and renews every 300 ms is measured at well under a second.
#[tokio::test]
async fn a_lease_takeover_is_timed_from_the_new_holders_acquire_time() {
    let s = scenario("lease-acquired").await;
    let j = s.janitor().await;
    s.pod("old").await;
    s.lease_lasting("op-lease", "old", 1, 10, true).await;
    kubelet::set_failed(&s.client, &s.ns, "old", "Evicted", "test")
        .await
        .unwrap();
    s.pod("new").await;
    let leases = s.leases();
    // The candidate: takes the Lease the moment it is released, then
    // renews it until the takeover is said.
    let released = wait_for("the Lease released", Duration::from_secs(60), || async {
        let l = leases.get("op-lease").await.ok()?;
        (l.spec.as_ref()?.holder_identity.as_deref() == Some("")).then_some(l)
    })
    .await;
    let now = || k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now());
    let mut l = released;
    let spec = l.spec.as_mut().unwrap();
    spec.holder_identity = Some("new".into());
    spec.lease_duration_seconds = Some(10);
    spec.acquire_time = Some(now());
    spec.renew_time = spec.acquire_time.clone();
    let mut l = leases
        .replace("op-lease", &PostParams::default(), &l)
        .await
        .expect("the candidate takes the released Lease");
    let taken = loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        l.spec.as_mut().unwrap().renew_time = Some(now());
        l = leases
            .replace("op-lease", &PostParams::default(), &l)
            .await
            .expect("the candidate renews");
        let m = j.metrics().await;
        if sample(&m, "lock_janitor_takeover_seconds_count", &[]) == Some(1.0) {
            break m;
        }
    };
    let secs = sample(&taken, "lock_janitor_takeover_seconds_sum", &[]).unwrap();
    assert!(
        secs < 1.0,
        "the takeover took {secs:.2}s by the metric; the candidate acquired it at once"
    );
}

/// A Lease held for life (nais/elector's shape: one Pod owner, no renewTime,
/// no leaseDurationSeconds, never renewed; its candidates only create it)
/// whose owner is evicted is deleted, with uid and resourceVersion
/// preconditions, as a ConfigMap lock is: a release would free nothing. The
/// waiting candidate's next create succeeds, the takeover is tracked, and
/// the opt-in label is carried over to the Lease it made. (Before, the
/// janitor said NoRenewTime and left it.)
#[tokio::test]
async fn a_lease_held_for_life_is_deleted_and_its_candidate_takes_it() {
    let s = scenario("lease-for-life").await;
    s.pod("op-a").await;
    s.pod("op-b").await;
    let kc = s.cp.kubeconfig_path();
    let mut a = Peer::for_life(kc, s.cp.dir(), &s.ns, "op-a", "op-lease").expect("peer a");
    a.wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let held = s.leases().get("op-lease").await.unwrap();
    let spec = held.spec.clone().unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some("op-a"));
    assert!(
        spec.renew_time.is_none() && spec.lease_duration_seconds.is_none(),
        "{held:?}"
    );
    assert!(spec.acquire_time.is_some(), "{held:?}");
    let owners = held.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].name.as_str()),
        ("Pod", "op-a")
    );
    s.label("op-lease").await;
    let j = s.janitor().await;
    let mut b = Peer::for_life(kc, s.cp.dir(), &s.ns, "op-b", "op-lease").expect("peer b");
    wait_for(
        "op-b lost the first election",
        Duration::from_secs(30),
        || async { b.logs().contains("lost the election").then_some(()) },
    )
    .await;
    // A live holder: nothing written, nothing said but that it is held.
    assert!(!b.is_leading(), "{}", b.logs());
    assert!(s.lease_writes().is_empty(), "{:#?}", s.lease_writes());

    // The kubelet evicts op-a: its process is gone, its status Failed.
    a.kill();
    kubelet::set_failed(
        &s.client,
        &s.ns,
        "op-a",
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .unwrap();
    let evicted = Instant::now();
    b.wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\njanitor:\n{}", j.logs()));
    eprintln!(
        "op-b leads {:.1}s after op-a's eviction (a Lease held for life)",
        evicted.elapsed().as_secs_f64()
    );
    let now = s.leases().get("op-lease").await.unwrap();
    assert_eq!(
        now.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("op-b")
    );

    // The one write freeing it: a DELETE with both preconditions of the
    // Lease judged.
    let deletes: Vec<_> = s
        .lease_writes()
        .into_iter()
        .filter(|e| e.verb == "delete")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:#?}");
    assert_eq!(deletes[0].code, Some(200), "{deletes:#?}");
    let pre = deletes[0]
        .request_object
        .as_ref()
        .and_then(|o| o.get("preconditions"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        pre.get("uid").and_then(|v| v.as_str()),
        held.metadata.uid.as_deref(),
        "{deletes:#?}"
    );
    assert!(
        pre.get("resourceVersion")
            .and_then(|v| v.as_str())
            .is_some(),
        "{deletes:#?}"
    );
    reclaimed_and_taken_over(&s, &j, "Deleted this Lease").await;
    // op-b made the Lease without the opt-in label; it is carried over,
    // so op-b's own death is seen too.
    wait_for(
        "the opt-in label carried over",
        Duration::from_secs(30),
        || async {
            let l = s.leases().get("op-lease").await.ok()?;
            l.metadata
                .labels
                .is_some_and(|l| l.get(WATCH_LABEL.0).map(String::as_str) == Some(WATCH_LABEL.1))
                .then_some(())
        },
    )
    .await;
    assert!(
        j.logs().contains("opt-in label carried over"),
        "{}",
        j.logs()
    );
}

/// op-lease was reclaimed once (reason Evicted, the counter, its Event on
/// the Lease saying `done`), and op-b's takeover said.
async fn reclaimed_and_taken_over(s: &Scenario, j: &Janitor, done: &str) {
    let m = metrics_reclaimed(j, &[("kind", "lease"), ("lock", "op-lease")], 1.0).await;
    let labels = [
        ("kind", "lease"),
        ("lock_namespace", s.ns.as_str()),
        ("lock", "op-lease"),
        ("reason", "Evicted"),
    ];
    assert_eq!(
        sample(&m, "lock_janitor_reclaims_total", &labels),
        Some(1.0),
        "{m}"
    );
    let ev = wait_event(&s.client, &s.ns, "StaleLockReclaimed", "op-lease").await;
    assert_eq!(
        ev.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("Lease")
    );
    assert!(
        ev.note.as_deref().unwrap_or_default().contains(done),
        "{ev:?}"
    );
    let taken = wait_event(&s.client, &s.ns, "LockTakenOver", "op-lease").await;
    assert!(
        taken.note.as_deref().unwrap_or_default().contains("op-b"),
        "{taken:?}"
    );
}

/// A Lease held for life is freed by a DELETE, not a release: when nobody
/// takes it again within --takeover-timeout, its NoTakeover Event says it
/// was freed, never that it was released.
#[tokio::test]
async fn no_takeover_of_a_lease_held_for_life_does_not_say_released() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    let s = scenario("for-life-no-takeover").await;
    let holder = s.pod("op-a").await;
    // As nais/elector writes it: its own pod the one owner, holder and
    // acquireTime set, never renewed.
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("op-lease".into()),
            labels: Some([(WATCH_LABEL.0.to_string(), WATCH_LABEL.1.to_string())].into()),
            owner_references: Some(vec![pod_owner(&holder)]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("op-a".into()),
            acquire_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    s.leases()
        .create(&PostParams::default(), &lease)
        .await
        .expect("the Lease held for life");
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
            "--takeover-timeout",
            "3s",
        ],
    )
    .await;
    kubelet::set_failed(
        &s.client,
        &s.ns,
        "op-a",
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .unwrap();
    wait_for("the Lease deleted", Duration::from_secs(30), || async {
        s.leases()
            .get_opt("op-lease")
            .await
            .ok()
            .and_then(|l| l.is_none().then_some(()))
    })
    .await;
    let ev = wait_event(&s.client, &s.ns, "NoTakeover", "op-lease").await;
    let note = ev.note.unwrap_or_default();
    assert!(
        note.contains("was freed") && !note.contains("released"),
        "{note}\njanitor:\n{}",
        j.logs()
    );
}
