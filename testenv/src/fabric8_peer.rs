//! A real leader-election peer that nobody here wrote, in Java: fabric8's
//! Kubernetes client's `io.fabric8.kubernetes.client.extended.leaderelection`
//! (Maven Central `io.fabric8:kubernetes-client`, pinned in
//! `testenv/peers/fabric8/pom.xml` with the JDK's HTTP client), run by
//! `testenv/peers/fabric8/Elector.java` with its `LeaseLock` or
//! `ConfigMapLock`. It is built by `hack/fabric8-peer.sh` (the jars fetched
//! with Maven, the elector compiled with javac; once per hash of the pom and
//! the source, in the cache beside the control plane's binaries; `make test`
//! builds it before the tests, and the first peer of a run builds it if it is
//! missing).
//!
//! The elector takes its identity as an argument (the tests give the pod's
//! name) and its cluster from `$KUBECONFIG`. Besides `LEADING IDENTITY` it
//! prints `NEW LEADER HOLDER` each time the library sees the record name
//! another holder (its `onNewLeader`), and `STOPPED IDENTITY` when it gives
//! the lead up. What it shares with the other real peers is
//! [`crate::elector`].

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::elector::{built_by, Elector, TIMINGS};
use crate::Error;

/// fabric8's lock kinds (`resourcelock.ConfigMapLock`,
/// `resourcelock.LeaseLock`).
pub use crate::elector::ElectorLock as Fabric8Lock;

/// The built elector's launcher (`bin/elector`, which execs java with its
/// classpath), built by `hack/fabric8-peer.sh` the first time it is asked
/// for in this process (the script is quick when the build is there, and
/// takes a lock while it makes one).
pub fn launcher() -> Result<PathBuf, Error> {
    static LAUNCHER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    built_by(&LAUNCHER, "fabric8-peer.sh", "launcher")
}

/// One running fabric8 elector: an [`Elector`] (`is_leading`,
/// `wait_leading`, `output`, `logs`, `kill`).
pub struct Fabric8Peer(Elector);

impl Fabric8Peer {
    /// Starts a candidate for `namespace/lock` (a ConfigMap or a Lease, as
    /// `kind`), holder identity `identity`, with the tests' timings: a 60 s
    /// lease, a 50 s renew deadline, a 2 s retry period. Its output goes to
    /// `<dir>/fabric8-<namespace>-<identity>.{out,log}`.
    pub fn start(
        kubeconfig: &Path,
        dir: &Path,
        kind: Fabric8Lock,
        namespace: &str,
        lock: &str,
        identity: &str,
    ) -> Result<Fabric8Peer, Error> {
        Self::start_with(kubeconfig, dir, kind, namespace, lock, identity, TIMINGS)
    }

    /// As [`Fabric8Peer::start`], with its own lease duration, renew
    /// deadline and retry period (whole seconds).
    pub fn start_with(
        kubeconfig: &Path,
        dir: &Path,
        kind: Fabric8Lock,
        namespace: &str,
        lock: &str,
        identity: &str,
        timings: [Duration; 3],
    ) -> Result<Fabric8Peer, Error> {
        let mut cmd = Command::new(launcher()?);
        // The control plane's client keys are ECDSA P-256 (rcgen's default)
        // in PKCS#8 PEM (`BEGIN PRIVATE KEY`); fabric8 tells EC from RSA
        // only by a PEM header `BEGIN EC PRIVATE KEY`, takes any other key
        // for RSA and fails on it ("Invalid DER: object is not integer"),
        // unless told the algorithm (its `kubernetes.certs.client.key.algo`,
        // as this variable).
        cmd.env("KUBERNETES_CERTS_CLIENT_KEY_ALGO", "EC");
        let args = [namespace, lock, identity];
        Elector::spawn(cmd, "fabric8", kubeconfig, dir, kind, args, timings).map(Fabric8Peer)
    }
}

impl Deref for Fabric8Peer {
    type Target = Elector;
    fn deref(&self) -> &Elector {
        &self.0
    }
}

impl DerefMut for Fabric8Peer {
    fn deref_mut(&mut self) -> &mut Elector {
        &mut self.0
    }
}
