//! A takeover is awaited (`lock_janitor_awaiting_takeover`, and `NoTakeover`
//! with `lock_janitor_takeover_timeouts_total` past `--takeover-timeout`)
//! only where someone must act: for a lock the janitor freed itself, while
//! its namespace stays and its holder's workload still asks for replicas.
//! Deployments and ReplicaSets are real objects here: the control plane's
//! replicaset controller makes the pods (there is no deployment controller,
//! so the test scales both as it would).

use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// A Deployment `name` of `replicas`, and its ReplicaSet (owned by it, as
/// the deployment controller makes it) whose pods are bound to `node`; the
/// replicaset controller creates them. Returns the first pod, Running.
async fn operator(client: &Client, ns: &str, name: &str, node: &str) -> Pod {
    let labels = json!({"app": name});
    let template = json!({
        "metadata": {"labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": kubelet::PAUSE_IMAGE}]},
    });
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
    }))
    .unwrap();
    let d = deployments
        .create(&PostParams::default(), &d)
        .await
        .expect("deployment");
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{name}-5d8f7"),
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                "uid": d.metadata.uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
    }))
    .unwrap();
    Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &rs)
        .await
        .expect("replicaset");
    let pods = pods_of(client, ns, name, 1).await;
    let pod = pods[0].metadata.name.clone().unwrap_or_default();
    kubelet::set_running(client, ns, &pod)
        .await
        .expect("running")
}

/// The pods of `app`, once there are at least `n`.
async fn pods_of(client: &Client, ns: &str, app: &str, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("app={app}"));
    wait_for(&format!("{n} pods of {app}"), WAIT, || async {
        let list = pods.list(&lp).await.ok()?.items;
        (list.len() >= n).then_some(list)
    })
    .await
}

/// Scales a Deployment and its ReplicaSet, as the deployment controller
/// would.
async fn scale(client: &Client, ns: &str, name: &str, replicas: i32) {
    let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &patch)
        .await
        .expect("scale deployment");
    Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .patch(&format!("{name}-5d8f7"), &PatchParams::default(), &patch)
        .await
        .expect("scale replicaset");
}

async fn wait_gone(client: &Client, ns: &str, lock: &str) {
    wait_for(&format!("lock {ns}/{lock} gone"), WAIT, || async {
        (!lock_exists(client, ns, lock).await).then_some(())
    })
    .await
}

/// Four freed or deleted locks; only the one whose Deployment still asks
/// for a replica, which never takes the lock, is said missing.
#[tokio::test]
async fn a_takeover_is_awaited_only_while_someone_wants_the_operator() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "awaited").await;
    let pruned = fresh_namespace(&client, "pruned").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");

    let kept = operator(&client, &ns, "kept", &node).await;
    create_lock(&client, &lock_for("kept-lock", &kept, true)).await;
    let paused = operator(&client, &ns, "paused", &node).await;
    create_lock(&client, &lock_for("paused-lock", &paused, true)).await;
    let by_hand = running_pod(&client, &ns, "by-hand", &node).await;
    create_lock(&client, &lock_for("hand-lock", &by_hand, true)).await;
    let gone_with_ns = running_pod(&client, &pruned, "leader", &node).await;
    create_lock(&client, &lock_for("pruned-lock", &gone_with_ns, true)).await;

    let j = Janitor::start(
        &kubeconfig_as(cp, JANITOR_USER),
        &[
            "--namespace",
            &ns,
            "--namespace",
            &pruned,
            "--resync",
            "2s",
            "--takeover-timeout",
            "3s",
        ],
    )
    .await;

    // Someone else deletes a lock: followed for its label, never awaited.
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .delete("hand-lock", &DeleteParams::default())
        .await
        .expect("delete by hand");

    // The operator is scaled to 0: its pod stops (Succeeded, being
    // deleted), the janitor frees the lock, and nobody is meant to take it.
    scale(&client, &ns, "paused", 0).await;
    let pod = paused.metadata.name.clone().unwrap_or_default();
    kubelet::set_succeeded(&client, &ns, &pod)
        .await
        .expect("stopped");
    wait_gone(&client, &ns, "paused-lock").await;

    // A leader evicted, its lock freed, then its namespace is pruned.
    kubelet::set_failed(&client, &pruned, "leader", "Evicted", "low on memory")
        .await
        .expect("evict");
    wait_gone(&client, &pruned, "pruned-lock").await;
    Api::<Namespace>::all(client.clone())
        .delete(&pruned, &DeleteParams::default())
        .await
        .expect("delete namespace");

    // Last, the leader of a Deployment that still asks for one replica: its
    // ReplicaSet makes a new pod, which never takes the lock.
    let pod = kept.metadata.name.clone().unwrap_or_default();
    kubelet::set_failed(&client, &ns, &pod, "Evicted", "low on memory")
        .await
        .expect("evict");
    wait_gone(&client, &ns, "kept-lock").await;
    pods_of(&client, &ns, "kept", 2).await;
    let said = wait_event(&client, &ns, "NoTakeover", "kept-lock").await;
    assert_eq!(said.type_.as_deref(), Some("Warning"), "{said:?}");

    // Freed or deleted before it, none of the others timed out.
    let kept_awaited = [("lock_namespace", ns.as_str()), ("lock", "kept-lock")];
    let m = wait_for("the kept lock's timeout counted", WAIT, || async {
        let m = j.metrics().await;
        (sample(&m, "lock_janitor_takeover_timeouts_total", &kept_awaited) == Some(1.0))
            .then_some(m)
    })
    .await;
    let timed_out: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("lock_janitor_takeover_timeouts_total{"))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert_eq!(timed_out.len(), 1, "{m}");
    assert!(timed_out[0].contains("lock=\"kept-lock\""), "{m}");
    let awaiting: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("lock_janitor_awaiting_takeover{"))
        .collect();
    assert!(
        awaiting.iter().all(|l| l.contains("lock=\"kept-lock\"")),
        "{m}"
    );
    let said: Vec<String> = events(&client, &ns, "NoTakeover")
        .await
        .into_iter()
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    assert!(
        said.iter().all(|n| n == "kept-lock" || n == &pod),
        "NoTakeover only on the kept lock and its dead holder: {said:?}"
    );
    let logs = j.logs();
    // The paused operator's lock is dropped from the followers once its
    // Deployment is read at 0, unless the scale-down deleted the dead
    // holder before the janitor's write: the holder's read right before
    // the write then stops it, the garbage collector deletes the lock, and
    // a lock the janitor did not free is never awaited at all.
    let paused_dropped = logs.contains("deployment scaled to 0")
        || (logs.contains("following its name to label a new holder's lock namespace=")
            && logs.contains("lock=paused-lock holder="));
    assert!(
        paused_dropped
            && (logs.contains("namespace being deleted") || logs.contains("namespace deleted")),
        "{logs}"
    );
}

/// What is awaited comes back after a restart from the janitor's own
/// Events, and whether the operator still wants a leader from the API: a
/// janitor started after the reclaim of a paused operator's lock (its
/// timeout long past) reads the holder pod's workload and awaits nothing,
/// while a bare pod's lock freed alongside is said missing.
#[tokio::test]
async fn a_restarted_janitor_reads_again_that_the_operator_is_paused() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "awaited-restart").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    let paused = operator(&client, &ns, "paused", &node).await;
    create_lock(&client, &lock_for("paused-lock", &paused, true)).await;
    let bare = running_pod(&client, &ns, "bare", &node).await;
    create_lock(&client, &lock_for("bare-lock", &bare, true)).await;

    let kc = kubeconfig_as(cp, JANITOR_USER);
    let args = |timeout: &'static str| {
        [
            "--namespace".to_owned(),
            ns.clone(),
            "--resync".into(),
            "2s".into(),
            "--takeover-timeout".into(),
            timeout.into(),
        ]
    };
    // The first janitor would wait an hour: it is gone long before.
    let first_args = args("1h");
    let first_args: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let mut first = Janitor::start(&kc, &first_args).await;
    // Both judged held before their holders end: the reclaims below
    // follow the ends the janitor saw, as in a cluster where it ran first.
    wait_for("both locks judged held", WAIT, || async {
        let m = first.metrics().await;
        let held = sample(
            &m,
            "lock_janitor_locks",
            &[("kind", "configmap"), ("state", "held")],
        );
        (held == Some(2.0)).then_some(())
    })
    .await;
    let pod = paused.metadata.name.clone().unwrap_or_default();
    kubelet::set_succeeded(&client, &ns, &pod)
        .await
        .expect("stopped");
    kubelet::set_failed(&client, &ns, "bare", "Evicted", "low on memory")
        .await
        .expect("evict");
    for lock in ["paused-lock", "bare-lock"] {
        wait_gone(&client, &ns, lock).await;
        wait_event(&client, &ns, "StaleLockReclaimed", lock).await;
    }
    // The operator is paused once its lock is freed, not before: a
    // scale-down first races the janitor, as the ReplicaSet deletes the
    // holder and the garbage collector its lock, and then nothing is
    // reclaimed at all (the test above allows for it; this one needs the
    // reclaim's record). Its replacement pod says the ReplicaSet has seen
    // the holder end, so the scale-down leaves the ended holder be: the
    // restarted janitor reads its workload from it.
    pods_of(&client, &ns, "paused", 2).await;
    scale(&client, &ns, "paused", 0).await;
    first.kill();

    // Its successor's timeout is already past for both.
    let second_args = args("1s");
    let second_args: Vec<&str> = second_args.iter().map(String::as_str).collect();
    let second = Janitor::start(&kc, &second_args).await;
    wait_event(&client, &ns, "NoTakeover", "bare-lock").await;
    wait_for(
        "the paused operator's lock no longer awaited",
        WAIT,
        || async {
            second
                .logs()
                .contains("deployment scaled to 0")
                .then_some(())
        },
    )
    .await;
    let m = second.metrics().await;
    let paused_lock = [("lock_namespace", ns.as_str()), ("lock", "paused-lock")];
    assert_eq!(
        sample(&m, "lock_janitor_takeover_timeouts_total", &paused_lock),
        None,
        "{m}"
    );
    assert_eq!(
        sample(&m, "lock_janitor_awaiting_takeover", &paused_lock),
        None,
        "{m}"
    );
    let said: Vec<String> = events(&client, &ns, "NoTakeover")
        .await
        .into_iter()
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    assert!(
        !said.iter().any(|n| n == "paused-lock" || n == &pod),
        "{said:?}"
    );
}
