//! What the suites of the real leader-election peers nobody here wrote
//! share (`python.rs`: the official Python client; `fabric8.rs`: fabric8's
//! Java client; `java.rs`: the official Java client): the ConfigMap lock's
//! leader annotation as they write it, the janitor's writes from the audit
//! log, an elector leading, waiting and evicted, timings.

use std::time::{Duration, Instant};

use crate::support::lease::*;
use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::Api;
use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testenv::elector::{Elector, ElectorLock, Peer};
use lock_janitor_testenv::kubelet;
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

/// Starts a `peer` elector in `s`'s namespace as pod `pod`'s candidate.
pub(crate) fn elector(
    s: &Scenario,
    peer: Peer,
    kind: ElectorLock,
    lock: &str,
    pod: &str,
) -> Elector {
    Elector::start(
        peer,
        s.cp.kubeconfig_path(),
        s.cp.dir(),
        kind,
        [&s.ns, lock, pod],
    )
    .unwrap_or_else(|e| panic!("start the {peer:?} elector {pod}: {e}"))
}

/// Waits until `p` leads (a JVM's or an interpreter's start included).
pub(crate) async fn leads(p: &mut Elector, who: &str) {
    p.wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{who}: {e}"));
}

/// Waits until the follower `p` has found the lock held and waits: its
/// library's own log `line`, and, when its elector prints one, its
/// `NEW LEADER` line for `holder`; checks it does not lead.
pub(crate) async fn waits(p: &Elector, line: &str, new_leader: Option<&str>) {
    wait_for("the follower waiting", Duration::from_secs(60), || async {
        p.logs().contains(line).then_some(())
    })
    .await;
    if let Some(holder) = new_leader {
        let reported = format!("NEW LEADER {holder}\n");
        wait_for(
            "the follower's onNewLeader",
            Duration::from_secs(10),
            || async { p.output().contains(&reported).then_some(()) },
        )
        .await;
    }
    assert!(!p.is_leading(), "a second leader: {}", p.logs());
}

/// The kubelet evicts `pod`: its elector is killed first (no chance to give
/// anything up), then its status is written Failed. The instant and time of
/// the death.
pub(crate) async fn evict(s: &Scenario, leader: &mut Elector, pod: &str) -> (Instant, Timestamp) {
    leader.kill();
    kubelet::set_failed(
        &s.client,
        &s.ns,
        pod,
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .expect("failed");
    (Instant::now(), Timestamp::now())
}

/// The one write of the janitor: after the death, a success.
pub(crate) fn the_one_write(writes: &[AuditEvent], died_at: Timestamp) -> &AuditEvent {
    assert_eq!(writes.len(), 1, "{writes:#?}");
    let w = &writes[0];
    assert!(matches!(w.verb.as_str(), "update" | "patch"), "{w:?}");
    assert_eq!(w.code, Some(200), "{w:?}");
    assert!(received(w) >= died_at, "{w:?}");
    w
}

/// No line of the library says it failed to read or write the lock: none
/// of `bad` in its log.
pub(crate) fn no_lock_errors(p: &Elector, bad: &[&str]) {
    let logs = p.logs();
    for bad in bad {
        assert!(!logs.contains(bad), "{bad} in the elector's log:\n{logs}");
    }
}

/// The leader renews the Lease `lease` (every 2 s): the janitor sees it and
/// judges it a few times more. It writes nothing of it, and the follower
/// `b` does not lead.
pub(crate) async fn lease_renewed_untouched(s: &Scenario, j: &Janitor, lease: &str, b: &Elector) {
    s.renewed_times(lease, 3, Duration::from_secs(30)).await;
    j.wait_sweeps(2).await;
    s.renewed_times(lease, 1, Duration::from_secs(30)).await;
    assert!(
        s.lease_writes().is_empty(),
        "the janitor wrote the Lease of a leader that renews: {:#?}\n{}",
        s.lease_writes(),
        j.logs()
    );
    assert!(!b.is_leading(), "{}", b.logs());
}

/// The leader renews the ConfigMap lock `cm`: the janitor sees it and
/// judges it a few times more.
pub(crate) async fn cm_renewed_around_sweeps(s: &Scenario, j: &Janitor, cm: &str) {
    cm_renewed(s, cm, 3).await;
    j.wait_sweeps(2).await;
    cm_renewed(s, cm, 1).await;
}

/// While the leader renews, the janitor has written nothing, and the
/// follower `b` does not lead.
pub(crate) fn nothing_written_yet(s: &Scenario, j: &Janitor, b: &Elector) {
    assert!(
        janitor_writes(s).is_empty(),
        "the janitor wrote while the leader renews: {:#?}\n{}",
        janitor_writes(s),
        j.logs()
    );
    assert!(!b.is_leading(), "{}", b.logs());
}

/// A Lease's takeover as the janitor says it: one reclaim of `lease`
/// counted (Evicted), a `LockTakenOver` naming `new`, and no write of the
/// janitor but to Leases.
pub(crate) async fn lease_takeover_said(s: &Scenario, j: &Janitor, lease: &str, new: &str) {
    let m = metrics_reclaimed(j, &[("kind", "lease"), ("lock", lease)], 1.0).await;
    assert_eq!(
        sample(
            &m,
            "lock_janitor_reclaims_total",
            &[("kind", "lease"), ("lock", lease), ("reason", "Evicted")]
        ),
        Some(1.0),
        "{m}"
    );
    let taken = wait_event(&s.client, &s.ns, "LockTakenOver", lease).await;
    assert!(
        taken.note.as_deref().unwrap_or_default().contains(new),
        "{taken:?}"
    );
    assert!(janitor_writes(s)
        .iter()
        .all(|e| e.resource.as_deref() == Some("leases")));
}

/// The follower `b` (pod `follower`, a `client` elector, e.g. "Python
/// LeaseLock") leads within [`TAKEOVER`] of the death, before the lease
/// from `last_renewal` ran out (alone it would have waited for that), and
/// the Lease's record names it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn lease_taken_in_time(
    s: &Scenario,
    j: &Janitor,
    b: &mut Elector,
    lease: &str,
    follower: &str,
    client: &str,
    died: Instant,
    last_renewal: Timestamp,
) {
    b.wait_leading(TAKEOVER).await.unwrap_or_else(|e| {
        panic!(
            "{follower} after its leader's eviction: {e}\njanitor:\n{}",
            j.logs()
        )
    });
    eprintln!(
        "{follower} ({client}) leads {:.1}s after its leader's eviction (lease {}s)",
        died.elapsed().as_secs_f64(),
        LEASE.as_secs()
    );
    assert!(
        Timestamp::now() < last_renewal + SignedDuration::try_from(LEASE).unwrap(),
        "{follower} led only once the lease had run out"
    );
    wait_for(
        &format!("{follower}'s record"),
        Duration::from_secs(10),
        || async { (s.identity(lease).await == follower).then_some(()) },
    )
    .await;
}
