//! The sweep's rules, request by request, on a mocked API server
//! (`fixtures::ApiServer`): which reads each namespace gets (its holders by
//! name, or its pods listed), and which locks come out as suspects.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{json, Value};

use super::*;
use crate::fixtures::{list_of, lock_meta, pod_owner, Answer, ApiServer, Expect};
use crate::index::{HolderIndex, LeaseIndex};

/// `TERMINAL_PODS` as the query carries it.
const TERMINAL: &str = "fieldSelector=status.phase%21%3DPending%2Cstatus.phase%21%3DRunning%2Cstatus.phase%21%3DUnknown";

/// ConfigMap lock `ns/name` held by `holder` (uid `u-<holder>`).
fn lock(ns: &str, name: &str, holder: &str) -> ConfigMap {
    let mut meta = lock_meta(vec![pod_owner(holder, &format!("u-{holder}"))], &[]);
    meta.namespace = Some(ns.into());
    meta.name = Some(name.into());
    ConfigMap {
        metadata: meta,
        ..Default::default()
    }
}

fn holders(locks: &[ConfigMap]) -> HolderIndex {
    let index = HolderIndex::default();
    for l in locks {
        index.apply_owners(l);
    }
    index
}

/// Pod `ns/name` (uid `uid`) in `phase`, whole or as a metadata list item.
fn pod(ns: &str, name: &str, uid: &str, phase: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "status": {"phase": phase},
    })
}

fn pods(items: Vec<Value>) -> Answer {
    Answer::Ok(list_of("PartialObjectMetadataList", items))
}

fn pod_path(ns: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/pods/{name}")
}

fn keys(set: &HashSet<LockKey>) -> BTreeSet<String> {
    set.iter().map(|k| format!("{k}")).collect()
}

async fn run(
    scope: Option<&str>,
    watched: Watched<'_>,
    script: Vec<Expect>,
) -> (Sweep, Result<(), Error>) {
    let (client, server) = ApiServer::start(script);
    let mut out = Sweep::default();
    let result = sweep(&client, scope, watched, &mut out).await;
    server.finish().await;
    (out, result)
}

/// Up to two holders in a namespace: each read by name. A terminal holder,
/// a missing one and one made again under another uid make their locks
/// suspects; a running one does not.
#[tokio::test]
async fn a_few_holders_are_read_by_name() {
    let index = holders(&[
        lock("a", "dead", "p1"),
        lock("a", "gone", "p2"),
        lock("b", "alive", "p3"),
        lock("b", "again", "p4"),
    ]);
    let script = vec![
        Expect::get(&pod_path("a", "p1")).answer(Answer::Ok(pod("a", "p1", "u-p1", "Failed"))),
        Expect::get(&pod_path("a", "p2")).status(404),
        Expect::get(&pod_path("b", "p3")).answer(Answer::Ok(pod("b", "p3", "u-p3", "Running"))),
        Expect::get(&pod_path("b", "p4")).answer(Answer::Ok(pod("b", "p4", "other", "Running"))),
    ];
    let watched = Watched {
        configmaps: Some(&index),
        leases: None,
    };
    let (out, result) = run(None, watched, script).await;
    result.unwrap();
    assert_eq!(
        keys(&out.configmaps),
        BTreeSet::from(["a/dead".into(), "a/gone".into(), "b/again".into()])
    );
    assert_eq!((out.requests, out.namespaces), (4, 2));
}

/// More than two holders in a namespace: no GET per holder, but its
/// terminal pods listed, then all its pods (metadata only, 500 a page).
#[tokio::test]
async fn many_holders_are_found_by_listing_the_namespace() {
    let index = holders(&[
        lock("a", "l1", "p1"),
        lock("a", "l2", "p2"),
        lock("a", "l3", "p3"),
    ]);
    let script = vec![
        Expect::get("/api/v1/namespaces/a/pods")
            .query(TERMINAL)
            .query("limit=500")
            .answer(pods(vec![pod("a", "p1", "u-p1", "Succeeded")])),
        Expect::get("/api/v1/namespaces/a/pods")
            .query("limit=500")
            .answer(pods(vec![
                pod("a", "p1", "u-p1", "Succeeded"),
                pod("a", "p3", "u-p3", "Running"),
                pod("a", "unrelated", "u-x", "Running"),
            ])),
    ];
    let watched = Watched {
        configmaps: Some(&index),
        leases: None,
    };
    let (out, result) = run(None, watched, script).await;
    result.unwrap();
    // p1 terminal, p2 missing; p3 is there under its uid.
    assert_eq!(
        keys(&out.configmaps),
        BTreeSet::from(["a/l1".into(), "a/l2".into()])
    );
    assert_eq!((out.requests, out.pods), (2, 4));
}

/// A namespace whose Leases name hosts: its terminal pods listed (a host
/// may be a name cut to a hostname, which only a list finds), then its few
/// ConfigMap holders read by name.
#[tokio::test]
async fn lease_hosts_are_found_among_the_terminal_pods() {
    let cms = holders(&[lock("a", "cm", "p1")]);
    let leases = LeaseIndex::default();
    leases.apply_host(LockKey::lease("a", "lease"), Some("p2".into()));
    leases.apply_host(LockKey::lease("a", "running"), Some("p3".into()));
    let script = vec![
        Expect::get("/api/v1/namespaces/a/pods")
            .query(TERMINAL)
            .answer(pods(vec![pod("a", "p2", "u-p2", "Failed")])),
        Expect::get(&pod_path("a", "p1")).answer(Answer::Ok(pod("a", "p1", "u-p1", "Running"))),
    ];
    let watched = Watched {
        configmaps: Some(&cms),
        leases: Some(&leases),
    };
    let (out, result) = run(None, watched, script).await;
    result.unwrap();
    assert!(out.configmaps.is_empty(), "{:?}", out.configmaps);
    assert_eq!(keys(&out.leases), BTreeSet::from(["a/lease".into()]));
}

/// Cluster-wide, a namespace that refuses the list (403) is passed over:
/// the others are swept, and its locks are not taken for missing. A
/// namespace scope that refuses fails the sweep.
#[tokio::test]
async fn a_refused_namespace_stops_only_itself_cluster_wide() {
    let leases = LeaseIndex::default();
    leases.apply_host(LockKey::lease("a", "la"), Some("p1".into()));
    leases.apply_host(LockKey::lease("b", "lb"), Some("p2".into()));
    let cms = holders(&[lock("a", "cm", "p9")]);
    let script = vec![
        Expect::get("/api/v1/namespaces/a/pods")
            .query(TERMINAL)
            .status(403),
        Expect::get("/api/v1/namespaces/b/pods")
            .query(TERMINAL)
            .answer(pods(vec![pod("b", "p2", "u-p2", "Failed")])),
    ];
    let watched = Watched {
        configmaps: Some(&cms),
        leases: Some(&leases),
    };
    let (out, result) = run(None, watched, script).await;
    result.unwrap();
    assert_eq!(keys(&out.leases), BTreeSet::from(["b/lb".into()]));
    assert!(
        out.configmaps.is_empty(),
        "a/cm was not read: {:?}",
        out.configmaps
    );

    let script = vec![Expect::get("/api/v1/namespaces/a/pods")
        .query(TERMINAL)
        .status(403)];
    let (_, result) = run(Some("a"), watched, script).await;
    assert_eq!(result.unwrap_err().kind(), crate::ErrorKind::Forbidden);
}

/// A list of several pages follows its continue token; a token that
/// expired (410) lists again from the start, and what the first pages said
/// is forgotten.
#[tokio::test]
async fn pages_follow_the_continue_token_and_start_over_on_410() {
    let index = holders(&[
        lock("a", "l1", "p1"),
        lock("a", "l2", "p2"),
        lock("a", "l3", "p3"),
    ]);
    let page = |items: Vec<Value>, next: &str| {
        let mut l = list_of("PartialObjectMetadataList", items);
        l["metadata"]["continue"] = json!(next);
        Answer::Ok(l)
    };
    let all = "/api/v1/namespaces/a/pods";
    let script = vec![
        Expect::get(all).query(TERMINAL).answer(pods(vec![])),
        Expect::get(all).answer(page(vec![pod("a", "p1", "u-p1", "Running")], "t1")),
        Expect::get(all).query("continue=t1").status(410),
        Expect::get(all).answer(page(vec![pod("a", "p2", "u-p2", "Running")], "t2")),
        Expect::get(all)
            .query("continue=t2")
            .answer(pods(vec![pod("a", "p3", "u-p3", "Running")])),
    ];
    let watched = Watched {
        configmaps: Some(&index),
        leases: None,
    };
    let (out, result) = run(None, watched, script).await;
    result.unwrap();
    // p1 was seen only on the page listed before the start-over.
    assert_eq!(keys(&out.configmaps), BTreeSet::from(["a/l1".into()]));
}
