//! The wiring of one scope (a namespace, or all) for ConfigMap locks: a
//! metadata-only watch of the opted-in locks and the holder index it keeps
//! (the scope's pod side, `pods`, finds a terminal pod's locks in it), and
//! the trigger on taking the lead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio_util::sync::CancellationToken;

use super::pods::ConfigMaps;
use super::{drive, key_of, Context, LockMeta, Wiring};
use crate::index::HolderIndex;
use crate::lock;
use crate::scoped;
use crate::streams::{objects_only, on_first_sync, watch_backoff, watch_health};

/// Keeps of a watched lock only what the cache is used for (identity,
/// version, owner references): a judgement reads the lock whole.
pub fn strip_cached(m: &mut LockMeta) {
    let meta = &mut m.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.finalizers = None;
    meta.creation_timestamp = None;
    meta.generate_name = None;
    meta.generation = None;
    m.types = None;
}

/// The ConfigMap controller of one scope (a namespace, or all), to run
/// until `shutdown`, and what the scope's pod side needs of it. `listed`
/// counts the lock watch's first list.
pub(super) fn run_scope(
    ctx: Arc<Context>,
    namespace: Option<String>,
    listed: Arc<tokio::sync::watch::Sender<u8>>,
    shutdown: CancellationToken,
) -> (impl std::future::Future<Output = ()> + Send, ConfigMaps) {
    let scope = namespace.as_deref().unwrap_or("all namespaces").to_owned();
    // Api<PartialObjectMeta<_>> makes metadata-only requests.
    let shared = ctx.shared.clone();
    let cms: Api<LockMeta> = scoped(&ctx.client, namespace.as_deref());
    let (reader, writer) = reflector::store::<LockMeta>();
    let holders = Arc::new(HolderIndex::default());
    let readiness = ctx.shared.readiness.clone();

    // Whether the first sweep is done (see `pods`).
    let swept = Arc::new(AtomicBool::new(false));
    // Locks to judge that the lock watch's own events do not name: from
    // the pod side, the lead trigger and the end of a re-list.
    let (suspects_tx, suspects_rx) = futures::channel::mpsc::unbounded::<ObjectRef<LockMeta>>();
    let locks = {
        let ctx = ctx.clone();
        let reader = reader.clone();
        let (tx, swept_then) = (suspects_tx.clone(), swept.clone());
        let readiness = readiness.clone();
        let ns = namespace.clone();
        let index = holders.clone();
        let config = watcher::Config::default()
            .labels(ctx.settings.selector.as_str())
            .any_semantic();
        let stream = watcher(cms, config)
            .backoff(watch_backoff())
            .modify(strip_cached)
            .reflect(writer)
            .inspect(move |ev| match ev {
                Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => index.apply(m),
                Ok(watcher::Event::Delete(m)) => {
                    let key = key_of(m);
                    index.delete(&key);
                    if let Ok(last) = lock::parse(&m.metadata) {
                        // Whose lock it was, as it was last seen.
                        ctx.memory.set_holder(&key, &last.holder);
                    }
                    ctx.forget(&key);
                }
                Ok(watcher::Event::Init) => index.relist_started(),
                Ok(watcher::Event::InitDone) => {
                    index.relist_done();
                    ctx.forget_missing(ns.as_deref(), &reader);
                    // A re-list's objects were queued before they reached
                    // the store; now that they have, what changed is queued
                    // again (before the first sweep, it queues them).
                    if swept_then.load(Ordering::SeqCst) {
                        super::queue_unsettled(&ctx.memory, &reader, &tx);
                    }
                }
                Err(_) => {}
            });
        let stream = watch_health(stream, shared.clone(), "configmaps", &scope);
        let synced = on_first_sync(stream, move || {
            readiness.synced();
            listed.send_modify(|n| *n += 1);
        });
        objects_only(synced.applied_objects())
    };

    let side = ConfigMaps {
        index: holders,
        reader: reader.clone(),
        tx: suspects_tx.clone(),
        swept: swept.clone(),
    };
    let wiring = Wiring {
        locks,
        reader,
        suspects: suspects_rx,
        suspects_tx,
        // Until the first sweep, lock events are not queued: it settles
        // most locks without a read, then queues every other one itself
        // (10,000 locks queued at once before it would grow the
        // Controller's scheduler to 10,000 entries, for good).
        accepting: swept,
        concurrency: super::CONCURRENCY,
    };
    (
        async move { drive(ctx, wiring, &scope, shutdown).await },
        side,
    )
}
