#!/usr/bin/env bash
# make push REGISTRY=<host>[/<path>]: pushes what `make release` built into
# dist/ to your own OCI registry, then prints the one command that installs
# it (stdout, one line; progress goes to stderr):
#
#   <REGISTRY>/lock-janitor:<version>      the image index (linux/amd64, linux/arm64)
#   oci://<REGISTRY>/charts/lock-janitor   the chart, version <version>
#
#   hack/push.sh registry.example.com/platform
#   PLAIN_HTTP=1 hack/push.sh 127.0.0.1:5000/test   a registry without TLS
#
# Log in first as each tool expects: crane (or docker) login for the image,
# `helm registry login` for the chart. The tools are the release's own
# (hack/release-tools.sh crane; helm from testenv/build.sh). make
# release-check pushes with this script and installs with the command it
# prints, so docs/install.md ("From source") cannot drift from it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { echo "push: $*" >&2; }
fail() { echo "push: FAIL: $*" >&2; exit 1; }

registry="${1:-${REGISTRY:-}}"
registry="${registry%/}"
[ -n "$registry" ] || fail "say where: hack/push.sh <host>[/<path>] (or make push REGISTRY=...)"
case "$registry" in
  *://*) fail "REGISTRY is a host and path, without a scheme: '$registry'" ;;
esac
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
dist="$root/dist"
[ -d "$dist/image" ] && [ -f "$dist/lock-janitor-$version.tgz" ] \
  || fail "dist/ has no release of $version: run 'make release' first"

tools="$(hack/release-tools.sh crane)" || fail "hack/release-tools.sh crane failed (see above)"
eval "$tools"
helm="$(testenv/build.sh --print)/helm"
[ -x "$helm" ] || fail "$helm missing: run 'make testenv-build'"

crane_opts=() helm_opts=()
if [ -n "${PLAIN_HTTP:-}" ]; then
  crane_opts=(--insecure) helm_opts=(--plain-http)
fi

repo="$registry/lock-janitor"
ref="$("$CRANE" push "${crane_opts[@]}" "$dist/image" "$repo:$version")" \
  || fail "crane push $dist/image $repo:$version"
digest="${ref##*@}"
say "pushed the image: $ref"
"$helm" push "$dist/lock-janitor-$version.tgz" "oci://$registry/charts" "${helm_opts[@]}" >&2 \
  || fail "helm push $dist/lock-janitor-$version.tgz oci://$registry/charts"
say "pushed the chart: oci://$registry/charts/lock-janitor --version $version"

# The chart names its image registry/repository@digest; registry is left
# empty so that the repository carries the whole path.
echo "helm install lock-janitor oci://$registry/charts/lock-janitor --version $version${helm_opts:+ ${helm_opts[*]}} --namespace lock-janitor --create-namespace --set image.registry= --set image.repository=$repo --set image.digest=$digest"
