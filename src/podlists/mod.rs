//! One list of a namespace's pods serves every Lease judgement waiting on
//! it.
//!
//! A Lease's holder identity may name a pod by its name or by its
//! `spec.hostname`, and no field selector reaches a hostname: a judgement
//! pages through every pod of the Lease's namespace. When a node dies with
//! many leaders, their Leases come out of their renewal windows together,
//! and each judgement listing the same namespace on its own multiplies the
//! work by the number of Leases (a hundred Leases among 1,000 pods a
//! namespace made 1,500 page requests in one second's worth of deaths).
//!
//! Here the judgements that wait on one namespace at the same time share a
//! list. A list that is already under way is never joined: it may have
//! passed a pod made since the judgement began (a holder recreated under its
//! name), so a judgement waits for the next list, which starts after it
//! asked and sees everything it would have seen alone. While one list runs,
//! whoever asks gathers for the next; when it ends, the next starts for all
//! of them once it has a turn: at most `LISTS_IN_FLIGHT` namespaces are
//! listed at once for the reads a death makes necessary, fewer for the
//! budgeted ones (sweeps, doubts), which have turns of their own so that
//! they never hold back the former. Each judgement gets only the pods its
//! own identity names; a page is held while it is filtered, never the
//! namespace.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{oneshot, Semaphore};

use crate::Error;

/// The lists under way and the judgements waiting for the next one, per
/// namespace and client (the urgent client's lists are not paced by the
/// idle budget, so they are not shared with budgeted ones).
#[derive(Clone)]
pub struct PodLists {
    slots: Arc<Mutex<HashMap<Key, Slot>>>,
    /// Lists of different namespaces go side by side up to this many (each
    /// holds a page while it filters it); a namespace waiting for a turn
    /// gathers more judgements for its list meanwhile. The budgeted lists
    /// have turns of their own (`[budgeted, urgent]`): paced by the idle
    /// budget, they would otherwise hold turns a death's lists need.
    turns: [Arc<Semaphore>; 2],
}

/// How many namespaces are listed at once for the reads a death makes
/// necessary.
pub const LISTS_IN_FLIGHT: usize = 16;
/// How many namespaces are listed at once within the idle budget.
pub const BUDGETED_LISTS_IN_FLIGHT: usize = 4;

impl Default for PodLists {
    fn default() -> Self {
        Self::with_turns(LISTS_IN_FLIGHT)
    }
}

type Key = (String, bool);
type Reply = oneshot::Sender<Result<Vec<Pod>, Error>>;

#[derive(Default)]
struct Slot {
    /// A list is under way (its task runs until nobody waits).
    running: bool,
    /// Who waits for the next list: the identity each one looks for.
    waiting: Vec<(String, Reply)>,
}

impl PodLists {
    fn with_turns(n: usize) -> Self {
        PodLists {
            slots: Default::default(),
            turns: [
                Arc::new(Semaphore::new(BUDGETED_LISTS_IN_FLIGHT.min(n))),
                Arc::new(Semaphore::new(n)),
            ],
        }
    }

    /// The pods of `namespace` that `host` names, from a list that starts
    /// after this call. `list` lists the namespace once for several
    /// identities and answers, for each in order, the pods it names.
    pub async fn named<L, F>(
        &self,
        namespace: &str,
        urgent: bool,
        host: &str,
        list: L,
    ) -> Result<Vec<Pod>, Error>
    where
        L: Fn(Vec<String>) -> F + Send + 'static,
        F: Future<Output = Result<Vec<Vec<Pod>>, Error>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let key = (namespace.to_owned(), urgent);
        let lead = {
            let mut slots = lock(&self.slots);
            let slot = slots.entry(key.clone()).or_default();
            slot.waiting.push((host.to_owned(), tx));
            !std::mem::replace(&mut slot.running, true)
        };
        if lead {
            // The guard exists before the task does: should the task never
            // run (dropped unpolled at shutdown), the slot goes with it.
            let guard = Ended {
                slots: self.slots.clone(),
                key,
                armed: true,
            };
            let turns = self.turns[usize::from(urgent)].clone();
            tokio::spawn(run(guard, turns, list));
        }
        match rx.await {
            Ok(answer) => answer,
            // The list's task ended without answering (it panicked): the
            // judgement fails and is retried, nothing is judged.
            Err(_) => Err(Error::Kube {
                action: format!("listing pods in {namespace}"),
                source: kube::Error::Service("the shared list of pods ended unanswered".into()),
            }),
        }
    }

    /// How many namespaces have a list under way or waiting.
    #[cfg(test)]
    fn busy(&self) -> usize {
        lock(&self.slots).len()
    }

    /// How many judgements wait for the next list of this namespace.
    #[cfg(test)]
    fn waiting(&self, namespace: &str, urgent: bool) -> usize {
        lock(&self.slots)
            .get(&(namespace.to_owned(), urgent))
            .map_or(0, |s| s.waiting.len())
    }
}

fn lock(slots: &Mutex<HashMap<Key, Slot>>) -> std::sync::MutexGuard<'_, HashMap<Key, Slot>> {
    // A panic elsewhere while the map was held leaves it consistent (each
    // change is one statement): carry on with it.
    slots.lock().unwrap_or_else(|p| p.into_inner())
}

/// Lists for whoever waits on the guard's key, one list after the other,
/// until nobody does.
async fn run<L, F>(mut guard: Ended, turns: Arc<Semaphore>, list: L)
where
    L: Fn(Vec<String>) -> F,
    F: Future<Output = Result<Vec<Vec<Pod>>, Error>>,
{
    loop {
        // The batch is taken once this namespace's turn has come: whoever
        // asked until then is served by this list. (The semaphore is never
        // closed; were it, the list would go without a turn.)
        let _turn = turns.acquire().await.ok();
        let batch: Vec<(String, Reply)> = {
            let mut map = lock(&guard.slots);
            let Some(slot) = map.get_mut(&guard.key) else {
                guard.armed = false;
                return;
            };
            // Who stopped waiting (a reconcile cancelled) needs no list.
            slot.waiting.retain(|(_, reply)| !reply.is_closed());
            if slot.waiting.is_empty() {
                map.remove(&guard.key);
                guard.armed = false;
                return;
            }
            std::mem::take(&mut slot.waiting)
        };
        let hosts = batch.iter().map(|(h, _)| h.clone()).collect();
        let answer = list(hosts).await.and_then(|found| {
            if found.len() == batch.len() {
                Ok(found)
            } else {
                // Never read as "no pod matches" (a held verdict that
                // settles): every waiter fails and judges again.
                Err(Error::Kube {
                    action: format!("listing pods in {}", guard.key.0),
                    source: kube::Error::Service(
                        format!(
                            "the shared list answered {} of {} identities",
                            found.len(),
                            batch.len()
                        )
                        .into(),
                    ),
                })
            }
        });
        match answer {
            Ok(found) => {
                for ((_, reply), pods) in batch.into_iter().zip(found) {
                    let _ = reply.send(Ok(pods));
                }
            }
            Err(e) => {
                for (_, reply) in batch {
                    let _ = reply.send(Err(copy_of(&e)));
                }
            }
        }
    }
}

/// Removes the slot of a list task that ends without doing so itself (a
/// panic in the list, or a task dropped before it ran): its waiters are
/// answered by their dropped replies, and the next judgement starts a list
/// of its own.
struct Ended {
    slots: Arc<Mutex<HashMap<Key, Slot>>>,
    key: Key,
    armed: bool,
}

impl Drop for Ended {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.slots).remove(&self.key);
        }
    }
}

/// Lists the pods of `namespace` once, in pages of 100, and answers for
/// each of `hosts` the pods it names, whole. Each page is read twice at
/// most: first into what naming needs (name, hostname, host network and
/// node) with the rest of each pod skipped unread, then whole only if a pod
/// of it is named, to keep the matches. A judgement among 1,000 pods needs
/// the one or two pods its identity names, not 1,000 built and dropped.
pub async fn naming(
    client: &kube::Client,
    namespace: &str,
    hosts: &[String],
) -> Result<Vec<Vec<Pod>>, Error> {
    use kube::api::ListParams;
    use kube::Resource;
    let what = format!("listing pods in {namespace}");
    let request = kube::core::Request::new(Pod::url_path(&(), Some(namespace)));
    let mut found = vec![Vec::new(); hosts.len()];
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let mut req = request.list(&lp).map_err(|e| Error::Kube {
            action: what.clone(),
            source: kube::Error::BuildRequest(e),
        })?;
        // Named as kube's Api::list names its own (the trace span).
        req.extensions_mut().insert("list");
        let text = crate::call(what.clone(), client.request_text(req)).await?;
        let page: SlimPage = serde_json::from_str(&text).map_err(|e| Error::Kube {
            action: what.clone(),
            source: kube::Error::SerdeError(e),
        })?;
        // (item, host) pairs: which pod of the page each host names.
        let mut named = Vec::new();
        for (i, item) in page.items.into_iter().enumerate() {
            let pod = item.into_pod();
            for (h, host) in hosts.iter().enumerate() {
                if crate::lock::lease::names(host, &pod) {
                    named.push((i, h));
                }
            }
        }
        if !named.is_empty() {
            let whole: kube::core::ObjectList<Pod> =
                serde_json::from_str(&text).map_err(|e| Error::Kube {
                    action: what.clone(),
                    source: kube::Error::SerdeError(e),
                })?;
            for (i, h) in named {
                let Some(pod) = whole.items.get(i) else {
                    return Err(Error::Kube {
                        action: what,
                        source: kube::Error::Service(
                            "a page read whole holds fewer pods than read by name".into(),
                        ),
                    });
                };
                found[h].push(pod.clone());
            }
        }
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(found);
        }
    }
}

/// Pods a page of a judgement's list holds.
const PAGE: u32 = 100;

/// A list page as naming reads it. As in kube's `ObjectList`, `items` must
/// be there (`null` is none): a body without it is not a list, and read as
/// an empty one it would hide a holder.
#[derive(serde::Deserialize)]
struct SlimPage {
    #[serde(default)]
    metadata: SlimListMeta,
    #[serde(deserialize_with = "crate::null_as_empty")]
    items: Vec<SlimPod>,
}

#[derive(Default, serde::Deserialize)]
struct SlimListMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

/// What says which identities a pod answers to; the rest is skipped.
#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct SlimPod {
    metadata: SlimMeta,
    spec: Option<SlimSpec>,
}

#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct SlimMeta {
    name: Option<String>,
    #[serde(rename = "generateName")]
    generate_name: Option<String>,
}

#[derive(Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct SlimSpec {
    hostname: Option<String>,
    host_network: Option<bool>,
    node_name: Option<String>,
}

impl SlimPod {
    /// A pod with just these fields, for `lock::lease::names`.
    fn into_pod(self) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = self.metadata.name;
        pod.metadata.generate_name = self.metadata.generate_name;
        pod.spec = self.spec.map(|s| k8s_openapi::api::core::v1::PodSpec {
            hostname: s.hostname,
            host_network: s.host_network,
            node_name: s.node_name,
            ..Default::default()
        });
        pod
    }
}

/// The same failure for another waiter: an API error keeps its status (a
/// 403 stays a 403 in the metrics), anything else its message.
fn copy_of(e: &Error) -> Error {
    match e {
        Error::Kube { action, source } => Error::Kube {
            action: action.clone(),
            source: match source {
                kube::Error::Api(status) => kube::Error::Api(status.clone()),
                other => kube::Error::Service(crate::error_chain(other).into()),
            },
        },
        Error::Timeout { action, after } => Error::Timeout {
            action: action.clone(),
            after: *after,
        },
        Error::Metrics(m) => Error::Kube {
            action: "listing pods (shared)".into(),
            source: kube::Error::Service(m.to_string().into()),
        },
    }
}

#[cfg(test)]
mod tests;
