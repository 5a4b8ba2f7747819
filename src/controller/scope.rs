//! The wiring of one scope (a namespace, or all) for one lock kind: the
//! watch of its opted-in locks (ConfigMaps metadata-only; Leases whole, the
//! holder identity is in the spec), the index that watch keeps (the scope's
//! pod side, `pods`, finds a terminal pod's locks in it), and the
//! Controller that judges them (`drive`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::channel::mpsc::UnboundedSender;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio_util::sync::CancellationToken;

use super::{drive, key_of, Context, LockMeta, Watched, Wiring};
use crate::index::{HolderIndex, Index, LeaseIndex};
use crate::kinds::{self, Judged};
use crate::lock::{self, LockKey};
use crate::scoped;
use crate::streams::{objects_only, on_first_sync, watch_backoff, watch_health};

/// What differs between the kinds in a scope's wiring.
pub(super) trait Kind:
    Watched + kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
{
    type Index: Index<Self>;
    /// The resource, as watch errors are counted.
    const RESOURCE: &'static str;
    /// Whether the lock watch's events reach the Controller from the start
    /// (Leases: the first list's are judged as they come), or only after
    /// the first sweep (ConfigMaps: it settles most locks without a read,
    /// then queues every other one itself; 10,000 locks queued at once
    /// before it would grow the Controller's scheduler to 10,000 entries,
    /// for good).
    const ACCEPTING_FROM_START: bool;
    /// Keeps of a watched lock only what the cache is used for.
    fn trim(&mut self);
    /// What memory learns from a listed, created or changed lock: every
    /// renewal the watch delivers of a renewed lock teaches its holder's
    /// renew period (a release waits for it to be missed).
    fn seen(ctx: &Context, key: &LockKey, lock: &Self) {
        let o = lock.object();
        if let Some(r) = kinds::of(o).renewal(o) {
            ctx.memory.saw_renewal(key, r);
        }
    }
    /// Who else hears that a lock left the watch (deleted, or its opt-in
    /// label removed or changed).
    fn left(_ctx: &Context, _key: &LockKey) {}
    /// What memory learns from a deleted one, before it is forgotten: the
    /// owner of a lock held for life, as it was last seen.
    fn gone(ctx: &Context, key: &LockKey, last: &Self) {
        Self::left(ctx, key);
        let o = last.object();
        let kind = kinds::of(o);
        if kind.judged() == Judged::ByOwner {
            if let Some(owner) = kind.holder(o) {
                ctx.memory.set_holder(key, &owner);
            }
        }
    }
}

impl Kind for LockMeta {
    type Index = HolderIndex;
    const RESOURCE: &'static str = "configmaps";
    const ACCEPTING_FROM_START: bool = false;
    fn trim(&mut self) {
        strip_cached(self)
    }
}

impl Kind for Lease {
    type Index = LeaseIndex;
    const RESOURCE: &'static str = "leases";
    const ACCEPTING_FROM_START: bool = true;
    /// Large annotations are dropped: a release is made from a live read,
    /// never from this copy.
    fn trim(&mut self) {
        lock::lease::trim_for_watch(self)
    }
    /// Also told to auto opt-in: a Lease leaves this watch when it is
    /// deleted or its opt-in label is removed or changed.
    fn left(ctx: &Context, key: &LockKey) {
        ctx.shared.left.tell(key);
    }
}

/// What a watched annotation longer than its kind reads is kept as.
pub(super) const TOO_LARGE: &str = "(too large to keep in the watch's copy)";

/// Keeps of a watched ConfigMap lock only what the cache is used for
/// (identity, version, owner references, the annotation a kind is read
/// from): a judgement reads the lock whole.
pub fn strip_cached(m: &mut LockMeta) {
    let meta = &mut m.metadata;
    meta.managed_fields = None;
    meta.annotations = meta.annotations.take().and_then(|mut all| {
        all.retain(|k, v| {
            // The longest any kind that reads it reads.
            let Some(max) = kinds::watched_annotations()
                .filter(|(w, _)| w == k)
                .map(|(_, max)| max)
                .max()
            else {
                return false;
            };
            if v.len() > max {
                // Longer than its kind reads: kept as a value that reads as
                // none (the lock stays its kind, unmanageable).
                *v = TOO_LARGE.to_owned();
            }
            true
        });
        (!all.is_empty()).then_some(all)
    });
    meta.labels = None;
    meta.finalizers = None;
    meta.creation_timestamp = None;
    meta.generate_name = None;
    meta.generation = None;
    m.types = None;
}

/// One kind's side of a scope, as the scope's pod side needs it.
pub(super) struct Side<K: Kind> {
    pub(super) index: Arc<K::Index>,
    pub(super) reader: Store<K>,
    /// Names suspects to the kind's Controller.
    pub(super) tx: UnboundedSender<ObjectRef<K>>,
    /// Whether the lock watch's events reach the Controller yet (set by the
    /// first sweep for ConfigMaps).
    pub(super) accepting: Arc<AtomicBool>,
}

/// The Controller of one kind in one scope (a namespace, or all), to run
/// until `shutdown`, and what the scope's pod side needs of it. `listed`
/// counts the lock watch's first list.
pub(super) fn run_scope<K: Kind>(
    ctx: Arc<Context>,
    namespace: Option<String>,
    listed: Arc<tokio::sync::watch::Sender<u8>>,
    shutdown: CancellationToken,
) -> (impl std::future::Future<Output = ()> + Send, Side<K>) {
    let within = namespace.as_deref().unwrap_or("all namespaces");
    let scope = match K::KIND {
        lock::LockKind::ConfigMap => within.to_owned(),
        lock::LockKind::Lease => format!("{within} (Lease locks)"),
    };
    // For ConfigMaps, Api<PartialObjectMeta<_>>: metadata-only requests.
    let api: Api<K> = scoped(&ctx.client, namespace.as_deref());
    let (reader, writer) = reflector::store::<K>();
    let index = Arc::new(K::Index::default());
    let accepting = Arc::new(AtomicBool::new(K::ACCEPTING_FROM_START));
    // Locks to judge that the lock watch's own events do not name: from the
    // pod side, the lead trigger and the end of a re-list.
    let (suspects_tx, suspects_rx) = futures::channel::mpsc::unbounded::<ObjectRef<K>>();
    let locks = {
        let (ctx, index, reader, tx) = (
            ctx.clone(),
            index.clone(),
            reader.clone(),
            suspects_tx.clone(),
        );
        let (ns, accepting) = (namespace.clone(), accepting.clone());
        let (shared, readiness) = (ctx.shared.clone(), ctx.shared.readiness.clone());
        let mut listed_once = false;
        let ns_label = namespace.clone().unwrap_or_default();
        let config = watcher::Config::default()
            .labels(ctx.settings.selector.as_str())
            .any_semantic();
        let stream = watcher(api, config)
            .backoff(watch_backoff())
            .modify(K::trim)
            .reflect(writer)
            .inspect(move |ev| match ev {
                Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                    K::seen(&ctx, &key_of(l), l);
                    index.apply(l);
                }
                Ok(watcher::Event::Delete(l)) => {
                    let key = key_of(l);
                    index.delete(&key);
                    K::gone(&ctx, &key, l);
                    ctx.forget(&key);
                }
                Ok(watcher::Event::Init) => index.relist_started(),
                Ok(watcher::Event::InitDone) => {
                    index.relist_done();
                    ctx.forget_missing(ns.as_deref(), &reader);
                    // A re-list's objects were queued before they reached
                    // the store; now that they have, what changed is queued
                    // again (the first list's reach the Controller as they
                    // come, or are queued by the first sweep).
                    if listed_once && accepting.load(Ordering::SeqCst) {
                        super::queue_unsettled(&ctx.memory, &reader, &tx);
                    }
                    listed_once = true;
                }
                Err(_) => {}
            });
        let stream = watch_health(stream, shared, K::RESOURCE, namespace.as_deref(), &scope);
        let synced = on_first_sync(stream, move || {
            readiness.synced_in(ns_label.as_str());
            listed.send_modify(|n| *n += 1);
        });
        objects_only(synced.applied_objects())
    };

    let side = Side {
        index,
        reader: reader.clone(),
        tx: suspects_tx.clone(),
        accepting: accepting.clone(),
    };
    let wiring = Wiring {
        locks,
        reader,
        suspects: suspects_rx,
        suspects_tx,
        accepting,
        concurrency: super::CONCURRENCY,
    };
    (
        async move { drive(ctx, wiring, &scope, shutdown).await },
        side,
    )
}
