//! Kubernetes Events: the reason strings of docs/design.md and the one way the
//! janitor writes an Event (events.k8s.io, bounded note, never blocking).

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tracing::warn;

use crate::election::Gate;
use crate::lock::{Lock, LockKind};
use crate::metrics::Metrics;
use crate::ErrorKind;

pub const REASON_RECLAIMED: &str = "StaleLockReclaimed";
/// Written just before the freeing write: what restore reads if the janitor
/// dies between that write and its StaleLockReclaimed Event.
pub const REASON_RECLAIMING: &str = "StaleLockReclaiming";
pub const REASON_DETECTED: &str = "StaleLockDetected";
pub const REASON_POD_DELETED: &str = "DeadHolderDeleted";
pub const REASON_UNMANAGEABLE: &str = "UnmanageableLock";
pub const REASON_AMBIGUOUS: &str = "AmbiguousLock";
/// A new holder created a lock again after it was deleted.
pub const REASON_TAKEN_OVER: &str = "LockTakenOver";
/// Nobody created a deleted lock again within --takeover-timeout.
pub const REASON_NO_TAKEOVER: &str = "NoTakeover";
/// `run --auto-opt-in` labeled a lock candidate with the opt-in label.
pub const REASON_OPTED_IN: &str = "LockOptedIn";
/// A stale lock is being deleted but finalizers keep it (it still blocks).
pub const REASON_BLOCKED: &str = "LockDeletionBlocked";
/// After `StaleLockReclaiming`, nothing was written: the holder, read again
/// as the last request, or the lock (a 409) changed since the judgement.
pub const REASON_STOPPED: &str = "StaleLockReclaimStopped";

/// events.k8s.io refuses a note over 1 KiB.
const MAX_NOTE: usize = 1024;
/// How often the Event of a write made is tried (1 s, then 2 s apart).
const RECORD_ATTEMPTS: u32 = 3;
/// All the attempts of one such Event together.
const RECORD_WITHIN: Duration = Duration::from_secs(10);

fn truncate(note: String) -> String {
    cut(note, MAX_NOTE)
}

/// `s` in at most `max` bytes: cut on a character boundary and ended with
/// '…' when it is longer.
pub fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub('…'.len_utf8());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// A reclaim's note: `body`, then `marker` last, whatever the length of
/// `body` (a pod's `status.reason` is bounded by nothing). The body is cut
/// first, so that the whole note fits the 1 KiB events.k8s.io takes and the
/// marker that restore looks for at the note's end (`takeover::restore`)
/// is never what the cut takes.
pub fn marked_note(body: &str, marker: &str) -> String {
    let room = MAX_NOTE.saturating_sub(marker.len() + 1);
    let mut note = cut(body.to_owned(), room);
    note.push(' ');
    note.push_str(marker);
    note
}

/// A reference to a lock of `kind` as read (its exact version).
pub fn ref_of(kind: LockKind, meta: &ObjectMeta) -> ObjectReference {
    let api_version = match kind {
        LockKind::ConfigMap => "v1",
        LockKind::Lease => "coordination.k8s.io/v1",
    };
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.kind().into()),
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..Default::default()
    }
}

/// A reference to the pod a lock names.
pub fn holder_ref(lock: &Lock) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(lock.namespace.clone()),
        name: Some(lock.holder.name.clone()),
        uid: Some(lock.holder.uid.clone()),
        ..Default::default()
    }
}

/// One thing to say about an object.
pub struct Say {
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// Writes Events as `lock-janitor` (instance: the pod name).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    metrics: Metrics,
    gate: Gate,
}

impl Events {
    pub fn new(client: Client, metrics: Metrics, gate: Gate) -> Self {
        let reporter = Reporter {
            controller: crate::NAME.into(),
            instance: std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()),
        };
        Events {
            recorder: Recorder::new(client, reporter),
            metrics,
            gate,
        }
    }

    /// Publishes an Event on `regarding`, if this replica leads. A failed
    /// Event never undoes or blocks what it reports; it is logged and
    /// counted. True if written.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        say: Say,
    ) -> bool {
        if !self.gate.may_write() {
            // A standby says nothing; the leader reports.
            return false;
        }
        self.write(regarding, related, &say).await
    }

    /// Records a write this replica made (a reclaim, a dead pod deleted),
    /// whether it still leads or not: the lead may be lost during the
    /// write, and `takeover::restore` finds what to await from these
    /// Events alone. Tried `RECORD_ATTEMPTS` times within `RECORD_WITHIN`;
    /// true if written.
    pub async fn record(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        say: Say,
    ) -> bool {
        let tries = async {
            for attempt in 1..=RECORD_ATTEMPTS {
                if self.write(regarding, related.clone(), &say).await {
                    return true;
                }
                if attempt < RECORD_ATTEMPTS {
                    tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await;
                }
            }
            false
        };
        // Bounded as a whole: a slow Events API must not hold a report's
        // place (`reclaim::REPORTS_AT_ONCE`) for three API timeouts.
        tokio::time::timeout(RECORD_WITHIN, tries)
            .await
            .unwrap_or(false)
    }

    async fn write(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        say: &Say,
    ) -> bool {
        let ev = Event {
            type_: say.type_,
            reason: say.reason.into(),
            note: Some(truncate(say.note.clone())),
            action: say.action.into(),
            secondary: related,
        };
        let res =
            tokio::time::timeout(crate::API_TIMEOUT, self.recorder.publish(&ev, regarding)).await;
        let err = match res {
            Ok(Ok(())) => return true,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        self.metrics
            .reconcile_errors
            .with_label_values(&[ErrorKind::Event.as_str()])
            .inc();
        warn!(namespace = regarding.namespace.as_deref().unwrap_or_default(),
              lock = regarding.name.as_deref().unwrap_or_default(),
              reason = say.reason, error = %err, "could not write Event");
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARKER: &str = "[selector lock-janitor.io/watch=true]";

    /// The marker ends the note, and the note fits 1 KiB, for any body:
    /// short, exactly at the edge, 4 KiB, multi-byte characters across the
    /// cut.
    #[test]
    fn the_marker_survives_any_body() {
        let room = MAX_NOTE - MARKER.len() - 1;
        for body in [
            String::new(),
            "Deleted this lock: holder pod op-0 has Failed (Evicted).".to_owned(),
            "x".repeat(room),
            "x".repeat(room + 1),
            format!("reason {}", "R".repeat(4096)),
            "é".repeat(2000),
            format!("a{}", "🦀".repeat(1000)),
        ] {
            let note = marked_note(&body, MARKER);
            assert!(note.ends_with(MARKER), "{note}");
            assert!(note.len() <= MAX_NOTE, "{} bytes", note.len());
            // What the Event write does to it changes nothing.
            assert_eq!(truncate(note.clone()), note);
            if body.len() <= room {
                assert_eq!(note, format!("{body} {MARKER}"));
            } else {
                assert!(note.contains("… [selector"), "{note}");
            }
        }
    }

    #[test]
    fn a_cut_keeps_whole_characters() {
        assert_eq!(cut("abc".into(), 3), "abc");
        assert_eq!(cut("abcdef".into(), 5), "ab…");
        // 'é' is 2 bytes: never split.
        let c = cut("éééé".into(), 6);
        assert!(c.len() <= 6 && c.ends_with('…'), "{c}");
    }
}
