#!/usr/bin/env bash
# What `lock-janitor run` costs on a local control plane, as numbers (no
# pass/fail on time):
#  1. its memory (VmRSS/VmHWM) watching 0, 100 and 1,000 opted-in locks,
#     before and after 5,000 Running and 2,000 Failed/Succeeded pods that hold
#     no lock are added (same process, then fresh processes);
#  2. reclaim latency of a burst of 100 evicted holders (eviction status write
#     to lock deletion), with the janitor's own reclaim-latency histogram.
# About 3.5 minutes on 2 cores once built (setup: ~70 s). Not part of `make test`.
#
#   hack/bench-janitor.sh [--small 100] [--locks 1000] [--running-pods 5000]
#       [--terminal-pods 2000] [--evict 100] [--resync-secs 15] [--settle-resyncs 2]
#
# It measures target/release/lock-janitor (glibc malloc). To measure another
# build, e.g. the image's static musl binary:
#   cargo build --release --target x86_64-unknown-linux-musl --bin lock-janitor
#   LOCK_JANITOR_BIN=$PWD/target/x86_64-unknown-linux-musl/release/lock-janitor hack/bench-janitor.sh
set -euo pipefail
cd "$(dirname "$0")/.."
testenv/build.sh >/dev/null
cargo build --locked --release --bin lock-janitor
start=$(date +%s)
LOCK_JANITOR_BIN="${LOCK_JANITOR_BIN:-$PWD/target/release/lock-janitor}" \
  cargo run --locked --example bench_janitor -- "$@"
echo "bench-janitor: $(($(date +%s) - start))s in all (after the build)"
