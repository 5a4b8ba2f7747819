#!/usr/bin/env bash
# make test-rust: every Rust test, built once, then run:
#   0. the real peers' builds, each made once, then cached: the Python peer's
#      venv (hack/python-peer.sh), the fabric8 peer (hack/fabric8-peer.sh) and
#      the Java peer (hack/java-peer.sh java);
#   1. the unit tests (the library's, the binaries', the testenv crate's);
#   2. three lanes side by side: tests/e2e/ (one shared control plane,
#      TEST_THREADS threads), tests/isolated/ (suites that start a control
#      plane of their own) and testenv/tests/ (the control plane's own
#      tests), ISOLATED_THREADS threads each; each lane's output goes to
#      target/test-logs/<lane>.log, printed when it ends, and its seconds to
#      the phase table (hack/phases.sh).
# Exits non-zero if any test failed. Extra arguments go to every test binary
# (a filter, --nocapture, ...).
#
#   hack/test-rust.sh
#   TEST_THREADS=4 ISOLATED_THREADS=1 hack/test-rust.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cargo="${CARGO:-cargo}"
threads="${TEST_THREADS:-6}"
isolated_threads="${ISOLATED_THREADS:-2}"
logs="$root/target/test-logs"
mkdir -p "$logs"

say() { echo "test-rust: $*" >&2; }

# --- build every test binary once -------------------------------------------
built="$logs/built.json"
"$cargo" test --locked --workspace --lib --bins --tests --no-run \
  --message-format=json-render-diagnostics >"$built"
exe_of() { # target name -> its test executable
  python3 - "$built" "$1" <<'EOF'
import json, sys
path, name = sys.argv[1], sys.argv[2]
for line in open(path):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == name and m["profile"]["test"]:
        print(m["executable"])
        break
EOF
}
e2e="$(exe_of e2e)"
isolated="$(exe_of isolated)"
control_plane="$(exe_of control_plane)"
for x in "$e2e" "$isolated" "$control_plane"; do
  [ -x "$x" ] || { say "FAIL: a test binary (e2e, isolated, control_plane) is missing from $built"; exit 1; }
done

# --- the Python peer's venv (tests/e2e/python.rs) ---------------------------
# Made once per testenv/peers/python/requirements.txt (cold: a pip install
# from PyPI; warm: a file test), before the lanes, so that its cost is a phase
# of its own and no test waits for it.
hack/phases.sh run "test-rust: python-peer" hack/python-peer.sh >/dev/null

# --- the fabric8 peer (tests/e2e/fabric8.rs) --------------------------------
# Built once per hash of testenv/peers/fabric8/{pom.xml,Elector.java} (cold:
# the jars from Maven Central and javac; warm: a file test), as a phase of
# its own for the same reason.
hack/phases.sh run "test-rust: fabric8-peer" hack/fabric8-peer.sh >/dev/null

# --- the Java peer's build (tests/e2e/java.rs) -------------------------------
# The official Java client's jars and Elector.class, built once per hash of
# testenv/peers/java/{pom.xml,Elector.java} (cold: Maven fetches about 50 MB
# from Maven Central, then javac; warm: a file test), before the lanes too.
hack/phases.sh run "test-rust: java-peer" hack/java-peer.sh java >/dev/null

# --- 1. unit tests ------------------------------------------------------------
hack/phases.sh run "test-rust: unit" \
  "$cargo" test --locked --workspace --lib --bins -q -- --test-threads="$threads" "$@"

# --- 2. the end-to-end harnesses, side by side ------------------------------
# Run as cargo runs them: from their package's root, the binary straight.
# testenv/tests/control_plane.rs (the control plane's own tests, each with a
# control plane of its own) goes beside them, as tests/isolated does.
lane() { # name dir exe threads args...
  local name="$1" dir="$2" exe="$3" n="$4"; shift 4
  hack/phases.sh run "test-rust: $name" \
    sh -c 'cd "$1" && shift && exec "$@" >"$0" 2>&1' "$logs/$name.log" "$dir" "$exe" --test-threads="$n" "$@"
}
say "running tests/e2e (threads: $threads), tests/isolated and testenv's tests (threads: $isolated_threads each) side by side; logs in $logs"
lane e2e "$root" "$e2e" "$threads" "$@" & e2e_pid=$!
lane isolated "$root" "$isolated" "$isolated_threads" "$@" & isolated_pid=$!
lane testenv "$root/testenv" "$control_plane" "$isolated_threads" "$@" & testenv_pid=$!
status=0
for l in testenv:$testenv_pid isolated:$isolated_pid e2e:$e2e_pid; do
  wait "${l#*:}" || status=1
  say "--- ${l%%:*} ($logs/${l%%:*}.log) ---"
  cat "$logs/${l%%:*}.log"
done
if [ "$status" -ne 0 ]; then
  say "FAIL: a test failed; the failures:"
  grep -h -B1 -A30 "^failures:$" "$logs/e2e.log" "$logs/isolated.log" "$logs/testenv.log" >&2 || true
fi
exit "$status"
