//! Protection that survives a restart: a watched namespace that refuses the
//! janitor (its RoleBinding deleted, or the namespace not there yet) does
//! not stop start-up. The janitor serves the other scopes, shows the
//! refused one with `lock_janitor_scope_ready 0`, checks it again with
//! backoff, and watches it once it is allowed. And the election Lease: a
//! replica that is not ready never creates it ahead of a ready one.
//!
//! The janitors run as the chart's ServiceAccount with the RBAC the chart
//! renders for `watchNamespaces` (a Role and RoleBinding in each), with the
//! Deployment's own args.

use std::time::{Duration, Instant};

use crate::support::chart::{apply_rbac, kind_of, name_of, render, sa_kubeconfig, sa_user};
use crate::support::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};
use serde_json::Value;

/// The chart rendered for `watch` with two replicas (leader election on),
/// a 4 s lease and short clocks; its selector is `lock-janitor.io/watch=<rel>`,
/// used by no other suite.
struct Install {
    cp: &'static ControlPlane,
    client: Client,
    rel: String,
    docs: Vec<Value>,
    sa: String,
    args: Vec<String>,
}

async fn install(prefix: &str, watch: &[&str], replicas: u32) -> Install {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    let rel = fresh_namespace(&client, &format!("{prefix}-rel")).await;
    let set = |s: String| ["--set".to_string(), s];
    let args: Vec<String> = [
        set(format!("selector=lock-janitor.io/watch={rel}")),
        set(format!("watchNamespaces={{{}}}", watch.join(","))),
        set(format!("replicas={replicas}")),
        set("leaderElection.leaseDuration=4s".into()),
        set("ownerGoneGrace=2s".into()),
        set("resync=3s".into()),
    ]
    .concat();
    let docs = render(&rel, &rel, &args);
    let deployment = docs
        .iter()
        .find(|d| kind_of(d) == "Deployment")
        .expect("a Deployment");
    let spec = &deployment["spec"]["template"]["spec"];
    let sa = spec["serviceAccountName"].as_str().expect("sa").to_owned();
    let args = spec["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .filter(|a| !a.starts_with("--metrics-bind-address"))
        .map(str::to_owned)
        .collect();
    Install {
        cp,
        client,
        rel,
        docs,
        sa,
        args,
    }
}

impl Install {
    /// The rendered Role and RoleBinding in `ns`.
    fn rbac_in(&self, ns: &str) -> Vec<Value> {
        self.docs
            .iter()
            .filter(|d| d["metadata"]["namespace"].as_str() == Some(ns))
            .filter(|d| matches!(kind_of(d), "Role" | "RoleBinding"))
            .cloned()
            .collect()
    }

    /// Every rendered object but those in `ns`.
    fn rbac_outside(&self, ns: &str) -> Vec<Value> {
        self.docs
            .iter()
            .filter(|d| d["metadata"]["namespace"].as_str() != Some(ns))
            .cloned()
            .collect()
    }

    fn spawn(&self) -> Janitor {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        Janitor::spawn(&sa_kubeconfig(self.cp, &self.rel, &self.sa), &args)
    }

    /// A running holder in `ns` and its opted-in lock.
    async fn locked(&self, ns: &str, node: &str, holder: &str, lock: &str) {
        let pod = running_pod(&self.client, ns, holder, node).await;
        let mut cm = lock_for(lock, &pod, false);
        cm.metadata.labels = Some(
            [("lock-janitor.io/watch".to_string(), self.rel.clone())]
                .into_iter()
                .collect(),
        );
        create_lock(&self.client, &cm).await;
    }

    /// Evicts `holder` and waits until the janitor has deleted `lock`
    /// (the audit log names the ServiceAccount); returns how long it took.
    async fn evict_and_wait(&self, ns: &str, holder: &str, lock: &str) -> Duration {
        kubelet::set_failed(
            &self.client,
            ns,
            holder,
            "Evicted",
            "The node was low on resource: memory.",
        )
        .await
        .expect("evict");
        let evicted = Instant::now();
        wait_for(
            &format!("lock {ns}/{lock} deleted"),
            Duration::from_secs(30),
            || async { (!lock_exists(&self.client, ns, lock).await).then_some(()) },
        )
        .await;
        let took = evicted.elapsed();
        let by_janitor = writes_by(self.cp, &sa_user(&self.rel, &self.sa), ns)
            .iter()
            .any(|e| e.verb == "delete" && e.name.as_deref() == Some(lock));
        assert!(by_janitor, "lock {ns}/{lock} deleted by someone else");
        took
    }
}

/// `lock_janitor_scope_ready{scope}` of a janitor, once it serves metrics
/// (None before, or after it exited).
async fn scope_ready(j: &Janitor, scope: &str) -> Option<f64> {
    let (code, body) = http_get(j.port, "/metrics").await.ok()?;
    (code == 200)
        .then(|| sample(&body, "lock_janitor_scope_ready", &[("scope", scope)]))
        .flatten()
}

/// Waits until `j` shows `ok` serving and `refused` refused.
async fn serving_around(j: &Janitor, ok: &str, refused: &str) {
    wait_for(
        &format!("scope {ok} ready and scope {refused} not"),
        Duration::from_secs(30),
        || async {
            (scope_ready(j, ok).await == Some(1.0) && scope_ready(j, refused).await == Some(0.0))
                .then_some(())
        },
    )
    .await
}

#[tokio::test]
async fn a_restart_with_one_scope_refused_still_reclaims_in_the_others() {
    let cp = shared().await;
    let admin = cp.client().await.expect("admin client");
    let a = fresh_namespace(&admin, "scopes-a").await;
    let b = fresh_namespace(&admin, "scopes-b").await;
    let i = install("scopes", &[&a, &b], 2).await;
    apply_rbac(&i.client, &i.docs).await;
    let node = format!("node-{a}");
    kubelet::create_node(&i.client, &node).await.expect("node");
    i.locked(&a, &node, "leader", "op-lock").await;

    // The pair runs, both ready; then b's RoleBinding goes.
    let first = [i.spawn(), i.spawn()];
    for j in &first {
        j.wait_ready().await;
    }
    let binding = i
        .rbac_in(&b)
        .into_iter()
        .find(|d| kind_of(d) == "RoleBinding")
        .expect("the chart's RoleBinding in b");
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(i.client.clone(), &b)
        .delete(name_of(&binding), &DeleteParams::default())
        .await
        .expect("delete b's RoleBinding");

    // A drain or a helm upgrade: both stop, two new ones start.
    for mut j in first {
        j.signal("TERM");
        let status = j.wait_exit(Duration::from_secs(30)).await;
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", j.logs());
    }
    let pair = [i.spawn(), i.spawn()];
    for j in &pair {
        serving_around(j, &a, &b).await;
    }

    let took = i.evict_and_wait(&a, "leader", "op-lock").await;
    println!(
        "one scope refused at start-up: the lock in the other deleted {:.1}s after its holder's eviction",
        took.as_secs_f64()
    );
    for j in &pair {
        assert_eq!(scope_ready(j, &b).await, Some(0.0), "b still refused");
        assert_eq!(
            j.readyz().await,
            Some(503),
            "not ready while a scope is refused"
        );
        let logs = j.logs();
        assert!(
            logs.lines().any(|l| l.contains("scope refused at start-up")
                && l.contains(&b)
                && l.contains("list configmaps")),
            "a WARN names the scope and what it may not do:\n{logs}"
        );
    }
}

#[tokio::test]
async fn a_namespace_created_later_is_watched_once_it_exists() {
    let cp = shared().await;
    let admin = cp.client().await.expect("admin client");
    let a = fresh_namespace(&admin, "scopes-now").await;
    // Not there yet: Argo CD may apply the janitor first.
    let later = format!("{a}-later");
    let i = install("scopes-later", &[&a, &later], 1).await;
    apply_rbac(&i.client, &i.rbac_outside(&later)).await;
    let node = format!("node-{a}");
    kubelet::create_node(&i.client, &node).await.expect("node");

    let j = i.spawn();
    serving_around(&j, &a, &later).await;
    i.locked(&a, &node, "leader", "op-lock").await;
    i.evict_and_wait(&a, "leader", "op-lock").await;

    // The namespace and its Role and RoleBinding arrive.
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(later.clone()),
            labels: Some(
                [(
                    "app.kubernetes.io/created-by".to_string(),
                    "lock-janitor-testenv".to_string(),
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(i.client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create the namespace");
    apply_rbac(&i.client, &i.rbac_in(&later)).await;
    let created = Instant::now();
    wait_for(
        "the new namespace watched",
        // The refused scope's checks back off from 5 s to 2 min (±20 %):
        // one more is due within 144 s whenever the namespace appears.
        Duration::from_secs(180),
        || async { (scope_ready(&j, &later).await == Some(1.0)).then_some(()) },
    )
    .await;
    println!(
        "a namespace created later: watched {:.1}s after it and its RoleBinding exist",
        created.elapsed().as_secs_f64()
    );
    j.wait_ready().await;
    i.locked(&later, &node, "leader", "op-lock").await;
    i.evict_and_wait(&later, "leader", "op-lock").await;
    assert!(
        j.logs().contains("scope allowed now: watching it"),
        "{}",
        j.logs()
    );
}

/// Only a refusal of every scope stops start-up: exit 1, naming each scope
/// and the API server's answer.
#[tokio::test]
async fn every_scope_refused_fails_start_up() {
    let cp = shared().await;
    let admin = cp.client().await.expect("admin client");
    let a = fresh_namespace(&admin, "scopes-none").await;
    let (x, y) = (format!("{a}-x"), format!("{a}-y"));
    let i = install("scopes-none", &[&x, &y], 1).await;
    apply_rbac(
        &i.client,
        &i.rbac_outside(&x)
            .into_iter()
            .filter(|d| d["metadata"]["namespace"].as_str() != Some(y.as_str()))
            .collect::<Vec<_>>(),
    )
    .await;
    let mut j = i.spawn();
    let status = j
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("still running:\n{}", j.logs()));
    assert_eq!(status.code(), Some(1), "{}", j.logs());
    let logs = j.logs();
    assert!(
        logs.contains("every scope refused the janitor's list or watch")
            && logs.contains(&format!("namespace {x}: list configmaps"))
            && logs.contains(&format!("namespace {y}: list configmaps"))
            && logs.contains("forbidden"),
        "{logs}"
    );
}

/// Two electors of one Lease, in-process: one whose scope never lists
/// (not ready), started first, and one ready. The not-ready one reads the
/// missing Lease first; the ready one still creates it, and leads.
#[tokio::test]
async fn a_replica_that_is_not_ready_leaves_the_election_lease_to_a_ready_one() {
    use lock_janitor::election::{start, Election};
    use lock_janitor::readiness::Readiness;
    use lock_janitor::shared::Shared;
    use std::sync::Arc;
    let cp = shared().await;
    let admin = cp.client().await.expect("admin client");
    let ns = fresh_namespace(&admin, "scopes-elect").await;
    let kc = kube::config::Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let election = |identity: &str| Election {
        lease: "lock-janitor".into(),
        namespace: ns.clone(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(15),
    };
    let stop = tokio_util::sync::CancellationToken::new();

    // Its only scope never lists.
    let listing = Arc::new(Readiness::default());
    listing.expect_in(&ns, 1);
    let slow = Shared::new().unwrap();
    let client = lock_janitor::client::control(config.clone(), &slow.metrics).unwrap();
    let (slow_gate, slow_task) = start(
        client,
        election("not-ready"),
        slow.metrics.clone(),
        listing,
        stop.clone(),
    );
    // It has read the Lease, and found none.
    wait_for(
        "the not-ready replica read the missing Lease",
        Duration::from_secs(10),
        || async {
            let text = slow.metrics.render().ok()?;
            (sample(
                &text,
                "lock_janitor_api_requests_total",
                &[("verb", "get"), ("code", "404")],
            )? >= 1.0)
                .then_some(())
        },
    )
    .await;

    let ready = Arc::new(Readiness::default());
    ready.expect_in(&ns, 1);
    ready.synced_in(&ns);
    let fine = Shared::new().unwrap();
    let client = lock_janitor::client::control(config, &fine.metrics).unwrap();
    let (ready_gate, ready_task) = start(
        client,
        election("ready"),
        fine.metrics.clone(),
        ready,
        stop.clone(),
    );
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    let lease = wait_for(
        "the ready replica holds the Lease",
        Duration::from_secs(10),
        || async {
            let l = leases.get_opt("lock-janitor").await.ok()??;
            let holder = l.spec.as_ref()?.holder_identity.clone()?;
            (holder == "ready" && ready_gate.may_write()).then_some(l)
        },
    )
    .await;
    assert!(!slow_gate.may_write(), "the not-ready replica never led");
    assert_eq!(
        lease.spec.and_then(|s| s.lease_transitions),
        Some(0),
        "created by the ready replica, never taken from another"
    );
    stop.cancel();
    let _ = tokio::join!(slow_task, ready_task);
}
