//! End-to-end with the real operator-lib (v0.19.0) `leader.Become` as the
//! leader and its waiting replicas (`testenv/peers`), on the real control
//! plane, with the janitor as its own user. Tests play the kubelet: a pod's
//! death is its status write, and its peer process is killed with it.

use std::time::{Duration, Instant};

use crate::support::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use lock_janitor_testenv::peers::Peer;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};

const LOCK: &str = "memcached-operator-lock";

struct Operator {
    cp: &'static ControlPlane,
    client: Client,
    ns: String,
    node: String,
}

impl Operator {
    async fn new(prefix: &str) -> Operator {
        let cp = shared().await;
        let client = cp.client().await.expect("admin client");
        grant_janitor(&client).await;
        let ns = fresh_namespace(&client, prefix).await;
        let node = format!("node-{ns}");
        kubelet::create_node(&client, &node).await.expect("node");
        Operator {
            cp,
            client,
            ns,
            node,
        }
    }

    /// A replica: its Pod object (Running) and operator-lib in it, trying
    /// to become the leader.
    async fn replica(&self, name: &str) -> (Pod, Peer) {
        let pod = running_pod(&self.client, &self.ns, name, &self.node).await;
        let peer = Peer::become_leader(
            self.cp.kubeconfig_path(),
            self.cp.dir(),
            &self.ns,
            name,
            LOCK,
        )
        .expect("start the operator-lib peer");
        (pod, peer)
    }

    async fn lock(&self) -> Option<ConfigMap> {
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.ns)
            .get_opt(LOCK)
            .await
            .expect("get the lock")
    }

    async fn owner(&self) -> Option<String> {
        let cm = self.lock().await?;
        Some(cm.metadata.owner_references?.first()?.name.clone())
    }

    async fn wait_labeled(&self, owner: &str) {
        wait_for(
            &format!("the opt-in label on the lock of {owner}"),
            Duration::from_secs(30),
            || async {
                let cm = self.lock().await?;
                let labeled = cm.metadata.labels?.get(WATCH_LABEL.0).map(String::as_str)
                    == Some(WATCH_LABEL.1);
                let mine = cm.metadata.owner_references?.first()?.name == owner;
                (labeled && mine).then_some(())
            },
        )
        .await
    }

    /// Waits until operator-lib in `peer` has found the lock taken and
    /// waits (its own log line).
    async fn wait_waiting(&self, peer: &Peer) {
        wait_for(
            "the replica waiting for the lock",
            Duration::from_secs(30),
            || async {
                peer.logs()
                    .contains("Not the leader. Waiting.")
                    .then_some(())
            },
        )
        .await
    }
}

/// Three failovers in a row, each of a death operator-lib alone cannot
/// resolve at once: node shutdown (reason Terminated, which operator-lib
/// never handles), a Succeeded leader, an eviction (operator-lib deletes
/// the evicted pod itself, but then waits for the garbage collector). The
/// janitor reclaims each lock, the waiting replica leads, and the opt-in
/// label is carried over so that the next failover works too.
#[tokio::test]
async fn real_operator_lib_fails_over_three_times() {
    let op = Operator::new("operator-lib").await;
    let (_a, mut peer_a) = op.replica("operator-a").await;
    peer_a
        .wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(op.owner().await.as_deref(), Some("operator-a"));
    // operator-lib creates its lock without labels: opt it in as an admin
    // would, with the janitor's own command.
    let kc = kubeconfig_as(op.cp, JANITOR_USER);
    let out = std::process::Command::new(janitor_bin())
        .args(["label", "--apply", "--namespace", &op.ns])
        .env("KUBECONFIG", &kc)
        .output()
        .expect("run lock-janitor label");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    op.wait_labeled("operator-a").await;

    let janitor = Janitor::start(&kc, &["--namespace", &op.ns, "--resync", "5s"]).await;

    let deaths: [(&str, &str, &str); 3] = [
        ("operator-a", "operator-b", "Terminated"),
        ("operator-b", "operator-c", "Succeeded"),
        ("operator-c", "operator-d", "Evicted"),
    ];
    let mut leader_peer = peer_a;
    for (dead, next, how) in deaths {
        let (_pod, mut waiting) = op.replica(next).await;
        op.wait_waiting(&waiting).await;
        assert!(!waiting.is_leading(), "{next} leads while {dead} runs");
        // The kubelet stops the leader's containers and writes its status.
        leader_peer.kill();
        let died = Instant::now();
        match how {
            "Succeeded" => {
                kubelet::set_succeeded(&op.client, &op.ns, dead)
                    .await
                    .expect("succeeded");
            }
            reason => {
                kubelet::set_failed(&op.client, &op.ns, dead, reason, "test")
                    .await
                    .expect("failed");
            }
        }
        let led = waiting
            .wait_leading(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{next} after {dead} {how}: {e}\njanitor:\n{}",
                    janitor.logs()
                )
            });
        eprintln!(
            "{next} leads {:.1}s after {dead} {how}",
            (led - died).as_secs_f64()
        );
        assert_eq!(op.owner().await.as_deref(), Some(next));
        op.wait_labeled(next).await;
        leader_peer = waiting;
    }

    // The janitor deleted only the lock and patched only its label. After
    // the eviction operator-lib's replica may, on a retry that falls in the
    // janitor's few milliseconds, delete the evicted pod first (then the
    // garbage collector deletes the lock): the counts agree either way.
    let m = janitor.metrics().await;
    let reclaimed = |reason: &str| {
        sample(
            &m,
            "lock_janitor_reclaims_total",
            &[
                ("lock_namespace", op.ns.as_str()),
                ("lock", LOCK),
                ("reason", reason),
            ],
        )
    };
    assert_eq!(reclaimed("Shutdown"), Some(1.0), "{m}");
    assert_eq!(reclaimed("Succeeded"), Some(1.0), "{m}");
    let evicted = reclaimed("Evicted").unwrap_or(0.0) as usize;
    let writes = writes_by(op.cp, JANITOR_USER, &op.ns);
    let deletes: Vec<_> = writes.iter().filter(|e| e.verb == "delete").collect();
    assert_eq!(deletes.len(), 2 + evicted, "{writes:#?}\n{m}");
    for d in &deletes {
        assert_eq!(d.resource.as_deref(), Some("configmaps"), "{d:?}");
        assert_eq!(d.name.as_deref(), Some(LOCK), "{d:?}");
        assert_eq!(d.code, Some(200), "{d:?}");
    }
    assert!(
        writes
            .iter()
            .filter(|e| e.verb != "delete")
            .all(|e| e.verb == "patch" && e.name.as_deref() == Some(LOCK)),
        "{writes:#?}"
    );
    assert_eq!(
        sample(&m, "lock_janitor_takeover_seconds_count", &[]),
        Some(3.0),
        "{m}"
    );
}

/// With the lock opted in but no janitor, operator-lib alone is stuck
/// after a node shutdown: its replica keeps waiting. The janitor, started
/// later, frees it at once.
#[tokio::test]
async fn real_operator_lib_alone_is_stuck_after_a_node_shutdown() {
    let op = Operator::new("operator-lib-stuck").await;
    let (_a, mut peer_a) = op.replica("operator-a").await;
    peer_a
        .wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let cms: Api<ConfigMap> = Api::namespaced(op.client.clone(), &op.ns);
    let label = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: WATCH_LABEL.1}}});
    cms.patch(LOCK, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("opt in");
    let (_b, mut peer_b) = op.replica("operator-b").await;
    op.wait_waiting(&peer_b).await;
    peer_a.kill();
    kubelet::set_failed(
        &op.client,
        &op.ns,
        "operator-a",
        "Terminated",
        "node shutdown",
    )
    .await
    .expect("failed");
    // Two more of the replica's own attempts see the dead leader and wait
    // (operator-lib deletes only Evicted and Preempting leaders).
    let waits = |p: &Peer| p.logs().matches("Not the leader. Waiting.").count();
    let before = waits(&peer_b);
    wait_for(
        "two more attempts of the replica",
        Duration::from_secs(60),
        || async { (waits(&peer_b) >= before + 2).then_some(()) },
    )
    .await;
    assert!(!peer_b.is_leading(), "{}", peer_b.logs());
    assert_eq!(op.owner().await.as_deref(), Some("operator-a"));

    let kc = kubeconfig_as(op.cp, JANITOR_USER);
    let janitor = Janitor::start(&kc, &["--namespace", &op.ns]).await;
    peer_b
        .wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\njanitor:\n{}", janitor.logs()));
    assert_eq!(op.owner().await.as_deref(), Some("operator-b"));
}
