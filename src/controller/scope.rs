//! The wiring of one scope (a namespace, or all) for ConfigMap locks: a
//! metadata-only watch of the opted-in locks, a watch of terminal pods that
//! finds the locks each holds (the holder index), the resync sweeper, and
//! the trigger on taking the lead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    drive, error_backoff, key_of, resync_after, suspects, terminal_pods, Context, LockMeta, Wiring,
};
use crate::index::HolderIndex;
use crate::lock::{self, LockKey};
use crate::streams::{objects_only, on_first_sync, watch_backoff, watch_health};
use crate::{scoped, sweep};

/// Keeps of a watched lock only what the cache is used for (identity,
/// version, owner references): every judgement re-reads the lock whole.
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

/// Runs the controller for one scope (a namespace, or all) until `shutdown`.
pub(super) async fn run_scope(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: CancellationToken,
) {
    let scope = namespace.as_deref().unwrap_or("all namespaces").to_owned();
    // Api<PartialObjectMeta<_>> makes metadata-only requests.
    let shared = ctx.shared.clone();
    let cms: Api<LockMeta> = scoped(&ctx.client, namespace.as_deref());
    let (reader, writer) = reflector::store::<LockMeta>();
    let holders = Arc::new(HolderIndex::default());
    let readiness = ctx.shared.readiness.clone();
    // How many of this scope's two watches have listed once.
    let (listed_tx, listed_rx) = tokio::sync::watch::channel(0u8);
    let listed_tx = Arc::new(listed_tx);

    // Whether the first sweep is done (see below).
    let swept = Arc::new(AtomicBool::new(false));
    // Locks to judge that the lock watch's own events do not name: from
    // the sweeper, the lead trigger and the end of a re-list.
    let (suspects_tx, suspects_rx) = futures::channel::mpsc::unbounded::<ObjectRef<LockMeta>>();
    let suspects_tx_lead = suspects_tx.clone();
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
        let listed = listed_tx.clone();
        let stream = watch_health(stream, shared.clone(), "configmaps", &scope);
        let synced = on_first_sync(stream, move || {
            readiness.synced();
            listed.send_modify(|n| *n += 1);
        });
        objects_only(synced.touched_objects())
    };

    let terminal_pods = {
        let (readiness, listed) = (readiness.clone(), listed_tx.clone());
        terminal_pods(&ctx, namespace.as_deref(), &scope, move || {
            readiness.synced();
            listed.send_modify(|n| *n += 1);
        })
    };
    // A terminal pod finds its locks in the index: the cost of an event
    // does not grow with the number of locks.
    let held_by = {
        let (ctx, holders) = (ctx.clone(), holders.clone());
        move |pod: PartialObjectMeta<Pod>| {
            let ns = pod.namespace().unwrap_or_default();
            let uid = pod.metadata.uid.unwrap_or_default();
            let keys = holders.locks_of(&ns, &uid);
            // A death: the reads it makes necessary skip the idle budget.
            for k in &keys {
                ctx.memory.died(k, &uid);
            }
            suspects::<LockMeta>(&ctx, keys)
        }
    };

    // The sweeper: once both watches have listed, and every --resync, two
    // metadata-only pod lists name the suspects (see `sweep`). The first
    // sweep settles every lock it finds nothing against, so that start-up
    // does not read each lock and holder one by one; it is the last thing
    // readiness waits for. It also prunes ghosts: a lock deleted while its
    // reconcile was in flight may be remembered after the watch said it
    // was gone.
    let sweeper = {
        let (ctx, reader, ns, shutdown, index, swept) = (
            ctx.clone(),
            reader.clone(),
            namespace.clone(),
            shutdown.clone(),
            holders.clone(),
            swept.clone(),
        );
        let mut listed = listed_rx;
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = listed.wait_for(|n| *n >= 2) => {}
            }
            let mut first = true;
            let mut failures = 0;
            let health = format!(
                "pods sweep in {}",
                ns.as_deref().unwrap_or("all namespaces")
            );
            loop {
                // Locks as they were before the sweep: only these, unchanged
                // since, may be settled by the first one (later sweeps settle
                // nothing, and need no copy).
                let before: HashMap<LockKey, String> = if first {
                    reader
                        .state()
                        .iter()
                        .map(|m| {
                            (
                                key_of(&**m),
                                m.metadata.resource_version.clone().unwrap_or_default(),
                            )
                        })
                        .collect()
                } else {
                    HashMap::new()
                };
                match sweep::sweep(&ctx.client, ns.as_deref(), &index).await {
                    Ok(found) => {
                        failures = 0;
                        super::sweep_ok(&ctx, &health);
                        debug!(
                            scope = ns.as_deref().unwrap_or("all namespaces"),
                            pods = found.pods,
                            requests = found.requests,
                            suspects = found.suspects.len(),
                            "resync sweep done"
                        );
                        // Suspects first, so that seeding leaves them alone.
                        for key in &found.suspects {
                            ctx.memory.suspect(key);
                        }
                        if first {
                            for m in reader.state() {
                                let key = key_of(&*m);
                                let Ok(lock) = lock::parse(&m.metadata) else {
                                    continue;
                                };
                                if before.get(&key) == Some(&lock.resource_version) {
                                    ctx.memory.seed_held(
                                        &key,
                                        &lock.resource_version,
                                        &lock.holder,
                                    );
                                }
                            }
                            // From now on the lock watch queues what changes;
                            // what is already there and not settled is queued
                            // here (a lock whose event came before this is in
                            // the store by now, or, listed again by a re-list
                            // still under way, is queued at its end).
                            swept.store(true, Ordering::SeqCst);
                            super::queue_unsettled(&ctx.memory, &reader, &suspects_tx);
                            // What was awaited before a restart or a failover.
                            match ctx.takeovers.restore(ns.as_deref()).await {
                                Ok(n) if n > 0 => {
                                    info!(awaited = n, "takeovers awaited again after a restart")
                                }
                                Ok(_) => {}
                                Err(e) => warn!(error = %e,
                                    "could not read the janitor's reclaim Events; takeovers awaited before a restart are not followed"),
                            }
                            ctx.shared.readiness.synced();
                            first = false;
                        } else {
                            ctx.forget_missing(ns.as_deref(), &reader);
                            ctx.shared
                                .metrics
                                .prune_reclaims(crate::metrics::RECLAIM_SERIES_TTL);
                        }
                        for key in found.suspects {
                            let _ = suspects_tx
                                .unbounded_send(ObjectRef::new(&key.name).within(&key.namespace));
                        }
                    }
                    Err(e) => {
                        failures += 1;
                        super::sweep_failed(&ctx, &health, &e);
                    }
                }
                // A failing sweep retries at least every 30 s, so readiness
                // sees it failing rather than recovered.
                let wait = if failures > 0 {
                    error_backoff(failures).min(Duration::from_secs(30))
                } else {
                    resync_after(ctx.settings.resync)
                };
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        })
    };

    let wiring = Wiring {
        locks,
        reader,
        terminal_pods,
        held_by,
        suspects: suspects_rx,
        suspects_tx: suspects_tx_lead,
        // Until the first sweep, lock events are not queued: it settles
        // most locks without a read, then queues every other one itself
        // (10,000 locks queued at once before it would grow the
        // Controller's scheduler to 10,000 entries, for good).
        accepting: swept,
        sweeper,
        concurrency: 4,
    };
    drive(ctx, wiring, &scope, shutdown).await;
}
