//! End-to-end with a real peer nobody here wrote, in Java: fabric8's
//! Kubernetes client's `io.fabric8.kubernetes.client.extended.leaderelection`
//! (Maven Central `io.fabric8:kubernetes-client` 8.0.0 with the JDK's HTTP
//! client, `testenv/peers/fabric8/Elector.java`, built by
//! `hack/fabric8-peer.sh`), with its `LeaseLock` and its `ConfigMapLock`.
//! fabric8 writes the ConfigMap's leader annotation
//! `control-plane.alpha.kubernetes.io/leader` in a form of its own:
//! `leaseDuration` (a Java `Duration`, which fabric8 8's Jackson 3 writes
//! in ISO 8601: `"PT1M"`) where client-go writes `leaseDurationSeconds`, and
//! times as
//! `yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'` in UTC. Candidates' identities are their
//! pods' names; the electors run a 60 s lease, a 50 s renew deadline and a
//! 2 s retry period, and do not release on cancel. Tests play the kubelet: a
//! pod's death is its status write, and its elector is killed with it. Every
//! write of the janitor is checked in the API server's audit log.
//!
//! fabric8's follower (6.1 on) takes a record at once when it names no
//! holder (`holderIdentity` "", as the janitor's release writes for
//! fabric8's record and for a Lease, or null); otherwise it waits until the
//! record's own `renewTime` plus its own lease duration has passed.

use std::time::Instant;

use crate::peer_locks::{self, *};
use crate::support::cli::run;
use crate::support::lease::*;
use crate::support::*;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use lock_janitor::kinds::annotation::record;
use lock_janitor_testenv::elector::{Elector, ElectorLock, Peer};
use serde_json::Value;
use std::time::Duration;

/// Starts a fabric8 elector in `s`'s namespace as pod `pod`'s candidate.
fn elector(s: &Scenario, kind: ElectorLock, lock: &str, pod: &str) -> Elector {
    peer_locks::elector(s, Peer::Fabric8, kind, lock, pod)
}

/// Waits until the follower `p` has found the lock held by `holder` and
/// waits (the library's own debug line, and its onNewLeader hook).
async fn waits(p: &Elector, holder: &str) {
    let line = format!("Lock is held by {holder} and has not yet expired");
    peer_locks::waits(p, &line, Some(holder)).await;
}

/// No line of the library says it failed to read or write the lock.
fn no_lock_errors(p: &Elector) {
    peer_locks::no_lock_errors(p, &["Exception", "Error deserializing", "ERROR"]);
}

/// fabric8's `LeaseLock`: the leader's elector is killed and its pod marked
/// Failed (Evicted); the other candidate, which alone would wait until the
/// record's renewTime plus 60 s, leads within 15 s because the janitor
/// released the Lease. While the leader renewed, the janitor never wrote
/// the Lease; after the death it wrote it once, a release.
#[tokio::test]
async fn fabric8_lease_candidate_leads_within_15s_after_its_leaders_death() {
    let s = scenario("f8-lease").await;
    s.pod("f8-a").await;
    s.pod("f8-b").await;
    let mut a = elector(&s, ElectorLock::Lease, "f8-lease", "f8-a");
    leads(&mut a, "f8-a").await;
    assert_eq!(s.identity("f8-lease").await, "f8-a");
    let lease = s.leases().get("f8-lease").await.unwrap();
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.lease_duration_seconds),
        Some(60),
        "{lease:?}"
    );
    s.label("f8-lease").await;
    let j = s.janitor().await;
    let mut b = elector(&s, ElectorLock::Lease, "f8-lease", "f8-b");
    waits(&b, "f8-a").await;
    lease_renewed_untouched(&s, &j, "f8-lease", &b).await;

    let (died, died_at) = evict(&s, &mut a, "f8-a").await;
    let last_renewal = s.renew_time("f8-lease").await.expect("renewed");
    lease_taken_in_time(
        &s,
        &j,
        &mut b,
        "f8-lease",
        "f8-b",
        "fabric8 LeaseLock",
        died,
        last_renewal,
    )
    .await;

    // One write of the janitor in all, after the death: the release.
    let writes = s.lease_writes();
    let w = the_one_write(&writes, died_at);
    let body = w.request_object.as_ref().expect("request body");
    assert_eq!(body["spec"]["holderIdentity"], "", "{body}");
    assert_eq!(body["spec"]["leaseDurationSeconds"], 1, "{body}");
    lease_takeover_said(&s, &j, "f8-lease", "f8-b").await;
    no_lock_errors(&b);
}

/// A Java `Duration` as Jackson writes it, in seconds: fabric8 8 (Jackson
/// 3) writes ISO 8601 (`"PT1M"`, `"PT1M30.5S"`); fabric8 up to 7 (Jackson 2
/// with its JSR-310 module) a number of seconds (`60.000000000`).
fn java_duration_secs(v: &Value) -> Option<f64> {
    if let Some(n) = v.as_f64() {
        return Some(n);
    }
    let mut rest = v.as_str()?.strip_prefix("PT")?;
    let mut secs = 0.0;
    for (unit, factor) in [('H', 3600.0), ('M', 60.0), ('S', 1.0)] {
        if let Some((n, tail)) = rest.split_once(unit) {
            secs += n.parse::<f64>().ok()? * factor;
            rest = tail;
        }
    }
    rest.is_empty().then_some(secs)
}

/// The record fabric8's ConfigMapLock wrote for `holder`: its own fields
/// (`leaseDuration`, a Java Duration: 60 s; no `leaseDurationSeconds`;
/// times with six fractional digits, UTC, `Z`).
fn assert_fabric8_record(rec: &Value, holder: &str) {
    assert_eq!(rec["holderIdentity"], holder, "{rec}");
    let duration = java_duration_secs(&rec["leaseDuration"]);
    assert_eq!(duration, Some(60.0), "leaseDuration: {rec}");
    assert!(rec.get("leaseDurationSeconds").is_none(), "{rec}");
    for field in ["acquireTime", "renewTime"] {
        let t = rec[field].as_str().unwrap_or_default();
        let fabric8_form = t.len() == 27
            && t.ends_with('Z')
            && t.as_bytes()[10] == b'T'
            && t.as_bytes()[19] == b'.'
            && t[20..26].bytes().all(|b| b.is_ascii_digit());
        assert!(fabric8_form, "{field} {t:?}: {rec}");
        t.parse::<Timestamp>()
            .unwrap_or_else(|e| panic!("{field} {t:?}: {e}"));
    }
}

/// fabric8's `ConfigMapLock`: the same takeover. The lock is the ConfigMap
/// the library creates (the leader annotation only), opted in with the
/// label. While the leader renews, `scan` reports it held by its pod and the
/// janitor never writes it; once the leader is dead it frees it (one write
/// of the annotation), and the follower, which must read that record, takes
/// it at once and leads within 15 s.
#[tokio::test]
async fn fabric8_configmap_candidate_leads_within_15s_after_its_leaders_death() {
    let s = scenario("f8-cm").await;
    s.pod("f8-a").await;
    s.pod("f8-b").await;
    let mut a = elector(&s, ElectorLock::ConfigMap, "f8-cm-lock", "f8-a");
    leads(&mut a, "f8-a").await;
    let written = annotation(&s, "f8-cm-lock").await.expect("a leader record");
    eprintln!("fabric8 ConfigMapLock's record: {written}");
    let rec: Value = serde_json::from_str(&written).expect("a JSON leader record");
    assert_fabric8_record(&rec, "f8-a");
    label_cm(&s, "f8-cm-lock").await;
    let j = janitor_for_all_kinds(&s).await;
    let mut b = elector(&s, ElectorLock::ConfigMap, "f8-cm-lock", "f8-b");
    waits(&b, "f8-a").await;
    cm_renewed_around_sweeps(&s, &j, "f8-cm-lock").await;

    // What the janitor makes of fabric8's record while its holder renews.
    let kc = kubeconfig_as(s.cp, JANITOR_USER);
    let scan = run(&kc, &["scan", "-n", &s.ns, "-o", "json"]).await;
    let report = scan.json();
    let row = report["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|r| r["metadata"]["name"] == "f8-cm-lock")
        .unwrap_or_else(|| panic!("scan lists f8-cm-lock: {scan}"))
        .clone();
    eprintln!("scan's row for fabric8's ConfigMapLock: {row:#}");
    assert_eq!(row["spec"]["holder"]["name"], "f8-a", "{row:#}");
    let verdict = row["status"]["verdict"].as_str().unwrap_or_default();
    assert!(verdict.starts_with("held"), "{row:#}");
    nothing_written_yet(&s, &j, &b);

    let (died, died_at) = evict(&s, &mut a, "f8-a").await;
    if let Err(e) = b.wait_leading(TAKEOVER).await {
        panic!(
            "f8-b after f8-a's eviction: {e}\nthe record now: {:?}\njanitor's writes: {:#?}\njanitor:\n{}",
            annotation(&s, "f8-cm-lock").await,
            janitor_writes(&s),
            j.logs()
        );
    }
    eprintln!(
        "f8-b (fabric8 ConfigMapLock) leads {:.1}s after f8-a's eviction (lease {}s)",
        died.elapsed().as_secs_f64(),
        LEASE.as_secs()
    );
    wait_for("f8-b's record", Duration::from_secs(10), || async {
        (cm_holder(&s, "f8-cm-lock").await.as_deref() == Some("f8-b")).then_some(())
    })
    .await;
    // f8-b wrote a record of its own form over the released one.
    assert_fabric8_record(&record(&s, "f8-cm-lock").await.unwrap(), "f8-b");
    eprintln!(
        "f8-b's record: {}",
        annotation(&s, "f8-cm-lock").await.unwrap_or_default()
    );

    // One write of the janitor in all, after the death, of the lock (the
    // audit log keeps no ConfigMap bodies: what a release writes, and that
    // fabric8 reads it, is the next test's).
    let writes = janitor_writes(&s);
    let w = the_one_write(&writes, died_at);
    assert_eq!(w.resource.as_deref(), Some("configmaps"), "{w:?}");
    assert_eq!(w.name.as_deref(), Some("f8-cm-lock"), "{w:?}");
    // f8-b read the released record without an error and counted one
    // transition from it (it fails on any field its record does not have,
    // such as client-go's leaseDurationSeconds, and then never leads); the
    // label stayed through fabric8's writes (JSON merge patches).
    let rec = record(&s, "f8-cm-lock").await.unwrap();
    assert_eq!(rec["leaderTransitions"], 1, "{rec}");
    no_lock_errors(&b);
    let cm = configmaps(&s).get("f8-cm-lock").await.unwrap();
    assert_eq!(
        cm.metadata
            .labels
            .unwrap_or_default()
            .get(WATCH_LABEL.0)
            .map(String::as_str),
        Some(WATCH_LABEL.1)
    );
    let ev = wait_event(&s.client, &s.ns, "StaleLockReclaimed", "f8-cm-lock").await;
    eprintln!("the janitor's Event: {:?}", ev.note);
}

/// Whether fabric8 can read the record the janitor's release writes, apart
/// from when the janitor writes it: the test plays the janitor. f8-a leads
/// with a ConfigMapLock, f8-b follows; f8-a is killed, and the test writes
/// over its record exactly what the janitor's release makes of it
/// (`record::released`). f8-b must read it, find no holder, and take it at
/// once (alone it would wait 60 s from f8-a's last renewal), with no error
/// in its log.
///
/// fabric8's record class fails on any field it does not have: with a
/// release that adds client-go's `leaseDurationSeconds`, fabric8 (7.4.0,
/// 7.9.0 and 8.0.0 alike) logs `Error deserializing LeaderElectionRecord
/// from ConfigMap` (Jackson's `Unrecognized property "leaseDurationSeconds"
/// ... not marked as ignorable`), takes the lock for missing, tries to
/// create it (409 AlreadyExists) and does so again at every retry: it never
/// leads. A record in fabric8's own form with `holderIdentity` "" or null
/// is taken within one retry period (1.3-3.4 s measured); a ConfigMap whose
/// annotation is removed is as stuck as the unreadable record.
#[tokio::test]
async fn fabric8_configmap_follower_takes_the_janitors_released_record() {
    let s = scenario("f8-cm-rel").await;
    let mut a = elector(&s, ElectorLock::ConfigMap, "f8-rel", "f8-a");
    leads(&mut a, "f8-a").await;
    let b = &mut elector(&s, ElectorLock::ConfigMap, "f8-rel", "f8-b");
    waits(b, "f8-a").await;
    a.kill();

    let mut cm = configmaps(&s).get("f8-rel").await.unwrap();
    let annotations = cm.metadata.annotations.as_mut().expect("annotations");
    let was = annotations[LEADER].clone();
    let released = record::released(&was).expect("the janitor releases fabric8's record");
    // "", not null: fabric8 before 6.x cannot read a record without a holder.
    assert!(
        released.starts_with(r#"{"holderIdentity":"","#),
        "{released}"
    );
    assert!(
        record::is_release_of(&was, &released),
        "the delete guard admits it: {released}"
    );
    annotations.insert(LEADER.into(), released.clone());
    configmaps(&s)
        .replace("f8-rel", &PostParams::default(), &cm)
        .await
        .expect("write the released record");
    let written = Instant::now();
    eprintln!("fabric8's record: {was}\nreleased as the janitor does: {released}");
    b.wait_leading(TAKEOVER)
        .await
        .unwrap_or_else(|e| panic!("f8-b after the release: {e}"));
    eprintln!(
        "f8-b leads {:.1}s after the released record was written",
        written.elapsed().as_secs_f64()
    );
    wait_for("f8-b's record", Duration::from_secs(10), || async {
        (cm_holder(&s, "f8-rel").await.as_deref() == Some("f8-b")).then_some(())
    })
    .await;
    let rec = record(&s, "f8-rel").await.unwrap();
    assert_fabric8_record(&rec, "f8-b");
    assert_eq!(rec["leaderTransitions"], 1, "{rec}");
    no_lock_errors(b);
}
