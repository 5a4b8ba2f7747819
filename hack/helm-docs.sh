#!/usr/bin/env bash
# Generates charts/lock-janitor/README.md from values.yaml (`# --` comments)
# and README.md.gotmpl with helm-docs, built from its Go module into the
# cache outside the repository (as testenv/build.sh builds its tools).
#
#   hack/helm-docs.sh          rewrite the chart's README.md
#   hack/helm-docs.sh --check  fail when it is not what helm-docs generates
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=v1.14.2
cache="${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-janitor}/helm-docs-$version"
bin="$cache/bin/helm-docs"
chart=charts/lock-janitor

if [ ! -x "$bin" ]; then
  command -v go >/dev/null 2>&1 || { echo "helm-docs: 'go' is not on PATH; install Go >= 1.22" >&2; exit 1; }
  echo "helm-docs: building github.com/norwoodj/helm-docs $version into $cache" >&2
  mkdir -p "$cache/bin"
  GOBIN="$cache/bin" GOFLAGS=-trimpath go install "github.com/norwoodj/helm-docs/cmd/helm-docs@$version" >&2
fi

# Sorted as in values.yaml; tests/e2e/docs.rs checks that every value is listed.
args=(--chart-search-root "$chart" --template-files README.md.gotmpl --sort-values-order file
      --skip-version-footer --log-level warning)
if [ "${1:-}" = "--check" ]; then
  want="$(mktemp)"; trap 'rm -f "$want"' EXIT
  "$bin" "${args[@]}" --dry-run >"$want"
  if ! diff -u "$chart/README.md" "$want" >&2; then
    echo "helm-docs: $chart/README.md is not current; run hack/helm-docs.sh and commit it" >&2
    exit 1
  fi
  echo "helm-docs: $chart/README.md is current" >&2
else
  "$bin" "${args[@]}"
  echo "helm-docs: wrote $chart/README.md" >&2
fi
