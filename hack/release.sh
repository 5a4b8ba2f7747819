#!/usr/bin/env bash
# make release: builds everything a release publishes into dist/, from this
# checkout, on this (x86_64 Linux) machine, without a Docker engine:
#
#   dist/lock-janitor_<v>_<os>_<arch>.tar.gz  linux|darwin x amd64|arm64: lock-janitor, LICENSE, README.md
#   dist/sbom.cdx.json                         CycloneDX SBOM of the Rust dependencies (cargo-cyclonedx)
#   dist/image/                                OCI layout: one index, linux/amd64 + linux/arm64
#   dist/lock-janitor-<v>.tgz                  the chart (helm package)
#   dist/lock-janitor.yaml                     the krew manifest, sha256 of each archive
#   dist/checksums.txt                         sha256sum of the archives, the chart and the SBOM
#
#   hack/release.sh              all of it
#   hack/release.sh --verify     only check an existing dist/ (what the end of a build checks)
#   RELEASE_PLATFORMS="linux/amd64 linux/arm64" hack/release.sh
#                                a partial dist/ for those platforms only (no krew
#                                manifest): what .ci/run checks, to stay in its time
#                                budget; a release is always all four
#
# The version is Cargo.toml's; the chart's version and appVersion must equal it.
# Tools: hack/release-tools.sh (zig + cargo-zigbuild, cargo-cyclonedx, the OCI
# layout writer), helm from testenv/build.sh. Cross builds: `cargo zigbuild
# --release --locked --target <triple>...`, the command the Dockerfile runs,
# once for the Linux triples and once for the macOS ones (see below); the
# Linux ones are static (musl). macOS links against generated stubs of
# CoreFoundation and Security (hack/darwin-stubs.py), so no Apple SDK is
# needed; they run on macOS 11 and newer (MACOS_MIN). Timestamps come from
# SOURCE_DATE_EPOCH (default: the commit time), so the archives and the image
# are reproducible.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { echo "release: $*" >&2; }
fail() { echo "release: FAIL: $*" >&2; exit 1; }

verify_only=false
case "${1:-}" in
  "") ;;
  --verify) verify_only=true ;;
  *) echo "usage: $0 [--verify]" >&2; exit 2 ;;
esac

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
[ -n "$version" ] || fail "no version in Cargo.toml"
source_url="https://github.com/lock-janitor/lock-janitor"
dist="$root/dist"
chart=charts/lock-janitor
# os/arch -> Rust target triple
declare -A TRIPLE=(
  [linux/amd64]=x86_64-unknown-linux-musl
  [linux/arm64]=aarch64-unknown-linux-musl
  [darwin/amd64]=x86_64-apple-darwin
  [darwin/arm64]=aarch64-apple-darwin
)
ALL_PLATFORMS=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64)
read -r -a PLATFORMS <<<"${RELEASE_PLATFORMS:-${ALL_PLATFORMS[*]}}"
for p in "${PLATFORMS[@]}"; do
  [ -n "${TRIPLE[$p]:-}" ] || fail "RELEASE_PLATFORMS: unknown platform '$p' (of: ${ALL_PLATFORMS[*]})"
done
for p in linux/amd64 linux/arm64; do
  case " ${PLATFORMS[*]} " in *" $p "*) ;; *) fail "RELEASE_PLATFORMS must include $p (the image needs both)" ;; esac
done
partial=false
[ "${#PLATFORMS[@]}" -eq "${#ALL_PLATFORMS[@]}" ] || partial=true
# What `file` says of each binary.
declare -A FILE_SAYS=(
  [linux/amd64]="ELF 64-bit LSB .*x86-64.*static"
  [linux/arm64]="ELF 64-bit LSB .*ARM aarch64.*static"
  [darwin/amd64]="Mach-O 64-bit x86_64 executable"
  [darwin/arm64]="Mach-O 64-bit arm64 executable"
)
# The oldest macOS the binaries run on (LC_BUILD_VERSION minos). Without it
# zig writes its own default, macOS 15, and the binary refuses to start on
# 14 and older. 11.0 is Apple silicon's first and what kubectl needs too.
MACOS_MIN=11.0  # MACOSX_DEPLOYMENT_TARGET of the build; checked in verify
archive_of() { echo "lock-janitor_${version}_${1%/*}_${1#*/}.tar.gz"; }
# Cargo's target dir: target/ unless CARGO_TARGET_DIR (or build.target-dir) says
# otherwise; it need not exist yet (a fresh clone has none).
target_dir="$(cargo metadata --format-version 1 --no-deps --locked \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')" \
  || fail "cargo metadata failed"
bin_of() { echo "$target_dir/${TRIPLE[$1]}/release/lock-janitor"; }

# --- checks of dist/ (also run at the end of a build) -----------------------
verify() {
  command -v file >/dev/null 2>&1 || fail "'file' is needed (Debian: file; hack/setup.sh installs it)"
  local p a desc
  for p in "${PLATFORMS[@]}"; do
    a="$dist/$(archive_of "$p")"
    [ -f "$a" ] || fail "$a is missing"
    local tmp; tmp="$(mktemp -d)"
    tar -xzf "$a" -C "$tmp"
    for f in lock-janitor LICENSE README.md; do [ -f "$tmp/$f" ] || fail "$a has no $f"; done
    cmp -s "$tmp/LICENSE" LICENSE || fail "$a: LICENSE differs from the repository's"
    desc="$(file -b "$tmp/lock-janitor")"
    grep -Eq "${FILE_SAYS[$p]}" <<<"$desc" || fail "$a: lock-janitor is not ${FILE_SAYS[$p]}: $desc"
    say "$(basename "$a"): $desc"
    if [ "$p" = linux/amd64 ]; then
      local v; v="$("$tmp/lock-janitor" --version)" || fail "$a: lock-janitor --version failed"
      grep -Fq "$version" <<<"$v" || fail "$a: --version says '$v', want $version"
      say "$(basename "$a"): --version: $v"
    fi
    rm -rf "$tmp"
  done
  (cd "$dist" && sha256sum --quiet -c checksums.txt) || fail "dist/checksums.txt does not verify"
  for a in "${PLATFORMS[@]}"; do grep -q "  $(archive_of "$a")\$" "$dist/checksums.txt" || fail "checksums.txt lacks $(archive_of "$a")"; done
  for f in "lock-janitor-$version.tgz" sbom.cdx.json; do grep -q "  $f\$" "$dist/checksums.txt" || fail "checksums.txt lacks $f"; done
  if $partial; then
    [ ! -e "$dist/lock-janitor.yaml" ] || fail "a partial dist/ has a krew manifest"
  else
    [ -f "$dist/lock-janitor.yaml" ] || fail "dist/lock-janitor.yaml (krew) is missing"
  fi
  MACOS_MIN="$MACOS_MIN" python3 hack/check_release.py "$dist" "$version" || fail "dist/ checks (hack/check_release.py)"
  say "dist/ verified: $(cd "$dist" && ls | tr '\n' ' ')"
}

if $verify_only; then verify; exit 0; fi

# --- the chart must already say this version ------------------------------
grep -q "^version: $version\$" "$chart/Chart.yaml" || fail "$chart/Chart.yaml version is not $version (Cargo.toml)"
grep -q "^appVersion: \"$version\"\$" "$chart/Chart.yaml" || fail "$chart/Chart.yaml appVersion is not \"$version\" (Cargo.toml)"

# --- tools ----------------------------------------------------------------
# Assigned first: `eval "$(...)"` alone would go on after a failed tool build.
tools="$(hack/release-tools.sh zig cyclonedx ociimage targets)" || fail "hack/release-tools.sh zig cyclonedx ociimage targets failed (see above)"
eval "$tools"

# --- binaries ---------------------------------------------------------------
mkdir -p "$target_dir"
stubs="$target_dir/darwin-stubs"
cargo metadata --format-version 1 --locked >"$target_dir/release-metadata.json" \
  || fail "cargo metadata failed"
python3 hack/darwin-stubs.py "$stubs" <"$target_dir/release-metadata.json"
# One cargo invocation per Linux target, exactly the command the Dockerfile
# and make test's docker-build-check.sh run (`cargo zigbuild --release
# --locked --target <triple>`, same env), so that the linux/amd64 binary that
# check built is the one the release packs (cargo finds it fresh), not built
# again inside a two-target invocation (a cold .ci/run built amd64 twice,
# 927 s in the check and again within the release's 658 s). The macOS targets go in one invocation of their own: cargo
# unifies features across the --target of an invocation, and the two OSes
# pull libc in differently (rustix uses libc on macOS), so mixing them would
# rebuild the Linux tree with other features. The host parts (build scripts,
# proc macros) are shared by every invocation.
declare -a GROUPS_=()
darwin_targets=""
for p in "${PLATFORMS[@]}"; do
  t="${TRIPLE[$p]}"
  if [ "${p%/*}" = darwin ]; then
    darwin_targets+=" --target $t"
    var="CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$t")_RUSTFLAGS"
    export "$var=-C link-arg=-F$stubs"
  else
    GROUPS_+=("linux:--target $t")
  fi
done
[ -n "$darwin_targets" ] && GROUPS_+=("darwin:${darwin_targets# }")
start=$SECONDS
for g in "${GROUPS_[@]}"; do
  os="${g%%:*}"
  read -r -a targets <<<"${g#*:}"
  say "cargo zigbuild --release --locked ${targets[*]}"
  # The zig venv goes first on PATH for cargo-zigbuild only (its python3 has
  # no PyYAML, which the checks below need). SOURCE_DATE_EPOCH stays out of
  # the build even when the caller exports it: cc (ring's build script)
  # declares rerun-if-env-changed=SOURCE_DATE_EPOCH, so a new commit time
  # would rebuild ring and everything above it.
  # MACOSX_DEPLOYMENT_TARGET only for macOS: the Linux build's env stays that
  # of docker-build-check.sh and the Dockerfile.
  osenv=()
  [ "$os" = darwin ] && osenv=(MACOSX_DEPLOYMENT_TARGET="$MACOS_MIN")
  t0=$SECONDS
  env -u SOURCE_DATE_EPOCH PATH="$ZIG_BIN:$PATH" "${osenv[@]}" \
    nice -n 10 cargo zigbuild --release --locked "${targets[@]}" \
    || fail "cargo zigbuild --release --locked ${targets[*]} failed"
  say "${targets[*]}: $((SECONDS - t0))s"
done
say "built ${PLATFORMS[*]} in $((SECONDS - start))s"

# --- dist/ ------------------------------------------------------------------
# Set only now: exported during the build it would change with every commit and
# make cargo rebuild the crates whose build scripts read it.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
rm -rf "$dist"
mkdir -p "$dist"
tarit() { # dir archive
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
      -C "$1" -cf - . | gzip -9n >"$2"
}
for p in "${PLATFORMS[@]}"; do
  stage="$target_dir/release-stage/${p/\//_}"
  rm -rf "$stage"; mkdir -p "$stage"
  install -m 0755 "$(bin_of "$p")" "$stage/lock-janitor"
  install -m 0644 LICENSE README.md "$stage/"
  tarit "$stage" "$dist/$(archive_of "$p")"
done

# The SBOM: the binary's dependency tree (normal dependencies; the test-only
# crates are not shipped).
say "sbom: cargo-cyclonedx $("$CARGO_CYCLONEDX" cyclonedx --version 2>/dev/null | awk '{print $NF}')"
# (cargo-cyclonedx writes one file per workspace member; testenv's and
# testsupport's are dropped.)
"$CARGO_CYCLONEDX" cyclonedx --manifest-path Cargo.toml --format json --spec-version 1.5 \
  --target all --override-filename lock-janitor.cdx >/dev/null \
  || fail "cargo cyclonedx failed"
mv lock-janitor.cdx.json "$dist/sbom.cdx.json"
rm -f testenv/lock-janitor.cdx.json testsupport/lock-janitor.cdx.json

say "image: OCI layout (linux/amd64, linux/arm64)"
digest="$("$OCIIMAGE" -out "$dist/image" -version "$version" -source "$source_url" \
  -revision "$(git rev-parse HEAD 2>/dev/null || true)" \
  "linux/amd64=$(bin_of linux/amd64)" "linux/arm64=$(bin_of linux/arm64)")" || fail "writing dist/image failed"
say "image index $digest"

# helm: $HELM, else the testenv's pinned build (built alone when missing).
helm="${HELM:-}"
if [ -z "$helm" ]; then
  helm="$(testenv/build.sh --print)/helm"
  [ -x "$helm" ] || helm="$(testenv/build.sh helm)/helm"
fi
[ -x "$helm" ] || fail "helm not found at $helm"
"$helm" package "$chart" --destination "$dist" >/dev/null || fail "helm package $chart failed"
[ -f "$dist/lock-janitor-$version.tgz" ] || fail "helm package wrote no dist/lock-janitor-$version.tgz"

if $partial; then
  say "RELEASE_PLATFORMS=${PLATFORMS[*]}: a partial dist/, no krew manifest"
else
  hack/krew-manifest.sh "$dist"
fi

(cd "$dist" && sha256sum lock-janitor_*.tar.gz "lock-janitor-$version.tgz" sbom.cdx.json >checksums.txt)

verify
say "OK: dist/ for $version"
