//! After a watched lock is gone (reclaimed, collected or deleted by hand), a
//! new holder is expected to create it again: follow the name for a while
//! and carry the opt-in label over to the new lock, which operator-lib
//! creates without labels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::call;
use crate::election::Gate;
use crate::lock::{self, LockKey};
use crate::optin::{self, Plan, Written};
use crate::readiness::Readiness;
use crate::selector::Selector;

/// How long to wait for a takeover after a lock is gone. operator-lib's
/// waiting replicas retry at most every 16 s; a new pod may need to start.
const TAKEOVER_WINDOW: Duration = Duration::from_secs(600);

/// What the followers may spend of the API budget together: they poll, and
/// must never crowd out the reads before a reclaim during a mass eviction.
const FOLLOWER_QPS: u32 = 2;
const FOLLOWER_BURST: u32 = 5;
/// A follower's first look, and its longest wait between looks.
const FIRST_LOOK: Duration = Duration::from_secs(2);
const LONGEST_WAIT: Duration = Duration::from_secs(30);

type Limiter = governor::DefaultDirectRateLimiter;

/// The takeovers being awaited, one follower task per lock.
pub struct Takeovers {
    client: Client,
    gate: Gate,
    limiter: Arc<Limiter>,
    readiness: Arc<Readiness>,
    selector: Selector,
    dry_run: bool,
    followers: Mutex<HashMap<LockKey, JoinHandle<()>>>,
}

impl Takeovers {
    pub fn new(
        client: Client,
        gate: Gate,
        readiness: Arc<Readiness>,
        selector: Selector,
        dry_run: bool,
    ) -> Self {
        let quota = governor::Quota::per_second(
            std::num::NonZeroU32::new(FOLLOWER_QPS).unwrap_or(std::num::NonZeroU32::MIN),
        )
        .allow_burst(
            std::num::NonZeroU32::new(FOLLOWER_BURST).unwrap_or(std::num::NonZeroU32::MIN),
        );
        Takeovers {
            client,
            gate,
            limiter: Arc::new(governor::RateLimiter::direct(quota)),
            readiness,
            selector,
            dry_run,
            followers: Mutex::default(),
        }
    }

    /// Starts following a lock that is gone. One follower per lock; none in
    /// dry-run (no writes) or when the selector is not one `key=value`.
    pub fn follow(&self, key: &LockKey, old_holder_uid: String) {
        if self.dry_run {
            return;
        }
        let Some((k, v)) = self.selector.opt_in_label() else {
            warn!(namespace = %key.namespace, lock = %key.name, selector = %self.selector,
                  "the selector is not a single key=value label; label the new lock by hand after a takeover");
            return;
        };
        let mut followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        followers.retain(|_, t| !t.is_finished());
        if followers.contains_key(key) {
            return;
        }
        let task = carry_label_over(
            self.gate.clone(),
            self.limiter.clone(),
            self.readiness.clone(),
            Api::namespaced(self.client.clone(), &key.namespace),
            key.name.clone(),
            (k.to_owned(), v.to_owned()),
            old_holder_uid,
        );
        followers.insert(key.clone(), tokio::spawn(task));
    }

    /// Locks whose takeover is still awaited (lost if the process stops).
    pub fn awaiting(&self) -> Vec<LockKey> {
        let followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<LockKey> = followers
            .iter()
            .filter(|(_, t)| !t.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }
}

/// Waits for the takeover (a new holder creating the lock again) and adds
/// the opt-in label to the new lock. Writes only a leader-for-life lock of
/// another holder that has no value for the label key (`false` is an
/// opt-out), with a resourceVersion-guarded merge patch, so it never
/// overwrites a concurrent change.
async fn carry_label_over(
    gate: Gate,
    limiter: Arc<Limiter>,
    readiness: Arc<Readiness>,
    cms: Api<ConfigMap>,
    name: String,
    (key, value): (String, String),
    old_holder_uid: String,
) {
    let ns = cms.namespace().unwrap_or_default().to_owned();
    let started = Instant::now();
    let mut wait = FIRST_LOOK;
    while started.elapsed() < TAKEOVER_WINDOW {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LONGEST_WAIT);
        limiter.until_ready().await;
        // Safety rule 4: no write before every watch has synced; and only
        // the leader writes.
        if !readiness.is_synced() || !gate.may_write() {
            continue;
        }
        // The whole object: only a lock-shaped (empty) ConfigMap is labeled.
        let read = call("reading the lock after it was deleted", cms.get_opt(&name));
        let cm = match read.await {
            Ok(Some(cm)) => cm,
            Ok(None) => continue,
            Err(e) => {
                warn!(namespace = %ns, lock = %name, error = %e, "waiting for the takeover");
                continue;
            }
        };
        if !lock::lock_shaped(&cm) {
            info!(namespace = %ns, lock = %name,
                  "the lock was re-created with data; not lock-shaped, not labeling it");
            return;
        }
        let meta = cm.metadata;
        let holder = match lock::parse(&meta) {
            // Same holder: the lock was not deleted but left the selector
            // (someone removed the label). Respect that.
            Ok(l) if l.holder.uid == old_holder_uid => return,
            Ok(l) => l.holder.name,
            Err(why) => {
                info!(namespace = %ns, lock = %name, why = %why,
                      "the lock was re-created but is not a leader-for-life lock; not labeling it");
                return;
            }
        };
        let after = started.elapsed().as_secs_f64();
        match optin::plan_label(&meta, &key, &value) {
            Some(Plan::Add) => {}
            Some(Plan::Unchanged) => {
                info!(namespace = %ns, lock = %name, holder = %holder, after_seconds = after,
                      "takeover: a new holder leads; the lock already carries the opt-in label");
                return;
            }
            Some(Plan::Conflicting(other)) => {
                info!(namespace = %ns, lock = %name, holder = %holder, value = %other,
                      "takeover: a new holder leads; its lock sets the opt-in label key to another value, left alone");
                return;
            }
            None => return,
        }
        match optin::write_label(&cms, &meta, &key, &value).await {
            Written::Labeled => {
                info!(namespace = %ns, lock = %name, holder = %holder, after_seconds = after,
                      "takeover: a new holder leads; opt-in label carried over");
                return;
            }
            Written::Gone | Written::Conflict => continue,
            Written::Failed(e) => {
                warn!(namespace = %ns, lock = %name, error = %e,
                      "could not carry the opt-in label over; label the lock with `lock-janitor label --apply`");
                return;
            }
        }
    }
    warn!(namespace = %ns, lock = %name,
          "no takeover within {}s; if a replica takes over later, label its lock with `lock-janitor label --apply`",
          TAKEOVER_WINDOW.as_secs());
}
