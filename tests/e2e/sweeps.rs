//! What a resync sweep reads, from the API server's audit log: only the
//! namespaces where a watched lock names a pod, each the cheaper way (a
//! few holders by name, many by listing the namespace), never the pods of
//! a namespace without locks.

use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};

/// A user of this test's own, so that the audit log tells its janitor's
/// reads from every other test's.
const USER: &str = "lock-janitor-e2e-sweeps";

/// The janitor's reads of pods (list and get), as the API server served them.
fn pod_reads(cp: &ControlPlane) -> Vec<AuditEvent> {
    lock_janitor_testenv::audit::read(cp.audit_log_path())
        .into_iter()
        .filter(|e| {
            e.effective_user() == USER
                && e.stage == "ResponseComplete"
                && e.resource.as_deref() == Some("pods")
                && e.subresource.is_none()
                && matches!(e.verb.as_str(), "get" | "list")
        })
        .collect()
}

#[tokio::test]
async fn a_sweep_reads_only_the_pods_its_locks_name() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    bind_cluster_role(&client, USER, JANITOR_USER).await;
    let ns = fresh_namespace(&client, "sweeps").await;
    let bystanders = fresh_namespace(&client, "sweeps-bystanders").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();
    for i in 0..20 {
        running_pod(&client, &bystanders, &format!("b{i}"), &node).await;
    }
    // This test's own opt-in label: the janitor watches the whole cluster,
    // and only these locks are its.
    let label = format!("lock-janitor.io/{ns}");
    let selector = format!("{label}=true");
    let lock = |name: &str, holder: &k8s_openapi::api::core::v1::Pod| {
        let mut cm: ConfigMap = lock_for(name, holder, false);
        cm.metadata.labels = Some([(label.clone(), "true".to_string())].into());
        cm
    };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let p0 = running_pod(&client, &ns, "p0", &node).await;
    api.create(&PostParams::default(), &lock("l0", &p0))
        .await
        .unwrap();

    // Beside it, a lock whose owner name no pod can have (written by hand):
    // never put in a URL, it fails no sweep, and is reported unmanageable.
    let mut odd = lock("odd", &p0);
    if let Some(o) = odd.metadata.owner_references.as_mut() {
        o[0].name = "a b/eviction".into();
    }
    api.create(&PostParams::default(), &odd).await.unwrap();

    let kc = kubeconfig_as(cp, USER);
    let j = Janitor::start(&kc, &["--selector", &selector, "--resync", "1s"]).await;
    j.wait_sweeps(3).await;
    let ev = wait_event(&client, &ns, "UnmanageableLock", "odd").await;
    assert!(
        ev.note
            .as_deref()
            .unwrap_or_default()
            .contains("OwnerNameNotAPod"),
        "{ev:?}"
    );

    // One holder: read by name, and nothing listed but the terminal-pod
    // watch's own list of the cluster.
    let reads = pod_reads(cp);
    let by_name = reads
        .iter()
        .filter(|e| e.verb == "get" && e.namespace.as_deref() == Some(ns.as_str()))
        .filter(|e| e.name.as_deref() == Some("p0"))
        .count();
    assert!(by_name >= 3, "p0 read by name each sweep: {reads:#?}");
    let lists: Vec<&AuditEvent> = reads.iter().filter(|e| e.verb == "list").collect();
    assert!(
        lists
            .iter()
            .all(|e| e.namespace.is_none() && e.request_uri.contains("fieldSelector=status.phase")),
        "only the terminal-pod watch lists (the cluster's terminal pods): {lists:#?}"
    );
    assert!(
        reads
            .iter()
            .all(|e| e.namespace.as_deref() != Some(bystanders.as_str())),
        "no read of a namespace without locks: {reads:#?}"
    );

    // Four holders: cheaper to list the namespace (its terminal pods, then
    // all of it) than to read each, and it stays so.
    for i in 1..4 {
        let p = running_pod(&client, &ns, &format!("p{i}"), &node).await;
        api.create(&PostParams::default(), &lock(&format!("l{i}"), &p))
            .await
            .unwrap();
    }
    wait_for(
        "the janitor judged the new locks",
        Duration::from_secs(30),
        || async {
            let m = j.metrics().await;
            (sample(&m, "lock_janitor_locks", &[("state", "held")]) == Some(4.0)).then_some(())
        },
    )
    .await;
    let before = pod_reads(cp).len();
    j.wait_sweeps(3).await;
    let reads: Vec<AuditEvent> = pod_reads(cp).into_iter().skip(before).collect();
    let in_ns = |verb: &str| {
        reads
            .iter()
            .filter(|e| e.verb == verb && e.namespace.as_deref() == Some(ns.as_str()))
            .count()
    };
    assert!(in_ns("list") >= 4, "the namespace listed: {reads:#?}");
    assert!(
        reads.iter().all(|e| e.namespace.is_some()
            || e.verb != "list"
            || e.request_uri.contains("fieldSelector=status.phase")),
        "never the cluster's pods: {reads:#?}"
    );
    assert!(
        reads
            .iter()
            .all(|e| e.namespace.as_deref() != Some(bystanders.as_str())),
        "no read of a namespace without locks: {reads:#?}"
    );
}
