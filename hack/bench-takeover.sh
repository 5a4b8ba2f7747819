#!/usr/bin/env bash
# make bench: takeover time after an eviction with the real operator-lib,
# alone beside with the janitor, in one run on a local control plane
# (examples/bench_takeover.rs). About 4 minutes on 2 cores for 3 rounds.
#
#   hack/bench-takeover.sh [--rounds 3]
set -euo pipefail
cd "$(dirname "$0")/.."
testenv/build.sh >/dev/null
cargo build --locked --release --bin lock-janitor --example bench_takeover
start=$(date +%s)
LOCK_JANITOR_BIN="${LOCK_JANITOR_BIN:-$PWD/target/release/lock-janitor}" \
  target/release/examples/bench_takeover "$@"
echo "bench-takeover: $(($(date +%s) - start))s in all (after the build)"
