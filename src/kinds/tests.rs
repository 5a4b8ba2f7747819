//! The registry's rules: every object has one kind, and each kind's
//! candidate shape (moved here with the rules from `lock::candidate`).

use super::*;
use crate::fixtures::{lock_meta, pod_owner};
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;

fn configmap(cm: &ConfigMap) -> Option<Shape> {
    configmap_candidate(cm)
}

fn lease(l: &Lease) -> Option<Shape> {
    candidate(Object::Lease(l))
}

fn cm(owners: Vec<OwnerReference>, data: Option<&str>) -> ConfigMap {
    ConfigMap {
        metadata: lock_meta(owners, &[]),
        data: data.map(|d| [("k".to_string(), d.to_string())].into()),
        ..Default::default()
    }
}

#[test]
fn configmaps_held_for_life() {
    let one = || vec![pod_owner("op-1", "u1")];
    assert_eq!(
        configmap(&cm(one(), None)),
        Some(Shape::HeldForLife(LockKind::ConfigMap))
    );
    assert_eq!(configmap(&cm(one(), Some("spark"))), None, "holds data");
    let two = vec![pod_owner("a", "1"), pod_owner("b", "2")];
    assert_eq!(configmap(&cm(two, None)), None, "two owners");
    assert_eq!(configmap(&cm(vec![], None)), None, "no owner");
    assert_eq!(configmap(&cm(vec![pod_owner("", "1")], None)), None);
    assert_eq!(configmap(&cm(vec![pod_owner("a", "")], None)), None);
    let rs = OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        ..pod_owner("op", "1")
    };
    assert_eq!(configmap(&cm(vec![rs], None)), None, "not a pod");
    let custom = OwnerReference {
        api_version: "example.com/v1".into(),
        ..pod_owner("op", "1")
    };
    assert_eq!(configmap(&cm(vec![custom], None)), None, "not core/v1");
}

fn lease_with(owners: Vec<OwnerReference>, ns: &str, spec: LeaseSpec) -> Lease {
    Lease {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some("op-lease".into()),
            uid: Some("lu".into()),
            resource_version: Some("3".into()),
            owner_references: Some(owners),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

fn renewed(identity: &str) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(identity.into()),
        lease_duration_seconds: Some(15),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..Default::default()
    }
}

#[test]
fn leases_renewed_or_held_for_life() {
    let cr = "op-7d9c-x2x_0c3e5a12-4b1f-4a2e-9d7c-1f2e3d4c5b6a";
    assert_eq!(
        lease(&lease_with(vec![], "ops", renewed(cr))),
        Some(Shape::NamesAPod(LockKind::Lease, "op-7d9c-x2x".into()))
    );
    assert_eq!(
        lease(&lease_with(vec![], "ops", renewed("op-0")))
            .and_then(|s| s.host().map(str::to_owned)),
        Some("op-0".into())
    );
    let nais = LeaseSpec {
        holder_identity: Some("op-a".into()),
        ..Default::default()
    };
    assert_eq!(
        lease(&lease_with(vec![pod_owner("op-a", "u")], "ops", nais)),
        Some(Shape::HeldForLife(LockKind::Lease))
    );
    // Released, an identity that names no pod, a node heartbeat, one the
    // API server elects: none.
    assert_eq!(
        lease(&lease_with(vec![], "ops", LeaseSpec::default())),
        None
    );
    assert_eq!(
        lease(&lease_with(vec![], "ops", renewed("10.0.0.1:80"))),
        None
    );
    assert_eq!(
        lease(&lease_with(vec![], "kube-node-lease", renewed("node-a"))),
        None
    );
    let cle = LeaseSpec {
        strategy: Some("OldestEmulationVersion".into()),
        ..renewed("op-0")
    };
    assert_eq!(lease(&lease_with(vec![], "ops", cle)), None);
    // Held with no renew time and no owner: nothing tells when it ends.
    let bare = LeaseSpec {
        holder_identity: Some("op-0".into()),
        ..Default::default()
    };
    assert_eq!(lease(&lease_with(vec![], "ops", bare)), None);
}
