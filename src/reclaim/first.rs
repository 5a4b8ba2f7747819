//! Freeing comes first: what is said after a write (`StaleLockReclaimed`,
//! `--delete-pod`'s deletion, a dry run's or an untouchable lock's Event)
//! waits while judgements are in line or under way, at most
//! `YIELD_AT_MOST`. In a mass eviction the API server then serves the
//! reclaims' reads and writes before their reports, which follow the
//! burst's last write instead of slowing it (each is one more write to
//! etcd). The intent Event (`StaleLockReclaiming`), which restore reads
//! too, is not delayed: it is part of the judgement's turn, before the
//! write. `StaleLockReclaimed` and the count of the reclaim (metrics, log)
//! come up to `YIELD_AT_MOST` later. A count, not a queue: nothing is kept
//! per lock; the count is shared by every scope and kind.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The longest a report yields: under judgements that never stop (a
/// re-list of thousands of locks), each report still goes within this.
pub const YIELD_AT_MOST: Duration = Duration::from_secs(1);

/// How many judgements are in line or under way, in all scopes and kinds.
#[derive(Clone)]
pub struct Judging {
    count: Arc<watch::Sender<usize>>,
}

impl Default for Judging {
    fn default() -> Self {
        Judging {
            count: Arc::new(watch::Sender::new(0)),
        }
    }
}

impl Judging {
    /// One more judgement, counted until the guard drops (its turn ends).
    pub fn enter(&self) -> InLine {
        // Wakes no report: they wait for 0.
        self.count.send_if_modified(|n| {
            *n += 1;
            false
        });
        InLine {
            count: self.count.clone(),
        }
    }

    /// Waits until no judgement is in line or under way, `at_most`.
    pub async fn quiet(&self, at_most: Duration) {
        let mut rx = self.count.subscribe();
        let _ = tokio::time::timeout(at_most, rx.wait_for(|n| *n == 0)).await;
    }
}

/// A judgement counted by `Judging::enter`, until dropped.
pub struct InLine {
    count: Arc<watch::Sender<usize>>,
}

impl Drop for InLine {
    fn drop(&mut self) {
        // Only the last one out wakes the reports.
        self.count.send_if_modified(|n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_report_waits_for_the_judgements_then_goes() {
        let judging = Judging::default();
        let (a, b) = (judging.enter(), judging.enter());
        let t0 = tokio::time::Instant::now();
        let out = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(a);
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(b);
        };
        let ((), waited) = futures::join!(out, async {
            judging.quiet(YIELD_AT_MOST).await;
            t0.elapsed()
        });
        assert_eq!(waited, Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_goes_at_once_when_nothing_is_judged() {
        let judging = Judging::default();
        drop(judging.enter());
        let t0 = tokio::time::Instant::now();
        judging.quiet(YIELD_AT_MOST).await;
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_yields_at_most_its_bound() {
        let judging = Judging::default();
        let _never = judging.enter();
        let t0 = tokio::time::Instant::now();
        judging.quiet(YIELD_AT_MOST).await;
        assert_eq!(t0.elapsed(), YIELD_AT_MOST);
    }
}
