#!/usr/bin/env bash
# make bench: takeover time after an eviction with the real operator-lib,
# alone beside with the janitor, in one run on a local control plane
# (examples/bench_takeover.rs): operator-lib, a 60 s controller-runtime Lease and
# client-go at OpenShift's library-go timings (137 s / 107 s / 26 s). About 9
# minutes on 2 cores for 3 rounds and one library-go round.
#
#   hack/bench-takeover.sh [--rounds 3] [--library-go-rounds 1]
set -euo pipefail
cd "$(dirname "$0")/.."
testenv/build.sh >/dev/null
cargo build --locked --release --bin lock-janitor --example bench_takeover
start=$(date +%s)
LOCK_JANITOR_BIN="${LOCK_JANITOR_BIN:-$PWD/target/release/lock-janitor}" \
  target/release/examples/bench_takeover "$@"
echo "bench-takeover: $(($(date +%s) - start))s in all (after the build)"
