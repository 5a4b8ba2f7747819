//! What `scan` reports, one row per lock candidate, built purely from what
//! was read and judged; and the stable `-o json|yaml` form `scan` and
//! `label` share, a `LockList` (documented in docs/cli.md, "The LockList
//! format"). `label`'s rows are in `label_report.rs`.

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::Candidate;
use crate::lock::{Lock, Unmanageable};
use crate::verdict::Verdict;
use crate::words;

/// One line of the report, as the table shows it. `-o json|yaml` prints it
/// as a [`LockItem`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// `configmap` or `lease`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Matches `--selector` (watched by the controller).
    pub labeled: bool,
    /// The holder pod's name, from the lock's ownerReference.
    pub holder: Option<String>,
    /// The holder's uid, from the lock's ownerReference.
    pub holder_uid: Option<String>,
    /// Whether a pod with the holder's name exists (None: not looked up).
    pub holder_found: Option<bool>,
    /// The uid of the pod found under the holder's name (differs from
    /// `holder_uid` when ambiguous).
    pub holder_pod_uid: Option<String>,
    /// `status.phase` of the pod found.
    pub phase: Option<String>,
    /// `status.reason` of the pod found (e.g. Evicted).
    pub phase_reason: Option<String>,
    /// `status.message` of the pod found.
    pub phase_message: Option<String>,
    /// The pod found has a deletionTimestamp.
    pub holder_deleting: bool,
    /// `spec.nodeName` of the pod found.
    pub node: Option<String>,
    /// The lock's creationTimestamp (RFC 3339).
    pub created_at: Option<String>,
    pub age_seconds: Option<u64>,
    /// As in the table: `held`, `stale:<Reason>`, `ambiguous`, `unmanageable:<Code>`.
    pub verdict: String,
    /// `held`, `stale`, `ambiguous` or `unmanageable` (the `state` of the metrics).
    pub state: String,
    /// Stale reason, unmanageable code, or why held (`Running`, `Pending`,
    /// `Unknown`, `NoStatus`, `Terminating`, `OwnerGoneGrace`).
    pub reason: Option<String>,
    /// When the holder died, if known (stale only).
    pub died_at: Option<String>,
    /// A sentence explaining the verdict.
    pub message: String,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub total: usize,
    pub labeled: usize,
    pub unlabeled: usize,
    pub held: usize,
    pub stale: usize,
    pub ambiguous: usize,
    pub unmanageable: usize,
    /// ConfigMaps read to find the candidates.
    #[serde(rename = "configMapsScanned")]
    pub configmaps_scanned: usize,
    /// Leases read to find the candidates (0 when leases may not be listed).
    pub leases_scanned: usize,
    /// Unlabeled ConfigMaps owned by one Pod but holding data: not lock-shaped, left out.
    pub skipped_with_data: usize,
    /// The namespaces in scope; empty means all.
    pub namespaces: Vec<String>,
    pub selector: String,
    pub owner_gone_grace_seconds: f64,
    pub duration_seconds: f64,
}

#[derive(Clone, Debug)]
pub struct Report {
    pub locks: Vec<Row>,
    pub summary: Summary,
    /// Namespaces named with `-n` where nothing was listed: maybe typos.
    pub empty_namespaces: Vec<String>,
}

/// The `apiVersion` of `-o json|yaml`.
pub const API_VERSION: &str = "lock-janitor.io/v1alpha1";

/// `scan -o json|yaml` and `label -o json|yaml`: a list in the shape of
/// Kubernetes lists. Its items are [`LockItem`]s (scan) or
/// [`LabeledItem`]s (label), each with its command's summary.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockList<S, I> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub summary: S,
    pub items: Vec<I>,
}

impl<S, I> LockList<S, I> {
    pub fn new(summary: S, items: Vec<I>) -> Self {
        LockList {
            api_version: API_VERSION,
            kind: "LockList",
            summary,
            items,
        }
    }
}

/// One lock of a [`LockList`].
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockItem<'a> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ItemMeta<'a>,
    pub spec: ItemSpec<'a>,
    pub status: ItemStatus<'a>,
}

/// The lock object itself.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemMeta<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub creation_timestamp: Option<&'a str>,
}

/// What the lock says: its kind, whether it is opted in, whom it names.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemSpec<'a> {
    /// `configmap` or `lease` (the `kind` label of the metrics).
    pub lock_kind: &'a str,
    pub labeled: bool,
    pub holder: ItemHolder<'a>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemHolder<'a> {
    /// The pod name (ConfigMap: its ownerReference; Lease: the host its
    /// holder identity names).
    pub name: Option<&'a str>,
    /// The ownerReference's uid (ConfigMaps only).
    pub uid: Option<&'a str>,
}

/// What was found and concluded.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemStatus<'a> {
    pub verdict: &'a str,
    pub state: &'a str,
    pub reason: Option<&'a str>,
    pub message: &'a str,
    pub age_seconds: Option<u64>,
    pub died_at: Option<&'a str>,
    /// The pod found under the holder's name; null when not looked up.
    pub holder_pod: Option<ItemPod<'a>>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemPod<'a> {
    pub found: bool,
    pub uid: Option<&'a str>,
    pub phase: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub message: Option<&'a str>,
    pub deleting: bool,
    pub node: Option<&'a str>,
}

/// What a live read found of a lock's holder.
#[derive(Clone, Debug)]
pub enum Found {
    Pod(Box<Pod>),
    Missing,
}

/// Builds a row from what was read. Pure, for tests.
pub fn build_row(
    c: &Candidate,
    parsed: &Result<Lock, Unmanageable>,
    found: Option<&Found>,
    verdict: &Verdict,
    now: Timestamp,
) -> Row {
    let meta = &c.meta;
    let owner = meta.owner_references.as_deref().and_then(|o| match o {
        [one] if !one.name.is_empty() => Some(one),
        _ => None,
    });
    let holder = owner.map(|o| o.name.clone());
    let holder_uid = owner.map(|o| o.uid.clone()).filter(|u| !u.is_empty());
    let pod = match found {
        Some(Found::Pod(p)) => Some(p.as_ref()),
        _ => None,
    };
    let holder_found = found
        .map(|f| matches!(f, Found::Pod(_)))
        .filter(|_| parsed.is_ok());
    Row {
        holder_uid,
        holder_found,
        ..row("configmap", meta, c.labeled, holder, pod, verdict, now)
    }
}

/// A row: the lock (of `kind`, opted in or not, naming `holder`), the
/// holder pod found (if any) and the verdict. The holder's uid and whether
/// it was looked up are the caller's to add.
pub fn row(
    kind: &'static str,
    meta: &ObjectMeta,
    labeled: bool,
    holder: Option<String>,
    pod: Option<&Pod>,
    verdict: &Verdict,
    now: Timestamp,
) -> Row {
    let status = pod.and_then(|p| p.status.as_ref());
    let created = meta.creation_timestamp.as_ref().map(|t| t.0);
    let age = created.map(|c| Duration::try_from(now.duration_since(c)).unwrap_or(Duration::ZERO));
    let died_at = match verdict {
        Verdict::Stale { died_at, .. } => died_at.map(|t| t.to_string()),
        _ => None,
    };
    let holder_name = holder.clone().unwrap_or_default();
    Row {
        kind: kind.into(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        labeled,
        holder,
        holder_uid: None,
        holder_found: None,
        holder_pod_uid: pod.and_then(|p| p.metadata.uid.clone()),
        phase: status.and_then(|s| s.phase.clone()),
        phase_reason: status.and_then(|s| s.reason.clone()),
        phase_message: status.and_then(|s| s.message.clone()),
        holder_deleting: pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        node: pod
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone()),
        created_at: created.map(|t| t.to_string()),
        age_seconds: age.map(|a| a.as_secs()),
        verdict: words::verdict_code(verdict),
        state: verdict.state().as_str().to_owned(),
        reason: words::reason_code(verdict),
        died_at,
        message: words::explain(verdict, &holder_name, pod, age),
    }
}

impl Row {
    /// The row as an item of a `LockList`.
    pub fn item(&self) -> LockItem<'_> {
        LockItem {
            api_version: API_VERSION,
            kind: "Lock",
            metadata: ItemMeta {
                namespace: &self.namespace,
                name: &self.name,
                creation_timestamp: self.created_at.as_deref(),
            },
            spec: ItemSpec {
                lock_kind: &self.kind,
                labeled: self.labeled,
                holder: ItemHolder {
                    name: self.holder.as_deref(),
                    uid: self.holder_uid.as_deref(),
                },
            },
            status: ItemStatus {
                verdict: &self.verdict,
                state: &self.state,
                reason: self.reason.as_deref(),
                message: &self.message,
                age_seconds: self.age_seconds,
                died_at: self.died_at.as_deref(),
                holder_pod: self.holder_found.map(|found| ItemPod {
                    found,
                    uid: self.holder_pod_uid.as_deref(),
                    phase: self.phase.as_deref(),
                    reason: self.phase_reason.as_deref(),
                    message: self.phase_message.as_deref(),
                    deleting: self.holder_deleting,
                    node: self.node.as_deref(),
                }),
            },
        }
    }

    /// The PHASE column: `Failed/Evicted`, `(gone)`, `Terminating`, `-`.
    pub fn phase_cell(&self) -> String {
        match (self.holder_found, &self.phase) {
            (None, _) => "-".into(),
            (Some(false), _) => "(gone)".into(),
            (Some(true), phase) => {
                let terminal = matches!(phase.as_deref(), Some("Failed" | "Succeeded"));
                if self.holder_deleting && !terminal {
                    return "Terminating".into();
                }
                let mut s = phase.clone().unwrap_or_else(|| "?".into());
                if let Some(reason) = &self.phase_reason {
                    let _ = write!(s, "/{reason}");
                }
                s
            }
        }
    }
}

/// A lock as kubectl names it (`-o name`): `configmap/<name>`,
/// `lease.coordination.k8s.io/<name>`.
pub fn kubectl_name(kind: &str, name: &str) -> String {
    match kind {
        "lease" => format!("lease.coordination.k8s.io/{name}"),
        _ => format!("configmap/{name}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{lock_meta, pod_owner};
    use crate::lock;
    use crate::observe::{HolderClock, LockAge};
    use crate::verdict::{self, HolderSeen, Policy};
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn missing_holder(lock: &Lock, now: Timestamp) -> HolderSeen<'static> {
        let (since, gone_for) = LockAge.holder_missing(lock, now);
        HolderSeen::Missing { since, gone_for }
    }

    #[test]
    fn rows_carry_the_verdict() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let c = Candidate {
            meta: lock_meta(vec![pod_owner("op-1", "pod-uid")], &[]),
            labeled: false,
            holds_data: false,
        };
        let parsed = lock::parse(&c.meta);
        let lock = parsed.clone().unwrap();
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("op-1".into()),
                uid: Some("pod-uid".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-a".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                reason: Some("Evicted".into()),
                message: Some("The node was low on resource: memory.".into()),
                ..Default::default()
            }),
        };
        let policy = Policy {
            owner_gone_grace: Duration::from_secs(30),
        };
        let v = verdict::judge(&lock, HolderSeen::Pod(&pod), &policy);
        let found = Found::Pod(Box::new(pod));
        let r = build_row(&c, &parsed, Some(&found), &v, now);
        assert_eq!(r.verdict, "stale:Evicted");
        assert_eq!(r.state, "stale");
        assert_eq!(r.reason.as_deref(), Some("Evicted"));
        assert_eq!(r.node.as_deref(), Some("node-a"));
        assert_eq!(r.age_seconds, Some(60));
        assert_eq!(r.phase_cell(), "Failed/Evicted");
        assert!(r.message.contains("low on resource"), "{}", r.message);

        // A missing holder: the grace runs from the lock's creation.
        for (grace, want) in [(30, "stale:OwnerGone"), (120, "held")] {
            let policy = Policy {
                owner_gone_grace: Duration::from_secs(grace),
            };
            let v = verdict::judge(&lock, missing_holder(&lock, now), &policy);
            let r = build_row(&c, &parsed, Some(&Found::Missing), &v, now);
            assert_eq!(r.verdict, want);
            assert_eq!(r.holder_found, Some(false));
            assert_eq!(r.phase_cell(), "(gone)");
        }

        // Unmanageable: no holder read at all.
        let bad = Candidate {
            meta: lock_meta(vec![pod_owner("op-1", "")], &[]),
            labeled: true,
            holds_data: false,
        };
        let parsed = lock::parse(&bad.meta);
        let v = Verdict::Unmanageable(parsed.clone().unwrap_err());
        let r = build_row(&bad, &parsed, None, &v, now);
        assert_eq!(r.verdict, "unmanageable:EmptyOwnerUid");
        assert_eq!(r.holder.as_deref(), Some("op-1"));
        assert_eq!(r.holder_found, None);
        assert_eq!(r.phase_cell(), "-");
    }
}
