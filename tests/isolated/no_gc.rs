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

/// A Lease held for life (nais/elector's shape: one Pod ownerReference,
/// holderIdentity the pod's name, acquireTime, neither renewTime nor
/// leaseDurationSeconds) whose Running owner is force-deleted: no
/// terminal-pod event ever names it and no garbage collector takes it, so
/// the resync sweep finds the owner missing and the Lease is deleted after
/// the owner-gone grace, as a ConfigMap lock is: the owner read live after
/// the intent Event, right before a DELETE with uid and resourceVersion
/// preconditions. (Before, the sweep asked only after terminal owners of
/// Leases: the Lease stayed held for good.)
#[tokio::test]
async fn a_lease_held_for_life_whose_owner_is_gone_is_deleted_after_the_grace() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;
    let (cp, client) = no_gc_plane().await;
    let ns = fresh_namespace(&client, "lease-owner-gone").await;
    let owner = running_pod(&client, &ns, "elector-0", "node-a").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let lease = leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: ObjectMeta {
                    name: Some("for-life".into()),
                    owner_references: Some(vec![pod_owner(&owner)]),
                    labels: Some([(WATCH_LABEL.0.into(), WATCH_LABEL.1.into())].into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some("elector-0".into()),
                    acquire_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                    ..Default::default()
                }),
            },
        )
        .await
        .unwrap();
    let j = janitor(&cp, &[]).await;
    // Judged held first (its owner runs): on the old code, nothing after
    // this would ever judge it again.
    wait_for("the Lease judged held", Duration::from_secs(30), || async {
        let m = j.metrics().await;
        (sample(
            &m,
            "lock_janitor_locks",
            &[("kind", "lease"), ("state", "held")],
        ) == Some(1.0))
        .then_some(())
    })
    .await;

    kubelet::force_delete_pod(&client, &ns, "elector-0")
        .await
        .unwrap();
    let gone = std::time::Instant::now();
    // The grace (3 s) plus 10 s.
    wait_for(
        "the Lease held for life deleted",
        Duration::from_secs(13),
        || async {
            leases
                .get_opt("for-life")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "deleted {:.1}s after its owner was force-deleted",
        gone.elapsed().as_secs_f64()
    );
    // The grace (3 s) was waited out: nothing freed it sooner.
    assert!(
        gone.elapsed() >= Duration::from_secs(3),
        "deleted {:?} after its owner was force-deleted, within the 3 s grace",
        gone.elapsed()
    );
    assert!(
        j.logs().contains("reclaiming after the owner-gone grace"),
        "the janitor waited out the grace first:\n{}",
        j.logs()
    );
    let labels = [
        ("lock_namespace", ns.as_str()),
        ("lock", "for-life"),
        ("kind", "lease"),
        ("reason", "OwnerGone"),
    ];
    let m = metrics_reclaimed(&j, &labels, 1.0).await;
    assert_eq!(
        sample(&m, "lock_janitor_reclaims_total", &labels),
        Some(1.0),
        "{m}"
    );
    let ev = wait_event(&client, &ns, "StaleLockReclaimed", "for-life").await;
    assert_eq!(
        ev.regarding.and_then(|r| r.kind).as_deref(),
        Some("Lease"),
        "the Event is on the Lease"
    );
    assert!(ev.note.unwrap_or_default().contains("no longer exists"));

    // The janitor's requests about the Lease and its owner, in the order
    // the API server answered them: the DELETE carries the uid and
    // resourceVersion read, and the owner's GET is the last request before
    // it, after the intent Event.
    let mine = |e: &lock_janitor_testenv::audit::AuditEvent| {
        e.effective_user() == JANITOR_USER && e.namespace.as_deref() == Some(ns.as_str())
    };
    let log = wait_for(
        "the DELETE in the audit log",
        Duration::from_secs(30),
        || async {
            let log: Vec<_> = lock_janitor_testenv::audit::read(cp.audit_log_path())
                .into_iter()
                .filter(mine)
                .collect();
            log.iter()
                .any(|e| e.verb == "delete" && e.resource.as_deref() == Some("leases"))
                .then_some(log)
        },
    )
    .await;
    let at = log
        .iter()
        .position(|e| e.verb == "delete" && e.resource.as_deref() == Some("leases"))
        .unwrap();
    let delete = &log[at];
    assert_eq!(delete.code, Some(200), "{delete:?}");
    let pre = delete
        .request_object
        .as_ref()
        .and_then(|b| b.get("preconditions"))
        .unwrap_or_else(|| panic!("a DELETE without preconditions: {delete:?}"));
    assert_eq!(pre["uid"].as_str(), lease.metadata.uid.as_deref());
    assert!(
        pre["resourceVersion"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{pre}"
    );
    assert_holder_read_last(&log[..at], "for-life", "elector-0");
    drop(j);
    cp.stop();
}

/// The holder is read again after the intent Event, the last request
/// before the DELETE: a holder made again under its name between the
/// judgement and the write (a StatefulSet pod, which operator-lib takes for
/// the leader by name; the lock's uid and resourceVersion preconditions
/// cannot see it, and no garbage collector took the lock) stops the write.
/// Nothing is deleted; judged again, the lock is ambiguous. (Before, the
/// DELETE went through on the judgement's read.)
#[tokio::test]
async fn a_holder_made_again_after_the_judgement_stops_the_delete() {
    use lock_janitor::lock::LockKey;
    use lock_janitor::reclaim::Freed;
    use lock_janitor::verdict::LockState;
    let (cp, client) = no_gc_plane().await;
    let ns = fresh_namespace(&client, "reread").await;
    let holder = running_pod(&client, &ns, "stateful-0", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &holder, true)).await;
    kubelet::set_failed(&client, &ns, "stateful-0", "Evicted", "test")
        .await
        .unwrap();
    let ctx = context(&cp, &ns).await;
    let key = LockKey::configmap(ns.clone(), "op-lock");
    let judged = ctx.judge_live(&key).await.unwrap().expect("opted in");
    assert_eq!(judged.verdict.state(), LockState::Stale, "{judged:?}");
    kubelet::force_delete_pod(&client, &ns, "stateful-0")
        .await
        .unwrap();
    running_pod(&client, &ns, "stateful-0", "node-a").await;

    let (done, error) = ctx.reclaimer.reclaim(&judged, |_| false).await;
    assert!(error.is_none(), "{error:?}");
    assert!(
        matches!(done.freed, Some(Freed::Changed(_))),
        "{:?}",
        done.freed
    );
    assert!(lock_exists(&client, &ns, "op-lock").await);
    let deletes: Vec<_> = writes_by(&cp, JANITOR_USER, &ns)
        .into_iter()
        .filter(|e| e.verb == "delete")
        .collect();
    assert!(deletes.is_empty(), "{deletes:?}");
    assert_eq!(
        ctx.judge_live(&key).await.unwrap().unwrap().verdict.state(),
        LockState::Ambiguous
    );
    cp.stop();
}

/// The janitor's library, as the janitor's user, for the ConfigMap locks
/// of `ns` (no election: it always writes).
async fn context(cp: &ControlPlane, ns: &str) -> std::sync::Arc<lock_janitor::controller::Context> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig_as(cp, JANITOR_USER)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let state = lock_janitor::shared::Shared::new().unwrap();
    state.readiness.expect(0);
    lock_janitor::controller::Context::new(
        Client::try_from(config).unwrap(),
        state,
        lock_janitor::controller::Settings {
            kinds: vec![lock_janitor::lock::LockKind::ConfigMap],
            selector: lock_janitor::selector::Selector::parse(lock_janitor::DEFAULT_SELECTOR)
                .unwrap(),
            namespaces: vec![ns.to_owned()],
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
