//! What the real leader-election peers that nobody here wrote have in
//! common ([`crate::python_peer`]: the official Python client;
//! [`crate::fabric8_peer`]: fabric8's Java client; [`crate::java_peer`]:
//! the official Java client): each is one candidate
//! program, built once by a script under `hack/` into the cache, that takes
//! `configmap|lease NAMESPACE LOCK IDENTITY LEASE RENEW RETRY`, reads its
//! cluster from `$KUBECONFIG`, prints `LEADING IDENTITY` on stdout once it
//! leads and logs the library's own lines on stderr. It needs no pod around
//! it, so it runs as a plain child process, tied to the test process as the
//! control plane's are.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{process, Error};

/// The repository's root (this crate is `testenv/` in it).
pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testenv/ has a parent")
        .to_path_buf()
}

/// The lock kinds both clients have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElectorLock {
    /// `ConfigMapLock`: the leader record is the ConfigMap's annotation
    /// `control-plane.alpha.kubernetes.io/leader`.
    ConfigMap,
    /// `LeaseLock`: a coordination.k8s.io/v1 Lease.
    Lease,
}

impl ElectorLock {
    pub(crate) fn arg(self) -> &'static str {
        match self {
            ElectorLock::ConfigMap => "configmap",
            ElectorLock::Lease => "lease",
        }
    }
}

/// The tests' timings: a 60 s lease, a 50 s renew deadline, a 2 s retry
/// period.
pub const TIMINGS: [Duration; 3] = [
    Duration::from_secs(60),
    Duration::from_secs(50),
    Duration::from_secs(2),
];

/// The file that `hack/<script>` prints on its last line (a peer's
/// program, which the script builds if it is missing), asked for once per
/// process: `once` keeps the answer (the script is quick when the build is
/// there, and takes a lock while it makes one). `script` is the script's
/// name, then any arguments, separated by spaces (`java-peer.sh java`).
pub(crate) fn built_by(
    once: &'static OnceLock<Result<PathBuf, String>>,
    script: &str,
    what: &str,
) -> Result<PathBuf, Error> {
    once.get_or_init(|| {
        let mut words = script.split_whitespace();
        let script = repo().join("hack").join(words.next().unwrap_or_default());
        let out = Command::new(&script)
            .args(words)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        if !out.status.success() || !path.is_file() {
            return Err(format!(
                "{} ({}) gave no {what}: the peer could not be built:\n{}{}",
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

/// One running elector, of either client.
pub struct Elector {
    child: Child,
    out: PathBuf,
    log: PathBuf,
    started: Instant,
    reaped: bool,
    who: &'static str,
}

impl Elector {
    /// Starts `cmd` (the program and any arguments before the elector's)
    /// as a candidate for `namespace/lock`, holder identity `identity`, with
    /// `timings` (lease, renew deadline, retry period: whole seconds, as the
    /// libraries take them). Its output goes to
    /// `<dir>/<who>-<namespace>-<identity>.{out,log}`; `who` names it in
    /// errors.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn(
        mut cmd: Command,
        who: &'static str,
        kubeconfig: &Path,
        dir: &Path,
        kind: ElectorLock,
        [namespace, lock, identity]: [&str; 3],
        timings: [Duration; 3],
    ) -> Result<Elector, Error> {
        let base = dir.join(format!("{who}-{namespace}-{identity}"));
        let out = base.with_extension("out");
        let log = base.with_extension("log");
        let io = |p: &Path| {
            File::create(p).map_err(|e| Error::Io {
                what: format!("create {}", p.display()),
                source: e,
            })
        };
        let [lease, renew, retry] = timings.map(|t| t.as_secs().to_string());
        cmd.args([kind.arg(), namespace, lock, identity])
            .args([&lease, &renew, &retry])
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(io(&out)?)
            .stderr(io(&log)?);
        let what = format!("start the {who} elector {cmd:?}");
        let child = process::spawn_tied(cmd).map_err(|e| Error::Io { what, source: e })?;
        Ok(Elector {
            child,
            out,
            log,
            started: Instant::now(),
            reaped: false,
            who,
        })
    }

    /// What the elector printed on stdout (`LEADING IDENTITY`, and what
    /// else its program says).
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Whether the elector said it leads (the library called its
    /// started-leading callback).
    pub fn is_leading(&self) -> bool {
        self.output().lines().any(|l| l.starts_with("LEADING "))
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
                    "{} elector exited ({status}) without leading; its output:\n{}its log:\n{}",
                    self.who,
                    self.output(),
                    self.logs()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} elector did not lead within {timeout:?} (started {:?} ago); its output:\n{}its log:\n{}",
                    self.who,
                    self.started.elapsed(),
                    self.output(),
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

impl Drop for Elector {
    fn drop(&mut self) {
        self.kill();
    }
}
