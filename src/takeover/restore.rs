//! After a restart or a failover: the takeovers this janitor awaited, and
//! the locks made again while no janitor ran, found again from its own
//! reclaim Events and a live read of each lock.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::Api;
use tracing::{info, warn};

use super::{look, reclaim_marker, Awaited, Look, New, TakenBy, Takeovers, Workload, FOLLOW_FOR};
use crate::events;
use crate::lock::{Holder, LockKey, LockKind};
use crate::optin::{self, Plan};
use crate::{call, scoped};

impl Takeovers {
    /// After a restart or a failover: awaits again the takeovers of locks
    /// this janitor (any replica) reclaimed within `FOLLOW_FOR` and that no
    /// new holder has created yet, from its own `StaleLockReclaimed` Events
    /// in `namespace` (all for None), and a live read of each lock
    /// (`still_awaited`).
    pub async fn restore(&self, namespace: Option<&str>) -> Result<usize, crate::Error> {
        let api: Api<Event> = scoped(&self.shared.client, namespace);
        // The reclaims, and the intents written just before each freeing
        // write (what is left of a reclaim whose janitor died before its
        // StaleLockReclaimed Event; still_awaited tells from the lock as it
        // is now whether it was freed).
        let mut items = Vec::new();
        for reason in [events::REASON_RECLAIMED, events::REASON_RECLAIMING] {
            let lp = ListParams::default().fields(&format!("reason={reason}"));
            let list = call("listing the janitor's reclaim Events", api.list(&lp))
                .await
                .inspect_err(|_| self.shared.metrics.restore_failures.inc())?;
            items.extend(list.items);
        }
        // The latest reclaim per lock.
        let marker = reclaim_marker(&self.selector);
        let mut latest: HashMap<LockKey, (Timestamp, Holder)> = HashMap::new();
        for (key, at, holder) in items.into_iter().filter_map(|ev| reclaim_of(ev, &marker)) {
            if latest.get(&key).is_none_or(|(t, _)| *t < at) {
                latest.insert(key, (at, holder));
            }
        }
        let now = Timestamp::now();
        let mut restored = 0;
        for (key, (at, holder)) in latest {
            let age = Duration::try_from(now.duration_since(at)).unwrap_or_default();
            if age >= FOLLOW_FOR {
                continue;
            }
            // One lock's failed read costs that lock only: counted, said,
            // and the others are restored.
            let awaited = match self.still_awaited(&key, &holder).await {
                Ok(a) => a,
                Err(e) => {
                    self.shared.metrics.restore_failures.inc();
                    warn!(namespace = %key.namespace, lock = %key.name, error = %e,
                          "could not restore the takeover of a reclaimed lock; it is not followed");
                    continue;
                }
            };
            let first = match awaited {
                Restore::Nothing => continue,
                Restore::Await => {
                    info!(namespace = %key.namespace, lock = %key.name,
                          reclaimed_seconds_ago = age.as_secs(),
                          "awaiting the takeover of a lock reclaimed before this janitor started");
                    None
                }
                Restore::Label(look) => {
                    info!(namespace = %key.namespace, lock = %key.name,
                          reclaimed_seconds_ago = age.as_secs(),
                          "a reclaimed lock was created again while no janitor ran, without the opt-in label; labeling it");
                    Some(look)
                }
            };
            // The lock just read is the follower's first look: a restart
            // spends none of the followers' budget to find the locks it
            // labels, which stay unprotected until they are labeled.
            // Whose workload it was is read from the holder pod at the
            // first look (`Workload::Unread`), as everything here is.
            self.follow_from(&key, holder, at, Awaited::Freed(Workload::Unread), first);
            restored += 1;
        }
        Ok(restored)
    }

    /// After a restart: whether the takeover of a lock reclaimed from
    /// `old` is still awaited, from a live read. A lock present again was
    /// taken over while no janitor looked; one a new holder created without
    /// the opt-in label is followed once more, which labels it.
    async fn still_awaited(&self, key: &LockKey, old: &Holder) -> Result<Restore, crate::Error> {
        Ok(match look(&self.shared, key, old).await? {
            // Not there again (a ConfigMap, a Lease held for life), or a
            // Lease released and not taken yet.
            Look::Waiting => Restore::Await,
            // Made again by a new holder without the opt-in label. A Lease
            // keeps its labels through a release: nothing to carry there.
            Look::Taken(t) if self.unlabeled(&t) => Restore::Label(Look::Taken(t)),
            Look::Taken(_) | Look::Done(_) => Restore::Nothing,
        })
    }

    /// Whether a lock a new holder made lacks the opt-in label there is to
    /// carry over.
    fn unlabeled(&self, t: &TakenBy) -> bool {
        let Some((k, v)) = self.shared.label.as_ref() else {
            return false;
        };
        let meta = match &t.new {
            Some(New::ConfigMap(cm)) => &cm.metadata,
            Some(New::Lease(lease)) => &lease.metadata,
            None => return false,
        };
        optin::plan_label(meta, k, v) == Some(Plan::Add)
    }
}

/// The lock a reclaim Event is about, when it was said, and the holder the
/// lock was reclaimed from; None for an Event not this janitor's, or
/// incomplete.
fn reclaim_of(ev: Event, marker: &str) -> Option<(LockKey, Timestamp, Holder)> {
    // Only this janitor's (its selector is in the note): another release's
    // reclaims are not ours to follow or label.
    if ev.reporting_controller.as_deref() != Some(crate::NAME) || !ev.note?.ends_with(marker) {
        return None;
    }
    let (regarding, related) = (ev.regarding?, ev.related?);
    let kind = match regarding.kind.as_deref()? {
        "ConfigMap" => LockKind::ConfigMap,
        "Lease" => LockKind::Lease,
        _ => return None,
    };
    let at = ev
        .series
        .map(|s| s.last_observed_time.0)
        .or(ev.event_time.map(|t| t.0))
        .or(ev.metadata.creation_timestamp.map(|t| t.0))?;
    let key = LockKey {
        namespace: regarding.namespace?,
        name: regarding.name?,
        kind,
    };
    let holder = Holder {
        name: related.name?,
        uid: related.uid?,
    };
    Some((key, at, holder))
}

/// What a restart finds of a lock it had reclaimed.
enum Restore {
    /// Taken over and opted in (or not a lock): nothing to do.
    Nothing,
    /// Not taken over yet: followed again.
    Await,
    /// Taken over without the opt-in label: followed from this look,
    /// which labels it.
    Label(Look),
}
