//! The cost of `run --auto-opt-in` among objects that are no locks, on a
//! local control plane of its own: bystander ConfigMaps (1 KiB of data
//! each) and bystander Leases renewed by a writer here (holders that name
//! no pod), then the same janitor run without and with `--auto-opt-in`.
//! Reported for each: VmRSS and VmHWM after an idle window, and the
//! janitor's own requests per second in that window
//! (`lock_janitor_api_requests_total`); with `--auto-opt-in` also the time
//! from each candidate's creation (the create's answer) to its label as a
//! watch here sees it, for candidates created one at a time at idle (half
//! ConfigMap locks, half Leases held by a running pod), p50 / p99 / max.
//!
//! `make bench-optin` (`hack/bench-optin.sh`) builds the release binary and
//! runs it at the issue's scale. By hand, small:
//!
//! ```text
//! cargo run --example bench_optin -- --configmaps 500 --leases 50 --candidates 20 \
//!   --idle 30s --bin target/debug/lock-janitor
//! ```
//!
//! Not part of `make test`. It reports numbers; it asserts none.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use lock_janitor_testsupport::bench::*;
use lock_janitor_testsupport::{sample, Janitor, WATCH_LABEL};

#[derive(Parser, Debug)]
#[command(
    about = "The cost of lock-janitor run --auto-opt-in among bystander ConfigMaps and Leases"
)]
struct Args {
    /// Bystander ConfigMaps (no owner, 1 KiB of data each).
    #[arg(long, default_value_t = 20_000)]
    configmaps: usize,
    /// Bystander Leases, renewed every --renew-every by this process.
    #[arg(long, default_value_t = 2_000)]
    leases: usize,
    /// Lock candidates created one at a time with --auto-opt-in (at idle).
    #[arg(long, default_value_t = 200)]
    candidates: usize,
    /// Lock candidates created all at once after those (32 creates in
    /// flight): the time to label with the janitor busy. 0: none.
    #[arg(long, default_value_t = 200)]
    burst: usize,
    /// Namespaces the objects are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    renew_every: Duration,
    /// The idle window each run is measured over.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    idle: Duration,
    /// Pause between two candidates' creations.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    create_every: Duration,
    /// The janitor binary (hack/bench-optin.sh builds the release one).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/lock-janitor"))]
    bin: PathBuf,
}

/// Object writes in flight while setting up.
const WRITERS: usize = 32;

fn bystander_configmap(ns: &str, i: usize) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("app-config-{i}")),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some([("settings".to_string(), "x".repeat(1024))].into()),
        ..Default::default()
    }
}

fn held_lease(ns: &str, name: &str, holder: &str) -> Lease {
    let now = MicroTime(Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..Default::default()
        }),
    }
}

/// A process's CPU time so far (user and system, every thread), in
/// seconds: /proc/<pid>/stat's utime and stime, in clock ticks of 1/100 s
/// (Linux's USER_HZ).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's ")": state is field 3, utime 14 and stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => 0.0,
    }
}

/// The janitor's requests so far (every verb and code).
fn requests(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("lock_janitor_api_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Run {
    rss: Mem,
    requests_per_second: f64,
    /// The janitor's CPU time per second of the idle window.
    cpu: f64,
    /// Lease renewals answered per second in the idle window.
    renewals_per_second: f64,
    /// Creation to label, one at a time (at idle) and in the burst.
    labels: Vec<f64>,
    burst_labels: Vec<f64>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if !args.bin.exists() {
        die(&format!(
            "{} not found: build it first (hack/bench-optin.sh does)",
            args.bin.display()
        ));
    }
    // support::Janitor runs LOCK_JANITOR_BIN.
    std::env::set_var("LOCK_JANITOR_BIN", &args.bin);
    step(&format!(
        "control plane; {} bystander ConfigMaps (1 KiB), {} bystander Leases renewed every {}, in {} namespaces",
        args.configmaps,
        args.leases,
        secs(args.renew_every),
        args.namespaces
    ));
    let (cp, client, kubeconfig, namespaces) = bench_plane("optin", args.namespaces).await;
    let ns_of = |i: usize| namespaces[i % namespaces.len()].clone();
    let leases = bystanders(&client, &args, &ns_of).await;
    let renewed = Arc::new(AtomicU64::new(0));
    let renewer = renew_all(&client, &leases, args.renew_every, renewed.clone());

    let base = ["--resync", "5m"];
    step(&format!(
        "without --auto-opt-in: idle for {}",
        secs(args.idle)
    ));
    let without = measure(&kubeconfig, &base, &args, &renewed, None).await;

    step(&format!(
        "with --auto-opt-in: {} candidates created {} apart, {} at once, then idle for {}",
        args.candidates,
        secs(args.create_every),
        args.burst,
        secs(args.idle)
    ));
    let holders: Vec<String> = (0..10).map(|i| format!("holder-{i}")).collect();
    for (i, h) in holders.iter().enumerate() {
        running(&client, &ns_of(i), h, &node_of(i), "operator").await;
    }
    let with_args = ["--resync", "5m", "--auto-opt-in"];
    let with = measure(
        &kubeconfig,
        &with_args,
        &args,
        &renewed,
        Some((&client, &ns_of, &holders)),
    )
    .await;
    renewer.abort();
    results(&args, &without, &with);
    drop(cp);
}

/// The bystanders: ConfigMaps that are not locks, and Leases held by no
/// pod of theirs; the Leases' namespaces and names.
async fn bystanders(
    client: &Client,
    args: &Args,
    ns_of: &dyn Fn(usize) -> String,
) -> Vec<(String, String)> {
    let started = Instant::now();
    futures::stream::iter(0..args.configmaps)
        .map(|i| {
            let (client, ns) = (client.clone(), ns_of(i));
            async move {
                let api: Api<ConfigMap> = Api::namespaced(client, &ns);
                let cm = bystander_configmap(&ns, i);
                retry("creating a ConfigMap", || async {
                    api.create(&PostParams::default(), &cm).await
                })
                .await;
            }
        })
        .buffer_unordered(WRITERS)
        .collect::<()>()
        .await;
    let leases: Vec<(String, String)> = (0..args.leases)
        .map(|i| (ns_of(i), format!("bystander-{i}")))
        .collect();
    futures::stream::iter(leases.clone())
        .map(|(ns, name)| {
            let client = client.clone();
            async move {
                let api: Api<Lease> = Api::namespaced(client, &ns);
                let l = held_lease(&ns, &name, &format!("{name}-holder"));
                retry("creating a Lease", || async {
                    api.create(&PostParams::default(), &l).await
                })
                .await;
            }
        })
        .buffer_unordered(WRITERS)
        .collect::<()>()
        .await;
    println!("set up in {}", secs(started.elapsed()));
    leases
}

/// The renewals, spread evenly over each period, as long as the bench
/// runs; up to WRITERS in flight, so that one slow answer does not hold the
/// others back. `renewed` counts those answered 200 (the idle windows
/// report the rate reached).
fn renew_all(
    client: &Client,
    leases: &[(String, String)],
    every: Duration,
    renewed: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let (client, leases) = (client.clone(), leases.to_vec());
    tokio::spawn(async move {
        let gap = every.div_f64(leases.len().max(1) as f64);
        let mut tick = tokio::time::interval(gap);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let in_flight = Arc::new(tokio::sync::Semaphore::new(WRITERS));
        for (ns, name) in leases.iter().cycle() {
            tick.tick().await;
            let Ok(turn) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let api: Api<Lease> = Api::namespaced(client.clone(), ns);
            let (name, renewed) = (name.clone(), renewed.clone());
            tokio::spawn(async move {
                let p = serde_json::json!({"spec": {"renewTime": MicroTime(Timestamp::now())}});
                if api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&p))
                    .await
                    .is_ok()
                {
                    renewed.fetch_add(1, Ordering::Relaxed);
                }
                drop(turn);
            });
        }
    })
}

/// The table: memory, idle requests and CPU with and without, and the
/// label times.
fn results(args: &Args, without: &Run, with: &Run) {
    step("results");
    println!(
        "objects: {} ConfigMaps (1 KiB), {} Leases renewed every {}, {} candidates; idle window {}",
        args.configmaps,
        args.leases,
        secs(args.renew_every),
        args.candidates,
        secs(args.idle)
    );
    for (name, r) in [
        ("without --auto-opt-in", without),
        ("with --auto-opt-in", with),
    ] {
        println!(
            "{name:<22} VmRSS {} MiB  VmHWM {} MiB  RssAnon {} MiB  requests/s at idle {:.2}  CPU at idle {:.1} %  (Lease renewals answered: {:.0}/s)",
            mib(r.rss.rss),
            mib(r.rss.hwm),
            mib(r.rss.anon),
            r.requests_per_second,
            r.cpu * 100.0,
            r.renewals_per_second
        );
    }
    println!(
        "RSS difference (with - without): {:+.1} MiB VmRSS, {:+.1} MiB VmHWM",
        (with.rss.rss as f64 - without.rss.rss as f64) / 1024.0,
        (with.rss.hwm as f64 - without.rss.hwm as f64) / 1024.0
    );
    println!(
        "creation to label, one at a time (idle), p50 / p99 / max: {}",
        median_p99_max(with.labels.clone())
    );
    println!(
        "creation to label, a burst of {} at once, p50 / p99 / max: {}",
        args.burst,
        median_p99_max(with.burst_labels.clone())
    );
}

type Candidates<'a> = (&'a Client, &'a dyn Fn(usize) -> String, &'a [String]);

/// One janitor run: started, ready, candidates created (if any) and their
/// labels timed, then the idle window measured.
async fn measure(
    kubeconfig: &std::path::Path,
    flags: &[&str],
    args: &Args,
    renewed: &AtomicU64,
    candidates: Option<Candidates<'_>>,
) -> Run {
    let started = Instant::now();
    let j = Janitor::start(kubeconfig, flags).await;
    println!("ready in {}", secs(started.elapsed()));
    let (mut labels, mut burst_labels) = (Vec::new(), Vec::new());
    if let Some((client, ns_of, holders)) = candidates {
        let ready = Instant::now();
        (labels, burst_labels) = label_times(client, ns_of, holders, args, ready).await;
    }
    // Settle, then the idle window.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = requests(&j.metrics().await);
    let (cpu_before, renewed_before) = (cpu_seconds(j.pid()), renewed.load(Ordering::Relaxed));
    tokio::time::sleep(args.idle).await;
    let m = j.metrics().await;
    let after = requests(&m);
    let (cpu_after, renewed_after) = (cpu_seconds(j.pid()), renewed.load(Ordering::Relaxed));
    let rss = mem(j.pid());
    if candidates.is_some() {
        // Where the janitor's requests went (a re-list shows as lists),
        // and what it warned of.
        for l in m.lines().filter(|l| {
            l.starts_with("lock_janitor_api_requests_total{")
                || l.starts_with("lock_janitor_api_budget_wait_seconds_sum")
                || l.starts_with("lock_janitor_api_budget_wait_seconds_count")
                || l.starts_with("lock_janitor_opt_ins_total")
        }) {
            println!("  {l}");
        }
        for l in j.logs().lines().filter(|l| l.contains("WARN")).take(20) {
            println!("  janitor: {l}");
        }
    }
    if let Some(n) = sample(
        &m,
        "lock_janitor_unprotected_locks",
        &[("kind", "configmap")],
    ) {
        println!("unprotected at the end: {n} ConfigMaps");
    }
    Run {
        rss,
        requests_per_second: (after - before) / args.idle.as_secs_f64(),
        cpu: (cpu_after - cpu_before) / args.idle.as_secs_f64(),
        renewals_per_second: (renewed_after - renewed_before) as f64 / args.idle.as_secs_f64(),
        labels,
        burst_labels,
    }
}

/// Creates the candidates one at a time, then the burst all at once, and
/// returns for each the seconds from just before its create to a watch here
/// seeing it labeled (one at a time, burst).
async fn label_times(
    client: &Client,
    ns_of: &dyn Fn(usize) -> String,
    holders: &[String],
    args: &Args,
    ready: Instant,
) -> (Vec<f64>, Vec<f64>) {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let (synced_tx, mut synced_rx) = tokio::sync::mpsc::channel::<()>(2);
    let cms = watch_labeled::<ConfigMap>(client, "configmap", &seen, &synced_tx);
    let leases = watch_labeled::<Lease>(client, "lease", &seen, &synced_tx);
    for _ in 0..2 {
        synced_rx.recv().await;
    }
    // Readiness does not wait for auto opt-in's start-up lists: first, a
    // ConfigMap candidate whose key sorts after every other ConfigMap's
    // (the last namespace, the last name) is labeled only once the list has
    // reached its end (pages come in key order) or the watch after it has
    // begun. Candidates created before that would time the start-up list,
    // not the janitor at idle.
    let t0 = Instant::now();
    let last = (0..holders.len().min(args.namespaces))
        .max_by_key(|&i| ns_of(i))
        .unwrap_or(0);
    let at = Instant::now();
    let key = create_candidate(
        client,
        &ns_of(last),
        &holders[last],
        "zzzz-after-the-list",
        0,
    )
    .await;
    wait_labels(
        &seen,
        &[(key, at, Instant::now())],
        "after the start-up list",
        t0,
    )
    .await;
    println!(
        "the start-up list done: a candidate at its end labeled {} after the janitor was ready",
        secs(ready.elapsed())
    );

    // One at a time, at idle.
    println!(
        "candidates from {} (the janitor's log times: UTC)",
        Timestamp::now()
    );
    let mut idle: Vec<Created> = Vec::new();
    for i in 0..args.candidates {
        let holder = &holders[i % holders.len()];
        // From before the create is sent: the answer may come after the label.
        let at = Instant::now();
        let key = create_candidate(client, &ns_of(i), holder, &format!("operator-{i}"), i).await;
        idle.push((key, at, Instant::now()));
        tokio::time::sleep(args.create_every).await;
    }
    let idle_times = wait_labels(&seen, &idle, "one at a time", t0).await;
    // Then all at once (WRITERS creates in flight): the janitor busy.
    let burst: Vec<Created> = futures::stream::iter(0..args.burst)
        .map(|i| async move {
            let holder = &holders[i % holders.len()];
            let at = Instant::now();
            let key = create_candidate(client, &ns_of(i), holder, &format!("burst-{i}"), i).await;
            (key, at, Instant::now())
        })
        .buffer_unordered(WRITERS)
        .collect()
        .await;
    let burst_times = wait_labels(&seen, &burst, "in the burst", t0).await;
    cms.abort();
    leases.abort();
    (idle_times, burst_times)
}

/// Watches the opted-in objects of a kind (metadata only), noting when
/// each was first seen labeled (`seen`, by `kind/namespace/name`); says on
/// `synced` when its first list is done.
fn watch_labeled<K>(
    client: &Client,
    kind: &'static str,
    seen: &Arc<Mutex<HashMap<String, Instant>>>,
    synced: &tokio::sync::mpsc::Sender<()>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let (seen, tx) = (seen.clone(), synced.clone());
    let api: Api<PartialObjectMeta<K>> = Api::all(client.clone());
    let selector = format!("{}={}", WATCH_LABEL.0, WATCH_LABEL.1);
    let config = watcher::Config::default().labels(&selector);
    tokio::spawn(async move {
        let stream = watcher(api, config);
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(o)) => {
                    let key = format!(
                        "{kind}/{}/{}",
                        o.namespace().unwrap_or_default(),
                        o.name_any()
                    );
                    seen.lock().unwrap().entry(key).or_insert_with(Instant::now);
                }
                Ok(watcher::Event::InitDone) => {
                    let _ = tx.send(()).await;
                }
                _ => {}
            }
        }
    })
}

/// Creates candidate `i` (even: a ConfigMap lock of `holder`, odd: a Lease
/// it holds) named after `name`; returns its key as the watches name it.
async fn create_candidate(client: &Client, ns: &str, holder: &str, name: &str, i: usize) -> String {
    if i.is_multiple_of(2) {
        let pod: k8s_openapi::api::core::v1::Pod = Api::namespaced(client.clone(), ns)
            .get(holder)
            .await
            .unwrap_or_else(|e| die(&format!("holder {ns}/{holder}: {e}")));
        let name = format!("{name}-lock");
        let cm = lock_janitor_testsupport::lock_for(&name, &pod, false);
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        retry("creating a lock", || async {
            api.create(&PostParams::default(), &cm).await
        })
        .await;
        format!("configmap/{ns}/{name}")
    } else {
        let name = format!("{name}-lease");
        let api: Api<Lease> = Api::namespaced(client.clone(), ns);
        let l = held_lease(ns, &name, holder);
        retry("creating a Lease lock", || async {
            api.create(&PostParams::default(), &l).await
        })
        .await;
        format!("lease/{ns}/{name}")
    }
}

/// A candidate's key, when its create was sent and when it was answered.
type Created = (String, Instant, Instant);

/// Waits for every label of `created` (or 60 s), then returns, for each
/// labeled one, the seconds from before its create to the label seen.
/// Prints where the time went: the create's own answer, and the rest by
/// kind (the janitor's part), with the slowest candidates.
async fn wait_labels(
    seen: &Mutex<HashMap<String, Instant>>,
    created: &[Created],
    what: &str,
    t0: Instant,
) -> Vec<f64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let done = {
            let seen = seen.lock().unwrap();
            created.iter().all(|(k, _, _)| seen.contains_key(k))
        };
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = seen.lock().unwrap();
    let missing = created
        .iter()
        .filter(|(k, _, _)| !seen.contains_key(k))
        .count();
    if missing > 0 {
        println!(
            "{missing} of {} candidates created {what} not labeled within 60 s",
            created.len()
        );
    }
    let answer: Vec<f64> = created
        .iter()
        .map(|(_, at, answered)| answered.saturating_duration_since(*at).as_secs_f64())
        .collect();
    println!(
        "  {what}: the create's answer, p50 / p99 / max: {}",
        median_p99_max(answer)
    );
    for kind in ["configmap", "lease"] {
        let after: Vec<f64> = created
            .iter()
            .filter(|(k, _, _)| k.starts_with(kind))
            .filter_map(|(k, _, answered)| {
                Some(
                    seen.get(k)?
                        .saturating_duration_since(*answered)
                        .as_secs_f64(),
                )
            })
            .collect();
        println!(
            "  {what}: {kind}s, the create's answer to the label, p50 / p99 / max: {}",
            median_p99_max(after)
        );
    }
    let mut slow: Vec<(f64, f64, &str)> = created
        .iter()
        .filter_map(|(k, at, _)| {
            let took = seen.get(k)?.saturating_duration_since(*at).as_secs_f64();
            Some((took, at.duration_since(t0).as_secs_f64(), k.as_str()))
        })
        .collect();
    slow.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (took, at, k) in slow.iter().take(5) {
        println!("  {what}: slow: {k} created at +{at:.1}s, labeled {took:.3}s later");
    }
    created
        .iter()
        .filter_map(|(k, at, _)| Some(seen.get(k)?.saturating_duration_since(*at).as_secs_f64()))
        .collect()
}
