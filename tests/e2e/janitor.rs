//! End-to-end: the real janitor binary against a real control plane (etcd,
//! kube-apiserver, kube-controller-manager with the garbage collector on).
//! Tests play the kubelet by writing pod status.

use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};

struct Scenario {
    cp: &'static ControlPlane,
    client: Client,
    ns: String,
    node: String,
}

async fn scenario(prefix: &str) -> Scenario {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, prefix).await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    Scenario {
        cp,
        client,
        ns,
        node,
    }
}

impl Scenario {
    async fn janitor(&self, extra: &[&str]) -> Janitor {
        let kc = kubeconfig_as(self.cp, JANITOR_USER);
        let mut args = vec![
            "--namespace",
            &self.ns,
            "--resync",
            "2s",
            "--owner-gone-grace",
            "2s",
        ];
        args.extend_from_slice(extra);
        Janitor::start(&kc, &args).await
    }

    async fn pod(&self, name: &str) -> Pod {
        running_pod(&self.client, &self.ns, name, &self.node).await
    }

    async fn lock(&self, name: &str, holder: &Pod) -> ConfigMap {
        create_lock(&self.client, &lock_for(name, holder, true)).await
    }

    async fn wait_gone(&self, lock: &str) {
        wait_for(
            &format!("lock {lock} deleted"),
            Duration::from_secs(30),
            || async { (!lock_exists(&self.client, &self.ns, lock).await).then_some(()) },
        )
        .await
    }

    fn janitor_writes(&self) -> Vec<lock_janitor_testenv::audit::AuditEvent> {
        writes_by(self.cp, JANITOR_USER, &self.ns)
    }

    /// The janitor's library in this process, acting as `user` on this
    /// scenario's namespace, for tests that drive it step by step.
    async fn context_as(
        &self,
        user: &str,
        state: lock_janitor::shared::Shared,
    ) -> std::sync::Arc<lock_janitor::controller::Context> {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig_as(self.cp, user)).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        lock_janitor::controller::Context::new(
            Client::try_from(config).unwrap(),
            state,
            lock_janitor::controller::Settings {
                kinds: vec![lock_janitor::lock::LockKind::ConfigMap],
                selector: lock_janitor::selector::Selector::parse(lock_janitor::DEFAULT_SELECTOR)
                    .unwrap(),
                namespaces: vec![self.ns.clone()],
                dry_run: false,
                delete_pod: false,
                policy: lock_janitor::verdict::Policy {
                    owner_gone_grace: Duration::from_secs(30),
                },
                resync: Duration::from_secs(60),
                takeover_timeout: Duration::from_secs(300),
            },
        )
    }
}

/// A holder dies with `pod_reason` (or succeeds); the lock is deleted, the
/// metric counts it with `label`, and an Event says so.
async fn reclaimed_when(prefix: &str, kill: impl AsyncFnOnce(&Scenario, &str), label: &str) {
    let s = scenario(prefix).await;
    let leader = s.pod("leader").await;
    s.lock("op-lock", &leader).await;
    let j = s.janitor(&[]).await;
    kill(&s, "leader").await;
    s.wait_gone("op-lock").await;

    let labels = [
        ("lock_namespace", s.ns.as_str()),
        ("lock", "op-lock"),
        ("reason", label),
    ];
    let m = metrics_reclaimed(&j, &labels, 1.0).await;
    assert_eq!(
        sample(&m, "lock_janitor_reclaims_total", &labels),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "lock_janitor_reclaim_latency_seconds_count", &[]),
        Some(1.0)
    );
    let ev = wait_event(&s.client, &s.ns, "StaleLockReclaimed", "op-lock").await;
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    assert!(
        ev.note.as_deref().unwrap_or_default().contains(label),
        "{ev:?}"
    );
    let related = ev.related.expect("Event names the holder pod");
    assert_eq!(related.kind.as_deref(), Some("Pod"));
    assert_eq!(related.name.as_deref(), Some("leader"));
    // The delete was guarded by the judged uid and resourceVersion.
    let deletes: Vec<_> = s
        .janitor_writes()
        .into_iter()
        .filter(|e| e.verb == "delete")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].code, Some(200));
    // The dead pod stays without --delete-pod.
    assert!(Api::<Pod>::namespaced(s.client.clone(), &s.ns)
        .get_opt("leader")
        .await
        .unwrap()
        .is_some());
}

async fn fail_with(s: &Scenario, pod: &str, reason: &str) {
    kubelet::set_failed(&s.client, &s.ns, pod, reason, "test")
        .await
        .expect("set failed");
}

#[tokio::test]
async fn evicted_holder_lock_is_reclaimed() {
    reclaimed_when(
        "evicted",
        async |s, p| fail_with(s, p, "Evicted").await,
        "Evicted",
    )
    .await;
}

#[tokio::test]
async fn preempted_holder_lock_is_reclaimed() {
    reclaimed_when(
        "preempted",
        async |s, p| fail_with(s, p, "Preempting").await,
        "Preempted",
    )
    .await;
}

#[tokio::test]
async fn shutdown_holder_lock_is_reclaimed() {
    reclaimed_when(
        "shutdown",
        async |s, p| fail_with(s, p, "NodeShutdown").await,
        "Shutdown",
    )
    .await;
}

#[tokio::test]
async fn otherwise_failed_holder_lock_is_reclaimed() {
    reclaimed_when(
        "failed",
        async |s, p| fail_with(s, p, "Error").await,
        "Failed",
    )
    .await;
}

#[tokio::test]
async fn succeeded_holder_lock_is_reclaimed() {
    reclaimed_when(
        "succeeded",
        async |s, p| {
            kubelet::set_succeeded(&s.client, &s.ns, p)
                .await
                .expect("set succeeded");
        },
        "Succeeded",
    )
    .await;
}

#[tokio::test]
async fn live_ambiguous_and_unmanageable_locks_survive_resyncs() {
    let s = scenario("held").await;
    let running = s.pod("running").await;
    s.lock("running-lock", &running).await;

    // Terminating: a finalizer keeps the deleted pod in the API, still Running.
    let terminating = s.pod("terminating").await;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    pods.patch(
        "terminating",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": ["lock-janitor.io/test"]}})),
    )
    .await
    .unwrap();
    s.lock("terminating-lock", &terminating).await;
    pods.delete("terminating", &DeleteParams::default())
        .await
        .unwrap();

    // Unmanageable: no owner; two owners; a non-Pod owner.
    let other = s.pod("other").await;
    let mut no_owner = lock_for("no-owner-lock", &running, true);
    no_owner.metadata.owner_references = None;
    create_lock(&s.client, &no_owner).await;
    let mut two = lock_for("two-owner-lock", &running, true);
    two.metadata.owner_references = Some(vec![pod_owner(&running), pod_owner(&other)]);
    create_lock(&s.client, &two).await;
    let plain = create_lock(&s.client, &{
        let mut c = lock_for("plain-config", &running, false);
        c.metadata.owner_references = None;
        c
    })
    .await;
    let mut cm_owned = lock_for("cm-owner-lock", &running, true);
    cm_owned.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "plain-config".into(),
            uid: plain.metadata.uid.clone().unwrap(),
            ..Default::default()
        },
    ]);
    create_lock(&s.client, &cm_owned).await;

    let j = s.janitor(&["--delete-pod"]).await;

    for name in ["no-owner-lock", "two-owner-lock", "cm-owner-lock"] {
        let ev = wait_event(&s.client, &s.ns, "UnmanageableLock", name).await;
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
    }

    // Four resyncs (2 s each): each sweeps the holders and judges again
    // whatever it finds changed; nothing is deleted.
    j.wait_sweeps(4).await;

    for lock in [
        "running-lock",
        "terminating-lock",
        "no-owner-lock",
        "two-owner-lock",
        "cm-owner-lock",
    ] {
        assert!(
            lock_exists(&s.client, &s.ns, lock).await,
            "{lock} was deleted"
        );
    }
    assert!(
        s.janitor_writes().is_empty(),
        "janitor wrote: {:?}",
        s.janitor_writes()
    );
    let m = j.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_locks", &[("state", "held")]),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "lock_janitor_locks", &[("state", "ambiguous")]),
        Some(0.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "lock_janitor_locks", &[("state", "unmanageable")]),
        Some(3.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "lock_janitor_locks", &[("state", "stale")]),
        Some(0.0),
        "{m}"
    );
    // Reported once per resourceVersion, not once per resync.
    for reason in ["UnmanageableLock"] {
        for ev in events(&s.client, &s.ns, reason).await {
            assert!(ev.series.is_none(), "{reason} repeated: {ev:?}");
        }
    }

    // Clean up the finalizer so the namespace can go.
    let p = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
    pods.patch("terminating", &PatchParams::default(), &p)
        .await
        .unwrap();
}

#[tokio::test]
async fn dry_run_writes_nothing_but_events() {
    let s = scenario("dry-run").await;
    let leader = s.pod("leader").await;
    s.lock("op-lock", &leader).await;
    let j = s.janitor(&["--dry-run", "--delete-pod"]).await;
    fail_with(&s, "leader", "Evicted").await;

    let ev = wait_event(&s.client, &s.ns, "StaleLockDetected", "op-lock").await;
    assert!(ev.note.unwrap_or_default().contains("dry run"));
    let labels = [
        ("lock_namespace", s.ns.as_str()),
        ("lock", "op-lock"),
        ("reason", "Evicted"),
    ];
    wait_for("stale_locks gauge", Duration::from_secs(10), || async {
        (sample(&j.metrics().await, "lock_janitor_stale_locks", &labels) == Some(1.0)).then_some(())
    })
    .await;
    // Let a few resyncs pass, then check the audit log: no write at all.
    let before = sample(
        &j.metrics().await,
        "lock_janitor_reconcile_duration_seconds_count",
        &[],
    )
    .unwrap();
    wait_for("resyncs", Duration::from_secs(20), || async {
        let n = sample(
            &j.metrics().await,
            "lock_janitor_reconcile_duration_seconds_count",
            &[],
        )?;
        (n >= before + 2.0).then_some(())
    })
    .await;
    assert!(lock_exists(&s.client, &s.ns, "op-lock").await);
    assert!(
        s.janitor_writes().is_empty(),
        "dry run wrote: {:?}",
        s.janitor_writes()
    );
    let m = j.metrics().await;
    // Nothing was reclaimed: no reclaim series exists for the lock.
    assert_eq!(
        sample(&m, "lock_janitor_reclaims_total", &labels),
        None,
        "{m}"
    );
    assert_eq!(
        sample(&m, "lock_janitor_locks", &[("state", "stale")]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(events(&s.client, &s.ns, "StaleLockDetected").await.len(), 1);
}

#[tokio::test]
async fn delete_pod_deletes_the_dead_holder_and_never_a_live_one() {
    let s = scenario("delete-pod").await;
    let leader = s.pod("leader").await;
    s.lock("op-lock", &leader).await;
    let live = s.pod("live").await;
    s.lock("live-lock", &live).await;
    let j = s.janitor(&["--delete-pod"]).await;
    fail_with(&s, "leader", "Evicted").await;
    s.wait_gone("op-lock").await;

    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    wait_for("dead pod deleted", Duration::from_secs(20), || async {
        pods.get_opt("leader")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    wait_event(&s.client, &s.ns, "DeadHolderDeleted", "op-lock").await;
    assert!(pods.get_opt("live").await.unwrap().is_some());
    assert!(lock_exists(&s.client, &s.ns, "live-lock").await);
    let pod_deletes: Vec<_> = s
        .janitor_writes()
        .into_iter()
        .filter(|e| e.resource.as_deref() == Some("pods") && e.verb == "delete")
        .collect();
    assert_eq!(pod_deletes.len(), 1, "{pod_deletes:?}");
    assert_eq!(pod_deletes[0].name.as_deref(), Some("leader"));

    // Every metric of docs/design.md is exposed (stale_locks: see the dry-run test).
    let m = metrics_reclaimed(&j, &[("lock_namespace", s.ns.as_str())], 1.0).await;
    assert_eq!(
        sample(
            &m,
            "lock_janitor_pod_deletions_total",
            &[("lock_namespace", s.ns.as_str()), ("reason", "Evicted")]
        ),
        Some(1.0)
    );
    for name in [
        "lock_janitor_reclaims_total",
        "lock_janitor_locks",
        "lock_janitor_reclaim_latency_seconds_bucket",
        "lock_janitor_pod_deletions_total",
        "lock_janitor_reconcile_errors_total",
        "lock_janitor_reconcile_duration_seconds_bucket",
        "lock_janitor_build_info",
    ] {
        assert!(
            sample(&m, name, &[]).is_some(),
            "{name} missing from /metrics:\n{m}"
        );
    }
    assert_eq!(
        sample(
            &m,
            "lock_janitor_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn waiting_replica_takes_over_after_eviction() {
    let s = scenario("takeover").await;
    let leader = s.pod("operator-a").await;
    let replica = s.pod("operator-b").await;
    let lock = become_leader(&s.client, &leader, "operator-lock", true).await;
    assert_eq!(
        lock.metadata.owner_references.unwrap()[0].name,
        "operator-a"
    );
    let j = s.janitor(&[]).await;

    // The replica follows operator-lib's protocol and waits.
    let waiting = {
        let client = s.client.clone();
        let replica = replica.clone();
        tokio::spawn(async move { become_leader(&client, &replica, "operator-lock", false).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !waiting.is_finished(),
        "replica must wait while the leader runs"
    );

    fail_with(&s, "operator-a", "Evicted").await;
    let new_lock = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("replica took over within 60s")
        .unwrap();
    let owner = &new_lock.metadata.owner_references.unwrap()[0];
    assert_eq!(owner.name, "operator-b");
    assert_eq!(Some(owner.uid.clone()), replica.metadata.uid);

    // operator-lib re-creates the lock without labels; the janitor carries
    // the opt-in label over, so the next eviction is handled too.
    let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    wait_for(
        "opt-in label carried over",
        Duration::from_secs(30),
        || async {
            let cm = cms.get("operator-lock").await.ok()?;
            (cm.metadata.labels?.get(WATCH_LABEL.0).map(String::as_str) == Some(WATCH_LABEL.1))
                .then_some(())
        },
    )
    .await;
    // The takeover is said: an Event on the new lock, a histogram sample.
    let ev = wait_event(&s.client, &s.ns, "LockTakenOver", "operator-lock").await;
    assert!(
        ev.note
            .as_deref()
            .unwrap_or_default()
            .contains("operator-b"),
        "{ev:?}"
    );
    let m = j.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_takeover_seconds_count", &[]),
        Some(1.0),
        "{m}"
    );
    let third = s.pod("operator-c").await;
    let waiting = {
        let client = s.client.clone();
        tokio::spawn(async move { become_leader(&client, &third, "operator-lock", false).await })
    };
    fail_with(&s, "operator-b", "Preempting").await;
    let newest = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("second takeover within 60s")
        .unwrap();
    assert_eq!(
        newest.metadata.owner_references.unwrap()[0].name,
        "operator-c"
    );
    // Exactly one label patch per takeover, each guarded by resourceVersion.
    let patches: Vec<_> = s
        .janitor_writes()
        .into_iter()
        .filter(|e| e.verb == "patch")
        .collect();
    assert!(
        !patches.is_empty()
            && patches
                .iter()
                .all(|e| e.name.as_deref() == Some("operator-lock")),
        "{patches:?}"
    );
}

#[tokio::test]
async fn restarted_janitor_converges() {
    let s = scenario("restart").await;
    let a = s.pod("a").await;
    s.lock("a-lock", &a).await;
    let b = s.pod("b").await;
    s.lock("b-lock", &b).await;

    let mut first = s.janitor(&[]).await;
    fail_with(&s, "a", "Evicted").await;
    s.wait_gone("a-lock").await;
    // A replica took over a's lock; the janitor crashes.
    let a2 = s.pod("a2").await;
    s.lock("a-lock", &a2).await;
    first.kill();

    // While no janitor runs, b dies.
    fail_with(&s, "b", "Preempting").await;
    let second = s.janitor(&[]).await;
    s.wait_gone("b-lock").await;
    wait_for(
        "the new a-lock judged held",
        Duration::from_secs(20),
        || async {
            let m = second.metrics().await;
            (sample(&m, "lock_janitor_locks", &[("state", "held")]) == Some(1.0)).then_some(())
        },
    )
    .await;
    let ns = s.ns.as_str();
    let m = metrics_reclaimed(&second, &[("lock_namespace", ns), ("lock", "b-lock")], 1.0).await;
    assert_eq!(
        sample(
            &m,
            "lock_janitor_reclaims_total",
            &[
                ("lock_namespace", ns),
                ("lock", "b-lock"),
                ("reason", "Preempted")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &m,
            "lock_janitor_reclaims_total",
            &[
                ("lock_namespace", ns),
                ("lock", "a-lock"),
                ("reason", "Evicted")
            ]
        ),
        None,
        "the second janitor never reclaims the new leader's lock"
    );
    assert!(
        lock_exists(&s.client, &s.ns, "a-lock").await,
        "the new leader's lock survives"
    );
    assert_eq!(
        sample(&m, "lock_janitor_locks", &[("state", "held")]),
        Some(1.0),
        "{m}"
    );
    let deletes = s
        .janitor_writes()
        .into_iter()
        .filter(|e| e.verb == "delete")
        .count();
    assert_eq!(deletes, 2, "one delete per dead holder, none repeated");
}

#[tokio::test]
async fn sigterm_exits_cleanly() {
    let s = scenario("sigterm").await;
    let mut j = s.janitor(&[]).await;
    j.signal("TERM");
    let st = j
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("exited within 10s after SIGTERM");
    assert_eq!(st.code(), Some(0), "{}", j.logs());
}

#[tokio::test]
async fn bad_input_never_panics_nor_deletes() {
    let s = scenario("bad-input").await;
    // Near the 1 MiB object limit, with a dead holder, labeled: it holds
    // data, so it is no leader-for-life lock (those are empty). Reported
    // unmanageable, never deleted: deleting it would lose the data.
    let big_holder = s.pod("big").await;
    let mut big = lock_for("big-lock", &big_holder, true);
    big.data = Some([("blob".to_string(), "x".repeat(1_000_000))].into());
    create_lock(&s.client, &big).await;
    // An empty lock whose holder dies: reclaimed.
    let empty_holder = s.pod("empty").await;
    s.lock("empty-lock", &empty_holder).await;
    // Odd label values do not opt in.
    let odd = s.pod("odd").await;
    let mut odd_lock = lock_for("odd-lock", &odd, true);
    odd_lock.metadata.labels =
        Some([("lock-janitor.io/watch".to_string(), "TRUE".to_string())].into());
    create_lock(&s.client, &odd_lock).await;
    // A held lock keeps resyncs going.
    let steady = s.pod("steady").await;
    s.lock("steady-lock", &steady).await;

    let j = s.janitor(&[]).await;
    fail_with(&s, "big", "Evicted").await;
    fail_with(&s, "empty", "Evicted").await;
    fail_with(&s, "odd", "Evicted").await;
    s.wait_gone("empty-lock").await;
    let ev = wait_event(&s.client, &s.ns, "UnmanageableLock", "big-lock").await;
    assert!(
        ev.note
            .as_deref()
            .unwrap_or_default()
            .contains("holds data"),
        "{ev:?}"
    );
    assert!(lock_exists(&s.client, &s.ns, "big-lock").await);
    // A couple of resyncs later the unselected lock is still there.
    j.wait_sweeps(2).await;
    assert!(lock_exists(&s.client, &s.ns, "odd-lock").await);
    assert!(lock_exists(&s.client, &s.ns, "big-lock").await);
    let deletes: Vec<_> = s
        .janitor_writes()
        .into_iter()
        .filter(|e| e.verb == "delete")
        .collect();
    assert_eq!(deletes.len(), 1, "only empty-lock: {deletes:?}");
    assert_eq!(deletes[0].name.as_deref(), Some("empty-lock"));
    assert!(!j.logs().contains("panicked"), "{}", j.logs());
}

#[tokio::test]
async fn bad_flags_exit_2_with_a_message() {
    for args in [
        vec!["run", "--resync", "never"],
        vec!["run", "--namespace", "Not_A_Namespace"],
        vec!["run", "--log-format", "xml"],
        vec!["run", "--selector", "a=b c"],
        // Opt-in stays opt-in: these would select opted-out locks.
        vec!["run", "--selector", "lock-janitor.io/watch"],
        vec!["run", "--selector", "!foo"],
        vec!["run", "--selector", "lock-janitor.io/watch!=false"],
        // The floors: no grace for a force-deleted pod, a resync that spins.
        vec!["run", "--owner-gone-grace", "0s"],
        vec!["run", "--owner-gone-grace", "999ms"],
        vec!["run", "--resync", "1ms"],
        vec!["frobnicate"],
    ] {
        let out = std::process::Command::new(janitor_bin())
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error:"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        if args.get(1) == Some(&"--selector") && !args[2].contains(' ') {
            assert!(err.contains("key=value"), "{args:?}: {err}");
        }
    }
    // The same refusals from the environment.
    for (var, value) in [
        ("LOCK_JANITOR_SELECTOR", "lock-janitor.io/watch"),
        ("LOCK_JANITOR_OWNER_GONE_GRACE", "0s"),
        ("LOCK_JANITOR_RESYNC", "1ms"),
    ] {
        let out = std::process::Command::new(janitor_bin())
            .arg("run")
            .env(var, value)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        if var != "LOCK_JANITOR_SELECTOR" {
            assert!(err.contains("at least 1s"), "{var}={value}: {err}");
        }
    }
    let out = std::process::Command::new(janitor_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
    // No cluster: a clear error, exit 1.
    let out = std::process::Command::new(janitor_bin())
        .args(["run", "--metrics-bind-address", "127.0.0.1:0"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Kubernetes cluster found"));
}

/// A janitor started against an API server older than the oldest supported
/// minor says so and exits non-zero before it watches anything. The server
/// here is a stand-in that answers `/version` as v1.30.14 does (no 1.30
/// control plane is built); every supported minor runs the real one
/// (`make test-compat`).
#[tokio::test]
async fn an_api_server_older_than_supported_is_refused_at_start() {
    use axum::http::header;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let version = r#"{"major":"1","minor":"30","gitVersion":"v1.30.14","gitCommit":"","gitTreeState":"clean","buildDate":"1970-01-01T00:00:00Z","goVersion":"go1.23","compiler":"gc","platform":"linux/amd64"}"#;
    let app = axum::Router::new().route(
        "/version",
        axum::routing::get(move || async move {
            ([(header::CONTENT_TYPE, "application/json")], version)
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: old\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: old\n  context:\n    cluster: old\n    user: old\ncurrent-context: old\n\
             users:\n- name: old\n  user: {{}}\n"
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(janitor_bin())
        .args(["run", "--metrics-bind-address", "127.0.0.1:0"])
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the API server runs Kubernetes v1.30.14; lock-janitor supports Kubernetes 1.31 and later"),
        "{err}"
    );
}

/// Every write follows a live read of the lock and of its holder: a holder
/// that died and was recreated under its name (a StatefulSet pod, which
/// operator-lib takes for the leader by name) is seen by that read even
/// when the janitor's cached copy of the lock is the version it judged
/// held before: the lock is ambiguous, reported, and never deleted.
#[tokio::test]
async fn a_holder_recreated_under_its_name_is_seen_before_any_write() {
    use lock_janitor::lock::LockKey;
    let s = scenario("fastsame").await;
    let holder = s.pod("op-0").await;
    s.lock("op-lock", &holder).await;
    let state = lock_janitor::shared::Shared::new().unwrap();
    state.readiness.expect(0);
    let ctx = s.context_as(JANITOR_USER, state).await;
    let key = LockKey::configmap(s.ns.clone(), "op-lock");
    let mut cached = Api::<ConfigMap>::namespaced(s.client.clone(), &s.ns)
        .get_metadata("op-lock")
        .await
        .unwrap();
    lock_janitor::controller::strip_cached(&mut cached);
    let cached = std::sync::Arc::new(cached);
    lock_janitor::controller::reconcile(cached.clone(), ctx.clone(), Default::default())
        .await
        .unwrap();
    assert!(
        !ctx.memory
            .needs_judging(&key, cached.metadata.resource_version.as_deref().unwrap()),
        "judged held and settled"
    );

    // The holder fails and is replaced under its name before the janitor
    // looks (the garbage collector may take the lock meanwhile: either way
    // the janitor must not delete it).
    fail_with(&s, "op-0", "Evicted").await;
    kubelet::force_delete_pod(&s.client, &s.ns, "op-0")
        .await
        .unwrap();
    s.pod("op-0").await;
    ctx.memory.suspect(&key);
    lock_janitor::controller::reconcile(cached.clone(), ctx.clone(), Default::default())
        .await
        .unwrap();
    if lock_exists(&s.client, &s.ns, "op-lock").await {
        wait_event(&s.client, &s.ns, "AmbiguousLock", "op-lock").await;
    }
    let deletes: Vec<_> = s
        .janitor_writes()
        .into_iter()
        .filter(|e| e.verb == "delete")
        .collect();
    assert!(deletes.is_empty(), "{deletes:?}");
}

/// A lock there before the janitor starts is settled by the first sweep,
/// without a read of its own; when its holder dies, the lock and its holder
/// are both read live before the DELETE, and the holder once more after
/// the intent Event, right before it. A lock that holds data is read whole
/// and left alone (unmanageable).
#[tokio::test]
async fn a_lock_there_before_start_is_read_live_before_its_reclaim() {
    let s = scenario("learned").await;
    let leader = s.pod("leader").await;
    s.lock("op-lock", &leader).await;
    let other = s.pod("other").await;
    let mut with_data = lock_for("data-lock", &other, true);
    with_data.data = Some([("state".to_string(), "mine".to_string())].into());
    create_lock(&s.client, &with_data).await;
    let j = s.janitor(&[]).await;
    j.wait_ready().await;
    fail_with(&s, "leader", "Evicted").await;
    fail_with(&s, "other", "Evicted").await;
    s.wait_gone("op-lock").await;
    wait_event(&s.client, &s.ns, "UnmanageableLock", "data-lock").await;
    assert!(lock_exists(&s.client, &s.ns, "data-lock").await);
    let about = |e: &lock_janitor_testenv::audit::AuditEvent, name: &str, resource: &str| {
        e.effective_user() == JANITOR_USER
            && e.namespace.as_deref() == Some(s.ns.as_str())
            && e.resource.as_deref() == Some(resource)
            && e.subresource.is_none()
            && e.name.as_deref() == Some(name)
    };
    let log = || lock_janitor_testenv::audit::read(s.cp.audit_log_path());
    // The audit log may lag the API server's answers a moment.
    let log = wait_for(
        "the DELETE in the audit log",
        Duration::from_secs(30),
        || async {
            let log = log();
            log.iter()
                .any(|e| about(e, "op-lock", "configmaps") && e.verb == "delete")
                .then_some(log)
        },
    )
    .await;
    let mine = |name: &str, resource: &str, verb: &str| {
        log.iter()
            .filter(|e| about(e, name, resource) && e.verb == verb)
            .count()
    };
    // Before its DELETE (the takeover follower reads the lock afterwards,
    // 2 s on): the log is written as answers complete, and a read the
    // reclaim made was answered before the DELETE was sent.
    let before_delete = |resource: &str, name: &str| {
        log.iter()
            .take_while(|e| !(about(e, "op-lock", "configmaps") && e.verb == "delete"))
            .filter(|e| about(e, name, resource) && e.verb == "get")
            .count()
    };
    assert_eq!(
        before_delete("configmaps", "op-lock"),
        1,
        "the lock is read once, after its holder died"
    );
    assert!(before_delete("pods", "leader") >= 1, "and its holder");
    // The holder is read again after the intent Event: the last request
    // before the DELETE.
    let at = log
        .iter()
        .position(|e| about(e, "op-lock", "configmaps") && e.verb == "delete")
        .unwrap();
    let here: Vec<_> = log[..at]
        .iter()
        .filter(|e| e.namespace.as_deref() == Some(s.ns.as_str()))
        .cloned()
        .collect();
    assert_holder_read_last(&here, "op-lock", "leader");
    assert_eq!(mine("op-lock", "configmaps", "delete"), 1);
    assert!(
        mine("data-lock", "configmaps", "get") >= 1,
        "the lock with data is read whole"
    );
    assert_eq!(mine("data-lock", "configmaps", "delete"), 0);
}

/// The janitor's cached copy of a lock is behind: the lock was opted out
/// after its holder died. The live read before the write sees it: no
/// DELETE, and the lock is forgotten; the same stale copy again changes
/// nothing.
#[tokio::test]
async fn a_cached_copy_behind_the_lock_never_leads_to_a_delete() {
    use lock_janitor::lock::LockKey;
    let s = scenario("fast409").await;
    let holder = s.pod("holder").await;
    s.lock("op-lock", &holder).await;
    let state = lock_janitor::shared::Shared::new().unwrap();
    state.readiness.expect(0);
    let ctx = s.context_as(JANITOR_USER, state).await;
    let key = LockKey::configmap(s.ns.clone(), "op-lock");
    let metas: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    let mut cached = metas.get_metadata("op-lock").await.unwrap();
    lock_janitor::controller::strip_cached(&mut cached);
    let cached = std::sync::Arc::new(cached);
    lock_janitor::controller::reconcile(cached.clone(), ctx.clone(), Default::default())
        .await
        .unwrap();

    // The holder dies, and the lock is opted out before the watch says so.
    fail_with(&s, "holder", "Evicted").await;
    let opt_out = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: "false"}}});
    Api::<ConfigMap>::namespaced(s.client.clone(), &s.ns)
        .patch("op-lock", &PatchParams::default(), &Patch::Merge(&opt_out))
        .await
        .unwrap();
    for _ in 0..2 {
        ctx.memory.suspect(&key);
        lock_janitor::controller::reconcile(cached.clone(), ctx.clone(), Default::default())
            .await
            .unwrap();
    }
    assert!(
        lock_exists(&s.client, &s.ns, "op-lock").await,
        "opted out: kept"
    );
    assert!(
        ctx.memory
            .keys_in(None, lock_janitor::lock::LockKind::ConfigMap)
            .is_empty(),
        "forgotten"
    );
    let deletes: Vec<_> = s
        .janitor_writes()
        .into_iter()
        .filter(|e| e.verb == "delete" && e.resource.as_deref() == Some("configmaps"))
        .collect();
    assert!(deletes.is_empty(), "{deletes:?}");
}

/// The race: the lock is deleted and re-created by a live pod between the
/// judgement and the DELETE. The library's reclaim is driven directly with
/// the stale judgement; the API server's preconditions refuse the delete.
#[tokio::test]
async fn lock_recreated_between_judgement_and_delete_survives() {
    use lock_janitor::lock::LockKey;
    use lock_janitor::reclaim::Freed;
    let s = scenario("race").await;
    let dead = s.pod("dead").await;
    s.lock("op-lock", &dead).await;
    fail_with(&s, "dead", "Evicted").await;

    let ctx = s
        .context_as(JANITOR_USER, lock_janitor::shared::Shared::new().unwrap())
        .await;
    let key = LockKey::configmap(s.ns.clone(), "op-lock");
    let judged = ctx.judge_live(&key).await.unwrap().expect("lock exists");
    assert_eq!(
        judged.verdict.state(),
        lock_janitor::verdict::LockState::Stale
    );

    // Meanwhile: someone deletes the lock and a live replica takes it.
    let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    cms.delete("op-lock", &DeleteParams::default())
        .await
        .unwrap();
    let live = s.pod("live").await;
    let new_lock = s.lock("op-lock", &live).await;
    assert!(matches!(
        ctx.reclaimer.reclaim(&judged, |_| false).await.0.freed,
        Some(Freed::Changed(_))
    ));
    let now = cms.get("op-lock").await.unwrap();
    assert_eq!(
        now.metadata.uid, new_lock.metadata.uid,
        "the new lock survives"
    );

    // Same lock, changed since judged (resourceVersion): also refused. The
    // copy names the dead pod as its holder, so that the holder's read
    // right before the write lets the DELETE go and its precondition is
    // what refuses it.
    let judged = ctx.judge_live(&key).await.unwrap().unwrap();
    let mut stale_copy = judged.clone();
    if let Some(lock) = stale_copy.lock.as_mut() {
        lock.resource_version = "1".into();
        lock.holder.name = "dead".into();
        lock.holder.uid = dead.metadata.uid.clone().unwrap();
    }
    stale_copy.verdict = lock_janitor::verdict::Verdict::Stale {
        reason: lock_janitor::verdict::StaleReason::Evicted,
        died_at: None,
    };
    assert!(matches!(
        ctx.reclaimer.reclaim(&stale_copy, |_| false).await.0.freed,
        Some(Freed::Changed(_))
    ));
    assert!(lock_exists(&s.client, &s.ns, "op-lock").await);

    let conflicts: Vec<_> = s
        .janitor_writes()
        .into_iter()
        .filter(|e| e.verb == "delete" && e.resource.as_deref() == Some("configmaps"))
        .collect();
    assert_eq!(conflicts.len(), 2, "{conflicts:?}");
    assert!(
        conflicts.iter().all(|e| e.code == Some(409)),
        "{conflicts:?}"
    );
    // And a live judgement of the new lock says held.
    assert_eq!(
        ctx.judge_live(&key).await.unwrap().unwrap().verdict.state(),
        lock_janitor::verdict::LockState::Held
    );
}

/// `/readyz` is 503 until every watch has listed once, 200 after, and 503
/// again from the moment shutdown starts. The janitor starts as a user with
/// no RBAC, so its watches cannot list; once granted, they sync.
#[tokio::test]
async fn readyz_follows_the_watches() {
    use lock_janitor::controller;
    use lock_janitor::http;
    use lock_janitor::shared::Shared;
    let s = scenario("readyz").await;
    let user = format!("readyz-{}", s.ns);
    let state = Shared::new().unwrap();
    let listener = http::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(http::serve(
        listener,
        state.clone(),
        shutdown.clone().cancelled_owned(),
    ));
    assert_eq!(
        http_get(port, "/readyz").await.unwrap().0,
        503,
        "not ready before any watch"
    );
    assert_eq!(http_get(port, "/healthz").await.unwrap().0, 200);

    let ctx = s.context_as(&user, state.clone()).await;
    let run = tokio::spawn(controller::run(ctx, shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        http_get(port, "/readyz").await.unwrap().0,
        503,
        "not ready while the watches cannot list"
    );

    bind_cluster_role(&s.client, &user, JANITOR_USER).await;
    wait_for(
        "ready after the watches sync",
        Duration::from_secs(60),
        || async { (http_get(port, "/readyz").await.ok()?.0 == 200).then_some(()) },
    )
    .await;

    state.readiness.shutting_down();
    assert_eq!(
        http_get(port, "/readyz").await.unwrap().0,
        503,
        "not ready once shutdown starts"
    );
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("controller stops")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}

/// A routine rollout: the leader pod is deleted, the garbage collector (not
/// the janitor) deletes its lock, and the new leader re-creates it without
/// labels. The janitor still carries the opt-in label over.
#[tokio::test]
async fn label_is_carried_over_when_the_gc_deletes_the_lock() {
    let s = scenario("gc-takeover").await;
    let leader = s.pod("operator-a").await;
    let replica = s.pod("operator-b").await;
    become_leader(&s.client, &leader, "operator-lock", true).await;
    let kc = kubeconfig_as(s.cp, JANITOR_USER);
    let j = Janitor::start(
        &kc,
        &[
            "--namespace",
            &s.ns,
            "--resync",
            "2s",
            "--owner-gone-grace",
            "10m",
        ],
    )
    .await;
    wait_for("lock judged", Duration::from_secs(20), || async {
        (sample(
            &j.metrics().await,
            "lock_janitor_locks",
            &[("state", "held")],
        ) == Some(1.0))
        .then_some(())
    })
    .await;
    let waiting = {
        let client = s.client.clone();
        tokio::spawn(async move { become_leader(&client, &replica, "operator-lock", false).await })
    };
    kubelet::force_delete_pod(&s.client, &s.ns, "operator-a")
        .await
        .unwrap();
    let new_lock = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("takeover after the GC deleted the lock")
        .unwrap();
    assert_eq!(
        new_lock.metadata.owner_references.unwrap()[0].name,
        "operator-b"
    );
    let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    wait_for(
        "opt-in label carried over",
        Duration::from_secs(30),
        || async {
            let cm = cms.get("operator-lock").await.ok()?;
            (cm.metadata.labels?.get(WATCH_LABEL.0).map(String::as_str) == Some(WATCH_LABEL.1))
                .then_some(())
        },
    )
    .await;
    let writes = s.janitor_writes();
    assert!(
        writes.iter().all(|e| e.verb == "patch"),
        "the GC deleted the lock, not the janitor: {writes:?}"
    );
}

/// After a reclaim, a new lock that sets the opt-in key to another value
/// (`false`: an opt-out) is left as it is.
#[tokio::test]
async fn carry_over_respects_an_opt_out() {
    let s = scenario("opt-out").await;
    let leader = s.pod("operator-a").await;
    s.lock("operator-lock", &leader).await;
    let j = s.janitor(&[]).await;
    fail_with(&s, "operator-a", "Evicted").await;
    s.wait_gone("operator-lock").await;
    let replica = s.pod("operator-b").await;
    let mut opted_out = lock_for("operator-lock", &replica, false);
    opted_out.metadata.labels = Some([(WATCH_LABEL.0.to_string(), "false".to_string())].into());
    create_lock(&s.client, &opted_out).await;
    wait_for("the follower gives up", Duration::from_secs(30), || async {
        j.logs().contains("left alone").then_some(())
    })
    .await;
    let cm = Api::<ConfigMap>::namespaced(s.client.clone(), &s.ns)
        .get("operator-lock")
        .await
        .unwrap();
    assert_eq!(
        cm.metadata
            .labels
            .unwrap()
            .get(WATCH_LABEL.0)
            .map(String::as_str),
        Some("false")
    );
    assert!(
        s.janitor_writes().iter().all(|e| e.verb != "patch"),
        "{:?}",
        s.janitor_writes()
    );
}

/// Removing the opt-in label stops the janitor: a live read that no longer
/// matches the selector is not judged, and no label comes back.
#[tokio::test]
async fn removing_the_label_opts_out() {
    use lock_janitor::lock::LockKey;
    let s = scenario("unlabel").await;
    let leader = s.pod("operator-a").await;
    s.lock("operator-lock", &leader).await;
    let j = s.janitor(&[]).await;
    wait_for("lock judged", Duration::from_secs(20), || async {
        (sample(
            &j.metrics().await,
            "lock_janitor_locks",
            &[("state", "held")],
        ) == Some(1.0))
        .then_some(())
    })
    .await;

    // In-process: a judgement made from a live copy without the label.
    let ctx = s
        .context_as(JANITOR_USER, lock_janitor::shared::Shared::new().unwrap())
        .await;
    let key = LockKey::configmap(s.ns.clone(), "operator-lock");
    assert!(ctx.judge_live(&key).await.unwrap().is_some());
    let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    cms.patch(
        "operator-lock",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: null}}})),
    )
    .await
    .unwrap();
    assert!(
        ctx.judge_live(&key).await.unwrap().is_none(),
        "an unlabeled live copy is not judged"
    );

    // The running janitor lets go: the dead holder's lock stays, unlabeled.
    wait_for("lock forgotten", Duration::from_secs(20), || async {
        (sample(
            &j.metrics().await,
            "lock_janitor_locks",
            &[("state", "held")],
        ) == Some(0.0))
        .then_some(())
    })
    .await;
    fail_with(&s, "operator-a", "Evicted").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let cm = cms
        .get("operator-lock")
        .await
        .expect("the unlabeled lock stays");
    assert!(!cm
        .metadata
        .labels
        .unwrap_or_default()
        .contains_key(WATCH_LABEL.0));
    assert!(s.janitor_writes().is_empty(), "{:?}", s.janitor_writes());
}

/// A stale lock held back by a finalizer: the DELETE only sets its
/// deletionTimestamp. The janitor says so (log, Warning Event, stale gauge)
/// and never counts it reclaimed; once the finalizer goes, the lock is gone.
#[tokio::test]
async fn a_lock_kept_by_a_finalizer_is_reported_not_counted() {
    let s = scenario("finalizer").await;
    let leader = s.pod("leader").await;
    let mut cm = lock_for("op-lock", &leader, true);
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    create_lock(&s.client, &cm).await;
    let j = s.janitor(&[]).await;
    fail_with(&s, "leader", "Evicted").await;

    let ev = wait_event(&s.client, &s.ns, "LockDeletionBlocked", "op-lock").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert!(
        ev.note
            .as_deref()
            .unwrap_or_default()
            .contains("example.com/hold"),
        "{ev:?}"
    );
    let stale = [
        ("lock_namespace", s.ns.as_str()),
        ("lock", "op-lock"),
        ("reason", "Evicted"),
    ];
    wait_for("stale gauge set", Duration::from_secs(20), || async {
        (sample(&j.metrics().await, "lock_janitor_stale_locks", &stale) == Some(1.0)).then_some(())
    })
    .await;
    let m = j.metrics().await;
    assert_ne!(
        sample(&m, "lock_janitor_reclaims_total", &stale),
        Some(1.0),
        "{m}"
    );
    assert!(!j.logs().contains("stale lock reclaimed"), "{}", j.logs());
    let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    let kept = cms
        .get("op-lock")
        .await
        .expect("the finalizer keeps the lock");
    assert!(kept.metadata.deletion_timestamp.is_some());
    // One DELETE (it started the deletion); resyncs do not send another.
    let deletes = || {
        s.janitor_writes()
            .into_iter()
            .filter(|e| e.verb == "delete")
            .count()
    };
    let before = sample(&m, "lock_janitor_reconcile_duration_seconds_count", &[]).unwrap();
    wait_for("two more reconciles", Duration::from_secs(20), || async {
        let now = sample(
            &j.metrics().await,
            "lock_janitor_reconcile_duration_seconds_count",
            &[],
        )?;
        (now >= before + 2.0).then_some(())
    })
    .await;
    assert_eq!(deletes(), 1, "{:?}", s.janitor_writes());

    cms.patch(
        "op-lock",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    s.wait_gone("op-lock").await;
    wait_for("stale gauge cleared", Duration::from_secs(20), || async {
        (sample(&j.metrics().await, "lock_janitor_stale_locks", &stale).is_none()).then_some(())
    })
    .await;
}

/// A holder whose phase is terminal but whose status still shows a running
/// container is not proof of death: the lock is held, through resyncs.
#[tokio::test]
async fn a_terminal_holder_with_a_running_container_is_held() {
    let s = scenario("still-running").await;
    let leader = s.pod("leader").await;
    s.lock("op-lock", &leader).await;
    let j = s.janitor(&[]).await;
    // Phase Failed, but the container status still says running.
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let live = pods.get_status("leader").await.unwrap();
    let mut status = live.status.clone().unwrap();
    status.phase = Some("Failed".into());
    status.reason = Some("Terminated".into());
    pods.patch_status(
        "leader",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": status})),
    )
    .await
    .unwrap();
    let running = pods.get("leader").await.unwrap();
    assert!(running
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .running
        .is_some());

    let before = sample(
        &j.metrics().await,
        "lock_janitor_reconcile_duration_seconds_count",
        &[],
    )
    .unwrap_or(0.0);
    wait_for("three more reconciles", Duration::from_secs(30), || async {
        let now = sample(
            &j.metrics().await,
            "lock_janitor_reconcile_duration_seconds_count",
            &[],
        )?;
        (now >= before + 3.0).then_some(())
    })
    .await;
    assert!(lock_exists(&s.client, &s.ns, "op-lock").await);
    let m = j.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_locks", &[("state", "held")]),
        Some(1.0),
        "{m}"
    );
    assert!(s.janitor_writes().is_empty(), "{:?}", s.janitor_writes());

    // Once the kubelet reports the container terminated, it is reclaimed.
    kubelet::set_failed(&s.client, &s.ns, "leader", "Terminated", "node shutdown")
        .await
        .unwrap();
    s.wait_gone("op-lock").await;
}

/// After a reclaim with no waiting replica, the janitor says NoTakeover
/// (on the lock by name and on the dead pod) once --takeover-timeout passes,
/// even across a restart: what is awaited comes back from its own
/// StaleLockReclaimed Events. A replica that finally creates the lock is a
/// takeover: LockTakenOver on the new lock, a histogram sample, nothing
/// awaited any more.
#[tokio::test]
async fn no_takeover_is_said_and_survives_a_restart() {
    let s = scenario("no-takeover").await;
    let leader = s.pod("leader").await;
    s.lock("op-lock", &leader).await;
    let args = ["--takeover-timeout", "6s"];
    let mut first = s.janitor(&args).await;
    fail_with(&s, "leader", "Evicted").await;
    s.wait_gone("op-lock").await;
    let awaited = [("lock_namespace", s.ns.as_str()), ("lock", "op-lock")];
    wait_for("awaiting the takeover", Duration::from_secs(10), || async {
        (sample(
            &first.metrics().await,
            "lock_janitor_awaiting_takeover",
            &awaited,
        ) == Some(1.0))
        .then_some(())
    })
    .await;
    wait_event(&s.client, &s.ns, "StaleLockReclaimed", "op-lock").await;

    // A restart before the timeout: the new janitor awaits it too.
    first.kill();
    let second = s.janitor(&args).await;
    wait_for(
        "awaited again after the restart",
        Duration::from_secs(20),
        || async {
            (sample(
                &second.metrics().await,
                "lock_janitor_awaiting_takeover",
                &awaited,
            ) == Some(1.0))
            .then_some(())
        },
    )
    .await;
    let on_lock = wait_event(&s.client, &s.ns, "NoTakeover", "op-lock").await;
    assert_eq!(on_lock.type_.as_deref(), Some("Warning"));
    assert!(
        on_lock
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("rollout restart"),
        "{on_lock:?}"
    );
    wait_event(&s.client, &s.ns, "NoTakeover", "leader").await;
    let m = second.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_takeover_timeouts_total", &awaited),
        Some(1.0),
        "{m}"
    );
    assert!(second.logs().contains("no takeover"), "{}", second.logs());

    // A replica finally takes the lock.
    let late = s.pod("late").await;
    become_leader(&s.client, &late, "op-lock", false).await;
    let ev = wait_event(&s.client, &s.ns, "LockTakenOver", "op-lock").await;
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    wait_for("no longer awaited", Duration::from_secs(30), || async {
        let m = second.metrics().await;
        (sample(&m, "lock_janitor_awaiting_takeover", &awaited).is_none()
            && sample(&m, "lock_janitor_takeover_seconds_count", &[]) == Some(1.0))
        .then_some(())
    })
    .await;
}
