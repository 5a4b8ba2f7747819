//! Every metric named in docs/design.md, on a registry of our own (no global
//! state, so tests can run several janitors in one process).

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::lock::{LockKey, LockKind};
use crate::verdict::{LockState, StaleReason};
use crate::ErrorKind;

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Every metric family registered (an empty one is not rendered).
    names: std::sync::Arc<Vec<String>>,
    pub reclaims: IntCounterVec,
    pub reclaims_by_reason: IntCounterVec,
    pub stale_locks: IntGaugeVec,
    pub locks: IntGaugeVec,
    pub reclaim_latency: Histogram,
    pub pod_deletions: IntCounterVec,
    pub reconcile_errors: IntCounterVec,
    pub reconcile_duration: Histogram,
    pub build_info: IntGaugeVec,
    pub watch_errors: IntCounterVec,
    pub ready: prometheus::IntGauge,
    pub scope_ready: IntGaugeVec,
    pub leader: prometheus::IntGauge,
    pub takeover: Histogram,
    pub awaiting_takeover: IntGaugeVec,
    pub takeover_timeouts: IntCounterVec,
    pub last_reclaim: IntGaugeVec,
    pub leader_renew_errors: prometheus::IntCounter,
    pub restore_failures: prometheus::IntCounter,
    pub api_requests: IntCounterVec,
    pub api_budget_wait: Histogram,
    /// Per-lock reclaim series and when they were last touched, so that
    /// those of locks reclaimed long ago are removed.
    reclaimed: std::sync::Arc<std::sync::Mutex<Touched>>,
}

/// The labels of each per-lock reclaim series and when it was last set.
type Touched = std::collections::HashMap<[String; 4], std::time::Instant>;

/// Per-lock reclaim series are removed this long after their last reclaim.
pub const RECLAIM_SERIES_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// The bounded values of `lock_janitor_watch_errors_total{resource}`.
pub const WATCHED_RESOURCES: [&str; 3] = ["configmaps", "pods", "leases"];

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let mut names = Vec::new();
        let reclaims = IntCounterVec::new(
            Opts::new(
                "lock_janitor_reclaims_total",
                "Stale locks reclaimed (ConfigMaps deleted, Leases released), by lock and reason.",
            ),
            &["kind", "namespace", "lock", "reason"],
        )?;
        let stale_locks = IntGaugeVec::new(
            Opts::new(
                "lock_janitor_stale_locks",
                "Locks that are stale now and not reclaimed (dry-run or errors).",
            ),
            &["kind", "namespace", "lock", "reason"],
        )?;
        let locks = IntGaugeVec::new(
            Opts::new(
                "lock_janitor_locks",
                "Watched locks by kind and verdict state.",
            ),
            &["kind", "state"],
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
        let leader = prometheus::IntGauge::new(
            "lock_janitor_leader",
            "1 on the replica that may write (holds the leader lease, or runs without election).",
        )?;
        let takeover = Histogram::with_opts(
            HistogramOpts::new(
                "lock_janitor_takeover_seconds",
                "Time from a watched lock's deletion to a lock of another holder under its name.",
            )
            .buckets(vec![
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                3600.0,
            ]),
        )?;
        let awaiting_takeover = IntGaugeVec::new(
            Opts::new(
                "lock_janitor_awaiting_takeover",
                "1 while a deleted lock awaits a new holder.",
            ),
            &["namespace", "lock"],
        )?;
        let takeover_timeouts = IntCounterVec::new(
            Opts::new(
                "lock_janitor_takeover_timeouts_total",
                "Deleted locks that no new holder created within --takeover-timeout.",
            ),
            &["namespace", "lock"],
        )?;
        let last_reclaim = IntGaugeVec::new(
            Opts::new(
                "lock_janitor_last_reclaim_timestamp_seconds",
                "Unix time of the lock's last reclaim (series removed an hour later).",
            ),
            &["kind", "namespace", "lock", "reason"],
        )?;
        let reclaims_by_reason = IntCounterVec::new(
            Opts::new(
                "lock_janitor_reclaims_by_reason_total",
                "Stale locks reclaimed, by kind and reason; every series starts at 0, so increase() counts a first reclaim.",
            ),
            &["kind", "reason"],
        )?;
        let ready = prometheus::IntGauge::new(
            "lock_janitor_ready",
            "1 exactly when /readyz answers 200 (watches synced and working, not shutting down).",
        )?;
        let scope_ready = IntGaugeVec::new(
            Opts::new(
                "lock_janitor_scope_ready",
                "Per scope watched (a namespace, or \"\" for the whole cluster): 1 when its watches have listed and none has been failing for more than a minute.",
            ),
            &["scope"],
        )?;
        let leader_renew_errors = prometheus::IntCounter::new(
            "lock_janitor_leader_renew_errors_total",
            "Rounds of the leader election that failed to read, acquire or renew the janitor's own Lease.",
        )?;
        let restore_failures = prometheus::IntCounter::new(
            "lock_janitor_restore_failures_total",
            "Takeovers the janitor could not restore after a restart or failover, and opt-in label carry-overs it gave up.",
        )?;
        let api_requests = IntCounterVec::new(
            Opts::new(
                "lock_janitor_api_requests_total",
                "Requests the janitor made to the API server, by verb and answer code (none: no answer).",
            ),
            &["verb", "code"],
        )?;
        let api_budget_wait = Histogram::with_opts(
            HistogramOpts::new(
                "lock_janitor_api_budget_wait_seconds",
                "Time a read waited for the client-side budget (--api-qps, --api-burst) before it was sent.",
            )
            .buckets(vec![
                0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )?;
        #[cfg(target_os = "linux")]
        {
            // process_cpu_seconds_total, process_resident_memory_bytes, ...
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            names.extend(
                prometheus::core::Collector::desc(&pc)
                    .iter()
                    .map(|d| d.fq_name.clone()),
            );
            registry.register(Box::new(pc))?;
        }
        for c in [
            Box::new(watch_errors.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(api_requests.clone()),
            Box::new(api_budget_wait.clone()),
            Box::new(leader_renew_errors.clone()),
            Box::new(restore_failures.clone()),
            Box::new(ready.clone()),
            Box::new(scope_ready.clone()),
            Box::new(leader.clone()),
            Box::new(takeover.clone()),
            Box::new(awaiting_takeover.clone()),
            Box::new(takeover_timeouts.clone()),
            Box::new(last_reclaim.clone()),
            Box::new(reclaims.clone()),
            Box::new(reclaims_by_reason.clone()),
            Box::new(stale_locks.clone()),
            Box::new(locks.clone()),
            Box::new(reclaim_latency.clone()),
            Box::new(pod_deletions.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(reconcile_duration.clone()),
            Box::new(build_info.clone()),
        ] {
            names.extend(c.desc().iter().map(|d| d.fq_name.clone()));
            registry.register(c)?;
        }
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        // Bounded label sets start at zero, so rate() and absence-based
        // alerts work from the first scrape.
        for k in LockKind::ALL {
            for s in LockState::ALL {
                locks.with_label_values(&[k.as_str(), s.as_str()]).set(0);
            }
        }
        for k in LockKind::ALL {
            for r in StaleReason::ALL {
                reclaims_by_reason.with_label_values(&[k.as_str(), r.as_str()]);
            }
        }
        for k in ErrorKind::ALL {
            reconcile_errors.with_label_values(&[k.as_str()]);
        }
        for r in WATCHED_RESOURCES {
            watch_errors.with_label_values(&[r]);
        }
        names.sort();
        Ok(Metrics {
            registry,
            names: std::sync::Arc::new(names),
            reclaims,
            reclaims_by_reason,
            stale_locks,
            locks,
            reclaim_latency,
            pod_deletions,
            leader_renew_errors,
            restore_failures,
            api_requests,
            api_budget_wait,
            reconcile_errors,
            reconcile_duration,
            build_info,
            watch_errors,
            ready,
            scope_ready,
            leader,
            takeover,
            awaiting_takeover,
            takeover_timeouts,
            last_reclaim,
            reclaimed: Default::default(),
        })
    }

    /// Counts a reclaim: `lock_janitor_reclaims_total` (its series is born
    /// at 1; no series exists for a lock that was never reclaimed) and
    /// `lock_janitor_last_reclaim_timestamp_seconds`, which lets the reclaim
    /// alert see a first reclaim even in a Prometheus that just started.
    /// Series of reclaims older than `RECLAIM_SERIES_TTL` are removed.
    pub fn reclaimed(&self, key: &LockKey, reason: StaleReason) {
        let labels = [
            key.kind.as_str(),
            &key.namespace,
            &key.name,
            reason.as_str(),
        ];
        self.reclaims.with_label_values(&labels).inc();
        self.reclaims_by_reason
            .with_label_values(&[key.kind.as_str(), reason.as_str()])
            .inc();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        self.last_reclaim.with_label_values(&labels).set(now);
        let mut seen = self.reclaimed.lock().unwrap_or_else(|e| e.into_inner());
        seen.insert(labels.map(str::to_owned), std::time::Instant::now());
        // Pruned at each sweep; here only when it has grown.
        if seen.len().is_multiple_of(1024) {
            self.prune(&mut seen, RECLAIM_SERIES_TTL);
        }
    }

    /// Removes the reclaim series last touched more than `ttl` ago.
    pub fn prune_reclaims(&self, ttl: std::time::Duration) {
        let mut seen = self.reclaimed.lock().unwrap_or_else(|e| e.into_inner());
        self.prune(&mut seen, ttl);
    }

    fn prune(&self, seen: &mut Touched, ttl: std::time::Duration) {
        seen.retain(|l, at| {
            if at.elapsed() < ttl {
                return true;
            }
            let labels = [l[0].as_str(), l[1].as_str(), l[2].as_str(), l[3].as_str()];
            let _ = self.reclaims.remove_label_values(&labels);
            let _ = self.last_reclaim.remove_label_values(&labels);
            false
        });
    }

    pub fn set_stale(&self, key: &LockKey, reason: Option<StaleReason>) {
        let (kind, ns, lock) = (key.kind.as_str(), key.namespace.as_str(), key.name.as_str());
        for r in StaleReason::ALL {
            if Some(r) != reason {
                // Absent label sets are fine to remove: ignore the NotFound.
                let _ = self
                    .stale_locks
                    .remove_label_values(&[kind, ns, lock, r.as_str()]);
            }
        }
        if let Some(r) = reason {
            self.stale_locks
                .with_label_values(&[kind, ns, lock, r.as_str()])
                .set(1);
        }
    }

    pub fn set_lock_counts(&self, counts: impl IntoIterator<Item = ((LockKind, LockState), i64)>) {
        for ((kind, state), n) in counts {
            self.locks
                .with_label_values(&[kind.as_str(), state.as_str()])
                .set(n);
        }
    }

    /// The name of every metric family the janitor exports.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The text exposition format for `/metrics`.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaim_series_exist_only_after_a_reclaim_and_go_after_their_ttl() {
        let m = Metrics::new().unwrap();
        assert!(!m.render().unwrap().contains("lock_janitor_reclaims_total{"));
        m.reclaimed(&LockKey::configmap("ops", "op-lock"), StaleReason::Evicted);
        let text = m.render().unwrap();
        assert!(
            text.contains(
                r#"lock_janitor_reclaims_total{kind="configmap",lock="op-lock",namespace="ops",reason="Evicted"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(
            "lock_janitor_last_reclaim_timestamp_seconds{kind=\"configmap\",lock=\"op-lock\""
        ));
        m.reclaimed(&LockKey::configmap("ops", "op-lock"), StaleReason::Evicted);
        assert!(m.render().unwrap().contains(
            r#"lock_janitor_reclaims_total{kind="configmap",lock="op-lock",namespace="ops",reason="Evicted"} 2"#
        ));
        m.prune_reclaims(std::time::Duration::from_secs(3600));
        assert!(
            m.render().unwrap().contains("op-lock"),
            "kept within the ttl"
        );
        m.prune_reclaims(std::time::Duration::ZERO);
        let text = m.render().unwrap();
        assert!(!text.contains("op-lock"), "{text}");
    }
}
