//! Hot standby: two janitors with --leader-elect on one Lease. Both watch
//! and are ready; only the leader writes. The leader killed (SIGKILL): the
//! standby reclaims a lock that goes stale meanwhile within the lease
//! duration (15 s) and a little; the leader stopped (SIGTERM): it releases
//! the lease and the standby leads within a few seconds.

use std::time::{Duration, Instant};

use crate::support::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, shared};

async fn grant_leases(client: &Client, ns: &str) {
    let rules = vec![rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["get", "create", "update"],
    )];
    grant_in(client, ns, "janitor-leases", user(JANITOR_USER), rules).await;
}

async fn leading(j: &Janitor) -> bool {
    sample(&j.metrics().await, "lock_janitor_leader", &[]) == Some(1.0)
}

/// Waits until exactly one of `js` leads; returns its index.
async fn one_leader(js: &[&Janitor]) -> usize {
    wait_for("exactly one leader", Duration::from_secs(40), || async {
        let mut who = Vec::new();
        for (i, j) in js.iter().enumerate() {
            if leading(j).await {
                who.push(i);
            }
        }
        (who.len() == 1).then(|| who[0])
    })
    .await
}

#[tokio::test]
async fn the_standby_takes_over_after_a_kill_and_a_clean_stop() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "ha").await;
    grant_leases(&client, &ns).await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();
    let kc = kubeconfig_as(cp, JANITOR_USER);
    let args = [
        "--namespace",
        ns.as_str(),
        "--leader-elect",
        "--leader-elect-namespace",
        ns.as_str(),
        "--resync",
        "5s",
    ];
    let a = Janitor::start(&kc, &args).await;
    let b = Janitor::start(&kc, &args).await;
    let first = one_leader(&[&a, &b]).await;
    let (mut leader, standby) = if first == 0 { (a, b) } else { (b, a) };
    assert_eq!(
        standby.readyz().await,
        Some(200),
        "the standby is ready too"
    );
    let lease = Api::<Lease>::namespaced(client.clone(), &ns)
        .get("lock-janitor")
        .await
        .unwrap();
    let holder = lease.spec.unwrap().holder_identity.unwrap_or_default();
    assert!(
        holder.starts_with("lock-janitor-e2e-"),
        "the holder identity is the pod name: {holder}"
    );

    // The leader reclaims; the standby writes nothing (no Event of its own).
    let p1 = running_pod(&client, &ns, "p1", &node).await;
    create_lock(&client, &lock_for("lock-1", &p1, true)).await;
    kubelet::set_failed(&client, &ns, "p1", "Evicted", "test")
        .await
        .unwrap();
    wait_for("lock-1 reclaimed", Duration::from_secs(20), || async {
        (!lock_exists(&client, &ns, "lock-1").await).then_some(())
    })
    .await;
    let by = |j: &Janitor| {
        j.logs()
            .lines()
            .filter(|l| l.contains("stale lock reclaimed"))
            .count()
    };
    leader.wait_said("stale lock reclaimed").await;
    assert_eq!((by(&leader), by(&standby)), (1, 0));

    // SIGKILL the leader, then a holder dies: the standby reclaims within
    // the lease duration and a little.
    let p2 = running_pod(&client, &ns, "p2", &node).await;
    create_lock(&client, &lock_for("lock-2", &p2, true)).await;
    wait_for(
        "lock-2 judged held by both",
        Duration::from_secs(20),
        || async {
            let (l, s) = (leader.metrics().await, standby.metrics().await);
            let held = |m: &str| sample(m, "lock_janitor_locks", &[("state", "held")]);
            (held(&l) == Some(1.0) && held(&s) == Some(1.0)).then_some(())
        },
    )
    .await;
    leader.kill();
    let killed = Instant::now();
    kubelet::set_failed(&client, &ns, "p2", "Evicted", "test")
        .await
        .unwrap();
    wait_for(
        "the standby reclaims lock-2",
        Duration::from_secs(17),
        || async { (!lock_exists(&client, &ns, "lock-2").await).then_some(()) },
    )
    .await;
    let after_kill = killed.elapsed();
    assert!(leading(&standby).await);

    // A new standby; SIGTERM the leader: it releases the lease, and the
    // standby leads within a few seconds.
    let mut new_leader = standby;
    let third = Janitor::start(&kc, &args).await;
    assert!(!leading(&third).await);
    new_leader.signal("TERM");
    let stopped = Instant::now();
    wait_for(
        "the third janitor leads",
        Duration::from_secs(3),
        || async { leading(&third).await.then_some(()) },
    )
    .await;
    let after_term = stopped.elapsed();
    let status = new_leader.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    assert!(
        new_leader.logs().contains("released the leader lease"),
        "{}",
        new_leader.logs()
    );
    println!(
        "failover: SIGKILL -> stale lock reclaimed by the standby in {:.1}s; SIGTERM -> standby leads in {:.1}s",
        after_kill.as_secs_f64(),
        after_term.as_secs_f64()
    );
}

/// Only the leader sweeps after the first sweep (every replica's first one
/// settles its own memory and readiness waits for it); a standby that takes
/// the lead sweeps at once.
#[tokio::test]
async fn only_the_leader_sweeps_and_a_new_leader_sweeps_at_once() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "ha-sweeps").await;
    grant_leases(&client, &ns).await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.unwrap();
    let p1 = running_pod(&client, &ns, "p1", &node).await;
    create_lock(&client, &lock_for("lock-1", &p1, true)).await;
    let kc = kubeconfig_as(cp, JANITOR_USER);
    let args = [
        "--namespace",
        ns.as_str(),
        "--leader-elect",
        "--leader-elect-namespace",
        ns.as_str(),
        "--leader-elect-lease-duration",
        "4s",
        "--resync",
        "1s",
    ];
    let a = Janitor::start(&kc, &args).await;
    let b = Janitor::start(&kc, &args).await;
    let first = one_leader(&[&a, &b]).await;
    let (mut leader, standby) = if first == 0 { (a, b) } else { (b, a) };
    leader.wait_sweeps(4).await;
    assert_eq!(standby.sweeps(), 1, "the standby swept only once, at start");

    leader.kill();
    wait_for("the standby leads", Duration::from_secs(30), || async {
        leading(&standby).await.then_some(())
    })
    .await;
    standby.wait_sweeps(2).await;
    assert!(
        standby.logs().contains("took the lead: sweeping now"),
        "{}",
        standby.logs()
    );
}
