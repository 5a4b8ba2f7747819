//! After a watched lock is gone (reclaimed, collected or deleted by hand), a
//! new holder is expected to create it again: follow the name, say when the
//! takeover comes (`LockTakenOver`, `lock_janitor_takeover_seconds`) or does
//! not come within `--takeover-timeout` (`NoTakeover`,
//! `lock_janitor_takeover_timeouts_total`), and carry the opt-in label over
//! to the new lock, which operator-lib creates without labels. What is
//! awaited is derived again from the janitor's own `StaleLockReclaimed`
//! Events after a restart or a failover. The label carry-over is in `carry`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::events::EventType;
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::election::Gate;
use crate::events::{self, Events, Say};
use crate::lock::{self, Holder, LockKey, LockKind};
use crate::metrics::Metrics;
use crate::optin::{self, Plan};

mod carry;
use crate::readiness::Readiness;
use crate::selector::Selector;
use crate::{call, scoped};

/// How long a gone lock is followed at most (a takeover may still come long
/// after the timeout, when someone restarts the replica that gave up).
const FOLLOW_FOR: Duration = Duration::from_secs(24 * 3600);

/// What the followers may spend of the API budget together: they poll, and
/// must never crowd out the reads before a reclaim during a mass eviction.
const FOLLOWER_QPS: u32 = 2;
const FOLLOWER_BURST: u32 = 5;
/// The label writes of every follower together: a restart labels the locks
/// made again while no janitor ran from its own reads (no look to pace
/// them), 200 in about 10 s rather than all at once.
const LABEL_WRITES_QPS: u32 = 20;
/// A follower's first look, and its longest wait between looks.
const FIRST_LOOK: Duration = Duration::from_secs(2);
const LONGEST_WAIT: Duration = Duration::from_secs(30);
/// The longest wait once --takeover-timeout has passed.
const LONGEST_WAIT_LATE: Duration = Duration::from_secs(300);

type Limiter = governor::DefaultDirectRateLimiter;

/// What every follower shares.
struct Shared {
    client: Client,
    gate: Gate,
    limiter: Limiter,
    label_writes: Limiter,
    readiness: Arc<Readiness>,
    metrics: Metrics,
    events: Events,
    /// The label to carry over; none in dry run or without one key=value.
    label: Option<(String, String)>,
    timeout: Duration,
}

/// The takeovers being awaited, one follower task per lock.
pub struct Takeovers {
    shared: Arc<Shared>,
    selector: Selector,
    followers: Mutex<HashMap<LockKey, JoinHandle<()>>>,
}

/// How the followers are set up.
pub struct Settings {
    pub selector: Selector,
    pub dry_run: bool,
    pub timeout: Duration,
}

impl Takeovers {
    pub fn new(
        client: Client,
        gate: Gate,
        readiness: Arc<Readiness>,
        metrics: Metrics,
        events: Events,
        settings: Settings,
    ) -> Self {
        let nz = |n: u32| std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN);
        let quota = governor::Quota::per_second(nz(FOLLOWER_QPS)).allow_burst(nz(FOLLOWER_BURST));
        let label = if settings.dry_run {
            None
        } else {
            settings
                .selector
                .opt_in_label()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        };
        Takeovers {
            shared: Arc::new(Shared {
                client,
                gate,
                limiter: governor::RateLimiter::direct(quota),
                label_writes: governor::RateLimiter::direct(governor::Quota::per_second(nz(
                    LABEL_WRITES_QPS,
                ))),
                readiness,
                metrics,
                events,
                label,
                timeout: settings.timeout,
            }),
            selector: settings.selector,
            followers: Mutex::default(),
        }
    }

    /// Starts awaiting a takeover of a lock that is gone since `since`.
    /// One follower per lock.
    pub fn follow(&self, key: &LockKey, old: Holder, since: Timestamp) {
        self.follow_from(key, old, since, None);
    }

    /// As `follow`, with a first look already made (a restart's own read).
    fn follow_from(&self, key: &LockKey, old: Holder, since: Timestamp, first: Option<Look>) {
        if self.shared.label.is_none() && self.selector.opt_in_label().is_none() {
            warn!(namespace = %key.namespace, lock = %key.name, selector = %self.selector,
                  "the selector is not a single key=value label; label the new lock by hand after a takeover");
        }
        let mut followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        followers.retain(|_, t| !t.is_finished());
        if followers.contains_key(key) {
            return;
        }
        let task = follow(self.shared.clone(), key.clone(), old, since, first);
        followers.insert(key.clone(), tokio::spawn(task));
    }

    /// Locks whose takeover is still awaited.
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

    /// After a restart or a failover: awaits again the takeovers of locks
    /// this janitor (any replica) reclaimed within `FOLLOW_FOR` and that no
    /// new holder has created yet, from its own `StaleLockReclaimed` Events
    /// in `namespace` (all for None). `present` says whether a lock exists
    /// now, and under which holder uid.
    pub async fn restore(&self, namespace: Option<&str>) -> Result<usize, crate::Error> {
        let api: Api<k8s_openapi::api::events::v1::Event> = scoped(&self.shared.client, namespace);
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
        let mut latest: HashMap<LockKey, (Timestamp, Holder)> = HashMap::new();
        for ev in items {
            // Only this janitor's (its selector is in the note): another
            // release's reclaims are not ours to follow or label.
            if ev.reporting_controller.as_deref() != Some(crate::NAME)
                || !ev
                    .note
                    .as_deref()
                    .is_some_and(|n| n.ends_with(&reclaim_marker(&self.selector)))
            {
                continue;
            }
            let kind = match ev.regarding.as_ref().and_then(|r| r.kind.as_deref()) {
                Some("ConfigMap") => LockKind::ConfigMap,
                Some("Lease") => LockKind::Lease,
                _ => continue,
            };
            let (Some(regarding), Some(related)) = (ev.regarding, ev.related) else {
                continue;
            };
            let (Some(ns), Some(name), Some(holder), Some(uid)) = (
                regarding.namespace,
                regarding.name,
                related.name,
                related.uid,
            ) else {
                continue;
            };
            let at = ev
                .series
                .map(|s| s.last_observed_time.0)
                .or(ev.event_time.map(|t| t.0))
                .or(ev.metadata.creation_timestamp.map(|t| t.0));
            let Some(at) = at else { continue };
            let key = LockKey {
                namespace: ns,
                name,
                kind,
            };
            if latest.get(&key).is_none_or(|(t, _)| *t < at) {
                latest.insert(key, (at, Holder { name: holder, uid }));
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
            self.follow_from(&key, holder, at, first);
            restored += 1;
        }
        Ok(restored)
    }

    /// After a restart: whether the takeover of a lock reclaimed from
    /// `old` is still awaited, from a live read. A lock present again was
    /// taken over while no janitor looked; one a new holder created without
    /// the opt-in label is followed once more, which labels it.
    async fn still_awaited(&self, key: &LockKey, old: &Holder) -> Result<Restore, crate::Error> {
        let look = match key.kind {
            LockKind::ConfigMap => look_configmap(&self.shared, key, old).await?,
            LockKind::Lease => look_lease(&self.shared, key, old).await?,
        };
        Ok(match look {
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

/// The end of the janitor's StaleLockReclaimed note: which selector's
/// janitor reclaimed it, so that after a restart it follows only its own.
pub fn reclaim_marker(selector: &Selector) -> String {
    format!("[selector {selector}]")
}

fn lock_by_name(key: &LockKey) -> ObjectReference {
    let api_version = match key.kind {
        LockKind::ConfigMap => "v1",
        LockKind::Lease => "coordination.k8s.io/v1",
    };
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(key.kind.kind().into()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        ..Default::default()
    }
}

fn seconds_since(t: Timestamp) -> f64 {
    Duration::try_from(Timestamp::now().duration_since(t))
        .unwrap_or_default()
        .as_secs_f64()
}

/// What a follower's look at a lock's name found.
enum Look {
    /// Not there (a ConfigMap), or nobody holds it (a Lease): still awaited.
    Waiting,
    /// Nothing more to await, and why.
    Done(&'static str),
    /// A new holder leads.
    Taken(Box<TakenBy>),
}

/// Who took a lock over: since when, the lock as read, who.
struct TakenBy {
    at: Option<Timestamp>,
    lock: ObjectReference,
    holder: lock::Lock,
    /// The new lock, to carry the opt-in label over to: a ConfigMap, or a
    /// Lease held for life (a released Lease keeps its labels).
    new: Option<New>,
}

/// A lock made again by a new holder, as read.
enum New {
    ConfigMap(ConfigMap),
    Lease(Lease),
}

/// One look at a gone ConfigMap lock's name.
async fn look_configmap(s: &Shared, key: &LockKey, old: &Holder) -> Result<Look, crate::Error> {
    let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), &key.namespace);
    // The whole object: only a lock-shaped (empty) ConfigMap is a lock.
    let read = call(
        "reading the lock after it was deleted",
        cms.get_opt(&key.name),
    );
    let Some(cm) = read.await? else {
        return Ok(Look::Waiting);
    };
    let new = match lock::parse(&cm.metadata) {
        // Same holder: the lock was not deleted but left the selector
        // (someone removed the label). Nothing is awaited.
        Ok(l) if l.holder.uid == old.uid => return Ok(Look::Done("opted out")),
        Ok(l) if lock::lock_shaped(&cm) => l,
        Ok(_) => return Ok(Look::Done("re-created with data: not a lock")),
        Err(why) => {
            info!(namespace = %key.namespace, lock = %key.name, why = %why,
                  "the lock was re-created but is not a leader-for-life lock; not following it");
            return Ok(Look::Done("not a lock"));
        }
    };
    Ok(Look::Taken(Box::new(TakenBy {
        // When the new lock was created, not when this follower looked.
        at: cm.metadata.creation_timestamp.as_ref().map(|t| t.0),
        lock: events::lock_ref(&cm.metadata),
        holder: new,
        new: Some(New::ConfigMap(cm)),
    })))
}

/// One look at a released (or deleted) Lease: a new holder identity is a
/// takeover.
async fn look_lease(s: &Shared, key: &LockKey, old: &Holder) -> Result<Look, crate::Error> {
    let leases: Api<Lease> = Api::namespaced(s.client.clone(), &key.namespace);
    let read = call(
        "reading the lease after it was released",
        leases.get_opt(&key.name),
    );
    let Some(lease) = read.await? else {
        return Ok(Look::Waiting);
    };
    if lock::lease::held_for_life(&lease) {
        // Made again by a candidate (a Lease held for life is deleted, not
        // released): its owner is the new holder.
        return Ok(match lock::parse(&lease.metadata) {
            Ok(l) if l.holder.uid == old.uid => Look::Done("held again by the same pod"),
            Ok(l) => Look::Taken(Box::new(TakenBy {
                at: lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.acquire_time.as_ref())
                    .map(|t| t.0)
                    .or(lease.metadata.creation_timestamp.as_ref().map(|t| t.0)),
                lock: events::ref_of(LockKind::Lease, &lease.metadata),
                holder: l,
                new: Some(New::Lease(lease)),
            })),
            Err(_) => Look::Done("not a lock"),
        });
    }
    let parsed = match lock::lease::parse(&lease) {
        Ok(l) => l,
        Err(_) => return Ok(Look::Done("not a lock")),
    };
    match parsed.host.as_deref() {
        None => Ok(Look::Waiting),
        // The same host as the released holder's (its pod name, or the
        // hostname it was matched by): not a new holder.
        Some(h) if h == old.name || lock::lease::host_of_name(&old.name) == h => {
            Ok(Look::Done("held again under the same identity"))
        }
        Some(_) => Ok(Look::Taken(Box::new(TakenBy {
            // When the new holder took it (every elector sets acquireTime
            // as it takes a Lease); its latest renewal only when it does
            // not say: that is when the follower looked, not the takeover.
            at: lease
                .spec
                .as_ref()
                .and_then(|s| s.acquire_time.as_ref())
                .map(|t| t.0)
                .or(parsed.renewed),
            lock: events::ref_of(LockKind::Lease, &lease.metadata),
            holder: crate::observe::lease_lock(&parsed, None),
            new: None,
        }))),
    }
}

/// Follows one gone (or released) lock until a new holder takes it (a
/// takeover), or for `FOLLOW_FOR`. Says `NoTakeover` once the timeout
/// passes with nobody holding it.
async fn follow(
    s: Arc<Shared>,
    key: LockKey,
    old: Holder,
    since: Timestamp,
    mut first: Option<Look>,
) {
    let labels = [key.namespace.as_str(), key.name.as_str()];
    s.metrics
        .awaiting_takeover
        .with_label_values(&labels)
        .set(1);
    // Born at 0 while awaited, so that increase() counts a first timeout;
    // removed at the end unless one was counted.
    let timeouts = s.metrics.takeover_timeouts.with_label_values(&labels);
    let started = Instant::now();
    let (mut counted, mut said) = (false, false);
    let mut wait = FIRST_LOOK;
    let outcome = loop {
        if started.elapsed() >= FOLLOW_FOR {
            break "given up";
        }
        let look = match first.take() {
            Some(look) => Ok(look),
            None => {
                tokio::time::sleep(wait).await;
                // Past the timeout (NoTakeover said), a follower looks only
                // every few minutes: the young ones, whose takeover is due
                // any second, must not queue behind it for the budget.
                let longest = if seconds_since(since) >= s.timeout.as_secs_f64() {
                    LONGEST_WAIT_LATE
                } else {
                    LONGEST_WAIT
                };
                wait = (wait * 2).min(longest);
                s.limiter.until_ready().await;
                match key.kind {
                    LockKind::ConfigMap => look_configmap(&s, &key, &old).await,
                    LockKind::Lease => look_lease(&s, &key, &old).await,
                }
            }
        };
        let (at, lock_ref, new, made) = match look {
            Ok(Look::Waiting) => {
                // Still nobody: past the timeout, nobody took over.
                if !said && seconds_since(since) >= s.timeout.as_secs_f64() {
                    if !counted {
                        counted = true;
                        timeouts.inc();
                    }
                    // A standby writes no Event: it tries again at its next
                    // look, and says it once it leads.
                    said = no_takeover(&s, &key, &old, since).await;
                }
                continue;
            }
            Ok(Look::Done(why)) => break why,
            Ok(Look::Taken(t)) => {
                let t = *t;
                (t.at, t.lock, t.holder, t.new)
            }
            Err(e) => {
                debug!(namespace = %key.namespace, lock = %key.name, error = %e, "waiting for the takeover");
                continue;
            }
        };
        let after = at
            .map(|c| {
                Duration::try_from(c.duration_since(since))
                    .unwrap_or_default()
                    .as_secs_f64()
            })
            .unwrap_or_else(|| seconds_since(since));
        s.metrics.takeover.observe(after);
        let _ = s.metrics.awaiting_takeover.remove_label_values(&labels);
        info!(namespace = %key.namespace, lock = %key.name, kind = %key.kind, holder = %new.holder.name,
              after_seconds = after, "takeover: a new holder leads");
        let freed = match (key.kind, &made) {
            // A Lease held for life was deleted, not released.
            (LockKind::ConfigMap, _) | (LockKind::Lease, Some(New::Lease(_))) => "deleted",
            (LockKind::Lease, _) => "released",
        };
        let say = Say {
            type_: EventType::Normal,
            reason: events::REASON_TAKEN_OVER,
            action: "Takeover",
            note: format!(
                "Pod {} took this lock over {:.1}s after the lock of {} was {freed}.",
                new.holder.name, after, old.name
            ),
        };
        let gone = match made {
            Some(New::ConfigMap(cm)) => {
                let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), &key.namespace);
                carry::carry_label_over(&s, &cms, &key, cm, &new.holder.name).await
            }
            Some(New::Lease(lease)) => {
                let leases: Api<Lease> = Api::namespaced(s.client.clone(), &key.namespace);
                carry::carry_label_over(&s, &leases, &key, lease, &new.holder.name).await
            }
            None => false,
        };
        if gone {
            // Deleted again before its label was written (its holder died
            // too, or a restart's read was old by the time the janitor
            // led): the next holder's lock is awaited, and labeled.
            info!(namespace = %key.namespace, lock = %key.name,
                  "the new lock was gone before its label was written; awaiting the next holder");
            s.metrics
                .awaiting_takeover
                .with_label_values(&labels)
                .set(1);
            continue;
        }
        // Said after the carry-over, which waits for the lead when it has a
        // label to carry: a replica that saw the takeover while the lead
        // was changing hands (a rolling upgrade) says it once it leads and
        // has labeled the lock, instead of losing it; one that found the
        // label carried by the leader says nothing (the leader did).
        s.events
            .publish(&lock_ref, Some(events::holder_ref(&new)), say)
            .await;
        break "taken over";
    };
    let _ = s.metrics.awaiting_takeover.remove_label_values(&labels);
    if timeouts.get() == 0 {
        let _ = s.metrics.takeover_timeouts.remove_label_values(&labels);
    }
    debug!(namespace = %key.namespace, lock = %key.name, outcome, "no longer awaiting a takeover");
}

/// Nobody created the lock again within the timeout: the waiting replica
/// gave up, or none runs. Said on the lock by name and on the dead holder
/// pod while it exists. True once the Event on the lock is written.
async fn no_takeover(s: &Shared, key: &LockKey, old: &Holder, since: Timestamp) -> bool {
    if !s.gate.may_write() {
        return false;
    }
    let waited = seconds_since(since);
    warn!(namespace = %key.namespace, lock = %key.name, holder = %old.name, waited_seconds = waited,
          "no takeover: nobody created the lock again; is a replica of the operator running, or did it give up?");
    let (taken, freed) = match key.kind {
        LockKind::ConfigMap => ("created lock", "deleted"),
        LockKind::Lease => ("taken Lease", "released"),
    };
    let note = format!(
        "No pod has {taken} {} again {:.0}s after the lock of the dead holder {} was {freed}: \
         no replica of the operator runs, or it stopped trying. Restart a replica (kubectl rollout restart).",
        key.name, waited, old.name
    );
    let say = |note: String| Say {
        type_: EventType::Warning,
        reason: events::REASON_NO_TAKEOVER,
        action: "Takeover",
        note,
    };
    let written = s
        .events
        .publish(&lock_by_name(key), None, say(note.clone()))
        .await;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &key.namespace);
    if let Ok(Some(pod)) = call("reading the dead holder", pods.get_opt(&old.name)).await {
        if pod.metadata.uid.as_deref() == Some(old.uid.as_str()) {
            let holder = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(key.namespace.clone()),
                name: Some(old.name.clone()),
                uid: Some(old.uid.clone()),
                ..Default::default()
            };
            s.events.publish(&holder, None, say(note)).await;
        }
    }
    written
}
