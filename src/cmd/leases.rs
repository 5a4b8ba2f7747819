//! The Lease locks of `scan` and `label`: one paged list of Leases per scope,
//! and the pods of each namespace with a candidate (a Lease's holder may be
//! named by a pod's `spec.hostname`, so the namespace's pods are listed
//! whole, once). A Lease is a candidate when it is opted in, or when
//! its kind's candidate rule (`Kind::candidate`) says so: held for life, or held under an
//! identity that names exactly one pod of its namespace (node heartbeats in
//! `kube-node-lease` and the control plane's own leases name no pod and are
//! left out), outside the excluded namespaces unless named with -n.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use super::report::{row, Row};
use super::Cluster;
use crate::cli::Scope;
use crate::kinds::{self, Object};
use crate::lock::candidate::{self, Shape};
use crate::lock::{self, LockKey};
use crate::observe::{Judgement, Observer};
use crate::Error;

/// One Lease that `scan` reports and `label` may opt in.
pub struct LeaseCandidate {
    pub lease: Lease,
    pub labeled: bool,
}

/// What the Lease lists found.
#[derive(Default)]
pub struct LeaseListing {
    pub candidates: Vec<LeaseCandidate>,
    /// The pods of every namespace that has a Lease naming a host.
    pub pods: BTreeMap<String, Vec<Pod>>,
    /// Leases read, candidates or not.
    pub scanned: usize,
    /// Unlabeled Leases of a candidate's shape in the namespaces of
    /// `--exclude-namespaces` (not named with -n): left out.
    pub excluded: usize,
}

/// Lists the Leases in scope and the pods their identities may name.
pub async fn list_lease_candidates(
    cluster: &Cluster,
    scope: &Scope,
) -> Result<LeaseListing, Error> {
    let mut leases = Vec::new();
    for ns in crate::scopes(&scope.namespaces) {
        let api: Api<Lease> = crate::scoped(&cluster.client, ns.as_deref());
        let what = format!(
            "listing leases in {}",
            ns.as_deref().unwrap_or("all namespaces")
        );
        leases.extend(crate::list_all(&api, &what).await?);
    }
    let scanned = leases.len();
    let mut excluded = 0;
    let shapes: Vec<Option<Shape>> = leases
        .iter()
        .map(|l| {
            let ns = l.metadata.namespace.as_deref().unwrap_or_default();
            let shape = kinds::candidate(Object::Lease(l));
            let labeled = scope.selector.matches(l.metadata.labels.as_ref());
            if shape.is_some() && !labeled && scope.leaves_out(ns) {
                excluded += 1;
                return None;
            }
            shape
        })
        .collect();
    // The pods of every namespace with a candidate: a host to look for, or
    // the owner of a Lease held for life (its judgement reads them).
    let wanted: BTreeSet<String> = leases
        .iter()
        .zip(&shapes)
        .filter(|(l, shape)| shape.is_some() || scope.selector.matches(l.metadata.labels.as_ref()))
        .filter_map(|(l, _)| l.metadata.namespace.clone())
        .collect();
    let mut pods = BTreeMap::new();
    for ns in wanted {
        let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
        let list = crate::list_all(&api, &format!("listing pods in {ns}")).await?;
        pods.insert(ns, list);
    }
    let mut candidates: Vec<LeaseCandidate> = leases
        .into_iter()
        .zip(shapes)
        .filter_map(|(lease, shape)| {
            let labeled = scope.selector.matches(lease.metadata.labels.as_ref());
            let ns = lease.metadata.namespace.as_deref().unwrap_or_default();
            let found = pods.get(ns).map(Vec::as_slice).unwrap_or_default();
            let is_candidate =
                shape.is_some_and(|s| s.host().is_none_or(|h| candidate::names_one_pod(h, found)));
            (labeled || is_candidate).then_some(LeaseCandidate { lease, labeled })
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
        excluded,
    })
}

/// [`list_lease_candidates`], or none when Leases or pods may not be
/// listed (a janitor installed for ConfigMaps only): said on stderr.
pub async fn lease_candidates_if_allowed(
    cluster: &Cluster,
    scope: &Scope,
    needs: &str,
) -> anyhow::Result<LeaseListing> {
    match list_lease_candidates(cluster, scope).await {
        Ok(found) => Ok(found),
        Err(e) if e.kind() == crate::ErrorKind::Forbidden => {
            eprintln!("lock-janitor: Lease locks left out ({needs} is not allowed): {e}");
            Ok(LeaseListing::default())
        }
        Err(e) => Err(super::explain(e, cluster, needs)),
    }
}

/// Judges every candidate through the controller's own path.
pub async fn judge_all(
    observer: &Observer,
    listing: &LeaseListing,
) -> Result<Vec<Judgement>, Error> {
    let mut out = Vec::new();
    for c in &listing.candidates {
        let meta = &c.lease.metadata;
        let ns = meta.namespace.clone().unwrap_or_default();
        let pods = listing.pods.get(&ns).map(Vec::as_slice).unwrap_or_default();
        let key = LockKey::lease(ns, meta.name.clone().unwrap_or_default());
        let renewals = crate::verdict::Renewals::default();
        let lease = c.lease.clone();
        out.push(
            observer
                .judge_lease(key, lease, Some(pods), &renewals)
                .await?,
        );
    }
    Ok(out)
}

/// A report row for a ConfigMap whose leader record names its holder (the
/// identity's host), judged as a Lease is.
pub fn record_row(c: &super::Candidate, j: &Judgement, now: Timestamp) -> Row {
    let o = crate::kinds::Object::ConfigMapMeta(&c.meta);
    let holder = crate::kinds::of(o).holder(o).map(|h| h.name);
    Row {
        holder_found: holder.as_ref().map(|_| j.holder.is_some()),
        ..row(
            "configmap",
            &c.meta,
            c.labeled,
            holder,
            j.holder.as_ref(),
            &j.verdict,
            now,
        )
    }
}

/// A report row for a Lease (the holder is the identity's host).
pub fn lease_row(c: &LeaseCandidate, j: &Judgement, now: Timestamp) -> Row {
    let holder = lock::lease::parse(&c.lease).ok().and_then(|p| p.host);
    Row {
        holder_found: holder.as_ref().map(|_| j.holder.is_some()),
        ..row(
            "lease",
            &c.lease.metadata,
            c.labeled,
            holder,
            j.holder.as_ref(),
            &j.verdict,
            now,
        )
    }
}
