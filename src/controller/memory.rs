//! Where each watched lock's `State` is kept between reconciles: a
//! reconcile takes it once and puts the next one back once, and the counts
//! of `lock_janitor_locks` and the series of `lock_janitor_stale_locks`
//! follow from that put. Two things reach a lock from outside its
//! reconcile: a suspect (the pod watch or a sweep says its holder may have
//! changed) and a Lease's renewals as its watch delivers them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::cadence::Cadence;
use crate::decide::{Phase, State};
use crate::lock::{Holder, Lock, LockKey, LockKind, Renewal};
use crate::metrics::Metrics;
use crate::observe::HolderClock;
use crate::verdict::{LockState, Renewals};

#[derive(Debug, Default)]
struct Entry {
    state: State,
    /// The pod watch or a sweep says the holder may have changed: the next
    /// reconcile judges from live reads whatever the state says.
    suspect: bool,
    /// The renewals seen of a Lease (Leases only).
    cadence: Option<Box<Cadence>>,
}

#[derive(Default)]
struct Inner {
    locks: HashMap<LockKey, Entry>,
    /// Locks per state, kept as states change (never recounted).
    counts: HashMap<(LockKind, LockState), i64>,
}

/// Every watched lock's state; one per janitor, shared by every scope.
pub struct Memory {
    metrics: Metrics,
    inner: Mutex<Inner>,
}

impl Memory {
    pub fn new(metrics: Metrics) -> Self {
        Memory {
            metrics,
            inner: Mutex::default(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut crate::locked(&self.inner))
    }

    /// How many locks are remembered (the per-lock state a soak run
    /// watches for growth; logged with each resync sweep).
    pub fn remembered(&self) -> usize {
        self.with(|i| i.locks.len())
    }

    /// A reconcile of `version` starts: the lock's state, unless its last
    /// judgement stands (settled at this version, not suspect). The
    /// suspect is cleared (one raised from now on stays raised), and the
    /// holder the cached copy names is kept before any read can fail:
    /// whose lock to follow if it goes.
    pub fn take(&self, key: &LockKey, version: &str, cached: Option<Holder>) -> Option<State> {
        self.with(|i| {
            let e = i.locks.entry(key.clone()).or_default();
            if !e.suspect && !e.state.needs_judging(version) {
                return None;
            }
            e.suspect = false;
            if cached.is_some() {
                e.state.holder = cached;
            }
            Some(e.state.clone())
        })
    }

    /// The state a reconcile ends with, and its metrics. Dropped if the lock
    /// was forgotten meanwhile. Whether it stands (no suspect raised while
    /// it was judged).
    pub fn put(&self, key: &LockKey, state: State) -> bool {
        self.with(|i| {
            let Some(e) = i.locks.get_mut(key) else {
                return false;
            };
            let (before, after) = (e.state.phase, state.phase);
            e.state = state;
            let stands = !e.suspect;
            if before.state() != after.state() {
                count(i, key.kind, before.state(), after.state(), &self.metrics);
            }
            if before != after {
                self.metrics.set_stale(key, stale_reason(after));
            }
            stands
        })
    }

    /// The holder of a lock may have changed: judged from live reads next
    /// time. Kept even for a lock not judged yet, so that the first sweep
    /// never settles it.
    pub fn suspect(&self, key: &LockKey) {
        self.with(|i| i.locks.entry(key.clone()).or_default().suspect = true);
    }

    /// A reconcile failed: how many in a row; judged from live reads after
    /// its backoff.
    pub fn failed(&self, key: &LockKey) -> u32 {
        self.with(|i| {
            let e = i.locks.entry(key.clone()).or_default();
            e.suspect = true;
            e.state.failures = e.state.failures.saturating_add(1);
            e.state.failures
        })
    }

    /// Whose lock it was, as its watch last saw it (a deleted lock's).
    pub fn set_holder(&self, key: &LockKey, holder: &Holder) {
        self.with(|i| {
            if let Some(e) = i.locks.get_mut(key) {
                e.state.holder = Some(holder.clone());
            }
        });
    }

    /// Whether a reconcile of `version` would judge (see `take`); for the
    /// filters that keep settled locks from the Controller's queue.
    pub fn needs_judging(&self, key: &LockKey, version: &str) -> bool {
        self.with(|i| {
            i.locks
                .get(key)
                .is_none_or(|e| e.suspect || e.state.needs_judging(version))
        })
    }

    /// A sweep found nothing against a lock not judged yet (its holder is
    /// there under its uid, not terminal): held and settled without a read.
    pub fn seed_held(&self, key: &LockKey, version: &str, holder: &Holder) {
        self.with(|i| {
            if i.locks.contains_key(key) {
                return;
            }
            let state = State {
                phase: Phase::Settled(LockState::Held),
                version: Some(version.into()),
                holder: Some(holder.clone()),
                ..State::default()
            };
            i.locks.insert(
                key.clone(),
                Entry {
                    state,
                    ..Entry::default()
                },
            );
            count(i, key.kind, None, Some(LockState::Held), &self.metrics);
        });
    }

    /// Takes in a renewed lock's renewal as watched or read live now; what
    /// was seen of its renewals so far.
    pub fn saw_renewal(&self, key: &LockKey, renewal: Renewal) -> Renewals {
        let now = Instant::now();
        self.with(|i| {
            let e = i.locks.entry(key.clone()).or_default();
            match &mut e.cadence {
                Some(c) => c.observe(renewal, now),
                None => e.cadence = Some(Box::new(Cadence::new(renewal, now))),
            }
            e.cadence
                .as_ref()
                .map(|c| c.renewals(now))
                .unwrap_or_default()
        })
    }

    /// Forgets a lock that no longer exists (or no longer carries the opt-in
    /// label), and its series; the holder last seen.
    pub fn forget(&self, key: &LockKey) -> Option<Holder> {
        let e = self.with(|i| {
            let e = i.locks.remove(key)?;
            count(i, key.kind, e.state.phase.state(), None, &self.metrics);
            Some(e)
        });
        self.metrics.set_stale(key, None);
        e.and_then(|e| e.state.holder)
    }

    /// The locks of a kind kept in a namespace (all of them for `None`).
    pub fn keys_in(&self, namespace: Option<&str>, kind: LockKind) -> Vec<LockKey> {
        self.with(|i| {
            i.locks
                .keys()
                .filter(|k| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
                .cloned()
                .collect()
        })
    }

    /// The clocks a judgement of this lock runs on: its `state`'s, and the
    /// Lease renewals kept here.
    pub fn clock<'a>(&'a self, key: &'a LockKey, state: &'a mut State) -> Clock<'a> {
        Clock {
            memory: self,
            key,
            state,
        }
    }
}

fn stale_reason(p: Phase) -> Option<crate::verdict::StaleReason> {
    match p {
        Phase::Stale(r) => Some(r),
        _ => None,
    }
}

fn count(
    i: &mut Inner,
    kind: LockKind,
    before: Option<LockState>,
    after: Option<LockState>,
    metrics: &Metrics,
) {
    if let Some(b) = before {
        *i.counts.entry((kind, b)).or_default() -= 1;
    }
    if let Some(a) = after {
        *i.counts.entry((kind, a)).or_default() += 1;
    }
    metrics.set_lock_counts(i.counts.iter().map(|(s, n)| (*s, *n)));
}

/// The clocks of one lock's judgement: its state's (`State::holder_missing`,
/// `State::stale_since`), and the Lease renewals kept here.
pub struct Clock<'a> {
    memory: &'a Memory,
    key: &'a LockKey,
    state: &'a mut State,
}

impl HolderClock for Clock<'_> {
    fn holder_present(&mut self, _lock: &Lock) {
        self.state.holder_present();
    }

    fn holder_missing(&mut self, lock: &Lock, now: Timestamp) -> (Timestamp, Duration) {
        self.state
            .holder_missing(&lock.holder.uid, Instant::now(), now)
    }

    fn renewals(&mut self, renewal: Renewal) -> Renewals {
        self.memory.saw_renewal(self.key, renewal)
    }

    fn stale_since(&mut self, lock: &Lock, now: Timestamp) -> Timestamp {
        self.state.stale_since(&lock.holder.uid, now)
    }
}

#[cfg(test)]
mod tests;
