//! `lock-janitor scan` and `lock-janitor label`, as the real binary, against a
//! real control plane (etcd, kube-apiserver, kube-controller-manager). Each
//! test works in its own namespace and scopes the commands to it.
//!
//! The verdict test runs on a control plane of its own, without the
//! ownerReference garbage collector: with it, a lock whose holder pod does not
//! exist (and a ConfigMap owned by pods or a Deployment that do not exist) is
//! deleted within a second, before a scan could see it. Without it, the test
//! stands for a cluster where the collector lags, which is when `OwnerGone`
//! matters. The other tests share the usual control plane (collector on).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodTemplateSpec};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use lock_janitor_testenv::audit::{self, AuditEvent};
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane, Options};
use serde_json::Value;

use crate::support::cli::{command, run, run_with, Run};
use crate::support::*;

const WATCH: &str = "lock-janitor.io/watch";
/// The node every test's pods run on (created with the first of them).
const NODE: &str = "scan-node";

// ---------------------------------------------------------------------------
// Helpers

/// Creates a ConfigMap with these owners and labels (operator-lib's lock:
/// one Pod owner, no labels, a little data).
async fn configmap(
    client: &Client,
    ns: &str,
    name: &str,
    owners: Vec<OwnerReference>,
    labels: &[(&str, &str)],
) -> ConfigMap {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: (!owners.is_empty()).then_some(owners),
            labels: (!labels.is_empty()).then(|| {
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..Default::default()
        },
        // Empty, as operator-lib writes its locks (lock-shaped).
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("creating configmap {ns}/{name}: {e}"))
}

async fn evicted_pod(client: &Client, ns: &str, name: &str) -> Pod {
    running_pod(client, ns, name, NODE).await;
    kubelet::set_failed(
        client,
        ns,
        name,
        "Evicted",
        "The node was low on resource: memory.",
    )
    .await
    .unwrap_or_else(|e| panic!("pod {name} evicted: {e}"))
}

/// A Deployment object (nothing runs it: no deployment controller here).
async fn deployment(client: &Client, ns: &str, name: &str) -> Deployment {
    let labels = BTreeMap::from([("app".to_string(), name.to_string())]);
    let d = Deployment {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(0),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(k8s_openapi::api::core::v1::PodSpec {
                    containers: vec![k8s_openapi::api::core::v1::Container {
                        name: "main".into(),
                        image: Some(kubelet::PAUSE_IMAGE.into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &d)
        .await
        .unwrap_or_else(|e| panic!("creating deployment {name}: {e}"))
}

fn deployment_owner(d: &Deployment) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: d.metadata.name.clone().unwrap(),
        uid: d.metadata.uid.clone().unwrap(),
        controller: Some(true),
        ..Default::default()
    }
}

async fn labels_of(client: &Client, ns: &str, name: &str) -> BTreeMap<String, String> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("reading configmap {name}: {e}"))
        .metadata
        .labels
        .unwrap_or_default()
}

async fn delete_cm(client: &Client, ns: &str, name: &str) {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting configmap {name}: {e}"));
}

/// The items of a `-o json|yaml` LockList, by name (checking the list's
/// own apiVersion and kind, and each item's).
fn rows_by_name(report: &Value) -> BTreeMap<String, Value> {
    assert_eq!(
        report["apiVersion"], "lock-janitor.io/v1alpha1",
        "{report:#}"
    );
    assert_eq!(report["kind"], "LockList", "{report:#}");
    report["items"]
        .as_array()
        .expect("items is an array")
        .iter()
        .map(|r| {
            assert_eq!(r["apiVersion"], "lock-janitor.io/v1alpha1", "{r:#}");
            assert_eq!(r["kind"], "Lock", "{r:#}");
            let name = r["metadata"]["name"].as_str().expect("metadata.name");
            (name.to_owned(), r.clone())
        })
        .collect()
}

/// Audit-log position before a command runs.
fn audit_mark(cp: &ControlPlane) -> usize {
    audit::read(cp.audit_log_path()).len()
}

const WRITES: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// Writes on ConfigMaps of `ns` logged after `mark`, by anyone. A sentinel
/// write made now, once it shows up in the log, proves that the log has
/// caught up with everything the finished command did.
async fn configmap_writes_since(
    cp: &ControlPlane,
    client: &Client,
    ns: &str,
    mark: usize,
) -> Vec<AuditEvent> {
    let sentinel = format!("audit-sentinel-{}", audit_mark(cp));
    configmap(client, ns, &sentinel, vec![], &[]).await;
    let events = wait_for(
        "the audit log to show the sentinel write",
        Duration::from_secs(30),
        || async {
            let events = audit::read(cp.audit_log_path());
            events
                .iter()
                .any(|e| {
                    e.verb == "create"
                        && e.namespace.as_deref() == Some(ns)
                        && e.name.as_deref() == Some(sentinel.as_str())
                })
                .then_some(events)
        },
    )
    .await;
    events
        .into_iter()
        .skip(mark)
        .filter(|e| {
            WRITES.contains(&e.verb.as_str())
                && e.resource.as_deref() == Some("configmaps")
                && e.namespace.as_deref() == Some(ns)
                && e.name.as_deref() != Some(sentinel.as_str())
                && !e
                    .name
                    .as_deref()
                    .unwrap_or_default()
                    .starts_with("audit-sentinel-")
        })
        .collect()
}

/// `cell` is `full`, or `full` shortened with a `…` in the middle.
fn shortened(cell: &str, full: &str) -> bool {
    match cell.split_once('…') {
        None => cell == full,
        Some((head, tail)) => {
            full.starts_with(head)
                && full.ends_with(tail)
                && cell.chars().count() < full.chars().count()
        }
    }
}

/// The cells of the table row of the lock `name` (table rows end at the
/// first empty line).
fn table_row(stdout: &str, name: &str) -> Option<Vec<String>> {
    stdout
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|cells| cells.get(1).is_some_and(|c| shortened(c, name)))
}

/// Each (column, value) is in the row, possibly shortened.
fn assert_cells(row: &[String], want: &[(usize, &str)], run: &Run) {
    for (i, value) in want {
        let cell = row.get(*i).map(String::as_str).unwrap_or_default();
        assert!(
            shortened(cell, value),
            "column {i}: {cell:?} is not {value:?}\n{run}"
        );
    }
}

const LABEL_HEADERS: [&str; 4] = ["NAMESPACE", "NAME", "HOLDER", "RESULT"];

/// The `label` table has a row `NAMESPACE NAME HOLDER RESULT` for the lock.
fn assert_label_row(r: &Run, ns: &str, name: &str, holder: &str, result: &str) {
    let header: Vec<&str> = r
        .stdout
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, LABEL_HEADERS, "{r}");
    let row = table_row(&r.stdout, name).unwrap_or_else(|| panic!("no row for {name}\n{r}"));
    assert_eq!(row, [ns, name, holder, result], "{r}");
}

fn names(events: &[AuditEvent]) -> BTreeSet<String> {
    events.iter().filter_map(|e| e.name.clone()).collect()
}

/// Waits until `user` may list ConfigMaps in `ns` (RBAC changes take a moment).
async fn wait_until_can_list(cp: &ControlPlane, ns: &str, user: &str) {
    let mut config = cp.kube_config();
    config.auth_info.impersonate = Some(user.into());
    let as_user = Client::try_from(config).expect("impersonating client");
    let cms: Api<ConfigMap> = Api::namespaced(as_user, ns);
    wait_for(
        &format!("{user} to be allowed to list configmaps in {ns}"),
        Duration::from_secs(30),
        || async {
            cms.list_metadata(&ListParams::default())
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
}

// ---------------------------------------------------------------------------
// scan

#[tokio::test]
async fn scan_finds_candidates_and_judges_them_like_the_controller() {
    // Own control plane without the garbage collector: see the module docs.
    let cp = ControlPlane::start(Options {
        garbage_collector: false,
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let kc = cp.kubeconfig_path().to_path_buf();
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "scan-verdicts").await;

    let live = running_pod(&client, &ns, "live-op", NODE).await;
    let evicted = evicted_pod(&client, &ns, "evicted-op").await;
    let deploy = deployment(&client, &ns, "some-app").await;
    // Candidates: labeled or not, a live, an evicted and a never-existing holder.
    configmap(
        &client,
        &ns,
        "live-lock",
        vec![pod_owner(&live)],
        &[(WATCH, "true")],
    )
    .await;
    configmap(&client, &ns, "evicted-lock", vec![pod_owner(&evicted)], &[]).await;
    configmap(
        &client,
        &ns,
        "ghost-lock",
        vec![pod_owner(&Pod {
            metadata: ObjectMeta {
                name: Some("ghost-op".into()),
                uid: Some("0b5e8f3c-6d1a-4c57-9d0e-000000000001".into()),
                ..Default::default()
            },
            ..Default::default()
        })],
        &[],
    )
    .await;
    // Labeled but not a lock: reported as unmanageable, never silently dropped.
    configmap(&client, &ns, "labeled-plain", vec![], &[(WATCH, "true")]).await;
    // Ordinary ConfigMaps: never reported.
    configmap(&client, &ns, "plain", vec![], &[]).await;
    configmap(
        &client,
        &ns,
        "deployment-owned",
        vec![deployment_owner(&deploy)],
        &[],
    )
    .await;
    configmap(
        &client,
        &ns,
        "two-owners",
        vec![pod_owner(&live), pod_owner(&evicted)],
        &[],
    )
    .await;
    configmap(&client, &ns, "opted-out", vec![], &[(WATCH, "false")]).await;

    let scan = |extra: &'static [&'static str]| {
        let kc = kc.clone();
        let ns = ns.clone();
        async move {
            let mut args = vec!["scan", "--namespace", ns.as_str()];
            args.extend_from_slice(extra);
            run(&kc, &args).await
        }
    };

    // --owner-gone-grace 0s: the missing holder is stale at once.
    let mark = audit_mark(&cp);
    let r = scan(&["--owner-gone-grace", "0s", "-o", "json"]).await;
    assert_eq!(r.code, 3, "a stale lock exits 3\n{r}");
    let report = r.json();
    let rows = rows_by_name(&report);
    assert_eq!(
        rows.keys().map(String::as_str).collect::<Vec<_>>(),
        ["evicted-lock", "ghost-lock", "labeled-plain", "live-lock"],
        "exactly the candidates\n{r}"
    );
    let verdict = |name: &str| rows[name]["status"]["verdict"].as_str().unwrap().to_owned();
    assert_eq!(verdict("live-lock"), "held");
    assert_eq!(verdict("evicted-lock"), "stale:Evicted");
    assert_eq!(verdict("ghost-lock"), "stale:OwnerGone");
    assert_eq!(verdict("labeled-plain"), "unmanageable:NoOwner");
    assert_eq!(rows["live-lock"]["spec"]["labeled"], true);
    assert_eq!(rows["evicted-lock"]["spec"]["labeled"], false);
    assert_eq!(rows["ghost-lock"]["status"]["holderPod"]["found"], false);
    assert_eq!(rows["live-lock"]["status"]["holderPod"]["phase"], "Running");
    assert_eq!(
        rows["evicted-lock"]["status"]["holderPod"]["phase"],
        "Failed"
    );
    assert_eq!(
        rows["evicted-lock"]["status"]["holderPod"]["reason"],
        "Evicted"
    );
    assert_eq!(
        rows["evicted-lock"]["status"]["holderPod"]["node"],
        "scan-node"
    );
    let s = &report["summary"];
    assert_eq!(
        (&s["total"], &s["held"], &s["stale"], &s["unmanageable"]),
        (
            &Value::from(4),
            &Value::from(1),
            &Value::from(2),
            &Value::from(1)
        ),
        "{r}"
    );
    assert_eq!(
        (&s["labeled"], &s["unlabeled"]),
        (&Value::from(2), &Value::from(2))
    );
    let in_ns = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .list_metadata(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    assert_eq!(s["configMapsScanned"], in_ns, "{r}");

    // The default grace (30s): a lock younger than the grace whose holder is
    // missing is held, as the controller would hold it.
    let r = scan(&["-o", "json"]).await;
    assert_eq!(r.code, 3, "{r}");
    let rows = rows_by_name(&r.json());
    assert_eq!(rows["ghost-lock"]["status"]["verdict"], "held");
    assert_eq!(rows["ghost-lock"]["status"]["reason"], "OwnerGoneGrace");

    // The table says the same.
    let r = scan(&["--owner-gone-grace", "0s"]).await;
    assert_eq!(r.code, 3, "{r}");
    let header = r.stdout.lines().next().unwrap();
    for col in [
        "NAMESPACE",
        "NAME",
        "LABELED",
        "HOLDER",
        "PHASE",
        "NODE",
        "AGE",
        "VERDICT",
    ] {
        assert!(header.contains(col), "{col} missing\n{r}");
    }
    // Piped (not a terminal): nothing is cut, whatever the width.
    assert!(!r.stdout.contains('…'), "{r}");
    let row =
        |name: &str| table_row(&r.stdout, name).unwrap_or_else(|| panic!("no row for {name}\n{r}"));
    assert_cells(
        &row("evicted-lock"),
        &[
            (2, "no"),
            (3, "evicted-op"),
            (4, "Failed/Evicted"),
            (7, "stale:Evicted"),
        ],
        &r,
    );
    assert_cells(
        &row("live-lock"),
        &[
            (2, "yes"),
            (3, "live-op"),
            (4, "Running"),
            (5, "scan-node"),
            (7, "held"),
        ],
        &r,
    );
    assert_cells(
        &row("ghost-lock"),
        &[(3, "ghost-op"), (4, "(gone)"), (7, "stale:OwnerGone")],
        &r,
    );
    assert_cells(
        &row("labeled-plain"),
        &[(2, "yes"), (3, "-"), (7, "unmanageable:NoOwner")],
        &r,
    );
    for name in ["plain", "deployment-owned", "two-owners", "opted-out"] {
        assert!(
            table_row(&r.stdout, name).is_none(),
            "{name} is not a candidate\n{r}"
        );
    }

    // Scanning wrote nothing.
    let writes = configmap_writes_since(&cp, &client, &ns, mark).await;
    assert!(writes.is_empty(), "scan wrote: {writes:?}");

    // Without the stale locks: only held (and unmanageable) ones, exit 0.
    delete_cm(&client, &ns, "evicted-lock").await;
    delete_cm(&client, &ns, "ghost-lock").await;
    let r = scan(&["--owner-gone-grace", "0s"]).await;
    assert_eq!(r.code, 0, "no stale lock exits 0\n{r}");
    assert!(r.stderr.contains("1 held, 0 stale"), "{r}");

    drop(client);
    cp.stop();
}

#[tokio::test]
async fn scan_json_carries_every_column() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "scan-json").await;
    let other = fresh_namespace(&client, "scan-json-other").await;
    let live = running_pod(&client, &ns, "memcached-operator-7d9f8b6c5-x2x9k", NODE).await;
    let evicted = evicted_pod(&client, &other, "redis-operator-5c8d7f9b4-abcde").await;
    configmap(
        &client,
        &ns,
        "memcached-operator-lock",
        vec![pod_owner(&live)],
        &[],
    )
    .await;
    configmap(
        &client,
        &other,
        "redis-operator-lock",
        vec![pod_owner(&evicted)],
        &[(WATCH, "true")],
    )
    .await;

    let kc = cp.kubeconfig_path();
    let r = run(
        kc,
        &["scan", "-n", &ns, "--namespace", &other, "-o", "json"],
    )
    .await;
    assert_eq!(r.code, 3, "{r}");
    let report = r.json();
    let rows = rows_by_name(&report);
    assert_eq!(rows.len(), 2, "{r}");

    // The documented shape (docs/cli.md, "The LockList format"), exactly.
    let lock = &rows["redis-operator-lock"];
    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(lock),
        ["apiVersion", "kind", "metadata", "spec", "status"]
    );
    assert_eq!(
        keys(&lock["metadata"]),
        ["creationTimestamp", "name", "namespace"]
    );
    assert_eq!(keys(&lock["spec"]), ["holder", "labeled", "lockKind"]);
    assert_eq!(keys(&lock["spec"]["holder"]), ["name", "uid"]);
    assert_eq!(
        keys(&lock["status"]),
        [
            "ageSeconds",
            "diedAt",
            "holderPod",
            "message",
            "reason",
            "state",
            "verdict"
        ]
    );
    let pod = &lock["status"]["holderPod"];
    assert_eq!(
        keys(pod),
        ["deleting", "found", "message", "node", "phase", "reason", "uid"]
    );
    assert_eq!(lock["spec"]["lockKind"], "configmap");
    assert_eq!(lock["metadata"]["namespace"], other.as_str());
    assert_eq!(lock["spec"]["labeled"], true);
    assert_eq!(
        lock["spec"]["holder"]["name"],
        "redis-operator-5c8d7f9b4-abcde"
    );
    assert_eq!(
        lock["spec"]["holder"]["uid"],
        evicted.metadata.uid.clone().unwrap().as_str()
    );
    assert_eq!(pod["uid"], lock["spec"]["holder"]["uid"]);
    assert_eq!(pod["found"], true);
    assert_eq!(pod["deleting"], false);
    assert_eq!(pod["phase"], "Failed");
    assert_eq!(pod["reason"], "Evicted");
    assert_eq!(pod["message"], "The node was low on resource: memory.");
    assert_eq!(pod["node"], "scan-node");
    let status = &lock["status"];
    assert_eq!(status["verdict"], "stale:Evicted");
    assert_eq!(status["state"], "stale");
    assert_eq!(status["reason"], "Evicted");
    assert!(status["diedAt"].is_string(), "{lock:#}");
    assert!(status["ageSeconds"].as_u64().unwrap() < 600, "{lock:#}");
    assert!(
        lock["metadata"]["creationTimestamp"]
            .as_str()
            .unwrap()
            .ends_with('Z'),
        "{lock:#}"
    );
    let held = &rows["memcached-operator-lock"]["status"];
    assert_eq!(
        (
            &held["verdict"],
            &held["state"],
            &held["reason"],
            &rows["memcached-operator-lock"]["spec"]["labeled"]
        ),
        (
            &Value::from("held"),
            &Value::from("held"),
            &Value::from("Running"),
            &Value::from(false)
        )
    );
    assert!(held["diedAt"].is_null());

    let s = report["summary"].as_object().unwrap();
    for f in [
        "total",
        "labeled",
        "unlabeled",
        "held",
        "stale",
        "ambiguous",
        "unmanageable",
        "configMapsScanned",
        "leasesScanned",
        "skippedWithData",
        "namespaces",
        "selector",
        "ownerGoneGraceSeconds",
        "durationSeconds",
    ] {
        assert!(s.contains_key(f), "summary.{f} missing: {s:?}");
    }
    assert_eq!(s["selector"], "lock-janitor.io/watch=true");
    assert_eq!(s["ownerGoneGraceSeconds"], 30.0);

    // -o yaml is the same document.
    let y = run(kc, &["scan", "-n", &ns, "-n", &other, "-o", "yaml"]).await;
    assert_eq!(y.code, 3, "{y}");
    let mut from_yaml: Value = serde_saphyr::from_str(&y.stdout)
        .unwrap_or_else(|e| panic!("stdout is not YAML ({e})\n{y}"));
    let mut from_json = report.clone();
    for doc in [&mut from_yaml, &mut from_json] {
        // Timed anew on each run.
        doc["summary"]["durationSeconds"] = Value::Null;
        for item in doc["items"].as_array_mut().unwrap() {
            item["status"]["ageSeconds"] = Value::Null;
            item["status"]["message"] = Value::Null;
        }
    }
    assert_eq!(from_yaml, from_json, "{y}");

    // -o name: one kubectl name a line; --no-headers: the rows alone.
    let n = run(kc, &["scan", "-n", &ns, "-n", &other, "-o", "name"]).await;
    // Sorted by namespace, then name: the namespaces' names are random.
    let mut names: Vec<&str> = n.stdout.lines().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "configmap/memcached-operator-lock",
            "configmap/redis-operator-lock"
        ],
        "{n}"
    );
    assert!(n.stdout.ends_with('\n'), "{n}");
    let h = run(kc, &["scan", "-n", &ns, "-n", &other, "--no-headers"]).await;
    assert_eq!(h.stdout.lines().count(), 2, "{h}");
    assert!(!h.stdout.contains("NAMESPACE"), "{h}");
    assert!(h.stderr.contains("2 locks"), "{h}");

    // Each table cell is in the JSON.
    let t = run(kc, &["scan", "-n", &ns, "-n", &other]).await;
    assert_eq!(t.code, 3, "{t}");
    let cells = table_row(&t.stdout, "redis-operator-lock").expect("a row for the lock");
    let field = |path: &[&str]| {
        path.iter()
            .fold(lock, |v, k| &v[*k])
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_cells(
        &cells,
        &[
            (0, &field(&["metadata", "namespace"])),
            (1, &field(&["metadata", "name"])),
            (2, "yes"),
            (3, &field(&["spec", "holder", "name"])),
            (4, "Failed/Evicted"),
            (5, &field(&["status", "holderPod", "node"])),
            (7, &field(&["status", "verdict"])),
        ],
        &t,
    );

    // Without --namespace, every namespace is scanned (other tests' locks too).
    let all = run(kc, &["scan", "-o", "json"]).await;
    assert!([0, 3].contains(&all.code), "{all}");
    let found: BTreeSet<(String, String)> = all.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["metadata"]["namespace"].as_str().unwrap().to_owned(),
                r["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        found.contains(&(ns.clone(), "memcached-operator-lock".into())),
        "{all}"
    );
    assert!(
        found.contains(&(other.clone(), "redis-operator-lock".into())),
        "{all}"
    );
}

/// When stdout is not a terminal (a pipe, a file) nothing is cut, whatever
/// the width; `-o wide` adds the holder uid, the death and the message.
#[tokio::test]
async fn piped_tables_are_never_cut() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "scan-piped").await;
    let holder = format!("operator-{}-7d9f8b6c5-x2x9k", "p".repeat(120));
    let lock = format!("operator-lock-{}", "l".repeat(150));
    let pod = evicted_pod(&client, &ns, &holder).await;
    configmap(
        &client,
        &ns,
        &lock,
        vec![pod_owner(&pod)],
        &[(WATCH, "true")],
    )
    .await;
    let kc = cp.kubeconfig_path();

    let t = run(kc, &["scan", "-n", &ns]).await;
    assert_eq!(t.code, 3, "{t}");
    assert!(!t.stdout.contains('…'), "{t}");
    let row = table_row(&t.stdout, &lock).unwrap_or_else(|| panic!("no row\n{t}"));
    assert_cells(&row, &[(1, &lock), (3, &holder), (7, "stale:Evicted")], &t);
    // The notes and the summary are on stderr, the table alone on stdout.
    assert_eq!(t.stdout.lines().count(), 2, "{t}");
    assert!(t.stderr.contains("1 lock (1 labeled, 0 unlabeled)"), "{t}");

    let w = run(kc, &["scan", "-n", &ns, "-o", "wide"]).await;
    assert_eq!(w.code, 3, "{w}");
    let header = w.stdout.lines().next().unwrap();
    for col in ["HOLDER-UID", "DIED", "MESSAGE"] {
        assert!(header.contains(col), "{col}\n{w}");
    }
    let uid = pod.metadata.uid.clone().unwrap();
    assert!(w.stdout.contains(&uid), "{w}");
    assert!(w.stdout.contains("low on resource: memory"), "{w}");
    assert!(!w.stdout.contains('…'), "{w}");
}

#[tokio::test]
async fn scan_and_label_fail_with_a_clear_message() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "scan-errors").await;

    // No access: says which list was forbidden.
    let nobody = kubeconfig_as(cp, "scan-nobody");
    let r = run(&nobody, &["scan", "-n", &ns]).await;
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr.contains(&format!(
            "listing configmaps in namespace {ns} was forbidden"
        )) && r.stderr.contains("scan-nobody"),
        "{r}"
    );
    assert!(r.stdout.is_empty(), "{r}");
    let r = run(&nobody, &["label", "-n", &ns]).await;
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("forbidden"), "{r}");

    // May list ConfigMaps, nothing else: each command says what it lacks.
    let pod = running_pod(&client, &ns, "op", NODE).await;
    configmap(&client, &ns, "op-lock", vec![pod_owner(&pod)], &[]).await;
    grant_in(
        &client,
        &ns,
        "scan-reader",
        user("scan-reader"),
        vec![rule(&[""], &["configmaps"], &["list"])],
    )
    .await;
    wait_until_can_list(cp, &ns, "scan-reader").await;
    let reader = kubeconfig_as(cp, "scan-reader");
    // An unlabeled candidate is read whole (is it empty, lock-shaped?).
    for args in [vec!["scan", "-n", &ns], vec!["label", "-n", &ns]] {
        let r = run(&reader, &args).await;
        assert_eq!(r.code, 1, "{r}");
        assert!(
            r.stderr
                .contains(&format!("reading configmap {ns}/op-lock was forbidden"))
                && r.stderr.contains("list and get on configmaps"),
            "{r}"
        );
    }
    Api::<Role>::namespaced(client.clone(), &ns)
        .patch(
            "scan-reader",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "get"]}
            ]})),
        )
        .await
        .unwrap();
    let r = wait_for(
        "get on configmaps granted",
        Duration::from_secs(30),
        || async {
            let r = run(&reader, &["scan", "-n", &ns]).await;
            (!r.stderr.contains("reading configmap")).then_some(r)
        },
    )
    .await;
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr
            .contains(&format!("reading holder pod {ns}/op was forbidden")),
        "{r}"
    );
    let r = run(&reader, &["label", "-n", &ns]).await;
    assert_eq!(r.code, 0, "a dry run only reads\n{r}");
    let r = run(&reader, &["label", "-n", &ns, "--apply"]).await;
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr
            .contains(&format!("labeling configmap {ns}/op-lock was forbidden")),
        "{r}"
    );
    assert!(
        r.stderr.contains("stopped at the first forbidden write"),
        "{r}"
    );
    assert!(!labels_of(&client, &ns, "op-lock").await.contains_key(WATCH));

    // No cluster configured at all.
    let home = cp.dir().join("scan-empty-home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = command(&home.join("no-such-kubeconfig"), &["scan"]);
    cmd.env("HOME", &home);
    let r = run_with(cmd).await;
    assert_eq!(r.code, 1, "{r}");
    assert!(r.stderr.contains("no Kubernetes cluster configured"), "{r}");

    // A cluster that does not answer.
    let down = kubeconfig_unreachable(cp);
    let r = run(&down, &["scan", "-n", &ns]).await;
    assert_eq!(r.code, 1, "{r}");
    assert!(
        r.stderr.contains("cannot reach the Kubernetes API server"),
        "{r}"
    );

    // label needs a key=value to write: a usage error (2), said plainly.
    for selector in ["team!=x", "lock-janitor.io/watch", "!lock-janitor.io/watch"] {
        let r = run(
            cp.kubeconfig_path(),
            &["label", "-n", &ns, "--selector", selector],
        )
        .await;
        assert_eq!(r.code, 2, "{r}");
        assert!(
            r.stderr
                .contains(&format!("--selector {selector} has no single key=value")),
            "{r}"
        );
        assert!(!r.stderr.contains("Selector {"), "no Debug dump\n{r}");
        assert!(r.stdout.is_empty(), "{r}");
    }

    // A set-based selector is named as such, for every command.
    for cmd in ["scan", "label"] {
        let r = run(
            cp.kubeconfig_path(),
            &[
                cmd,
                "-n",
                &ns,
                "--selector",
                "lock-janitor.io/watch in (true,yes)",
            ],
        )
        .await;
        assert_eq!(r.code, 2, "{r}");
        assert!(
            r.stderr.contains("set-based selectors")
                && r.stderr.contains("one key=value term")
                && !r.stderr.contains("not a label key"),
            "{r}"
        );
    }
}

/// A tiny HTTP server that is no Kubernetes API server: every request gets
/// `404` with `body`. Returns a kubeconfig pointing at it and its URL.
async fn not_kubernetes(cp: &ControlPlane, body: &'static str) -> (std::path::PathBuf, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: web\n  cluster:\n    server: {url}\n\
         users:\n- name: someone\n  user:\n    token: not-a-token\ncontexts:\n- name: web\n  context:\n    \
         cluster: web\n    user: someone\ncurrent-context: web\n"
    );
    let path = cp.dir().join(format!("kubeconfig-not-kubernetes-{port}"));
    std::fs::write(&path, kubeconfig).unwrap();
    (path, url)
}

#[tokio::test]
async fn errors_name_the_server_the_namespace_and_the_way_out() {
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "scan-way-out").await;

    // A web server that is no API server: its status and URL, whatever it said.
    for body in ["404 page not found\n", ""] {
        let (kubeconfig, url) = not_kubernetes(cp, body).await;
        for args in [
            vec!["scan", "-n", "ops"],
            vec!["label", "-A"],
            vec!["check"],
        ] {
            let r = run(&kubeconfig, &args).await;
            assert_eq!(r.code, 1, "{r}");
            assert!(
                r.stderr
                    .contains(&format!("{url}/ answered HTTP 404 Not Found"))
                    || r.stderr
                        .contains(&format!("{url} answered HTTP 404 Not Found")),
                "{r}"
            );
            assert!(r.stderr.contains("a Kubernetes API server?"), "{r}");
            assert!(!r.stderr.contains("Failed to parse error data"), "{r}");
            if body.is_empty() {
                assert!(r.stderr.contains("with an empty body"), "{r}");
            } else {
                assert!(r.stderr.contains("404 page not found"), "{r}");
            }
        }
    }

    // A namespace that does not exist: said, not only "0 scanned".
    let typo = format!("{ns}-typo");
    for cmd in ["scan", "label"] {
        let r = run(cp.kubeconfig_path(), &[cmd, "-n", &typo, "-n", &ns]).await;
        assert_eq!(r.code, 0, "{r}");
        assert!(
            r.stderr
                .contains(&format!("namespace {typo} does not exist")),
            "{r}"
        );
        // The real one, empty as it is, is not called missing.
        assert!(
            !r.stderr.contains(&format!("namespace {ns} does not exist")),
            "{r}"
        );
        assert!(
            !r.stdout.contains("does not exist"),
            "stdout is the report alone\n{r}"
        );
    }

    // Forbidden in all namespaces: the way out is -n.
    let nobody = kubeconfig_as(cp, "scan-way-out-nobody");
    for cmd in ["scan", "label"] {
        let r = run(&nobody, &[cmd]).await;
        assert_eq!(r.code, 1, "{r}");
        assert!(
            r.stderr
                .contains("listing configmaps in all namespaces was forbidden"),
            "{r}"
        );
        assert!(r.stderr.contains("name them: -n NAMESPACE"), "{r}");
        // In one namespace, -n is no way out.
        let r = run(&nobody, &[cmd, "-n", &ns]).await;
        assert_eq!(r.code, 1, "{r}");
        assert!(r.stderr.contains("was forbidden"), "{r}");
        assert!(!r.stderr.contains("-n NAMESPACE"), "{r}");
    }
}

// ---------------------------------------------------------------------------
// label

#[tokio::test]
async fn label_is_a_dry_run_by_default_and_labels_exactly_the_candidates() {
    let cp = shared().await;
    let kc = cp.kubeconfig_path();
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "label").await;
    let a = running_pod(&client, &ns, "a-op", NODE).await;
    let b = evicted_pod(&client, &ns, "b-op").await;
    let c = running_pod(&client, &ns, "c-op", NODE).await;
    let deploy = deployment(&client, &ns, "some-app").await;
    configmap(&client, &ns, "a-lock", vec![pod_owner(&a)], &[]).await;
    configmap(
        &client,
        &ns,
        "b-lock",
        vec![pod_owner(&b)],
        &[("team", "x")],
    )
    .await;
    configmap(&client, &ns, "skip-lock", vec![pod_owner(&c)], &[]).await;
    configmap(
        &client,
        &ns,
        "already-lock",
        vec![pod_owner(&a)],
        &[(WATCH, "true")],
    )
    .await;
    configmap(
        &client,
        &ns,
        "optout-lock",
        vec![pod_owner(&c)],
        &[(WATCH, "false")],
    )
    .await;
    configmap(&client, &ns, "plain", vec![], &[]).await;
    configmap(
        &client,
        &ns,
        "deployment-owned",
        vec![deployment_owner(&deploy)],
        &[],
    )
    .await;
    configmap(
        &client,
        &ns,
        "two-owners",
        vec![pod_owner(&a), pod_owner(&c)],
        &[],
    )
    .await;

    // Dry run: prints the changes, writes nothing.
    let mark = audit_mark(cp);
    let r = run(kc, &["label", "-n", &ns]).await;
    assert_eq!(r.code, 0, "{r}");
    assert_label_row(&r, &ns, "a-lock", "a-op", "would-label");
    assert_label_row(&r, &ns, "b-lock", "b-op", "would-label");
    assert_label_row(&r, &ns, "skip-lock", "c-op", "would-label");
    assert_label_row(&r, &ns, "already-lock", "a-op", "unchanged");
    assert_label_row(&r, &ns, "optout-lock", "c-op", "skipped");
    // Why it was skipped: a note on stderr.
    assert!(
        r.stderr.contains(&format!(
            "{ns}/optout-lock: has {WATCH}=false; not overwriting it"
        )),
        "{r}"
    );
    for name in ["plain", "deployment-owned", "two-owners"] {
        assert!(table_row(&r.stdout, name).is_none(), "{name}\n{r}");
    }
    assert!(
        r.stderr
            .contains("dry run: 3 would be labeled, 1 unchanged, 1 skipped"),
        "{r}"
    );
    let writes = configmap_writes_since(cp, &client, &ns, mark).await;
    assert!(writes.is_empty(), "the dry run wrote: {writes:?}");

    // --apply, with --exclude: labels exactly a-lock and b-lock.
    let mark = audit_mark(cp);
    let r = run(kc, &["label", "-n", &ns, "--apply", "--exclude", "skip-*"]).await;
    assert_eq!(r.code, 0, "{r}");
    assert_label_row(&r, &ns, "a-lock", "a-op", "labeled");
    assert_label_row(&r, &ns, "b-lock", "b-op", "labeled");
    assert!(!r.stdout.contains("skip-lock"), "{r}");
    assert!(
        r.stderr
            .contains("1 left out by --include/--exclude/--from-selector"),
        "{r}"
    );
    let writes = configmap_writes_since(cp, &client, &ns, mark).await;
    assert_eq!(
        names(&writes),
        BTreeSet::from(["a-lock".to_string(), "b-lock".to_string()]),
        "{writes:?}"
    );
    assert!(
        writes
            .iter()
            .all(|e| e.verb == "patch" && e.code == Some(200)),
        "{writes:?}"
    );
    assert_eq!(
        labels_of(&client, &ns, "a-lock")
            .await
            .get(WATCH)
            .map(String::as_str),
        Some("true")
    );
    let b_labels = labels_of(&client, &ns, "b-lock").await;
    assert_eq!(b_labels.get(WATCH).map(String::as_str), Some("true"));
    assert_eq!(
        b_labels.get("team").map(String::as_str),
        Some("x"),
        "other labels kept"
    );
    assert!(!labels_of(&client, &ns, "skip-lock")
        .await
        .contains_key(WATCH));
    assert_eq!(
        labels_of(&client, &ns, "optout-lock")
            .await
            .get(WATCH)
            .map(String::as_str),
        Some("false"),
        "an opt-out is never overwritten"
    );
    for name in ["plain", "deployment-owned", "two-owners"] {
        assert!(
            !labels_of(&client, &ns, name).await.contains_key(WATCH),
            "{name}"
        );
    }

    // --from-selector: after a change of the selector, only the locks the
    // old one opts in get the new label (b-lock carries team=x); the old
    // label stays.
    let mark = audit_mark(cp);
    let r = run(
        kc,
        &[
            "label",
            "-n",
            &ns,
            "--apply",
            "--selector",
            "moved=yes",
            "--from-selector",
            "team=x",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{r}");
    assert_label_row(&r, &ns, "b-lock", "b-op", "labeled");
    assert!(!r.stdout.contains("a-lock"), "{r}");
    let writes = configmap_writes_since(cp, &client, &ns, mark).await;
    assert_eq!(
        names(&writes),
        BTreeSet::from(["b-lock".to_string()]),
        "{writes:?}"
    );
    let b_labels = labels_of(&client, &ns, "b-lock").await;
    assert_eq!(b_labels.get("moved").map(String::as_str), Some("yes"));
    assert_eq!(b_labels.get("team").map(String::as_str), Some("x"));
    let bad = run(kc, &["label", "-n", &ns, "--from-selector", "no value"]).await;
    assert_eq!(bad.code, 2, "{bad}");

    // --include: only the matching lock.
    let mark = audit_mark(cp);
    let r = run(kc, &["label", "-n", &ns, "--apply", "--include", "skip-*"]).await;
    assert_eq!(r.code, 0, "{r}");
    assert_label_row(&r, &ns, "skip-lock", "c-op", "labeled");
    assert!(!r.stdout.contains("a-lock"), "{r}");
    let writes = configmap_writes_since(cp, &client, &ns, mark).await;
    assert_eq!(
        names(&writes),
        BTreeSet::from(["skip-lock".to_string()]),
        "{writes:?}"
    );

    // Again: nothing to change, nothing written.
    let mark = audit_mark(cp);
    let r = run(kc, &["label", "-n", &ns, "--apply"]).await;
    assert_eq!(r.code, 0, "{r}");
    assert!(
        r.stderr.contains("0 labeled, 4 unchanged, 1 skipped"),
        "{r}"
    );
    let writes = configmap_writes_since(cp, &client, &ns, mark).await;
    assert!(writes.is_empty(), "the second run wrote: {writes:?}");

    // Everything labeled is now seen as labeled by scan.
    let r = run(kc, &["scan", "-n", &ns, "-o", "json"]).await;
    assert_eq!(r.code, 3, "b-lock's holder is evicted\n{r}");
    let rows = rows_by_name(&r.json());
    for name in ["a-lock", "b-lock", "skip-lock", "already-lock"] {
        assert_eq!(rows[name]["spec"]["labeled"], true, "{name}\n{r}");
    }
    assert_eq!(rows["optout-lock"]["spec"]["labeled"], false, "{r}");
}

/// `label` prints as `scan` does: a table never cut when piped (the notes
/// and summary on stderr), `--no-headers`, `-o wide`, `-o name` (only what
/// it labels), and a `LockList` in JSON and YAML whose items say what it did
/// or would do.
#[tokio::test]
async fn label_output_fits_kubectl_habits() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    let cp = shared().await;
    let kc = cp.kubeconfig_path();
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "label-out").await;
    let holder = format!("operator-{}-7d9f8b6c5-x2x9k", "p".repeat(120));
    let lock = format!("operator-lock-{}", "l".repeat(150));
    let pod = running_pod(&client, &ns, &holder, NODE).await;
    let other = running_pod(&client, &ns, "other-op", NODE).await;
    let lease_op = running_pod(&client, &ns, "lease-op", NODE).await;
    configmap(&client, &ns, &lock, vec![pod_owner(&pod)], &[]).await;
    configmap(
        &client,
        &ns,
        "in-lock",
        vec![pod_owner(&other)],
        &[(WATCH, "true")],
    )
    .await;
    configmap(
        &client,
        &ns,
        "out-lock",
        vec![pod_owner(&other)],
        &[(WATCH, "false")],
    )
    .await;
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("op-lease".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: lease_op.metadata.name.clone(),
            lease_duration_seconds: Some(3600),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..Default::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    let uid = pod.metadata.uid.clone().unwrap();

    // Piped: nothing cut; the table alone on stdout.
    let t = run(kc, &["label", "-n", &ns]).await;
    assert_eq!(t.code, 0, "{t}");
    assert!(!t.stdout.contains('…'), "{t}");
    assert_label_row(&t, &ns, &lock, &holder, "would-label");
    assert_label_row(&t, &ns, "in-lock", "other-op", "unchanged");
    assert_label_row(&t, &ns, "out-lock", "other-op", "skipped");
    assert_label_row(&t, &ns, "lease/op-lease", "lease-op", "would-label");
    assert_eq!(t.stdout.lines().count(), 5, "a header and 4 rows\n{t}");
    assert!(
        t.stderr.contains(&format!(
            "{ns}/out-lock: has {WATCH}=false; not overwriting it"
        )),
        "{t}"
    );
    assert!(
        t.stderr
            .contains("dry run: 2 would be labeled, 1 unchanged, 1 skipped"),
        "{t}"
    );

    let h = run(kc, &["label", "-n", &ns, "--no-headers"]).await;
    assert_eq!(h.code, 0, "{h}");
    assert_eq!(h.stdout, t.stdout.split_once('\n').unwrap().1, "{h}");

    let w = run(kc, &["label", "-n", &ns, "-o", "wide"]).await;
    assert_eq!(w.code, 0, "{w}");
    let header: Vec<&str> = w
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "NAME",
            "HOLDER",
            "RESULT",
            "HOLDER-UID",
            "MESSAGE"
        ],
        "{w}"
    );
    let row = table_row(&w.stdout, &lock).unwrap();
    assert_eq!(
        row[..5],
        [ns.as_str(), &lock, &holder, "would-label", &uid],
        "{w}"
    );
    assert_eq!(row[5..].join(" "), format!("would add {WATCH}=true"), "{w}");
    assert!(
        w.stdout
            .contains("has lock-janitor.io/watch=false; not overwriting it"),
        "the message is a column\n{w}"
    );
    assert!(!w.stderr.contains("out-lock:"), "no notes with wide\n{w}");

    // -o name: only what would be labeled, as kubectl names it.
    let n = run(kc, &["label", "-n", &ns, "-o", "name"]).await;
    assert_eq!(n.code, 0, "{n}");
    assert_eq!(
        n.stdout,
        format!("configmap/{lock}\nlease.coordination.k8s.io/op-lease\n"),
        "{n}"
    );

    // JSON and YAML: the same LockList.
    let j = run(kc, &["label", "-n", &ns, "-o", "json"]).await;
    assert_eq!(j.code, 0, "{j}");
    let list = j.json();
    let items = rows_by_name(&list);
    assert_eq!(items.len(), 4, "{j}");
    let summary = &list["summary"];
    assert_eq!(summary["dryRun"], true, "{j}");
    assert_eq!(summary["label"], "lock-janitor.io/watch=true", "{j}");
    assert_eq!(summary["total"], 4, "{j}");
    assert_eq!(
        summary["results"],
        serde_json::json!({"labeled": 0, "would-label": 2, "unchanged": 1, "skipped": 1,
                           "gone": 0, "conflict": 0, "failed": 0}),
        "{j}"
    );
    assert_eq!(summary["namespaces"], serde_json::json!([ns]), "{j}");
    assert_eq!(summary["selector"], "lock-janitor.io/watch=true", "{j}");
    let l = &items[&lock];
    assert_eq!(l["metadata"]["namespace"], ns.as_str(), "{j}");
    assert!(l["metadata"]["creationTimestamp"].is_string(), "{j}");
    assert_eq!(l["spec"]["lockKind"], "configmap", "{j}");
    assert_eq!(l["spec"]["labeled"], false, "{j}");
    assert_eq!(l["spec"]["holder"]["name"], holder.as_str(), "{j}");
    assert_eq!(l["spec"]["holder"]["uid"], uid.as_str(), "{j}");
    assert!(l.get("status").is_none(), "label judges nothing\n{j}");
    assert_eq!(
        l["labeling"],
        serde_json::json!({"result": "would-label", "currentValue": null,
                           "message": format!("would add {WATCH}=true")}),
        "{j}"
    );
    assert_eq!(items["in-lock"]["spec"]["labeled"], true, "{j}");
    assert_eq!(items["in-lock"]["labeling"]["result"], "unchanged", "{j}");
    assert_eq!(items["out-lock"]["labeling"]["result"], "skipped", "{j}");
    assert_eq!(
        items["out-lock"]["labeling"]["currentValue"], "false",
        "{j}"
    );
    assert_eq!(items["op-lease"]["spec"]["lockKind"], "lease", "{j}");
    assert_eq!(
        items["op-lease"]["spec"]["holder"]["name"], "lease-op",
        "{j}"
    );
    assert_eq!(
        items["op-lease"]["spec"]["holder"]["uid"],
        Value::Null,
        "{j}"
    );
    // stdout is the document alone; the summary line is on stderr.
    assert!(j.stderr.contains("dry run: 2 would be labeled"), "{j}");

    let y = run(kc, &["label", "-n", &ns, "-o", "yaml"]).await;
    assert_eq!(y.code, 0, "{y}");
    let yaml: Value = serde_saphyr::from_str(&y.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one YAML document ({e})\n{y}"));
    assert_eq!(yaml["apiVersion"], "lock-janitor.io/v1alpha1", "{y}");
    assert_eq!(yaml["kind"], "LockList", "{y}");
    assert_eq!(yaml["items"], list["items"], "{y}");
    assert_eq!(yaml["summary"]["results"], summary["results"], "{y}");

    // --apply -o json: what it did.
    let a = run(kc, &["label", "-n", &ns, "--apply", "-o", "json"]).await;
    assert_eq!(a.code, 0, "{a}");
    let list = a.json();
    assert_eq!(list["summary"]["dryRun"], false, "{a}");
    assert_eq!(list["summary"]["results"]["labeled"], 2, "{a}");
    assert_eq!(list["summary"]["results"]["would-label"], 0, "{a}");
    let items = rows_by_name(&list);
    assert_eq!(items[&lock]["labeling"]["result"], "labeled", "{a}");
    assert_eq!(
        items[&lock]["labeling"]["message"],
        format!("added {WATCH}=true"),
        "{a}"
    );
    assert_eq!(items["op-lease"]["labeling"]["result"], "labeled", "{a}");
    assert_eq!(
        labels_of(&client, &ns, &lock)
            .await
            .get(WATCH)
            .map(String::as_str),
        Some("true")
    );
    // Again: nothing to add, so -o name prints nothing.
    let n = run(kc, &["label", "-n", &ns, "--apply", "-o", "name"]).await;
    assert_eq!(n.code, 0, "{n}");
    assert_eq!(n.stdout, "", "{n}");
    assert!(
        n.stderr.contains("0 labeled, 3 unchanged, 1 skipped"),
        "{n}"
    );
}

/// A ConfigMap owned by exactly one Pod but holding data (a Spark driver's,
/// say) is not lock-shaped: scan leaves it out and says so, label never
/// labels it, even with --apply.
#[tokio::test]
async fn configmaps_with_data_are_not_lock_candidates() {
    let cp = shared().await;
    let kc = cp.kubeconfig_path();
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "with-data").await;
    let driver = running_pod(&client, &ns, "spark-driver", NODE).await;
    let op = running_pod(&client, &ns, "op", NODE).await;
    configmap(&client, &ns, "op-lock", vec![pod_owner(&op)], &[]).await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    for (name, data, binary) in [
        (
            "spark-conf",
            Some(BTreeMap::from([(
                "spark.conf".to_string(),
                "x=1".to_string(),
            )])),
            None,
        ),
        (
            "spark-bin",
            None,
            Some(BTreeMap::from([(
                "blob".to_string(),
                k8s_openapi::ByteString(vec![0, 1]),
            )])),
        ),
    ] {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                owner_references: Some(vec![pod_owner(&driver)]),
                ..Default::default()
            },
            data,
            binary_data: binary,
            ..Default::default()
        };
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }

    let r = run(kc, &["scan", "-n", &ns, "-o", "json"]).await;
    assert_eq!(r.code, 0, "{r}");
    let report: Value = serde_json::from_str(&r.stdout).unwrap();
    let rows = rows_by_name(&report);
    assert!(rows.contains_key("op-lock"), "{r}");
    assert!(
        !rows.contains_key("spark-conf") && !rows.contains_key("spark-bin"),
        "{r}"
    );
    assert_eq!(report["summary"]["skippedWithData"], 2, "{r}");
    let r = run(kc, &["scan", "-n", &ns]).await;
    assert!(
        r.stderr
            .contains("2 unlabeled ConfigMaps owned by one Pod skipped"),
        "{r}"
    );

    let mark = audit_mark(cp);
    let r = run(kc, &["label", "-n", &ns, "--apply"]).await;
    assert_eq!(r.code, 0, "{r}");
    assert_label_row(&r, &ns, "op-lock", "op", "labeled");
    assert!(!r.stdout.contains("spark"), "{r}");
    assert!(
        r.stderr.contains("2 owned by one Pod but holding data"),
        "{r}"
    );
    let writes = configmap_writes_since(cp, &client, &ns, mark).await;
    assert_eq!(
        names(&writes),
        BTreeSet::from(["op-lock".to_string()]),
        "{writes:?}"
    );
    for name in ["spark-conf", "spark-bin"] {
        assert!(!labels_of(&client, &ns, name).await.contains_key(WATCH));
    }
}

#[tokio::test]
async fn label_never_overwrites_a_concurrent_change() {
    // The patch label writes carries the resourceVersion it read: a stale one
    // is refused with 409 and the object is left as it is.
    let cp = shared().await;
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "label-conflict").await;
    let pod = running_pod(&client, &ns, "op", NODE).await;
    let read = configmap(&client, &ns, "op-lock", vec![pod_owner(&pod)], &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // Someone else changes it after label read it...
    cms.patch(
        "op-lock",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {WATCH: "false"}}})),
    )
    .await
    .unwrap();
    // ...then label's write, built from the old read, must fail.
    let patch = lock_janitor::optin::label_patch(&read.metadata, WATCH, "true");
    assert_eq!(
        patch["metadata"]["resourceVersion"],
        read.metadata.resource_version.clone().unwrap().as_str()
    );
    let err = cms
        .patch("op-lock", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409),
        "{err}"
    );
    assert_eq!(
        labels_of(&client, &ns, "op-lock")
            .await
            .get(WATCH)
            .map(String::as_str),
        Some("false")
    );
}

#[tokio::test]
async fn controller_reclaims_a_newly_labeled_stale_lock() {
    let cp = shared().await;
    let kc = cp.kubeconfig_path();
    let client = cp.client().await.unwrap();
    let ns = fresh_namespace(&client, "label-reclaim").await;
    let evicted = evicted_pod(&client, &ns, "op-evicted").await;
    configmap(&client, &ns, "op-lock", vec![pod_owner(&evicted)], &[]).await;

    let port = free_port();
    let log = cp.dir().join(format!("janitor-{ns}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = command(
        kc,
        &[
            "run",
            "--namespace",
            &ns,
            "--metrics-bind-address",
            &format!("127.0.0.1:{port}"),
            "--owner-gone-grace",
            "1s",
            "--resync",
            "2s",
        ],
    );
    cmd.env("RUST_LOG", "info")
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    let mut janitor = cmd.spawn().expect("start lock-janitor run");
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    // Ready: its watches have synced.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(http_get(port, "/readyz").await, Ok((200, _))) {
        if let Ok(Some(st)) = janitor.try_wait() {
            panic!("the janitor exited ({st}):\n{}", logs());
        }
        assert!(
            Instant::now() < deadline,
            "the janitor was not ready within 60s:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let r = run(kc, &["scan", "-n", &ns]).await;
    assert_eq!(r.code, 3, "{r}");
    assert!(r.stdout.contains("stale:Evicted"), "{r}");

    let r = run(kc, &["label", "-n", &ns, "--apply"]).await;
    assert_eq!(r.code, 0, "{r}");
    assert_label_row(&r, &ns, "op-lock", "op-evicted", "labeled");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    wait_for(
        "the janitor to delete op-lock",
        Duration::from_secs(30),
        || async {
            cms.get_opt("op-lock")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    // It was the janitor, and it said so.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let reclaimed = wait_for(
        "a StaleLockReclaimed Event",
        Duration::from_secs(30),
        || async {
            events
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("StaleLockReclaimed"))
        },
    )
    .await;
    assert_eq!(
        reclaimed.regarding.and_then(|r| r.name).as_deref(),
        Some("op-lock")
    );
    // The evicted pod stays (no --delete-pod); the lock is gone: scan exits 0.
    assert!(Api::<Pod>::namespaced(client.clone(), &ns)
        .get_opt("op-evicted")
        .await
        .unwrap()
        .is_some());
    let r = run(kc, &["scan", "-n", &ns]).await;
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stderr.contains("No lock candidates"), "{r}");

    janitor.kill().await.expect("kill the janitor");
}
