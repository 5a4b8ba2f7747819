//! Every freeing write, request by request, on a mocked API server
//! (`fixtures::ApiServer`): for each kind (a ConfigMap lock, a Lease held
//! for life, a renewed Lease, a ConfigMap's leader record annotation) and for the dead pod (`--delete-pod`), the
//! exact requests the janitor sends, in order, and what it concludes when
//! the answer is 200, 404, 409, none at all, a connection broken after the
//! write, a finalizer, or a live read that is not what was watched. No
//! control plane: `cargo test --lib reclaim` (or `make test-fast`).

use std::sync::Arc;

use http::Method;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::core::PartialObjectMetaExt;
use kube::Client;
use serde_json::{json, Value};

use crate::controller::{self, Context, LockMeta, Settings};
use crate::decide;
use crate::events::{
    REASON_AMBIGUOUS, REASON_BLOCKED, REASON_DETECTED, REASON_POD_DELETED, REASON_RECLAIMED,
    REASON_RECLAIMING, REASON_STOPPED, REASON_UNMANAGEABLE,
};
use crate::fixtures::{
    cm_lock, evicted_pod, holder_pod, lease_for_life, list_of, record_lock, renewed_lease, to_json,
    Answer, ApiServer, Expect, Seen, HOLDER_UID,
};
use crate::kinds::annotation::record::ANNOTATION;
use crate::lock::LockKey;
use crate::observe::LockAge;
use crate::reclaim::*;
use crate::selector::Selector;
use crate::shared::Shared;
use crate::verdict::{self, StaleReason, Verdict};
use crate::verdict::{HeldBecause, Policy};
use crate::Error;
use std::time::Duration;

const CM_PATH: &str = "/api/v1/namespaces/ops/configmaps/op-lock";
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/op-lease";
const RECORD_PATH: &str = "/api/v1/namespaces/ops/configmaps/op-record";
const POD_PATH: &str = "/api/v1/namespaces/ops/pods/op-1";
const PODS_PATH: &str = "/api/v1/namespaces/ops/pods";

/// The three kinds of lock, each freed its own way.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Deleted, with uid and resourceVersion preconditions.
    ConfigMap,
    /// Deleted as a ConfigMap lock is.
    LeaseForLife,
    /// Released: an update of the very object read.
    Lease,
    /// Released: a merge patch of its leader record annotation, carrying
    /// the resourceVersion read.
    Record,
}

const KINDS: [Kind; 4] = [
    Kind::ConfigMap,
    Kind::LeaseForLife,
    Kind::Lease,
    Kind::Record,
];
/// The kinds freed by a DELETE (finalizers can keep them).
const DELETED_KINDS: [Kind; 2] = [Kind::ConfigMap, Kind::LeaseForLife];

impl Kind {
    fn key(self) -> LockKey {
        match self {
            Kind::ConfigMap => LockKey::configmap("ops", "op-lock"),
            Kind::LeaseForLife | Kind::Lease => LockKey::lease("ops", "op-lease"),
            Kind::Record => LockKey::configmap("ops", "op-record"),
        }
    }

    fn path(self) -> &'static str {
        match self {
            Kind::ConfigMap => CM_PATH,
            Kind::LeaseForLife | Kind::Lease => LEASE_PATH,
            Kind::Record => RECORD_PATH,
        }
    }

    fn uid(self) -> &'static str {
        match self {
            Kind::ConfigMap => "cm-uid",
            Kind::LeaseForLife | Kind::Lease => "lease-uid",
            Kind::Record => "record-uid",
        }
    }

    /// The lock as the API server holds it (resourceVersion 7), held by
    /// op-1, which died 560 s ago (`evicted_pod`): a renewed Lease was last
    /// renewed 570 s ago, within its 600 s lease and past 5/6 of it, so
    /// that it is stale on the times alone (nothing watched it renew).
    fn live(self) -> Value {
        match self {
            Kind::ConfigMap => to_json(&cm_lock()),
            Kind::LeaseForLife => to_json(&lease_for_life()),
            Kind::Lease => to_json(&renewed_lease(SignedDuration::from_secs(570))),
            Kind::Record => to_json(&record_lock(SignedDuration::from_secs(570))),
        }
    }

    /// The lock as live, with this resourceVersion.
    fn live_at(self, resource_version: &str) -> Value {
        let mut v = self.live();
        v["metadata"]["resourceVersion"] = json!(resource_version);
        v
    }

    fn is_deleted(self) -> bool {
        !self.is_renewed()
    }

    /// Judged by renewals: its holder identity names a host, and the pods
    /// of its namespace are listed.
    fn is_renewed(self) -> bool {
        matches!(self, Kind::Lease | Kind::Record)
    }
}

// --- the request sequences ------------------------------------------------------

/// The live reads a judgement makes: the lock, then its holder. A lock
/// held by a pod by name and uid reads the pod by name; a missing one is
/// looked for in other namespaces by uid (`holder_elsewhere`), then read
/// again (the last read before a write). A renewed Lease names a host:
/// the pods of its namespace are listed.
fn reads(kind: Kind, lock: Value, holder: Option<&Pod>) -> Vec<Expect> {
    let mut s = vec![Expect::get(kind.path()).answer(Answer::Ok(lock))];
    match (kind, holder) {
        (kind, holder) if kind.is_renewed() => {
            let items = holder.map(to_json).into_iter().collect();
            s.push(
                Expect::get(PODS_PATH)
                    .query("limit=100")
                    .answer(Answer::Ok(list_of("PodList", items))),
            );
        }
        (_, Some(pod)) => s.push(Expect::get(POD_PATH).ok(pod)),
        (_, None) => s.extend([
            Expect::get(POD_PATH).status(404),
            Expect::get("/api/v1/pods")
                .query("fieldSelector=metadata.name%3Dop-1")
                .answer(Answer::Ok(list_of("PartialObjectMetadataList", vec![]))),
            Expect::get(POD_PATH).status(404),
        ]),
    }
    s
}

/// Everything before a freeing write, in order: the live reads (`reads`),
/// the intent Event (`StaleLockReclaiming`), then the holder read again by
/// name, the last request before the write (it must still be the judged
/// pod and dead, or still absent for `OwnerGone`; answered here as the
/// judgement's read was). Every test of a write starts with this one
/// sequence: a change to what comes before the write is made here and
/// nowhere else.
fn prelude(kind: Kind, lock: Value, holder: Option<&Pod>) -> Vec<Expect> {
    let mut s = reads(kind, lock, holder);
    s.push(Expect::event("ops", REASON_RECLAIMING));
    s.push(holder_read_again(holder));
    s
}

/// The holder read by name again after the intent Event, found as `holder`.
fn holder_read_again(holder: Option<&Pod>) -> Expect {
    match holder {
        Some(pod) => Expect::get(POD_PATH).ok(pod),
        None => Expect::get(POD_PATH).status(404),
    }
}

/// The freeing write of the lock judged at (`uid`, `resource_version`): a
/// DELETE carrying both as preconditions, or a Lease release, the whole
/// object read with its resourceVersion (holder emptied, a one-second
/// lease, its transitions kept). Answered as the API server answers a
/// write that went through.
fn freeing_write(kind: Kind, uid: &str, resource_version: &str) -> Expect {
    if kind.is_deleted() {
        return Expect::delete(kind.path())
            .with(
                "/preconditions",
                json!({"uid": uid, "resourceVersion": resource_version}),
            )
            .answer(Answer::Ok(json!({
                "kind": "Status", "apiVersion": "v1", "status": "Success",
            })));
    }
    if kind == Kind::Record {
        // The annotation alone, to the released record; the resourceVersion
        // read makes the patch conditional (409 if it changed since).
        let annotation = |v: Value| v["metadata"]["annotations"][ANNOTATION].clone();
        let judged = annotation(kind.live());
        let released =
            crate::kinds::annotation::record::released(judged.as_str().unwrap()).unwrap();
        return Expect::patch(RECORD_PATH)
            .with("/metadata/resourceVersion", json!(resource_version))
            .with("/metadata/annotations", json!({ ANNOTATION: released }))
            .answer(Answer::Echo);
    }
    Expect::put(LEASE_PATH)
        .with("/metadata/uid", json!(uid))
        .with("/metadata/resourceVersion", json!(resource_version))
        .with("/spec/holderIdentity", json!(""))
        .with("/spec/leaseDurationSeconds", json!(1))
        .with("/spec/leaseTransitions", json!(3))
        // The rest of the object as read: its annotations too.
        .with("/metadata/annotations/team", json!("ops"))
        .answer(Answer::Echo)
}

/// The write of the lock as `Kind::live` has it.
fn write_of(kind: Kind) -> Expect {
    freeing_write(kind, kind.uid(), "7")
}

/// The dead holder's DELETE (`--delete-pod`): its uid as the precondition.
fn pod_delete() -> Expect {
    Expect::delete(POD_PATH).with("/preconditions", json!({"uid": HOLDER_UID}))
}

/// A release's times: acquireTime = renewTime, both just written.
fn assert_release_times(seen: &[Seen]) {
    let put = seen
        .iter()
        .find(|s| s.method == Method::PUT)
        .expect("a release");
    let spec = &put.body["spec"];
    assert_eq!(spec["acquireTime"], spec["renewTime"], "{spec}");
    let renewed: Timestamp = spec["renewTime"].as_str().unwrap().parse().unwrap();
    let ago = Timestamp::now().duration_since(renewed);
    assert!(
        ago < SignedDuration::from_secs(60),
        "renewTime is now: {renewed}"
    );
    assert!(spec.get("strategy").is_none() && spec.get("preferredHolder").is_none());
}

// --- the janitor under test -----------------------------------------------------

/// A janitor on `client` that leads (no election) in `mode`, wired as
/// `run` wires it, and its metrics.
fn janitor(client: Client, mode: Mode) -> (Arc<Context>, Shared) {
    janitor_in(client, mode, vec![])
}

/// As `janitor`, writing only while `gate` allows it.
fn janitor_gated(client: Client, gate: crate::election::Gate) -> Arc<Context> {
    let (ctx, shared) = janitor(client, WRITE);
    Context::with_gate(ctx.client.clone(), shared, ctx.settings.clone(), gate)
}

/// As `janitor`, watching only `namespaces` (`--namespace`).
fn janitor_in(client: Client, mode: Mode, namespaces: Vec<String>) -> (Arc<Context>, Shared) {
    let shared = Shared::new().unwrap();
    // No watch to wait for: synced at once.
    shared.readiness.expect(0);
    let settings = Settings {
        kinds: vec![
            crate::lock::LockKind::ConfigMap,
            crate::lock::LockKind::Lease,
        ],
        selector: Selector::parse(crate::DEFAULT_SELECTOR).unwrap(),
        namespaces,
        dry_run: mode.dry_run,
        delete_pod: mode.delete_pod,
        policy: Policy {
            owner_gone_grace: Duration::from_secs(30),
        },
        resync: Duration::from_secs(300),
        takeover_timeout: Duration::from_secs(300),
    };
    (Context::new(client, shared.clone(), settings), shared)
}

/// The janitor's modes: it writes; it also deletes the dead pod
/// (`--delete-pod`); it writes nothing but Events (`--dry-run`).
const WRITE: Mode = Mode {
    dry_run: false,
    delete_pod: false,
};
const DELETE_POD: Mode = Mode {
    dry_run: false,
    delete_pod: true,
};
const DRY_RUN: Mode = Mode {
    dry_run: true,
    delete_pod: true,
};

/// What one judgement and its write came to.
#[derive(Debug)]
struct Outcome {
    /// `None`: the lock is gone (or no longer opted in).
    verdict: Option<Verdict>,
    done: Done,
    error: Option<Error>,
}

impl Outcome {
    fn freed(&self) -> Option<&Freed> {
        self.done.freed.as_ref()
    }
}

/// What a reconcile does once it takes a lock: judge it from live reads,
/// then write what the decision calls for (a report, or the reclaim).
/// The holder's missing clock is the lock's age (`LockAge`, as `scan`'s):
/// the lock is days old, past any owner-gone grace.
async fn judge_and_write(ctx: &Context, key: &LockKey) -> Outcome {
    let j = match ctx.observer.judge_live(key, &mut LockAge).await {
        Ok(Some(j)) => j,
        Ok(None) => {
            return Outcome {
                verdict: None,
                done: Done::default(),
                error: None,
            }
        }
        Err(e) => {
            return Outcome {
                verdict: None,
                done: Done::default(),
                error: Some(e),
            }
        }
    };
    let (done, error) = match decide::step(&j.verdict, &decide::State::default(), &j.version()) {
        decide::Step::Nothing => (Done::default(), None),
        decide::Step::Report(reason) => {
            let said = ctx.reclaimer.report_untouchable(&j).await.then_some(reason);
            (Done { freed: None, said }, None)
        }
        decide::Step::Reclaim => ctx.reclaimer.reclaim(&j, |_| false).await,
    };
    Outcome {
        verdict: Some(j.verdict),
        done,
        error,
    }
}

/// Runs one judgement and its write against `script`: its outcome and the
/// requests received (every one expected, in order, and no other).
async fn run(kind: Kind, mode: Mode, script: Vec<Expect>) -> (Outcome, Vec<Seen>, Shared) {
    let (client, server) = ApiServer::start(script);
    let (ctx, shared) = janitor(client, mode);
    let outcome = judge_and_write(&ctx, &kind.key()).await;
    let seen = server.finish().await;
    (outcome, seen, shared)
}

fn reclaims(shared: &Shared, kind: Kind) -> u64 {
    let kind = kind.key().kind.as_str();
    shared
        .metrics
        .reclaims_by_reason
        .with_label_values(&[kind, "Evicted"])
        .get()
}

fn errors(shared: &Shared, kind: crate::ErrorKind) -> u64 {
    shared
        .metrics
        .reconcile_errors
        .with_label_values(&[kind.as_str()])
        .get()
}

/// The verdict on `pod` (the evicted holder a test's script answered
/// with: built once, so that its death time is the one judged).
fn evicted(pod: &Pod) -> Verdict {
    Verdict::Stale {
        reason: StaleReason::Evicted,
        died_at: verdict::last_finished(pod),
    }
}

// --- the answers to the freeing write -------------------------------------------

/// 200: freed, said (StaleLockReclaimed, after the write) and counted.
#[tokio::test]
async fn a_write_that_goes_through_frees_says_and_counts() {
    for kind in KINDS {
        let pod = evicted_pod();
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind));
        script.push(Expect::event("ops", REASON_RECLAIMED));
        let (out, seen, shared) = run(kind, WRITE, script).await;
        assert_eq!(out.verdict, Some(evicted(&pod)), "{kind:?}");
        assert!(
            matches!(out.freed(), Some(Freed::Reclaimed { .. })),
            "{kind:?}: {out:?}"
        );
        assert!(out.error.is_none() && out.done.said.is_none(), "{kind:?}");
        assert_eq!(reclaims(&shared, kind), 1, "{kind:?}");
        if kind == Kind::Lease {
            assert_release_times(&seen);
        }
    }
}

/// 404: someone else freed it first. Fine: nothing more is written,
/// nothing is counted as reclaimed, no error.
#[tokio::test]
async fn a_404_means_someone_else_freed_it() {
    for kind in KINDS {
        let pod = evicted_pod();
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind).status(404));
        let (out, _, shared) = run(kind, WRITE, script).await;
        assert_eq!(out.freed(), Some(&Freed::Gone), "{kind:?}");
        assert!(out.error.is_none(), "{kind:?}");
        assert_eq!(reclaims(&shared, kind), 0, "{kind:?}");
    }
}

/// 409: the lock changed since it was read. Never retried blindly (the
/// script ends with the one write: a second would fail it); judged again.
#[tokio::test]
async fn a_409_is_judged_again_never_retried() {
    for kind in KINDS {
        let pod = evicted_pod();
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind).status(409));
        script.push(Expect::event("ops", REASON_STOPPED));
        let (out, _, shared) = run(kind, WRITE, script).await;
        assert!(
            matches!(out.freed(), Some(Freed::Changed(_))),
            "{kind:?}: {out:?}"
        );
        assert!(out.error.is_none(), "{kind:?}");
        assert_eq!(reclaims(&shared, kind), 0, "{kind:?}");
    }
}

/// No answer: the janitor's own timeout (`API_TIMEOUT`, on tokio's paused
/// clock) ends the write. No success is claimed: no StaleLockReclaimed
/// Event, nothing counted, the error returned.
#[tokio::test(start_paused = true)]
async fn a_write_without_an_answer_claims_nothing() {
    for kind in KINDS {
        let pod = evicted_pod();
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind).answer(Answer::Hang));
        let (out, _, shared) = run(kind, WRITE, script).await;
        assert_eq!(out.freed(), Some(&Freed::Failed), "{kind:?}");
        assert!(
            matches!(out.error, Some(Error::Timeout { .. })),
            "{kind:?}: {out:?}"
        );
        assert_eq!(reclaims(&shared, kind), 0, "{kind:?}");
    }
}

/// The write went through but its answer was lost (the connection broke):
/// no success is claimed; the next judgement reads the lock live, finds it
/// gone (or released), and writes nothing more.
#[tokio::test]
async fn an_answer_lost_after_the_write_is_found_out_by_the_next_read() {
    for kind in KINDS {
        let pod = evicted_pod();
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind).answer(Answer::Broken));
        let (client, server) = ApiServer::start(script);
        let (ctx, shared) = janitor(client, WRITE);
        let out = judge_and_write(&ctx, &kind.key()).await;
        server.finish().await;
        assert_eq!(out.freed(), Some(&Freed::Failed), "{kind:?}");
        assert!(
            matches!(
                &out.error,
                Some(Error::Kube {
                    source: kube::Error::Service(_),
                    ..
                })
            ),
            "{kind:?}: {out:?}"
        );
        assert_eq!(reclaims(&shared, kind), 0, "{kind:?}");

        // The next look, as the retry makes it: the write had been made.
        let now = if kind.is_deleted() {
            Expect::get(kind.path()).status(404)
        } else if kind == Kind::Record {
            let mut cm = kind.live_at("8");
            let judged = cm["metadata"]["annotations"][ANNOTATION].clone();
            let released = crate::kinds::annotation::record::released(judged.as_str().unwrap());
            cm["metadata"]["annotations"][ANNOTATION] = json!(released.unwrap());
            Expect::get(RECORD_PATH).answer(Answer::Ok(cm))
        } else {
            let lease = crate::lock::lease::released(
                serde_json::from_value(kind.live_at("8")).unwrap(),
                Timestamp::now(),
            );
            Expect::get(LEASE_PATH).ok(&lease)
        };
        let (client, server) = ApiServer::start(vec![now]);
        let (ctx, _) = janitor(client, WRITE);
        let again = judge_and_write(&ctx, &kind.key()).await;
        server.finish().await;
        let expected = (!kind.is_deleted()).then_some(Verdict::Held(HeldBecause::Released));
        assert_eq!(again.verdict, expected, "{kind:?}");
        assert!(again.freed().is_none() && again.error.is_none(), "{kind:?}");
    }
}

/// A DELETE answered with the object, deletionTimestamp set and finalizers
/// left: it is not freed (a waiting replica still cannot take over), and
/// says so (LockDeletionBlocked), not StaleLockReclaimed.
#[tokio::test]
async fn a_delete_kept_by_finalizers_is_not_a_reclaim() {
    for kind in DELETED_KINDS {
        let pod = evicted_pod();
        let mut kept = kind.live_at("8");
        kept["metadata"]["deletionTimestamp"] = json!("2026-12-06T20:00:00Z");
        kept["metadata"]["finalizers"] = json!(["example.com/keep"]);
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind).answer(Answer::Ok(kept)));
        script.push(Expect::event("ops", REASON_BLOCKED));
        let (out, _, shared) = run(kind, WRITE, script).await;
        assert_eq!(
            out.done,
            Done {
                freed: Some(Freed::Blocked(vec!["example.com/keep".into()])),
                said: Some(REASON_BLOCKED),
            },
            "{kind:?}"
        );
        assert_eq!(reclaims(&shared, kind), 0, "{kind:?}");
    }
}

/// A lock read live already being deleted (finalizers keep it): another
/// DELETE changes nothing, so none is sent, nor an intent Event; it is
/// reported once (LockDeletionBlocked).
#[tokio::test]
async fn a_lock_already_being_deleted_gets_no_second_delete() {
    for kind in DELETED_KINDS {
        let pod = evicted_pod();
        let mut live = kind.live();
        live["metadata"]["deletionTimestamp"] = json!("2026-12-06T20:00:00Z");
        live["metadata"]["finalizers"] = json!(["example.com/keep"]);
        let mut script = reads(kind, live, Some(&pod));
        script.push(Expect::event("ops", REASON_BLOCKED));
        let (out, _, _) = run(kind, WRITE, script).await;
        assert_eq!(
            out.freed(),
            Some(&Freed::Blocked(vec!["example.com/keep".into()])),
            "{kind:?}"
        );
    }
}

// --- live reads that differ from what was watched ---------------------------------

/// The write is guarded by the lock as read live, never as watched: a lock
/// made again under its name (another uid) at another resourceVersion is
/// written with that uid and version (the API server's 409 then judges
/// anything newer).
#[tokio::test]
async fn the_write_carries_what_the_live_read_found() {
    for kind in KINDS {
        let pod = evicted_pod();
        let mut live = kind.live_at("9");
        live["metadata"]["uid"] = json!("made-again");
        let mut script = prelude(kind, live, Some(&pod));
        script.push(freeing_write(kind, "made-again", "9").status(409));
        script.push(Expect::event("ops", REASON_STOPPED));
        let (out, _, _) = run(kind, WRITE, script).await;
        assert!(
            matches!(out.freed(), Some(Freed::Changed(_))),
            "{kind:?}: {out:?}"
        );
    }
}

/// The holder read live runs again (the watch said it died): held, and
/// nothing is written, not even an Event.
#[tokio::test]
async fn a_holder_running_again_gets_no_write() {
    for kind in KINDS {
        let running = holder_pod("Running", None, SignedDuration::ZERO);
        let script = reads(kind, kind.live(), Some(&running));
        let (out, _, _) = run(kind, WRITE, script).await;
        assert_eq!(
            out.verdict,
            Some(Verdict::Held(HeldBecause::Phase("Running".into()))),
            "{kind:?}"
        );
        assert_eq!(out.done, Done::default(), "{kind:?}");
    }
}

/// A pod of the holder's name with another uid (a StatefulSet pod made
/// again): ambiguous, reported, never written.
#[tokio::test]
async fn a_holder_made_again_is_reported_not_written() {
    for kind in DELETED_KINDS {
        let mut other = evicted_pod();
        other.metadata.uid = Some("another-uid".into());
        let mut script = reads(kind, kind.live(), Some(&other));
        script.push(Expect::event("ops", REASON_AMBIGUOUS));
        let (out, _, _) = run(kind, WRITE, script).await;
        assert_eq!(
            out.verdict,
            Some(Verdict::Ambiguous {
                other_uid: "another-uid".into()
            }),
            "{kind:?}"
        );
        assert_eq!(out.done.said, Some(REASON_AMBIGUOUS), "{kind:?}");
        assert!(out.freed().is_none(), "{kind:?}");
    }
}

/// A renewed Lease whose live copy names another holder, which runs: held,
/// never released (the watched copy named the dead one).
#[tokio::test]
async fn a_lease_taken_by_another_holder_gets_no_write() {
    let mut live = Kind::Lease.live_at("9");
    live["spec"]["holderIdentity"] = json!("op-2");
    live["spec"]["renewTime"] = json!(Timestamp::now().to_string());
    let mut op2 = holder_pod("Running", None, SignedDuration::ZERO);
    op2.metadata.name = Some("op-2".into());
    op2.metadata.uid = Some("op-2-uid".into());
    let script = reads(Kind::Lease, live, Some(&op2));
    let (out, _, _) = run(Kind::Lease, WRITE, script).await;
    assert_eq!(
        out.verdict,
        Some(Verdict::Held(HeldBecause::Phase("Running".into())))
    );
    assert_eq!(out.done, Done::default());
}

/// The holder as read again after the intent Event is not the one judged
/// (a pod made again under its name, or one that runs, or a holder judged
/// gone that is there again): nothing is written, and the lock is judged
/// again (`Freed::Changed`).
#[tokio::test]
async fn a_holder_changed_after_the_intent_event_gets_no_write() {
    let mut made_again = evicted_pod();
    made_again.metadata.uid = Some("another-uid".into());
    let running = holder_pod("Running", None, SignedDuration::ZERO);
    for kind in KINDS {
        for (judged, again) in [
            (Some(evicted_pod()), Some(&made_again)),
            (Some(evicted_pod()), Some(&running)),
            (Some(evicted_pod()), None),
        ] {
            let mut script = prelude(kind, kind.live(), judged.as_ref());
            *script.last_mut().unwrap() = holder_read_again(again);
            script.push(Expect::event("ops", REASON_STOPPED));
            let (out, _, shared) = run(kind, WRITE, script).await;
            assert!(
                matches!(out.freed(), Some(Freed::Changed(_))),
                "{kind:?}, read again as {again:?}: {out:?}"
            );
            assert_eq!(reclaims(&shared, kind), 0, "{kind:?}");
        }
    }
    for kind in DELETED_KINDS {
        let mut script = prelude(kind, kind.live(), None);
        *script.last_mut().unwrap() = holder_read_again(Some(&running));
        script.push(Expect::event("ops", REASON_STOPPED));
        let (out, _, _) = run(kind, WRITE, script).await;
        assert!(
            matches!(out.freed(), Some(Freed::Changed(_))),
            "{kind:?}, gone, then there again: {out:?}"
        );
    }
}

/// A Lease watched as held for life that is renewed when read live is a
/// renewed Lease: never deleted. Here it was renewed after its holder
/// died, so nothing is written at all.
#[tokio::test]
async fn a_lease_for_life_renewed_since_is_never_deleted() {
    let pod = evicted_pod();
    let mut live = Kind::Lease.live_at("9");
    live["metadata"]["ownerReferences"] =
        to_json(&lease_for_life())["metadata"]["ownerReferences"].clone();
    live["spec"]["renewTime"] = json!(Timestamp::now().to_string());
    let script = reads(Kind::Lease, live, Some(&pod));
    let (out, _, _) = run(Kind::LeaseForLife, WRITE, script).await;
    assert_eq!(
        out.verdict,
        Some(Verdict::Held(HeldBecause::RenewedAfterDeath))
    );
    assert_eq!(out.done, Done::default());
}

/// A holder gone (no pod of its name, none of its uid elsewhere) past the
/// grace: freed as a dead one is, after the searches (`reads`).
#[tokio::test]
async fn a_holder_gone_is_freed_after_the_last_read() {
    for kind in DELETED_KINDS {
        let mut script = prelude(kind, kind.live(), None);
        script.push(write_of(kind));
        script.push(Expect::event("ops", REASON_RECLAIMED));
        let (out, _, shared) = run(kind, WRITE, script).await;
        assert!(
            matches!(
                out.verdict,
                Some(Verdict::Stale {
                    reason: StaleReason::OwnerGone,
                    ..
                })
            ),
            "{kind:?}: {out:?}"
        );
        assert!(
            matches!(out.freed(), Some(Freed::Reclaimed { .. })),
            "{kind:?}"
        );
        let kind_label = if kind == Kind::ConfigMap {
            "configmap"
        } else {
            "lease"
        };
        let counted = shared
            .metrics
            .reclaims_by_reason
            .with_label_values(&[kind_label, "OwnerGone"])
            .get();
        assert_eq!(counted, 1, "{kind:?}");
    }
}

/// A holder missing from the lock's namespace but alive in another one
/// (found by its uid): an owner reference across namespaces, which
/// Kubernetes does not allow. Unmanageable: reported, never written. An
/// install that may not list pods cluster-wide (403) looks in the
/// namespaces it watches.
#[tokio::test]
async fn a_holder_in_another_namespace_is_reported_never_written() {
    let elsewhere = json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"namespace": "other", "name": "op-1", "uid": HOLDER_UID},
    });
    let found = Answer::Ok(list_of("PartialObjectMetadataList", vec![elsewhere]));
    let unmanageable = Some(Verdict::Unmanageable(
        crate::lock::Unmanageable::OwnerInOtherNamespace("other".into()),
    ));
    for kind in DELETED_KINDS {
        for refused in [false, true] {
            let mut script = vec![
                Expect::get(kind.path()).answer(Answer::Ok(kind.live())),
                Expect::get(POD_PATH).status(404),
            ];
            let by_name = "fieldSelector=metadata.name%3Dop-1";
            if refused {
                script.push(Expect::get("/api/v1/pods").query(by_name).status(403));
                script.push(
                    Expect::get("/api/v1/namespaces/other/pods")
                        .query(by_name)
                        .answer(found.clone()),
                );
            } else {
                script.push(
                    Expect::get("/api/v1/pods")
                        .query(by_name)
                        .answer(found.clone()),
                );
            }
            script.push(Expect::event("ops", REASON_UNMANAGEABLE));
            let (client, server) = ApiServer::start(script);
            let (ctx, _) = janitor_in(client, WRITE, vec!["ops".into(), "other".into()]);
            let out = judge_and_write(&ctx, &kind.key()).await;
            server.finish().await;
            assert_eq!(out.verdict, unmanageable, "{kind:?}, refused: {refused}");
            assert_eq!(out.done.said, Some(REASON_UNMANAGEABLE), "{kind:?}");
            assert!(out.freed().is_none(), "{kind:?}");
        }
    }
}

/// Live reads that end the judgement before any write: the lock gone
/// (404), its live copy no longer opted in, a ConfigMap that holds data
/// (reported), a read refused (500) or unanswered (the paused clock runs
/// out the timeout). Nothing is written, and an error is returned as such.
#[tokio::test(start_paused = true)]
async fn live_reads_that_end_in_no_write() {
    for kind in KINDS {
        let mut opted_out = kind.live();
        opted_out["metadata"]["labels"] = json!({"lock-janitor.io/watch": "false"});
        for (script, gone) in [
            (vec![Expect::get(kind.path()).status(404)], true),
            (
                vec![Expect::get(kind.path()).answer(Answer::Ok(opted_out))],
                true,
            ),
        ] {
            let (out, _, _) = run(kind, WRITE, script).await;
            assert_eq!(out.verdict.is_none(), gone, "{kind:?}: {out:?}");
            assert!(out.error.is_none() && out.freed().is_none(), "{kind:?}");
        }
        for (answer, error) in [
            (Answer::Status(500), crate::ErrorKind::Api),
            (Answer::Hang, crate::ErrorKind::Timeout),
        ] {
            let mut script = reads(kind, kind.live(), Some(&evicted_pod()));
            *script.last_mut().unwrap() = script.last().unwrap().clone().answer(answer.clone());
            let (out, _, _) = run(kind, WRITE, script).await;
            assert_eq!(
                out.error.as_ref().map(Error::kind),
                Some(error),
                "{kind:?} {answer:?}"
            );
            assert!(out.verdict.is_none() && out.freed().is_none(), "{kind:?}");
        }
    }
    let mut with_data = Kind::ConfigMap.live();
    with_data["data"] = json!({"leader": "op-1"});
    let script = vec![
        Expect::get(CM_PATH).answer(Answer::Ok(with_data)),
        Expect::event("ops", REASON_UNMANAGEABLE),
    ];
    let (out, _, _) = run(Kind::ConfigMap, WRITE, script).await;
    assert_eq!(
        out.verdict,
        Some(Verdict::Unmanageable(crate::lock::Unmanageable::HoldsData))
    );
    assert!(out.freed().is_none());
}

/// The controller's own path (`controller::reconcile`) from a watched
/// copy: the live read decides, and a 409 is judged again soon (a
/// requeue), never retried in the same reconcile.
#[tokio::test]
async fn reconcile_writes_what_it_read_live_and_requeues_a_409() {
    let pod = evicted_pod();
    let mut live = Kind::ConfigMap.live_at("9");
    live["metadata"]["uid"] = json!("made-again");
    let mut script = prelude(Kind::ConfigMap, live, Some(&pod));
    script.push(freeing_write(Kind::ConfigMap, "made-again", "9").status(409));
    script.push(Expect::event("ops", REASON_STOPPED));
    let (client, server) = ApiServer::start(script);
    let (ctx, _) = janitor(client, WRITE);
    // The watched copy: the lock as it was before (uid cm-uid, version 7).
    let watched: LockMeta = cm_lock().metadata.into_response_partial();
    let action = controller::reconcile(Arc::new(watched), ctx).await.unwrap();
    server.finish().await;
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(decide::REJUDGE_AFTER)
    );
}

// --- what surrounds the write: the intent Event, the record, a dry run ------------

/// The intent Event refused (500) or cut short (no answer within 500 ms,
/// on tokio's paused clock): the reclaim goes on all the same (a lock is
/// never kept stale for want of an Event), and the failure is counted.
#[tokio::test(start_paused = true)]
async fn an_intent_event_that_fails_does_not_stop_the_write() {
    for answer in [Answer::Status(500), Answer::Hang] {
        for kind in KINDS {
            let pod = evicted_pod();
            let mut script = prelude(kind, kind.live(), Some(&pod));
            let intent = script
                .iter()
                .rposition(|e| format!("{e:?}").contains(REASON_RECLAIMING))
                .expect("the intent Event");
            script[intent] = script[intent].clone().answer(answer.clone());
            script.push(write_of(kind));
            script.push(Expect::event("ops", REASON_RECLAIMED));
            let (out, _, shared) = run(kind, WRITE, script).await;
            assert!(
                matches!(out.freed(), Some(Freed::Reclaimed { .. })),
                "{kind:?} {answer:?}: {out:?}"
            );
            assert_eq!(
                errors(&shared, crate::ErrorKind::Event),
                1,
                "{kind:?} {answer:?}"
            );
        }
    }
}

/// The StaleLockReclaimed Event (what restore reads) is tried again when
/// refused: written at the third try here, and the reclaim stands.
#[tokio::test(start_paused = true)]
async fn the_reclaimed_event_is_tried_again() {
    let kind = Kind::ConfigMap;
    let pod = evicted_pod();
    let mut script = prelude(kind, kind.live(), Some(&pod));
    script.push(write_of(kind));
    script.push(Expect::event("ops", REASON_RECLAIMED).status(500));
    script.push(Expect::event("ops", REASON_RECLAIMED).status(503));
    script.push(Expect::event("ops", REASON_RECLAIMED));
    let (out, _, shared) = run(kind, WRITE, script).await;
    assert!(matches!(out.freed(), Some(Freed::Reclaimed { .. })));
    assert_eq!(reclaims(&shared, kind), 1);
    assert_eq!(errors(&shared, crate::ErrorKind::Event), 2);
}

/// `--dry-run`: the same live reads, then one StaleLockDetected Event and
/// no write at all (no intent Event, no DELETE or release, no pod DELETE).
#[tokio::test]
async fn a_dry_run_reads_and_says_but_never_writes() {
    for kind in KINDS {
        let pod = evicted_pod();
        let mut script = reads(kind, kind.live(), Some(&pod));
        script.push(Expect::event("ops", REASON_DETECTED));
        let (out, _, shared) = run(kind, DRY_RUN, script).await;
        assert_eq!(
            out.done,
            Done {
                freed: Some(Freed::DryRun),
                said: Some(REASON_DETECTED),
            },
            "{kind:?}"
        );
        assert_eq!(reclaims(&shared, kind), 0, "{kind:?}");
    }
}

/// A replica that does not lead judges from live reads but writes
/// nothing at all: no intent Event, no freeing write, no other Event.
#[tokio::test]
async fn a_replica_that_does_not_lead_writes_nothing() {
    for kind in KINDS {
        let (gate, close) = crate::election::Gate::closable();
        close();
        let pod = evicted_pod();
        let (client, server) = ApiServer::start(reads(kind, kind.live(), Some(&pod)));
        let ctx = janitor_gated(client, gate);
        let out = judge_and_write(&ctx, &kind.key()).await;
        server.finish().await;
        assert_eq!(out.verdict, Some(evicted(&pod)), "{kind:?}");
        assert_eq!(
            out.done,
            Done {
                freed: Some(Freed::NotLeader),
                said: None
            },
            "{kind:?}"
        );
    }
}

/// The lead lost while the intent Event is written: the gate, checked
/// again at the moment of the write, stops it.
#[tokio::test]
async fn a_lead_lost_during_the_intent_event_stops_the_write() {
    for kind in KINDS {
        let (gate, close) = crate::election::Gate::closable();
        let mut script = prelude(kind, kind.live(), Some(&evicted_pod()));
        let intent = script
            .iter()
            .rposition(|e| format!("{e:?}").contains(REASON_RECLAIMING))
            .expect("the intent Event");
        script[intent] = script[intent].clone().then(close);
        let (client, server) = ApiServer::start(script);
        let ctx = janitor_gated(client, gate);
        let out = judge_and_write(&ctx, &kind.key()).await;
        server.finish().await;
        assert_eq!(out.freed(), Some(&Freed::NotLeader), "{kind:?}: {out:?}");
    }
}

// --- the dead holder pod (--delete-pod) -----------------------------------------

/// After the lock is freed and said: the terminal holder is deleted, with
/// its uid as the precondition, said (DeadHolderDeleted) and counted.
#[tokio::test]
async fn the_dead_holder_is_deleted_after_the_lock() {
    for kind in KINDS {
        let pod = evicted_pod();
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind));
        script.push(Expect::event("ops", REASON_RECLAIMED));
        script.push(pod_delete().ok(&pod));
        script.push(Expect::event("ops", REASON_POD_DELETED));
        let (out, _, shared) = run(kind, DELETE_POD, script).await;
        assert!(
            matches!(out.freed(), Some(Freed::Reclaimed { .. })),
            "{kind:?}"
        );
        let deleted = shared
            .metrics
            .pod_deletions
            .with_label_values(&["ops", "Evicted"])
            .get();
        assert_eq!(deleted, 1, "{kind:?}");
    }
}

/// The pod's DELETE answered 404 (gone), 409 (another pod of its name
/// now), no answer, or a broken connection: the lock stays reclaimed, the
/// pod is not counted, nothing is tried again, and only a failure that is
/// not 404/409 counts as an error.
#[tokio::test(start_paused = true)]
async fn a_failed_pod_delete_leaves_the_reclaim_alone() {
    for (answer, error) in [
        (Answer::Status(404), None),
        (Answer::Status(409), None),
        (Answer::Hang, Some(crate::ErrorKind::Timeout)),
        (Answer::Broken, Some(crate::ErrorKind::Api)),
    ] {
        let pod = evicted_pod();
        let kind = Kind::ConfigMap;
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind));
        script.push(Expect::event("ops", REASON_RECLAIMED));
        script.push(pod_delete().answer(answer.clone()));
        let (out, _, shared) = run(kind, DELETE_POD, script).await;
        assert!(
            matches!(out.freed(), Some(Freed::Reclaimed { .. })),
            "{answer:?}"
        );
        assert!(out.error.is_none(), "{answer:?}");
        let deleted = shared
            .metrics
            .pod_deletions
            .with_label_values(&["ops", "Evicted"])
            .get();
        assert_eq!(deleted, 0, "{answer:?}");
        for k in [crate::ErrorKind::Timeout, crate::ErrorKind::Api] {
            let want = u64::from(error == Some(k));
            assert_eq!(errors(&shared, k), want, "{answer:?}: {k:?}");
        }
    }
}

/// A terminal holder already being deleted (a rollout deletes it anyway)
/// gets no DELETE of the janitor's.
#[tokio::test]
async fn a_holder_already_being_deleted_is_left_alone() {
    let mut pod = evicted_pod();
    pod.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    let kind = Kind::ConfigMap;
    let mut script = prelude(kind, kind.live(), Some(&pod));
    script.push(write_of(kind));
    script.push(Expect::event("ops", REASON_RECLAIMED));
    let (out, _, _) = run(kind, DELETE_POD, script).await;
    assert!(matches!(out.freed(), Some(Freed::Reclaimed { .. })));
}
