//! ConfigMap locks with holder pods, their holders' deaths and the floor
//! reclaimer, shared by `bench_scale` (simulated control plane) and
//! `bench_node` (the chart's pod on the real node).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use lock_janitor_testenv::kubelet;

use crate::bench_support::*;

/// Concurrent writers when creating locks and killing holders.
pub const WRITERS: usize = 32;
/// The floor reclaimer's user.
pub const FLOOR_USER: &str = "lock-janitor-bench-floor";
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

/// Holder pod `operator-<i>` (Running, on `node_of(i)`) and its opted-in lock.
pub async fn holder_and_lock(client: Client, ns: String, i: usize) -> Made {
    let holder = format!("operator-{i}");
    let pod = running(&client, &ns, &holder, &node_of(i), "operator").await;
    let cm = crate::support::lock_for(&format!("{holder}-lock"), &pod, true);
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
) -> Vec<Made> {
    futures::stream::iter(from..to)
        .map(|i| holder_and_lock(client.clone(), namespaces[i % namespaces.len()].clone(), i))
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

/// Evicts the holders of `seq` one at a time, then of `burst` at once;
/// returns the latencies (status write acknowledged -> lock deleted).
pub async fn reclaim_latency(
    client: &Client,
    deleted: &Mutex<HashMap<String, Instant>>,
    seq: &[Made],
    burst: &[Made],
) -> (Vec<f64>, Vec<f64>) {
    let mut one_by_one = Vec::new();
    for m in seq {
        let acked = evict(client, m).await;
        one_by_one.extend(gone_after(deleted, m, acked).await);
    }
    let acks: Vec<(Made, Instant)> = futures::stream::iter(burst.iter().cloned())
        .map(|m| async move {
            let acked = evict(client, &m).await;
            (m, acked)
        })
        .buffer_unordered(WRITERS)
        .collect()
        .await;
    let mut at_once = Vec::new();
    for (m, acked) in &acks {
        at_once.extend(gone_after(deleted, m, *acked).await);
    }
    (one_by_one, at_once)
}

/// The floor: a bare watcher of terminal pods that deletes each one's lock
/// with the preconditions it was created with. No live reads, no Events.
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

/// A client as `FLOOR_USER`, bound to `role` (the janitor's grants), so
/// that the audit log tells the floor's requests from the benchmark's.
pub async fn floor_client(
    cp: &lock_janitor_testenv::ControlPlane,
    admin: &Client,
    role: &str,
) -> Client {
    crate::support::bind_cluster_role(admin, FLOOR_USER, role).await;
    let kc = kube::config::Kubeconfig::read_from(crate::support::kubeconfig_as(cp, FLOOR_USER))
        .unwrap_or_else(|e| die(&e.to_string()));
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    Client::try_from(config).unwrap_or_else(|e| die(&e.to_string()))
}
