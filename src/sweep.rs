//! What each resync still checks, without a GET per lock, for both lock
//! kinds at once. The terminal-pod watch already pushes every death and the
//! garbage collector removes the locks of deleted pods; a sweep catches what
//! those miss (a death during a watch outage, a holder deleted while the
//! garbage collector is off or backlogged, a holder recreated under its
//! name) and names those locks as suspects, to be judged from live reads.
//! Nothing here decides or writes anything.
//!
//! Its cost follows the locks, not the cluster's pods: it reads only the
//! namespaces where a watched lock names a pod, and in each the cheaper of
//! two ways, as learned from the sweep before: list the namespace's pods
//! (terminal ones, then all of them, metadata only, 500 a page), or read
//! each named pod by name. A janitor of the whole cluster whose locks are
//! spread over many small namespaces lists the cluster instead when that
//! costs fewer requests (its size is asked once an hour with a one-item
//! list).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Client, Resource};
use serde::Deserialize;

use crate::index::{HolderIndex, LeaseIndex};
use crate::lock::LockKey;
use crate::{call, Error, TERMINAL_PODS};

/// Objects per page of a sweep list.
const PAGE_SIZE: u32 = 500;

/// What one sweep found.
#[derive(Debug, Default)]
pub struct Sweep {
    /// ConfigMap locks whose holder is terminal, missing, or replaced by
    /// another pod of its name.
    pub configmaps: HashSet<LockKey>,
    /// Leases whose holder is terminal.
    pub leases: HashSet<LockKey>,
    /// Pods read and requests made.
    pub pods: usize,
    pub requests: usize,
    /// Namespaces read one by one (0: the cluster at once, or nothing).
    pub namespaces: usize,
    /// Whether the cluster was listed at once.
    pub cluster: bool,
}

/// The locks a sweep asks about: either kind may be absent.
#[derive(Clone, Copy, Default)]
pub struct Watched<'a> {
    pub configmaps: Option<&'a HolderIndex>,
    pub leases: Option<&'a LeaseIndex>,
}

/// A sweep's memory of what reading cost, for the next one to choose.
#[derive(Debug, Default)]
pub struct Plan {
    /// Per namespace: requests its lists took last time.
    list_cost: HashMap<String, usize>,
    /// Requests a sweep of the whole cluster at once takes (estimated or
    /// last seen), and at which sweep that was learned.
    cluster_cost: Option<(usize, u64)>,
    sweeps: u64,
}

/// How often (in sweeps) the cluster's size is asked again.
const CLUSTER_COST_TTL: u64 = 12;

/// How one namespace is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// List its pods: terminal ones (both kinds), then all (ConfigMap
    /// holders' presence).
    List,
    /// Read each named pod.
    ByName,
}

impl Plan {
    /// The way to read a namespace naming `names` pods, and its cost.
    fn way(&self, namespace: &str, names: usize) -> (Way, usize) {
        match self.list_cost.get(namespace) {
            Some(&list) if list <= names => (Way::List, list),
            Some(_) => (Way::ByName, names),
            // Not listed yet: a list costs at least two requests.
            None if names <= 2 => (Way::ByName, names),
            None => (Way::List, 2),
        }
    }
}

/// A pod as a sweep reads it: who it is, nothing else. A page is read into
/// these directly: the rest of each pod's metadata (its managedFields above
/// all, kilobytes per pod) is skipped unread instead of being built and
/// dropped, 500 pods at a time, every --resync.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PodId {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A metadata-only list page, as the sweep reads it. As in kube's
/// `ObjectList`, `items` must be there, and `null` (what the API server
/// sends for an empty list) is none: a body without it is not a list, and
/// read as an empty one it would hide suspects.
#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(deserialize_with = "null_as_empty")]
    items: Vec<Item>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Item>, D::Error> {
    Ok(Option::<Vec<Item>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Default, Deserialize)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
    /// How many items follow (set on lists without a selector).
    #[serde(rename = "remainingItemCount", default)]
    remaining: Option<i64>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    metadata: PodId,
}

/// Lists the pods of a scope (a namespace, or all), those matching `fields`
/// if given, in metadata-only pages, and calls `each` on every one.
async fn pages(
    client: &Client,
    namespace: Option<&str>,
    fields: Option<&str>,
    what: &str,
    mut each: impl FnMut(PodId),
) -> Result<usize, Error> {
    let request = kube::core::Request::new(Pod::url_path(&(), namespace));
    let mut token: Option<String> = None;
    let mut requests = 0;
    let mut restarts = 0;
    loop {
        let mut lp = ListParams::default().limit(PAGE_SIZE);
        if let Some(f) = fields {
            lp = lp.fields(f);
        }
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = match request.list_metadata(&lp) {
            Ok(req) => call(what, client.request::<Page>(req)).await,
            Err(e) => Err(Error::Kube {
                action: what.to_owned(),
                source: kube::Error::BuildRequest(e),
            }),
        };
        let page = match page {
            Ok(page) => page,
            // A continue token expires (410) when paging outlasts etcd's
            // compaction: start over, a few times. What was already seen is
            // seen again, which only repeats suspects.
            Err(Error::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 410 && token.is_some() && restarts < 3 => {
                restarts += 1;
                token = None;
                continue;
            }
            Err(e) => return Err(e),
        };
        requests += 1;
        page.items
            .into_iter()
            .map(|i| i.metadata)
            .for_each(&mut each);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(requests);
        }
    }
}

/// A pod as read by name: who it is and whether it ended.
#[derive(Deserialize)]
struct NamedPod {
    #[serde(default)]
    metadata: PodId,
    #[serde(default)]
    status: PodPhase,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct PodPhase {
    phase: Option<String>,
}

/// Reads one pod by name; `None`: there is none.
async fn pod_named(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<NamedPod>, Error> {
    let what = "sweeping a holder pod by name";
    let request = kube::core::Request::new(Pod::url_path(&(), Some(namespace)));
    let req = request
        .get(name, &kube::api::GetParams::default())
        .map_err(|e| Error::Kube {
            action: what.to_owned(),
            source: kube::Error::BuildRequest(e),
        })?;
    match call(what, client.request::<NamedPod>(req)).await {
        Ok(p) => Ok(Some(p)),
        Err(Error::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// How many pods the cluster has, from a one-item list (`None`: the API
/// server did not say).
async fn cluster_size(client: &Client) -> Result<Option<usize>, Error> {
    let request = kube::core::Request::new(Pod::url_path(&(), None));
    let what = "sizing the cluster's pods";
    let req = request
        .list_metadata(&ListParams::default().limit(1))
        .map_err(|e| Error::Kube {
            action: what.to_owned(),
            source: kube::Error::BuildRequest(e),
        })?;
    let page = call(what, client.request::<Page>(req)).await?;
    let more = page.metadata.continue_.is_some_and(|t| !t.is_empty());
    Ok(match (more, page.metadata.remaining) {
        (false, _) => Some(page.items.len()),
        (true, Some(n)) => usize::try_from(n).ok().map(|n| n + page.items.len()),
        (true, None) => None,
    })
}

/// Sweeps one scope (a namespace, or all) for the locks of `watched`,
/// reading only the namespaces they name pods in (see the module's words).
pub async fn sweep(
    client: &Client,
    scope: Option<&str>,
    watched: Watched<'_>,
    plan: &mut Plan,
) -> Result<Sweep, Error> {
    plan.sweeps += 1;
    let mut out = Sweep::default();
    // namespace -> the pod names its locks name (holders and Lease hosts).
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    if let Some(cms) = watched.configmaps {
        cms.holder_names(&mut names);
    }
    if let Some(leases) = watched.leases {
        leases.hosts(&mut names);
    }
    if let Some(ns) = scope {
        names.retain(|n, _| n == ns);
    }
    plan.list_cost.retain(|ns, _| names.contains_key(ns));
    if names.is_empty() {
        return Ok(out);
    }
    let by_namespace: usize = names.iter().map(|(ns, n)| plan.way(ns, n.len()).1).sum();

    // namespace -> name -> uid of the named pods that exist.
    let mut found: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut terminal = |out: &mut Sweep, p: &PodId| {
        if let Some(cms) = watched.configmaps {
            out.configmaps.extend(cms.locks_of(&p.namespace, &p.uid));
        }
        if let Some(leases) = watched.leases {
            out.leases.extend(leases.leases_of(&p.namespace, &p.name));
        }
    };

    if scope.is_none() && by_namespace > 2 {
        let stale = plan
            .cluster_cost
            .is_none_or(|(_, at)| plan.sweeps - at >= CLUSTER_COST_TTL);
        if stale {
            out.requests += 1;
            let lists = if watched.configmaps.is_some() { 2 } else { 1 };
            let cost = cluster_size(client).await?.map_or(usize::MAX, |pods| {
                pods.div_ceil(PAGE_SIZE as usize).max(1) * lists
            });
            plan.cluster_cost = Some((cost, plan.sweeps));
        }
        if plan
            .cluster_cost
            .is_some_and(|(cost, _)| cost < by_namespace)
        {
            out.cluster = true;
            let before = out.requests;
            list(
                client,
                None,
                watched,
                &names,
                &mut out,
                &mut found,
                &mut terminal,
            )
            .await?;
            plan.cluster_cost = Some((out.requests - before, plan.sweeps));
            finish(watched, &found, &names, &mut out);
            return Ok(out);
        }
    }

    for (ns, wanted) in &names {
        out.namespaces += 1;
        match plan.way(ns, wanted.len()).0 {
            Way::List => {
                let before = out.requests;
                list(
                    client,
                    Some(ns),
                    watched,
                    &names,
                    &mut out,
                    &mut found,
                    &mut terminal,
                )
                .await?;
                plan.list_cost.insert(ns.clone(), out.requests - before);
            }
            Way::ByName => {
                // A few at a time, as a list's pages would not be.
                let wanted: Vec<&String> = wanted.iter().collect();
                let mut reads = Vec::with_capacity(wanted.len());
                for names in wanted.chunks(4) {
                    let each = names.iter().map(|name| pod_named(client, ns, name));
                    reads.extend(futures::future::join_all(each).await);
                }
                for pod in reads {
                    out.requests += 1;
                    let Some(pod) = pod? else { continue };
                    out.pods += 1;
                    let p = pod.metadata;
                    if matches!(pod.status.phase.as_deref(), Some("Failed" | "Succeeded")) {
                        terminal(&mut out, &p);
                    }
                    found
                        .entry(p.namespace.clone())
                        .or_default()
                        .insert(p.name, p.uid);
                }
            }
        }
    }
    finish(watched, &found, &names, &mut out);
    Ok(out)
}

/// Lists a namespace's pods (or the cluster's): the terminal ones, then,
/// when ConfigMap locks are watched, all of them, keeping of those only the
/// pods some lock names.
async fn list(
    client: &Client,
    namespace: Option<&str>,
    watched: Watched<'_>,
    names: &BTreeMap<String, BTreeSet<String>>,
    out: &mut Sweep,
    found: &mut HashMap<String, HashMap<String, String>>,
    terminal: &mut impl FnMut(&mut Sweep, &PodId),
) -> Result<(), Error> {
    let mut seen = 0;
    let mut hits = Sweep::default();
    out.requests += pages(
        client,
        namespace,
        Some(TERMINAL_PODS),
        "sweeping terminal pods",
        |p| {
            seen += 1;
            terminal(&mut hits, &p);
        },
    )
    .await?;
    out.configmaps.extend(hits.configmaps);
    out.leases.extend(hits.leases);
    if watched.configmaps.is_some() {
        out.requests += pages(client, namespace, None, "sweeping pods", |p| {
            seen += 1;
            if names.get(&p.namespace).is_some_and(|n| n.contains(&p.name)) {
                found.entry(p.namespace).or_default().insert(p.name, p.uid);
            }
        })
        .await?;
    }
    out.pods += seen;
    Ok(())
}

/// The ConfigMap locks whose holder is not there under its uid, among the
/// namespaces read.
fn finish(
    watched: Watched<'_>,
    found: &HashMap<String, HashMap<String, String>>,
    names: &BTreeMap<String, BTreeSet<String>>,
    out: &mut Sweep,
) {
    let Some(cms) = watched.configmaps else {
        return;
    };
    out.configmaps.extend(cms.missing_holders(|ns, name, uid| {
        // A namespace not read this time (none: every one a lock names is)
        // says nothing against its locks.
        !names.contains_key(ns)
            || found
                .get(ns)
                .and_then(|n| n.get(name))
                .is_some_and(|u| u == uid)
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace not listed yet is read by name when it names one or two
    /// pods, else listed; once listed, the cheaper of its list's cost and
    /// the number of names.
    #[test]
    fn reads_each_namespace_the_cheaper_way() {
        let mut plan = Plan::default();
        assert_eq!(plan.way("ops", 1), (Way::ByName, 1));
        assert_eq!(plan.way("ops", 2), (Way::ByName, 2));
        assert_eq!(plan.way("ops", 3), (Way::List, 2));
        plan.list_cost.insert("ops".into(), 12);
        assert_eq!(plan.way("ops", 3), (Way::ByName, 3));
        assert_eq!(plan.way("ops", 12), (Way::List, 12));
        assert_eq!(plan.way("ops", 40), (Way::List, 12));
    }

    /// A page as the API server sends it: identities are read, the rest
    /// (managedFields, labels, owners) is skipped, the continue token kept.
    #[test]
    fn reads_identities_from_a_metadata_page() {
        let body = serde_json::json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "77", "continue": "next-page"},
            "items": [
                {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                 "metadata": {"name": "op-0", "namespace": "ops", "uid": "u-0",
                    "labels": {"app": "op"},
                    "managedFields": [{"manager": "kubelet", "operation": "Update",
                        "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:status": {"f:phase": {}, "f:conditions": {}}}}]}},
                {"metadata": {"name": "op-1", "namespace": "ops"}}
            ]
        });
        let page: Page = serde_json::from_value(body).expect("a page");
        assert_eq!(page.metadata.continue_.as_deref(), Some("next-page"));
        let ids: Vec<(String, String, String)> = page
            .items
            .into_iter()
            .map(|i| (i.metadata.namespace, i.metadata.name, i.metadata.uid))
            .collect();
        assert_eq!(
            ids,
            vec![
                ("ops".into(), "op-0".into(), "u-0".into()),
                // A pod without a uid (no API server sends one) names no
                // holder: an empty uid matches no lock.
                ("ops".into(), "op-1".into(), String::new()),
            ]
        );
        for items in [serde_json::json!([]), serde_json::Value::Null] {
            let last: Page = serde_json::from_value(serde_json::json!({
                "kind": "PartialObjectMetadataList", "metadata": {"resourceVersion": "78"},
                "items": items,
            }))
            .expect("an empty last page");
            assert!(last.metadata.continue_.is_none() && last.items.is_empty());
        }
        // Not a list (a Status, say): an error, never an empty page.
        let status = serde_json::json!({"kind": "Status", "status": "Failure", "code": 500});
        assert!(serde_json::from_value::<Page>(status).is_err());
    }
}
