#!/usr/bin/env bash
# Packs the static (musl) binary as the krew plugin archive and writes its
# sha256 into krew/lock-janitor.yaml (a release step).
#
#   hack/krew-manifest.sh [binary] [out-dir]
#     binary   default target/x86_64-unknown-linux-musl/release/lock-janitor
#     out-dir  default target/krew
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/x86_64-unknown-linux-musl/release/lock-janitor}"
out="${2:-target/krew}"
version="v$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
[ -x "$bin" ] || { echo "krew-manifest: $bin not found; build it with hack/docker-build-check.sh" >&2; exit 1; }
grep -q "version: $version\$" krew/lock-janitor.yaml || { echo "krew-manifest: krew/lock-janitor.yaml is not at $version" >&2; exit 1; }
mkdir -p "$out/pkg"
cp "$bin" "$out/pkg/kubectl-lock_janitor"
archive="$out/kubectl-lock_janitor-$version-linux-amd64.tar.gz"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$out/pkg" -cf - . | gzip -n > "$archive"
sum="$(sha256sum "$archive" | cut -d' ' -f1)"
sed -i "s|^\(      sha256: \).*|\1\"$sum\"|" krew/lock-janitor.yaml
echo "krew-manifest: $archive ($sum) -> krew/lock-janitor.yaml"
