//! A lock is a ConfigMap that names its leader through its only ownerReference
//! (operator-lib's leader-for-life format). Parsing says either what the lock
//! is, or exactly why the janitor will not manage it.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

/// The pod a lock names: the leader, alive or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub name: String,
    pub uid: String,
}

/// A leader-for-life lock as it was read, identified down to its
/// resourceVersion so that a delete can be made conditional on exactly it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lock {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub created: Option<Timestamp>,
    pub holder: Holder,
}

/// Why a labeled ConfigMap is not a lock the janitor can judge. Such objects
/// are reported, never deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unmanageable {
    /// The object lacks the name, namespace, uid or resourceVersion every
    /// stored object has; only a broken or fake read produces this.
    IncompleteMetadata,
    NoOwner,
    SeveralOwners(usize),
    /// The only owner is not a core/v1 Pod.
    NotAPod {
        api_version: String,
        kind: String,
    },
    EmptyOwnerName,
    EmptyOwnerUid,
    /// The holder's uid belongs to a pod in another namespace. Owner
    /// references cannot cross namespaces; something wrote this lock by hand.
    OwnerInOtherNamespace(String),
}

impl Unmanageable {
    /// A bounded label for logs and Events (never contains object names).
    pub fn code(&self) -> &'static str {
        match self {
            Unmanageable::IncompleteMetadata => "IncompleteMetadata",
            Unmanageable::NoOwner => "NoOwner",
            Unmanageable::SeveralOwners(_) => "SeveralOwners",
            Unmanageable::NotAPod { .. } => "NotAPod",
            Unmanageable::EmptyOwnerName => "EmptyOwnerName",
            Unmanageable::EmptyOwnerUid => "EmptyOwnerUid",
            Unmanageable::OwnerInOtherNamespace(_) => "OwnerInOtherNamespace",
        }
    }
}

impl fmt::Display for Unmanageable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unmanageable::IncompleteMetadata => {
                write!(f, "the object has no name, namespace, uid or resourceVersion")
            }
            Unmanageable::NoOwner => write!(f, "it has no ownerReference, so it names no holder pod"),
            Unmanageable::SeveralOwners(n) => write!(
                f,
                "it has {n} ownerReferences; a leader-for-life lock has exactly one, of kind Pod"
            ),
            Unmanageable::NotAPod { api_version, kind } => write!(
                f,
                "its owner is a {kind} ({api_version}), not a v1 Pod"
            ),
            Unmanageable::EmptyOwnerName => write!(f, "its Pod ownerReference has an empty name"),
            Unmanageable::EmptyOwnerUid => write!(f, "its Pod ownerReference has an empty uid"),
            Unmanageable::OwnerInOtherNamespace(ns) => write!(
                f,
                "its owner pod exists only in namespace {ns}; owner references cannot cross namespaces"
            ),
        }
    }
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

/// Reads a ConfigMap's metadata as a lock. Only metadata matters: the owner
/// lives there, and the data (up to 1 MiB) is never needed.
pub fn parse(meta: &ObjectMeta) -> Result<Lock, Unmanageable> {
    let (Some(namespace), Some(name), Some(uid), Some(resource_version)) = (
        non_empty(&meta.namespace),
        non_empty(&meta.name),
        non_empty(&meta.uid),
        non_empty(&meta.resource_version),
    ) else {
        return Err(Unmanageable::IncompleteMetadata);
    };
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
    if owner.uid.is_empty() {
        return Err(Unmanageable::EmptyOwnerUid);
    }
    Ok(Lock {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        resource_version: resource_version.to_owned(),
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        holder: Holder {
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        },
    })
}

/// Whether the ownerReferences look like a leader-for-life lock at all
/// (exactly one owner, of kind Pod). `scan` and `label` use this to find
/// unlabeled candidates; a candidate can still be unmanageable (empty uid).
pub fn looks_like_lock(meta: &ObjectMeta) -> bool {
    matches!(meta.owner_references.as_deref(), Some([one]) if one.kind == "Pod" && one.api_version == "v1")
}

/// What `label` does with one lock-shaped ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Add `key=value`.
    Add,
    /// It already has `key=value`.
    Unchanged,
    /// It has `key` with another value (a deliberate opt-out?): never overwritten.
    Conflicting(String),
}

/// Decides what `label` does with a ConfigMap; `None`: not a candidate, never touched.
pub fn plan_label(meta: &ObjectMeta, key: &str, value: &str) -> Option<Plan> {
    if !looks_like_lock(meta) {
        return None;
    }
    Some(match meta.labels.as_ref().and_then(|l| l.get(key)) {
        Some(v) if v == value => Plan::Unchanged,
        Some(v) => Plan::Conflicting(v.clone()),
        None => Plan::Add,
    })
}

/// The merge patch `label` writes: the label, and the resourceVersion that
/// was read, which makes the patch conditional (409 if the ConfigMap changed
/// since).
pub fn label_patch(meta: &ObjectMeta, key: &str, value: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": meta.resource_version,
            "labels": { key: value },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod_owner(name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

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
    fn candidates_need_exactly_one_pod_owner() {
        assert!(looks_like_lock(&meta(Some(vec![pod_owner("a", "")]))));
        assert!(!looks_like_lock(&meta(None)));
        assert!(!looks_like_lock(&meta(Some(vec![
            pod_owner("a", "1"),
            pod_owner("b", "2")
        ]))));
    }
}
