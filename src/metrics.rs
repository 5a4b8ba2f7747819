//! Every metric named in docs/design.md, on a registry of our own (no global
//! state, so tests can run several janitors in one process).

use prometheus::core::Collector;
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, Result, TextEncoder,
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
    pub watch_errors: IntCounterVec,
    pub ready: IntGauge,
    pub scope_ready: IntGaugeVec,
    pub leader: IntGauge,
    pub takeover: Histogram,
    pub awaiting_takeover: IntGaugeVec,
    pub takeover_timeouts: IntCounterVec,
    pub last_reclaim: IntGaugeVec,
    pub leader_renew_errors: IntCounter,
    pub restore_failures: IntCounter,
    pub api_requests: IntCounterVec,
    pub api_budget_wait: Histogram,
    pub opt_ins: IntCounterVec,
    pub unprotected: IntGaugeVec,
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

/// Registers each metric as it is made, and keeps the names of its families.
struct Registrar {
    registry: Registry,
    names: Vec<String>,
}

impl Registrar {
    fn register(&mut self, c: Box<dyn Collector>) -> Result<()> {
        self.names
            .extend(c.desc().iter().map(|d| d.fq_name.clone()));
        self.registry.register(c)
    }

    fn add<C: Collector + Clone + 'static>(&mut self, c: C) -> Result<C> {
        self.register(Box::new(c.clone()))?;
        Ok(c)
    }

    fn counter(&mut self, name: &str, help: &str) -> Result<IntCounter> {
        self.add(IntCounter::new(name, help)?)
    }

    fn gauge(&mut self, name: &str, help: &str) -> Result<IntGauge> {
        self.add(IntGauge::new(name, help)?)
    }

    fn counters(&mut self, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
        self.add(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    fn gauges(&mut self, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
        self.add(IntGaugeVec::new(Opts::new(name, help), labels)?)
    }

    fn histogram(&mut self, name: &str, help: &str, buckets: &[f64]) -> Result<Histogram> {
        self.add(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        )?)
    }
}

/// A lock's labels. A lock's namespace is `lock_namespace`: a scrape that
/// does not honour the target's labels (OpenShift's user workload
/// monitoring) would overwrite a `namespace` label with the janitor's own.
const LOCK_LABELS: &[&str] = &["kind", "lock_namespace", "lock", "reason"];
const TAKEOVER_LABELS: &[&str] = &["lock_namespace", "lock"];

/// The locks seen and the reclaims.
struct Reclaims {
    reclaims: IntCounterVec,
    reclaims_by_reason: IntCounterVec,
    stale_locks: IntGaugeVec,
    locks: IntGaugeVec,
    reclaim_latency: Histogram,
    pod_deletions: IntCounterVec,
    last_reclaim: IntGaugeVec,
}

impl Reclaims {
    fn register(r: &mut Registrar) -> Result<Self> {
        Ok(Reclaims {
            reclaims: r.counters(
                "lock_janitor_reclaims_total",
                "Stale locks reclaimed (ConfigMaps deleted, Leases released), by lock and reason.",
                LOCK_LABELS,
            )?,
            stale_locks: r.gauges(
                "lock_janitor_stale_locks",
                "Locks that are stale now and not reclaimed (dry-run or errors).",
                LOCK_LABELS,
            )?,
            locks: r.gauges(
                "lock_janitor_locks",
                "Watched locks by kind and verdict state.",
                &["kind", "state"],
            )?,
            // 5 ms (a watch event and one DELETE) to an hour (a grace, a
            // backlog, a janitor that was down).
            reclaim_latency: r.histogram(
                "lock_janitor_reclaim_latency_seconds",
                "Time from the holder's death to the acknowledged delete of its lock.",
                &[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 900.0, 1800.0, 3600.0,
                ],
            )?,
            pod_deletions: r.counters(
                "lock_janitor_pod_deletions_total",
                "Dead holder pods deleted (--delete-pod), by the lock's namespace and reason.",
                &["lock_namespace", "reason"],
            )?,
            last_reclaim: r.gauges(
                "lock_janitor_last_reclaim_timestamp_seconds",
                "Unix time of the lock's last reclaim (series removed an hour later).",
                LOCK_LABELS,
            )?,
            reclaims_by_reason: r.counters(
                "lock_janitor_reclaims_by_reason_total",
                "Stale locks reclaimed, by kind and reason; every series starts at 0, so increase() counts a first reclaim.",
                &["kind", "reason"],
            )?,
        })
    }
}

/// The reconciles, the watches, readiness and the leader election.
struct Health {
    reconcile_errors: IntCounterVec,
    reconcile_duration: Histogram,
    watch_errors: IntCounterVec,
    ready: IntGauge,
    scope_ready: IntGaugeVec,
    leader: IntGauge,
    leader_renew_errors: IntCounter,
}

impl Health {
    fn register(r: &mut Registrar) -> Result<Self> {
        Ok(Health {
            reconcile_errors: r.counters(
                "lock_janitor_reconcile_errors_total",
                "Reconcile failures by error kind.",
                &["error"],
            )?,
            reconcile_duration: r.histogram(
                "lock_janitor_reconcile_duration_seconds",
                "Time spent judging (and possibly reclaiming) one lock.",
                &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
            )?,
            watch_errors: r.counters(
                "lock_janitor_watch_errors_total",
                "Errors answered to the janitor's watches, by resource.",
                &["resource"],
            )?,
            leader: r.gauge(
                "lock_janitor_leader",
                "1 on the replica that may write (holds the leader lease, or runs without election).",
            )?,
            ready: r.gauge(
                "lock_janitor_ready",
                "1 exactly when /readyz answers 200 (watches synced and working, not shutting down).",
            )?,
            scope_ready: r.gauges(
                "lock_janitor_scope_ready",
                "Per scope watched (a namespace, or \"\" for the whole cluster): 1 when its watches have listed and none has been failing for more than a minute.",
                &["scope"],
            )?,
            leader_renew_errors: r.counter(
                "lock_janitor_leader_renew_errors_total",
                "Rounds of the leader election that failed to read, acquire or renew the janitor's own Lease.",
            )?,
        })
    }
}

/// The takeovers after a reclaim, the API traffic and the auto opt-in.
struct Takeovers {
    takeover: Histogram,
    awaiting_takeover: IntGaugeVec,
    takeover_timeouts: IntCounterVec,
    restore_failures: IntCounter,
    api_requests: IntCounterVec,
    api_budget_wait: Histogram,
    opt_ins: IntCounterVec,
    unprotected: IntGaugeVec,
}

impl Takeovers {
    fn register(r: &mut Registrar) -> Result<Self> {
        Ok(Takeovers {
            takeover: r.histogram(
                "lock_janitor_takeover_seconds",
                "Time from a watched lock's deletion to a lock of another holder under its name.",
                &[
                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                    1800.0, 3600.0,
                ],
            )?,
            awaiting_takeover: r.gauges(
                "lock_janitor_awaiting_takeover",
                "1 while a deleted lock awaits a new holder.",
                TAKEOVER_LABELS,
            )?,
            takeover_timeouts: r.counters(
                "lock_janitor_takeover_timeouts_total",
                "Deleted locks that no new holder created within --takeover-timeout.",
                TAKEOVER_LABELS,
            )?,
            restore_failures: r.counter(
                "lock_janitor_restore_failures_total",
                "Takeovers the janitor could not restore after a restart or failover, and opt-in label carry-overs it gave up.",
            )?,
            api_requests: r.counters(
                "lock_janitor_api_requests_total",
                "Requests the janitor made to the API server, by verb and answer code (none: no answer).",
                &["verb", "code"],
            )?,
            api_budget_wait: r.histogram(
                "lock_janitor_api_budget_wait_seconds",
                "Time a read waited for the client-side budget (--api-qps, --api-burst) before it was sent.",
                &[
                    0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ],
            )?,
            opt_ins: r.counters(
                "lock_janitor_opt_ins_total",
                "Lock candidates the janitor labeled with the opt-in label (--auto-opt-in), by kind.",
                &["kind"],
            )?,
            unprotected: r.gauges(
                "lock_janitor_unprotected_locks",
                "Lock candidates in scope, outside --exclude-namespaces, without the opt-in label's key (--auto-opt-in), by kind.",
                &["kind"],
            )?,
        })
    }
}

impl Metrics {
    /// Every metric, registered (the registry renders the families sorted
    /// by name, whatever the order they were registered in).
    pub fn new() -> Result<Self> {
        let mut r = Registrar {
            registry: Registry::new(),
            names: Vec::new(),
        };
        // process_cpu_seconds_total, process_resident_memory_bytes, ...
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        let build_info = r.gauges(
            "lock_janitor_build_info",
            "Always 1; carries the version.",
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let (l, h, t) = (
            Reclaims::register(&mut r)?,
            Health::register(&mut r)?,
            Takeovers::register(&mut r)?,
        );
        let m = Metrics {
            reclaims: l.reclaims,
            reclaims_by_reason: l.reclaims_by_reason,
            stale_locks: l.stale_locks,
            locks: l.locks,
            reclaim_latency: l.reclaim_latency,
            pod_deletions: l.pod_deletions,
            last_reclaim: l.last_reclaim,
            reconcile_errors: h.reconcile_errors,
            reconcile_duration: h.reconcile_duration,
            watch_errors: h.watch_errors,
            ready: h.ready,
            scope_ready: h.scope_ready,
            leader: h.leader,
            leader_renew_errors: h.leader_renew_errors,
            takeover: t.takeover,
            awaiting_takeover: t.awaiting_takeover,
            takeover_timeouts: t.takeover_timeouts,
            restore_failures: t.restore_failures,
            api_requests: t.api_requests,
            api_budget_wait: t.api_budget_wait,
            opt_ins: t.opt_ins,
            unprotected: t.unprotected,
            registry: r.registry,
            names: {
                r.names.sort();
                std::sync::Arc::new(r.names)
            },
            reclaimed: Default::default(),
        };
        m.start_at_zero();
        Ok(m)
    }

    /// Bounded label sets start at zero, so rate() and absence-based
    /// alerts work from the first scrape.
    fn start_at_zero(&self) {
        for k in LockKind::ALL {
            for s in LockState::ALL {
                self.locks
                    .with_label_values(&[k.as_str(), s.as_str()])
                    .set(0);
            }
            self.opt_ins.with_label_values(&[k.as_str()]);
            for r in StaleReason::ALL {
                self.reclaims_by_reason
                    .with_label_values(&[k.as_str(), r.as_str()]);
            }
        }
        for k in ErrorKind::ALL {
            self.reconcile_errors.with_label_values(&[k.as_str()]);
        }
        for r in WATCHED_RESOURCES {
            self.watch_errors.with_label_values(&[r]);
        }
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
        let mut seen = crate::locked(&self.reclaimed);
        seen.insert(labels.map(str::to_owned), std::time::Instant::now());
        // Pruned at each sweep; here only when it has grown.
        if seen.len().is_multiple_of(1024) {
            self.prune(&mut seen, RECLAIM_SERIES_TTL);
        }
    }

    /// Removes the reclaim series last touched more than `ttl` ago.
    pub fn prune_reclaims(&self, ttl: std::time::Duration) {
        let mut seen = crate::locked(&self.reclaimed);
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
    pub fn render(&self) -> Result<String> {
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
                r#"lock_janitor_reclaims_total{kind="configmap",lock="op-lock",lock_namespace="ops",reason="Evicted"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(
            "lock_janitor_last_reclaim_timestamp_seconds{kind=\"configmap\",lock=\"op-lock\""
        ));
        m.reclaimed(&LockKey::configmap("ops", "op-lock"), StaleReason::Evicted);
        assert!(m.render().unwrap().contains(
            r#"lock_janitor_reclaims_total{kind="configmap",lock="op-lock",lock_namespace="ops",reason="Evicted"} 2"#
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
