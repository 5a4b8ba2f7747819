//! The wiring of one scope (a namespace, or all) for Lease locks: a watch
//! of the opted-in Leases (whole: the holder identity is in the spec), a
//! watch of terminal pods that finds the Leases each may hold by name (the
//! Lease index), a resync sweep, and the trigger on taking the lead.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{drive, error_backoff, key_of, resync_after, suspects, terminal_pods, Context, Wiring};
use crate::index::LeaseIndex;
use crate::lock;
use crate::streams::{objects_only, on_first_sync, watch_backoff, watch_health};
use crate::{scoped, sweep};

/// Runs the Lease controller for one scope until `shutdown`.
pub(super) async fn run_scope(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: CancellationToken,
) {
    // Its watches' health is its own (a healthy ConfigMap pod watch must
    // not cover for a failing one here).
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
    // the sweeper, the lead trigger and the end of a re-list.
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
        let mut listed = false;
        let config = watcher::Config::default()
            .labels(ctx.settings.selector.as_str())
            .any_semantic();
        let stream = watcher(leases, config)
            .backoff(watch_backoff())
            .modify(|l: &mut Lease| {
                l.metadata.managed_fields = None;
                l.metadata.annotations = None;
            })
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
                Ok(watcher::Event::InitDone) => {
                    ctx.forget_missing(ns.as_deref(), &reader);
                    // A re-list's objects were queued before they reached
                    // the store; now that they have, what changed is queued
                    // again (the first list's are judged as they come).
                    if listed {
                        super::queue_unsettled(&ctx.memory, &reader, &tx);
                    }
                    listed = true;
                }
                _ => {}
            });
        let stream = watch_health(stream, shared.clone(), "leases", &scope);
        let synced = on_first_sync(stream, move || readiness.synced());
        objects_only(synced.touched_objects())
    };

    let terminal_pods = {
        let readiness = readiness.clone();
        terminal_pods(&ctx, namespace.as_deref(), &scope, move || {
            readiness.synced()
        })
    };
    // A terminal pod finds the Leases that may name it.
    let held_by = {
        let (ctx, index) = (ctx.clone(), index.clone());
        move |pod: PartialObjectMeta<Pod>| {
            let ns = pod.namespace().unwrap_or_default();
            suspects::<Lease>(&ctx, index.leases_of(&ns, &pod.name_any()))
        }
    };

    // Each --resync, one list of terminal pods names the suspects.
    let sweeper = {
        let (ctx, ns, shutdown, index, tx) = (
            ctx.clone(),
            namespace.clone(),
            shutdown.clone(),
            index.clone(),
            suspects_tx.clone(),
        );
        tokio::spawn(async move {
            let mut failures = 0;
            let health = format!(
                "pods sweep in {} (Lease locks)",
                ns.as_deref().unwrap_or("all namespaces")
            );
            loop {
                let wait = if failures > 0 {
                    error_backoff(failures).min(std::time::Duration::from_secs(30))
                } else {
                    resync_after(ctx.settings.resync)
                };
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
                match sweep::sweep_leases(&ctx.client, ns.as_deref(), &index).await {
                    Ok(found) => {
                        failures = 0;
                        super::sweep_ok(&ctx, &health);
                        debug!(
                            scope = ns.as_deref().unwrap_or("all namespaces"),
                            pods = found.pods,
                            suspects = found.suspects.len(),
                            "lease sweep done"
                        );
                        for r in suspects::<Lease>(&ctx, found.suspects) {
                            let _ = tx.unbounded_send(r);
                        }
                    }
                    Err(e) => {
                        failures += 1;
                        super::sweep_failed(&ctx, &health, &e);
                    }
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
        suspects_tx,
        accepting: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        sweeper,
        concurrency: 2,
    };
    drive(ctx, wiring, &scope, shutdown).await;
}
