//! A real leader-election peer that nobody here wrote: the official
//! Kubernetes Java client's `io.kubernetes.client.extended.leaderelection`
//! (Maven Central `io.kubernetes:client-java-extended`, pinned in
//! `testenv/peers/java/pom.xml`), run by `testenv/peers/java/Elector.java`
//! with its `LeaseLock` or `ConfigMapLock`. It is built by
//! `hack/java-peer.sh java` (the jars fetched with Maven, the elector
//! compiled with javac; once per hash of the pom and the source, in the
//! cache beside the control plane's binaries; `make test` builds it before
//! the tests, and the first peer of a run builds it if it is missing).
//!
//! The elector takes its identity as an argument (the tests give the pod's
//! name) and its cluster from `$KUBECONFIG`. Besides `LEADING IDENTITY` it
//! prints `NEW LEADER HOLDER` when the library reports another holder (its
//! `onNewLeader` hook), and `STOPPED IDENTITY` when its run ends. What it
//! shares with the other real peers is [`crate::elector`].

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::elector::{built_by, Elector, TIMINGS};
use crate::Error;

/// The Java client's lock kinds (`resourcelock.ConfigMapLock`,
/// `resourcelock.LeaseLock`).
pub use crate::elector::ElectorLock as JavaLock;

/// The built elector's launcher (`bin/elector`, which execs java with its
/// classpath), built by `hack/java-peer.sh java` the first time it is
/// asked for in this process (the script is quick when the build is there,
/// and takes a lock while it makes one).
pub fn launcher() -> Result<PathBuf, Error> {
    static LAUNCHER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    built_by(&LAUNCHER, "java-peer.sh java", "launcher")
}

/// One running elector of the official Java client: an [`Elector`]
/// (`is_leading`, `wait_leading`, `output`, `logs`, `kill`).
pub struct JavaPeer(Elector);

impl JavaPeer {
    /// Starts a candidate for `namespace/lock` (a ConfigMap or a Lease, as
    /// `kind`), holder identity `identity`, with the tests' timings: a 60 s
    /// lease, a 50 s renew deadline, a 2 s retry period. Its output goes to
    /// `<dir>/java-<namespace>-<identity>.{out,log}`.
    pub fn start(
        kubeconfig: &Path,
        dir: &Path,
        kind: JavaLock,
        namespace: &str,
        lock: &str,
        identity: &str,
    ) -> Result<JavaPeer, Error> {
        Self::start_with(kubeconfig, dir, kind, namespace, lock, identity, TIMINGS)
    }

    /// As [`JavaPeer::start`], with its own lease duration, renew deadline
    /// and retry period (whole seconds).
    pub fn start_with(
        kubeconfig: &Path,
        dir: &Path,
        kind: JavaLock,
        namespace: &str,
        lock: &str,
        identity: &str,
        timings: [Duration; 3],
    ) -> Result<JavaPeer, Error> {
        let cmd = Command::new(launcher()?);
        let args = [namespace, lock, identity];
        Elector::spawn(cmd, "java", kubeconfig, dir, kind, args, timings).map(JavaPeer)
    }
}

impl Deref for JavaPeer {
    type Target = Elector;
    fn deref(&self) -> &Elector {
        &self.0
    }
}

impl DerefMut for JavaPeer {
    fn deref_mut(&mut self) -> &mut Elector {
        &mut self.0
    }
}
