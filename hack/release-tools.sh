#!/usr/bin/env bash
# Installs the release tools into the cache, once per version, and prints
# shell assignments of their paths for `eval`:
#
#   eval "$(hack/release-tools.sh zig cyclonedx ociimage)"   # make release
#   eval "$(hack/release-tools.sh crane registry cosign)"    # make release-check
#
# Tools (versions in hack/release-versions.env), each under
# ${LOCK_JANITOR_CACHE:-~/.cache/lock-janitor}/release-tools/<tool>-<version>:
#   zig       ziglang + cargo-zigbuild from PyPI into a venv; prints ZIG_BIN
#             (put it first on PATH: cargo-zigbuild then runs zig as
#             `python3 -m ziglang` with the venv's python3)
#   cyclonedx cargo-cyclonedx from crates.io (cargo install --locked); CARGO_CYCLONEDX
#   crane     go-containerregistry's crane (go install); CRANE
#   registry  the distribution registry (go install); REGISTRY
#   cosign    cosign (go install); COSIGN
#   ociimage  hack/ociimage, the OCI layout writer (go build); OCIIMAGE
#   targets   the rustup targets of the release (no output)
# Everything comes from the package registries (PyPI, crates.io, the Go module
# proxy) and rustup; nothing else is downloaded. Build logs go to the cache's
# log/ directory; a failed build prints its last lines.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=release-versions.env
. "$root/hack/release-versions.env"
cache="${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-janitor}/release-tools"
log="$cache/log"
mkdir -p "$log"

TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl x86_64-apple-darwin aarch64-apple-darwin)

say() { echo "release-tools: $*" >&2; }
fail() { echo "release-tools: FAIL: $*" >&2; exit 1; }
timed() { # name log -- command...
  local name="$1" lf="$2"; shift 2
  local start=$SECONDS
  say "building $name (log: $lf)"
  if ! nice -n 10 "$@" >"$lf" 2>&1; then
    tail -n 30 "$lf" >&2
    fail "building $name failed (full log: $lf); fix the cause above and run again"
  fi
  say "built $name in $((SECONDS - start))s"
}

need_go() { command -v go >/dev/null 2>&1 || fail "'go' is not on PATH; install Go >= 1.26 to build $1"; }

# go_tool NAME VERSION PACKAGE: `go install PACKAGE@VERSION` into the cache.
go_tool() {
  local name="$1" version="$2" pkg="$3"
  local dir="$cache/$name-$version"
  if [ ! -x "$dir/$name" ]; then
    need_go "$name"
    mkdir -p "$dir.tmp"
    # Up to three attempts: the Go module proxy is always asked (a package
    # path below a module's root is looked up online), and a loaded machine
    # sees the odd TLS handshake timeout.
    timed "$name $version" "$log/$name-$version.log" \
      sh -c 'for i in 1 2 3; do "$@" && exit 0; echo "attempt $i failed" >&2; sleep 5; done; exit 1' go-install \
      env GOBIN="$dir.tmp" GOFLAGS=-buildvcs=false go install -trimpath -ldflags "-s -w" "$pkg@$version"
    [ -x "$dir.tmp/$name" ] || fail "go install $pkg@$version made no $name"
    rm -rf "$dir"; mv "$dir.tmp" "$dir"
  fi
  echo "$dir/$name"
}

tool_zig() {
  local venv="$cache/zig-$ZIGLANG_VERSION-zigbuild-$CARGO_ZIGBUILD_VERSION"
  if [ ! -x "$venv/bin/cargo-zigbuild" ] || ! "$venv/bin/python3" -m ziglang version >/dev/null 2>&1; then
    rm -rf "$venv"
    timed "zig venv (ziglang $ZIGLANG_VERSION, cargo-zigbuild $CARGO_ZIGBUILD_VERSION)" "$log/zig-venv.log" \
      sh -c "python3 -m venv '$venv' && '$venv/bin/pip' install --disable-pip-version-check 'ziglang==$ZIGLANG_VERSION' 'cargo-zigbuild==$CARGO_ZIGBUILD_VERSION'"
  fi
  echo "ZIG_BIN=$venv/bin"
}

tool_cyclonedx() {
  local dir="$cache/cargo-cyclonedx-$CARGO_CYCLONEDX_VERSION"
  if [ ! -x "$dir/bin/cargo-cyclonedx" ]; then
    timed "cargo-cyclonedx $CARGO_CYCLONEDX_VERSION" "$log/cargo-cyclonedx.log" \
      cargo install --locked --root "$dir" --version "$CARGO_CYCLONEDX_VERSION" cargo-cyclonedx
  fi
  echo "CARGO_CYCLONEDX=$dir/bin/cargo-cyclonedx"
}

tool_ociimage() {
  need_go ociimage
  # Rebuilt whenever its source changes.
  local sum
  sum="$(cat "$root"/hack/ociimage/go.mod "$root"/hack/ociimage/go.sum "$root"/hack/ociimage/*.go | sha256sum | cut -c1-16)"
  local dir="$cache/ociimage-$sum"
  if [ ! -x "$dir/ociimage" ]; then
    mkdir -p "$dir"
    timed "ociimage" "$log/ociimage.log" \
      sh -c "cd '$root/hack/ociimage' && GOFLAGS=-buildvcs=false go build -trimpath -o '$dir/ociimage' ."
  fi
  echo "OCIIMAGE=$dir/ociimage"
}

tool_targets() {
  command -v rustup >/dev/null 2>&1 || fail "rustup not found: add the targets ${TARGETS[*]} to your Rust toolchain by hand"
  local have
  have="$(rustup target list --installed)"
  for t in "${TARGETS[@]}"; do
    grep -qx "$t" <<<"$have" || { say "rustup target add $t"; rustup target add "$t" >&2; }
  done
}

[ $# -gt 0 ] || set -- zig cyclonedx ociimage crane registry cosign targets
for t in "$@"; do
  case "$t" in
    zig) tool_zig ;;
    cyclonedx) tool_cyclonedx ;;
    ociimage) tool_ociimage ;;
    targets) tool_targets ;;
    # Assigned first: a failure inside "$(...)" given straight to echo would
    # be lost, print CRANE= and let the caller go on with no tool.
    crane) p="$(go_tool crane "$CRANE_VERSION" github.com/google/go-containerregistry/cmd/crane)"; echo "CRANE=$p" ;;
    registry) p="$(go_tool registry "$REGISTRY_VERSION" github.com/distribution/distribution/v3/cmd/registry)"; echo "REGISTRY=$p" ;;
    cosign) p="$(go_tool cosign "$COSIGN_VERSION" github.com/sigstore/cosign/v2/cmd/cosign)"; echo "COSIGN=$p" ;;
    *) fail "unknown tool '$t' (zig cyclonedx ociimage crane registry cosign targets)" ;;
  esac
done
