//! A tested upgrade: an older chart is installed with its real defaults
//! (cluster-wide), then `helm upgrade` to the chart of this checkout with
//! its default values and then with a custom values file, on the real
//! control plane: no failure, the Deployment rolls where its pod template
//! changed, the upgraded release's RBAC (and delete guard) is in force, and
//! the janitor, run with the flags the upgraded Deployment carries, keeps
//! its locks opted in: it reclaims a dead holder's lock and carries the
//! opt-in label over to the new leader's lock.
//!
//! Two older charts: the one of the previous commit that changed the chart
//! (from the history, so it moves on by itself), and the chart as of
//! 8e7efdf, before the ClusterRole and ClusterRoleBinding were renamed to
//! `<fullname>-<release namespace>` (60efdc9): the upgrade removes the old
//! pair and the ServiceAccount keeps its rights. Both come from git (`git
//! archive`), so the test needs the repository's history (CI clones it
//! whole; a shallow clone fails here and says so).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::chart::{chart_dir, helm, sa_groups, sa_kubeconfig};
use crate::support::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::PostParams;
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// The last commit whose chart names its ClusterRole and ClusterRoleBinding
/// `<fullname>`, without the release namespace.
const BEFORE_THE_RENAME: &str = "8e7efdf";

fn git(args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("running git (the test reads the older charts from the history)");
    assert!(
        out.status.success(),
        "git {args:?}: {} (the test needs the repository's history: not a shallow clone)",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The commit before the last one that changed the chart.
fn previous_chart_commit() -> String {
    let last = String::from_utf8(git(&[
        "log",
        "-n1",
        "--format=%H",
        "--",
        "charts/lock-janitor",
    ]))
    .unwrap()
    .trim()
    .to_owned();
    assert!(
        !last.is_empty(),
        "no commit changed the chart: a shallow clone?"
    );
    format!("{last}^")
}

/// The chart as `commit` left it, unpacked under `into`.
fn chart_at(commit: &str, into: &Path) -> PathBuf {
    let tar = git(&["archive", commit, "charts/lock-janitor"]);
    let mut untar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(into)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("tar");
    use std::io::Write;
    untar.stdin.take().unwrap().write_all(&tar).unwrap();
    assert!(untar.wait().unwrap().success());
    into.join("charts/lock-janitor")
}

fn helm_run(cp: &ControlPlane, home: &Path, args: &[&str]) {
    let out = Command::new(helm())
        .args(args)
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn pod_template(d: &Deployment) -> Value {
    serde_json::to_value(&d.spec.as_ref().unwrap().template).unwrap()
}

fn generation(d: &Deployment) -> i64 {
    d.metadata.generation.unwrap_or_default()
}

fn service_account(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.service_account_name.clone())
        .expect("the janitor's ServiceAccount")
}

/// The container's flags, but the metrics address (the test janitor binds
/// a free local port of its own).
fn janitor_args(d: &Deployment) -> Vec<String> {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| !a.starts_with("--metrics-bind-address"))
        .collect()
}

/// A helm upgrade changed the pod template exactly when the Deployment's
/// generation moved: a rollout. (The test control plane runs no deployment
/// controller, so no ReplicaSet is made; the new generation with the new
/// template is what one rolls on.)
fn assert_rolls_iff_changed(before: &Deployment, after: &Deployment, what: &str) {
    let changed = pod_template(before) != pod_template(after);
    assert_eq!(
        generation(after) > generation(before),
        changed,
        "{what}: the pod template {} but the generation went {} -> {}",
        if changed { "changed" } else { "did not change" },
        generation(before),
        generation(after)
    );
}

/// What the janitor's ServiceAccount may do, asked of the API server
/// (SubjectAccessReview), in `ns`: every verb its job needs.
async fn assert_may_do_its_job(client: &Client, release_ns: &str, sa: &str, ns: &str) {
    let needs: &[(&str, &str, &str)] = &[
        ("", "configmaps", "list"),
        ("", "configmaps", "watch"),
        ("", "configmaps", "delete"),
        ("", "configmaps", "patch"),
        ("coordination.k8s.io", "leases", "watch"),
        ("coordination.k8s.io", "leases", "update"),
        ("coordination.k8s.io", "leases", "delete"),
        ("coordination.k8s.io", "leases", "patch"),
        ("", "pods", "watch"),
        ("events.k8s.io", "events", "create"),
    ];
    for (group, resource, verb) in needs {
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(format!("system:serviceaccount:{release_ns}:{sa}")),
                groups: Some(sa_groups(release_ns)),
                resource_attributes: Some(ResourceAttributes {
                    group: Some((*group).into()),
                    resource: Some((*resource).into()),
                    verb: Some((*verb).into()),
                    namespace: Some(ns.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(client.clone())
            .create(&PostParams::default(), &sar)
            .await
            .unwrap();
        assert!(
            answer.status.is_some_and(|s| s.allowed),
            "{sa} of {release_ns} may not {verb} {resource} in {ns}"
        );
    }
}

async fn opted_in(client: &Client, ns: &str, name: &str) -> bool {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|cm| cm.metadata.labels)
        .and_then(|l| l.get(WATCH_LABEL.0).cloned())
        .as_deref()
        == Some(WATCH_LABEL.1)
}

/// The janitor as the upgraded Deployment runs it: its flags, as its
/// ServiceAccount (so under the release's RBAC and delete guard). One
/// deviation: `--namespace=<locks>` is added. The chart's default is
/// cluster-wide, and this control plane is shared with the other suites, whose
/// locks carry the same default opt-in label: a cluster-wide janitor would
/// reclaim and relabel theirs. The install and upgrades themselves keep the
/// defaults (cluster-wide RBAC); only the process is scoped.
async fn janitor_of(cp: &ControlPlane, d: &Deployment, release_ns: &str, locks: &str) -> Janitor {
    let kubeconfig = sa_kubeconfig(cp, release_ns, &service_account(d));
    let mut args = janitor_args(d);
    args.push(format!("--namespace={locks}"));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Janitor::start(&kubeconfig, &refs).await
}

/// The holder `holder` of lock `lock` is evicted; the janitor frees the
/// lock; `next` takes over as operator-lib does (its lock unlabeled) and
/// the janitor carries the opt-in label over.
async fn keeps_it_opted_in(client: &Client, locks: &str, lock: &str, holder: &str, next: &str) {
    assert!(opted_in(client, locks, lock).await, "{lock} is opted in");
    kubelet::set_failed(
        client,
        locks,
        holder,
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .expect("evict");
    wait_for(&format!("lock {lock} reclaimed"), WAIT, || async {
        (!lock_exists(client, locks, lock).await).then_some(())
    })
    .await;
    let node = format!("node-{locks}");
    let replica = running_pod(client, locks, next, &node).await;
    become_leader(client, &replica, lock, false).await;
    wait_for(
        &format!("the opt-in label carried over to {next}'s {lock}"),
        WAIT,
        || async { opted_in(client, locks, lock).await.then_some(()) },
    )
    .await;
}

/// Installs the chart of `from` with its defaults, upgrades to this one with
/// its defaults and then with a custom values file.
async fn upgrades_to_this_chart(from: &str, prefix: &str) {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    // The release is named after its namespace: every name is its own, also
    // the cluster-scoped ones of a chart from before the rename.
    let ns = fresh_namespace(&client, &format!("{prefix}-rel")).await;
    let release = ns.as_str();
    let locks = fresh_namespace(&client, &format!("{prefix}-locks")).await;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("helm");
    let old = chart_at(from, tmp.path());
    let old_chart = old.to_str().unwrap();
    helm_run(cp, &home, &["install", release, old_chart, "-n", &ns]);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let fullname = format!("{release}-lock-janitor");
    let installed = deployments.get(&fullname).await.unwrap();
    assert!(
        !janitor_args(&installed)
            .iter()
            .any(|a| a.starts_with("--namespace")),
        "the previous chart's defaults watch every namespace"
    );
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    // The chart before the rename names its ClusterRole <fullname>; the
    // later ones <fullname>-<namespace>.
    assert_eq!(
        roles.get_opt(&fullname).await.unwrap().is_some(),
        from == BEFORE_THE_RENAME,
        "ClusterRole {fullname} after installing the chart of {from}"
    );

    // Locks opted in before the upgrade.
    let node = format!("node-{locks}");
    kubelet::create_node(&client, &node).await.unwrap();
    let holder = running_pod(&client, &locks, "op-a", &node).await;
    create_lock(&client, &lock_for("op-lock", &holder, true)).await;

    // To this chart with its defaults (what was set is kept, as the upgrade
    // notes say: --reset-then-reuse-values; nothing was).
    let chart = chart_dir();
    let new_chart = chart.to_str().unwrap();
    helm_run(
        cp,
        &home,
        &[
            "upgrade",
            release,
            new_chart,
            "-n",
            &ns,
            "--reset-then-reuse-values",
        ],
    );
    let upgraded = deployments.get(&fullname).await.unwrap();
    assert_rolls_iff_changed(&installed, &upgraded, "the upgrade with the defaults");
    // The RBAC of this chart: named <fullname>-<namespace>; the old pair of
    // a chart from before the rename is gone.
    let role = format!("{fullname}-{ns}");
    assert!(
        roles.get_opt(&role).await.unwrap().is_some(),
        "ClusterRole {role}"
    );
    let binding = bindings.get(&role).await.unwrap();
    assert_eq!(binding.role_ref.name, role);
    let sa = service_account(&upgraded);
    assert!(
        binding
            .subjects
            .unwrap_or_default()
            .iter()
            .any(|s| s.kind == "ServiceAccount"
                && s.name == sa
                && s.namespace.as_deref() == Some(&ns)),
        "ClusterRoleBinding {role} binds {sa}"
    );
    if from == BEFORE_THE_RENAME {
        assert!(
            roles.get_opt(&fullname).await.unwrap().is_none(),
            "the old ClusterRole {fullname} is removed"
        );
        assert!(
            bindings.get_opt(&fullname).await.unwrap().is_none(),
            "the old ClusterRoleBinding {fullname} is removed"
        );
    }
    assert_may_do_its_job(&client, &ns, &sa, &locks).await;
    let j = janitor_of(cp, &upgraded, &ns, &locks).await;
    keeps_it_opted_in(&client, &locks, "op-lock", "op-a", "op-b").await;
    drop(j);

    // And with a custom values file: the pod template changes, so it rolls.
    let values = tmp.path().join("values.yaml");
    std::fs::write(
        &values,
        "logLevel: debug\nownerGoneGrace: 45s\npodAnnotations: {team: platform}\n\
         resources:\n  requests: {cpu: 150m, memory: 128Mi}\n  limits: {memory: 128Mi}\n",
    )
    .unwrap();
    helm_run(
        cp,
        &home,
        &[
            "upgrade",
            release,
            new_chart,
            "-n",
            &ns,
            "-f",
            values.to_str().unwrap(),
        ],
    );
    let custom = deployments.get(&fullname).await.unwrap();
    assert_ne!(pod_template(&upgraded), pod_template(&custom));
    assert_rolls_iff_changed(&upgraded, &custom, "the upgrade with a values file");
    let args = janitor_args(&custom);
    for want in ["--log-level=debug", "--owner-gone-grace=45s"] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    assert_may_do_its_job(&client, &ns, &sa, &locks).await;
    let j = janitor_of(cp, &custom, &ns, &locks).await;
    keeps_it_opted_in(&client, &locks, "op-lock", "op-b", "op-c").await;
    drop(j);
    helm_run(cp, &home, &["uninstall", release, "-n", &ns]);
}

#[tokio::test]
async fn the_previous_chart_upgrades_to_this_one() {
    upgrades_to_this_chart(&previous_chart_commit(), "upgrade").await;
}

#[tokio::test]
async fn the_chart_before_the_cluster_role_rename_upgrades_to_this_one() {
    upgrades_to_this_chart(BEFORE_THE_RENAME, "upgrade-rename").await;
}
