//! Per-lock memory: what it remembers, and when it forgets.

use super::*;

fn memory() -> Memory {
    Memory::new(Metrics::new().expect("metrics"))
}

/// What lets a judgement skip the read of a lock: this very version
/// read live lock-shaped. A new version, a forget or a cleared flag
/// (a 409, a re-list) each take it away.
#[test]
fn lock_shaped_holds_for_the_version_read_only() {
    let m = memory();
    let k = LockKey::configmap("ops", "lock");
    m.suspect(&k);
    m.judged(&k, "7", true);
    assert!(!m.known_shaped(&k, "7"), "not before it is said");
    m.set_shaped(&k, true);
    assert!(m.known_shaped(&k, "7"));
    assert!(!m.known_shaped(&k, "8"), "another version");
    m.judged(&k, "8", true);
    assert!(!m.known_shaped(&k, "8") && !m.known_shaped(&k, "7"));
    m.set_shaped(&k, true);
    m.set_shaped(&k, false);
    assert!(!m.known_shaped(&k, "8"));
    m.set_shaped(&k, true);
    m.forget(&k);
    assert!(!m.known_shaped(&k, "8"), "forgotten");
}

/// A version learned empty from the table counts only when it is the
/// version last judged; a new version clears it, as after a live read.
#[test]
fn learned_empty_holds_for_the_judged_version_only() {
    let m = memory();
    let k = LockKey::configmap("ops", "lock");
    assert!(
        !m.learned_empty(&k, "7"),
        "a lock never judged is not marked"
    );
    assert!(!m.known_shaped(&k, "7"));
    let holder = Holder {
        name: "p".into(),
        uid: "u1".into(),
    };
    m.seed_held(&k, "7", &holder);
    assert!(!m.learned_empty(&k, "6"), "an older version");
    assert!(!m.known_shaped(&k, "7"));
    assert!(m.learned_empty(&k, "7"));
    assert!(m.known_shaped(&k, "7"));
    m.judged(&k, "8", true);
    assert!(!m.known_shaped(&k, "8") && !m.known_shaped(&k, "7"));
    // A 409 on version 8: a table of an older snapshot does not mark it
    // again; the next version may be.
    m.refused(&k);
    assert!(!m.learned_empty(&k, "8"), "refused at this version");
    assert!(!m.known_shaped(&k, "8"));
    m.judged(&k, "9", true);
    assert!(m.learned_empty(&k, "9"));
}

/// A death makes one judgement urgent per lock and holder uid; the same
/// death said again (a re-list, a repeated event) does not.
#[test]
fn a_death_is_urgent_once_per_holder() {
    let m = memory();
    let k = LockKey::configmap("ops", "lock");
    assert!(!m.take_urgent(&k));
    m.died(&k, "uid-1");
    assert!(m.take_urgent(&k));
    assert!(!m.take_urgent(&k), "taken");
    m.died(&k, "uid-1");
    assert!(!m.take_urgent(&k), "the same death again");
    m.died(&k, "uid-2");
    assert!(m.take_urgent(&k), "another holder's");
    // A Lease's renewal window: the first judgement after its end.
    m.urgent_after_window(&k, Duration::from_secs(3600));
    assert!(!m.take_urgent(&k), "not before the window ends");
    let w = LockKey::lease("ns", "lease");
    m.died(&w, "uid-4");
    assert!(m.take_urgent(&w));
    m.urgent_after_window(&w, Duration::ZERO);
    assert!(m.take_urgent(&w), "the window's end");
    assert!(!m.take_urgent(&w), "taken");
    m.urgent_after_window(&w, Duration::ZERO);
    assert!(!m.take_urgent(&w), "once per death");
    m.died(&w, "uid-5");
    assert!(m.take_urgent(&w));
    m.urgent_after_window(&w, Duration::ZERO);
    assert!(m.take_urgent(&w), "again for another death");
    // Taken before its end, the window's urgency is not spent.
    let early = LockKey::lease("ns", "early");
    m.died(&early, "uid-6");
    assert!(m.take_urgent(&early));
    m.urgent_after_window(&early, Duration::from_millis(300));
    assert!(!m.take_urgent(&early), "before the end");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !m.take_urgent(&early) {
        assert!(Instant::now() < deadline, "never urgent after the end");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A 409 before the end spends it: the next judgement reads live.
    let refused = LockKey::lease("ns", "refused");
    m.died(&refused, "uid-7");
    assert!(m.take_urgent(&refused));
    m.urgent_after_window(&refused, Duration::ZERO);
    m.refused(&refused);
    assert!(!m.take_urgent(&refused), "spent by the 409");
    let other = LockKey::lease("ns", "never-died");
    m.urgent_after_window(&other, Duration::ZERO);
    assert!(!m.take_urgent(&other), "no death, no urgency");
}
