//! `make chaos`: a long run of the chaos suite (testsupport's `chaos_engine`)
//! with a random seed it prints; `SEED=<n>` replays a plan. Reports locks,
//! faults, wrong deletes and missed reclaims (both must be 0), reclaim
//! latency outside faults, the 409s received, and the recovery time after
//! each apiserver restart; exits 1 if anything was wrong, keeping the audit
//! log and the janitors' logs (it says where).
//!
//! ```text
//! cargo build --bin lock-janitor
//! cargo run --example chaos -- [--locks 300] [--faults 20] [--spread-secs 600]
//! ```

use std::time::Duration;

use lock_janitor_testsupport::chaos_engine;

fn die(msg: &str) -> ! {
    eprintln!("chaos: {msg}");
    std::process::exit(2)
}

/// A long run of the chaos suite with a random seed (`SEED=<n>` replays a
/// plan).
#[derive(clap::Parser)]
#[command(args_override_self = true)]
struct Args {
    /// Locks in the run.
    #[arg(long, default_value_t = 300)]
    locks: usize,
    /// Faults injected.
    #[arg(long, default_value_t = 20)]
    faults: usize,
    /// Seconds the faults are spread over.
    #[arg(long = "spread-secs", value_name = "N", default_value_t = 600)]
    spread: u64,
}

#[tokio::main]
async fn main() {
    let Args {
        locks,
        faults,
        spread,
    } = clap::Parser::parse();
    let seed = std::env::var("SEED")
        .ok()
        .map(|s| s.parse().unwrap_or_else(|_| die("SEED must be a number")))
        .unwrap_or_else(|| fastrand::u64(..));
    println!("chaos: seed {seed}, {locks} locks, {faults} faults over {spread}s");
    let keep = std::env::temp_dir().join(format!("lock-janitor-chaos-{seed}"));
    let report = chaos_engine::run(chaos_engine::Config {
        seed,
        locks,
        faults,
        spread: Duration::from_secs(spread),
        keep,
    })
    .await;
    report.print();
    if !report.ok() {
        std::process::exit(1);
    }
}
