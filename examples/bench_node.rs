//! `make bench-node`: the janitor as deployed, in one run on the real node
//! (docs/real-node.md): the chart installed with its shipped values
//! (its shipped resources, two replicas, election on) from the
//! node's imported image, watching `--locks` opted-in ConfigMap locks whose
//! holders are pods bound to cordoned simulated nodes (their status written
//! here, as a kubelet would). Then bursts of holder deaths (`--bursts`) and a
//! burst of Lease holders failing at once (`--lease-burst`; in namespaces of
//! their own, or among the lock holders, 1,000 pods a namespace, with
//! `--lease-namespaces locks`), each reclaimed
//! by, in turn on fresh locks: (a) the chart's leading pod; (b) the same
//! static binary as a bare process on the host with the Deployment's own
//! flags (the chart scaled to 0 first); (c) the floor, a bare terminal-pod
//! watcher sending one guarded DELETE per death. Prints reclaim latency
//! (median, p99, max) side by side, the leading pod's CPU throttling
//! (cgroup v1 `cpu.stat` of its container) over each burst, and its memory
//! peak (`memory.max_usage_in_bytes`, VmHWM) against its limit, including a
//! re-list of its lock watches after the API server restarts. Then real
//! kubelet evictions (`--evictions`): the real operator-lib operator (a
//! leader and a replica) runs on the real node in that many namespaces, the
//! kubelet is put under memory pressure and evicts their pods; each evicted
//! leader's lock is timed from the pod's end (Failed or Succeeded, as a pod
//! watch here sees it) to the lock's deletion, with who deleted it (the
//! chart's janitor, or operator-lib), and the chart's own pods the kubelet
//! evicted too are listed: once as shipped, once with a PriorityClass of
//! 1,000,000 (`priorityClassName`, as values.yaml advises).
//! It reports numbers; it fails only if something breaks.
//!
//! ```text
//! make bench-node [BENCH_NODE_ARGS="--locks 500 --bursts 20,50 --lease-burst 20 --lease-namespaces own|locks --evictions 3"]
//! ```
//!
//! Needs root, `make node-build` and the static janitor (`make janitor-musl`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{Api, Client, ResourceExt};
use lock_janitor_testenv::kubelet;
use lock_janitor_testsupport::bench::*;
use lock_janitor_testsupport::lease_burst;
use lock_janitor_testsupport::real_node::{self, RealNode};
use lock_janitor_testsupport::reclaim::*;
use lock_janitor_testsupport::*;

const RELEASE: &str = "lock-janitor";
const LOCK_NAMESPACES: usize = 10;

/// The chart's janitor on the real node (see the file's doc).
#[derive(clap::Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Locks in all.
    #[arg(long, default_value_t = 10_000)]
    locks: usize,
    /// Holders evicted at once, one burst for each, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    bursts: Vec<usize>,
    /// Lease holders that fail at once (0: none).
    #[arg(long = "lease-burst", default_value_t = 100)]
    lease_burst: usize,
    /// `locks`: the Lease holders live among the ConfigMap holders (1,000
    /// pods a namespace at 10,000 locks); `own`: in namespaces of their own.
    #[arg(long = "lease-namespaces", value_name = "own|locks", default_value = "own", value_parser = own_or_locks, action = clap::ArgAction::Set)]
    leases_among_locks: bool,
    /// Namespaces with a real operator whose pods the kubelet evicts.
    #[arg(long, default_value_t = 3)]
    evictions: usize,
}

fn parse_args() -> Args {
    let a = <Args as clap::Parser>::parse();
    if a.locks < 3 * a.bursts.iter().sum::<usize>() {
        die("need --locks >= 3 x the sum of --bursts (each reclaimer gets fresh locks)");
    }
    a
}

/// Gives up once the node runs: a panic, so that the node and the control
/// plane are stopped on the way out (`die` exits without that).
fn fail(msg: &str) -> ! {
    panic!("{msg}")
}

/// The chart's janitor container: its pod, and its cgroups (v1) on the node.
struct Pod1 {
    name: String,
    ip: String,
    restarts: i32,
    cpu: PathBuf,
    memory: PathBuf,
}

/// A cgroup directory named `id` under `root`, depth first.
fn find_dir(root: &Path, id: &str, depth: usize) -> Option<PathBuf> {
    for e in std::fs::read_dir(root).ok()?.flatten() {
        let p = e.path();
        if !p.is_dir() {
            continue;
        }
        if e.file_name().to_string_lossy().contains(id) {
            return Some(p);
        }
        if depth > 0 {
            if let Some(f) = find_dir(&p, id, depth - 1) {
                return Some(f);
            }
        }
    }
    None
}

async fn leader_pod(n: &RealNode, sys: &str) -> Pod1 {
    let name = wait_for("the chart's leader", Duration::from_secs(120), || async {
        n.janitor_leader(sys, RELEASE).await
    })
    .await;
    let pod = Api::<Pod>::namespaced(n.client.clone(), sys)
        .get(&name)
        .await
        .unwrap_or_else(|e| fail(&format!("get pod {name}: {e}")));
    let st = pod.status.unwrap_or_default();
    let cs = st
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .next()
        .unwrap_or_else(|| fail(&format!("{name}: no container status")));
    let id = cs
        .container_id
        .as_deref()
        .and_then(|c| c.split("://").nth(1))
        .unwrap_or_else(|| fail(&format!("{name}: no container id")))
        .to_owned();
    // cgroup v1: cpu and cpuacct mounted together or apart.
    let find = |ctrls: &[&str]| {
        ctrls
            .iter()
            .find_map(|c| find_dir(&Path::new("/sys/fs/cgroup").join(c), &id, 5))
            .unwrap_or_else(|| {
                fail(&format!(
                    "no cgroup of container {id} under /sys/fs/cgroup/{ctrls:?}"
                ))
            })
    };
    Pod1 {
        ip: st.pod_ip.unwrap_or_default(),
        restarts: cs.restart_count,
        cpu: find(&["cpu,cpuacct", "cpu"]),
        memory: find(&["memory"]),
        name,
    }
}

fn read_u64(p: &Path) -> u64 {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// `cpu.stat`: (nr_periods, nr_throttled, throttled_time ns).
fn cpu_stat(pod: &Pod1) -> (u64, u64, u64) {
    let text = std::fs::read_to_string(pod.cpu.join("cpu.stat")).unwrap_or_default();
    let f = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
            .unwrap_or(0)
    };
    (f("nr_periods "), f("nr_throttled "), f("throttled_time "))
}

/// The container's memory: (max_usage, usage, limit) in bytes, and VmHWM
/// / VmRSS of its process in KiB (0 if unreadable).
struct PodMem {
    max_usage: u64,
    usage: u64,
    limit: u64,
    hwm: u64,
    rss: u64,
    anon: u64,
}

fn pod_mem(pod: &Pod1) -> PodMem {
    let pid = std::fs::read_to_string(pod.memory.join("cgroup.procs"))
        .ok()
        .and_then(|s| s.lines().next()?.trim().parse::<u32>().ok());
    let m = pid
        .filter(|p| Path::new(&format!("/proc/{p}/status")).exists())
        .map(mem)
        .unwrap_or_default();
    PodMem {
        max_usage: read_u64(&pod.memory.join("memory.max_usage_in_bytes")),
        usage: read_u64(&pod.memory.join("memory.usage_in_bytes")),
        limit: read_u64(&pod.memory.join("memory.limit_in_bytes")),
        hwm: m.hwm,
        rss: m.rss,
        anon: m.anon,
    }
}

fn show_mem(what: &str, m: &PodMem) -> String {
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    format!(
        "{what}: max_usage {:.1} MiB ({:.0} % of the {:.0} MiB limit), usage {:.1} MiB, VmHWM {} MiB, VmRSS {} MiB (RssAnon {} MiB)",
        mb(m.max_usage),
        100.0 * m.max_usage as f64 / m.limit.max(1) as f64,
        mb(m.limit),
        mb(m.usage),
        mib(m.hwm),
        mib(m.rss),
        mib(m.anon)
    )
}

/// The pod's metrics, straight from its IP (the host routes to the bridge).
async fn pod_metrics(pod: &Pod1) -> String {
    http_get_from(&pod.ip, 8080, "/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default()
}

fn held(metrics: &str, kind: &str) -> usize {
    sample(
        metrics,
        "lock_janitor_locks",
        &[("kind", kind), ("state", "held")],
    )
    .unwrap_or(0.0) as usize
}

/// Kills the holders of `burst` at once; the latencies (status write
/// acknowledged -> lock deleted, as the watch here sees it).
async fn burst(client: &Client, deleted: &Deletions, locks: &[Made]) -> Vec<f64> {
    let at_once = at_once(client, deleted, locks).await;
    if at_once.len() < locks.len() {
        println!(
            "    {} of {} locks NOT reclaimed within 120 s",
            locks.len() - at_once.len(),
            locks.len()
        );
    }
    at_once
}

/// A Lease burst: `n` holders renew, `held` says when the reclaimer
/// counts them all, then all fail at once; `floor`: released by the bare
/// releaser instead. Latencies from "the rule allows it" to the release.
async fn lease_burst_for<F, Fut>(
    client: &Client,
    namespaces: &[String],
    prefix: &str,
    n: usize,
    floor: bool,
    held: F,
) -> Vec<f64>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let hs = lease_burst::holders(client, namespaces, prefix, n, !floor).await;
    let (released, watch, synced) = lease_burst::watch_releases(client);
    let _ = synced.await;
    let renewer = lease_burst::Renewer::start(client, &hs);
    if !floor {
        let t = Instant::now();
        while held().await < n {
            if t.elapsed() > Duration::from_secs(300) {
                fail(&format!("{prefix}: {n} Leases not held within 300 s"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    renewer.rounds(5).await;
    let renewed = renewer.stop().await;
    let allowed = lease_burst::fail_all(client, &hs, &renewed).await;
    if floor {
        let refused =
            lease_burst::bare_releases(client, &allowed, lock_janitor::lock::lease::released).await;
        if refused > 0 {
            println!("    the bare releaser was refused {refused} times");
        }
    }
    let out = lease_burst::release_latencies(&released, &allowed, Duration::from_secs(120)).await;
    watch.abort();
    out
}

/// A leader the kubelet evicted, and what became of its lock.
struct Evicted {
    ns: String,
    leader: String,
    /// Its end (Failed or Succeeded, as a pod watch here sees it) to its lock's
    /// deletion (as the lock watch here sees it).
    latency: Option<f64>,
    /// Who deleted the lock (the audit log's user).
    deleter: String,
}

const PRIORITY_CLASS_NAME: &str = "lock-janitor-bench";
const PRIORITY_CLASS: &str = r#"{"apiVersion":"scheduling.k8s.io/v1","kind":"PriorityClass",
"metadata":{"name":"lock-janitor-bench"},"value":1000000,
"description":"lock-janitor in make bench-node: kept under the pressure that evicts the leaders it cleans up after"}"#;

/// A pod that ended: Failed, or Succeeded (an evicted container that exits
/// 0 on the kubelet's signal leaves its pod Succeeded; see real-node.md).
fn ended(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

/// Puts the kubelet under memory pressure (a threshold 1 GiB under the
/// memory available, and a Guaranteed pod of 2 GiB, the hog) until it has
/// evicted the leader of every namespace in `evict_ns`, their locks are
/// gone and it has evicted the hog too (or 300 s), then lifts it. The
/// leaders evicted, and the chart's own pods (in `sys`) the kubelet
/// evicted meanwhile.
async fn kubelet_evictions(
    n: &RealNode,
    evict_ns: &[String],
    sys: &str,
) -> (Vec<Evicted>, Vec<String>) {
    let client = n.client.clone();
    let chart_failed = || async {
        n.pods(sys, "app.kubernetes.io/name=lock-janitor")
            .await
            .into_iter()
            .filter(ended)
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    };
    let failed_before = chart_failed().await;
    // The lock deletes in the audit log so far: the first one after them is
    // this round's.
    let deletes_before: HashMap<String, usize> = evict_ns
        .iter()
        .map(|ns| (ns.clone(), lock_deletes(n, ns).len()))
        .collect();
    let mut leaders = Vec::new();
    for ns in evict_ns {
        let leader = n
            .owner(ns)
            .await
            .unwrap_or_else(|| fail(&format!("no lock in {ns}")));
        leaders.push((ns.clone(), leader));
    }
    // When each pod ended and each lock was first deleted, as
    // watches here see them.
    let (failed, gone, watches) = watch_ends(&client, evict_ns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    press_until_evicted(n, &leaders, &failed, &gone).await;
    for w in watches {
        w.abort();
    }
    let lost: Vec<String> = chart_failed()
        .await
        .into_iter()
        .filter(|p| !failed_before.contains(p))
        .collect();
    let (f, g) = (failed.lock().unwrap().clone(), gone.lock().unwrap().clone());
    let evicted = leaders
        .into_iter()
        .filter_map(|(ns, leader)| {
            let at = *f.get(&format!("{ns}/{leader}"))?;
            let deleter = lock_deletes(n, &ns)
                .into_iter()
                .nth(deletes_before.get(&ns).copied().unwrap_or(0))
                .unwrap_or_else(|| "-".into());
            Some(Evicted {
                latency: g
                    .get(&ns)
                    .map(|g| g.saturating_duration_since(at).as_secs_f64()),
                ns,
                leader,
                deleter,
            })
        })
        .collect();
    (evicted, lost)
}

/// When each pod ended or each lock was first deleted (by key), as a watch
/// here saw it.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

/// The deleters (users) of the lock in `ns`, in the audit log's order.
fn lock_deletes(n: &RealNode, ns: &str) -> Vec<String> {
    n.audit()
        .into_iter()
        .filter(|e| {
            e.verb == "delete"
                && e.code == Some(200)
                && e.namespace.as_deref() == Some(ns)
                && e.resource.as_deref() == Some("configmaps")
                && e.name.as_deref() == Some(real_node::LOCK)
        })
        .map(|e| e.effective_user().to_owned())
        .collect()
}

/// Watches of the pods that end and of the lock's first delete in each
/// namespace of `evict_ns`.
fn watch_ends(
    client: &Client,
    evict_ns: &[String],
) -> (Seen, Seen, Vec<tokio::task::JoinHandle<()>>) {
    use futures::StreamExt;
    use kube::runtime::{watcher, WatchStreamExt};
    let (failed, gone): (Seen, Seen) = Default::default();
    let mut watches = Vec::new();
    for ns in evict_ns {
        let (failed, api) = (failed.clone(), Api::<Pod>::namespaced(client.clone(), ns));
        watches.push(tokio::spawn(async move {
            let pods = watcher(api, watcher::Config::default()).applied_objects();
            futures::pin_mut!(pods);
            while let Some(p) = pods.next().await {
                let Ok(p) = p else { continue };
                if ended(&p) {
                    let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
                    failed
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_insert_with(Instant::now);
                }
            }
        }));
        let (gone, api) = (
            gone.clone(),
            Api::<ConfigMap>::namespaced(client.clone(), ns),
        );
        watches.push(tokio::spawn(async move {
            let config =
                watcher::Config::default().fields(&format!("metadata.name={}", real_node::LOCK));
            let cms = watcher(api, config);
            futures::pin_mut!(cms);
            while let Some(ev) = cms.next().await {
                if let Ok(watcher::Event::Delete(cm)) = ev {
                    let key = cm.namespace().unwrap_or_default();
                    gone.lock().unwrap().entry(key).or_insert_with(Instant::now);
                }
            }
        }));
    }
    (failed, gone, watches)
}

/// Memory pressure on the node (a 1 GiB threshold under what is available,
/// a 2 GiB hog) until every leader ended and its lock is gone and the hog
/// was evicted too (at most 300 s); prints the kubelet's eviction order,
/// then deletes the hog and puts the threshold back.
async fn press_until_evicted(
    n: &RealNode,
    leaders: &[(String, String)],
    failed: &Seen,
    gone: &Seen,
) {
    let hog_ns = n.namespace("bench-hog").await;
    let avail = RealNode::memory_available_mib();
    n.node
        .set_memory_available(&format!("{}Mi", avail.saturating_sub(1024)))
        .await
        .unwrap_or_else(|e| fail(&format!("kubelet eviction threshold: {e}")));
    n.hog(&hog_ns, "hog", 2048);
    let t = Instant::now();
    let hogs = Api::<Pod>::namespaced(n.client.clone(), &hog_ns);
    // Until every leader's lock is gone and the kubelet has evicted the hog
    // too (the pressure ends with it): which pods it ranked before the hog.
    loop {
        let done = {
            let (f, g) = (failed.lock().unwrap(), gone.lock().unwrap());
            leaders
                .iter()
                .all(|(ns, l)| f.contains_key(&format!("{ns}/{l}")) && g.contains_key(ns))
        };
        let hog_ended = matches!(hogs.get_opt("hog").await, Ok(None))
            || matches!(hogs.get_opt("hog").await, Ok(Some(p)) if ended(&p));
        if (done && hog_ended) || t.elapsed() > Duration::from_secs(300) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let order: Vec<String> = n
        .node
        .kubelet_log()
        .lines()
        .filter(|l| l.contains("pod is evicted successfully"))
        .filter_map(|l| l.split("pod=\"").nth(1)?.split('"').next())
        .filter_map(|p| p.split('/').nth(1).map(str::to_owned))
        .collect();
    println!(
        "    evictions over after {}; the kubelet evicted, in order: {order:?}",
        secs(t.elapsed())
    );
    n.kubectl(
        &[
            "delete",
            "pod",
            "-n",
            &hog_ns,
            "hog",
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    n.node
        .set_memory_available("100Mi")
        .await
        .unwrap_or_else(|e| fail(&format!("kubelet eviction threshold back: {e}")));
}

/// The node's load average (1, 5, 15 min).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A row of the latency table: what, then the pod's, the bare process's
/// and the floor's latencies.
type Row = (String, Vec<f64>, Vec<f64>, Vec<f64>);

struct Throttle {
    periods: u64,
    throttled: u64,
    time: Duration,
}

fn throttled_over(before: (u64, u64, u64), after: (u64, u64, u64)) -> Throttle {
    Throttle {
        periods: after.0.saturating_sub(before.0),
        throttled: after.1.saturating_sub(before.1),
        time: Duration::from_nanos(after.2.saturating_sub(before.2)),
    }
}

fn show_throttle(t: &Throttle) -> String {
    format!(
        "{} of {} periods throttled, {:.2} s",
        t.throttled,
        t.periods,
        t.time.as_secs_f64()
    )
}

#[tokio::main]
async fn main() {
    let run = Instant::now();
    let args = parse_args();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!(
        "bench_node: {} locks, bursts {:?}, {} Leases ({}); bare janitor {}; commit {commit}; load {}",
        args.locks,
        args.bursts,
        args.lease_burst,
        if args.leases_among_locks {
            "among the lock holders"
        } else {
            "in namespaces of their own"
        },
        janitor_bin().display(),
        loadavg()
    );
    let (n, client, kubeconfig, beat) = start_node().await;
    let sp = namespaces(&n, &args).await;
    let (per, deleted, watch) = stage_locks(&client, &sp.lock_ns, &args).await;
    let chart = chart_phase(&n, &client, &args, &sp, &deleted, &per[0]).await;
    let remaining = args.locks - per[0].iter().map(Vec::len).sum::<usize>();
    let mut throttles = chart.throttles;
    let (relist_note, after_relist) =
        relist_phase(&n, &client, &sp, &chart.pod, remaining, &mut throttles).await;
    let eviction_rounds = eviction_rounds(&n, &sp).await;
    let (bare_lat, bare_lease, bare_mem) = bare_phase(
        &n,
        &client,
        &kubeconfig,
        &args,
        &sp,
        &deleted,
        &per[1],
        remaining,
    )
    .await;
    let (floor_lat, floor_lease) = floor_phase(&n, &client, &args, &sp, &deleted, &per[2]).await;
    watch.abort();
    beat.abort();

    let table = latency_rows(
        &args,
        [&chart.lat, &bare_lat, &floor_lat],
        [chart.lease, bare_lease, floor_lease],
    );
    print_latencies(&args, &commit, &table);
    print_evictions(&eviction_rounds, sp.evict_ns.len());
    print_throttles(&throttles);
    let mems = [&chart.started, &chart.after_bursts, &after_relist];
    print_memory(&args, mems, &bare_mem, &relist_note);
    print_goals(&args, &chart.lat, &bare_lat, mems);
    println!("\nwhole run {}", secs(run.elapsed()));
}

/// The namespaces of a run: the chart's, the locks', the Lease holders',
/// all that the chart watches, and those of the operators to evict.
struct Spaces {
    sys: String,
    lock_ns: Vec<String>,
    lease_ns: Vec<String>,
    watched: Vec<String>,
    evict_ns: Vec<String>,
}

/// What the chart's pod did: its pod, its memory after start-up and after
/// the bursts, each burst's latencies, the Lease burst's, its throttling.
struct ChartRun {
    pod: Pod1,
    started: PodMem,
    after_bursts: PodMem,
    lat: Vec<Vec<f64>>,
    lease: Vec<f64>,
    throttles: Vec<(String, Throttle)>,
}

/// The control plane and the real node; the holders' simulated nodes,
/// cordoned and kept Ready by heartbeats (the task returned).
async fn start_node() -> (RealNode, Client, PathBuf, tokio::task::JoinHandle<()>) {
    step("Control plane and the real node");
    let n = RealNode::start(true).await;
    println!(
        "    node Ready in {}; node dir {}",
        secs(n.started),
        n.node.dir().display()
    );
    let client = n.client.clone();
    grant_janitor(&client).await;
    let kubeconfig = kubeconfig_as(&n.cp, JANITOR_USER);
    // The holders' nodes: simulated, cordoned (the scheduler places the
    // chart's pods on the real node only), kept Ready by heartbeats.
    for i in 0..NODES {
        let node = node_of(i);
        retry("creating a node", || kubelet::create_node(&client, &node)).await;
        n.kubectl(&["cordon", &node], None);
    }
    let beat = {
        let client = client.clone();
        tokio::spawn(async move {
            loop {
                for i in 0..NODES {
                    let _ = kubelet::heartbeat(&client, &node_of(i)).await;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        })
    };
    (n, client, kubeconfig, beat)
}

/// The namespaces, and the real operators the kubelet will evict (a leader
/// and a replica each, their locks opted in).
async fn namespaces(n: &RealNode, args: &Args) -> Spaces {
    let sys = n.namespace("lock-janitor-system").await;
    let mut lock_ns = Vec::new();
    for i in 0..LOCK_NAMESPACES {
        lock_ns.push(n.namespace(&format!("bench-node-{i}")).await);
    }
    // The Lease holders' namespaces (watched by the chart too).
    let lease_ns = if args.leases_among_locks {
        lock_ns.clone()
    } else {
        let mut v = Vec::new();
        for i in 0..LOCK_NAMESPACES {
            v.push(n.namespace(&format!("bench-lease-{i}")).await);
        }
        v
    };
    let mut watched = lock_ns.clone();
    if !args.leases_among_locks && args.lease_burst > 0 {
        watched.extend(lease_ns.iter().cloned());
    }
    // The real operators the kubelet will evict: a leader and a replica
    // each, their locks opted in.
    let mut evict_ns = Vec::new();
    for i in 0..args.evictions {
        evict_ns.push(n.namespace(&format!("bench-evict-{i}")).await);
    }
    if !evict_ns.is_empty() {
        step(&format!(
            "{} real operators (operator-lib, two replicas each) on the real node",
            evict_ns.len()
        ));
        for ns in &evict_ns {
            n.deploy_operator(ns);
        }
        for ns in &evict_ns {
            n.wait_leader(ns, None, Duration::from_secs(180)).await;
            n.wait_standby(ns, Duration::from_secs(120)).await;
            n.label_locks(ns);
            n.wait_labeled(ns).await;
        }
        watched.extend(evict_ns.iter().cloned());
    }
    Spaces {
        sys,
        lock_ns,
        lease_ns,
        watched,
        evict_ns,
    }
}

/// The holder pods and their locks, a watch of their deletions, and fresh
/// locks for each reclaimer (the chart's pod, the bare process, the
/// floor), one slice per burst.
async fn stage_locks(
    client: &Client,
    lock_ns: &[String],
    args: &Args,
) -> (Vec<Vec<Vec<Made>>>, Deletions, tokio::task::JoinHandle<()>) {
    step(&format!("Creating {} holder pods and locks", args.locks));
    let t = Instant::now();
    let made = holders_and_locks(client, lock_ns, 0, args.locks, true).await;
    println!("    {} created in {}", made.len(), secs(t.elapsed()));
    let (deleted, watch, synced) =
        watch_deletions(client, &format!("{}={}", WATCH_LABEL.0, WATCH_LABEL.1));
    let _ = synced.await;
    // Fresh locks for each reclaimer, one slice per burst.
    let mut rest: &[Made] = &made;
    let mut take = |k: usize| {
        let (a, b) = rest.split_at(k);
        rest = b;
        a.to_vec()
    };
    let per: Vec<Vec<Vec<Made>>> = (0..3)
        .map(|_| args.bursts.iter().map(|&b| take(b)).collect())
        .collect();
    (per, deleted, watch)
}

/// (a) The chart's pod, installed with its shipped values: every lock
/// held, then each burst and the Lease burst.
async fn chart_phase(
    n: &RealNode,
    client: &Client,
    args: &Args,
    sp: &Spaces,
    deleted: &Deletions,
    per0: &[Vec<Made>],
) -> ChartRun {
    let (sys, watched, lease_ns) = (&sp.sys, &sp.watched, &sp.lease_ns);
    step("Installing the chart with its shipped values (its resources as values.yaml ships them)");
    let watch_refs: Vec<&str> = watched.iter().map(String::as_str).collect();
    let t = Instant::now();
    n.install_chart_as_shipped(RELEASE, sys, &watch_refs);
    n.wait_rollout(sys);
    let pod = leader_pod(n, sys).await;
    wait_for(
        "the chart's leader holding every lock",
        Duration::from_secs(600),
        || async { (held(&pod_metrics(&pod).await, "configmap") >= args.locks).then_some(()) },
    )
    .await;
    println!(
        "    {} leads; every lock held {} after install; cgroups {} and {}",
        pod.name,
        secs(t.elapsed()),
        pod.cpu.display(),
        pod.memory.display()
    );
    let started = pod_mem(&pod);
    println!("    {}", show_mem("after start-up", &started));

    let mut throttles: Vec<(String, Throttle)> = Vec::new();
    let mut chart_lat = Vec::new();
    for locks in per0 {
        step(&format!("The chart's pod: a burst of {}", locks.len()));
        let before = cpu_stat(&pod);
        let t = Instant::now();
        let lat = burst(client, deleted, locks).await;
        // Its Events and metrics after the last delete count too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let th = throttled_over(before, cpu_stat(&pod));
        println!(
            "    {} in {}; throttled: {}",
            median_p99_max(lat.clone()),
            secs(t.elapsed()),
            show_throttle(&th)
        );
        println!("    {}", show_mem("after it", &pod_mem(&pod)));
        throttles.push((format!("burst of {}", locks.len()), th));
        chart_lat.push(lat);
    }
    let chart_lease = if args.lease_burst > 0 {
        step(&format!(
            "The chart's pod: {} Lease holders fail at once",
            args.lease_burst
        ));
        let before = cpu_stat(&pod);
        let lat = lease_burst_for(
            client,
            lease_ns,
            "chart-leader",
            args.lease_burst,
            false,
            || async { held(&pod_metrics(&pod).await, "lease") },
        )
        .await;
        let th = throttled_over(before, cpu_stat(&pod));
        println!(
            "    {}; throttled: {}",
            median_p99_max(lat.clone()),
            show_throttle(&th)
        );
        throttles.push((format!("{} Leases", args.lease_burst), th));
        lat
    } else {
        println!("\n    (no Lease burst: --lease-burst 0)");
        Vec::new()
    };
    let after_bursts = pod_mem(&pod);
    println!("    {}", show_mem("after the bursts", &after_bursts));
    ChartRun {
        pod,
        started,
        after_bursts,
        lat: chart_lat,
        lease: chart_lease,
        throttles,
    }
}

/// The API server restarted under the chart's pod: its lock watches list
/// again; its memory after (a new container's or leader's, if it
/// changed).
async fn relist_phase(
    n: &RealNode,
    client: &Client,
    sp: &Spaces,
    pod: &Pod1,
    remaining: usize,
    throttles: &mut Vec<(String, Throttle)>,
) -> (String, PodMem) {
    let (sys, watched) = (&sp.sys, &sp.watched);
    step("The chart's pod: API server restarted, its lock watches list again");
    let before = cpu_stat(pod);
    let t = Instant::now();
    n.cp.restart_apiserver()
        .await
        .unwrap_or_else(|e| fail(&format!("restarting the API server: {e}")));
    let podref = Api::<Pod>::namespaced(client.clone(), sys)
        .get(&pod.name)
        .await
        .unwrap_or_else(|e| fail(&format!("get pod {}: {e}", pod.name)));
    let relisted = {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let log = n.pod_log(sys, &podref);
            let relists = log
                .lines()
                .filter(|l| l.contains("watch re-listed") && l.contains("configmaps in"))
                .count();
            if relists >= watched.len() {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let still = leader_pod(n, sys).await;
    let relist_note = if !relisted {
        "no re-list of every lock watch seen within 180 s".to_string()
    } else if still.name != pod.name || still.restarts != pod.restarts {
        format!(
            "leadership or container changed ({} restarts {} -> {}, leader {})",
            pod.name, pod.restarts, still.restarts, still.name
        )
    } else {
        wait_for(
            "every lock held after the re-list",
            Duration::from_secs(300),
            || async { (held(&pod_metrics(pod).await, "configmap") >= remaining).then_some(()) },
        )
        .await;
        format!("re-listed, every lock held again, {}", secs(t.elapsed()))
    };
    let relist_th = throttled_over(before, cpu_stat(pod));
    throttles.push(("re-list".into(), relist_th));
    // A new container (or leader) started with a full list of its own:
    // its peak is read instead.
    let changed = still.name != pod.name || still.restarts != pod.restarts;
    let after_relist = pod_mem(if changed { &still } else { pod });
    println!(
        "    {relist_note}\n    {}",
        show_mem("after the re-list", &after_relist)
    );
    (relist_note, after_relist)
}

/// Real kubelet evictions: as shipped, then with the priority class
/// values.yaml advises. Last for the chart: its own pods may go too.
async fn eviction_rounds(
    n: &RealNode,
    sp: &Spaces,
) -> Vec<(&'static str, Vec<Evicted>, Vec<String>)> {
    let (sys, evict_ns) = (&sp.sys, &sp.evict_ns);
    let watch_refs: Vec<&str> = sp.watched.iter().map(String::as_str).collect();
    let mut eviction_rounds: Vec<(&str, Vec<Evicted>, Vec<String>)> = Vec::new();
    if !evict_ns.is_empty() {
        step(&format!(
            "The chart as shipped (no priority class): the kubelet evicts the {} operators' pods under memory pressure",
            evict_ns.len()
        ));
        let (e, lost) = kubelet_evictions(n, evict_ns, sys).await;
        eviction_rounds.push(("as shipped (no priority class)", e, lost));
        step("The chart with priorityClassName (a PriorityClass of 1,000,000, as values.yaml advises): the same again");
        n.kubectl(&["apply", "-f", "-"], Some(PRIORITY_CLASS));
        n.upgrade_chart_as_shipped(
            RELEASE,
            sys,
            &watch_refs,
            &[&format!("priorityClassName={PRIORITY_CLASS_NAME}")],
        );
        n.wait_rollout(sys);
        for ns in evict_ns {
            n.wait_leader(ns, None, Duration::from_secs(300)).await;
            n.wait_standby(ns, Duration::from_secs(120)).await;
            n.label_locks(ns);
            n.wait_labeled(ns).await;
        }
        let (e, lost) = kubelet_evictions(n, evict_ns, sys).await;
        eviction_rounds.push(("priorityClassName set", e, lost));
    }
    eviction_rounds
}

/// (b) The same binary, a bare process with the Deployment's flags (the
/// chart scaled to 0): each burst and the Lease burst; its memory after.
#[allow(clippy::too_many_arguments)]
async fn bare_phase(
    n: &RealNode,
    client: &Client,
    kubeconfig: &Path,
    args: &Args,
    sp: &Spaces,
    deleted: &Deletions,
    per1: &[Vec<Made>],
    remaining: usize,
) -> (Vec<Vec<f64>>, Vec<f64>, Mem) {
    let (sys, lease_ns) = (&sp.sys, &sp.lease_ns);
    step("The chart scaled to 0; the same binary as a bare process on the host");
    let flags = scale_chart_away(n, client, sys).await;
    let flag_refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let t = Instant::now();
    let j = Janitor::start(kubeconfig, &flag_refs).await;
    wait_for(
        "the bare janitor holding every lock",
        Duration::from_secs(600),
        || async { (held(&j.metrics().await, "configmap") >= remaining).then_some(()) },
    )
    .await;
    println!(
        "    every lock ({remaining}) held {} after start",
        secs(t.elapsed())
    );
    let mut bare_lat = Vec::new();
    for locks in per1 {
        step(&format!("The bare process: a burst of {}", locks.len()));
        let lat = burst(client, deleted, locks).await;
        let m = mem(j.pid());
        println!(
            "    {}; VmHWM {} MiB, RssAnon {} MiB",
            median_p99_max(lat.clone()),
            mib(m.hwm),
            mib(m.anon)
        );
        bare_lat.push(lat);
    }
    let bare_lease = if args.lease_burst > 0 {
        step(&format!(
            "The bare process: {} Lease holders fail at once",
            args.lease_burst
        ));
        let lat = lease_burst_for(
            client,
            lease_ns,
            "bare-leader",
            args.lease_burst,
            false,
            || async { held(&j.metrics().await, "lease") },
        )
        .await;
        println!("    {}", median_p99_max(lat.clone()));
        lat
    } else {
        Vec::new()
    };
    let bare_mem = mem(j.pid());
    drop(j);
    (bare_lat, bare_lease, bare_mem)
}

/// The Deployment's flags without the election; the chart then scaled to
/// 0 and its pods gone.
async fn scale_chart_away(n: &RealNode, client: &Client, sys: &str) -> Vec<String> {
    let dep = Api::<Deployment>::namespaced(client.clone(), sys)
        .get(RELEASE)
        .await
        .unwrap_or_else(|e| fail(&format!("get the Deployment: {e}")));
    let flags: Vec<String> = dep
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| !a.starts_with("--leader-elect") && !a.starts_with("--metrics-bind-address"))
        .collect();
    n.kubectl(
        &[
            "scale",
            "-n",
            sys,
            &format!("deployment/{RELEASE}"),
            "--replicas=0",
        ],
        None,
    );
    wait_for(
        "the chart's pods gone",
        Duration::from_secs(120),
        || async {
            n.pods(sys, "app.kubernetes.io/name=lock-janitor")
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    println!("    flags (the Deployment's, without the election): {flags:?}");
    flags
}

/// (c) The floor: a bare terminal-pod watcher, one guarded DELETE per
/// death; each burst and the Lease burst released at the rule's moment.
async fn floor_phase(
    n: &RealNode,
    client: &Client,
    args: &Args,
    sp: &Spaces,
    deleted: &Deletions,
    per2: &[Vec<Made>],
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let lease_ns = &sp.lease_ns;
    step("The floor: a bare terminal-pod watcher, one guarded DELETE per death");
    let fc = floor_client(&n.cp, client, FLOOR_USER, JANITOR_USER).await;
    let floor = floor_deleter(
        &fc,
        per2.iter()
            .flatten()
            .map(|m| ((m.ns.clone(), m.holder.clone()), m.clone()))
            .collect::<HashMap<_, _>>(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut floor_lat = Vec::new();
    for locks in per2 {
        step(&format!("The floor: a burst of {}", locks.len()));
        let lat = burst(client, deleted, locks).await;
        println!("    {}", median_p99_max(lat.clone()));
        floor_lat.push(lat);
    }
    floor.abort();
    let floor_lease = if args.lease_burst > 0 {
        step(&format!(
            "The floor: {} Lease holders fail at once, released at the rule's moment",
            args.lease_burst
        ));
        let lat = lease_burst_for(
            client,
            lease_ns,
            "floor-leader",
            args.lease_burst,
            true,
            || async { 0 },
        )
        .await;
        println!("    {}", median_p99_max(lat.clone()));
        lat
    } else {
        Vec::new()
    };
    (floor_lat, floor_lease)
}

/// The rows of the latency table: each burst, then the Lease burst, for
/// the chart's pod, the bare process and the floor.
fn latency_rows(args: &Args, lat: [&Vec<Vec<f64>>; 3], lease: [Vec<f64>; 3]) -> Vec<Row> {
    let [chart_lat, bare_lat, floor_lat] = lat;
    let [chart_lease, bare_lease, floor_lease] = lease;
    let mut table: Vec<Row> = Vec::new();
    for (i, b) in args.bursts.iter().enumerate() {
        table.push((
            format!("burst of {b}"),
            chart_lat[i].clone(),
            bare_lat[i].clone(),
            floor_lat[i].clone(),
        ));
    }
    if args.lease_burst > 0 {
        table.push((
            format!("{} Leases at once", args.lease_burst),
            chart_lease,
            bare_lease,
            floor_lease,
        ));
    }
    table
}

fn print_latencies(args: &Args, commit: &str, table: &[Row]) {
    println!(
        "\nAs deployed: {} watched locks, commit {commit}, load {} at the end; reclaim latency median / p99 / max \
         (status write acknowledged -> deleted, as a watch here sees it; Leases: the rule allows it -> released)",
        args.locks,
        loadavg()
    );
    println!("| | chart's pod (as shipped) | bare process | floor |");
    println!("|---|---|---|---|");
    for (what, a, b, c) in table {
        println!(
            "| {what} | {} | {} | {} |",
            median_p99_max(a.clone()),
            median_p99_max(b.clone()),
            median_p99_max(c.clone())
        );
    }
}

fn print_evictions(eviction_rounds: &[(&str, Vec<Evicted>, Vec<String>)], operators: usize) {
    for (what, evicted, lost) in eviction_rounds {
        let lat: Vec<f64> = evicted.iter().filter_map(|e| e.latency).collect();
        println!(
            "\nReal kubelet evictions, the chart {what}: {} of {} operator leaders evicted, their locks freed {} \
             (ended -> deleted, as watches here see them); the chart's own pods evicted: {lost:?}",
            evicted.len(),
            operators,
            median_p99_max(lat)
        );
        println!("| namespace | leader | ended -> lock deleted | deleted by |");
        println!("|---|---|---|---|");
        for e in evicted {
            println!(
                "| {} | {} | {} | {} |",
                e.ns,
                e.leader,
                e.latency
                    .map_or("not deleted".into(), |l| format!("{l:.3} s")),
                e.deleter
            );
        }
    }
}

fn print_throttles(throttles: &[(String, Throttle)]) {
    println!("\nThe chart's pod, CPU throttling (cpu.stat of its container over each phase):");
    println!("| phase | throttled periods | of periods | throttled time |");
    println!("|---|---|---|---|");
    for (what, th) in throttles {
        println!(
            "| {what} | {} | {} | {:.2} s |",
            th.throttled,
            th.periods,
            th.time.as_secs_f64()
        );
    }
}

/// The chart's pod's memory after start-up, the bursts and a re-list, and
/// the bare process's.
fn print_memory(args: &Args, mems: [&PodMem; 3], bare_mem: &Mem, relist_note: &str) {
    let [started, after_bursts, after_relist] = mems;
    println!("\nMemory at {} locks:", args.locks);
    println!("| | container max_usage | of the limit | VmHWM | VmRSS | RssAnon |");
    println!("|---|---|---|---|---|---|");
    for (what, m) in [
        ("chart's pod after start-up", started),
        ("chart's pod after the bursts", after_bursts),
        ("chart's pod after a re-list", after_relist),
    ] {
        println!(
            "| {what} | {:.1} MiB | {:.0} % of {:.0} MiB | {} MiB | {} MiB | {} MiB |",
            m.max_usage as f64 / (1 << 20) as f64,
            100.0 * m.max_usage as f64 / m.limit.max(1) as f64,
            m.limit as f64 / (1 << 20) as f64,
            mib(m.hwm),
            mib(m.rss),
            mib(m.anon)
        );
    }
    println!(
        "| bare process after its bursts (no re-list) | - | - | {} MiB | {} MiB | {} MiB |",
        mib(bare_mem.hwm),
        mib(bare_mem.rss),
        mib(bare_mem.anon)
    );
    println!("re-list: {relist_note}");
}

/// The goals (issue 36): a burst of 1,000 within 5 s and within 2x the
/// bare process; the memory peak within 50 % of the limit.
fn print_goals(args: &Args, chart_lat: &[Vec<f64>], bare_lat: &[Vec<f64>], mems: [&PodMem; 3]) {
    let [started, after_bursts, after_relist] = mems;
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    if let Some(i) = args.bursts.iter().position(|&b| b == 1000) {
        let (pod_max, bare_max) = (max(&chart_lat[i]), max(&bare_lat[i]));
        println!(
            "goal, a burst of 1,000 within 5 s and within 2x the bare process: pod {pod_max:.2} s, bare {bare_max:.2} s ({:.2}x) -> {}",
            pod_max / bare_max.max(1e-9),
            if pod_max <= 5.0 && pod_max <= 2.0 * bare_max { "holds" } else { "NOT met" }
        );
    }
    let peak = [started, after_bursts, after_relist]
        .iter()
        .map(|m| m.max_usage)
        .max()
        .unwrap_or(0);
    println!(
        "goal, memory peak within 50 % of the limit: {:.1} MiB of {:.0} MiB ({:.0} %) -> {}",
        peak as f64 / (1 << 20) as f64,
        after_relist.limit as f64 / (1 << 20) as f64,
        100.0 * peak as f64 / after_relist.limit.max(1) as f64,
        if peak * 2 <= after_relist.limit {
            "holds"
        } else {
            "NOT met"
        }
    );
}
