//! Real leader-election peers, built from `testenv/peers` (Go) by
//! `testenv/build.sh`: operator-lib's `leader.Become`, controller-runtime's
//! Lease lock driven by client-go's elector, and a candidate for a Lease held
//! for life (nais/elector's behaviour), run as a pod would run them.
//!
//! A pod's operator finds its name in `$POD_NAME` (downward API), its
//! namespace in the service-account file the kubelet mounts,
//! `/var/run/secrets/kubernetes.io/serviceaccount/namespace`, and its
//! hostname (controller-runtime's identity) is the pod name. Each peer runs
//! in its own mount and UTS namespaces (`unshare --mount --uts`, which needs
//! root or CAP_SYS_ADMIN) with a tmpfs over `/run` holding that file and
//! the pod name as hostname, so peers run side by side and the host is left
//! alone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{paths, process, Error};

/// One running peer process.
pub struct Peer {
    child: Child,
    out: PathBuf,
    log: PathBuf,
    started: Instant,
}

/// The shell run inside the new mount namespace: the service-account file,
/// then the peer itself.
const POD_SHELL: &str = "set -e; mount -t tmpfs tmpfs /run; \
    d=/run/secrets/kubernetes.io/serviceaccount; mkdir -p \"$d\"; \
    printf %s \"$PEER_NAMESPACE\" > \"$d/namespace\"; exec \"$@\"";

impl Peer {
    /// Starts operator-lib's `leader.Become(ctx, lock)` as pod `pod` of
    /// `namespace`, with the cluster credentials of `kubeconfig`. Its output
    /// goes to `<dir>/peer-<namespace>-<pod>.{out,log}`.
    pub fn become_leader(
        kubeconfig: &Path,
        dir: &Path,
        namespace: &str,
        pod: &str,
        lock: &str,
    ) -> Result<Peer, Error> {
        Self::start(kubeconfig, dir, namespace, pod, &["become", lock])
    }

    /// Starts a controller-runtime Lease candidate for `lease` (identity
    /// `<pod>_<uuid>`), with a lease of `duration` (renew deadline two
    /// thirds of it, retry period 2 s).
    pub fn elect(
        kubeconfig: &Path,
        dir: &Path,
        namespace: &str,
        pod: &str,
        lease: &str,
        duration: Duration,
    ) -> Result<Peer, Error> {
        let d = format!("{}s", duration.as_secs());
        Self::start(kubeconfig, dir, namespace, pod, &["elect", lease, &d])
    }

    /// Starts a candidate that holds `lease` for life, as nais/elector's
    /// does: it only creates the Lease (owned by pod `pod`, holder identity
    /// the pod name, never renewed) and tries again every second while it
    /// finds it there.
    pub fn for_life(
        kubeconfig: &Path,
        dir: &Path,
        namespace: &str,
        pod: &str,
        lease: &str,
    ) -> Result<Peer, Error> {
        Self::start(kubeconfig, dir, namespace, pod, &["forlife", lease])
    }

    /// A candidate with client-go timings of its own: lease duration, renew
    /// deadline and retry period (OpenShift's library-go: 137 s, 107 s, 26 s).
    pub fn elect_with(
        kubeconfig: &Path,
        dir: &Path,
        namespace: &str,
        pod: &str,
        lease: &str,
        timings: [Duration; 3],
    ) -> Result<Peer, Error> {
        let [d, renew, retry] = timings.map(|t| format!("{}ms", t.as_millis()));
        Self::start(
            kubeconfig,
            dir,
            namespace,
            pod,
            &["elect", lease, &d, &renew, &retry],
        )
    }

    fn start(
        kubeconfig: &Path,
        dir: &Path,
        namespace: &str,
        pod: &str,
        args: &[&str],
    ) -> Result<Peer, Error> {
        let bin = paths::binary("peers")?;
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            POD_SHELL,
            "peer",
        ])
        .arg(&bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", pod)
        .env("PEER_NAMESPACE", namespace)
        .stdin(Stdio::null());
        let (out, log) =
            process::output_to(&mut cmd, &dir.join(format!("peer-{namespace}-{pod}")))?;
        let child = process::spawn_tied(cmd).map_err(|e| Error::Io {
            what: format!("start {} (through unshare)", bin.display()),
            source: e,
        })?;
        Ok(Peer {
            child,
            out,
            log,
            started: Instant::now(),
        })
    }

    /// Whether the peer said it leads.
    pub fn is_leading(&self) -> bool {
        std::fs::read_to_string(&self.out)
            .map(|s| s.lines().any(|l| l.starts_with("LEADING ")))
            .unwrap_or(false)
    }

    /// Waits until the peer leads; the instant it was seen leading (polled
    /// every 10 ms). Fails with the peer's log if it exits or `timeout` passes.
    pub async fn wait_leading(&mut self, timeout: Duration) -> Result<Instant, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_leading() {
                return Ok(Instant::now());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "peer exited ({status}) without leading; its log:\n{}",
                    self.logs()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "peer did not lead within {timeout:?} (started {:?} ago); its log:\n{}",
                    self.started.elapsed(),
                    self.logs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The peer's log (operator-lib's own lines), for failure messages.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the peer (its pod "dies"); waits for the process to go.
    pub fn kill(&mut self) {
        process::signal(self.child.id(), libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}
