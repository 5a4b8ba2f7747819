//! What each resync still checks, without a GET per lock: two paged,
//! metadata-only pod lists per scope. The terminal-pod watch already pushes
//! every death and the garbage collector removes the locks of deleted pods;
//! a sweep catches what those miss (a death during a watch outage, a holder
//! deleted while the garbage collector is off or backlogged, a holder
//! recreated under its name) and names those locks as suspects, to be judged
//! from live reads. Nothing here decides or writes anything.

use std::collections::{HashMap, HashSet};

use futures::Future;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::core::{ObjectList, PartialObjectMeta};
use kube::{Api, Client, ResourceExt};

use crate::index::{HolderIndex, LeaseIndex};
use crate::lock::LockKey;
use crate::{call, scoped, Error, TERMINAL_PODS};

/// Objects per page of a sweep list.
const PAGE_SIZE: u32 = 500;

/// What one sweep found.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Locks whose holder is terminal, missing, or replaced by another pod
    /// of its name.
    pub suspects: HashSet<LockKey>,
    /// Pods read (both lists) and requests made.
    pub pods: usize,
    pub requests: usize,
}

/// Lists pods in pages and calls `each` on every one.
async fn pages<F, Fut>(
    list: F,
    mut each: impl FnMut(PartialObjectMeta<Pod>),
) -> Result<usize, Error>
where
    F: Fn(ListParams) -> Fut,
    Fut: Future<Output = Result<ObjectList<PartialObjectMeta<Pod>>, Error>>,
{
    let mut token: Option<String> = None;
    let mut requests = 0;
    let mut restarts = 0;
    loop {
        let mut lp = ListParams::default().limit(PAGE_SIZE);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = match list(lp).await {
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
        page.items.into_iter().for_each(&mut each);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(requests);
        }
    }
}

/// One page of the scope's terminal pods (metadata only), per call.
fn terminal(
    api: &Api<Pod>,
) -> impl Fn(
    ListParams,
) -> futures::future::BoxFuture<'static, Result<ObjectList<PartialObjectMeta<Pod>>, Error>> {
    let api = api.clone();
    move |lp: ListParams| {
        let (api, lp) = (api.clone(), lp.fields(TERMINAL_PODS));
        Box::pin(async move { call("sweeping terminal pods", api.list_metadata(&lp)).await })
    }
}

/// Sweeps one scope (a namespace, or all) against its holder index.
pub async fn sweep(
    client: &Client,
    namespace: Option<&str>,
    index: &HolderIndex,
) -> Result<Sweep, Error> {
    let api: Api<Pod> = scoped(client, namespace);
    let mut out = Sweep::default();

    // Terminal pods that hold a lock.
    out.requests += pages(terminal(&api), |p| {
        out.pods += 1;
        let ns = p.namespace().unwrap_or_default();
        let uid = p.metadata.uid.unwrap_or_default();
        out.suspects.extend(index.locks_of(&ns, &uid));
    })
    .await?;

    // Which holders exist, under which uid. Only pods a lock names are kept.
    let mut found: HashMap<(String, String), String> = HashMap::new();
    let list = |lp: ListParams| {
        let api = api.clone();
        async move { call("sweeping pods", api.list_metadata(&lp)).await }
    };
    out.requests += pages(list, |p| {
        out.pods += 1;
        let ns = p.namespace().unwrap_or_default();
        let name = p.name_any();
        if index.names_a_holder(&ns, &name) {
            found.insert((ns, name), p.metadata.uid.unwrap_or_default());
        }
    })
    .await?;
    out.suspects.extend(index.missing_holders(|ns, name, uid| {
        found
            .get(&(ns.to_owned(), name.to_owned()))
            .is_some_and(|u| u == uid)
    }));
    Ok(out)
}

/// Sweeps one scope's Leases: one paged, metadata-only list of terminal
/// pods names the Leases whose holder may have died during a watch outage.
/// (A Lease that names a pod by a `spec.hostname` other than its name is
/// found by its own watch events only; it expires by itself meanwhile.)
pub async fn sweep_leases(
    client: &Client,
    namespace: Option<&str>,
    index: &LeaseIndex,
) -> Result<Sweep, Error> {
    let api: Api<Pod> = scoped(client, namespace);
    let mut out = Sweep::default();
    out.requests += pages(terminal(&api), |p| {
        out.pods += 1;
        let ns = p.namespace().unwrap_or_default();
        out.suspects.extend(index.leases_of(&ns, &p.name_any()));
    })
    .await?;
    Ok(out)
}
