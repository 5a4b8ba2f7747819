#!/usr/bin/env bash
# make test-compat: a compat subset of tests/e2e on the control plane of each
# Kubernetes minor (docs/compatibility.md). For each version: build its
# binaries if needed (testenv/build.sh), run the subset with
# LOCK_JANITOR_TESTENV_BIN at that version's bin dir, then print a table
# version x feature (pass/fail). Exits non-zero if any
# feature failed on any version. Not part of make test or .ci/run (too long:
# about 7 minutes per version to build, 2-4 to run).
#
#   hack/test-compat.sh                             every version of versions.env K8S_VERSIONS
#   VERSIONS="v1.31.14 v1.37.2" hack/test-compat.sh
#   COMPAT_THREADS=2 hack/test-compat.sh            test threads (default 4)
#
# Logs and the results (results.tsv: date, commit, version, feature, result,
# test seconds; this run's, and appended to history.tsv) go to $COMPAT_LOGS
# (default <cargo target dir>/compat).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cargo="${CARGO:-cargo}"
# shellcheck source=../testenv/versions.env
. testenv/versions.env
versions="${VERSIONS:-$K8S_VERSIONS}"
threads="${COMPAT_THREADS:-4}"
target="${CARGO_TARGET_DIR:-$root/target}"
logs="${COMPAT_LOGS:-$target/compat}"
mkdir -p "$logs"
say() { echo "test-compat: $*" >&2; }

for v in $versions; do
  case " $K8S_VERSIONS " in
    *" $v "*) ;;
    *) say "$v is not one of testenv/versions.env K8S_VERSIONS ($K8S_VERSIONS)"; exit 2 ;;
  esac
done

# feature -> the tests (tests/e2e, module::name) that must all pass for it.
features=(reclaim lease guard auto-opt-in chart check scan-label)
declare -A tests_of=(
  [reclaim]="janitor::evicted_holder_lock_is_reclaimed janitor::preempted_holder_lock_is_reclaimed janitor::shutdown_holder_lock_is_reclaimed janitor::otherwise_failed_holder_lock_is_reclaimed janitor::succeeded_holder_lock_is_reclaimed janitor::live_ambiguous_and_unmanageable_locks_survive_resyncs restore::a_lock_recreated_while_no_janitor_ran_is_labeled_after_the_restart"
  [lease]="leases::real_candidate_leads_within_seconds_after_its_leaders_eviction leases::a_lease_held_for_life_is_deleted_and_its_candidate_takes_it"
  [guard]="admission::the_guard_refuses_what_rbac_allows_and_lets_the_janitor_work"
  [auto-opt-in]="auto_opt_in::a_real_operator_lib_lock_is_protected_with_no_human_step auto_opt_in::a_lease_whose_label_was_removed_is_labeled_again"
  [chart]="chart::rendered_manifests_pass_server_side_dry_run chart::chart_rbac_reclaims_without_delete_pod"
  [check]="check::a_healthy_install_passes"
  [scan-label]="scan::scan_finds_candidates_and_judges_them_like_the_controller scan::label_is_a_dry_run_by_default_and_labels_exactly_the_candidates scan::controller_reclaims_a_newly_labeled_stale_lock"
)
all_tests=()
for f in "${features[@]}"; do
  # shellcheck disable=SC2206
  all_tests+=(${tests_of[$f]})
done

# The e2e test binary, built once (its janitor binary too).
say "building the e2e tests (target dir $target)"
built="$logs/built.json"
"$cargo" test --locked --test e2e --no-run --message-format=json-render-diagnostics >"$built"
e2e="$(python3 - "$built" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == "e2e" and m["profile"]["test"]:
        print(m["executable"])
        break
EOF
)"
[ -x "$e2e" ] || { say "FAIL: the e2e test binary is missing from $built"; exit 1; }

commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit+dirty"
fi
date="$(date -u +%F)"
results="$logs/results.tsv"
: >"$results"
declare -A cell secs build_secs
failed=0

for v in $versions; do
  log="$logs/$v.log"
  start=$SECONDS
  say "$v: building (testenv/build.sh; log $logs/$v.build.log)"
  if ! bin="$(K8S_VERSION="$v" testenv/build.sh 2>"$logs/$v.build.log")"; then
    tail -n 20 "$logs/$v.build.log" >&2
    build_secs[$v]=$((SECONDS - start))
    secs[$v]=0
    for f in "${features[@]}"; do cell[$v,$f]="fail (build)"; done
    failed=1
    continue
  fi
  build_secs[$v]=$((SECONDS - start))
  got="$("$bin/kube-apiserver" --version 2>/dev/null || true)"
  if [ "$got" != "Kubernetes $v" ]; then
    say "$v: $bin/kube-apiserver --version says '$got'"
    for f in "${features[@]}"; do cell[$v,$f]="fail (binary)"; done
    secs[$v]=0; failed=1
    continue
  fi
  start=$SECONDS
  say "$v: running ${#all_tests[@]} tests (threads: $threads; log $log)"
  # --show-output: the tests' own lines (compat: ...) of passing tests too.
  set +e
  LOCK_JANITOR_TESTENV_BIN="$bin" "$e2e" --exact --test-threads="$threads" --show-output \
    "${all_tests[@]}" >"$log" 2>&1
  rc=$?
  set -e
  secs[$v]=$((SECONDS - start))
  ran="$(grep -c '^test .* \.\.\. \(ok\|FAILED\|ignored\)$' "$log" || true)"
  if [ "$ran" -ne "${#all_tests[@]}" ]; then
    say "$v: $ran of ${#all_tests[@]} tests reported a result (exit $rc); see $log"
    failed=1
  fi
  for f in "${features[@]}"; do
    r=pass
    for t in ${tests_of[$f]}; do
      if ! grep -qx "test $t \.\.\. ok" "$log"; then r=fail; fi
    done
    [ "$r" = fail ] && failed=1
    cell[$v,$f]="$r"
  done
  if [ "$rc" -ne 0 ]; then
    failed=1
    say "$v: FAILED (exit $rc); the failures:"
    { sed -n '/^failures:$/,$p' "$log" | head -n 80 >&2; } || true
  fi
done

for v in $versions; do
  for f in "${features[@]}"; do
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$date" "$commit" "$v" "$f" "${cell[$v,$f]}" "${secs[$v]}" >>"$results"
  done
done
cat "$results" >>"$logs/history.tsv"

# The table.
{
  echo
  echo "test-compat: $date, commit $commit (results: $results)"
  printf '%-9s' version
  for f in "${features[@]}"; do printf ' %-11s' "$f"; done
  printf ' %6s %6s\n' build_s test_s
  for v in $versions; do
    printf '%-9s' "$v"
    for f in "${features[@]}"; do printf ' %-11s' "${cell[$v,$f]}"; done
    printf ' %6s %6s\n' "${build_secs[$v]}" "${secs[$v]}"
  done
} >&2
if [ "$failed" -ne 0 ]; then
  say "FAIL: a feature failed on a version (logs in $logs)"
  exit 1
fi
say "every feature passed on: $versions"
