//! How often each watched renewed lock's holder renews it, as the janitor
//! sees it: the gaps between the renew times its watch (and its live reads)
//! deliver under one holder identity (or, when those times cannot be
//! trusted, between the changes it saw, on its own clock), and how long, on the janitor's own clock, no
//! new renewal has come. A Lease is released only once its holder has
//! missed its own renewals (`verdict::lease`); this is where "its own" is
//! learnt. Pure bookkeeping: the caller passes the instant.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::lock::Renewal;
use crate::verdict::Renewals;

/// How many recent gaps are kept: the longest of them is the period, so one
/// slow renewal (an API server hiccup) widens the window for a while.
const GAPS: usize = 4;
/// A gap longer than this is not a renew period (the holder stopped and
/// came back, or the watch was away): not learnt.
const LONGEST_GAP: Duration = Duration::from_secs(3600);
/// A gap shorter than this is not a renew period either: client-go renews
/// right after it acquires, milliseconds after the acquisition's write.
const SHORTEST_GAP: Duration = Duration::from_secs(1);
/// Gaps seen before the longest of them counts as the period.
const GAPS_NEEDED: usize = 2;

/// The renew history of one renewed lock.
#[derive(Clone, Debug)]
pub struct Cadence {
    /// A hash of the holder identity and the lock's uid: a new holder, or
    /// a new lock of the same name, starts a new history.
    identity: u64,
    /// The renew time as last written, hashed: any change is a renewal (a
    /// renewer whose clock runs behind writes older times).
    mark: u64,
    /// The newest trusted renew time seen (gaps are learnt from it).
    renewed: Option<Timestamp>,
    /// When the janitor last saw the renew time change.
    since: Instant,
    /// Whether `since` is a change seen (not the first sighting): a gap on
    /// the janitor's own clock is learnt only between two changes.
    changed: bool,
    /// The marks seen lately: one seen again (an older renewal, from a
    /// re-list served from the API server's cache or a watch behind a live
    /// read) restarts the silence but teaches no gap on the janitor's clock.
    recent: [u64; GAPS],
    /// Recent gaps in milliseconds, newest last; 0 is none.
    gaps: [u32; GAPS],
}

impl Cadence {
    /// The history of a lock first seen `at`.
    pub fn new(r: Renewal, at: Instant) -> Cadence {
        Cadence {
            identity: r.identity,
            mark: r.mark,
            renewed: r.renewed,
            since: at,
            changed: false,
            recent: [r.mark; GAPS],
            gaps: [0; GAPS],
        }
    }

    /// Takes in the lock as read or watched `at`. Any change of the renew
    /// time restarts the silence, even to an older time (a renewer elsewhere
    /// with a clock behind, or a watch event behind a live read: that only
    /// delays a release). A gap is learnt from two trusted renew times, the
    /// newer after the older; from a record whose times carry no zone
    /// (never trusted), from the janitor's own clock between two changes it
    /// saw.
    pub fn observe(&mut self, r: Renewal, at: Instant) {
        if r.identity != self.identity {
            *self = Cadence::new(r, at);
            return;
        }
        if r.mark == self.mark {
            return;
        }
        self.mark = r.mark;
        let previous = std::mem::replace(&mut self.since, at);
        let seen_changing = std::mem::replace(&mut self.changed, true);
        let seen_before = self.recent.contains(&r.mark);
        if !seen_before {
            self.recent.rotate_left(1);
            self.recent[GAPS - 1] = r.mark;
        }
        match (r.renewed, self.renewed) {
            (Some(new), Some(old)) => {
                if new <= old {
                    return;
                }
                if let Ok(gap) = Duration::try_from(new.duration_since(old)) {
                    self.learn(gap);
                }
                self.renewed = Some(new);
            }
            (Some(new), None) => self.renewed = Some(new),
            (None, _) if seen_changing && !seen_before => {
                self.learn(at.saturating_duration_since(previous))
            }
            (None, _) => {}
        }
    }

    fn learn(&mut self, gap: Duration) {
        if (SHORTEST_GAP..=LONGEST_GAP).contains(&gap) {
            let ms = u32::try_from(gap.as_millis()).unwrap_or(u32::MAX).max(1);
            self.gaps.rotate_left(1);
            self.gaps[GAPS - 1] = ms;
        }
    }

    /// What was seen, as of `now`.
    pub fn renewals(&self, now: Instant) -> Renewals {
        let longest = self.gaps.iter().copied().max().unwrap_or(0);
        let seen = self.gaps.iter().filter(|g| **g > 0).count();
        Renewals {
            period: (seen >= GAPS_NEEDED).then(|| Duration::from_millis(u64::from(longest))),
            quiet_for: Some(now.saturating_duration_since(self.since)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{Kind, Object};
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::SignedDuration;

    fn seen(l: &Lease) -> Renewal {
        crate::kinds::lease::RenewedLease
            .renewal(Object::Lease(l))
            .expect("a Lease shows its renewals")
    }

    fn lease(identity: &str, renewed: Timestamp) -> Renewal {
        seen(&lease_object(identity, renewed))
    }

    fn lease_object(identity: &str, renewed: Timestamp) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.into()),
                renew_time: Some(MicroTime(renewed)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn learns_the_longest_recent_gap_under_one_holder() {
        let t0: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let at = Instant::now();
        let s = |n: i64| t0 + SignedDuration::from_secs(n);
        let i = |n: u64| at + Duration::from_secs(n);
        let mut c = Cadence::new(lease("a", s(0)), i(0));
        assert_eq!(
            c.renewals(i(3)),
            Renewals {
                period: None,
                quiet_for: Some(Duration::from_secs(3))
            }
        );
        // client-go renews right after it acquires: not a period.
        c.observe(lease("a", s(0) + SignedDuration::from_millis(20)), i(0));
        c.observe(lease("a", s(26)), i(26));
        assert_eq!(c.renewals(i(26)).period, None, "one gap is not enough");
        c.observe(lease("a", s(52)), i(53));
        // The same renewal again (a watch event after a live read): nothing.
        c.observe(lease("a", s(52)), i(60));
        let r = c.renewals(i(60));
        assert_eq!(r.period, Some(Duration::from_secs(26)));
        assert_eq!(r.quiet_for, Some(Duration::from_secs(7)));
        // An older renew time (a renewer whose clock is behind) teaches no
        // gap, but it is a renewal: the silence starts again.
        c.observe(lease("a", s(40)), i(61));
        assert_eq!(c.renewals(i(61)).quiet_for, Some(Duration::ZERO));
        assert_eq!(c.renewals(i(61)).period, Some(Duration::from_secs(26)));
        c.observe(lease("a", s(52)), i(62));
        assert_eq!(c.renewals(i(62)).quiet_for, Some(Duration::ZERO));
        // One slow renewal widens the period; it stays the longest of four.
        c.observe(lease("a", s(92)), i(92));
        assert_eq!(c.renewals(i(92)).period, Some(Duration::from_secs(40)));
        for n in 1..=3 {
            c.observe(lease("a", s(92 + 26 * n)), i(92 + 26 * n as u64));
        }
        assert_eq!(c.renewals(i(200)).period, Some(Duration::from_secs(40)));
        c.observe(lease("a", s(92 + 26 * 4)), i(200));
        assert_eq!(c.renewals(i(200)).period, Some(Duration::from_secs(26)));
        // A new holder: nothing known of its period yet.
        c.observe(lease("b", s(300)), i(300));
        c.observe(lease("b", s(326)), i(326));
        assert_eq!(c.renewals(i(326)).period, None);
        assert_eq!(c.renewals(i(327)).quiet_for, Some(Duration::from_secs(1)));
        c.observe(lease("b", s(352)), i(352));
        assert_eq!(c.renewals(i(352)).period, Some(Duration::from_secs(26)));
        // The same holder on a Lease made again (another uid): nothing
        // known of it either.
        let mut again = lease_object("b", s(378));
        again.metadata.uid = Some("uid-2".into());
        c.observe(seen(&again), i(378));
        assert_eq!(c.renewals(i(378)).period, None);
    }

    #[test]
    fn gaps_of_hours_are_not_periods() {
        let t0: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let at = Instant::now();
        let mut c = Cadence::new(lease("a", t0), at);
        c.observe(lease("a", t0 + SignedDuration::from_hours(2)), at);
        assert_eq!(c.renewals(at).period, None);
        // Without a renew time at first: the first one starts the clock.
        let mut c = Cadence::new(seen(&Lease::default()), at);
        c.observe(lease("", t0), at + Duration::from_secs(5));
        assert_eq!(c.renewals(at + Duration::from_secs(5)).period, None);
    }

    /// A record whose times carry no zone (the Python client's): its gaps
    /// are learnt on the janitor's own clock, between changes it saw (never
    /// from the first sighting, which is no renewal).
    #[test]
    fn untrusted_times_are_learnt_on_the_janitors_clock() {
        let at = Instant::now();
        let i = |n: u64| at + Duration::from_secs(n);
        let seen = |mark: u64| Renewal::new("uid", "py-a", mark, None);
        let mut c = Cadence::new(seen(0), i(0));
        c.observe(seen(1), i(5));
        assert_eq!(
            c.renewals(i(5)).period,
            None,
            "from the first sighting: no gap"
        );
        c.observe(seen(2), i(7));
        c.observe(seen(2), i(8));
        assert_eq!(c.renewals(i(8)).period, None, "one gap is not enough");
        c.observe(seen(3), i(9));
        let r = c.renewals(i(10));
        assert_eq!(r.period, Some(Duration::from_secs(2)));
        assert_eq!(r.quiet_for, Some(Duration::from_secs(1)));
        // An older renewal seen again (a re-list from the cache): the
        // silence starts again, but no gap is learnt from it, nor from the
        // newer one coming back right after.
        c.observe(seen(2), i(10));
        assert_eq!(c.renewals(i(10)).quiet_for, Some(Duration::ZERO));
        c.observe(seen(3), i(10) + Duration::from_millis(1100));
        c.observe(seen(4), i(12));
        assert_eq!(
            c.renewals(i(12)).period,
            Some(Duration::from_secs(2)),
            "no 1.1 s gap learnt"
        );
    }
}
