//! A real leader-election peer that nobody here wrote: the official
//! Kubernetes Python client's `kubernetes.leaderelection` (PyPI
//! `kubernetes`, pinned in `testenv/peers/python/requirements.txt`), run by
//! `testenv/peers/python/elector.py` with its `ConfigMapLock` or `LeaseLock`.
//! Its venv is made by `hack/python-peer.sh` (once per requirements hash, in
//! the cache beside the control plane's binaries; `make test` makes it before
//! the tests, and the first peer of a run makes it if it is missing).
//!
//! The elector takes its identity as an argument (the tests give the pod's
//! name) and its cluster from `$KUBECONFIG`; it needs no pod around it, so
//! it runs as a plain child process, tied to the test process as the
//! control plane's are.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{process, Error};

/// The repository's root (this crate is `testenv/` in it).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testenv/ has a parent")
        .to_path_buf()
}

/// The Python client's lock kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyLock {
    /// `resourcelock.configmaplock.ConfigMapLock`: the leader record is the
    /// ConfigMap's annotation `control-plane.alpha.kubernetes.io/leader`.
    ConfigMap,
    /// `resourcelock.leaselock.LeaseLock`: a coordination.k8s.io/v1 Lease.
    Lease,
}

impl PyLock {
    fn arg(self) -> &'static str {
        match self {
            PyLock::ConfigMap => "configmap",
            PyLock::Lease => "lease",
        }
    }
}

/// The venv's python, made by `hack/python-peer.sh` the first time it is
/// asked for in this process (the script is quick when the venv is there,
/// and takes a lock while it makes one).
pub fn python() -> Result<PathBuf, Error> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let script = repo().join("hack/python-peer.sh");
            let out = Command::new(&script)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("running {}: {e}", script.display()))?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
            if !out.status.success() || !path.is_file() {
                return Err(format!(
                    "{} ({}) gave no python: the Python peer's venv could not be made:\n{}{}",
                    script.display(),
                    out.status,
                    stdout,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(path)
        })
        .clone()
        .map_err(Error::Other)
}

/// One running Python elector.
pub struct PythonPeer {
    child: Child,
    out: PathBuf,
    log: PathBuf,
    started: Instant,
    reaped: bool,
}

impl PythonPeer {
    /// Starts a candidate for `namespace/lock` (a ConfigMap or a Lease, as
    /// `kind`), holder identity `identity`, with the tests' timings: a 60 s
    /// lease, a 50 s renew deadline, a 2 s retry period. Its output goes to
    /// `<dir>/python-<namespace>-<identity>.{out,log}`.
    pub fn start(
        kubeconfig: &Path,
        dir: &Path,
        kind: PyLock,
        namespace: &str,
        lock: &str,
        identity: &str,
    ) -> Result<PythonPeer, Error> {
        Self::start_with(
            kubeconfig,
            dir,
            kind,
            namespace,
            lock,
            identity,
            [60, 50, 2].map(Duration::from_secs),
        )
    }

    /// As [`PythonPeer::start`], with its own lease duration, renew deadline
    /// and retry period (whole seconds: the library takes seconds).
    pub fn start_with(
        kubeconfig: &Path,
        dir: &Path,
        kind: PyLock,
        namespace: &str,
        lock: &str,
        identity: &str,
        timings: [Duration; 3],
    ) -> Result<PythonPeer, Error> {
        let python = python()?;
        let elector = repo().join("testenv/peers/python/elector.py");
        let base = dir.join(format!("python-{namespace}-{identity}"));
        let out = base.with_extension("out");
        let log = base.with_extension("log");
        let io = |p: &Path| {
            File::create(p).map_err(|e| Error::Io {
                what: format!("create {}", p.display()),
                source: e,
            })
        };
        let [lease, renew, retry] = timings.map(|t| t.as_secs().to_string());
        let mut cmd = Command::new(&python);
        cmd.arg(&elector)
            .args([
                kind.arg(),
                namespace,
                lock,
                identity,
                &lease,
                &renew,
                &retry,
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(io(&out)?)
            .stderr(io(&log)?);
        let child = process::spawn_tied(cmd).map_err(|e| Error::Io {
            what: format!("start {} {}", python.display(), elector.display()),
            source: e,
        })?;
        Ok(PythonPeer {
            child,
            out,
            log,
            started: Instant::now(),
            reaped: false,
        })
    }

    /// Whether the elector said it leads (the library called its
    /// `onstarted_leading`).
    pub fn is_leading(&self) -> bool {
        std::fs::read_to_string(&self.out)
            .map(|s| s.lines().any(|l| l.starts_with("LEADING ")))
            .unwrap_or(false)
    }

    /// Waits until the elector leads; the instant it was seen leading
    /// (polled every 10 ms). Fails with its log if it exits or `timeout`
    /// passes.
    pub async fn wait_leading(&mut self, timeout: Duration) -> Result<Instant, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_leading() {
                return Ok(Instant::now());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                self.reaped = true;
                return Err(format!(
                    "python elector exited ({status}) without leading; its log:\n{}",
                    self.logs()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "python elector did not lead within {timeout:?} (started {:?} ago); its log:\n{}",
                    self.started.elapsed(),
                    self.logs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The library's log lines (stderr), for waits and failure messages.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the elector (SIGKILL: its pod "dies" with no chance to give up
    /// the lead); waits for the process to go.
    pub fn kill(&mut self) {
        // Once waited for, its pid may be another process's: signal it only
        // while it is this child (running, or a zombie not yet reaped).
        if self.reaped {
            return;
        }
        process::signal(self.child.id(), libc::SIGKILL);
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for PythonPeer {
    fn drop(&mut self) {
        self.kill();
    }
}
