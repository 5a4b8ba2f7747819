//! `lock-janitor check` end to end on the real control plane: the chart
//! installed with the testenv's `helm install` (release `lock-janitor` in a
//! fresh namespace, watching a second fresh namespace), the pods the
//! Deployment would run created and set Ready as a kubelet would (there is
//! no kubelet, and no Deployment controller: the test writes the
//! Deployment's status as that controller would), and the leader Lease held
//! by one of them. A healthy install passes every check; then each failure
//! on its own turns its check (and only the exit code it should) red.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::chart::{chart_dir, helm, install_monitoring_crds};
use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};
use serde_json::{json, Value};

const RELEASE: &str = "lock-janitor";
const CHECKS: [&str; 8] = [
    "install-found",
    "leader",
    "rbac",
    "delete-guard",
    "auto-opt-in",
    "locks",
    "stale-now",
    "monitoring",
];

/// The checks a healthy install passes outright (monitoring may be
/// skipped where nothing is served).
const HEALTHY_OK: [&str; 7] = [
    "install-found",
    "leader",
    "rbac",
    "delete-guard",
    "auto-opt-in",
    "locks",
    "stale-now",
];

/// The opt-in label key of the installs here. Each install opts in with a
/// value of its own (its lock namespace's name), so that what one finds
/// opted in across the cluster is its own, whatever the other suites of
/// the shared control plane label `lock-janitor.io/watch=true`.
const OPT_IN_KEY: &str = "check.lock-janitor.io/watch";

/// One release of the chart, its two pods Ready and the first leading.
struct Install {
    cp: &'static ControlPlane,
    client: Client,
    /// The release namespace.
    ns: String,
    /// The one namespace it watches.
    locks: String,
    node: String,
    pods: [String; 2],
}

fn helm_install(cp: &ControlPlane, ns: &str, sets: &[String]) {
    let home = tempfile::tempdir().expect("helm home");
    let out = Command::new(helm())
        .args(["install", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", ns, "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .args(sets.iter().flat_map(|s| ["--set", s.as_str()]))
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm install failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn install(prefix: &str, sets: &[&str]) -> Install {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    let ns = fresh_namespace(&client, &format!("{prefix}-rel")).await;
    let locks = fresh_namespace(&client, &format!("{prefix}-locks")).await;
    let mut all = vec![
        format!("watchNamespaces={{{locks}}}"),
        format!("selector={OPT_IN_KEY}={locks}"),
    ];
    all.extend(sets.iter().map(|s| s.to_string()));
    helm_install(cp, &ns, &all);
    let node = format!("node-{locks}");
    kubelet::create_node(&client, &node).await.expect("node");
    let pods = [format!("{RELEASE}-7d9f-a"), format!("{RELEASE}-7d9f-b")];
    // The pods its Deployment selects (nameOverride changes them).
    let selector = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get(RELEASE)
        .await
        .expect("the chart's Deployment")
        .spec
        .expect("spec")
        .selector
        .match_labels
        .expect("matchLabels");
    let labels: Vec<(&str, &str)> = selector
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for p in &pods {
        kubelet::create_pod(&client, &ns, p, &node, &labels)
            .await
            .expect("janitor pod");
        kubelet::set_running(&client, &ns, p)
            .await
            .expect("set running");
    }
    let i = Install {
        cp,
        client,
        ns,
        locks,
        node,
        pods,
    };
    i.deployment_status(2).await;
    let leader = i.pods[0].clone();
    i.leader_lease(&leader, 0).await;
    // An application's own ConfigMap: not a lock, never opted in.
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("app-settings".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("level".into(), "info".into())])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(i.client.clone(), &i.locks)
        .create(&PostParams::default(), &cm)
        .await
        .expect("app configmap");
    i
}

impl Install {
    /// The Deployment's status as its controller would write it.
    async fn deployment_status(&self, ready: i32) {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &self.ns);
        let patch = json!({"status": {
            "observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
            "readyReplicas": ready, "availableReplicas": ready,
        }});
        api.patch_status(RELEASE, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("deployment status");
    }

    /// The leader Lease, held by `holder` and renewed `ago` seconds ago
    /// (15 s lease, the chart's default), as the election writes it.
    async fn leader_lease(&self, holder: &str, ago: i64) {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        let at = MicroTime(Timestamp::now() - SignedDuration::from_secs(ago));
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(RELEASE.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                acquire_time: Some(at.clone()),
                renew_time: Some(at),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        match api.get_opt(RELEASE).await.expect("get lease") {
            None => {
                api.create(&PostParams::default(), &lease)
                    .await
                    .expect("create lease");
            }
            Some(old) => {
                let mut l = lease;
                l.metadata.resource_version = old.metadata.resource_version;
                api.replace(RELEASE, &PostParams::default(), &l)
                    .await
                    .expect("replace lease");
            }
        }
    }

    /// An operator pod of the watched namespace and its lock.
    async fn lock(
        &self,
        name: &str,
        holder: &str,
        labeled: bool,
    ) -> k8s_openapi::api::core::v1::Pod {
        let ns = self.locks.clone();
        self.lock_in(&ns, name, holder, labeled.then_some(ns.as_str()))
            .await
    }

    /// An operator pod of `ns` and its lock, labeled `OPT_IN_KEY=value`.
    async fn lock_in(
        &self,
        ns: &str,
        name: &str,
        holder: &str,
        value: Option<&str>,
    ) -> k8s_openapi::api::core::v1::Pod {
        let pod = running_pod(&self.client, ns, holder, &self.node).await;
        let mut cm = lock_for(name, &pod, false);
        cm.metadata.labels = value.map(|v| BTreeMap::from([(OPT_IN_KEY.to_owned(), v.to_owned())]));
        create_lock(&self.client, &cm).await;
        pod
    }

    /// The opt-in selector of this install.
    fn selector(&self) -> String {
        format!("{OPT_IN_KEY}={}", self.locks)
    }

    /// Adds `env` to the janitor container, as the chart's extraEnv would.
    async fn container_env(&self, env: Value) {
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "lock-janitor", "env": env}
        ]}}}});
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .patch(RELEASE, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .expect("patch the Deployment's env");
    }

    fn check(&self, extra: &[&str]) -> Outcome {
        self.check_as(self.cp.kubeconfig_path(), extra)
    }

    fn check_as(&self, kubeconfig: &Path, extra: &[&str]) -> Outcome {
        let out = Command::new(janitor_bin())
            .args(["check", "-n", &self.ns, "--kubeconfig"])
            .arg(kubeconfig)
            .args(extra)
            .env_remove("KUBECONFIG")
            .output()
            .expect("run lock-janitor check");
        Outcome::new(out)
    }
}

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn new(out: std::process::Output) -> Outcome {
        Outcome {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// name -> (status, detail, hint) from the table.
    fn checks(&self) -> BTreeMap<String, (String, String, Option<String>)> {
        let mut out: BTreeMap<String, (String, String, Option<String>)> = BTreeMap::new();
        let mut last = None;
        for line in self.stdout.lines() {
            if let Some(hint) = line.trim_start().strip_prefix("hint: ") {
                let name: &String = last.as_ref().expect("a hint under a check");
                out.get_mut(name).expect("check").2 = Some(hint.to_owned());
                continue;
            }
            let mut parts = line
                .splitn(3, char::is_whitespace)
                .filter(|s| !s.is_empty());
            let status = parts.next().expect("status").to_owned();
            let rest = line[status.len()..].trim_start();
            let (name, detail) = rest
                .split_once(char::is_whitespace)
                .expect("name and detail");
            out.insert(
                name.to_owned(),
                (status, detail.trim_start().to_owned(), None),
            );
            last = Some(name.to_owned());
        }
        out
    }

    fn status(&self, name: &str) -> String {
        self.checks()
            .get(name)
            .unwrap_or_else(|| panic!("no check {name}:\n{self}"))
            .0
            .clone()
    }

    fn detail(&self, name: &str) -> String {
        self.checks()[name].1.clone()
    }

    fn hint(&self, name: &str) -> String {
        self.checks()[name].2.clone().unwrap_or_default()
    }

    /// Every check but `except` is ok or warn.
    fn others_pass(&self, except: &str) {
        for (name, (status, ..)) in self.checks() {
            if name != except {
                assert!(
                    status == "ok" || status == "warn",
                    "{name}: {status}\n{self}"
                );
            }
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n{}{}", self.code, self.stdout, self.stderr)
    }
}

#[tokio::test]
async fn a_healthy_install_passes() {
    let i = install("healthy", &[]).await;
    i.lock("memcached-operator-lock", "memcached-operator-1", true)
        .await;
    let out = i.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    let checks = out.checks();
    assert_eq!(
        checks.keys().map(String::as_str).collect::<Vec<_>>().len(),
        CHECKS.len(),
        "{out}"
    );
    for name in CHECKS {
        assert!(checks.contains_key(name), "{name} missing\n{out}");
    }
    out.others_pass("");
    for name in HEALTHY_OK {
        assert_eq!(out.status(name), "ok", "{name}\n{out}");
    }
    assert!(
        out.detail("install-found").contains("2/2 pods ready"),
        "{out}"
    );
    assert!(
        out.detail("leader")
            .contains(&format!("pod {} leads", i.pods[0])),
        "{out}"
    );
    assert!(
        out.detail("rbac")
            .contains(&format!("system:serviceaccount:{}:", i.ns)),
        "{out}"
    );
    assert!(
        out.detail("delete-guard")
            .contains(&format!("{}/app-settings", i.locks)),
        "the guard was tried on the application's ConfigMap\n{out}"
    );
    assert!(out.detail("locks").contains("1 opted in"), "{out}");
    assert!(out.detail("stale-now").contains("1 held"), "{out}");
    // The chart's default: the janitor opts new locks in by itself.
    assert!(
        out.detail("auto-opt-in")
            .starts_with("on: the leader labels"),
        "{out}"
    );
    assert!(
        out.detail("auto-opt-in").contains("kube-system"),
        "the exclusions are named\n{out}"
    );
    assert!(out.stderr.contains("8 checks"), "{out}");

    // -o json: the same checks, as a CheckReport.
    let json = i.check(&["-o", "json"]);
    assert_eq!(json.code, 0, "{json}");
    let v: Value = serde_json::from_str(&json.stdout).expect("check -o json parses");
    assert_eq!(v["apiVersion"], "lock-janitor.io/v1alpha1");
    assert_eq!(v["kind"], "CheckReport");
    let items = v["checks"].as_array().expect("checks");
    let names: Vec<&str> = items.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, CHECKS, "{json}");
    for c in items {
        let (status, detail, _) = &checks[c["name"].as_str().unwrap()];
        assert_eq!(c["status"], status.as_str(), "{c}");
        // The leader's detail names seconds since the renewal.
        if c["name"] != "leader" {
            assert_eq!(c["detail"], detail.as_str(), "{c}");
        }
        assert_eq!(c["hint"].is_null(), status == "ok", "{c}");
    }

    // As a kubectl plugin.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        std::fs::canonicalize(janitor_bin()).unwrap(),
        dir.path().join("kubectl-lock_janitor"),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = lock_janitor_testenv::binary("kubectl").unwrap_or_else(|e| panic!("{e}"));
    let plugin = Outcome::new(
        Command::new(kubectl)
            .args(["lock-janitor", "check", "-n", &i.ns, "--kubeconfig"])
            .arg(i.cp.kubeconfig_path())
            .env("PATH", path)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap(),
    );
    assert_eq!(plugin.code, 0, "{plugin}");
    assert_eq!(plugin.status("leader"), "ok", "{plugin}");
}

#[tokio::test]
async fn usage_errors_and_no_install() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let out = Outcome::new(
        Command::new(janitor_bin())
            .args(["check", "-o", "yaml"])
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 2, "{out}");
    let empty = fresh_namespace(&client, "check-empty").await;
    let out = Outcome::new(
        Command::new(janitor_bin())
            .args(["check", "-n", &empty, "--kubeconfig"])
            .arg(cp.kubeconfig_path())
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("install-found"), "fail", "{out}");
    // The chart pinned to this version, from where the admin has it: no
    // registry URL that nothing was published to.
    let hint = out.hint("install-found");
    assert!(
        hint.starts_with(&format!(
            "install it: helm install lock-janitor <your chart reference> --version {} -n {empty} --create-namespace",
            env!("CARGO_PKG_VERSION")
        )),
        "{out}"
    );
    assert!(
        !hint.contains("oci://") && !hint.contains("ghcr.io"),
        "{out}"
    );

    // An API server that does not answer: said so, with its URL; no RBAC.
    let down = kubeconfig_unreachable(cp);
    let out = Outcome::new(
        Command::new(janitor_bin())
            .args(["check", "--kubeconfig"])
            .arg(&down)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stderr.contains(
            "listing deployments: cannot reach the Kubernetes API server at https://127.0.0.1:"
        ),
        "{out}"
    );
    assert!(
        !out.stderr.contains("needs list on deployments") && !out.stderr.contains("forbidden"),
        "{out}"
    );

    // Several installs and none named: a usage error naming them.
    let a = install("usage-a", &[]).await;
    let b = install("usage-b", &[]).await;
    let out = Outcome::new(
        Command::new(janitor_bin())
            .args(["check", "--kubeconfig"])
            .arg(cp.kubeconfig_path())
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 2, "{out}");
    for i in [&a, &b] {
        assert!(out.stderr.contains(&format!("{}/{RELEASE}", i.ns)), "{out}");
    }
    // A release that is not there.
    let out = a.check(&["--release", "other"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.detail("install-found")
            .contains("app.kubernetes.io/instance=other"),
        "{out}"
    );
}

#[tokio::test]
async fn pods_not_ready_fail() {
    let i = install("notready", &[]).await;
    kubelet::set_failed(
        &i.client,
        &i.ns,
        &i.pods[1],
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .unwrap();
    i.deployment_status(1).await;
    let out = i.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("install-found"), "fail", "{out}");
    let detail = out.detail("install-found");
    assert!(detail.contains("1/2 pods ready"), "{out}");
    assert!(detail.contains(&format!("{} (Failed)", i.pods[1])), "{out}");
    assert!(out.hint("install-found").contains("kubectl -n"), "{out}");
    out.others_pass("install-found");
}

#[tokio::test]
async fn a_stale_leader_lease_fails() {
    let i = install("leaderstale", &[]).await;
    let holder = i.pods[0].clone();
    i.leader_lease(&holder, 60).await;
    let out = i.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("leader"), "fail", "{out}");
    assert!(out.detail("leader").contains("expired 4"), "{out}");
    out.others_pass("leader");

    // Fresh but held by something that is no pod of the Deployment.
    i.leader_lease("someone-else", 0).await;
    let out = i.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.detail("leader").contains("no pod of the Deployment"),
        "{out}"
    );
}

#[tokio::test]
async fn rbac_missing_a_verb_fails() {
    let i = install("rbac", &[]).await;
    let roles: Api<Role> = Api::namespaced(i.client.clone(), &i.locks);
    let mut role = roles.get(RELEASE).await.expect("the chart's Role");
    for rule in role.rules.iter_mut().flatten() {
        if rule
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r == "configmaps"))
        {
            rule.verbs.retain(|v| v != "delete");
        }
    }
    roles
        .replace(RELEASE, &PostParams::default(), &role)
        .await
        .unwrap();
    let out = i.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("rbac"), "fail", "{out}");
    assert!(
        out.detail("rbac")
            .ends_with(&format!("may not: delete configmaps in {}", i.locks)),
        "{out}"
    );
    assert!(out.hint("rbac").contains("Role lock-janitor"), "{out}");
    // The guard could not be tried: RBAC refuses first.
    assert_eq!(out.status("delete-guard"), "warn", "{out}");
    out.others_pass("rbac");
}

/// The one watched namespace whose RoleBinding is gone: `check` names it as
/// a refused scope and says that with every scope refused the janitor does
/// not start (with others it would serve them and retry this one).
#[tokio::test]
async fn a_refused_scope_is_named() {
    let i = install("refused", &[]).await;
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(i.client.clone(), &i.locks)
        .delete(RELEASE, &DeleteParams::default())
        .await
        .expect("delete the chart's RoleBinding");
    let out = i.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("rbac"), "fail", "{out}");
    let detail = out.detail("rbac");
    assert!(detail.contains("list configmaps in"), "{out}");
    assert!(
        detail.ends_with(&format!(
            "every watched scope refused, so the janitor does not start (exit 1): {}",
            i.locks
        )),
        "{out}"
    );
}

#[tokio::test]
async fn a_removed_or_toothless_guard_fails() {
    let i = install("guard", &[]).await;
    let name = format!("{RELEASE}-{}-guard", i.ns);
    // Toothless: the policy allows everything.
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(i.client.clone());
    let patch = json!({"spec": {"validations": [{"expression": "true"}]}});
    policies
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    // The API server picks the change up within a moment.
    let out = wait_for(
        "the weakened guard to let the delete through",
        Duration::from_secs(30),
        || async {
            let out = i.check(&[]);
            out.detail("delete-guard")
                .contains("was allowed")
                .then_some(out)
        },
    )
    .await;
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("delete-guard"), "fail", "{out}");
    out.others_pass("delete-guard");

    // Removed: policy and binding gone.
    Api::<ValidatingAdmissionPolicyBinding>::all(i.client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    policies
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let out = i.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("delete-guard"), "fail", "{out}");
    assert!(out.detail("delete-guard").contains("RBAC alone"), "{out}");
    assert!(
        out.hint("delete-guard")
            .contains("deleteGuard.enabled=true"),
        "{out}"
    );
    out.others_pass("delete-guard");
}

/// A kubeconfig with the token of a new ServiceAccount `name` of `ns`: a
/// caller of its own, who impersonates nobody.
async fn token_kubeconfig(i: &Install, name: &str) -> std::path::PathBuf {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(i.client.clone(), &i.ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create(&PostParams::default(), &sa)
        .await
        .expect("create sa");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = sas
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("token")
        .status
        .expect("token status")
        .token;
    let admin = std::fs::read_to_string(i.cp.kubeconfig_path()).expect("admin kubeconfig");
    let start = admin
        .find("    client-certificate-data:")
        .expect("kubeconfig layout");
    let end = admin.find("contexts:").expect("kubeconfig layout");
    let text = format!("{}    token: {token}\n{}", &admin[..start], &admin[end..]);
    let path = i.cp.dir().join(format!("kubeconfig-{}-{name}", i.ns));
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

#[tokio::test]
async fn the_guard_untried_without_impersonation_warns() {
    let i = install("noimp", &[]).await;
    // A caller who may read and review, but not impersonate.
    let name = format!("checker-{}", i.ns);
    let role = k8s_openapi::api::rbac::v1::ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        rules: Some(vec![
            serde_json::from_value(json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]})).unwrap(),
            serde_json::from_value(json!({"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]})).unwrap(),
        ]),
        ..Default::default()
    };
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(i.client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "checker", "namespace": i.ns}],
    }))
    .unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(i.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let kubeconfig = token_kubeconfig(&i, "checker").await;
    let out = i.check_as(&kubeconfig, &[]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.status("delete-guard"), "warn", "{out}");
    assert!(
        out.detail("delete-guard").contains("may not impersonate"),
        "{out}"
    );
    assert!(out.hint("delete-guard").contains("impersonate"), "{out}");
    assert_eq!(out.status("rbac"), "ok", "{out}");
}

#[tokio::test]
async fn a_stale_lock_fails() {
    let i = install("stalelock", &[]).await;
    let holder = i
        .lock("memcached-operator-lock", "memcached-operator-1", true)
        .await;
    let name = holder.metadata.name.clone().unwrap();
    kubelet::set_failed(
        &i.client,
        &i.locks,
        &name,
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .unwrap();
    let out = i.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("stale-now"), "fail", "{out}");
    assert!(
        out.detail("stale-now").contains(&format!(
            "configmap {}/memcached-operator-lock (stale:Evicted)",
            i.locks
        )),
        "{out}"
    );
    assert!(out.hint("stale-now").contains("logs"), "{out}");
    out.others_pass("stale-now");
}

#[tokio::test]
async fn an_unlabeled_lock_warns() {
    let i = install("unlabeled", &[]).await;
    i.lock("memcached-operator-lock", "memcached-operator-1", false)
        .await;
    // Opted out on purpose: listed as such, no warning of its own.
    let pod = running_pod(&i.client, &i.locks, "redis-operator-1", &i.node).await;
    let mut out_lock = lock_for("redis-operator-lock", &pod, false);
    out_lock.metadata.labels = Some(BTreeMap::from([(OPT_IN_KEY.into(), "false".into())]));
    create_lock(&i.client, &out_lock).await;
    let out = i.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.status("locks"), "warn", "{out}");
    let detail = out.detail("locks");
    assert!(detail.contains("1 opted out on purpose"), "{out}");
    assert!(
        detail.contains(&format!(
            "{}/redis-operator-lock ({OPT_IN_KEY}=false)",
            i.locks
        )),
        "{out}"
    );
    assert!(
        detail.contains(&format!(
            "1 not opted in: {}/memcached-operator-lock",
            i.locks
        )),
        "{out}"
    );
    assert!(
        out.hint("locks").contains(&format!(
            "lock-janitor label -n {} --selector {} --apply",
            i.locks,
            i.selector()
        )),
        "{out}"
    );
    out.others_pass("locks");
}

/// `check` warns about the monitoring objects only where no Prometheus
/// would pick them up: kube-prometheus-stack's selects by a `release`
/// label; one with empty selectors (OpenShift's user workload monitoring)
/// needs none.
#[tokio::test]
async fn monitoring_warns_only_where_no_prometheus_selects_it() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    // The same CRDs as the chart suite's (support::chart): one definition
    // for every suite, whichever creates them first.
    install_monitoring_crds(&client).await;
    for plural in ["servicemonitors", "prometheusrules", "prometheuses"] {
        wait_for(
            &format!("{plural} served"),
            Duration::from_secs(30),
            || async {
                let r = client
                    .list_api_group_resources("monitoring.coreos.com/v1")
                    .await
                    .ok()?;
                r.resources.iter().any(|r| r.name == plural).then_some(())
            },
        )
        .await;
    }
    let monitoring = ["serviceMonitor.enabled=true", "prometheusRule.enabled=true"];
    // Enabled, without the label kube-prometheus-stack selects by; one with
    // it; one for a Prometheus that selects anything in its namespace.
    let unlabeled = install("monitoring", &monitoring).await;
    let labeled = install(
        "monitoring-ok",
        &[
            monitoring[0],
            monitoring[1],
            "serviceMonitor.additionalLabels.release=kps",
            "prometheusRule.additionalLabels.release=kps",
        ],
    )
    .await;
    let anything = install("monitoring-any", &monitoring).await;
    // Each Prometheus looks only at this test's namespaces: the other
    // suites' objects are not its business.
    let prometheus = |name: &str, ns: &str, selector: Value, namespaces: &[&str]| {
        let in_these = json!({"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]});
        json!({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "serviceMonitorSelector": selector, "serviceMonitorNamespaceSelector": in_these,
                "ruleSelector": selector, "ruleNamespaceSelector": in_these,
            },
        })
    };
    let ar = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "monitoring.coreos.com",
        "v1",
        "Prometheus",
    ));
    for (ns, p) in [
        (
            &unlabeled.ns,
            prometheus(
                "kps",
                &unlabeled.ns,
                json!({"matchLabels": {"release": "kps"}}),
                &[&unlabeled.ns, &labeled.ns],
            ),
        ),
        (
            &anything.ns,
            prometheus("user-workload", &anything.ns, json!({}), &[&anything.ns]),
        ),
    ] {
        let obj: kube::api::DynamicObject = serde_json::from_value(p).unwrap();
        Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), ns, &ar)
            .create(&PostParams::default(), &obj)
            .await
            .expect("Prometheus");
    }

    // No `release` label, and none needed.
    let out = anything.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.status("monitoring"), "ok", "{out}");
    assert!(
        out.detail("monitoring").contains(&format!(
            "picked up by Prometheus {}/user-workload",
            anything.ns
        )),
        "{out}"
    );

    let out = unlabeled.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.status("monitoring"), "warn", "{out}");
    assert!(
        out.detail("monitoring")
            .contains("picked up by no Prometheus"),
        "{out}"
    );
    assert!(
        out.hint("monitoring")
            .contains("--set serviceMonitor.additionalLabels.release=kps --set prometheusRule.additionalLabels.release=kps"),
        "{out}"
    );

    let out = labeled.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.status("monitoring"), "ok", "{out}");
    assert!(out.detail("monitoring").contains("release=kps"), "{out}");
    assert!(
        out.detail("monitoring")
            .contains(&format!("picked up by Prometheus {}/kps", unlabeled.ns)),
        "{out}"
    );

    // Not enabled at all.
    let bare = install("monitoring-off", &[]).await;
    let out = bare.check(&[]);
    assert_eq!(out.status("monitoring"), "warn", "{out}");
    assert!(
        out.detail("monitoring")
            .contains("no ServiceMonitor or PrometheusRule"),
        "{out}"
    );
}

/// `helm test`: the chart's test hook runs `lock-janitor check` against the
/// install as a ServiceAccount of its own. There is no kubelet here to run
/// its Pod, so the test applies the hook's own RBAC as helm would, runs the
/// Pod's command with that ServiceAccount's token, and sees every check
/// pass, the guard's impersonated dry run included: the hook's grants are
/// enough, and the Pod says what it runs.
#[tokio::test]
async fn the_helm_test_hook_checks_the_install_with_its_own_grants() {
    use crate::support::chart::{apply_rbac, render};
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let i = install("hook", &[]).await;
    i.lock("memcached-operator-lock", "memcached-operator-1", true)
        .await;
    let docs = render(
        RELEASE,
        &i.ns,
        &["--set".into(), format!("watchNamespaces={{{}}}", i.locks)],
    );
    let hooks: Vec<Value> = docs
        .into_iter()
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .collect();
    let pod = hooks
        .iter()
        .find(|d| d["kind"] == "Pod")
        .expect("a test Pod");
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap()
        .to_owned();
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["command"], json!(["/lock-janitor"]));
    let args: Vec<String> = serde_json::from_value(container["args"].clone()).unwrap();
    assert_eq!(args, ["check", "--namespace", &i.ns, "--release", RELEASE]);
    apply_rbac(&i.client, &hooks).await;

    // That ServiceAccount's own token, as the Pod would have it mounted.
    let token = Api::<ServiceAccount>::namespaced(i.client.clone(), &i.ns)
        .create_token_request(
            &sa,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: vec![],
                    expiration_seconds: Some(600),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("a token for the test's ServiceAccount")
        .status
        .expect("token status")
        .token;
    let mut kc = kube::config::Kubeconfig::read_from(i.cp.kubeconfig_path()).unwrap();
    for a in &mut kc.auth_infos {
        if let Some(info) = a.auth_info.as_mut() {
            *info = kube::config::AuthInfo {
                token: Some(token.clone().into()),
                ..Default::default()
            };
        }
    }
    let path = i.cp.dir().join(format!("kubeconfig-helm-test-{}", i.ns));
    std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
    // RBAC takes a moment; then every check passes as the Pod would see it.
    let out = wait_for(
        "the hook's grants in effect",
        Duration::from_secs(30),
        || {
            let out = i.check_as(&path, &["--release", RELEASE]);
            async move { (out.code == 0).then_some(out) }
        },
    )
    .await;
    for name in HEALTHY_OK {
        assert_eq!(out.status(name), "ok", "{name}\n{out}");
    }
}

#[tokio::test]
async fn a_dry_run_install_is_reported_as_dry_run() {
    let version = env!("CARGO_PKG_VERSION");
    // The chart's dryRun: --dry-run in the container's args.
    let i = install("dryrun", &["dryRun=true"]).await;
    let out = i.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.status("install-found"), "warn", "{out}");
    assert!(
        out.detail("install-found")
            .contains("in dry-run mode (--dry-run): it reports stale locks and frees none"),
        "{out}"
    );
    // The upgrade that ends it: this install's release, namespace and chart
    // version; the chart reference is the admin's.
    assert_eq!(
        out.hint("install-found"),
        format!(
            "to let it free stale locks: helm upgrade {RELEASE} <your chart reference> --version {version} -n {} \
             --reset-then-reuse-values --set dryRun=false (<your chart reference>: where you installed chart \
             lock-janitor {version} from)",
            i.ns
        ),
        "{out}"
    );
    assert!(out.stderr.contains("runs in dry-run mode"), "{out}");
    assert!(!out.stderr.contains("the install works"), "{out}");
    out.others_pass("");

    // Set through the container's env (the chart's extraEnv) instead.
    let e = install("dryrun-env", &[]).await;
    assert_eq!(e.check(&[]).status("install-found"), "ok");
    e.container_env(json!([
        {"name": "LOCK_JANITOR_DRY_RUN", "value": "true"},
        // Its args say --namespace: they win, as in the pod.
        {"name": "LOCK_JANITOR_NAMESPACE", "value": "kube-system"}
    ]))
    .await;
    let out = e.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.status("install-found"), "warn", "{out}");
    assert!(
        out.detail("install-found")
            .contains("dry-run mode (LOCK_JANITOR_DRY_RUN in its container's env)"),
        "{out}"
    );
    assert!(
        out.hint("install-found")
            .contains("remove LOCK_JANITOR_DRY_RUN from the container's env"),
        "{out}"
    );
    assert!(
        out.detail("rbac")
            .contains(&format!("its scope (namespace {}) needs", e.locks)),
        "{out}"
    );
    assert_eq!(out.status("rbac"), "ok", "{out}");

    // A flag only the env sets is read: --delete-pod needs delete on pods,
    // which the chart (deletePod=false) did not grant.
    e.container_env(json!([{"name": "LOCK_JANITOR_DELETE_POD", "value": "true"}]))
        .await;
    let out = e.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("rbac"), "fail", "{out}");
    assert!(
        out.detail("rbac")
            .ends_with(&format!("may not: delete pods in {}", e.locks)),
        "{out}"
    );
}

#[tokio::test]
async fn stale_locks_not_opted_in_warn_and_opted_in_ones_fail() {
    let i = install("stalewarn", &[]).await;
    let evict = |name: String| {
        let client = i.client.clone();
        let ns = i.locks.clone();
        async move {
            kubelet::set_failed(
                &client,
                &ns,
                &name,
                "Evicted",
                "The node was low on resource: memory.",
            )
            .await
            .unwrap();
        }
    };
    let holder = i
        .lock("legacy-operator-lock", "legacy-operator-1", false)
        .await;
    evict(holder.metadata.name.unwrap()).await;
    let out = i.check(&[]);
    assert_eq!(
        out.code, 0,
        "the cluster's lock, not the install's failure\n{out}"
    );
    assert_eq!(out.status("stale-now"), "warn", "{out}");
    assert!(
        out.detail("stale-now").contains(&format!(
            "stale now but not opted in (the janitor leaves them alone): configmap {}/legacy-operator-lock (stale:Evicted)",
            i.locks
        )),
        "{out}"
    );
    assert!(
        out.hint("stale-now").contains(&format!(
            "lock-janitor label -n {} --selector {} --apply",
            i.locks,
            i.selector()
        )),
        "{out}"
    );
    out.others_pass("");

    // An opted-in one beside it: that fails, and both are named.
    let holder = i
        .lock("memcached-operator-lock", "memcached-operator-1", true)
        .await;
    evict(holder.metadata.name.unwrap()).await;
    let out = i.check(&[]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.status("stale-now"), "fail", "{out}");
    let detail = out.detail("stale-now");
    assert!(
        detail.contains(&format!(
            "opted in and stale now, its holder dead and a replica waiting: configmap {}/memcached-operator-lock",
            i.locks
        )) && detail.contains("legacy-operator-lock"),
        "{out}"
    );
    out.others_pass("stale-now");
}

#[tokio::test]
async fn an_install_with_a_name_override_is_found() {
    let i = install("override", &["nameOverride=janitor"]).await;
    let d = Api::<Deployment>::namespaced(i.client.clone(), &i.ns)
        .get(RELEASE)
        .await
        .unwrap();
    assert_eq!(
        d.metadata.labels.as_ref().unwrap()["app.kubernetes.io/name"],
        "janitor",
        "nameOverride changes the name label"
    );
    let out = i.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    for name in HEALTHY_OK {
        assert_eq!(out.status(name), "ok", "{name}\n{out}");
    }
    assert!(
        out.detail("install-found")
            .contains(&format!("deployment {}/{RELEASE}", i.ns)),
        "{out}"
    );
    // By release name too.
    let out = i.check(&["--release", RELEASE]);
    assert_eq!(out.status("install-found"), "ok", "{out}");
}

#[tokio::test]
async fn opted_in_locks_outside_the_watched_namespaces_warn() {
    let i = install("outside", &[]).await;
    i.lock("memcached-operator-lock", "memcached-operator-1", true)
        .await;
    let other = fresh_namespace(&i.client, "outside-other").await;
    i.lock_in(&other, "stray-lock", "stray-operator-1", Some(&i.locks))
        .await;
    let out = i.check(&[]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.status("locks"), "warn", "{out}");
    assert!(
        out.detail("locks").contains(&format!(
            "; 1 opted in outside the watched namespaces, never freed: {other}/stray-lock"
        )),
        "{out}"
    );
    let mut both = [i.locks.clone(), other.clone()];
    both.sort();
    assert!(
        out.hint("locks").contains(&format!(
            "--set watchNamespaces={{{},{}}}",
            both[0], both[1]
        )),
        "{out}"
    );
    out.others_pass("");

    // A caller who may list only in the install's namespaces: not looked
    // for, and said so; no warning it cannot back.
    let user = format!("narrow-{}", i.ns);
    let read = |resources: &[&str]| {
        rule(
            &["", "apps", "coordination.k8s.io"],
            resources,
            &["get", "list"],
        )
    };
    grant_in(
        &i.client,
        &i.ns,
        "narrow",
        crate::support::user(&user),
        vec![read(&["deployments", "pods", "leases"])],
    )
    .await;
    grant_in(
        &i.client,
        &i.locks,
        "narrow",
        crate::support::user(&user),
        vec![read(&["configmaps", "pods", "leases"])],
    )
    .await;
    let kubeconfig = kubeconfig_as(i.cp, &user);
    let out = wait_for(
        "the narrow grants in effect",
        Duration::from_secs(30),
        || {
            let out = i.check_as(&kubeconfig, &[]);
            let judged = out.checks().get("locks").is_some_and(|c| c.0 != "fail");
            async move { judged.then_some(out) }
        },
    )
    .await;
    assert_eq!(out.status("locks"), "ok", "{out}");
    assert!(
        out.detail("locks").contains(
            "; opted-in locks outside the watched namespaces not looked for (you may not list them in all namespaces)"
        ),
        "{out}"
    );
}
