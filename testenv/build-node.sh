#!/usr/bin/env bash
# Builds the optional real node beside the control plane's binaries (the bin dir
# of build.sh --print), from Go modules: kubelet and kube-scheduler at the control
# plane's version, containerd 2.x with its runc shim and ctr, runc (cgo, with
# seccomp from Debian's libseccomp-dev), the CNI plugins loopback, bridge and
# host-local (into bin/cni/), crictl, and the pause binary (pause.c of
# k8s.io/kubernetes, static, gcc). build.sh never calls this; `make node-up` does.
#
#   testenv/build-node.sh          build what is missing or stale, print the bin dir
#   testenv/build-node.sh --print  only print the bin dir
#
# Each build is timed (nice -n 10: the 2 cores are shared) into <cache>/log/node-times.txt.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/versions.env"
. "$here/node/versions.env"
bin="$("$here/build.sh" --print)"
if [ "${1:-}" = "--print" ]; then echo "$bin"; exit 0; fi
cache="$(dirname "$bin")"
say() { echo "build-node: $*" >&2; }

# Rebuild everything when any pinned version or module changes.
sum="$(cat "$here/versions.env" "$here/node/versions.env" "$here"/node/*/go.mod "$here"/node/*/go.sum | sha256sum | cut -c1-16)"
want=(kubelet kube-scheduler containerd containerd-shim-runc-v2 ctr runc crictl pause cni/loopback cni/bridge cni/host-local)
missing=()
stale=0
[ "$(cat "$bin/node.sum" 2>/dev/null)" = "$sum" ] || stale=1
for b in "${want[@]}"; do
  if [ $stale = 1 ] || [ ! -x "$bin/$b" ]; then missing+=("$b"); fi
done
if [ ${#missing[@]} -eq 0 ]; then
  say "node binaries cached in $bin"
  echo "$bin"; exit 0
fi
has() { local x; for x in "${missing[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }

command -v go >/dev/null 2>&1 || { say "'go' is not on PATH; install Go >= 1.26"; exit 1; }
# Pinned versions and go.mod files must agree.
chk() { grep -q "^[[:space:]]*$1 $2\( //.*\)\?$" "$here/node/$3/go.mod" || { say "node/$3/go.mod does not require $1 $2 (versions.env)"; exit 1; }; }
chk k8s.io/kubernetes "$K8S_VERSION" k8s
chk github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" containerd
chk github.com/opencontainers/runc "$RUNC_VERSION" runc
chk github.com/containernetworking/plugins "$CNI_PLUGINS_VERSION" cni
chk sigs.k8s.io/cri-tools "$CRI_TOOLS_VERSION" cri-tools

# runc's seccomp support links libseccomp (cgo): Debian's libseccomp-dev.
if has runc && ! pkg-config --exists libseccomp 2>/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian's libseccomp-dev (runc's seccomp filter, cgo)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config >/dev/null; }
  else
    say "runc needs libseccomp-dev: run: sudo apt-get install -y libseccomp-dev pkg-config"; exit 1
  fi
fi

mkdir -p "$bin/cni" "$cache/log"
times="$cache/log/node-times.txt"
tmp="$(mktemp -d "$cache/build-node.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

run() { # name module-dir -- go build args...
  local name="$1" dir="$2" log="$cache/log/node-$1.log"; shift 2
  say "building $name (log: $log)"
  local start=$SECONDS
  if ! (cd "$dir" && nice -n 10 go build -trimpath "$@") >"$log" 2>&1; then
    say "building $name failed; last lines of $log:"
    tail -n 30 "$log" >&2
    exit 1
  fi
  say "built $name in $((SECONDS - start))s"
  echo "$(date -u +%FT%TZ) $name $((SECONDS - start))s" >>"$times"
}

# kubelet, kube-scheduler: stamped as build.sh stamps the control plane.
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld="$ld -X $p.gitVersion=${K8S_VERSION} -X $p.gitMajor=1 -X $p.gitMinor=${minor} -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
for c in kubelet kube-scheduler; do
  if has $c; then
    run $c "$here/node/k8s" -ldflags "$ld" -o "$tmp/$c" "k8s.io/kubernetes/cmd/$c"
    mv "$tmp/$c" "$bin/$c"
  fi
done

# containerd, its runc shim and ctr; version stamped as containerd's Makefile does.
cld="-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION} -X github.com/containerd/containerd/v2/version.Revision=module"
for c in containerd containerd-shim-runc-v2 ctr; do
  if has $c; then
    # The shim is static in containerd's releases (it is exec'd in odd mount namespaces).
    cgo=1; [ $c = containerd-shim-runc-v2 ] && cgo=0
    (export CGO_ENABLED=$cgo; run $c "$here/node/containerd" -ldflags "$cld" -o "$tmp/$c" "github.com/containerd/containerd/v2/cmd/$c")
    mv "$tmp/$c" "$bin/$c"
  fi
done

# runc with seccomp (cgo), as runc's Makefile builds it by default.
if has runc; then
  (export CGO_ENABLED=1; run runc "$here/node/runc" -tags "seccomp urfave_cli_no_docs" \
    -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -X main.gitCommit=module" -o "$tmp/runc" github.com/opencontainers/runc)
  mv "$tmp/runc" "$bin/runc"
fi

# CNI plugins (static, as their release builds them).
for p in main/loopback main/bridge ipam/host-local; do
  n="${p#*/}"
  if has "cni/$n"; then
    (export CGO_ENABLED=0; run "cni-$n" "$here/node/cni" \
      -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=${CNI_PLUGINS_VERSION}" \
      -o "$tmp/$n" "github.com/containernetworking/plugins/plugins/$p")
    mv "$tmp/$n" "$bin/cni/$n"
  fi
done

if has crictl; then
  (export CGO_ENABLED=0; run crictl "$here/node/cri-tools" \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${CRI_TOOLS_VERSION}" -o "$tmp/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
  mv "$tmp/crictl" "$bin/crictl"
fi

# pause: the sandbox's init, from k8s.io/kubernetes's own build/pause/linux/pause.c.
if has pause; then
  src="$(cd "$here/node/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  [ -f "$src" ] || (cd "$here/node/k8s" && go mod download k8s.io/kubernetes)
  say "building pause from $src"
  start=$SECONDS
  gcc -Os -Wall -Werror -static -DVERSION="${PAUSE_IMAGE##*:}-lock-janitor" -o "$tmp/pause" "$src"
  strip "$tmp/pause"
  echo "$(date -u +%FT%TZ) pause $((SECONDS - start))s" >>"$times"
  mv "$tmp/pause" "$bin/pause"
fi

echo "$sum" >"$bin/node.sum"
say "node binaries in $bin (build times: $times)"
echo "$bin"
