//! Restart leaves no lock unprotected: a lock the janitor reclaimed and a
//! new holder created again, unlabeled, while no janitor ran is labeled by
//! the next janitor (from its own reclaim Events); a restore that cannot
//! read those Events is counted in lock_janitor_restore_failures_total.

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
