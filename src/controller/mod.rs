//! kube-runtime wiring: a metadata-only watch of the opted-in locks, a watch
//! of terminal pods that maps each to the locks it holds, and a periodic
//! resync. (Over 500 lines: the wiring of one scope, its watches, sweeper
//! and lead trigger, reads best as one function; its tests are in tests.rs.) Each reconcile judges the lock from live reads (`observe`) and
//! acts on the verdict (`reclaim`), remembering what it needs (`memory`)
//! and following deleted locks for a takeover (`takeover`).

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

use crate::election::Gate;
use crate::events::Events;
use crate::lock::{self, Holder, LockKey, LockKind};
use crate::memory::Memory;
use crate::observe::{Judgement, Observer};
use crate::reclaim::{self, Mode, Reclaimer};
use crate::selector::Selector;
use crate::shared::Shared;
use crate::takeover::Takeovers;
use crate::verdict::{self, Policy, Verdict};
use crate::Error;

/// How soon a standby judges a stale lock again; taking the lead triggers a
/// judgement of every lock at once anyway.
const STANDBY_RETRY: Duration = Duration::from_secs(5);
/// How soon a lock that changed under a delete is judged again.
const REJUDGE_AFTER: Duration = Duration::from_millis(500);
/// A grace or a renewal window is judged again this long after its
/// remaining time: that time was measured just before, on clocks that move
/// with the timer's, so this covers the timer's rounding; a judgement made
/// a moment early finds the wait not over and waits again.
const PAST_THE_WAIT: Duration = Duration::from_millis(20);
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
    /// Which kinds of lock are watched (`--lock-kinds`).
    pub kinds: Vec<LockKind>,
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
        Self::with_clients(client.clone(), client, shared, settings, gate)
    }

    /// As `with_gate`, with `unbudgeted` (outside `--api-qps`) for the reads
    /// a death makes necessary and for the takeover followers, which keep
    /// to a budget of their own.
    pub fn with_clients(
        client: Client,
        unbudgeted: Client,
        shared: Shared,
        settings: Settings,
        gate: Gate,
    ) -> Arc<Self> {
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
            )
            .with_urgent(unbudgeted.clone()),
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
                unbudgeted,
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
        self.judge_with(key, None, None, false).await
    }

    /// As `judge_live`, but without reading a ConfigMap lock whose `cached`
    /// version was read live before and held no data, nor a Lease whose
    /// watched copy (`cached_lease`) may be judged as it is
    /// (`lease_copy_decides`); `urgent`: a death made these reads necessary
    /// (they skip the idle budget).
    pub async fn judge_with(
        &self,
        key: &LockKey,
        cached: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
        cached_lease: Option<&Lease>,
        urgent: bool,
    ) -> Result<Option<Judgement>, Error> {
        let clock = self.memory.clock(key);
        if let Some(lease) = cached_lease.filter(|l| lease_copy_decides(l, urgent)) {
            let j = self
                .observer
                .judge_watched_lease(key, lease, &clock, urgent)
                .await?;
            if let Some(lock) = j.as_ref().and_then(|j| j.lock.as_ref()) {
                self.memory.set_holder(key, &lock.holder);
            }
            return Ok(j);
        }
        let known = cached.filter(|m| {
            key.kind == LockKind::ConfigMap
                && m.resource_version
                    .as_deref()
                    .is_some_and(|rv| self.memory.known_shaped(key, rv))
        });
        let j = match known {
            Some(meta) => Some(
                self.observer
                    .judge_known(key, meta.clone(), &clock, urgent)
                    .await?,
            ),
            None => self.observer.judge_live_with(key, &clock, urgent).await?,
        };
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
}

/// Whether a Lease may be judged as its watch holds it, without a live
/// read. When a death made the judgement urgent: a release replaces
/// exactly the judged version (409 if it was renewed or changed since),
/// and the judgement after a 409 is not urgent and reads the Lease live,
/// so a watch that lags costs at most one refused write per death (a copy
/// the watch dropped large annotations from is read live instead). When
/// the copy is released or expired: such a Lease is held (candidates take
/// it by themselves) and nothing is written. A newer version reaches the
/// watch and is judged in its turn either way.
fn lease_copy_decides(lease: &Lease, urgent: bool) -> bool {
    // A copy without its large annotations never becomes a release's body.
    (urgent && crate::lock::lease::is_whole(lease))
        || crate::lock::lease::parse(lease)
            .is_ok_and(|p| p.host.is_none() || p.expired(k8s_openapi::jiff::Timestamp::now()))
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
    /// What a settled judgement depends on: when it changes, the lock is
    /// judged again (`memory::needs_judging`).
    fn version(&self) -> String;
    /// The holder the cached copy names, when it can tell.
    fn cached_holder(&self) -> Option<Holder>;
    /// The cached metadata a judgement may stand on instead of a read of
    /// the lock (ConfigMaps: see `Observer::judge_known`); none for Leases,
    /// whose release is an update of the very object read.
    fn cached_meta(&self) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta> {
        None
    }
    /// The Lease as its watch holds it, judged without a live read when
    /// `lease_copy_decides`; none for ConfigMaps.
    fn cached_lease(&self) -> Option<&Lease> {
        None
    }
}

impl Watched for LockMeta {
    const KIND: LockKind = LockKind::ConfigMap;
    fn version(&self) -> String {
        self.metadata.resource_version.clone().unwrap_or_default()
    }
    fn cached_holder(&self) -> Option<Holder> {
        lock::parse(&self.metadata).ok().map(|l| l.holder)
    }
    fn cached_meta(&self) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta> {
        Some(&self.metadata)
    }
}

impl Watched for Lease {
    const KIND: LockKind = LockKind::Lease;
    /// Its uid and holder identity, not its resourceVersion: a holder
    /// renews every few seconds, and a renewal changes nothing the verdict
    /// depends on (a holder's death comes from the terminal-pod watch).
    fn version(&self) -> String {
        lease_version(self)
    }
    fn cached_holder(&self) -> Option<Holder> {
        let host = lock::lease::parse(self).ok()?.host?;
        Some(Holder {
            name: host,
            uid: String::new(),
        })
    }
    fn cached_lease(&self) -> Option<&Lease> {
        Some(self)
    }
}

pub use crate::lock::lease::version as lease_version;

pub fn key_of<K: Watched>(o: &K) -> LockKey {
    LockKey {
        namespace: o.namespace().unwrap_or_default(),
        name: o.name_any(),
        kind: K::KIND,
    }
}

/// Judges one lock from live reads and acts on the verdict, unless its last
/// judgement still stands (nothing changed since: see `memory`).
pub async fn reconcile<K: Watched>(obj: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.shared.readiness.is_synced() {
        // Safety rule 4: nothing happens before every watch has synced.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let key = key_of(&*obj);
    if !ctx.memory.needs_judging(&key, &obj.version()) {
        // Its judgement stands until the lock or its holder changes: the
        // lock watch, the terminal-pod watch and each sweep say so. No
        // timer is kept per settled lock (memory at 10,000 locks).
        return Ok(Action::await_change());
    }
    let _timer = ctx.shared.metrics.reconcile_duration.start_timer();
    ctx.memory.take_suspect(&key);
    if let Some(holder) = obj.cached_holder() {
        // Known before any read can fail: whose lock to follow if it goes.
        ctx.memory.set_holder(&key, &holder);
    }
    // A standby's judgement ends in NotLeader: it keeps the death notice
    // for when it leads, and reads within the budget meanwhile.
    let urgent = ctx.gate.may_write() && ctx.memory.take_urgent(&key);
    let _death = urgent.then(|| ctx.reclaimer.judging_a_death());
    let Some(judgement) = ctx
        .judge_with(&key, obj.cached_meta(), obj.cached_lease(), urgent)
        .await?
    else {
        debug!(namespace = %key.namespace, lock = %key.name, kind = %key.kind, "lock is gone");
        ctx.forget(&key);
        return Ok(Action::await_change());
    };
    let judged = match &judgement.lease {
        Some(l) => lease_version(l),
        None => judgement.meta.resource_version.clone().unwrap_or_default(),
    };
    let untouchable = match &judgement.verdict {
        Verdict::Ambiguous { .. } | Verdict::AmbiguousHolders(_) => {
            Some(crate::events::REASON_AMBIGUOUS)
        }
        Verdict::Unmanageable(_) => Some(crate::events::REASON_UNMANAGEABLE),
        _ => None,
    };
    // A Lease whose holder matched by spec.hostname only: no terminal-pod
    // event names it (they name pods), so it is judged again each resync.
    let mut settles = settles(&judgement.verdict) && !judgement.matched_by_hostname_only();
    let reported_rv = judgement.reported_version();
    // Lock-shaped at this version, and not on its way out (a copy stripped
    // of its finalizers would tell them wrong).
    let shaped = key.kind == LockKind::ConfigMap
        && judgement.lock.is_some()
        && judgement.meta.deletion_timestamp.is_none();
    // A death's judgement found the renewal window open: the first one
    // after it ends is urgent too.
    let window = match judgement.verdict {
        Verdict::Held(verdict::HeldBecause::RenewalWindow { remaining }) if urgent => {
            Some(remaining)
        }
        _ => None,
    };
    let (action, changed) = act(&ctx, judgement).await?;
    if let Some(remaining) = window {
        ctx.memory.urgent_after_window(&key, remaining);
    }
    if let Some(reason) = untouchable {
        // Settled only once its Event is written (a standby writes none).
        settles &= ctx.memory.was_reported(&key, &reported_rv, reason);
    }
    ctx.memory.judged(&key, &judged, settles);
    // A ConfigMap lock-shaped at this version: its next judgement needs no
    // read of the lock while the version stands. Not after a 409: the cache
    // is behind the lock, and the next judgement reads it live (a 409 is
    // never retried blindly).
    if changed {
        ctx.memory.refused(&key);
    } else {
        ctx.memory.set_shaped(&key, shaped);
    }
    ctx.memory.succeeded(&key);
    if settles && !ctx.memory.needs_judging(&key, &judged) {
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
            | Verdict::Held(verdict::HeldBecause::RenewalWindow { .. })
            | Verdict::Held(verdict::HeldBecause::Expired)
            | Verdict::Unmanageable(lock::Unmanageable::OwnerInOtherNamespace(_))
    )
}

/// Acts on a judgement: reports, reclaims, and says when to look again,
/// and whether the lock had changed under the write (409).
pub async fn act(ctx: &Context, j: Judgement) -> Result<(Action, bool), Error> {
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
                let wait = remaining.saturating_add(PAST_THE_WAIT);
                return Ok((Action::requeue(wait.min(ctx.settings.resync)), false));
            }
            if let verdict::HeldBecause::RenewalWindow { remaining } = why {
                debug!(namespace = %j.key.namespace, lock = %j.key.name, remaining_seconds = remaining.as_secs_f64(),
                       "Lease holder died moments ago; releasing once nothing renewed it");
                let wait = remaining.saturating_add(PAST_THE_WAIT);
                return Ok((Action::requeue(wait.min(ctx.settings.resync)), false));
            }
            Ok((resync, false))
        }
        Verdict::Ambiguous { .. } | Verdict::AmbiguousHolders(_) | Verdict::Unmanageable(_) => {
            ctx.reclaimer.report_untouchable(&j).await;
            Ok((resync, false))
        }
        Verdict::Stale { .. } => match ctx.reclaimer.reclaim(&j).await? {
            reclaim::Outcome::Reclaimed | reclaim::Outcome::AlreadyGone => {
                ctx.forget(&j.key);
                Ok((Action::await_change(), false))
            }
            reclaim::Outcome::Changed => Ok((Action::requeue(REJUDGE_AFTER), true)),
            reclaim::Outcome::DryRun | reclaim::Outcome::Blocked => Ok((resync, false)),
            // A standby looks again soon: it writes once it leads.
            reclaim::Outcome::NotLeader => Ok((Action::requeue(STANDBY_RETRY), false)),
        },
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
    ctx.memory.suspect(&key);
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
    let scopes: Vec<Option<String>> = if ctx.settings.namespaces.is_empty() {
        vec![None]
    } else {
        ctx.settings.namespaces.iter().cloned().map(Some).collect()
    };
    let kinds = &ctx.settings.kinds;
    // Per scope, before anything is judged: each kind's lock watch, the
    // terminal-pod watch and the first sweep.
    ctx.shared
        .readiness
        .expect((kinds.len() + 2) * scopes.len());
    let mut runs: Vec<future::BoxFuture<'static, ()>> = Vec::new();
    for ns in scopes {
        // How many of the scope's watches have listed once.
        let (listed_tx, listed_rx) = tokio::sync::watch::channel(0u8);
        let listed_tx = Arc::new(listed_tx);
        let mut sides = pods::Sides::default();
        if kinds.contains(&LockKind::ConfigMap) {
            let (run, side) =
                scope::run_scope(ctx.clone(), ns.clone(), listed_tx.clone(), shutdown.clone());
            runs.push(Box::pin(run));
            sides.configmaps = Some(side);
        }
        if kinds.contains(&LockKind::Lease) {
            let (run, side) =
                leases::run_scope(ctx.clone(), ns.clone(), listed_tx.clone(), shutdown.clone());
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
    }
    future::join_all(runs).await;
}

mod leases;
mod pods;
mod scope;
mod wiring;
pub use scope::strip_cached;
use wiring::{drive, queue_unsettled, suspects, sweep_failed, sweep_ok, terminal_pods, Wiring};
#[cfg(test)]
mod tests;
