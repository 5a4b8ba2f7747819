//! Every write that frees a lock: the guarded DELETE of a stale lock (or
//! the release of a stale Lease), the dead holder pod (`--delete-pod`), and
//! the Events and metrics that report them. Called only with a judgement
//! made from live reads (see `observe::Judgement`); takes what it needs
//! (client, Events, metrics, mode) and nothing else.
//!
//! The requests of one reclaim, in order (after the judgement's live reads
//! of the lock and its holder; none in a dry run, on a replica that does
//! not lead, or for a lock already being deleted):
//!
//! 1. the intent Event, `StaleLockReclaiming` (events.k8s.io; one try,
//!    `INTENT_WITHIN`); refused or cut short, the reclaim goes on;
//! 2. a GET of the holder pod by name (`holder_again`): still the judged
//!    uid and still dead, or still absent for `OwnerGone`, else nothing is
//!    written (`Freed::Changed`, judged again); an error, nothing written;
//! 3. the freeing write: a DELETE of the ConfigMap or the Lease held for
//!    life with uid and resourceVersion preconditions, or a PUT of the
//!    Lease read, released (its resourceVersion guards it). 404 is
//!    `Freed::Gone`, 409 `Freed::Changed`;
//! 4. once freed, `StaleLockReclaimed` (up to three tries), then, with
//!    `--delete-pod`, a DELETE of the dead pod with a uid precondition and
//!    `DeadHolderDeleted`. The controller's turn has ended before these
//!    (`reclaim_with`): they are what the reclaim says, not its judgement;
//!    they wait while other judgements are in line or under way (1 s at
//!    most, `first`) and go `REPORTS_AT_ONCE` at a time.
//!
//! The holder's GET is the last request before the freeing write: no
//! precondition sees a pod made again under the holder's name.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, Client};
use tracing::{error, info, warn};

use crate::election::Gate;
use crate::events::{self, Events, Say};
use crate::kinds::{Answer, Target};
use crate::lock::Lock;
use crate::metrics::Metrics;
use crate::observe::Judgement;
use crate::verdict::{self, StaleReason, Verdict};
use crate::{api_code, call, words, Error};

/// How long a reclaim waits for its intent Event before the freeing write
/// (it takes a few ms). The holder is read again after it, right before
/// the write.
const INTENT_WITHIN: Duration = Duration::from_millis(500);

/// What judgements say once their writes are answered, or when they make
/// none (`StaleLockReclaimed`, `--delete-pod`'s deletion and its Event, a
/// dry run's or a blocked lock's Event, the report of a lock never
/// touched), at most this many at once in all, once no judgement is in
/// line or under way (`first`). The judgements' turns end before it
/// (`controller::Turn`), so a slow Events API during a mass eviction
/// holds at most this many requests and connections for reports; the
/// rest wait, each holding its judgement (the lock and holder as read).
pub const REPORTS_AT_ONCE: usize = 64;

pub use crate::decide::{Done, Freed};
pub use first::{InLine, Judging};

mod first;

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
    mode: Mode,
    /// Places for what is said after a write (`REPORTS_AT_ONCE`).
    reports: std::sync::Arc<tokio::sync::Semaphore>,
    /// The judgements a report yields to (`first`).
    judging: Judging,
}

impl Reclaimer {
    pub fn new(
        client: Client,
        marker: String,
        gate: Gate,
        events: Events,
        metrics: Metrics,
        mode: Mode,
    ) -> Self {
        Reclaimer {
            client,
            marker,
            gate,
            events,
            metrics,
            mode,
            reports: std::sync::Arc::new(tokio::sync::Semaphore::new(REPORTS_AT_ONCE)),
            judging: Judging::default(),
        }
    }

    /// The count of judgements in line or under way, which the turns keep
    /// (`controller::Turn`) and reports yield to.
    pub fn judging(&self) -> Judging {
        self.judging.clone()
    }

    /// Takes every report place (a test's Events API that is slow).
    #[cfg(test)]
    pub(crate) fn hold_reports(&self) -> tokio::sync::OwnedSemaphorePermit {
        let all = u32::try_from(REPORTS_AT_ONCE).unwrap();
        self.reports.clone().try_acquire_many_owned(all).unwrap()
    }

    /// One of the `REPORTS_AT_ONCE` places, held while something is said
    /// after a write (or for a lock never touched), taken once no
    /// judgement is in line or under way (`first::YIELD_AT_MOST` at most).
    async fn report_place(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.judging.quiet(first::YIELD_AT_MOST).await;
        // Never closed (were it, the report would go without a place).
        self.reports.acquire().await.ok()
    }

    async fn publish(&self, j: &Judgement, say: Say) -> bool {
        let related = j.lock.as_ref().map(events::holder_ref);
        self.events
            .publish(&events::ref_of(j.key.kind, &j.meta), related, say)
            .await
    }

    /// Records a write this replica made, leading or not (`Events::record`).
    async fn record_event(&self, j: &Judgement, say: Say) -> bool {
        let related = j.lock.as_ref().map(events::holder_ref);
        self.events
            .record(&events::ref_of(j.key.kind, &j.meta), related, say)
            .await
    }

    /// Reports a lock the janitor will never touch (ambiguous or
    /// unmanageable); whether the Event was written. Its Event waits for
    /// one of `REPORTS_AT_ONCE` places.
    pub async fn report_untouchable(&self, j: &Judgement) -> bool {
        let reason = match &j.verdict {
            Verdict::Ambiguous { .. } | Verdict::AmbiguousHolders(_) => events::REASON_AMBIGUOUS,
            Verdict::Unmanageable(_) => events::REASON_UNMANAGEABLE,
            _ => return false,
        };
        let holder = j
            .lock
            .as_ref()
            .map(|l| l.holder.name.as_str())
            .unwrap_or_default();
        let Some(note) = words::untouchable_note(&j.verdict, holder) else {
            return false;
        };
        warn!(namespace = %j.key.namespace, lock = %j.key.name, reason, "{note}");
        if !self.gate.may_write() {
            // A standby says nothing; the leader reports.
            return false;
        }
        let _place = self.report_place().await;
        let say = Say {
            type_: EventType::Warning,
            reason,
            action: "Skip",
            note,
        };
        self.publish(j, say).await
    }

    /// Reclaims a stale lock, top to bottom: the guarded write (or why there
    /// is none), then what it did, said (its Event, then the dead pod's
    /// deletion if asked) and recorded (metrics, the log line). A dry run's
    /// and a blocked lock's Event is written once per version:
    /// `reported(reason)` says whether it was. The error of a failed write
    /// comes back beside `Freed::Failed`.
    /// (The controller's reconcile calls `reclaim_with`; tests call this.)
    pub async fn reclaim(
        &self,
        j: &Judgement,
        reported: impl Fn(&str) -> bool,
    ) -> (Done, Option<Error>) {
        self.reclaim_with(j, reported, || {}).await
    }

    /// `reclaim`, calling `after_write` once the write is answered (or it
    /// is known that none is made; for a lock not judged stale, never),
    /// before what the reclaim says after it (a `StaleLockReclaimStopped`
    /// is said before). What is said after waits for one of
    /// `REPORTS_AT_ONCE` places; a reclaim that says nothing more (a lock
    /// gone, changed, a write failed, a lead lost, a dry run already
    /// reported) takes none.
    pub async fn reclaim_with(
        &self,
        j: &Judgement,
        reported: impl Fn(&str) -> bool,
        after_write: impl FnOnce(),
    ) -> (Done, Option<Error>) {
        let (Verdict::Stale { reason, .. }, Some(lock)) = (&j.verdict, &j.lock) else {
            // Only stale locks come here; anything else is judged again, never deleted.
            let done = Done {
                freed: Some(Freed::Changed("not judged stale".into())),
                said: None,
            };
            return (done, None);
        };
        let (freed, error) = match self.write(j, lock, *reason).await {
            Ok(f) => (f, None),
            Err(e) => (Freed::Failed, Some(e)),
        };
        after_write();
        // Said first: a reclaim counts as done once its Event is written.
        let said = self.say(j, lock, *reason, &freed, reported).await;
        self.record(j, lock, *reason, &freed, error.as_ref());
        let done = Done {
            freed: Some(freed),
            said,
        };
        (done, error)
    }

    /// The write a stale lock gets: none in a dry run, for a lock already
    /// being deleted, or on a replica that does not lead (checked at the
    /// moment of the write: a lease lost a moment ago stops it); none if
    /// the holder, read again after the intent Event, is no longer as
    /// judged; else the guarded DELETE or release.
    async fn write(&self, j: &Judgement, lock: &Lock, reason: StaleReason) -> Result<Freed, Error> {
        if self.mode.dry_run {
            return Ok(Freed::DryRun);
        }
        if let Some(finalizers) = &lock.deleting {
            // Already being deleted: another DELETE changes nothing.
            return Ok(Freed::Blocked(finalizers.clone()));
        }
        if !self.gate.may_write() {
            return Ok(Freed::NotLeader);
        }
        self.intent(j, lock, reason).await;
        let again = match self.holder_again(lock, reason).await {
            Ok(again) => again,
            Err(e) => {
                self.stopped(j, &format!("the holder could not be read again ({e})"))
                    .await;
                return Err(e);
            }
        };
        if let Some(changed) = again {
            warn!(namespace = %j.key.namespace, lock = %j.key.name, kind = %j.key.kind,
                  holder = %lock.holder.name, reason = %reason, changed = %changed,
                  "the holder changed between the judgement and the write; nothing written, judging again");
            self.stopped(j, &changed).await;
            return Ok(Freed::Changed(changed));
        }
        // Checked again at the moment of the write.
        if !self.gate.may_write() {
            return Ok(Freed::NotLeader);
        }
        let freed = self.free(j, lock).await;
        if let Ok(Freed::Changed(source)) = &freed {
            self.stopped(
                j,
                &format!("the lock changed since it was judged ({source})"),
            )
            .await;
        }
        freed
    }

    /// Says on the lock that the reclaim its `StaleLockReclaiming` Event
    /// announced wrote nothing (`what` changed): the lock is judged again.
    async fn stopped(&self, j: &Judgement, what: &str) {
        let say = Say {
            type_: EventType::Normal,
            reason: events::REASON_STOPPED,
            action: "Reclaim",
            note: format!("Nothing written: {what}. Judging the lock again."),
        };
        self.publish(j, say).await;
    }

    /// The holder read live once more, the last request before the freeing
    /// write (the judgement's read came before the intent Event, which may
    /// take up to `INTENT_WITHIN`, more when the API server queues it): a
    /// pod made again under the holder's name in that time (a StatefulSet's,
    /// which believes it still leads) stops the write. What was judged must
    /// still hold: for `OwnerGone` no pod of that name; for a death, the pod
    /// of the judged uid, still dead (terminal, no container running). Else
    /// what changed; an error of the read is the reconcile's (nothing
    /// written).
    async fn holder_again(
        &self,
        lock: &Lock,
        reason: StaleReason,
    ) -> Result<Option<String>, Error> {
        let (ns, name) = (lock.namespace.as_str(), lock.holder.name.as_str());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let pod = call(
            format!("reading holder pod {ns}/{name} again before the write"),
            pods.get_opt(name),
        )
        .await?;
        Ok(holder_changed(lock, reason, pod.as_ref()))
    }

    /// The record restore reads, written no later than the freeing write:
    /// a `StaleLockReclaiming` Event just before it (one try, 500 ms at most), so
    /// that a janitor killed between the write and its `StaleLockReclaimed`
    /// Event leaves a record all the same. Restore checks it against the
    /// lock as it is then (a lock still held by the same pod was not freed:
    /// nothing is done). Not written, the reclaim goes on (a lock is never
    /// kept stale for want of an Event), and it says so: a WARN and
    /// `lock_janitor_reconcile_errors_total{error="event"}`, whether the
    /// Events API refused it or it was cut short.
    async fn intent(&self, j: &Judgement, lock: &Lock, reason: StaleReason) {
        let doing = j.kind().words().doing;
        let why = words::why_stale(reason, &lock.holder.name, j.holder.as_ref());
        let say = Say {
            type_: EventType::Normal,
            reason: events::REASON_RECLAIMING,
            action: "Reclaim",
            note: events::marked_note(&format!("{doing}: {why}."), &self.marker),
        };
        let publish = tokio::time::timeout(INTENT_WITHIN, self.publish(j, say));
        let (written, cause) = match publish.await {
            // Refused (the Events WARN above says why), or the lead lost.
            Ok(written) => (written, "not written"),
            Err(_) => {
                // Cut short, the write counted nothing: count it here as a
                // failed Event, as a refused one is counted.
                self.metrics
                    .reconcile_errors
                    .with_label_values(&[crate::ErrorKind::Event.as_str()])
                    .inc();
                (false, "not answered in time; it may be written yet")
            }
        };
        // Not leading any more, nothing was tried and nothing follows (the
        // gate is checked again before the write).
        if !written && self.gate.may_write() {
            warn!(namespace = %j.key.namespace, lock = %j.key.name, cause, within = ?INTENT_WITHIN,
                  "the reclaim's intent Event could not be written: a crash before its StaleLockReclaimed Event would leave nothing for restore to follow");
        }
    }

    /// What a reclaim did, in metrics and in the log.
    fn record(
        &self,
        j: &Judgement,
        lock: &Lock,
        reason: StaleReason,
        freed: &Freed,
        error: Option<&Error>,
    ) {
        let (ns, name, kind) = (lock.namespace.as_str(), lock.name.as_str(), j.key.kind);
        match freed {
            Freed::DryRun => {
                info!(namespace = ns, lock = name, holder = %lock.holder.name, reason = %reason, dry_run = true,
                      "stale lock detected; not deleting (dry run)");
            }
            Freed::Blocked(finalizers) => {
                warn!(namespace = ns, lock = name, reason = %reason, finalizers = %finalizers.join(", "),
                      "stale lock is being deleted but finalizers keep it; a waiting replica cannot take over until they are removed");
            }
            Freed::NotLeader => {}
            Freed::Gone => {
                info!(namespace = ns, lock = name, kind = %kind, "lock already deleted by someone else");
            }
            Freed::Changed(source) => {
                info!(namespace = ns, lock = name, kind = %kind, error = %source,
                      "lock changed since it was judged; not reclaiming, judging again");
            }
            Freed::Reclaimed { at } => {
                self.metrics.reclaimed(&j.key, reason);
                let latency = j
                    .died_at
                    .map(|d| Duration::try_from(at.duration_since(d)).unwrap_or(Duration::ZERO));
                if let Some(l) = latency {
                    self.metrics.reclaim_latency.observe(l.as_secs_f64());
                }
                info!(namespace = ns, lock = name, kind = %kind, holder = %lock.holder.name, reason = %reason,
                      latency_seconds = latency.map(|l| l.as_secs_f64()), "stale lock reclaimed");
            }
            Freed::Failed => {
                let e = error.map(ToString::to_string).unwrap_or_default();
                error!(namespace = ns, lock = name, kind = %kind, reason = %reason, error = %e, "stale lock not reclaimed");
            }
        }
    }

    /// What a reclaim did, said as an Event: a dry run's and a blocked
    /// lock's once per version (the reason returned when written now); a
    /// reclaim's after the write (`report_place`), before it is counted,
    /// followed by the dead pod's deletion when asked.
    async fn say(
        &self,
        j: &Judgement,
        lock: &Lock,
        reason: StaleReason,
        freed: &Freed,
        reported: impl Fn(&str) -> bool,
    ) -> Option<&'static str> {
        let why = || words::why_stale(reason, &lock.holder.name, j.holder.as_ref());
        let once = match freed {
            Freed::DryRun => {
                let why = why();
                let w = j.kind().words();
                let note = format!("{}: {why} (dry run: {}).", w.would, w.untouched);
                Say {
                    type_: EventType::Warning,
                    reason: events::REASON_DETECTED,
                    action: "DryRun",
                    note,
                }
            }
            Freed::Blocked(finalizers) => Say {
                type_: EventType::Warning,
                reason: events::REASON_BLOCKED,
                action: "Reclaim",
                note: format!(
                    "This lock is stale ({}) and its deletion has started, but finalizers [{}] keep it: \
                     a waiting replica cannot take over until whoever owns them removes them.",
                    reason,
                    finalizers.join(", ")
                ),
            },
            Freed::Reclaimed { .. } => {
                let done = j.kind().words().done;
                let say = Say {
                    type_: EventType::Normal,
                    reason: events::REASON_RECLAIMED,
                    action: "Reclaim",
                    note: events::marked_note(
                        &format!("{done}: {}. A waiting replica can now take over.", why()),
                        &self.marker,
                    ),
                };
                let _place = self.report_place().await;
                // Written before the reclaim counts as done, leading or
                // not: after a crash, `takeover::restore` finds the
                // takeovers to await from these Events alone.
                if !self.record_event(j, say).await {
                    warn!(namespace = %j.key.namespace, lock = %j.key.name,
                          "the reclaim's Event could not be written: a restart before its takeover would not await it");
                }
                if self.mode.delete_pod {
                    self.delete_dead_pod(j, reason).await;
                }
                return None;
            }
            Freed::NotLeader | Freed::Gone | Freed::Changed(_) | Freed::Failed => return None,
        };
        let reason = once.reason;
        if reported(reason) || !self.gate.may_write() {
            // Said already, or a standby, which says nothing.
            return None;
        }
        let _place = self.report_place().await;
        self.publish(j, once).await.then_some(reason)
    }

    /// The one write that frees a stale lock, the lock's kind's
    /// (`Kind::free`), guarded by exactly what was judged.
    async fn free(&self, j: &Judgement, lock: &Lock) -> Result<Freed, Error> {
        let target = Target {
            meta: &j.meta,
            uid: &lock.uid,
            resource_version: &lock.resource_version,
            lease: j.lease.as_ref(),
            now: Timestamp::now(),
        };
        match j.kind().free(&self.client, target).await {
            Ok(Answer::Freed) => Ok(Freed::Reclaimed {
                at: Timestamp::now(),
            }),
            Ok(Answer::Kept(finalizers)) => Ok(Freed::Blocked(finalizers)),
            Ok(Answer::NotWritten(why)) => Ok(Freed::Changed(why)),
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
                self.record_event(j, say).await;
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

/// What changed of a stale lock's holder since it was judged (`pod`: the
/// holder's name read again), or None if it is still as judged: absent for
/// `OwnerGone`, else the pod of the judged uid, still dead. A pod that is
/// gone after it was judged dead counts as changed too: what is judged
/// next (its owner-gone grace, or a Lease left to expire) decides.
fn holder_changed(lock: &Lock, reason: StaleReason, pod: Option<&Pod>) -> Option<String> {
    let name = &lock.holder.name;
    match (reason, pod) {
        (StaleReason::OwnerGone, None) => None,
        (StaleReason::OwnerGone, Some(p)) => Some(format!(
            "a pod named {name} exists again (uid {})",
            p.metadata.uid.as_deref().unwrap_or_default()
        )),
        (_, None) => Some(format!("holder pod {name} is gone")),
        (_, Some(p)) if p.metadata.uid.as_deref() != Some(lock.holder.uid.as_str()) => {
            Some(format!(
                "pod {name} is another pod now (uid {}, judged {})",
                p.metadata.uid.as_deref().unwrap_or_default(),
                lock.holder.uid
            ))
        }
        (_, Some(p)) => match verdict::judge_holder_pod(p) {
            Verdict::Stale { .. } => None,
            v => Some(format!(
                "holder pod {name} is no longer dead ({})",
                words::verdict_code(&v)
            )),
        },
    }
}

#[cfg(test)]
mod tests;
