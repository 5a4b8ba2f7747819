//! The lock kinds, one folder each, behind one interface ([`Kind`]): what
//! differs between them and nothing else. Watching, indexing, judging,
//! deciding, gating and recording are written once, in the modules above
//! this one, and ask the kind of a lock ([`of`]) what they need.
//!
//! A kind says:
//! - which objects it is ([`Kind::claims`]), in which resource
//!   ([`Kind::resource`], the `kind` label of metrics and Events);
//! - how its locks are judged ([`Judged`]): by the one Pod that owns them,
//!   or by the renewals of a leader record whose holder names a pod;
//! - what a judgement depends on ([`Kind::version`]);
//! - its candidate shape, the one rule `scan`, `label`, `check` and
//!   `--auto-opt-in` use ([`Kind::candidate`]);
//! - its freeing write, guarded by exactly what was judged
//!   ([`Kind::free`]), and the words that report it ([`Words`]).
//!
//! Adding a kind is a folder here (its `Kind`, and its `cases` for the shared
//! freeing-write tests), its `pub mod` line and its line in [`KINDS`];
//! `hack/kind-locality.sh` checks that nothing else in the crate depends on
//! it.

pub mod annotation;
pub mod configmap;
pub mod lease;
pub mod lease_for_life;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};
use kube::Client;

use crate::lock::candidate::{holds_data, Shape};
use crate::lock::lease::LeaseLock;
use crate::lock::{Holder, Lock, LockKind, Renewal, Unmanageable};
use crate::Error;

/// The registration: every kind, in the order they claim an object (the
/// first that claims it is its kind; the last of each resource claims
/// every object of it, so that every watched object has a kind).
pub static KINDS: &[&dyn Kind] = &[
    &annotation::LeaderAnnotation,
    &lease_for_life::LeaseHeldForLife,
    &lease::RenewedLease,
    &configmap::ConfigMapHeldForLife,
];

/// The kind of a lock object.
pub fn of(o: Object<'_>) -> &'static dyn Kind {
    KINDS
        .iter()
        .copied()
        .find(|k| k.resource() == o.resource() && k.claims(o))
        .unwrap_or(match o.resource() {
            LockKind::ConfigMap => &configmap::ConfigMapHeldForLife,
            LockKind::Lease => &lease::RenewedLease,
        })
}

/// The candidate shape of an object, by its kind (`Kind::candidate`).
pub fn candidate(o: Object<'_>) -> Option<Shape> {
    of(o).candidate(o)
}

/// A ConfigMap read whole: its kind's shape.
pub fn configmap_candidate(cm: &ConfigMap) -> Option<Shape> {
    candidate(Object::ConfigMap(cm))
}

/// A lock object as watched or read: the metadata of a ConfigMap (all a
/// ConfigMap kind is judged by lives there; whether it holds data is read
/// on its own) or a whole Lease.
#[derive(Clone, Copy, Debug)]
pub enum Object<'a> {
    /// A ConfigMap as its metadata-only watch or list shows it.
    ConfigMapMeta(&'a ObjectMeta),
    /// A ConfigMap read whole.
    ConfigMap(&'a ConfigMap),
    Lease(&'a Lease),
    /// A Lease's metadata alone: no kind writes to it.
    LeaseMeta(&'a ObjectMeta),
}

impl<'a> Object<'a> {
    pub fn meta(&self) -> &'a ObjectMeta {
        match self {
            Object::ConfigMapMeta(m) => m,
            Object::ConfigMap(cm) => &cm.metadata,
            Object::Lease(l) => &l.metadata,
            Object::LeaseMeta(m) => m,
        }
    }

    pub fn resource(&self) -> LockKind {
        match self {
            Object::ConfigMapMeta(_) | Object::ConfigMap(_) => LockKind::ConfigMap,
            Object::Lease(_) | Object::LeaseMeta(_) => LockKind::Lease,
        }
    }

    /// Whether a ConfigMap holds data; `None` when not known (its
    /// metadata only, or not a ConfigMap).
    pub fn holds_data(&self) -> Option<bool> {
        match self {
            Object::ConfigMap(cm) => Some(holds_data(cm)),
            _ => None,
        }
    }
}

/// How a kind's locks are judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    /// By the one v1 Pod that owns the lock, by name and uid; freed when it
    /// is dead, or gone past `--owner-gone-grace` (operator-lib, nais/elector).
    ByOwner,
    /// By a leader record whose holder identity names a pod of its
    /// namespace, and by the renewals the janitor itself observes (client-go
    /// and every elector that renews).
    ByRenewals,
}

/// How a kind's Events and logs say its freeing write.
#[derive(Clone, Copy, Debug)]
pub struct Words {
    /// Before the write: "Deleting this lock".
    pub doing: &'static str,
    /// After it: "Deleted this lock".
    pub done: &'static str,
    /// A dry run's: "Would delete this lock".
    pub would: &'static str,
    /// What a dry run did not do: "nothing deleted".
    pub untouched: &'static str,
    /// The freed lock, as a takeover's log says it: "deleted".
    pub freed: &'static str,
}

/// What a look at a freed lock's name found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Took {
    /// Not there, or nobody holds it: still awaited.
    Waiting,
    /// Nothing more to await, and why.
    Done(&'static str),
    /// A new holder leads: since when, the lock as it now reads; `carry`:
    /// the lock is a new object, to carry the opt-in label over to (a lock
    /// released in place keeps its labels).
    Taken(Box<Taken>),
}

/// Who took a freed lock over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub at: Option<Timestamp>,
    pub holder: Lock,
    pub carry: bool,
}

/// What a freeing write did, when the API server did not refuse it (404
/// and 409 come back as errors, which the caller reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Freed,
    /// A delete that only set deletionTimestamp: these finalizers keep it.
    Kept(Vec<String>),
    /// Nothing written: what was judged is not at hand as the write needs
    /// it (this), so the lock is judged again.
    NotWritten(String),
}

/// The lock exactly as judged, from live reads: what its freeing write is
/// guarded by.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub meta: &'a ObjectMeta,
    /// The uid and resourceVersion judged (never empty: a lock without
    /// them is unmanageable, and never gets here).
    pub uid: &'a str,
    pub resource_version: &'a str,
    /// A Lease as read, whole.
    pub lease: Option<&'a Lease>,
    pub now: Timestamp,
}

impl Target<'_> {
    pub fn namespace(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }
}

/// One lock kind: what differs between kinds, and only that.
pub trait Kind: Send + Sync + 'static {
    /// The resource it lives in.
    fn resource(&self) -> LockKind;
    /// Whether an object of its resource is of this kind (asked in
    /// [`KINDS`]' order).
    fn claims(&self, o: Object<'_>) -> bool;
    fn judged(&self) -> Judged;
    /// The pod the lock names, as far as the object tells: an owner by
    /// name and uid, a holder identity by the host it names (no uid).
    fn holder(&self, o: Object<'_>) -> Option<Holder>;
    /// What a settled judgement depends on: when it changes, the lock is
    /// judged again.
    fn version(&self, o: Object<'_>) -> String;
    /// The candidate shape: whether the object is a lock of this kind that
    /// the janitor could manage, from what a list shows.
    fn candidate(&self, o: Object<'_>) -> Option<Shape>;
    fn words(&self) -> &'static Words;
    /// A lock judged by renewals: its leader record as read (the holder
    /// identity and the host it names, the trusted renew time, the
    /// duration), or why it is not one the janitor can judge. `None` for a
    /// lock held for life.
    fn record(&self, _o: Object<'_>) -> Option<Result<LeaseLock, Unmanageable>> {
        None
    }
    /// A lock judged by renewals: what this read shows of them.
    fn renewal(&self, _o: Object<'_>) -> Option<Renewal> {
        None
    }
    /// The annotation a watched copy must keep for this kind (the watch of
    /// ConfigMaps keeps no other), and the longest value of it the kind
    /// reads (a longer one is kept as a value that reads as none).
    fn watched_annotation(&self) -> Option<(&'static str, usize)> {
        None
    }
    /// What a takeover looks like: the lock read by name after it was freed
    /// (`None`: not there), against the holder it was freed from.
    fn look(&self, o: Option<Object<'_>>, old: &Holder) -> Took;
    /// The one write that frees a stale lock, guarded by exactly what was
    /// judged (preconditions or the resourceVersion read). 404 and 409 come
    /// back as errors: the caller reads them.
    fn free<'a>(
        &'a self,
        client: &'a Client,
        t: Target<'a>,
    ) -> BoxFuture<'a, Result<Answer, Error>>;
    /// Its locks and freeing writes as the shared freeing-write tests run
    /// them on a mocked API server, one for each form its write takes (its
    /// electors' dialects): every kind has at least one.
    #[cfg(test)]
    fn cases(&self) -> &'static [&'static dyn crate::fixtures::Case];
}

/// Every annotation some kind's watched copy keeps, and the longest value
/// of it that kind reads.
pub fn watched_annotations() -> impl Iterator<Item = (&'static str, usize)> {
    KINDS.iter().filter_map(|k| k.watched_annotation())
}

/// The owner a lock held for life names (`Judged::ByOwner`).
fn owner(o: Object<'_>) -> Option<Holder> {
    crate::lock::parse(o.meta()).ok().map(|l| l.holder)
}

/// The freeing write of a lock held for life: a DELETE of the object judged,
/// with its uid and resourceVersion as preconditions (`what` names it in
/// the action: "lock", "lease").
pub async fn delete<K>(client: &Client, t: Target<'_>, what: &str) -> Result<Answer, Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), t.namespace());
    let action = format!("deleting {what} {}/{}", t.namespace(), t.name());
    crate::call(action, api.delete(t.name(), &guarded_delete(&t)))
        .await
        .map(|answer| deleted(answer.left().map(|o| o.meta().clone())))
}

/// What a look finds at a renewed record released in place (`lock`, as
/// read, taken at `at` when it says): nobody yet, the freed holder again
/// (its pod name, or the hostname it was matched by: not a new holder), or
/// a new holder, whose lock keeps its label (nothing to carry).
pub fn looked_in_place(lock: LeaseLock, old: &Holder, at: Option<Timestamp>) -> Took {
    match lock.host.as_deref() {
        None => Took::Waiting,
        Some(h) if h == old.name || crate::lock::lease::host_of_name(&old.name) == h => {
            Took::Done("held again under the same identity")
        }
        Some(_) => Took::Taken(Box::new(Taken {
            at,
            holder: lock.as_lock(None),
            carry: false,
        })),
    }
}

/// A DELETE with the uid and resourceVersion judged as preconditions.
pub fn guarded_delete(t: &Target<'_>) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(t.uid.to_owned()),
            resource_version: Some(t.resource_version.to_owned()),
        }),
        ..Default::default()
    }
}

/// What a DELETE did from its answer: the object (not a Status) when the
/// delete only set its deletionTimestamp, and finalizers keep it;
/// `Answer::Freed` for a Status.
pub fn deleted(meta: Option<ObjectMeta>) -> Answer {
    let kept = meta.and_then(|meta| {
        meta.deletion_timestamp.as_ref()?;
        meta.finalizers.filter(|f| !f.is_empty())
    });
    kept.map_or(Answer::Freed, Answer::Kept)
}

#[cfg(test)]
mod tests;
