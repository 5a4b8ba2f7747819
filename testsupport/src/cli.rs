//! The `lock-janitor` binary as a one-shot command (`scan`, `label`, ...):
//! run with a clean environment against one kubeconfig, and what it printed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use super::janitor_bin;

/// The outcome of one run of the binary.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// stdout, as one JSON document.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// A command with a clean environment: only `KUBECONFIG` says where the cluster is.
pub fn command(kubeconfig: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(janitor_bin());
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("LOCK_JANITOR_") && k != "LOCK_JANITOR_TESTENV_BIN" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs `cmd` to the end (within 120 s), capturing its exit code and output.
pub async fn run_with(mut cmd: tokio::process::Command) -> Run {
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the command finished within 120s")
        .expect("the command started");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `lock-janitor <args>` against `kubeconfig`'s cluster, to the end.
pub async fn run(kubeconfig: &Path, args: &[&str]) -> Run {
    run_with(command(kubeconfig, args)).await
}
