//! The Helm chart, end to end on the real control plane: its RBAC lets the
//! janitor do its job when it runs as the chart's ServiceAccount, every
//! granted verb is needed and nothing more is granted, every rendered
//! manifest is accepted by the API server (server-side dry-run with strict
//! field validation), and the chart's appVersion is the crate's version.
//!
//! Each test renders the chart with the testenv's helm (`helm template`,
//! release namespace = a fresh namespace), applies its ServiceAccount and RBAC
//! for real, and runs the real janitor binary with the Deployment's own args,
//! impersonating the ServiceAccount: user `system:serviceaccount:<ns>:<sa>`
//! with the groups a token of it carries. The locks live in a second fresh
//! namespace. Each release watches its own selector
//! (`lock-janitor.io/watch=<lock namespace>`), so the cluster-wide janitors
//! of tests running in parallel never touch each other's locks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::support::chart::*;
use crate::support::*;
use futures::future::join_all;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{GroupVersionKind, Request};
use kube::discovery::{pinned_kind, Scope};
use kube::{Api, Client};
use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);
const LABEL_KEY: &str = "lock-janitor.io/watch";

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    // The `helm test` hook's objects are not the install's.
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| kind_of(d) == kind && d["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect();
    assert_eq!(found.len(), 1, "want one {kind} in the rendered chart");
    found[0]
}

fn container(docs: &[Value]) -> &Value {
    &one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

/// Which chart values a test renders with.
#[derive(Clone, Copy, Default)]
struct Opts {
    delete_pod: bool,
    /// `watchNamespaces: [<lock namespace>]`: Roles instead of a ClusterRole.
    namespaced: bool,
    /// `dryRun: true`, with a 2 s owner-gone grace and resync.
    dry_run: bool,
}

impl Opts {
    fn helm_args(self, locks: &str) -> Vec<String> {
        let mut a = vec!["--set".to_string(), format!("selector={LABEL_KEY}={locks}")];
        let mut set = |s: String| a.extend(["--set".to_string(), s]);
        if self.delete_pod {
            set("deletePod=true".into());
        }
        if self.namespaced {
            set(format!("watchNamespaces={{{locks}}}"));
        }
        if self.dry_run {
            set("dryRun=true".into());
            set("ownerGoneGrace=2s".into());
            set("resync=2s".into());
        }
        a
    }
}

/// A verb taken out of the chart's rules: (API group, resource, verb).
type Verb = (&'static str, &'static str, &'static str);

/// Removes `verb` from every rendered Role/ClusterRole rule that grants it;
/// panics if none did (the test would prove nothing).
fn remove_verb(docs: &mut [Value], (group, resource, verb): Verb) {
    let mut removed = 0;
    for d in docs
        .iter_mut()
        .filter(|d| matches!(kind_of(d), "ClusterRole" | "Role"))
    {
        for rule in d["rules"].as_array_mut().into_iter().flatten() {
            let has =
                |k: &str, v: &str| rule[k].as_array().is_some_and(|a| a.iter().any(|x| x == v));
            if has("apiGroups", group) && has("resources", resource) {
                let verbs = rule["verbs"].as_array_mut().expect("verbs");
                let before = verbs.len();
                verbs.retain(|v| v != verb);
                removed += before - verbs.len();
            }
        }
    }
    assert!(
        removed > 0,
        "the chart does not grant {verb} on {group}/{resource}"
    );
}

/// The chart installed (ServiceAccount and RBAC) into a fresh release
/// namespace, with a fresh namespace for the locks and a node for the pods.
struct Release {
    cp: &'static ControlPlane,
    client: Client,
    /// The release namespace (also the release name).
    ns: String,
    /// Where the locks and their holders live.
    locks: String,
    node: String,
    /// The ServiceAccount the Deployment runs as.
    sa: String,
    /// The Deployment's container args, without --metrics-bind-address.
    args: Vec<String>,
}

async fn install(prefix: &str, opts: Opts, without: Option<Verb>) -> Release {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    let ns = fresh_namespace(&client, &format!("{prefix}-rel")).await;
    let locks = fresh_namespace(&client, &format!("{prefix}-locks")).await;
    let mut docs = render(&ns, &ns, &opts.helm_args(&locks));
    if let Some(v) = without {
        remove_verb(&mut docs, v);
    }
    apply_rbac(&client, &docs).await;
    let node = format!("node-{locks}");
    kubelet::create_node(&client, &node).await.expect("node");
    let sa = one(&docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName")
        .to_owned();
    let args = container(&docs)["args"]
        .as_array()
        .expect("container args")
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| !a.starts_with("--metrics-bind-address"))
        // A janitor scoped by its selector alone runs cluster-wide on the
        // shared control plane: with --auto-opt-in it would label every
        // suite's locks, and here it would race the label carry-over these
        // tests follow. tests/e2e/auto_opt_in.rs runs the chart's own flags
        // and RBAC with it.
        .filter(|a| *a != "--auto-opt-in")
        .map(str::to_owned)
        .collect();
    Release {
        cp,
        client,
        ns,
        locks,
        node,
        sa,
        args,
    }
}

impl Release {
    fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.ns, self.sa)
    }

    /// A kubeconfig that acts as the chart's ServiceAccount.
    fn kubeconfig(&self) -> PathBuf {
        sa_kubeconfig(self.cp, &self.ns, &self.sa)
    }

    fn arg_refs(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    /// Starts the janitor as the ServiceAccount and waits until it is ready.
    async fn janitor(&self) -> Janitor {
        Janitor::start(&self.kubeconfig(), &self.arg_refs()).await
    }

    /// Starts the janitor as the ServiceAccount without waiting.
    fn spawn_janitor(&self) -> Janitor {
        Janitor::spawn(&self.kubeconfig(), &self.arg_refs())
    }

    async fn pod(&self, name: &str) -> Pod {
        running_pod(&self.client, &self.locks, name, &self.node).await
    }

    /// A leader-for-life lock held by `holder`, opted in with this release's
    /// selector.
    async fn lock(&self, name: &str, holder: &Pod) -> ConfigMap {
        let mut cm = lock_for(name, holder, false);
        cm.metadata.labels = Some(BTreeMap::from([(
            LABEL_KEY.to_string(),
            self.locks.clone(),
        )]));
        create_lock(&self.client, &cm).await
    }

    /// A running leader, its lock, and then its eviction.
    async fn stale_lock(&self, lock: &str, holder: &str) {
        let leader = self.pod(holder).await;
        self.lock(lock, &leader).await;
        self.evict(holder).await;
    }

    async fn evict(&self, pod: &str) {
        kubelet::set_failed(
            &self.client,
            &self.locks,
            pod,
            "Evicted",
            "The node was low on resource: memory.",
        )
        .await
        .expect("evict");
    }

    async fn lock_exists(&self, lock: &str) -> bool {
        lock_exists(&self.client, &self.locks, lock).await
    }

    async fn wait_gone(&self, lock: &str) {
        wait_for(&format!("lock {lock} deleted"), WAIT, || async {
            (!self.lock_exists(lock).await).then_some(())
        })
        .await
    }

    async fn pod_exists(&self, pod: &str) -> bool {
        Api::<Pod>::namespaced(self.client.clone(), &self.locks)
            .get_opt(pod)
            .await
            .expect("get pod")
            .is_some()
    }

    /// Requests of the ServiceAccount, from the audit log.
    fn audit(&self) -> Vec<AuditEvent> {
        let user = self.user();
        lock_janitor_testenv::audit::read(self.cp.audit_log_path())
            .into_iter()
            .filter(|e| e.effective_user() == user)
            .collect()
    }

    /// The ServiceAccount's `verb` requests on `resource` with status `code`.
    fn audited(&self, verb: &str, resource: &str, code: u16) -> Vec<AuditEvent> {
        self.audit()
            .into_iter()
            .filter(|e| {
                e.verb == verb
                    && e.resource.as_deref() == Some(resource)
                    && e.subresource.is_none()
                    && e.code == Some(code)
            })
            .collect()
    }

    /// Waits until the audit log has such requests (the apiserver writes an
    /// event once the response is complete) and returns them.
    async fn wait_audited(&self, verb: &str, resource: &str, code: u16) -> Vec<AuditEvent> {
        wait_for(
            &format!("audit: {verb} {resource} -> {code} by {}", self.user()),
            WAIT,
            || async {
                let found = self.audited(verb, resource, code);
                (!found.is_empty()).then_some(found)
            },
        )
        .await
    }

    /// A SubjectAccessReview (as admin) for the ServiceAccount.
    async fn can(&self, ns: Option<&str>, group: &str, resource: &str, verb: &str) -> bool {
        let (resource, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_owned())),
            None => (resource, None),
        };
        let sar = SubjectAccessReview {
            metadata: ObjectMeta::default(),
            spec: SubjectAccessReviewSpec {
                user: Some(self.user()),
                groups: Some(sa_groups(&self.ns)),
                resource_attributes: Some(ResourceAttributes {
                    namespace: ns.map(str::to_owned),
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    subresource: sub,
                    verb: Some(verb.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            status: None,
        };
        Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await
            .expect("SubjectAccessReview")
            .status
            .expect("SubjectAccessReview status")
            .allowed
    }

    /// (group, resource, verb) that `user` may use in `ns`, as the user sees
    /// it (SelfSubjectRulesReview through impersonation).
    async fn rules_of(&self, user: &str, ns: &str) -> BTreeSet<(String, String, String)> {
        let mut config = self.cp.kube_config();
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups = Some(sa_groups(&self.ns));
        let client = Client::try_from(config).expect("impersonating client");
        let review = SelfSubjectRulesReview {
            metadata: ObjectMeta::default(),
            spec: SelfSubjectRulesReviewSpec {
                namespace: Some(ns.to_owned()),
            },
            status: None,
        };
        let status = Api::<SelfSubjectRulesReview>::all(client)
            .create(&PostParams::default(), &review)
            .await
            .expect("SelfSubjectRulesReview")
            .status
            .expect("SelfSubjectRulesReview status");
        assert!(!status.incomplete, "{:?}", status.evaluation_error);
        let mut out = BTreeSet::new();
        for r in status.resource_rules {
            // A rule limited to some names shows as `resource/name`.
            let names = r.resource_names.clone().unwrap_or_default();
            for g in r.api_groups.iter().flatten() {
                for res in r.resources.iter().flatten() {
                    for v in &r.verbs {
                        if names.is_empty() {
                            out.insert((g.clone(), res.clone(), v.clone()));
                        }
                        for n in &names {
                            out.insert((g.clone(), format!("{res}/{n}"), v.clone()));
                        }
                    }
                }
            }
        }
        out
    }

    /// What the ServiceAccount may do in `ns` beyond what every
    /// ServiceAccount of its namespace may do (discovery, self-reviews).
    async fn extra_rules_in(&self, ns: &str) -> BTreeSet<(String, String, String)> {
        let mine = self.rules_of(&self.user(), ns).await;
        let nobody = format!("system:serviceaccount:{}:nobody", self.ns);
        let base = self.rules_of(&nobody, ns).await;
        mine.difference(&base).cloned().collect()
    }
}

/// The rules the chart grants: exactly what `lock-janitor run` uses.
/// What the chart grants where the janitor works; `cluster_wide` adds the
/// one cluster-scoped read (namespaces, for the takeover followers).
fn granted(delete_pod: bool, cluster_wide: bool) -> BTreeSet<(String, String, String)> {
    let mut g = BTreeSet::new();
    let mut add = |group: &str, resource: &str, verbs: &[&str]| {
        for v in verbs {
            g.insert((group.to_owned(), resource.to_owned(), v.to_string()));
        }
    };
    add(
        "",
        "configmaps",
        &["get", "list", "watch", "delete", "patch"],
    );
    add("", "pods", &["get", "list", "watch"]);
    if delete_pod {
        add("", "pods", &["delete"]);
    }
    add(
        "coordination.k8s.io",
        "leases",
        &["get", "list", "watch", "update", "delete", "patch"],
    );
    add("events.k8s.io", "events", &["create", "patch", "list"]);
    for workload in ["replicasets", "deployments", "statefulsets"] {
        add("apps", workload, &["get"]);
    }
    if cluster_wide {
        add("", "namespaces", &["get"]);
    }
    g
}

async fn metric(j: &Janitor, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    sample(&j.metrics().await, name, labels)
}

async fn wait_metric(j: &Janitor, name: &str, labels: &[(&str, &str)], at_least: f64) -> f64 {
    wait_for(&format!("{name}{labels:?} >= {at_least}"), WAIT, || async {
        metric(j, name, labels).await.filter(|v| *v >= at_least)
    })
    .await
}

async fn wait_log(j: &Janitor, text: &str) {
    wait_for(&format!("janitor log line {text:?}"), WAIT, || async {
        j.logs().contains(text).then_some(())
    })
    .await
}

const FORBIDDEN: [(&str, &str); 1] = [("error", "forbidden")];

// ---------------------------------------------------------------------------
// The chart's RBAC is enough: reclaims as the chart's ServiceAccount.

/// The janitor's job with the chart's rights: a lock created after it
/// started (configmaps watch), an eviction (pods watch), the guarded delete,
/// the Event, the dead pod deleted or not, and the label carried over to the
/// lock of the replica that takes over, which keeps the operator protected.
async fn reclaims_with_chart_rbac(opts: Opts, prefix: &str) {
    let r = install(prefix, opts, None).await;
    let j = r.janitor().await;
    let leader = r.pod("leader").await;
    r.lock("op-lock", &leader).await;
    wait_metric(&j, "lock_janitor_locks", &[("state", "held")], 1.0).await;

    r.evict("leader").await;
    r.wait_gone("op-lock").await;
    let reclaimed = [
        ("lock_namespace", r.locks.as_str()),
        ("lock", "op-lock"),
        ("reason", "Evicted"),
    ];
    assert_eq!(
        wait_metric(&j, "lock_janitor_reclaims_total", &reclaimed, 1.0).await,
        1.0
    );
    let ev = wait_event(&r.client, &r.locks, "StaleLockReclaimed", "op-lock").await;
    assert_eq!(ev.reporting_controller.as_deref(), Some("lock-janitor"));
    let deletes = r.wait_audited("delete", "configmaps", 200).await;
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].name.as_deref(), Some("op-lock"));

    if opts.delete_pod {
        wait_for("dead holder deleted", WAIT, || async {
            (!r.pod_exists("leader").await).then_some(())
        })
        .await;
        let deleted = [("lock_namespace", r.locks.as_str()), ("reason", "Evicted")];
        assert_eq!(
            wait_metric(&j, "lock_janitor_pod_deletions_total", &deleted, 1.0).await,
            1.0
        );
        wait_event(&r.client, &r.locks, "DeadHolderDeleted", "op-lock").await;
        assert_eq!(r.wait_audited("delete", "pods", 200).await.len(), 1);
    } else {
        // Without deletePod the ServiceAccount may not delete pods, and the
        // janitor did not try.
        assert!(!r.can(Some(&r.locks), "", "pods", "delete").await);
        assert!(r.pod_exists("leader").await);
        assert!(
            r.audit()
                .iter()
                .all(|e| !(e.verb == "delete" && e.resource.as_deref() == Some("pods"))),
            "the janitor tried to delete a pod"
        );
    }

    // Takeover, as operator-lib does it: a waiting replica creates the lock,
    // without the opt-in label. The janitor carries the label over.
    let replica = r.pod("replica").await;
    become_leader(&r.client, &replica, "op-lock", false).await;
    let cms: Api<ConfigMap> = Api::namespaced(r.client.clone(), &r.locks);
    wait_for("opt-in label carried over", WAIT, || async {
        let cm = cms.get("op-lock").await.ok()?;
        (cm.metadata.labels?.get(LABEL_KEY) == Some(&r.locks)).then_some(())
    })
    .await;
    wait_log(&j, "opt-in label carried over").await;
    assert_eq!(r.wait_audited("patch", "configmaps", 200).await.len(), 1);

    // Still protected: the replica's eviction is reclaimed too.
    r.evict("replica").await;
    r.wait_gone("op-lock").await;
    assert_eq!(
        wait_metric(&j, "lock_janitor_reclaims_total", &reclaimed, 2.0).await,
        2.0
    );
    assert!(
        r.audit().iter().all(|e| e.code != Some(403)),
        "a request of the janitor was forbidden: {:?}",
        r.audit()
            .into_iter()
            .filter(|e| e.code == Some(403))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn chart_rbac_reclaims_without_delete_pod() {
    reclaims_with_chart_rbac(Opts::default(), "chart-default").await;
}

#[tokio::test]
async fn chart_rbac_reclaims_and_deletes_the_dead_pod_with_delete_pod() {
    let opts = Opts {
        delete_pod: true,
        ..Default::default()
    };
    reclaims_with_chart_rbac(opts, "chart-delpod").await;
}

#[tokio::test]
async fn chart_rbac_reclaims_in_namespaced_mode() {
    let opts = Opts {
        namespaced: true,
        ..Default::default()
    };
    reclaims_with_chart_rbac(opts, "chart-nsd").await;
}

// ---------------------------------------------------------------------------
// Nothing more: the grants, as the API server's authorizer sees them.

async fn grants_exactly(opts: Opts, prefix: &str) {
    let r = install(prefix, opts, None).await;
    let want = granted(opts.delete_pod, !opts.namespaced);
    // Leader election (two replicas by default): its own Lease, by name, and
    // create, in the release namespace only.
    let lease = r
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--leader-elect-lease="))
        .expect("leader election is on by default")
        .to_owned();
    let leases: BTreeSet<(String, String, String)> = [
        ("leases".to_string(), "create"),
        (format!("leases/{lease}"), "get"),
        (format!("leases/{lease}"), "update"),
    ]
    .into_iter()
    .map(|(res, v)| ("coordination.k8s.io".to_string(), res, v.to_string()))
    .collect();
    // The complete list of what the ServiceAccount may do, beyond what any
    // ServiceAccount may: exactly the chart's grants where it works...
    assert_eq!(r.extra_rules_in(&r.locks).await, want);
    // ...and, in namespaced mode, nothing anywhere else but its Lease.
    for elsewhere in [r.ns.as_str(), "default", "kube-system"] {
        let extra = r.extra_rules_in(elsewhere).await;
        let mut expected = if opts.namespaced {
            BTreeSet::new()
        } else {
            want.clone()
        };
        if elsewhere == r.ns {
            expected.extend(leases.iter().cloned());
        }
        assert_eq!(extra, expected, "in {elsewhere}");
    }

    // The same, request by request (SubjectAccessReview as admin).
    let here = Some(r.locks.as_str());
    let mut cases: Vec<(Option<&str>, &str, &str, &str, bool)> = vec![];
    for (g, res, v) in &want {
        cases.push((here, g.as_str(), res.as_str(), v.as_str(), true));
    }
    let denied_here: &[(&str, &str, &[&str])] = &[
        ("", "configmaps", &["create", "update", "deletecollection"]),
        (
            "",
            "pods",
            &["create", "update", "patch", "deletecollection"],
        ),
        ("", "pods/status", &["get", "update", "patch"]),
        ("", "pods/eviction", &["create"]),
        ("", "pods/log", &["get"]),
        ("", "pods/exec", &["create", "get"]),
        ("", "secrets", &["get", "list", "watch"]),
        ("", "events", &["create", "patch"]),
        ("", "serviceaccounts/token", &["create"]),
        (
            "events.k8s.io",
            "events",
            &["get", "watch", "update", "delete"],
        ),
        // delete and patch of Leases are granted where locks are watched:
        // a Lease held for life is deleted, its successor labeled.
        (
            "coordination.k8s.io",
            "leases",
            &["create", "deletecollection"],
        ),
        // Workloads are read (get), never changed or listed.
        ("apps", "deployments", &["update", "list", "patch"]),
        ("apps", "replicasets", &["update", "list", "delete"]),
        ("apps", "statefulsets", &["update", "list"]),
    ];
    for (g, res, verbs) in denied_here {
        for v in *verbs {
            cases.push((here, g, res, v, false));
        }
    }
    if !opts.delete_pod {
        cases.push((here, "", "pods", "delete", false));
    }
    // Leases in the release namespace: create for its own; get, update,
    // list, delete and patch of Lease locks only where it watches
    // (everywhere with a ClusterRole); the guard narrows delete and patch
    // to Leases held for life.
    let release = Some(r.ns.as_str());
    cases.push((release, "coordination.k8s.io", "leases", "create", true));
    for v in ["get", "update", "list", "delete", "patch"] {
        cases.push((
            release,
            "coordination.k8s.io",
            "leases",
            v,
            !opts.namespaced,
        ));
    }
    // Cluster scope: list/watch of every namespace only for a ClusterRole;
    // never anything cluster-scoped.
    for (g, res) in [
        ("", "configmaps"),
        ("", "pods"),
        ("coordination.k8s.io", "leases"),
    ] {
        for v in ["list", "watch"] {
            cases.push((None, g, res, v, !opts.namespaced));
        }
    }
    for (g, res, verbs) in [
        ("", "nodes", &["get", "list", "watch", "patch"][..]),
        // get of a namespace only for a ClusterRole (the takeover followers).
        ("", "namespaces", &["list", "watch", "delete"][..]),
        ("", "users", &["impersonate"][..]),
        ("", "serviceaccounts", &["impersonate"][..]),
        (
            "rbac.authorization.k8s.io",
            "clusterroles",
            &["escalate", "bind"][..],
        ),
        (
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            &["list"][..],
        ),
    ] {
        for v in verbs {
            cases.push((None, g, res, v, false));
        }
    }
    cases.push((None, "", "namespaces", "get", !opts.namespaced));
    // Namespaced mode: the grants stop at the watched namespace.
    if opts.namespaced {
        for ns in [r.ns.as_str(), "default"] {
            for (g, res, v) in &want {
                cases.push((Some(ns), g.as_str(), res.as_str(), v.as_str(), false));
            }
        }
    }
    let answers = join_all(cases.iter().map(|(ns, g, res, v, _)| r.can(*ns, g, res, v))).await;
    let wrong: Vec<String> = cases
        .iter()
        .zip(answers)
        .filter(|((.., want), got)| want != got)
        .map(|((ns, g, res, v, want), _)| {
            format!(
                "{v} {g}/{res} in {}: want allowed={want}",
                ns.unwrap_or("<cluster>")
            )
        })
        .collect();
    assert!(wrong.is_empty(), "RBAC matrix:\n{}", wrong.join("\n"));
}

#[tokio::test]
async fn chart_grants_exactly_what_the_janitor_uses() {
    grants_exactly(Opts::default(), "grants").await;
}

#[tokio::test]
async fn chart_grants_pod_delete_only_with_delete_pod() {
    let opts = Opts {
        delete_pod: true,
        ..Default::default()
    };
    grants_exactly(opts, "grants-delpod").await;
}

#[tokio::test]
async fn chart_grants_nothing_outside_watched_namespaces() {
    let opts = Opts {
        namespaced: true,
        ..Default::default()
    };
    grants_exactly(opts, "grants-nsd").await;
}

// ---------------------------------------------------------------------------
// Every granted verb is needed: the chart with one verb taken out, and what
// the janitor then fails to do.

/// Without `list` or `watch` the start-up check fails: exit code 1, naming RBAC.
async fn exits_without(resource: &'static str, verb: &'static str, prefix: &str) {
    let group = if resource == "leases" {
        "coordination.k8s.io"
    } else {
        ""
    };
    let r = install(prefix, Opts::default(), Some((group, resource, verb))).await;
    let mut j = r.spawn_janitor();
    let status = j
        .wait_exit(WAIT)
        .await
        .unwrap_or_else(|| panic!("the janitor keeps running without {verb}"));
    assert_eq!(status.code(), Some(1), "{}", j.logs());
    let logs = j.logs();
    let action = if verb == "list" {
        "listing"
    } else {
        "watching"
    };
    assert!(
        logs.contains("start-up check failed")
            && logs.contains("RBAC")
            && logs.contains(&format!("{action} {resource}"))
            && logs.contains("forbidden"),
        "{logs}"
    );
    r.wait_audited(verb, resource, 403).await;
}

#[tokio::test]
async fn needs_configmaps_list() {
    exits_without("configmaps", "list", "no-cm-list").await;
}

#[tokio::test]
async fn needs_pods_list() {
    exits_without("pods", "list", "no-pod-list").await;
}

/// Without `watch` a watcher lists once (and looks synced), then retries a
/// forbidden watch forever and misses every change. The start-up check
/// opens a short watch, so the janitor refuses to start instead.
#[tokio::test]
async fn needs_configmaps_watch() {
    exits_without("configmaps", "watch", "no-cm-watch").await;
}

#[tokio::test]
async fn needs_pods_watch() {
    exits_without("pods", "watch", "no-pod-watch").await;
}

#[tokio::test]
async fn needs_leases_list() {
    exits_without("leases", "list", "no-lease-list").await;
}

#[tokio::test]
async fn needs_leases_watch() {
    exits_without("leases", "watch", "no-lease-watch").await;
}

/// Without `get` on configmaps or pods the janitor cannot make the live
/// reads it judges from: every reconcile fails as forbidden, nothing is
/// deleted.
async fn no_live_read(resource: &'static str, prefix: &str) {
    let r = install(prefix, Opts::default(), Some(("", resource, "get"))).await;
    let j = r.janitor().await;
    r.stale_lock("op-lock", "leader").await;
    let before = wait_metric(&j, "lock_janitor_reconcile_errors_total", &FORBIDDEN, 1.0).await;
    // It tries again (after the eviction, and on its error backoff) and fails again.
    wait_metric(
        &j,
        "lock_janitor_reconcile_errors_total",
        &FORBIDDEN,
        before + 1.0,
    )
    .await;
    assert!(r.lock_exists("op-lock").await);
    r.wait_audited("get", resource, 403).await;
    assert!(r.audited("delete", "configmaps", 200).is_empty());
}

#[tokio::test]
async fn needs_configmaps_get() {
    no_live_read("configmaps", "no-cm-get").await;
}

#[tokio::test]
async fn needs_pods_get() {
    no_live_read("pods", "no-pod-get").await;
}

/// Without `delete` on configmaps the stale lock stays, the error counts as
/// forbidden and the lock is reported stale.
#[tokio::test]
async fn needs_configmaps_delete() {
    let r = install(
        "no-cm-delete",
        Opts::default(),
        Some(("", "configmaps", "delete")),
    )
    .await;
    let j = r.janitor().await;
    r.stale_lock("op-lock", "leader").await;
    wait_metric(&j, "lock_janitor_reconcile_errors_total", &FORBIDDEN, 1.0).await;
    let stale = [
        ("lock_namespace", r.locks.as_str()),
        ("lock", "op-lock"),
        ("reason", "Evicted"),
    ];
    assert_eq!(
        metric(&j, "lock_janitor_stale_locks", &stale).await,
        Some(1.0)
    );
    assert!(r.lock_exists("op-lock").await);
    r.wait_audited("delete", "configmaps", 403).await;
}

/// Without `patch` on configmaps the reclaim works once, but the lock of the
/// replica that takes over stays without the opt-in label: the operator is
/// no longer protected.
#[tokio::test]
async fn needs_configmaps_patch() {
    let r = install(
        "no-cm-patch",
        Opts::default(),
        Some(("", "configmaps", "patch")),
    )
    .await;
    let j = r.janitor().await;
    r.stale_lock("op-lock", "leader").await;
    r.wait_gone("op-lock").await;
    let replica = r.pod("replica").await;
    become_leader(&r.client, &replica, "op-lock", false).await;
    // After five failed writes, 1 + 2 + 4 + 8 s apart.
    wait_for(
        "the carry-over to give up",
        Duration::from_secs(90),
        || async {
            j.logs()
                .contains("could not carry the opt-in label over")
                .then_some(())
        },
    )
    .await;
    let cm = Api::<ConfigMap>::namespaced(r.client.clone(), &r.locks)
        .get("op-lock")
        .await
        .expect("the replica's lock");
    assert!(
        !cm.metadata
            .labels
            .unwrap_or_default()
            .contains_key(LABEL_KEY),
        "the lock was labeled without patch"
    );
    r.wait_audited("patch", "configmaps", 403).await;
}

/// Without `delete` on pods (deletePod=true) the lock is reclaimed but the
/// dead pod stays, counted as a forbidden error.
#[tokio::test]
async fn needs_pods_delete_with_delete_pod() {
    let opts = Opts {
        delete_pod: true,
        ..Default::default()
    };
    let r = install("no-pod-delete", opts, Some(("", "pods", "delete"))).await;
    let j = r.janitor().await;
    r.stale_lock("op-lock", "leader").await;
    r.wait_gone("op-lock").await;
    wait_metric(&j, "lock_janitor_reconcile_errors_total", &FORBIDDEN, 1.0).await;
    assert!(r.pod_exists("leader").await);
    assert_eq!(
        metric(
            &j,
            "lock_janitor_pod_deletions_total",
            &[("lock_namespace", r.locks.as_str())]
        )
        .await,
        None
    );
    r.wait_audited("delete", "pods", 403).await;
}

/// Without `create` on events.k8s.io events the reclaim goes through but
/// nobody is told: no Event, and an `event` error.
#[tokio::test]
async fn needs_events_create() {
    let r = install(
        "no-ev-create",
        Opts::default(),
        Some(("events.k8s.io", "events", "create")),
    )
    .await;
    let j = r.janitor().await;
    r.stale_lock("op-lock", "leader").await;
    r.wait_gone("op-lock").await;
    wait_metric(
        &j,
        "lock_janitor_reconcile_errors_total",
        &[("error", "event")],
        1.0,
    )
    .await;
    assert!(events(&r.client, &r.locks, "StaleLockReclaimed")
        .await
        .is_empty());
    r.wait_audited("create", "events", 403).await;
}

/// kube's event recorder patches an Event it wrote when the same report
/// repeats (same lock version, reason and related pod, within its 6-minute
/// cache) instead of creating a new one. The janitor repeats a report when
/// its verdict flips back while the lock stays unchanged: in dry-run, a lock
/// reported stale (StaleLockDetected: its holder is gone), then ambiguous (a
/// pod with the holder's name but another uid appears), then stale again
/// (that pod goes). With the garbage collector on, a lock outlives its
/// holder like that only while a finalizer holds its deletion, so the test
/// gives it one. The second StaleLockDetected is a patch.
async fn repeated_event(without_patch: bool, prefix: &str) {
    let opts = Opts {
        dry_run: true,
        ..Default::default()
    };
    let without = without_patch.then_some(("events.k8s.io", "events", "patch"));
    let r = install(prefix, opts, without).await;
    let ghost = Pod {
        metadata: ObjectMeta {
            name: Some("ghost".into()),
            namespace: Some(r.locks.clone()),
            uid: Some("00000000-0000-4000-8000-00000000dead".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let cms: Api<ConfigMap> = Api::namespaced(r.client.clone(), &r.locks);
    let mut lock = lock_for("ghost-lock", &ghost, false);
    lock.metadata.labels = Some(BTreeMap::from([(LABEL_KEY.to_string(), r.locks.clone())]));
    lock.metadata.finalizers = Some(vec!["lock-janitor.io/test-hold".into()]);
    create_lock(&r.client, &lock).await;
    wait_for("the garbage collector deleting the lock", WAIT, || async {
        cms.get("ghost-lock")
            .await
            .ok()?
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;

    let j = r.janitor().await;
    wait_event(&r.client, &r.locks, "StaleLockDetected", "ghost-lock").await;
    r.pod("ghost").await;
    wait_event(&r.client, &r.locks, "AmbiguousLock", "ghost-lock").await;
    kubelet::force_delete_pod(&r.client, &r.locks, "ghost")
        .await
        .expect("delete pod");
    let event_errors = [("error", "event")];
    if without_patch {
        wait_metric(
            &j,
            "lock_janitor_reconcile_errors_total",
            &event_errors,
            1.0,
        )
        .await;
        r.wait_audited("patch", "events", 403).await;
    } else {
        wait_for("the Event's series count at 2", WAIT, || async {
            events(&r.client, &r.locks, "StaleLockDetected")
                .await
                .into_iter()
                .find_map(|e| e.series.filter(|s| s.count == 2))
        })
        .await;
        assert_eq!(
            metric(&j, "lock_janitor_reconcile_errors_total", &event_errors).await,
            Some(0.0)
        );
        assert_eq!(r.wait_audited("patch", "events", 200).await.len(), 1);
    }
    assert_eq!(
        events(&r.client, &r.locks, "StaleLockDetected").await.len(),
        1
    );
    // Let the lock go.
    cms.patch(
        "ghost-lock",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");
}

#[tokio::test]
async fn repeated_event_is_patched() {
    repeated_event(false, "ev-patch").await;
}

#[tokio::test]
async fn needs_events_patch() {
    repeated_event(true, "no-ev-patch").await;
}

// ---------------------------------------------------------------------------
// Every manifest is accepted by the API server.

/// POST `doc` with `dryRun=All` and `fieldValidation=Strict`: the API server
/// runs defaulting, validation and admission, and stores nothing.
async fn dry_run_create(client: &Client, doc: &Value) -> Result<Value, kube::Error> {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind_of(doc));
    // A new CRD takes a moment to show up in discovery.
    let (ar, caps) = wait_for(&format!("discovery of {gvk:?}"), WAIT, || async {
        pinned_kind(client, &gvk).await.ok()
    })
    .await;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            doc["metadata"]["namespace"].as_str().expect("namespace"),
            &ar,
        ),
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    };
    let pp = PostParams {
        dry_run: true,
        field_manager: Some("lock-janitor-chart-test".into()),
    };
    let mut req = Request::new(api.resource_url())
        .create(&pp, serde_json::to_vec(doc).expect("json"))
        .map_err(kube::Error::BuildRequest)?;
    let uri = format!("{}&fieldValidation=Strict", req.uri());
    *req.uri_mut() = uri.parse().expect("uri");
    client.request::<Value>(req).await
}

async fn exists(client: &Client, doc: &Value) -> bool {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind_of(doc));
    let (ar, caps) = pinned_kind(client, &gvk).await.expect("discovery");
    let api: Api<DynamicObject> = match (caps.scope, doc["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    api.get_opt(name_of(doc)).await.expect("get").is_some()
}

fn api_error(r: Result<Value, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.message),
        other => panic!("want an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn rendered_manifests_pass_server_side_dry_run() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    install_monitoring_crds(&client).await;
    let ns = fresh_namespace(&client, "dryrun").await;
    let watched = fresh_namespace(&client, "dryrun-watched").await;
    let ci = chart_dir().join("ci");
    let file = |f: &str| ci.join(f).to_string_lossy().into_owned();
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("defaults", vec![]),
        ("all-on", vec!["-f".into(), file("all-on-values.yaml")]),
        (
            "namespaced",
            vec![
                "-f".into(),
                file("namespaced-values.yaml"),
                "--set".into(),
                format!("watchNamespaces={{{watched}}}"),
            ],
        ),
        // The guard is on by default, also under plain `helm template`
        // (GitOps), and the API server takes it as rendered; off, none.
        (
            "no-guard",
            vec![
                "--set".into(),
                "admissionPolicies.deleteGuard.enabled=false".into(),
            ],
        ),
    ];
    let mut all_kinds = BTreeSet::new();
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let mut hook_sas: Vec<String> = Vec::new();
    for (case, args) in &cases {
        let docs = render(&format!("{ns}-{case}"), &ns, args);
        assert!(!docs.is_empty(), "{case}: nothing rendered");
        let guard = docs
            .iter()
            .filter(|d| kind_of(d).starts_with("ValidatingAdmissionPolicy"))
            .count();
        assert_eq!(
            guard,
            if *case == "no-guard" { 0 } else { 2 },
            "{case}: the guard's policy and binding under plain helm template"
        );
        for d in &docs {
            // The `helm test` Pod is admitted only if its ServiceAccount
            // exists: that one is created for real (the API server
            // validates it as a dry run would), and removed below.
            let hook = !d["metadata"]["annotations"]["helm.sh/hook"].is_null();
            if hook && kind_of(d) == "ServiceAccount" {
                let sa: k8s_openapi::api::core::v1::ServiceAccount =
                    serde_json::from_value(d.clone()).unwrap();
                sas.create(&PostParams::default(), &sa)
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "{case}: the API server refused ServiceAccount {}: {e}",
                            name_of(d)
                        )
                    });
                hook_sas.push(name_of(d).to_owned());
                all_kinds.insert(kind_of(d).to_owned());
                continue;
            }
            if let Err(e) = dry_run_create(&client, d).await {
                panic!(
                    "{case}: the API server refused {} {}: {e}\n{d:#}",
                    kind_of(d),
                    name_of(d)
                );
            }
            all_kinds.insert(kind_of(d).to_owned());
        }
        for name in hook_sas.drain(..) {
            sas.delete(&name, &Default::default()).await.unwrap();
        }
        wait_for("the hook's ServiceAccounts gone", WAIT, || async {
            let left = sas.list(&Default::default()).await.ok()?;
            left.items
                .iter()
                .all(|sa| {
                    !sa.metadata
                        .name
                        .as_deref()
                        .unwrap_or_default()
                        .ends_with("-test")
                })
                .then_some(())
        })
        .await;
        // A dry run stores nothing.
        for d in &docs {
            assert!(
                !exists(&client, d).await,
                "{case}: {} {} was stored",
                kind_of(d),
                name_of(d)
            );
        }
    }
    let want: BTreeSet<String> = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        // the `helm test` hook's
        "Pod",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        // on by default
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(all_kinds, want);

    // The check has teeth: strict field validation and the CRD schemas
    // refuse a misspelt or mistyped field.
    let docs = render(
        &format!("{ns}-bad"),
        &ns,
        &["-f".into(), file("all-on-values.yaml")],
    );
    let mut dep = one(&docs, "Deployment").clone();
    dep["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = json!({});
    let (code, msg) = api_error(dry_run_create(&client, &dep).await);
    assert!(code == 400 && msg.contains("unknown field"), "{code} {msg}");
    let mut sm = one(&docs, "ServiceMonitor").clone();
    sm["spec"]["endpoints"][0]["honorLabel"] = json!(true);
    let (code, msg) = api_error(dry_run_create(&client, &sm).await);
    assert!(code == 400 && msg.contains("unknown field"), "{code} {msg}");
    let mut rule = one(&docs, "PrometheusRule").clone();
    rule["spec"]["groups"][0]["rules"][0]["for"] = json!("10 minutes");
    let (code, msg) = api_error(dry_run_create(&client, &rule).await);
    assert!(code == 422, "{code} {msg}");
}

/// The Deployment's pod passes Pod Security "restricted", enforced by the
/// API server's PodSecurity admission in a namespace labeled for it, also as
/// rendered for OpenShift, and fixes no runAsUser/runAsGroup/fsGroup (the
/// image's USER runs it; OpenShift's restricted-v2 assigns its own).
#[tokio::test]
async fn deployment_pod_meets_pod_security_restricted() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    let base = fresh_namespace(&client, "pss").await;
    // A second namespace, restricted: fresh_namespace cannot label.
    let ns = format!("{base}-restricted");
    let labels = [
        ("pod-security.kubernetes.io/enforce", "restricted"),
        ("pod-security.kubernetes.io/enforce-version", "latest"),
    ];
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.clone()),
                    labels: Some(
                        labels
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("namespace");
    let all_on = chart_dir().join("ci/all-on-values.yaml");
    for (case, args) in [
        ("defaults", vec![]),
        (
            "all-on",
            vec!["-f".to_string(), all_on.to_string_lossy().into_owned()],
        ),
        // As on OpenShift (its security API served): the same pod, no fixed
        // UID/GID for restricted-v2 (hack/check_chart_render.py checks the SCC rules).
        (
            "openshift",
            vec!["--api-versions=security.openshift.io/v1".to_string()],
        ),
    ] {
        let release = format!("pss-{case}");
        let docs = render(&release, &ns, &args);
        // The pod runs as the chart's ServiceAccount, which must exist.
        create(
            Api::<ServiceAccount>::namespaced(client.clone(), &ns),
            one(&docs, "ServiceAccount"),
        )
        .await;
        let template = &one(&docs, "Deployment")["spec"]["template"];
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": template["metadata"].clone(),
            "spec": template["spec"].clone(),
        });
        for key in ["runAsUser", "runAsGroup", "fsGroup"] {
            assert!(
                pod["spec"]["securityContext"].get(key).is_none(),
                "{case}: the pod fixes {key}"
            );
        }
        pod["metadata"]["name"] = json!(format!("{release}-pod"));
        pod["metadata"]["namespace"] = json!(ns);
        if let Err(e) = dry_run_create(&client, &pod).await {
            panic!("{case}: the pod does not pass Pod Security restricted: {e}\n{pod:#}");
        }
        // The check has teeth: one weakened setting is refused.
        pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
        let (code, msg) = api_error(dry_run_create(&client, &pod).await);
        assert!(
            code == 403 && msg.contains("violates PodSecurity"),
            "{code} {msg}"
        );
    }
}

// ---------------------------------------------------------------------------

/// The chart installs the version of the code it ships with.
#[test]
fn chart_app_version_is_the_crate_version() {
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .expect("Chart.yaml");
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
    // And the image tag defaults to it.
    let docs = render("lj", "lj", &[]);
    let image = container(&docs)["image"].as_str().expect("image");
    assert_eq!(
        image,
        format!(
            "ghcr.io/lock-janitor/lock-janitor:{}",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// `rbac.create=false` says what to grant: every resource and verb of the
/// ClusterRole the chart renders with the default `lockKinds` (Leases
/// included), in values.yaml's comment (so the chart README) and in the
/// runbooks' list of what the janitor needs.
#[test]
fn rbac_guidance_lists_every_verb_the_chart_grants() {
    let collapse = |s: &str| {
        s.replace('#', " ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let values = collapse(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap());
    let runbooks =
        collapse(&std::fs::read_to_string(chart_dir().join("../../docs/runbooks.md")).unwrap());
    let docs = render("lj", "lj", &[]);
    let role = one(&docs, "ClusterRole");
    let mut said = 0;
    for rule in role["rules"].as_array().expect("rules") {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for resource in rule["resources"].as_array().unwrap() {
            let want = format!("{} {}", resource.as_str().unwrap(), verbs.join("/"));
            assert!(
                values.contains(&want),
                "values.yaml's rbac.create comment does not say {want:?}"
            );
            assert!(
                runbooks.contains(&want),
                "docs/runbooks.md does not say {want:?}"
            );
            said += 1;
        }
    }
    assert_eq!(
        said, 8,
        "configmaps, leases, pods, events, replicasets, deployments, statefulsets, namespaces: {role:#}"
    );
}

/// `helm template` with `args`: the rendered documents, or helm's error.
fn try_render(args: &[String]) -> Result<Vec<Value>, String> {
    let out = std::process::Command::new(helm())
        .args(["template", "lj"])
        .arg(chart_dir())
        .args(["--namespace", "lj"])
        .args(args)
        .output()
        .expect("running helm");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(render("lj", "lj", args))
}

/// The chart refuses exactly the durations the janitor refuses, at render
/// time: each bound of src/cli.rs (`parse_duration`, at most 24h;
/// `parse_positive_duration`, above 0; `parse_at_least_a_second`, 1s to
/// 24h; `parse_lease_duration`, 3s to 10m)
/// and its neighbours, asked of `helm template` and of the binary's own
/// parser. A bound changed in src/cli.rs and not in the chart (or the other
/// way round) fails here.
#[test]
fn chart_duration_bounds_are_the_binarys() {
    let day: &[&str] = &[
        "0s", "0ns", "1ns", "30s", "1.5m", "2m", "1h 30m", "1hour", "24h", "1d", "1440m",
        "24h 1ns", "86401s", "25h", "2d", "48h", "1w", "30x", "1.5ns", "5",
    ];
    let lease: &[&str] = &[
        "0s", "1s", "2s", "2999ms", "3s", "3000ms", "15s", "1.5m", "10m", "600s", "10m 1ns",
        "601s", "11m", "1h", "15 s",
    ];
    // The floors of --owner-gone-grace and --resync, and the day above them.
    let floored: Vec<&str> = [
        "1ms",
        "999ms",
        "0.9s",
        "999999999ns",
        "1s",
        "1000ms",
        "1000000000ns",
        "1.5s",
        "2s",
        "3s",
    ]
    .iter()
    .chain(day)
    .copied()
    .collect();
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "leaderElection.leaseDuration",
            "--leader-elect-lease-duration",
            lease,
        ),
        ("ownerGoneGrace", "--owner-gone-grace", &floored),
        ("resync", "--resync", &floored),
        ("takeoverTimeout", "--takeover-timeout", day),
    ];
    let mut accepted = 0;
    let mut refused = 0;
    for (value, flag, samples) in cases {
        for v in samples {
            let arg = format!("{flag}={v}");
            let binary = lock_janitor::cli::Cli::try_parse_checked(["lock-janitor", "run", &arg]);
            let chart = try_render(&["--set-string".into(), format!("{value}={v}")]);
            match (&chart, &binary) {
                (Ok(docs), Ok(_)) => {
                    let args = container(docs)["args"].as_array().expect("args");
                    assert!(
                        args.iter().any(|a| a == &json!(arg)),
                        "{value}={v:?}: the Deployment does not pass {arg}"
                    );
                    accepted += 1;
                }
                (Err(e), Err(_)) => {
                    assert!(
                        e.contains(value)
                            && (e.contains("out of range")
                                || e.contains("is not")
                                || e.contains("pattern")),
                        "{value}={v:?}: refused without saying why: {e}"
                    );
                    refused += 1;
                }
                (Ok(_), Err(b)) => {
                    panic!("{value}={v:?}: the chart renders what the janitor refuses: {b}")
                }
                (Err(e), Ok(_)) => {
                    panic!("{value}={v:?}: the chart refuses what the janitor takes: {e}")
                }
            }
        }
    }
    assert!(
        accepted >= 20 && refused >= 20,
        "{accepted} accepted, {refused} refused"
    );
}

/// Two installs with one release name, in two namespaces, share no name of
/// a cluster-scoped object (RBAC, the admission policies and their
/// bindings, the `helm test` hook's RBAC): each carries its namespace. Both
/// installs' RBAC is created on the real API server, and each
/// ServiceAccount gets the cluster-wide rights of its own install.
#[tokio::test]
async fn two_installs_of_one_release_name_share_no_cluster_scoped_name() {
    const CLUSTER_SCOPED: [&str; 4] = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut installs = Vec::new();
    for team in ["twin-a", "twin-b"] {
        let ns = fresh_namespace(&client, team).await;
        let docs = render(
            "twin",
            &ns,
            &[
                "--api-versions=admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy".into(),
                "--set".into(),
                format!("selector={LABEL_KEY}={ns}"),
            ],
        );
        let mut kinds = BTreeSet::new();
        for d in docs.iter().filter(|d| CLUSTER_SCOPED.contains(&kind_of(d))) {
            let name = format!("{}/{}", kind_of(d), name_of(d));
            assert!(
                name_of(d).contains(&ns),
                "{name} does not name its namespace {ns}"
            );
            if let Some(other) = seen.insert(name.clone(), ns.clone()) {
                panic!("{name} is rendered by the installs in {other} and {ns}");
            }
            kinds.insert(kind_of(d).to_owned());
        }
        assert_eq!(kinds.len(), CLUSTER_SCOPED.len(), "{kinds:?}");
        let role = name_of(one(&docs, "ClusterRole")).to_owned();
        assert_eq!(
            one(&docs, "ClusterRoleBinding")["roleRef"]["name"],
            json!(role)
        );
        apply_rbac(&client, &docs).await;
        let sa = one(&docs, "ServiceAccount")["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_owned();
        installs.push((ns, sa));
    }
    for (ns, sa) in &installs {
        let sar = SubjectAccessReview {
            metadata: ObjectMeta::default(),
            spec: SubjectAccessReviewSpec {
                user: Some(sa_user(ns, sa)),
                groups: Some(sa_groups(ns)),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some("default".into()),
                    resource: Some("configmaps".into()),
                    verb: Some("delete".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            status: None,
        };
        let allowed = Api::<SubjectAccessReview>::all(client.clone())
            .create(&PostParams::default(), &sar)
            .await
            .expect("SubjectAccessReview")
            .status
            .expect("status")
            .allowed;
        assert!(
            allowed,
            "{ns}/{sa}: the install's ClusterRole is not bound to it"
        );
    }
}

/// Artifact Hub's metadata names this version: the image of appVersion for
/// both platforms, the links at its tag; and every change is one of Artifact
/// Hub's kinds. The runbook links of the NOTES and of the rendered
/// PrometheusRule point at that tag too, not at main.
#[test]
fn artifact_hub_metadata_and_runbook_links_name_this_version() {
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .expect("Chart.yaml");
    let version = chart["appVersion"].as_str().expect("appVersion");
    let tag = format!("/blob/v{version}/");
    let annotation = |key: &str| -> Value {
        let text = chart["annotations"][key]
            .as_str()
            .unwrap_or_else(|| panic!("Chart.yaml: no annotation {key}"));
        serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    let images = annotation("artifacthub.io/images");
    assert_eq!(
        images[0]["image"],
        json!(format!("ghcr.io/lock-janitor/lock-janitor:{version}"))
    );
    assert_eq!(
        images[0]["platforms"],
        json!(["linux/amd64", "linux/arm64"])
    );
    for link in annotation("artifacthub.io/links").as_array().unwrap() {
        let url = link["url"].as_str().unwrap();
        assert!(url.contains(&tag), "link {url} is not at v{version}");
    }
    let changes = annotation("artifacthub.io/changes");
    assert!(!changes.as_array().unwrap().is_empty());
    for c in changes.as_array().unwrap() {
        let kind = c["kind"].as_str().unwrap_or_default();
        assert!(
            [
                "added",
                "changed",
                "deprecated",
                "removed",
                "fixed",
                "security"
            ]
            .contains(&kind),
            "{c}"
        );
        assert!(c["description"].as_str().is_some_and(|d| !d.is_empty()));
    }
    assert!(chart["maintainers"][0]["name"].is_string());
    assert!(chart.get("icon").is_none_or(|i| {
        // An icon, if ever set, is a file of the repository.
        let path = i.as_str().unwrap_or_default();
        path.contains("/blob/") || path.contains("raw.githubusercontent.com")
    }));
    // The PrometheusRule's and the NOTES' runbook links.
    let docs = render(
        "lj",
        "lj",
        &["--set".into(), "prometheusRule.enabled=true".into()],
    );
    let rule = one(&docs, "PrometheusRule");
    let mut urls = 0;
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            if let Some(url) = r["annotations"]["runbook_url"].as_str() {
                assert!(
                    url.starts_with(&format!(
                        "https://github.com/lock-janitor/lock-janitor{tag}docs/runbooks.md#"
                    )),
                    "{url}"
                );
                urls += 1;
            }
        }
    }
    assert_eq!(urls, 10);
    let notes = std::fs::read_to_string(chart_dir().join("templates/NOTES.txt")).unwrap();
    assert!(!notes.contains("/blob/main/"), "NOTES.txt links main");
    assert!(notes.contains("/blob/v{{ .Chart.AppVersion }}/docs/runbooks.md"));
}

/// The runbooks' shared preamble selects the pods of a release of any name:
/// its `SEL`, with `$RELEASE` set to a release not named lock-janitor
/// ("prod", whose full name is "prod-lock-janitor"), matches the labels of
/// the pods that release's Deployment makes.
#[test]
fn the_runbooks_selector_selects_the_pods_of_any_release_name() {
    let runbooks = std::fs::read_to_string(chart_dir().join("../../docs/runbooks.md")).unwrap();
    let sel = runbooks
        .lines()
        .find_map(|l| l.strip_prefix("SEL=\""))
        .and_then(|l| l.split('"').next())
        .expect("docs/runbooks.md sets SEL=\"...\"");
    let sel = sel.replace("$RELEASE", "prod");
    assert!(!sel.contains('$'), "SEL uses another variable: {sel}");
    let docs = render("prod", "ops", &[]);
    let deployment = one(&docs, "Deployment");
    assert_eq!(name_of(deployment), "prod-lock-janitor");
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for term in sel.split(',') {
        let (k, v) = term.split_once('=').expect("key=value");
        assert_eq!(
            labels[k],
            json!(v),
            "the runbooks' SEL term {term} does not match the pods of release prod: {labels}"
        );
    }
}

/// `helm test` as helm runs it (there is no kubelet here: the test writes
/// the Pod's Succeeded status as a kubelet would). Its ServiceAccount and
/// RBAC may impersonate the janitor's ServiceAccount: once the test passed
/// they are gone, and only the Pod, which holds no grant, stays (for `helm
/// test --logs`); `helm uninstall` leaves no grant of the hook behind.
#[tokio::test]
async fn helm_test_leaves_no_grant_behind() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    const RELEASE: &str = "hooked";
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    let ns = fresh_namespace(&client, "hook-grants").await;
    let home = tempfile::tempdir().expect("helm home");
    let helm_cmd = |args: &[String]| {
        let mut c = tokio::process::Command::new(helm());
        c.args(args)
            .args(["--namespace", &ns, "--kubeconfig"])
            .arg(cp.kubeconfig_path())
            .env("HELM_CACHE_HOME", home.path().join("cache"))
            .env("HELM_CONFIG_HOME", home.path().join("config"))
            .env("HELM_DATA_HOME", home.path().join("data"))
            .kill_on_drop(true);
        c
    };
    let ok = |what: &str, out: std::process::Output| {
        assert!(
            out.status.success(),
            "{what} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let install: Vec<String> = vec![
        "install".into(),
        RELEASE.into(),
        chart_dir().to_string_lossy().into_owned(),
        "--set".into(),
        format!("watchNamespaces={{{ns}}}"),
        "--set".into(),
        format!("selector={LABEL_KEY}={ns}"),
    ];
    ok("helm install", helm_cmd(&install).output().await.unwrap());

    let test = helm_cmd(&[
        "test".into(),
        RELEASE.into(),
        "--timeout".into(),
        "2m".into(),
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("running helm test");
    let hook = format!("{RELEASE}-lock-janitor-test");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_for("the test Pod", WAIT, || async {
        pods.get_opt(&hook).await.ok().flatten().map(|_| ())
    })
    .await;
    // While it runs, its grants exist: this is what must not outlive it.
    let cluster_name = format!("{hook}-{ns}");
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let ns_roles: Api<Role> = Api::namespaced(client.clone(), &ns);
    let ns_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    let role = roles
        .get(&cluster_name)
        .await
        .expect("the hook's ClusterRole");
    assert!(
        role.rules
            .iter()
            .flatten()
            .any(|r| r.verbs.iter().any(|v| v == "impersonate")),
        "{role:?}"
    );
    kubelet::set_succeeded(&client, &ns, &hook)
        .await
        .expect("the test Pod Succeeded");
    let out = tokio::time::timeout(Duration::from_secs(120), test.wait_with_output())
        .await
        .expect("helm test returns once the Pod succeeded")
        .unwrap();
    ok("helm test", out);

    let left = |what: &str, name: &str, found: bool| {
        assert!(!found, "{what} {name} is left after the test passed")
    };
    left(
        "ClusterRole",
        &cluster_name,
        roles.get_opt(&cluster_name).await.unwrap().is_some(),
    );
    left(
        "ClusterRoleBinding",
        &cluster_name,
        bindings.get_opt(&cluster_name).await.unwrap().is_some(),
    );
    left(
        "ServiceAccount",
        &hook,
        sas.get_opt(&hook).await.unwrap().is_some(),
    );
    left(
        "Role",
        &hook,
        ns_roles.get_opt(&hook).await.unwrap().is_some(),
    );
    left(
        "RoleBinding",
        &hook,
        ns_bindings.get_opt(&hook).await.unwrap().is_some(),
    );
    assert!(
        pods.get_opt(&hook).await.unwrap().is_some(),
        "the test Pod is gone: `helm test --logs` has nothing to read"
    );

    ok(
        "helm uninstall",
        helm_cmd(&["uninstall".into(), RELEASE.into()])
            .output()
            .await
            .unwrap(),
    );
    // Nothing cluster-wide of this install is left, hook or not.
    let names: Vec<String> = roles
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .chain(
            bindings
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|b| ClusterRole {
                    metadata: b.metadata,
                    ..Default::default()
                }),
        )
        .filter_map(|o| o.metadata.name)
        .filter(|n| n.contains(&ns))
        .collect();
    assert!(names.is_empty(), "left after helm uninstall: {names:?}");
}
