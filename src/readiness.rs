//! Readiness: every scope's watches have listed once, none has been failing
//! for more than a minute, no scope was refused at start-up, and shutdown
//! has not started. What `/readyz` answers and `lock_janitor_ready` shows.
//! Each scope also gates its own reconciles on its own first lists (safety
//! rule 4, per scope): a scope that is refused, or slow to list, holds no
//! other.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Where a scope stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ScopeState {
    /// Refused its list or watch at start-up: not watched, retried with
    /// backoff. What it may not do ("list configmaps, watch pods").
    Refused { missing: String },
    /// Watched: this many of its watches (and its first sweep) have not
    /// listed once yet; 0 once they all have.
    Listing(usize),
}

/// Readiness: per scope, refused or how many of its watches have not
/// listed once; the health of each watch; a flag raised when shutdown
/// starts.
#[derive(Debug, Default)]
pub struct Readiness {
    shutting_down: AtomicBool,
    watches: Mutex<HashMap<String, Health>>,
    /// Every scope (its namespace, or "" for the whole cluster), for
    /// `lock_janitor_scope_ready`.
    scopes: Mutex<BTreeMap<String, ScopeState>>,
}

impl Readiness {
    /// The scope `scope` (a namespace, or "" for the cluster) refused its
    /// list or watch at start-up; `missing` says what it may not do.
    pub fn refused(&self, scope: &str, missing: String) {
        crate::locked(&self.scopes).insert(scope.to_owned(), ScopeState::Refused { missing });
    }
    /// The scope `scope` is watched: `n` watches (or sweeps) must each call
    /// `synced_in` once before anything in it is judged.
    pub fn expect_in(&self, scope: &str, n: usize) {
        crate::locked(&self.scopes).insert(scope.to_owned(), ScopeState::Listing(n));
    }
    /// As `expect_in` for the whole cluster, which serves every namespace
    /// (`expect(0)`: judgements may run at once, as in-process tests do).
    pub fn expect(&self, n: usize) {
        self.expect_in("", n)
    }
    /// One of the scope's watches has listed once.
    pub fn synced_in(&self, scope: &str) {
        if let Some(ScopeState::Listing(n)) = crate::locked(&self.scopes).get_mut(scope) {
            *n = n.saturating_sub(1);
        }
    }
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }
    /// Every scope is watched and has listed once (none refused).
    pub fn is_synced(&self) -> bool {
        let scopes = crate::locked(&self.scopes);
        !scopes.is_empty() && scopes.values().all(|s| *s == ScopeState::Listing(0))
    }
    /// Whether the scope that holds `namespace` (the namespace itself, or
    /// the whole cluster) has listed once: what a judgement or a write in
    /// that namespace waits for.
    pub fn serves(&self, namespace: &str) -> bool {
        let scopes = crate::locked(&self.scopes);
        scopes
            .get(namespace)
            .or_else(|| scopes.get(""))
            .is_some_and(|s| *s == ScopeState::Listing(0))
    }
    /// The scopes refused at start-up and not allowed since, with what each
    /// may not do.
    pub fn refused_scopes(&self) -> Vec<(String, String)> {
        crate::locked(&self.scopes)
            .iter()
            .filter_map(|(scope, s)| match s {
                ScopeState::Refused { missing } => Some((scope.clone(), missing.clone())),
                ScopeState::Listing(_) => None,
            })
            .collect()
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Health>) -> T) -> T {
        f(&mut crate::locked(&self.watches))
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

    /// What keeps this replica from being ready, besides its first lists
    /// and shutdown: the scopes refused at start-up and the watches failing
    /// for more than a minute (the election offers its lease on the
    /// failing watches alone).
    pub fn troubles(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .refused_scopes()
            .into_iter()
            .map(|(scope, missing)| format!("{} refused ({missing})", scope_text(&scope)))
            .collect();
        v.extend(self.failing_watches());
        v
    }

    /// Per scope, whether it works: watched, every watch of it has listed
    /// once, and none of its has been failing for more than a minute.
    pub fn scope_readiness(&self) -> Vec<(String, bool)> {
        let now = Instant::now();
        let failing: std::collections::HashSet<String> = self.with(|w| {
            w.values()
                .filter(|h| h.failing(now))
                .map(|h| h.scope.clone())
                .collect()
        });
        crate::locked(&self.scopes)
            .iter()
            .map(|(s, state)| {
                (
                    s.clone(),
                    *state == ScopeState::Listing(0) && !failing.contains(s),
                )
            })
            .collect()
    }

    /// Ready: every scope watched and listed once, none refused, no watch
    /// failing for more than a minute, shutdown not started.
    pub fn is_ready(&self) -> bool {
        self.is_synced()
            && !self.shutting_down.load(Ordering::SeqCst)
            && self.failing_watches().is_empty()
    }
}

/// A scope as logs and `/readyz` name it.
pub fn scope_text(scope: &str) -> String {
    if scope.is_empty() {
        "all namespaces".to_owned()
    } else {
        format!("namespace {scope}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_failing_for_a_minute_is_not_ready_until_it_recovers() {
        let r = Readiness::default();
        r.expect_in("", 1);
        r.synced_in("");
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

    #[test]
    fn a_refused_scope_holds_readiness_but_not_the_other_scopes() {
        let r = Readiness::default();
        assert!(!r.is_synced(), "nothing declared yet");
        r.expect_in("a", 3);
        r.refused("b", "list configmaps, list pods".into());
        for _ in 0..2 {
            r.synced_in("a");
        }
        assert!(!r.serves("a"), "one of a's watches has not listed");
        r.synced_in("a");
        assert!(r.serves("a"));
        assert!(!r.serves("b"));
        assert!(!r.serves("c"), "not a scope");
        assert!(!r.is_ready(), "b is refused");
        assert_eq!(
            r.scope_readiness(),
            vec![("a".to_owned(), true), ("b".to_owned(), false)]
        );
        assert_eq!(
            r.troubles(),
            vec!["namespace b refused (list configmaps, list pods)"]
        );
        // Allowed later: watched, and ready once it has listed.
        r.expect_in("b", 1);
        assert!(r.refused_scopes().is_empty());
        assert!(!r.is_ready());
        r.synced_in("b");
        assert!(r.is_ready());
        assert!(r.troubles().is_empty());
        // The whole cluster serves every namespace.
        let all = Readiness::default();
        all.expect_in("", 1);
        all.synced_in("");
        assert!(all.serves("anything"));
    }
}
