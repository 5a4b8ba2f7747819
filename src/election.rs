//! The lease gate: who may write. With `--leader-elect`, every replica keeps
//! its watches warm and judges, but only the holder of a
//! `coordination.k8s.io/v1` Lease writes (reclaims, Events, label
//! carry-over). The holder keeps a local deadline on the monotonic clock:
//! it stops writing `renew_deadline` after the start of its last successful
//! renewal, before any other replica can see the lease expire, whatever the
//! API server answers meanwhile. SIGTERM releases the lease as client-go
//! does (empty holder, `leaseDurationSeconds: 1`); so does a leader whose
//! watches have been failing for over a minute, so that a healthy standby
//! leads (not for a scope refused at start-up: every replica shares that
//! answer). A replica that is not ready (a scope refused, watches failing
//! or still listing) takes or creates a free lease only once it has been
//! free for a whole lease duration, so a ready replica leads first. Rule 6 makes this an
//! optimisation, not the safety net: two janitors writing at once still
//! cannot delete a lock whose holder may run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::readiness::Readiness;
use crate::{api_code, call, locked, Error};

/// Which Lease, held as whom, for how long.
#[derive(Clone, Debug)]
pub struct Election {
    pub lease: String,
    pub namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
}

impl Election {
    /// client-go's ratios: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn renew_deadline(&self) -> Duration {
        self.lease_duration.mul_f64(2.0 / 3.0)
    }
    pub fn retry_period(&self) -> Duration {
        self.lease_duration
            .mul_f64(2.0 / 15.0)
            .max(Duration::from_millis(200))
    }
}

#[derive(Debug, Default)]
struct State {
    /// Writes are allowed until then.
    deadline: Option<Instant>,
    /// The lease record last seen (holder, renewTime) and when it was first
    /// seen so: another holder's lease expires `lease_duration` after that,
    /// on this replica's own clock (as in client-go).
    observed: Option<(String, Option<Timestamp>, Instant)>,
    /// The last round took the lease from nobody (not a renewal of its own).
    took: bool,
}

/// Whether this replica may write now. Cheap to clone; checked at the
/// moment of each write.
#[derive(Clone, Debug, Default)]
pub struct Gate {
    /// None: no election, this replica always writes.
    state: Option<Arc<Mutex<State>>>,
    /// Says when this replica starts or stops leading.
    changes: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Gate {
    /// No election: the only janitor writes.
    pub fn always() -> Gate {
        Gate::default()
    }

    /// A gate that leads until the function returned is called: a lead
    /// lost at a moment a test chooses.
    #[cfg(test)]
    pub(crate) fn closable() -> (Gate, impl Fn() + Send + Sync + 'static) {
        let state = Arc::new(Mutex::new(State {
            deadline: Some(Instant::now() + Duration::from_secs(3600)),
            ..State::default()
        }));
        let gate = Gate {
            state: Some(state.clone()),
            changes: None,
        };
        (gate, move || locked(&state).deadline = None)
    }

    /// Leading changes (true: it leads now); none without an election.
    pub fn changes(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.changes.clone()
    }

    /// Whether the election last said this replica leads (its claim may
    /// have lapsed since, for a moment, while a renewal runs late).
    pub fn leads(&self) -> bool {
        self.changes.as_ref().is_none_or(|c| *c.borrow())
    }

    pub fn may_write(&self) -> bool {
        match &self.state {
            None => true,
            Some(s) => locked(s).deadline.is_some_and(|d| Instant::now() < d),
        }
    }
}

/// Runs the election until `shutdown`, then releases the lease if held.
/// Returns the gate at once; the task runs in the background.
///
/// A leader whose watches have been failing past the readiness threshold
/// (`readiness`: not ready for a minute) offers the lease to a ready
/// replica (releases it; not for a scope refused at start-up, which every
/// replica's ServiceAccount shares); a replica
/// that is not ready for any reason (its watches still listing included)
/// takes or creates only a lease nobody took for a lease duration. So a
/// ready standby leads if there is one, and otherwise the not-ready one
/// leads its healthy scopes (one broken namespace does not stop reclaims in
/// the others).
pub fn start(
    client: Client,
    election: Election,
    metrics: Metrics,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
) -> (Gate, tokio::task::JoinHandle<()>) {
    let state = Arc::new(Mutex::new(State::default()));
    let (changed, changes) = tokio::sync::watch::channel(false);
    let gate = Gate {
        state: Some(state.clone()),
        changes: Some(changes),
    };
    let elector = Elector {
        api: Api::namespaced(client, &election.namespace),
        election,
        state,
        gate: gate.clone(),
        metrics,
        readiness,
        changed,
        leading: false,
        offered: None,
    };
    (gate, tokio::spawn(elector.run(shutdown)))
}

/// The election's task and what it carries from one round to the next.
struct Elector {
    api: Api<Lease>,
    election: Election,
    state: Arc<Mutex<State>>,
    gate: Gate,
    metrics: Metrics,
    readiness: Arc<Readiness>,
    changed: tokio::sync::watch::Sender<bool>,
    leading: bool,
    /// While not ready: the failing watches when this replica last
    /// offered the lease (or took it back), and when.
    offered: Option<(Vec<String>, Instant)>,
}

impl Elector {
    /// A round a retry period (or less) apart until `shutdown`, then the
    /// release.
    async fn run(mut self, shutdown: CancellationToken) {
        let election = self.election.clone();
        loop {
            let started = Instant::now();
            // Offered only for failing watches: a scope refused at
            // start-up is the API server's answer to the ServiceAccount
            // every replica shares, so no other replica serves it
            // either, and offering the lease for it would only leave
            // gaps with no leader (a replica not ready for it still
            // waits its patience before it takes a free lease).
            let failing = self.readiness.failing_watches();
            let offering = self.offer_if_failing(&failing).await;
            // A replica that is not ready (a scope refused or failing,
            // or its watches still listing) takes or creates only a
            // lease that nobody took for a lease duration: a ready one
            // comes first, and when none can be ready this one still
            // leads the scopes it serves.
            let patience = if self.readiness.is_ready() {
                Duration::ZERO
            } else {
                election.lease_duration
            };
            let result = if offering {
                Ok(false)
            } else {
                self.round(patience).await
            };
            match result {
                Ok(true) => {
                    locked(&self.state).deadline = Some(started + election.renew_deadline())
                }
                Ok(false) => locked(&self.state).deadline = None,
                Err(e) => {
                    self.metrics.leader_renew_errors.inc();
                    warn!(lease = %election.lease, error = %e,
                          "could not renew or acquire the leader lease; writes stop at the renew deadline");
                }
            }
            self.say_change(&failing);
            let wait = self.wait(patience);
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            // A deadline that passed while sleeping ends the lead.
            if self.leading && !self.gate.may_write() {
                self.leading = false;
                self.metrics.leader.set(0);
                let _ = self.changed.send(false);
                warn!(lease = %election.lease, "leader lease not renewed within its deadline: stopped writing");
            }
        }
        self.release_at_stop().await;
    }

    /// A leader whose watches are failing offers the lease (releases it):
    /// a ready standby takes it at its next retry; if none does within a
    /// lease duration, this replica takes it back (a later round) and
    /// leads its healthy scopes. Returns whether it offered this round.
    async fn offer_if_failing(&mut self, failing: &[String]) -> bool {
        let election = &self.election;
        if failing.is_empty() {
            if self.offered.take().is_some() {
                info!(lease = %election.lease, "ready again: leading or standing by as usual");
            }
            return false;
        }
        if !(self.gate.may_write() && should_offer(failing, self.offered.as_ref())) {
            return false;
        }
        warn!(lease = %election.lease, failing = ?failing,
              "not ready (watches failing for over a minute): offering the leader lease to a ready replica; taken back if none takes it within a lease duration");
        locked(&self.state).deadline = None;
        match release(&self.api, election).await {
            Ok(()) => {
                self.offered = Some((failing.to_vec(), Instant::now()));
                info!(lease = %election.lease, "released the leader lease while not ready")
            }
            Err(e) => {
                self.metrics.leader_renew_errors.inc();
                warn!(lease = %election.lease, error = %e,
                      "could not release the leader lease while not ready; writes have stopped, and it is tried again");
            }
        }
        true
    }

    /// One try to acquire or renew. A round that takes longer than the
    /// renew deadline is a failed one: the gauge must not say 1 past the
    /// deadline.
    async fn round(&self, patience: Duration) -> Result<bool, Error> {
        let election = &self.election;
        let round = tokio::time::timeout(
            election.renew_deadline(),
            try_acquire_or_renew(&self.api, election, &self.state, patience),
        );
        match round.await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                action: "renewing the leader lease".into(),
                after: election.renew_deadline(),
            }),
        }
    }

    /// When leading starts or stops: the gauge, the gate's watchers and
    /// the log.
    fn say_change(&mut self, failing: &[String]) {
        let election = &self.election;
        let now_leading = self.gate.may_write();
        if now_leading == self.leading {
            return;
        }
        self.leading = now_leading;
        let leading = now_leading;
        self.metrics.leader.set(i64::from(leading));
        let _ = self.changed.send(leading);
        let took = std::mem::take(&mut locked(&self.state).took);
        if leading && took && !failing.is_empty() {
            // Taken back: nobody ready took it. Not offered
            // again until another watch fails, or REOFFER_EVERY.
            self.offered = Some((failing.to_vec(), Instant::now()));
            warn!(lease = %election.lease, identity = %election.identity, failing = ?failing,
                  "leading while not ready: no ready replica took the leader lease; reclaims go on in the scopes whose watches work");
        } else if leading {
            info!(lease = %election.lease, identity = %election.identity, "leading: this replica writes");
        } else {
            info!(lease = %election.lease, identity = %election.identity, "not leading: standing by (watches stay warm)");
        }
    }

    /// How long until the next round. A standby looks again right when
    /// the lease it saw expires, not up to a retry period later.
    fn wait(&self, patience: Duration) -> Duration {
        let election = &self.election;
        if self.leading {
            return election.retry_period();
        }
        let s = locked(&self.state);
        match &s.observed {
            Some((holder, _, seen)) if !holder.is_empty() => {
                // Not ready: it may take it only a lease
                // duration later (`patience`).
                let expires =
                    *seen + election.lease_duration + patience + Duration::from_millis(50);
                election
                    .retry_period()
                    .min(expires.saturating_duration_since(Instant::now()))
                    .max(Duration::from_millis(50))
            }
            _ => election.retry_period(),
        }
    }

    /// Whenever this replica may still be the holder (a release that
    /// failed while not ready, a deadline just missed): `release`
    /// writes only a Lease this identity holds, guarded by its
    /// resourceVersion.
    async fn release_at_stop(&self) {
        let election = &self.election;
        if self.leading || self.offered.is_some() || self.gate.may_write() {
            locked(&self.state).deadline = None;
            self.metrics.leader.set(0);
            match release(&self.api, election).await {
                Ok(()) => info!(lease = %election.lease, "released the leader lease"),
                Err(e) => {
                    self.metrics.leader_renew_errors.inc();
                    warn!(lease = %election.lease, error = %e, "could not release the leader lease; it expires by itself")
                }
            }
        }
    }
}

/// A leader that is not ready offers its lease again this often while
/// nothing else changes: a replica that became ready since may take it.
const REOFFER_EVERY: Duration = Duration::from_secs(300);

/// Whether a leader that is not ready, with these watches failing, offers
/// its lease now: not yet since it became not ready, another watch failing
/// since it last did, or REOFFER_EVERY since then.
fn should_offer(failing: &[String], offered: Option<&(Vec<String>, Instant)>) -> bool {
    match offered {
        None => true,
        Some((was, at)) => {
            failing.iter().any(|w| !was.contains(w)) || at.elapsed() >= REOFFER_EVERY
        }
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// One round of client-go's tryAcquireOrRenew. Ok(true): this replica holds
/// the lease now. Every write is guarded by the resourceVersion read. A
/// lease another identity held is taken only once it has been free (held by
/// nobody, or expired) for `patience` on this replica's clock.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    e: &Election,
    state: &Mutex<State>,
    patience: Duration,
) -> Result<bool, Error> {
    let secs = i32::try_from(e.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let Some(current) = call("reading the leader lease", api.get_opt(&e.lease)).await? else {
        // Missing: free since it was first seen missing.
        if free_since(state, String::new(), None).elapsed() < patience {
            return Ok(false);
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(e.lease.clone()),
                namespace: Some(e.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(e.identity.clone()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        let pp = PostParams::default();
        let created = call("creating the leader lease", api.create(&pp, &lease)).await;
        return won(created, state, true);
    };
    let spec = current.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    let duration = spec
        .lease_duration_seconds
        .map(|s| Duration::from_secs(s.max(0) as u64))
        .unwrap_or(e.lease_duration);
    let seen = free_since(state, holder.clone(), renewed);
    let mine = holder == e.identity;
    if !mine {
        // Free since it was first seen held by nobody, or since it expired.
        let free_for = if holder.is_empty() {
            Some(seen.elapsed())
        } else {
            seen.elapsed()
                .checked_sub(duration)
                .filter(|d| !d.is_zero())
        };
        if free_for.is_none_or(|f| f < patience) {
            return Ok(false);
        }
    }
    let transitions = spec.lease_transitions.unwrap_or(0);
    let mut next = current.clone();
    next.spec = Some(LeaseSpec {
        holder_identity: Some(e.identity.clone()),
        lease_duration_seconds: Some(secs),
        acquire_time: if mine {
            spec.acquire_time.clone()
        } else {
            Some(now_micro())
        },
        renew_time: Some(now_micro()),
        lease_transitions: Some(if mine { transitions } else { transitions + 1 }),
        ..spec
    });
    // replace carries metadata.resourceVersion: a concurrent change is a 409.
    let replaced = call(
        "renewing the leader lease",
        api.replace(&e.lease, &PostParams::default(), &next),
    )
    .await;
    won(replaced, state, !mine)
}

/// Records the lease record seen (`holder`, `renewed`; an empty holder and
/// no renewal for a missing Lease) and returns since when it has been
/// seen so, on this replica's clock.
fn free_since(state: &Mutex<State>, holder: String, renewed: Option<Timestamp>) -> Instant {
    let mut s = locked(state);
    let changed = !matches!(&s.observed, Some((h, r, _)) if *h == holder && *r == renewed);
    if changed {
        s.observed = Some((holder, renewed, Instant::now()));
    }
    s.observed
        .as_ref()
        .map_or_else(Instant::now, |(_, _, seen)| *seen)
}

/// Ok(true) when the write went through (`took`: the lease was not this
/// replica's before it), Ok(false) on a 409: another wrote first.
fn won(written: Result<Lease, Error>, state: &Mutex<State>, took: bool) -> Result<bool, Error> {
    match written {
        Ok(_) => {
            locked(state).took = took;
            Ok(true)
        }
        Err(Error::Kube { source, .. }) if api_code(&source) == Some(409) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Gives the lease up as client-go does on a clean stop.
async fn release(api: &Api<Lease>, e: &Election) -> Result<(), Error> {
    let Some(current) = call("reading the leader lease", api.get_opt(&e.lease)).await? else {
        return Ok(());
    };
    let spec = current.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(e.identity.as_str()) {
        return Ok(());
    }
    let next = crate::lock::lease::released(current, Timestamp::now());
    call(
        "releasing the leader lease",
        api.replace(&e.lease, &PostParams::default(), &next),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_follow_client_go() {
        let e = Election {
            lease: "lock-janitor".into(),
            namespace: "ops".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(15),
        };
        assert_eq!(e.renew_deadline(), Duration::from_secs(10));
        assert_eq!(e.retry_period(), Duration::from_secs(2));
        assert!(
            e.renew_deadline() < e.lease_duration,
            "stops writing before others may lead"
        );
    }

    #[test]
    fn a_gate_without_a_deadline_refuses() {
        assert!(Gate::always().may_write());
        let g = Gate {
            state: Some(Arc::new(Mutex::new(State::default()))),
            changes: None,
        };
        assert!(!g.may_write());
        if let Some(s) = &g.state {
            s.lock().unwrap().deadline = Some(Instant::now() + Duration::from_secs(10));
        }
        assert!(g.may_write());
        if let Some(s) = &g.state {
            s.lock().unwrap().deadline = Some(Instant::now() - Duration::from_millis(1));
        }
        assert!(
            !g.may_write(),
            "a passed deadline stops writes, whatever else"
        );
    }
}
