//! `make demo-node`: the kubelet itself evicts a real operator-lib leader.
//!
//! Starts a control plane and a real node (containerd, runc, kubelet,
//! kube-scheduler; testenv/src/node.rs), installs the chart (two janitor
//! pods, election on) from a locally built image, deploys the real
//! operator-lib operator (testenv/peers `become`, two replicas), sets the
//! kubelet's evictionHard memory.available just under what is available now
//! and starts a pod that allocates past it. Prints the kubelet's eviction,
//! who freed the lock (the janitor, or operator-lib deleting the evicted pod
//! and the garbage collector), the replica's takeover and the times. Exits
//! non-zero if no replica takes over.
//!
//! Needs root, `make node-build` (testenv/build-node.sh) and the static
//! janitor (`cargo build --release --target x86_64-unknown-linux-musl`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_janitor_testsupport::real_node::*;

const RELEASE: &str = "lock-janitor";

fn step(msg: &str) {
    println!("\n==> {msg}");
}

#[tokio::main]
async fn main() -> ExitCode {
    match demo().await {
        Ok(()) => {
            println!("\nDemo passed: the kubelet evicted the leader, its lock was freed and a replica took over.");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nDemo FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn demo() -> anyhow::Result<()> {
    step("Starting a control plane and a real node (containerd, runc, CNI bridge, kubelet, kube-scheduler)");
    let n = RealNode::start(true).await;
    println!(
        "    node {} Ready in {:.1}s; node dir {}",
        lock_janitor_testenv::node::NODE_NAME,
        n.started.as_secs_f64(),
        n.node.dir().display()
    );

    let op = n.namespace("demo-operator").await;
    let sys = n.namespace("lock-janitor-system").await;
    let pressure = n.namespace("demo-pressure").await;

    step("Deploying the real operator-lib operator (leader for life, two replicas)");
    n.deploy_operator(&op);
    let leader = n.wait_leader(&op, None, Duration::from_secs(120)).await;
    n.wait_standby(&op, Duration::from_secs(60)).await;
    println!("    {leader} holds {op}/{LOCK}; the other replica waits");
    n.label_locks(&op);
    n.wait_labeled(&op).await;
    println!("    lock opted in (lock-janitor label --apply)");

    step("Installing the chart: two janitor pods from lock-janitor.local/lock-janitor:dev, election on");
    n.install_chart(RELEASE, &sys, &[&op]);
    n.wait_rollout(&sys);
    let jl = wait_some(Duration::from_secs(60), || n.janitor_leader(&sys, RELEASE)).await;
    println!("    janitor pods Ready; {jl} leads");

    step("Driving the node into memory pressure");
    press_memory(&n, &pressure).await?;

    step("Waiting for the kubelet to evict the leader");
    let t0 = Instant::now();
    let ev = wait_evicted(&n, &op, &leader, t0).await?;
    let evicted_at = Instant::now();
    show_eviction(&n, &op, &leader, &ev).await;
    relieve_pressure(&n, &pressure);

    step("Waiting for a replica to take over");
    let next = n
        .wait_leader(&op, Some(&leader), Duration::from_secs(180))
        .await;
    let took = evicted_at.elapsed();
    println!(
        "    {next} leads {:.1}s after the eviction was seen",
        took.as_secs_f64()
    );

    step("Who freed the lock (audit log)");
    who_freed(&n, &op, &sys).await;
    println!(
        "\n    times: evicted -> new leader {:.1}s; eviction seen {:.1}s after the hog started",
        took.as_secs_f64(),
        (evicted_at - t0).as_secs_f64()
    );
    Ok(())
}

/// Restarts the kubelet with an eviction threshold 1 GiB under the memory
/// available now, and starts a pod that allocates 2 GiB.
async fn press_memory(n: &RealNode, pressure: &str) -> anyhow::Result<()> {
    let avail = RealNode::memory_available_mib();
    let threshold = avail.saturating_sub(1024);
    n.node
        .set_memory_available(&format!("{threshold}Mi"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("    memory.available now {avail}Mi; kubelet restarted with evictionHard memory.available<{threshold}Mi");
    n.hog(pressure, "hog", 2048);
    println!("    pod {pressure}/hog allocates 2048Mi (Guaranteed: ranked after pods over their requests)");
    Ok(())
}

/// The kubelet's Evicted Event for the leader, within 240 s of `t0`.
async fn wait_evicted(
    n: &RealNode,
    op: &str,
    leader: &str,
    t0: Instant,
) -> anyhow::Result<k8s_openapi::api::core::v1::Event> {
    Ok(loop {
        if let Some(e) = n.event(op, leader, "Evicted").await {
            break e;
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(240),
            "the kubelet did not evict {leader} within 240s; kubelet log:\n{}",
            tail(&n.node.kubelet_log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    })
}

/// The Event, the evicted pod as the kubelet left it, and the kubelet's
/// own log lines of the eviction.
async fn show_eviction(
    n: &RealNode,
    op: &str,
    leader: &str,
    ev: &k8s_openapi::api::core::v1::Event,
) {
    println!(
        "    Event {} from {:?}: {}",
        ev.reason.as_deref().unwrap_or(""),
        ev.source.as_ref().and_then(|s| s.component.as_deref()),
        ev.message.as_deref().unwrap_or("")
    );
    if let Some(p) = n
        .pods(op, OPERATOR_LABEL)
        .await
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(leader))
    {
        let st = p.status.unwrap_or_default();
        let conds: Vec<String> = st
            .conditions
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                format!(
                    "{}={}{}",
                    c.type_,
                    c.status,
                    c.reason.map(|r| format!("({r})")).unwrap_or_default()
                )
            })
            .collect();
        println!(
            "    pod {leader} as the kubelet left it: phase {:?}, reason {:?}, conditions [{}]",
            st.phase,
            st.reason,
            conds.join(", ")
        );
    }
    for l in n.node.kubelet_log().lines().filter(|l| {
        l.contains("Eviction manager: pod is evicted successfully")
            || l.contains("pods ranked for eviction")
    }) {
        println!("    kubelet: {}", l.trim());
    }
}

/// Deletes the memory hog.
fn relieve_pressure(n: &RealNode, pressure: &str) {
    n.kubectl(
        &[
            "delete",
            "pod",
            "-n",
            pressure,
            "hog",
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    println!("    pressure relieved: hog deleted");
}

/// The DELETEs in the operator's namespace (audit log), the janitor's
/// Event, who freed the lock and the janitor pods' log lines about it.
async fn who_freed(n: &RealNode, op: &str, sys: &str) {
    let deletes: Vec<_> = n
        .audit()
        .into_iter()
        .filter(|e| {
            e.verb == "delete"
                && e.namespace.as_deref() == Some(op)
                && e.stage == "ResponseComplete"
        })
        .filter(|e| {
            matches!(e.resource.as_deref(), Some("configmaps" | "pods")) && e.subresource.is_none()
        })
        .collect();
    for d in &deletes {
        println!(
            "    {} {} {}/{} by {} -> {:?}",
            d.received.as_deref().unwrap_or(""),
            d.verb,
            d.resource.as_deref().unwrap_or(""),
            d.name.as_deref().unwrap_or(""),
            d.user,
            d.code
        );
    }
    let sa = format!("system:serviceaccount:{sys}:{RELEASE}");
    if let Some(r) = n.event(op, LOCK, "StaleLockReclaimed").await {
        println!(
            "    janitor Event StaleLockReclaimed: {}",
            r.message.as_deref().unwrap_or("")
        );
    }
    let by_janitor = deletes
        .iter()
        .any(|d| d.user == sa && d.name.as_deref() == Some(LOCK) && d.code == Some(200));
    println!(
        "    the lock was freed by {}",
        if by_janitor {
            "the janitor (chart pod)"
        } else {
            "operator-lib and the garbage collector (the janitor stayed out)"
        }
    );
    for p in n.pods(sys, "app.kubernetes.io/name=lock-janitor").await {
        for l in n.pod_log(sys, &p).lines().filter(|l| l.contains(LOCK)) {
            println!(
                "    janitor {}: {}",
                p.metadata.name.as_deref().unwrap_or(""),
                l.trim()
            );
        }
    }
}

async fn wait_some<T, F, Fut>(timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
