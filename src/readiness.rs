//! Readiness: every watch has listed once, none has been failing for more
//! than a minute, and shutdown has not started. What `/readyz` answers and
//! `lock_janitor_ready` shows, and what gates every write (safety rule 4).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A watch failing for longer than this makes the janitor not ready.
pub const FAILING_AFTER: Duration = Duration::from_secs(60);
/// A failing watch retries at least this often (kube's default backoff
/// tops out at 30 s): this long without an error, it has recovered.
pub const RECOVERED_AFTER: Duration = Duration::from_secs(45);
/// At most one WARN line per watch this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct Health {
    /// The scope the watch serves: its namespace, or "" for the cluster.
    scope: String,
    /// The first error since the watch last worked.
    first_error: Option<Instant>,
    last_error: Option<Instant>,
    last_warned: Option<Instant>,
    /// Errors since the last WARN line.
    unreported: u64,
}

impl Health {
    fn failing(&self, now: Instant) -> bool {
        match (self.first_error, self.last_error) {
            (Some(first), Some(last)) => {
                now.duration_since(first) > FAILING_AFTER
                    && now.duration_since(last) < RECOVERED_AFTER
            }
            _ => false,
        }
    }
}

/// What a watch error should be said as.
#[derive(Debug, PartialEq, Eq)]
pub enum Report {
    /// Log it at WARN, with the errors it stands for.
    Warn { errors: u64, failing_for: Duration },
    /// Counted only: a WARN line was written less than 30 s ago.
    Quiet,
}

/// Readiness: a count of watches that have not finished their first list,
/// the health of each watch, and a flag raised when shutdown starts.
#[derive(Debug, Default)]
pub struct Readiness {
    unsynced: AtomicUsize,
    registered: AtomicBool,
    shutting_down: AtomicBool,
    watches: Mutex<HashMap<String, Health>>,
    /// Every scope watched (`scopes`), for `lock_janitor_scope_ready`.
    scopes: Mutex<Vec<String>>,
}

impl Readiness {
    /// Declares `n` watches that must each call `synced` once.
    pub fn expect(&self, n: usize) {
        self.unsynced.fetch_add(n, Ordering::SeqCst);
        self.registered.store(true, Ordering::SeqCst);
    }
    pub fn synced(&self) {
        self.unsynced.fetch_sub(1, Ordering::SeqCst);
    }
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }
    /// Every declared watch has listed once.
    pub fn is_synced(&self) -> bool {
        self.registered.load(Ordering::SeqCst) && self.unsynced.load(Ordering::SeqCst) == 0
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Health>) -> T) -> T {
        f(&mut crate::locked(&self.watches))
    }

    /// The scopes watched: each namespace, or "" for the whole cluster.
    pub fn scopes(&self, scopes: Vec<String>) {
        *crate::locked(&self.scopes) = scopes;
    }

    /// The watch `name`, of scope `scope` (a namespace, or "" for the
    /// cluster), answered an error.
    pub fn watch_failed(&self, scope: &str, name: &str) -> Report {
        self.watch_failed_at(scope, name, Instant::now())
    }

    fn watch_failed_at(&self, scope: &str, name: &str, now: Instant) -> Report {
        self.with(|w| {
            let h = w.entry(name.to_owned()).or_default();
            scope.clone_into(&mut h.scope);
            // A watch quiet for RECOVERED_AFTER had recovered in between.
            if h.last_error
                .is_some_and(|l| now.duration_since(l) >= RECOVERED_AFTER)
            {
                h.first_error = None;
            }
            let first = *h.first_error.get_or_insert(now);
            h.last_error = Some(now);
            h.unreported += 1;
            if h.last_warned
                .is_some_and(|t| now.duration_since(t) < WARN_EVERY)
            {
                return Report::Quiet;
            }
            h.last_warned = Some(now);
            let errors = std::mem::take(&mut h.unreported);
            Report::Warn {
                errors,
                failing_for: now.duration_since(first),
            }
        })
    }

    /// The watch `name` delivered an event: it works. True if it had been
    /// failing (worth a line saying it recovered).
    pub fn watch_ok(&self, name: &str) -> bool {
        self.with(|w| match w.get_mut(name) {
            Some(h) if h.first_error.is_some() => {
                h.first_error = None;
                h.last_error = None;
                h.unreported = 0;
                true
            }
            _ => false,
        })
    }

    /// Watches failing for more than a minute, now.
    pub fn failing_watches(&self) -> Vec<String> {
        self.failing_at(Instant::now())
    }

    fn failing_at(&self, now: Instant) -> Vec<String> {
        let mut v: Vec<String> = self.with(|w| {
            w.iter()
                .filter(|(_, h)| h.failing(now))
                .map(|(n, _)| n.clone())
                .collect()
        });
        v.sort();
        v
    }

    /// Per scope watched, whether it works: every watch has listed once and
    /// none of the scope's has been failing for more than a minute.
    pub fn scope_readiness(&self) -> Vec<(String, bool)> {
        let now = Instant::now();
        let failing: std::collections::HashSet<String> = self.with(|w| {
            w.values()
                .filter(|h| h.failing(now))
                .map(|h| h.scope.clone())
                .collect()
        });
        let synced = self.is_synced();
        crate::locked(&self.scopes)
            .iter()
            .map(|s| (s.clone(), synced && !failing.contains(s)))
            .collect()
    }

    pub fn is_ready(&self) -> bool {
        self.is_synced()
            && !self.shutting_down.load(Ordering::SeqCst)
            && self.failing_watches().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_failing_for_a_minute_is_not_ready_until_it_recovers() {
        let r = Readiness::default();
        r.expect(1);
        r.synced();
        assert!(r.is_ready());
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            r.watch_failed_at("", "pods in all namespaces", at(0)),
            Report::Warn {
                errors: 1,
                failing_for: Duration::ZERO
            }
        );
        // Retries every 20 s: counted, one WARN per 30 s.
        assert_eq!(
            r.watch_failed_at("", "pods in all namespaces", at(20)),
            Report::Quiet
        );
        assert!(matches!(
            r.watch_failed_at("", "pods in all namespaces", at(40)),
            Report::Warn { errors: 2, .. }
        ));
        assert!(r.failing_at(at(59)).is_empty(), "not a minute yet");
        r.watch_failed_at("", "pods in all namespaces", at(60));
        assert_eq!(r.failing_at(at(61)), vec!["pods in all namespaces"]);
        // No error for RECOVERED_AFTER: it reconnected.
        assert!(r.failing_at(at(60 + 46)).is_empty());
        // An event proves it at once.
        r.watch_failed_at("ops", "configmaps in ops", at(300));
        r.watch_failed_at("ops", "configmaps in ops", at(330));
        r.watch_failed_at("ops", "configmaps in ops", at(361));
        assert_eq!(r.failing_at(at(362)), vec!["configmaps in ops"]);
        assert!(r.watch_ok("configmaps in ops"));
        assert!(r.failing_at(at(362)).is_empty());
        assert!(!r.watch_ok("configmaps in ops"), "already fine");
        // A new run of errors after a quiet spell starts a new minute.
        r.watch_failed_at("ops", "configmaps in ops", at(500));
        assert!(r.failing_at(at(501)).is_empty());
    }
}
