//! End-to-end with a real peer nobody here wrote, in Java: the official
//! Kubernetes Java client's `io.kubernetes.client.extended.leaderelection`
//! (Maven Central `io.kubernetes:client-java-extended` 25.0.0,
//! `testenv/peers/java/Elector.java`, built by `hack/java-peer.sh java`),
//! with its `LeaseLock` and its `ConfigMapLock` (the leader record is the
//! ConfigMap's annotation `control-plane.alpha.kubernetes.io/leader`, JSON
//! written by the client's Gson). Candidates' identities are their pods'
//! names; the electors run a 60 s lease, a 50 s renew deadline and a 2 s
//! retry period and are never closed (closing is what would give the lock
//! up). Tests play the kubelet: a pod's death is its status write, and its
//! elector is killed with it. Every write of the janitor is checked in the
//! API server's audit log.
//!
//! The Java client's follower takes a record at once only when its
//! `holderIdentity` is null (absent), or its `acquireTime` or `renewTime` is;
//! a `holderIdentity` of "" is a held record like any other, and then, as
//! for any record that changed, it waits its own 60 s from the moment it saw
//! the change (the record's `leaseDurationSeconds` is never read). Its
//! `LeaseLock` also reads `leaseDurationSeconds` and `leaseTransitions` into
//! Java `int`s: a Lease without either fails every read of the follower.

use std::time::{Duration, Instant};

use crate::peer_locks::{self, *};
use crate::support::lease::*;
use crate::support::*;
use futures::TryStreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{WatchEvent, WatchParams};
use lock_janitor_testenv::elector::{Elector, ElectorLock, Peer};
use serde_json::Value;

/// Starts a Java elector in `s`'s namespace as pod `pod`'s candidate.
fn elector(s: &Scenario, kind: ElectorLock, lock: &str, pod: &str) -> Elector {
    peer_locks::elector(s, Peer::Java, kind, lock, pod)
}

/// Waits until the follower `p` has found the lock held by `holder` and
/// waits (the library's own debug line, and its onNewLeader hook).
async fn waits(p: &Elector, holder: &str) {
    let line = format!("Lock is held by {holder} and has not yet expired");
    peer_locks::waits(p, &line, Some(holder)).await;
}

/// Waits until the follower `b` leads, within [`TAKEOVER`] of the death;
/// the seconds it took. If it does not, it waits on (up to the lease and
/// [`TAKEOVER`] more) to measure when it leads at all, and fails with that
/// time and `context()` (the record, the janitor's writes).
async fn takes_over(b: &mut Elector, died: Instant, context: impl AsyncFnOnce() -> String) -> f64 {
    if let Ok(at) = b.wait_leading(TAKEOVER).await {
        return (at - died).as_secs_f64();
    }
    let late = match b.wait_leading(LEASE + TAKEOVER).await {
        Ok(at) => format!("it led {:.1}s after the death", (at - died).as_secs_f64()),
        Err(e) => format!("it did not lead at all: {e}"),
    };
    panic!(
        "the Java follower did not lead within {TAKEOVER:?} of its leader's death: {late}\n{}\nits output:\n{}its log:\n{}",
        context().await,
        b.output(),
        b.logs()
    );
}

/// No line of the library says it failed to read or write the lock.
fn no_lock_errors(p: &Elector) {
    peer_locks::no_lock_errors(p, &["Exception", "ERROR"]);
}

/// A holder as the Java client reads it: absent or null is no holder (it
/// takes the lock at once), "" a held record.
fn holder(v: &Value) -> Option<&str> {
    v.as_str()
}

/// The Java client's `LeaseLock`: the leader's elector is killed and its
/// pod marked Failed (Evicted); the other candidate, which alone would wait
/// out its 60 s from the last renewal it saw, leads within 15 s because the
/// janitor released the Lease. While the leader renewed, the janitor never
/// wrote the Lease; after the death it wrote it once: client-go's release
/// with no holder at all, as the Lease's managedFields say this client
/// wrote its holder (after a `""` it would wait its own lease from the
/// release: 67 s measured), its int fields there.
#[tokio::test]
async fn java_lease_candidate_leads_within_15s_after_its_leaders_death() {
    let s = scenario("java-lease").await;
    s.pod("java-a").await;
    s.pod("java-b").await;
    let mut a = elector(&s, ElectorLock::Lease, "java-lease", "java-a");
    leads(&mut a, "java-a").await;
    assert_eq!(s.identity("java-lease").await, "java-a");
    let lease = s.leases().get("java-lease").await.unwrap();
    let spec = lease.spec.clone().expect("a spec");
    eprintln!("the Java client's Lease: {spec:?}");
    assert_eq!(spec.lease_duration_seconds, Some(60), "{spec:?}");
    assert_eq!(spec.lease_transitions, Some(0), "{spec:?}");
    s.label("java-lease").await;
    let j = s.janitor().await;
    let mut b = elector(&s, ElectorLock::Lease, "java-lease", "java-b");
    waits(&b, "java-a").await;
    lease_renewed_untouched(&s, &j, "java-lease", &b).await;

    let (died, died_at) = evict(&s, &mut a, "java-a").await;
    let secs = takes_over(&mut b, died, async || {
        format!(
            "the Lease now: {:?}\nthe janitor's writes: {:#?}\njanitor:\n{}",
            s.leases().get("java-lease").await.map(|l| l.spec),
            s.lease_writes(),
            j.logs()
        )
    })
    .await;
    eprintln!(
        "java-b (Java LeaseLock) leads {secs:.1}s after java-a's eviction (lease {}s)",
        LEASE.as_secs()
    );
    wait_for("java-b's record", Duration::from_secs(10), || async {
        (s.identity("java-lease").await == "java-b").then_some(())
    })
    .await;

    // One write of the janitor in all, after the death: the release.
    let writes = s.lease_writes();
    let w = the_one_write(&writes, died_at);
    let body = w.request_object.as_ref().expect("request body");
    eprintln!(
        "the janitor's release of the Java client's Lease: {}",
        body["spec"]
    );
    assert_eq!(body["spec"].get("holderIdentity"), None, "{body}");
    // What the Java client's LeaseLock unboxes into ints on every read.
    assert_eq!(body["spec"]["leaseDurationSeconds"], 1, "{body}");
    assert!(body["spec"]["leaseTransitions"].is_i64(), "{body}");
    lease_takeover_said(&s, &j, "java-lease", "java-b").await;
    no_lock_errors(&b);
}

/// Every leader record the ConfigMap `cm` held after resourceVersion
/// `from`, verbatim and in order, up to the first that names `last`: a
/// watch from `from` (the API server replays every change since), so no
/// record is missed however briefly it stood.
async fn records_since(s: &Scenario, cm: &str, from: &str, last: &str) -> Vec<String> {
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={cm}"))
        .timeout(30);
    let stream = configmaps(s)
        .watch(&wp, from)
        .await
        .expect("watch the ConfigMap");
    let mut stream = std::pin::pin!(stream);
    let mut seen = Vec::new();
    while let Some(ev) = stream.try_next().await.expect("a watch event") {
        let c = match ev {
            WatchEvent::Added(c) | WatchEvent::Modified(c) => c,
            WatchEvent::Error(e) => panic!("watching {cm} from {from}: {e:?}"),
            _ => continue,
        };
        let Some(a) = c.metadata.annotations.and_then(|mut a| a.remove(LEADER)) else {
            continue;
        };
        let done = serde_json::from_str::<Value>(&a).is_ok_and(|r| r["holderIdentity"] == last);
        seen.push(a);
        if done {
            return seen;
        }
    }
    panic!("{cm} named no {last} within the watch: {seen:#?}");
}

/// The record the Java client's ConfigMapLock wrote for `holder`: client-go's
/// field names (`leaseDurationSeconds` a number, 60), its times parseable.
fn assert_java_record(rec: &Value, holder: &str) {
    assert_eq!(rec["holderIdentity"], holder, "{rec}");
    assert_eq!(rec["leaseDurationSeconds"], 60, "{rec}");
    for field in ["acquireTime", "renewTime"] {
        let t = rec[field].as_str().unwrap_or_default();
        t.parse::<Timestamp>()
            .unwrap_or_else(|e| panic!("{field} {t:?}: {e}: {rec}"));
    }
}

/// The Java client's `ConfigMapLock`: the same takeover. The lock is the
/// ConfigMap the library creates (the leader annotation only), opted in
/// with the label. While the leader renews, the janitor never writes it;
/// once the leader is dead it frees it (a write of the annotation), and the
/// follower, which must read that record and find no holder in it, takes
/// it at once and leads within 15 s.
#[tokio::test]
async fn java_configmap_candidate_leads_within_15s_after_its_leaders_death() {
    let s = scenario("java-cm").await;
    s.pod("java-a").await;
    s.pod("java-b").await;
    let mut a = elector(&s, ElectorLock::ConfigMap, "java-cm-lock", "java-a");
    leads(&mut a, "java-a").await;
    let written = annotation(&s, "java-cm-lock")
        .await
        .expect("a leader record");
    eprintln!("the Java client's ConfigMapLock record: {written}");
    let rec: Value = serde_json::from_str(&written).expect("a JSON leader record");
    assert_java_record(&rec, "java-a");
    let cm = configmaps(&s).get("java-cm-lock").await.unwrap();
    assert!(cm.metadata.owner_references.is_none(), "{cm:?}");
    label_cm(&s, "java-cm-lock").await;
    let j = janitor_for_all_kinds(&s).await;
    let mut b = elector(&s, ElectorLock::ConfigMap, "java-cm-lock", "java-b");
    waits(&b, "java-a").await;
    cm_renewed_around_sweeps(&s, &j, "java-cm-lock").await;
    nothing_written_yet(&s, &j, &b);

    let from = configmaps(&s).get("java-cm-lock").await.unwrap();
    let from = from.metadata.resource_version.expect("a resourceVersion");
    let (died, died_at) = evict(&s, &mut a, "java-a").await;
    let secs = takes_over(&mut b, died, async || {
        format!(
            "the record now: {:?}\nthe janitor's writes: {:#?}\njanitor:\n{}",
            annotation(&s, "java-cm-lock").await,
            janitor_writes(&s),
            j.logs()
        )
    })
    .await;
    eprintln!(
        "java-b (Java ConfigMapLock) leads {secs:.1}s after java-a's eviction (lease {}s)",
        LEASE.as_secs()
    );
    wait_for("java-b's record", Duration::from_secs(10), || async {
        (cm_holder(&s, "java-cm-lock").await.as_deref() == Some("java-b")).then_some(())
    })
    .await;
    assert_java_record(&record(&s, "java-cm-lock").await.unwrap(), "java-b");

    // One write of the janitor in all, after the death, of the lock: the
    // release, in place (the label kept).
    let writes = janitor_writes(&s);
    let w = the_one_write(&writes, died_at);
    assert_eq!(w.resource.as_deref(), Some("configmaps"), "{w:?}");
    assert_eq!(w.name.as_deref(), Some("java-cm-lock"), "{w:?}");
    // The audit log keeps no body of a ConfigMap write: the release is the
    // record seen between java-a's and java-b's, one that names no holder.
    let records = records_since(&s, "java-cm-lock", &from, "java-b").await;
    let released: Vec<(&String, Value)> = records
        .iter()
        .map(|a| (a, serde_json::from_str::<Value>(a).expect("JSON")))
        .filter(|(_, r)| !matches!(holder(&r["holderIdentity"]), Some("java-a" | "java-b")))
        .collect();
    assert_eq!(released.len(), 1, "one release: {records:#?}");
    for (a, r) in released {
        eprintln!("the record between java-a's and java-b's: {a}");
        // null, the key there: what this client takes at once.
        assert!(r.get("holderIdentity").is_some_and(Value::is_null), "{r}");
        assert_eq!(r["leaseDurationSeconds"], 1, "{r}");
        assert_eq!(r["leaderTransitions"], 0, "java-a's fields kept: {r}");
    }
    let cm = configmaps(&s).get("java-cm-lock").await.unwrap();
    assert_eq!(
        cm.metadata
            .labels
            .unwrap_or_default()
            .get(WATCH_LABEL.0)
            .map(String::as_str),
        Some(WATCH_LABEL.1)
    );
    no_lock_errors(&b);
    let ev = wait_event(&s.client, &s.ns, "StaleLockReclaimed", "java-cm-lock").await;
    assert_eq!(
        ev.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("ConfigMap")
    );
}
