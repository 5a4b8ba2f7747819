//! Test fixtures shared by the unit tests: lock-shaped metadata; the objects
//! a reclaim reads and a mocked API server behind `kube::Client` (`api`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

mod api;
pub use api::*;

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A v1 Pod ownerReference.
pub fn pod_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.into(),
        uid: uid.into(),
        ..Default::default()
    }
}

/// The metadata of ConfigMap ops/op-lock with these owners and labels.
pub fn lock_meta(owners: Vec<OwnerReference>, lbl: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: Some("ops".into()),
        name: Some("op-lock".into()),
        uid: Some("cm-uid".into()),
        resource_version: Some("7".into()),
        creation_timestamp: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
        owner_references: Some(owners),
        labels: Some(labels(lbl)),
        ..Default::default()
    }
}
