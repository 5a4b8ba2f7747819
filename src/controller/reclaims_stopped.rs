//! The holder's read right before the freeing write (`holder_again`, safety
//! rule 1) failing, on a mocked API server (`fixtures::ApiServer`), as
//! `mocked.rs` tests the other answers: refused (500) or unanswered (the
//! janitor's own timeout, on tokio's paused clock), the write is not made,
//! `StaleLockReclaimStopped` says so on the lock, and the error is the
//! reconcile's. A file of its own so that `mocked.rs` does not grow; the
//! few helpers it needs are its own. `cargo test --lib reclaim`.

use std::time::Duration;

use k8s_openapi::jiff::SignedDuration;
use serde_json::Value;

use super::{Context, Settings};
use crate::decide;
use crate::events::{REASON_RECLAIMED, REASON_RECLAIMING, REASON_STOPPED};
use crate::fixtures::{
    cm_lock, evicted_pod, lease_for_life, list_of, record_lock, renewed_lease, to_json, Answer,
    ApiServer, Expect,
};
use crate::lock::{LockKey, LockKind};
use crate::observe::LockAge;
use crate::reclaim::*;
use crate::selector::Selector;
use crate::shared::Shared;
use crate::verdict::Policy;
use crate::verdict::{StaleReason, Verdict};
use crate::Error;
use kube::Client;

const CM_PATH: &str = "/api/v1/namespaces/ops/configmaps/op-lock";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/op-lease";
const POD_PATH: &str = "/api/v1/namespaces/ops/pods/op-1";
const PODS_PATH: &str = "/api/v1/namespaces/ops/pods";
const RECORD_PATH: &str = "/api/v1/namespaces/ops/configmaps/op-record";

/// Each kind of lock (a ConfigMap held for life, a Lease held for life, a
/// renewed Lease and a ConfigMap's leader record last renewed 570 s ago,
/// past 5/6 of their 600 s), its path and the live reads its judgement
/// makes before the intent Event.
fn kinds() -> Vec<(&'static str, LockKey, Vec<Expect>)> {
    let pod = evicted_pod();
    let by_name = |path: &str, lock: Value| {
        vec![
            Expect::get(path).answer(Answer::Ok(lock)),
            Expect::get(POD_PATH).ok(&pod),
        ]
    };
    vec![
        (
            "configmap",
            LockKey::configmap("ops", "op-lock"),
            by_name(CM_PATH, to_json(&cm_lock())),
        ),
        (
            "lease held for life",
            LockKey::lease("ops", "op-lease"),
            by_name(LEASE_PATH, to_json(&lease_for_life())),
        ),
        (
            "renewed lease",
            LockKey::lease("ops", "op-lease"),
            vec![
                Expect::get(LEASE_PATH).answer(Answer::Ok(to_json(&renewed_lease(
                    SignedDuration::from_secs(570),
                )))),
                Expect::get(PODS_PATH)
                    .query("limit=100")
                    .answer(Answer::Ok(list_of("PodList", vec![to_json(&pod)]))),
            ],
        ),
        (
            "leader record",
            LockKey::configmap("ops", "op-record"),
            vec![
                Expect::get(RECORD_PATH).answer(Answer::Ok(to_json(&record_lock(
                    SignedDuration::from_secs(570),
                )))),
                Expect::get(PODS_PATH)
                    .query("limit=100")
                    .answer(Answer::Ok(list_of("PodList", vec![to_json(&pod)]))),
            ],
        ),
    ]
}

/// A janitor that leads (no election) and writes, wired as `run` wires it.
fn janitor(client: Client) -> (std::sync::Arc<Context>, Shared) {
    let shared = Shared::new().unwrap();
    // No watch to wait for: synced at once.
    shared.readiness.expect(0);
    let settings = Settings {
        kinds: vec![LockKind::ConfigMap, LockKind::Lease],
        selector: Selector::parse(crate::DEFAULT_SELECTOR).unwrap(),
        namespaces: vec![],
        dry_run: false,
        delete_pod: false,
        policy: Policy {
            owner_gone_grace: Duration::from_secs(30),
        },
        resync: Duration::from_secs(300),
        takeover_timeout: Duration::from_secs(300),
    };
    (Context::new(client, shared.clone(), settings), shared)
}

/// The holder judged dead, the intent Event written, then the holder's GET
/// right before the write refused (500) or never answered: no freeing
/// write (the script ends with the Event, and a request after it fails
/// the test at `finish`), `StaleLockReclaimStopped` on the lock, nothing
/// counted as reclaimed, and the read's error returned to the reconcile
/// (which judges the lock again after its backoff).
#[tokio::test(start_paused = true)]
async fn a_holder_read_again_that_fails_gets_no_write_and_a_stopped_event() {
    for (answer, error) in [
        (Answer::Status(500), crate::ErrorKind::Api),
        (Answer::Hang, crate::ErrorKind::Timeout),
    ] {
        for (kind, key, reads) in kinds() {
            let mut script = reads;
            script.push(Expect::event("ops", REASON_RECLAIMING));
            script.push(Expect::get(POD_PATH).answer(answer.clone()));
            script.push(Expect::event("ops", REASON_STOPPED));
            let (client, server) = ApiServer::start(script);
            let (ctx, shared) = janitor(client);
            let j = ctx
                .observer
                .judge_live(&key, &mut LockAge)
                .await
                .unwrap()
                .expect("the lock is there");
            assert!(
                matches!(
                    j.verdict,
                    Verdict::Stale {
                        reason: StaleReason::Evicted,
                        ..
                    }
                ),
                "{kind}: {:?}",
                j.verdict
            );
            assert_eq!(
                decide::step(&j.verdict, &decide::State::default(), &j.version()),
                decide::Step::Reclaim,
                "{kind}"
            );
            let (done, err) = ctx.reclaimer.reclaim(&j, |_| false).await;
            let seen = server.finish().await;
            assert_eq!(done.freed, Some(Freed::Failed), "{kind} {answer:?}");
            assert_eq!(
                err.as_ref().map(Error::kind),
                Some(error),
                "{kind} {answer:?}: {err:?}"
            );
            // No write of any kind: only reads and the two Events.
            let writes: Vec<String> = seen
                .iter()
                .filter(|s| s.method != http::Method::GET)
                .map(|s| format!("{} {} {}", s.method, s.path, s.body["reason"]))
                .collect();
            assert_eq!(writes.len(), 2, "{kind} {answer:?}: {writes:?}");
            let stopped = &seen.last().unwrap().body;
            assert_eq!(stopped["reason"], REASON_STOPPED, "{kind} {answer:?}");
            let note = stopped["note"].as_str().unwrap_or_default();
            assert!(
                note.starts_with("Nothing written: the holder could not be read again"),
                "{kind} {answer:?}: {note}"
            );
            let reclaimed = shared
                .metrics
                .reclaims_by_reason
                .with_label_values(&[key.kind.as_str(), "Evicted"])
                .get();
            assert_eq!(reclaimed, 0, "{kind} {answer:?}");
            assert!(
                seen.iter().all(|s| s.body["reason"] != REASON_RECLAIMED),
                "{kind} {answer:?}"
            );
        }
    }
}
