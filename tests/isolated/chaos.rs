//! The chaos suite's short seeded run (see `chaos_engine`): a few dozen
//! locks with random fates and one fault of each kind, on a control plane
//! of its own, checked against the audit log. `make chaos` runs a long one.

use std::time::Duration;

#[tokio::test]
async fn chaos_short_seeded_run() {
    let seed = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261201);
    let keep = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{seed}"));
    let report = crate::chaos_engine::run(crate::chaos_engine::Config {
        seed,
        locks: 45,
        faults: 5,
        spread: Duration::from_secs(60),
        keep,
    })
    .await;
    report.print();
    assert!(
        report.ok(),
        "chaos run failed (seed {seed}); see the report above"
    );
    assert_eq!(report.faults.len(), 4, "every fault window was recorded");
    assert!(!report.latencies.is_empty(), "some reclaims outside faults");
}
