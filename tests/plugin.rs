//! The kubectl plugin: the binary linked as `kubectl-lock_janitor` on PATH
//! answers a real `kubectl lock-janitor scan|label|version` (kubectl built
//! from the pinned Kubernetes module by `testenv/build.sh`), with kubectl's
//! conventions: `-n`, `-A`, `--context`, `--kubeconfig`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use lock_janitor_testenv::{fresh_namespace, kubelet, shared};
use support::*;

/// A PATH with `kubectl-lock_janitor` (a link to the janitor binary) first.
fn plugin_path(dir: &Path) -> String {
    let link = dir.join("kubectl-lock_janitor");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(
        std::fs::canonicalize(janitor_bin()).expect("the janitor binary"),
        &link,
    )
    .expect("link the plugin");
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn kubectl() -> PathBuf {
    lock_janitor_testenv::binary("kubectl").unwrap_or_else(|e| panic!("{e}"))
}

fn run(path: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(kubectl())
        .args(args)
        .env("PATH", path)
        // Only what a flag says: no KUBECONFIG from the environment.
        .env_remove("KUBECONFIG")
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("run kubectl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn kubectl_runs_the_plugin_with_its_conventions() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "plugin").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();
    let holder = running_pod(&client, &ns, "leader", &node).await;
    create_lock(&client, &lock_for("memcached-operator-lock", &holder, true)).await;

    let dir = tempfile::tempdir().unwrap();
    let path = plugin_path(dir.path());
    let kc = cp.kubeconfig_path().display().to_string();

    // kubectl finds it.
    let (code, out, err) = run(&path, &["plugin", "list"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("kubectl-lock_janitor"), "{out}{err}");
    let (code, out, err) = run(&path, &["lock-janitor", "version"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.trim(),
        format!("lock-janitor {}", env!("CARGO_PKG_VERSION"))
    );

    // scan -n, with --kubeconfig.
    let (code, out, err) = run(
        &path,
        &["lock-janitor", "scan", "-n", &ns, "--kubeconfig", &kc],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("memcached-operator-lock"), "{out}");
    assert!(out.contains("leader"), "{out}");
    // -A: all namespaces (this one included).
    let (code, out, err) = run(
        &path,
        &[
            "lock-janitor",
            "scan",
            "-A",
            "-o",
            "json",
            "--kubeconfig",
            &kc,
        ],
    );
    assert!([0, 3].contains(&code), "{out}{err}");
    assert!(out.contains(&format!("\"namespace\": \"{ns}\"")), "{out}");
    // --context picks a context of the kubeconfig: its current one points
    // nowhere, the named one at the control plane.
    let admin = std::fs::read_to_string(cp.kubeconfig_path()).unwrap();
    let two = admin
        .replace(
            "current-context: lock-janitor-testenv",
            "current-context: nowhere",
        )
        .replace(
            "contexts:\n",
            "contexts:\n- name: nowhere\n  context:\n    cluster: nowhere\n    user: lock-janitor-admin\n",
        )
        .replace(
            "clusters:\n",
            "clusters:\n- name: nowhere\n  cluster:\n    server: https://127.0.0.1:1\n",
        );
    assert_ne!(two, admin, "kubeconfig layout changed");
    let two_path = dir.path().join("two-contexts");
    std::fs::write(&two_path, two).unwrap();
    let two_path = two_path.display().to_string();
    let (code, out, err) = run(
        &path,
        &["lock-janitor", "scan", "-n", &ns, "--kubeconfig", &two_path],
    );
    assert_eq!(code, 1, "the current context points nowhere: {out}{err}");
    let (code, out, err) = run(
        &path,
        &[
            "lock-janitor",
            "scan",
            "-n",
            &ns,
            "--kubeconfig",
            &two_path,
            "--context",
            "lock-janitor-testenv",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("memcached-operator-lock"), "{out}");
    // label, a dry run: nothing to add (the lock is labeled).
    let (code, out, err) = run(
        &path,
        &["lock-janitor", "label", "-n", &ns, "--kubeconfig", &kc],
    );
    assert_eq!(code, 0, "{out}{err}");
    // The summary is on stderr, the report on stdout.
    assert!(err.contains("1 unchanged"), "{out}{err}");
    assert!(out.contains("unchanged"), "{out}");
    // -n and -A together: a usage error, as kubectl would say.
    let (code, _, err) = run(&path, &["lock-janitor", "scan", "-A", "-n", &ns]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("kubectl lock-janitor"),
        "usage names the plugin: {err}"
    );
}

/// The krew manifest names the plugin binary kubectl runs and the crate's
/// version, and `hack/krew-manifest.sh` packs an archive whose sha256 it
/// writes into it (checked here on a copy of the repository's manifest).
#[test]
fn krew_manifest_matches_the_plugin() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("krew/lock-janitor.yaml")).unwrap();
    let m: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(m["metadata"]["name"], "lock-janitor");
    assert_eq!(
        m["spec"]["version"],
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
    let p = &m["spec"]["platforms"][0];
    assert_eq!(p["bin"], lock_janitor::cli::PLUGIN_NAME);
    assert_eq!(p["files"][0]["from"], lock_janitor::cli::PLUGIN_NAME);
    // The script, run on a copy: a real archive and its real sha256.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("repo");
    for d in ["hack", "krew"] {
        std::fs::create_dir_all(copy.join(d)).unwrap();
    }
    std::fs::copy(
        root.join("hack/krew-manifest.sh"),
        copy.join("hack/krew-manifest.sh"),
    )
    .unwrap();
    std::fs::copy(
        root.join("krew/lock-janitor.yaml"),
        copy.join("krew/lock-janitor.yaml"),
    )
    .unwrap();
    std::fs::copy(root.join("Cargo.toml"), copy.join("Cargo.toml")).unwrap();
    let bin = std::fs::canonicalize(janitor_bin()).unwrap();
    let out = Command::new("bash")
        .arg(copy.join("hack/krew-manifest.sh"))
        .arg(&bin)
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(copy.join("krew/lock-janitor.yaml")).unwrap();
    let m: serde_json::Value = serde_saphyr::from_str(&written).unwrap();
    let sum = m["spec"]["platforms"][0]["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let archive = dir.path().join(format!(
        "out/kubectl-lock_janitor-v{}-linux-amd64.tar.gz",
        env!("CARGO_PKG_VERSION")
    ));
    let real = Command::new("sha256sum").arg(&archive).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&real.stdout).split(' ').next(),
        Some(sum.as_str())
    );
    let list = Command::new("tar")
        .arg("-tzf")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains("kubectl-lock_janitor"));
}
