//! The kubectl plugin: the binary linked as `kubectl-lock_janitor` on PATH
//! answers a real `kubectl lock-janitor scan|label|version` (kubectl built
//! from the pinned Kubernetes module by `testenv/build.sh`), with kubectl's
//! conventions: `-n`, `-A`, `--context`, `--kubeconfig`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};

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

/// The krew manifest template names the binary krew links as the plugin
/// (`kubectl-lock_janitor`, which the binary answers to) and the crate's
/// version, and `hack/krew-manifest.sh` writes from it a manifest whose
/// sha256s are those of the four archives it names (checked on a copy of
/// the repository with archives of the real binary).
#[test]
fn krew_manifest_matches_the_plugin() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("krew/lock-janitor.yaml")).unwrap();
    let m: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(m["kind"], "Plugin");
    // krew links the plugin as kubectl-<name with _ for ->.
    assert_eq!(m["metadata"]["name"], "lock-janitor");
    assert_eq!(
        format!(
            "kubectl-{}",
            m["metadata"]["name"].as_str().unwrap().replace('-', "_")
        ),
        lock_janitor::cli::PLUGIN_NAME
    );
    assert_eq!(m["spec"]["version"], "vVERSION");
    let platforms = m["spec"]["platforms"].as_array().unwrap();
    assert_eq!(platforms.len(), 4);
    // The script, run on a copy, with archives of the real binary.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("repo");
    let dist = dir.path().join("dist");
    for d in ["hack", "krew"] {
        std::fs::create_dir_all(copy.join(d)).unwrap();
    }
    std::fs::create_dir_all(&dist).unwrap();
    for f in [
        "hack/krew-manifest.sh",
        "krew/lock-janitor.yaml",
        "Cargo.toml",
    ] {
        std::fs::copy(root.join(f), copy.join(f)).unwrap();
    }
    let version = env!("CARGO_PKG_VERSION");
    let stage = dir.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    std::fs::copy(janitor_bin(), stage.join("lock-janitor")).unwrap();
    std::fs::copy(root.join("LICENSE"), stage.join("LICENSE")).unwrap();
    std::fs::copy(root.join("README.md"), stage.join("README.md")).unwrap();
    for (os, arch) in [
        ("linux", "amd64"),
        ("linux", "arm64"),
        ("darwin", "amd64"),
        ("darwin", "arm64"),
    ] {
        let archive = dist.join(format!("lock-janitor_{version}_{os}_{arch}.tar.gz"));
        let ok = Command::new("tar")
            .arg("-czf")
            .arg(&archive)
            .arg("-C")
            .arg(&stage)
            .args(["lock-janitor", "LICENSE", "README.md"])
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let out = Command::new("bash")
        .arg(copy.join("hack/krew-manifest.sh"))
        .arg(&dist)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(dist.join("lock-janitor.yaml")).unwrap();
    let m: serde_json::Value = serde_saphyr::from_str(&written).unwrap();
    assert_eq!(m["spec"]["version"], format!("v{version}"));
    for p in m["spec"]["platforms"].as_array().unwrap() {
        let uri = p["uri"].as_str().unwrap();
        let name = uri.rsplit('/').next().unwrap();
        assert!(uri.contains(&format!("/v{version}/")), "{uri}");
        let real = Command::new("sha256sum")
            .arg(dist.join(name))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&real.stdout).split(' ').next(),
            p["sha256"].as_str(),
            "{name}"
        );
        assert_eq!(p["bin"], "lock-janitor");
    }
}
