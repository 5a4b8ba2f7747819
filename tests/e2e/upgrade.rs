//! A tested upgrade: the chart as the previous commit that changed it left
//! it is installed, then `helm upgrade` to the chart of this checkout, with
//! its default values and then with a custom values file, on the real
//! control plane: no failure, the Deployment rolls where its pod template
//! changed, what the new chart grants is in force, and the locks stay
//! opted in (an upgrade never touches them). The previous chart comes from
//! git (`git archive`), so the test needs the repository's history.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::chart::{chart_dir, helm};
use crate::support::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::Api;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};

const RELEASE: &str = "lock-janitor";

/// The chart as it was before the last commit that changed it, unpacked
/// under `into`.
fn previous_chart(into: &Path) -> (String, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .expect("running git (the test reads the previous chart from the history)");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
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
    let previous = format!("{last}^");
    let tar = git(&["archive", &previous, "charts/lock-janitor"]);
    let mut untar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(into)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("tar");
    use std::io::Write;
    untar.stdin.take().unwrap().write_all(&tar).unwrap();
    assert!(untar.wait().unwrap().success());
    (previous, into.join("charts/lock-janitor"))
}

fn helm_run(cp: &lock_janitor_testenv::ControlPlane, home: &Path, args: &[&str]) {
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

#[tokio::test]
async fn the_previous_chart_upgrades_to_this_one() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "upgrade-rel").await;
    let locks = fresh_namespace(&client, "upgrade-locks").await;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("helm");
    let (previous, old) = previous_chart(tmp.path());
    let watch = format!("watchNamespaces={{{locks}}}");
    let old_chart = old.to_str().unwrap();
    helm_run(
        cp,
        &home,
        &["install", RELEASE, old_chart, "-n", &ns, "--set", &watch],
    );
    let node = format!("node-{locks}");
    kubelet::create_node(&client, &node).await.unwrap();
    let holder = running_pod(&client, &locks, "op-a", &node).await;
    create_lock(&client, &lock_for("op-lock", &holder, true)).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let generation = |d: &Deployment| d.metadata.generation.unwrap_or_default();
    let before = deployments.get(RELEASE).await.unwrap();

    // To this chart with its defaults (what was set is kept, as the upgrade
    // notes say: --reset-then-reuse-values).
    let chart = chart_dir();
    let new_chart = chart.to_str().unwrap();
    helm_run(
        cp,
        &home,
        &[
            "upgrade",
            RELEASE,
            new_chart,
            "-n",
            &ns,
            "--reset-then-reuse-values",
        ],
    );
    let after = deployments.get(RELEASE).await.unwrap();
    let template =
        |d: &Deployment| serde_json::to_value(&d.spec.as_ref().unwrap().template).unwrap();
    if template(&before) != template(&after) {
        assert!(
            generation(&after) > generation(&before),
            "the Deployment rolls"
        );
    }
    // What this chart grants is in force: Leases held for life are
    // deleted, where locks are watched.
    let sa = after
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.service_account_name.clone())
        .expect("the janitor's ServiceAccount");
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{ns}:{sa}")),
            resource_attributes: Some(ResourceAttributes {
                group: Some("coordination.k8s.io".into()),
                resource: Some("leases".into()),
                verb: Some("delete".into()),
                namespace: Some(locks.clone()),
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
        "after the upgrade from {previous} the new grants are in force"
    );

    // And with a custom values file: the pod template changes, so it rolls.
    let values = tmp.path().join("values.yaml");
    std::fs::write(
        &values,
        format!(
            "watchNamespaces: [{locks}]\nlogLevel: debug\nresources:\n  requests: {{cpu: 150m, memory: 128Mi}}\n  limits: {{memory: 128Mi}}\n"
        ),
    )
    .unwrap();
    helm_run(
        cp,
        &home,
        &[
            "upgrade",
            RELEASE,
            new_chart,
            "-n",
            &ns,
            "-f",
            values.to_str().unwrap(),
        ],
    );
    let custom = deployments.get(RELEASE).await.unwrap();
    assert!(
        generation(&custom) > generation(&after),
        "the Deployment rolls"
    );
    let args = custom
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(args.iter().any(|a| a == "--log-level=debug"), "{args:?}");
    // The locks are as they were: still opted in.
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &locks)
        .get("op-lock")
        .await
        .unwrap();
    assert_eq!(
        cm.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(WATCH_LABEL.0))
            .map(String::as_str),
        Some(WATCH_LABEL.1)
    );
    helm_run(cp, &home, &["uninstall", RELEASE, "-n", &ns]);
}
