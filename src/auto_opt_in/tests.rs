use super::*;
use crate::fixtures::Received;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

#[test]
fn a_lease_is_looked_at_after_a_change_of_holder_not_per_renewal() {
    let now: Timestamp = "2026-12-06T20:00:00Z".parse().unwrap();
    let ago = |s: i64| now - SignedDuration::from_secs(s);
    let lease = |created: i64, acquired: Option<i64>| Lease {
        metadata: ObjectMeta {
            creation_timestamp: Some(Time(ago(created))),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            acquire_time: acquired.map(|a| MicroTime(ago(a))),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    };
    assert!(changed_lately(&lease(2, Some(2)), now), "new");
    assert!(changed_lately(&lease(3600, Some(5)), now), "a new holder");
    assert!(!changed_lately(&lease(3600, Some(3600)), now), "a renewal");
    assert!(!changed_lately(&lease(3600, None), now));
    assert!(changed_lately(&lease(1, None), now), "new, no acquire time");
}

/// A holder whose clock is ahead writes an acquireTime in the future:
/// that is not a change of lately, else every renewal would be judged
/// for as long as the clock is ahead (an hour fast: an hour).
#[test]
fn a_time_ahead_of_now_is_not_lately() {
    let now: Timestamp = "2026-12-06T20:00:00Z".parse().unwrap();
    let at = |s: i64| now + SignedDuration::from_secs(s);
    let lease = |created: i64, acquired: i64| Lease {
        metadata: ObjectMeta {
            creation_timestamp: Some(Time(at(created))),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            acquire_time: Some(MicroTime(at(acquired))),
            renew_time: Some(MicroTime(at(acquired))),
            ..Default::default()
        }),
    };
    assert!(!changed_lately(&lease(-86400, 3600), now), "an hour ahead");
    assert!(!changed_lately(&lease(-86400, 1), now), "a second ahead");
    assert!(changed_lately(&lease(-86400, 0), now), "acquired now");
    assert!(changed_lately(&lease(-86400, -29), now));
    assert!(!changed_lately(&lease(-86400, -30), now), "RECENT run out");
}

fn configmap(rv: &str, label: Option<&str>) -> serde_json::Value {
    let mut cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "op-lock", "namespace": "ops", "uid": "cm-uid", "resourceVersion": rv,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "op-1", "uid": "pod-uid"}]}});
    if let Some(v) = label {
        cm["metadata"]["labels"] = serde_json::json!({"lock-janitor.io/watch": v});
    }
    cm
}

fn auto(client: Client) -> (Arc<AutoOptIn>, Metrics) {
    auto_of(client, vec![LockKind::ConfigMap])
}

fn auto_of(client: Client, kinds: Vec<LockKind>) -> (Arc<AutoOptIn>, Metrics) {
    let metrics = Metrics::new().unwrap();
    let a = AutoOptIn::new(
        client,
        Gate::always(),
        metrics.clone(),
        Settings {
            key: "lock-janitor.io/watch".into(),
            value: "true".into(),
            namespaces: vec!["ops".into()],
            exclusions: Exclusions::parse("kube-system").unwrap(),
            kinds,
            own_lease: None,
            retry: Duration::from_secs(300),
            write: true,
        },
    );
    (a, metrics)
}

const CM: &str = "/api/v1/namespaces/ops/configmaps/op-lock";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/op-lease";
const PODS: &str = "/api/v1/namespaces/ops/pods";
const HOLDER: &str = "op-7d9c-x2x_0c3e5a12-4b1f-4a2e-9d7c-1f2e3d4c5b6a";

/// A renewed Lease of `ops` held by `HOLDER` (host `op-7d9c-x2x`),
/// acquired `acquired` seconds ago.
fn renewed_lease(rv: &str, acquired: i64, label: Option<&str>) -> Lease {
    let now = Timestamp::now();
    let at = MicroTime(now - SignedDuration::from_secs(acquired));
    Lease {
        metadata: ObjectMeta {
            namespace: Some("ops".into()),
            name: Some("op-lease".into()),
            uid: Some("lease-uid".into()),
            resource_version: Some(rv.into()),
            creation_timestamp: Some(Time(now - SignedDuration::from_secs(86400))),
            labels: label.map(|v| [("lock-janitor.io/watch".into(), v.into())].into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(HOLDER.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(at.clone()),
            renew_time: Some(at),
            ..Default::default()
        }),
    }
}

fn json<T: serde::Serialize>(o: &T) -> serde_json::Value {
    let mut v = serde_json::to_value(o).unwrap();
    v["apiVersion"] = "coordination.k8s.io/v1".into();
    v["kind"] = "Lease".into();
    v
}

/// A page of `ops`'s pods, named `names`.
fn pods(names: &[&str]) -> serde_json::Value {
    let items: Vec<serde_json::Value> = names
        .iter()
        .map(|n| serde_json::json!({"metadata": {"name": n, "namespace": "ops", "uid": format!("{n}-uid")}}))
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
}

fn calls(received: &Received) -> Vec<(String, String)> {
    received
        .lock()
        .unwrap()
        .iter()
        .map(|(m, u, _)| {
            (
                m.clone(),
                u.split('?').next().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn call_of(m: &str, p: &str) -> (String, String) {
    (m.to_owned(), p.to_owned())
}

/// The API's answer to the `LockOptedIn` Event in namespace ops.
fn opted_in_event() -> crate::fixtures::Exchange {
    let event = serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e", "namespace": "ops"}, "eventTime": "2026-12-06T20:00:00.000000Z"});
    let events = "/apis/events.k8s.io/v1/namespaces/ops/events";
    crate::fixtures::Exchange::new("POST", events, 201, event)
}

/// Waits until no judgement runs.
async fn settled(a: &AutoOptIn) {
    for _ in 0..500 {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        if crate::locked(&a.state).running.is_empty() {
            return;
        }
    }
    panic!("judgements still running");
}

/// A renewed Lease that is no candidate (its holder names no pod) is
/// judged once after its change of holder, not again at each renewal
/// within `RECENT`; deleted, it is forgotten whole.
#[tokio::test]
async fn a_lease_found_no_candidate_is_not_judged_at_each_renewal() {
    use crate::fixtures::{scripted, Exchange};
    let (client, received) = scripted(vec![
        Exchange::new("GET", LEASE, 200, json(&renewed_lease("7", 2, None))),
        Exchange::new("GET", PODS, 200, pods(&["someone-else"])),
    ]);
    let (a, m) = auto_of(client, vec![LockKind::Lease]);
    let key = LockKey::lease("ops", "op-lease");
    let l = renewed_lease("7", 2, None);
    assert!(
        a.look_again(&key, &l, HOLDER, Timestamp::now()),
        "a new holder"
    );
    a.clone().judge_soon(key.clone(), None);
    settled(&a).await;
    assert_eq!(
        calls(&received),
        [call_of("GET", LEASE), call_of("GET", PODS)],
        "judged: no candidate"
    );
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="lease""#),
        "0"
    );
    // Its renewals within RECENT: not judged again.
    for rv in ["8", "9", "10"] {
        let l = renewed_lease(rv, 4, None);
        assert!(
            !a.look_again(&key, &l, HOLDER, Timestamp::now()),
            "renewal {rv} judged again"
        );
    }
    // Another holder is judged.
    assert!(a.look_again(&key, &l, "op-other", Timestamp::now()));
    // Deleted: forgotten, judged when it comes back.
    a.forget(&key);
    assert!(crate::locked(&a.state).judged.is_empty());
    assert!(a.look_again(&key, &l, HOLDER, Timestamp::now()));
}

/// A candidate whose read failed stays counted as unprotected and is
/// judged (and labeled) again with the retries.
#[tokio::test]
async fn a_candidate_whose_read_failed_is_retried() {
    use crate::fixtures::{scripted, status, Exchange};
    let (client, received) = scripted(vec![
        Exchange::new("GET", CM, 500, status(500, "InternalError")),
        Exchange::new("GET", CM, 200, configmap("7", None)),
        Exchange::new("PATCH", CM, 200, configmap("8", Some("true"))),
    ]);
    let (a, m) = auto(client);
    let key = LockKey::configmap("ops", "op-lock");
    a.judge_and_label(&key, None).await;
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="configmap""#),
        "1",
        "a read that failed: still (maybe) unprotected"
    );
    a.retry_unprotected();
    settled(&a).await;
    let c = calls(&received);
    assert_eq!(
        &c[..3],
        [call_of("GET", CM), call_of("GET", CM), call_of("PATCH", CM)],
        "{c:?}"
    );
    assert_eq!(
        value(&m, "lock_janitor_opt_ins_total", r#"kind="configmap""#),
        "1"
    );
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="configmap""#),
        "0"
    );
}

/// The listed Leases of a namespace whose pod list failed are counted
/// as unprotected, and retried: read, their pods listed, labeled.
#[tokio::test]
async fn leases_whose_pod_list_failed_are_retried() {
    use crate::fixtures::{scripted, status, Exchange};
    let labeled = json(&renewed_lease("8", 3600, Some("true")));
    let (client, received) = scripted(vec![
        Exchange::new("GET", PODS, 500, status(500, "InternalError")),
        Exchange::new("GET", LEASE, 200, json(&renewed_lease("7", 3600, None))),
        Exchange::new("GET", PODS, 200, pods(&["op-7d9c-x2x"])),
        Exchange::new("PATCH", LEASE, 200, labeled),
    ]);
    let (a, m) = auto_of(client, vec![LockKind::Lease]);
    let key = LockKey::lease("ops", "op-lease");
    let listed = vec![Listed {
        key: key.clone(),
        host: "op-7d9c-x2x".into(),
        uid: "lease-uid".into(),
        identity: HOLDER.into(),
    }];
    a.clone()
        .judge_listed_leases("ops".into(), listed)
        .await
        .unwrap();
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="lease""#),
        "1",
        "a pod list that failed: still (maybe) unprotected"
    );
    a.retry_unprotected();
    settled(&a).await;
    let c = calls(&received);
    assert_eq!(
        &c[..4],
        [
            call_of("GET", PODS),
            call_of("GET", LEASE),
            call_of("GET", PODS),
            call_of("PATCH", LEASE)
        ],
        "{c:?}"
    );
    assert_eq!(
        value(&m, "lock_janitor_opt_ins_total", r#"kind="lease""#),
        "1"
    );
}

/// Counted as unprotected (by a standby, say) days ago: on taking the
/// lead the Lease's pods are listed again, and a holder that names no
/// pod any more (or several) is not labeled.
#[tokio::test]
async fn a_retry_checks_the_pods_again_before_labeling_a_lease() {
    use crate::fixtures::{scripted, Exchange};
    let (client, received) = scripted(vec![
        Exchange::new("GET", LEASE, 200, json(&renewed_lease("7", 86400, None))),
        // Its holder's pod is gone since.
        Exchange::new("GET", PODS, 200, pods(&["op-8f00-a1a"])),
    ]);
    let (a, m) = auto_of(client, vec![LockKind::Lease]);
    let key = LockKey::lease("ops", "op-lease");
    a.unprotected(&key, "lease-uid", HOLDER);
    a.retry_unprotected();
    settled(&a).await;
    let c = calls(&received);
    assert_eq!(
        c.iter().filter(|(m, _)| m == "PATCH").count(),
        0,
        "labeled without a look at the pods: {c:?}"
    );
    assert_eq!(
        &c[..2],
        [call_of("GET", LEASE), call_of("GET", PODS)],
        "{c:?}"
    );
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="lease""#),
        "0",
        "no candidate now"
    );
}

fn value(m: &Metrics, name: &str, labels: &str) -> String {
    let text = m.render().unwrap();
    let line = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .unwrap_or("absent")
        .to_owned()
}

/// A 409 reads and judges again: the second read still a candidate is
/// labeled (its own resourceVersion in the patch), and said.
#[tokio::test]
async fn a_conflict_reads_and_judges_again() {
    use crate::fixtures::{scripted, status, Exchange};
    let (client, received) = scripted(vec![
        Exchange::new("GET", CM, 200, configmap("7", None)),
        Exchange::new("PATCH", CM, 409, status(409, "Conflict")),
        Exchange::new("GET", CM, 200, configmap("9", None)),
        Exchange::new("PATCH", CM, 200, configmap("10", Some("true"))),
        opted_in_event(),
    ]);
    let (a, m) = auto(client);
    a.judge_and_label(&LockKey::configmap("ops", "op-lock"), None)
        .await;
    let received = received.lock().unwrap().clone();
    let calls: Vec<(&str, &str)> = received
        .iter()
        .map(|(m, u, _)| (m.as_str(), u.split('?').next().unwrap_or_default()))
        .collect();
    assert_eq!(
        &calls[..4],
        [("GET", CM), ("PATCH", CM), ("GET", CM), ("PATCH", CM)],
        "{received:#?}"
    );
    assert_eq!(received[3].2["metadata"]["resourceVersion"], "9");
    assert_eq!(
        calls.get(4).map(|c| c.0),
        Some("POST"),
        "the LockOptedIn Event"
    );
    assert_eq!(received[4].2["reason"], "LockOptedIn", "{received:#?}");
    assert_eq!(
        value(&m, "lock_janitor_opt_ins_total", r#"kind="configmap""#),
        "1"
    );
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="configmap""#),
        "0"
    );
}

/// A judgement asked for while one of the same lock runs (its label
/// removed right after it was written) is made once more when the first
/// ends, never dropped: the lock is read again.
#[tokio::test]
async fn a_judgement_asked_for_meanwhile_runs_after_the_first() {
    use crate::fixtures::{scripted, Exchange};
    let (client, received) = scripted(vec![
        Exchange::new("GET", CM, 200, configmap("7", None)),
        Exchange::new("PATCH", CM, 200, configmap("8", Some("true"))),
        opted_in_event(),
        Exchange::new("GET", CM, 200, configmap("8", Some("true"))),
    ]);
    let (a, _m) = auto(client);
    let key = LockKey::configmap("ops", "op-lock");
    a.clone().judge_soon(key.clone(), None);
    a.clone().judge_soon(key, None);
    settled(&a).await;
    let events = "/apis/events.k8s.io/v1/namespaces/ops/events";
    assert_eq!(
        calls(&received),
        [
            call_of("GET", CM),
            call_of("PATCH", CM),
            call_of("POST", events),
            call_of("GET", CM),
        ],
        "read again after the first"
    );
}

/// Read again after a 409, the lock carries the key with another value
/// (someone opted it out meanwhile): nothing more is written.
#[tokio::test]
async fn an_opt_out_made_meanwhile_is_never_overwritten() {
    use crate::fixtures::{scripted, status, Exchange};
    let (client, received) = scripted(vec![
        Exchange::new("GET", CM, 200, configmap("7", None)),
        Exchange::new("PATCH", CM, 409, status(409, "Conflict")),
        Exchange::new("GET", CM, 200, configmap("9", Some("false"))),
    ]);
    let (a, m) = auto(client);
    a.judge_and_label(&LockKey::configmap("ops", "op-lock"), None)
        .await;
    assert_eq!(received.lock().unwrap().len(), 3);
    assert_eq!(
        value(&m, "lock_janitor_opt_ins_total", r#"kind="configmap""#),
        "0"
    );
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="configmap""#),
        "0"
    );
}

/// A refused label is counted as `forbidden`, and the lock stays
/// counted as unprotected; a ConfigMap with data is never written.
#[tokio::test]
async fn a_refusal_is_counted_and_data_is_never_labeled() {
    use crate::fixtures::{scripted, status, Exchange};
    let (client, received) = scripted(vec![
        Exchange::new("GET", CM, 200, configmap("7", None)),
        Exchange::new("PATCH", CM, 403, status(403, "Forbidden")),
    ]);
    let (a, m) = auto(client);
    a.judge_and_label(&LockKey::configmap("ops", "op-lock"), None)
        .await;
    assert_eq!(received.lock().unwrap().len(), 2);
    assert_eq!(
        value(
            &m,
            "lock_janitor_reconcile_errors_total",
            r#"error="forbidden""#
        ),
        "1"
    );
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="configmap""#),
        "1"
    );

    let mut spark = configmap("7", None);
    spark["data"] = serde_json::json!({"spark.conf": "x"});
    let (client, received) = scripted(vec![Exchange::new("GET", CM, 200, spark)]);
    let (a, m) = auto(client);
    a.judge_and_label(&LockKey::configmap("ops", "op-lock"), None)
        .await;
    assert_eq!(received.lock().unwrap().len(), 1, "one read, no write");
    assert_eq!(
        value(&m, "lock_janitor_unprotected_locks", r#"kind="configmap""#),
        "0"
    );
    // Excluded: not even read.
    let (client, received) = scripted(vec![]);
    let (a, _) = auto(client);
    a.judge_and_label(&LockKey::configmap("kube-system", "op-lock"), None)
        .await;
    assert!(received.lock().unwrap().is_empty());
}
