//! The rest of the mocked freeing-write tests (`super`): live reads that
//! differ from what was watched, what surrounds the write (the intent
//! Event, the record, a dry run), and the dead holder pod.

use super::*;

// --- live reads that differ from what was watched ---------------------------------

/// The write is guarded by the lock as read live, never as watched: a lock
/// made again under its name (another uid) at another resourceVersion is
/// written with that uid and version (the API server's 409 then judges
/// anything newer).
#[tokio::test]
async fn the_write_carries_what_the_live_read_found() {
    for kind in every_kind() {
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
    for kind in every_kind() {
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
    for kind in deleted_kinds() {
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
    let mut live = lease().live_at("9");
    live["spec"]["holderIdentity"] = json!("op-2");
    live["spec"]["renewTime"] = json!(Timestamp::now().to_string());
    let mut op2 = holder_pod("Running", None, SignedDuration::ZERO);
    op2.metadata.name = Some("op-2".into());
    op2.metadata.uid = Some("op-2-uid".into());
    let script = reads(lease(), live, Some(&op2));
    let (out, _, _) = run(lease(), WRITE, script).await;
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
    for kind in every_kind() {
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
    for kind in deleted_kinds() {
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
    let mut live = lease().live_at("9");
    live["metadata"]["ownerReferences"] =
        to_json(&crate::fixtures::lease_for_life())["metadata"]["ownerReferences"].clone();
    live["spec"]["renewTime"] = json!(Timestamp::now().to_string());
    let script = reads(lease(), live, Some(&pod));
    // Judged from the live read alone: as a renewed Lease, whatever was watched.
    let (out, _, _) = run(lease(), WRITE, script).await;
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
    for kind in deleted_kinds() {
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
        let kind_label = kind.key().kind.as_str();
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
    for kind in deleted_kinds() {
        for refused in [false, true] {
            let mut script = vec![
                Expect::get(&kind.path()).answer(Answer::Ok(kind.live())),
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
    for kind in every_kind() {
        let mut opted_out = kind.live();
        opted_out["metadata"]["labels"] = json!({"lock-janitor.io/watch": "false"});
        for (script, gone) in [
            (vec![Expect::get(&kind.path()).status(404)], true),
            (
                vec![Expect::get(&kind.path()).answer(Answer::Ok(opted_out))],
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
    let mut with_data = configmap().live();
    with_data["data"] = json!({"leader": "op-1"});
    let script = vec![
        Expect::get(&configmap().path()).answer(Answer::Ok(with_data)),
        Expect::event("ops", REASON_UNMANAGEABLE),
    ];
    let (out, _, _) = run(configmap(), WRITE, script).await;
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
    let mut live = configmap().live_at("9");
    live["metadata"]["uid"] = json!("made-again");
    let mut script = prelude(configmap(), live, Some(&pod));
    script.push(freeing_write(configmap(), "made-again", "9").status(409));
    script.push(Expect::event("ops", REASON_STOPPED));
    let (client, server) = ApiServer::start(script);
    let (ctx, _) = janitor(client, WRITE);
    // The watched copy: the lock as it was before (uid cm-uid, version 7).
    let watched: LockMeta = crate::fixtures::cm_lock().metadata.into_response_partial();
    let action = controller::reconcile(Arc::new(watched), ctx, Default::default())
        .await
        .unwrap();
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
        for kind in every_kind() {
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
    let kind = configmap();
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
    for kind in every_kind() {
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
    for kind in every_kind() {
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
    for kind in every_kind() {
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
    for kind in every_kind() {
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
        let kind = configmap();
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
    let kind = configmap();
    let mut script = prelude(kind, kind.live(), Some(&pod));
    script.push(write_of(kind));
    script.push(Expect::event("ops", REASON_RECLAIMED));
    let (out, _, _) = run(kind, DELETE_POD, script).await;
    assert!(matches!(out.freed(), Some(Freed::Reclaimed { .. })));
}

// --- the Lease the official Java client holds -------------------------------------

/// A Lease whose holder identity only the official Java client wrote (its
/// managedFields, as read live) is released with no holder at all, which
/// that client takes at once (after a `""` its follower waits its own
/// lease); with another writer of it beside, with `""`, which fabric8
/// before 6.x needs.
#[tokio::test]
async fn a_lease_the_java_client_wrote_is_released_with_no_holder_at_all() {
    let entry = |manager: &str| {
        json!({"manager": manager, "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
               "fieldsType": "FieldsV1",
               "fieldsV1": {"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}})
    };
    let label = json!({"manager": "lock-janitor", "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
                       "fieldsType": "FieldsV1",
                       "fieldsV1": {"f:metadata": {"f:labels": {"f:lock-janitor.io/watch": {}}}}});
    let renewer = json!({"manager": "fabric8-kubernetes-client", "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
                         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:renewTime": {}}}});
    let mut first_writer = entry("Kubernetes Java Client");
    first_writer["fieldsV1"] = json!({"f:spec": {"f:holderIdentity": {}}});
    for (managers, holder) in [
        (vec![entry("Kubernetes Java Client"), label.clone()], None),
        // fabric8 renewing under the identity the Java client wrote.
        (vec![first_writer, renewer], Some(json!(""))),
        (
            vec![
                entry("Kubernetes Java Client"),
                entry("fabric8-kubernetes-client"),
            ],
            Some(json!("")),
        ),
        (vec![entry("fabric8-kubernetes-client")], Some(json!(""))),
    ] {
        let pod = evicted_pod();
        let mut live = lease().live();
        live["metadata"]["managedFields"] = json!(managers);
        let mut script = prelude(lease(), live, Some(&pod));
        let write = Expect::put(&lease().path())
            .with("/metadata/resourceVersion", json!("7"))
            .with("/spec/leaseDurationSeconds", json!(1));
        script.push(
            match &holder {
                None => write.without("/spec/holderIdentity"),
                Some(h) => write.with("/spec/holderIdentity", h.clone()),
            }
            .answer(Answer::Echo),
        );
        script.push(Expect::event("ops", REASON_RECLAIMED));
        let (out, _, _) = run(lease(), WRITE, script).await;
        assert!(
            matches!(out.freed(), Some(Freed::Reclaimed { .. })),
            "{holder:?}: {out:?}"
        );
    }
}
