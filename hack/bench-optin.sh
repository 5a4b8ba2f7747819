#!/usr/bin/env bash
# The cost of `lock-janitor run --auto-opt-in` among 20,000 bystander
# ConfigMaps (1 KiB of data each) and 2,000 bystander Leases renewed every
# 10 s, with 200 candidates: RSS and requests per second at idle with and
# without it, and the time from a candidate's creation to its label.
# On a local control plane of its own. Not part of `make test`.
#
#   hack/bench-optin.sh [--configmaps 20000] [--leases 2000] [--candidates 200] [--idle 120s] ...
set -euo pipefail
cd "$(dirname "$0")/.."
testenv/build.sh >/dev/null
cargo build --locked --release --bin lock-janitor
cargo run --locked --release --example bench_optin -- --bin target/release/lock-janitor "$@"
