#!/usr/bin/env bash
# Lints and renders the chart with its default values and with every CI values
# file, checks the rendered objects (hack/check_chart_render.py), and checks
# that bad values are refused.
#
#   hack/test-chart.sh
#
# helm: $HELM, else the testenv's pinned build (testenv/build.sh --print), else
# PATH. This script does not build helm; `make testenv-build` does.
set -euo pipefail
# `CMD | has PATTERN`: grep -q on all of CMD's output, read to the end first
# (a bare `| grep -q` exits at the first match, CMD then dies of SIGPIPE,
# and pipefail turns the match into a failure).
has() { local out; out=$(cat); grep -q "$@" <<<"$out"; }
cd "$(dirname "${BASH_SOURCE[0]}")/.."

chart=charts/lock-janitor
ns=lj-test
fail() { echo "test-chart: FAIL: $*" >&2; exit 1; }

helm="${HELM:-}"
if [ -z "$helm" ]; then
  tb="$(testenv/build.sh --print 2>/dev/null || true)"
  if [ -n "$tb" ] && [ -x "$tb/helm" ]; then helm="$tb/helm"
  elif command -v helm >/dev/null 2>&1; then helm="$(command -v helm)"
  else fail "helm not found: set HELM, run 'testenv/build.sh', or put helm on PATH"
  fi
fi
python3 -c 'import yaml' 2>/dev/null || fail "python3 with PyYAML is needed (pip install pyyaml)"
echo "test-chart: $("$helm" version --short 2>&1)"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

render() { # case [helm args...]; --api-versions (helm template only) is not passed to lint
  local case="$1"; shift
  local lint_args=() a
  for a in "$@"; do case "$a" in --api-versions=*) ;; *) lint_args+=("$a") ;; esac; done
  "$helm" lint --strict "$chart" --namespace "$ns" "${lint_args[@]}" || fail "helm lint ($case)"
  "$helm" template lj "$chart" --namespace "$ns" "$@" >"$out/$case.yaml" || fail "helm template ($case)"
  python3 hack/check_chart_render.py "$case" "$ns" <"$out/$case.yaml" || fail "rendered objects ($case)"
}
render defaults
render all-on -f "$chart/ci/all-on-values.yaml"
render namespaced -f "$chart/ci/namespaced-values.yaml"
# As on OpenShift: its API present; the pod must pass the restricted-v2 SCC.
render openshift --api-versions=security.openshift.io/v1 --api-versions=security.openshift.io/v1/SecurityContextConstraints

# The OpenShift check has teeth: a fixed UID (the old default) is refused.
"$helm" template lj "$chart" --namespace "$ns" --api-versions=security.openshift.io/v1 \
  --set podSecurityContext.runAsUser=65532 >"$out/fixed-uid.yaml" || fail "helm template (fixed-uid)"
if python3 hack/check_chart_render.py openshift "$ns" <"$out/fixed-uid.yaml" >"$out/fixed-uid.err"; then
  fail "check_chart_render.py passed a pod with a fixed runAsUser under restricted-v2"
fi
grep -q "restricted-v2: pod securityContext fixes runAsUser" "$out/fixed-uid.err" || { cat "$out/fixed-uid.err" >&2; fail "fixed-uid: not refused for runAsUser"; }
echo "test-chart: refused a fixed runAsUser under restricted-v2"

# The conventions of its peers (registry mirrors, common labels, a namespace
# override, ServiceMonitor and PrometheusRule knobs).
"$helm" template lj "$chart" --namespace "$ns" -f hack/conventions-values.yaml >"$out/conventions.yaml" \
  || fail "helm template (conventions)"
python3 hack/check_chart_conventions.py lj-override <"$out/conventions.yaml" || fail "chart conventions"

refuse() { # description expected-message helm-args...
  local what="$1" want="$2"; shift 2
  if "$helm" template lj "$chart" --namespace "$ns" "$@" >/dev/null 2>"$out/err"; then
    fail "$what was accepted"
  fi
  grep -Fq "$want" "$out/err" || { cat "$out/err" >&2; fail "$what: error does not say '$want'"; }
  echo "test-chart: refused $what: $(grep -F "$want" "$out/err" | head -n1 | cut -c1-160)"
}
refuse "a grace period below the drain bound" "terminationGracePeriodSeconds" --set terminationGracePeriodSeconds=10
refuse "an unknown top-level key" "replica" --set replica=1
refuse "a string for dryRun" "dryRun" --set-string dryRun=yes
refuse "a number for ownerGoneGrace" "ownerGoneGrace" --set ownerGoneGrace=30
refuse "logFormat: xml" "logFormat" --set logFormat=xml
# The janitor's own bounds (src/cli.rs), at render time rather than in a
# crash-looping pod; tests/e2e/chart.rs asks the binary about each bound.
refuse "a 1s leader lease" 'leaderElection.leaseDuration "1s" is out of range' --set leaderElection.leaseDuration=1s
refuse "a 48h resync" 'resync "48h" is out of range' --set resync=48h
refuse "a 1ms resync" 'resync "1ms" is out of range' --set resync=1ms
refuse "an ownerGoneGrace of 0" 'ownerGoneGrace "0s" is out of range' --set ownerGoneGrace=0s
refuse "an ownerGoneGrace over 24h" 'ownerGoneGrace "24h 1s" is out of range' --set "ownerGoneGrace=24h 1s"
refuse "a takeoverTimeout of 0" 'takeoverTimeout "0s" is out of range' --set takeoverTimeout=0s
refuse "a unit the janitor does not know" '"x" is not a unit' --set ownerGoneGrace=30x
refuse "a misspelt serviceMonitor key" "enable" --set serviceMonitor.enable=true
refuse "an unknown alert in prometheusRule.disabled" "LockJanitorTypo" --set prometheusRule.disabled.LockJanitorTypo=true
refuse "logLevel: loud" "logLevel" --set logLevel=loud
refuse "a takeoverTimeout Prometheus cannot wait" "takeoverTimeout" --set prometheusRule.enabled=true --set takeoverTimeout=5min
refuse "Kubernetes 1.30" "requires kubeVersion: >=1.31.0-0" --kube-version 1.30.0
# The delete guard, the auto opt-in policy and the carry-over enforce one
# key=value label: any other selector would be half-enforced.
sel_values="$(mktemp)"; printf 'selector: "team=a,lock-janitor.io/watch=true"\n' >"$sel_values"
refuse "a selector of two terms" "the chart takes exactly one key=value label" -f "$sel_values"
rm -f "$sel_values"
refuse "a selector without a value" "the chart takes exactly one key=value label" --set selector=lock-janitor.io/watch
refuse "a set-based selector" "the chart takes exactly one key=value label" --set "selector=lock-janitor.io/watch in (true)"
refuse "serviceAccount.create=false without a name" "serviceAccount.create=false needs serviceAccount.name" --set serviceAccount.create=false
# The delete guard: on by default, also under plain `helm template` (GitOps
# pipelines that render manifests see no cluster); false never renders it,
# even where the API is served. Nothing is said on stderr.
vap=admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy
guard() { # case want(0|2) helm-args...: renders and counts the policy and its binding
  local case="$1" want="$2"; shift 2
  "$helm" template lj "$chart" --namespace "$ns" "$@" >"$out/guard-$case.yaml" 2>"$out/guard-$case.err" \
    || { cat "$out/guard-$case.err" >&2; fail "helm template (guard $case)"; }
  [ ! -s "$out/guard-$case.err" ] || { cat "$out/guard-$case.err" >&2; fail "guard $case: helm printed something on stderr"; }
  python3 hack/check_chart_render.py guard "$ns" <"$out/guard-$case.yaml" >/dev/null || fail "rendered objects (guard $case)"
  local n
  n="$(grep -cE '^kind: ValidatingAdmissionPolicy(Binding)?$' "$out/guard-$case.yaml" || true)"
  [ "$n" = "$want" ] || fail "guard $case: $n of the policy and its binding rendered, want $want"
  echo "test-chart: guard $case: $n of the policy and its binding"
}
guard "default, plain helm template" 2
guard "default, API served" 2 --api-versions "$vap"
guard "\"true\" (a string)" 2 --set-string admissionPolicies.deleteGuard.enabled=true
guard "false, API served" 0 --api-versions "$vap" --set admissionPolicies.deleteGuard.enabled=false
guard "\"false\" (a string), API served" 0 --api-versions "$vap" --set-string admissionPolicies.deleteGuard.enabled=false
grep -q "name: lj-lock-janitor-$ns-guard" "$out/guard-default, plain helm template.yaml" || fail "guard default: not named <fullname>-<namespace>-guard"
refuse "deleteGuard.enabled=yes" "deleteGuard" --set admissionPolicies.deleteGuard.enabled=yes
# auto is gone: the guard no longer depends on what helm sees of a cluster.
refuse "deleteGuard.enabled=auto" "deleteGuard" --set admissionPolicies.deleteGuard.enabled=auto

# The topology spread: the default's labelSelector is the janitor's pods';
# [] renders none; a constraint without a labelSelector gets them too.
"$helm" template lj "$chart" --namespace "$ns" --set-json 'topologySpreadConstraints=[]' >"$out/spread-none.yaml" || fail "helm template (no spread)"
grep -q "topologySpreadConstraints" "$out/spread-none.yaml" && fail "topologySpreadConstraints=[] still renders a spread"
"$helm" template lj "$chart" --namespace "$ns" --set-json \
  'topologySpreadConstraints=[{"maxSkew":2,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"DoNotSchedule"}]' \
  >"$out/spread-own.yaml" || fail "helm template (own spread)"
python3 - "$out/spread-own.yaml" <<'PY' || fail "a spread without a labelSelector does not count the janitor's pods"
import sys, yaml
dep = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment")
got = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
want = [{"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]}}]
assert got == want, got
PY
echo "test-chart: the topology spread counts the janitor's pods unless told otherwise"
refuse "a spread without a topologyKey" "topologyKey" --set-json 'topologySpreadConstraints=[{"maxSkew":1,"whenUnsatisfiable":"ScheduleAnyway"}]'

# NOTES: with election, the logs of the leader (the holder of the Lease), not
# of deploy/ (either replica); and `check`.
# `helm install --dry-run=client` still asks for a cluster, so the NOTES are
# rendered through a copy of the chart with one more template that includes
# them.
cp -a "$chart" "$out/notes-chart"
cat >"$out/notes-chart/templates/zz-notes.yaml" <<'EOF_NOTES'
apiVersion: v1
kind: ConfigMap
metadata:
  name: notes
data:
  notes: {{ include "lock-janitor/templates/NOTES.txt" . | toJson }}
EOF_NOTES
notes() { # file helm-args...: the NOTES as `helm install` prints them
  local f="$1"; shift
  "$helm" template lj "$out/notes-chart" --namespace "$ns" --show-only templates/zz-notes.yaml "$@" \
    | python3 -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["data"]["notes"])' >"$f" \
    || fail "rendering the NOTES"
  [ -s "$f" ] || fail "no NOTES rendered"
}
notes "$out/notes.txt"
grep -Fq "lock-janitor check -n $ns --release lj" "$out/notes.txt" || { cat "$out/notes.txt" >&2; fail "NOTES do not point at check"; }
grep -Fq "kubectl get lease -n $ns lj-lock-janitor -o jsonpath='{.spec.holderIdentity}'" "$out/notes.txt" \
  || { cat "$out/notes.txt" >&2; fail "NOTES do not find the leader"; }
grep -Fq 'kubectl logs -n '"$ns"' "pod/$leader"' "$out/notes.txt" || { cat "$out/notes.txt" >&2; fail "NOTES do not show the leader's logs"; }
grep -Fq "deploy/" "$out/notes.txt" && { cat "$out/notes.txt" >&2; fail "NOTES show deploy/ logs (either replica) with election on"; }
notes "$out/notes-one.txt" --set replicas=1
grep -Fq "kubectl logs -n $ns deploy/lj-lock-janitor" "$out/notes-one.txt" || { cat "$out/notes-one.txt" >&2; fail "NOTES of one replica do not show its logs"; }
echo "test-chart: NOTES point at check and at the leader's logs"

# Auto opt-in: on by default with the default exclusions; one value turns
# it off, another sets the exclusions ([] renders an empty flag: none).
ao() { "$helm" template lj "$chart" --namespace "$ns" "$@" | grep -E -- '--(auto-opt-in|exclude-namespaces)' || true; }
[ "$(ao | tr -d ' "-' )" = "$(printf 'autooptin\nexcludenamespaces=kubesystem,kubepublic,kubenodelease,openshift*')" ] \
  || fail "auto opt-in defaults: $(ao)"
ao --set autoOptIn.enabled=false | has -- '--auto-opt-in' && fail "autoOptIn.enabled=false still renders --auto-opt-in"
ao --set-json 'autoOptIn.excludeNamespaces=[]' | has -- '"--exclude-namespaces="' || fail "autoOptIn.excludeNamespaces=[] does not render an empty --exclude-namespaces"
refuse "a namespace glob with a space" "does not match pattern" --set-json 'autoOptIn.excludeNamespaces=["kube system"]'
echo "test-chart: auto opt-in on by default, off with autoOptIn.enabled=false, exclusions from autoOptIn.excludeNamespaces"

# The delete guard lets the janitor label a renewed Lease only for
# --auto-opt-in: not rendered with autoOptIn.enabled=false, and refused in
# the excluded namespaces (their globs as anchored regexes, matching as the
# binary's globs do; tests/e2e/admission.rs shows the refusal).
guard_of() { "$helm" template lj "$chart" --namespace "$ns" --show-only templates/admission-delete-guard.yaml "$@"; }
renewed_branch='variables.heldLease && !variables.excludedNamespace'
guard_of | has -F "$renewed_branch" || fail "the guard's label branch for renewed Leases is not rendered by default"
guard_of --set autoOptIn.enabled=false | has -F "variables.heldLease && !variables.excludedNamespace" \
  && fail "autoOptIn.enabled=false still renders the guard's label branch for renewed Leases"
guard_of --set autoOptIn.enabled=false | has -F "excludedNamespace" \
  && fail "autoOptIn.enabled=false still renders excludedNamespace"
guard_of --set autoOptIn.enabled=false | has -F "((variables.forLifeLease) &&" \
  || fail "autoOptIn.enabled=false does not keep the label branch for Leases held for life"
guard_of --set-json 'autoOptIn.excludeNamespaces=["kube-system","team-?","ci-*","a[bc]d"]' | python3 -c '
import re, sys, yaml
policy = next(d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] == "ValidatingAdmissionPolicy")
expr = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "excludedNamespace")
m = re.fullmatch(r"(\[.*\])\.exists\(re, request\.namespace\.matches\(re\)\)", expr.strip())
assert m, expr
regexes = yaml.safe_load(m.group(1))
excluded = lambda ns: any(re.search(r, ns) for r in regexes)
for ns in ["kube-system", "team-a", "ci-", "ci-42", "abd", "acd"]:
    assert excluded(ns), (ns, regexes)
for ns in ["kube-systems", "my-kube-system", "team-ab", "team-", "xci-1", "aed", "ops"]:
    assert not excluded(ns), (ns, regexes)
' || fail "the guard's excluded namespaces do not match as the globs do"
guard_of --set-json 'autoOptIn.excludeNamespaces=[]' | grep -A2 "name: excludedNamespace" | has "^ *false$" \
  || fail "autoOptIn.excludeNamespaces=[] does not render excludedNamespace as false"
echo "test-chart: the guard labels renewed Leases only with autoOptIn.enabled, never in autoOptIn.excludeNamespaces"

echo "test-chart: OK"
