//! Live reads and the one judging path: read the lock and its holder from
//! the API server (never from a cache), feed the pure verdict, and return a
//! `Judgement`. The controller and `scan` both judge through here, so they
//! can never judge differently.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::{Api, Client, ResourceExt};
use tracing::debug;

use crate::kinds::{self, Judged, Kind, Object};
use crate::lock::lease::LeaseLock;
use crate::lock::{self, Lock, LockKey, LockKind, Renewal};
use crate::selector::Selector;
use crate::verdict::Renewals;
use crate::verdict::{self, HolderSeen, Policy, StaleReason, Verdict};
use crate::{call, Error, ErrorKind, Paged};

/// A lock as judged from live reads of the lock and its holder: what
/// `reclaim` acts on, and nothing else.
#[derive(Clone, Debug)]
pub struct Judgement {
    pub key: LockKey,
    /// The lock's metadata as judged (uid and resourceVersion guard the delete).
    pub meta: ObjectMeta,
    pub lock: Option<Lock>,
    pub holder: Option<Pod>,
    pub verdict: Verdict,
    /// For stale locks: when the holder died, as well as is known.
    pub died_at: Option<Timestamp>,
    /// A Lease lock exactly as read: its release is an update of this very
    /// object (its resourceVersion guards it).
    pub lease: Option<Lease>,
}

impl Judgement {
    /// A lock that cannot be managed (`why`): never written.
    fn unmanageable(
        key: LockKey,
        meta: ObjectMeta,
        why: lock::Unmanageable,
        lease: Option<Lease>,
    ) -> Self {
        Judgement {
            key,
            meta,
            lock: None,
            holder: None,
            verdict: Verdict::Unmanageable(why),
            died_at: None,
            lease,
        }
    }

    /// The lock object as judged: a Lease as read, or a ConfigMap's
    /// metadata as read. A Lease judged without its object (no path makes
    /// one) is a Lease's metadata still, and its kind's write refuses it.
    pub fn object(&self) -> Object<'_> {
        match (&self.lease, self.key.kind) {
            (Some(l), _) => Object::Lease(l),
            (None, LockKind::ConfigMap) => Object::ConfigMapMeta(&self.meta),
            (None, LockKind::Lease) => Object::LeaseMeta(&self.meta),
        }
    }

    /// The lock's kind.
    pub fn kind(&self) -> &'static dyn Kind {
        kinds::of(self.object())
    }

    /// The version judged, as the lock's kind names it (`Kind::version`).
    pub fn version(&self) -> String {
        self.kind().version(self.object())
    }

    /// A renewed lock whose one matching pod matched by its hostname, not its
    /// name (a `spec.hostname` of its own, or a name over 63 characters).
    pub fn matched_by_hostname_only(&self) -> bool {
        let Some(pod) = &self.holder else {
            return false;
        };
        let o = self.object();
        let host = self.kind().record(o).and_then(|r| r.ok()?.host);
        host.is_some_and(|h| pod.metadata.name.as_deref() != Some(h.as_str()))
    }
}

/// How long a lock's holder has been missing, and since when a lock whose
/// pod does not say when it died has been seen stale. The controller
/// remembers (`memory`); a one-shot `scan` uses the lock's age.
pub trait HolderClock {
    /// The holder was found: its missing clock stops.
    fn holder_present(&mut self, lock: &Lock);
    /// The holder is missing: since when (wall clock) and for how long.
    fn holder_missing(&mut self, lock: &Lock, now: Timestamp) -> (Timestamp, Duration);
    /// First time this holder was seen dead without a container finish time.
    fn stale_since(&mut self, lock: &Lock, now: Timestamp) -> Timestamp;
    /// Takes in a renewed lock's renewal as read live; what was seen of its
    /// renewals (none for a clock that does not watch).
    fn renewals(&mut self, _renewal: Renewal) -> Renewals {
        Renewals::default()
    }
}

/// `scan`'s clock: it cannot watch a grace go by, so the lock's age stands
/// in for how long its holder has been missing. The holder cannot have
/// vanished before its lock was created, so this never calls a lock stale
/// earlier than the controller could.
pub struct LockAge;

impl HolderClock for LockAge {
    fn holder_present(&mut self, _lock: &Lock) {}
    fn holder_missing(&mut self, lock: &Lock, now: Timestamp) -> (Timestamp, Duration) {
        let since = lock.created.unwrap_or(now);
        let gone_for = Duration::try_from(now.duration_since(since)).unwrap_or_default();
        (since, gone_for)
    }
    fn stale_since(&mut self, _lock: &Lock, now: Timestamp) -> Timestamp {
        now
    }
}

/// The kind of a lock that is judged by renewals, if it is one.
fn renewed(o: Object<'_>) -> Option<&'static dyn Kind> {
    Some(kinds::of(o)).filter(|k| k.judged() == Judged::ByRenewals)
}

/// Why a judgement is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// It may lead to a delete: the holder read is the last read made.
    BeforeWrite,
    /// Only reported (`scan`).
    Report,
}

/// How many lists of a namespace's pods (for Lease judgements) run at
/// once; each holds one page of 100 pods while it filters it.
const LISTS_IN_FLIGHT: usize = 16;

/// Reads locks and holders live.
#[derive(Clone)]
pub struct Observer {
    client: Client,
    selector: Selector,
    /// Where a holder may be looked for when cluster-wide lists are refused.
    namespaces: Vec<String>,
    policy: Policy,
    /// Turns for the lists of a namespace's pods (`LISTS_IN_FLIGHT`).
    lists: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Observer {
    pub fn new(
        client: Client,
        selector: Selector,
        namespaces: Vec<String>,
        policy: Policy,
    ) -> Self {
        Observer {
            client,
            selector,
            namespaces,
            policy,
            lists: std::sync::Arc::new(tokio::sync::Semaphore::new(LISTS_IN_FLIGHT)),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Reads the lock and its holder live and judges them. `None`: the lock
    /// no longer exists, or its live copy no longer carries the opt-in label.
    pub async fn judge_live(
        &self,
        key: &LockKey,
        clock: &mut impl HolderClock,
    ) -> Result<Option<Judgement>, Error> {
        if key.kind == LockKind::Lease {
            return self.judge_live_lease(key, clock).await;
        }
        // The whole object: a ConfigMap that holds data is not a lock.
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &key.namespace);
        let Some(live) = call(format!("reading lock {key}"), cms.get_opt(&key.name)).await? else {
            return Ok(None);
        };
        // The cache said this lock is opted in; the live copy must say so too.
        if !self.selector.matches(live.metadata.labels.as_ref()) {
            return Ok(None);
        }
        let o = Object::ConfigMap(&live);
        if let Some(kind) = renewed(o) {
            let renewal = kind.renewal(o);
            return self
                .judge_record(
                    key.clone(),
                    live.metadata.clone(),
                    None,
                    kind.record(o),
                    None,
                    || renewal.map(|r| clock.renewals(r)).unwrap_or_default(),
                )
                .await
                .map(Some);
        }
        let holds_data = lock::holds_data(&live);
        self.judge(
            key.clone(),
            live.metadata,
            holds_data,
            None,
            clock,
            Purpose::BeforeWrite,
        )
        .await
        .map(Some)
    }

    /// Judges a lock read as `meta` (and whether it `holds_data`). Its
    /// holder is read live unless the caller already did (`holder`:
    /// `Some(None)` means read and missing).
    pub async fn judge(
        &self,
        key: LockKey,
        meta: ObjectMeta,
        holds_data: bool,
        holder: Option<Option<Pod>>,
        clock: &mut impl HolderClock,
        purpose: Purpose,
    ) -> Result<Judgement, Error> {
        let lock = match lock::parse_shaped(&meta, holds_data) {
            Ok(lock) => lock,
            Err(why) => return Ok(Judgement::unmanageable(key, meta, why, None)),
        };
        let mut holder = match holder {
            Some(h) => h,
            None => self.read_holder(&lock).await?,
        };
        let mut verdict = self.judge_holder(&lock, holder.as_ref(), clock);
        if let Verdict::Stale {
            reason: StaleReason::OwnerGone,
            ..
        } = verdict
        {
            if let Some(ns) = self.holder_elsewhere(&lock).await? {
                // Seen: its grace starts again once it is gone from there too.
                clock.holder_present(&lock);
                verdict = verdict::judge(&lock, HolderSeen::Elsewhere(ns), &self.policy);
            } else if purpose == Purpose::BeforeWrite {
                // That search took time: the holder read must be the last
                // read before a delete (a same-name pod may have appeared).
                holder = self.read_holder(&lock).await?;
                verdict = self.judge_holder(&lock, holder.as_ref(), clock);
            }
        }
        let died_at = match &verdict {
            Verdict::Stale { died_at, .. } => {
                Some(died_at.unwrap_or_else(|| clock.stale_since(&lock, Timestamp::now())))
            }
            _ => None,
        };
        Ok(Judgement {
            key,
            meta,
            lock: Some(lock),
            holder,
            verdict,
            died_at,
            lease: None,
        })
    }

    fn judge_holder(
        &self,
        lock: &Lock,
        holder: Option<&Pod>,
        clock: &mut impl HolderClock,
    ) -> Verdict {
        let seen = match holder {
            Some(pod) => {
                clock.holder_present(lock);
                HolderSeen::Pod(pod)
            }
            None => {
                let (since, gone_for) = clock.holder_missing(lock, Timestamp::now());
                HolderSeen::Missing { since, gone_for }
            }
        };
        verdict::judge(lock, seen, &self.policy)
    }

    /// A live GET of the holder by name in the lock's namespace.
    pub async fn read_holder(&self, lock: &Lock) -> Result<Option<Pod>, Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &lock.namespace);
        call(
            format!("reading holder pod {}/{}", lock.namespace, lock.holder.name),
            pods.get_opt(&lock.holder.name),
        )
        .await
    }

    /// Before calling a lock's owner gone: is a pod with the holder's uid
    /// alive in another namespace? One list by name (a field selector),
    /// cluster-wide; an install limited to some namespaces may not list
    /// cluster-wide, and then looks in the namespaces it watches.
    pub async fn holder_elsewhere(&self, lock: &Lock) -> Result<Option<String>, Error> {
        let lp = ListParams::default().fields(&format!("metadata.name={}", lock.holder.name));
        let find = |pods: kube::core::ObjectList<PartialObjectMeta<Pod>>| {
            pods.items
                .into_iter()
                .find(|p| p.metadata.uid.as_deref() == Some(lock.holder.uid.as_str()))
                .map(|p| p.namespace().unwrap_or_default())
        };
        let action = "looking for the holder in other namespaces";
        let all: Api<Pod> = Api::all(self.client.clone());
        match call(action, all.list_metadata(&lp)).await {
            Ok(pods) => return Ok(find(pods)),
            Err(e) if e.kind() == ErrorKind::Forbidden && !self.namespaces.is_empty() => {
                debug!(error = %e, "cannot list pods cluster-wide; looking in the watched namespaces only");
            }
            Err(e) => return Err(e),
        }
        for ns in self.namespaces.iter().filter(|ns| **ns != lock.namespace) {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
            if let Some(found) = find(call(action, pods.list_metadata(&lp)).await?) {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Reads a Lease live, then the pods of its namespace (every one its
    /// holder identity could name, by name or hostname), and judges it.
    async fn judge_live_lease(
        &self,
        key: &LockKey,
        clock: &mut impl HolderClock,
    ) -> Result<Option<Judgement>, Error> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &key.namespace);
        let Some(live) = call(format!("reading lease {key}"), leases.get_opt(&key.name)).await?
        else {
            return Ok(None);
        };
        self.judge_watched_lease(key, &live, clock).await
    }

    /// Judges a Lease as read (live, or a watched copy that is released or
    /// expired, for which nothing is written); the pods its holder identity
    /// could name are listed live (a pod of that name made since, by a
    /// StatefulSet for one, is seen by no precondition). A release that
    /// follows replaces exactly this version: the API server answers 409 if
    /// the Lease was renewed or changed since. `None`: not opted in.
    pub async fn judge_watched_lease(
        &self,
        key: &LockKey,
        lease: &Lease,
        clock: &mut impl HolderClock,
    ) -> Result<Option<Judgement>, Error> {
        if !self.selector.matches(lease.metadata.labels.as_ref()) {
            return Ok(None);
        }
        if kinds::of(Object::Lease(lease)).judged() == Judged::ByOwner {
            return self
                .judge_for_life(key.clone(), lease.clone(), None, clock)
                .await
                .map(Some);
        }
        // What was seen of its renewals is taken once the pods are listed:
        // the time the list took counts as watched, and a renewal seen
        // meanwhile counts too.
        let o = Object::Lease(lease);
        let kind = kinds::of(o);
        let renewal = kind.renewal(o);
        self.judge_record(
            key.clone(),
            lease.metadata.clone(),
            Some(lease.clone()),
            kind.record(o),
            None,
            || renewal.map(|r| clock.renewals(r)).unwrap_or_default(),
        )
        .await
        .map(Some)
    }

    /// Judges a Lease as read, with what was seen of its renewals. The pods
    /// of its namespace are listed live unless the caller already did
    /// (`pods`); nothing is read for a Lease that is released, expired or
    /// not a lock.
    pub async fn judge_lease(
        &self,
        key: LockKey,
        live: Lease,
        pods: Option<&[Pod]>,
        renewals: &Renewals,
    ) -> Result<Judgement, Error> {
        if kinds::of(Object::Lease(&live)).judged() == Judged::ByOwner {
            // Its owner, from the pods listed (whole) when there are any.
            let holder = pods.and_then(|pods| {
                let owner = lock::parse(&live.metadata).ok()?.holder;
                Some(pods.iter().find(|p| p.name_any() == owner.name).cloned())
            });
            return self.judge_for_life(key, live, holder, &mut LockAge).await;
        }
        let record = kinds::of(Object::Lease(&live)).record(Object::Lease(&live));
        let meta = live.metadata.clone();
        self.judge_record(key, meta, Some(live), record, pods, || *renewals)
            .await
    }

    /// Judges a lock of a kind judged by renewals as read (`scan`), with
    /// what was seen of its renewals; the pods its holder could name are
    /// listed live unless given.
    pub async fn judge_renewed(
        &self,
        key: LockKey,
        o: Object<'_>,
        pods: Option<&[Pod]>,
        renewals: &Renewals,
    ) -> Result<Judgement, Error> {
        let lease = match o {
            Object::Lease(l) => Some(l.clone()),
            _ => None,
        };
        let record = kinds::of(o).record(o);
        self.judge_record(key, o.meta().clone(), lease, record, pods, || *renewals)
            .await
    }

    /// A Lease held for life (`lock::lease::held_for_life`) is judged as a
    /// ConfigMap lock is, from its metadata: its owner by name and uid, read
    /// live unless given (`holder`), on the same clock.
    async fn judge_for_life(
        &self,
        key: LockKey,
        live: Lease,
        holder: Option<Option<Pod>>,
        clock: &mut impl HolderClock,
    ) -> Result<Judgement, Error> {
        let meta = live.metadata.clone();
        let mut j = self
            .judge(key, meta, false, holder, clock, Purpose::BeforeWrite)
            .await?;
        j.lease = Some(live);
        Ok(j)
    }

    /// Judges a lock whose kind judges it by renewals, from its leader
    /// record as read (`record`; a lock held for life has none, and is
    /// unmanageable here), with what was seen of its renewals, asked after
    /// the pods are listed. The pods of its namespace are listed live
    /// unless the caller already did (`pods`); nothing is read for a record
    /// that is released, expired or not a lock. `lease`: the Lease as read,
    /// whose release replaces it.
    async fn judge_record(
        &self,
        key: LockKey,
        meta: ObjectMeta,
        lease: Option<Lease>,
        record: Option<Result<LeaseLock, lock::Unmanageable>>,
        pods: Option<&[Pod]>,
        renewals: impl FnOnce() -> Renewals,
    ) -> Result<Judgement, Error> {
        let parsed = match record.unwrap_or(Err(lock::Unmanageable::NoRenewTime)) {
            Ok(l) => l,
            Err(why) => return Ok(Judgement::unmanageable(key, meta, why, lease)),
        };
        let now = Timestamp::now();
        let listed;
        let pods: &[Pod] = match pods {
            Some(p) => p,
            None if parsed.host.is_none() || parsed.expired(now) => &[],
            None => {
                listed = self
                    .pods_named(
                        &parsed.namespace,
                        parsed.host.as_deref().unwrap_or_default(),
                    )
                    .await?;
                &listed
            }
        };
        let renewals = renewals();
        let now = Timestamp::now();
        let verdict = verdict::judge_lease(&parsed, pods, now, &renewals);
        let holder = parsed.host.as_deref().and_then(|h| {
            let mut m = pods.iter().filter(|p| lock::lease::names(h, p));
            match (m.next(), m.next()) {
                (Some(one), None) => Some(one.clone()),
                _ => None,
            }
        });
        let died_at = match &verdict {
            Verdict::Stale { died_at, .. } => Some(died_at.unwrap_or(now)),
            _ => None,
        };
        Ok(Judgement {
            lock: Some(parsed.as_lock(holder.as_ref())),
            key,
            meta,
            holder,
            verdict,
            died_at,
            lease,
        })
    }

    /// The pods of a namespace that `host` names, by name or hostname (a
    /// Lease's holder may be named by `spec.hostname`, which no field
    /// selector reaches): every pod is read, in pages of 100, and only the
    /// matches are kept, so a judgement holds one page at a time, not the
    /// namespace's pods. At most `LISTS_IN_FLIGHT` such lists run at once.
    pub async fn pods_named(&self, namespace: &str, host: &str) -> Result<Vec<Pod>, Error> {
        // Never closed.
        let _turn = self.lists.acquire().await;
        let mut named = Vec::new();
        each_pod_page(&self.client, namespace, |page| match page {
            // A pod seen twice must not look like two.
            Paged::StartOver => named.clear(),
            Paged::Items(pods) => {
                named.extend(pods.into_iter().filter(|p| lock::lease::names(host, p)))
            }
        })
        .await?;
        Ok(named)
    }
}

/// Every pod of `namespace`, a page of 100 at a time (`crate::for_each_page`,
/// which may start over): what a holder identity names by hostname, which
/// no field selector reaches, is found by reading them all and keeping only
/// what `each` keeps.
pub async fn each_pod_page(
    client: &Client,
    namespace: &str,
    each: impl FnMut(Paged<Pod>),
) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let api = &api;
    let list = |lp: ListParams| async move { api.list(&lp).await };
    let what = format!("listing pods in {namespace}");
    crate::for_each_page(&what, &ListParams::default(), 100, list, each).await?;
    Ok(())
}
