#!/usr/bin/env bash
# Checks the alert rules and runs their unit tests with promtool, then checks
# that every alert has a test, a runbook section and a runbook_url that points
# at it.
#
#   hack/test-alerts.sh
#
# Needs promtool (Debian package `prometheus`); installs it with apt-get when
# it is missing and we are root, otherwise says how.
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
