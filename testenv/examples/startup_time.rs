//! Measures how long a control plane takes to start and stop:
//! `cargo run -p lock-janitor-testenv --example startup_time [runs]`.

use std::time::Instant;

use lock_janitor_testenv::{ControlPlane, Options};

#[tokio::main]
async fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    for i in 1..=runs {
        let t = Instant::now();
        let cp = match ControlPlane::start(Options::default()).await {
            Ok(cp) => cp,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let started = t.elapsed();
        let t = Instant::now();
        cp.stop();
        println!(
            "run {i}: start {:.2}s, stop {:.2}s",
            started.as_secs_f64(),
            t.elapsed().as_secs_f64()
        );
    }
}
