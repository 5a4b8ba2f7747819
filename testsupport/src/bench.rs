//! Helpers shared by the benchmarks (`bench_janitor`, `bench_scale`):
//! retried setup writes, holder pods, process memory, distributions.
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::ResourceExt;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use lock_janitor_testenv::kubelet;

/// Nodes the pods are bound to (created up front; `create_pod` reuses them).
pub const NODES: usize = 8;

pub fn die(msg: &str) -> ! {
    // The example's name, as its binary is named (`bench_scale`).
    let name = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    eprintln!("{name}: {msg}");
    std::process::exit(2);
}

/// A flag's whole seconds as a Duration (`--idle-secs 60`).
pub fn seconds(v: &str) -> Result<Duration, String> {
    v.parse()
        .map(Duration::from_secs)
        .map_err(|_| format!("{v:?} is not a number"))
}

/// `--lease-namespaces own|locks`: whether the Lease holders live among
/// the ConfigMap holders.
pub fn own_or_locks(v: &str) -> Result<bool, String> {
    match v {
        "own" => Ok(false),
        "locks" => Ok(true),
        v => Err(format!("{v:?} is neither own nor locks")),
    }
}

pub fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

pub fn step(msg: &str) {
    println!("\n==> {msg}");
}

/// Retries an API call a few times (a busy 2-core apiserver may answer 429
/// or time out); gives up with a message.
pub async fn retry<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        match f().await {
            Ok(v) => return v,
            Err(e) if attempt < 6 => {
                eprintln!("retrying {what}: {e}");
                tokio::time::sleep(Duration::from_millis(250 * attempt)).await;
            }
            Err(e) => die(&format!("{what}: {e}")),
        }
    }
}

pub fn node_of(i: usize) -> String {
    format!("bench-node-{}", i % NODES)
}

/// A pod bound to a bench node, then Running (a retried create that finds
/// the pod already there goes on with it).
pub async fn running(client: &Client, ns: &str, name: &str, node: &str, app: &str) -> Pod {
    retry(&format!("creating pod {ns}/{name}"), || async move {
        match kubelet::create_pod(client, ns, name, node, &[("app", app)]).await {
            Err(kube::Error::Api(s)) if s.code == 409 => {
                Api::<Pod>::namespaced(client.clone(), ns).get(name).await
            }
            r => r,
        }
    })
    .await;
    retry(&format!("pod {ns}/{name} Running"), || {
        kubelet::set_running(client, ns, name)
    })
    .await
}

/// VmRSS, VmHWM and RssAnon of a process, in KiB.
#[derive(Clone, Copy, Default)]
pub struct Mem {
    pub rss: u64,
    pub hwm: u64,
    pub anon: u64,
}

pub fn mem(pid: u32) -> Mem {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| die(&format!("reading /proc/{pid}/status: {e}")));
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Mem {
        rss: field("VmRSS:"),
        hwm: field("VmHWM:"),
        anon: field("RssAnon:"),
    }
}

pub fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// min / median / p90 / max of a sample, in seconds.
pub fn distribution(v: Vec<f64>) -> String {
    distribution_of(v, "s", 3)
}

/// min / median / p90 / max of a count (requests, say).
pub fn counts(v: Vec<f64>) -> String {
    distribution_of(v, "", 0)
}

/// The `q` quantile of a sorted, non-empty sample (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// median / p99 / max of a sample in seconds, as "0.123 / 0.456 / 0.789 s (n)".
pub fn median_p99_max(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| quantile(&v, q);
    format!(
        "{:.3} / {:.3} / {:.3} s (n={})",
        at(0.5),
        at(0.99),
        v[v.len() - 1],
        v.len()
    )
}

/// The p99 of a sample (nearest rank); None if it is empty.
pub fn p99(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| quantile(&v, 0.99))
}

/// `a / b` as "1.23x", or "-" when either is missing or b is 0.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

fn distribution_of(mut v: Vec<f64>, unit: &str, digits: usize) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| quantile(&v, q);
    format!(
        "n={}  min {:.d$}{unit}  median {:.d$}{unit}  p90 {:.d$}{unit}  max {:.d$}{unit}",
        v.len(),
        v[0],
        at(0.5),
        at(0.9),
        v[v.len() - 1],
        d = digits
    )
}

/// When each lock was seen deleted, by "ns/name".
pub type Deletions = Arc<Mutex<HashMap<String, Instant>>>;

/// Lock deletions as this process sees them, by "ns/name".
pub fn watch_deletions(
    client: &Client,
    selector: &str,
) -> (
    Deletions,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let deleted: Deletions = Arc::default();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = {
        let deleted = deleted.clone();
        let api: Api<PartialObjectMeta<ConfigMap>> = Api::all(client.clone());
        let config = watcher::Config::default().labels(selector);
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let stream = watcher(api, config);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Delete(cm)) => {
                        let key =
                            format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any());
                        deleted
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key, Instant::now());
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    _ => {}
                }
            }
        })
    };
    (deleted, task, rx)
}

/// A control plane for a benchmark: the janitor's grants, `NODES` nodes,
/// and `namespaces` fresh namespaces named after `prefix`.
pub async fn bench_plane(
    prefix: &str,
    namespaces: usize,
) -> (
    lock_janitor_testenv::ControlPlane,
    Client,
    std::path::PathBuf,
    Vec<String>,
) {
    let cp = lock_janitor_testenv::ControlPlane::start(lock_janitor_testenv::Options::default())
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    let client = cp.client().await.unwrap_or_else(|e| die(&e.to_string()));
    crate::grant_janitor(&client).await;
    let kubeconfig = crate::kubeconfig_as(&cp, crate::JANITOR_USER);
    for n in 0..NODES {
        let node = node_of(n);
        retry("creating a node", || kubelet::create_node(&client, &node)).await;
    }
    let mut out = Vec::new();
    for i in 0..namespaces {
        out.push(lock_janitor_testenv::fresh_namespace(&client, &format!("{prefix}-{i}")).await);
    }
    (cp, client, kubeconfig, out)
}

/// Requests of the API server's audit log counted by verb and resource
/// (with its subresource): "3 get pods, 1 update leases/status", or
/// "none".
pub fn by_verb<'a>(
    events: impl Iterator<Item = &'a lock_janitor_testenv::audit::AuditEvent>,
) -> String {
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for e in events {
        let what = format!(
            "{} {}{}",
            e.verb,
            e.resource.as_deref().unwrap_or("-"),
            e.subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default()
        );
        *by.entry(what).or_default() += 1;
    }
    if by.is_empty() {
        return "none".into();
    }
    let all: Vec<String> = by.into_iter().map(|(w, n)| format!("{n} {w}")).collect();
    all.join(", ")
}
