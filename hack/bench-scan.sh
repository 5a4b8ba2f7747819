#!/usr/bin/env bash
# How long `lock-janitor scan` takes on 10,000 ConfigMaps of which 500 are
# locks (500 holder pods, one in ten evicted), on a local control plane.
# Not part of `make test`.
#
#   hack/bench-scan.sh [--runs 3] [--namespaces 10] [--configmaps 10000] [--locks 500]
set -euo pipefail
cd "$(dirname "$0")/.."
testenv/build.sh >/dev/null
cargo build --locked --release --bin lock-janitor
cargo run --locked --example bench_scan -- --bin target/release/lock-janitor "$@"
