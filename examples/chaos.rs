//! `make chaos`: a long run of the chaos suite (`tests/chaos_engine`) with
//! a random seed it prints; `SEED=<n>` replays a plan. Reports locks,
//! faults, wrong deletes and missed reclaims (both must be 0), reclaim
//! latency outside faults, the 409s received, and the recovery time after
//! each apiserver restart; exits 1 if anything was wrong, keeping the audit
//! log and the janitors' logs (it says where).
//!
//! ```text
//! cargo build --bin lock-janitor
//! cargo run --example chaos -- [--locks 300] [--faults 20] [--spread-secs 600]
//! ```

#[path = "../tests/chaos_engine/mod.rs"]
mod chaos_engine;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

fn die(msg: &str) -> ! {
    eprintln!("chaos: {msg}");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let (mut locks, mut faults, mut spread) = (300usize, 20usize, 600u64);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it
            .next()
            .unwrap_or_else(|| die(&format!("{flag} needs a value")));
        let n: u64 = v
            .parse()
            .unwrap_or_else(|_| die(&format!("{flag}: {v:?} is not a number")));
        match flag.as_str() {
            "--locks" => locks = n as usize,
            "--faults" => faults = n as usize,
            "--spread-secs" => spread = n,
            _ => die("use --locks N --faults N --spread-secs N"),
        }
    }
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
