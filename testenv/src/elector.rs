//! The real leader-election peers that nobody here wrote ([`Peer`]: the
//! official Python client, fabric8's Java client, the official Java client),
//! driven alike: each is one candidate program, built once by a script under
//! `hack/` into the cache beside the control plane's binaries (once per hash
//! of its pins and source; `make test` builds it before the tests, and the
//! first elector of a run builds it if it is missing), that takes
//! `configmap|lease NAMESPACE LOCK IDENTITY LEASE RENEW RETRY`, reads its
//! cluster from `$KUBECONFIG`, prints `LEADING IDENTITY` on stdout once it
//! leads and logs the library's own lines on stderr. The Java electors also
//! print `NEW LEADER HOLDER` when the library reports another holder (its
//! `onNewLeader`) and `STOPPED IDENTITY` when they give the lead up. It needs
//! no pod around it, so it runs as a plain child process, tied to the test
//! process as the control plane's are.

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

/// A real peer: the library whose elector runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The official Python client's `kubernetes.leaderelection` (PyPI
    /// `kubernetes`, pinned in `testenv/peers/python/requirements.txt`),
    /// run by `testenv/peers/python/elector.py` in a venv that
    /// `hack/python-peer.sh` makes.
    Python,
    /// fabric8's `io.fabric8.kubernetes.client.extended.leaderelection`
    /// (Maven Central `io.fabric8:kubernetes-client`, pinned in
    /// `testenv/peers/fabric8/pom.xml` with the JDK's HTTP client), run by
    /// `testenv/peers/fabric8/Elector.java`, built by `hack/fabric8-peer.sh`
    /// (the jars fetched with Maven, the elector compiled with javac).
    Fabric8,
    /// The official Java client's `io.kubernetes.client.extended.leaderelection`
    /// (Maven Central `io.kubernetes:client-java-extended`, pinned in
    /// `testenv/peers/java/pom.xml`), run by `testenv/peers/java/Elector.java`,
    /// built by `hack/java-peer.sh java`.
    Java,
}

impl Peer {
    /// Its name in file names and errors.
    fn who(self) -> &'static str {
        match self {
            Peer::Python => "python",
            Peer::Fabric8 => "fabric8",
            Peer::Java => "java",
        }
    }

    /// The command that runs its elector, before the elector's arguments;
    /// the program is built by its script the first time it is asked for in
    /// this process (`built_by`).
    fn command(self) -> Result<Command, Error> {
        static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        static FABRIC8: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        static JAVA: OnceLock<Result<PathBuf, String>> = OnceLock::new();
        Ok(match self {
            Peer::Python => {
                let mut cmd = Command::new(built_by(&PYTHON, "python-peer.sh", "python")?);
                cmd.arg(repo().join("testenv/peers/python/elector.py"))
                    .env("PYTHONUNBUFFERED", "1")
                    .env("PYTHONDONTWRITEBYTECODE", "1");
                cmd
            }
            Peer::Fabric8 => {
                // `bin/elector` execs java with its classpath.
                let mut cmd = Command::new(built_by(&FABRIC8, "fabric8-peer.sh", "launcher")?);
                // The control plane's client keys are ECDSA P-256 (rcgen's
                // default) in PKCS#8 PEM (`BEGIN PRIVATE KEY`); fabric8 tells
                // EC from RSA only by a PEM header `BEGIN EC PRIVATE KEY`,
                // takes any other key for RSA and fails on it ("Invalid DER:
                // object is not integer"), unless told the algorithm (its
                // `kubernetes.certs.client.key.algo`, as this variable).
                cmd.env("KUBERNETES_CERTS_CLIENT_KEY_ALGO", "EC");
                cmd
            }
            Peer::Java => Command::new(built_by(&JAVA, "java-peer.sh java", "launcher")?),
        })
    }
}

/// The lock kinds every peer has: `ConfigMapLock` and `LeaseLock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElectorLock {
    /// `ConfigMapLock`: the leader record is the ConfigMap's annotation
    /// `control-plane.alpha.kubernetes.io/leader`.
    ConfigMap,
    /// `LeaseLock`: a coordination.k8s.io/v1 Lease.
    Lease,
}

impl ElectorLock {
    fn arg(self) -> &'static str {
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
fn built_by(
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

/// One running elector, of any peer.
pub struct Elector {
    child: Child,
    out: PathBuf,
    log: PathBuf,
    started: Instant,
    reaped: bool,
    who: &'static str,
}

impl Elector {
    /// Starts a `peer` candidate for `namespace/lock` (a ConfigMap or a
    /// Lease, as `kind`), holder identity `identity`, with the tests'
    /// timings ([`TIMINGS`]). Its output goes to
    /// `<dir>/<peer>-<namespace>-<identity>.{out,log}`.
    pub fn start(
        peer: Peer,
        kubeconfig: &Path,
        dir: &Path,
        kind: ElectorLock,
        [namespace, lock, identity]: [&str; 3],
    ) -> Result<Elector, Error> {
        let who = peer.who();
        let mut cmd = peer.command()?;
        let [lease, renew, retry] = TIMINGS.map(|t| t.as_secs().to_string());
        cmd.args([kind.arg(), namespace, lock, identity])
            .args([&lease, &renew, &retry])
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null());
        let base = dir.join(format!("{who}-{namespace}-{identity}"));
        let (out, log) = process::output_to(&mut cmd, &base)?;
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
