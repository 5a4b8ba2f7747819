//! Where the control-plane binaries live: the same rules as `testenv/build.sh`.

use std::path::{Path, PathBuf};

use crate::Error;

/// `testenv/versions.env`, compiled in so the key always matches the build script.
const VERSIONS_ENV: &str = include_str!("../versions.env");

/// Pinned versions, parsed from `versions.env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    pub k8s: String,
    pub etcd: String,
    pub helm: String,
}

impl Versions {
    /// The versions this crate was compiled with.
    pub fn pinned() -> Versions {
        parse_versions(VERSIONS_ENV)
    }

    /// The versions in use: the pinned ones, with `$K8S_VERSION` (when set)
    /// as the Kubernetes version, as `testenv/build.sh` reads it, so that
    /// `K8S_VERSION=v1.31.14 make testenv-up` starts the minor that
    /// `K8S_VERSION=v1.31.14 make testenv-build` built.
    pub fn current() -> Versions {
        let mut v = Versions::pinned();
        if let Some(k8s) = env_nonempty("K8S_VERSION") {
            v.k8s = k8s;
        }
        v
    }

    /// The cache key used by `build.sh`: `k8s-<v>_etcd-<v>_helm-<v>`.
    pub fn key(&self) -> String {
        format!("k8s-{}_etcd-{}_helm-{}", self.k8s, self.etcd, self.helm)
    }
}

fn parse_versions(text: &str) -> Versions {
    let mut k8s = None;
    let mut etcd = None;
    let mut helm = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"').trim_matches('\'').to_string();
        match k.trim() {
            "K8S_VERSION" => k8s = Some(v),
            "ETCD_VERSION" => etcd = Some(v),
            "HELM_VERSION" => helm = Some(v),
            _ => {}
        }
    }
    Versions {
        k8s: k8s.expect("testenv/versions.env: K8S_VERSION missing"),
        etcd: etcd.expect("testenv/versions.env: ETCD_VERSION missing"),
        helm: helm.expect("testenv/versions.env: HELM_VERSION missing"),
    }
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `$LOCK_JANITOR_CACHE`, else `$XDG_CACHE_HOME/lock-janitor`, else `~/.cache/lock-janitor`.
pub fn cache_root() -> PathBuf {
    if let Some(d) = env_nonempty("LOCK_JANITOR_CACHE") {
        return PathBuf::from(d);
    }
    let base = env_nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env_nonempty("HOME").unwrap_or_else(|| "/".into())).join(".cache")
        });
    base.join("lock-janitor")
}

/// The directory holding etcd, kube-apiserver, kube-controller-manager and helm:
/// `$LOCK_JANITOR_TESTENV_BIN` if set, else `<cache_root>/testenv/<key>/bin`
/// for [`Versions::current`] (what `testenv/build.sh --print` prints, with
/// the same `$K8S_VERSION`).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = env_nonempty("LOCK_JANITOR_TESTENV_BIN") {
        return PathBuf::from(d);
    }
    cache_root()
        .join("testenv")
        .join(Versions::current().key())
        .join("bin")
}

/// Path of one binary in [`bin_dir`], or an error naming the path and how to build it.
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    let path = bin_dir().join(name);
    if is_executable(&path) {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            name: name.to_string(),
            path,
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_versions_env() {
        let v = parse_versions(
            "# c\nK8S_VERSION=v1.2.3\nETCD_VERSION=\"v3.0.0\"\n\nHELM_VERSION=v3.1.0\n",
        );
        assert_eq!(v.key(), "k8s-v1.2.3_etcd-v3.0.0_helm-v3.1.0");
        let pinned = Versions::pinned();
        assert!(pinned.k8s.starts_with("v1."), "{pinned:?}");
    }
}
