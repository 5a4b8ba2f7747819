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

    /// How many namespaces have a list under way or waiting (for tests).
    pub fn busy(&self) -> usize {
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
    #[serde(deserialize_with = "null_as_empty")]
    items: Vec<SlimPod>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<SlimPod>, D::Error> {
    use serde::Deserialize;
    Ok(Option::<Vec<SlimPod>>::deserialize(d)?.unwrap_or_default())
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
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::{mpsc, Semaphore};

    fn pod(name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p
    }

    type Listed = std::pin::Pin<Box<dyn Future<Output = Result<Vec<Vec<Pod>>, Error>> + Send>>;

    /// A lister whose lists each wait for a permit; it reports the hosts
    /// of each list as it starts.
    fn gated(
        gate: Arc<Semaphore>,
        started: mpsc::UnboundedSender<Vec<String>>,
        lists: Arc<AtomicUsize>,
    ) -> impl Fn(Vec<String>) -> Listed + Send + 'static {
        move |hosts: Vec<String>| {
            let (gate, started, lists) = (gate.clone(), started.clone(), lists.clone());
            Box::pin(async move {
                lists.fetch_add(1, Ordering::SeqCst);
                let _ = started.send(hosts.clone());
                gate.acquire().await.unwrap().forget();
                Ok(hosts.iter().map(|h| vec![pod(h)]).collect())
            })
        }
    }

    /// Judgements that ask while a list runs share the next one, never the
    /// one under way; each gets the pods its own identity names.
    #[tokio::test]
    async fn a_list_under_way_is_not_joined_and_the_next_one_is_shared() {
        let lists = PodLists::default();
        let gate = Arc::new(Semaphore::new(0));
        let (tx, mut started) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));

        let first = tokio::spawn({
            let (lists, l) = (
                lists.clone(),
                gated(gate.clone(), tx.clone(), count.clone()),
            );
            async move { lists.named("ns", true, "a", l).await }
        });
        assert_eq!(started.recv().await.unwrap(), vec!["a".to_string()]);

        // Two more ask while the first list runs.
        let mut later = Vec::new();
        for host in ["b", "c"] {
            let (lists, l) = (
                lists.clone(),
                gated(gate.clone(), tx.clone(), count.clone()),
            );
            later.push(tokio::spawn(async move {
                lists.named("ns", true, host, l).await
            }));
        }
        // They are waiting, not listing.
        wait_waiting(&lists, "ns", 2).await;
        assert_eq!(count.load(Ordering::SeqCst), 1, "no second list yet");

        gate.add_permits(1);
        let a = first.await.unwrap().unwrap();
        assert_eq!(a[0].metadata.name.as_deref(), Some("a"));
        // The next list starts for both at once.
        let mut next = started.recv().await.unwrap();
        next.sort();
        assert_eq!(next, vec!["b".to_string(), "c".to_string()]);
        gate.add_permits(1);
        for (h, j) in ["b", "c"].into_iter().zip(later) {
            let got = j.await.unwrap().unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].metadata.name.as_deref(), Some(h));
        }
        assert_eq!(count.load(Ordering::SeqCst), 2);
        // Nobody waits: the slot is gone, and a new judgement lists anew.
        wait_idle(&lists).await;
        let (l, c) = (
            gated(gate.clone(), tx.clone(), count.clone()),
            count.clone(),
        );
        gate.add_permits(1);
        lists.named("ns", true, "d", l).await.unwrap();
        assert_eq!(c.load(Ordering::SeqCst), 3);
    }

    async fn wait_waiting(lists: &PodLists, ns: &str, n: usize) {
        for _ in 0..1000 {
            if lists.waiting(ns, true) == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{n} never waited on {ns}");
    }

    async fn wait_idle(lists: &PodLists) {
        for _ in 0..200 {
            if lists.busy() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the slot was never released");
    }

    /// Other namespaces, and the budgeted client, list on their own.
    #[tokio::test]
    async fn namespaces_and_clients_do_not_share() {
        let lists = PodLists::default();
        let gate = Arc::new(Semaphore::new(0));
        let (tx, mut started) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        let mut jobs = Vec::new();
        for (ns, urgent) in [("x", true), ("y", true), ("x", false)] {
            let (lists, l) = (
                lists.clone(),
                gated(gate.clone(), tx.clone(), count.clone()),
            );
            jobs.push(tokio::spawn(async move {
                lists.named(ns, urgent, "h", l).await
            }));
        }
        for _ in 0..3 {
            started.recv().await.unwrap();
        }
        gate.add_permits(3);
        for j in jobs {
            assert_eq!(j.await.unwrap().unwrap().len(), 1);
        }
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    /// A failed list fails every judgement that waited on it, with its
    /// status; a list that panics answers with an error, and the next
    /// judgement lists again.
    #[tokio::test]
    async fn failures_reach_every_waiter() {
        let lists = PodLists::default();
        let forbidden = |_: Vec<String>| async {
            Err(Error::Kube {
                action: "listing pods in ns".into(),
                source: kube::Error::Api(Box::new(
                    kube::core::Status::failure("no", "Forbidden").with_code(403),
                )),
            })
        };
        let e = lists.named("ns", false, "a", forbidden).await.unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Forbidden);

        let panics = |_: Vec<String>| async {
            if true {
                panic!("a bug in the list");
            }
            Ok(Vec::new())
        };
        let e = lists.named("ns", false, "a", panics).await.unwrap_err();
        assert!(e.to_string().contains("unanswered"), "{e}");
        wait_idle(&lists).await;
        let short = |_: Vec<String>| async { Ok(Vec::new()) };
        let e = lists.named("ns", false, "a", short).await.unwrap_err();
        assert!(e.to_string().contains("answered 0 of 1"), "{e}");
        wait_idle(&lists).await;
        let ok = |h: Vec<String>| async move { Ok(h.iter().map(|h| vec![pod(h)]).collect()) };
        assert_eq!(lists.named("ns", false, "a", ok).await.unwrap().len(), 1);
    }

    /// A list task dropped before it ran (a runtime shutting down) takes
    /// its slot with it: its waiters are answered, and nobody waits on a
    /// slot marked running that no task serves.
    #[tokio::test]
    async fn a_task_that_never_ran_releases_its_slot() {
        let lists = PodLists::default();
        let key = ("ns".to_string(), true);
        let (tx, rx) = oneshot::channel();
        lock(&lists.slots).insert(
            key.clone(),
            Slot {
                running: true,
                waiting: vec![("a".into(), tx)],
            },
        );
        let ok = |h: Vec<String>| async move { Ok(h.iter().map(|h| vec![pod(h)]).collect()) };
        let task = run(
            Ended {
                slots: lists.slots.clone(),
                key,
                armed: true,
            },
            Arc::new(Semaphore::new(1)),
            ok,
        );
        drop(task);
        assert_eq!(lists.busy(), 0);
        assert!(
            rx.await.is_err(),
            "the waiter is answered by a dropped reply"
        );
        assert_eq!(lists.named("ns", true, "a", ok).await.unwrap().len(), 1);
    }

    /// A namespace waiting for its turn gathers every judgement that asks
    /// meanwhile into its one list.
    #[tokio::test]
    async fn a_namespace_waiting_for_its_turn_gathers_judgements() {
        let lists = PodLists::with_turns(1);
        let gate = Arc::new(Semaphore::new(0));
        let (tx, mut started) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        let spawn = |ns: &'static str, host: &'static str| {
            let (lists, l) = (
                lists.clone(),
                gated(gate.clone(), tx.clone(), count.clone()),
            );
            tokio::spawn(async move { lists.named(ns, true, host, l).await })
        };
        let x = spawn("x", "a");
        assert_eq!(started.recv().await.unwrap(), vec!["a".to_string()]);
        let y: Vec<_> = ["b", "c", "d"].into_iter().map(|h| spawn("y", h)).collect();
        wait_waiting(&lists, "y", 3).await;
        assert_eq!(count.load(Ordering::SeqCst), 1, "y waits for its turn");
        gate.add_permits(1);
        x.await.unwrap().unwrap();
        let mut hosts = started.recv().await.unwrap();
        hosts.sort();
        assert_eq!(hosts, ["b", "c", "d"].map(String::from).to_vec());
        gate.add_permits(1);
        for j in y {
            assert_eq!(j.await.unwrap().unwrap().len(), 1);
        }
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    /// A budgeted list that holds its turn (its pages paced by the idle
    /// budget) never holds back a list a death makes necessary.
    #[tokio::test]
    async fn budgeted_lists_take_no_urgent_turn() {
        let lists = PodLists::with_turns(1);
        let gate = Arc::new(Semaphore::new(0));
        let (tx, mut started) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        let budgeted = tokio::spawn({
            let (lists, l) = (
                lists.clone(),
                gated(gate.clone(), tx.clone(), count.clone()),
            );
            async move { lists.named("x", false, "a", l).await }
        });
        started.recv().await.unwrap();
        let ok = |h: Vec<String>| async move { Ok(h.iter().map(|h| vec![pod(h)]).collect()) };
        assert_eq!(lists.named("y", true, "b", ok).await.unwrap().len(), 1);
        gate.add_permits(1);
        budgeted.await.unwrap().unwrap();
    }

    /// A pod read by name alone answers to the same identities as the pod
    /// read whole: its name, its hostname, a long name cut at 63, and a
    /// host-network pod's node.
    #[test]
    fn a_pod_read_by_name_answers_as_the_whole_pod() {
        let long = "x".repeat(70);
        let pods: Vec<Pod> = [
            serde_json::json!({"metadata": {"name": "plain", "managedFields": [{"manager": "k"}]},
                               "spec": {"containers": []}}),
            serde_json::json!({"metadata": {"name": "twin-b"},
                               "spec": {"hostname": "twin", "containers": []}}),
            serde_json::json!({"metadata": {"name": long}, "spec": {"containers": []}}),
            serde_json::json!({"metadata": {"name": "hostnet"},
                               "spec": {"hostNetwork": true, "nodeName": "node-1", "containers": []}}),
            serde_json::json!({"metadata": {"name": "nospec"}}),
            serde_json::json!({"metadata": {"generateName": "gen-"}}),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
        let hosts = [
            "plain".to_string(),
            "twin".into(),
            "twin-b".into(),
            "x".repeat(63),
            long.clone(),
            "hostnet".into(),
            "node-1".into(),
            "nospec".into(),
            "gen-".into(),
            "other".into(),
        ];
        let mut matched = 0;
        for whole in &pods {
            let slim: SlimPod =
                serde_json::from_str(&serde_json::to_string(whole).unwrap()).unwrap();
            let slim = slim.into_pod();
            for h in &hosts {
                let want = crate::lock::lease::names(h, whole);
                matched += usize::from(want);
                assert_eq!(
                    crate::lock::lease::names(h, &slim),
                    want,
                    "{h} / {:?}",
                    whole.metadata.name
                );
            }
        }
        assert!(matched >= 6, "the cases match something: {matched}");
    }
}
