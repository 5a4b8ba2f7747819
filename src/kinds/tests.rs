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

fn lease_object(owners: Vec<OwnerReference>, spec: LeaseSpec) -> Lease {
    let mut meta = lock_meta(owners, &[]);
    meta.name = Some("op-lease".into());
    Lease {
        metadata: meta,
        spec: Some(spec),
    }
}

/// Every object has exactly the kind the registry's order gives it; the
/// odd shapes fall to the kind that writes nothing unsafe for them.
#[test]
fn every_object_has_one_kind() {
    let kind = |o: Object<'_>| {
        let k = of(o);
        (k.resource(), k.judged())
    };
    let renewed = LeaseSpec {
        holder_identity: Some("op-a".into()),
        lease_duration_seconds: Some(15),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..Default::default()
    };
    let nais = LeaseSpec {
        holder_identity: Some("op-a".into()),
        ..Default::default()
    };
    let other = LeaseSpec {
        holder_identity: Some("op-b".into()),
        ..Default::default()
    };
    let owner = || vec![pod_owner("op-a", "u")];
    let l = lease_object(owner(), nais);
    assert_eq!(kind(Object::Lease(&l)), (LockKind::Lease, Judged::ByOwner));
    let l = lease_object(owner(), renewed.clone());
    assert_eq!(
        kind(Object::Lease(&l)),
        (LockKind::Lease, Judged::ByRenewals),
        "owner and renewTime"
    );
    let l = lease_object(owner(), other);
    assert_eq!(
        kind(Object::Lease(&l)),
        (LockKind::Lease, Judged::ByRenewals),
        "owner names another"
    );
    let l = lease_object(vec![], renewed);
    assert_eq!(
        kind(Object::Lease(&l)),
        (LockKind::Lease, Judged::ByRenewals)
    );
    let m = lock_meta(vec![], &[]);
    assert_eq!(
        kind(Object::ConfigMapMeta(&m)),
        (LockKind::ConfigMap, Judged::ByOwner),
        "no owner"
    );
    let m = lock_meta(owner(), &[]);
    assert_eq!(
        kind(Object::ConfigMapMeta(&m)),
        (LockKind::ConfigMap, Judged::ByOwner)
    );
}

/// The official Java client's Lease: only when it alone wrote both the
/// holder identity and the renew time, each entry with its field set.
#[test]
fn a_lease_is_the_java_clients_only_when_it_alone_wrote_holder_and_renewal() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    let entry = |manager: &str, fields: serde_json::Value| ManagedFieldsEntry {
        manager: Some(manager.into()),
        operation: Some("Update".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(fields)),
        ..Default::default()
    };
    let both = serde_json::json!({"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}});
    let renew = serde_json::json!({"f:spec": {"f:renewTime": {}}});
    let label = serde_json::json!({"f:metadata": {"f:labels": {"f:x": {}}}});
    let java = "Kubernetes Java Client";
    let with = |entries: Vec<ManagedFieldsEntry>| {
        let mut l = lease_with(vec![], "ops", renewed("op-a"));
        l.metadata.managed_fields = Some(entries);
        lease::held_by_the_java_client(&l)
    };
    assert!(with(vec![
        entry(java, both.clone()),
        entry("lock-janitor", label.clone())
    ]));
    // Another client renewing under the same identity: the holder keeps
    // its first writer, the renew time names the renewer.
    assert!(!with(vec![
        entry(
            java,
            serde_json::json!({"f:spec": {"f:holderIdentity": {}}})
        ),
        entry("fabric8-kubernetes-client", renew.clone())
    ]));
    assert!(!with(vec![
        entry(java, both.clone()),
        entry("fabric8-kubernetes-client", both.clone())
    ]));
    assert!(!with(vec![entry(
        "fabric8-kubernetes-client",
        both.clone()
    )]));
    // Another client owning anything of the spec took part.
    assert!(!with(vec![
        entry(java, both.clone()),
        entry(
            "fabric8-kubernetes-client",
            serde_json::json!({"f:spec": {"f:leaseDurationSeconds": {}}})
        )
    ]));
    // Nobody owns the renew time.
    assert!(!with(vec![entry(
        java,
        serde_json::json!({"f:spec": {"f:holderIdentity": {}}})
    )]));
    assert!(!with(vec![]));
    assert!(!with(vec![entry(java, label)]));
    let mut unknown = entry("other", both);
    unknown.fields_v1 = None;
    assert!(!with(vec![
        entry(
            java,
            serde_json::json!({"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}})
        ),
        unknown
    ]));
    assert!(!lease::held_by_the_java_client(&lease_with(
        vec![],
        "ops",
        renewed("op-a")
    )));
}

/// What tells two kinds apart (they are zero-sized statics: two may share
/// an address).
fn identity(k: &dyn Kind) -> (LockKind, Judged, &'static str) {
    (k.resource(), k.judged(), k.words().done)
}

/// Every registered kind has its cases for the shared freeing-write tests,
/// each named once, in its resource, and a lock each case holds is of that
/// kind: a kind without cases would be skipped there silently.
#[test]
fn every_kind_brings_its_freeing_write_cases() {
    let mut names = std::collections::BTreeSet::new();
    let mut kinds = Vec::new();
    for &k in KINDS {
        assert!(!kinds.contains(&identity(k)), "{:?} twice", identity(k));
        kinds.push(identity(k));
        assert!(!k.cases().is_empty(), "{:?} has no case", identity(k));
        for case in k.cases() {
            assert!(names.insert(case.name()), "{} twice", case.name());
            assert_eq!(case.key().kind, k.resource(), "{}", case.name());
            let live = case.live();
            let claimed = match k.resource() {
                LockKind::ConfigMap => {
                    let cm: ConfigMap = serde_json::from_value(live).unwrap();
                    identity(of(Object::ConfigMap(&cm)))
                }
                LockKind::Lease => {
                    let l: Lease = serde_json::from_value(live).unwrap();
                    identity(of(Object::Lease(&l)))
                }
            };
            assert_eq!(claimed, identity(k), "{}", case.name());
        }
    }
}
