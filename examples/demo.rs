//! `make demo`: the janitor's main job on a real local control plane.
//!
//! Starts etcd, kube-apiserver and kube-controller-manager, runs
//! `lock-janitor run`, stages an operator leader holding a leader-for-life
//! lock and a waiting replica, evicts the leader as the kubelet would, and
//! shows the reclaim, the takeover, the Event and the metrics. Exits non-zero
//! if the replica does not take over.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_janitor_testenv::{fresh_namespace, kubelet, ControlPlane, Options};
use lock_janitor_testsupport::*;

fn step(msg: &str) {
    println!("\n==> {msg}");
}

#[tokio::main]
async fn main() -> ExitCode {
    match demo().await {
        Ok(()) => {
            println!("\nDemo passed: the evicted leader's lock was reclaimed and the waiting replica took over.");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nDemo FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn demo() -> anyhow::Result<()> {
    step("Starting a local control plane (etcd, kube-apiserver, kube-controller-manager)");
    let t = Instant::now();
    let cp = ControlPlane::start(Options::default()).await?;
    println!(
        "    ready in {:.1}s at {}",
        t.elapsed().as_secs_f64(),
        cp.server_url()
    );
    let client = cp.client().await?;
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "demo").await;

    step("Starting lock-janitor (least-privilege identity, watching the demo namespace)");
    let janitor = Janitor::start(
        &kubeconfig_as(&cp, JANITOR_USER),
        &["--namespace", &ns, "--resync", "30s"],
    )
    .await;
    println!(
        "    ready: /readyz answers 200 on 127.0.0.1:{}",
        janitor.port
    );

    let waiting = stage_operator(&client, &ns).await?;

    step("The kubelet evicts the leader (memory pressure): phase Failed, reason Evicted");
    kubelet::set_failed(
        &client,
        &ns,
        "memcached-operator-a",
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await?;
    let evicted_at = Instant::now();

    took_over(waiting, evicted_at).await?;

    step("Events on the lock");
    show_reclaim(&client, &ns, &janitor).await?;

    step("Cleaning up (janitor and control plane stopped, temp dir removed)");
    drop(janitor);
    cp.stop();
    Ok(())
}

/// A leader pod holding the labeled lock and a replica waiting for it as
/// operator-lib does; returns the replica's wait (its lock, once taken).
async fn stage_operator(
    client: &kube::Client,
    ns: &str,
) -> anyhow::Result<tokio::task::JoinHandle<k8s_openapi::api::core::v1::ConfigMap>> {
    step("Staging an operator: leader pod memcached-operator-a holds the lock, replica -b waits");
    let leader = running_pod(client, ns, "memcached-operator-a", "worker-1").await;
    let replica = running_pod(client, ns, "memcached-operator-b", "worker-2").await;
    become_leader(client, &leader, "memcached-operator-lock", true).await;
    println!("    lock {ns}/memcached-operator-lock is owned by pod memcached-operator-a (labeled lock-janitor.io/watch=true)");
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            become_leader(&client, &replica, "memcached-operator-lock", false).await
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    anyhow::ensure!(
        !waiting.is_finished(),
        "the replica must wait while the leader runs"
    );
    println!("    memcached-operator-b retries (1s, 2s, 4s ... 16s), as operator-lib does: AlreadyExists");
    Ok(waiting)
}

/// The replica takes over within 60 s of the eviction and owns the new
/// lock.
async fn took_over(
    waiting: tokio::task::JoinHandle<k8s_openapi::api::core::v1::ConfigMap>,
    evicted_at: Instant,
) -> anyhow::Result<()> {
    let new_lock = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .map_err(|_| anyhow::anyhow!("no takeover within 60s of the eviction"))??;
    let owner = new_lock
        .metadata
        .owner_references
        .as_ref()
        .and_then(|o| o.first())
        .map(|o| o.name.clone())
        .unwrap_or_default();
    anyhow::ensure!(
        owner == "memcached-operator-b",
        "the lock is owned by {owner:?}, not the replica"
    );
    println!(
        "    takeover: memcached-operator-b now owns the lock, {:.1}s after the eviction",
        evicted_at.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The Event on the lock, the label carried over, the janitor's log lines
/// and its metrics of the reclaim.
async fn show_reclaim(client: &kube::Client, ns: &str, janitor: &Janitor) -> anyhow::Result<()> {
    let ev = wait_event(client, ns, "StaleLockReclaimed", "memcached-operator-lock").await;
    println!(
        "    {:<8} {:<20} {}",
        ev.type_.unwrap_or_default(),
        ev.reason.unwrap_or_default(),
        ev.note.unwrap_or_default()
    );

    // The janitor carries the opt-in label over to the new lock.
    wait_for(
        "opt-in label carried over",
        Duration::from_secs(30),
        || async {
            janitor
                .logs()
                .contains("opt-in label carried over")
                .then_some(())
        },
    )
    .await;
    step("The janitor's log");
    for line in janitor
        .logs()
        .lines()
        .filter(|l| l.contains("reclaimed") || l.contains("takeover"))
    {
        println!("    {line}");
    }

    step("Metrics (GET /metrics)");
    let metrics = janitor.metrics().await;
    for line in metrics.lines().filter(|l| {
        (l.starts_with("lock_janitor_reclaims_total") && !l.ends_with(" 0"))
            || l.starts_with("lock_janitor_locks{")
            || l.starts_with("lock_janitor_reclaim_latency_seconds_count")
            || l.starts_with("lock_janitor_reclaim_latency_seconds_sum")
    }) {
        println!("    {line}");
    }
    anyhow::ensure!(
        sample(
            &metrics,
            "lock_janitor_reclaims_total",
            &[("lock", "memcached-operator-lock"), ("reason", "Evicted")]
        ) == Some(1.0),
        "the reclaim metric did not count the reclaim"
    );
    Ok(())
}
