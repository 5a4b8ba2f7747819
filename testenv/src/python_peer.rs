//! A real leader-election peer that nobody here wrote: the official
//! Kubernetes Python client's `kubernetes.leaderelection` (PyPI
//! `kubernetes`, pinned in `testenv/peers/python/requirements.txt`), run by
//! `testenv/peers/python/elector.py` with its `ConfigMapLock` or `LeaseLock`.
//! Its venv is made by `hack/python-peer.sh` (once per requirements hash, in
//! the cache beside the control plane's binaries; `make test` makes it before
//! the tests, and the first peer of a run makes it if it is missing).
//!
//! The elector takes its identity as an argument (the tests give the pod's
//! name) and its cluster from `$KUBECONFIG`; what it shares with the other
//! real peers (a child process tied to the test process, `LEADING`, its
//! logs) is [`crate::elector`].

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::elector::{built_by, repo, Elector, TIMINGS};
use crate::Error;

/// The Python client's lock kinds (`resourcelock.configmaplock.ConfigMapLock`,
/// `resourcelock.leaselock.LeaseLock`).
pub use crate::elector::ElectorLock as PyLock;

/// The venv's python, made by `hack/python-peer.sh` the first time it is
/// asked for in this process (the script is quick when the venv is there,
/// and takes a lock while it makes one).
pub fn python() -> Result<PathBuf, Error> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    built_by(&PYTHON, "python-peer.sh", "python")
}

/// One running Python elector: an [`Elector`] (`is_leading`,
/// `wait_leading`, `logs`, `kill`).
pub struct PythonPeer(Elector);

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
        Self::start_with(kubeconfig, dir, kind, namespace, lock, identity, TIMINGS)
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
        let mut cmd = Command::new(python()?);
        cmd.arg(repo().join("testenv/peers/python/elector.py"))
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        let args = [namespace, lock, identity];
        Elector::spawn(cmd, "python", kubeconfig, dir, kind, args, timings).map(PythonPeer)
    }
}

impl Deref for PythonPeer {
    type Target = Elector;
    fn deref(&self) -> &Elector {
        &self.0
    }
}

impl DerefMut for PythonPeer {
    fn deref_mut(&mut self) -> &mut Elector {
        &mut self.0
    }
}
