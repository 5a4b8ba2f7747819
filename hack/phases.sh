#!/usr/bin/env bash
# Times the phases of `make test` and `.ci/run` and prints where the time went.
#
#   hack/phases.sh run NAME CMD...   run CMD, record "NAME seconds status"
#   hack/phases.sh record NAME SECONDS STATUS   record a phase timed elsewhere
#   hack/phases.sh table [TITLE]     print the recorded phases as a table
#   hack/phases.sh reset             forget the recorded phases
#
# The record is $LOCK_JANITOR_PHASES (default target/phases.tsv), so a caller
# that sets it (.ci/run) sees the phases of the `make test` it runs in its own
# table. A failed phase is recorded with its exit status, and `run` exits with
# it, so `make` stops where it did before.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
file="${LOCK_JANITOR_PHASES:-$root/target/phases.tsv}"

case "${1:-}" in
  run)
    shift
    [ $# -ge 2 ] || { echo "usage: $0 run NAME CMD..." >&2; exit 2; }
    name="$1"; shift
    mkdir -p "$(dirname "$file")"
    start=$SECONDS
    "$@"
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$((SECONDS - start))" "$rc" >>"$file"
    exit "$rc"
    ;;
  record)
    # record NAME SECONDS STATUS: a phase timed by the caller (a `wait` on
    # its own background job, which no child process can do).
    shift
    [ $# -eq 3 ] || { echo "usage: $0 record NAME SECONDS STATUS" >&2; exit 2; }
    mkdir -p "$(dirname "$file")"
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$file"
    ;;
  table)
    title="${2:-phases}"
    [ -s "$file" ] || { echo "$title: no phases recorded" >&2; exit 0; }
    # A phase named "PARENT: PART" is a part of PARENT (recorded before it,
    # since PARENT ends last): listed under it, indented, and not summed.
    awk -F'\t' -v title="$title" '
      { name[NR] = $1; secs[NR] = $2; rc[NR] = $3; w = (length($1) + 2 > w ? length($1) + 2 : w) }
      function row(label, i) {
        printf "| %-*s | %7d | %-10s |\n", w, label, secs[i], (rc[i] == 0 ? "ok" : "FAILED (" rc[i] ")")
      }
      END {
        if (w < 5) w = 5
        dashes = ""; for (i = 0; i < w; i++) dashes = dashes "-"
        printf "\n%s\n", title
        printf "| %-*s | %7s | %-10s |\n", w, "phase", "seconds", "result"
        printf "|-%s-|--------:|------------|\n", dashes
        for (i = 1; i <= NR; i++) {
          if (index(name[i], ": ") > 0) continue
          row(name[i], i); total += secs[i]
          for (j = 1; j <= NR; j++)
            if (index(name[j], name[i] ": ") == 1) row("  " substr(name[j], length(name[i]) + 3), j)
        }
        printf "| %-*s | %7d | %-10s |\n", w, "total", total, ""
      }' "$file" >&2
    ;;
  reset)
    rm -f "$file"
    ;;
  *)
    echo "usage: $0 run NAME CMD... | table [TITLE] | reset" >&2
    exit 2
    ;;
esac
