//! What a lock is: the holder it names, its identity down to the
//! resourceVersion, or exactly why the janitor will not manage it. One file
//! per lock kind parses it (`configmap`: operator-lib's leader-for-life;
//! `lease`: client-go's leader election); `candidate` holds each kind's
//! candidate shape.

pub mod candidate;
pub mod configmap;
pub mod lease;

pub use candidate::{holds_data, lock_shaped, one_pod_owner as looks_like_lock};
pub use configmap::{parse, parse_shaped};

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

/// The kinds of lock; `as_str` is the `kind` label of the metrics and the
/// value of `--lock-kinds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockKind {
    ConfigMap,
    Lease,
}

impl LockKind {
    pub const ALL: [LockKind; 2] = [LockKind::ConfigMap, LockKind::Lease];

    pub fn as_str(self) -> &'static str {
        match self {
            LockKind::ConfigMap => "configmap",
            LockKind::Lease => "lease",
        }
    }

    /// The Kubernetes kind, for Events and messages.
    pub fn kind(self) -> &'static str {
        match self {
            LockKind::ConfigMap => "ConfigMap",
            LockKind::Lease => "Lease",
        }
    }

    pub fn parse(s: &str) -> Option<LockKind> {
        LockKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A lock by kind, namespace and name: how the controller and its memory
/// know it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub namespace: String,
    pub name: String,
    pub kind: LockKind,
}

impl LockKey {
    pub fn configmap(namespace: impl Into<String>, name: impl Into<String>) -> LockKey {
        LockKey {
            namespace: namespace.into(),
            name: name.into(),
            kind: LockKind::ConfigMap,
        }
    }

    pub fn lease(namespace: impl Into<String>, name: impl Into<String>) -> LockKey {
        LockKey {
            namespace: namespace.into(),
            name: name.into(),
            kind: LockKind::Lease,
        }
    }
}

/// The namespace, name, uid and resourceVersion every stored object has,
/// or `IncompleteMetadata` (only a broken or fake read lacks one).
pub(crate) fn object_id(
    meta: &ObjectMeta,
) -> Result<(String, String, String, String), Unmanageable> {
    let get = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    match (
        get(&meta.namespace),
        get(&meta.name),
        get(&meta.uid),
        get(&meta.resource_version),
    ) {
        (Some(ns), Some(name), Some(uid), Some(rv)) => Ok((ns, name, uid, rv)),
        _ => Err(Unmanageable::IncompleteMetadata),
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What one read of a renewed lock shows of its renewals: whose record it
/// is (a new identity or object starts a new history), a mark of its renew
/// time as written (any change is a renewal seen), and that time when it
/// can be trusted (it carries a zone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// The object's uid and holder identity, hashed.
    pub identity: u64,
    /// The renew time as written, hashed.
    pub mark: u64,
    pub renewed: Option<Timestamp>,
}

impl Renewal {
    pub fn new(
        uid: &str,
        identity: &str,
        mark: impl std::hash::Hash,
        renewed: Option<Timestamp>,
    ) -> Self {
        use std::hash::{Hash, Hasher};
        let hash = |f: &dyn Fn(&mut std::collections::hash_map::DefaultHasher)| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            f(&mut h);
            h.finish()
        };
        Renewal {
            identity: hash(&|h| (uid, identity).hash(h)),
            mark: hash(&|h| mark.hash(h)),
            renewed,
        }
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
    /// The Pod ownerReference's name is no pod's name (not a DNS-1123
    /// subdomain): written by hand, and never read as a URL.
    OwnerNameNotAPod,
    EmptyOwnerUid,
    /// The holder's uid belongs to a pod in another namespace. Owner
    /// references cannot cross namespaces; something wrote this lock by hand.
    OwnerInOtherNamespace(String),
    /// The ConfigMap holds `data` or `binaryData`: not lock-shaped
    /// (operator-lib's locks are empty). Deleting it would lose that data.
    HoldsData,
    /// A Lease's holder identity cannot name a pod (neither a pod name nor
    /// controller-runtime's `<hostname>_<uuid>`).
    IdentityNotAPod(String),
    /// A Lease whose holder the API server's leader-election controller
    /// picks (Coordinated Leader Election: `spec.strategy` is set).
    CoordinatedLeaderElection,
    /// A kubelet's heartbeat in `kube-node-lease`, not a leader lock.
    NodeHeartbeat,
    /// An API server's identity Lease in `kube-system`.
    ApiServerIdentity,
    /// A held Lease without `renewTime` or `leaseDurationSeconds`: when it
    /// runs out, and whether it was renewed after a death, cannot be told.
    NoRenewTime,
    /// A leader record (the `control-plane.alpha.kubernetes.io/leader`
    /// annotation) that does not read as one: what is wrong with it.
    BadLeaderRecord(String),
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
            Unmanageable::OwnerNameNotAPod => "OwnerNameNotAPod",
            Unmanageable::EmptyOwnerUid => "EmptyOwnerUid",
            Unmanageable::OwnerInOtherNamespace(_) => "OwnerInOtherNamespace",
            Unmanageable::HoldsData => "HoldsData",
            Unmanageable::IdentityNotAPod(_) => "IdentityNotAPod",
            Unmanageable::CoordinatedLeaderElection => "CoordinatedLeaderElection",
            Unmanageable::NodeHeartbeat => "NodeHeartbeat",
            Unmanageable::ApiServerIdentity => "ApiServerIdentity",
            Unmanageable::NoRenewTime => "NoRenewTime",
            Unmanageable::BadLeaderRecord(_) => "BadLeaderRecord",
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
            Unmanageable::OwnerNameNotAPod => write!(
                f,
                "its Pod ownerReference's name is not a pod name (a DNS-1123 subdomain)"
            ),
            Unmanageable::EmptyOwnerUid => write!(f, "its Pod ownerReference has an empty uid"),
            Unmanageable::HoldsData => write!(
                f,
                "it holds data, and a leader-for-life lock is empty; deleting it would lose that data"
            ),
            Unmanageable::IdentityNotAPod(id) => write!(
                f,
                "its holder identity {id:?} names no pod (neither a pod name nor <hostname>_<uuid>)"
            ),
            Unmanageable::CoordinatedLeaderElection => write!(
                f,
                "the API server's Coordinated Leader Election manages it (spec.strategy is set)"
            ),
            Unmanageable::NodeHeartbeat => {
                write!(f, "it is a node's heartbeat in kube-node-lease, not a leader lock")
            }
            Unmanageable::ApiServerIdentity => {
                write!(f, "it is an API server's identity Lease, not a leader lock")
            }
            Unmanageable::BadLeaderRecord(why) => write!(f, "{why}"),
            Unmanageable::NoRenewTime => write!(
                f,
                "it is held but has no renewTime or leaseDurationSeconds, so whether its holder \
                 still renews it cannot be told"
            ),
            Unmanageable::OwnerInOtherNamespace(ns) => write!(
                f,
                "its owner pod exists only in namespace {ns}; owner references cannot cross namespaces"
            ),
        }
    }
}
