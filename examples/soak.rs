//! `make soak`: the janitor under churn for a long time, looking for what
//! grows. A control plane of its own, two janitors with leader election as
//! the chart's ServiceAccount with the chart's RBAC and arguments, and
//! `--locks` opted-in locks of the three kinds (a ConfigMap held for life, a
//! renewed Lease, a Lease held for life), a third each. Holders die all the
//! time (one every `--every-ms`), each dead holder's lock is freed by the
//! janitor and a new holder takes it; renewed Leases renew every 5 s; the API
//! server is restarted at a third and at two thirds of the run (watch
//! re-lists) and the leading janitor is SIGKILLed (and started again) at half.
//!
//! Every minute and at the end it prints, per janitor: RSS, open file
//! descriptors, threads, the per-lock state it remembers and the awaited
//! takeovers (from its resync sweep's log line), and its watch and
//! reconcile error counters. At the end: wrong writes (from the API server's
//! audit log: a freeing write whose lock's holder was not dead at that
//! moment), missed reclaims (a death whose lock was not freed within 2
//! minutes), and RSS growth after the first 5 minutes (per process, and per
//! stretch in one role from 5 minutes into it: a standby that takes the lead
//! takes on a leader's state). Exits 1 if any write was wrong, any reclaim
//! missed, or (in a run of 10 minutes or more) RSS grew 5 % or more within
//! a role, net of the per-lock reclaim series added meanwhile (memory that
//! follows the locks: `RECLAIMED_PAIR_BYTES`). Every minute it also prints
//! the series of each per-lock metric family and RSS split into anonymous
//! and file pages.
//!
//! The janitor judged is the image's: the static musl build. A glibc build
//! (`target/release`) grows its RSS by what its per-thread arenas keep of
//! memory already freed (docs/performance.md, the soak section), which is
//! not the janitor's to bound.
//!
//! ```text
//! cargo build --release --target x86_64-unknown-linux-musl --bin lock-janitor
//! cargo build --release --example soak
//! LOCK_JANITOR_BIN=target/x86_64-unknown-linux-musl/release/lock-janitor target/release/examples/soak --minutes 30
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::audit::{self, AuditEvent};
use lock_janitor_testenv::{kubelet, ControlPlane, Options};
use serde_json::{json, Value};

use lock_janitor_testsupport::chart::{apply_rbac, kind_of, render, sa_kubeconfig, sa_user};
use lock_janitor_testsupport::*;

#[derive(Parser, Debug)]
#[command(
    about = "A long run of the janitor under churn: what grows, what is missed, what is wrong"
)]
struct Args {
    /// How long the churn lasts.
    #[arg(long, env = "SOAK_MINUTES", default_value_t = 30)]
    minutes: u64,
    /// Opted-in locks, a third of each kind.
    #[arg(long, default_value_t = 300)]
    locks: usize,
    /// A holder dies this often (milliseconds).
    #[arg(long, default_value_t = 3000)]
    every_ms: u64,
    /// Replays a run's choices.
    #[arg(long, env = "SEED")]
    seed: Option<u64>,
}

/// Resident bytes one reclaimed (lock, reason) pair costs the janitor: its
/// `lock_janitor_reclaims_total` and `lock_janitor_last_reclaim_timestamp_seconds`
/// series and the time it was touched, kept an hour after the pair's last
/// reclaim (`metrics::RECLAIM_SERIES_TTL`). Measured by `make bench-memory`
/// on the musl build ("reclaim series of a reclaimed lock": 1,606 B
/// requested, 2,302 B resident). They are bounded by the locks (times the
/// six reasons), not by time, but a run shorter than an hour sees only
/// their climb (300 locks at a death every 3 s: about 12 new pairs a
/// minute): the RSS growth judged is net of them.
const RECLAIMED_PAIR_BYTES: f64 = 2302.0;

/// A death must be followed by its lock's freeing within this long.
const FREED_WITHIN: Duration = Duration::from_secs(120);
/// A renewed Lease lasts this long and is renewed every `RENEW`.
const LEASE_SECS: i32 = 15;
const RENEW: Duration = Duration::from_secs(5);
/// The reasons holders die with (`Succeeded` is a phase of its own).
const DEATHS: [&str; 5] = ["Evicted", "Preempting", "Terminated", "Error", "Succeeded"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    ConfigMap,
    Renewed,
    ForLife,
}

impl Kind {
    fn of(slot: usize) -> Kind {
        [Kind::ConfigMap, Kind::Renewed, Kind::ForLife][slot % 3]
    }
    fn resource(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmaps",
            _ => "leases",
        }
    }
}

fn lock_name(slot: usize) -> String {
    format!("lock-{slot}")
}
fn pod_name(slot: usize, generation: u32) -> String {
    format!("holder-{slot}-{generation}")
}

/// One death of a slot's holder: when it was written, when the lock was
/// seen free, when the next holder took it.
#[derive(Clone, Debug)]
struct Death {
    slot: usize,
    pod: String,
    at: Timestamp,
    freed: Option<Instant>,
    died: Instant,
    reborn: Option<Timestamp>,
}

#[derive(Default)]
struct Book {
    /// Slots whose holder lives (and, for a renewed Lease, renews): the
    /// generation of its holder.
    alive: BTreeMap<usize, u32>,
    deaths: Vec<Death>,
}

struct Soak {
    cp: ControlPlane,
    client: Client,
    ns: String,
    node: String,
    kubeconfig: std::path::PathBuf,
    args: Vec<String>,
    user: String,
    book: Mutex<Book>,
    janitors: Mutex<Vec<Janitor>>,
    rss: Mutex<Vec<Sample>>,
}

/// One minute's look at one janitor.
#[derive(Clone, Debug)]
struct Sample {
    minute: u64,
    port: u16,
    rss_kib: u64,
    /// VmRSS split: anonymous pages (the heap, stacks) and file pages (the
    /// binary's code and data as far as it has been paged in).
    rss_anon_kib: u64,
    rss_file_kib: u64,
    /// Series of the per-lock metric families, from its /metrics.
    series: PerLockSeries,
    fds: usize,
    threads: u64,
    remembered: Option<u64>,
    awaited: Option<u64>,
    watch_errors: f64,
    reconcile_errors: f64,
    reclaims: f64,
    leader: bool,
}

/// How many series each per-lock metric family has (one line each in the
/// text exposition): the metrics memory that follows locks.
#[derive(Clone, Copy, Debug, Default)]
struct PerLockSeries {
    /// `lock_janitor_reclaims_total{kind,lock_namespace,lock,reason}`.
    reclaims: usize,
    /// `lock_janitor_last_reclaim_timestamp_seconds{...}`, the same labels.
    last_reclaim: usize,
    /// `lock_janitor_stale_locks{...}`.
    stale: usize,
    /// `lock_janitor_awaiting_takeover` and
    /// `lock_janitor_takeover_timeouts_total` (`lock_namespace`, `lock`).
    takeover: usize,
}

impl PerLockSeries {
    fn of(metrics: &str) -> Self {
        let count = |family: &str| {
            let prefix = format!("{family}{{");
            metrics.lines().filter(|l| l.starts_with(&prefix)).count()
        };
        PerLockSeries {
            reclaims: count("lock_janitor_reclaims_total"),
            last_reclaim: count("lock_janitor_last_reclaim_timestamp_seconds"),
            stale: count("lock_janitor_stale_locks"),
            takeover: count("lock_janitor_awaiting_takeover")
                + count("lock_janitor_takeover_timeouts_total"),
        }
    }
}

/// Retries a write through API server restarts for up to two minutes; API
/// answers below 500 (404, 409) are returned.
async fn through<T, F, Fut>(what: &str, mut f: F) -> kube::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match f().await {
            Err(kube::Error::Api(s)) if s.code < 500 && s.code != 429 => {
                return Err(kube::Error::Api(s))
            }
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() > deadline => panic!("soak: {what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Whether a renewed Lease is free for a waiting candidate, as client-go
/// sees it: no holder, or not renewed within its duration (the janitor
/// leaves an expired Lease alone: the elector takes it by itself).
fn free(spec: &LeaseSpec) -> bool {
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(MicroTime(at)), Some(secs)) => {
            Timestamp::now() > *at + k8s_openapi::jiff::SignedDuration::from_secs(secs.into())
        }
        _ => false,
    };
    spec.holder_identity.as_deref().is_none_or(str::is_empty) || expired
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Soak {
    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn spawn_janitor(&self) -> Janitor {
        let refs: Vec<&str> = self.args.iter().map(String::as_str).collect();
        Janitor::spawn(&self.kubeconfig, &refs)
    }

    async fn holder(&self, slot: usize, generation: u32) -> Pod {
        let name = pod_name(slot, generation);
        through("holder pod", || async {
            match kubelet::create_pod(&self.client, &self.ns, &name, &self.node, &[]).await {
                Err(kube::Error::Api(s)) if s.code == 409 => self.api::<Pod>().get(&name).await,
                r => r,
            }
        })
        .await
        .expect("holder pod");
        through("holder running", || {
            kubelet::set_running(&self.client, &self.ns, &name)
        })
        .await
        .expect("holder running")
    }

    /// The slot's holder of `generation` takes its lock (creates it, or
    /// takes the released Lease).
    async fn take(&self, slot: usize, generation: u32) {
        let pod = self.holder(slot, generation).await;
        let name = lock_name(slot);
        let labels = Some(BTreeMap::from([(
            WATCH_LABEL.0.to_string(),
            WATCH_LABEL.1.to_string(),
        )]));
        match Kind::of(slot) {
            Kind::ConfigMap => {
                let cm = lock_for(&name, &pod, true);
                self.create(&name, || async {
                    self.api::<ConfigMap>()
                        .create(&PostParams::default(), &cm)
                        .await
                        .map(drop)
                })
                .await;
            }
            Kind::ForLife => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels,
                        owner_references: Some(vec![pod_owner(&pod)]),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: pod.metadata.name.clone(),
                        acquire_time: Some(now_micro()),
                        ..Default::default()
                    }),
                };
                self.create(&name, || async {
                    self.api::<Lease>()
                        .create(&PostParams::default(), &lease)
                        .await
                        .map(drop)
                })
                .await;
            }
            Kind::Renewed => {
                self.take_renewed(&name, pod_name(slot, generation), labels)
                    .await
            }
        }
        let mut book = self.book.lock().unwrap();
        book.alive.insert(slot, generation);
        if let Some(d) = book
            .deaths
            .iter_mut()
            .rev()
            .find(|d| d.slot == slot && d.reborn.is_none())
        {
            d.reborn = Some(Timestamp::now());
        }
    }

    /// A renewed Lease taken as client-go's elector takes it: created when
    /// missing, else taken once it is free (a 409 reads it again).
    async fn take_renewed(
        &self,
        name: &str,
        identity: String,
        labels: Option<BTreeMap<String, String>>,
    ) {
        let leases = self.api::<Lease>();
        loop {
            let existing = through("read lease", || async { leases.get_opt(name).await })
                .await
                .expect("read lease");
            let result = match existing {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.to_owned()),
                            labels: labels.clone(),
                            ..Default::default()
                        },
                        spec: Some(LeaseSpec {
                            holder_identity: Some(identity.clone()),
                            lease_duration_seconds: Some(LEASE_SECS),
                            acquire_time: Some(now_micro()),
                            renew_time: Some(now_micro()),
                            lease_transitions: Some(0),
                            ..Default::default()
                        }),
                    };
                    through("create lease", || async {
                        leases.create(&PostParams::default(), &lease).await
                    })
                    .await
                }
                Some(mut lease) => {
                    // As client-go: take it only once it is free.
                    let spec = lease.spec.get_or_insert_with(Default::default);
                    if !free(spec) {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                    spec.holder_identity = Some(identity.clone());
                    spec.lease_duration_seconds = Some(LEASE_SECS);
                    spec.acquire_time = Some(now_micro());
                    spec.renew_time = Some(now_micro());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                    through("take lease", || async {
                        leases.replace(name, &PostParams::default(), &lease).await
                    })
                    .await
                }
            };
            match result {
                Ok(_) => break,
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => panic!("soak: taking lease {name}: {e}"),
            }
        }
    }

    /// Creates a lock, waiting (as operator-lib does) while the old one
    /// still exists.
    async fn create<F, Fut>(&self, name: &str, mut f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = kube::Result<()>>,
    {
        loop {
            match through(&format!("create {name}"), &mut f).await {
                Ok(()) => return,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                Err(e) => panic!("soak: create {name}: {e}"),
            }
        }
    }

    /// Renews every live renewed Lease, every `RENEW`.
    async fn renewer(self: Arc<Self>, stop: Arc<std::sync::atomic::AtomicBool>) {
        let leases = self.api::<Lease>();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let tick = Instant::now();
            let live: Vec<(usize, u32)> = {
                let book = self.book.lock().unwrap();
                book.alive
                    .iter()
                    .filter(|(s, _)| Kind::of(**s) == Kind::Renewed)
                    .map(|(s, g)| (*s, *g))
                    .collect()
            };
            for (slot, generation) in live {
                // Only while this holder still lives and holds it: a
                // merge patch guarded by the holder's own read version.
                let Ok(Some(lease)) = leases.get_opt(&lock_name(slot)).await else {
                    continue;
                };
                let mine = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    == Some(pod_name(slot, generation).as_str());
                let still_alive = self.book.lock().unwrap().alive.get(&slot) == Some(&generation);
                if !(mine && still_alive) {
                    continue;
                }
                let patch = json!({
                    "metadata": {"resourceVersion": lease.metadata.resource_version},
                    "spec": {"renewTime": now_micro()},
                });
                let _ = leases
                    .patch(
                        &lock_name(slot),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
            }
            tokio::time::sleep(RENEW.saturating_sub(tick.elapsed())).await;
        }
    }

    /// Kills the holder of a random live slot and waits for its lock to be
    /// freed; then a new holder takes it.
    async fn kill_one(self: Arc<Self>, rng_seed: u64) {
        let mut rng = fastrand::Rng::with_seed(rng_seed);
        let picked = {
            let mut book = self.book.lock().unwrap();
            let live: Vec<(usize, u32)> = book.alive.iter().map(|(s, g)| (*s, *g)).collect();
            if live.is_empty() {
                None
            } else {
                let (slot, generation) = live[rng.usize(..live.len())];
                book.alive.remove(&slot);
                Some((slot, generation))
            }
        };
        let Some((slot, generation)) = picked else {
            return;
        };
        let pod = pod_name(slot, generation);
        let reason = DEATHS[rng.usize(..DEATHS.len())];
        let at = Timestamp::now();
        let index = {
            let mut book = self.book.lock().unwrap();
            book.deaths.push(Death {
                slot,
                pod: pod.clone(),
                at,
                freed: None,
                died: Instant::now(),
                reborn: None,
            });
            book.deaths.len() - 1
        };
        through(&format!("{pod} dies"), || async {
            match reason {
                "Succeeded" => kubelet::set_succeeded(&self.client, &self.ns, &pod).await,
                r => kubelet::set_failed(&self.client, &self.ns, &pod, r, "soak").await,
            }
        })
        .await
        .unwrap_or_else(|e| panic!("soak: {pod} dies: {e}"));
        let deadline = Instant::now() + FREED_WITHIN + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.freed(slot, &pod).await {
                self.book.lock().unwrap().deaths[index].freed = Some(Instant::now());
                // A waiting replica takes it.
                self.take(slot, generation + 1).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Never freed: a missed reclaim (reported at the end); the slot
        // stays dead.
    }

    /// Whether the slot's lock no longer names `pod`.
    async fn freed(&self, slot: usize, pod: &str) -> bool {
        let name = lock_name(slot);
        match Kind::of(slot) {
            Kind::ConfigMap => match self.api::<ConfigMap>().get_opt(&name).await {
                Ok(None) => true,
                Ok(Some(cm)) => !cm
                    .metadata
                    .owner_references
                    .unwrap_or_default()
                    .iter()
                    .any(|o| o.name == pod),
                Err(_) => false,
            },
            Kind::Renewed | Kind::ForLife => match self.api::<Lease>().get_opt(&name).await {
                Ok(None) => true,
                Ok(Some(l)) => l.spec.is_none_or(|s| {
                    s.holder_identity.as_deref() != Some(pod)
                        || (Kind::of(slot) == Kind::Renewed && free(&s))
                }),
                Err(_) => false,
            },
        }
    }

    async fn sample(&self, minute: u64) -> Vec<Sample> {
        let js: Vec<(u32, u16, std::path::PathBuf)> = self
            .janitors
            .lock()
            .unwrap()
            .iter()
            .map(|j| (j.pid(), j.port, j.log.clone()))
            .collect();
        let mut out = Vec::new();
        for (pid, port, log) in js {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let field = |name: &str| {
                status
                    .lines()
                    .find(|l| l.starts_with(name))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| d.count())
                .unwrap_or(0);
            let metrics = match http_get(port, "/metrics").await {
                Ok((200, body)) => body,
                _ => String::new(),
            };
            let sum = |name: &str| -> f64 {
                metrics
                    .lines()
                    .filter(|l| l.starts_with(name) && !l.starts_with('#'))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .fold(0.0, |a, b| a + b)
            };
            // The last resync sweep's line: "... remembered=N awaited=M ...".
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let last = text.lines().rev().find(|l| l.contains("resync sweep done"));
            let number = |key: &str| {
                last.and_then(|l| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix(&format!("{key}=")))
                        .and_then(|v| v.trim_matches('"').parse::<u64>().ok())
                })
            };
            out.push(Sample {
                minute,
                port,
                rss_kib: field("VmRSS:"),
                rss_anon_kib: field("RssAnon:"),
                rss_file_kib: field("RssFile:"),
                series: PerLockSeries::of(&metrics),
                fds,
                threads: field("Threads:"),
                remembered: number("remembered"),
                awaited: number("awaited"),
                watch_errors: sum("lock_janitor_watch_errors_total"),
                reconcile_errors: sum("lock_janitor_reconcile_errors_total"),
                reclaims: sum("lock_janitor_reclaims_total"),
                leader: sample(&metrics, "lock_janitor_leader", &[]) == Some(1.0),
            });
        }
        out
    }

    fn print(samples: &[Sample]) {
        for s in samples {
            let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            println!(
                "soak: min {:>3} janitor :{:<5} {} rss {:>7} KiB (anon {:>6}, file {:>6})  series reclaims {:>4} last {:>4} stale {:>3} takeover {:>3}  fds {:>3}  threads {:>3}  remembered {:>4}  awaited {:>3}  reclaims {:>6}  watch errors {:>3}  reconcile errors {:>3}",
                s.minute,
                s.port,
                if s.leader { "leader " } else { "standby" },
                s.rss_kib,
                s.rss_anon_kib,
                s.rss_file_kib,
                s.series.reclaims,
                s.series.last_reclaim,
                s.series.stale,
                s.series.takeover,
                s.fds,
                s.threads,
                opt(s.remembered),
                opt(s.awaited),
                s.reclaims,
                s.watch_errors,
                s.reconcile_errors,
            );
        }
    }

    async fn leader_index(&self) -> Option<usize> {
        let ports: Vec<u16> = self
            .janitors
            .lock()
            .unwrap()
            .iter()
            .map(|j| j.port)
            .collect();
        for (i, p) in ports.into_iter().enumerate() {
            if let Ok((200, body)) = http_get(p, "/metrics").await {
                if sample(&body, "lock_janitor_leader", &[]) == Some(1.0) {
                    return Some(i);
                }
            }
        }
        None
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    println!(
        "soak: seed {seed}, {} locks, a death every {} ms, {} minutes",
        args.locks, args.every_ms, args.minutes
    );
    let soak = Arc::new(setup(&args).await);
    let run = Duration::from_secs(args.minutes * 60);
    let start = Instant::now();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewer = tokio::spawn(soak.clone().renewer(stop.clone()));

    // Churn, faults and the minute samples, until the run's end.
    let mut deaths = Vec::new();
    let mut rng = fastrand::Rng::with_seed(seed);
    let faults = [
        (run / 3, "restart kube-apiserver"),
        (run / 2, "SIGKILL the leading janitor"),
        (run * 2 / 3, "restart kube-apiserver"),
    ];
    let mut next_fault = 0;
    let mut next_minute = 1;
    let every = Duration::from_millis(args.every_ms.max(100));
    while start.elapsed() < run {
        deaths.push(tokio::spawn(soak.clone().kill_one(rng.u64(..))));
        if start.elapsed() >= Duration::from_secs(60 * next_minute) {
            let s = soak.sample(next_minute).await;
            Soak::print(&s);
            soak.rss.lock().unwrap().extend(s);
            next_minute += 1;
        }
        if next_fault < faults.len() && start.elapsed() >= faults[next_fault].0 {
            let (_, what) = faults[next_fault];
            println!("soak: {what} at {:?}", start.elapsed());
            let soak = soak.clone();
            // In the background: the churn goes on through it.
            tokio::spawn(async move {
                if what.starts_with("restart") {
                    soak.cp
                        .restart_apiserver()
                        .await
                        .expect("restart kube-apiserver");
                } else if let Some(i) = soak.leader_index().await {
                    soak.janitors.lock().unwrap()[i].kill();
                    let j = soak.spawn_janitor();
                    j.wait_ready().await;
                    soak.janitors.lock().unwrap()[i] = j;
                }
            });
            next_fault += 1;
        }
        tokio::time::sleep(every).await;
    }
    println!(
        "soak: churn done after {:?}; waiting for the last deaths",
        start.elapsed()
    );
    for d in deaths {
        d.await.expect("a death panicked");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    renewer.await.expect("renewer");
    let last = soak.sample(next_minute).await;
    Soak::print(&last);
    soak.rss.lock().unwrap().extend(last);

    let report = judge(&soak, args.minutes);
    soak.janitors.lock().unwrap().clear();
    if !report {
        std::process::exit(1);
    }
}

async fn setup(args: &Args) -> Soak {
    let cp = ControlPlane::start(Options::default())
        .await
        .unwrap_or_else(|e| panic!("soak: control plane: {e}"));
    let client = cp.client().await.expect("admin client");
    let rel = lock_janitor_testenv::fresh_namespace(&client, "soak-rel").await;
    let ns = lock_janitor_testenv::fresh_namespace(&client, "soak-locks").await;
    let node = "soak-node".to_string();
    kubelet::create_node(&client, &node).await.expect("node");
    let set = |kv: &str| ["--set".to_string(), kv.to_string()];
    let values: Vec<String> = [
        "replicas=2",
        "deletePod=true",
        "resync=10s",
        "ownerGoneGrace=5s",
        "logFormat=plain",
    ]
    .iter()
    .flat_map(|kv| set(kv))
    .collect();
    let docs = render("lock-janitor", &rel, &values);
    apply_rbac(&client, &docs).await;
    let deployment = docs
        .iter()
        .find(|d| kind_of(d) == "Deployment")
        .expect("a Deployment");
    let pod_spec = &deployment["spec"]["template"]["spec"];
    let sa = pod_spec["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let janitor_args: Vec<String> = pod_spec["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| !a.starts_with("--metrics-bind-address"))
        .map(str::to_owned)
        .collect();
    let soak = Soak {
        kubeconfig: sa_kubeconfig(&cp, &rel, sa),
        user: sa_user(&rel, sa),
        cp,
        client,
        ns,
        node,
        args: janitor_args,
        book: Mutex::default(),
        janitors: Mutex::default(),
        rss: Mutex::default(),
    };
    let started = Instant::now();
    let soak = Arc::new(soak);
    futures::future::join_all((0..args.locks).map(|slot| {
        let soak = soak.clone();
        async move { soak.take(slot, 0).await }
    }))
    .await;
    println!(
        "soak: {} locks staged in {:?}",
        args.locks,
        started.elapsed()
    );
    let a = soak.spawn_janitor();
    let b = soak.spawn_janitor();
    a.wait_ready().await;
    b.wait_ready().await;
    *soak.janitors.lock().unwrap() = vec![a, b];
    wait_for("one leader", Duration::from_secs(60), || async {
        soak.leader_index().await.map(|_| ())
    })
    .await;
    Arc::try_unwrap(soak).unwrap_or_else(|_| panic!("soak: setup still shared"))
}

/// Prints the end report; true when nothing was wrong or missed and
/// nothing grew.
fn judge(soak: &Soak, minutes: u64) -> bool {
    let book = soak.book.lock().unwrap();
    let events = audit_events(soak);
    let w = janitor_writes(soak, &book, &events);
    let missed = deaths_freed(&book, &w);
    let grew = rss_grew(soak, minutes);
    let ok = w.wrong.is_empty() && missed.is_empty() && !grew;
    println!("soak: {}", if ok { "ok" } else { "FAILED" });
    ok
}

/// Every event of the audit log. The API server rotates its audit log at
/// 100 MB (its default); a long run fills several: read every one of them.
fn audit_events(soak: &Soak) -> Vec<AuditEvent> {
    let dir = soak
        .cp
        .audit_log_path()
        .parent()
        .expect("the audit log's dir");
    let mut events = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(dir)
        .expect("the audit log's dir")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("audit") && name.ends_with(".log") {
            events.extend(audit::read(&entry.path()));
            files += 1;
        }
    }
    println!(
        "soak: {} audit events read from {files} audit log file(s)",
        events.len()
    );
    events
}

/// The janitors' freeing writes in the run's namespace, from the audit log.
struct Writes {
    /// Writes that freed what they must not have.
    wrong: Vec<String>,
    /// When each slot's lock was freed.
    freed_at: BTreeMap<usize, Vec<Timestamp>>,
    freeing: usize,
    conflicts: usize,
}

/// Checks each freeing write against the deaths: a lock (or pod) may be
/// freed only between its holder's death and the next holder's taking it.
fn janitor_writes(soak: &Soak, book: &Book, events: &[AuditEvent]) -> Writes {
    let ns = soak.ns.as_str();
    let janitor =
        |e: &&AuditEvent| e.effective_user() == soak.user && e.namespace.as_deref() == Some(ns);
    // The intervals in which each slot's lock (and each pod) may be freed:
    // from its holder's death to the next holder's taking it.
    let by_slot: BTreeMap<usize, Vec<&Death>> =
        book.deaths.iter().fold(BTreeMap::new(), |mut m, d| {
            m.entry(d.slot).or_insert_with(Vec::new).push(d);
            m
        });
    let by_pod: BTreeMap<&str, &Death> = book.deaths.iter().map(|d| (d.pod.as_str(), d)).collect();
    let slot_of = |name: &str| name.strip_prefix("lock-")?.parse::<usize>().ok();
    let mut wrong = Vec::new();
    let mut freed_at: BTreeMap<usize, Vec<Timestamp>> = BTreeMap::new();
    let (mut freeing, mut conflicts) = (0usize, 0usize);
    for e in events.iter().filter(janitor) {
        let freeing_write = matches!(
            (e.resource.as_deref(), e.verb.as_str()),
            (Some("configmaps" | "pods"), "delete") | (Some("leases"), "delete" | "update")
        );
        if !freeing_write || e.subresource.is_some() {
            continue;
        }
        match e.code {
            Some(200..=299) => {}
            Some(409) => {
                conflicts += 1;
                continue;
            }
            _ => continue,
        }
        let Some(at) = e.received_at() else { continue };
        let name = e.name.clone().unwrap_or_default();
        let what = format!(
            "{} {} {ns}/{name} at {at}",
            e.verb,
            e.resource.as_deref().unwrap_or("?")
        );
        if e.resource.as_deref() == Some("pods") {
            if by_pod.get(name.as_str()).is_none_or(|d| at < d.at) {
                wrong.push(format!("{what}: not a dead holder"));
            }
            continue;
        }
        freeing += 1;
        let Some(slot) = slot_of(&name) else {
            wrong.push(format!("{what}: not a lock of this run"));
            continue;
        };
        freed_at.entry(slot).or_default().push(at);
        let kind_ok = e.resource.as_deref() == Some(Kind::of(slot).resource());
        let in_death = by_slot.get(&slot).is_some_and(|ds| {
            ds.iter()
                .any(|d| at >= d.at && d.reborn.is_none_or(|r| at <= r))
        });
        if !kind_ok || !in_death {
            wrong.push(format!("{what}: its holder was not dead"));
        }
    }
    Writes {
        wrong,
        freed_at,
        freeing,
        conflicts,
    }
}

/// Prints the deaths, how many a janitor freed and how fast, the wrong
/// writes and the missed reclaims; returns the missed ones.
fn deaths_freed(book: &Book, w: &Writes) -> Vec<String> {
    let Writes {
        wrong,
        freed_at,
        freeing,
        conflicts,
    } = w;
    // Deaths whose lock a janitor freed (a renewed Lease may also expire
    // first and be taken by the waiting candidate, as client-go does).
    let by_janitor = book
        .deaths
        .iter()
        .filter(|d| {
            freed_at.get(&d.slot).is_some_and(|ts| {
                ts.iter()
                    .any(|t| *t >= d.at && d.reborn.is_none_or(|r| *t <= r))
            })
        })
        .count();
    let missed: Vec<String> = book
        .deaths
        .iter()
        .filter(|d| {
            d.freed
                .is_none_or(|f| f.duration_since(d.died) > FREED_WITHIN)
        })
        .map(|d| {
            format!(
                "{} ({}): freed {:?} after the death",
                lock_name(d.slot),
                d.pod,
                d.freed.map(|f| f.duration_since(d.died))
            )
        })
        .collect();
    let mut latencies: Vec<f64> = book
        .deaths
        .iter()
        .filter_map(|d| Some(d.freed?.duration_since(d.died).as_secs_f64()))
        .collect();
    latencies.sort_by(f64::total_cmp);
    let q = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "soak: {} deaths, {by_janitor} of them freed by a janitor ({} others: a renewed Lease that expired first and was taken, or a miss), {freeing} freeing writes ({conflicts} answered 409)",
        book.deaths.len(),
        book.deaths.len() - by_janitor,
    );
    println!(
        "soak: death to freed: p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        q(0.5),
        q(0.99),
        latencies.last().copied().unwrap_or(f64::NAN)
    );
    println!("soak: wrong writes: {}", wrong.len());
    for w in wrong.iter().take(20) {
        println!("soak:   {w}");
    }
    println!("soak: missed reclaims: {}", missed.len());
    for m in missed.iter().take(20) {
        println!("soak:   {m}");
    }
    missed
}

/// Prints the RSS growth of each janitor process and role; whether one
/// grew 5 % or more (in a run of 10 minutes or more).
fn rss_grew(soak: &Soak, minutes: u64) -> bool {
    // RSS growth per janitor process (a port is one process: the restarted
    // one has a port of its own) and per role: a standby that takes the
    // lead takes on a leader's state (its sweeps, its takeover followers,
    // a reclaim series for each lock it frees, kept an hour), so each
    // stretch in one role is judged from 5 minutes into it to its end, net
    // of the reclaim series added meanwhile (they follow the locks).
    // The whole process's growth from minute 5 is printed too.
    let samples = soak.rss.lock().unwrap();
    let mut grew = false;
    let ports: std::collections::BTreeSet<u16> = samples.iter().map(|s| s.port).collect();
    for port in ports {
        let mine: Vec<&Sample> = samples.iter().filter(|s| s.port == port).collect();
        let peak = mine.iter().map(|s| s.rss_kib).max().unwrap_or(0);
        let growth = |a: &Sample, b: &Sample| {
            (b.rss_kib as f64 - a.rss_kib as f64) / a.rss_kib.max(1) as f64 * 100.0
        };
        if let (Some(first), Some(last)) = (mine.iter().find(|s| s.minute >= 5), mine.last()) {
            if last.minute > first.minute {
                println!(
                    "soak: janitor :{port}: RSS {} KiB at minute {} -> {} KiB at minute {} ({:+.1} %), peak {peak} KiB",
                    first.rss_kib,
                    first.minute,
                    last.rss_kib,
                    last.minute,
                    growth(first, last)
                );
            }
        }
        // Its stretches in one role.
        let mut stretches: Vec<Vec<&Sample>> = Vec::new();
        for s in &mine {
            match stretches.last_mut() {
                Some(st) if st[0].leader == s.leader => st.push(s),
                _ => stretches.push(vec![s]),
            }
        }
        for st in stretches {
            let role = if st[0].leader { "leader" } else { "standby" };
            let settled = st.iter().find(|s| s.minute >= st[0].minute + 5);
            let (Some(first), Some(last)) = (settled, st.last()) else {
                continue;
            };
            if last.minute <= first.minute {
                continue;
            }
            let g = growth(first, last);
            // What the (lock, reason) pairs reclaimed since cost: memory
            // that follows the locks, not time (see RECLAIMED_PAIR_BYTES).
            let pairs = last.series.reclaims as f64 - first.series.reclaims as f64;
            let follows_locks_kib = pairs * RECLAIMED_PAIR_BYTES / 1024.0;
            let net = (last.rss_kib as f64 - first.rss_kib as f64 - follows_locks_kib)
                / first.rss_kib.max(1) as f64
                * 100.0;
            println!(
                "soak: janitor :{port} as {role} (from minute {}): RSS {} KiB at minute {} -> {} KiB at minute {} ({g:+.1} %; anon {} -> {} KiB, file {} -> {} KiB); reclaim series pairs {} -> {} ({follows_locks_kib:+.0} KiB); net of them {net:+.1} %",
                st[0].minute, first.rss_kib, first.minute, last.rss_kib, last.minute,
                first.rss_anon_kib, last.rss_anon_kib, first.rss_file_kib, last.rss_file_kib,
                first.series.reclaims, last.series.reclaims,
            );
            if net >= 5.0 && minutes >= 10 {
                grew = true;
            }
        }
    }
    grew
}
