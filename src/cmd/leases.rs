//! The Lease locks of `scan` and `label`: one paged list of Leases per scope,
//! and the pods of each namespace where a Lease's holder identity could name
//! one (a Lease's holder may be named by a pod's `spec.hostname`, so the
//! namespace's pods are listed whole, once). A Lease is a candidate when it
//! is opted in, or when its holder identity names exactly one pod of its
//! namespace (DESIGN.md "Lock-shaped": node heartbeats in `kube-node-lease`
//! and the control plane's own leases name no pod and are left out).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::Api;

use super::report::Row;
use super::Cluster;
use crate::cli::Scope;
use crate::lock::{self, LockKey};
use crate::observe::{Judgement, Observer};
use crate::selector::Selector;
use crate::{call, words, Error};

/// One Lease that `scan` reports and `label` may opt in.
pub struct LeaseCandidate {
    pub lease: Lease,
    pub labeled: bool,
}

/// What the Lease lists found.
pub struct LeaseListing {
    pub candidates: Vec<LeaseCandidate>,
    /// The pods of every namespace that has a Lease naming a host.
    pub pods: BTreeMap<String, Vec<Pod>>,
    /// Leases read, candidates or not.
    pub scanned: usize,
}

async fn list_leases(cluster: &Cluster, ns: Option<&str>) -> Result<Vec<Lease>, Error> {
    let api: Api<Lease> = crate::scoped(&cluster.client, ns);
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let what = format!("listing leases in {}", ns.unwrap_or("all namespaces"));
        let page = call(what, api.list(&lp)).await?;
        out.extend(page.items);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// Lists the Leases in scope and the pods their identities may name.
pub async fn list_lease_candidates(
    cluster: &Cluster,
    observer: &Observer,
    scope: &Scope,
    selector: &Selector,
) -> Result<LeaseListing, Error> {
    let namespaces: Vec<Option<String>> = if scope.namespaces.is_empty() {
        vec![None]
    } else {
        let set: BTreeSet<&String> = scope.namespaces.iter().collect();
        set.into_iter().cloned().map(Some).collect()
    };
    let mut leases = Vec::new();
    for ns in namespaces {
        let found = list_leases(cluster, ns.as_deref()).await?;
        leases.extend(found);
    }
    let scanned = leases.len();
    let hosts = |l: &Lease| lock::lease::parse(l).ok().and_then(|p| p.host);
    let wanted: BTreeSet<String> = leases
        .iter()
        .filter(|l| hosts(l).is_some())
        .filter_map(|l| l.metadata.namespace.clone())
        .collect();
    let mut pods = BTreeMap::new();
    for ns in wanted {
        let list = observer.pods_in(&ns).await?;
        pods.insert(ns, list);
    }
    let mut candidates: Vec<LeaseCandidate> = leases
        .into_iter()
        .filter_map(|lease| {
            let labeled = selector.matches(lease.metadata.labels.as_ref());
            let names_one_pod = hosts(&lease).is_some_and(|h| {
                let ns = lease.metadata.namespace.as_deref().unwrap_or_default();
                pods.get(ns).map_or(0, |ps| {
                    ps.iter().filter(|p| lock::lease::names(&h, p)).count()
                }) == 1
            });
            (labeled || names_one_pod).then_some(LeaseCandidate { lease, labeled })
        })
        .collect();
    candidates.sort_by(|a, b| {
        (&a.lease.metadata.namespace, &a.lease.metadata.name)
            .cmp(&(&b.lease.metadata.namespace, &b.lease.metadata.name))
    });
    Ok(LeaseListing {
        candidates,
        pods,
        scanned,
    })
}

/// Judges every candidate through the controller's own path.
pub async fn judge_all(
    observer: &Observer,
    listing: &LeaseListing,
) -> Result<Vec<Judgement>, Error> {
    let mut out = Vec::new();
    for c in &listing.candidates {
        let ns = c.lease.metadata.namespace.clone().unwrap_or_default();
        let key = LockKey::lease(
            ns.clone(),
            c.lease.metadata.name.clone().unwrap_or_default(),
        );
        let pods = listing.pods.get(&ns).map(Vec::as_slice).unwrap_or_default();
        out.push(
            observer
                .judge_lease(key, c.lease.clone(), Some(pods))
                .await?,
        );
    }
    Ok(out)
}

/// A report row for a Lease (the holder is the identity's host).
pub fn lease_row(c: &LeaseCandidate, j: &Judgement, now: Timestamp) -> Row {
    let meta = &c.lease.metadata;
    let parsed = lock::lease::parse(&c.lease).ok();
    let holder = parsed.as_ref().and_then(|p| p.host.clone());
    let pod = j.holder.as_ref();
    let status = pod.and_then(|p| p.status.as_ref());
    let created = meta.creation_timestamp.as_ref().map(|t| t.0);
    let age =
        created.map(|c| std::time::Duration::try_from(now.duration_since(c)).unwrap_or_default());
    let verdict = &j.verdict;
    let died_at = match verdict {
        crate::verdict::Verdict::Stale { died_at, .. } => died_at.map(|t| t.to_string()),
        _ => None,
    };
    Row {
        kind: "lease".into(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        labeled: c.labeled,
        holder_found: holder.as_ref().map(|_| pod.is_some()),
        holder: holder.clone(),
        holder_uid: None,
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
        message: words::explain(verdict, holder.as_deref().unwrap_or_default(), pod, age),
    }
}
