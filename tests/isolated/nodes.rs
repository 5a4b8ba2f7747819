//! End-to-end with the node-lifecycle controller on (10 s node-monitor
//! grace): a holder on a node that goes NotReady, then unreachable, may still
//! run (a network partition), so its lock is held. Kubernetes' own proof
//! that a node is dead is the `node.kubernetes.io/out-of-service` taint an
//! admin applies: then PodGC force-deletes the node's terminating pods and
//! the garbage collector deletes their locks. Own control plane.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::Api;
use lock_janitor_testenv::{fresh_namespace, kubelet, ControlPlane, Options};

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

#[tokio::test]
async fn holders_on_lost_nodes_are_held_until_out_of_service() {
    let cp = ControlPlane::start(Options {
        node_lifecycle: true,
        ..Default::default()
    })
    .await
    .expect("control plane with node lifecycle");
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "lost-node").await;
    let node = "node-lost";
    kubelet::create_node(&client, node).await.unwrap();

    // A kubelet that posts heartbeats until told to stop.
    let beating = Arc::new(AtomicBool::new(true));
    let heart = {
        let (client, beating) = (client.clone(), beating.clone());
        tokio::spawn(async move {
            while beating.load(Ordering::SeqCst) {
                let _ = kubelet::heartbeat(&client, node).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    };
    let leader = running_pod(&client, &ns, "leader", node).await;
    create_lock(&client, &lock_for("op-lock", &leader, true)).await;
    let j = Janitor::start(
        &kubeconfig_as(&cp, JANITOR_USER),
        &[
            "--namespace",
            &ns,
            "--resync",
            "1s",
            "--owner-gone-grace",
            "60s",
        ],
    )
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let reconciles = async || {
        sample(
            &j.metrics().await,
            "lock_janitor_reconcile_duration_seconds_count",
            &[],
        )
        .unwrap_or(0.0)
    };
    // Held through a live judgement made after `what` (a change to the lock
    // makes the janitor read it and its holder again) and two resync sweeps.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let held_through = async |what: &str| {
        let before = reconciles().await;
        let poke = serde_json::json!({"metadata": {"annotations": {"test/poke": what}}});
        cms.patch("op-lock", &PatchParams::default(), &Patch::Merge(&poke))
            .await
            .unwrap();
        wait_for(what, Duration::from_secs(30), || async {
            (reconciles().await > before).then_some(())
        })
        .await;
        j.wait_sweeps(2).await;
        assert!(lock_exists(&client, &ns, "op-lock").await, "{what}");
        let m = j.metrics().await;
        assert_eq!(
            sample(&m, "lock_janitor_locks", &[("state", "held")]),
            Some(1.0),
            "{what}: {m}"
        );
        assert!(
            writes_by(&cp, JANITOR_USER, &ns).is_empty(),
            "{what}: {:?}",
            writes_by(&cp, JANITOR_USER, &ns)
        );
    };

    // NotReady: the kubelet stops and its last word is Ready=False.
    beating.store(false, Ordering::SeqCst);
    heart.await.unwrap();
    let not_ready = serde_json::json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "KubeletNotReady",
        "message": "container runtime is down",
        "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    }]}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&not_ready))
        .await
        .unwrap();
    wait_for("not-ready taint", Duration::from_secs(30), || async {
        has_taint(&nodes.get(node).await.ok()?, "node.kubernetes.io/not-ready").then_some(())
    })
    .await;
    held_through("node NotReady").await;

    // Unreachable: no heartbeat for the grace; the controller marks the
    // node Unknown and taints it.
    wait_for("unreachable taint", Duration::from_secs(60), || async {
        has_taint(
            &nodes.get(node).await.ok()?,
            "node.kubernetes.io/unreachable",
        )
        .then_some(())
    })
    .await;
    let phase = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.clone());
    assert_eq!(
        phase(&pods.get("leader").await.unwrap()).as_deref(),
        Some("Running")
    );
    held_through("node unreachable, holder Running").await;

    // The holder's phase Unknown (what older control planes wrote): held.
    let unknown = serde_json::json!({"status": {"phase": "Unknown"}});
    pods.patch_status("leader", &PatchParams::default(), &Patch::Merge(&unknown))
        .await
        .unwrap();
    held_through("node unreachable, holder Unknown").await;

    // The admin's proof of death: out-of-service. Taint eviction deletes the
    // pod (no kubelet confirms: it stays terminating), PodGC force-deletes
    // terminating pods on out-of-service nodes, and the garbage collector
    // deletes the lock.
    let started = Instant::now();
    let taint = serde_json::json!({"spec": {"taints": [
        {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    ]}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .unwrap();
    wait_for("holder pod gone", Duration::from_secs(120), || async {
        pods.get_opt("leader").await.ok()?.is_none().then_some(())
    })
    .await;
    let pod_gone = started.elapsed();
    wait_for("lock deleted", Duration::from_secs(60), || async {
        (!lock_exists(&client, &ns, "op-lock").await).then_some(())
    })
    .await;
    let lock_gone = started.elapsed();
    println!(
        "out-of-service taint -> holder pod force-deleted in {:.1}s, lock deleted in {:.1}s",
        pod_gone.as_secs_f64(),
        lock_gone.as_secs_f64()
    );
    // The garbage collector freed it (the janitor's 60 s owner-gone grace
    // had not passed); the janitor saw the lock go and awaits a takeover.
    assert!(
        writes_by(&cp, JANITOR_USER, &ns).is_empty(),
        "{:?}",
        writes_by(&cp, JANITOR_USER, &ns)
    );
    wait_for(
        "janitor reports the deletion",
        Duration::from_secs(10),
        || async { j.logs().contains("watched lock deleted").then_some(()) },
    )
    .await;
}
