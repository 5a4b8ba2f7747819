//! The Helm chart as tests use it: rendered with the testenv's helm, its
//! ServiceAccount and RBAC applied for real, and a kubeconfig that acts as
//! that ServiceAccount (impersonation with the groups a token carries).

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::PostParams;
use kube::{Api, Client, Resource};
use lock_janitor_testenv::ControlPlane;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/lock-janitor")
}

pub fn helm() -> PathBuf {
    if let Some(h) = std::env::var_os("HELM").filter(|h| !h.is_empty()) {
        return h.into();
    }
    lock_janitor_testenv::binary("helm").unwrap_or_else(|e| panic!("{e}"))
}

/// `helm template <release> charts/lock-janitor -n <namespace> <args>`, as
/// JSON documents.
pub fn render(release: &str, namespace: &str, args: &[String]) -> Vec<Value> {
    let out = Command::new(helm())
        .args(["template", release])
        .arg(chart_dir())
        .args(["--namespace", namespace])
        .args(args)
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm template {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("helm prints UTF-8");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("parsing helm template output: {e}\n{text}"));
    let docs: Vec<Value> = docs
        .into_iter()
        .filter(|d| d.is_object() && d.get("kind").is_some())
        .collect();
    // Every object helm printed was parsed.
    let printed = text.lines().filter(|l| l.starts_with("kind: ")).count();
    assert_eq!(docs.len(), printed, "{text}");
    docs
}

pub fn kind_of(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

pub fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

pub async fn create<K>(api: Api<K>, doc: &Value)
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", kind_of(doc), name_of(doc)));
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {} {}: {e}", kind_of(doc), name_of(doc)));
}

/// Creates the rendered ServiceAccount and RBAC objects, for real.
pub async fn apply_rbac(client: &Client, docs: &[Value]) {
    for d in docs {
        let ns = d["metadata"]["namespace"].as_str().unwrap_or_default();
        let c = client.clone();
        match kind_of(d) {
            "ServiceAccount" => create(Api::<ServiceAccount>::namespaced(c, ns), d).await,
            "ClusterRole" => create(Api::<ClusterRole>::all(c), d).await,
            "ClusterRoleBinding" => create(Api::<ClusterRoleBinding>::all(c), d).await,
            "Role" => create(Api::<Role>::namespaced(c, ns), d).await,
            "RoleBinding" => create(Api::<RoleBinding>::namespaced(c, ns), d).await,
            _ => {}
        }
    }
}

/// The groups of a ServiceAccount token of namespace `ns`.
pub fn sa_groups(ns: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".into(),
    ]
}

/// `system:serviceaccount:<ns>:<sa>`.
pub fn sa_user(ns: &str, sa: &str) -> String {
    format!("system:serviceaccount:{ns}:{sa}")
}

/// A kubeconfig (in the control plane's dir) that acts as ServiceAccount
/// `sa` of `ns`.
pub fn sa_kubeconfig(cp: &ControlPlane, ns: &str, sa: &str) -> PathBuf {
    let admin = std::fs::read_to_string(cp.kubeconfig_path()).expect("read admin kubeconfig");
    let groups: String = sa_groups(ns)
        .iter()
        .map(|g| format!("    - {g}\n"))
        .collect();
    let text = admin.replacen(
        "  user:\n",
        &format!(
            "  user:\n    as: {}\n    as-groups:\n{groups}",
            sa_user(ns, sa)
        ),
        1,
    );
    assert_ne!(text, admin, "kubeconfig layout changed: cannot impersonate");
    let path = cp.dir().join(format!("kubeconfig-{ns}"));
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}
