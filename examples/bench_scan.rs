//! How long `lock-janitor scan` takes on a cluster with 10,000 ConfigMaps of
//! which 500 are leader-for-life locks, on a local control plane.
//!
//! `hack/bench-scan.sh` (or `make bench-scan`) builds the release binary and
//! runs this. By hand:
//!
//! ```text
//! cargo build --release --bin lock-janitor
//! cargo run --example bench_scan -- [--runs 3] [--namespaces 10] [--configmaps 10000] [--locks 500] [--bin target/release/lock-janitor]
//! ```
//!
//! It starts its own control plane (etcd, kube-apiserver,
//! kube-controller-manager), spreads the ConfigMaps over the namespaces, gives
//! every lock its own holder pod (one in ten evicted), times `scan` over all
//! namespaces and scoped to each namespace, and, to back the design choices,
//! times the alternatives scan does not use: a full (not metadata-only)
//! ConfigMap list, and one pod list per namespace instead of one GET per holder.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, ControlPlane, Options};

/// Object writes in flight while setting up.
const WRITERS: usize = 48;

/// `scan` at scale (see the file's doc).
#[derive(clap::Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Runs of each command.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Namespaces the ConfigMaps are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// ConfigMaps in all.
    #[arg(long, default_value_t = 10_000)]
    configmaps: usize,
    /// Of them, locks.
    #[arg(long, default_value_t = 500)]
    locks: usize,
    /// The lock-janitor binary to run.
    #[arg(long, value_name = "PATH", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/lock-janitor"))]
    bin: PathBuf,
}

fn parse_args() -> Args {
    let a = <Args as clap::Parser>::parse();
    if a.locks > a.configmaps || a.namespaces == 0 || a.runs == 0 {
        die("need 0 < namespaces, 0 < runs, locks <= configmaps");
    }
    if !a.bin.exists() {
        die(&format!(
            "{} not found: run `cargo build --release --bin lock-janitor` first (hack/bench-scan.sh does)",
            a.bin.display()
        ));
    }
    a
}

fn die(msg: &str) -> ! {
    eprintln!("bench_scan: {msg}");
    std::process::exit(2);
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// min / median / max.
fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "min {}  median {}  max {}",
        secs(v[0]),
        secs(v[v.len() / 2]),
        secs(v[v.len() - 1])
    )
}

async fn create_cm(client: Client, ns: String, name: String, owner: Option<OwnerReference>) {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        // Typical small app config (what a full list would carry, and a
        // metadata-only list does not).
        data: Some(BTreeMap::from([(
            "config.yaml".to_string(),
            format!("# {name}\n{}", "key: value\n".repeat(100)),
        )])),
        ..Default::default()
    };
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    for attempt in 1.. {
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => return,
            Err(e) if attempt < 5 => {
                eprintln!("retrying {ns}/{name}: {e}");
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
            Err(e) => die(&format!("creating configmap {ns}/{name}: {e}")),
        }
    }
}

/// A holder pod, Running, or Failed/Evicted; returns its owner reference.
async fn create_holder(client: Client, ns: String, name: String, evicted: bool) -> OwnerReference {
    let node = "bench-node";
    let pod = kubelet::create_pod(&client, &ns, &name, node, &[("app", "bench-operator")])
        .await
        .unwrap_or_else(|e| die(&format!("creating pod {ns}/{name}: {e}")));
    kubelet::set_running(&client, &ns, &name)
        .await
        .unwrap_or_else(|e| die(&format!("pod {ns}/{name} running: {e}")));
    if evicted {
        kubelet::set_failed(
            &client,
            &ns,
            &name,
            "Evicted",
            "The node was low on resource: memory.",
        )
        .await
        .unwrap_or_else(|e| die(&format!("pod {ns}/{name} evicted: {e}")));
    }
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name,
        uid: pod.metadata.uid.unwrap_or_default(),
        ..Default::default()
    }
}

struct ScanRun {
    wall: Duration,
    code: i32,
    stdout: String,
}

async fn scan(bin: &PathBuf, kubeconfig: &std::path::Path, args: &[String]) -> ScanRun {
    let start = Instant::now();
    let out = tokio::process::Command::new(bin)
        .arg("scan")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| die(&format!("running {}: {e}", bin.display())));
    let wall = start.elapsed();
    let code = out.status.code().unwrap_or(-1);
    if code != 0 && code != 3 {
        die(&format!(
            "scan exited {code}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    ScanRun {
        wall,
        code,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    println!(
        "bench_scan: {} ConfigMaps ({} locks) in {} namespaces, {} runs, binary {}",
        args.configmaps,
        args.locks,
        args.namespaces,
        args.runs,
        args.bin.display()
    );

    let t = Instant::now();
    let cp = ControlPlane::start(Options::default())
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    println!("control plane started in {}", secs(t.elapsed()));
    let client = cp.client().await.unwrap_or_else(|e| die(&e.to_string()));
    kubelet::create_node(&client, "bench-node")
        .await
        .unwrap_or_else(|e| die(&format!("creating the node: {e}")));

    let mut namespaces = Vec::new();
    for i in 0..args.namespaces {
        namespaces.push(fresh_namespace(&client, &format!("bench-{i}")).await);
    }
    let ns_of = |i: usize| namespaces[i % namespaces.len()].clone();

    stage(&client, &args, &ns_of).await;
    time_scans(&args, cp.kubeconfig_path(), &namespaces).await;
    // The alternatives scan does not use, measured with the same client.
    println!();
    time_configmap_lists(&client, &args).await;
    time_holder_reads(&client, &args, &namespaces, &ns_of).await;
    drop(client);
    cp.stop();
}

/// The holders (one pod per lock, every tenth evicted) and the ConfigMaps
/// (the locks, and plain ones up to the total).
async fn stage(client: &Client, args: &Args, ns_of: &dyn Fn(usize) -> String) {
    // Holders: one pod per lock, every tenth evicted.
    let t = Instant::now();
    let owners: Vec<(String, OwnerReference)> = futures::stream::iter(0..args.locks)
        .map(|i| {
            let (client, ns) = (client.clone(), ns_of(i));
            async move {
                let owner =
                    create_holder(client, ns.clone(), format!("operator-{i}"), i % 10 == 0).await;
                (ns, owner)
            }
        })
        .buffer_unordered(WRITERS)
        .collect()
        .await;
    println!(
        "{} holder pods created ({} evicted) in {}",
        owners.len(),
        args.locks.div_ceil(10),
        secs(t.elapsed())
    );

    // ConfigMaps: the locks, and plain ones up to the total.
    let t = Instant::now();
    let plain = args.configmaps - args.locks;
    let locks = owners
        .into_iter()
        .enumerate()
        .map(|(i, (ns, o))| (ns, format!("operator-{i}-lock"), Some(o)));
    let plains = (0..plain).map(|i| (ns_of(i), format!("app-config-{i}"), None));
    let jobs: Vec<_> = locks.chain(plains).collect();
    let n = jobs.len();
    futures::stream::iter(jobs)
        .map(|(ns, name, owner)| create_cm(client.clone(), ns, name, owner))
        .buffer_unordered(WRITERS)
        .collect::<Vec<()>>()
        .await;
    println!("{n} ConfigMaps created in {}", secs(t.elapsed()));
}

/// `scan` run `args.runs` times each way: all namespaces as JSON and as a
/// table, every namespace named, one namespace.
async fn time_scans(args: &Args, kc: &std::path::Path, namespaces: &[String]) {
    // Warm-up (and a check of what scan sees).
    let warm = scan(&args.bin, kc, &["-o".into(), "json".into()]).await;
    let report: serde_json::Value =
        serde_json::from_str(&warm.stdout).unwrap_or_else(|e| die(&format!("scan -o json: {e}")));
    let s = &report["summary"];
    println!(
        "scan sees: {} ConfigMaps scanned, {} locks, {} held, {} stale (exit {})",
        s["configMapsScanned"], s["total"], s["held"], s["stale"], warm.code
    );

    let mut all = Vec::new();
    let mut internal = Vec::new();
    for _ in 0..args.runs {
        let r = scan(&args.bin, kc, &["-o".into(), "json".into()]).await;
        let rep: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_default();
        internal.push(Duration::from_secs_f64(
            rep["summary"]["durationSeconds"].as_f64().unwrap_or(0.0),
        ));
        all.push(r.wall);
    }
    let mut table = Vec::new();
    for _ in 0..args.runs {
        table.push(scan(&args.bin, kc, &[]).await.wall);
    }
    let scoped_args: Vec<String> = namespaces
        .iter()
        .flat_map(|ns| ["--namespace".to_string(), ns.clone()])
        .collect();
    let mut scoped = Vec::new();
    for _ in 0..args.runs {
        scoped.push(scan(&args.bin, kc, &scoped_args).await.wall);
    }
    let mut one_ns = Vec::new();
    for _ in 0..args.runs {
        one_ns.push(
            scan(
                &args.bin,
                kc,
                &["--namespace".into(), namespaces[0].clone()],
            )
            .await
            .wall,
        );
    }

    println!();
    println!("scan, all namespaces, -o json (wall):   {}", stats(all));
    println!(
        "  of which listing + judging (summary):  {}",
        stats(internal)
    );
    println!("scan, all namespaces, table (wall):     {}", stats(table));
    println!(
        "scan, --namespace x{} (wall):           {}",
        namespaces.len(),
        stats(scoped)
    );
    println!(
        "scan, one namespace ({} ConfigMaps):  {}",
        args.configmaps / namespaces.len(),
        stats(one_ns)
    );
}

/// The ConfigMap list, metadata only and full objects, paged.
async fn time_configmap_lists(client: &Client, args: &Args) {
    let cms: Api<ConfigMap> = Api::all(client.clone());
    let mut meta = Vec::new();
    let mut full = Vec::new();
    for _ in 0..args.runs {
        let t = Instant::now();
        let n = paged(|lp| {
            let cms = cms.clone();
            async move {
                cms.list_metadata(&lp)
                    .await
                    .map(|l| (l.items.len(), l.metadata.continue_))
            }
        })
        .await;
        meta.push(t.elapsed());
        let t = Instant::now();
        let m = paged(|lp| {
            let cms = cms.clone();
            async move {
                cms.list(&lp)
                    .await
                    .map(|l| (l.items.len(), l.metadata.continue_))
            }
        })
        .await;
        full.push(t.elapsed());
        assert_eq!(n, m);
    }
    println!("ConfigMap list, metadata only (paged):  {}", stats(meta));
    println!("ConfigMap list, full objects (paged):   {}", stats(full));
}

/// The holders read as scan reads them (a GET each, 16 in flight) and by
/// a pod list per namespace.
async fn time_holder_reads(
    client: &Client,
    args: &Args,
    namespaces: &[String],
    ns_of: &dyn Fn(usize) -> String,
) {
    let holders: Vec<(String, String)> = (0..args.locks)
        .map(|i| (ns_of(i), format!("operator-{i}")))
        .collect();
    let mut gets = Vec::new();
    let mut lists = Vec::new();
    for _ in 0..args.runs {
        let t = Instant::now();
        futures::stream::iter(holders.clone())
            .map(|(ns, name)| {
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                async move { api.get_opt(&name).await }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await
            .unwrap_or_else(|e| die(&format!("get pod: {e}")));
        gets.push(t.elapsed());
        let t = Instant::now();
        for ns in namespaces {
            let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
            paged(|lp| {
                let pods = pods.clone();
                async move {
                    pods.list(&lp)
                        .await
                        .map(|l| (l.items.len(), l.metadata.continue_))
                }
            })
            .await;
        }
        lists.push(t.elapsed());
    }
    println!(
        "holders: {} GETs, 16 in flight (scan):  {}",
        args.locks,
        stats(gets)
    );
    println!(
        "holders: one pod list per namespace:    {}  (every pod here is a holder: the list's best case)",
        stats(lists)
    );
}

/// Follows continue tokens, 500 per page; returns the item count.
async fn paged<F, Fut>(mut page: F) -> usize
where
    F: FnMut(ListParams) -> Fut,
    Fut: std::future::Future<Output = kube::Result<(usize, Option<String>)>>,
{
    let mut token: Option<String> = None;
    let mut n = 0;
    loop {
        let mut lp = ListParams::default().limit(500);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let (count, next) = page(lp)
            .await
            .unwrap_or_else(|e| die(&format!("list: {e}")));
        n += count;
        token = next.filter(|t| !t.is_empty());
        if token.is_none() {
            return n;
        }
    }
}
