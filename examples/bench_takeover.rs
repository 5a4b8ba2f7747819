//! Takeover time after an eviction with real peers (`testenv/peers`), each
//! alone beside with the janitor, side by side in one run on a local control
//! plane: operator-lib's leader-for-life (v0.19.0), a controller-runtime
//! Lease candidate (client-go's elector) with a 60 s lease, and client-go
//! candidates at OpenShift's library-go timings (137 s / 107 s / 26 s).
//!
//! Each round, in two namespaces at once, a leader and a waiting replica run
//! operator-lib's `leader.Become`. Once the replica is in its steady 16 s
//! backoff (its fifth "Not the leader. Waiting."), the leader is evicted
//! (its process killed, its status written Failed/Evicted). Measured: from
//! the status write to the replica saying it leads. Alone, operator-lib's
//! replica deletes the evicted pod on its next attempt, the garbage
//! collector deletes the lock, and the attempt after that creates it; with
//! the janitor the lock is gone within milliseconds and the next attempt
//! leads. It reports numbers and passes or fails nothing on time.
//!
//! `make bench` runs it. By hand:
//!
//! ```text
//! cargo build --release --bin lock-janitor
//! LOCK_JANITOR_BIN=target/release/lock-janitor cargo run --release --example bench_takeover -- [--rounds 3] [--library-go-rounds 1]
//! ```

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use lock_janitor_testenv::kubelet;
use lock_janitor_testenv::peers::Peer;
use lock_janitor_testsupport::bench::*;
use lock_janitor_testsupport::*;

const LOCK: &str = "bench-operator-lock";
/// operator-lib doubles its wait from 1 s up to 16 s: after five waits the
/// next one is the steady 16 s (±20% jitter).
const STEADY_AFTER_WAITS: usize = 5;

fn waits(p: &Peer) -> usize {
    p.logs().matches("Not the leader. Waiting.").count()
}

/// One side of a round: evicts the leader in `ns` once the replica is in
/// its steady backoff, and returns the seconds until the replica leads.
async fn round(
    cp: &lock_janitor_testenv::ControlPlane,
    client: &Client,
    ns: &str,
    r: usize,
) -> f64 {
    let (leader, replica) = (format!("leader-{r}"), format!("replica-{r}"));
    // A lock of its own each round: the last round's replica still leads.
    let lock = format!("{LOCK}-{r}");
    running(client, ns, &leader, &node_of(r), "bench").await;
    running(client, ns, &replica, &node_of(r + 1), "bench").await;
    let mut first = Peer::become_leader(cp.kubeconfig_path(), cp.dir(), ns, &leader, &lock)
        .unwrap_or_else(|e| die(&e.to_string()));
    first
        .wait_leading(Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| die(&e));
    // Opted in (a no-op where no janitor runs).
    let label = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: WATCH_LABEL.1}}});
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let params = PatchParams::default();
    let patch = Patch::Merge(&label);
    retry("labeling the lock", || cms.patch(&lock, &params, &patch)).await;
    let mut second = Peer::become_leader(cp.kubeconfig_path(), cp.dir(), ns, &replica, &lock)
        .unwrap_or_else(|e| die(&e.to_string()));
    wait_for(
        "the replica in its steady backoff",
        Duration::from_secs(120),
        || async { (waits(&second) >= STEADY_AFTER_WAITS).then_some(()) },
    )
    .await;
    first.kill();
    retry("evicting the leader", || {
        kubelet::set_failed(
            client,
            ns,
            &leader,
            "Evicted",
            "The node was low on resource: memory.",
        )
    })
    .await;
    let evicted = Instant::now();
    let led = second
        .wait_leading(Duration::from_secs(180))
        .await
        .unwrap_or_else(|e| die(&e));
    (led - evicted).as_secs_f64()
}

/// One side of a Lease round: a controller-runtime candidate waits on a
/// Waits until the Lease `name` has been renewed `n` more times.
async fn renewals(
    leases: &kube::Api<k8s_openapi::api::coordination::v1::Lease>,
    name: &str,
    n: usize,
) {
    let renewed = || async {
        leases
            .get(name)
            .await
            .ok()
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0)
    };
    let mut seen = renewed().await;
    let mut count = 0;
    while count < n {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = renewed().await;
        if now != seen {
            seen = now;
            count += 1;
        }
    }
}

/// A Lease with `timings` (lease, renew deadline, retry period, for both
/// candidates); the leader is killed and its pod marked Evicted once the
/// Lease has been renewed three times more (the janitor has seen two gaps:
/// its renew period); seconds until the candidate leads. Alone it waits
/// out the lease; with the janitor the Lease is released once the dead
/// holder has missed 2.5 of its renew periods, and the candidate leads at
/// its next retry.
async fn lease_round(
    cp: &lock_janitor_testenv::ControlPlane,
    client: &Client,
    ns: &str,
    r: usize,
    timings: [Duration; 3],
) -> f64 {
    use k8s_openapi::api::coordination::v1::Lease;
    let (leader, candidate) = (format!("lease-leader-{r}"), format!("lease-candidate-{r}"));
    let lease = format!("bench-lease-{r}-{}", timings[0].as_secs());
    running(client, ns, &leader, &node_of(r), "bench").await;
    running(client, ns, &candidate, &node_of(r + 1), "bench").await;
    let mut first = Peer::elect_with(cp.kubeconfig_path(), cp.dir(), ns, &leader, &lease, timings)
        .unwrap_or_else(|e| die(&e.to_string()));
    first
        .wait_leading(Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| die(&e));
    let label = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: WATCH_LABEL.1}}});
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let (params, patch) = (PatchParams::default(), Patch::Merge(&label));
    retry("labeling the lease", || {
        leases.patch(&lease, &params, &patch)
    })
    .await;
    let mut second = Peer::elect_with(
        cp.kubeconfig_path(),
        cp.dir(),
        ns,
        &candidate,
        &lease,
        timings,
    )
    .unwrap_or_else(|e| die(&e.to_string()));
    wait_for("the candidate trying", Duration::from_secs(120), || async {
        second
            .logs()
            .contains("Attempting to acquire leader lease")
            .then_some(())
    })
    .await;
    renewals(&leases, &lease, 3).await;
    first.kill();
    retry("evicting the leader", || {
        kubelet::set_failed(
            client,
            ns,
            &leader,
            "Evicted",
            "The node was low on resource: memory.",
        )
    })
    .await;
    let evicted = Instant::now();
    let led = second
        .wait_leading(timings[0] * 3)
        .await
        .unwrap_or_else(|e| die(&e));
    (led - evicted).as_secs_f64()
}

/// A controller-runtime manager with a 60 s lease (as charts that raise it
/// use): renew deadline 40 s, retry 2 s.
const LEASE_60S: [Duration; 3] = [
    Duration::from_secs(60),
    Duration::from_secs(40),
    Duration::from_secs(2),
];
/// OpenShift's library-go defaults: lease 137 s, renew deadline 107 s,
/// retry 26 s.
const LIBRARY_GO: [Duration; 3] = [
    Duration::from_secs(137),
    Duration::from_secs(107),
    Duration::from_secs(26),
];

/// Takeover time after an eviction with real peers, alone and with the
/// janitor (see the file's doc).
#[derive(clap::Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Rounds of operator-lib and of the 60 s Lease.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Rounds at library-go's timings.
    #[arg(long = "library-go-rounds", default_value_t = 1)]
    library_go_rounds: usize,
}

#[tokio::main]
async fn main() {
    let Args {
        rounds,
        library_go_rounds: slow_rounds,
    } = clap::Parser::parse();
    println!(
        "bench_takeover: {rounds} rounds, operator-lib alone beside operator-lib with the janitor {}",
        janitor_bin().display()
    );
    step("Control plane");
    let (cp, client, kubeconfig, ns) = bench_plane("takeover", 2).await;
    let (alone, with) = (&ns[0], &ns[1]);
    let janitor = Janitor::start(&kubeconfig, &["--namespace", with]).await;
    let (mut t_alone, mut t_with) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        step(&format!("Round {} of {rounds}", r + 1));
        let (a, w) = tokio::join!(
            round(&cp, &client, alone, 2 * r),
            round(&cp, &client, with, 2 * r)
        );
        println!("    alone {a:.1} s, with the janitor {w:.1} s");
        t_alone.push(a);
        t_with.push(w);
    }
    let (mut l_alone, mut l_with) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        step(&format!("Lease round {} of {rounds}", r + 1));
        let (a, w) = tokio::join!(
            lease_round(&cp, &client, alone, 2 * r, LEASE_60S),
            lease_round(&cp, &client, with, 2 * r, LEASE_60S)
        );
        println!("    alone {a:.1} s, with the janitor {w:.1} s");
        l_alone.push(a);
        l_with.push(w);
    }
    let (mut s_alone, mut s_with) = (Vec::new(), Vec::new());
    for r in 0..slow_rounds {
        step(&format!(
            "Lease round at library-go timings {} of {slow_rounds}",
            r + 1
        ));
        let (a, w) = tokio::join!(
            lease_round(&cp, &client, alone, 2 * r + 100, LIBRARY_GO),
            lease_round(&cp, &client, with, 2 * r + 100, LIBRARY_GO)
        );
        println!("    alone {a:.1} s, with the janitor {w:.1} s");
        s_alone.push(a);
        s_with.push(w);
    }
    let m = janitor.metrics().await;
    let reclaims: f64 = m
        .lines()
        .filter(|l| l.starts_with("lock_janitor_reclaims_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!();
    println!("takeover after an eviction, waiting replica in its steady 16 s backoff :");
    println!(
        "    operator-lib alone:            {}",
        distribution(t_alone)
    );
    println!(
        "    operator-lib with the janitor: {}",
        distribution(t_with)
    );
    println!(
        "takeover after an eviction, controller-runtime candidate on a 60 s lease (retry 2 s):"
    );
    println!("    candidate alone:            {}", distribution(l_alone));
    println!("    candidate with the janitor: {}", distribution(l_with));
    println!(
        "takeover after an eviction, client-go candidates at OpenShift's library-go timings (137 s / 107 s / 26 s):"
    );
    println!("    candidate alone:            {}", distribution(s_alone));
    println!("    candidate with the janitor: {}", distribution(s_with));
    println!("    (the janitor reclaimed {reclaims} locks)");
}
