#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kubectl and helm from the Go
# module proxy into a cache outside the repository, keyed by the pinned
# versions. Reuses the cache when the binaries are already there.
#
#   testenv/build.sh          build when missing, print the bin dir
#   testenv/build.sh --print  only print the bin dir
#   K8S_VERSION=v1.31.14 testenv/build.sh [--print]
#                             the same for another Kubernetes version of
#                             versions.env K8S_VERSIONS (its own cache dir)
#   testenv/build.sh helm     build only the named binaries (of etcd kube-apiserver
#                             kube-controller-manager kubectl helm peers), e.g. the
#                             helm that `make release` packages the chart with
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
asked="${K8S_VERSION:-}"
# shellcheck source=versions.env
. "$here/versions.env"
# kube-apiserver, kube-controller-manager and kubectl come from k8s/ (the default
# K8S_VERSION) or k8s-1.<minor>/ (another of K8S_VERSIONS); etcd always from k8s/.
kmod="$here/k8s"
if [ -n "$asked" ] && [ "$asked" != "$K8S_VERSION" ]; then
  case " $K8S_VERSIONS " in
    *" $asked "*) ;;
    *) echo "testenv: K8S_VERSION=$asked is not served; one of: $K8S_VERSIONS (testenv/versions.env K8S_VERSIONS)" >&2; exit 2 ;;
  esac
  K8S_VERSION="$asked"
  kminor="${K8S_VERSION#v1.}"; kminor="${kminor%%.*}"
  kmod="$here/k8s-1.$kminor"
  # A Go toolchain of its own, if versions.env names one for this minor.
  gt_var="GO_TOOLCHAIN_1_$kminor"
  if [ -n "${!gt_var:-}" ]; then export GOTOOLCHAIN="${!gt_var}"; fi
fi

key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
cache="${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-janitor}/testenv/$key"
bin="$cache/bin"
if [ "${1:-}" = "--print" ]; then echo "$bin"; exit 0; fi

all=(etcd kube-apiserver kube-controller-manager kubectl helm peers)
want=("${all[@]}")
if [ $# -gt 0 ]; then
  for b in "$@"; do
    case " ${all[*]} " in *" $b "*) ;; *) echo "testenv: unknown binary '$b' (one of: ${all[*]})" >&2; exit 2 ;; esac
  done
  want=("$@")
fi
wanted() { case " ${want[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
missing=()
for b in "${want[@]}"; do [ "$b" = peers ] || [ -x "$bin/$b" ] || missing+=("$b"); done
# The real leader-election peers (peers/): rebuilt whenever their sources change.
peers_sum="$(cat "$here/peers/go.mod" "$here/peers/go.sum" "$here"/peers/*.go | sha256sum | cut -c1-16)"
if wanted peers && { [ ! -x "$bin/peers" ] || [ "$(cat "$bin/peers.sum" 2>/dev/null)" != "$peers_sum" ]; }; then missing+=(peers); fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "testenv: binaries cached in $bin" >&2
  echo "$bin"; exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "testenv: 'go' is not on PATH; install Go >= 1.26 (https://go.dev/doc/install) and run 'make testenv-build' again" >&2
  exit 1
fi

# The versions in versions.env and the go.mod files must agree.
grep -q "k8s.io/kubernetes ${K8S_VERSION}\( //.*\)\?$" "$kmod/go.mod" || { echo "testenv: ${kmod#"$here"/}/go.mod does not require k8s.io/kubernetes ${K8S_VERSION} (versions.env; testenv/k8s-mod.sh writes k8s-1.<minor>/)" >&2; exit 1; }
grep -q "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}\( //.*\)\?$" "$here/k8s/go.mod" || { echo "testenv: k8s/go.mod does not require etcd server ${ETCD_VERSION} (versions.env)" >&2; exit 1; }
grep -q "helm.sh/helm/v3 ${HELM_VERSION}\( //.*\)\?$" "$here/helm/go.mod" || { echo "testenv: helm/go.mod does not require helm ${HELM_VERSION} (versions.env)" >&2; exit 1; }

mkdir -p "$bin" "$cache/log"
tmp="$(mktemp -d "$cache/build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

run() { # name dir log -- go build args...
  local name="$1" dir="$2" log="$3"; shift 3
  echo "testenv: building $name (log: $log)" >&2
  local start=$SECONDS
  if ! (cd "$dir" && go build -trimpath "$@") >"$log" 2>&1; then
    echo "testenv: building $name failed; last lines of $log:" >&2
    tail -n 30 "$log" >&2
    echo "testenv: fix the cause above, then run 'make testenv-build' again" >&2
    exit 1
  fi
  echo "testenv: built $name in $((SECONDS - start))s" >&2
}

# Stamp the release into the Kubernetes binaries, as hack/lib/version.sh does.
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
kv=k8s.io/component-base/version
cv=k8s.io/client-go/pkg/version
ld="-s -w"
for p in $kv $cv; do
  ld="$ld -X $p.gitVersion=${K8S_VERSION} -X $p.gitMajor=1 -X $p.gitMinor=${minor} -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

if wanted etcd && [ ! -x "$bin/etcd" ]; then
  run etcd "$here/k8s" "$cache/log/etcd.log" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
  mv "$tmp/etcd" "$bin/etcd"
fi
for c in kube-apiserver kube-controller-manager kubectl; do
  if wanted "$c" && [ ! -x "$bin/$c" ]; then
    run "$c" "$kmod" "$cache/log/$c.log" -ldflags "$ld" -o "$tmp/$c" "k8s.io/kubernetes/cmd/$c"
    mv "$tmp/$c" "$bin/$c"
  fi
done
if wanted helm && [ ! -x "$bin/helm" ]; then
  # As helm's Makefile does: the Kubernetes version helm assumes for
  # .Capabilities and lint comes from its client-go (v0.37.x -> 1.37).
  hv=helm.sh/helm/v3/internal/version
  cgo="$(cd "$here/helm" && go list -m -f '{{.Version}}' k8s.io/client-go)"
  kminor="${cgo#v0.}"; kminor="${kminor%%.*}"
  hld="-s -w -X $hv.version=${HELM_VERSION} -X $hv.gitTreeState=clean"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    hld="$hld -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=${kminor}"
  done
  run helm "$here/helm" "$cache/log/helm.log" -ldflags "$hld" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm
  mv "$tmp/helm" "$bin/helm"
fi
if wanted peers && { [ ! -x "$bin/peers" ] || [ "$(cat "$bin/peers.sum" 2>/dev/null)" != "$peers_sum" ]; }; then
  run peers "$here/peers" "$cache/log/peers.log" -ldflags "-s -w" -o "$tmp/peers" .
  mv "$tmp/peers" "$bin/peers"
  echo "$peers_sum" >"$bin/peers.sum"
fi
echo "$bin"
