//! After a watched lock is gone (reclaimed, collected or deleted by hand), a
//! new holder may create it again: follow the name, say when the takeover
//! comes (`LockTakenOver`, `lock_janitor_takeover_seconds`), and carry the
//! opt-in label over to the new lock, which operator-lib creates without
//! labels. A takeover is *awaited* (`lock_janitor_awaiting_takeover`, and
//! `NoTakeover` with `lock_janitor_takeover_timeouts_total` when it does not
//! come within `--takeover-timeout`) only for a lock the janitor itself
//! freed, and only while someone wants the operator to run: not once the
//! lock's namespace is being deleted, nor once the holder's workload (its
//! pod's controller, up through a ReplicaSet to its Deployment, or a
//! StatefulSet) is gone or scaled to 0 (`workload`). What is awaited is
//! derived again from the janitor's own `StaleLockReclaimed` Events after a
//! restart or a failover (`restore`), and whether it is still wanted from a
//! live read at each look. The label carry-over is in `carry`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::election::Gate;
use crate::events::{self, Events, Say};
use crate::kinds::{self, Object, Took};
use crate::lock::{self, Holder, LockKey, LockKind};
use crate::metrics::Metrics;

mod carry;
#[cfg(test)]
mod mocked;
mod restore;
mod workload;
use crate::call;
use crate::readiness::Readiness;
use crate::selector::Selector;
pub use workload::Workload;

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

/// The locks followed, one follower task per lock.
pub struct Takeovers {
    shared: Arc<Shared>,
    selector: Selector,
    followers: Mutex<HashMap<LockKey, Follower>>,
}

struct Follower {
    task: JoinHandle<()>,
    /// Whether it was started to await a takeover (see `Awaited`).
    awaited: bool,
}

/// Why a gone lock is followed.
#[derive(Clone, Debug)]
pub enum Awaited {
    /// The janitor freed it: a takeover is awaited, and said missing
    /// (`NoTakeover`) past `--takeover-timeout` while the holder's workload
    /// still wants to run. `Workload::Unread` after a restart: read from
    /// the holder pod, if it is still there.
    Freed(Workload),
    /// Someone else deleted it (the garbage collector after the holder pod
    /// went, a person, an uninstall): followed only to carry the opt-in
    /// label over to a new lock; nothing is awaited or said missing.
    Gone,
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

    /// Starts following a lock that is gone (or released) since `since`.
    /// One follower per lock; a lock the janitor freed replaces a follower
    /// started for it as merely gone (the watch may tell of the delete
    /// before the reclaim returns).
    pub fn follow(&self, key: &LockKey, old: Holder, since: Timestamp, why: Awaited) {
        self.follow_from(key, old, since, why, None);
    }

    /// As `follow`, with a first look already made (a restart's own read).
    fn follow_from(
        &self,
        key: &LockKey,
        old: Holder,
        since: Timestamp,
        why: Awaited,
        first: Option<Look>,
    ) {
        if self.shared.label.is_none() && self.selector.opt_in_label().is_none() {
            warn!(namespace = %key.namespace, lock = %key.name, selector = %self.selector,
                  "the selector is not a single key=value label; label the new lock by hand after a takeover");
        }
        let awaited = matches!(why, Awaited::Freed(_));
        let mut followers = crate::locked(&self.followers);
        followers.retain(|_, f| !f.task.is_finished());
        match followers.get(key) {
            Some(f) if f.awaited || !awaited => return,
            // Merely gone so far: it sets no series, and the new follower
            // carries the label over as it would have.
            Some(f) => f.task.abort(),
            None => {}
        }
        let task = follow(self.shared.clone(), key.clone(), old, since, why, first);
        followers.insert(
            key.clone(),
            Follower {
                task: tokio::spawn(task),
                awaited,
            },
        );
    }

    /// Locks followed (their takeover awaited, or their label to carry).
    pub fn awaiting(&self) -> Vec<LockKey> {
        let followers = crate::locked(&self.followers);
        let mut keys: Vec<LockKey> = followers
            .iter()
            .filter(|(_, f)| !f.task.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }
}

/// The end of the janitor's StaleLockReclaimed note: which selector's
/// janitor reclaimed it, so that after a restart it follows only its own.
pub fn reclaim_marker(selector: &Selector) -> String {
    format!("[selector {selector}]")
}

/// A reference to a lock by name alone (no uid or version: it is gone).
fn lock_by_name(key: &LockKey) -> ObjectReference {
    let meta = ObjectMeta {
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        ..Default::default()
    };
    events::ref_of(key.kind, &meta)
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

/// One look at a freed lock's name: the object read by name (whole), and
/// its kind's reading of it (`Kind::look`).
async fn look(s: &Shared, key: &LockKey, old: &Holder) -> Result<Look, crate::Error> {
    let took = match key.kind {
        LockKind::ConfigMap => {
            let cms: Api<ConfigMap> = Api::namespaced(s.client.clone(), &key.namespace);
            let read = call(
                "reading the lock after it was freed",
                cms.get_opt(&key.name),
            );
            match read.await? {
                Some(cm) => taken(key, Object::ConfigMap(&cm), old, || {
                    New::ConfigMap(cm.clone())
                }),
                None => return Ok(Look::Waiting),
            }
        }
        LockKind::Lease => {
            let leases: Api<Lease> = Api::namespaced(s.client.clone(), &key.namespace);
            let read = call(
                "reading the lease after it was freed",
                leases.get_opt(&key.name),
            );
            match read.await? {
                Some(l) => taken(key, Object::Lease(&l), old, || New::Lease(l.clone())),
                None => return Ok(Look::Waiting),
            }
        }
    };
    Ok(took)
}

/// The look at a lock read by name, by its kind.
fn taken(key: &LockKey, o: Object<'_>, old: &Holder, new: impl FnOnce() -> New) -> Look {
    match kinds::of(o).look(Some(o), old) {
        Took::Waiting => Look::Waiting,
        Took::Done(why) => Look::Done(why),
        Took::Taken(t) => Look::Taken(Box::new(TakenBy {
            at: t.at,
            lock: events::ref_of(key.kind, o.meta()),
            holder: t.holder,
            new: t.carry.then(new),
        })),
    }
}

/// Follows one gone (or released) lock until a new holder takes it (a
/// takeover), or for `FOLLOW_FOR`. A lock the janitor freed is awaited:
/// `NoTakeover` once the timeout passes with nobody holding it, unless its
/// namespace or its holder's workload says nobody wants it any more.
async fn follow(
    s: Arc<Shared>,
    key: LockKey,
    old: Holder,
    since: Timestamp,
    why: Awaited,
    mut first: Option<Look>,
) {
    let mut f = Following::new(s, key, old, since, why);
    let started = Instant::now();
    let mut wait = FIRST_LOOK;
    let outcome = loop {
        if started.elapsed() >= FOLLOW_FOR {
            break "given up";
        }
        let look = match first.take() {
            Some(look) => Ok(look),
            None => f.look_after(&mut wait).await,
        };
        match look {
            Ok(Look::Waiting) => {
                if let Some(why) = f.still_waiting().await {
                    break why;
                }
            }
            Ok(Look::Done(why)) => break why,
            Ok(Look::Taken(t)) => {
                if f.taken(*t).await {
                    break "taken over";
                }
            }
            Err(e) => {
                debug!(namespace = %f.key.namespace, lock = %f.key.name, error = %e, "waiting for the takeover");
            }
        }
    };
    f.done(outcome);
}

/// One follower's state: the lock, the holder it was freed from and when,
/// the workload that wants a new holder (none: nothing is awaited, only the
/// label carried), and what it counted and said.
struct Following {
    s: Arc<Shared>,
    key: LockKey,
    old: Holder,
    since: Timestamp,
    workload: Option<Workload>,
    /// Born at 0 while awaited, so that increase() counts a first timeout;
    /// removed at the end unless one was counted.
    timeouts: Option<prometheus::IntCounter>,
    counted: bool,
    said: bool,
}

impl Following {
    fn new(s: Arc<Shared>, key: LockKey, old: Holder, since: Timestamp, why: Awaited) -> Self {
        let workload = match why {
            Awaited::Freed(w) => Some(w),
            Awaited::Gone => None,
        };
        let labels = [key.namespace.as_str(), key.name.as_str()];
        let timeouts = workload.is_some().then(|| {
            s.metrics
                .awaiting_takeover
                .with_label_values(&labels)
                .set(1);
            s.metrics.takeover_timeouts.with_label_values(&labels)
        });
        Following {
            s,
            key,
            old,
            since,
            workload,
            timeouts,
            counted: false,
            said: false,
        }
    }

    fn labels(&self) -> [&str; 2] {
        [self.key.namespace.as_str(), self.key.name.as_str()]
    }

    /// The next look, `wait` after the last (doubling).
    async fn look_after(&self, wait: &mut Duration) -> Result<Look, crate::Error> {
        tokio::time::sleep(*wait).await;
        // Past the timeout (NoTakeover said), a follower looks only every
        // few minutes: the young ones, whose takeover is due any second,
        // must not queue behind it for the budget.
        let longest = if seconds_since(self.since) >= self.s.timeout.as_secs_f64() {
            LONGEST_WAIT_LATE
        } else {
            LONGEST_WAIT
        };
        *wait = (*wait * 2).min(longest);
        self.s.limiter.until_ready().await;
        look(&self.s, &self.key, &self.old).await
    }

    /// Still nobody. Is anyone meant to take it? The reason to stop
    /// awaiting, if any; past the timeout, nobody took over (`NoTakeover`).
    async fn still_waiting(&mut self) -> Option<&'static str> {
        let (s, key, old) = (&self.s, &self.key, &self.old);
        s.limiter.until_ready().await;
        let wanted = workload::wanted(&s.client, &key.namespace, old, self.workload.as_mut());
        match wanted.await {
            workload::Wanted::Yes => {}
            workload::Wanted::NoNamespace(why) => {
                info!(namespace = %key.namespace, lock = %key.name, why,
                      "no takeover awaited any more: the namespace is going");
                return Some(why);
            }
            workload::Wanted::NoWorkload(why) if self.workload.is_some() => {
                self.workload = None;
                let labels = [key.namespace.as_str(), key.name.as_str()];
                let _ = s.metrics.awaiting_takeover.remove_label_values(&labels);
                if self.timeouts.as_ref().is_some_and(|t| t.get() == 0) {
                    let _ = s.metrics.takeover_timeouts.remove_label_values(&labels);
                }
                info!(namespace = %key.namespace, lock = %key.name, holder = %old.name, why,
                      "no takeover awaited any more: nobody wants the operator to run");
            }
            workload::Wanted::NoWorkload(_) => {}
        }
        let timeouts = self.timeouts.as_ref().filter(|_| self.workload.is_some())?;
        if !self.said && seconds_since(self.since) >= s.timeout.as_secs_f64() {
            if !self.counted {
                self.counted = true;
                timeouts.inc();
            }
            // A standby writes no Event: it tries again at its next look,
            // and says it once it leads.
            self.said = no_takeover(s, key, old, self.since).await;
        }
        None
    }

    /// A new holder leads: measured, logged, the label carried over to a
    /// lock made again, and said. False when the new lock was gone before
    /// its label was written: the next holder is awaited.
    async fn taken(&mut self, t: TakenBy) -> bool {
        let (s, key, old) = (&self.s, &self.key, &self.old);
        let TakenBy {
            at,
            lock: lock_ref,
            holder: new,
            new: made,
        } = t;
        let after = at
            .map(|c| {
                Duration::try_from(c.duration_since(self.since))
                    .unwrap_or_default()
                    .as_secs_f64()
            })
            .unwrap_or_else(|| seconds_since(self.since));
        s.metrics.takeover.observe(after);
        let _ = s
            .metrics
            .awaiting_takeover
            .remove_label_values(&self.labels());
        info!(namespace = %key.namespace, lock = %key.name, kind = %key.kind, holder = %new.holder.name,
              after_seconds = after, "takeover: a new holder leads");
        // The words of the kind the lock was freed as: a lock made again
        // was deleted; one taken in place was released.
        let freed = match &made {
            Some(New::ConfigMap(cm)) => kinds::of(Object::ConfigMap(cm)).words().freed,
            Some(New::Lease(l)) => kinds::of(Object::Lease(l)).words().freed,
            None => "released",
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
                carry::carry_label_over(s, &cms, key, cm, &new.holder.name).await
            }
            Some(New::Lease(lease)) => {
                let leases: Api<Lease> = Api::namespaced(s.client.clone(), &key.namespace);
                carry::carry_label_over(s, &leases, key, lease, &new.holder.name).await
            }
            None => false,
        };
        if gone {
            // Deleted again before its label was written (its holder died
            // too, or a restart's read was old by the time the janitor
            // led): the next holder's lock is awaited, and labeled.
            info!(namespace = %key.namespace, lock = %key.name,
                  "the new lock was gone before its label was written; awaiting the next holder");
            if self.workload.is_some() {
                s.metrics
                    .awaiting_takeover
                    .with_label_values(&self.labels())
                    .set(1);
            }
            return false;
        }
        // Said after the carry-over, which waits for the lead when it has a
        // label to carry: a replica that saw the takeover while the lead
        // was changing hands (a rolling upgrade) says it once it leads and
        // has labeled the lock, instead of losing it; one that found the
        // label carried by the leader says nothing (the leader did).
        s.events
            .publish(&lock_ref, Some(events::holder_ref(&new)), say)
            .await;
        true
    }

    /// The follower ends: its series go, unless a timeout was counted.
    fn done(&self, outcome: &str) {
        let labels = self.labels();
        let _ = self
            .s
            .metrics
            .awaiting_takeover
            .remove_label_values(&labels);
        if self.timeouts.as_ref().is_some_and(|t| t.get() == 0) {
            let _ = self
                .s
                .metrics
                .takeover_timeouts
                .remove_label_values(&labels);
        }
        debug!(namespace = %self.key.namespace, lock = %self.key.name, outcome, "no longer awaiting a takeover");
    }
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
        LockKind::Lease => ("taken Lease", "freed"),
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
