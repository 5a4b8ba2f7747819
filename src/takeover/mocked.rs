//! A follower's looks and the label carry-over, request by request, on a
//! mocked API server (`fixtures::ApiServer`): what one look at a gone
//! lock's name reads and concludes, and which guarded writes carry the
//! opt-in label over to the new lock.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;

use super::*;
use crate::fixtures::{
    cm_lock, lease_for_life, pod_owner, renewed_lease, Answer, ApiServer, Expect, HOLDER,
    HOLDER_UID,
};

const CM_PATH: &str = "/api/v1/namespaces/ops/configmaps/op-lock";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/op-lease";
/// The opt-in label's key as a JSON pointer names it.
const LABEL: &str = "/metadata/labels/lock-janitor.io~1watch";

/// The followers' shared parts on `client`, leading and synced.
fn followers(client: Client) -> Takeovers {
    let metrics = Metrics::new().unwrap();
    let readiness = Arc::new(Readiness::default());
    // No watch to wait for: synced at once.
    readiness.expect(0);
    let gate = Gate::always();
    Takeovers::new(
        client.clone(),
        gate.clone(),
        readiness,
        metrics.clone(),
        Events::new(client, metrics, gate),
        Settings {
            selector: Selector::parse(crate::DEFAULT_SELECTOR).unwrap(),
            dry_run: false,
            timeout: Duration::from_secs(300),
        },
    )
}

fn old() -> Holder {
    Holder {
        name: HOLDER.into(),
        uid: HOLDER_UID.into(),
    }
}

/// What a look concluded, in words.
fn said(look: Result<Look, crate::Error>) -> String {
    match look {
        Ok(Look::Waiting) => "waiting".into(),
        Ok(Look::Done(why)) => format!("done: {why}"),
        Ok(Look::Taken(t)) => {
            let new = match t.new {
                Some(New::ConfigMap(_)) => "a configmap to label",
                Some(New::Lease(_)) => "a lease to label",
                None => "nothing to label",
            };
            format!("taken by {}, {new}", t.holder.holder.name)
        }
        Err(e) => format!("error: {}", e.kind().as_str()),
    }
}

/// A ConfigMap lock made again by op-2, without the opt-in label.
fn made_again() -> ConfigMap {
    let mut cm = cm_lock();
    cm.metadata.owner_references = Some(vec![pod_owner("op-2", "op-2-uid")]);
    cm.metadata.labels = None;
    cm.metadata.uid = Some("new-uid".into());
    cm.metadata.resource_version = Some("11".into());
    cm
}

/// One look per answer, each a GET of the lock's name: nothing there (or
/// nobody holding it) waits; the same holder, or something that is not a
/// lock, ends the follow; a new holder is a takeover.
#[tokio::test]
async fn looks_at_a_gone_configmap_lock() {
    let mut with_data = made_again();
    with_data.data = Some([("k".to_string(), "v".to_string())].into());
    let mut two_owners = made_again();
    two_owners.metadata.owner_references =
        Some(vec![pod_owner("op-2", "a"), pod_owner("op-3", "b")]);
    let cases = [
        (Expect::get(CM_PATH).status(404), "waiting"),
        (Expect::get(CM_PATH).ok(&cm_lock()), "done: opted out"),
        (
            Expect::get(CM_PATH).ok(&made_again()),
            "taken by op-2, a configmap to label",
        ),
        (
            Expect::get(CM_PATH).ok(&with_data),
            "done: re-created with data: not a lock",
        ),
        (Expect::get(CM_PATH).ok(&two_owners), "done: not a lock"),
        (Expect::get(CM_PATH).status(500), "error: api"),
    ];
    let (script, want): (Vec<_>, Vec<_>) = cases.into_iter().unzip();
    let (client, server) = ApiServer::start(script);
    let t = followers(client);
    let key = LockKey::configmap("ops", "op-lock");
    let mut got = vec![];
    for _ in &want {
        got.push(said(look(&t.shared, &key, &old()).await));
    }
    server.finish().await;
    assert_eq!(got, want);
}

/// A Lease is released, not deleted: nobody holding it waits; the same
/// identity again ends the follow; another identity is a takeover (nothing
/// to label: a released Lease keeps its labels). A Lease held for life is
/// deleted and made again by its next holder: labeled.
#[tokio::test]
async fn looks_at_a_released_or_deleted_lease() {
    let released =
        crate::lock::lease::released(renewed_lease(Default::default()), Timestamp::now());
    let mut taken = renewed_lease(Default::default());
    taken.spec.as_mut().unwrap().holder_identity =
        Some("op-2_4b3c2d1e-aaaa-bbbb-cccc-0123456789ab".into());
    let mut for_life_again = lease_for_life();
    for_life_again.metadata.owner_references = Some(vec![pod_owner("op-2", "op-2-uid")]);
    for_life_again.spec.as_mut().unwrap().holder_identity = Some("op-2".into());
    let cases = [
        (Expect::get(LEASE_PATH).status(404), "waiting"),
        (Expect::get(LEASE_PATH).ok(&released), "waiting"),
        (
            Expect::get(LEASE_PATH).ok(&renewed_lease(Default::default())),
            "done: held again under the same identity",
        ),
        (
            Expect::get(LEASE_PATH).ok(&taken),
            "taken by op-2, nothing to label",
        ),
        (
            Expect::get(LEASE_PATH).ok(&lease_for_life()),
            "done: held again by the same pod",
        ),
        (
            Expect::get(LEASE_PATH).ok(&for_life_again),
            "taken by op-2, a lease to label",
        ),
    ];
    let (script, want): (Vec<_>, Vec<_>) = cases.into_iter().unzip();
    let (client, server) = ApiServer::start(script);
    let t = followers(client);
    let key = LockKey::lease("ops", "op-lease");
    let mut got = vec![];
    for _ in &want {
        got.push(said(look(&t.shared, &key, &old()).await));
    }
    server.finish().await;
    assert_eq!(got, want);
}

/// The label carried over to the new lock: one merge patch of the label
/// alone, guarded by the resourceVersion read. A 409 reads the lock again
/// and writes with the new version; a 404 means it is gone again (the
/// next holder is awaited).
#[tokio::test]
async fn the_label_is_carried_over_with_the_version_read() {
    let patch = |rv: &str| {
        Expect::patch(CM_PATH)
            .query("fieldManager=lock-janitor")
            .with(LABEL, json!("true"))
            .with("/metadata/resourceVersion", json!(rv))
    };
    let mut newer = made_again();
    newer.metadata.resource_version = Some("12".into());
    let script = vec![
        patch("11").status(409),
        Expect::get(CM_PATH).ok(&newer),
        patch("12").answer(Answer::Echo),
        patch("11").status(404),
    ];
    let (client, server) = ApiServer::start(script);
    let t = followers(client.clone());
    let key = LockKey::configmap("ops", "op-lock");
    let cms: Api<ConfigMap> = Api::namespaced(client, "ops");
    let labeled = carry::carry_label_over(&t.shared, &cms, &key, made_again(), "op-2").await;
    let gone = carry::carry_label_over(&t.shared, &cms, &key, made_again(), "op-2").await;
    let seen = server.finish().await;
    assert!(!labeled, "labeled, not gone");
    assert!(gone, "gone before its label was written");
    // The label and the version, nothing else of the lock.
    let body = &seen[0].body;
    assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
    assert_eq!(body["metadata"].as_object().unwrap().len(), 2, "{body}");
}

/// A new lock that opted out (the key with another value), or that is
/// not lock-shaped (a Lease now renewed), gets no write.
#[tokio::test]
async fn an_opted_out_or_renewed_lock_is_not_labeled() {
    let (client, server) = ApiServer::start(vec![]);
    let t = followers(client.clone());
    let mut opted_out = made_again();
    opted_out.metadata.labels = Some([("lock-janitor.io/watch".into(), "false".into())].into());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "ops");
    let key = LockKey::configmap("ops", "op-lock");
    assert!(!carry::carry_label_over(&t.shared, &cms, &key, opted_out, "op-2").await);
    let leases: Api<Lease> = Api::namespaced(client, "ops");
    let renewed = renewed_lease(Default::default());
    let key = LockKey::lease("ops", "op-lease");
    assert!(!carry::carry_label_over(&t.shared, &leases, &key, renewed, "op-2").await);
    server.finish().await;
}
