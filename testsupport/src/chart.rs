//! The Helm chart as tests use it: rendered with the testenv's helm, its
//! ServiceAccount and RBAC applied for real, and a kubeconfig that acts as
//! that ServiceAccount (impersonation with the groups a token carries).

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client, Resource};
use lock_janitor_testenv::ControlPlane;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

pub fn chart_dir() -> PathBuf {
    crate::repo_root().join("charts/lock-janitor")
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
    // Written whole, then renamed into place: a janitor started a moment
    // ago may be reading the same file (one install spawns several), and a
    // write in place would let it read a truncated one ("no current
    // context", seen once under load).
    let tmp = cp
        .dir()
        .join(format!("kubeconfig-{ns}.{}", crate::free_port()));
    std::fs::write(&tmp, text).expect("write kubeconfig");
    std::fs::rename(&tmp, &path).expect("put kubeconfig in place");
    path
}

/// Duration strings of Prometheus, as the Prometheus Operator's CRDs check them.
const PROM_DURATION: &str =
    "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$";

/// Minimal CRDs for the Prometheus Operator's ServiceMonitor and
/// PrometheusRule (monitoring.coreos.com/v1): structural schemas with the
/// fields the chart uses and their types, so that with strict field
/// validation a misspelt or mistyped field is refused.
pub fn monitoring_crds() -> Vec<CustomResourceDefinition> {
    let string = json!({"type": "string"});
    let duration = json!({"type": "string", "pattern": PROM_DURATION});
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let preserve = json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
    let label_selector = json!({"type": "object", "properties": {
        "matchLabels": string_map,
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "required": ["key", "operator"],
            "properties": {"key": string, "operator": string, "values": strings}}},
    }});
    let service_monitor = json!({"type": "object", "required": ["spec"], "properties": {
        "apiVersion": string, "kind": string, "metadata": {"type": "object"},
        "spec": {"type": "object", "required": ["selector"], "properties": {
            "jobLabel": string,
            "targetLabels": strings,
            "podTargetLabels": strings,
            "sampleLimit": {"type": "integer", "format": "int64"},
            "selector": label_selector,
            "namespaceSelector": {"type": "object", "properties": {
                "any": {"type": "boolean"}, "matchNames": strings}},
            "endpoints": {"type": "array", "items": {"type": "object", "properties": {
                "port": string,
                "targetPort": {"x-kubernetes-int-or-string": true,
                               "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "path": string,
                "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
                "interval": duration,
                "scrapeTimeout": duration,
                "honorLabels": {"type": "boolean"},
                "honorTimestamps": {"type": "boolean"},
                "relabelings": {"type": "array", "items": preserve},
                "metricRelabelings": {"type": "array", "items": preserve},
            }}},
        }},
    }});
    let prometheus_rule = json!({"type": "object", "required": ["spec"], "properties": {
        "apiVersion": string, "kind": string, "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": {
            "groups": {"type": "array", "items": {
                "type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "interval": duration,
                    "limit": {"type": "integer"},
                    "labels": string_map,
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"], "properties": {
                            "alert": string,
                            "record": string,
                            "expr": {"x-kubernetes-int-or-string": true,
                                     "anyOf": [{"type": "integer"}, {"type": "string"}]},
                            "for": duration,
                            "keep_firing_for": duration,
                            "labels": string_map,
                            "annotations": string_map,
                        }}},
                }}},
        }},
    }});
    // A Prometheus: only what `check` reads of it (its selectors).
    let prometheus = json!({"type": "object", "properties": {
        "apiVersion": string, "kind": string, "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": {
            "serviceMonitorSelector": label_selector,
            "serviceMonitorNamespaceSelector": label_selector,
            "ruleSelector": label_selector,
            "ruleNamespaceSelector": label_selector,
        }},
    }});
    [
        ("servicemonitors", "ServiceMonitor", service_monitor),
        ("prometheusrules", "PrometheusRule", prometheus_rule),
        ("prometheuses", "Prometheus", prometheus),
    ]
    .into_iter()
    .map(|(plural, kind, schema)| {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind},
                "versions": [{"name": "v1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": schema}}],
            },
        }))
        .expect("CRD")
    })
    .collect()
}

/// Creates them (or keeps the ones already there: every suite that needs
/// them installs these same two) and waits until they are established.
pub async fn install_monitoring_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in monitoring_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating CRD {name}: {e}"),
        }
        super::wait_for(
            &format!("CRD {name} established"),
            std::time::Duration::from_secs(60),
            || async {
                let c = crds.get(&name).await.ok()?;
                c.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            },
        )
        .await;
    }
}
