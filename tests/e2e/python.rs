//! End-to-end with a real peer nobody here wrote: the official Kubernetes
//! Python client's `kubernetes.leaderelection` (PyPI `kubernetes` 37.0.2,
//! `testenv/peers/python/elector.py`, its venv made by `hack/python-peer.sh`),
//! with its `LeaseLock` and its `ConfigMapLock` (the leader record is the
//! ConfigMap's annotation `control-plane.alpha.kubernetes.io/leader`, JSON
//! written by Python: `leaseDurationSeconds` a string, times in Python's
//! `str(datetime)` form, local and without a zone). Candidates' identities
//! are their pods' names; the electors run a 60 s lease, a 50 s renew
//! deadline and a 2 s retry period. Tests play the kubelet: a pod's death is
//! its status write, and its elector is killed with it. Every write of the
//! janitor is checked in the API server's audit log.
//!
//! The Python client's follower waits out its own 60 s from the moment it
//! last saw the record change; it takes a record at once only if the record
//! names no holder (holderIdentity "" or null: a Lease release writes "",
//! a record release null) or is missing.

use std::time::{Duration, Instant};

use crate::peer_locks::{self, *};
use crate::support::cli::run;
use crate::support::lease::*;
use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use lock_janitor_testenv::elector::{Elector, ElectorLock, Peer};
use lock_janitor_testenv::kubelet;

/// Starts a Python elector in `s`'s namespace as pod `pod`'s candidate.
fn elector(s: &Scenario, kind: ElectorLock, lock: &str, pod: &str) -> Elector {
    peer_locks::elector(s, Peer::Python, kind, lock, pod)
}

/// Waits until the follower `p` has found the lock held and waits (the
/// library's own log line).
async fn waits(p: &Elector, holder: &str) {
    let line = format!("yet to finish lease_duration, lease held by {holder}");
    peer_locks::waits(p, &line, None).await;
}

/// Python's `LeaseLock`: the leader's elector is killed and its pod marked
/// Failed (Evicted); the other candidate, which alone would wait out its
/// 60 s from the last renewal it saw, leads within 15 s because the janitor
/// released the Lease. While the leader renewed, the janitor never wrote
/// the Lease; after the death it wrote it once, a release.
#[tokio::test]
async fn python_lease_candidate_leads_within_15s_after_its_leaders_death() {
    let s = scenario("py-lease").await;
    s.pod("py-a").await;
    s.pod("py-b").await;
    let mut a = elector(&s, ElectorLock::Lease, "py-lease", "py-a");
    leads(&mut a, "py-a").await;
    assert_eq!(s.identity("py-lease").await, "py-a");
    s.label("py-lease").await;
    let j = s.janitor().await;
    let mut b = elector(&s, ElectorLock::Lease, "py-lease", "py-b");
    waits(&b, "py-a").await;
    lease_renewed_untouched(&s, &j, "py-lease", &b).await;

    // The kubelet evicts py-a: its process is gone, its status Failed.
    a.kill();
    let last_renewal = s.renew_time("py-lease").await.expect("renewed");
    kubelet::set_failed(
        &s.client,
        &s.ns,
        "py-a",
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .expect("failed");
    let died = Instant::now();
    let died_at = Timestamp::now();
    lease_taken_in_time(
        &s,
        &j,
        &mut b,
        "py-lease",
        "py-b",
        "Python LeaseLock",
        died,
        last_renewal,
    )
    .await;

    // One write of the janitor in all, after the death: the release.
    let writes = s.lease_writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(
        (writes[0].verb.as_str(), writes[0].code),
        ("update", Some(200)),
        "{writes:#?}"
    );
    assert!(received(&writes[0]) >= died_at, "{writes:#?}");
    let body = writes[0].request_object.as_ref().expect("request body");
    assert_eq!(body["spec"]["holderIdentity"], "", "{body}");
    assert_eq!(body["spec"]["leaseDurationSeconds"], 1, "{body}");
    lease_takeover_said(&s, &j, "py-lease", "py-b").await;
}

/// Python's `ConfigMapLock`: the same takeover. The lock is the ConfigMap
/// the library creates (no owner, no data, the leader annotation only),
/// opted in with the label. While the leader renews, the janitor never
/// writes it; once the leader is dead it frees it (a write of the
/// annotation, as the fourth lock kind does: holderIdentity null and
/// leaseDurationSeconds 1), and the follower, which takes a record naming
/// no holder at once, leads within 15 s.
#[tokio::test]
async fn python_configmap_candidate_leads_within_15s_after_its_leaders_death() {
    let s = scenario("py-cm").await;
    s.pod("py-a").await;
    s.pod("py-b").await;
    let mut a = elector(&s, ElectorLock::ConfigMap, "py-cm-lock", "py-a");
    leads(&mut a, "py-a").await;
    // The record as the Python client writes it.
    let rec = record(&s, "py-cm-lock")
        .await
        .expect("a JSON leader record");
    assert_eq!(rec["holderIdentity"], "py-a", "{rec}");
    assert_eq!(rec["leaseDurationSeconds"], "60", "{rec}");
    let cm = configmaps(&s).get("py-cm-lock").await.unwrap();
    assert!(cm.metadata.owner_references.is_none(), "{cm:?}");
    label_cm(&s, "py-cm-lock").await;
    let j = janitor_for_all_kinds(&s).await;
    let mut b = elector(&s, ElectorLock::ConfigMap, "py-cm-lock", "py-b");
    waits(&b, "py-a").await;
    cm_renewed_around_sweeps(&s, &j, "py-cm-lock").await;
    // The label stayed through the library's renewals (each a PUT of the
    // object it read).
    let cm = configmaps(&s).get("py-cm-lock").await.unwrap();
    assert_eq!(
        cm.metadata
            .labels
            .unwrap_or_default()
            .get(WATCH_LABEL.0)
            .map(String::as_str),
        Some(WATCH_LABEL.1)
    );
    nothing_written_yet(&s, &j, &b);

    // The kubelet evicts py-a.
    a.kill();
    let at_kill = annotation(&s, "py-cm-lock").await.expect("a record");
    kubelet::set_failed(
        &s.client,
        &s.ns,
        "py-a",
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .expect("failed");
    let died = Instant::now();
    let died_at = Timestamp::now();
    if let Err(e) = b.wait_leading(TAKEOVER).await {
        panic!(
            "py-b after py-a's eviction: {e}\nthe record at the kill: {at_kill}\nthe record now: {:?}\njanitor's writes: {:#?}\njanitor:\n{}",
            annotation(&s, "py-cm-lock").await,
            janitor_writes(&s),
            j.logs()
        );
    }
    eprintln!(
        "py-b (Python ConfigMapLock) leads {:.1}s after py-a's eviction (lease {}s)",
        died.elapsed().as_secs_f64(),
        LEASE.as_secs()
    );
    wait_for("py-b's record", Duration::from_secs(10), || async {
        (cm_holder(&s, "py-cm-lock").await.as_deref() == Some("py-b")).then_some(())
    })
    .await;

    // One write of the janitor in all, after the death, of the lock: it
    // frees it in place (the follower's own record lands in the same
    // ConfigMap, the label kept).
    let writes = janitor_writes(&s);
    assert_eq!(writes.len(), 1, "{writes:#?}");
    let w = &writes[0];
    assert_eq!(w.resource.as_deref(), Some("configmaps"), "{w:?}");
    assert_eq!(w.name.as_deref(), Some("py-cm-lock"), "{w:?}");
    assert!(matches!(w.verb.as_str(), "update" | "patch"), "{w:?}");
    assert_eq!(w.code, Some(200), "{w:?}");
    assert!(received(w) >= died_at, "{w:?}");
    let cm = configmaps(&s).get("py-cm-lock").await.unwrap();
    assert_eq!(
        cm.metadata
            .labels
            .unwrap_or_default()
            .get(WATCH_LABEL.0)
            .map(String::as_str),
        Some(WATCH_LABEL.1)
    );
    let ev = wait_event(&s.client, &s.ns, "StaleLockReclaimed", "py-cm-lock").await;
    assert_eq!(
        ev.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("ConfigMap")
    );
}

/// A labeled ConfigMap whose leader annotation is no JSON record (a
/// Python record cut short), its holder's pod dead: reported as a lock the
/// janitor cannot judge (an UnmanageableLock Event naming the annotation),
/// never written. (The Python client itself treats it as unheld and
/// overwrites it; no elector runs on it here.)
#[tokio::test]
async fn python_configmap_with_an_unparsable_record_is_reported_and_never_written() {
    let s = scenario("py-cm-garbled").await;
    s.pod("py-a").await;
    kubelet::set_failed(&s.client, &s.ns, "py-a", "Evicted", "test")
        .await
        .expect("failed");
    let garbled = r#"{"holderIdentity": "py-a", "leaseDurationSeconds": "60", "acquireTime": "2026-12-06 23:06:26.782255", "renewTime": "2026-12-06 23:0"#;
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("py-garbled".into()),
            labels: Some([(WATCH_LABEL.0.into(), WATCH_LABEL.1.into())].into()),
            annotations: Some([(LEADER.into(), garbled.into())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    configmaps(&s)
        .create(&PostParams::default(), &cm)
        .await
        .expect("create the ConfigMap");
    let j = janitor_for_all_kinds(&s).await;
    let ev = wait_event(&s.client, &s.ns, "UnmanageableLock", "py-garbled").await;
    let note = ev.note.unwrap_or_default();
    assert!(
        note.contains(LEADER),
        "the report names the annotation it cannot read: {note}"
    );
    j.wait_sweeps(3).await;
    assert!(
        janitor_writes(&s).is_empty(),
        "{:#?}\n{}",
        janitor_writes(&s),
        j.logs()
    );
    assert_eq!(annotation(&s, "py-garbled").await.as_deref(), Some(garbled));
}

/// Records the Python client wrote whose holder names no pod: one whose
/// identity is a pod name no pod has (`nobody-here`), one whose identity
/// cannot be a pod name (`10.0.0.7:8443`), their electors gone. The first
/// is reported by `scan` with that holder and is not stale (a pod that is
/// not there proves nothing dead: it expires by itself), even with the
/// shortest `--owner-gone-grace`; the second is reported as unmanageable
/// with its identity. Neither is ever written.
#[tokio::test]
async fn python_configmap_records_naming_no_pod_are_reported_and_never_written() {
    let s = scenario("py-cm-nopod").await;
    for (lock, identity) in [("py-nobody", "nobody-here"), ("py-addr", "10.0.0.7:8443")] {
        let mut p = elector(&s, ElectorLock::ConfigMap, lock, identity);
        leads(&mut p, identity).await;
        p.kill();
        assert_eq!(cm_holder(&s, lock).await.as_deref(), Some(identity));
        label_cm(&s, lock).await;
    }
    let before = (
        annotation(&s, "py-nobody").await,
        annotation(&s, "py-addr").await,
    );
    // The shortest owner-gone grace: a holder that names no pod must not
    // pass for an operator-lib owner that is gone (reclaimed once the
    // grace is over), however short the grace.
    let kc = kubeconfig_as(s.cp, JANITOR_USER);
    let j = Janitor::start(
        &kc,
        &[
            "--namespace",
            &s.ns,
            "--resync",
            "2s",
            "--owner-gone-grace",
            "1s",
        ],
    )
    .await;

    let ev = wait_event(&s.client, &s.ns, "UnmanageableLock", "py-addr").await;
    let note = ev.note.unwrap_or_default();
    assert!(note.contains("10.0.0.7:8443"), "{note}");
    let scan = run(
        &kc,
        &[
            "scan",
            "-n",
            &s.ns,
            "--owner-gone-grace",
            "1s",
            "-o",
            "json",
        ],
    )
    .await;
    let report = scan.json();
    let row = report["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|r| r["metadata"]["name"] == "py-nobody")
        .unwrap_or_else(|| panic!("scan lists py-nobody: {scan}"))
        .clone();
    assert_eq!(row["spec"]["holder"]["name"], "nobody-here", "{row:#}");
    let verdict = row["status"]["verdict"].as_str().unwrap_or_default();
    assert!(verdict.starts_with("held"), "{row:#}");

    j.wait_sweeps(3).await;
    assert!(
        janitor_writes(&s).is_empty(),
        "{:#?}\n{}",
        janitor_writes(&s),
        j.logs()
    );
    let after = (
        annotation(&s, "py-nobody").await,
        annotation(&s, "py-addr").await,
    );
    assert_eq!(after, before);
}
