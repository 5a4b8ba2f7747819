#!/usr/bin/env bash
# make release-check: installs the release in dist/ from a registry, for real,
# on this machine:
#   1. starts a local OCI registry (distribution's registry, on 127.0.0.1);
#   2. pushes the image index (crane) and the chart (helm push);
#   3. signs the index with cosign (a throwaway key pair, no transparency log),
#      attests the SBOM, and verifies both; a wrong key must fail;
#   4. starts a test control plane (testenv up, its own state dir) and runs
#      `helm install oci://127.0.0.1:<port>/charts/lock-janitor` with the image
#      set to the pushed digest, in a namespace that enforces Pod Security
#      "restricted"; checks that every object of the release exists, that the
#      Deployment's image is exactly <registry>/lock-janitor/lock-janitor@<digest>,
#      and that its pod is admitted there (created from the Deployment's
#      template: the test control plane runs no deployment controller and no
#      kubelet, so it stays Pending);
#   5. pulls the linux/arm64 image from the index and checks that its binary
#      is aarch64 (and linux/amd64: x86-64).
# Everything it starts, it stops (also on failure); nothing outside a temp dir
# is written.
#
#   hack/release-check.sh      (after `make release`; `make release-check` runs both)
#
# Tools: hack/release-tools.sh (crane, registry, cosign); helm, kube-apiserver
# and etcd from testenv/build.sh (`make testenv-build`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { echo "release-check: $*" >&2; }
fail() { echo "release-check: FAIL: $*" >&2; exit 1; }

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
dist="$root/dist"
[ -d "$dist/image" ] && [ -f "$dist/lock-janitor-$version.tgz" ] || fail "dist/ has no release of $version: run 'make release' first"
hack/release.sh --verify

# Assigned first: `eval "$(...)"` alone would go on after a failed tool build.
tools="$(hack/release-tools.sh crane registry cosign)" || fail "hack/release-tools.sh crane registry cosign failed (see above)"
eval "$tools"
tbin="$(testenv/build.sh --print)"
for b in helm etcd kube-apiserver kube-controller-manager; do
  [ -x "$tbin/$b" ] || fail "$tbin/$b missing: run 'make testenv-build'"
done
helm="$tbin/helm"
command -v file >/dev/null 2>&1 || fail "'file' is needed (hack/setup.sh installs it)"

work="$(mktemp -d "${TMPDIR:-/tmp}/lj-release-check.XXXXXX")"
registry_pid=""
testenv_up=false
cleanup() {
  local rc=$?
  if $testenv_up; then
    LOCK_JANITOR_CACHE="$work/cache" LOCK_JANITOR_TESTENV_BIN="$tbin" \
      cargo run --locked -q -p lock-janitor-testenv --bin testenv -- down >/dev/null 2>&1 || say "testenv down failed (state in $work/cache)"
  fi
  if [ -n "$registry_pid" ]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  if [ $rc -ne 0 ] && [ -f "$work/registry.log" ]; then say "registry log (last lines):"; tail -n 20 "$work/registry.log" >&2; fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

# --- 1. registry --------------------------------------------------------------
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
reg="127.0.0.1:$port"
cat >"$work/registry.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: $reg
EOF
# No OpenTelemetry export (it would try localhost:4318).
OTEL_TRACES_EXPORTER=none "$REGISTRY" serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 1 300); do
  curl -fsS "http://$reg/v2/" >/dev/null 2>&1 && break
  kill -0 "$registry_pid" 2>/dev/null || fail "the registry exited: $(tail -n 5 "$work/registry.log")"
  sleep 0.1
done
curl -fsS "http://$reg/v2/" >/dev/null || fail "the registry does not answer on http://$reg/v2/"
say "registry $("$REGISTRY" --version 2>&1 | head -n1) on $reg"

# --- 2. push ------------------------------------------------------------------
# The push and the install are docs/install.md's "From source", exactly:
# hack/push.sh, then the command it prints.
export HELM_CONFIG_HOME="$work/helm/config" HELM_CACHE_HOME="$work/helm/cache" HELM_DATA_HOME="$work/helm/data"
install_cmd="$(PLAIN_HTTP=1 hack/push.sh "$reg/lock-janitor" 2>"$work/push.log")" \
  || { cat "$work/push.log" >&2; fail "hack/push.sh $reg/lock-janitor"; }
repo="$reg/lock-janitor/lock-janitor"
digest="${install_cmd##*image.digest=}"
ref="$repo@$digest"
want_digest="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$dist/image/index.json")"
[ "$digest" = "$want_digest" ] || fail "pushed digest $digest, the layout's index is $want_digest"
say "pushed image index $ref"
mt="$("$CRANE" manifest --insecure "$repo:$version" | python3 -c 'import json,sys; m=json.load(sys.stdin); print(m["mediaType"], sorted(d["platform"]["os"]+"/"+d["platform"]["architecture"] for d in m["manifests"]))')"
[ "$mt" = "application/vnd.oci.image.index.v1+json ['linux/amd64', 'linux/arm64']" ] || fail "registry serves $repo:$version as: $mt"

say "pushed chart oci://$reg/lock-janitor/charts/lock-janitor:$version"

export COSIGN_PASSWORD=""
(cd "$work" && "$COSIGN" generate-key-pair >/dev/null 2>&1) || fail "cosign generate-key-pair"
mkdir -p "$work/other" && (cd "$work/other" && "$COSIGN" generate-key-pair >/dev/null 2>&1) || fail "cosign generate-key-pair (wrong key)"
cosign_opts=(--allow-http-registry)
"$COSIGN" sign --yes --key "$work/cosign.key" --tlog-upload=false "${cosign_opts[@]}" "$ref" >"$work/sign.log" 2>&1 \
  || { cat "$work/sign.log" >&2; fail "cosign sign $ref"; }
"$COSIGN" attest --yes --key "$work/cosign.key" --tlog-upload=false "${cosign_opts[@]}" \
  --type cyclonedx --predicate "$dist/sbom.cdx.json" "$ref" >"$work/attest.log" 2>&1 \
  || { cat "$work/attest.log" >&2; fail "cosign attest (SBOM) $ref"; }
"$COSIGN" verify --key "$work/cosign.pub" --insecure-ignore-tlog=true "${cosign_opts[@]}" "$ref" >"$work/verify.json" 2>"$work/verify.log" \
  || { cat "$work/verify.log" >&2; fail "cosign verify $ref"; }
grep -Fq "\"docker-manifest-digest\":\"$digest\"" "$work/verify.json" || fail "the verified signature is not for $digest: $(cat "$work/verify.json")"
"$COSIGN" verify-attestation --key "$work/cosign.pub" --insecure-ignore-tlog=true "${cosign_opts[@]}" \
  --type cyclonedx "$ref" >/dev/null 2>"$work/verify-att.log" \
  || { cat "$work/verify-att.log" >&2; fail "cosign verify-attestation (SBOM) $ref"; }
if "$COSIGN" verify --key "$work/other/cosign.pub" --insecure-ignore-tlog=true "${cosign_opts[@]}" "$ref" >/dev/null 2>&1; then
  fail "cosign verify accepted a signature with the wrong public key"
fi
say "signed $ref and attested the SBOM; both verify with the key pair's public key, not with another"

# --- 4. install from oci:// into a control plane ------------------------------
say "starting a test control plane"
up="$(LOCK_JANITOR_CACHE="$work/cache" LOCK_JANITOR_TESTENV_BIN="$tbin" \
  cargo run --locked -q -p lock-janitor-testenv --bin testenv -- up 2>"$work/testenv.log")" \
  || { cat "$work/testenv.log" >&2; fail "testenv up"; }
testenv_up=true
export KUBECONFIG="${up#export KUBECONFIG=}"
[ -f "$KUBECONFIG" ] || fail "testenv up printed no kubeconfig: $up"
kubectl=("$tbin/kubectl")
ns=lock-janitor
"${kubectl[@]}" create namespace "$ns" >/dev/null
"${kubectl[@]}" label namespace "$ns" pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest >/dev/null
case "$install_cmd" in
  "helm install lock-janitor oci://$reg/lock-janitor/charts/lock-janitor --version $version --plain-http "*) ;;
  *) fail "hack/push.sh printed an unexpected install command: $install_cmd" ;;
esac
(PATH="$tbin:$PATH"; eval "$install_cmd") >"$work/install.log" 2>&1 \
  || { cat "$work/install.log" >&2; fail "$install_cmd"; }
say "$install_cmd: $(grep -m1 '^STATUS' "$work/install.log")"
"$helm" get manifest lock-janitor -n "$ns" >"$work/manifest.yaml"
n="$(python3 - "$work/manifest.yaml" "$ns" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    m = d["metadata"]
    cluster = d["kind"] in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    print(d["apiVersion"], d["kind"], "-" if cluster else m.get("namespace", sys.argv[2]), m["name"])
EOF
)" || fail "reading the release manifest"
count=0
while read -r api kind namespace name; do
  [ -n "$kind" ] || continue
  group="${api%/*}"; [ "$group" = "$api" ] && group=""
  res="$kind${group:+.$group}"
  args=(get "$res" "$name" -o name)
  [ "$namespace" != - ] && args+=(-n "$namespace")
  "${kubectl[@]}" "${args[@]}" >/dev/null 2>"$work/get.err" || fail "$kind $namespace/$name of the release does not exist: $(cat "$work/get.err")"
  count=$((count + 1))
done <<<"$n"
say "all $count objects of the release exist: $(awk '{print $2}' <<<"$n" | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}')"
image="$("${kubectl[@]}" get deployment -n "$ns" -l app.kubernetes.io/instance=lock-janitor -o jsonpath='{.items[0].spec.template.spec.containers[0].image}')"
[ "$image" = "$repo@$digest" ] || fail "the Deployment runs image '$image', want exactly '$repo@$digest'"
say "the Deployment's image is the pushed digest: $image"
# The test control plane runs no deployment controller (and no kubelet): create
# the Deployment's pod from the installed template, for real, in the namespace
# that enforces Pod Security restricted.
"${kubectl[@]}" get deployment -n "$ns" -l app.kubernetes.io/instance=lock-janitor -o json \
  | python3 -c '
import json, sys
t = json.load(sys.stdin)["items"][0]["spec"]["template"]
t["metadata"]["name"] = "lock-janitor-from-template"
print(json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": t["metadata"], "spec": t["spec"]}))' >"$work/pod.json"
"${kubectl[@]}" create -n "$ns" -f "$work/pod.json" >/dev/null 2>"$work/pod.err" \
  || fail "the Deployment's pod is refused in a Pod Security restricted namespace: $(cat "$work/pod.err")"
pod_image="$("${kubectl[@]}" get pod -n "$ns" lock-janitor-from-template -o jsonpath='{.spec.containers[0].image}')"
[ "$pod_image" = "$repo@$digest" ] || fail "the pod runs '$pod_image'"
say "the Deployment's pod is admitted under Pod Security restricted (Pending: no kubelet here)"

# --- 5. the arm64 image from the registry -------------------------------------
for plat in linux/arm64 linux/amd64; do
  d="$work/pull-${plat#*/}"; mkdir -p "$d"
  "$CRANE" export --insecure --platform "$plat" "$ref" - | tar -x -C "$d" lock-janitor \
    || fail "pulling $plat from $ref"
  desc="$(file -b "$d/lock-janitor")"
  case "$plat" in
    linux/arm64) want="ARM aarch64" ;;
    linux/amd64) want="x86-64" ;;
  esac
  grep -Fq "$want" <<<"$desc" && grep -Eq "statically linked|static-pie linked" <<<"$desc" \
    || fail "$plat from the registry: $desc (want a static $want binary)"
  say "$plat from the registry: $desc"
done

say "OK"
