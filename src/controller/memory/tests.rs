//! The memory's bookkeeping: one take and one put per reconcile, suspects
//! that outlive a judgement, and the lock counts that follow the put.

use super::*;
use crate::decide::Phase;
use crate::verdict::StaleReason;

fn memory() -> (Memory, Metrics) {
    let metrics = Metrics::new().unwrap();
    (Memory::new(metrics.clone()), metrics)
}

fn holder() -> Holder {
    Holder {
        name: "op-0".into(),
        uid: "u".into(),
    }
}

fn settled_at(version: &str) -> State {
    State {
        phase: Phase::Settled(LockState::Held),
        version: Some(version.into()),
        ..State::default()
    }
}

#[test]
fn a_settled_lock_is_taken_again_only_when_it_or_its_holder_changes() {
    let (m, _) = memory();
    let k = LockKey::configmap("ops", "lock");
    let s = m.take(&k, "7", None).expect("new: judged");
    assert_eq!(s.phase, Phase::New);
    assert!(m.put(&k, settled_at("7")), "stands");
    assert!(m.take(&k, "7", None).is_none(), "settled at this version");
    assert!(!m.needs_judging(&k, "7"));
    assert!(m.take(&k, "8", None).is_some(), "another version");
    m.put(&k, settled_at("8"));
    m.suspect(&k);
    assert!(m.needs_judging(&k, "8"));
    assert!(m.take(&k, "8", None).is_some(), "suspect");
    // A suspect raised while the lock is judged outlives the put.
    m.suspect(&k);
    assert!(!m.put(&k, settled_at("8")), "does not stand");
    assert!(m.take(&k, "8", None).is_some());
}

#[test]
fn a_put_after_the_lock_was_forgotten_keeps_nothing() {
    let (m, _) = memory();
    let k = LockKey::configmap("ops", "lock");
    let holder = Holder {
        name: "op-0".into(),
        uid: "u".into(),
    };
    m.take(&k, "7", Some(holder.clone())).unwrap();
    assert_eq!(
        m.forget(&k),
        Some(holder),
        "the cached holder is kept at once"
    );
    assert!(!m.put(&k, settled_at("7")));
    assert!(m.keys_in(None, LockKind::ConfigMap).is_empty());
}

#[test]
fn counts_and_stale_series_follow_the_put() {
    let (m, metrics) = memory();
    let held = |kind: LockKind, state: LockState| {
        metrics
            .locks
            .with_label_values(&[kind.as_str(), state.as_str()])
            .get()
    };
    let stale = |k: &LockKey| {
        metrics
            .stale_locks
            .with_label_values(&[k.kind.as_str(), &k.namespace, &k.name, "Evicted"])
            .get()
    };
    let (a, b) = (LockKey::configmap("ops", "a"), LockKey::lease("ops", "b"));
    m.take(&a, "1", None);
    m.put(&a, settled_at("1"));
    m.seed_held(&b, "1", &holder());
    m.seed_held(&a, "9", &holder());
    assert_eq!(
        held(LockKind::ConfigMap, LockState::Held),
        1,
        "seeded once only"
    );
    assert_eq!(held(LockKind::Lease, LockState::Held), 1);
    m.take(&a, "2", None);
    let dry = State {
        phase: Phase::Stale(StaleReason::Evicted),
        ..State::default()
    };
    m.put(&a, dry);
    assert_eq!(held(LockKind::ConfigMap, LockState::Held), 0);
    assert_eq!(held(LockKind::ConfigMap, LockState::Stale), 1);
    assert_eq!(stale(&a), 1);
    m.take(&a, "3", None);
    m.put(&a, settled_at("3"));
    assert_eq!(stale(&a), 0, "no longer stale");
    m.forget(&a);
    m.forget(&b);
    assert_eq!(held(LockKind::ConfigMap, LockState::Held), 0);
    assert_eq!(held(LockKind::Lease, LockState::Held), 0);
}

#[test]
fn failures_count_in_a_row_and_make_the_lock_suspect() {
    let (m, _) = memory();
    let k = LockKey::configmap("ops", "lock");
    m.take(&k, "1", None);
    m.put(&k, settled_at("1"));
    assert_eq!((m.failed(&k), m.failed(&k)), (1, 2));
    let s = m.take(&k, "1", None).expect("judged again after a failure");
    assert_eq!(s.failures, 2);
}
