#!/usr/bin/env bash
# Checks the alert rules and runs their unit tests with promtool, then checks
# that every alert has a test, a runbook section and a runbook_url that points
# at it. The rules are tested twice: the plain file (tests/alerts/alerts_test.yaml)
# and as the chart renders them into its PrometheusRule, with the default
# replicas (tests/alerts/chart_test.yaml) and with replicas: 0
# (tests/alerts/paused_test.yaml).
#
#   hack/test-alerts.sh
#
# Needs promtool (Debian package `prometheus`); installs it with apt-get when
# it is missing and we are root, otherwise says how. helm: $HELM, else the
# testenv's pinned build (testenv/build.sh --print), else PATH.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rules=charts/lock-janitor/files/prometheus-rules.yaml
tests=tests/alerts/alerts_test.yaml
runbooks=docs/runbooks.md
# The runbooks of the version the rules ship with: its tag, v<appVersion>.
app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/lock-janitor/Chart.yaml)"
runbook_base="https://github.com/lock-janitor/lock-janitor/blob/v$app_version/docs/runbooks.md"

fail() { echo "test-alerts: FAIL: $*" >&2; exit 1; }

if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test-alerts: promtool missing; installing Debian package 'prometheus'" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    fail "promtool not found; install it (Debian: apt-get install prometheus) or put it on PATH"
  fi
fi
echo "test-alerts: $(promtool --version 2>&1 | head -n1)"

[ -n "$app_version" ] || fail "no appVersion in charts/lock-janitor/Chart.yaml"
if grep -n 'runbook_url:' "$rules" | grep -vF "$runbook_base#"; then
  fail "every runbook_url of $rules must point at $runbook_base (the tag of appVersion $app_version)"
fi
promtool check rules "$rules" || fail "promtool check rules $rules"
promtool test rules "$tests" || fail "promtool test rules $tests"

# The rules as the chart renders them (release lj, namespace lock-janitor).
helm="${HELM:-}"
if [ -z "$helm" ]; then
  tb="$(testenv/build.sh --print 2>/dev/null || true)"
  if [ -n "$tb" ] && [ -x "$tb/helm" ]; then helm="$tb/helm"
  elif command -v helm >/dev/null 2>&1; then helm="$(command -v helm)"
  else fail "helm not found: set HELM, run 'testenv/build.sh', or put helm on PATH"
  fi
fi
python3 -c 'import yaml' 2>/dev/null || fail "python3 with PyYAML is needed (pip install pyyaml)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
render_rules() { # file [helm args...]: the PrometheusRule's groups as a rules file
  local file="$1"; shift
  "$helm" template lj charts/lock-janitor --namespace lock-janitor --set prometheusRule.enabled=true \
    --show-only templates/prometheusrule.yaml "$@" >"$out/$file.rendered" || fail "helm template ($file)"
  python3 -c 'import sys, yaml; d = yaml.safe_load(sys.stdin); yaml.safe_dump({"groups": d["spec"]["groups"]}, sys.stdout, sort_keys=False)' \
    <"$out/$file.rendered" >"$out/$file" || fail "$file: not a PrometheusRule"
  promtool check rules "$out/$file" >/dev/null || fail "promtool check rules ($file, as the chart renders it)"
}
render_rules chart-rules.yaml
render_rules chart-rules-paused.yaml --set replicas=0
alerts_in() { sed -n 's/^[[:space:]]*- alert:[[:space:]]*\([A-Za-z0-9_]*\).*/\1/p' "$1" | sort | tr '\n' ' '; }
for a in LockJanitorDown LockJanitorNotScraped; do
  grep -q "alert: $a\$" "$out/chart-rules.yaml" || fail "$a: not rendered with the default replicas"
  if grep -q "alert: $a\$" "$out/chart-rules-paused.yaml"; then fail "$a: rendered with replicas: 0"; fi
done
want="$(alerts_in "$rules" | tr ' ' '\n' | grep -vx 'LockJanitorDown\|LockJanitorNotScraped' | tr '\n' ' ')"
[ "$(alerts_in "$out/chart-rules-paused.yaml")" = "$want" ] \
  || fail "replicas: 0 renders $(alerts_in "$out/chart-rules-paused.yaml"), want $want"
# Nothing pages: the janitor is off the data path (docs/runbooks.md).
if grep -n "severity: critical" "$rules" "$out/chart-rules.yaml"; then fail "an alert is critical"; fi
cp tests/alerts/chart_test.yaml tests/alerts/paused_test.yaml "$out/"
promtool test rules "$out/chart_test.yaml" || fail "promtool test rules tests/alerts/chart_test.yaml (rules as the chart renders them)"
promtool test rules "$out/paused_test.yaml" || fail "promtool test rules tests/alerts/paused_test.yaml (replicas: 0)"

# Every alert: a test that names it, a runbook heading, and a runbook_url to it.
mapfile -t alerts < <(sed -n 's/^[[:space:]]*- alert:[[:space:]]*\([A-Za-z0-9_]*\).*/\1/p' "$rules")
[ "${#alerts[@]}" -gt 0 ] || fail "no alerts found in $rules"
for a in "${alerts[@]}"; do
  [[ "$a" == LockJanitor* ]] || fail "$a: alert names start with LockJanitor"
  grep -Eq "alertname:[[:space:]]*$a\$" "$tests" || fail "$a: no test in $tests"
  grep -Eq "^## $a\$" "$runbooks" || fail "$a: no '## $a' section in $runbooks"
  anchor="$(echo "$a" | tr '[:upper:]' '[:lower:]')"
  grep -Fq "runbook_url: $runbook_base#$anchor" "$rules" || fail "$a: runbook_url must be $runbook_base#$anchor"
done
echo "test-alerts: ${#alerts[@]} alerts (${alerts[*]}) have tests, runbooks and runbook_urls"
echo "test-alerts: OK"
