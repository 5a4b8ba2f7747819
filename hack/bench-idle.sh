#!/usr/bin/env bash
# make bench-idle: what the janitor costs idle among many pods that hold no
# lock (requests/s from the API server's audit log for the janitor's users,
# election apart; CPU; memory with and without the bystanders), and the peak
# memory of a Lease judgement among 5,000 pods, beside the goals of issue 20.
# Two replicas with --leader-elect, as the chart runs them. It prints numbers
# and fails on nothing but errors.
#
#   hack/bench-idle.sh [--bystanders 50000] [--window-secs 600]
#       [--baseline-window-secs <window>] [--resync 5m] [--churn-per-min 1000]
#       [--locks 1000] [--lock-namespaces 20] [--bystander-namespaces 25]
#       [--running-percent 60] [--lease-pods 5000] [--writers 64]
#
# With the defaults about 33 minutes on 2 cores after the builds (two
# 10-minute windows, each opened 150 s after start-up, ~8 minutes of
# setup); a quick try (about 5 minutes):
#   hack/bench-idle.sh --bystanders 2000 --window-secs 60 --resync 20s --lease-pods 1000
# A shorter --resync makes more sweeps per window: the sweep lists scale
# with 1/resync (the table adds them scaled back to 5m); election and watch
# restarts do not.
#
# It measures the image's binary (the static musl build of the Dockerfile),
# as bench-scale does; LOCK_JANITOR_BIN=<path> measures another build (for
# example target/release/lock-janitor, the glibc build).
set -euo pipefail
cd "$(dirname "$0")/.."
testenv/build.sh >/dev/null
cargo build --locked --release --example bench_idle
if [ -z "${LOCK_JANITOR_BIN:-}" ]; then
  cargo build --locked --release --target x86_64-unknown-linux-musl --bin lock-janitor
  LOCK_JANITOR_BIN="$PWD/target/x86_64-unknown-linux-musl/release/lock-janitor"
fi
start=$(date +%s)
echo "bench-idle: $(uptime)"
LOCK_JANITOR_BIN="$LOCK_JANITOR_BIN" target/release/examples/bench_idle "$@"
echo "bench-idle: $(($(date +%s) - start))s in all (after the build); $(uptime)"
