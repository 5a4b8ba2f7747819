#!/usr/bin/env bash
# The venv of the Python peer (testenv/peers/python/elector.py): the official
# Kubernetes Python client (PyPI `kubernetes`, pinned with its dependencies in
# testenv/peers/python/requirements.txt), whose kubernetes.leaderelection the
# end-to-end tests (tests/e2e/python.rs) run as a real leader-election peer.
# Prints the venv's python. Made once per requirements.txt (the cache key is
# its hash), in the cache beside the control plane's binaries:
#   ${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lock-janitor}/python-peer/<hash>/
# Idempotent and quick when it is there (a file test); safe to run from
# several processes at once (a lock, and the venv is moved into place only
# once complete). Needs python3 (>= 3.9) with its venv module and PyPI.
#
#   hack/python-peer.sh           make it if missing, print its python
#   hack/python-peer.sh --print   only print where its python is (or will be)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
req="$root/testenv/peers/python/requirements.txt"
key="$(sha256sum "$req" | cut -c1-16)"
base="${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-janitor}/python-peer"
venv="$base/$key"
python="$venv/bin/python"
say() { echo "python-peer: $*" >&2; }

if [ "${1:-}" = "--print" ]; then echo "$python"; exit 0; fi
ready() { [ -f "$venv/.complete" ] && [ -x "$python" ]; }
if ready; then echo "$python"; exit 0; fi

mkdir -p "$base"
exec 9>"$base/.lock"
flock 9
if ready; then echo "$python"; exit 0; fi

py="${PYTHON:-python3}"
command -v "$py" >/dev/null 2>&1 || { say "python3 is not on PATH (Debian: apt-get install python3 python3-venv)"; exit 1; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 9))' \
  || { say "$("$py" --version 2>&1) is too old: the kubernetes client needs Python >= 3.9"; exit 1; }
start=$(date +%s)
tmp="$base/.new-$key-$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
say "creating the venv ($("$py" --version 2>&1), $(grep -m1 '^kubernetes==' "$req")) in $venv"
"$py" -m venv "$tmp" || { say "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
"$tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
  --no-deps --only-binary=:all: -r "$req" >&2
# Every pin installed, nothing missing: the imports the peer makes work.
"$tmp/bin/python" -m pip check >&2
"$tmp/bin/python" -c 'import kubernetes.leaderelection.leaderelection, kubernetes.leaderelection.resourcelock.configmaplock, kubernetes.leaderelection.resourcelock.leaselock'
rm -rf "$venv"
mv "$tmp" "$venv"
trap - EXIT
# venv's scripts name the directory they were made in; the tests run
# bin/python itself, which finds its venv from where it is.
touch "$venv/.complete"
say "ready in $(($(date +%s) - start))s"
echo "$python"
