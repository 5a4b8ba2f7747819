//! Never "looks healthy, does nothing": a janitor whose watches start failing
//! after start-up (here: its RBAC binding removed, then the API server
//! restarted so that open watches must reconnect) turns not ready within a
//! minute and counts the errors; once RBAC is restored it is ready again.
//! Own control plane (the API server is restarted).

mod support;

use std::time::Duration;

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::DeleteParams;
use kube::Api;
use lock_janitor_testenv::{fresh_namespace, ControlPlane, Options};
use support::*;

#[tokio::test]
async fn failing_watches_turn_readiness_off_and_back_on() {
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "health").await;
    let leader = running_pod(&client, &ns, "leader", "node-a").await;
    create_lock(&client, &lock_for("op-lock", &leader, true)).await;
    let user = "health-janitor";
    bind_cluster_role(&client, user, JANITOR_USER).await;
    let j = Janitor::start(&kubeconfig_as(&cp, user), &["--resync", "5s"]).await;
    let m = j.metrics().await;
    assert_eq!(sample(&m, "lock_janitor_ready", &[]), Some(1.0), "{m}");
    let errors = |m: &str| {
        sample(
            m,
            "lock_janitor_watch_errors_total",
            &[("resource", "configmaps")],
        )
        .unwrap_or(0.0)
            + sample(
                m,
                "lock_janitor_watch_errors_total",
                &[("resource", "pods")],
            )
            .unwrap_or(0.0)
    };
    assert_eq!(errors(&m), 0.0, "{m}");

    // RBAC taken away; the API server restarts, so every watch reconnects.
    Api::<ClusterRoleBinding>::all(client.clone())
        .delete(user, &DeleteParams::default())
        .await
        .unwrap();
    cp.restart_apiserver()
        .await
        .expect("restart kube-apiserver");
    let (code, body) = wait_for("/readyz 503", Duration::from_secs(120), || async {
        let (code, body) = http_get(j.port, "/readyz").await.ok()?;
        (code == 503).then_some((code, body))
    })
    .await;
    assert_eq!(code, 503);
    assert!(body.contains("failing for more than a minute"), "{body}");
    let m = j.metrics().await;
    assert_eq!(sample(&m, "lock_janitor_ready", &[]), Some(0.0), "{m}");
    assert!(errors(&m) > 0.0, "{m}");
    assert!(j.logs().contains("watch failing"), "{}", j.logs());

    // Restored: ready again, without a restart of the janitor.
    bind_cluster_role(&client, user, JANITOR_USER).await;
    wait_for("/readyz 200 again", Duration::from_secs(120), || async {
        (j.readyz().await == Some(200)).then_some(())
    })
    .await;
    let m = j.metrics().await;
    assert_eq!(sample(&m, "lock_janitor_ready", &[]), Some(1.0), "{m}");
}
