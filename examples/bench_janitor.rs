//! What `lock-janitor run` costs on a local control plane: its memory as the
//! number of pods that hold no lock grows, and how fast it reclaims a burst
//! of stale locks. It reports numbers; it passes or fails nothing on time.
//!
//! `hack/bench-janitor.sh` builds the release binary and runs this. By hand:
//!
//! ```text
//! cargo build --release --bin lock-janitor
//! LOCK_JANITOR_BIN=target/release/lock-janitor cargo run --example bench_janitor -- \
//!     [--small 100] [--locks 1000] [--running-pods 5000] [--terminal-pods 2000] \
//!     [--evict 100] [--resync-secs 15] [--settle-resyncs 2]
//! ```
//!
//! Memory. `--locks` leader-for-life locks, each with its own Running holder
//! pod, labeled `lock-janitor.io/watch=true`; every lock also carries
//! `bench.lock-janitor.io/large=true`, the first `--small` ones
//! `bench.lock-janitor.io/small=true`. Three janitors watch the whole
//! cluster at once with `--resync <resync-secs>`: one selects nothing (the
//! baseline), one the small set, one the large set. Each one's VmRSS and
//! VmHWM (`/proc/<pid>/status`) are read once its watches have synced, once
//! it has judged every lock and a few resyncs went by, again after
//! `--running-pods` Running pods and `--terminal-pods` Failed/Succeeded pods
//! that hold no lock were added (and a few resyncs), and once more from
//! fresh processes started with those pods present.
//!
//! Reclaim. A janitor with the default selector and flags watches all the
//! locks among all those pods; the holders of `--evict` locks are evicted
//! (`status.phase=Failed`, reason `Evicted`, 32 status writes in flight),
//! and each lock's latency from its holder's acknowledged status write to
//! its deletion, as seen by a ConfigMap watch in this process, is reported
//! with the janitor's own `lock_janitor_reclaim_latency_seconds`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet};
use lock_janitor_testsupport::bench::*;
use lock_janitor_testsupport::*;

/// Object writes in flight while setting up (and status writes in the burst).
const WRITERS: usize = 32;
/// Namespaces for the locks, and for the pods that hold no lock.
const LOCK_NAMESPACES: usize = 10;
const POD_NAMESPACES: usize = 10;
const SMALL_LABEL: &str = "bench.lock-janitor.io/small";
const LARGE_LABEL: &str = "bench.lock-janitor.io/large";
/// Selects no lock: the baseline janitor.
const NONE_LABEL: &str = "bench.lock-janitor.io/none";

/// The janitor's reclaim latency and its cost among many pods (see the
/// file's doc).
#[derive(clap::Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Locks of the small janitor.
    #[arg(long, default_value_t = 100)]
    small: usize,
    /// Locks of the large janitor.
    #[arg(long, default_value_t = 1000)]
    locks: usize,
    /// Running pods that hold no lock.
    #[arg(long = "running-pods", default_value_t = 5000)]
    running_pods: usize,
    /// Terminal pods that hold no lock.
    #[arg(long = "terminal-pods", default_value_t = 2000)]
    terminal_pods: usize,
    /// Holders evicted in the burst.
    #[arg(long, default_value_t = 100)]
    evict: usize,
    /// The janitor's --resync, in seconds.
    #[arg(long = "resync-secs", value_name = "N", default_value = "15", value_parser = seconds)]
    resync: Duration,
    /// Resyncs to wait for before measuring.
    #[arg(long = "settle-resyncs", default_value_t = 2)]
    settle_resyncs: u32,
}

fn parse_args() -> Args {
    let a = <Args as clap::Parser>::parse();
    if a.small > a.locks || a.evict > a.locks || a.resync.is_zero() {
        die("need small <= locks, evict <= locks, resync-secs > 0");
    }
    let bin = janitor_bin();
    if !bin.exists() {
        die(&format!(
            "{} not found: build it with `cargo build --release --bin lock-janitor` and set \
             LOCK_JANITOR_BIN (hack/bench-janitor.sh does both)",
            bin.display()
        ));
    }
    a
}

#[derive(Clone, Copy)]
enum Noise {
    Running,
    Evicted,
    Succeeded,
}

/// A pod that holds no lock, as a workload or a finished Job would leave it.
async fn noise_pod(client: Client, ns: String, i: usize, kind: Noise) {
    let (name, app) = match kind {
        Noise::Running => (format!("web-{i}"), "web"),
        Noise::Evicted | Noise::Succeeded => (format!("job-{i}"), "batch"),
    };
    running(&client, &ns, &name, &node_of(i), app).await;
    match kind {
        Noise::Running => {}
        Noise::Evicted => {
            retry(&format!("pod {ns}/{name} Failed"), || {
                kubelet::set_failed(
                    &client,
                    &ns,
                    &name,
                    "Evicted",
                    "The node was low on resource: memory.",
                )
            })
            .await;
        }
        Noise::Succeeded => {
            retry(&format!("pod {ns}/{name} Succeeded"), || {
                kubelet::set_succeeded(&client, &ns, &name)
            })
            .await;
        }
    }
}

/// Lock `i`: a Running holder `operator-{i}` and its lock `operator-{i}-lock`.
async fn holder_and_lock(client: Client, ns: String, i: usize, small: bool) -> (String, String) {
    let holder = format!("operator-{i}");
    let pod = running(&client, &ns, &holder, &node_of(i), "operator").await;
    let mut cm = lock_for(&format!("{holder}-lock"), &pod, true);
    let labels = cm.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(LARGE_LABEL.into(), "true".into());
    if small {
        labels.insert(SMALL_LABEL.into(), "true".into());
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    retry(&format!("creating lock {ns}/{holder}-lock"), || async {
        match cms.create(&PostParams::default(), &cm).await {
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(cm.clone()),
            r => r,
        }
    })
    .await;
    (ns, holder)
}

/// One janitor of the memory benchmark.
struct Watcher {
    locks: usize,
    selector: String,
    janitor: Option<Janitor>,
}

impl Watcher {
    fn j(&self) -> &Janitor {
        self.janitor.as_ref().expect("janitor running")
    }

    fn start(&mut self, kubeconfig: &std::path::Path, resync: &str) {
        self.janitor = Some(Janitor::spawn(
            kubeconfig,
            &["--selector", &self.selector, "--resync", resync],
        ));
    }

    async fn reconciles(&self) -> f64 {
        let m = self.j().metrics().await;
        sample(&m, "lock_janitor_reconcile_duration_seconds_count", &[]).unwrap_or(0.0)
    }
}

/// Waits until `j` has judged `n` locks held (its first pass over them).
async fn all_judged(j: &Janitor, n: usize) {
    wait_for(
        &format!("{n} locks judged held"),
        Duration::from_secs(600),
        || async move {
            let m = j.metrics().await;
            let held = sample(&m, "lock_janitor_locks", &[("state", "held")]).unwrap_or(0.0);
            (held as usize == n).then_some(())
        },
    )
    .await;
}

/// Starts every janitor, waits until each is ready (reading its memory
/// then), has judged its locks, and `resyncs` resync periods went by.
/// Returns (memory at /readyz 200, memory settled).
async fn start_and_settle(
    ws: &mut [Watcher],
    kubeconfig: &std::path::Path,
    args: &Args,
) -> (Vec<Mem>, Vec<Mem>) {
    let resync = format!("{}s", args.resync.as_secs());
    for w in ws.iter_mut() {
        w.start(kubeconfig, &resync);
    }
    let mut ready = Vec::new();
    for w in ws.iter() {
        w.j().wait_ready().await;
        ready.push(mem(w.j().pid()));
    }
    let t = Instant::now();
    for w in ws.iter() {
        all_judged(w.j(), w.locks).await;
    }
    println!(
        "    ready; every lock judged {} after the last /readyz",
        secs(t.elapsed())
    );
    (ready, settle(ws, args).await)
}

/// Lets `settle_resyncs` resync periods (plus 5 s) go by; returns memory.
async fn settle(ws: &[Watcher], args: &Args) -> Vec<Mem> {
    let wait = args.resync * args.settle_resyncs + Duration::from_secs(5);
    let mut before = Vec::new();
    for w in ws {
        before.push(w.reconciles().await);
    }
    println!(
        "    settling {} ({} resyncs of {})",
        secs(wait),
        args.settle_resyncs,
        secs(args.resync)
    );
    tokio::time::sleep(wait).await;
    let mut out = Vec::new();
    for (w, b) in ws.iter().zip(before) {
        let done = w.reconciles().await - b;
        println!(
            "    {} locks: {} reconciles while settling",
            w.locks, done as u64
        );
        out.push(mem(w.j().pid()));
    }
    out
}

fn print_memory_table(ws: &[Watcher], rows: &[(String, Vec<Mem>, bool)]) {
    println!();
    println!("janitor memory, MiB: VmRSS (VmHWM) [RssAnon]; columns: opted-in locks watched");
    let head: Vec<String> = ws.iter().map(|w| format!("{} locks", w.locks)).collect();
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    print!("{:<width$}", "");
    for h in &head {
        print!(" | {h:>24}");
    }
    println!();
    for (label, mems, with_hwm) in rows {
        print!("{label:<width$}");
        for m in mems {
            let cell = if *with_hwm {
                format!("{} ({}) [{}]", mib(m.rss), mib(m.hwm), mib(m.anon))
            } else {
                format!("{} [{}]", mib(m.rss), mib(m.anon))
            };
            print!(" | {cell:>24}");
        }
        println!();
    }
}

/// `latency_seconds=<x>` of each "stale lock reclaimed" line of the log.
fn logged_latencies(log: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains("stale lock reclaimed"))
        .filter_map(|l| {
            let v = l.split("latency_seconds=").nth(1)?;
            v.split(|c: char| c.is_whitespace() || c == ',')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Sum of every sample of `name` (any labels).
fn total(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::main]
async fn main() {
    let run = Instant::now();
    let args = parse_args();
    println!(
        "bench_janitor: {} locks ({} in the small set), +{} Running and +{} terminal pods \
         holding no lock, {} evictions; janitor {}; resync {} while measuring memory",
        args.locks,
        args.small,
        args.running_pods,
        args.terminal_pods,
        args.evict,
        janitor_bin().display(),
        secs(args.resync)
    );

    step("Control plane");
    let t = Instant::now();
    let (cp, client, kubeconfig, lock_ns) = bench_plane("bench-ops", LOCK_NAMESPACES).await;
    let mut pod_ns = Vec::new();
    for i in 0..POD_NAMESPACES {
        pod_ns.push(fresh_namespace(&client, &format!("bench-apps-{i}")).await);
    }
    println!(
        "    started in {} ({} nodes, {} namespaces)",
        secs(t.elapsed()),
        NODES,
        LOCK_NAMESPACES + POD_NAMESPACES
    );

    let (holders, setup_locks) = holders_and_locks(&client, &lock_ns, &args).await;
    let (noise, setup_pods) = claim_memory(&client, &kubeconfig, &pod_ns, &args).await;
    let janitor = claim_latency(&client, &kubeconfig, &holders, &args, noise).await;

    println!();
    println!(
        "setup: {} holder pods + locks {}; {noise} other pods {}; whole run {}",
        args.locks,
        secs(setup_locks),
        secs(setup_pods),
        secs(run.elapsed())
    );
    drop(janitor);
    drop(client);
    cp.stop();
}

/// `args.locks` Running holder pods and their locks (the first
/// `args.small` in the small set); the holders and how long they took.
async fn holders_and_locks(
    client: &Client,
    lock_ns: &[String],
    args: &Args,
) -> (Vec<(String, String)>, Duration) {
    step(&format!(
        "{} Running holder pods and their locks",
        args.locks
    ));
    let t = Instant::now();
    let holders: Vec<(String, String)> = futures::stream::iter(0..args.locks)
        .map(|i| {
            holder_and_lock(
                client.clone(),
                lock_ns[i % LOCK_NAMESPACES].clone(),
                i,
                i < args.small,
            )
        })
        .buffered(WRITERS)
        .collect()
        .await;
    let setup_locks = t.elapsed();
    println!(
        "    created in {} ({:.0} pods+locks/s)",
        secs(setup_locks),
        args.locks as f64 / setup_locks.as_secs_f64()
    );
    (holders, setup_locks)
}

/// Claim 1: memory does not grow with pods that hold no lock. Three
/// janitors (no lock, the small set, every lock) before and after the
/// other pods, the same processes and fresh ones. Returns the number of
/// other pods and how long they took to create.
async fn claim_memory(
    client: &Client,
    kubeconfig: &std::path::Path,
    pod_ns: &[String],
    args: &Args,
) -> (usize, Duration) {
    let mut ws = vec![
        Watcher {
            locks: 0,
            selector: format!("{NONE_LABEL}=true"),
            janitor: None,
        },
        Watcher {
            locks: args.small,
            selector: format!("{SMALL_LABEL}=true"),
            janitor: None,
        },
        Watcher {
            locks: args.locks,
            selector: format!("{LARGE_LABEL}=true"),
            janitor: None,
        },
    ];
    let mut rows: Vec<(String, Vec<Mem>, bool)> = Vec::new();

    step("Three janitors, cluster-wide: selecting no lock, the small set, all locks");
    let (ready, settled) = start_and_settle(&mut ws, kubeconfig, args).await;
    rows.push(("A. no other pods, watches synced".into(), ready, false));
    rows.push(("B. no other pods, settled".into(), settled.clone(), true));

    let noise = args.running_pods + args.terminal_pods;
    step(&format!(
        "{} Running + {} terminal pods holding no lock ({} Failed/Evicted, {} Succeeded), \
         the janitors running",
        args.running_pods,
        args.terminal_pods,
        args.terminal_pods.div_ceil(2),
        args.terminal_pods / 2
    ));
    let setup_pods = noise_pods(client, pod_ns, args).await;
    let during: Vec<Mem> = ws.iter().map(|w| mem(w.j().pid())).collect();
    rows.push((
        format!("C. +{noise} pods, same process, right after"),
        during,
        true,
    ));
    let after = settle(&ws, args).await;
    rows.push((
        format!("D. +{noise} pods, same process, settled"),
        after.clone(),
        true,
    ));

    step("Fresh janitors, started with those pods present");
    for w in ws.iter_mut() {
        w.janitor = None; // killed on drop
    }
    let (ready2, settled2) = start_and_settle(&mut ws, kubeconfig, args).await;
    rows.push((
        format!("E. +{noise} pods, fresh, watches synced"),
        ready2,
        false,
    ));
    rows.push((
        format!("F. +{noise} pods, fresh, settled"),
        settled2.clone(),
        true,
    ));
    print_memory_table(&ws, &rows);
    let delta = |a: &[Mem], b: &[Mem]| -> Vec<String> {
        a.iter()
            .zip(b)
            .map(|(x, y)| format!("{:+.1}", (y.rss as f64 - x.rss as f64) / 1024.0))
            .collect()
    };
    println!(
        "VmRSS change B -> D (same process): {} MiB; B -> F (fresh): {} MiB",
        delta(&settled, &after).join(" / "),
        delta(&settled, &settled2).join(" / ")
    );
    for w in ws.iter_mut() {
        w.janitor = None;
    }
    (noise, setup_pods)
}

/// The pods holding no lock, Running and terminal interleaved so that
/// terminal pods keep arriving all along; how long they took.
async fn noise_pods(client: &Client, pod_ns: &[String], args: &Args) -> Duration {
    let noise = args.running_pods + args.terminal_pods;
    let mut jobs = Vec::with_capacity(noise);
    for i in 0..args.running_pods.max(args.terminal_pods) {
        if i < args.running_pods {
            jobs.push((i, Noise::Running));
        }
        if i < args.terminal_pods {
            let kind = if i % 2 == 0 {
                Noise::Evicted
            } else {
                Noise::Succeeded
            };
            jobs.push((i, kind));
        }
    }
    let t = Instant::now();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            tick.tick().await;
            loop {
                tick.tick().await;
                let n = done.load(std::sync::atomic::Ordering::Relaxed);
                println!("    ... {n}/{noise} pods after {}", secs(t.elapsed()));
            }
        })
    };
    futures::stream::iter(jobs)
        .map(|(i, kind)| {
            let ns = pod_ns[i % POD_NAMESPACES].clone();
            let (client, done) = (client.clone(), done.clone());
            async move {
                noise_pod(client, ns, i, kind).await;
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .buffer_unordered(WRITERS)
        .collect::<Vec<()>>()
        .await;
    progress.abort();
    let setup_pods = t.elapsed();
    println!(
        "    created in {} ({:.0} pods/s)",
        secs(setup_pods),
        noise as f64 / setup_pods.as_secs_f64()
    );
    setup_pods
}

/// Claim 2: reclaim latency. A janitor with the default selector and flags
/// judges every lock held, then `args.evict` holders are evicted at once;
/// each lock's deletion is timed as a watch here sees it. Returns the
/// janitor (stopped when dropped).
async fn claim_latency(
    client: &Client,
    kubeconfig: &std::path::Path,
    holders: &[(String, String)],
    args: &Args,
    noise: usize,
) -> Janitor {
    step(&format!(
        "Reclaim: a janitor with the default selector and flags over {} locks and {noise} other pods",
        args.locks
    ));
    let janitor = Janitor::start(kubeconfig, &[]).await;
    all_judged(&janitor, args.locks).await;
    let before = mem(janitor.pid());
    println!(
        "    every lock judged held; VmRSS {} MiB (VmHWM {})",
        mib(before.rss),
        mib(before.hwm)
    );

    // Deletions as this process sees them.
    let (deleted, observer, synced_rx) =
        watch_deletions(client, &format!("{}={}", WATCH_LABEL.0, WATCH_LABEL.1));
    synced_rx
        .await
        .unwrap_or_else(|_| die("the lock watch ended before it synced"));

    let victims: Vec<(String, String)> = holders[..args.evict].to_vec();
    let burst = Instant::now();
    let written = evict(client, victims).await;
    let burst_writes = burst.elapsed();
    let all_gone = tokio::time::timeout(Duration::from_secs(300), async {
        loop {
            let n = {
                let d = deleted.lock().unwrap_or_else(|e| e.into_inner());
                written.iter().filter(|(k, ..)| d.contains_key(k)).count()
            };
            if n == written.len() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let makespan = burst.elapsed();
    observer.abort();
    let deleted = deleted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // Signed: this process may see a delete on its watch before the
    // acknowledgement of the status write that caused it.
    let since = |from: Instant, to: Instant| {
        if to >= from {
            (to - from).as_secs_f64()
        } else {
            -(from - to).as_secs_f64()
        }
    };
    let mut latencies = Vec::new();
    let mut from_issue = Vec::new();
    for (k, issued, acked) in &written {
        if let Some(gone) = deleted.get(k) {
            latencies.push(since(*acked, *gone));
            from_issue.push(since(*issued, *gone));
        }
    }
    if all_gone.is_err() {
        println!(
            "    WARNING: {} of {} locks were not seen deleted within 300s",
            written.len() - latencies.len(),
            written.len()
        );
    }
    report_reclaim(
        &janitor,
        before,
        written.len(),
        burst_writes,
        makespan,
        latencies,
        from_issue,
    )
    .await;
    janitor
}

/// Evicts each of `victims` (its status written as the kubelet's), WRITERS
/// at a time: (lock, status write issued, status write acknowledged).
async fn evict(client: &Client, victims: Vec<(String, String)>) -> Vec<(String, Instant, Instant)> {
    futures::stream::iter(victims)
        .map(|(ns, holder)| {
            let client = client.clone();
            async move {
                let issued = Instant::now();
                retry(&format!("evicting {ns}/{holder}"), || {
                    kubelet::set_failed(
                        &client,
                        &ns,
                        &holder,
                        "Evicted",
                        "The node was low on resource: memory.",
                    )
                })
                .await;
                (format!("{ns}/{holder}-lock"), issued, Instant::now())
            }
        })
        .buffer_unordered(WRITERS)
        .collect()
        .await
}

/// What the janitor says of the burst (its log, its metrics, its memory)
/// beside what the watch here saw.
async fn report_reclaim(
    janitor: &Janitor,
    before: Mem,
    locks: usize,
    burst_writes: Duration,
    makespan: Duration,
    latencies: Vec<f64>,
    from_issue: Vec<f64>,
) {
    // The janitor's metrics may trail the deletes by its Event write.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics = janitor.metrics().await;
    let after_burst = mem(janitor.pid());
    let sum = sample(&metrics, "lock_janitor_reclaim_latency_seconds_sum", &[]).unwrap_or(0.0);
    let count = sample(&metrics, "lock_janitor_reclaim_latency_seconds_count", &[]).unwrap_or(0.0);
    let logged = logged_latencies(&janitor.logs());

    println!();
    println!(
        "reclaim of {} evicted holders' locks ({} status writes in flight; writes took {}, \
         last lock gone {} after the burst began)",
        locks,
        WRITERS,
        secs(burst_writes),
        secs(makespan)
    );
    println!(
        "  status write acknowledged -> lock deleted (bench watch): {}",
        distribution(latencies)
    );
    println!(
        "  status write issued (GET + PATCH) -> lock deleted:        {}",
        distribution(from_issue)
    );
    println!(
        "  janitor log latency_seconds (container finishedAt -> delete acknowledged): {}",
        distribution(logged)
    );
    println!(
        "  lock_janitor_reclaim_latency_seconds: count {count}  sum {sum:.3}s  mean {:.3}s",
        if count > 0.0 { sum / count } else { 0.0 }
    );
    // Up to the first bucket that holds every observation.
    let mut buckets = Vec::new();
    for l in metrics
        .lines()
        .filter(|l| l.starts_with("lock_janitor_reclaim_latency_seconds_bucket"))
    {
        let le = l.split("le=\"").nth(1).and_then(|s| s.split('"').next());
        let v = l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok());
        if let (Some(le), Some(v)) = (le, v) {
            buckets.push(format!("le {le}: {v}"));
            if v >= count {
                break;
            }
        }
    }
    println!("    buckets (cumulative): {}", buckets.join(", "));
    println!(
        "  lock_janitor_reclaims_total (all series): {}  reconcile errors: {}",
        total(&metrics, "lock_janitor_reclaims_total"),
        total(&metrics, "lock_janitor_reconcile_errors_total")
    );
    println!(
        "  reclaim janitor VmRSS {} MiB before, {} MiB after the burst (VmHWM {})",
        mib(before.rss),
        mib(after_burst.rss),
        mib(after_burst.hwm)
    );
}
