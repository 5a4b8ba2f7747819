//! The leader-for-life lock: a ConfigMap that names its leader through its
//! only ownerReference (operator-lib). Only metadata matters: the owner lives
//! there, and the data (up to 1 MiB) is never needed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{object_id, Holder, Lock, Unmanageable};

/// Reads a ConfigMap's metadata as a lock.
pub fn parse(meta: &ObjectMeta) -> Result<Lock, Unmanageable> {
    let (namespace, name, uid, resource_version) = object_id(meta)?;
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    let owner = match owners {
        [] => return Err(Unmanageable::NoOwner),
        [one] => one,
        many => return Err(Unmanageable::SeveralOwners(many.len())),
    };
    if owner.kind != "Pod" || owner.api_version != "v1" {
        return Err(Unmanageable::NotAPod {
            api_version: owner.api_version.clone(),
            kind: owner.kind.clone(),
        });
    }
    if owner.name.is_empty() {
        return Err(Unmanageable::EmptyOwnerName);
    }
    if !crate::dns_subdomain(&owner.name) {
        return Err(Unmanageable::OwnerNameNotAPod);
    }
    if owner.uid.is_empty() {
        return Err(Unmanageable::EmptyOwnerUid);
    }
    Ok(Lock {
        namespace,
        name,
        uid,
        resource_version,
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        holder: Holder {
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        },
        deleting: meta
            .deletion_timestamp
            .as_ref()
            .map(|_| meta.finalizers.clone().unwrap_or_default()),
    })
}

/// Reads a ConfigMap as a lock when it is known whether it holds data: one
/// that does is never a lock the janitor judges.
pub fn parse_shaped(meta: &ObjectMeta, holds_data: bool) -> Result<Lock, Unmanageable> {
    let lock = parse(meta)?;
    if holds_data {
        return Err(Unmanageable::HoldsData);
    }
    Ok(lock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod_owner;
    use crate::lock::{lock_shaped, looks_like_lock};
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(owners: Option<Vec<OwnerReference>>) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("ops".into()),
            name: Some("memcached-operator-lock".into()),
            uid: Some("cm-uid".into()),
            resource_version: Some("42".into()),
            owner_references: owners,
            ..Default::default()
        }
    }

    #[test]
    fn one_pod_owner_is_a_lock() {
        let lock = parse(&meta(Some(vec![pod_owner("op-1", "pod-uid")]))).unwrap();
        assert_eq!(lock.namespace, "ops");
        assert_eq!(lock.name, "memcached-operator-lock");
        assert_eq!(lock.uid, "cm-uid");
        assert_eq!(lock.resource_version, "42");
        assert_eq!(
            lock.holder,
            Holder {
                name: "op-1".into(),
                uid: "pod-uid".into()
            }
        );
    }

    #[test]
    fn unmanageable_shapes() {
        let deployment = OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "op".into(),
            uid: "d-uid".into(),
            ..Default::default()
        };
        let custom_pod = OwnerReference {
            api_version: "example.com/v1".into(),
            ..pod_owner("op-1", "x")
        };
        let cases = vec![
            (meta(None), Unmanageable::NoOwner),
            (meta(Some(vec![])), Unmanageable::NoOwner),
            (
                meta(Some(vec![pod_owner("a", "1"), pod_owner("b", "2")])),
                Unmanageable::SeveralOwners(2),
            ),
            (
                meta(Some(vec![deployment])),
                Unmanageable::NotAPod {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                },
            ),
            (
                meta(Some(vec![custom_pod])),
                Unmanageable::NotAPod {
                    api_version: "example.com/v1".into(),
                    kind: "Pod".into(),
                },
            ),
            (
                meta(Some(vec![pod_owner("", "1")])),
                Unmanageable::EmptyOwnerName,
            ),
            (
                meta(Some(vec![pod_owner("a b", "1")])),
                Unmanageable::OwnerNameNotAPod,
            ),
            (
                meta(Some(vec![pod_owner("op/eviction", "1")])),
                Unmanageable::OwnerNameNotAPod,
            ),
            (
                meta(Some(vec![pod_owner("a", "")])),
                Unmanageable::EmptyOwnerUid,
            ),
            (
                ObjectMeta {
                    uid: None,
                    ..meta(Some(vec![pod_owner("a", "1")]))
                },
                Unmanageable::IncompleteMetadata,
            ),
            (
                ObjectMeta {
                    resource_version: Some(String::new()),
                    ..meta(Some(vec![pod_owner("a", "1")]))
                },
                Unmanageable::IncompleteMetadata,
            ),
        ];
        for (m, want) in cases {
            assert_eq!(parse(&m), Err(want.clone()), "{want}");
            assert!(!want.to_string().is_empty());
        }
    }

    #[test]
    fn lock_shaped_means_empty() {
        let owned = |data: Option<&str>, binary: bool| ConfigMap {
            metadata: meta(Some(vec![pod_owner("a", "1")])),
            data: data.map(|d| [("k".to_string(), d.to_string())].into()),
            binary_data: binary
                .then(|| [("b".to_string(), k8s_openapi::ByteString(vec![1]))].into()),
            ..Default::default()
        };
        assert!(lock_shaped(&owned(None, false)));
        assert!(lock_shaped(&ConfigMap {
            data: Some(Default::default()),
            ..owned(None, false)
        }));
        assert!(!lock_shaped(&owned(Some("spark"), false)));
        assert!(!lock_shaped(&owned(Some(""), false)));
        assert!(!lock_shaped(&owned(None, true)));
        assert!(!lock_shaped(&ConfigMap {
            metadata: meta(None),
            ..Default::default()
        }));
        // Judged: a lock that holds data is unmanageable, whatever its owner.
        let m = meta(Some(vec![pod_owner("a", "1")]));
        assert!(parse_shaped(&m, false).is_ok());
        assert_eq!(parse_shaped(&m, true), Err(Unmanageable::HoldsData));
        assert_eq!(parse_shaped(&meta(None), true), Err(Unmanageable::NoOwner));
    }

    #[test]
    fn candidates_need_exactly_one_pod_owner_with_a_name_and_uid() {
        assert!(looks_like_lock(&meta(Some(vec![pod_owner("a", "1")]))));
        assert!(!looks_like_lock(&meta(Some(vec![pod_owner("a", "")]))));
        assert!(!looks_like_lock(&meta(None)));
        assert!(!looks_like_lock(&meta(Some(vec![
            pod_owner("a", "1"),
            pod_owner("b", "2")
        ]))));
    }
}
