//! What a lock is: the holder it names, its identity down to the
//! resourceVersion, or exactly why the janitor will not manage it. One file
//! per lock kind parses it (`configmap`: operator-lib's leader-for-life).

pub mod configmap;

pub use configmap::{holds_data, lock_shaped, looks_like_lock, parse, parse_shaped};

use std::fmt;

use k8s_openapi::jiff::Timestamp;

/// A lock by namespace and name: how the controller and its memory know it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

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
    /// The lock is being deleted (deletionTimestamp set): these finalizers
    /// hold it, and it still blocks a takeover until they are removed.
    pub deleting: Option<Vec<String>>,
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
    /// The ConfigMap holds `data` or `binaryData`: not lock-shaped
    /// (operator-lib's locks are empty). Deleting it would lose that data.
    HoldsData,
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
            Unmanageable::HoldsData => "HoldsData",
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
            Unmanageable::HoldsData => write!(
                f,
                "it holds data, and a leader-for-life lock is empty; deleting it would lose that data"
            ),
            Unmanageable::OwnerInOtherNamespace(ns) => write!(
                f,
                "its owner pod exists only in namespace {ns}; owner references cannot cross namespaces"
            ),
        }
    }
}
