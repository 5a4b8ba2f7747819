//! What the janitor remembers about each watched lock between reconciles:
//! the owner-gone and first-seen-stale clocks, what was already reported,
//! the count of locks per state, and the lifecycle of per-lock metric series.
//! Nothing here decides anything; it is lost on restart by design (every
//! decision is made again from live reads).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::cadence::{Cadence, Renewals};
use crate::lock::{Holder, Lock, LockKey, LockKind};
use crate::metrics::Metrics;
use crate::observe::HolderClock;
use crate::verdict::{LockState, StaleReason};

/// Kept for each watched lock, so it is small (10,000 locks in the
/// memory budget): what most locks never need is in `Rare`.
#[derive(Debug, Default)]
struct Memo {
    /// The state of the last verdict, counted in `lock_janitor_locks`.
    last_state: Option<LockState>,
    /// That judgement holds until something changes: the lock (a new
    /// resourceVersion), or its holder (a suspect from the pod watch or a
    /// sweep). Stale locks, a running owner-gone grace and an owner in
    /// another namespace are never settled.
    settled: bool,
    /// The pod watch or a sweep says the holder changed.
    suspect: bool,
    /// The terminal-pod watch says the holder died (first notice for that
    /// holder): the reads of the next judgement skip the idle budget.
    urgent: bool,
    /// `judged_rv` was read live and was lock-shaped (no data): a
    /// judgement of that same version needs no read of the lock.
    shaped: bool,
    /// A DELETE guarded by `judged_rv` was refused (409): the lock changed
    /// since, and no table of an older snapshot may mark that version
    /// again (`learned_empty`); the next version clears it (a re-list does
    /// not: the next judgement reads the lock live either way).
    refused: bool,
    /// Reconciles that failed in a row (for the per-lock backoff).
    failures: u32,
    /// The holder last judged, so that the takeover follower knows whose
    /// lock it was.
    holder: Option<Holder>,
    /// The resourceVersion of the lock last judged (live, or by a sweep).
    judged_rv: Option<Box<str>>,
    rare: Option<Box<Rare>>,
}

/// What only a lock whose holder went missing or died, or that was
/// reported, needs remembered.
#[derive(Debug, Default)]
struct Rare {
    /// (holder uid, first seen missing, wall time then): the start of the
    /// owner-gone grace, on the monotonic clock so that a clock step never
    /// shortens it.
    missing_since: Option<(String, Instant, Timestamp)>,
    /// (holder uid, first seen terminal): the death time when the pod does
    /// not say when its containers finished.
    stale_since: Option<(String, Timestamp)>,
    /// (resourceVersion, Event reason) last reported, so that a condition is
    /// announced once per version of the lock, not once per resync.
    reported: Option<(String, &'static str)>,
    /// A hash of the holder uid whose death was last noticed: its reads
    /// skip the budget once.
    died: Option<u64>,
    /// That death's Lease renewal window, as its urgent judgement found it.
    window: Window,
}

/// The end of a dead holder's Lease renewal window, once per death: the
/// first judgement from then on is urgent too (the death made its reads
/// necessary; the window only delays them). Judgements before it (a sweep,
/// a Lease event) are not, and do not spend it.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Window {
    #[default]
    Unseen,
    EndsAt(Instant),
    Spent,
}

impl Memo {
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Frees `rare` once it holds nothing.
    fn tidy(&mut self) {
        if self.rare.as_ref().is_some_and(|r| {
            r.missing_since.is_none()
                && r.stale_since.is_none()
                && r.reported.is_none()
                && r.died.is_none()
        }) {
            self.rare = None;
        }
    }
}

#[derive(Default)]
struct Inner {
    memos: HashMap<LockKey, Memo>,
    /// The renew history of each watched Lease (Leases only).
    cadences: HashMap<LockKey, Cadence>,
    /// Locks per state, kept as states change (never recounted).
    counts: HashMap<(LockKind, LockState), i64>,
}

/// Per-lock memory; one per janitor, shared by every scope.
pub struct Memory {
    metrics: Metrics,
    inner: Mutex<Inner>,
}

/// What a reclaim left of a stale lock (see `Memory::record_reclaim`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Left {
    /// Still stale, not freed.
    Stale,
    /// Freed by someone else.
    Gone,
    /// Freed by this janitor.
    Reclaimed {
        latency: Option<std::time::Duration>,
    },
    /// Nothing to record (not the leader; changed, judged again).
    Unchanged,
}

impl Memory {
    pub fn new(metrics: Metrics) -> Self {
        Memory {
            metrics,
            inner: Mutex::default(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut inner)
    }

    fn with_memo<T>(&self, key: &LockKey, f: impl FnOnce(&mut Memo) -> T) -> T {
        self.with(|i| {
            // Found without cloning the key, which most calls need not.
            if let Some(memo) = i.memos.get_mut(key) {
                let out = f(memo);
                memo.tidy();
                return out;
            }
            let memo = i.memos.entry(key.clone()).or_default();
            let out = f(memo);
            memo.tidy();
            out
        })
    }

    /// The owner-gone and stale clocks of one lock.
    pub fn clock<'a>(&'a self, key: &'a LockKey) -> MemoryClock<'a> {
        MemoryClock { memory: self, key }
    }

    /// Remembers whose lock this is (for the takeover follower).
    pub fn set_holder(&self, key: &LockKey, holder: &Holder) {
        self.with_memo(key, |m| {
            if m.holder.as_ref() != Some(holder) {
                m.holder = Some(holder.clone());
            }
        });
    }

    /// Records the state of a lock's verdict and updates `lock_janitor_locks`.
    pub fn set_state(&self, key: &LockKey, state: LockState) {
        let metrics = &self.metrics;
        self.with(|i| {
            let memo = i.memos.entry(key.clone()).or_default();
            let before = memo.last_state.replace(state);
            if before != Some(state) {
                if let Some(b) = before {
                    *i.counts.entry((key.kind, b)).or_default() -= 1;
                }
                *i.counts.entry((key.kind, state)).or_default() += 1;
                metrics.set_lock_counts(i.counts.iter().map(|(s, n)| (*s, *n)));
            }
        });
    }

    /// Marks a lock stale-but-not-reclaimed, unless it was forgotten
    /// meanwhile (deleted under a reclaim that then failed or timed out).
    pub fn mark_stale(&self, key: &LockKey, reason: StaleReason) {
        self.with(|i| {
            if i.memos.contains_key(key) {
                self.metrics.set_stale(key, Some(reason));
            }
        });
    }

    /// The lock is not stale-and-unreclaimed (any more).
    pub fn clear_stale(&self, key: &LockKey) {
        self.metrics.set_stale(key, None);
    }

    /// What a reclaim left: the lock still stale and not freed (a dry run,
    /// finalizers, a failed write), someone else's deletion, or freed by
    /// this janitor (counted, with its latency when the death's time is
    /// known). Memory and metrics from the one value.
    pub fn record_reclaim(&self, key: &LockKey, reason: StaleReason, left: Left) {
        match left {
            Left::Stale => self.mark_stale(key, reason),
            Left::Gone => self.clear_stale(key),
            Left::Reclaimed { latency } => {
                self.clear_stale(key);
                self.metrics.reclaimed(key, reason);
                if let Some(l) = latency {
                    self.metrics.reclaim_latency.observe(l.as_secs_f64());
                }
            }
            Left::Unchanged => {}
        }
    }

    /// Whether `reason` was already reported for this version of the lock.
    pub fn was_reported(&self, key: &LockKey, resource_version: &str, reason: &str) -> bool {
        self.with_memo(key, |m| {
            m.rare
                .as_ref()
                .and_then(|r| r.reported.as_ref())
                .is_some_and(|(rv, r)| rv == resource_version && *r == reason)
        })
    }

    pub fn set_reported(&self, key: &LockKey, resource_version: &str, reason: &'static str) {
        self.with_memo(key, |m| {
            m.rare().reported = Some((resource_version.to_owned(), reason))
        });
    }

    /// Whether a reconcile must judge this lock from live reads: it is new,
    /// it changed since it was judged, its holder is suspect, or its last
    /// verdict does not settle it. Otherwise the last judgement stands and
    /// nothing is read.
    pub fn needs_judging(&self, key: &LockKey, resource_version: &str) -> bool {
        self.with(|i| match i.memos.get(key) {
            Some(m) => !m.settled || m.suspect || m.judged_rv.as_deref() != Some(resource_version),
            None => true,
        })
    }

    /// Records what was judged: the lock's version and whether it settles.
    /// A suspect raised while it was judged stays raised.
    pub fn judged(&self, key: &LockKey, resource_version: &str, settled: bool) {
        self.with(|i| {
            if let Some(m) = i.memos.get_mut(key) {
                if m.judged_rv.as_deref() != Some(resource_version) {
                    m.judged_rv = Some(resource_version.into());
                    // Known only for a version read live (set_shaped).
                    m.shaped = false;
                    m.refused = false;
                }
                m.settled = settled;
            }
        });
    }

    /// The terminal-pod watch says the holder `uid` of this lock died: its
    /// next judgement is urgent, once per lock and holder.
    pub fn died(&self, key: &LockKey, uid: &str) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        uid.hash(&mut h);
        let uid = h.finish();
        self.with_memo(key, |m| {
            let r = m.rare();
            if r.died != Some(uid) {
                r.died = Some(uid);
                r.window = Window::Unseen;
                m.urgent = true;
            }
        });
    }

    /// An urgent judgement (one that followed a death) found the Lease's
    /// renewal window open for `remaining`: the first judgement once it
    /// has passed is urgent too, once per death.
    pub fn urgent_after_window(&self, key: &LockKey, remaining: Duration) {
        self.with_memo(key, |m| {
            if let Some(r) = m.rare.as_mut().filter(|r| r.died.is_some()) {
                if r.window == Window::Unseen {
                    r.window = Window::EndsAt(Instant::now() + remaining);
                }
            }
        });
    }

    /// Whether this judgement follows a death notice (and clears it).
    pub fn take_urgent(&self, key: &LockKey) -> bool {
        self.with(|i| {
            i.memos.get_mut(key).is_some_and(|m| {
                if std::mem::take(&mut m.urgent) {
                    return true;
                }
                let Some(r) = m.rare.as_mut() else {
                    return false;
                };
                match r.window {
                    Window::EndsAt(at) if Instant::now() >= at => {
                        r.window = Window::Spent;
                        true
                    }
                    _ => false,
                }
            })
        })
    }

    /// Whether `resource_version` of this lock was read live and held no
    /// data (see `Memo::shaped`).
    pub fn known_shaped(&self, key: &LockKey, resource_version: &str) -> bool {
        self.with(|i| {
            i.memos
                .get(key)
                .is_some_and(|m| m.shaped && m.judged_rv.as_deref() == Some(resource_version))
        })
    }

    /// Records whether the version just judged was read live lock-shaped.
    pub fn set_shaped(&self, key: &LockKey, shaped: bool) {
        self.with(|i| {
            if let Some(m) = i.memos.get_mut(key) {
                m.shaped = shaped;
            }
        });
    }

    /// A write guarded by the version last judged was refused (409): that
    /// version is known no more, and its next judgement reads the lock live
    /// (a 409 is never retried blindly; a Lease's window end, if still to
    /// come, makes no judgement urgent any more).
    pub fn refused(&self, key: &LockKey) {
        self.with(|i| {
            if let Some(m) = i.memos.get_mut(key) {
                m.shaped = false;
                m.refused = true;
                if let Some(r) = m.rare.as_mut() {
                    if matches!(r.window, Window::EndsAt(_)) {
                        r.window = Window::Spent;
                    }
                }
            }
        });
    }

    /// The API server's table of ConfigMaps says `resource_version` of this
    /// lock holds no data (`shapes`): when that is the version last judged,
    /// and no write guarded by it was refused (a table page of an older
    /// snapshot may list it after the 409), its next judgement needs no
    /// read of the lock, as after a live read (`set_shaped`). True if marked.
    pub fn learned_empty(&self, key: &LockKey, resource_version: &str) -> bool {
        self.with(|i| match i.memos.get_mut(key) {
            Some(m) if !m.refused && m.judged_rv.as_deref() == Some(resource_version) => {
                m.shaped = true;
                true
            }
            _ => false,
        })
    }

    /// The holder of a lock may have changed: judge it from live reads next
    /// time. Remembered even for a lock not judged yet, so that a first
    /// sweep never settles it.
    pub fn suspect(&self, key: &LockKey) {
        self.with_memo(key, |m| m.suspect = true);
    }

    /// A live judgement starts: clears the suspect flag (a failed one sets
    /// it again in `error_policy`).
    pub fn take_suspect(&self, key: &LockKey) {
        self.with(|i| {
            if let Some(m) = i.memos.get_mut(key) {
                m.suspect = false;
            }
        });
    }

    /// A sweep found nothing against a lock the janitor has not judged yet
    /// (its holder exists under its uid and is not terminal): held, settled,
    /// without a read of its own. A lock already remembered is left alone.
    pub fn seed_held(&self, key: &LockKey, resource_version: &str, holder: &Holder) {
        let new = self.with(|i| !i.memos.contains_key(key));
        if new {
            self.set_state(key, LockState::Held);
            self.set_holder(key, holder);
            self.judged(key, resource_version, true);
        }
    }

    /// Counts a failed reconcile; returns how many failed in a row.
    pub fn failed(&self, key: &LockKey) -> u32 {
        self.with_memo(key, |m| {
            m.failures = m.failures.saturating_add(1);
            m.failures
        })
    }

    /// A reconcile went through: the backoff starts over.
    pub fn succeeded(&self, key: &LockKey) {
        self.with(|i| {
            if let Some(m) = i.memos.get_mut(key) {
                m.failures = 0;
            }
        });
    }

    /// Takes in a Lease as watched or read live now; what was seen of its
    /// renewals so far.
    pub fn saw_lease(
        &self,
        key: &LockKey,
        lease: &k8s_openapi::api::coordination::v1::Lease,
    ) -> Renewals {
        let now = Instant::now();
        self.with(|i| match i.cadences.get_mut(key) {
            Some(c) => {
                c.observe(lease, now);
                c.renewals(now)
            }
            None => {
                let c = Cadence::new(lease, now);
                let seen = c.renewals(now);
                i.cadences.insert(key.clone(), c);
                seen
            }
        })
    }

    /// Forgets a lock that no longer exists (or no longer carries the opt-in
    /// label) and its series; returns the holder last judged.
    pub fn forget(&self, key: &LockKey) -> Option<Holder> {
        let memo = self.with(|i| {
            i.cadences.remove(key);
            let memo = i.memos.remove(key)?;
            if let Some(s) = memo.last_state {
                *i.counts.entry((key.kind, s)).or_default() -= 1;
                self.metrics
                    .set_lock_counts(i.counts.iter().map(|(s, n)| (*s, *n)));
            }
            Some(memo)
        });
        self.metrics.set_stale(key, None);
        memo.and_then(|m| m.holder)
    }

    /// The locks of a kind remembered in a namespace (all of them for `None`).
    pub fn keys_in(&self, namespace: Option<&str>, kind: LockKind) -> Vec<LockKey> {
        self.with(|i| {
            i.memos
                .keys()
                .filter(|k| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
                .cloned()
                .collect()
        })
    }
}

/// The clocks of one remembered lock.
pub struct MemoryClock<'a> {
    memory: &'a Memory,
    key: &'a LockKey,
}

impl HolderClock for MemoryClock<'_> {
    fn holder_present(&self, _lock: &Lock) {
        self.memory.with_memo(self.key, |m| {
            if let Some(r) = m.rare.as_mut() {
                r.missing_since = None;
            }
        });
    }

    fn holder_missing(&self, lock: &Lock, now: Timestamp) -> (Timestamp, Duration) {
        self.memory.with_memo(self.key, |m| {
            let r = m.rare();
            let (since, at) = match &r.missing_since {
                Some((u, since, at)) if *u == lock.holder.uid => (*since, *at),
                _ => {
                    let first = (Instant::now(), now);
                    r.missing_since = Some((lock.holder.uid.clone(), first.0, first.1));
                    first
                }
            };
            (at, since.elapsed())
        })
    }

    fn lease_renewals(&self, lease: &k8s_openapi::api::coordination::v1::Lease) -> Renewals {
        self.memory.saw_lease(self.key, lease)
    }

    fn stale_since(&self, lock: &Lock, now: Timestamp) -> Timestamp {
        self.memory.with_memo(self.key, |m| {
            let r = m.rare();
            match &r.stale_since {
                Some((u, t)) if *u == lock.holder.uid => *t,
                _ => {
                    r.stale_since = Some((lock.holder.uid.clone(), now));
                    now
                }
            }
        })
    }
}

#[cfg(test)]
mod tests;
