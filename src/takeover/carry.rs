//! The opt-in label carried over to the lock a new holder created after a
//! takeover (operator-lib creates it without labels): only the leader
//! writes, with a resourceVersion-guarded merge patch, after every watch has
//! synced; a standby waits for the lead.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use tracing::{debug, info, warn};

use super::{Shared, FIRST_LOOK, FOLLOW_FOR};
use crate::call;
use crate::kinds::{self, Object};
use crate::lock::{self, LockKey};
use crate::optin::{self, Plan, Written};

/// How long a follower that does not lead waits for the lead before it
/// leaves the label carry-over to the leader.
const GATE_WAIT: Duration = Duration::from_secs(30);
/// Failed label writes before the carry-over gives up, and attempts in all
/// (conflicts included).
const LABEL_FAILURES: u32 = 5;
const LABEL_ATTEMPTS: u32 = 10;

/// A lock a new holder makes again after a reclaim, and its shape: a
/// ConfigMap without data, a Lease held for life.
pub(super) trait Lockish:
    kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug
{
    fn shaped(&self) -> bool;
}

impl Lockish for ConfigMap {
    fn shaped(&self) -> bool {
        held_for_life(Object::ConfigMap(self))
    }
}

impl Lockish for k8s_openapi::api::coordination::v1::Lease {
    fn shaped(&self) -> bool {
        held_for_life(Object::Lease(self))
    }
}

/// A lock held for life, by its kind's shape: what a new holder makes again.
fn held_for_life(o: Object<'_>) -> bool {
    matches!(
        kinds::candidate(o),
        Some(crate::lock::candidate::Shape::HeldForLife(_))
    )
}

/// Adds the opt-in label to the new lock, when there is one to carry and the
/// lock is lock-shaped and has no value for its key (`false` is an opt-out),
/// with a resourceVersion-guarded merge patch: it never overwrites a
/// concurrent change. Only the leader writes, and never before every watch
/// has synced (safety rule 4). True when the lock was gone by the time of
/// the write (deleted again): still awaited.
pub(super) async fn carry_label_over<K: Lockish>(
    s: &Shared,
    cms: &Api<K>,
    key: &LockKey,
    mut cm: K,
    holder: &str,
) -> bool {
    let Some((k, v)) = &s.label else {
        return false;
    };
    let mut failures = 0;
    for _ in 0..LABEL_ATTEMPTS {
        if !cm.shaped() {
            info!(namespace = %key.namespace, lock = %key.name,
                  "the new lock is not lock-shaped (a ConfigMap with data, a Lease renewed); not labeling it");
            return false;
        }
        match optin::plan_label(cm.meta(), k, v) {
            Some(Plan::Add) => {}
            Some(Plan::Unchanged) | None => return false,
            Some(Plan::Conflicting(other)) => {
                info!(namespace = %key.namespace, lock = %key.name, value = %other,
                      "the new lock sets the opt-in label key to another value; left alone");
                return false;
            }
        }
        // Only the leader writes, never before sync. A standby waits for
        // the lead, looking again now and then: done once the leader has
        // labeled the lock (or it is gone). It does not leave it to the
        // leader blindly: the leader may die before its own follower looks
        // (found by the chaos suite), and a janitor that starts later sees
        // a lock that is present again as taken over, not as awaited.
        let (waiting, mut looked) = (Instant::now(), Instant::now());
        let mut settled = false;
        while !s.readiness.serves(&key.namespace) || !s.gate.may_write() {
            if waiting.elapsed() > FOLLOW_FOR {
                return false;
            }
            if looked.elapsed() >= GATE_WAIT {
                looked = Instant::now();
                s.limiter.until_ready().await;
                match call("reading the new lock", cms.get_opt(&key.name)).await {
                    Ok(Some(again)) => {
                        settled = !again.shaped()
                            || optin::plan_label(again.meta(), k, v) != Some(Plan::Add);
                        cm = again;
                    }
                    Ok(None) => return true,
                    Err(_) => {}
                }
                if settled {
                    debug!(namespace = %key.namespace, lock = %key.name,
                           "the leader carried the label over");
                    return false;
                }
            }
            tokio::time::sleep(FIRST_LOOK).await;
        }
        s.label_writes.until_ready().await;
        match optin::write_label(cms, cm.meta(), k, v).await {
            Written::Labeled => {
                // The lock read last names its holder (another heir, if the
                // first one lost it meanwhile).
                let holder = lock::parse(cm.meta()).map_or(holder.to_owned(), |l| l.holder.name);
                info!(namespace = %key.namespace, lock = %key.name, holder = %holder,
                      "opt-in label carried over to the new lock");
                return false;
            }
            Written::Gone => return true,
            Written::Conflict => {}
            // Tried again after 1, 2, 4 and 8 s: an API server that has just
            // restarted denies requests until its RBAC caches are filled
            // (found by the chaos suite), and a timeout or a 5xx passes too.
            Written::Failed(e) if failures + 1 < LABEL_FAILURES => {
                failures += 1;
                let wait = Duration::from_secs(1 << (failures - 1));
                debug!(namespace = %key.namespace, lock = %key.name, error = %e,
                       retry_seconds = wait.as_secs(), "label carry-over failed; trying again");
                tokio::time::sleep(wait).await;
            }
            Written::Failed(e) => {
                s.metrics.restore_failures.inc();
                warn!(namespace = %key.namespace, lock = %key.name, error = %e, failures = LABEL_FAILURES,
                      "could not carry the opt-in label over; label the lock with `lock-janitor label --apply`");
                return false;
            }
        }
        s.limiter.until_ready().await;
        match call("reading the new lock", cms.get_opt(&key.name)).await {
            Ok(Some(again)) => cm = again,
            Ok(None) => return true,
            // The next write, with the copy at hand, says what is wrong.
            Err(_) => {}
        }
    }
    s.metrics.restore_failures.inc();
    warn!(namespace = %key.namespace, lock = %key.name, attempts = LABEL_ATTEMPTS,
          "could not carry the opt-in label over (the lock kept changing); label the lock with `lock-janitor label --apply`");
    false
}
