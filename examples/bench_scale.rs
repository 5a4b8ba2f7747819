//! What the janitor costs at scale, in one run on a local control plane:
//! resident memory watching 0, 1,000 and 10,000 locks (steady; the peak
//! that includes its initial list and a scrape; and the peak after the API
//! server restarts and the lock watch lists every lock again), the API
//! requests it makes
//! while idle (from the API server's own `apiserver_request_total`, with and
//! without the janitor), and reclaim latency, sequential and in bursts,
//! beside two floors measured in the same run, each on locks of its own
//! (not opted in, so the janitor does not see them), all three watching
//! throughout and taking turns: one at a time, then `--bursts` rounds of a
//! burst each, the first of each round in turn:
//! the safe floor, a bare client making exactly the requests the janitor
//! must make for a reclaim (a live GET of the lock, a live GET of the
//! holder, the intent Event, the holder read again, the DELETE with uid and
//! resourceVersion preconditions), 16 reclaims at a time as the janitor
//! runs them; and the bare-DELETE floor, a watcher of terminal pods that
//! sends one guarded DELETE per death and nothing else. It prints the
//! janitor's p99 over the safe floor's. Then a burst of Lease holders
//! that die at once (`--lease-burst`, renewing every 2 s until they die),
//! `--lease-rounds` rounds of it: the time from the moment the renewal
//! rule allows a release to the release, beside two floors in the same
//! run, taking turns as the ConfigMap bursts do, each with holders of its
//! own: the Lease safe floor, which makes the janitor's requests from that
//! moment (a live GET of the Lease, the pods of its namespace listed, the
//! intent Event, the holder read again, the guarded release), 16 at a
//! time; and a bare releaser that updates each Lease at that moment and
//! does nothing else. It prints the janitor's p99 over the safe floor's.
//! It reports numbers; it passes or fails nothing on time.
//!
//! `make bench` builds the release binary and runs this. By hand:
//!
//! ```text
//! cargo build --release --bin lock-janitor
//! LOCK_JANITOR_BIN=target/release/lock-janitor cargo run --release --example bench_scale -- \
//!     [--levels 1000,10000] [--sequential 20] [--evict 100] [--bursts 3] [--idle-secs 60] [--resync-secs 20] \
//!     [--lease-burst 100] [--lease-rounds 3] [--lease-namespaces own|locks] \
//!     [--first janitor|safe-floor|bare-delete|random]
//! ```
//!
//! `--lease-namespaces locks` puts the Lease holders among the ConfigMap
//! holders (1,000 pods a namespace at 10,000 locks), so each judgement
//! pages through a crowded namespace; `own` (the default) gives them
//! namespaces of their own.
//!
//! Idle load. Idle, the janitor reads only its resync sweeps (the pods its
//! locks name, by name or by listing their namespaces, each --resync). To see several in a
//! minute the janitor runs with `--resync <resync-secs>`; the load at the
//! default `--resync 5m` is that measured rate scaled by resync/300 s, and
//! the requests per sweep are read from the janitor's own debug log.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testsupport::bench::*;
use lock_janitor_testsupport::lease_burst;
use lock_janitor_testsupport::reclaim::*;
use lock_janitor_testsupport::*;

const LOCK_NAMESPACES: usize = 10;

/// What the janitor costs at scale, beside two floors measured in the same
/// run (see the file's doc).
#[derive(clap::Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Lock counts to measure at, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    levels: Vec<usize>,
    /// Holders evicted one at a time (for the janitor and each floor).
    #[arg(long, default_value_t = 20)]
    sequential: usize,
    /// Holders evicted at once (for the janitor and each floor).
    #[arg(long, default_value_t = 100)]
    evict: usize,
    /// Bursts of --evict for each (their p99 is over all of them).
    #[arg(long, default_value_t = 3)]
    bursts: usize,
    /// Seconds of each idle window.
    #[arg(long = "idle-secs", value_name = "N", default_value = "60", value_parser = seconds)]
    idle: Duration,
    /// The janitor's --resync while idle, in seconds.
    #[arg(long = "resync-secs", value_name = "N", default_value = "20", value_parser = seconds)]
    resync: Duration,
    /// Lease holders that fail at once, for each (0: none).
    #[arg(long, default_value_t = 100)]
    lease_burst: usize,
    /// Rounds of a Lease burst for each (their p99 is over all of them).
    /// The dead holders stay, so later turns list more pods; a multiple
    /// of 3 gives each reclaimer the same share of early and late turns.
    #[arg(long, default_value_t = 3)]
    lease_rounds: usize,
    /// `locks`: the Lease holders live among the ConfigMap holders (1,000
    /// pods a namespace at 10,000 locks); `own`: in namespaces of their own.
    #[arg(long = "lease-namespaces", value_name = "own|locks", default_value = "own", value_parser = own_or_locks, action = clap::ArgAction::Set)]
    leases_among_locks: bool,
    /// Who goes first in the first round, of the bursts and of the Lease
    /// rounds (then the next, in turn); `random` (the default) draws it
    /// for each run, so that no reclaimer always has the run's first
    /// burst, or the same places in it.
    #[arg(long, value_name = "janitor|safe-floor|bare-delete|random", default_value = "random", value_parser = first_turn)]
    first: usize,
}

/// `--first`: an index into `WHO`.
fn first_turn(v: &str) -> Result<usize, String> {
    match v {
        "janitor" => Ok(0),
        "safe-floor" => Ok(1),
        "bare-delete" => Ok(2),
        "random" => Ok(fastrand::usize(..3)),
        _ => Err(format!(
            "{v:?}: expected janitor, safe-floor, bare-delete or random"
        )),
    }
}

fn parse_args() -> Args {
    let mut a = <Args as clap::Parser>::parse();
    a.levels.sort();
    let top = a.levels.last().copied().unwrap_or(0);
    if top < a.sequential + a.evict * a.bursts
        || a.bursts == 0
        || a.resync.is_zero()
        || a.idle < a.resync
    {
        die("need the largest level >= sequential + evict * bursts, bursts > 0, resync-secs > 0, idle-secs >= resync-secs");
    }
    a
}

/// Every request the API server has counted so far.
async fn apiserver_requests(client: &Client) -> f64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = retry("reading the API server's metrics", || {
        client.request_text(req.clone())
    })
    .await;
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Requests the API server counts per second over `idle`.
async fn request_rate(client: &Client, idle: Duration) -> f64 {
    let before = apiserver_requests(client).await;
    let t = Instant::now();
    tokio::time::sleep(idle).await;
    let after = apiserver_requests(client).await;
    // The two reads of /metrics count themselves; leave them out.
    (after - before - 1.0).max(0.0) / t.elapsed().as_secs_f64()
}

/// `requests=<n>` of each "resync sweep done" line in the log.
fn sweep_requests(log: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains("resync sweep done"))
        .filter_map(|l| {
            l.split("requests=")
                .nth(1)?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

struct Level {
    locks: usize,
    steady: Mem,
    peak: Mem,
    /// After the API server was restarted and the lock watch listed again
    /// (None: no re-list was seen).
    relist: Option<Mem>,
    baseline_rps: f64,
    with_rps: f64,
    per_sweep: f64,
    sweeps: usize,
}

async fn measure_level(
    cp: &lock_janitor_testenv::ControlPlane,
    client: &Client,
    kubeconfig: &std::path::Path,
    locks: usize,
    args: &Args,
) -> Level {
    step(&format!("{locks} locks: idle API load without a janitor"));
    let baseline_rps = request_rate(client, args.idle).await;
    println!("    {baseline_rps:.2} requests/s");
    step(&format!(
        "{locks} locks: a janitor, --resync {}",
        secs(args.resync)
    ));
    let resync = format!("{}s", args.resync.as_secs());
    let t = Instant::now();
    let j = Janitor::start(kubeconfig, &["--resync", &resync]).await;
    all_held(&j, locks, &format!("{locks} locks judged held")).await;
    println!(
        "    ready and every lock held {} after start",
        secs(t.elapsed())
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let steady = mem(j.pid());
    let _ = j.metrics().await;
    let before_log = j.logs().len();
    let with_rps = request_rate(client, args.idle).await;
    let log = j.logs();
    let sweeps = sweep_requests(&log[before_log.min(log.len())..]);
    let per_sweep = if sweeps.is_empty() {
        0.0
    } else {
        sweeps.iter().sum::<f64>() / sweeps.len() as f64
    };
    let peak = mem(j.pid());
    println!(
        "    {with_rps:.2} requests/s with the janitor; {} sweeps of {per_sweep:.1} requests",
        sweeps.len()
    );
    let relist = if locks > 0 {
        Some(relisted(cp, &j, locks).await).flatten()
    } else {
        None
    };
    Level {
        locks,
        steady,
        peak,
        relist,
        baseline_rps,
        with_rps,
        per_sweep,
        sweeps: sweeps.len(),
    }
}

/// Waits until the janitor counts `locks` locks held.
async fn all_held(j: &Janitor, locks: usize, what: &str) {
    wait_for(what, Duration::from_secs(600), || async {
        let m = j.metrics().await;
        let held = sample(&m, "lock_janitor_locks", &[("state", "held")]).unwrap_or(0.0);
        (held as usize == locks).then_some(())
    })
    .await;
}

/// Restarts the API server, whose fresh watch cache no longer serves the
/// janitor's resourceVersion: the lock watch lists every lock again. Once
/// it has, and every lock is held again after a scrape, the janitor's
/// memory (its peak now includes the re-list). None if no re-list was seen.
async fn relisted(
    cp: &lock_janitor_testenv::ControlPlane,
    j: &Janitor,
    locks: usize,
) -> Option<Mem> {
    step(&format!(
        "{locks} locks: API server restarted, the lock watch lists again"
    ));
    let before = j.logs().len();
    let t = Instant::now();
    cp.restart_apiserver()
        .await
        .unwrap_or_else(|e| die(&format!("restarting the API server: {e}")));
    let seen = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let log = j.logs();
            let new = &log[before.min(log.len())..];
            if new
                .lines()
                .any(|l| l.contains("watch re-listed") && l.contains("configmaps in"))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    if seen.is_err() {
        println!("    no re-list of the locks within 120 s (the janitor resumed its watch)");
        return None;
    }
    all_held(j, locks, "every lock held after the re-list").await;
    let _ = j.metrics().await;
    println!(
        "    re-listed and every lock held {} after the restart",
        secs(t.elapsed())
    );
    Some(mem(j.pid()))
}

/// The last status write of `m`'s holder that `user` did not make: the
/// benchmark's eviction.
fn evicted<'a>(events: &'a [AuditEvent], m: &Made, user: &str) -> Option<&'a AuditEvent> {
    events
        .iter()
        .filter(|e| {
            e.namespace.as_deref() == Some(m.ns.as_str())
                && e.resource.as_deref() == Some("pods")
                && e.subresource.as_deref() == Some("status")
                && e.name.as_deref() == Some(m.holder.as_str())
                && e.effective_user() != user
        })
        .max_by_key(|e| e.received_at())
}

/// The requests `user` made about `m`'s reclaim, after the eviction: the
/// GETs and the DELETE of its lock and its holder (no watch, no list) and,
/// with `events`, the Events about its lock.
fn about<'a>(
    events: &'a [AuditEvent],
    m: &'a Made,
    user: &'a str,
    with_events: bool,
) -> impl Iterator<Item = &'a AuditEvent> {
    events
        .iter()
        .filter(move |e| e.effective_user() == user && e.namespace.as_deref() == Some(&m.ns))
        .filter(|e| e.subresource.is_none() && !matches!(e.verb.as_str(), "watch" | "list"))
        .filter(move |e| {
            let (r, n) = (e.resource.as_deref(), e.name.as_deref());
            (r == Some("pods") && n == Some(m.holder.as_str()))
                || (r == Some("configmaps") && n == Some(m.lock.as_str()))
                || (with_events
                    && r == Some("events")
                    && n.and_then(|n| n.strip_prefix(m.lock.as_str()))
                        .is_some_and(|t| t.starts_with('.')))
        })
}

/// Where each reclaim of `seq` spent its time, from the API server's audit
/// log (request-received times, on the API server's clock): from the
/// eviction's status write to the reclaimer's first request about the lock
/// (the watch event, the queue), from there to its DELETE (the reads on
/// the critical path), and how many reads it made (lock and holder GETs).
fn where_time_goes(events: &[AuditEvent], user: &str, seq: &[Made]) -> String {
    let secs = |a: Timestamp, b: Timestamp| b.duration_since(a).as_secs_f64();
    let (mut to_first, mut to_delete, mut reads) = (Vec::new(), Vec::new(), Vec::new());
    for m in seq {
        let Some(evicted) = evicted(events, m, user).and_then(AuditEvent::received_at) else {
            continue;
        };
        let mine: Vec<(Timestamp, &str)> = about(events, m, user, false)
            .filter_map(|e| Some((e.received_at()?, e.verb.as_str())))
            .filter(|(t, _)| *t >= evicted)
            .collect();
        let Some(delete) = mine.iter().find(|(_, v)| *v == "delete").map(|(t, _)| *t) else {
            continue;
        };
        let first = mine.iter().map(|(t, _)| *t).min().unwrap_or(delete);
        to_first.push(secs(evicted, first));
        to_delete.push(secs(first, delete));
        reads.push(
            mine.iter()
                .filter(|(t, v)| *v == "get" && *t <= delete)
                .count() as f64,
        );
    }
    format!(
        "status write -> first request: {}\n    first request -> DELETE:       {}\n    reads before the DELETE:       {}",
        distribution(to_first),
        distribution(to_delete),
        counts(reads)
    )
}

/// Each request of the reclaims of `seq`, step by step, from the API
/// server's audit log: for the n-th request about a reclaim (its lock, its
/// holder, an Event in its namespace), the time before the API server
/// received it (after the previous one completed, or after the holder's
/// status write for the first: the reclaimer's own time, its queue and its
/// connection) and the time the API server took to answer it.
fn step_by_step(events: &[AuditEvent], user: &str, seq: &[Made]) -> String {
    let secs = |a: Timestamp, b: Timestamp| b.duration_since(a).as_secs_f64();
    // (what, before it, answering it) for each step.
    let mut steps: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for m in seq {
        let Some(evicted) = evicted(events, m, user).and_then(AuditEvent::completed_at) else {
            continue;
        };
        let mut mine: Vec<(Timestamp, Timestamp, String)> = about(events, m, user, true)
            .filter_map(|e| {
                let what = format!("{} {}", e.verb, e.resource.as_deref().unwrap_or_default());
                Some((e.received_at()?, e.completed_at()?, what))
            })
            .filter(|(t, _, _)| *t >= evicted)
            .collect();
        mine.sort_by_key(|(t, _, _)| *t);
        // Up to the Event that follows the DELETE (not the takeover's
        // look at the lock, seconds later).
        if let Some(d) = mine.iter().position(|(_, _, w)| w.starts_with("delete")) {
            mine.truncate(d + 2);
        }
        let mut prev = evicted;
        for (i, (received, completed, what)) in mine.into_iter().enumerate() {
            if steps.len() <= i {
                steps.push((what.clone(), Vec::new(), Vec::new()));
            }
            if !steps[i].0.split(" or ").any(|w| w == what) {
                steps[i].0 = format!("{} or {what}", steps[i].0);
            }
            steps[i].1.push(secs(prev, received));
            steps[i].2.push(secs(received, completed));
            prev = completed;
        }
    }
    steps
        .into_iter()
        .map(|(what, before, answer)| {
            format!(
                "\n      {what} ({} of them): before {}; answered in {}",
                before.len(),
                median_p99_max(before),
                median_p99_max(answer)
            )
        })
        .collect()
}

/// As when a node dies some time after start: the janitor has done its
/// start-up work (ready: its watches listed and its first sweep done).
async fn settled(j: &Janitor) {
    j.wait_ready().await;
}

/// The Lease bursts' figures: each reclaimer's latencies from "the rule
/// allows it" to the release (pooled over the rounds, and each round's
/// own), the windows, and where the time went.
#[derive(Default)]
struct LeaseFigures {
    /// Janitor, safe floor, bare releaser: one list per round.
    rounds: [Vec<Vec<f64>>; 3],
    windows: Vec<f64>,
    requests: String,
}

impl LeaseFigures {
    fn pooled(&self, i: usize) -> Vec<f64> {
        self.rounds[i].concat()
    }
}

/// Who releases in a Lease round, in the order of `LeaseFigures::rounds`.
const LEASE_WHO: [&str; 3] = ["leader", "safe-leader", "bare-leader"];

/// The Lease bursts: `--lease-rounds` rounds, in each of which the janitor,
/// the Lease safe floor and the bare releaser take turns (the first of each
/// round in turn, as the ConfigMap bursts do), each on `n` holders of its
/// own made for the round, which renew (client-go's timings) and then all
/// fail at once. The janitor watches throughout (beside every ConfigMap
/// lock still there); the floors' Leases are not opted in, so it does not
/// see them.
async fn lease_burst_phase(
    cp: &lock_janitor_testenv::ControlPlane,
    client: &Client,
    kubeconfig: &std::path::Path,
    lock_ns: &[String],
    args: &Args,
) -> LeaseFigures {
    let n = args.lease_burst;
    let namespaces = lease_namespaces(client, lock_ns, args).await;
    step(&format!(
        "Lease bursts: {} rounds of {n} holders each for the janitor and the two floors, renewing every {} \
         on a {} s lease, in {} namespaces ({})",
        args.lease_rounds,
        secs(lease_burst::RENEW),
        lease_burst::LEASE_SECONDS,
        namespaces.len(),
        if args.leases_among_locks {
            "among the ConfigMap holders"
        } else {
            "of their own"
        }
    ));
    let (released, watch, synced) = lease_burst::watch_releases(client);
    let _ = synced.await;
    let j = Janitor::start(kubeconfig, &[]).await;
    // Its start-up work over the ConfigMap locks still there is done.
    settled(&j).await;
    let safe_client = floor_client(cp, client, SAFE_FLOOR_USER, JANITOR_USER).await;
    let mut f = LeaseFigures::default();
    let mut allowed: [HashMap<String, lease_burst::Allowed>; 3] = Default::default();
    // Each janitor turn's span, from its holders' deaths to the last release.
    let mut turns = Vec::new();
    // The janitor's releases so far.
    let mut freed = 0;
    for k in 0..args.lease_rounds {
        for i in turn_order(args.first + k) {
            let prefix = format!("{}-{k}", LEASE_WHO[i]);
            // The Leases the janitor holds already (those it released stay
            // held: judged released) before its turn's are made.
            let before = if i == 0 { held_leases(&j).await } else { 0 };
            let holders = lease_burst::holders(client, &namespaces, &prefix, n, i == 0).await;
            let mut deaths = None;
            let now = match i {
                0 => {
                    let (now, at) = janitor_lease_round(client, &j, &holders, before).await;
                    deaths = Some(at);
                    now
                }
                1 => lease_safe_floor(client, &safe_client, &holders).await,
                _ => lease_floor(client, &holders).await,
            };
            let took =
                lease_burst::release_latencies(&released, &now, Duration::from_secs(120)).await;
            if let Some(at) = deaths {
                turns.push((at, Timestamp::now()));
                freed += took.len();
                said(&j, "lease", freed).await;
            }
            if took.len() < n {
                println!(
                    "    {}: {} of {n} Leases NOT released within 120 s",
                    LEASE_WHO[i],
                    n - took.len()
                );
            }
            f.rounds[i].push(took);
            allowed[i].extend(now);
            tokio::time::sleep(SETTLE).await;
        }
    }
    f.windows = allowed[0]
        .values()
        .map(|a| a.window.as_secs_f64())
        .collect();
    let audit = lock_janitor_testenv::audit::read(cp.audit_log_path());
    let requests = lease_burst::requests_in(&audit, JANITOR_USER, &namespaces, &turns);
    let timeline = lease_timeline(&audit, &allowed, &released, &j.logs());
    drop(j);
    watch.abort();
    f.requests =
        format!("{requests}\n  where the time goes (the API server's audit log):\n  {timeline}");
    f
}

/// The janitor's round: its holders renew until it has seen four gaps (it
/// learns each holder's renew period from its watch), then all fail at
/// once. Returns when the rule allows each release.
async fn janitor_lease_round(
    client: &Client,
    j: &Janitor,
    holders: &[lease_burst::Holder],
    held_before: usize,
) -> (HashMap<String, lease_burst::Allowed>, Timestamp) {
    let renewer = lease_burst::Renewer::start(client, holders);
    wait_for(
        "every Lease of the round held",
        Duration::from_secs(300),
        || async { (held_leases(j).await >= held_before + holders.len()).then_some(()) },
    )
    .await;
    // Four gaps seen (the janitor keeps the last four).
    renewer.rounds(5).await;
    let renewed = renewer.stop().await;
    let deaths = Timestamp::now();
    (
        lease_burst::fail_all(client, holders, &renewed).await,
        deaths,
    )
}

/// The Leases the janitor counts as held (`lock_janitor_locks`).
async fn held_leases(j: &Janitor) -> usize {
    let m = j.metrics().await;
    let held = sample(
        &m,
        "lock_janitor_locks",
        &[("kind", "lease"), ("state", "held")],
    );
    held.unwrap_or(0.0) as usize
}

/// Where each release's time went, pooled over the rounds (the audit log,
/// and the janitor's own log for the moment it found).
fn lease_timeline(
    audit: &[AuditEvent],
    allowed: &[HashMap<String, lease_burst::Allowed>; 3],
    released: &lease_burst::Releases,
    janitor_log: &str,
) -> String {
    let (to_list, list_to_release, to_release) =
        lease_burst::timeline(audit, Some(JANITOR_USER), JANITOR_USER, &allowed[0]);
    let (to_own, own_to_release) = lease_burst::by_janitor_moment(
        released,
        &allowed[0],
        &lease_burst::janitor_moments(janitor_log),
    );
    let (s_list, s_list_to_release, s_release) =
        lease_burst::timeline(audit, Some(SAFE_FLOOR_USER), JANITOR_USER, &allowed[1]);
    let (_, _, b_release) = lease_burst::timeline(audit, None, JANITOR_USER, &allowed[2]);
    format!(
        "janitor: allowed -> its last pod list: {}\n    pod list -> release:          {}\n    allowed -> release:           {}\n    \
         allowed -> the janitor's own moment (its log: the window it found, on its own clock): {}\n    \
         its own moment -> released (as the watch here sees it): {}\n  \
         safe floor: allowed -> its last pod list: {}\n    pod list -> release:          {}\n    \
         allowed -> release:           {}\n  \
         bare release: allowed -> release:           {}",
        distribution(to_list),
        distribution(list_to_release),
        distribution(to_release),
        distribution(to_own),
        distribution(own_to_release),
        distribution(s_list),
        distribution(s_list_to_release),
        distribution(s_release),
        distribution(b_release)
    )
}

/// The Lease safe floor's round: its holders renew five rounds, then all
/// fail at once, and it releases them with the janitor's requests
/// (`lease_burst::safe_releases`) as the rule allows each.
async fn lease_safe_floor(
    admin: &Client,
    client: &Client,
    holders: &[lease_burst::Holder],
) -> HashMap<String, lease_burst::Allowed> {
    let allowed = lease_burst::renew_then_fail(admin, holders).await;
    let misses = lease_burst::safe_releases(
        client,
        &allowed,
        lock_janitor::lock::lease::released,
        lock_janitor::lock::lease::names,
    )
    .await;
    let (skipped, failed, events) = (
        misses.skipped.load(std::sync::atomic::Ordering::Relaxed),
        misses.failed.load(std::sync::atomic::Ordering::Relaxed),
        misses
            .events_failed
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    if skipped + failed + events > 0 {
        println!(
            "    the Lease safe floor skipped {skipped} Leases after a read, failed {failed} \
             releases and {events} intent Events"
        );
    }
    allowed
}

/// Where the Lease holders live: among the ConfigMap holders, or in
/// namespaces of their own.
async fn lease_namespaces(client: &Client, lock_ns: &[String], args: &Args) -> Vec<String> {
    if args.leases_among_locks {
        lock_ns.to_vec()
    } else {
        let mut v = Vec::new();
        for i in 0..LOCK_NAMESPACES {
            v.push(
                lock_janitor_testenv::fresh_namespace(client, &format!("scale-lease-{i}")).await,
            );
        }
        v
    }
}

/// The bare releaser's round: its holders renew five rounds, then all
/// fail at once, and it releases each by the rule's clock alone.
async fn lease_floor(
    client: &Client,
    bare: &[lease_burst::Holder],
) -> HashMap<String, lease_burst::Allowed> {
    let allowed = lease_burst::renew_then_fail(client, bare).await;
    let refused =
        lease_burst::bare_releases(client, &allowed, lock_janitor::lock::lease::released).await;
    if refused > 0 {
        println!("    the bare releaser was refused {refused} times");
    }
    allowed
}

/// The reclaimers of the latency phase, in the order of their rows.
const WHO: [&str; 3] = ["janitor,    ", "safe floor, ", "bare DELETE,"];

/// Who goes in round `k`, in order (indexes into `WHO`): the first of each
/// round in turn, so each reclaimer has each place once in three rounds.
/// `k` counts from `--first`: round 0 of a run is `turn_order(first)`.
fn turn_order(k: usize) -> impl Iterator<Item = usize> {
    (0..3).map(move |j| (j + k) % 3)
}

/// The place (1 to 3) reclaimer `i` has in round `k` (see `turn_order`).
fn place_in(i: usize, k: usize) -> usize {
    (i + 3 - k % 3) % 3 + 1
}

/// Their users, which tell their requests apart in the audit log.
const USERS: [&str; 3] = [JANITOR_USER, SAFE_FLOOR_USER, FLOOR_USER];

/// Between two bursts: the last one's Events and watch events are done.
const SETTLE: Duration = Duration::from_secs(1);

/// One reclaimer's latencies: one at a time, and each burst's.
#[derive(Default)]
struct Latencies {
    seq: Vec<f64>,
    bursts: Vec<Vec<f64>>,
}

impl Latencies {
    fn burst(&self) -> Vec<f64> {
        self.bursts.concat()
    }
}

/// Locks by their holder (namespace, pod), as the floors look them up.
fn by_holder(set: &[Made]) -> HashMap<(String, String), Made> {
    set.iter()
        .map(|m| ((m.ns.clone(), m.holder.clone()), m.clone()))
        .collect()
}

/// The two floors, each watching for the deaths of its own locks' holders.
struct Floors {
    safe: tokio::task::JoinHandle<()>,
    misses: std::sync::Arc<SafeFloorMisses>,
    bare: tokio::task::JoinHandle<()>,
}

impl Floors {
    async fn start(
        cp: &lock_janitor_testenv::ControlPlane,
        client: &Client,
        safe: &[Made],
        bare: &[Made],
    ) -> Floors {
        // Each floor as a user of its own, so that the audit log tells its
        // requests from the benchmark's.
        let safe_client = floor_client(cp, client, SAFE_FLOOR_USER, JANITOR_USER).await;
        let (safe, misses) = safe_floor_deleter(&safe_client, by_holder(safe));
        let bare_client = floor_client(cp, client, FLOOR_USER, JANITOR_USER).await;
        let bare = floor_deleter(&bare_client, by_holder(bare));
        // Their watches listed.
        tokio::time::sleep(Duration::from_secs(2)).await;
        Floors { safe, misses, bare }
    }

    fn stop(self) {
        self.safe.abort();
        self.bare.abort();
        let count =
            |c: &std::sync::atomic::AtomicUsize| c.load(std::sync::atomic::Ordering::Relaxed);
        let m = &self.misses;
        let (skipped, failed, events_failed) =
            (count(&m.skipped), count(&m.failed), count(&m.events_failed));
        if skipped + failed + events_failed > 0 {
            println!(
                "    the safe floor skipped {skipped} locks after a read, failed {failed} reclaims \
                 and {events_failed} intent Events"
            );
        }
    }
}

/// The janitor and the two floors take turns on locks of their own: each
/// evicts `s` holders one at a time, then each a burst of `b` at once,
/// `bursts` rounds, the first of each round in turn. All three watch
/// throughout, so each burst meets the same watchers and the same drift
/// of the control plane.
async fn take_turns(
    client: &Client,
    deleted: &Deletions,
    j: &Janitor,
    sets: [&[Made]; 3],
    (s, b, bursts, first): (usize, usize, usize, usize),
) -> [Latencies; 3] {
    let mut l: [Latencies; 3] = Default::default();
    for (i, set) in sets.iter().enumerate() {
        l[i].seq = one_at_a_time(client, deleted, &set[..s]).await;
    }
    let mut freed = l[0].seq.len();
    for k in 0..bursts {
        for i in turn_order(first + k) {
            let burst = &sets[i][s + k * b..s + (k + 1) * b];
            let took = at_once(client, deleted, burst).await;
            if took.len() < b {
                println!(
                    "    {}: {} of {b} locks NOT reclaimed within 120 s",
                    WHO[i].trim(),
                    b - took.len()
                );
            }
            if i == 0 {
                freed += took.len();
                said(j, "configmap", freed).await;
            }
            l[i].bursts.push(took);
            tokio::time::sleep(SETTLE).await;
        }
    }
    l
}

/// Waits until the janitor has said what it freed: `n` reclaims of `kind`
/// counted (`lock_janitor_reclaims_by_reason_total`, counted once the
/// `StaleLockReclaimed` Event is written), so that its reports are not
/// served during the next reclaimer's turn. 30 s at most: a lock freed but
/// not counted (a DELETE whose answer was lost, then a 404) is said, and
/// the run goes on.
async fn said(j: &Janitor, kind: &str, n: usize) {
    let counted = || async {
        let m = j.metrics().await;
        sample_sum(
            &m,
            "lock_janitor_reclaims_by_reason_total",
            &[("kind", kind)],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = counted().await;
        if c >= n as f64 {
            return;
        }
        if Instant::now() > deadline {
            println!(
                "    the janitor counted {c} reclaims of kind {kind}, not {n}, 30 s after its turn"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the latency phase prints: the latencies, the janitor's p99 over
/// the safe floor's, and where the time went (the audit log).
fn print_latencies(
    cp: &lock_janitor_testenv::ControlPlane,
    top: usize,
    sets: [&[Made]; 3],
    lat: &[Latencies; 3],
    (s, b, first): (usize, usize, usize),
) {
    let n = lat[0].bursts.len();
    println!("reclaim latency over {top} locks (holder's status write acknowledged -> lock deleted, as a watch here sees it):");
    for (who, l) in WHO.iter().zip(lat) {
        println!("  {who} one at a time: {}", distribution(l.seq.clone()));
    }
    for (who, l) in WHO.iter().zip(lat) {
        println!("  {who} {n} bursts of {b}: {}", distribution(l.burst()));
    }
    println!("median / p99 / max, and the janitor's p99 over the safe floor's:");
    let rows = [
        (
            "one at a time".to_string(),
            lat.each_ref().map(|l| l.seq.clone()),
        ),
        (
            format!("{n} bursts of {b}"),
            lat.each_ref().map(Latencies::burst),
        ),
    ];
    for (what, [j, sf, f]) in rows {
        println!("  {what}:");
        println!("    janitor:     {}", median_p99_max(j.clone()));
        println!("    safe floor:  {}", median_p99_max(sf.clone()));
        println!("    bare DELETE: {}", median_p99_max(f.clone()));
        println!(
            "    janitor p99 / safe floor p99 = {}",
            ratio(p99(&j), p99(&sf))
        );
    }
    let each: Vec<String> = (0..n)
        .map(|k| ratio(p99(&lat[0].bursts[k]), p99(&lat[1].bursts[k])))
        .collect();
    println!(
        "  each burst alone, janitor p99 / safe floor p99: {}",
        each.join(", ")
    );
    // Each burst's p99 itself, and who went before it in its round.
    for (i, (who, l)) in WHO.iter().zip(lat).enumerate().take(2) {
        let each: Vec<String> = (0..n)
            .map(|k| {
                let place = place_in(i, first + k);
                let p = p99(&l.bursts[k]).map_or("-".into(), |p| format!("{p:.3}"));
                format!("{p} ({place})")
            })
            .collect();
        println!(
            "  each burst's p99 (its place in the round), {who} {}",
            each.join(", ")
        );
    }
    let events = lock_janitor_testenv::audit::read(cp.audit_log_path());
    println!("where one reclaim's time goes (one at a time; the API server's audit log):");
    for (who, (user, set)) in WHO.iter().zip(USERS.iter().zip(sets)) {
        println!("  {who} {}", where_time_goes(&events, user, &set[..s]));
    }
    println!("where the time goes in the bursts:");
    for (who, (user, set)) in WHO.iter().zip(USERS.iter().zip(sets)) {
        println!(
            "  {who} {}",
            where_time_goes(&events, user, &set[s..s + n * b])
        );
    }
    println!("other requests during each burst of one's own (the API server's audit log):");
    for (who, (user, set)) in WHO.iter().zip(USERS.iter().zip(sets)).take(2) {
        for k in 0..n {
            let burst = &set[s + k * b..s + (k + 1) * b];
            println!(
                "  {who} burst {}: {}",
                k + 1,
                meanwhile(&events, user, burst)
            );
        }
    }
    println!("step by step in the bursts (the API server's audit log; median / p99 / max):");
    for (who, (user, set)) in WHO.iter().zip(USERS.iter().zip(sets)).take(2) {
        println!(
            "  {}:{}",
            who.trim().trim_end_matches(','),
            step_by_step(&events, user, &set[s..s + n * b])
        );
    }
}

/// What else `user` asked of the API server while a burst of its own was
/// reclaimed (from the first eviction's status write to the last DELETE):
/// requests about none of the burst's locks and holders, by verb and
/// resource (watches aside). For the janitor: its takeover looks at the
/// locks it freed before, its sweeps, its lease.
fn meanwhile(events: &[AuditEvent], user: &str, burst: &[Made]) -> String {
    let start = burst
        .iter()
        .filter_map(|m| evicted(events, m, user)?.received_at())
        .min();
    let end = burst
        .iter()
        .flat_map(|m| about(events, m, user, false))
        .filter(|e| e.verb == "delete")
        .filter_map(AuditEvent::received_at)
        .max();
    let (Some(start), Some(end)) = (start, end) else {
        return "no window".into();
    };
    let ours: std::collections::HashSet<&str> = burst
        .iter()
        .flat_map(|m| [m.holder.as_str(), m.lock.as_str()])
        .collect();
    let others = events.iter().filter(|e| {
        let in_window = e.received_at().is_some_and(|t| t >= start && t <= end);
        let named = e.name.as_deref().map(|n| n.split('.').next().unwrap_or(n));
        e.effective_user() == user
            && in_window
            && e.verb != "watch"
            && !named.is_some_and(|n| ours.contains(n))
    });
    let secs = end.duration_since(start).as_secs_f64();
    format!("over {secs:.3}s: {}", by_verb(others))
}

/// What the Lease phase prints: the latencies pooled over the rounds, the
/// janitor's p99 over the safe floor's (pooled, and each round's), and
/// where the time went.
fn print_lease_latencies(f: &LeaseFigures, n: usize) {
    let rounds = f.rounds[0].len();
    println!(
        "Lease release, {rounds} rounds of {n} holders failed at once for each (the renewal rule allows it -> \
         released, as a watch here sees it; W {}):",
        distribution(f.windows.clone())
    );
    for (i, who) in ["janitor:     ", "safe floor:  ", "bare release:"]
        .iter()
        .enumerate()
    {
        println!("  {who} {}", distribution(f.pooled(i)));
    }
    println!(
        "  janitor p99 / safe floor p99 = {}",
        ratio(p99(&f.pooled(0)), p99(&f.pooled(1)))
    );
    let each: Vec<String> = (0..rounds)
        .map(|k| ratio(p99(&f.rounds[0][k]), p99(&f.rounds[1][k])))
        .collect();
    println!(
        "  each round alone, janitor p99 / safe floor p99: {}",
        each.join(", ")
    );
    println!(
        "  janitor's requests in the Lease namespaces during its turns (from the deaths to the last release): {}",
        f.requests
    );
}

/// The table of the levels: memory and API load at each lock count.
fn print_levels(args: &Args, levels: &[Level]) {
    println!("janitor at scale (release build; idle load at --resync {}; default-flag load = that x {}/300)", secs(args.resync), args.resync.as_secs());
    println!(
        "{:>7} | {:>12} | {:>10} | {:>16} | {:>9} | {:>14} | {:>13} | {:>15} | {:>20}",
        "locks",
        "VmRSS MiB",
        "VmHWM MiB",
        "HWM re-list MiB",
        "KiB/lock",
        "req/s without",
        "req/s with",
        "req per sweep",
        "req/s /1k @5m resync"
    );
    let base = levels[0].steady.rss as f64;
    for l in levels {
        let per_lock = if l.locks > 0 {
            (l.steady.rss as f64 - base) / l.locks as f64
        } else {
            0.0
        };
        let added = (l.with_rps - l.baseline_rps).max(0.0);
        let at_default = added * args.resync.as_secs_f64() / 300.0;
        let per_1k = if l.locks > 0 {
            at_default * 1000.0 / l.locks as f64
        } else {
            at_default
        };
        println!(
            "{:>7} | {:>12} | {:>10} | {:>16} | {:>9.2} | {:>14.2} | {:>13.2} | {:>15.1} | {:>20.4}",
            l.locks,
            mib(l.steady.rss),
            mib(l.peak.hwm),
            l.relist
                .as_ref()
                .map(|m| format!("{} ({:.2}x)", mib(m.hwm), m.hwm as f64 / l.steady.rss as f64))
                .unwrap_or_else(|| "-".into()),
            per_lock / 1.0,
            l.baseline_rps,
            l.with_rps,
            l.per_sweep,
            per_1k
        );
        let _ = l.sweeps;
    }
}

#[tokio::main]
async fn main() {
    let run = Instant::now();
    let args = parse_args();
    println!(
        "bench_scale: levels {:?} locks; latency {} sequential + a burst of {}; idle windows of {}; janitor {}",
        args.levels, args.sequential, args.evict, secs(args.idle), janitor_bin().display()
    );
    step("Control plane");
    let (cp, client, kubeconfig, lock_ns) = bench_plane("scale", LOCK_NAMESPACES).await;

    let mut levels = vec![measure_level(&cp, &client, &kubeconfig, 0, &args).await];
    let mut made: Vec<Made> = Vec::new();
    for &n in &args.levels {
        step(&format!("Creating holders and locks up to {n}"));
        let t = Instant::now();
        let more = holders_and_locks(&client, &lock_ns, made.len(), n, true).await;
        made.extend(more);
        println!("    {} created in {}", made.len(), secs(t.elapsed()));
        levels.push(measure_level(&cp, &client, &kubeconfig, n, &args).await);
    }

    let top = made.len();
    let (s, b, n) = (args.sequential, args.evict, args.bursts);
    let per = s + b * n;
    step(&format!(
        "Reclaim latency over {top} locks: the janitor, the safe floor (a bare client making the \
         janitor's requests: GET lock, GET holder, intent Event, GET holder, guarded DELETE; \
         {JANITOR_CONCURRENCY} at a time) and the bare-DELETE floor (one guarded DELETE per death), \
         taking turns, the {} first",
        WHO[args.first].trim_end_matches([',', ' '])
    ));
    // Each floor reclaims locks of its own, not opted in: the janitor, which
    // watches the `top` opted-in locks, does not see them.
    let floors = holders_and_locks(&client, &lock_ns, top, top + 2 * per, false).await;
    let (deleted, watch, synced) = watch_deletions(&client, "");
    let _ = synced.await;
    let j = Janitor::start(&kubeconfig, &[]).await;
    all_held(&j, top, "every lock held").await;
    settled(&j).await;
    let sets = [&made[..per], &floors[..per], &floors[per..]];
    let running = Floors::start(&cp, &client, sets[1], sets[2]).await;
    let lat = take_turns(&client, &deleted, &j, sets, (s, b, n, args.first)).await;
    running.stop();
    drop(j);
    watch.abort();
    let leases = if args.lease_burst > 0 && args.lease_rounds > 0 {
        Some(lease_burst_phase(&cp, &client, &kubeconfig, &lock_ns, &args).await)
    } else {
        None
    };

    println!();
    print_levels(&args, &levels);
    println!();
    print_latencies(&cp, top, sets, &lat, (s, b, args.first));
    if let Some(f) = leases {
        print_lease_latencies(&f, args.lease_burst);
    }
    println!("\nwhole run {}", secs(run.elapsed()));
    drop(client);
    cp.stop();
}
