//! kube-runtime wiring: a metadata-only watch of the opted-in locks, a watch
//! of terminal pods that maps each to the locks it holds, and a periodic
//! resync. (Over 500 lines: the wiring of one scope, its watches, sweeper
//! and lead trigger, reads best as one function; its tests are in tests.rs.) Each reconcile judges the lock from live reads (`observe`) and
//! acts on the verdict (`reclaim`), remembering what it needs (`memory`)
//! and following deleted locks for a takeover (`takeover`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{future, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::election::Gate;
use crate::events::Events;
use crate::index::HolderIndex;
use crate::lock::{self, LockKey};
use crate::memory::Memory;
use crate::observe::{Judgement, Observer};
use crate::reclaim::{self, Mode, Reclaimer};
use crate::selector::Selector;
use crate::shared::Shared;
use crate::streams::{objects_only, on_first_sync, watch_backoff, watch_health};
use crate::takeover::Takeovers;
use crate::verdict::{self, Policy, Verdict};
use crate::{scoped, sweep, Error, TERMINAL_PODS};

/// How soon a standby judges a stale lock again; taking the lead triggers a
/// judgement of every lock at once anyway.
const STANDBY_RETRY: Duration = Duration::from_secs(5);
/// How soon a lock that changed under a delete is judged again.
const REJUDGE_AFTER: Duration = Duration::from_millis(500);
/// Retry delay after a first error (counted in `error_policy`); it doubles
/// with each failure in a row, up to `MAX_ERROR_BACKOFF`, with ±20% jitter.
const ERROR_BACKOFF: Duration = Duration::from_secs(5);
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(300);

/// The wait before retrying a lock that failed `failures` times in a row.
pub fn error_backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(10);
    let base = ERROR_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_ERROR_BACKOFF);
    base.mul_f64(0.8 + 0.4 * fastrand::f64())
}

/// When to judge a lock again without a trigger: within `resync`, spread
/// over its last quarter so that locks listed together are not re-judged
/// together.
pub fn resync_after(resync: Duration) -> Duration {
    resync.mul_f64(0.75 + 0.25 * fastrand::f64())
}

pub type LockMeta = PartialObjectMeta<ConfigMap>;

#[derive(Clone, Debug)]
pub struct Settings {
    pub selector: Selector,
    /// Empty: the whole cluster.
    pub namespaces: Vec<String>,
    pub dry_run: bool,
    pub delete_pod: bool,
    pub policy: Policy,
    pub resync: Duration,
    pub takeover_timeout: Duration,
}

/// Per-reconcile context: who reads, who remembers, who writes.
pub struct Context {
    pub client: Client,
    /// Who may write (the leader lease).
    pub gate: Gate,
    pub shared: Shared,
    pub settings: Settings,
    pub observer: Observer,
    pub memory: Arc<Memory>,
    pub reclaimer: Reclaimer,
    pub takeovers: Takeovers,
}

impl Context {
    /// A janitor that always writes (no leader election).
    pub fn new(client: Client, shared: Shared, settings: Settings) -> Arc<Self> {
        Self::with_gate(client, shared, settings, Gate::always())
    }

    /// A janitor that writes only while `gate` allows it.
    pub fn with_gate(client: Client, shared: Shared, settings: Settings, gate: Gate) -> Arc<Self> {
        let metrics = shared.metrics.clone();
        let memory = Arc::new(Memory::new(metrics.clone()));
        let mode = Mode {
            dry_run: settings.dry_run,
            delete_pod: settings.delete_pod,
        };
        Arc::new(Context {
            observer: Observer::new(
                client.clone(),
                settings.selector.clone(),
                settings.namespaces.clone(),
                settings.policy.clone(),
            ),
            reclaimer: Reclaimer::new(
                client.clone(),
                crate::takeover::reclaim_marker(&settings.selector),
                gate.clone(),
                Events::new(client.clone(), metrics.clone(), gate.clone()),
                metrics.clone(),
                memory.clone(),
                mode,
            ),
            takeovers: Takeovers::new(
                client.clone(),
                gate.clone(),
                shared.readiness.clone(),
                metrics.clone(),
                Events::new(client.clone(), metrics.clone(), gate.clone()),
                crate::takeover::Settings {
                    selector: settings.selector.clone(),
                    dry_run: settings.dry_run,
                    timeout: settings.takeover_timeout,
                },
            ),
            memory,
            gate,
            client,
            shared,
            settings,
        })
    }

    /// Reads the lock and its holder live and judges them with this
    /// janitor's memory. `None`: the lock is gone or no longer opted in.
    pub async fn judge_live(&self, key: &LockKey) -> Result<Option<Judgement>, Error> {
        let j = self
            .observer
            .judge_live(key, &self.memory.clock(key))
            .await?;
        if let Some(lock) = j.as_ref().and_then(|j| j.lock.as_ref()) {
            self.memory.set_holder(key, &lock.holder);
        }
        Ok(j)
    }

    /// Forgets a lock that no longer exists (or no longer carries the
    /// opt-in label), and starts following its name for a takeover.
    pub fn forget(&self, key: &LockKey) {
        if let Some(holder) = self.memory.forget(key) {
            info!(namespace = %key.namespace, lock = %key.name, holder = %holder.name,
                  "watched lock deleted or opted out; awaiting a takeover");
            self.takeovers
                .follow(key, holder, k8s_openapi::jiff::Timestamp::now());
        }
    }

    /// After a re-list: forgets locks of this scope that are no longer there.
    fn forget_missing(&self, namespace: Option<&str>, store: &Store<LockMeta>) {
        let present: HashSet<LockKey> = store.state().iter().map(|m| key_of(m)).collect();
        for k in self.memory.keys_in(namespace) {
            if !present.contains(&k) {
                self.forget(&k);
            }
        }
    }
}

pub fn key_of(m: &LockMeta) -> LockKey {
    LockKey {
        namespace: m.namespace().unwrap_or_default(),
        name: m.name_any(),
    }
}

/// Judges one lock from live reads and acts on the verdict, unless its last
/// judgement still stands (nothing changed since: see `memory`).
pub async fn reconcile(obj: Arc<LockMeta>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.shared.readiness.is_synced() {
        // Safety rule 4: nothing happens before every watch has synced.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let key = key_of(&obj);
    let cached_rv = obj.metadata.resource_version.as_deref().unwrap_or_default();
    if !ctx.memory.needs_judging(&key, cached_rv) {
        // Its judgement stands until the lock or its holder changes: the
        // lock watch, the terminal-pod watch and each sweep say so. No
        // timer is kept per settled lock (memory at 10,000 locks).
        return Ok(Action::await_change());
    }
    let _timer = ctx.shared.metrics.reconcile_duration.start_timer();
    ctx.memory.take_suspect(&key);
    if let Ok(cached) = lock::parse(&obj.metadata) {
        // Known before any read can fail: whose lock to follow if it goes.
        ctx.memory.set_holder(&key, &cached.holder);
    }
    let Some(judgement) = ctx.judge_live(&key).await? else {
        debug!(namespace = %key.namespace, lock = %key.name, "lock is gone");
        ctx.forget(&key);
        return Ok(Action::await_change());
    };
    let judged_rv = judgement.meta.resource_version.clone().unwrap_or_default();
    let untouchable = match &judgement.verdict {
        Verdict::Ambiguous { .. } => Some(crate::events::REASON_AMBIGUOUS),
        Verdict::Unmanageable(_) => Some(crate::events::REASON_UNMANAGEABLE),
        _ => None,
    };
    let mut settles = settles(&judgement.verdict);
    let action = act(&ctx, judgement).await?;
    if let Some(reason) = untouchable {
        // Settled only once its Event is written (a standby writes none).
        settles &= ctx.memory.was_reported(&key, &judged_rv, reason);
    }
    ctx.memory.judged(&key, &judged_rv, settles);
    ctx.memory.succeeded(&key);
    if settles && !ctx.memory.needs_judging(&key, &judged_rv) {
        // Settled and not suspected while it was judged: no timer.
        return Ok(Action::await_change());
    }
    Ok(action)
}

/// Whether a verdict stands until the lock or its holder changes (both are
/// watched). A stale lock (dry run, blocked, failing), a running owner-gone
/// grace and an owner in another namespace are judged again each time.
fn settles(v: &Verdict) -> bool {
    !matches!(
        v,
        Verdict::Stale { .. }
            | Verdict::Held(verdict::HeldBecause::OwnerGoneGrace { .. })
            | Verdict::Unmanageable(lock::Unmanageable::OwnerInOtherNamespace(_))
    )
}

/// Acts on a judgement: reports, reclaims, and says when to look again.
pub async fn act(ctx: &Context, j: Judgement) -> Result<Action, Error> {
    let resync = Action::requeue(resync_after(ctx.settings.resync));
    ctx.memory.set_state(&j.key, j.verdict.state());
    if !matches!(j.verdict, Verdict::Stale { .. }) {
        ctx.memory.clear_stale(&j.key);
    }
    match &j.verdict {
        Verdict::Held(why) => {
            debug!(namespace = %j.key.namespace, lock = %j.key.name, held = ?why, "lock is held");
            if let verdict::HeldBecause::OwnerGoneGrace { remaining } = why {
                info!(namespace = %j.key.namespace, lock = %j.key.name,
                      "holder pod is missing; reclaiming after the owner-gone grace unless it reappears");
                let wait = remaining.saturating_add(Duration::from_millis(100));
                return Ok(Action::requeue(wait.min(ctx.settings.resync)));
            }
            Ok(resync)
        }
        Verdict::Ambiguous { .. } | Verdict::Unmanageable(_) => {
            ctx.reclaimer.report_untouchable(&j).await;
            Ok(resync)
        }
        Verdict::Stale { .. } => match ctx.reclaimer.reclaim(&j).await? {
            reclaim::Outcome::Reclaimed | reclaim::Outcome::AlreadyGone => {
                ctx.forget(&j.key);
                Ok(Action::await_change())
            }
            reclaim::Outcome::Changed => Ok(Action::requeue(REJUDGE_AFTER)),
            reclaim::Outcome::DryRun | reclaim::Outcome::Blocked => Ok(resync),
            // A standby looks again soon: it writes once it leads.
            reclaim::Outcome::NotLeader => Ok(Action::requeue(STANDBY_RETRY)),
        },
    }
}

/// The one place where failures are counted; each lock backs off on its own.
pub fn error_policy(obj: Arc<LockMeta>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.shared
        .metrics
        .reconcile_errors
        .with_label_values(&[err.kind().as_str()])
        .inc();
    let key = key_of(&obj);
    // Judged again from live reads after the backoff, whatever the memory says.
    ctx.memory.suspect(&key);
    let failures = ctx.memory.failed(&key);
    let retry = error_backoff(failures);
    warn!(namespace = %obj.namespace().unwrap_or_default(), lock = %obj.name_any(), error = %err,
          kind = err.kind().as_str(), failures, retry_seconds = retry.as_secs_f64(),
          "reconcile failed; nothing deleted, retrying");
    Action::requeue(retry)
}

/// Runs the controller for one scope (a namespace, or all) until `shutdown`.
async fn run_scope(ctx: Arc<Context>, namespace: Option<String>, shutdown: CancellationToken) {
    let scope = namespace.as_deref().unwrap_or("all namespaces").to_owned();
    // Api<PartialObjectMeta<_>> makes metadata-only requests.
    let shared = ctx.shared.clone();
    let cms: Api<LockMeta> = scoped(&ctx.client, namespace.as_deref());
    let pods: Api<PartialObjectMeta<Pod>> = scoped(&ctx.client, namespace.as_deref());
    let (reader, writer) = reflector::store::<LockMeta>();
    let holders = Arc::new(HolderIndex::default());
    let readiness = ctx.shared.readiness.clone();
    // How many of this scope's two watches have listed once.
    let (listed_tx, listed_rx) = tokio::sync::watch::channel(0u8);
    let listed_tx = Arc::new(listed_tx);

    let locks = {
        let ctx = ctx.clone();
        let reader = reader.clone();
        let readiness = readiness.clone();
        let ns = namespace.clone();
        let index = holders.clone();
        let config = watcher::Config::default()
            .labels(ctx.settings.selector.as_str())
            .any_semantic();
        let stream = watcher(cms, config)
            .backoff(watch_backoff())
            // Keep only what the cache is used for (identity, version, owner
            // references): every judgement re-reads the lock whole.
            .modify(|m: &mut LockMeta| {
                let meta = &mut m.metadata;
                meta.managed_fields = None;
                meta.annotations = None;
                meta.labels = None;
                meta.finalizers = None;
                meta.creation_timestamp = None;
                meta.generate_name = None;
                meta.generation = None;
                m.types = None;
            })
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
        let readiness = readiness.clone();
        let listed = listed_tx.clone();
        let stream = watcher(pods, watcher::Config::default().fields(TERMINAL_PODS))
            .backoff(watch_backoff());
        let stream = watch_health(stream, shared.clone(), "pods", &scope);
        let synced = on_first_sync(stream, move || {
            readiness.synced();
            listed.send_modify(|n| *n += 1);
        });
        objects_only(synced.touched_objects())
    };
    // A terminal pod finds its locks in the index: the cost of an event
    // does not grow with the number of locks.
    let held_by = {
        let (ctx, holders) = (ctx.clone(), holders.clone());
        move |pod: PartialObjectMeta<Pod>| {
            let ns = pod.namespace().unwrap_or_default();
            let uid = pod.metadata.uid.unwrap_or_default();
            holders
                .locks_of(&ns, &uid)
                .into_iter()
                .map(|k| {
                    ctx.memory.suspect(&k);
                    ObjectRef::new(&k.name).within(&k.namespace)
                })
                .collect::<Vec<_>>()
        }
    };

    // The sweeper: once both watches have listed, and every --resync, two
    // metadata-only pod lists name the suspects (see `sweep`). The first
    // sweep settles every lock it finds nothing against, so that start-up
    // does not read each lock and holder one by one; it is the last thing
    // readiness waits for. It also prunes ghosts: a lock deleted while its
    // reconcile was in flight may be remembered after the watch said it
    // was gone.
    let (suspects_tx, suspects_rx) = futures::channel::mpsc::unbounded::<ObjectRef<LockMeta>>();
    let suspects_tx_lead = suspects_tx.clone();
    let sweeper = {
        let (ctx, reader, ns, shutdown, index) = (
            ctx.clone(),
            reader.clone(),
            namespace.clone(),
            shutdown.clone(),
            holders.clone(),
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
                // since, may be settled by the first one.
                let before: HashMap<LockKey, String> = reader
                    .state()
                    .iter()
                    .map(|m| {
                        (
                            key_of(m),
                            m.metadata.resource_version.clone().unwrap_or_default(),
                        )
                    })
                    .collect();
                match sweep::sweep(&ctx.client, ns.as_deref(), &index).await {
                    Ok(found) => {
                        failures = 0;
                        if ctx.shared.readiness.watch_ok(&health) {
                            info!(sweep = %health, "resync sweep recovered");
                        }
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
                                let key = key_of(&m);
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
                        ctx.shared
                            .metrics
                            .watch_errors
                            .with_label_values(&["pods"])
                            .inc();
                        if let crate::readiness::Report::Warn {
                            errors,
                            failing_for,
                        } = ctx.shared.readiness.watch_failed(&health)
                        {
                            warn!(sweep = %health, error = %e, errors, failing_seconds = failing_for.as_secs(),
                                  "resync sweep failed; retrying (not ready after a minute of this)");
                        }
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

    // On taking the lead, look at every lock at once: a standby judged
    // stale locks without writing; the settled ones cost nothing.
    let on_lead = ctx.gate.changes().map(|mut changes| {
        let (reader, tx) = (reader.clone(), suspects_tx_lead.clone());
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                if *changes.borrow_and_update() {
                    for m in reader.state() {
                        let _ = tx.unbounded_send(ObjectRef::from_obj(&*m));
                    }
                }
            }
        })
    });

    info!(scope = %scope, selector = %ctx.settings.selector, "watching locks");
    Controller::for_stream(locks, reader)
        .watches_stream(terminal_pods, held_by)
        .reconcile_on(suspects_rx)
        .with_config(ControllerConfig::default().concurrency(4))
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            match res {
                Ok((obj, _)) => debug!(lock = %obj, "reconciled"),
                Err(e) => debug!(error = %e, "controller event"),
            }
            future::ready(())
        })
        .await;
    sweeper.abort();
    if let Some(t) = on_lead {
        t.abort();
    }
    info!(scope = %scope, "stopped watching");
}

/// Runs one controller per scope until `shutdown` is cancelled and every
/// in-flight reconcile has finished.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let scopes: Vec<Option<String>> = if ctx.settings.namespaces.is_empty() {
        vec![None]
    } else {
        ctx.settings.namespaces.iter().cloned().map(Some).collect()
    };
    // Per scope, two watches (locks, terminal pods) and the first sweep
    // must list before anything is judged.
    ctx.shared.readiness.expect(3 * scopes.len());
    future::join_all(
        scopes
            .into_iter()
            .map(|ns| run_scope(ctx.clone(), ns, shutdown.clone())),
    )
    .await;
}

#[cfg(test)]
mod tests;
