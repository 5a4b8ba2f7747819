//! The chaos suite: many locks in flight at once, each with a random fate,
//! and faults at random moments, on a control plane of its own, with two
//! janitors (leader election) running as the chart's ServiceAccount with the
//! chart's RBAC. Ground truth is the API server's audit log: every DELETE the
//! janitors sent is checked against what the suite wrote and when.
//!
//! `tests/isolated/chaos.rs` runs a short seeded run in `make test`; `make chaos`
//! (`examples/chaos.rs`) a long one with a random seed it prints
//! (`SEED=` replays the plan; timing on a real control plane still varies).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::audit::{self, AuditEvent};
use lock_janitor_testenv::{kubelet, ControlPlane, Options, ADMIN_USER};
use serde_json::{json, Value};

use crate::chart::{apply_rbac, kind_of, render, sa_kubeconfig, sa_user};
use crate::*;

/// Every lock whose holder died is reclaimed this soon after the death,
/// outside fault windows.
const RECLAIM_WITHIN: Duration = Duration::from_secs(30);

/// What a run looks like.
#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    pub locks: usize,
    pub faults: usize,
    /// Fates and faults happen within this long.
    pub spread: Duration,
    /// Where a failing run keeps its audit log and janitor logs.
    pub keep: PathBuf,
}

/// What happens to a lock's holder (and to the lock) during the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fate {
    Evicted,
    Preempted,
    Shutdown,
    OtherFailure,
    Succeeded,
    StaysRunning,
    StaysPending,
    GoesUnknown,
    TerminatingRunning,
    RecreatedSameName,
    /// Evicted; within 0-100 ms the lock is deleted and an heir creates it.
    TakeoverRace,
    /// Evicted; within 0-100 ms the opt-in label is removed.
    LabelRemovedRace,
    /// Evicted, but the lock was never opted in.
    UnlabeledDead,
    /// The holder pod is deleted for good (the garbage collector's case).
    DeletedForGood,
    /// Evicted; once the lock is gone a waiting replica creates it again,
    /// without the label (operator-lib does).
    HeirWithoutLabel,
}

impl Fate {
    const ALL: [Fate; 15] = [
        Fate::Evicted,
        Fate::Preempted,
        Fate::Shutdown,
        Fate::OtherFailure,
        Fate::Succeeded,
        Fate::StaysRunning,
        Fate::StaysPending,
        Fate::GoesUnknown,
        Fate::TerminatingRunning,
        Fate::RecreatedSameName,
        Fate::TakeoverRace,
        Fate::LabelRemovedRace,
        Fate::UnlabeledDead,
        Fate::DeletedForGood,
        Fate::HeirWithoutLabel,
    ];

    /// The status the holder dies with, if it dies: a Failed reason, or
    /// `Succeeded`.
    fn death(self) -> Option<&'static str> {
        match self {
            Fate::Evicted
            | Fate::TakeoverRace
            | Fate::LabelRemovedRace
            | Fate::UnlabeledDead
            | Fate::HeirWithoutLabel => Some("Evicted"),
            Fate::Preempted => Some("Preempting"),
            Fate::Shutdown => Some("Terminated"),
            Fate::OtherFailure => Some("Error"),
            Fate::Succeeded => Some("Succeeded"),
            _ => None,
        }
    }

    /// Whether the janitor must reclaim the lock (nobody else will).
    fn must_be_reclaimed(self) -> bool {
        matches!(
            self,
            Fate::Evicted
                | Fate::Preempted
                | Fate::Shutdown
                | Fate::OtherFailure
                | Fate::Succeeded
                | Fate::HeirWithoutLabel
        )
    }

    /// Whether the janitor may delete the lock at all (after the death).
    fn may_be_deleted(self) -> bool {
        self.must_be_reclaimed()
            || matches!(
                self,
                // Once the holder pod is gone (the garbage collector deletes
                // such a lock too, whatever runs under the name later).
                Fate::TakeoverRace
                    | Fate::LabelRemovedRace
                    | Fate::DeletedForGood
                    | Fate::RecreatedSameName
            )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL one janitor (the leader or the standby), restart it.
    KillJanitor,
    /// SIGSTOP kube-apiserver for a few seconds.
    PauseApiserver,
    /// SIGKILL kube-apiserver and start it again; then the recovery time.
    RestartApiserver,
    /// SIGKILL etcd and start it again.
    RestartEtcd,
    /// A third janitor without leader election writes beside the leader.
    SecondWriter,
}

const FAULTS: [Fault; 5] = [
    Fault::KillJanitor,
    Fault::PauseApiserver,
    Fault::RestartApiserver,
    Fault::RestartEtcd,
    Fault::SecondWriter,
];

struct Plan {
    fates: Vec<Fate>,
    /// When each lock's fate happens, from the start of the run.
    at: Vec<Duration>,
    /// The race delay (0-100 ms) of each lock.
    race: Vec<Duration>,
    faults: Vec<(Duration, Fault, Duration)>,
}

fn plan(cfg: &Config) -> Plan {
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    // Every fate at least once when there are enough locks, then at random.
    let mut fates: Vec<Fate> = (0..cfg.locks)
        .map(|i| {
            Fate::ALL
                .get(i)
                .copied()
                .unwrap_or_else(|| Fate::ALL[rng.usize(..Fate::ALL.len())])
        })
        .collect();
    rng.shuffle(&mut fates);
    let spread = cfg.spread.as_millis() as u64;
    let at = (0..cfg.locks)
        .map(|_| Duration::from_millis(rng.u64(0..spread)))
        .collect();
    let race = (0..cfg.locks)
        .map(|_| Duration::from_millis(rng.u64(0..=100)))
        .collect();
    // Every kind of fault once when there are enough, in a random order.
    let mut kinds: Vec<Fault> = (0..cfg.faults)
        .map(|i| {
            FAULTS
                .get(i)
                .copied()
                .unwrap_or_else(|| FAULTS[rng.usize(..FAULTS.len())])
        })
        .collect();
    rng.shuffle(&mut kinds);
    let mut faults: Vec<(Duration, Fault, Duration)> = kinds
        .into_iter()
        .map(|f| {
            let length = match f {
                Fault::PauseApiserver => Duration::from_millis(rng.u64(2000..6000)),
                Fault::SecondWriter => Duration::from_millis(rng.u64(5000..15000)),
                Fault::KillJanitor => Duration::from_millis(rng.u64(0..3000)),
                _ => Duration::ZERO,
            };
            (
                Duration::from_millis(rng.u64(2000..spread.max(2001))),
                f,
                length,
            )
        })
        .collect();
    faults.sort_by_key(|f| f.0);
    Plan {
        fates,
        at,
        race,
        faults,
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub locks: usize,
    pub fates: BTreeMap<String, usize>,
    /// (fault, seconds it lasted).
    pub faults: Vec<(String, f64)>,
    pub wrong_deletes: Vec<String>,
    pub missed: Vec<String>,
    /// Locks gone without a DELETE in the audit log while the API server
    /// was restarted: a DELETE it carried out just before it was killed
    /// has no audit record (the client saw the connection drop).
    pub unaudited: Vec<String>,
    /// Death to reclaim, seconds, of the deaths outside fault windows.
    pub latencies: Vec<f64>,
    pub conflicts: usize,
    pub not_found: usize,
    /// apiserver /readyz after a restart to the first reclaim of a holder
    /// that died then, seconds.
    pub recoveries: Vec<f64>,
    /// How long after the fates and faults the last heir's lock carried
    /// the opt-in label.
    pub label_carry_over_wait: f64,
    /// Where the evidence was kept (a failing run).
    pub kept: Option<PathBuf>,
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

impl Report {
    pub fn ok(&self) -> bool {
        self.wrong_deletes.is_empty() && self.missed.is_empty()
    }

    pub fn print(&self) {
        println!("chaos: seed {} (replay with SEED={})", self.seed, self.seed);
        println!("  locks: {} ({:?})", self.locks, self.fates);
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(f, s)| format!("{f} {s:.1}s"))
            .collect();
        println!("  faults: {} ({})", self.faults.len(), faults.join(", "));
        println!("  wrong deletes: {} (must be 0)", self.wrong_deletes.len());
        for w in &self.wrong_deletes {
            println!("    {w}");
        }
        println!("  missed reclaims: {} (must be 0)", self.missed.len());
        for m in &self.missed {
            println!("    {m}");
        }
        println!(
            "  reclaims the audit log lost to an API server restart: {}",
            self.unaudited.len()
        );
        for u in &self.unaudited {
            println!("    {u}");
        }
        println!(
            "  reclaim latency outside faults: n={} p50 {:.3}s p99 {:.3}s max {:.3}s",
            self.latencies.len(),
            quantile(&self.latencies, 0.5),
            quantile(&self.latencies, 0.99),
            quantile(&self.latencies, 1.0)
        );
        println!(
            "  janitor DELETEs refused: {} with 409 Conflict, {} with 404",
            self.conflicts, self.not_found
        );
        let rec: Vec<String> = self.recoveries.iter().map(|r| format!("{r:.2}s")).collect();
        println!(
            "  recovery after an apiserver restart (readyz -> first reclaim): {}",
            if rec.is_empty() {
                "not measured".into()
            } else {
                rec.join(", ")
            }
        );
        println!(
            "  label carried over to every heir's lock within {:.1}s after the fates and faults",
            self.label_carry_over_wait
        );
        if let Some(k) = &self.kept {
            println!("  evidence kept in {}", k.display());
        }
    }
}

/// A fault's window, in audit-log time.
/// The fault window of an API server killed and started again.
const API_SERVER_RESTART: &str = "kube-apiserver restart";

#[derive(Clone, Debug)]
struct Window {
    what: String,
    from: Timestamp,
    to: Timestamp,
}

struct Run {
    cp: ControlPlane,
    client: Client,
    ns: String,
    node: String,
    kubeconfig: PathBuf,
    args: Vec<String>,
    user: String,
    janitors: Mutex<Vec<Janitor>>,
    logs: Mutex<Vec<PathBuf>>,
    windows: Mutex<Vec<Window>>,
    recoveries: Mutex<Vec<f64>>,
}

fn lock_name(i: usize) -> String {
    format!("lock-{i}")
}
fn pod_name(i: usize) -> String {
    format!("holder-{i}")
}
fn heir_name(i: usize) -> String {
    format!("heir-{i}")
}

/// Retries a write through faults (refused connections, 5xx, timeouts)
/// for up to two minutes; API answers like 404 or 409 are returned.
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
            Err(e) if Instant::now() > deadline => panic!("chaos: {what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

impl Run {
    fn janitor_args(&self, leader_elect: bool) -> Vec<String> {
        self.args
            .iter()
            .filter(|a| leader_elect || !a.starts_with("--leader-elect"))
            .cloned()
            .collect()
    }

    async fn spawn_janitor(&self, leader_elect: bool) -> Janitor {
        let args = self.janitor_args(leader_elect);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let j = Janitor::spawn(&self.kubeconfig, &refs);
        self.logs.lock().unwrap().push(j.log.clone());
        j
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn leaders(&self) -> usize {
        let ports: Vec<u16> = self
            .janitors
            .lock()
            .unwrap()
            .iter()
            .map(|j| j.port)
            .collect();
        let mut n = 0;
        for p in ports {
            if let Ok((200, body)) = http_get(p, "/metrics").await {
                if sample(&body, "lock_janitor_leader", &[]) == Some(1.0) {
                    n += 1;
                }
            }
        }
        n
    }

    async fn die(&self, i: usize, how: &str) {
        let pod = pod_name(i);
        through(&format!("{pod} dies"), || async {
            match how {
                "Succeeded" => kubelet::set_succeeded(&self.client, &self.ns, &pod).await,
                reason => kubelet::set_failed(&self.client, &self.ns, &pod, reason, "chaos").await,
            }
        })
        .await
        .unwrap_or_else(|e| panic!("chaos: {pod} dies: {e}"));
    }

    /// Plays one lock's fate.
    async fn fate(&self, i: usize, fate: Fate, race: Duration) {
        let (pod, lock) = (pod_name(i), lock_name(i));
        let pods: Api<Pod> = self.api();
        let cms: Api<ConfigMap> = self.api();
        match fate {
            Fate::StaysRunning | Fate::StaysPending => {}
            Fate::GoesUnknown => {
                let patch = json!({"status": {"phase": "Unknown", "reason": "NodeLost"}});
                through("phase Unknown", || async {
                    pods.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                })
                .await
                .expect("phase Unknown");
            }
            Fate::TerminatingRunning => {
                // Graceful deletion of a pod bound to a node: it stays
                // terminating until its kubelet confirms (there is none).
                let _ = through("terminating", || async {
                    pods.delete(&pod, &DeleteParams::default()).await
                })
                .await;
            }
            Fate::RecreatedSameName => {
                let _ = through("force delete", || {
                    kubelet::force_delete_pod(&self.client, &self.ns, &pod)
                })
                .await;
                through("recreate", || {
                    kubelet::create_pod(&self.client, &self.ns, &pod, &self.node, &[])
                })
                .await
                .expect("recreate the holder");
                through("running again", || {
                    kubelet::set_running(&self.client, &self.ns, &pod)
                })
                .await
                .expect("running again");
            }
            Fate::DeletedForGood => {
                let _ = through("force delete", || {
                    kubelet::force_delete_pod(&self.client, &self.ns, &pod)
                })
                .await;
            }
            _ => {
                self.die(i, fate.death().expect("a dying fate")).await;
                match fate {
                    Fate::TakeoverRace => {
                        tokio::time::sleep(race).await;
                        let _ = through("delete for the heir", || async {
                            cms.delete(&lock, &DeleteParams::default()).await
                        })
                        .await;
                        self.heir(i).await;
                    }
                    Fate::LabelRemovedRace => {
                        tokio::time::sleep(race).await;
                        let patch = json!({"metadata": {"labels": {WATCH_LABEL.0: null}}});
                        let _ = through("unlabel", || async {
                            cms.patch(&lock, &PatchParams::default(), &Patch::Merge(&patch))
                                .await
                        })
                        .await;
                    }
                    Fate::HeirWithoutLabel => {
                        let deadline = Instant::now() + Duration::from_secs(300);
                        while Instant::now() < deadline {
                            if let Ok(None) = cms.get_opt(&lock).await {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        self.heir(i).await;
                    }
                    _ => {}
                }
            }
        }
    }

    /// A waiting replica creates the lock again (operator-lib: unlabeled).
    async fn heir(&self, i: usize) {
        let heir = through("heir pod", || async {
            match kubelet::create_pod(&self.client, &self.ns, &heir_name(i), &self.node, &[]).await
            {
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    self.api::<Pod>().get(&heir_name(i)).await
                }
                r => r,
            }
        })
        .await
        .expect("heir pod");
        let heir = through("heir running", || async {
            kubelet::set_running(&self.client, &self.ns, &heir_name(i)).await
        })
        .await
        .unwrap_or(heir);
        let cms: Api<ConfigMap> = self.api();
        loop {
            match through("heir lock", || async {
                cms.create(
                    &PostParams::default(),
                    &lock_for(&lock_name(i), &heir, false),
                )
                .await
            })
            .await
            {
                Ok(_) => return,
                // Not deleted yet (its reclaim is in flight): retry as
                // operator-lib would.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                Err(e) => panic!("chaos: heir lock {i}: {e}"),
            }
        }
    }

    fn window(&self, what: String, from: Timestamp) {
        self.windows.lock().unwrap().push(Window {
            what,
            from,
            to: Timestamp::now(),
        });
    }

    async fn fault(&self, fault: Fault, length: Duration, rng: &mut fastrand::Rng) {
        let from = Timestamp::now();
        match fault {
            Fault::KillJanitor => {
                let at = rng.usize(..2);
                let port = {
                    let mut js = self.janitors.lock().unwrap();
                    js[at].kill();
                    js[at].port
                };
                tokio::time::sleep(length).await;
                let j = self.spawn_janitor(true).await;
                j.wait_ready().await;
                self.janitors.lock().unwrap()[at] = j;
                wait_for("one leader again", Duration::from_secs(60), || async {
                    (self.leaders().await == 1).then_some(())
                })
                .await;
                self.window(format!("janitor SIGKILL (port {port})"), from);
            }
            Fault::PauseApiserver => {
                self.cp.pause("kube-apiserver").expect("SIGSTOP");
                tokio::time::sleep(length).await;
                self.cp.resume("kube-apiserver").expect("SIGCONT");
                self.window("kube-apiserver SIGSTOP".into(), from);
            }
            Fault::RestartApiserver => {
                self.cp
                    .restart_apiserver()
                    .await
                    .expect("restart kube-apiserver");
                let ready = Instant::now();
                self.window(API_SERVER_RESTART.into(), from);
                self.recovery(ready).await;
            }
            Fault::RestartEtcd => {
                self.cp.restart_etcd().await.expect("restart etcd");
                self.window("etcd restart".into(), from);
            }
            Fault::SecondWriter => {
                // Not a fault window: it can only add writes.
                let j = self.spawn_janitor(false).await;
                tokio::time::sleep(length).await;
                drop(j);
            }
        }
    }

    /// The first reclaim after an apiserver restart: a holder dies as soon
    /// as the apiserver serves; the time until its lock is gone.
    async fn recovery(&self, ready: Instant) {
        let n = self.recoveries.lock().unwrap().len();
        let i = RECOVERY_BASE + n;
        self.die(i, "Evicted").await;
        let cms: Api<ConfigMap> = self.api();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(None) = cms.get_opt(&lock_name(i)).await {
                self.recoveries
                    .lock()
                    .unwrap()
                    .push(ready.elapsed().as_secs_f64());
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Locks reserved for recovery measurements are numbered from here.
const RECOVERY_BASE: usize = 100_000;

fn ts(e: &AuditEvent) -> Timestamp {
    e.received
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("audit event without a timestamp: {e:?}"))
}

fn secs(d: SignedDuration) -> f64 {
    d.as_secs_f64()
}

/// Runs the suite; returns its report (check `Report::ok`).
pub async fn run(cfg: Config) -> Report {
    let plan = plan(&cfg);
    let cp = ControlPlane::start(Options::default())
        .await
        .unwrap_or_else(|e| panic!("chaos: control plane: {e}"));
    let client = cp.client().await.expect("admin client");
    let rel = lock_janitor_testenv::fresh_namespace(&client, "chaos-rel").await;
    let ns = lock_janitor_testenv::fresh_namespace(&client, "chaos-locks").await;
    let node = "chaos-node".to_string();
    kubelet::create_node(&client, &node).await.expect("node");
    let (kubeconfig, user, args) = chart_janitor(&cp, &client, &rel).await;

    // The holders and their locks.
    let all = stage_locks(&client, &ns, &node, &plan).await;

    let run = Arc::new(Run {
        cp,
        client: client.clone(),
        ns: ns.clone(),
        node,
        kubeconfig,
        args,
        user,
        janitors: Mutex::new(Vec::new()),
        logs: Mutex::new(Vec::new()),
        windows: Mutex::new(Vec::new()),
        recoveries: Mutex::new(Vec::new()),
    });
    let a = run.spawn_janitor(true).await;
    let b = run.spawn_janitor(true).await;
    a.wait_ready().await;
    b.wait_ready().await;
    *run.janitors.lock().unwrap() = vec![a, b];
    wait_for("one leader", Duration::from_secs(60), || async {
        (run.leaders().await == 1).then_some(())
    })
    .await;

    // The fates and the faults, at once.
    let start = Instant::now();
    play(&run, &plan, start, cfg.seed).await;

    let carried_within = settle(&run, &plan).await;
    two_more_sweeps(&run).await;
    let mut report = judge(&run, &plan, &all).await;
    report.label_carry_over_wait = carried_within;
    report.seed = cfg.seed;
    report.recoveries = run.recoveries.lock().unwrap().clone();
    report.faults = run
        .windows
        .lock()
        .unwrap()
        .iter()
        .map(|w| (w.what.clone(), secs(w.to.duration_since(w.from))))
        .collect();
    let elapsed = start.elapsed();
    run.janitors.lock().unwrap().clear();
    if !report.ok() {
        report.kept = Some(keep(&run, &cfg.keep));
    }
    eprintln!("chaos: fates and faults took {elapsed:?}");
    report
}

/// The chart's RBAC applied in `rel`; the kubeconfig and user of its
/// ServiceAccount and the Deployment's janitor flags (but the metrics
/// address), as two janitors run them.
async fn chart_janitor(
    cp: &ControlPlane,
    client: &Client,
    rel: &str,
) -> (PathBuf, String, Vec<String>) {
    let docs = render(
        "lock-janitor",
        rel,
        &[
            "--set".into(),
            "replicas=2".into(),
            "--set".into(),
            "deletePod=true".into(),
            "--set".into(),
            "resync=10s".into(),
            "--set".into(),
            "ownerGoneGrace=5s".into(),
            "--set".into(),
            "logFormat=plain".into(),
            // Its fates model an unlabeled lock (and one whose label is
            // removed) as one the janitor must leave alone; with auto opt-in
            // a lock without the key is labeled and protected instead
            // (tests/e2e/auto_opt_in.rs covers that).
            "--set".into(),
            "autoOptIn.enabled=false".into(),
        ],
    );
    apply_rbac(client, &docs).await;
    let deployment = docs
        .iter()
        .find(|d| kind_of(d) == "Deployment")
        .expect("a Deployment");
    let pod_spec = &deployment["spec"]["template"]["spec"];
    let sa = pod_spec["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let args: Vec<String> = pod_spec["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| !a.starts_with("--metrics-bind-address"))
        .map(str::to_owned)
        .collect();
    let kubeconfig = sa_kubeconfig(cp, rel, sa);
    let user = sa_user(rel, sa);
    (kubeconfig, user, args)
}

/// Every fate's holder and lock, and one lock for each API server restart
/// (its recovery is timed on it): (index, fate).
async fn stage_locks(client: &Client, ns: &str, node: &str, plan: &Plan) -> Vec<(usize, Fate)> {
    let recovery_locks = plan
        .faults
        .iter()
        .filter(|f| f.1 == Fault::RestartApiserver)
        .count();
    let all: Vec<(usize, Fate)> = plan
        .fates
        .iter()
        .copied()
        .enumerate()
        .chain((0..recovery_locks).map(|k| (RECOVERY_BASE + k, Fate::Evicted)))
        .collect();
    futures::future::join_all(all.iter().map(|&(i, fate)| {
        let (client, ns, node) = (client.clone(), ns.to_owned(), node.to_owned());
        async move {
            let pod = if fate == Fate::StaysPending {
                kubelet::create_pod(&client, &ns, &pod_name(i), &node, &[])
                    .await
                    .expect("pending pod")
            } else {
                running_pod(&client, &ns, &pod_name(i), &node).await
            };
            let labeled = fate != Fate::UnlabeledDead;
            create_lock(&client, &lock_for(&lock_name(i), &pod, labeled)).await;
        }
    }))
    .await;
    all
}

/// Each fate at its moment and each fault at its, side by side, from
/// `start`.
async fn play(run: &Arc<Run>, plan: &Plan, start: Instant, seed: u64) {
    let fates = futures::future::join_all(plan.fates.iter().enumerate().map(|(i, &fate)| {
        let (run, at, race) = (run.clone(), plan.at[i], plan.race[i]);
        tokio::spawn(async move {
            tokio::time::sleep_until((start + at).into()).await;
            run.fate(i, fate, race).await;
        })
    }));
    let faults = {
        let (run, faults) = (run.clone(), plan.faults.clone());
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed ^ 0xfa017);
            for (at, fault, length) in faults {
                tokio::time::sleep_until((start + at).into()).await;
                run.fault(fault, length, &mut rng).await;
            }
        })
    };
    for r in fates.await {
        r.expect("a fate panicked");
    }
    faults.await.expect("a fault panicked");
}

/// Settle: what must be reclaimed is (within 120 s), and the label is
/// carried over to each heir's lock (within 180 s); returns the seconds
/// the carry-over took.
async fn settle(run: &Run, plan: &Plan) -> f64 {
    // Settle: what must be reclaimed is, then two more sweeps of each
    // janitor look for anything else to (wrongly) delete.
    let cms: Api<ConfigMap> = run.api();
    let originals: Vec<usize> = plan
        .fates
        .iter()
        .enumerate()
        .filter(|(_, f)| f.must_be_reclaimed())
        .map(|(i, _)| i)
        .collect();
    let settle = Instant::now() + Duration::from_secs(120);
    for i in originals {
        while Instant::now() < settle {
            let cm = cms.get_opt(&lock_name(i)).await.ok().flatten();
            let held_by_original = cm
                .and_then(|c| c.metadata.owner_references)
                .is_some_and(|o| o.iter().any(|o| o.name == pod_name(i)));
            if !held_by_original {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The label carried over to each heir's lock, eventually: the
    // followers share a budget of their own, so with many locks awaited at
    // once this takes a while.
    let carry = Instant::now();
    for (i, _) in plan
        .fates
        .iter()
        .enumerate()
        .filter(|(_, f)| **f == Fate::HeirWithoutLabel)
    {
        while carry.elapsed() < Duration::from_secs(180) {
            let cm = cms.get_opt(&lock_name(i)).await.ok().flatten();
            let done = cm.is_some_and(|c| {
                c.metadata.labels.is_some_and(|l| {
                    l.get(WATCH_LABEL.0).map(String::as_str) == Some(WATCH_LABEL.1)
                })
            });
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    carry.elapsed().as_secs_f64()
}

/// Two more sweeps by whoever sweeps: the leader (a standby sweeps once it
/// leads), or every janitor without an election.
async fn two_more_sweeps(run: &Run) {
    let js = std::mem::take(&mut *run.janitors.lock().unwrap());
    let leaders = wait_for("a janitor leads", Duration::from_secs(60), || async {
        let mut leaders = Vec::new();
        for j in &js {
            let m = j.metrics().await;
            if sample(&m, "lock_janitor_leader", &[]) == Some(1.0) {
                leaders.push(j);
            }
        }
        (!leaders.is_empty()).then_some(leaders)
    })
    .await;
    for j in leaders {
        j.wait_sweeps(2).await;
    }
    *run.janitors.lock().unwrap() = js;
}

/// Checks every janitor DELETE in the audit log against what the suite
/// wrote and when.
async fn judge(run: &Run, plan: &Plan, all: &[(usize, Fate)]) -> Report {
    // Which locks that must be reclaimed are gone, asked before the audit
    // log is read: a lock deleted after the read would otherwise look gone
    // with no DELETE.
    let gone = gone_locks(run, all).await;
    let events = audit::read(run.cp.audit_log_path());
    let a = Audit {
        events: &events,
        ns: run.ns.as_str(),
    };
    let mut report = Report {
        locks: plan.fates.len(),
        ..Default::default()
    };
    for f in &plan.fates {
        *report.fates.entry(format!("{f:?}")).or_default() += 1;
    }
    let windows = run.windows.lock().unwrap().clone();
    // When each holder's death was written (the last status write of a
    // dying holder; the first set it Running), or its pod deleted for good.
    let died = a.deaths(all);
    let reclaimed = a.janitor_deletes(&run.user, all, &died, &mut report);
    // Every lock the janitor must reclaim was, within the bound outside
    // faults (a fault in the way extends it by the fault's length).
    a.reclaims(all, &died, &reclaimed, &windows, &gone, &mut report);
    // The heirs' locks live on (their holders run), the heir of a
    // reclaimed lock carries the opt-in label again.
    heirs_hold(run, all, &mut report).await;
    report
}

/// The locks that must be reclaimed and are gone now.
async fn gone_locks(run: &Run, all: &[(usize, Fate)]) -> BTreeSet<usize> {
    let mut gone = BTreeSet::new();
    for &(i, fate) in all {
        if fate.must_be_reclaimed()
            && run
                .api::<ConfigMap>()
                .get_opt(&lock_name(i))
                .await
                .is_ok_and(|cm| cm.is_none())
        {
            gone.insert(i);
        }
    }
    gone
}

/// The audit log of a run, in the run's namespace.
struct Audit<'a> {
    events: &'a [AuditEvent],
    ns: &'a str,
}

impl Audit<'_> {
    /// `user`'s `verb` on `resource` (and subresource) in the namespace.
    fn mine(
        &self,
        e: &AuditEvent,
        user: &str,
        verb: &str,
        resource: &str,
        sub: Option<&str>,
    ) -> bool {
        e.effective_user() == user
            && e.verb == verb
            && e.namespace.as_deref() == Some(self.ns)
            && e.resource.as_deref() == Some(resource)
            && e.subresource.as_deref() == sub
    }

    /// When each holder's death was written (the last status write of a
    /// dying holder; the first set it Running), or its pod deleted for good.
    fn deaths(&self, all: &[(usize, Fate)]) -> BTreeMap<usize, Timestamp> {
        let events = self.events;
        let mut died: BTreeMap<usize, Timestamp> = BTreeMap::new();
        for &(i, fate) in all {
            let name = pod_name(i);
            let at = if matches!(fate, Fate::DeletedForGood | Fate::RecreatedSameName) {
                events
                    .iter()
                    .filter(|e| self.mine(e, ADMIN_USER, "delete", "pods", None))
                    .filter(|e| e.name.as_deref() == Some(&name) && e.code == Some(200))
                    .map(ts)
                    .next()
            } else if fate.death().is_some() {
                events
                    .iter()
                    .filter(|e| self.mine(e, ADMIN_USER, "patch", "pods", Some("status")))
                    .filter(|e| e.name.as_deref() == Some(&name) && e.code == Some(200))
                    .map(ts)
                    .next_back()
            } else {
                None
            };
            if let Some(at) = at {
                died.insert(i, at);
            }
        }
        died
    }

    /// When an heir created the lock again.
    fn heir_at(&self, name: &str) -> Option<Timestamp> {
        self.events
            .iter()
            .filter(|e| self.mine(e, ADMIN_USER, "create", "configmaps", None))
            .filter(|e| e.name.as_deref() == Some(name) && e.code == Some(201))
            .map(ts)
            .nth(1)
    }

    /// Whether the label removal won.
    fn unlabeled(&self, name: &str) -> bool {
        self.events
            .iter()
            .filter(|e| self.mine(e, ADMIN_USER, "patch", "configmaps", None))
            .any(|e| e.name.as_deref() == Some(name) && e.code == Some(200))
    }

    /// The janitors' DELETEs: each freed what it may have (a lock after its
    /// holder's death and before an heir's lock; a terminal holder pod), or
    /// it is a wrong delete. Returns when each lock was first reclaimed.
    fn janitor_deletes(
        &self,
        user: &str,
        all: &[(usize, Fate)],
        died: &BTreeMap<usize, Timestamp>,
        report: &mut Report,
    ) -> BTreeMap<usize, Timestamp> {
        let by_name: BTreeMap<String, (usize, Fate)> =
            all.iter().map(|&(i, f)| (lock_name(i), (i, f))).collect();
        let pods_by_name: BTreeMap<String, (usize, Fate)> =
            all.iter().map(|&(i, f)| (pod_name(i), (i, f))).collect();
        let mut reclaimed: BTreeMap<usize, Timestamp> = BTreeMap::new();
        for d in self
            .events
            .iter()
            .filter(|e| e.effective_user() == user && e.verb == "delete")
        {
            let name = d.name.clone().unwrap_or_default();
            let what = format!(
                "{} {}/{name}",
                d.resource.as_deref().unwrap_or("?"),
                d.namespace.as_deref().unwrap_or("-")
            );
            match d.code {
                Some(200) => {}
                Some(409) => {
                    report.conflicts += 1;
                    continue;
                }
                Some(404) => {
                    report.not_found += 1;
                    continue;
                }
                _ => continue,
            }
            let at = ts(d);
            match d.resource.as_deref() {
                Some("configmaps") => {
                    let Some(&(i, fate)) = by_name.get(&name) else {
                        report
                            .wrong_deletes
                            .push(format!("{what}: not a lock of this run, at {at}"));
                        continue;
                    };
                    if !fate.may_be_deleted() {
                        report.wrong_deletes.push(format!(
                            "{what} ({fate:?}): its holder may run, deleted at {at}"
                        ));
                    } else if died.get(&i).is_none_or(|&t| at <= t) {
                        report.wrong_deletes.push(format!(
                            "{what} ({fate:?}): deleted at {at}, before its holder's death ({:?})",
                            died.get(&i)
                        ));
                    } else if self.heir_at(&name).is_some_and(|h| at > h) {
                        report.wrong_deletes.push(format!(
                            "{what} ({fate:?}): the heir's lock deleted at {at}"
                        ));
                    } else if fate == Fate::LabelRemovedRace && self.unlabeled(&name) {
                        report.wrong_deletes.push(format!(
                            "{what}: deleted at {at} although its opt-in label was removed"
                        ));
                    } else {
                        reclaimed.entry(i).or_insert(at);
                    }
                }
                Some("pods") => {
                    let Some(&(i, fate)) = pods_by_name.get(&name) else {
                        report
                            .wrong_deletes
                            .push(format!("{what}: not a dead holder, at {at}"));
                        continue;
                    };
                    let dead_before =
                        fate.death().is_some() && died.get(&i).is_some_and(|&t| at > t);
                    if !dead_before {
                        report.wrong_deletes.push(format!(
                            "{what} ({fate:?}): a pod deleted at {at} that was not terminal"
                        ));
                    }
                }
                _ => report
                    .wrong_deletes
                    .push(format!("{what}: deleted at {at}")),
            }
        }
        reclaimed
    }

    /// Every lock the janitor must reclaim was, within the bound outside
    /// faults (a fault in the way extends it by the fault's length); the
    /// latencies outside faults.
    fn reclaims(
        &self,
        all: &[(usize, Fate)],
        died: &BTreeMap<usize, Timestamp>,
        reclaimed: &BTreeMap<usize, Timestamp>,
        windows: &[Window],
        gone: &BTreeSet<usize>,
        report: &mut Report,
    ) {
        for &(i, fate) in all {
            if !fate.must_be_reclaimed() {
                continue;
            }
            let Some(&death) = died.get(&i) else {
                report.missed.push(format!(
                    "{}: its death is not in the audit log",
                    lock_name(i)
                ));
                continue;
            };
            // A fault in the way extends the bound by its length.
            let mut allowed = SignedDuration::try_from(RECLAIM_WITHIN).unwrap();
            for w in windows {
                if w.to > death && w.from < death + allowed {
                    allowed += w.to.duration_since(w.from.max(death));
                }
            }
            // An API server killed between carrying out a DELETE and writing
            // its audit record leaves a lock gone with no record: accepted
            // only when such a restart fell within the bound and none after
            // it, no DELETE of the lock by anyone is in the audit log, and the
            // lock is gone (or its heir made it again: the heir's create is
            // audited, and only the janitor deletes these locks while their
            // pods stay).
            let restart = |w: &&Window| w.what == API_SERVER_RESTART;
            let lost_within = windows
                .iter()
                .filter(restart)
                .any(|w| w.to > death && w.from < death + allowed)
                && !windows
                    .iter()
                    .filter(restart)
                    .any(|w| w.from >= death + allowed);
            let name = lock_name(i);
            let no_delete = !self.events.iter().any(|e| {
                e.verb == "delete"
                    && e.namespace.as_deref() == Some(self.ns)
                    && e.resource.as_deref() == Some("configmaps")
                    && e.name.as_deref() == Some(name.as_str())
            });
            let went = gone.contains(&i) || self.heir_at(&name).is_some();
            match reclaimed.get(&i) {
                None if lost_within && no_delete && went => report.unaudited.push(format!(
                    "{} ({fate:?}): gone with no DELETE in the audit log (died {death})",
                    lock_name(i)
                )),
                None => report.missed.push(format!(
                    "{} ({fate:?}): never reclaimed (died {death})",
                    lock_name(i)
                )),
                Some(&at) => {
                    let took = at.duration_since(death);
                    if took > allowed {
                        report.missed.push(format!(
                            "{} ({fate:?}): reclaimed {:.1}s after the death, allowed {:.1}s",
                            lock_name(i),
                            secs(took),
                            secs(allowed)
                        ));
                    }
                    // Outside faults: no fault window between death and reclaim.
                    let faulted = windows.iter().any(|w| w.to > death && w.from < at);
                    if !faulted && i < RECOVERY_BASE {
                        report.latencies.push(secs(took));
                    }
                }
            }
        }
    }
}

/// The heirs' locks live on (their holders run), the heir of a reclaimed
/// lock carries the opt-in label again.
async fn heirs_hold(run: &Run, all: &[(usize, Fate)], report: &mut Report) {
    let cms: Api<ConfigMap> = run.api();
    for &(i, fate) in all {
        if !matches!(fate, Fate::TakeoverRace | Fate::HeirWithoutLabel) {
            continue;
        }
        let cm = cms.get_opt(&lock_name(i)).await.ok().flatten();
        let owner = cm
            .as_ref()
            .and_then(|c| c.metadata.owner_references.as_ref())
            .and_then(|o| o.first())
            .map(|o| o.name.clone());
        if owner.as_deref() != Some(heir_name(i).as_str()) {
            report.missed.push(format!(
                "{} ({fate:?}): the heir's lock is gone or not the heir's: owner {owner:?}",
                lock_name(i)
            ));
        }
        if fate == Fate::HeirWithoutLabel {
            let labeled = cm
                .and_then(|c| c.metadata.labels)
                .is_some_and(|l| l.get(WATCH_LABEL.0).map(String::as_str) == Some(WATCH_LABEL.1));
            if !labeled {
                report.missed.push(format!(
                    "{} (HeirWithoutLabel): the opt-in label was not carried over",
                    lock_name(i)
                ));
            }
        }
    }
}

/// Copies the audit log and the janitors' logs out of the control plane's
/// temp dir, which goes when the run ends.
fn keep(run: &Run, dir: &Path) -> PathBuf {
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::copy(run.cp.audit_log_path(), dir.join("audit.log"));
    for (n, log) in run.logs.lock().unwrap().iter().enumerate() {
        let _ = std::fs::copy(log, dir.join(format!("janitor-{n}.log")));
    }
    if let Ok(entries) = std::fs::read_dir(run.cp.dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".log") {
                let _ = std::fs::copy(e.path(), dir.join(&name));
            }
        }
    }
    dir.to_path_buf()
}
