//! What the janitor costs idle in a cluster of many pods that hold no lock,
//! and what a Lease judgement costs in memory, as users run it: two replicas
//! with `--leader-elect` (the chart's default), each as its own user so that
//! the API server's audit log says whose request it was. It reports numbers
//! beside the goals of issue 20; it passes or fails nothing on them.
//!
//! `hack/bench-idle.sh` (`make bench-idle`) builds and runs this. By hand:
//!
//! ```text
//! cargo build --release --bin lock-janitor
//! LOCK_JANITOR_BIN=target/release/lock-janitor cargo run --release --example bench_idle -- \
//!     [--locks 1000] [--lock-namespaces 20] [--bystanders 50000] [--bystander-namespaces 25] \
//!     [--running-percent 60] [--churn-per-min 1000] [--job-run-secs 10] [--job-ttl-secs 60] \
//!     [--resync 5m] [--window-secs 600] [--baseline-window-secs <window>] \
//!     [--lease-pods 5000] [--writers 64]
//! ```
//!
//! The cluster. `--locks` ConfigMap locks as operator-lib writes them (no
//! data, one ownerReference to the Running holder pod, labeled
//! `lock-janitor.io/watch=true`), spread over `--lock-namespaces`
//! namespaces. Later `--bystanders` pods that hold no lock, in namespaces of
//! their own, `--running-percent` Running and the rest Succeeded (status
//! written through the status subresource, as a kubelet would; no node runs
//! them), created `--writers` at a time; and a Job-like churn in one more
//! namespace: `--churn-per-min` pods a minute, each created, Running,
//! Succeeded after `--job-run-secs` and deleted `--job-ttl-secs` later (as
//! `ttlSecondsAfterFinished` does). The pod garbage collector's
//! terminated-pod threshold (12,500 by default) is raised so that the
//! Succeeded bystanders stay.
//!
//! Phase B, the baseline: two janitors over the locks alone, measured for
//! `--baseline-window-secs` (default: the window). Phase A: the bystanders
//! and the churn added, two fresh janitors, measured for `--window-secs`
//! (default 10 minutes: two resyncs at the default `--resync 5m`). In each
//! window: every request of the janitors' users in the audit log (received
//! in the window; a watch counts when it starts, so watch restarts count),
//! split into election (Leases in the election namespace) and everything
//! else, per verb and resource; each process's CPU time (utime + stime from
//! `/proc/<pid>/stat`) as a share of one core; VmRSS and VmHWM at the end.
//! A shorter `--resync` makes more sweeps in the window: the sweep lists
//! scale with 1/resync (the table also shows the lists scaled back to 5m),
//! watch restarts and election do not.
//!
//! Phase C, a Lease judgement: `--lease-pods` Running pods in one new
//! namespace, one of them the holder of a Lease as client-go writes it
//! (holderIdentity = its pod name, 15 s, renewed every 2 s, opted in). Once
//! both janitors hold it judged, their VmHWM is reset to VmRSS
//! (`/proc/<pid>/clear_refs`), the holder fails (phase Failed) and renews
//! no more, and once the leader has released the Lease the rise of each
//! VmHWM over the VmRSS before is reported.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testenv::{fresh_namespace, kubelet, ControlPlane, Options};
use lock_janitor_testsupport::bench::*;
use lock_janitor_testsupport::*;

/// Each replica's own user (both bound to what the chart grants).
const USERS: [&str; 2] = ["lock-janitor-idle-a", "lock-janitor-idle-b"];
/// The janitor's leader-election Lease (its default name).
const ELECTION_LEASE: &str = "lock-janitor";
/// Every request at Metadata level but health checks: the janitor's
/// discovery or any read of another resource counts too.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    nonResourceURLs: ["/healthz*", "/readyz*", "/livez*"]
  - level: Metadata
"#;

/// What the janitor costs idle among many pods that hold no lock (see the
/// file's doc).
#[derive(clap::Parser)]
#[command(args_override_self = true)]
struct Args {
    /// ConfigMap locks.
    #[arg(long, default_value_t = 1000)]
    locks: usize,
    /// Namespaces the locks are spread over.
    #[arg(long = "lock-namespaces", default_value_t = 20)]
    lock_namespaces: usize,
    /// Pods that hold no lock.
    #[arg(long, default_value_t = 50_000)]
    bystanders: usize,
    /// Namespaces the bystanders are spread over.
    #[arg(long = "bystander-namespaces", default_value_t = 25)]
    bystander_namespaces: usize,
    /// Of the bystanders, the share Running (the rest Succeeded).
    #[arg(long = "running-percent", default_value_t = 60)]
    running_percent: usize,
    /// Job-like pods created a minute.
    #[arg(long = "churn-per-min", default_value_t = 1000)]
    churn_per_min: u64,
    /// Seconds a Job-like pod runs.
    #[arg(long = "job-run-secs", value_name = "N", default_value = "10", value_parser = seconds)]
    job_run: Duration,
    /// Seconds a finished Job-like pod stays.
    #[arg(long = "job-ttl-secs", value_name = "N", default_value = "60", value_parser = seconds)]
    job_ttl: Duration,
    /// The janitors' --resync: 90s, 5m, 1h, or plain seconds.
    #[arg(long, value_name = "D", default_value = "5m", value_parser = resync_arg)]
    resync: String,
    /// --resync in seconds.
    #[arg(skip)]
    resync_secs: f64,
    /// Seconds of the measured window.
    #[arg(long = "window-secs", value_name = "N", default_value = "600", value_parser = seconds)]
    window: Duration,
    /// Seconds of the baseline's window (default: --window-secs).
    #[arg(long = "baseline-window-secs", value_name = "N", value_parser = seconds)]
    baseline: Option<Duration>,
    /// The baseline's window, as run.
    #[arg(skip)]
    baseline_window: Duration,
    /// Running pods in the namespace of the Lease judgement (phase C).
    #[arg(long = "lease-pods", default_value_t = 5000)]
    lease_pods: usize,
    /// Object writes in flight while setting up.
    #[arg(long, default_value_t = 64)]
    writers: usize,
}

/// `90s`, `5m`, `1h`, or plain seconds.
fn parse_resync(v: &str) -> Option<f64> {
    let (n, unit) = match v.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => v.split_at(i),
        None => (v, "s"),
    };
    let n: f64 = n.parse().ok()?;
    let f = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    (n > 0.0).then_some(n * f)
}

/// `--resync`, checked: a duration `parse_resync` reads.
fn resync_arg(v: &str) -> Result<String, String> {
    parse_resync(v)
        .map(|_| v.to_owned())
        .ok_or_else(|| format!("{v:?} is not a duration like 60s or 5m"))
}

fn parse_args() -> Args {
    let mut a = <Args as clap::Parser>::parse();
    a.resync_secs = parse_resync(&a.resync).unwrap_or(300.0);
    a.baseline_window = a.baseline.unwrap_or(a.window);
    if a.locks == 0
        || a.lock_namespaces == 0
        || a.bystander_namespaces == 0
        || a.running_percent > 100
        || a.window.is_zero()
        || a.baseline_window.is_zero()
        || a.lease_pods == 0
        || a.writers == 0
    {
        die("need locks, namespaces, windows, lease-pods and writers > 0, running-percent <= 100");
    }
    let bin = janitor_bin();
    if !bin.exists() {
        die(&format!(
            "{} not found: build it with `cargo build --release --bin lock-janitor` and set \
             LOCK_JANITOR_BIN (hack/bench-idle.sh does both)",
            bin.display()
        ));
    }
    a
}

/// Load averages, as `uptime` prints them.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| die(&format!("reading /proc/{pid}/stat: {e}")));
    // Fields after the command name, which may hold spaces: state is the 3rd.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// Resets VmHWM to VmRSS. False if the kernel refused.
fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Sum of the samples of `name` whose labels include `labels`.
fn sum_samples(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

async fn scrape(j: &Janitor) -> String {
    match http_get(j.port, "/metrics").await {
        Ok((200, body)) => body,
        _ => String::new(),
    }
}

async fn leading(j: &Janitor) -> bool {
    sample(&scrape(j).await, "lock_janitor_leader", &[]) == Some(1.0)
}

/// Tolerates a busy API server: a few attempts, then gives up (None).
async fn attempt<T, F, Fut>(mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    for i in 0..4u64 {
        match f().await {
            Ok(v) => return Some(v),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => return None,
            Err(_) => tokio::time::sleep(Duration::from_millis(200 * (i + 1))).await,
        }
    }
    None
}

/// A pod bound to `node`, as `kubelet::create_pod` makes it (without its
/// look-up of the node, which exists). A pod already there counts as made.
async fn create_pod(client: &Client, ns: &str, name: &str, node: &str, app: &str) -> bool {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "main".into(),
                image: Some(kubelet::PAUSE_IMAGE.into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    for i in 0..6u64 {
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) if s.code == 409 => return true,
            Err(e) if i == 5 => {
                eprintln!("creating pod {ns}/{name}: {e}");
                return false;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250 * (i + 1))).await,
        }
    }
    false
}

/// A pod that holds no lock: Running, or Succeeded (a finished Job's).
async fn bystander(client: &Client, ns: &str, i: usize, running: bool) {
    let name = if running {
        format!("web-{i}")
    } else {
        format!("job-{i}")
    };
    let app = if running { "web" } else { "batch" };
    if !create_pod(client, ns, &name, &node_of(i), app).await {
        return;
    }
    if running {
        retry(&format!("pod {ns}/{name} Running"), || {
            kubelet::set_running(client, ns, &name)
        })
        .await;
    } else {
        retry(&format!("pod {ns}/{name} Succeeded"), || {
            kubelet::set_succeeded(client, ns, &name)
        })
        .await;
    }
}

/// Lock `i`: a Running holder `operator-{i}` and its lock `operator-{i}-lock`.
async fn holder_and_lock(client: Client, ns: String, i: usize) {
    let holder = format!("operator-{i}");
    let pod = running(&client, &ns, &holder, &node_of(i), "operator").await;
    let cm = lock_for(&format!("{holder}-lock"), &pod, true);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    retry(&format!("creating lock {ns}/{holder}-lock"), || async {
        match cms.create(&PostParams::default(), &cm).await {
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(cm.clone()),
            r => r,
        }
    })
    .await;
}

/// Runs `jobs` with `writers` in flight, printing progress every 30 s.
async fn in_flight<F>(what: &str, n: usize, writers: usize, job: impl Fn(usize) -> F)
where
    F: std::future::Future<Output = ()>,
{
    let t = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let progress = {
        let (done, what) = (done.clone(), what.to_string());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            tick.tick().await;
            loop {
                tick.tick().await;
                let d = done.load(Ordering::Relaxed);
                println!(
                    "    ... {d}/{n} {what} after {} (load {})",
                    secs(t.elapsed()),
                    load()
                );
            }
        })
    };
    futures::stream::iter(0..n)
        .map(|i| {
            let done = done.clone();
            let f = job(i);
            async move {
                f.await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
        .buffer_unordered(writers)
        .collect::<Vec<()>>()
        .await;
    progress.abort();
    println!(
        "    {n} {what} in {} ({:.0}/s)",
        secs(t.elapsed()),
        n as f64 / t.elapsed().as_secs_f64().max(0.001)
    );
}

#[derive(Default)]
struct ChurnStats {
    started: AtomicU64,
    succeeded: AtomicU64,
    deleted: AtomicU64,
    failed: AtomicU64,
}

/// The Job-like churn: `per_min` pods a minute, each created, Running,
/// Succeeded after `run`, deleted `ttl` later. Stops creating when `stop`.
fn churn(
    client: Client,
    ns: String,
    per_min: u64,
    run: Duration,
    ttl: Duration,
    stop: Arc<AtomicBool>,
    stats: Arc<ChurnStats>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if per_min == 0 {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs_f64(60.0 / per_min as f64));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0usize;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            n += 1;
            let (client, ns, stats) = (client.clone(), ns.clone(), stats.clone());
            tokio::spawn(async move {
                let name = format!("batch-{n}");
                stats.started.fetch_add(1, Ordering::Relaxed);
                let ok = create_pod(&client, &ns, &name, &node_of(n), "batch").await
                    && attempt(|| kubelet::set_running(&client, &ns, &name))
                        .await
                        .is_some();
                if ok {
                    tokio::time::sleep(run).await;
                }
                if ok
                    && attempt(|| kubelet::set_succeeded(&client, &ns, &name))
                        .await
                        .is_some()
                {
                    stats.succeeded.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(ttl).await;
                } else {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                }
                if attempt(|| kubelet::force_delete_pod(&client, &ns, &name))
                    .await
                    .is_some()
                {
                    stats.deleted.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    })
}

/// Requests of the janitors' users in the audit log, by user and by what.
#[derive(Default, Clone)]
struct Requests {
    /// user -> "verb resource" -> count
    by_user: HashMap<String, BTreeMap<String, u64>>,
}

impl Requests {
    fn count(&self, user: &str, pred: impl Fn(&str) -> bool) -> u64 {
        self.by_user
            .get(user)
            .map(|m| m.iter().filter(|(k, _)| pred(k)).map(|(_, v)| v).sum())
            .unwrap_or(0)
    }
    fn election(&self, user: &str) -> u64 {
        self.count(user, |k| k.starts_with("election "))
    }
    fn beside(&self, user: &str) -> u64 {
        self.count(user, |k| !k.starts_with("election "))
    }
    fn lists(&self, user: &str) -> u64 {
        self.count(user, |k| k.starts_with("list "))
    }
    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .by_user
            .values()
            .flat_map(|m| m.keys().cloned())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        // Election first, then by name.
        keys.sort_by_key(|k| (!k.starts_with("election "), k.clone()));
        keys
    }
}

/// The audit log's length now: where a window starts reading.
fn audit_offset(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The janitors' requests received in [from, to], read from `offset` on.
/// `election_ns`: the namespace of the leader-election Lease. `only_ns`:
/// count only requests in this namespace (None: all).
fn janitor_requests(
    path: &Path,
    offset: u64,
    from: Timestamp,
    to: Timestamp,
    election_ns: &str,
    only_ns: Option<&str>,
) -> Requests {
    let mut f = std::fs::File::open(path)
        .unwrap_or_else(|e| die(&format!("opening {}: {e}", path.display())));
    f.seek(std::io::SeekFrom::Start(offset))
        .unwrap_or_else(|e| die(&format!("seeking {}: {e}", path.display())));
    let mut seen = HashSet::new();
    let mut out = Requests::default();
    for line in std::io::BufReader::new(f).lines() {
        let Ok(line) = line else { break };
        if !USERS.iter().any(|u| line.contains(u)) {
            continue;
        }
        let Some(e) = AuditEvent::parse(&line) else {
            continue;
        };
        let user = e.effective_user().to_string();
        if !USERS.contains(&user.as_str()) || !seen.insert(e.audit_id.clone()) {
            continue;
        }
        let Some(at) = e
            .received
            .as_deref()
            .and_then(|r| r.parse::<Timestamp>().ok())
        else {
            continue;
        };
        if at < from || at > to {
            continue;
        }
        if only_ns.is_some() && e.namespace.as_deref() != only_ns {
            continue;
        }
        let resource = match (&e.resource, &e.subresource) {
            (Some(r), Some(s)) => format!("{r}/{s}"),
            (Some(r), None) => r.clone(),
            (None, _) => e
                .request_uri
                .split('?')
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        let election = e.resource.as_deref() == Some("leases")
            && e.namespace.as_deref() == Some(election_ns)
            && e.name.as_deref().is_none_or(|n| n == ELECTION_LEASE);
        let key = if election {
            format!("election {} {resource}", e.verb)
        } else {
            // A list's first page (a sweep or a watch's list) or a later one.
            let page = if e.verb == "list" && e.request_uri.contains("continue=") {
                " (later pages)"
            } else {
                ""
            };
            format!("{} {resource}{page}", e.verb)
        };
        *out.by_user.entry(user).or_default().entry(key).or_default() += 1;
    }
    out
}

/// One janitor replica of a phase.
struct Replica {
    user: &'static str,
    janitor: Janitor,
}

/// A phase's figures, per replica (in `USERS` order).
struct Measured {
    name: String,
    window: Duration,
    requests: Requests,
    cpu_secs: Vec<f64>,
    mem: Vec<Mem>,
    leader: Vec<bool>,
    load_before: String,
    load_after: String,
}

impl Measured {
    fn rate(&self, n: u64) -> f64 {
        n as f64 / self.window.as_secs_f64()
    }
    fn beside_rate(&self) -> f64 {
        self.rate(USERS.iter().map(|u| self.requests.beside(u)).sum())
    }
    fn election_rate(&self) -> f64 {
        self.rate(USERS.iter().map(|u| self.requests.election(u)).sum())
    }
    /// Beside election, with the lists scaled from `resync` to 5 minutes.
    fn beside_rate_at_5m(&self, resync_secs: f64) -> f64 {
        let all: u64 = USERS.iter().map(|u| self.requests.beside(u)).sum();
        let lists: u64 = USERS.iter().map(|u| self.requests.lists(u)).sum();
        self.rate(all - lists) + self.rate(lists) * resync_secs / 300.0
    }
    fn cpu_percent(&self, i: usize) -> f64 {
        100.0 * self.cpu_secs[i] / self.window.as_secs_f64()
    }
    fn role(&self, i: usize) -> &'static str {
        if self.leader[i] {
            "leader"
        } else {
            "standby"
        }
    }
    /// Index of the leader (else the first).
    fn leader_index(&self) -> usize {
        self.leader.iter().position(|l| *l).unwrap_or(0)
    }

    fn print(&self) {
        println!();
        println!(
            "{}: {} window; load {} before, {} after",
            self.name,
            secs(self.window),
            self.load_before,
            self.load_after
        );
        let head: Vec<String> = (0..USERS.len())
            .map(|i| format!("{} ({})", USERS[i], self.role(i)))
            .collect();
        println!(
            "  {:<44} {:>30} {:>30} {:>8} {:>8}",
            "requests (audit log)", head[0], head[1], "both", "req/s"
        );
        for key in self.requests.keys() {
            let per: Vec<u64> = USERS
                .iter()
                .map(|u| self.requests.count(u, |k| k == key))
                .collect();
            let both: u64 = per.iter().sum();
            println!(
                "  {:<44} {:>30} {:>30} {:>8} {:>8.3}",
                key,
                per[0],
                per[1],
                both,
                self.rate(both)
            );
        }
        let e: Vec<u64> = USERS.iter().map(|u| self.requests.election(u)).collect();
        let b: Vec<u64> = USERS.iter().map(|u| self.requests.beside(u)).collect();
        println!(
            "  {:<44} {:>30} {:>30} {:>8} {:>8.3}",
            "= election",
            e[0],
            e[1],
            e[0] + e[1],
            self.election_rate()
        );
        println!(
            "  {:<44} {:>30} {:>30} {:>8} {:>8.3}",
            "= beside election",
            b[0],
            b[1],
            b[0] + b[1],
            self.beside_rate()
        );
        for (i, user) in USERS.iter().enumerate() {
            println!(
                "  {user} ({}): CPU {:.2} s = {:.2}% of one core; VmRSS {} MiB, VmHWM {} MiB",
                self.role(i),
                self.cpu_secs[i],
                self.cpu_percent(i),
                mib(self.mem[i].rss),
                mib(self.mem[i].hwm)
            );
        }
    }
}

struct Plane {
    cp: ControlPlane,
    client: Client,
    election_ns: String,
    kubeconfigs: Vec<PathBuf>,
}

impl Plane {
    fn janitor_args<'a>(&'a self, resync: &'a str) -> Vec<&'a str> {
        vec![
            "--leader-elect",
            "--leader-elect-namespace",
            &self.election_ns,
            "--resync",
            resync,
        ]
    }

    /// Two replicas, each as its own user; returns once both are ready,
    /// one leads and both have judged `locks` ConfigMap locks held.
    async fn start_janitors(&self, resync: &str, locks: usize) -> Vec<Replica> {
        let t = Instant::now();
        let args = self.janitor_args(resync);
        let replicas: Vec<Replica> = USERS
            .iter()
            .zip(&self.kubeconfigs)
            .map(|(user, kc)| Replica {
                user,
                janitor: Janitor::spawn(kc, &args),
            })
            .collect();
        for r in &replicas {
            let j = &r.janitor;
            wait_for(
                &format!("{} ready", r.user),
                Duration::from_secs(600),
                || async { (j.readyz().await == Some(200)).then_some(()) },
            )
            .await;
        }
        wait_for("one leader", Duration::from_secs(120), || async {
            let mut n = 0;
            for r in &replicas {
                n += leading(&r.janitor).await as usize;
            }
            (n == 1).then_some(())
        })
        .await;
        for r in &replicas {
            let j = &r.janitor;
            wait_for(
                &format!("{} judging {locks} locks held", r.user),
                Duration::from_secs(600),
                || async {
                    let m = scrape(j).await;
                    let held = sum_samples(
                        &m,
                        "lock_janitor_locks",
                        &[("kind", "configmap"), ("state", "held")],
                    );
                    (held as usize >= locks).then_some(())
                },
            )
            .await;
        }
        println!(
            "    two janitors ready, one leading, every lock judged held, {} after start \
             (VmRSS {} MiB)",
            secs(t.elapsed()),
            replicas
                .iter()
                .map(|r| mib(mem(r.janitor.pid()).rss))
                .collect::<Vec<_>>()
                .join(" / ")
        );
        replicas
    }

    /// Measures `replicas` over `window`, opened half a resync (at most
    /// 150 s) after now: each replica swept when it got ready, so a window
    /// of whole resyncs then holds whole sweeps, not one cut at its edge.
    async fn measure(
        &self,
        name: &str,
        replicas: &[Replica],
        window: Duration,
        resync_secs: f64,
    ) -> Measured {
        let offset_in = Duration::from_secs_f64((resync_secs / 2.0).min(150.0));
        println!(
            "    {} (half a resync) before the window opens",
            secs(offset_in)
        );
        tokio::time::sleep(offset_in).await;
        let hz = clock_ticks();
        let audit = self.cp.audit_log_path().to_path_buf();
        let offset = audit_offset(&audit);
        let from = Timestamp::now();
        let load_before = load();
        let cpu0: Vec<u64> = replicas
            .iter()
            .map(|r| cpu_ticks(r.janitor.pid()))
            .collect();
        let t = Instant::now();
        println!(
            "    measuring {} from {from} (load {load_before})",
            secs(window)
        );
        let mut left = window;
        while !left.is_zero() {
            let nap = left.min(Duration::from_secs(60));
            tokio::time::sleep(nap).await;
            left -= nap;
            if !left.is_zero() {
                println!(
                    "    ... {} of {} (load {})",
                    secs(t.elapsed()),
                    secs(window),
                    load()
                );
            }
        }
        let cpu1: Vec<u64> = replicas
            .iter()
            .map(|r| cpu_ticks(r.janitor.pid()))
            .collect();
        let elapsed = t.elapsed();
        let to = Timestamp::now();
        let mem: Vec<Mem> = replicas.iter().map(|r| mem(r.janitor.pid())).collect();
        let load_after = load();
        let mut leader = Vec::new();
        for r in replicas {
            leader.push(leading(&r.janitor).await);
        }
        // Blocking audit mode writes before answering; a moment for the file.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let requests = janitor_requests(&audit, offset, from, to, &self.election_ns, None);
        Measured {
            name: name.into(),
            window: elapsed,
            requests,
            cpu_secs: cpu0
                .iter()
                .zip(&cpu1)
                .map(|(a, b)| (b - a) as f64 / hz)
                .collect(),
            mem,
            leader,
            load_before,
            load_after,
        }
    }
}

async fn plane(args: &Args) -> Plane {
    let policy = std::env::temp_dir().join(format!(
        "lock-janitor-bench-idle-audit-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&policy, AUDIT_POLICY)
        .unwrap_or_else(|e| die(&format!("writing {}: {e}", policy.display())));
    let opts = Options {
        // The last --audit-policy-file wins: every request is logged.
        extra_apiserver_args: vec![format!("--audit-policy-file={}", policy.display())],
        // Keep the Succeeded bystanders (the default threshold is 12,500).
        extra_controller_manager_args: vec![format!(
            "--terminated-pod-gc-threshold={}",
            (args.bystanders + args.lease_pods + 100_000).min(i32::MAX as usize)
        )],
        ..Default::default()
    };
    let cp = ControlPlane::start(opts)
        .await
        .unwrap_or_else(|e| die(&e.to_string()));
    let client = cp.client().await.unwrap_or_else(|e| die(&e.to_string()));
    grant_janitor(&client).await;
    let election_ns = fresh_namespace(&client, "lock-janitor").await;
    let verbs = ["get", "create", "update"];
    let mut kubeconfigs = Vec::new();
    for u in USERS {
        bind_cluster_role(&client, u, JANITOR_USER).await;
        let rules = vec![rule(&["coordination.k8s.io"], &["leases"], &verbs)];
        grant_in(
            &client,
            &election_ns,
            &format!("election-{u}"),
            user(u),
            rules,
        )
        .await;
        kubeconfigs.push(kubeconfig_as(&cp, u));
    }
    for n in 0..NODES {
        let node = node_of(n);
        retry("creating a node", || kubelet::create_node(&client, &node)).await;
    }
    Plane {
        cp,
        client,
        election_ns,
        kubeconfigs,
    }
}

/// A Lease as client-go writes it, held by `holder` (its pod name).
fn lease(name: &str, holder: &str) -> Lease {
    let now = MicroTime(Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                WATCH_LABEL.0.to_string(),
                WATCH_LABEL.1.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    }
}

struct LeaseFigures {
    before: Vec<Mem>,
    after: Vec<Mem>,
    reset: bool,
    released_after: Option<Duration>,
    requests: Requests,
    pods: usize,
}

/// `args.lease_pods` pods Running in `ns`, `args.writers` at a time.
async fn running_pods(client: &Client, ns: &str, args: &Args) {
    let (client, ns) = (client.clone(), ns.to_owned());
    in_flight(
        &format!("Running pods in {ns}"),
        args.lease_pods,
        args.writers,
        |i| {
            let (client, ns) = (client.clone(), ns.clone());
            async move {
                let name = format!("app-{i}");
                if create_pod(&client, &ns, &name, &node_of(i), "app").await {
                    retry(&format!("pod {ns}/{name} Running"), || {
                        kubelet::set_running(&client, &ns, &name)
                    })
                    .await;
                }
            }
        },
    )
    .await;
}

/// Renews the Lease app-leader every 2 s until `renewing` is false.
fn renew_every_2s(leases: &Api<Lease>, renewing: &Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let (leases, renewing) = (leases.clone(), renewing.clone());
    tokio::spawn(async move {
        while renewing.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if !renewing.load(Ordering::Relaxed) {
                break;
            }
            let patch = serde_json::json!({"spec": {"renewTime": MicroTime(Timestamp::now())}});
            let _ = leases
                .patch("app-leader", &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
    })
}

/// How long after `killed` the Lease app-leader named another holder than
/// `holder`; None if not within `within`.
async fn released_within(
    leases: &Api<Lease>,
    holder: &str,
    killed: Instant,
    within: Duration,
) -> Option<Duration> {
    tokio::time::timeout(within, async {
        loop {
            if let Ok(l) = leases.get("app-leader").await {
                let who = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
                if who != holder {
                    return killed.elapsed();
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .ok()
}

/// Phase C: a Lease held in a namespace of `args.lease_pods` pods, its
/// holder failed; the janitors' peak memory around the judgement.
async fn lease_judgement(p: &Plane, replicas: &[Replica], args: &Args) -> LeaseFigures {
    let ns = fresh_namespace(&p.client, "lease-app").await;
    running_pods(&p.client, &ns, args).await;
    let holder = "app-0";
    let leases: Api<Lease> = Api::namespaced(p.client.clone(), &ns);
    let made = lease("app-leader", holder);
    retry("creating the Lease", || {
        let (leases, made) = (leases.clone(), made.clone());
        async move { leases.create(&PostParams::default(), &made).await }
    })
    .await;
    // The holder renews every 2 s, as client-go's elector would.
    let renewing = Arc::new(AtomicBool::new(true));
    let renewer = renew_every_2s(&leases, &renewing);
    for r in replicas {
        let j = &r.janitor;
        wait_for(
            &format!("{} judging the Lease held", r.user),
            Duration::from_secs(300),
            || async {
                let m = scrape(j).await;
                let held = sum_samples(
                    &m,
                    "lock_janitor_locks",
                    &[("kind", "lease"), ("state", "held")],
                );
                (held >= 1.0).then_some(())
            },
        )
        .await;
    }
    println!("    both janitors judged the Lease held; 10 s of renewals");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let reset = replicas.iter().all(|r| reset_peak(r.janitor.pid()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<Mem> = replicas.iter().map(|r| mem(r.janitor.pid())).collect();
    let audit = p.cp.audit_log_path().to_path_buf();
    let offset = audit_offset(&audit);
    let from = Timestamp::now();
    renewing.store(false, Ordering::Relaxed);
    let _ = renewer.await;
    let killed = Instant::now();
    retry("failing the holder", || {
        kubelet::set_failed(&p.client, &ns, holder, "Error", "exit code 1")
    })
    .await;
    let released = released_within(&leases, holder, killed, Duration::from_secs(180)).await;
    // Both replicas judge the death; let the standby's judgement land too.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after: Vec<Mem> = replicas.iter().map(|r| mem(r.janitor.pid())).collect();
    let to = Timestamp::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let requests = janitor_requests(&audit, offset, from, to, &p.election_ns, Some(&ns));
    LeaseFigures {
        before,
        after,
        reset,
        released_after: released,
        requests,
        pods: args.lease_pods,
    }
}

fn signed_mib(kib: i64) -> String {
    format!("{:+.1}", kib as f64 / 1024.0)
}

#[tokio::main]
async fn main() {
    let run = Instant::now();
    let args = parse_args();
    // The chart's log level (RUST_LOG set by Janitor::spawn from this).
    if std::env::var_os("LOCK_JANITOR_TEST_LOG").is_none() {
        std::env::set_var("LOCK_JANITOR_TEST_LOG", "info");
    }
    println!(
        "bench_idle: {} locks in {} namespaces; {} bystander pods ({}% Running) in {} \
         namespaces; churn {} pods/min; janitor {} (two replicas, --leader-elect, --resync {}); \
         windows {} (without bystanders) and {} (with); Lease judgement among {} pods; load {}",
        args.locks,
        args.lock_namespaces,
        args.bystanders,
        args.running_percent,
        args.bystander_namespaces,
        args.churn_per_min,
        janitor_bin().display(),
        args.resync,
        secs(args.baseline_window),
        secs(args.window),
        args.lease_pods,
        load()
    );

    step("Control plane");
    let t = Instant::now();
    let p = plane(&args).await;
    println!(
        "    started in {}; janitors as {} and {}; election Lease in {}",
        secs(t.elapsed()),
        USERS[0],
        USERS[1],
        p.election_ns
    );

    stage_locks(&p, &args).await;

    step("Phase B: two janitors, the locks alone");
    let replicas = p.start_janitors(&args.resync, args.locks).await;
    let without = p
        .measure(
            "B. locks alone",
            &replicas,
            args.baseline_window,
            args.resync_secs,
        )
        .await;
    without.print();
    drop(replicas);

    let (stop, stats, churner) = bystanders_and_churn(&p, &args).await;

    step("Phase A: two fresh janitors, the locks among the bystanders and the churn");
    let replicas = p.start_janitors(&args.resync, args.locks).await;
    let with = p
        .measure(
            "A. locks + bystanders + churn",
            &replicas,
            args.window,
            args.resync_secs,
        )
        .await;
    with.print();
    stop.store(true, Ordering::Relaxed);
    let _ = churner.await;
    let churn_line = format!(
        "churn: {} pods started, {} Succeeded, {} deleted, {} failed to be written",
        stats.started.load(Ordering::Relaxed),
        stats.succeeded.load(Ordering::Relaxed),
        stats.deleted.load(Ordering::Relaxed),
        stats.failed.load(Ordering::Relaxed)
    );
    println!("  {churn_line} (creation stopped)");

    step(&format!(
        "Phase C: a Lease among {} pods of one namespace, its holder fails",
        args.lease_pods
    ));
    let lease = lease_judgement(&p, &replicas, &args).await;
    drop(replicas);

    print_table(&args, &with, &without, &lease);
    print_lease_outcome(&lease);
    println!("{churn_line}");
    println!("whole run {} (load now {})", secs(run.elapsed()), load());
    drop(p);
}

/// The ConfigMap locks with Running holders, in namespaces of their own.
async fn stage_locks(p: &Plane, args: &Args) {
    step(&format!(
        "{} ConfigMap locks with Running holders in {} namespaces",
        args.locks, args.lock_namespaces
    ));
    let mut lock_ns = Vec::new();
    for i in 0..args.lock_namespaces {
        lock_ns.push(fresh_namespace(&p.client, &format!("ops-{i}")).await);
    }
    let client = p.client.clone();
    in_flight("holders and locks", args.locks, args.writers, |i| {
        holder_and_lock(client.clone(), lock_ns[i % lock_ns.len()].clone(), i)
    })
    .await;
}

/// The bystander pods, then the Job churn brought to its steady state;
/// returns the churn's stop flag, its counts and its task.
async fn bystanders_and_churn(
    p: &Plane,
    args: &Args,
) -> (
    Arc<AtomicBool>,
    Arc<ChurnStats>,
    tokio::task::JoinHandle<()>,
) {
    let client = p.client.clone();
    step(&format!(
        "{} bystander pods in {} namespaces, {} writers in flight",
        args.bystanders, args.bystander_namespaces, args.writers
    ));
    let mut by_ns = Vec::new();
    for i in 0..args.bystander_namespaces {
        by_ns.push(fresh_namespace(&p.client, &format!("apps-{i}")).await);
    }
    let jobs_ns = fresh_namespace(&p.client, "jobs").await;
    let percent = args.running_percent;
    in_flight("bystander pods", args.bystanders, args.writers, |i| {
        let (client, ns) = (client.clone(), by_ns[i % by_ns.len()].clone());
        async move { bystander(&client, &ns, i, i % 100 < percent).await }
    })
    .await;

    step(&format!(
        "Job churn in {jobs_ns}: {} pods/min (Running, Succeeded after {}, deleted {} later)",
        args.churn_per_min,
        secs(args.job_run),
        secs(args.job_ttl)
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(ChurnStats::default());
    let churner = churn(
        p.client.clone(),
        jobs_ns.clone(),
        args.churn_per_min,
        args.job_run,
        args.job_ttl,
        stop.clone(),
        stats.clone(),
    );
    // Into its steady state: pods finishing and deleted all along.
    let warm = args.job_run + args.job_ttl.min(Duration::from_secs(30));
    println!("    {} for the churn to reach its steady state", secs(warm));
    tokio::time::sleep(warm).await;
    (stop, stats, churner)
}

/// One row of the table: figure, measured value, goal.
fn row(fig: &str, val: String, goal: &str) {
    println!("{fig:<66} {val:<46} {goal}");
}

/// The table: A (with bystanders and churn) against B (the locks alone),
/// and the Lease judgement's memory.
fn print_table(args: &Args, with: &Measured, without: &Measured, lease: &LeaseFigures) {
    println!();
    println!(
        "bench_idle: {} locks; {} bystanders + {} pods/min churn; --resync {}; windows {} / {}",
        args.locks,
        args.bystanders,
        args.churn_per_min,
        args.resync,
        secs(with.window),
        secs(without.window)
    );
    row("figure", "measured".into(), "goal (issue 20)");
    load_rows(args, with, without);
    memory_rows(with, without, lease);
}

/// The rows of the API load and the CPU.
fn load_rows(args: &Args, with: &Measured, without: &Measured) {
    let (la, lb) = (with.leader_index(), without.leader_index());
    let (sa, sb) = (1 - la, 1 - lb);
    row(
        "requests/s beside election, both replicas (A, with bystanders)",
        format!(
            "{:.3} (leader {:.3}, standby {:.3})",
            with.beside_rate(),
            with.rate(with.requests.beside(USERS[la])),
            with.rate(with.requests.beside(USERS[sa]))
        ),
        "<= 0.2",
    );
    if (args.resync_secs - 300.0).abs() > 0.5 {
        row(
            "  the same, lists scaled to --resync 5m (estimate)",
            format!("{:.3}", with.beside_rate_at_5m(args.resync_secs)),
            "<= 0.2",
        );
    }
    row(
        "requests/s beside election (B, without bystanders)",
        format!("{:.3}", without.beside_rate()),
        "(baseline)",
    );
    let watches = |m: &Measured| -> u64 {
        USERS
            .iter()
            .map(|u| m.requests.count(u, |k| k.starts_with("watch ")))
            .sum()
    };
    row(
        "  of which watches started (restarts), A / B",
        format!("{} / {}", watches(with), watches(without)),
        "(counted above)",
    );
    row(
        "election requests/s, both replicas (A / B)",
        format!(
            "{:.3} / {:.3}",
            with.election_rate(),
            without.election_rate()
        ),
        "(not counted)",
    );
    row(
        "CPU, % of one core, leader + standby (A)",
        format!(
            "{:.2} ({:.2} + {:.2})",
            with.cpu_percent(la) + with.cpu_percent(sa),
            with.cpu_percent(la),
            with.cpu_percent(sa)
        ),
        "<= 5",
    );
    row(
        "CPU, % of one core, leader + standby (B)",
        format!(
            "{:.2} ({:.2} + {:.2})",
            without.cpu_percent(lb) + without.cpu_percent(sb),
            without.cpu_percent(lb),
            without.cpu_percent(sb)
        ),
        "(baseline)",
    );
}

/// The rows of memory: A against B, and the Lease judgement's rise.
fn memory_rows(with: &Measured, without: &Measured, lease: &LeaseFigures) {
    let (la, lb) = (with.leader_index(), without.leader_index());
    let (sa, sb) = (1 - la, 1 - lb);
    let d = |a: u64, b: u64| signed_mib(a as i64 - b as i64);
    row(
        "VmRSS A - B, MiB (leader; standby)",
        format!(
            "{}; {}  ({} vs {}; {} vs {})",
            d(with.mem[la].rss, without.mem[lb].rss),
            d(with.mem[sa].rss, without.mem[sb].rss),
            mib(with.mem[la].rss),
            mib(without.mem[lb].rss),
            mib(with.mem[sa].rss),
            mib(without.mem[sb].rss)
        ),
        "within 2 MiB",
    );
    row(
        "VmHWM A - B, MiB (leader; standby)",
        format!(
            "{}; {}  ({} vs {}; {} vs {})",
            d(with.mem[la].hwm, without.mem[lb].hwm),
            d(with.mem[sa].hwm, without.mem[sb].hwm),
            mib(with.mem[la].hwm),
            mib(without.mem[lb].hwm),
            mib(with.mem[sa].hwm),
            mib(without.mem[sb].hwm)
        ),
        "(peaks)",
    );
    let rise = |i: usize| {
        let base = if lease.reset {
            lease.before[i].rss
        } else {
            lease.before[i].hwm
        };
        d(lease.after[i].hwm, base)
    };
    row(
        &format!(
            "Lease judgement among {} pods: VmHWM rise, MiB (leader; standby)",
            lease.pods
        ),
        format!(
            "{}; {}  (VmRSS before {} / {})",
            rise(la),
            rise(sa),
            mib(lease.before[la].rss),
            mib(lease.before[sa].rss)
        ),
        "<= 5",
    );
}

/// Whether the peak could be reset, and when the Lease was released with
/// the janitors' requests meanwhile.
fn print_lease_outcome(lease: &LeaseFigures) {
    println!();
    if !lease.reset {
        println!(
            "note: /proc/<pid>/clear_refs was refused: the Lease rise is VmHWM after - VmHWM \
             before, which hides a judgement below an earlier peak"
        );
    }
    match lease.released_after {
        Some(t) => {
            println!(
            "Lease released {} after the holder failed; the janitors' requests in its namespace \
             meanwhile: {}",
            secs(t),
            lease
                .requests
                .keys()
                .iter()
                .map(|k| {
                    let n: u64 = USERS.iter().map(|u| lease.requests.count(u, |x| x == k)).sum();
                    format!("{k}: {n}")
                })
                .collect::<Vec<_>>()
                .join(", ")
        )
        }
        None => {
            println!("WARNING: the Lease was not released within 180 s of the holder's failure")
        }
    }
}
