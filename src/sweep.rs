//! What each resync still checks, without a GET per lock, for both lock
//! kinds at once. The terminal-pod watch already pushes every death and the
//! garbage collector removes the locks of deleted pods; a sweep catches what
//! those miss (a death during a watch outage, a holder deleted while the
//! garbage collector is off or backlogged, a holder recreated under its
//! name) and names those locks as suspects, to be judged from live reads.
//! Nothing here decides or writes anything.
//!
//! Its cost follows the locks, not the cluster's pods: it reads only the
//! namespaces where a watched lock names a pod, each by one fixed rule. The
//! holders a lock names by ownerReference (a ConfigMap's, a Lease held for
//! life's owner) are read by name up to `BY_NAME_UP_TO`; more are found by
//! listing the namespace's pods (metadata only, 500 a page). A namespace
//! whose Leases name hosts, or whose holders are listed, has its terminal
//! pods listed first (a host may be a pod name cut to a hostname, which
//! only a list finds).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::core::PartialObjectMeta;
use kube::{Api, Client};

use crate::index::{HolderIndex, LeaseIndex};
use crate::lock::LockKey;
use crate::{call, dns_subdomain, Error, Paged, TERMINAL_PODS};

/// Objects per page of a sweep list.
const PAGE_SIZE: u32 = 500;
/// A namespace's holders named by ownerReference are read by name up to
/// this many, else its pods are listed (two lists: terminal pods, then all).
const BY_NAME_UP_TO: usize = 2;

/// What one sweep found.
#[derive(Debug, Default)]
pub struct Sweep {
    /// ConfigMap locks whose holder is terminal, missing, or replaced by
    /// another pod of its name.
    pub configmaps: HashSet<LockKey>,
    /// Leases whose holder is terminal; Leases held for life whose owner
    /// is also missing or replaced, as for ConfigMaps.
    pub leases: HashSet<LockKey>,
    /// Pods read and requests made.
    pub pods: usize,
    pub requests: usize,
    /// Namespaces read.
    pub namespaces: usize,
}

/// The locks a sweep asks about: either kind may be absent.
#[derive(Clone, Copy, Default)]
pub struct Watched<'a> {
    pub configmaps: Option<&'a HolderIndex>,
    pub leases: Option<&'a LeaseIndex>,
}

/// The pods one namespace's locks name.
#[derive(Debug, Default)]
struct Named {
    /// Holders named by ownerReference (ConfigMaps, Leases held for life):
    /// is each there, under its uid, and alive?
    holders: BTreeSet<String>,
    /// Lease hosts: has one ended?
    hosts: BTreeSet<String>,
}

/// Sweeps one scope (a namespace, or all) for the locks of `watched`,
/// reading only the namespaces they name pods in (see the module's words),
/// into `out`. On an error, `out` holds the suspects found before it (the
/// missing holders are named only by a sweep that read everything).
pub async fn sweep(
    client: &Client,
    scope: Option<&str>,
    watched: Watched<'_>,
    out: &mut Sweep,
) -> Result<(), Error> {
    let mut named: BTreeMap<String, Named> = BTreeMap::new();
    for (ns, names) in watched
        .configmaps
        .map(HolderIndex::holder_names)
        .unwrap_or_default()
    {
        named.entry(ns).or_default().holders = names;
    }
    for (ns, hosts) in watched.leases.map(LeaseIndex::hosts).unwrap_or_default() {
        named.entry(ns).or_default().hosts = hosts;
    }
    for (ns, hosts) in watched
        .configmaps
        .map(HolderIndex::hosts)
        .unwrap_or_default()
    {
        named.entry(ns).or_default().hosts.extend(hosts);
    }
    for (ns, owners) in watched
        .leases
        .map(LeaseIndex::owner_names)
        .unwrap_or_default()
    {
        named.entry(ns).or_default().holders.extend(owners);
    }
    if let Some(ns) = scope {
        named.retain(|n, _| n == ns);
    }
    let mut pass = Pass {
        client,
        watched,
        out,
        found: HashMap::new(),
    };
    let mut refused = Vec::new();
    for (ns, wanted) in &named {
        pass.out.namespaces += 1;
        let by_name = wanted.holders.len() <= BY_NAME_UP_TO;
        if !wanted.hosts.is_empty() || !by_name {
            match pass.list(ns, wanted, !by_name).await {
                Ok(()) => {}
                // A cluster-wide scope goes on past one namespace that
                // refuses it: the others must still be swept (and the
                // janitor become ready); that namespace's locks are judged
                // at their next event. A namespace scope fails.
                Err(e) if scope.is_none() && e.kind() == crate::ErrorKind::Forbidden => {
                    tracing::warn!(namespace = %ns, error = %e,
                        "the resync sweep may not list pods in this namespace; sweeping the others");
                    refused.push(ns.clone());
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        if by_name {
            pass.read_by_name(ns, scope.is_some(), wanted).await?;
        }
    }
    // Nothing read there: none of its holders is taken for missing.
    for ns in refused {
        named.remove(&ns);
    }
    // The locks whose holder (a ConfigMap's, a Lease held for life's
    // owner) is not there under its uid, among the namespaces read.
    let found = &pass.found;
    let there = |ns: &str, name: &str, uid: &str| {
        // A namespace not read this time (none: every one a lock names is)
        // says nothing against its locks.
        !named.contains_key(ns)
            || found
                .get(ns)
                .and_then(|n| n.get(name))
                .is_some_and(|u| u == uid)
    };
    if let Some(cms) = watched.configmaps {
        pass.out.configmaps.extend(cms.missing_holders(there));
    }
    if let Some(leases) = watched.leases {
        pass.out.leases.extend(leases.missing_owners(there));
    }
    Ok(())
}

/// One sweep under way.
struct Pass<'a> {
    client: &'a Client,
    watched: Watched<'a>,
    out: &'a mut Sweep,
    /// namespace -> name -> uid of the holders named by ownerReference
    /// that exist.
    found: HashMap<String, HashMap<String, String>>,
}

impl Pass<'_> {
    /// Reads a namespace's holders one by one (a few at a time).
    /// `namespace_scope`: the scope is this namespace, and a refusal of it
    /// fails the sweep.
    async fn read_by_name(
        &mut self,
        ns: &str,
        namespace_scope: bool,
        wanted: &Named,
    ) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        // A name no pod can have is not read: its locks are suspects (judged
        // from live reads, which say what they are).
        let names: Vec<&String> = wanted.holders.iter().filter(|n| dns_subdomain(n)).collect();
        for chunk in names.chunks(4) {
            let reads = futures::future::join_all(
                chunk
                    .iter()
                    .map(|n| call("sweeping a holder pod by name", api.get_opt(n))),
            )
            .await;
            for pod in reads {
                self.out.requests += 1;
                let pod = match pod {
                    Ok(Some(pod)) => pod,
                    Ok(None) => continue,
                    // Refused for this pod alone (400, 422, ...; and 401/403
                    // in a cluster-wide scope, where one namespace refused
                    // must not stop the sweep of all the others): its locks
                    // are suspects, judged from live reads. Refused for the
                    // namespace that is the scope (401, 403: RBAC is per
                    // namespace), throttled (429), a server or network
                    // error: the sweep fails, and the scope's health says so.
                    Err(Error::Kube {
                        source: kube::Error::Api(s),
                        ..
                    }) if (400..500).contains(&s.code)
                        && s.code != 429
                        && !(namespace_scope && [401, 403].contains(&s.code)) =>
                    {
                        continue
                    }
                    Err(e) => return Err(e),
                };
                self.out.pods += 1;
                let (name, uid) = (
                    pod.metadata.name.unwrap_or_default(),
                    pod.metadata.uid.unwrap_or_default(),
                );
                let phase = pod.status.and_then(|s| s.phase);
                if matches!(phase.as_deref(), Some("Failed" | "Succeeded")) {
                    if let Some(cms) = self.watched.configmaps {
                        self.out.configmaps.extend(cms.locks_of(ns, &uid));
                    }
                }
                self.found
                    .entry(ns.to_owned())
                    .or_default()
                    .insert(name, uid);
            }
        }
        Ok(())
    }

    /// Lists a namespace's terminal pods, then, if `all`, all of them,
    /// keeping of those only the pods some lock names by ownerReference.
    async fn list(&mut self, ns: &str, wanted: &Named, all: bool) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let api = &api;
        let list = |lp: ListParams| async move { api.list_metadata(&lp).await };
        let terminal = ListParams::default().fields(TERMINAL_PODS);
        let (watched, out) = (self.watched, &mut *self.out);
        // What was seen before a start-over is seen again: it only repeats
        // suspects.
        let requests = crate::for_each_page(
            "sweeping terminal pods",
            &terminal,
            PAGE_SIZE,
            list,
            |page| {
                let Paged::Items(pods) = page else { return };
                out.pods += pods.len();
                for p in &pods {
                    let (ns, name, uid) = id(p);
                    if let Some(index) = watched.configmaps {
                        out.configmaps.extend(index.locks_of(ns, uid));
                        out.configmaps.extend(index.locks_named(ns, name));
                    }
                    if let Some(index) = watched.leases {
                        out.leases.extend(index.leases_of(ns, name));
                    }
                }
            },
        )
        .await;
        out.requests += requests?;
        if all {
            let mut seen = 0;
            let mut here = HashMap::new();
            let every = ListParams::default();
            out.requests +=
                crate::for_each_page("sweeping pods", &every, PAGE_SIZE, list, |page| {
                    let Paged::Items(pods) = page else {
                        (here, seen) = (HashMap::new(), 0);
                        return;
                    };
                    seen += pods.len();
                    for p in &pods {
                        let (_, name, uid) = id(p);
                        if wanted.holders.contains(name) {
                            here.insert(name.to_owned(), uid.to_owned());
                        }
                    }
                })
                .await?;
            out.pods += seen;
            self.found.entry(ns.to_owned()).or_default().extend(here);
        }
        Ok(())
    }
}

/// The namespace and name and uid of a pod in a metadata list.
fn id(p: &PartialObjectMeta<Pod>) -> (&str, &str, &str) {
    let m = &p.metadata;
    (
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use crate::dns_subdomain;

    /// The names a sweep reads by name are the names Kubernetes allows a
    /// pod (a DNS-1123 subdomain, whose labels may pass 63 characters).
    #[test]
    fn only_pod_names_are_read_by_name() {
        let long = format!("{}.b", "x".repeat(100));
        for ok in [
            "op-0",
            "a",
            "web.1",
            "x".repeat(253).as_str(),
            long.as_str(),
        ] {
            assert!(dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "p/eviction",
            "Op",
            "-a",
            "a-",
            "..",
            "a..b",
            "a.-b",
            ".a",
            "a.",
            &"x".repeat(254),
        ] {
            assert!(!dns_subdomain(bad), "{bad}");
        }
    }
}

#[cfg(test)]
mod mocked;
