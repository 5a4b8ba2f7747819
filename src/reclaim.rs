//! Every write that frees a lock: the guarded DELETE of a stale lock, the
//! dead holder pod (`--delete-pod`), and the Events and metrics that report
//! them. Called only with a judgement made from live reads (see
//! `observe::Judgement`); takes what it
//! needs (client, Events, metrics, memory, mode) and nothing else.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, Client};
use tracing::{error, info, warn};

use crate::election::Gate;
use crate::events::{self, Events, Say};
use crate::lock::{Lock, LockKind};
use crate::memory::{Left, Memory};
use crate::metrics::Metrics;
use crate::observe::Judgement;
use crate::verdict::{self, StaleReason, Verdict};
use crate::{api_code, call, words, Error};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The lock was deleted (and the dead pod, if asked).
    Reclaimed,
    /// Someone else deleted it first (404).
    AlreadyGone,
    /// The lock changed since it was judged (409): judge it again.
    Changed,
    /// `--dry-run`: reported, not deleted.
    DryRun,
    /// The lock is being deleted, but finalizers keep it: reported, never
    /// counted as reclaimed. Its deletion arrives as a watch event.
    Blocked,
    /// This replica does not hold the leader lease: it wrote nothing.
    NotLeader,
}

/// What the freeing write found.
enum Freed {
    Done,
    /// Deleted, but these finalizers keep it.
    Kept(Vec<String>),
    /// Already gone (404).
    Gone,
    /// Changed since it was judged (409).
    Changed(String),
}

/// What a reclaim did: recorded and said from this one value.
enum Did {
    /// `--dry-run`: nothing written.
    DryRun,
    /// Being deleted, but these finalizers keep it.
    Blocked(Vec<String>),
    NotLeader,
    /// Someone else deleted it first (404).
    Gone,
    /// Changed since it was judged (409).
    Changed(String),
    /// Freed at this time.
    Reclaimed {
        at: Timestamp,
    },
}

impl Did {
    fn outcome(&self) -> Outcome {
        match self {
            Did::DryRun => Outcome::DryRun,
            Did::Blocked(_) => Outcome::Blocked,
            Did::NotLeader => Outcome::NotLeader,
            Did::Gone => Outcome::AlreadyGone,
            Did::Changed(_) => Outcome::Changed,
            Did::Reclaimed { .. } => Outcome::Reclaimed,
        }
    }
}

/// What the janitor may write.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mode {
    /// Write nothing but Events.
    pub dry_run: bool,
    /// Also delete the dead holder pod.
    pub delete_pod: bool,
}

/// The writer of reclaims.
#[derive(Clone)]
pub struct Reclaimer {
    client: Client,
    /// Ends the StaleLockReclaimed note (see `takeover::reclaim_marker`).
    marker: String,
    gate: Gate,
    events: Events,
    metrics: Metrics,
    memory: Arc<Memory>,
    mode: Mode,
    /// What follows a reclaim off its critical path (its Event, the dead
    /// pod's deletion), finished in the drain.
    after: tokio_util::task::TaskTracker,
    /// How many of those run at once (`AFTER_IN_FLIGHT`).
    after_slots: Arc<tokio::sync::Semaphore>,
    /// Judgements of a death in flight (`judging_a_death`): what follows a
    /// reclaim waits for none to be, `AFTER_WAITS_AT_MOST` at most.
    deaths: Deaths,
}

/// Judgements of a death in flight, counted.
#[derive(Clone)]
struct Deaths(Arc<tokio::sync::watch::Sender<usize>>);

impl Deaths {
    fn new() -> Self {
        Deaths(Arc::new(tokio::sync::watch::Sender::new(0)))
    }

    fn judging(&self) -> JudgingADeath {
        self.0.send_modify(|n| *n += 1);
        JudgingADeath(self.clone())
    }

    /// Until none is in flight, or `by`.
    async fn quiet(&self, by: tokio::time::Instant) {
        let mut deaths = self.0.subscribe();
        let _ = tokio::time::timeout_at(by, deaths.wait_for(|n| *n == 0)).await;
    }

    /// None counts any more (at shutdown); those still held count down to
    /// no less than zero.
    fn forget_all(&self) {
        self.0.send_replace(0);
    }
}

/// Held while a judgement made urgent by a death runs (see
/// `Reclaimer::judging_a_death`); dropped, on any path, it counts down.
pub struct JudgingADeath(Deaths);

impl Drop for JudgingADeath {
    fn drop(&mut self) {
        (self.0).0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// What follows reclaims (Events, dead pods' deletions) goes at most this
/// many requests at a time. In a mass eviction the API server then serves
/// the DELETEs first (16 in flight per scope, Lease releases 128): an Event is a write as
/// costly as a DELETE, and 1,000 of them sent alongside slowed the last
/// reclaims of a burst of 1,000; they follow within seconds.
const AFTER_IN_FLIGHT: usize = 2;

/// And they wait, at most this long after their reclaim, until no death is
/// being judged: a mass eviction's DELETEs then have the API server to
/// themselves until the last lock is free.
const AFTER_WAITS_AT_MOST: Duration = Duration::from_secs(5);

impl Reclaimer {
    pub fn new(
        client: Client,
        marker: String,
        gate: Gate,
        events: Events,
        metrics: Metrics,
        memory: Arc<Memory>,
        mode: Mode,
    ) -> Self {
        Reclaimer {
            client,
            marker,
            gate,
            events,
            metrics,
            memory,
            mode,
            after: tokio_util::task::TaskTracker::new(),
            after_slots: Arc::new(tokio::sync::Semaphore::new(AFTER_IN_FLIGHT)),
            deaths: Deaths::new(),
        }
    }

    /// A judgement made urgent by a death starts: while the value lives,
    /// what follows earlier reclaims (Events, pod deletions) waits.
    pub fn judging_a_death(&self) -> JudgingADeath {
        self.deaths.judging()
    }

    /// Waits for what follows the reclaims already made (their Events and
    /// pod deletions); at shutdown, once no reconcile runs.
    pub async fn finish(&self) {
        // A reconcile the drain gave up on still counts as judging a death:
        // what follows the last reclaims waits for it no more.
        self.deaths.forget_all();
        self.after.close();
        self.after.wait().await;
    }

    async fn publish(&self, j: &Judgement, say: Say) -> bool {
        let related = j.lock.as_ref().map(events::holder_ref);
        self.events
            .publish(&events::ref_of(j.key.kind, &j.meta), related, say)
            .await
    }

    /// Publishes at most once per resourceVersion of the lock and reason (a
    /// failed write is tried again at the next reconcile).
    async fn publish_once(&self, j: &Judgement, say: Say) {
        let rv = j.reported_version();
        let reason = say.reason;
        if self.memory.was_reported(&j.key, &rv, reason) {
            return;
        }
        if self.publish(j, say).await {
            self.memory.set_reported(&j.key, &rv, reason);
        }
    }

    /// Reports a lock the janitor will never touch (ambiguous or unmanageable).
    pub async fn report_untouchable(&self, j: &Judgement) {
        let reason = match &j.verdict {
            Verdict::Ambiguous { .. } | Verdict::AmbiguousHolders(_) => events::REASON_AMBIGUOUS,
            Verdict::Unmanageable(_) => events::REASON_UNMANAGEABLE,
            _ => return,
        };
        let holder = j
            .lock
            .as_ref()
            .map(|l| l.holder.name.as_str())
            .unwrap_or_default();
        let Some(note) = words::untouchable_note(&j.verdict, holder) else {
            return;
        };
        warn!(namespace = %j.key.namespace, lock = %j.key.name, reason, "{note}");
        let say = Say {
            type_: EventType::Warning,
            reason,
            action: "Skip",
            note,
        };
        self.publish_once(j, say).await;
    }

    /// Reclaims a stale lock, top to bottom: the guarded write (or why there
    /// is none), then what it did, recorded in one place (memory, metrics,
    /// the log line), then said (its Event; after a reclaim, off the
    /// critical path, with the dead pod's deletion if asked).
    pub async fn reclaim(&self, j: &Judgement) -> Result<Outcome, Error> {
        let (Verdict::Stale { reason, .. }, Some(lock)) = (&j.verdict, &j.lock) else {
            // Only stale locks come here; anything else is judged again, never deleted.
            return Ok(Outcome::Changed);
        };
        let did = self.write(j, lock).await;
        self.record(j, lock, *reason, &did);
        self.say(j, lock, *reason, &did).await;
        did.map(|d| d.outcome())
    }

    /// The write a stale lock gets: none in a dry run, for a lock already
    /// being deleted, or on a replica that does not lead (checked at the
    /// moment of the write: a lease lost a moment ago stops it); else the
    /// guarded DELETE or release.
    async fn write(&self, j: &Judgement, lock: &Lock) -> Result<Did, Error> {
        if self.mode.dry_run {
            return Ok(Did::DryRun);
        }
        if let Some(finalizers) = &lock.deleting {
            // Already being deleted: another DELETE changes nothing.
            return Ok(Did::Blocked(finalizers.clone()));
        }
        if !self.gate.may_write() {
            return Ok(Did::NotLeader);
        }
        Ok(match self.free(j, lock).await? {
            Freed::Done => Did::Reclaimed {
                at: Timestamp::now(),
            },
            Freed::Kept(finalizers) => Did::Blocked(finalizers),
            Freed::Gone => Did::Gone,
            Freed::Changed(source) => Did::Changed(source),
        })
    }

    /// What a reclaim did, in memory and metrics (one value: what it left)
    /// and in the log.
    fn record(&self, j: &Judgement, lock: &Lock, reason: StaleReason, did: &Result<Did, Error>) {
        let (ns, name, kind) = (lock.namespace.as_str(), lock.name.as_str(), j.key.kind);
        let left = match did {
            Ok(Did::DryRun | Did::Blocked(_)) | Err(_) => Left::Stale,
            Ok(Did::Gone) => Left::Gone,
            Ok(Did::Reclaimed { at }) => Left::Reclaimed {
                latency: self.latency(j, *at),
            },
            Ok(Did::NotLeader | Did::Changed(_)) => Left::Unchanged,
        };
        self.memory.record_reclaim(&j.key, reason, left);
        match did {
            Ok(Did::DryRun) => {
                info!(namespace = ns, lock = name, holder = %lock.holder.name, reason = %reason, dry_run = true,
                      "stale lock detected; not deleting (dry run)");
            }
            Ok(Did::Blocked(finalizers)) => {
                warn!(namespace = ns, lock = name, reason = %reason, finalizers = %finalizers.join(", "),
                      "stale lock is being deleted but finalizers keep it; a waiting replica cannot take over until they are removed");
            }
            Ok(Did::NotLeader) => {}
            Ok(Did::Gone) => {
                info!(namespace = ns, lock = name, kind = %kind, "lock already deleted by someone else");
            }
            Ok(Did::Changed(source)) => {
                info!(namespace = ns, lock = name, kind = %kind, error = %source,
                      "lock changed since it was judged; not reclaiming, judging again");
            }
            Ok(Did::Reclaimed { .. }) => {
                let latency = match left {
                    Left::Reclaimed { latency } => latency.map(|l| l.as_secs_f64()),
                    _ => None,
                };
                info!(namespace = ns, lock = name, kind = %kind, holder = %lock.holder.name, reason = %reason,
                      latency_seconds = latency, "stale lock reclaimed");
            }
            Err(e) => {
                error!(namespace = ns, lock = name, kind = %kind, reason = %reason, error = %e, "stale lock not reclaimed");
            }
        }
    }

    /// From the holder's death to the lock's reclaim, when the death's time
    /// is known.
    fn latency(&self, j: &Judgement, at: Timestamp) -> Option<Duration> {
        j.died_at
            .map(|d| Duration::try_from(at.duration_since(d)).unwrap_or(Duration::ZERO))
    }

    /// What a reclaim did, said as an Event: a dry run's and a blocked
    /// lock's once per version; a reclaim's after the write, off the
    /// critical path (the lock is free, the waiting replica may take it
    /// now), followed by the dead pod's deletion when asked.
    async fn say(&self, j: &Judgement, lock: &Lock, reason: StaleReason, did: &Result<Did, Error>) {
        let why = || words::why_stale(reason, &lock.holder.name, j.holder.as_ref());
        match did {
            Ok(Did::DryRun) => {
                let why = why();
                let note = match j.key.kind {
                    LockKind::ConfigMap => {
                        format!("Would delete this lock: {why} (dry run: nothing deleted).")
                    }
                    LockKind::Lease => {
                        format!("Would release this Lease: {why} (dry run: nothing written).")
                    }
                };
                let say = Say {
                    type_: EventType::Warning,
                    reason: events::REASON_DETECTED,
                    action: "DryRun",
                    note,
                };
                self.publish_once(j, say).await;
            }
            Ok(Did::Blocked(finalizers)) => {
                let say = Say {
                    type_: EventType::Warning,
                    reason: events::REASON_BLOCKED,
                    action: "Reclaim",
                    note: format!(
                        "This lock is stale ({}) and its deletion has started, but finalizers [{}] keep it: \
                         a waiting replica cannot take over until whoever owns them removes them.",
                        reason,
                        finalizers.join(", ")
                    ),
                };
                self.publish_once(j, say).await;
            }
            Ok(Did::Reclaimed { .. }) => {
                let done = match j.key.kind {
                    LockKind::ConfigMap => "Deleted this lock",
                    LockKind::Lease => "Released this Lease",
                };
                let say = Say {
                    type_: EventType::Normal,
                    reason: events::REASON_RECLAIMED,
                    action: "Reclaim",
                    note: format!(
                        "{done}: {}. A waiting replica can now take over. {}",
                        why(),
                        self.marker
                    ),
                };
                let (this, j) = (self.clone(), j.clone());
                let quiet_by = tokio::time::Instant::now() + AFTER_WAITS_AT_MOST;
                self.after.spawn(async move {
                    // Never closed: a slot always comes.
                    let _slot = this.after_slots.acquire().await;
                    this.deaths.quiet(quiet_by).await;
                    this.publish(&j, say).await;
                    if this.mode.delete_pod {
                        this.delete_dead_pod(&j, reason).await;
                    }
                });
            }
            Ok(Did::NotLeader | Did::Gone | Did::Changed(_)) | Err(_) => {}
        }
    }

    /// The one write that frees a stale lock, guarded by exactly what was
    /// judged: a ConfigMap is deleted with uid and resourceVersion
    /// preconditions; a Lease is released (never deleted) by an update of
    /// the very object read, which carries its resourceVersion.
    async fn free(&self, j: &Judgement, lock: &Lock) -> Result<Freed, Error> {
        let (ns, name) = (lock.namespace.as_str(), lock.name.as_str());
        let answered = match j.key.kind {
            LockKind::ConfigMap => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(lock.uid.clone()),
                        resource_version: Some(lock.resource_version.clone()),
                    }),
                    ..Default::default()
                };
                let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
                call(format!("deleting lock {ns}/{name}"), cms.delete(name, &dp))
                    .await
                    // The API server answers with the object, not a Status,
                    // when the delete only set deletionTimestamp: finalizers
                    // keep it.
                    .map(|answer| {
                        answer.left().and_then(|cm| {
                            cm.metadata.deletion_timestamp.as_ref()?;
                            cm.metadata.finalizers.filter(|f| !f.is_empty())
                        })
                    })
            }
            LockKind::Lease => {
                // Never a copy the watch dropped annotations from: the
                // replace would erase them.
                let Some(judged) = j.lease.clone().filter(crate::lock::lease::is_whole) else {
                    return Ok(Freed::Changed(
                        "the Lease as judged is not at hand whole".into(),
                    ));
                };
                // The judged object keeps its resourceVersion: the update
                // fails with 409 if the Lease changed since it was read.
                let released = crate::lock::lease::released(judged, Timestamp::now());
                let leases: Api<Lease> = Api::namespaced(self.client.clone(), ns);
                call(
                    format!("releasing lease {ns}/{name}"),
                    leases.replace(name, &PostParams::default(), &released),
                )
                .await
                .map(|_| None)
            }
        };
        match answered {
            Ok(None) => Ok(Freed::Done),
            Ok(Some(finalizers)) => Ok(Freed::Kept(finalizers)),
            Err(Error::Kube { source, .. }) if api_code(&source) == Some(404) => Ok(Freed::Gone),
            Err(Error::Kube { source, .. }) if api_code(&source) == Some(409) => {
                Ok(Freed::Changed(source.to_string()))
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes the dead holder (`--delete-pod`): only a terminal pod, only
    /// the very pod judged (uid precondition). Failures are logged, never
    /// retried blindly: the lock is already free.
    async fn delete_dead_pod(&self, j: &Judgement, reason: StaleReason) {
        // Terminal, and not already being deleted (a rollout deletes it anyway).
        let Some(pod) = j
            .holder
            .as_ref()
            .filter(|p| verdict::is_terminal(p) && p.metadata.deletion_timestamp.is_none())
        else {
            return;
        };
        if j.matched_by_hostname_only() {
            // A Lease names a host; only a pod of exactly that name is
            // surely the one that held it (a hostname may be another
            // app's pod, or a whole node's).
            info!(namespace = %j.key.namespace, lock = %j.key.name, pod = ?pod.metadata.name,
                  "dead holder pod matched the Lease by hostname only; not deleting it");
            return;
        }
        let (Some(ns), Some(name), Some(uid)) = (
            pod.metadata.namespace.as_deref(),
            pod.metadata.name.as_deref(),
            pod.metadata.uid.as_deref(),
        ) else {
            return;
        };
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..Default::default()
        };
        if !self.gate.may_write() {
            return;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        match call(format!("deleting pod {ns}/{name}"), pods.delete(name, &dp)).await {
            Ok(_) => {
                self.metrics
                    .pod_deletions
                    .with_label_values(&[ns, reason.as_str()])
                    .inc();
                info!(namespace = ns, pod = name, reason = %reason, "dead holder pod deleted");
                let say = Say {
                    type_: EventType::Normal,
                    reason: events::REASON_POD_DELETED,
                    action: "DeletePod",
                    note: format!("Deleted the dead holder pod {name} ({reason})."),
                };
                self.publish(j, say).await;
            }
            Err(Error::Kube { source, .. }) if matches!(api_code(&source), Some(404 | 409)) => {
                info!(
                    namespace = ns,
                    pod = name,
                    "dead holder pod already gone or replaced; left alone"
                );
            }
            Err(e) => {
                self.metrics
                    .reconcile_errors
                    .with_label_values(&[e.kind().as_str()])
                    .inc();
                warn!(namespace = ns, pod = name, error = %e, "could not delete the dead holder pod; the lock is reclaimed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::{Duration, Instant};

    /// What follows a reclaim waits while a death is judged, until the last
    /// judgement ends or its deadline passes, whichever comes first.
    #[tokio::test(start_paused = true)]
    async fn what_follows_a_reclaim_waits_for_deaths_judged_at_most_its_deadline() {
        let deaths = Deaths::new();
        let far = Instant::now() + Duration::from_secs(60);
        let t = Instant::now();
        deaths.quiet(far).await;
        assert_eq!(t.elapsed(), Duration::ZERO, "none judged: no wait");

        let (one, two) = (deaths.judging(), deaths.judging());
        let ends = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(one);
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(two);
        });
        let t = Instant::now();
        deaths.quiet(far).await;
        assert_eq!(
            t.elapsed(),
            Duration::from_secs(2),
            "until the last one ends"
        );
        ends.await.unwrap();

        let stuck = deaths.judging();
        let t = Instant::now();
        deaths.quiet(Instant::now() + AFTER_WAITS_AT_MOST).await;
        assert_eq!(t.elapsed(), AFTER_WAITS_AT_MOST, "never past its deadline");

        // At shutdown none counts; a judgement dropped afterwards does not
        // go below zero, and a new one counts again.
        deaths.forget_all();
        let t = Instant::now();
        deaths.quiet(far).await;
        assert_eq!(t.elapsed(), Duration::ZERO);
        drop(stuck);
        let again = deaths.judging();
        assert_eq!(*deaths.0.borrow(), 1);
        drop(again);
        assert_eq!(*deaths.0.borrow(), 0);
    }
}
