use super::*;
use crate::lock::Holder;
use k8s_openapi::api::core::v1::PodStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn lock() -> Lock {
    Lock {
        namespace: "ops".into(),
        name: "op-lock".into(),
        uid: "lock-uid".into(),
        resource_version: "7".into(),
        created: None,
        holder: Holder {
            name: "op-0".into(),
            uid: "u1".into(),
        },
        deleting: None,
    }
}

fn pod(uid: &str, phase: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("op-0".into()),
            namespace: Some("ops".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The holder read again right before the write: the write goes on
/// only if it is still as judged.
#[test]
fn the_write_goes_on_only_for_the_holder_as_judged() {
    let l = lock();
    let evicted = StaleReason::Evicted;
    let cases: [(StaleReason, Option<Pod>, bool); 8] = [
        // Still dead, the same pod.
        (evicted, Some(pod("u1", "Failed")), true),
        (StaleReason::Succeeded, Some(pod("u1", "Succeeded")), true),
        // Made again under its name (a StatefulSet), any phase.
        (evicted, Some(pod("u2", "Running")), false),
        (evicted, Some(pod("u2", "Failed")), false),
        // Gone since: judged again.
        (evicted, None, false),
        // Owner gone: still absent, or there again.
        (StaleReason::OwnerGone, None, true),
        (StaleReason::OwnerGone, Some(pod("u2", "Pending")), false),
        (StaleReason::OwnerGone, Some(pod("u1", "Running")), false),
    ];
    for (reason, p, writes) in cases {
        let changed = holder_changed(&l, reason, p.as_ref());
        assert_eq!(changed.is_none(), writes, "{reason} {p:?}: {changed:?}");
    }
    // The judged uid, no longer terminal (a status written by hand).
    assert!(holder_changed(&l, evicted, Some(&pod("u1", "Running"))).is_some());
}
