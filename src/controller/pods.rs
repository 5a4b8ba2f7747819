//! The pod side of one scope, shared by both lock kinds: one watch of
//! terminal pods and one resync sweeper name the locks whose holder may have
//! ended, ConfigMaps by the holder's uid (the holder index), Leases by its
//! name (the Lease index). Only the leader sweeps after the first sweep: a
//! standby keeps its watches warm and sweeps once it takes the lead.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::scope::{Kind, Side};
use super::wiring::TerminalPod;
use super::{error_backoff, key_of, resync_after, terminal_pods, Context, LockMeta};
use crate::index::Index;
use crate::lock::{self, LockKey};
use crate::readiness::Report;
use crate::sweep::{self, Sweep};

/// The kinds a scope watches.
#[derive(Default)]
pub(super) struct Sides {
    pub(super) configmaps: Option<Side<LockMeta>>,
    pub(super) leases: Option<Side<Lease>>,
}

impl Sides {
    fn watched(&self) -> sweep::Watched<'_> {
        sweep::Watched {
            configmaps: self.configmaps.as_ref().map(|c| &*c.index),
            leases: self.leases.as_ref().map(|l| &*l.index),
        }
    }

    /// A terminal pod: the locks it may hold are judged from live reads.
    fn ended(&self, ctx: &Context, pod: &TerminalPod) {
        let ns = pod.namespace().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some(c) = &self.configmaps {
            c.suspect(ctx, c.index.locks_of(&ns, uid));
            // The leader records whose identity names the pod.
            c.suspect(ctx, c.index.locks_named(&ns, &pod.name_any()));
        }
        if let Some(l) = &self.leases {
            // The Leases whose identity names the pod.
            l.suspect(ctx, l.index.leases_of(&ns, &pod.name_any()));
        }
    }

    /// Names a sweep's suspects to their Controllers.
    fn send(&self, ctx: &Context, found: Sweep) {
        if let Some(c) = &self.configmaps {
            c.suspect(ctx, found.configmaps);
        }
        if let Some(l) = &self.leases {
            l.suspect(ctx, found.leases);
        }
    }
}

impl<K: Kind> Side<K> {
    /// Marks these locks suspect (judged from live reads at their next
    /// reconcile) and names them to the kind's Controller.
    fn suspect(&self, ctx: &Context, keys: impl IntoIterator<Item = LockKey>) {
        for k in keys {
            ctx.memory.suspect(&k);
            let _ = self
                .tx
                .unbounded_send(ObjectRef::new(&k.name).within(&k.namespace));
        }
    }
}

impl Side<LockMeta> {
    /// The locks and versions before the first sweep: only these, unchanged
    /// since, may be settled by it.
    fn snapshot(&self) -> HashMap<LockKey, String> {
        self.reader
            .state()
            .iter()
            .map(|m| {
                (
                    key_of(&**m),
                    m.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect()
    }

    /// After the first sweep: every lock it found nothing against, unchanged
    /// since the snapshot, is settled without a read (start-up does not read
    /// each lock and holder one by one); from now on the lock watch queues
    /// what changes, and what is there and not settled is queued here (a
    /// lock whose event came before this is in the store by now, or, listed
    /// again by a re-list still under way, is queued at its end).
    fn settle(&self, ctx: &Context, before: &HashMap<LockKey, String>) {
        for m in self.reader.state() {
            let key = key_of(&*m);
            let Ok(lock) = lock::parse(&m.metadata) else {
                continue;
            };
            if before.get(&key) == Some(&lock.resource_version) {
                ctx.memory
                    .seed_held(&key, &lock.resource_version, &lock.holder);
            }
        }
        self.accepting.store(true, Ordering::SeqCst);
        super::queue_unsettled(&ctx.memory, &self.reader, &self.tx);
    }
}

/// Runs a scope's pod side until `shutdown`: the terminal-pod watch, and
/// the sweeper once `listed` counts `expect_listed` watches listed (this
/// one's and each kind's lock watch).
pub(super) async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    sides: Sides,
    listed: (
        Arc<tokio::sync::watch::Sender<u8>>,
        tokio::sync::watch::Receiver<u8>,
    ),
    expect_listed: u8,
    shutdown: CancellationToken,
) {
    let scope = namespace.as_deref().unwrap_or("all namespaces").to_owned();
    let sides = Arc::new(sides);
    let (listed_tx, listed_rx) = listed;
    let watch = {
        let readiness = ctx.shared.readiness.clone();
        let (ctx, sides) = (ctx.clone(), sides.clone());
        let within = namespace.clone().unwrap_or_default();
        terminal_pods(&ctx.clone(), namespace.as_deref(), &scope, move || {
            readiness.synced_in(&within);
            listed_tx.send_modify(|n| *n += 1);
        })
        .for_each(move |pod| {
            if let Ok(pod) = pod {
                sides.ended(&ctx, &pod);
            }
            futures::future::ready(())
        })
    };
    let sweeper = sweeper(ctx, namespace, sides, listed_rx, expect_listed, shutdown);
    tokio::select! {
        _ = watch => {}
        _ = sweeper => {}
    }
}

/// Resolves when this replica takes the lead (never without an election:
/// it always leads, and sweeps on its timer).
async fn took_lead(changes: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    if let Some(rx) = changes {
        while rx.changed().await.is_ok() {
            if *rx.borrow_and_update() {
                return;
            }
        }
    }
    futures::future::pending::<()>().await
}

/// Once the watches have listed, and every --resync while this replica
/// leads (and at once when it takes the lead), one sweep names the suspects
/// of both kinds (see `sweep`). The first sweep runs on every replica: it
/// settles the locks it finds nothing against and is the last thing
/// readiness waits for. Later ones prune ghosts: a lock deleted while its
/// reconcile was in flight may be remembered after the watch said it was
/// gone.
async fn sweeper(
    ctx: Arc<Context>,
    ns: Option<String>,
    sides: Arc<Sides>,
    mut listed: tokio::sync::watch::Receiver<u8>,
    expect_listed: u8,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = listed.wait_for(|n| *n >= expect_listed) => {}
    }
    let scope = ns.as_deref().unwrap_or("all namespaces");
    let health = format!("pods sweep in {scope}");
    let mut lead = ctx.gate.changes();
    let mut first = true;
    let mut failures = 0;
    loop {
        // A replica whose sweep fails keeps trying, leading or not: its
        // readiness must see the sweep work again, not merely stop failing.
        if first || failures > 0 || ctx.gate.may_write() {
            let before = match (&sides.configmaps, first) {
                (Some(c), true) => c.snapshot(),
                _ => HashMap::new(),
            };
            let mut found = Sweep::default();
            // Read-only: dropped at shutdown rather than holding the drain.
            let swept = tokio::select! {
                r = sweep::sweep(&ctx.client, ns.as_deref(), sides.watched(), &mut found) => r,
                _ = shutdown.cancelled() => break,
            };
            match swept {
                Ok(()) => {
                    failures = 0;
                    swept_whole(&ctx, scope, &health, &found);
                    if first {
                        first_sweep_done(&ctx, ns.as_deref(), &sides, &before).await;
                        first = false;
                        // Leading already counts as taken: no second sweep.
                        if let Some(rx) = lead.as_mut() {
                            rx.borrow_and_update();
                        }
                    }
                    sides.send(&ctx, found);
                }
                Err(e) => {
                    failures += 1;
                    sweep_failed(&ctx, ns.as_deref(), &health, &e);
                    // What it found before the error is judged (never
                    // settled: the first sweep settles only when whole).
                    if !first {
                        sides.send(&ctx, found);
                    }
                }
            }
        }
        if !first {
            tidy(&ctx, ns.as_deref(), &sides);
        }
        // A failing sweep retries at least every 30 s, so readiness sees it
        // failing rather than recovered.
        let wait = if failures > 0 {
            error_backoff(failures).min(Duration::from_secs(30))
        } else {
            resync_after(ctx.settings.resync)
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
            _ = took_lead(&mut lead), if !first => {
                debug!(scope, "took the lead: sweeping now");
            }
        }
    }
}

/// A whole sweep: its health recovers, and its suspects are marked (first,
/// so that seeding leaves them alone).
fn swept_whole(ctx: &Context, scope: &str, health: &str, found: &Sweep) {
    if ctx.shared.readiness.watch_ok(health) {
        info!(sweep = %health, "resync sweep recovered");
    }
    debug!(
        scope,
        pods = found.pods,
        requests = found.requests,
        namespaces = found.namespaces,
        suspects = found.configmaps.len() + found.leases.len(),
        remembered = ctx.memory.remembered(),
        awaited = ctx.takeovers.awaiting().len(),
        "resync sweep done"
    );
    for key in found.configmaps.iter().chain(&found.leases) {
        ctx.memory.suspect(key);
    }
}

/// After the first whole sweep: the locks it found nothing against are
/// settled, the takeovers awaited before a restart are followed again, and
/// the scope is synced.
async fn first_sweep_done(
    ctx: &Context,
    ns: Option<&str>,
    sides: &Sides,
    before: &HashMap<LockKey, String>,
) {
    if let Some(c) = &sides.configmaps {
        c.settle(ctx, before);
    }
    // What was awaited before a restart or a failover.
    match ctx.takeovers.restore(ns).await {
        Ok(n) if n > 0 => info!(awaited = n, "takeovers awaited again after a restart"),
        Ok(_) => {}
        Err(e) => warn!(error = %e,
            "could not read the janitor's reclaim Events; takeovers awaited before a restart are not followed"),
    }
    ctx.shared.readiness.synced_in(ns.unwrap_or_default());
}

/// A failed sweep: counted as a pod watch error, and in readiness as a
/// watch of its own (not ready after a minute of this).
fn sweep_failed(ctx: &Context, ns: Option<&str>, health: &str, e: &crate::Error) {
    let within = ns.unwrap_or_default();
    if let Report::Warn {
        errors,
        failing_for,
    } = ctx.shared.watch_failed("pods", within, health)
    {
        warn!(sweep = %health, error = %e, errors, failing_seconds = failing_for.as_secs(),
              "resync sweep failed; retrying (not ready after a minute of this)");
    }
}

/// Local, on every replica: ghosts of locks deleted while their reconcile
/// was in flight, and reclaim series past their time. Not while a re-list
/// is under way: the store still holds the copy from before it, and a lock
/// listed again would be forgotten (its clocks and renewal history with it).
fn tidy(ctx: &Context, ns: Option<&str>, sides: &Sides) {
    if let Some(c) = sides.configmaps.as_ref().filter(|c| !c.index.relisting()) {
        ctx.forget_missing(ns, &c.reader);
    }
    if let Some(l) = sides.leases.as_ref().filter(|l| !l.index.relisting()) {
        ctx.forget_missing(ns, &l.reader);
    }
    ctx.shared
        .metrics
        .prune_reclaims(crate::metrics::RECLAIM_SERIES_TTL);
}
