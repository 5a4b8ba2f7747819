//! Every freeing write, request by request, on a mocked API server
//! (`fixtures::ApiServer`): for every registered kind, in each form its
//! write takes (`Kind::cases`, from the kind's folder), and for the dead
//! pod (`--delete-pod`), the exact requests the janitor sends, in order,
//! and what it concludes when the answer is 200, 404, 409, none at all, a
//! connection broken after the write, a finalizer, or a live read that is
//! not what was watched. The loops iterate the registration; a test of one
//! kind alone takes a resource's catch-all kind. No control plane: `cargo
//! test --lib reclaim` (or `make test-fast`).

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
    evicted_pod, holder_pod, list_of, path_of, to_json, Answer, ApiServer, Case, Expect, Seen,
    HOLDER_UID,
};
use crate::kinds;
use crate::lock::LockKey;
use crate::observe::LockAge;
use crate::reclaim::*;
use crate::selector::Selector;
use crate::shared::Shared;
use crate::verdict::{self, StaleReason, Verdict};
use crate::verdict::{HeldBecause, Policy};
use crate::Error;
use std::time::Duration;

const POD_PATH: &str = "/api/v1/namespaces/ops/pods/op-1";
const PODS_PATH: &str = "/api/v1/namespaces/ops/pods";

/// A registered lock kind with one of its locks and freeing writes for the
/// mocked API server (`Kind::cases`: each kind is freed its own way, and
/// some in more than one form).
#[derive(Clone, Copy)]
struct Kind {
    kind: &'static dyn kinds::Kind,
    case: &'static dyn Case,
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.case.name())
    }
}

impl PartialEq for Kind {
    fn eq(&self, other: &Kind) -> bool {
        self.case.name() == other.case.name()
    }
}

/// A ConfigMap held for life (its first case).
fn configmap() -> Kind {
    Kind::first(&kinds::configmap::ConfigMapHeldForLife)
}

/// A renewed Lease, as client-go writes it (its first case).
fn lease() -> Kind {
    Kind::first(&kinds::lease::RenewedLease)
}

/// Every registered kind, in each of its cases.
fn every_kind() -> impl Iterator<Item = Kind> {
    kinds::KINDS
        .iter()
        .flat_map(|&kind| kind.cases().iter().map(move |&case| Kind { kind, case }))
}

/// The kinds freed by a DELETE (finalizers can keep them).
fn deleted_kinds() -> impl Iterator<Item = Kind> {
    every_kind().filter(|k| k.is_deleted())
}

impl Kind {
    fn first(kind: &'static dyn kinds::Kind) -> Kind {
        Kind {
            kind,
            case: kind.cases()[0],
        }
    }

    fn case(self) -> &'static dyn Case {
        self.case
    }

    fn key(self) -> LockKey {
        self.case().key()
    }

    fn path(self) -> String {
        path_of(&self.key())
    }

    fn uid(self) -> String {
        self.live()["metadata"]["uid"].as_str().unwrap().to_owned()
    }

    /// The lock as the API server holds it (`Case::live`).
    fn live(self) -> Value {
        self.case().live()
    }

    /// The lock as live, with this resourceVersion.
    fn live_at(self, resource_version: &str) -> Value {
        let mut v = self.live();
        v["metadata"]["resourceVersion"] = json!(resource_version);
        v
    }

    fn is_deleted(self) -> bool {
        self.case().after_write("8").is_none()
    }

    /// Judged by renewals: its holder identity names a host, and the pods
    /// of its namespace are listed.
    fn is_renewed(self) -> bool {
        self.kind.judged() == kinds::Judged::ByRenewals
    }
}

// --- the request sequences ------------------------------------------------------

/// The live reads a judgement makes: the lock, then its holder. A lock
/// held by a pod by name and uid reads the pod by name; a missing one is
/// looked for in other namespaces by uid (`holder_elsewhere`), then read
/// again (the last read before a write). A renewed Lease names a host:
/// the pods of its namespace are listed.
fn reads(kind: Kind, lock: Value, holder: Option<&Pod>) -> Vec<Expect> {
    let mut s = vec![Expect::get(&kind.path()).answer(Answer::Ok(lock))];
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

/// The freeing write of the lock judged at (`uid`, `resource_version`),
/// as its kind makes it (`Case::freeing_write`).
fn freeing_write(kind: Kind, uid: &str, resource_version: &str) -> Expect {
    kind.case().freeing_write(uid, resource_version)
}

/// The write of the lock as `Kind::live` has it.
fn write_of(kind: Kind) -> Expect {
    freeing_write(kind, &kind.uid(), "7")
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
    for kind in every_kind() {
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
        if seen.iter().any(|s| s.method == Method::PUT) {
            assert_release_times(&seen);
        }
    }
}

/// 404: someone else freed it first. Fine: nothing more is written,
/// nothing is counted as reclaimed, no error.
#[tokio::test]
async fn a_404_means_someone_else_freed_it() {
    for kind in every_kind() {
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
    for kind in every_kind() {
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
    for kind in every_kind() {
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
    for kind in every_kind() {
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
        let now = match kind.case().after_write("8") {
            None => Expect::get(&kind.path()).status(404),
            Some(freed) => Expect::get(&kind.path()).answer(Answer::Ok(freed)),
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
    for kind in deleted_kinds() {
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
    for kind in deleted_kinds() {
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

mod reads;
mod stopped;
mod turns;
