//! Restart leaves no lock unprotected: a lock the janitor reclaimed and a
//! new holder created again, unlabeled, while no janitor ran is labeled by
//! the next janitor (from its own reclaim Events); a restore that cannot
//! read those Events is counted in lock_janitor_restore_failures_total.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};

#[tokio::test]
async fn a_lock_recreated_while_no_janitor_ran_is_labeled_after_the_restart() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "restore").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();
    let kc = kubeconfig_as(cp, JANITOR_USER);
    let args = ["--namespace", ns.as_str(), "--resync", "2s"];
    let mut first = Janitor::start(&kc, &args).await;
    let dead = running_pod(&client, &ns, "op-a", &node).await;
    create_lock(&client, &lock_for("op-lock", &dead, true)).await;
    kubelet::set_failed(&client, &ns, "op-a", "Evicted", "test")
        .await
        .unwrap();
    wait_event(&client, &ns, "StaleLockReclaimed", "op-lock").await;
    first.kill();

    // While no janitor runs, the heir takes over as operator-lib does: its
    // lock has no labels.
    let heir = running_pod(&client, &ns, "op-b", &node).await;
    create_lock(&client, &lock_for("op-lock", &heir, false)).await;

    let second = Janitor::start(&kc, &args).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "the heir's lock labeled",
        Duration::from_secs(30),
        || async {
            let cm = cms.get("op-lock").await.ok()?;
            (cm.metadata.labels?.get(WATCH_LABEL.0).map(String::as_str) == Some(WATCH_LABEL.1))
                .then_some(())
        },
    )
    .await;
    assert!(
        second.logs().contains("created again while no janitor ran"),
        "{}",
        second.logs()
    );
    // One guarded patch of the janitor's, on the heir's lock; no delete.
    let writes: Vec<_> = writes_by(cp, JANITOR_USER, &ns)
        .into_iter()
        .filter(|e| e.resource.as_deref() == Some("configmaps") && e.verb == "patch")
        .collect();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(writes[0].code, Some(200));
    let m = second.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_restore_failures_total", &[]),
        Some(0.0),
        "{m}"
    );
}

/// The record restore reads survives any length of the holder's
/// `status.reason`, which the reclaim's note quotes and nothing bounds: a
/// 4 KiB reason, the lock reclaimed, the janitor SIGKILLed, the heir's lock
/// made again without the opt-in label; the restarted janitor labels it.
/// (Before, the note was cut at 1 KiB with its marker, the selector restore
/// looks for at its end: that reclaim was ignored after the restart.)
#[tokio::test]
async fn a_reclaim_said_with_a_4_kib_reason_is_restored_after_a_kill() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "long-reason").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();
    let kc = kubeconfig_as(cp, JANITOR_USER);
    let args = ["--namespace", ns.as_str(), "--resync", "2s"];
    let mut first = Janitor::start(&kc, &args).await;
    let dead = running_pod(&client, &ns, "op-a", &node).await;
    create_lock(&client, &lock_for("op-lock", &dead, true)).await;
    let reason = format!("Reason{}", "x".repeat(4096 - 6));
    kubelet::set_failed(&client, &ns, "op-a", &reason, "test")
        .await
        .unwrap();
    let ev = wait_event(&client, &ns, "StaleLockReclaimed", "op-lock").await;
    first.kill();

    // While no janitor runs, the heir takes over as operator-lib does: its
    // lock has no labels.
    let heir = running_pod(&client, &ns, "op-b", &node).await;
    create_lock(&client, &lock_for("op-lock", &heir, false)).await;

    let second = Janitor::start(&kc, &args).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "the heir's lock labeled",
        Duration::from_secs(30),
        || async {
            let cm = cms.get("op-lock").await.ok()?;
            (cm.metadata.labels?.get(WATCH_LABEL.0).map(String::as_str) == Some(WATCH_LABEL.1))
                .then_some(())
        },
    )
    .await;
    assert!(
        second.logs().contains("created again while no janitor ran"),
        "{}",
        second.logs()
    );
    // The body was cut, not the marker.
    let note = ev.note.unwrap_or_default();
    assert!(note.len() <= 1024, "{} bytes", note.len());
    assert!(
        note.ends_with("… [selector lock-janitor.io/watch=true]"),
        "{note}"
    );
}

/// A janitor that may not list Events cannot restore what was awaited:
/// it says so and counts it, and goes on working.
#[tokio::test]
async fn a_restore_that_cannot_read_the_events_is_counted() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "restore-fail").await;
    // The janitor's rules without listing Events.
    let role: ClusterRole = Api::<ClusterRole>::all(client.clone())
        .get(JANITOR_USER)
        .await
        .unwrap();
    let rules: Vec<PolicyRule> = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .map(|mut r| {
            if r.resources.as_deref() == Some(&["events".to_string()][..]) {
                r.verbs.retain(|v| v != "list");
            }
            r
        })
        .collect();
    let name = format!("no-event-list-{ns}");
    Api::<ClusterRole>::all(client.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                rules: Some(rules),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    bind_cluster_role(&client, &name, &name).await;
    let j = Janitor::start(
        &kubeconfig_as(cp, &name),
        &["--namespace", ns.as_str(), "--resync", "2s"],
    )
    .await;
    wait_for("the failure counted", Duration::from_secs(30), || async {
        let m = j.metrics().await;
        (sample(&m, "lock_janitor_restore_failures_total", &[]) == Some(1.0)).then_some(())
    })
    .await;
    assert!(
        j.logs()
            .contains("could not read the janitor's reclaim Events"),
        "{}",
        j.logs()
    );
    assert_eq!(j.readyz().await, Some(200), "it goes on working");
}

/// A janitor killed during a burst leaves every lock protected: 200
/// opted-in locks, every holder evicted at once, the janitor SIGKILLed right
/// after its last DELETE (read from the audit log). No StaleLockReclaimed
/// Event may be written at all here (a policy of the test refuses them in
/// this namespace): that is what a kill between a DELETE and its Event
/// leaves, made certain for every lock instead of the last few in flight.
/// The operator's heirs make each lock again without the opt-in label;
/// the next janitor labels every one of them, from the StaleLockReclaiming
/// Events written before each DELETE, and counts no restore failure.
/// (Before them, restore read StaleLockReclaimed alone: nothing was
/// labeled again.) An intent Event has one try of 500 ms: one refused or
/// not answered in time (by a loaded API server, in a burst of 200) may
/// leave no record, and the first janitor says so by name; only those
/// locks, 10% at most, may stay unlabeled.
#[tokio::test]
async fn a_janitor_killed_after_its_deletes_leaves_no_lock_unprotected() {
    use futures::future::join_all;
    const LOCKS: usize = 200;
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "killed").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();

    // Lose every StaleLockReclaimed Event of this namespace.
    let policy = refuse_events(&client, &ns, "StaleLockReclaimed").await;

    let names: Vec<String> = (0..LOCKS).map(|i| format!("op-{i}")).collect();
    join_all(names.iter().map(|n| {
        let (client, ns, node) = (&client, &ns, &node);
        async move {
            let pod = running_pod(client, ns, &format!("{n}-a"), node).await;
            create_lock(client, &lock_for(n, &pod, true)).await;
        }
    }))
    .await;
    let kc = kubeconfig_as(cp, JANITOR_USER);
    let args = ["--namespace", ns.as_str(), "--resync", "30s"];
    let mut first = Janitor::start(&kc, &args).await;
    join_all(names.iter().map(|n| {
        let (client, ns) = (&client, &ns);
        async move {
            kubelet::set_failed(client, ns, &format!("{n}-a"), "Evicted", "test")
                .await
                .unwrap()
        }
    }))
    .await;
    let deleted = |cp| {
        writes_by(cp, JANITOR_USER, &ns)
            .into_iter()
            .filter(|e| {
                e.resource.as_deref() == Some("configmaps")
                    && e.verb == "delete"
                    && e.code == Some(200)
            })
            .count()
    };
    wait_for("every lock deleted", Duration::from_secs(120), || async {
        (deleted(cp) == LOCKS).then_some(())
    })
    .await;
    // Refused, each try: the policy took the Events. (The reports follow
    // the burst's writes, so the first tries come about when the last
    // DELETE does; most are still under way at the kill.)
    let refused = |l: &str| {
        l.contains("could not write Event")
            && l.contains("reason=\"StaleLockReclaimed\"")
            && l.contains("lost, as a SIGKILL would lose it")
    };
    wait_for(
        "a StaleLockReclaimed refused",
        Duration::from_secs(10),
        || async { first.logs().lines().any(refused).then_some(()) },
    )
    .await;
    first.kill();
    let unsaid: HashSet<String> = first
        .logs()
        .lines()
        .filter(|l| l.contains("the reclaim's intent Event could not be written"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("lock="))
                .map(str::to_owned)
        })
        .collect();
    assert!(
        unsaid.len() <= LOCKS / 10,
        "intent Events not written: {} of {LOCKS}",
        unsaid.len()
    );
    let recorded: Vec<&String> = names.iter().filter(|n| !unsaid.contains(*n)).collect();

    // While no janitor runs, each heir takes over as operator-lib does: its
    // lock has no labels.
    join_all(names.iter().map(|n| {
        let (client, ns, node) = (&client, &ns, &node);
        async move {
            let heir = running_pod(client, ns, &format!("{n}-b"), node).await;
            create_lock(client, &lock_for(n, &heir, false)).await;
        }
    }))
    .await;

    let second = Janitor::start(&kc, &args).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // The recorded locks not labeled yet.
    let unlabeled = || async {
        let labeled: HashSet<String> = cms
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|cm| {
                cm.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(WATCH_LABEL.0))
                    .map(String::as_str)
                    == Some(WATCH_LABEL.1)
            })
            .filter_map(|cm| cm.metadata.name)
            .collect();
        recorded.iter().filter(|n| !labeled.contains(**n)).count()
    };
    // The restart's own read of each lock is its follower's first look
    // (src/takeover): the labels are written once the janitor has synced,
    // 20 a second, without waiting on the followers' 2 looks a second.
    let restarted = std::time::Instant::now();
    let all = tokio::time::timeout(Duration::from_secs(300), async {
        while unlabeled().await != 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    if all.is_err() {
        let logs = second.logs();
        let tail: Vec<&str> = logs.lines().rev().take(60).collect();
        panic!(
            "{} of {} recorded heirs' locks unlabeled after 300 s; the janitor's last lines:\n{}",
            unlabeled().await,
            recorded.len(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    eprintln!(
        "{} heirs' locks labeled {:.1}s after the restarted janitor was ready ({} intents not written)",
        recorded.len(),
        restarted.elapsed().as_secs_f64(),
        unsaid.len()
    );
    let m = second.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_restore_failures_total", &[]),
        Some(0.0),
        "{m}"
    );
    unrefuse_events(&client, &policy).await;
}

/// An intent Event the API refuses does not stop the reclaim: the lock is
/// deleted all the same, and the janitor says so (a WARN and
/// `lock_janitor_reconcile_errors_total{error="event"}`), so a reclaim
/// without its restore record is never silent.
#[tokio::test]
async fn a_refused_intent_event_is_counted_and_the_reclaim_goes_on() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "no-intent").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();
    let policy = refuse_events(&client, &ns, "StaleLockReclaiming").await;
    let kc = kubeconfig_as(cp, JANITOR_USER);
    let j = Janitor::start(&kc, &["--namespace", ns.as_str(), "--resync", "30s"]).await;
    let dead = running_pod(&client, &ns, "op-a", &node).await;
    create_lock(&client, &lock_for("op-lock", &dead, true)).await;
    kubelet::set_failed(&client, &ns, "op-a", "Evicted", "test")
        .await
        .unwrap();
    wait_event(&client, &ns, "StaleLockReclaimed", "op-lock").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    assert!(cms.get_opt("op-lock").await.unwrap().is_none());
    let m = j.metrics().await;
    assert!(
        sample(
            &m,
            "lock_janitor_reconcile_errors_total",
            &[("error", "event")]
        )
        .is_some_and(|v| v >= 1.0),
        "{m}"
    );
    assert!(
        j.logs().lines().any(
            |l| l.contains("the reclaim's intent Event could not be written")
                && l.contains("cause=\"not written\"")
        ),
        "{}",
        j.logs()
    );
    unrefuse_events(&client, &policy).await;
}

/// A ValidatingAdmissionPolicy of the test that refuses every Event of
/// `reason` created in `ns`, as a SIGKILL or a broken Events API would lose
/// it; returns once it is in effect (an Event of that reason is refused).
async fn refuse_events(client: &kube::Client, ns: &str, reason: &str) -> String {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let policy = format!("lose-{}-{ns}", reason.to_lowercase());
    let vap: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": policy},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": ["events.k8s.io"], "apiVersions": ["v1"],
                                   "resources": ["events"], "operations": ["CREATE"]}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
            },
            "validations": [{"expression": format!("object.reason != '{reason}'"),
                             "message": "lost, as a SIGKILL would lose it"}]
        }
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": policy},
        "spec": {"policyName": policy, "validationActions": ["Deny"]}
    }))
    .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &vap)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // In effect once an Event of that reason is refused.
    let evs: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let probe = |i: u32| k8s_openapi::api::events::v1::Event {
        metadata: ObjectMeta {
            name: Some(format!("probe-{i}")),
            ..Default::default()
        },
        event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        reason: Some(reason.into()),
        action: Some("Probe".into()),
        reporting_controller: Some("probe".into()),
        reporting_instance: Some("probe".into()),
        type_: Some("Normal".into()),
        ..Default::default()
    };
    let mut i = 0;
    wait_for("the policy refuses", Duration::from_secs(30), || {
        i += 1;
        let (evs, ev) = (evs.clone(), probe(i));
        async move {
            evs.create(&PostParams::default(), &ev)
                .await
                .err()
                .map(|_| ())
        }
    })
    .await;
    policy
}

async fn unrefuse_events(client: &kube::Client, policy: &str) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .delete(policy, &Default::default())
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .delete(policy, &Default::default())
        .await
        .unwrap();
}
