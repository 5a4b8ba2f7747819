//! End-to-end on a control plane whose garbage collector is off, as when it
//! is backlogged in a large cluster: locks whose holder pod is gone stay, so
//! the janitor is the one that acts (or, when in doubt, refuses to).
//! Each test starts its own control plane and stops it at the end.

use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, ControlPlane, Options};

async fn no_gc_plane() -> (ControlPlane, Client) {
    let cp = ControlPlane::start(Options {
        garbage_collector: false,
        ..Default::default()
    })
    .await
    .expect("control plane without garbage collector");
    let client = cp.client().await.expect("client");
    grant_janitor(&client).await;
    (cp, client)
}

async fn janitor(cp: &ControlPlane, extra: &[&str]) -> Janitor {
    let mut args = vec!["--resync", "1s", "--owner-gone-grace", "3s"];
    args.extend_from_slice(extra);
    Janitor::start(&kubeconfig_as(cp, JANITOR_USER), &args).await
}

#[tokio::test]
async fn owner_gone_lock_is_reclaimed_after_the_grace() {
    let (cp, client) = no_gc_plane().await;
    let ns = fresh_namespace(&client, "owner-gone").await;
    let leader = running_pod(&client, &ns, "leader", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &leader, true)).await;
    let j = janitor(&cp, &[]).await;

    kubelet::force_delete_pod(&client, &ns, "leader")
        .await
        .unwrap();
    wait_for("lock reclaimed", Duration::from_secs(30), || async {
        (!lock_exists(&client, &ns, "op-lock").await).then_some(())
    })
    .await;
    assert!(
        j.logs().contains("reclaiming after the owner-gone grace"),
        "the janitor waited out the grace first:\n{}",
        j.logs()
    );
    let labels = [
        ("lock_namespace", ns.as_str()),
        ("lock", "op-lock"),
        ("reason", "OwnerGone"),
    ];
    let m = metrics_reclaimed(&j, &labels, 1.0).await;
    assert_eq!(
        sample(&m, "lock_janitor_reclaims_total", &labels),
        Some(1.0),
        "{m}"
    );
    let ev = wait_event(&client, &ns, "StaleLockReclaimed", "op-lock").await;
    assert!(ev.note.unwrap_or_default().contains("no longer exists"));
    drop(j);
    cp.stop();
}

#[tokio::test]
async fn same_name_other_uid_is_ambiguous_and_never_reclaimed() {
    let (cp, client) = no_gc_plane().await;
    let ns = fresh_namespace(&client, "ambiguous").await;
    let old = running_pod(&client, &ns, "stateful-0", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &old, true)).await;
    // A StatefulSet recreates its pod under the same name (new uid); the new
    // pod believes it still leads, so the lock must stay.
    kubelet::force_delete_pod(&client, &ns, "stateful-0")
        .await
        .unwrap();
    let new = running_pod(&client, &ns, "stateful-0", "node-a").await;
    assert_ne!(new.metadata.uid, old.metadata.uid);
    let j = janitor(&cp, &["--delete-pod"]).await;

    let ev = wait_event(&client, &ns, "AmbiguousLock", "op-lock").await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    // Several resyncs (1 s) and more than the owner-gone grace later: still there.
    wait_for("resyncs", Duration::from_secs(30), || async {
        let n = sample(
            &j.metrics().await,
            "lock_janitor_reconcile_duration_seconds_count",
            &[],
        )?;
        (n >= 5.0).then_some(())
    })
    .await;
    assert!(lock_exists(&client, &ns, "op-lock").await);
    assert!(
        writes_by(&cp, JANITOR_USER, &ns).is_empty(),
        "{:?}",
        writes_by(&cp, JANITOR_USER, &ns)
    );
    let m = j.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_locks", &[("state", "ambiguous")]),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        events(&client, &ns, "AmbiguousLock").await.len(),
        1,
        "one Event per lock version"
    );
    drop(j);
    cp.stop();
}

#[tokio::test]
async fn owner_in_another_namespace_is_unmanageable() {
    let (cp, client) = no_gc_plane().await;
    let ns = fresh_namespace(&client, "cross-a").await;
    let other = fresh_namespace(&client, "cross-b").await;
    let pod = running_pod(&client, &other, "leader", "node-a").await;
    // A lock in `ns` naming a pod that lives in `other`: owner references
    // cannot cross namespaces; someone wrote this by hand.
    let mut lock = lock_for("op-lock", &pod, true);
    lock.metadata.namespace = Some(ns.clone());
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &lock)
        .await
        .unwrap();
    let j = janitor(&cp, &[]).await;

    let ev = wait_event(&client, &ns, "UnmanageableLock", "op-lock").await;
    assert!(
        ev.note.unwrap_or_default().contains(&other),
        "names the other namespace"
    );
    wait_for(
        "resyncs past the grace",
        Duration::from_secs(30),
        || async {
            let n = sample(
                &j.metrics().await,
                "lock_janitor_reconcile_duration_seconds_count",
                &[],
            )?;
            (n >= 6.0).then_some(())
        },
    )
    .await;
    assert!(lock_exists(&client, &ns, "op-lock").await);
    assert!(writes_by(&cp, JANITOR_USER, &ns).is_empty());
    drop(j);
    cp.stop();
}
