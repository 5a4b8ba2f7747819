#!/usr/bin/env bash
# Installs what `make test` and `make demo` need beyond Go and Rust, so that
# the README's two commands are the whole set-up on a fresh machine:
#   - Debian packages: prometheus (promtool and a server for tests/e2e/prometheus.rs),
#     musl-tools (the image's static build), file (checks that it is static),
#     jq (the README's one-liner, run by tests/e2e/docs.rs), python3 and
#     python3-venv when missing (the Python peer's venv, hack/python-peer.sh),
#     a JDK (default-jdk-headless: java and javac >= 17) and maven when missing
#     (the Java peers, hack/java-peer.sh: fabric8's and the official client's);
#   - rustup: rustfmt, clippy and the x86_64-unknown-linux-musl target.
# apt-get runs as root (or through sudo when available); otherwise it names the
# command to run. Idempotent: nothing is installed twice.
#
#   hack/setup.sh
set -euo pipefail

say() { echo "setup: $*" >&2; }

need_apt=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v musl-gcc >/dev/null 2>&1 || need_apt+=(musl-tools)
command -v file >/dev/null 2>&1 || need_apt+=(file)
# The README's kubectl + jq one-liner is run by tests/e2e/docs.rs.
command -v jq >/dev/null 2>&1 || need_apt+=(jq)
# The Python peer's venv (hack/python-peer.sh, tests/e2e/python.rs): python3
# with venv and ensurepip (Debian splits them into python3-venv).
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
command -v python3 >/dev/null 2>&1 && ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1 && need_apt+=(python3-venv)
# The Java peers (hack/java-peer.sh; tests/e2e/fabric8.rs, tests/e2e/java.rs):
# javac and java (fabric8's client 8 needs Java 17; Debian's default JDK is 17
# or newer from bookworm on) and mvn to fetch their jars.
command -v javac >/dev/null 2>&1 && command -v java >/dev/null 2>&1 || need_apt+=(default-jdk-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt_get() { apt-get "$@"; }
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    apt_get() { sudo apt-get "$@"; }
  else
    say "missing Debian packages: ${need_apt[*]}"
    say "run: sudo apt-get install -y --no-install-recommends ${need_apt[*]}"
    exit 1
  fi
  say "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_get update -qq
  apt_get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # The Debian prometheus package starts a server on :9090; tests run their own.
  if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus 2>/dev/null || true; fi
  pkill -x prometheus 2>/dev/null || true
fi

if command -v rustup >/dev/null 2>&1; then
  installed="$(rustup component list --installed 2>/dev/null || true)"
  for c in rustfmt clippy; do
    grep -q "^$c" <<<"$installed" || rustup component add "$c" >/dev/null
  done
  rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl \
    || rustup target add x86_64-unknown-linux-musl >/dev/null
else
  say "rustup not found: install rustfmt, clippy and the x86_64-unknown-linux-musl target by hand"
fi
say "ready"
