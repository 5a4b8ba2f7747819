//! What each resync still checks, without a GET per lock: two paged,
//! metadata-only pod lists per scope. The terminal-pod watch already pushes
//! every death and the garbage collector removes the locks of deleted pods;
//! a sweep catches what those miss (a death during a watch outage, a holder
//! deleted while the garbage collector is off or backlogged, a holder
//! recreated under its name) and names those locks as suspects, to be judged
//! from live reads. Nothing here decides or writes anything.

use std::collections::{HashMap, HashSet};

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
    /// Locks whose holder is terminal, missing, or replaced by another pod
    /// of its name.
    pub suspects: HashSet<LockKey>,
    /// Pods read (both lists) and requests made.
    pub pods: usize,
    pub requests: usize,
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

/// Sweeps one scope (a namespace, or all) against its holder index.
pub async fn sweep(
    client: &Client,
    namespace: Option<&str>,
    index: &HolderIndex,
) -> Result<Sweep, Error> {
    let mut out = Sweep::default();

    // Terminal pods that hold a lock.
    let terminal = Some(TERMINAL_PODS);
    out.requests += pages(client, namespace, terminal, "sweeping terminal pods", |p| {
        out.pods += 1;
        out.suspects.extend(index.locks_of(&p.namespace, &p.uid));
    })
    .await?;

    // Which holders exist, under which uid (namespace -> name -> uid, so
    // that each lock's lookup allocates nothing). Only pods a lock names
    // are kept.
    let mut found: HashMap<String, HashMap<String, String>> = HashMap::new();
    out.requests += pages(client, namespace, None, "sweeping pods", |p| {
        out.pods += 1;
        if index.names_a_holder(&p.namespace, &p.name) {
            found.entry(p.namespace).or_default().insert(p.name, p.uid);
        }
    })
    .await?;
    out.suspects.extend(index.missing_holders(|ns, name, uid| {
        found
            .get(ns)
            .and_then(|names| names.get(name))
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
    let mut out = Sweep::default();
    let terminal = Some(TERMINAL_PODS);
    out.requests += pages(client, namespace, terminal, "sweeping terminal pods", |p| {
        out.pods += 1;
        out.suspects.extend(index.leases_of(&p.namespace, &p.name));
    })
    .await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
