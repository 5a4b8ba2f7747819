//! A judgement's turn (`controller::Turn`) ends once its write is
//! answered, before what the reclaim says after it: in `reclaim_with`, for
//! every kind, and in the controller's own path (`controller::reconcile`)
//! for a reclaim, a dry run and a report.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use tokio::sync::Semaphore;

use super::*;

/// The controller's turn ends once the write is answered, before the
/// reclaim's Event: a report never holds a turn a death waits for.
#[tokio::test]
async fn the_turn_ends_between_the_write_and_its_event() {
    for kind in every_kind() {
        let ended = Arc::new(AtomicBool::new(false));
        let at_write = Arc::new(AtomicBool::new(true));
        let at_event = Arc::new(AtomicBool::new(false));
        let seen_by = |flag: &Arc<AtomicBool>| {
            let (ended, flag) = (ended.clone(), flag.clone());
            move || flag.store(ended.load(SeqCst), SeqCst)
        };
        let pod = evicted_pod();
        let mut script = prelude(kind, kind.live(), Some(&pod));
        script.push(write_of(kind).then(seen_by(&at_write)));
        script.push(Expect::event("ops", REASON_RECLAIMED).then(seen_by(&at_event)));
        let (client, server) = ApiServer::start(script);
        let (ctx, _) = janitor(client, WRITE);
        let j = ctx.observer.judge_live(&kind.key(), &mut LockAge).await;
        let j = j.unwrap().unwrap();
        let (done, error) = ctx
            .reclaimer
            .reclaim_with(&j, |_| false, || ended.store(true, SeqCst))
            .await;
        server.finish().await;
        assert!(error.is_none(), "{kind:?}: {error:?}");
        assert!(
            matches!(done.freed, Some(Freed::Reclaimed { .. })),
            "{kind:?}"
        );
        assert!(
            !at_write.load(SeqCst),
            "{kind:?}: the turn ended before the write"
        );
        assert!(
            at_event.load(SeqCst),
            "{kind:?}: the Event was written in the turn"
        );
    }
}

/// Through `controller::reconcile` with a turn of a semaphore of one: the
/// turn is still held when the write is received, and given back when
/// what follows it is (`StaleLockReclaimed`; a dry run's
/// `StaleLockDetected`; for a report, its Event, there being no write).
#[tokio::test]
async fn reconcile_ends_its_turn_before_it_says_what_it_did() {
    let pod = evicted_pod();
    let mut reclaim = prelude(configmap(), configmap().live(), Some(&pod));
    reclaim.push(write_of(configmap()));
    reclaim.push(Expect::event("ops", REASON_RECLAIMED));
    let mut dry_run = reads(configmap(), configmap().live(), Some(&pod));
    dry_run.push(Expect::event("ops", REASON_DETECTED));
    let mut with_data = configmap().live();
    with_data["data"] = json!({"leader": "op-1"});
    let report = vec![
        Expect::get(&configmap().path()).answer(Answer::Ok(with_data)),
        Expect::event("ops", REASON_UNMANAGEABLE),
    ];
    for (name, mode, mut script) in [
        ("reclaim", WRITE, reclaim),
        ("dry run", DRY_RUN, dry_run),
        ("report", WRITE, report),
    ] {
        let turns = Arc::new(Semaphore::new(1));
        // A flag, and what sets it when a request is received: whether
        // the turn was free then.
        let turn_free = || {
            let (turns, flag) = (turns.clone(), Arc::new(AtomicBool::new(false)));
            let seen = flag.clone();
            (seen, move || {
                flag.store(turns.available_permits() == 1, SeqCst)
            })
        };
        let last = script.len() - 1;
        let (free_when_said, check) = turn_free();
        script[last] = script[last].clone().then(check);
        let (free_at_write, check) = turn_free();
        if name == "reclaim" {
            script[last - 1] = script[last - 1].clone().then(check);
        }
        let (client, server) = ApiServer::start(script);
        let (ctx, _) = janitor(client, mode);
        let watched: LockMeta = crate::fixtures::cm_lock().metadata.into_response_partial();
        let turn = controller::Turn::of(turns.clone().try_acquire_owned().unwrap());
        controller::reconcile(Arc::new(watched), ctx, turn)
            .await
            .unwrap();
        server.finish().await;
        assert!(free_when_said.load(SeqCst), "{name}: said within the turn");
        assert!(
            !free_at_write.load(SeqCst),
            "{name}: the turn ended before the write"
        );
    }
}

/// What is said once the turns are given back goes `REPORTS_AT_ONCE` at
/// a time: with the Events API not answering, 70 reports send 64 Events,
/// and the 65th goes once one of them is answered.
#[tokio::test(start_paused = true)]
async fn reports_go_a_bounded_number_at_a_time() {
    let (client, mut api) = crate::fixtures::mock_client();
    let (ctx, _) = janitor(client, WRITE);
    let j = crate::observe::Judgement {
        key: configmap().key(),
        meta: crate::fixtures::cm_lock().metadata,
        lock: None,
        holder: None,
        verdict: Verdict::Unmanageable(crate::lock::Unmanageable::HoldsData),
        died_at: None,
        lease: None,
    };
    let reports = tokio::spawn({
        let ctx = ctx.clone();
        async move {
            let all = (0..REPORTS_AT_ONCE + 6).map(|_| ctx.reclaimer.report_untouchable(&j));
            futures::future::join_all(all)
                .await
                .into_iter()
                .all(|said| said)
        }
    });
    let mut waiting = vec![];
    for _ in 0..REPORTS_AT_ONCE {
        waiting.push(api.next_request().await.expect("an Event"));
    }
    // Every task has run until it waits (the clock moves only then).
    let more = tokio::time::timeout(Duration::from_millis(100), api.next_request()).await;
    assert!(more.is_err(), "a report past {REPORTS_AT_ONCE} at once");
    echo(waiting.remove(0)).await;
    waiting.push(
        api.next_request()
            .await
            .expect("the 65th, once one is answered"),
    );
    for w in waiting {
        echo(w).await;
    }
    for _ in 0..5 {
        echo(api.next_request().await.expect("the last ones")).await;
    }
    assert!(reports.await.unwrap(), "every report written");
}

/// The freeing write never waits for a report place; what a reclaim says
/// after it (`StaleLockReclaimed`) does. A reclaim with nothing more to
/// say (the lock gone: 404) takes none.
#[tokio::test(start_paused = true)]
async fn writes_never_wait_for_a_report_place() {
    let (kind, pod) = (configmap(), evicted_pod());
    let written = Arc::new(AtomicBool::new(false));
    let mut script = prelude(kind, kind.live(), Some(&pod));
    let flag = written.clone();
    script.push(write_of(kind).then(move || flag.store(true, SeqCst)));
    script.push(Expect::event("ops", REASON_RECLAIMED));
    let (client, server) = ApiServer::start(script);
    let (ctx, _) = janitor(client, WRITE);
    let j = ctx.observer.judge_live(&kind.key(), &mut LockAge).await;
    let j = j.unwrap().unwrap();
    let places = ctx.reclaimer.hold_reports();
    let reclaim = ctx.reclaimer.reclaim(&j, |_| false);
    futures::pin_mut!(reclaim);
    // Every task has run until it waits (the clock moves only then).
    let early = tokio::time::timeout(Duration::from_millis(100), &mut reclaim).await;
    assert!(early.is_err(), "StaleLockReclaimed went without a place");
    assert!(written.load(SeqCst), "the write waited for a place");
    drop(places);
    let (done, error) = reclaim.await;
    assert!(error.is_none(), "{error:?}");
    assert!(matches!(done.freed, Some(Freed::Reclaimed { .. })));
    server.finish().await;

    let mut script = prelude(kind, kind.live(), Some(&pod));
    script.push(write_of(kind).status(404));
    let (client, server) = ApiServer::start(script);
    let (ctx, _) = janitor(client, WRITE);
    let j = ctx.observer.judge_live(&kind.key(), &mut LockAge).await;
    let j = j.unwrap().unwrap();
    let _places = ctx.reclaimer.hold_reports();
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        ctx.reclaimer.reclaim(&j, |_| false),
    );
    let (done, _) = gone.await.expect("a 404 waited for a report place");
    assert_eq!(done.freed, Some(Freed::Gone));
    server.finish().await;
}

type Received = (
    http::Request<kube::client::Body>,
    tower_test::mock::SendResponse<http::Response<kube::client::Body>>,
);

/// Answers an Event created with itself.
async fn echo((request, send): Received) {
    let body = request.into_body().collect_bytes().await.unwrap();
    send.send_response(http::Response::new(kube::client::Body::from(body.to_vec())));
}
