//! The wiring of one scope (a namespace, or all) for Lease locks: a watch
//! of the opted-in Leases (whole: the holder identity is in the spec) and
//! the Lease index it keeps (the scope's pod side, `pods`, finds the Leases
//! a terminal pod may hold by name in it), and the trigger on taking the
//! lead.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio_util::sync::CancellationToken;

use super::pods::Leases;
use super::{drive, key_of, Context, Wiring};
use crate::index::LeaseIndex;
use crate::lock;
use crate::scoped;
use crate::streams::{objects_only, on_first_sync, watch_backoff, watch_health};

/// The Lease controller of one scope, to run until `shutdown`, and what the
/// scope's pod side needs of it. `listed` counts the Lease watch's first
/// list.
pub(super) fn run_scope(
    ctx: Arc<Context>,
    namespace: Option<String>,
    listed: Arc<tokio::sync::watch::Sender<u8>>,
    shutdown: CancellationToken,
) -> (impl std::future::Future<Output = ()> + Send, Leases) {
    let scope = format!(
        "{} (Lease locks)",
        namespace.as_deref().unwrap_or("all namespaces")
    );
    let shared = ctx.shared.clone();
    let leases: Api<Lease> = scoped(&ctx.client, namespace.as_deref());
    let (reader, writer) = reflector::store::<Lease>();
    let index = Arc::new(LeaseIndex::default());
    let readiness = shared.readiness.clone();

    // Leases to judge that the Lease watch's own events do not name: from
    // the pod side, the lead trigger and the end of a re-list.
    let (suspects_tx, suspects_rx) = futures::channel::mpsc::unbounded::<ObjectRef<Lease>>();
    let locks = {
        let (ctx, index, reader, ns, readiness, tx) = (
            ctx.clone(),
            index.clone(),
            reader.clone(),
            namespace.clone(),
            readiness.clone(),
            suspects_tx.clone(),
        );
        let mut listed_once = false;
        let config = watcher::Config::default()
            .labels(ctx.settings.selector.as_str())
            .any_semantic();
        let stream = watcher(leases, config)
            .backoff(watch_backoff())
            // Large annotations are dropped: a release is made from a
            // live read, never from this copy.
            .modify(lock::lease::trim_for_watch)
            .reflect(writer)
            .inspect(move |ev| match ev {
                Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                    let host = lock::lease::parse(l).ok().and_then(|p| p.host);
                    let key = key_of(l);
                    // Every renewal the watch delivers teaches the holder's
                    // renew period (a release waits for it to be missed).
                    ctx.memory.saw_lease(&key, l);
                    index.apply(key, host);
                }
                Ok(watcher::Event::Delete(l)) => {
                    let key = key_of(l);
                    index.delete(&key);
                    ctx.forget(&key);
                }
                Ok(watcher::Event::Init) => index.relist_started(),
                Ok(watcher::Event::InitDone) => {
                    index.relist_done();
                    ctx.forget_missing(ns.as_deref(), &reader);
                    // A re-list's objects were queued before they reached
                    // the store; now that they have, what changed is queued
                    // again (the first list's are judged as they come).
                    if listed_once {
                        super::queue_unsettled(&ctx.memory, &reader, &tx);
                    }
                    listed_once = true;
                }
                _ => {}
            });
        let stream = watch_health(stream, shared.clone(), "leases", &scope);
        let synced = on_first_sync(stream, move || {
            readiness.synced();
            listed.send_modify(|n| *n += 1);
        });
        objects_only(synced.applied_objects())
    };

    let side = Leases {
        index,
        tx: suspects_tx.clone(),
    };
    let wiring = Wiring {
        locks,
        reader,
        suspects: suspects_rx,
        suspects_tx,
        accepting: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        concurrency: super::CONCURRENCY,
    };
    (
        async move { drive(ctx, wiring, &scope, shutdown).await },
        side,
    )
}
