//! ConfigMap locks with holder pods, their holders' deaths and the floor
//! reclaimers (the bare DELETE and the safe floor), shared by `bench_scale`
//! (simulated control plane) and `bench_node` (the chart's pod on the real
//! node).
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use lock_janitor_testenv::kubelet;

use crate::bench::*;

/// Concurrent writers when creating locks and killing holders.
pub const WRITERS: usize = 32;
/// The floor reclaimer's user.
pub const FLOOR_USER: &str = "lock-janitor-bench-floor";
/// The safe floor's user.
pub const SAFE_FLOOR_USER: &str = "lock-janitor-bench-safe-floor";
/// Reclaims the janitor runs side by side for one scope and kind
/// (`CONCURRENCY` in src/controller/mod.rs, the Controller's concurrency;
/// the benchmark's janitor has one scope, the whole cluster).
pub const JANITOR_CONCURRENCY: usize = 16;
/// How long the janitor waits for its intent Event before it goes on
/// (`INTENT_WITHIN` in src/reclaim.rs).
const INTENT_WITHIN: Duration = Duration::from_millis(500);
/// Pods that can no longer run (the janitor's own field selector).
pub const TERMINAL_PODS: &str = "status.phase!=Pending,status.phase!=Running,status.phase!=Unknown";

/// A lock as created: where, whose, and the version a guarded DELETE needs.
#[derive(Clone)]
pub struct Made {
    pub ns: String,
    pub holder: String,
    pub lock: String,
    pub uid: String,
    pub rv: String,
}

/// Holder pod `operator-<i>` (Running, on `node_of(i)`) and its lock,
/// opted in or not (a floor's, which the janitor does not watch).
pub async fn holder_and_lock(client: Client, ns: String, i: usize, opted_in: bool) -> Made {
    let holder = format!("operator-{i}");
    let pod = running(&client, &ns, &holder, &node_of(i), "operator").await;
    let cm = crate::lock_for(&format!("{holder}-lock"), &pod, opted_in);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let made = retry(&format!("creating lock {ns}/{holder}-lock"), || async {
        match cms.create(&PostParams::default(), &cm).await {
            Err(kube::Error::Api(s)) if s.code == 409 => cms.get(&format!("{holder}-lock")).await,
            r => r,
        }
    })
    .await;
    Made {
        lock: made.name_any(),
        uid: made.metadata.uid.unwrap_or_default(),
        rv: made.metadata.resource_version.unwrap_or_default(),
        ns,
        holder,
    }
}

/// Holders and locks `from..to`, spread over `namespaces`.
pub async fn holders_and_locks(
    client: &Client,
    namespaces: &[String],
    from: usize,
    to: usize,
    opted_in: bool,
) -> Vec<Made> {
    futures::stream::iter(from..to)
        .map(|i| {
            let ns = namespaces[i % namespaces.len()].clone();
            holder_and_lock(client.clone(), ns, i, opted_in)
        })
        .buffered(WRITERS)
        .collect()
        .await
}

/// The holder's status write as a kubelet's eviction; when it was acknowledged.
pub async fn evict(client: &Client, m: &Made) -> Instant {
    retry(&format!("evicting {}/{}", m.ns, m.holder), || {
        kubelet::set_failed(
            client,
            &m.ns,
            &m.holder,
            "Evicted",
            "The node was low on resource: memory.",
        )
    })
    .await;
    Instant::now()
}

/// Seconds from `acked` until the watch saw `m`'s lock deleted (None: not
/// within 120 s).
pub async fn gone_after(
    deleted: &Mutex<HashMap<String, Instant>>,
    m: &Made,
    acked: Instant,
) -> Option<f64> {
    let key = format!("{}/{}", m.ns, m.lock);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(at) = deleted.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Some(if *at >= acked {
                (*at - acked).as_secs_f64()
            } else {
                -(acked - *at).as_secs_f64()
            });
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Evicts the holders of `seq` one at a time, each after the last one's
/// lock was deleted; the latencies (status write acknowledged -> lock
/// deleted, as the watch here sees it).
pub async fn one_at_a_time(
    client: &Client,
    deleted: &crate::bench::Deletions,
    seq: &[Made],
) -> Vec<f64> {
    let mut latencies = Vec::new();
    for m in seq {
        let acked = evict(client, m).await;
        latencies.extend(gone_after(deleted, m, acked).await);
    }
    latencies
}

/// Evicts the holders of `burst` at once; the latencies, as
/// `one_at_a_time`'s. A lock not deleted within 120 s has none.
pub async fn at_once(
    client: &Client,
    deleted: &crate::bench::Deletions,
    burst: &[Made],
) -> Vec<f64> {
    let acks: Vec<(Made, Instant)> = futures::stream::iter(burst.iter().cloned())
        .map(|m| async move {
            let acked = evict(client, &m).await;
            (m, acked)
        })
        .buffer_unordered(WRITERS)
        .collect()
        .await;
    let mut latencies = Vec::new();
    for (m, acked) in &acks {
        latencies.extend(gone_after(deleted, m, *acked).await);
    }
    latencies
}

/// The bare-DELETE floor: a bare watcher of terminal pods that deletes each
/// one's lock with the preconditions it was created with, one after the
/// other. No live reads, no Events.
pub fn floor_deleter(
    client: &Client,
    locks: HashMap<(String, String), Made>,
) -> tokio::task::JoinHandle<()> {
    let client = client.clone();
    tokio::spawn(async move {
        let api: Api<PartialObjectMeta<Pod>> = Api::all(client.clone());
        let stream = watcher(api, watcher::Config::default().fields(TERMINAL_PODS));
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev else {
                continue;
            };
            let Some(m) = locks.get(&(p.namespace().unwrap_or_default(), p.name_any())) else {
                continue;
            };
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(m.uid.clone()),
                    resource_version: Some(m.rv.clone()),
                }),
                ..Default::default()
            };
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &m.ns);
            let _ = cms.delete(&m.lock, &dp).await;
        }
    })
}

/// What the safe floor did that was not a reclaim.
#[derive(Default)]
pub struct SafeFloorMisses {
    /// A live read found the lock gone, or its holder not dead or not the
    /// lock's: nothing written.
    pub skipped: AtomicUsize,
    /// A request failed (or the DELETE was refused): no reclaim.
    pub failed: AtomicUsize,
    /// Intent Events refused or not answered within `INTENT_WITHIN` (the
    /// reclaim went on, as the janitor's does).
    pub events_failed: AtomicUsize,
}

/// The safe floor: a bare client making exactly the requests the janitor
/// must make for a reclaim, in the janitor's order, and no others. For each
/// terminal pod its watch shows (each once), the pod's lock: a live GET of
/// the lock; a live GET of the holder; the intent Event (events.k8s.io, a
/// `StaleLockReclaiming` on the lock, the holder related, through kube's
/// `Recorder` as the janitor writes it, waited for `INTENT_WITHIN` at
/// most); the holder read again (the last request before the write); the
/// DELETE with the uid and resourceVersion of the lock as read.
/// `JANITOR_CONCURRENCY` reclaims at a time, the watch read on meanwhile
/// into a queue, as the janitor's Controller does. Its connections are
/// opened as its requests need them, as the janitor's are (HTTP/1.1: a
/// request in flight holds one; idle ones close after 90 s), not before:
/// the first burst after one-at-a-time reclaims pays the same TLS
/// handshakes for both. Its judgement is the least that reads can decide: the holder is
/// the pod the lock's owner reference names (its uid) and is Failed or
/// Succeeded; else nothing is written (counted in `skipped`).
pub fn safe_floor_deleter(
    client: &Client,
    locks: HashMap<(String, String), Made>,
) -> (tokio::task::JoinHandle<()>, Arc<SafeFloorMisses>) {
    let client = client.clone();
    let misses = Arc::new(SafeFloorMisses::default());
    let task = {
        let misses = misses.clone();
        tokio::spawn(async move {
            let (tx, rx) = futures::channel::mpsc::unbounded::<Made>();
            let api: Api<PartialObjectMeta<Pod>> = Api::all(client.clone());
            // One task with the workers: aborting it ends the watch too.
            let watch = async move {
                let stream = watcher(api, watcher::Config::default().fields(TERMINAL_PODS));
                futures::pin_mut!(stream);
                let mut queued = HashSet::new();
                while let Some(ev) = stream.next().await {
                    let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev else {
                        continue;
                    };
                    let key = (p.namespace().unwrap_or_default(), p.name_any());
                    if let Some(m) = locks.get(&key) {
                        if queued.insert(key) && tx.unbounded_send(m.clone()).is_err() {
                            return;
                        }
                    }
                }
            };
            let recorder = Recorder::new(
                client.clone(),
                Reporter {
                    controller: SAFE_FLOOR_USER.into(),
                    instance: None,
                },
            );
            let work = rx.for_each_concurrent(JANITOR_CONCURRENCY, |m| {
                let (client, recorder, misses) = (client.clone(), recorder.clone(), misses.clone());
                async move {
                    match safe_reclaim(&client, &recorder, &m, &misses.events_failed).await {
                        Ok(true) => {}
                        Ok(false) => {
                            misses.skipped.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            eprintln!("safe floor: {}/{}: {e}", m.ns, m.lock);
                            misses.failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
            futures::join!(watch, work);
        })
    };
    (task, misses)
}

/// Whether `pod` is the dead pod `cm`'s owner reference names.
fn dead_holder(cm: &ConfigMap, pod: Option<&Pod>) -> bool {
    let Some(pod) = pod else { return false };
    let owner = cm.owner_references().iter().find(|o| o.kind == "Pod");
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    owner.map(|o| o.uid.as_str()) == pod.metadata.uid.as_deref()
        && matches!(phase, Some("Failed" | "Succeeded"))
}

/// One reclaim of the safe floor (see `safe_floor_deleter`): true if the
/// lock was deleted, false if a read stopped it.
async fn safe_reclaim(
    client: &Client,
    recorder: &Recorder,
    m: &Made,
    events_failed: &AtomicUsize,
) -> kube::Result<bool> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &m.ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &m.ns);
    let Some(cm) = cms.get_opt(&m.lock).await? else {
        return Ok(false);
    };
    let holder = pods.get_opt(&m.holder).await?;
    if !dead_holder(&cm, holder.as_ref()) {
        return Ok(false);
    }
    let note = format!(
        "Deleting this lock: holder pod {} was evicted (it can never run again). \
         Reclaimed by the safe floor of bench-scale.",
        m.holder
    );
    intent(
        recorder,
        &cm.object_ref(&()),
        holder.as_ref(),
        note,
        events_failed,
    )
    .await;
    let again = pods.get_opt(&m.holder).await?;
    if !dead_holder(&cm, again.as_ref()) {
        return Ok(false);
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: cm.metadata.uid.clone(),
            resource_version: cm.metadata.resource_version.clone(),
        }),
        ..Default::default()
    };
    cms.delete(&m.lock, &dp).await?;
    Ok(true)
}

/// A safe floor's intent Event (`StaleLockReclaiming` on the lock, the
/// holder related, through kube's `Recorder` as the janitor writes it):
/// waited for `INTENT_WITHIN` at most, never required, as the janitor's;
/// one refused or not answered counts in `failed`.
pub(crate) async fn intent(
    recorder: &Recorder,
    regarding: &ObjectReference,
    holder: Option<&Pod>,
    note: String,
    failed: &AtomicUsize,
) {
    let intent = Event {
        type_: EventType::Normal,
        reason: "StaleLockReclaiming".into(),
        note: Some(note),
        action: "Reclaim".into(),
        secondary: holder.map(|p| ObjectReference {
            resource_version: None,
            ..p.object_ref(&())
        }),
    };
    let published = tokio::time::timeout(INTENT_WITHIN, recorder.publish(&intent, regarding)).await;
    if !matches!(published, Ok(Ok(()))) {
        failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// A client as `user`, bound to `role` (the janitor's grants), so that the
/// audit log tells a floor's requests from the benchmark's.
pub async fn floor_client(
    cp: &lock_janitor_testenv::ControlPlane,
    admin: &Client,
    user: &str,
    role: &str,
) -> Client {
    crate::bind_cluster_role(admin, user, role).await;
    let kc = kube::config::Kubeconfig::read_from(crate::kubeconfig_as(cp, user))
        .unwrap_or_else(|e| die(&e.to_string()));
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    Client::try_from(config).unwrap_or_else(|e| die(&e.to_string()))
}
