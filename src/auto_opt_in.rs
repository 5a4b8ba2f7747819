//! `run --auto-opt-in`: finds the lock candidates in scope that carry no
//! opt-in key (`lock::candidate`'s rules), counts them
//! (`lock_janitor_unprotected_locks{kind}`, on every replica) and, on the
//! leader only, labels each with one resourceVersion-guarded merge patch
//! made right after a live read (`optin::write_label`).
//!
//! What it keeps follows the candidates, not the cluster (docs/design.md,
//! "Auto opt-in"): a metadata-only watch of the ConfigMaps in scope and a
//! watch of the Leases, neither cached. Kept: each unprotected candidate
//! (its key and uid), each one-Pod-owned ConfigMap found to hold data (its
//! resourceVersion, so that it is not read again until it changes), and for
//! 30 s each Lease judged after a change of holder. A Lease renewal costs
//! nothing: a Lease is judged when it is listed, or when its holder was
//! acquired (or it was created) within the last 30 s, never per renewal.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::election::Gate;
use crate::events::{ref_of, Events, Say, REASON_OPTED_IN};
use crate::kinds::{self, Object};
use crate::lock::candidate::{self, Exclusions, Shape};
use crate::lock::{lease, LockKey, LockKind};
use crate::metrics::Metrics;
use crate::optin::{write_label, Written};
use crate::streams::watch_backoff;
use crate::{call, Error, ErrorKind, Paged};

/// A Lease whose holder was acquired (or that was created) this recently
/// is judged when its watch says it changed; after that, its renewals are
/// not looked at.
const RECENT: Duration = Duration::from_secs(30);
/// Judgements (a live read, maybe a pod list, and the patch) at once.
const IN_FLIGHT: usize = 8;
/// Reads and writes of one judgement: a 409 reads and judges again, at
/// most this many times in a row.
const ATTEMPTS: u32 = 3;

/// What auto opt-in is given.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The opt-in label it writes; a candidate carrying `key` with any
    /// value is left as it is.
    pub key: String,
    pub value: String,
    /// Empty: the whole cluster.
    pub namespaces: Vec<String>,
    pub exclusions: Exclusions,
    pub kinds: Vec<LockKind>,
    /// The janitor's own election Lease (namespace, name): never labeled.
    pub own_lease: Option<(String, String)>,
    /// How often the leader tries again the candidates it could not label.
    pub retry: Duration,
    /// Label (the leader); without it, only count.
    pub write: bool,
}

/// The auto opt-in of one janitor.
pub struct AutoOptIn {
    client: Client,
    gate: Gate,
    metrics: Metrics,
    events: Events,
    settings: Settings,
    state: Mutex<Found>,
    turns: tokio::sync::Semaphore,
}

/// What is remembered, all of it about candidates or near-candidates.
#[derive(Default)]
struct Found {
    /// Unprotected candidates: their uid, and for a Lease the holder
    /// identity it was judged with.
    unprotected: BTreeMap<LockKey, (String, String)>,
    /// ConfigMaps owned by one pod that hold data: their resourceVersion.
    holds_data: HashMap<LockKey, String>,
    /// Leases judged after a change: the identity, and when.
    judged: HashMap<LockKey, (String, Instant)>,
    /// Judgements running now, and whether each was asked for again
    /// meanwhile (then it runs once more when it ends).
    running: HashMap<LockKey, bool>,
}

impl AutoOptIn {
    pub fn new(client: Client, gate: Gate, metrics: Metrics, settings: Settings) -> Arc<Self> {
        let events = Events::new(client.clone(), metrics.clone(), gate.clone());
        for k in &settings.kinds {
            metrics.unprotected.with_label_values(&[k.as_str()]).set(0);
        }
        Arc::new(AutoOptIn {
            client,
            gate,
            metrics,
            events,
            settings,
            state: Mutex::default(),
            turns: tokio::sync::Semaphore::new(IN_FLIGHT),
        })
    }

    /// Watches every scope until `shutdown`; `left` names the opted-in
    /// Leases the lock watch saw leave (`Shared::left`).
    pub async fn run(
        self: Arc<Self>,
        left: Option<UnboundedReceiver<LockKey>>,
        shutdown: CancellationToken,
    ) {
        let mut runs: Vec<futures::future::BoxFuture<'static, ()>> = Vec::new();
        if let Some(left) = left {
            runs.push(Box::pin(self.clone().judge_what_left(left)));
        }
        for ns in crate::scopes(&self.settings.namespaces) {
            if self.settings.kinds.contains(&LockKind::ConfigMap) {
                runs.push(Box::pin(self.clone().watch_configmaps(ns.clone())));
            }
            if self.settings.kinds.contains(&LockKind::Lease) {
                runs.push(Box::pin(self.clone().watch_leases(ns)));
            }
        }
        runs.push(Box::pin(self.clone().retry_on_lead_and_after_failures()));
        tokio::select! {
            _ = futures::future::join_all(runs) => {}
            () = shutdown.cancelled() => {}
        }
    }

    /// Whether anything in `namespace` may be a candidate at all.
    fn in_reach(&self, namespace: &str) -> bool {
        !self.settings.exclusions.excludes(namespace)
    }

    fn has_key(&self, meta: &ObjectMeta) -> bool {
        meta.labels
            .as_ref()
            .is_some_and(|l| l.contains_key(&self.settings.key))
    }

    fn own_lease(&self, key: &LockKey) -> bool {
        key.kind == LockKind::Lease
            && self
                .settings
                .own_lease
                .as_ref()
                .is_some_and(|(ns, name)| *ns == key.namespace && *name == key.name)
    }

    /// Forgets what is known of `key` as a candidate: labeled, or no
    /// candidate now. When a Lease was judged (`judged`) is kept until
    /// `RECENT` runs out, whatever the judgement: a Lease found to be no
    /// candidate is not judged again at each of its renewals.
    fn drop_key(&self, key: &LockKey) {
        let mut s = crate::locked(&self.state);
        let counted = s.unprotected.remove(key).is_some();
        s.holds_data.remove(key);
        drop(s);
        if counted {
            self.count(key.kind);
        }
    }

    /// Forgets all of `key`: deleted.
    fn forget(&self, key: &LockKey) {
        crate::locked(&self.state).judged.remove(key);
        self.drop_key(key);
    }

    fn count(&self, kind: LockKind) {
        let n = crate::locked(&self.state)
            .unprotected
            .keys()
            .filter(|k| k.kind == kind)
            .count();
        self.metrics
            .unprotected
            .with_label_values(&[kind.as_str()])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A candidate that could not be judged (its read or its pods' list
    /// failed): counted as unprotected, so that it is retried; what was
    /// known of it is kept.
    fn maybe_unprotected(&self, key: &LockKey) {
        let mut s = crate::locked(&self.state);
        s.holds_data.remove(key);
        s.unprotected.entry(key.clone()).or_default();
        drop(s);
        self.count(key.kind);
    }

    fn unprotected(&self, key: &LockKey, uid: &str, identity: &str) {
        let mut s = crate::locked(&self.state);
        s.holds_data.remove(key);
        s.unprotected
            .insert(key.clone(), (uid.to_owned(), identity.to_owned()));
        drop(s);
        self.count(key.kind);
    }

    /// The metadata-only watch of a scope's ConfigMaps: a ConfigMap with
    /// one Pod owner and no opt-in key is read whole once (does it hold
    /// data?) and, when it does not, is a candidate.
    async fn watch_configmaps(self: Arc<Self>, namespace: Option<String>) {
        let api: Api<PartialObjectMeta<ConfigMap>> =
            crate::scoped(&self.client, namespace.as_deref());
        let stream = watcher(api, unfiltered()).backoff(watch_backoff());
        let mut relist = Relist::default();
        let mut stream = std::pin::pin!(stream);
        let mut errors = Warned::default();
        while let Some(ev) = stream.next().await {
            let meta = match ev {
                Ok(watcher::Event::Init) => {
                    relist = Relist::started(&self, namespace.as_deref(), LockKind::ConfigMap);
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    relist.done(&self);
                    continue;
                }
                Ok(watcher::Event::Delete(m)) => {
                    self.forget(&key_of(LockKind::ConfigMap, &m.metadata));
                    continue;
                }
                Ok(watcher::Event::InitApply(m) | watcher::Event::Apply(m)) => m.metadata,
                Err(e) => {
                    errors.failed(&self.metrics, "configmaps", namespace.as_deref(), &e);
                    continue;
                }
            };
            let key = key_of(LockKind::ConfigMap, &meta);
            relist.seen(&key);
            let o = Object::ConfigMapMeta(&meta);
            let shape = kinds::candidate(o);
            if !self.in_reach(&key.namespace) || self.has_key(&meta) || shape.is_none() {
                self.drop_key(&key);
                continue;
            }
            let uid = meta.uid.clone().unwrap_or_default();
            let identity = record_host(o);
            let known = {
                let s = crate::locked(&self.state);
                s.unprotected
                    .get(&key)
                    .is_some_and(|(u, i)| *u == uid && *i == identity)
                    || s.holds_data.get(&key) == meta.resource_version.as_ref()
            };
            // A leader record changes at each renewal: judged once per
            // holder within `RECENT` (its times may carry no zone, so not
            // by when it changed, as a Lease is).
            let due = || match shape {
                Some(Shape::NamesAPod(..)) => self.look_once(&key, &identity),
                _ => true,
            };
            if !known && due() {
                self.clone().judge_soon(key, None);
            }
        }
    }

    /// Each Lease that left the lock watch is judged from a live read: one
    /// whose opt-in key was removed is labeled again; one deleted (a 404),
    /// opted out (the key set to another value) or no candidate any more
    /// is left as it is. One read per opted-in Lease that leaves, nothing
    /// per renewal or per bystander.
    async fn judge_what_left(self: Arc<Self>, mut left: UnboundedReceiver<LockKey>) {
        while let Some(key) = left.recv().await {
            if key.kind == LockKind::Lease && self.settings.kinds.contains(&key.kind) {
                self.clone().judge_soon(key, None);
            }
        }
    }

    /// The watch of a scope's Leases. Renewals arrive every few seconds
    /// for every Lease: one is judged only when listed, or when its holder
    /// changed lately, and at most once per holder within `RECENT`.
    async fn watch_leases(self: Arc<Self>, namespace: Option<String>) {
        let api: Api<Lease> = crate::scoped(&self.client, namespace.as_deref());
        let stream = watcher(api, unfiltered()).backoff(watch_backoff());
        let mut relist = Relist::default();
        // Listed Leases whose identity names a host, by namespace: their
        // pods are listed once per namespace when the list is done.
        let mut listed: BTreeMap<String, Vec<Listed>> = BTreeMap::new();
        let mut stream = std::pin::pin!(stream);
        let mut errors = Warned::default();
        while let Some(ev) = stream.next().await {
            let (l, listing) = match ev {
                Ok(watcher::Event::Init) => {
                    relist = Relist::started(&self, namespace.as_deref(), LockKind::Lease);
                    listed.clear();
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    relist.done(&self);
                    for (ns, leases) in std::mem::take(&mut listed) {
                        self.clone().judge_listed_leases(ns, leases);
                    }
                    continue;
                }
                Ok(watcher::Event::Delete(l)) => {
                    self.forget(&key_of(LockKind::Lease, &l.metadata));
                    continue;
                }
                Ok(watcher::Event::InitApply(l)) => (l, true),
                Ok(watcher::Event::Apply(l)) => (l, false),
                Err(e) => {
                    errors.failed(&self.metrics, "leases", namespace.as_deref(), &e);
                    continue;
                }
            };
            let key = key_of(LockKind::Lease, &l.metadata);
            relist.seen(&key);
            if !self.in_reach(&key.namespace) || self.own_lease(&key) || self.has_key(&l.metadata) {
                self.drop_key(&key);
                continue;
            }
            let Some(shape) = kinds::candidate(Object::Lease(&l)) else {
                self.drop_key(&key);
                continue;
            };
            let uid = l.metadata.uid.clone().unwrap_or_default();
            let identity = identity_of(&l);
            let known = crate::locked(&self.state)
                .unprotected
                .get(&key)
                .is_some_and(|(u, i)| *u == uid && *i == identity);
            if known {
                continue;
            }
            match shape {
                Shape::HeldForLife(_) => self.clone().judge_soon(key, None),
                Shape::NamesAPod(_, host) if listing => {
                    listed
                        .entry(key.namespace.clone())
                        .or_default()
                        .push(Listed {
                            key,
                            host,
                            uid,
                            identity,
                        });
                }
                Shape::NamesAPod(..) => {
                    if self.look_again(&key, &l, &identity, Timestamp::now()) {
                        self.clone().judge_soon(key, None);
                    }
                }
            }
        }
    }

    /// Whether a renewed Lease seen by its watch (not known as unprotected)
    /// is judged now: it changed lately and was not judged with this holder
    /// within `RECENT`. When it is, that is remembered (and what was known
    /// of it as a candidate forgotten: it is judged again).
    fn look_again(&self, key: &LockKey, l: &Lease, identity: &str, now: Timestamp) -> bool {
        changed_lately(l, now) && self.look_once(key, identity)
    }

    /// Whether a renewed lock was not judged with this holder within
    /// `RECENT`; when so, that it is judged now is remembered (and what was
    /// known of it as a candidate forgotten: it is judged again).
    fn look_once(&self, key: &LockKey, identity: &str) -> bool {
        if !self.first_look(key, identity) {
            return false;
        }
        self.drop_key(key);
        crate::locked(&self.state)
            .judged
            .insert(key.clone(), (identity.to_owned(), Instant::now()));
        true
    }

    /// Whether a Lease that changed lately was not judged with this holder
    /// within `RECENT`; forgets the older judgements (so `judged` holds at
    /// most the Leases judged in the last `RECENT`).
    fn first_look(&self, key: &LockKey, identity: &str) -> bool {
        let mut s = crate::locked(&self.state);
        s.judged.retain(|_, (_, at)| at.elapsed() < RECENT);
        s.judged.get(key).is_none_or(|(i, _)| i != identity)
    }

    /// The listed Leases of one namespace whose identity names a host: one
    /// paged list of the namespace's pods tells which name exactly one.
    /// A failed list counts each of them as unprotected (maybe one): they
    /// are judged again with the other retries.
    fn judge_listed_leases(self: Arc<Self>, ns: String, leases: Vec<Listed>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let hosts: BTreeSet<String> = leases.iter().map(|l| l.host.clone()).collect();
            let found = {
                let _turn = self.turns.acquire().await;
                pods_naming(&self.client, &ns, &hosts).await
            };
            let counts = match found {
                Ok(c) => c,
                Err(e) => {
                    self.failed(&LockKey::lease(&ns, ""), &e, "list on pods");
                    for l in leases {
                        self.unprotected(&l.key, &l.uid, &l.identity);
                    }
                    return;
                }
            };
            for l in leases {
                if counts.get(&l.host) == Some(&1) {
                    self.clone().judge_soon(l.key, Some(l.identity));
                }
            }
        })
    }

    /// On taking the lead, and every `retry` while leading: each candidate
    /// still unprotected is judged and labeled again (those a standby
    /// counted, or whose read, pod list or label failed).
    async fn retry_on_lead_and_after_failures(self: Arc<Self>) {
        let mut lead = self.gate.changes();
        loop {
            let wait = tokio::time::sleep(self.settings.retry);
            match lead.as_mut() {
                Some(rx) => tokio::select! {
                    changed = rx.changed() => if changed.is_err() { lead = None; },
                    () = wait => {}
                },
                None => wait.await,
            }
            if !self.settings.write || !self.gate.leads() {
                continue;
            }
            self.retry_unprotected();
        }
    }

    /// Judges again each candidate counted as unprotected, from a live
    /// read and, for a Lease whose holder names a pod, a live list of its
    /// namespace's pods: whether it names exactly one pod may have changed
    /// since it was counted (a standby counts for days).
    fn retry_unprotected(self: &Arc<Self>) {
        let keys: Vec<LockKey> = crate::locked(&self.state)
            .unprotected
            .keys()
            .cloned()
            .collect();
        for key in keys {
            self.clone().judge_soon(key, None);
        }
    }
}

/// A listed Lease whose holder identity names `host`.
struct Listed {
    key: LockKey,
    host: String,
    uid: String,
    identity: String,
}

/// The keys of one scope and kind remembered before a (re-)list, less
/// those the list shows again: forgotten when it is done.
#[derive(Default)]
struct Relist(Option<HashSet<LockKey>>);

impl Relist {
    fn started(a: &AutoOptIn, namespace: Option<&str>, kind: LockKind) -> Relist {
        let s = crate::locked(&a.state);
        let mine = |k: &&LockKey| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns);
        Relist(Some(
            s.unprotected
                .keys()
                .chain(s.holds_data.keys())
                .filter(mine)
                .cloned()
                .collect(),
        ))
    }

    fn seen(&mut self, key: &LockKey) {
        if let Some(keys) = &mut self.0 {
            keys.remove(key);
        }
    }

    fn done(&mut self, a: &AutoOptIn) {
        for key in self.0.take().unwrap_or_default() {
            a.forget(&key);
        }
    }
}

/// Watch errors: counted (`lock_janitor_watch_errors_total`), a WARN line
/// at most every 30 s. Readiness is not told: the opted-in locks are
/// protected whatever becomes of finding new ones.
#[derive(Default)]
struct Warned(Option<Instant>);

impl Warned {
    fn failed(&mut self, metrics: &Metrics, resource: &str, ns: Option<&str>, e: &watcher::Error) {
        metrics.watch_errors.with_label_values(&[resource]).inc();
        if self
            .0
            .is_none_or(|at| at.elapsed() > Duration::from_secs(30))
        {
            self.0 = Some(Instant::now());
            warn!(resource, scope = ns.unwrap_or("all namespaces"), error = %e,
                  "auto opt-in watch failing; retrying (the janitor needs list and watch on configmaps and leases in its scope)");
        }
    }
}

/// The finding watches' lists: without a label selector they read every
/// ConfigMap and Lease in scope, so they are paged small (100 a page, from
/// etcd, not at resourceVersion 0 as the lock watches list): the page being
/// decoded is what a list costs in memory. Measured (docs/performance.md,
/// "Auto opt-in"): at 5,000 ConfigMaps, 500 a page cost 6.1 MiB more RSS
/// than no auto opt-in, 100 a page 3.0 MiB.
fn unfiltered() -> watcher::Config {
    watcher::Config::default().page_size(100)
}

fn key_of(kind: LockKind, meta: &ObjectMeta) -> LockKey {
    LockKey {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        kind,
    }
}

/// The host a ConfigMap's leader record names (empty for a ConfigMap held
/// for life): what a ConfigMap candidate is known by, beside its uid.
fn record_host(o: Object<'_>) -> String {
    kinds::of(o)
        .holder(o)
        .filter(|h| h.uid.is_empty())
        .map(|h| h.name)
        .unwrap_or_default()
}

fn identity_of(l: &Lease) -> String {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default()
}

/// Whether a Lease was created, or its holder acquired it, within
/// `RECENT` before `now`: a watch event of such a Lease may be a new
/// holder. A renewal of a holder that acquired long ago is none, and so is
/// one whose times are ahead of `now`.
pub fn changed_lately(l: &Lease, now: Timestamp) -> bool {
    let recent = SignedDuration::try_from(RECENT).unwrap_or(SignedDuration::ZERO);
    let acquired = l
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.as_ref())
        .map(|t| t.0);
    let created = l.metadata.creation_timestamp.as_ref().map(|t| t.0);
    // A time ahead of `now` (the holder's clock fast) is not recent: else
    // each renewal would be judged for as long as that clock is ahead.
    [acquired, created]
        .into_iter()
        .flatten()
        .map(|t| now.duration_since(t))
        .any(|d| d >= SignedDuration::ZERO && d < recent)
}

mod judge;
use judge::pods_naming;

#[cfg(test)]
mod tests;
