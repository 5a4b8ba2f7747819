//! Every metric named in DESIGN.md, on a registry of our own (no global
//! state, so tests can run several janitors in one process).

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::verdict::{LockState, StaleReason};
use crate::ErrorKind;

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub reclaims: IntCounterVec,
    pub stale_locks: IntGaugeVec,
    pub locks: IntGaugeVec,
    pub reclaim_latency: Histogram,
    pub pod_deletions: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_duration: Histogram,
    pub build_info: IntGaugeVec,
    pub watch_errors: IntCounterVec,
    pub ready: prometheus::IntGauge,
}

/// The bounded values of `lock_janitor_watch_errors_total{resource}`.
pub const WATCHED_RESOURCES: [&str; 3] = ["configmaps", "pods", "leases"];

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reclaims = IntCounterVec::new(
            Opts::new(
                "lock_janitor_reclaims_total",
                "Stale locks deleted, by lock and reason.",
            ),
            &["namespace", "lock", "reason"],
        )?;
        let stale_locks = IntGaugeVec::new(
            Opts::new(
                "lock_janitor_stale_locks",
                "Locks that are stale now and not reclaimed (dry-run or errors).",
            ),
            &["namespace", "lock", "reason"],
        )?;
        let locks = IntGaugeVec::new(
            Opts::new("lock_janitor_locks", "Watched locks by verdict state."),
            &["state"],
        )?;
        let reclaim_latency = Histogram::with_opts(
            HistogramOpts::new(
                "lock_janitor_reclaim_latency_seconds",
                "Time from the holder's death to the acknowledged delete of its lock.",
            )
            // 5 ms (a watch event and one DELETE) to an hour (a grace, a
            // backlog, a janitor that was down).
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                300.0, 900.0, 1800.0, 3600.0,
            ]),
        )?;
        let pod_deletions = IntCounterVec::new(
            Opts::new(
                "lock_janitor_pod_deletions_total",
                "Dead holder pods deleted (--delete-pod), by namespace and reason.",
            ),
            &["namespace", "reason"],
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "lock_janitor_reconcile_errors_total",
                "Reconcile failures by error kind.",
            ),
            &["error"],
        )?;
        let reconcile_duration = Histogram::with_opts(
            HistogramOpts::new(
                "lock_janitor_reconcile_duration_seconds",
                "Time spent judging (and possibly reclaiming) one lock.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )?;
        let build_info = IntGaugeVec::new(
            Opts::new("lock_janitor_build_info", "Always 1; carries the version."),
            &["version"],
        )?;
        let watch_errors = IntCounterVec::new(
            Opts::new(
                "lock_janitor_watch_errors_total",
                "Errors answered to the janitor's watches, by resource.",
            ),
            &["resource"],
        )?;
        let ready = prometheus::IntGauge::new(
            "lock_janitor_ready",
            "1 exactly when /readyz answers 200 (watches synced and working, not shutting down).",
        )?;
        for c in [
            Box::new(watch_errors.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(ready.clone()),
            Box::new(reclaims.clone()),
            Box::new(stale_locks.clone()),
            Box::new(locks.clone()),
            Box::new(reclaim_latency.clone()),
            Box::new(pod_deletions.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(reconcile_duration.clone()),
            Box::new(build_info.clone()),
        ] {
            registry.register(c)?;
        }
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // Bounded label sets start at zero, so rate() and absence-based
        // alerts work from the first scrape.
        for s in LockState::ALL {
            locks.with_label_values(&[s.as_str()]).set(0);
        }
        for k in ErrorKind::ALL {
            reconcile_errors.with_label_values(&[k.as_str()]);
        }
        for r in WATCHED_RESOURCES {
            watch_errors.with_label_values(&[r]);
        }
        Ok(Metrics {
            registry,
            reclaims,
            stale_locks,
            locks,
            reclaim_latency,
            pod_deletions,
            reconcile_errors,
            reconcile_duration,
            build_info,
            watch_errors,
            ready,
        })
    }

    pub fn set_stale(&self, namespace: &str, lock: &str, reason: Option<StaleReason>) {
        for r in StaleReason::ALL {
            if Some(r) != reason {
                // Absent label sets are fine to remove: ignore the NotFound.
                let _ = self
                    .stale_locks
                    .remove_label_values(&[namespace, lock, r.as_str()]);
            }
        }
        if let Some(r) = reason {
            self.stale_locks
                .with_label_values(&[namespace, lock, r.as_str()])
                .set(1);
        }
    }

    pub fn set_lock_counts(&self, counts: impl IntoIterator<Item = (LockState, i64)>) {
        for (state, n) in counts {
            self.locks.with_label_values(&[state.as_str()]).set(n);
        }
    }

    /// The text exposition format for `/metrics`.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}
