//! What one reconcile decides, pure: from a lock's remembered state and its
//! verdict, what to write (nothing, a report, or the guarded write that
//! frees it); from what the write did, the lock's next state and when to
//! judge it again. No I/O and no clock of its own: table-tested below, as
//! the verdict is.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::events::{REASON_AMBIGUOUS, REASON_UNMANAGEABLE};
use crate::lock::{Holder, Unmanageable};
use crate::verdict::{HeldBecause, LockState, StaleReason, Verdict};

/// How soon a lock that changed under the write (409) is judged again.
pub const REJUDGE_AFTER: Duration = Duration::from_millis(500);
/// A grace or a renewal window is judged again this long after its
/// remaining time (the timer's rounding): a judgement made a moment early
/// finds the wait not over and waits again.
pub const PAST_THE_WAIT: Duration = Duration::from_millis(20);

/// Where a lock stands between two reconciles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// Not judged yet.
    #[default]
    New,
    /// Judged, and that judgement stands until the lock (a new version) or
    /// its holder (a suspect from the pod watch or a sweep) changes: no
    /// timer is kept.
    Settled(LockState),
    /// Judged again on a timer: a grace or renewal window running, an
    /// expired Lease, a lock the write found changed, a standby's stale
    /// lock, a report not written yet.
    Due(LockState),
    /// Stale and not freed by this janitor (a dry run, finalizers, a failed
    /// write): counted in `lock_janitor_stale_locks`.
    Stale(StaleReason),
}

impl Phase {
    /// The state counted in `lock_janitor_locks`.
    pub fn state(self) -> Option<LockState> {
        match self {
            Phase::New => None,
            Phase::Settled(s) | Phase::Due(s) => Some(s),
            Phase::Stale(_) => Some(LockState::Stale),
        }
    }
}

/// What the janitor remembers of one lock between reconciles. Lost on
/// restart by design: every decision is made again from live reads.
#[derive(Clone, Debug, Default)]
pub struct State {
    pub phase: Phase,
    /// The lock's version as last judged (`Watched::version`).
    pub version: Option<Box<str>>,
    /// Whose lock it was when last seen: whom a takeover follows.
    pub holder: Option<Holder>,
    /// Reconciles that failed in a row (the per-lock backoff).
    pub failures: u32,
    /// What only a lock whose holder went missing or died, or that was
    /// reported, needs (most locks never do: 10,000 locks are kept).
    pub rare: Option<Box<Rare>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rare {
    /// (holder uid, first seen missing, wall time then): the start of the
    /// owner-gone grace, on the monotonic clock so that a clock step never
    /// shortens it.
    pub missing_since: Option<(String, Instant, Timestamp)>,
    /// (holder uid, first seen terminal): the death time when the pod does
    /// not say when its containers finished.
    pub stale_since: Option<(String, Timestamp)>,
    /// (version, Event reason) last reported: a condition is announced once
    /// per version of the lock, not once per resync.
    pub reported: Option<(String, &'static str)>,
}

impl State {
    /// Whether a judgement of `version` must be made from live reads: the
    /// last one does not stand, or was of another version.
    pub fn needs_judging(&self, version: &str) -> bool {
        !matches!(self.phase, Phase::Settled(_)) || self.version.as_deref() != Some(version)
    }

    /// Whether `reason` was already reported for `version`.
    pub fn reported(&self, version: &str, reason: &str) -> bool {
        self.rare
            .as_ref()
            .and_then(|r| r.reported.as_ref())
            .is_some_and(|(v, r)| v == version && *r == reason)
    }

    pub fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    /// Frees `rare` once it holds nothing.
    pub fn tidy(&mut self) {
        if self.rare.as_deref().is_some_and(|r| *r == Rare::default()) {
            self.rare = None;
        }
    }

    /// The holder was found: its missing clock stops.
    pub fn holder_present(&mut self) {
        if let Some(r) = self.rare.as_mut() {
            r.missing_since = None;
        }
        self.tidy();
    }

    /// The holder of `uid` is missing, seen so at `at` (monotonic) and `now`
    /// (wall clock): since when (wall clock) and for how long (monotonic),
    /// from the first time this holder was seen missing. Another holder's
    /// clock starts again.
    pub fn holder_missing(
        &mut self,
        uid: &str,
        at: Instant,
        now: Timestamp,
    ) -> (Timestamp, Duration) {
        let r = self.rare();
        let (first, since) = match &r.missing_since {
            Some((u, first, since)) if u == uid => (*first, *since),
            _ => {
                r.missing_since = Some((uid.to_owned(), at, now));
                (at, now)
            }
        };
        (since, at.saturating_duration_since(first))
    }

    /// The first time the holder of `uid` was seen dead without a container
    /// finish time (`now` if this is it).
    pub fn stale_since(&mut self, uid: &str, now: Timestamp) -> Timestamp {
        let r = self.rare();
        match &r.stale_since {
            Some((u, t)) if u == uid => *t,
            _ => {
                r.stale_since = Some((uid.to_owned(), now));
                now
            }
        }
    }
}

/// What a reconcile writes for a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// The Event of a lock the janitor never touches (once per version).
    Report(&'static str),
    /// The guarded write that frees a stale lock.
    Reclaim,
}

/// The write a verdict calls for, given what was already reported.
pub fn step(verdict: &Verdict, state: &State, version: &str) -> Step {
    match untouchable(verdict) {
        Some(reason) if state.reported(version, reason) => Step::Nothing,
        Some(reason) => Step::Report(reason),
        None if matches!(verdict, Verdict::Stale { .. }) => Step::Reclaim,
        None => Step::Nothing,
    }
}

fn untouchable(verdict: &Verdict) -> Option<&'static str> {
    match verdict {
        Verdict::Ambiguous { .. } | Verdict::AmbiguousHolders(_) => Some(REASON_AMBIGUOUS),
        Verdict::Unmanageable(_) => Some(REASON_UNMANAGEABLE),
        _ => None,
    }
}

/// What the guarded write of a stale lock did: one value for every kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Freed {
    /// Freed at this time (the ConfigMap deleted, the Lease released).
    Reclaimed { at: Timestamp },
    /// Someone else deleted it first (404).
    Gone,
    /// It changed since it was judged (409): judged again from live reads.
    Changed(String),
    /// Being deleted, but these finalizers keep it.
    Blocked(Vec<String>),
    /// `--dry-run`: nothing written.
    DryRun,
    /// This replica does not lead: nothing written.
    NotLeader,
    /// The write failed (the error is the reconcile's).
    Failed,
}

/// What a reconcile wrote: the guarded write's answer (for a stale lock),
/// and the Event reason reported once per version, if one was written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Done {
    pub freed: Option<Freed>,
    pub said: Option<&'static str>,
}

/// The judgement `after` decides from.
pub struct Judged<'a> {
    pub verdict: &'a Verdict,
    /// The version judged.
    pub version: &'a str,
    pub holder: Option<&'a Holder>,
    /// A Lease whose holder matched by `spec.hostname` only: no terminal-pod
    /// event names it (they name pods), so it is judged each resync.
    pub by_hostname: bool,
}

/// When to judge a lock again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// When the lock or its holder changes (no timer).
    OnChange,
    /// Within the resync period.
    Resync,
    After(Duration),
    /// A stale lock a standby could not free: when this replica takes the
    /// lead (taking it judges every lock that is not settled), else within
    /// the resync period. Never a timer of its own: a standby's judgements
    /// read outside the API budget.
    OnLead,
    /// Freed: forget it and await a takeover.
    Forget,
}

/// The lock's next state and when to judge it again, from its state, the
/// judgement and what the write did. `resync` bounds every wait.
pub fn after(mut state: State, j: &Judged, done: &Done, resync: Duration) -> (State, Next) {
    state.failures = 0;
    state.version = Some(j.version.into());
    if let Some(h) = j.holder {
        state.holder = Some(h.clone());
    }
    if let Some(reason) = done.said {
        state.rare().reported = Some((j.version.to_owned(), reason));
    }
    let s = j.verdict.state();
    let wait =
        |remaining: Duration| Next::After(remaining.saturating_add(PAST_THE_WAIT).min(resync));
    let (phase, next) = match j.verdict {
        Verdict::Stale { reason, .. } => match &done.freed {
            Some(Freed::Reclaimed { .. } | Freed::Gone) => (Phase::Due(s), Next::Forget),
            Some(Freed::Changed(_)) => (Phase::Due(s), Next::After(REJUDGE_AFTER)),
            Some(Freed::DryRun | Freed::Blocked(_) | Freed::Failed) => {
                (Phase::Stale(*reason), Next::Resync)
            }
            Some(Freed::NotLeader) | None => (Phase::Due(s), Next::OnLead),
        },
        Verdict::Held(HeldBecause::OwnerGoneGrace { remaining })
        | Verdict::Held(HeldBecause::RenewalWindow { remaining }) => {
            (Phase::Due(s), wait(*remaining))
        }
        Verdict::Held(HeldBecause::Expired)
        | Verdict::Unmanageable(Unmanageable::OwnerInOtherNamespace(_)) => {
            (Phase::Due(s), Next::Resync)
        }
        Verdict::Held(_) if j.by_hostname => (Phase::Due(s), Next::Resync),
        Verdict::Held(_) => (Phase::Settled(s), Next::OnChange),
        // Settled only once its Event is written (a standby writes none).
        v => match untouchable(v) {
            Some(reason) if state.reported(j.version, reason) => {
                (Phase::Settled(s), Next::OnChange)
            }
            _ => (Phase::Due(s), Next::Resync),
        },
    };
    state.phase = phase;
    state.tidy();
    (state, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESYNC: Duration = Duration::from_secs(300);

    fn stale() -> Verdict {
        Verdict::Stale {
            reason: StaleReason::Evicted,
            died_at: None,
        }
    }

    fn judged<'a>(verdict: &'a Verdict, version: &'a str) -> Judged<'a> {
        Judged {
            verdict,
            version,
            holder: None,
            by_hostname: false,
        }
    }

    fn freed(f: Freed) -> Done {
        Done {
            freed: Some(f),
            said: None,
        }
    }

    #[test]
    fn a_stale_lock_is_reclaimed_and_the_answer_says_what_follows() {
        let v = stale();
        assert_eq!(step(&v, &State::default(), "7"), Step::Reclaim);
        let at = Timestamp::now();
        let table = [
            (
                Freed::Reclaimed { at },
                Phase::Due(LockState::Stale),
                Next::Forget,
            ),
            (Freed::Gone, Phase::Due(LockState::Stale), Next::Forget),
            (
                Freed::Changed("409".into()),
                Phase::Due(LockState::Stale),
                Next::After(REJUDGE_AFTER),
            ),
            (
                Freed::DryRun,
                Phase::Stale(StaleReason::Evicted),
                Next::Resync,
            ),
            (
                Freed::Blocked(vec!["x/y".into()]),
                Phase::Stale(StaleReason::Evicted),
                Next::Resync,
            ),
            (
                Freed::Failed,
                Phase::Stale(StaleReason::Evicted),
                Next::Resync,
            ),
            (Freed::NotLeader, Phase::Due(LockState::Stale), Next::OnLead),
        ];
        for (f, phase, next) in table {
            let (s, n) = after(
                State::default(),
                &judged(&v, "7"),
                &freed(f.clone()),
                RESYNC,
            );
            assert_eq!((s.phase, n), (phase, next), "{f:?}");
            assert!(s.needs_judging("7"), "a stale lock never settles: {f:?}");
        }
    }

    #[test]
    fn a_held_lock_settles_unless_a_timer_or_a_hostname_keeps_it_due() {
        let held = Verdict::Held(HeldBecause::Phase("Running".into()));
        assert_eq!(step(&held, &State::default(), "7"), Step::Nothing);
        let (s, n) = after(
            State::default(),
            &judged(&held, "7"),
            &Done::default(),
            RESYNC,
        );
        assert_eq!(
            (s.phase, n),
            (Phase::Settled(LockState::Held), Next::OnChange)
        );
        assert!(
            !s.needs_judging("7") && s.needs_judging("8"),
            "until the version changes"
        );

        let j = Judged {
            by_hostname: true,
            ..judged(&held, "7")
        };
        let (s, n) = after(State::default(), &j, &Done::default(), RESYNC);
        assert_eq!((s.phase, n), (Phase::Due(LockState::Held), Next::Resync));

        let grace = Verdict::Held(HeldBecause::OwnerGoneGrace {
            remaining: Duration::from_secs(3),
        });
        let (_, n) = after(
            State::default(),
            &judged(&grace, "7"),
            &Done::default(),
            RESYNC,
        );
        assert_eq!(n, Next::After(Duration::from_secs(3) + PAST_THE_WAIT));
        let (_, n) = after(
            State::default(),
            &judged(&grace, "7"),
            &Done::default(),
            Duration::from_secs(1),
        );
        assert_eq!(
            n,
            Next::After(Duration::from_secs(1)),
            "never past a resync"
        );
        for v in [
            Verdict::Held(HeldBecause::Expired),
            Verdict::Unmanageable(Unmanageable::OwnerInOtherNamespace("b".into())),
        ] {
            let (s, n) = after(State::default(), &judged(&v, "7"), &Done::default(), RESYNC);
            assert_eq!(n, Next::Resync, "{v:?}");
            assert!(matches!(s.phase, Phase::Due(_)));
        }
    }

    #[test]
    fn an_untouchable_lock_is_reported_once_per_version_and_settles_once_reported() {
        let v = Verdict::Ambiguous {
            other_uid: "u-2".into(),
        };
        let fresh = State::default();
        assert_eq!(step(&v, &fresh, "7"), Step::Report(REASON_AMBIGUOUS));
        // Not written (a standby, a failed Event): judged again each resync.
        let (s, n) = after(fresh.clone(), &judged(&v, "7"), &Done::default(), RESYNC);
        assert_eq!(
            (s.phase, n),
            (Phase::Due(LockState::Ambiguous), Next::Resync)
        );
        let said = Done {
            freed: None,
            said: Some(REASON_AMBIGUOUS),
        };
        let (s, n) = after(fresh, &judged(&v, "7"), &said, RESYNC);
        assert_eq!(
            (s.phase, n),
            (Phase::Settled(LockState::Ambiguous), Next::OnChange)
        );
        assert_eq!(step(&v, &s, "7"), Step::Nothing, "once per version");
        assert_eq!(step(&v, &s, "8"), Step::Report(REASON_AMBIGUOUS));
        let u = Verdict::Unmanageable(Unmanageable::NoOwner);
        assert_eq!(
            step(&u, &s, "7"),
            Step::Report(REASON_UNMANAGEABLE),
            "and reason"
        );
    }

    #[test]
    fn the_next_state_keeps_the_holder_and_starts_the_backoff_over() {
        let held = Verdict::Held(HeldBecause::NoStatus);
        let holder = Holder {
            name: "op-0".into(),
            uid: "u".into(),
        };
        let before = State {
            failures: 4,
            holder: Some(holder.clone()),
            ..State::default()
        };
        let (s, _) = after(before, &judged(&held, "7"), &Done::default(), RESYNC);
        assert_eq!((s.failures, s.holder.as_ref()), (0, Some(&holder)));
        assert!(s.rare.is_none(), "nothing rare kept");
        let new = Holder {
            name: "op-1".into(),
            uid: "v".into(),
        };
        let j = Judged {
            holder: Some(&new),
            ..judged(&held, "8")
        };
        let (s, _) = after(s, &j, &Done::default(), RESYNC);
        assert_eq!(s.holder, Some(new));
        assert_eq!(s.version.as_deref(), Some("8"));
    }

    /// The owner-gone grace runs on the monotonic clock from the first time
    /// this holder was seen missing; it stops when the holder is found and
    /// starts again for another holder. A death time is the first one seen
    /// for that holder.
    #[test]
    fn a_holder_s_clocks_run_from_the_first_sighting_of_that_holder() {
        let t0 = Instant::now();
        let (w0, w1) = (
            Timestamp::from_second(1_000).unwrap(),
            Timestamp::from_second(1_030).unwrap(),
        );
        let mut s = State::default();
        assert_eq!(s.holder_missing("u", t0, w0), (w0, Duration::ZERO));
        let later = t0 + Duration::from_secs(30);
        assert_eq!(
            s.holder_missing("u", later, w1),
            (w0, Duration::from_secs(30))
        );
        // A wall clock stepped back shortens nothing: the grace is monotonic.
        let stepped_back = Timestamp::from_second(10).unwrap();
        assert_eq!(
            s.holder_missing("u", later, stepped_back),
            (w0, Duration::from_secs(30))
        );
        // Another holder (a new uid) starts its own clock.
        assert_eq!(s.holder_missing("v", later, w1), (w1, Duration::ZERO));
        // Found again: the clock stops, and nothing rare is left.
        s.holder_present();
        assert!(s.rare.is_none());
        assert_eq!(
            s.holder_missing("v", later + Duration::from_secs(5), w1),
            (w1, Duration::ZERO)
        );

        let mut s = State::default();
        assert_eq!(s.stale_since("u", w0), w0);
        assert_eq!(
            s.stale_since("u", w1),
            w0,
            "the first death time seen stands"
        );
        assert_eq!(s.stale_since("v", w1), w1, "another holder's is its own");
        // A found holder stops the missing clock only.
        s.holder_present();
        assert_eq!(s.stale_since("v", w0), w1);
    }
}
