//! kube-runtime wiring: a metadata-only watch of the opted-in locks, a watch
//! of terminal pods that maps each to the locks it holds, and a periodic
//! sweep. Each reconcile is one straight line: take the lock's state
//! (`memory`), read the lock and its holder live and judge them
//! (`observe`), decide what to write (`decide`, pure), write it
//! (`reclaim`), put the next state. Deleted locks are followed for a
//! takeover (`takeover`).

use std::collections::HashSet;

use std::sync::Arc;
use std::time::Duration;

use futures::future;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::decide::{self, Judged, Next, State, Step, REJUDGE_AFTER};
use crate::election::Gate;
use crate::events::Events;
use crate::kinds::{self, Object};
use crate::lock::{Holder, LockKey, LockKind};
use crate::observe::{Judgement, Observer};
use crate::reclaim::{Done, Freed};
use crate::reclaim::{Mode, Reclaimer};
use crate::selector::Selector;
use crate::shared::Shared;
use crate::takeover::{Awaited, Takeovers, Workload};
use crate::verdict::Policy;
use crate::verdict::{HeldBecause, Verdict};
use crate::Error;

/// How soon a leader whose claim had lapsed during a write judges again.
const LAPSED_RETRY: Duration = Duration::from_secs(5);
use memory::Memory;
pub use wiring::Turn;

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

/// Judgements in flight per scope and kind: a mass eviction frees its
/// locks side by side, each waiting on its reads, its intent Event and its
/// write (a few round trips). The API server sees at most this many
/// judgements per scope and kind (each --namespace is a scope; the whole
/// cluster is one); the others wait their turn in the order they were
/// queued (`wiring::in_turn`). What judgements say after their writes
/// (or with none to make) goes on outside the turns,
/// `reclaim::REPORTS_AT_ONCE` at a time in all.
const CONCURRENCY: u16 = 16;

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
    /// Which kinds of lock are watched (`--lock-kinds`).
    pub kinds: Vec<LockKind>,
}

/// Per-reconcile context: who reads, who remembers, who writes.
pub struct Context {
    /// Within the API budget: the watches and the sweeps (the reads made on
    /// the janitor's own schedule).
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
        Self::with_clients(client.clone(), client, shared, settings, gate)
    }

    /// As `with_gate`; `budgeted` (within `--api-qps`) for the watches and
    /// sweeps, `control` (outside it) for what a judgement reads and
    /// writes: a lock and its holder read live right before the write they
    /// may lead to, and the takeover followers (a budget of their own).
    pub fn with_clients(
        budgeted: Client,
        control: Client,
        shared: Shared,
        settings: Settings,
        gate: Gate,
    ) -> Arc<Self> {
        let metrics = shared.metrics.clone();
        let mode = Mode {
            dry_run: settings.dry_run,
            delete_pod: settings.delete_pod,
        };
        Arc::new(Context {
            observer: Observer::new(
                control.clone(),
                settings.selector.clone(),
                settings.namespaces.clone(),
                settings.policy.clone(),
            ),
            reclaimer: Reclaimer::new(
                control.clone(),
                crate::takeover::reclaim_marker(&settings.selector),
                gate.clone(),
                Events::new(control.clone(), metrics.clone(), gate.clone()),
                metrics.clone(),
                mode,
            ),
            takeovers: Takeovers::new(
                control.clone(),
                gate.clone(),
                shared.readiness.clone(),
                metrics.clone(),
                Events::new(control, metrics.clone(), gate.clone()),
                crate::takeover::Settings {
                    selector: settings.selector.clone(),
                    dry_run: settings.dry_run,
                    timeout: settings.takeover_timeout,
                },
            ),
            memory: Arc::new(Memory::new(metrics)),
            gate,
            client: budgeted,
            shared,
            settings,
        })
    }

    /// Reads the lock and its holder live and judges them on a fresh state
    /// (what `scan` would find, with the controller's clocks). `None`: the
    /// lock is gone or no longer opted in.
    pub async fn judge_live(&self, key: &LockKey) -> Result<Option<Judgement>, Error> {
        self.judge(key, &mut State::default(), None).await
    }

    /// Judges a lock from live reads on the clocks of `state`; a Lease
    /// whose watched copy says it is released or expired is judged as that
    /// copy is (nothing is written for such a Lease).
    async fn judge(
        &self,
        key: &LockKey,
        state: &mut State,
        watched: Option<&Lease>,
    ) -> Result<Option<Judgement>, Error> {
        let mut clock = self.memory.clock(key, state);
        let now = k8s_openapi::jiff::Timestamp::now();
        // A renewed record that is released or expired, as watched.
        let free = |l: &&Lease| {
            let o = Object::Lease(l);
            kinds::of(o)
                .record(o)
                .is_some_and(|r| r.is_ok_and(|p| p.host.is_none() || p.expired(now)))
        };
        if let Some(lease) = watched.filter(free) {
            let j = self
                .observer
                .judge_watched_lease(key, lease, &mut clock)
                .await?;
            // Only a copy held as released or expired stands; anything
            // else (a clock that stepped back) is judged from live reads.
            let held = |j: &Judgement| {
                matches!(
                    j.verdict,
                    Verdict::Held(HeldBecause::Released | HeldBecause::Expired)
                )
            };
            if let Some(j) = j.filter(held) {
                return Ok(Some(j));
            }
        }
        self.observer.judge_live(key, &mut clock).await
    }

    /// Forgets a lock that no longer exists (or no longer carries the
    /// opt-in label), and follows its name to carry the opt-in label over
    /// to a new holder's lock. A takeover is awaited only of a lock the
    /// janitor freed itself (`reconcile`).
    pub fn forget(&self, key: &LockKey) {
        if let Some(holder) = self.memory.forget(key) {
            info!(namespace = %key.namespace, lock = %key.name, holder = %holder.name,
                  "watched lock deleted or opted out; following its name to label a new holder's lock");
            self.takeovers.follow(
                key,
                holder,
                k8s_openapi::jiff::Timestamp::now(),
                Awaited::Gone,
            );
        }
    }

    /// After a re-list: forgets locks of this kind and scope that are no
    /// longer there.
    fn forget_missing<K: Watched>(&self, namespace: Option<&str>, store: &Store<K>) {
        let present: HashSet<LockKey> = store.state().iter().map(|m| key_of(&**m)).collect();
        for k in self.memory.keys_in(namespace, K::KIND) {
            if !present.contains(&k) {
                self.forget(&k);
            }
        }
    }

    /// Writes what the decision calls for; `turn` ends once the write is
    /// answered (or at once when there is none), before it is said.
    async fn write(
        &self,
        j: &Judgement,
        step: Step,
        state: &State,
        turn: Turn,
    ) -> (Done, Option<Error>) {
        match step {
            Step::Nothing => (Done::default(), None),
            Step::Report(reason) => {
                turn.end();
                let said = self.reclaimer.report_untouchable(j).await.then_some(reason);
                (Done { freed: None, said }, None)
            }
            Step::Reclaim => {
                let version = j.version();
                let reported = |reason: &str| state.reported(&version, reason);
                self.reclaimer
                    .reclaim_with(j, reported, || turn.end())
                    .await
            }
        }
    }
}

/// What the controller watches as locks, one impl per kind.
pub trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    const KIND: LockKind;
    /// The watched copy, as its kind reads it.
    fn object(&self) -> Object<'_>;
    /// What a settled judgement depends on: when it changes, the lock is
    /// judged again (`memory::needs_judging`).
    fn version(&self) -> String {
        let o = self.object();
        kinds::of(o).version(o)
    }
    /// The holder the cached copy names, when it can tell.
    fn cached_holder(&self) -> Option<Holder> {
        let o = self.object();
        kinds::of(o).holder(o)
    }
    /// The Lease as its watch holds it (judged as it is when released or
    /// expired); none for ConfigMaps.
    fn cached_lease(&self) -> Option<&Lease> {
        None
    }
}

impl Watched for LockMeta {
    const KIND: LockKind = LockKind::ConfigMap;
    fn object(&self) -> Object<'_> {
        Object::ConfigMapMeta(&self.metadata)
    }
}

impl Watched for Lease {
    const KIND: LockKind = LockKind::Lease;
    fn object(&self) -> Object<'_> {
        Object::Lease(self)
    }
    fn cached_lease(&self) -> Option<&Lease> {
        Some(self)
    }
}

pub fn key_of<K: Watched>(o: &K) -> LockKey {
    LockKey {
        namespace: o.namespace().unwrap_or_default(),
        name: o.name_any(),
        kind: K::KIND,
    }
}

/// Judges one lock from live reads and writes what the verdict calls for,
/// unless its last judgement still stands (nothing changed since). `turn`:
/// its place among the judgements that run at once (`wiring::in_turn`),
/// given up once its write is answered.
pub async fn reconcile<K: Watched>(
    obj: Arc<K>,
    ctx: Arc<Context>,
    turn: Turn,
) -> Result<Action, Error> {
    let key = key_of(&*obj);
    if !ctx.shared.readiness.serves(&key.namespace) {
        // Safety rule 4: nothing happens in a scope before each of its
        // watches has synced (other scopes do not wait for it).
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let Some(mut state) = ctx.memory.take(&key, &obj.version(), obj.cached_holder()) else {
        // Its judgement stands until the lock or its holder changes: the
        // lock watch, the terminal-pod watch and each sweep say so. No
        // timer is kept per settled lock.
        return Ok(Action::await_change());
    };
    let _timer = ctx.shared.metrics.reconcile_duration.start_timer();
    let Some(j) = ctx.judge(&key, &mut state, obj.cached_lease()).await? else {
        debug!(namespace = %key.namespace, lock = %key.name, kind = %key.kind, "lock is gone");
        ctx.forget(&key);
        return Ok(Action::await_change());
    };
    say_held(&j);
    let version = j.version();
    let step = decide::step(&j.verdict, &state, &version);
    let (done, error) = ctx.write(&j, step, &state, turn).await;
    let judged = Judged {
        verdict: &j.verdict,
        version: &version,
        holder: j.lock.as_ref().map(|l| &l.holder),
        by_hostname: j.matched_by_hostname_only(),
    };
    let (next, then) = decide::after(state, &judged, &done, ctx.settings.resync);
    let stands = ctx.memory.put(&key, next);
    if let Some(e) = error {
        return Err(e);
    }
    Ok(match then {
        Next::OnChange if stands => Action::await_change(),
        Next::OnChange | Next::Resync => Action::requeue(resync_after(ctx.settings.resync)),
        Next::After(wait) => Action::requeue(wait),
        // The lead came while this judgement ran: taking it queued the
        // locks that were not settled, which this one may have looked.
        Next::OnLead if ctx.gate.may_write() => Action::requeue(REJUDGE_AFTER),
        // A leader whose claim lapsed while a renewal ran late: no lead
        // change will queue it again, so it looks again soon.
        Next::OnLead if ctx.gate.leads() => Action::requeue(LAPSED_RETRY),
        Next::OnLead => Action::requeue(resync_after(ctx.settings.resync)),
        Next::Forget => {
            // Freed by this janitor: a takeover is awaited (before forget,
            // which would follow it as merely gone).
            if let (Some(Freed::Reclaimed { at }), Some(lock)) = (&done.freed, &j.lock) {
                let workload = Workload::of(j.holder.as_ref());
                ctx.takeovers
                    .follow(&key, lock.holder.clone(), *at, Awaited::Freed(workload));
            }
            ctx.forget(&key);
            Action::await_change()
        }
    })
}

/// Logs why a lock is held (what is written says itself in reclaim.rs).
fn say_held(j: &Judgement) {
    let (namespace, lock) = (&j.key.namespace, &j.key.name);
    match &j.verdict {
        Verdict::Held(HeldBecause::OwnerGoneGrace { remaining }) => {
            info!(%namespace, %lock, remaining_seconds = remaining.as_secs_f64(),
                  "holder pod is missing; reclaiming after the owner-gone grace unless it reappears");
        }
        Verdict::Held(HeldBecause::RenewalWindow { remaining }) => {
            debug!(%namespace, %lock, remaining_seconds = remaining.as_secs_f64(),
                   "Lease holder died moments ago; releasing once nothing renewed it");
        }
        Verdict::Held(why) => debug!(%namespace, %lock, held = ?why, "lock is held"),
        _ => {}
    }
}

/// The one place where failures are counted; each lock backs off on its own.
pub fn error_policy<K: Watched>(obj: Arc<K>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.shared
        .metrics
        .reconcile_errors
        .with_label_values(&[err.kind().as_str()])
        .inc();
    let key = key_of(&*obj);
    // Judged again from live reads after the backoff, whatever the memory says.
    let failures = ctx.memory.failed(&key);
    let retry = error_backoff(failures);
    warn!(namespace = %obj.namespace().unwrap_or_default(), lock = %obj.name_any(), error = %err,
          kind = err.kind().as_str(), failures, retry_seconds = retry.as_secs_f64(),
          "reconcile failed; nothing deleted, retrying");
    Action::requeue(retry)
}

/// Runs one controller per scope and lock kind until `shutdown` is
/// cancelled and every in-flight reconcile has finished.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    run_refused(ctx, Vec::new(), shutdown).await
}

/// As `run`, with the scopes that refused at start-up (`preflight`) left
/// out: each is said, shown not ready (`lock_janitor_scope_ready` 0), and
/// checked again with backoff (`REFUSED_RETRY` doubling to
/// `MAX_REFUSED_RETRY`); watched from the moment it is allowed. The other
/// scopes are served meanwhile.
pub async fn run_refused(
    ctx: Arc<Context>,
    refused: Vec<crate::preflight::Refusal>,
    shutdown: CancellationToken,
) {
    let mut runs: Vec<future::BoxFuture<'static, ()>> = Vec::new();
    for ns in crate::scopes(&ctx.settings.namespaces) {
        match refused.iter().find(|r| r.scope == ns) {
            None => runs.extend(wire(&ctx, ns, &shutdown)),
            Some(r) => {
                let label = r.scope_label();
                ctx.shared.readiness.refused(label, r.missing());
                warn!(scope = %label, missing = %r.missing(), answer = %r.answer, retry_seconds = REFUSED_RETRY.as_secs(),
                      "scope refused at start-up: not watched, its locks are not reclaimed; serving the other scopes and checking it again with backoff");
                let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
                runs.push(Box::pin(async move {
                    if allowed_again(&ctx, &ns, &shutdown).await {
                        future::join_all(wire(&ctx, ns, &shutdown)).await;
                    }
                }));
            }
        }
    }
    future::join_all(runs).await;
}

/// A scope refused at start-up is checked again after this, then after
/// twice as long each time, up to `MAX_REFUSED_RETRY` (±20 % jitter).
pub const REFUSED_RETRY: Duration = Duration::from_secs(5);
pub const MAX_REFUSED_RETRY: Duration = Duration::from_secs(120);

/// The wait before the `n`th check (from 1) of a refused scope.
pub fn refused_retry(n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(10);
    REFUSED_RETRY
        .saturating_mul(1 << doublings)
        .min(MAX_REFUSED_RETRY)
        .mul_f64(0.8 + 0.4 * fastrand::f64())
}

/// Checks a refused scope again with backoff (the start-up check, within
/// the API budget) until it is allowed (true) or shutdown starts (false).
/// A namespace created later, with its RoleBinding, is picked up so.
async fn allowed_again(ctx: &Context, ns: &Option<String>, shutdown: &CancellationToken) -> bool {
    let scope = ns.as_deref().unwrap_or_default();
    let mut wait = refused_retry(1);
    for n in 2.. {
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(wait) => {}
        }
        let checked = crate::preflight::check_scope(
            &ctx.client,
            &ctx.settings.selector,
            ns.as_deref(),
            &ctx.settings.kinds,
        )
        .await;
        wait = refused_retry(n);
        let next = wait.as_secs();
        match checked {
            Ok(None) => {
                info!(scope, "scope allowed now: watching it");
                return true;
            }
            Ok(Some(r)) => {
                ctx.shared.readiness.refused(scope, r.missing());
                warn!(scope, missing = %r.missing(), retry_seconds = next,
                      "scope still refused: not watched, its locks are not reclaimed; checking it again");
            }
            Err(e) => {
                warn!(scope, error = %e, retry_seconds = next,
                      "could not check a refused scope; checking it again");
            }
        }
    }
    false
}

/// A scope's watches: each kind's lock watch and Controller, the
/// terminal-pod watch and the sweeper. Declared to readiness: nothing in
/// the scope is judged before each kind's lock watch, the pod watch and the
/// first sweep are done.
fn wire(
    ctx: &Arc<Context>,
    ns: Option<String>,
    shutdown: &CancellationToken,
) -> Vec<future::BoxFuture<'static, ()>> {
    let kinds = &ctx.settings.kinds;
    ctx.shared
        .readiness
        .expect_in(ns.as_deref().unwrap_or_default(), kinds.len() + 2);
    let mut runs: Vec<future::BoxFuture<'static, ()>> = Vec::new();
    // How many of the scope's watches have listed once.
    let (listed_tx, listed_rx) = tokio::sync::watch::channel(0u8);
    let listed_tx = Arc::new(listed_tx);
    let mut sides = pods::Sides::default();
    if kinds.contains(&LockKind::ConfigMap) {
        let (run, side) = scope::run_scope::<LockMeta>(
            ctx.clone(),
            ns.clone(),
            listed_tx.clone(),
            shutdown.clone(),
        );
        runs.push(Box::pin(run));
        sides.configmaps = Some(side);
    }
    if kinds.contains(&LockKind::Lease) {
        let (run, side) =
            scope::run_scope::<Lease>(ctx.clone(), ns.clone(), listed_tx.clone(), shutdown.clone());
        runs.push(Box::pin(run));
        sides.leases = Some(side);
    }
    let expect = u8::try_from(kinds.len() + 1).unwrap_or(u8::MAX);
    runs.push(Box::pin(pods::run(
        ctx.clone(),
        ns,
        sides,
        (listed_tx, listed_rx),
        expect,
        shutdown.clone(),
    )));
    runs
}

pub mod cadence;

pub mod memory;
mod pods;
mod scope;
mod wiring;
pub use scope::strip_cached;
use wiring::{drive, queue_unsettled, terminal_pods, Wiring};
/// Every freeing write of every kind, request by request, on a mocked API
/// server, through the reconcile's own judgement and write.
#[cfg(test)]
mod reclaims;
#[cfg(test)]
mod tests;
