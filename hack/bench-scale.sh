#!/usr/bin/env bash
# make bench: what the janitor costs at 0, 1,000 and 10,000 locks (memory,
# idle API load from apiserver_request_total with and without it) and its
# reclaim latency beside two floors (the safe floor: the janitor's own
# requests from a bare client; the bare DELETE), in one run on a local
# control plane (docs/performance.md "Two floors"). It prints numbers and
# fails on nothing but errors. About 12 minutes on 2 cores with the
# defaults, after the builds.
#
#   hack/bench-scale.sh [--levels 1000,10000] [--sequential 20] [--evict 100] [--bursts 3]
#       [--idle-secs 60] [--resync-secs 20] [--lease-burst 100] [--lease-rounds 3]
#       [--lease-namespaces own|locks] [--first janitor|safe-floor|bare-delete|random]
#       (--help says what each is)
#
# It measures the image's binary (the static musl build of the Dockerfile);
# LOCK_JANITOR_BIN=<path> measures another (for example target/release/lock-janitor,
# the glibc build).
set -euo pipefail
cd "$(dirname "$0")/.."
testenv/build.sh >/dev/null
cargo build --locked --release --example bench_scale
if [ -z "${LOCK_JANITOR_BIN:-}" ]; then
  cargo build --locked --release --target x86_64-unknown-linux-musl --bin lock-janitor
  LOCK_JANITOR_BIN="$PWD/target/x86_64-unknown-linux-musl/release/lock-janitor"
fi
start=$(date +%s)
LOCK_JANITOR_BIN="$LOCK_JANITOR_BIN" target/release/examples/bench_scale "$@"
echo "bench-scale: $(($(date +%s) - start))s in all (after the build)"
