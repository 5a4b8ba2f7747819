//! What a lock candidate is: one shape rule per kind, the only one that
//! `scan`, `label`, `check` and `run --auto-opt-in` use; and the namespaces
//! left out of finding candidates (`--exclude-namespaces`). Pure: a rule
//! that needs the pods of a namespace says so ([`Shape::NamesAPod`]) and the
//! caller reads them its own way.
//!
//! Each kind's own rule is its `Kind::candidate` (`crate::kinds`); the
//! shapes they answer with, and the rules they share, are here.

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{lease, LockKind};

/// How an object is a lock candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Held for life by its one v1 Pod owner (a ConfigMap of operator-lib,
    /// a Lease of nais/elector): a candidate as it is.
    HeldForLife(LockKind),
    /// Its holder identity names `host`: a candidate when exactly one pod
    /// of its namespace is that host ([`names_one_pod`]).
    NamesAPod(LockKind, String),
}

impl Shape {
    pub fn kind(&self) -> LockKind {
        match self {
            Shape::HeldForLife(k) | Shape::NamesAPod(k, _) => *k,
        }
    }

    /// The host a pod must be for the object to be a candidate, if any.
    pub fn host(&self) -> Option<&str> {
        match self {
            Shape::HeldForLife(_) => None,
            Shape::NamesAPod(_, host) => Some(host),
        }
    }
}

/// Exactly one ownerReference, a `v1` `Pod` with a name and a uid: the
/// leader-for-life shape of operator-lib (and of nais/elector's Leases).
/// Metadata alone tells it, so a metadata-only list or watch finds these.
pub fn one_pod_owner(meta: &ObjectMeta) -> bool {
    matches!(meta.owner_references.as_deref(),
        Some([one]) if one.kind == "Pod" && one.api_version == "v1"
            && !one.name.is_empty() && !one.uid.is_empty())
}

/// Whether a ConfigMap holds `data` or `binaryData`.
pub fn holds_data(cm: &ConfigMap) -> bool {
    cm.data.as_ref().is_some_and(|d| !d.is_empty())
        || cm.binary_data.as_ref().is_some_and(|d| !d.is_empty())
}

/// Lock-shaped (docs/design.md): one Pod owner, and no `data` or
/// `binaryData` (operator-lib's locks are empty). Spark drivers, for one,
/// own ConfigMaps with data; those are never lock candidates.
pub fn lock_shaped(cm: &ConfigMap) -> bool {
    one_pod_owner(&cm.metadata) && !holds_data(cm)
}

/// Whether exactly one of `pods` (those of the candidate's namespace, or
/// any superset of those `host` names) is `host`, by name or hostname.
/// Several: whichever runs cannot be told, no candidate.
pub fn names_one_pod<'a>(host: &str, pods: impl IntoIterator<Item = &'a Pod>) -> bool {
    pods.into_iter().filter(|p| lease::names(host, p)).count() == 1
}

/// `--exclude-namespaces`: globs of namespaces whose locks are never
/// auto-opted in, not counted as unprotected, and left out of `label -A`
/// and of `scan -A`'s unlabeled candidates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exclusions(Vec<glob::Pattern>);

/// The namespaces of the control plane and of the platform: their locks
/// belong to the cluster's vendor, who runs them and their failover.
pub const DEFAULT_EXCLUSIONS: &str = "kube-system,kube-public,kube-node-lease,openshift-*";

impl Exclusions {
    /// Comma-separated globs; empty terms are skipped. A namespace name is
    /// lowercase letters, digits and `-`: a glob with any other character
    /// than those and `*`, `?`, `[`, `]` (an uppercase letter, say) could
    /// never match one, and is refused (the chart's schema says the same).
    pub fn parse(s: &str) -> Result<Exclusions, String> {
        s.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                if let Some(c) = t.chars().find(|c| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || "-*?[]".contains(*c))
                }) {
                    return Err(format!(
                        "invalid glob {t:?}: {c:?} can never match a namespace name \
                         (lowercase letters, digits and '-'; globs add '*', '?', '[', ']')"
                    ));
                }
                glob::Pattern::new(t).map_err(|e| format!("invalid glob {t:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Exclusions)
    }

    pub fn excludes(&self, namespace: &str) -> bool {
        self.0.iter().any(|p| p.matches(namespace))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for Exclusions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let globs: Vec<&str> = self.0.iter().map(glob::Pattern::as_str).collect();
        f.write_str(&globs.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(name: &str, hostname: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                hostname: hostname.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn exactly_one_pod_is_the_host() {
        let pods = [pod("op-0", None), pod("web-1", Some("web")), pod("x", None)];
        assert!(names_one_pod("op-0", &pods));
        assert!(names_one_pod("web", &pods), "by hostname");
        assert!(!names_one_pod("gone", &pods));
        let twice = [pod("web", None), pod("web-1", Some("web"))];
        assert!(!names_one_pod("web", &twice), "two pods answer to it");
    }

    #[test]
    fn exclusions_are_comma_separated_globs() {
        let x = Exclusions::parse(DEFAULT_EXCLUSIONS).unwrap();
        for ns in [
            "kube-system",
            "kube-public",
            "kube-node-lease",
            "openshift-monitoring",
            "openshift-",
        ] {
            assert!(x.excludes(ns), "{ns}");
        }
        for ns in ["ops", "kube-systems", "my-openshift-app", "openshift"] {
            assert!(!x.excludes(ns), "{ns}");
        }
        assert_eq!(x.to_string(), DEFAULT_EXCLUSIONS);
        let none = Exclusions::parse("").unwrap();
        assert!(none.is_empty() && !none.excludes("kube-system"));
        let spaced = Exclusions::parse(" team-?, ,ci-* ").unwrap();
        assert!(
            spaced.excludes("team-a") && spaced.excludes("ci-42") && !spaced.excludes("team-ab")
        );
        assert!(Exclusions::parse("a,[").is_err());
    }

    /// Namespace names are lowercase: a glob that could never match one is
    /// a usage error, not an exclusion that silently excludes nothing.
    #[test]
    fn exclusions_that_can_never_match_are_refused() {
        for bad in [
            "Kube-System",
            "openshift-*,Team-?",
            "kube_system",
            "ns.a",
            "[!a]*",
        ] {
            let e = Exclusions::parse(bad).expect_err(bad);
            assert!(e.contains("can never match a namespace name"), "{bad}: {e}");
        }
        assert!(Exclusions::parse("team-[ab]?,ci-*").is_ok());
    }
}
