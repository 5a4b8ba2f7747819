//! Tests against a real control plane (etcd + kube-apiserver +
//! kube-controller-manager). They need the binaries: `make testenv-build`.
//!
//! Each `#[tokio::test]` has its own runtime; all share one control plane
//! through `shared()`, except `second_control_plane_without_gc`.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::runtime::watcher;
use kube::Client;
use lock_janitor_testenv::{audit, fresh_namespace, kubelet, shared, ControlPlane, Options};

/// Polls `check` every 200 ms until it returns true, or panics after `timeout`.
async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// A leader-for-life style lock: a ConfigMap whose only ownerReference is `pod`.
async fn create_owned_configmap(client: &Client, ns: &str, name: &str, pod: &Pod) -> ConfigMap {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.metadata.name.clone().unwrap(),
                uid: pod.metadata.uid.clone().unwrap(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("create owned configmap")
}

async fn create_configmap(client: &Client, ns: &str, name: &str) -> ConfigMap {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("v".to_string(), "1".to_string())])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("create configmap")
}

#[tokio::test]
async fn garbage_collector_deletes_lock_of_deleted_pod() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "gc").await;
    let pod = kubelet::create_pod(&client, &ns, "leader", "node-a", &[("app", "op")])
        .await
        .unwrap();
    kubelet::set_running(&client, &ns, "leader").await.unwrap();
    create_owned_configmap(&client, &ns, "op-lock", &pod).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    // The GC must not collect a lock whose owner exists.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(cms.get_opt("op-lock").await.unwrap().is_some());

    kubelet::force_delete_pod(&client, &ns, "leader")
        .await
        .unwrap();
    eventually(
        "the garbage collector deletes op-lock",
        Duration::from_secs(60),
        || async { cms.get_opt("op-lock").await.unwrap().is_none() },
    )
    .await;
}

#[tokio::test]
async fn watch_with_failed_phase_field_selector() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "watch").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    kubelet::create_pod(&client, &ns, "evicted", "node-a", &[])
        .await
        .unwrap();
    kubelet::create_pod(&client, &ns, "running", "node-a", &[])
        .await
        .unwrap();
    kubelet::set_running(&client, &ns, "evicted").await.unwrap();

    let mut stream = watcher(
        pods.clone(),
        watcher::Config::default().fields("status.phase=Failed"),
    )
    .boxed();
    // Initial list: nothing is Failed yet.
    loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await {
            Ok(Some(Ok(watcher::Event::InitDone))) => break,
            Ok(Some(Ok(watcher::Event::InitApply(p)))) => {
                panic!("unexpected pod in initial list: {:?}", p.metadata.name)
            }
            Ok(Some(Ok(_))) => {}
            other => panic!("watch did not sync: {other:?}"),
        }
    }

    // Changes of the running pod come first in the stream, so if the field
    // selector let them through we would see them before the evicted pod.
    kubelet::set_running(&client, &ns, "running").await.unwrap();
    let failed = kubelet::set_failed(
        &client,
        &ns,
        "evicted",
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .unwrap();
    let status = failed.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("Evicted"));

    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(ev) = stream.next().await {
            match ev.expect("watch error") {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let name = p.metadata.name.clone().unwrap();
                    assert_ne!(
                        name, "running",
                        "field selector status.phase=Failed let a running pod through"
                    );
                    if name == "evicted" {
                        return p;
                    }
                }
                _ => {}
            }
        }
        panic!("watch stream ended");
    })
    .await
    .expect("the watch saw the evicted pod within 30s");
    assert_eq!(seen.status.unwrap().phase.as_deref(), Some("Failed"));
    assert_eq!(
        pods.get("running")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Running")
    );
}

#[tokio::test]
async fn delete_preconditions_conflict() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "precond").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let old = create_configmap(&client, &ns, "lock").await;
    let old_rv = old.metadata.resource_version.clone().unwrap();
    let uid = old.metadata.uid.clone().unwrap();
    let new = cms
        .patch(
            "lock",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"v": "2"}})),
        )
        .await
        .unwrap();
    assert_ne!(
        new.metadata.resource_version.as_deref(),
        Some(old_rv.as_str())
    );

    // Stale resourceVersion: 409, object stays.
    let stale = DeleteParams::default().preconditions(Preconditions {
        uid: Some(uid.clone()),
        resource_version: Some(old_rv),
    });
    let err = cms
        .delete("lock", &stale)
        .await
        .expect_err("stale resourceVersion must conflict");
    assert_eq!(api_code(&err), Some(409), "{err}");
    assert!(cms.get_opt("lock").await.unwrap().is_some());

    // Wrong uid: 409, object stays.
    let wrong_uid = DeleteParams::default().preconditions(Preconditions {
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
        resource_version: None,
    });
    let err = cms
        .delete("lock", &wrong_uid)
        .await
        .expect_err("wrong uid must conflict");
    assert_eq!(api_code(&err), Some(409), "{err}");
    assert!(cms.get_opt("lock").await.unwrap().is_some());

    // The right ones: deleted.
    let right = DeleteParams::default().preconditions(Preconditions {
        uid: Some(uid),
        resource_version: new.metadata.resource_version.clone(),
    });
    cms.delete("lock", &right).await.unwrap();
    assert!(cms.get_opt("lock").await.unwrap().is_none());
}

async fn create_service_account(client: &Client, ns: &str, name: &str) {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

async fn grant(client: &Client, ns: &str, sa: &str, verbs: &[&str]) {
    let role = Role {
        metadata: ObjectMeta {
            name: Some(format!("{sa}-configmaps")),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{sa}-configmaps")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: format!("{sa}-configmaps"),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.into(),
            namespace: Some(ns.into()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

async fn impersonating(cp: &ControlPlane, user: &str) -> Client {
    let mut config = cp.kube_config();
    config.auth_info.impersonate = Some(user.to_string());
    Client::try_from(config).unwrap()
}

#[tokio::test]
async fn rbac_applies_to_impersonated_service_account() {
    let cp = shared().await;
    let admin = cp.client().await.unwrap();
    let ns = fresh_namespace(&admin, "rbac").await;
    create_service_account(&admin, &ns, "janitor").await;
    let sa_client = impersonating(cp, &format!("system:serviceaccount:{ns}:janitor")).await;
    let cms: Api<ConfigMap> = Api::namespaced(sa_client, &ns);

    let err = cms
        .list(&ListParams::default())
        .await
        .expect_err("no grant yet: must be forbidden");
    assert_eq!(api_code(&err), Some(403), "{err}");

    grant(&admin, &ns, "janitor", &["list"]).await;
    eventually(
        "the new RoleBinding lets the service account list configmaps",
        Duration::from_secs(20),
        || async { cms.list(&ListParams::default()).await.is_ok() },
    )
    .await;
    // Still only list: get of a named object is forbidden.
    let err = cms.get("anything").await.expect_err("get is not granted");
    assert_eq!(api_code(&err), Some(403), "{err}");
}

/// Polls the audit log until an event matches.
async fn find_event(
    cp: &ControlPlane,
    what: &str,
    pred: impl Fn(&audit::AuditEvent) -> bool,
) -> audit::AuditEvent {
    let mut found = None;
    eventually(what, Duration::from_secs(10), || {
        found = audit::read(cp.audit_log_path()).into_iter().find(&pred);
        let ok = found.is_some();
        async move { ok }
    })
    .await;
    found.unwrap()
}

fn is_delete_of(e: &audit::AuditEvent, ns: &str, name: &str) -> bool {
    e.verb == "delete"
        && e.stage == "ResponseComplete"
        && e.resource.as_deref() == Some("configmaps")
        && e.namespace.as_deref() == Some(ns)
        && e.name.as_deref() == Some(name)
}

#[tokio::test]
async fn audit_log_records_deletes_and_who_made_them() {
    let cp = shared().await;
    let admin = cp.client().await.unwrap();
    let ns = fresh_namespace(&admin, "audit").await;

    // As the admin.
    create_configmap(&admin, &ns, "by-admin").await;
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .delete("by-admin", &DeleteParams::default())
        .await
        .unwrap();
    let e = find_event(cp, "the delete by the admin is audited", |e| {
        is_delete_of(e, &ns, "by-admin")
    })
    .await;
    assert_eq!(e.user, lock_janitor_testenv::ADMIN_USER);
    assert_eq!(e.impersonated_user, None);
    assert_eq!(e.code, Some(200));
    assert!(
        e.request_uri
            .contains(&format!("/namespaces/{ns}/configmaps/by-admin")),
        "{e:?}"
    );

    // As an impersonated service account.
    create_service_account(&admin, &ns, "janitor").await;
    grant(&admin, &ns, "janitor", &["get", "delete"]).await;
    create_configmap(&admin, &ns, "by-sa").await;
    let sa_user = format!("system:serviceaccount:{ns}:janitor");
    let cms: Api<ConfigMap> = Api::namespaced(impersonating(cp, &sa_user).await, &ns);
    eventually(
        "the service account may delete",
        Duration::from_secs(20),
        || async {
            match cms.delete("by-sa", &DeleteParams::default()).await {
                Ok(_) => true,
                Err(e) if api_code(&e) == Some(403) => false,
                Err(e) => panic!("delete as {sa_user}: {e}"),
            }
        },
    )
    .await;
    // Earlier tries may have been audited with 403 until RBAC caught up.
    let e = find_event(cp, "the delete by the service account is audited", |e| {
        is_delete_of(e, &ns, "by-sa") && e.code == Some(200)
    })
    .await;
    assert_eq!(e.code, Some(200));
    assert_eq!(e.user, lock_janitor_testenv::ADMIN_USER);
    assert_eq!(e.impersonated_user.as_deref(), Some(sa_user.as_str()));
    assert_eq!(e.effective_user(), sa_user);
}

#[tokio::test]
async fn kubelet_status_writes() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "kubelet").await;
    let node = kubelet::create_node(&client, "node-k").await.unwrap();
    let ready = node.status.unwrap().conditions.unwrap();
    assert!(ready
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True"));
    // Idempotent.
    kubelet::create_node(&client, "node-k").await.unwrap();

    for (name, reason) in [
        ("a", "Evicted"),
        ("b", "Preempting"),
        ("c", "NodeShutdown"),
        ("d", "OOMKilled"),
    ] {
        kubelet::create_pod(&client, &ns, name, "node-k", &[("x", "y")])
            .await
            .unwrap();
        let p = kubelet::set_running(&client, &ns, name).await.unwrap();
        let st = p.status.unwrap();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert!(st.pod_ip.is_some() && st.start_time.is_some());
        let p = kubelet::set_failed(&client, &ns, name, reason, "test")
            .await
            .unwrap();
        let st = p.status.unwrap();
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some(reason));
        let term = st.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(term.exit_code, if reason == "OOMKilled" { 1 } else { 137 });
        assert!(term.finished_at.is_some());
    }
    kubelet::create_pod(&client, &ns, "done", "node-k", &[])
        .await
        .unwrap();
    let p = kubelet::set_succeeded(&client, &ns, "done").await.unwrap();
    let st = p.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Succeeded"));
    let term = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (term.exit_code, term.reason.as_deref()),
        (0, Some("Completed"))
    );

    // The writes went through the status subresource.
    let events = audit::read(cp.audit_log_path());
    assert!(events.iter().any(|e| e.verb == "patch"
        && e.resource.as_deref() == Some("pods")
        && e.subresource.as_deref() == Some("status")
        && e.namespace.as_deref() == Some(ns.as_str())));
}

#[tokio::test]
async fn second_control_plane_without_gc() {
    // Started on a thread (and runtime) that ends right after: the processes
    // must not be tied to it.
    let cp = std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = Instant::now();
        let cp = rt
            .block_on(ControlPlane::start(Options {
                garbage_collector: false,
                ..Default::default()
            }))
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("second control plane started in {:?}", started.elapsed());
        cp
    })
    .join()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (name, pid) in cp.processes() {
        assert!(
            lock_janitor_testenv::pid_alive(pid),
            "{name} died with the thread that started it"
        );
    }
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "nogc").await;
    let pod = kubelet::create_pod(&client, &ns, "leader", "node-a", &[])
        .await
        .unwrap();
    create_owned_configmap(&client, &ns, "op-lock", &pod).await;
    kubelet::force_delete_pod(&client, &ns, "leader")
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(pods.get_opt("leader").await.unwrap().is_none());

    tokio::time::sleep(Duration::from_secs(10)).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    assert!(
        cms.get_opt("op-lock").await.unwrap().is_some(),
        "without the garbage collector the orphaned lock must stay"
    );
    drop(client);

    let pids = cp.processes();
    assert_eq!(pids.len(), 3, "{pids:?}");
    let dir = cp.dir().to_path_buf();
    assert!(dir.exists());
    let stopping = Instant::now();
    cp.stop();
    eprintln!("stopped in {:?}", stopping.elapsed());
    for (name, pid) in pids {
        // SAFETY: kill with signal 0 only checks existence.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        assert_eq!(r, -1, "{name} (pid {pid}) still exists after stop()");
    }
    assert!(!dir.exists(), "{} still exists after stop()", dir.display());
}

#[tokio::test]
async fn node_lifecycle_marks_silent_nodes_unknown() {
    let cp = ControlPlane::start(Options {
        node_lifecycle: true,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let client = cp.client().await.unwrap();
    kubelet::create_node(&client, "silent").await.unwrap();
    kubelet::create_node(&client, "alive").await.unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let ready = |n: &k8s_openapi::api::core::v1::Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
            .unwrap_or_default()
    };
    // Only "alive" heartbeats; the 10 s grace period makes "silent" Unknown.
    let start = Instant::now();
    loop {
        kubelet::heartbeat(&client, "alive").await.unwrap();
        let silent = nodes.get("silent").await.unwrap();
        if ready(&silent) == "Unknown" {
            let taints = silent.spec.unwrap().taints.unwrap_or_default();
            eprintln!(
                "silent node Unknown after {:?}, taints {:?}",
                start.elapsed(),
                taints.iter().map(|t| &t.key).collect::<Vec<_>>()
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "node 'silent' never became Unknown"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(ready(&nodes.get("alive").await.unwrap()), "True");
    // The unreachable taint follows.
    eventually(
        "node 'silent' gets the unreachable taint",
        Duration::from_secs(30),
        || async {
            nodes
                .get("silent")
                .await
                .unwrap()
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == "node.kubernetes.io/unreachable")
        },
    )
    .await;
    cp.stop();
}
