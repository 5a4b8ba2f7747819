//! The leader record kind as the shared code asks it (`Kind`): its
//! claim, candidate shape, holder, version, renewals and takeover looks.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;

use super::record;
use crate::fixtures::{lock_meta, pod_owner};
use crate::kinds::{candidate, of, Judged, Object, Took};
use crate::lock::candidate::Shape;
use crate::lock::{Holder, LockKind};

/// A ConfigMap that carries a record is this kind's, even beside a Pod
/// owner (the record wins: it is never deleted as a lock held for life).
#[test]
fn a_record_wins_over_a_pod_owner() {
    let mut m = lock_meta(vec![pod_owner("op-a", "u")], &[]);
    m.annotations = Some([(record::ANNOTATION.to_string(), PYTHON.to_string())].into());
    let k = of(Object::ConfigMapMeta(&m));
    assert_eq!(
        (k.resource(), k.judged()),
        (LockKind::ConfigMap, Judged::ByRenewals)
    );
    assert_eq!(k.words().done, "Released this lock");
}

/// The Python client's record, verbatim.
const PYTHON: &str = r#"{"holderIdentity": "op-a", "leaseDurationSeconds": "60", "acquireTime": "2026-12-06 23:06:26.782255", "renewTime": "2026-12-06 23:06:48.980359"}"#;

fn annotated(value: &str) -> ConfigMap {
    let mut meta = lock_meta(vec![], &[]);
    meta.annotations = Some(
        [
            (record::ANNOTATION.to_string(), value.to_string()),
            ("team".to_string(), "ops".to_string()),
        ]
        .into(),
    );
    ConfigMap {
        metadata: meta,
        ..Default::default()
    }
}

#[test]
fn a_leader_record_is_read_as_a_renewed_lock() {
    let cm = annotated(PYTHON);
    let o = Object::ConfigMap(&cm);
    let k = of(o);
    assert_eq!(k.words().done, "Released this lock");
    assert_eq!(
        k.watched_annotation(),
        Some((record::ANNOTATION, record::MAX_LEN))
    );
    assert_eq!(
        candidate(o),
        Some(Shape::NamesAPod(LockKind::ConfigMap, "op-a".into()))
    );
    assert_eq!(k.version(o), "cm-uid/op-a");
    let l = k.record(o).unwrap().unwrap();
    assert_eq!(l.host.as_deref(), Some("op-a"));
    assert_eq!(
        l.duration,
        Some(k8s_openapi::jiff::SignedDuration::from_secs(60))
    );
    // Local time without a zone: never trusted; the janitor's own clock
    // sees the renewals.
    assert_eq!(l.renewed, None);
    let seen = k.renewal(o).unwrap();
    let later = annotated(&PYTHON.replace("23:06:48.980359", "23:06:50.991002"));
    let seen_later = k.renewal(Object::ConfigMap(&later)).unwrap();
    assert_eq!(seen.identity, seen_later.identity);
    assert_ne!(seen.mark, seen_later.mark, "a renewal changes the mark");
    assert_eq!(
        k.version(Object::ConfigMap(&later)),
        k.version(o),
        "and not the version"
    );
}

#[test]
fn records_that_do_not_read_or_name_no_pod_are_never_candidates() {
    for (value, why) in [
        ("not json", "BadLeaderRecord"),
        (
            r#"{"holderIdentity": "10.0.0.7:8443", "leaseDurationSeconds": 15, "renewTime": "2026-12-06T23:00:00Z"}"#,
            "IdentityNotAPod",
        ),
        (r#"{"holderIdentity": "op-a"}"#, "NoRenewTime"),
    ] {
        let cm = annotated(value);
        let o = Object::ConfigMap(&cm);
        assert_eq!(candidate(o), None, "{value}");
        let got = of(o).record(o).unwrap().unwrap_err();
        assert_eq!(got.code(), why, "{value}");
    }
    // Released (or not written yet): a free record, no holder.
    for value in ["", r#"{"holderIdentity":"","leaseDurationSeconds":1}"#] {
        let cm = annotated(value);
        let o = Object::ConfigMap(&cm);
        assert_eq!(candidate(o), None, "{value:?}");
        assert_eq!(of(o).record(o).unwrap().unwrap().host, None, "{value:?}");
    }
}

#[test]
fn a_released_record_looks_like_a_takeover_only_under_another_holder() {
    let old = Holder {
        name: "op-a".into(),
        uid: "u".into(),
    };
    let look = |value: &str| {
        let cm = annotated(value);
        of(Object::ConfigMap(&cm)).look(Some(Object::ConfigMap(&cm)), &old)
    };
    assert_eq!(
        look(r#"{"holderIdentity":"","leaseDurationSeconds":1}"#),
        Took::Waiting
    );
    assert_eq!(
        look(PYTHON),
        Took::Done("held again under the same identity")
    );
    match look(&PYTHON.replace("op-a", "op-b")) {
        Took::Taken(t) => {
            let (holder, carry) = (t.holder, t.carry);
            assert_eq!(holder.holder.name, "op-b");
            assert!(!carry, "released in place: it keeps its label");
        }
        other => panic!("{other:?}"),
    }
}

/// `scan` has watched nothing: a record whose times carry no zone cannot be
/// called stale on its times; it is held for a window of watching. The
/// controller's clock has watched, and its window runs from the death.
#[test]
fn untrusted_times_are_never_stale_without_watching() {
    use crate::verdict::{judge_lease, HeldBecause, Renewals, Verdict};
    let cm = annotated(&PYTHON.replace("op-a", "op-1"));
    let o = Object::ConfigMap(&cm);
    let lock = of(o).record(o).unwrap().unwrap();
    let pod = crate::fixtures::evicted_pod();
    let now = Timestamp::now();
    let unwatched = judge_lease(&lock, std::slice::from_ref(&pod), now, &Renewals::default());
    assert!(
        matches!(unwatched, Verdict::Held(HeldBecause::RenewalWindow { .. })),
        "{unwatched:?}"
    );
    let watched = Renewals {
        period: Some(std::time::Duration::from_secs(2)),
        quiet_for: Some(std::time::Duration::from_secs(600)),
    };
    let judged = judge_lease(&lock, std::slice::from_ref(&pod), now, &watched);
    assert!(matches!(judged, Verdict::Stale { .. }), "{judged:?}");
}
