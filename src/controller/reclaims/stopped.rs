//! The holder's read right before the freeing write (`holder_again`, safety
//! rule 1) failing, on a mocked API server (`fixtures::ApiServer`), as
//! `super` tests the other answers: refused (500) or unanswered (the
//! janitor's own timeout, on tokio's paused clock), the write is not made,
//! `StaleLockReclaimStopped` says so on the lock, and the error is the
//! reconcile's. `cargo test --lib reclaim`.

use super::*;

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
        for kind in every_kind() {
            let key = kind.key();
            let pod = evicted_pod();
            let mut script = reads(kind, kind.live(), Some(&pod));
            script.push(Expect::event("ops", REASON_RECLAIMING));
            script.push(Expect::get(POD_PATH).answer(answer.clone()));
            script.push(Expect::event("ops", REASON_STOPPED));
            let (client, server) = ApiServer::start(script);
            let (ctx, shared) = janitor(client, WRITE);
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
                "{kind:?}: {:?}",
                j.verdict
            );
            assert_eq!(
                decide::step(&j.verdict, &decide::State::default(), &j.version()),
                decide::Step::Reclaim,
                "{kind:?}"
            );
            let (done, err) = ctx.reclaimer.reclaim(&j, |_| false).await;
            let seen = server.finish().await;
            assert_eq!(done.freed, Some(Freed::Failed), "{kind:?} {answer:?}");
            assert_eq!(
                err.as_ref().map(Error::kind),
                Some(error),
                "{kind:?} {answer:?}: {err:?}"
            );
            // No write of any kind: only reads and the two Events.
            let writes: Vec<String> = seen
                .iter()
                .filter(|s| s.method != http::Method::GET)
                .map(|s| format!("{} {} {}", s.method, s.path, s.body["reason"]))
                .collect();
            assert_eq!(writes.len(), 2, "{kind:?} {answer:?}: {writes:?}");
            let stopped = &seen.last().unwrap().body;
            assert_eq!(stopped["reason"], REASON_STOPPED, "{kind:?} {answer:?}");
            let note = stopped["note"].as_str().unwrap_or_default();
            assert!(
                note.starts_with("Nothing written: the holder could not be read again"),
                "{kind:?} {answer:?}: {note}"
            );
            let reclaimed = shared
                .metrics
                .reclaims_by_reason
                .with_label_values(&[key.kind.as_str(), "Evicted"])
                .get();
            assert_eq!(reclaimed, 0, "{kind:?} {answer:?}");
            assert!(
                seen.iter().all(|s| s.body["reason"] != REASON_RECLAIMED),
                "{kind:?} {answer:?}"
            );
        }
    }
}
