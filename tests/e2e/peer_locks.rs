//! What the suites of the real leader-election peers nobody here wrote
//! share (`python.rs`: the official Python client; `fabric8.rs`: fabric8's
//! Java client): the ConfigMap lock's leader annotation as they write it,
//! the janitor's writes from the audit log, timings.

use std::time::{Duration, Instant};

use crate::support::lease::*;
use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::Api;
use lock_janitor_testenv::audit::AuditEvent;
use serde_json::Value;

/// The annotation a ConfigMapLock keeps its record in (both clients).
pub(crate) const LEADER: &str = "control-plane.alpha.kubernetes.io/leader";
/// A leader elected with the peers' timings waits this long, alone.
pub(crate) const LEASE: Duration = Duration::from_secs(60);
/// The takeover the janitor must make possible (issue 47): well inside it.
pub(crate) const TAKEOVER: Duration = Duration::from_secs(15);

/// A janitor for every lock kind of this namespace (so also the kind of a
/// ConfigMap whose record is the leader annotation), sweeping every 2 s.
pub(crate) async fn janitor_for_all_kinds(s: &Scenario) -> Janitor {
    let kc = kubeconfig_as(s.cp, JANITOR_USER);
    Janitor::start(&kc, &["--namespace", &s.ns, "--resync", "2s"]).await
}

pub(crate) fn configmaps(s: &Scenario) -> Api<ConfigMap> {
    Api::namespaced(s.client.clone(), &s.ns)
}

/// The ConfigMap's leader annotation, verbatim.
pub(crate) async fn annotation(s: &Scenario, cm: &str) -> Option<String> {
    configmaps(s)
        .get_opt(cm)
        .await
        .expect("get the ConfigMap")?
        .metadata
        .annotations?
        .remove(LEADER)
}

/// The ConfigMap's leader record, as JSON.
pub(crate) async fn record(s: &Scenario, cm: &str) -> Option<Value> {
    serde_json::from_str(&annotation(s, cm).await?).ok()
}

pub(crate) async fn cm_holder(s: &Scenario, cm: &str) -> Option<String> {
    Some(record(s, cm).await?["holderIdentity"].as_str()?.to_owned())
}

pub(crate) async fn label_cm(s: &Scenario, cm: &str) {
    let patch = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: WATCH_LABEL.1}}});
    configmaps(s)
        .patch(cm, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("opt the ConfigMap in");
}

/// Waits until the record's renewTime has changed `n` more times (polled
/// every 200 ms, within 30 s).
pub(crate) async fn cm_renewed(s: &Scenario, cm: &str, n: usize) {
    let renew = || async { record(s, cm).await.map(|r| r["renewTime"].to_string()) };
    let mut seen = renew().await;
    let mut count = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while count < n {
        let now = renew().await;
        if now != seen {
            seen = now;
            count += 1;
        }
        assert!(
            Instant::now() < deadline,
            "{cm} renewed {count} of {n} times within 30s: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The janitor's writes of anything in this namespace but Events (its
/// locks, pods, labels), from the audit log.
pub(crate) fn janitor_writes(s: &Scenario) -> Vec<AuditEvent> {
    lock_janitor_testenv::audit::read(s.cp.audit_log_path())
        .into_iter()
        .filter(|e| {
            e.effective_user() == JANITOR_USER
                && e.namespace.as_deref() == Some(s.ns.as_str())
                && !matches!(e.verb.as_str(), "get" | "list" | "watch")
                && !matches!(e.resource.as_deref(), Some("events"))
        })
        .collect()
}

pub(crate) fn received(e: &AuditEvent) -> Timestamp {
    e.received
        .as_deref()
        .expect("requestReceivedTimestamp")
        .parse()
        .expect("an RFC 3339 time")
}
