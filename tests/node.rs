//! End-to-end on a real node (`make test-node`): a kubelet, containerd and
//! runc run the real operator-lib operator and the chart's janitor in real
//! containers. What the simulated tests cannot show: what a real kubelet
//! writes when it evicts under memory pressure, what the Eviction API and
//! the node lifecycle controllers do to real pods, and the chart's pods
//! (image, security context, in-cluster config, token, election) running.
//!
//! Not part of `make test`: these tests need root, the node binaries
//! (testenv/build-node.sh) and the static janitor, and they drive one node
//! at a time. `make test-node` sets LOCK_JANITOR_NODE=1; without it every
//! test fails at once, saying so (never a silent skip).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::EvictParams;
use kube::Api;
use lock_janitor_testenv::node::KUBELET_USER;
use lock_janitor_testenv::CONTROLLER_MANAGER_USER;
use lock_janitor_testsupport::real_node::*;
use lock_janitor_testsupport::{grant_janitor, kubeconfig_as, Janitor, JANITOR_USER};

/// One node at a time: tests take this for their whole run.
static ONE_NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn require_node() {
    if std::env::var(ENV).as_deref() != Ok("1") {
        panic!(
            "tests/node.rs runs on a real node: run `make test-node` (it builds the node, the static janitor and sets {ENV}=1); as root"
        );
    }
}

/// An operator with a leader and a waiting replica, the lock opted in, and
/// the janitor running on the host as its least-privilege user.
async fn operator(n: &RealNode, prefix: &str) -> (String, String, Janitor) {
    grant_janitor(&n.client).await;
    let ns = n.namespace(prefix).await;
    n.deploy_operator(&ns);
    let leader = n.wait_leader(&ns, None, Duration::from_secs(120)).await;
    n.wait_standby(&ns, Duration::from_secs(60)).await;
    n.label_locks(&ns);
    n.wait_labeled(&ns).await;
    let kc = kubeconfig_as(&n.cp, JANITOR_USER);
    let janitor = Janitor::start(&kc, &["--namespace", &ns, "--resync", "5s"]).await;
    (ns, leader, janitor)
}

#[tokio::test]
async fn kubelet_evicts_the_leader_under_memory_pressure() {
    require_node();
    let _one = ONE_NODE.lock().await;
    let n = RealNode::start(false).await;
    let (ns, leader, janitor) = operator(&n, "node-pressure").await;
    let pressure = n.namespace("node-hog").await;

    let avail = RealNode::memory_available_mib();
    n.node
        .set_memory_available(&format!("{}Mi", avail.saturating_sub(1024)))
        .await
        .unwrap();
    n.hog(&pressure, "hog", 2048);
    let t0 = Instant::now();
    while n.event(&ns, &leader, "Evicted").await.is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "the kubelet did not evict {leader}:\n{}",
            tail(&n.node.kubelet_log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    n.kubectl(
        &[
            "delete",
            "pod",
            "-n",
            &pressure,
            "hog",
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    let next = n
        .wait_leader(&ns, Some(&leader), Duration::from_secs(180))
        .await;
    assert_ne!(next, leader);

    let audit = n.audit();
    // The kubelet itself wrote the leader's Failed/Evicted status.
    assert!(
        audit.iter().any(|e| e.user == KUBELET_USER
            && e.namespace.as_deref() == Some(ns.as_str())
            && e.name.as_deref() == Some(leader.as_str())
            && e.subresource.as_deref() == Some("status")
            && e.code == Some(200)),
        "no status write of {leader} by the kubelet"
    );
    assert!(n
        .node
        .kubelet_log()
        .lines()
        .any(|l| l.contains("pod is evicted successfully") && l.contains(&leader)));
    // The lock was freed by the janitor or by operator-lib + the garbage
    // collector (operator-lib deletes an evicted leader's pod itself); the
    // janitor deleted nothing but the lock and wrote no pod.
    let deletes: Vec<_> = audit
        .iter()
        .filter(|e| e.verb == "delete" && e.namespace.as_deref() == Some(ns.as_str()))
        .filter(|e| e.resource.as_deref() == Some("configmaps") && e.name.as_deref() == Some(LOCK))
        .filter(|e| e.code == Some(200))
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:#?}");
    assert!(
        [JANITOR_USER, CONTROLLER_MANAGER_USER].contains(&deletes[0].effective_user()),
        "{:?}",
        deletes[0]
    );
    let janitor_writes = n.writes(JANITOR_USER, &ns);
    assert!(
        janitor_writes.iter().all(|e| e.resource.as_deref() == Some("configmaps") && e.name.as_deref() == Some(LOCK)),
        "{janitor_writes:#?}\n{}",
        janitor.logs()
    );
}

#[tokio::test]
async fn api_eviction_of_the_leader_frees_the_lock_once_after_its_pod_stopped() {
    require_node();
    let _one = ONE_NODE.lock().await;
    let n = RealNode::start(false).await;
    let (ns, leader, janitor) = operator(&n, "node-api-evict").await;
    Api::<Pod>::namespaced(n.client.clone(), &ns)
        .evict(&leader, &EvictParams::default())
        .await
        .expect("evict the leader");
    let next = n
        .wait_leader(&ns, Some(&leader), Duration::from_secs(120))
        .await;
    assert_ne!(next, leader);
    // The kubelet terminated the pod gracefully; the container exited 0 on
    // SIGTERM and the kubelet wrote phase Succeeded before the pod object
    // went away. The lock is deleted exactly once: by the garbage collector
    // (owner gone), or by the janitor, but then only after the kubelet's
    // terminal status write (the holder's process is gone), and the janitor
    // never deletes the pod itself. (Seen here: the janitor, reason
    // Succeeded, ~2 s after the eviction, ahead of the GC; see docs/real-node.md.)
    let audit = n.audit();
    let deletes: Vec<_> = audit
        .iter()
        .filter(|e| e.verb == "delete" && e.namespace.as_deref() == Some(ns.as_str()))
        .filter(|e| e.resource.as_deref() == Some("configmaps") && e.name.as_deref() == Some(LOCK))
        .filter(|e| e.code == Some(200))
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:#?}");
    let by = deletes[0].effective_user().to_string();
    assert!(
        [JANITOR_USER, CONTROLLER_MANAGER_USER].contains(&by.as_str()),
        "{:?}",
        deletes[0]
    );
    let eviction = audit
        .iter()
        .find(|e| {
            e.subresource.as_deref() == Some("eviction")
                && e.name.as_deref() == Some(leader.as_str())
        })
        .expect("the eviction in the audit log");
    // The safety property: the janitor's DELETE comes after the kubelet's
    // first status write of a terminal phase, and the pod that write left
    // says no container runs. (The kubelet may write the pod's status again
    // after that, e.g. its conditions, while the lock is already gone: those
    // later writes say nothing about the holder's process.) The kubelet
    // writes a strategic merge patch of what changed, so the pod is read
    // from the write's response, not its body.
    let terminal = audit
        .iter()
        .filter(|e| {
            e.user == KUBELET_USER
                && e.name.as_deref() == Some(leader.as_str())
                && e.subresource.as_deref() == Some("status")
                && e.code == Some(200)
        })
        .filter(|e| {
            let phase = e
                .response_object
                .as_ref()
                .and_then(|o| o.pointer("/status/phase"))
                .and_then(|p| p.as_str());
            matches!(phase, Some("Failed" | "Succeeded"))
        })
        .min_by_key(|e| e.received.clone())
        .expect("the kubelet's status write of a terminal phase for the leader");
    let pod = terminal
        .response_object
        .as_ref()
        .expect("a pod status write is logged with its response");
    let statuses: Vec<&serde_json::Value> = [
        "initContainerStatuses",
        "containerStatuses",
        "ephemeralContainerStatuses",
    ]
    .iter()
    .filter_map(|kind| pod.pointer(&format!("/status/{kind}")))
    .filter_map(|s| s.as_array())
    .flatten()
    .collect();
    assert!(
        !statuses.is_empty(),
        "the kubelet's terminal write left no container status: {pod:#}"
    );
    for c in &statuses {
        assert!(
            c.pointer("/state/running").is_none(),
            "the kubelet's terminal write left a container running: {c:#}"
        );
    }
    let terminal_at = terminal.received.clone().unwrap_or_default();
    if by == JANITOR_USER {
        assert!(
            deletes[0].received.as_deref() > Some(terminal_at.as_str()),
            "the janitor deleted the lock before the kubelet's first terminal status write: {terminal:#?}"
        );
    }
    eprintln!(
        "API eviction at {:?}; kubelet's first terminal status write {terminal_at}; lock deleted by {by} at {:?}",
        eviction.received, deletes[0].received
    );
    let jw = n.writes(JANITOR_USER, &ns);
    assert!(
        jw.iter()
            .all(|e| e.resource.as_deref() == Some("configmaps")),
        "janitor wrote: {jw:#?}\n{}",
        janitor.logs()
    );
}

#[tokio::test]
async fn kubelet_stopped_holds_the_lock_until_out_of_service() {
    require_node();
    let _one = ONE_NODE.lock().await;
    let n = RealNode::start(false).await;
    let (ns, leader, janitor) = operator(&n, "node-notready").await;
    // The node goes silent: NotReady after the 10 s grace period. Its pods
    // may still run: the lock must stay.
    n.node.stop_kubelet();
    let t0 = Instant::now();
    loop {
        let node = n.kubectl(
            &[
                "get",
                "node",
                lock_janitor_testenv::node::NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
            None,
        );
        if node.trim() == "Unknown" || node.trim() == "False" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(90), "node still Ready");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    // The janitor frees nothing on NotReady alone (the pods may run on).
    // operator-lib itself does: its waiting replica deletes a leader whose
    // node is NotReady and then the lock (seen here; see docs/real-node.md),
    // so the holder may have changed.
    let janitor_deletes = |n: &RealNode| {
        n.writes(JANITOR_USER, &ns)
            .into_iter()
            .filter(|e| e.verb == "delete")
            .collect::<Vec<_>>()
    };
    assert!(
        janitor_deletes(&n).is_empty(),
        "the janitor deleted during NotReady:\n{}",
        janitor.logs()
    );
    // operator-lib's replica deletes the leader and its lock, then makes the
    // lock again on its next try (a backoff of at most 16 s, 20 % jitter),
    // or exits when that lock delete found nothing: a lock held by the
    // first leader or by the replica, or none, is given time to settle.
    wait_some_lock(&n, &ns, Duration::from_secs(30)).await;
    // The node is really down (its containers stop): from here on nobody
    // changes the holder, so the lock read now is the one to free.
    n.node.stop_all_pods().unwrap();
    let held = n.owner(&ns).await;
    assert!(
        janitor_deletes(&n).is_empty(),
        "the janitor deleted while the node was NotReady:\n{}",
        janitor.logs()
    );
    let operator_sa = format!("system:serviceaccount:{ns}:memcached-operator");
    let by_operator = |what: &str| {
        n.writes(&operator_sa, &ns)
            .into_iter()
            .filter(|e| e.verb == "delete" && e.resource.as_deref() == Some(what))
            .filter_map(|e| e.name)
            .collect::<Vec<_>>()
    };
    eprintln!(
        "after 20 s NotReady: lock held by {held:?} (first leader {leader}); operator-lib deleted pods {:?}, locks {:?}",
        by_operator("pods"),
        by_operator("configmaps")
    );
    if held.is_none() {
        // Nobody holds it: operator-lib deleted it, never the janitor.
        assert!(
            by_operator("configmaps").iter().any(|name| name == LOCK),
            "no lock, and operator-lib did not delete it"
        );
    }
    // The admin says the node is down with the out-of-service taint: its
    // pods are force-deleted, the lock freed.
    n.kubectl(
        &[
            "taint",
            "node",
            lock_janitor_testenv::node::NODE_NAME,
            "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
        ],
        None,
    );
    if let Some(held) = &held {
        let t1 = Instant::now();
        while n.owner(&ns).await.as_ref() == Some(held) {
            assert!(
                t1.elapsed() < Duration::from_secs(120),
                "lock still held by {held} after the out-of-service taint\n{}",
                janitor.logs()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!(
            "lock of {held} freed {:.1}s after the out-of-service taint",
            t1.elapsed().as_secs_f64()
        );
        let audit = n.audit();
        assert!(
            audit.iter().any(|e| e.verb == "delete"
                && e.namespace.as_deref() == Some(ns.as_str())
                && e.name.as_deref() == Some(held.as_str())
                && e.user == CONTROLLER_MANAGER_USER),
            "the holder pod {held} was not force-deleted by the controller manager"
        );
    }
    let leader = held.unwrap_or(leader);
    // Back up: the taint lifted, the kubelet started, a new leader.
    n.kubectl(
        &[
            "taint",
            "node",
            lock_janitor_testenv::node::NODE_NAME,
            "node.kubernetes.io/out-of-service-",
        ],
        None,
    );
    n.node.start_kubelet().await.unwrap();
    let next = n
        .wait_leader(&ns, Some(&leader), Duration::from_secs(180))
        .await;
    assert_ne!(next, leader);
}

#[tokio::test]
async fn chart_janitor_pods_fail_over_when_the_leaders_container_is_killed() {
    require_node();
    let _one = ONE_NODE.lock().await;
    let n = RealNode::start(true).await;
    let sys = n.namespace("lock-janitor-system").await;
    let watched = n.namespace("node-watched").await;
    n.install_chart("lock-janitor", &sys, &[&watched]);
    n.wait_rollout(&sys);
    let kill_container = |n: &RealNode, pod: &str| {
        let out = n
            .node
            .crictl(&[
                "ps",
                "-q",
                "--label",
                &format!("io.kubernetes.pod.name={pod}"),
            ])
            .unwrap();
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(!id.is_empty(), "no container for {pod}");
        let inspect = n
            .node
            .crictl(&[
                "inspect",
                "-o",
                "go-template",
                "--template",
                "{{.info.pid}}",
                &id,
            ])
            .unwrap();
        let pid = String::from_utf8_lossy(&inspect.stdout).trim().to_string();
        let st = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .unwrap();
        assert!(st.success(), "kill -KILL {pid}");
    };
    let (first, _) = wait_holder(&n, &sys, None).await;
    let first_pod = holder_pod(&n, &sys, first.clone())
        .await
        .unwrap_or_else(|| panic!("holder {first} is none of the pods"));

    // 1. The leader's container is SIGKILLed (no release). The kubelet
    //    restarts it in the same pod, whose identity is the same ($POD_NAME):
    //    one holder throughout, leading again (or the other pod).
    kill_container(&n, &first_pod);
    let t1 = Instant::now();
    loop {
        let p = Api::<Pod>::namespaced(n.client.clone(), &sys)
            .get(&first_pod)
            .await
            .unwrap();
        let restarts = p
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.first().map(|c| c.restart_count))
            .unwrap_or(0);
        if restarts >= 1 {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(60),
            "the killed container did not restart"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (after, _) = wait_holder(&n, &sys, None).await;
    eprintln!(
        "container of {first_pod} killed: restarted after {:.1}s; Lease holder {after}",
        t1.elapsed().as_secs_f64()
    );

    // 2. The leading pod goes for good without releasing: its container
    //    SIGKILLed and the pod force-deleted. The other pod takes the Lease
    //    once it expires (leaseDuration 15 s).
    let gone = holder_pod(&n, &sys, after.clone())
        .await
        .expect("holder pod");
    n.kubectl(
        &[
            "delete",
            "pod",
            "-n",
            &sys,
            &gone,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ],
        None,
    );
    kill_container(&n, &gone);
    let (second, took) = wait_holder(&n, &sys, Some(after.clone())).await;
    assert_ne!(second, gone);
    eprintln!(
        "janitor Lease: {gone} (killed, force-deleted) -> {second} in {:.1}s",
        took.as_secs_f64()
    );
    // The Lease writes came from the chart's ServiceAccount: in-cluster
    // config through the `kubernetes` Service and the projected token, in
    // real pods.
    let sa = format!("system:serviceaccount:{sys}:lock-janitor");
    assert!(n
        .writes(&sa, &sys)
        .iter()
        .any(|e| e.resource.as_deref() == Some("leases") && e.code == Some(200)));
}

/// The lock's owner once there is one, or None after `timeout`.
async fn wait_some_lock(n: &RealNode, ns: &str, timeout: Duration) -> Option<String> {
    let t0 = Instant::now();
    loop {
        if let Some(o) = n.owner(ns).await {
            return Some(o);
        }
        if t0.elapsed() > timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn holder_pod(n: &RealNode, sys: &str, holder: String) -> Option<String> {
    n.pods(sys, "app.kubernetes.io/name=lock-janitor")
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .find(|p| holder == *p)
}

/// Waits for a janitor Lease holder other than `not`; returns it and the wait.
async fn wait_holder(n: &RealNode, sys: &str, not: Option<String>) -> (String, Duration) {
    let t = Instant::now();
    loop {
        match n.janitor_leader(sys, "lock-janitor").await {
            Some(h) if Some(&h) != not.as_ref() => return (h, t.elapsed()),
            _ => {}
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no janitor Lease holder other than {not:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One look at the chart's election Lease: when, who held it, and until when.
#[derive(Clone, Debug)]
struct LeaseLook {
    at: k8s_openapi::jiff::Timestamp,
    holder: String,
    /// renewTime + leaseDurationSeconds: the holder leads until then.
    until: Option<k8s_openapi::jiff::Timestamp>,
}

impl LeaseLook {
    fn led(&self) -> bool {
        !self.holder.is_empty() && self.until.is_some_and(|u| u >= self.at)
    }
}

/// Looks at the chart's election Lease every 100 ms until `stop`.
fn watch_lease(
    client: kube::Client,
    ns: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<LeaseLook>> {
    tokio::spawn(async move {
        use k8s_openapi::api::coordination::v1::Lease;
        let api: Api<Lease> = Api::namespaced(client, &ns);
        let mut looks = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(Some(l)) = api.get_opt("lock-janitor").await {
                let spec = l.spec.unwrap_or_default();
                let until = spec.renew_time.map(|r| r.0).and_then(|r| {
                    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0));
                    r.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                        .ok()
                });
                looks.push(LeaseLook {
                    at: k8s_openapi::jiff::Timestamp::now(),
                    holder: spec.holder_identity.unwrap_or_default(),
                    until,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        looks
    })
}

/// The longest time without a leader in `looks` (from the first look
/// without one to the next look with one), and the holders seen in turn.
fn longest_gap(looks: &[LeaseLook]) -> (Duration, Vec<String>) {
    let mut longest = Duration::ZERO;
    let mut since: Option<k8s_openapi::jiff::Timestamp> = None;
    let mut holders: Vec<String> = Vec::new();
    for l in looks {
        if l.led() {
            if let Some(s) = since.take() {
                let gap = Duration::try_from(l.at.duration_since(s)).unwrap_or_default();
                longest = longest.max(gap);
            }
            if holders.last() != Some(&l.holder) {
                holders.push(l.holder.clone());
            }
        } else if since.is_none() {
            since = Some(l.at);
        }
    }
    if let (Some(s), Some(last)) = (since, looks.last()) {
        longest = longest.max(Duration::try_from(last.at.duration_since(s)).unwrap_or_default());
    }
    (longest, holders)
}

/// The chart's pods as deployed, through a rolling `helm upgrade` (a new
/// image tag and a value change) while locks are held, a takeover is
/// awaited and a burst of holders dies, and then a node drain under the
/// chart's PodDisruptionBudget: no reclaim missed, none done twice, the
/// awaited takeover still followed, and never longer without a leader than
/// the election's lease duration (15 s) plus 2 s. The locks' holders are
/// pods on a second, simulated node whose status the test writes (the
/// real kubelet runs the janitor's pods).
// Two workers: kubectl (rollout status, drain) blocks the thread it runs
// on, and the Lease must be looked at all the while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_and_a_drain_keep_a_leader_and_miss_no_reclaim() {
    use lock_janitor_testenv::kubelet;
    use support::{create_lock, lock_for, running_pod, wait_for};
    const BURST: usize = 20;
    const LEASE_DURATION: Duration = Duration::from_secs(15);
    require_node();
    let _one = ONE_NODE.lock().await;
    let n = RealNode::start(true).await;
    let sys = n.namespace("lock-janitor-system").await;
    let watched = n.namespace("node-upgrade").await;
    let sim = format!("sim-{watched}");
    kubelet::create_node(&n.client, &sim).await.unwrap();
    // Cordoned: the scheduler places the chart's pods on the real node only
    // (the test binds its holder pods to this one by name).
    n.kubectl(&["cordon", &sim], None);
    let beat = {
        let (client, sim) = (n.client.clone(), sim.clone());
        tokio::spawn(async move {
            loop {
                let _ = kubelet::heartbeat(&client, &sim).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        })
    };
    n.install_chart("lock-janitor", &sys, &[&watched]);
    n.wait_rollout(&sys);
    let sa = format!("system:serviceaccount:{sys}:lock-janitor");
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(n.client.clone(), &watched);

    // Held locks, and one takeover awaited: its lock reclaimed before the
    // upgrade, its heir to come after it.
    let names: Vec<String> = (0..BURST).map(|i| format!("op-{i}")).collect();
    for name in &names {
        let pod = running_pod(&n.client, &watched, &format!("{name}-a"), &sim).await;
        create_lock(&n.client, &lock_for(name, &pod, true)).await;
    }
    let old = running_pod(&n.client, &watched, "awaited-a", &sim).await;
    create_lock(&n.client, &lock_for("awaited", &old, true)).await;
    kubelet::set_failed(&n.client, &watched, "awaited-a", "Evicted", "test")
        .await
        .unwrap();
    wait_for(
        "the awaited lock reclaimed",
        Duration::from_secs(60),
        || async { cms.get_opt("awaited").await.ok()?.is_none().then_some(()) },
    )
    .await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looks = watch_lease(n.client.clone(), sys.clone(), stop.clone());
    // The upgrade: a new image tag (the same image under another name) and
    // a value change, and while it rolls every holder dies at once.
    n.node
        .ctr(&[
            "images",
            "tag",
            &format!(
                "{}:{}",
                lock_janitor_testenv::node::JANITOR_IMAGE_REPO,
                lock_janitor_testenv::node::JANITOR_IMAGE_TAG
            ),
            &format!(
                "{}:upgraded",
                lock_janitor_testenv::node::JANITOR_IMAGE_REPO
            ),
        ])
        .unwrap();
    let t_upgrade = Instant::now();
    n.upgrade_chart(
        "lock-janitor",
        &sys,
        &[&watched],
        &["image.tag=upgraded", "resync=6s"],
    );
    for name in &names {
        kubelet::set_failed(&n.client, &watched, &format!("{name}-a"), "Evicted", "test")
            .await
            .unwrap();
    }
    n.wait_rollout(&sys);
    let rolled = t_upgrade.elapsed();
    let pods = n.pods(&sys, "app.kubernetes.io/name=lock-janitor").await;
    let running: Vec<_> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert!(
        running
            .iter()
            .all(|p| p.spec.as_ref().is_some_and(|s| s.containers[0]
                .image
                .as_deref()
                .is_some_and(|i| i.ends_with(":upgraded")))),
        "the Deployment rolled to the new tag: {:#?}",
        running.iter().map(|p| &p.metadata.name).collect::<Vec<_>>()
    );
    // The heir of the awaited lock makes it again, unlabeled: the new
    // pods, restored from the old leader's Events, label it and say so.
    let heir = running_pod(&n.client, &watched, "awaited-b", &sim).await;
    create_lock(&n.client, &lock_for("awaited", &heir, false)).await;
    wait_for(
        "every dead holder's lock deleted",
        Duration::from_secs(120),
        || async {
            let left = cms.list(&Default::default()).await.ok()?;
            (!left
                .items
                .iter()
                .any(|c| names.contains(c.metadata.name.as_ref().unwrap())))
            .then_some(())
        },
    )
    .await;
    let taken = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let labeled = cms.get("awaited").await.ok().is_some_and(|cm| {
                cm.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("lock-janitor.io/watch"))
                    .is_some_and(|v| v == "true")
            });
            let said = n
                .event(&watched, "awaited", "LockTakenOver")
                .await
                .is_some();
            if labeled && said {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    if taken.is_err() {
        let logs = n.kubectl_output(
            &[
                "logs",
                "-n",
                &sys,
                "-l",
                "app.kubernetes.io/name=lock-janitor",
                "--prefix",
                "--tail=-1",
            ],
            None,
        );
        panic!(
            "the heir's lock was not labeled with its takeover said within 120 s; lock {:?}; Lease {:?}; the janitor pods said:\n{}",
            cms.get_opt("awaited").await.ok().flatten().map(|c| c.metadata),
            n.janitor_leader(&sys, "lock-janitor").await,
            String::from_utf8_lossy(&logs.stdout)
        );
    }
    let t_drain = Instant::now();

    // A drain of the node under the chart's PodDisruptionBudget
    // (maxUnavailable 1): one janitor pod is evicted, its replacement
    // cannot run on the cordoned node, and the second eviction is refused
    // until the drain gives up.
    let drain = n.kubectl_output(
        &[
            "drain",
            lock_janitor_testenv::node::NODE_NAME,
            "--pod-selector=app.kubernetes.io/name=lock-janitor",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=40s",
        ],
        None,
    );
    let drained = t_drain.elapsed();
    // A running replica leads after the drain: the one the budget kept, or
    // its replacement (a drain lists its pods once: a replacement that the
    // scheduler bound before it saw the cordon runs on, and once it is
    // ready the budget lets the other go).
    let running = || async {
        n.pods(&sys, "app.kubernetes.io/name=lock-janitor")
            .await
            .into_iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.metadata.deletion_timestamp.is_none()
            })
            .filter_map(|p| p.metadata.name)
            .collect::<Vec<_>>()
    };
    let led = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let leader = n.janitor_leader(&sys, "lock-janitor").await;
            if leader.as_ref().is_some_and(|l| !l.is_empty()) {
                let still = running().await;
                if leader.as_ref().is_some_and(|l| still.contains(l)) {
                    return leader;
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    let still = running().await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let looks = looks.await.unwrap();
    n.kubectl(&["uncordon", lock_janitor_testenv::node::NODE_NAME], None);
    beat.abort();

    // None missed, none done twice: one successful DELETE of each lock,
    // by the chart's janitor.
    let audit = n.audit();
    for name in names.iter().chain(std::iter::once(&"awaited".to_owned())) {
        let deletes: Vec<_> = audit
            .iter()
            .filter(|e| e.verb == "delete" && e.namespace.as_deref() == Some(watched.as_str()))
            .filter(|e| {
                e.resource.as_deref() == Some("configmaps")
                    && e.name.as_deref() == Some(name.as_str())
            })
            .filter(|e| e.code == Some(200))
            .collect();
        assert_eq!(deletes.len(), 1, "{name}: {deletes:#?}");
        assert_eq!(deletes[0].effective_user(), sa, "{name}: {:?}", deletes[0]);
    }
    let evictions: Vec<_> = audit
        .iter()
        .filter(|e| {
            e.subresource.as_deref() == Some("eviction")
                && e.namespace.as_deref() == Some(sys.as_str())
        })
        .collect();
    let evicted = evictions.iter().filter(|e| e.code == Some(201)).count();
    let refused = evictions.iter().filter(|e| e.code == Some(429)).count();
    if drain.status.success() {
        // The drain finished: a replacement became ready, and the budget
        // then let the other go. Said with the Events, for the record.
        let said = n.kubectl_output(
            &["get", "events", "-n", &sys, "--sort-by=.lastTimestamp"],
            None,
        );
        eprintln!(
            "the drain finished: {}\nEvents:\n{}",
            String::from_utf8_lossy(&drain.stdout),
            String::from_utf8_lossy(&said.stdout)
        );
    }
    assert!(
        evicted >= 1 && refused >= 1,
        "the PodDisruptionBudget let one janitor pod go and refused the next while one was ready: {evicted} evicted, {refused} refused: {evictions:#?}\n{}",
        String::from_utf8_lossy(&drain.stderr)
    );
    let leader_after_drain = led.ok().flatten();
    assert!(
        leader_after_drain.is_some(),
        "a running replica leads after the drain: running {still:?}, Lease holder {:?}",
        n.janitor_leader(&sys, "lock-janitor").await
    );
    let (gap, holders) = longest_gap(&looks);
    eprintln!(
        "rolling upgrade rolled in {:.1}s, drain ended after {:.1}s; janitor Lease holders in turn {holders:?}; longest time without a leader {:.1}s ({} looks at the Lease); evictions {evicted} done, {refused} refused",
        rolled.as_secs_f64(),
        drained.as_secs_f64(),
        gap.as_secs_f64(),
        looks.len()
    );
    assert!(
        holders.len() >= 2,
        "the lead moved during the upgrade: {holders:?}"
    );
    assert!(
        gap <= LEASE_DURATION + Duration::from_secs(2),
        "{:.1}s without a leader (goal: the lease duration, 15 s, plus 2 s); holders {holders:?}",
        gap.as_secs_f64()
    );
}
