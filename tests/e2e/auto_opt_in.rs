//! `run --auto-opt-in` on the real control plane, as the chart's RBAC
//! grants it (`grant_janitor`): a real operator-lib operator deployed after
//! the janitor started is protected with no human step, a real client-go
//! elector's Lease is labeled, and what must never be labeled is not (an
//! opt-out, a ConfigMap with data or two owners, a lock in an excluded
//! namespace, the janitor's own election Lease); a standby never writes.
//! Every janitor here is scoped to the test's namespaces (`--namespace`).

use std::time::{Duration, Instant};

use crate::support::*;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::peers::Peer;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};

const LOCK: &str = "memcached-operator-lock";
/// The promise: a new candidate is labeled within this of its creation.
const WITHIN: Duration = Duration::from_secs(10);

fn label_of(meta: &ObjectMeta) -> Option<String> {
    meta.labels.as_ref()?.get(WATCH_LABEL.0).cloned()
}

async fn cm_label(client: &Client, ns: &str, name: &str) -> Option<String> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get configmap {ns}/{name}: {e}"));
    label_of(&cm.metadata)
}

async fn lease_label(client: &Client, ns: &str, name: &str) -> Option<String> {
    let l = Api::<Lease>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get lease {ns}/{name}: {e}"));
    label_of(&l.metadata)
}

/// Waits until `read` says `true` (the opt-in label).
async fn wait_opted_in<F, Fut>(what: &str, timeout: Duration, read: F) -> Instant
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    wait_for(what, timeout, || async {
        (read().await.as_deref() == Some(WATCH_LABEL.1)).then(Instant::now)
    })
    .await
}

/// The janitor's writes (create, update, patch, delete) in `ns`, from the
/// audit log: every resource but Events.
fn writes_in(
    cp: &ControlPlane,
    user: &str,
    ns: &str,
) -> Vec<lock_janitor_testenv::audit::AuditEvent> {
    lock_janitor_testenv::audit::read(cp.audit_log_path())
        .into_iter()
        .filter(|e| {
            e.effective_user() == user
                && e.namespace.as_deref() == Some(ns)
                && matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete")
                && e.resource.as_deref() != Some("events")
        })
        .collect()
}

/// A real operator-lib operator installed after the janitor started: its
/// leader's lock is labeled within 10 s with no human step (a `LockOptedIn`
/// Event says so, `lock_janitor_opt_ins_total` counts it); then its leader
/// is evicted and the waiting replica takes over.
#[tokio::test]
async fn a_real_operator_lib_lock_is_protected_with_no_human_step() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "auto-opt-in-op").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    // The chart's defaults, watching this namespace: its Role, its
    // ServiceAccount, its Deployment's flags (--auto-opt-in among them).
    let rel = fresh_namespace(&client, "auto-opt-in-rel").await;
    let docs = crate::support::chart::render(
        &rel,
        &rel,
        &[
            "--set".into(),
            format!("watchNamespaces={{{ns}}}"),
            "--set".into(),
            "replicas=1".into(),
        ],
    );
    crate::support::chart::apply_rbac(&client, &docs).await;
    let deployment = docs
        .iter()
        .find(|d| crate::support::chart::kind_of(d) == "Deployment")
        .expect("the Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let sa = pod["serviceAccountName"]
        .as_str()
        .expect("its ServiceAccount");
    let args: Vec<String> = pod["containers"][0]["args"]
        .as_array()
        .expect("its args")
        .iter()
        .filter_map(|a| a.as_str())
        .filter(|a| !a.starts_with("--metrics-bind-address"))
        .map(str::to_owned)
        .collect();
    assert!(
        args.iter().any(|a| a == "--auto-opt-in"),
        "the chart's default: {args:?}"
    );
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let kc = crate::support::chart::sa_kubeconfig(cp, &rel, sa);
    let janitor = Janitor::start(&kc, &refs).await;
    let janitor_user = format!("system:serviceaccount:{rel}:{sa}");

    running_pod(&client, &ns, "operator-a", &node).await;
    let mut a = Peer::become_leader(cp.kubeconfig_path(), cp.dir(), &ns, "operator-a", LOCK)
        .expect("operator-lib peer a");
    a.wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let created = cms
        .get(LOCK)
        .await
        .expect("the lock")
        .metadata
        .creation_timestamp
        .expect("created")
        .0;
    wait_opted_in("the opt-in label on operator-a's lock", WITHIN, || {
        cm_label(&client, &ns, LOCK)
    })
    .await;
    let labeled_after = Timestamp::now().duration_since(created);
    eprintln!(
        "labeled {:.2}s after its creation",
        labeled_after.as_secs_f64()
    );
    assert!(
        labeled_after < SignedDuration::try_from(WITHIN).unwrap(),
        "labeled {labeled_after} after the lock's creation\n{}",
        janitor.logs()
    );
    wait_event(&client, &ns, "LockOptedIn", LOCK).await;
    let m = janitor.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_opt_ins_total", &[("kind", "configmap")]),
        Some(1.0),
        "{m}"
    );
    // One write: the label patch of the lock (its body, the label and the
    // resourceVersion read, is optin.rs's unit test).
    let writes = writes_in(cp, &janitor_user, &ns);
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(
        (
            writes[0].verb.as_str(),
            writes[0].name.as_deref(),
            writes[0].code
        ),
        ("patch", Some(LOCK), Some(200)),
        "{writes:#?}"
    );

    // Protected: the leader evicted, the waiting replica leads.
    running_pod(&client, &ns, "operator-b", &node).await;
    let mut b = Peer::become_leader(cp.kubeconfig_path(), cp.dir(), &ns, "operator-b", LOCK)
        .expect("operator-lib peer b");
    wait_for("operator-b waiting", Duration::from_secs(30), || async {
        b.logs().contains("Not the leader. Waiting.").then_some(())
    })
    .await;
    a.kill();
    kubelet::set_failed(
        &client,
        &ns,
        "operator-a",
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .expect("evict");
    b.wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\njanitor:\n{}", janitor.logs()));
    wait_opted_in(
        "the opt-in label on operator-b's lock",
        Duration::from_secs(30),
        || cm_label(&client, &ns, LOCK),
    )
    .await;
}

/// A pod-owned lock-shaped ConfigMap, with data or labels as asked.
fn cm(ns: &str, name: &str, owners: &[&Pod], data: bool, label: Option<&str>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            owner_references: Some(owners.iter().map(|p| pod_owner(p)).collect()),
            labels: label.map(|v| [(WATCH_LABEL.0.to_string(), v.to_string())].into()),
            ..Default::default()
        },
        data: data.then(|| [("spark.conf".to_string(), "x".to_string())].into()),
        ..Default::default()
    }
}

/// Two janitors with --auto-opt-in and --leader-elect on the same
/// namespaces. Existing candidates are labeled at start, new ones as they
/// come (a real client-go elector's Lease, a Lease held for life); never an
/// opt-out, a ConfigMap with data or two owners, a lock in an excluded
/// namespace (a glob of the test's own, not kube-system, which other suites
/// share) or the janitor's own election Lease, even when its holder names a
/// running pod. The standby counts the candidates too and writes nothing.
#[tokio::test]
async fn only_candidates_are_labeled_and_only_by_the_leader() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "auto-opt-in").await;
    let excluded = fresh_namespace(&client, "auto-opt-in-excluded").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    let users = ["auto-opt-in-a", "auto-opt-in-b"];
    for u in users {
        bind_cluster_role(&client, u, JANITOR_USER).await;
        let rules = vec![rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "create", "update"],
        )];
        grant_in(&client, &ns, &format!("{u}-election"), user(u), rules).await;
    }

    // Before the janitors start.
    let op = running_pod(&client, &ns, "op-0", &node).await;
    let other = running_pod(&client, &ns, "op-1", &node).await;
    let far = running_pod(&client, &excluded, "op-0", &node).await;
    for c in [
        cm(&ns, "existing-lock", &[&op], false, None),
        cm(&ns, "opted-out-lock", &[&op], false, Some("false")),
        cm(&ns, "spark-conf", &[&op], true, None),
        cm(&ns, "two-owners", &[&op, &other], false, None),
        cm(&excluded, "excluded-lock", &[&far], false, None),
    ] {
        create_lock(&client, &c).await;
    }
    // The janitors run as pods jan-a and jan-b of this namespace: their
    // election Lease names a running pod, a candidate by its shape, never
    // labeled.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let jan_pods = ["jan-a", "jan-b"];
    for p in jan_pods {
        running_pod(&client, &ns, p, &node).await;
    }

    let namespaces = format!("{ns},{excluded}");
    let args = [
        "--namespace",
        namespaces.as_str(),
        "--auto-opt-in",
        "--exclude-namespaces",
        excluded.as_str(),
        "--leader-elect",
        "--leader-elect-namespace",
        ns.as_str(),
        "--leader-elect-lease-duration",
        "3s",
        "--resync",
        "5s",
    ];
    let a = Janitor::start_as_pod(&kubeconfig_as(cp, users[0]), &args, jan_pods[0]).await;
    let b = Janitor::start_as_pod(&kubeconfig_as(cp, users[1]), &args, jan_pods[1]).await;

    wait_opted_in(
        "the existing lock labeled at start",
        Duration::from_secs(30),
        || cm_label(&client, &ns, "existing-lock"),
    )
    .await;
    let leads = |m: &str| sample(m, "lock_janitor_leader", &[]) == Some(1.0);
    let (leader, standby, leader_user, standby_user) = if leads(&a.metrics().await) {
        (&a, &b, users[0], users[1])
    } else {
        (&b, &a, users[1], users[0])
    };
    assert!(leads(&leader.metrics().await), "one of them leads");

    // New candidates, after the start: a real client-go elector's Lease, a
    // Lease held for life, a ConfigMap lock; and in the excluded namespace.
    running_pod(&client, &ns, "elector-0", &node).await;
    let mut elector = Peer::elect(
        cp.kubeconfig_path(),
        cp.dir(),
        &ns,
        "elector-0",
        "elector-lease",
        Duration::from_secs(15),
    )
    .expect("client-go elector");
    elector
        .wait_leading(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let elected = Instant::now();
    let held = running_pod(&client, &ns, "nais-0", &node).await;
    let for_life = Lease {
        metadata: ObjectMeta {
            name: Some("nais-lease".into()),
            namespace: Some(ns.clone()),
            owner_references: Some(vec![pod_owner(&held)]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("nais-0".into()),
            ..Default::default()
        }),
    };
    leases
        .create(&PostParams::default(), &for_life)
        .await
        .expect("lease held for life");
    create_lock(&client, &cm(&ns, "new-lock", &[&op], false, None)).await;
    create_lock(
        &client,
        &cm(&excluded, "new-excluded-lock", &[&far], false, None),
    )
    .await;

    let labeled = wait_opted_in("the elector's Lease labeled", WITHIN, || {
        lease_label(&client, &ns, "elector-lease")
    })
    .await;
    eprintln!(
        "the elector's Lease labeled {:.2}s after it led",
        (labeled - elected).as_secs_f64()
    );
    wait_opted_in("the Lease held for life labeled", WITHIN, || {
        lease_label(&client, &ns, "nais-lease")
    })
    .await;
    wait_opted_in("the new lock labeled", WITHIN, || {
        cm_label(&client, &ns, "new-lock")
    })
    .await;
    for j in [leader, standby] {
        wait_for(
            "no unprotected candidate left",
            Duration::from_secs(30),
            || async {
                let m = j.metrics().await;
                let zero =
                    |k| sample(&m, "lock_janitor_unprotected_locks", &[("kind", k)]) == Some(0.0);
                (zero("configmap") && zero("lease")).then_some(())
            },
        )
        .await;
    }
    let m = leader.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_opt_ins_total", &[("kind", "configmap")]),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, "lock_janitor_opt_ins_total", &[("kind", "lease")]),
        Some(2.0),
        "{m}"
    );

    // What must never be labeled, after the janitors had every chance (the
    // locks above, created later, are labeled already).
    assert_eq!(
        cm_label(&client, &ns, "opted-out-lock").await.as_deref(),
        Some("false")
    );
    assert_eq!(
        cm_label(&client, &ns, "spark-conf").await,
        None,
        "a ConfigMap with data"
    );
    assert_eq!(
        cm_label(&client, &ns, "two-owners").await,
        None,
        "two owners"
    );
    assert_eq!(
        cm_label(&client, &excluded, "excluded-lock").await,
        None,
        "excluded"
    );
    assert_eq!(
        cm_label(&client, &excluded, "new-excluded-lock").await,
        None,
        "excluded"
    );
    assert_eq!(
        lease_label(&client, &ns, "lock-janitor").await,
        None,
        "its own Lease"
    );

    // The standby wrote nothing; the leader wrote only the four labels
    // (and its own election Lease), nothing in the excluded namespace.
    let standby_writes: Vec<_> = writes_in(cp, standby_user, &ns)
        .into_iter()
        .filter(|e| e.name.as_deref() != Some("lock-janitor"))
        .collect();
    assert!(
        standby_writes.is_empty(),
        "the standby wrote: {standby_writes:#?}"
    );
    for u in users {
        let far_writes = writes_in(cp, u, &excluded);
        assert!(
            far_writes.is_empty(),
            "{u} wrote in the excluded namespace: {far_writes:#?}"
        );
    }
    // A 409 (the elector renewed its Lease between the janitor's read and
    // its guarded patch) is read again and patched again: each name is
    // patched once with success, and any other answer is a 409.
    let mut patched: Vec<String> = writes_in(cp, leader_user, &ns)
        .into_iter()
        .filter(|e| e.name.as_deref() != Some("lock-janitor"))
        .filter_map(|e| {
            assert_eq!(e.verb, "patch", "{e:?}");
            assert!(matches!(e.code, Some(200) | Some(409)), "{e:?}");
            (e.code == Some(200)).then(|| e.name.unwrap_or_default())
        })
        .collect();
    patched.sort();
    assert_eq!(
        patched,
        ["elector-lease", "existing-lock", "nais-lease", "new-lock"],
        "leader:\n{}",
        leader.logs()
    );
}

/// `label -A` leaves the excluded namespaces' unlabeled candidates out,
/// and takes them when named with -n.
#[tokio::test]
async fn label_all_namespaces_leaves_excluded_namespaces_out() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    let ns = fresh_namespace(&client, "label-excl").await;
    let excluded = fresh_namespace(&client, "label-excl-x").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    let here = running_pod(&client, &ns, "op-0", &node).await;
    let there = running_pod(&client, &excluded, "op-0", &node).await;
    create_lock(&client, &cm(&ns, "in-lock", &[&here], false, None)).await;
    create_lock(&client, &cm(&excluded, "out-lock", &[&there], false, None)).await;
    let kc = cp.kubeconfig_path();
    let names = |args: &[&str]| {
        let mut argv = vec![
            "label",
            "-o",
            "json",
            "--exclude-namespaces",
            excluded.as_str(),
        ];
        argv.extend(args);
        let kc = kc.to_path_buf();
        let argv: Vec<String> = argv.into_iter().map(str::to_owned).collect();
        async move {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            let out = crate::support::cli::run(&kc, &argv).await;
            if argv.contains(&"-A") {
                assert!(
                    out.stderr.contains("--exclude-namespaces") && out.stderr.contains("left out"),
                    "label -A says what it left out: {out}"
                );
            }
            let doc = out.json();
            doc["items"]
                .as_array()
                .unwrap_or_else(|| panic!("{doc}"))
                .iter()
                .map(|i| {
                    format!(
                        "{}/{}",
                        i["metadata"]["namespace"].as_str().unwrap_or_default(),
                        i["metadata"]["name"].as_str().unwrap_or_default()
                    )
                })
                .collect::<Vec<String>>()
        }
    };
    let all = names(&["-A"]).await;
    assert!(all.contains(&format!("{ns}/in-lock")), "{all:?}");
    assert!(!all.contains(&format!("{excluded}/out-lock")), "{all:?}");
    let named = names(&["-n", excluded.as_str()]).await;
    assert_eq!(named, [format!("{excluded}/out-lock")], "named with -n");
}

/// A renewed Lease whose opt-in label someone removed (the key gone, not
/// set to `false`) is labeled again from that change, not at the next
/// re-list: the lock watch (by the opt-in selector) sees it leave and auto
/// opt-in reads it again. The Lease's own watch event would not bring it
/// back: the label is removed within 30 s of the janitor's judgement of the
/// same holder, which the change-of-holder path does not repeat (as it
/// does not look at a Lease acquired long ago); `--resync 5m`: no re-list
/// within the test.
#[tokio::test]
async fn a_lease_whose_label_was_removed_is_labeled_again() {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, "auto-opt-in-relabel").await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    running_pod(&client, &ns, "op-0", &node).await;
    let kc = kubeconfig_as(cp, JANITOR_USER);
    let janitor = Janitor::start(
        &kc,
        &[
            "--namespace",
            ns.as_str(),
            "--auto-opt-in",
            "--resync",
            "5m",
        ],
    )
    .await;
    let now = MicroTime(Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("op-lease".into()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("op-0".into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..Default::default()
        }),
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("the Lease");
    wait_opted_in("the new Lease labeled", WITHIN, || {
        lease_label(&client, &ns, "op-lease")
    })
    .await;

    let unlabel = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: null}}});
    leases
        .patch("op-lease", &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .expect("the label removed");
    let removed = Instant::now();
    wait_opted_in("the Lease labeled again", WITHIN, || {
        lease_label(&client, &ns, "op-lease")
    })
    .await;
    eprintln!(
        "labeled again {:.2}s after the label was removed",
        removed.elapsed().as_secs_f64()
    );
    let m = janitor.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_opt_ins_total", &[("kind", "lease")]),
        Some(2.0),
        "{m}"
    );

    // Set to false by hand: an opt-out, left as it is. The same path
    // reads it again (a GET by the janitor after the change) and finds the
    // key with another value.
    let gets = || {
        lock_janitor_testenv::audit::read(cp.audit_log_path())
            .into_iter()
            .filter(|e| {
                e.effective_user() == JANITOR_USER
                    && e.namespace.as_deref() == Some(ns.as_str())
                    && e.name.as_deref() == Some("op-lease")
                    && e.verb == "get"
            })
            .count()
    };
    let read_before = gets();
    let opt_out = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: "false"}}});
    leases
        .patch("op-lease", &PatchParams::default(), &Patch::Merge(&opt_out))
        .await
        .expect("opted out");
    wait_for("the opt-out read again", WITHIN, || async {
        (gets() > read_before).then_some(())
    })
    .await;
    assert_eq!(
        lease_label(&client, &ns, "op-lease").await.as_deref(),
        Some("false"),
        "{}",
        janitor.logs()
    );
    let m = janitor.metrics().await;
    assert_eq!(
        sample(&m, "lock_janitor_opt_ins_total", &[("kind", "lease")]),
        Some(2.0),
        "{m}"
    );
}
