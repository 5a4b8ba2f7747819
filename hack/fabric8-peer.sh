#!/usr/bin/env bash
# The build of the fabric8 peer (testenv/peers/fabric8/Elector.java): fabric8's
# Kubernetes client (Maven Central io.fabric8:kubernetes-client, pinned with
# its JDK HTTP client and slf4j-simple in testenv/peers/fabric8/pom.xml), whose
# io.fabric8.kubernetes.client.extended.leaderelection the end-to-end tests
# (tests/e2e/fabric8.rs) run as a real leader-election peer. Prints the path
# of its launcher, bin/elector (a shell script that execs java with the
# classpath: run it with the elector's arguments). Built once per hash of
# pom.xml and Elector.java, in the cache beside the control plane's binaries:
#   ${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lock-janitor}/fabric8-peer/<hash>/
#     lib/      the jars (mvn dependency:copy-dependencies)
#     classes/  Elector.class (javac)
#     bin/elector
# Maven's local repository is fabric8-peer/m2/ in that cache, shared by every
# build (so that a changed pom downloads only what changed, and nothing
# depends on ~/.m2); ~/.m2/settings.xml still applies (mirrors, proxies).
# Idempotent and quick when it is there (a file test); safe to run from
# several processes at once (a lock, and the build is moved into place only
# once complete). Needs java and javac (>= 17) and mvn, and Maven Central.
#
#   hack/fabric8-peer.sh           build it if missing, print its launcher
#   hack/fabric8-peer.sh --print   only print where its launcher is (or will be)
#   FABRIC8_VERSION=7.9.0 hack/fabric8-peer.sh   another release of the client
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/testenv/peers/fabric8"
# FABRIC8_VERSION overrides the pom's fabric8.version (another release of the
# client, e.g. 7.9.0: Jackson 2 where 8 has Jackson 3); it is in the key.
version="${FABRIC8_VERSION:-}"
key="$( (cat "$src/pom.xml" "$src/Elector.java"; echo "$version") | sha256sum | cut -c1-16)"
base="${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-janitor}/fabric8-peer"
dir="$base/$key"
launcher="$dir/bin/elector"
say() { echo "fabric8-peer: $*" >&2; }

if [ "${1:-}" = "--print" ]; then echo "$launcher"; exit 0; fi
ready() { [ -f "$dir/.complete" ] && [ -x "$launcher" ]; }
if ready; then echo "$launcher"; exit 0; fi

mkdir -p "$base"
exec 9>"$base/.lock"
flock 9
if ready; then echo "$launcher"; exit 0; fi

for tool in java javac mvn; do
  command -v "$tool" >/dev/null 2>&1 \
    || { say "$tool is not on PATH (Debian: apt-get install openjdk-17-jdk-headless maven; hack/setup.sh does)"; exit 1; }
done
java_major="$(javac -version 2>&1 | sed -n 's/^javac \([0-9]*\).*/\1/p')"
[ "${java_major:-0}" -ge 17 ] \
  || { say "$(javac -version 2>&1) is too old: fabric8's client 8 needs Java >= 17"; exit 1; }
start=$(date +%s)
tmp="$base/.new-$key-$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib" "$tmp/classes" "$tmp/bin"
fabric8="${version:-$(sed -n 's:.*<fabric8.version>\(.*\)</fabric8.version>.*:\1:p' "$src/pom.xml")}"
say "building the peer (io.fabric8:kubernetes-client $fabric8, $(javac -version 2>&1)) in $dir"
# -f: the pom where it is (this goal writes nothing beside it). Its output
# (colour codes even with -B) is shown only if it fails.
mvn -B -q -f "$src/pom.xml" -Dmaven.repo.local="$base/m2" -Dfabric8.version="$fabric8" \
  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp/lib" >"$tmp/mvn.log" 2>&1 \
  || { cat "$tmp/mvn.log" >&2; say "mvn could not fetch the dependencies of $src/pom.xml (Maven Central reachable?)"; exit 1; }
rm -f "$tmp/mvn.log"
javac -nowarn -d "$tmp/classes" -cp "$tmp/lib/*" "$src/Elector.java" >&2
# The launcher finds its directory from where it is, so the build can move.
# SerialGC and C1 only: a small, short-lived process on a busy test machine.
cat >"$tmp/bin/elector" <<'EOF'
#!/bin/sh
here="$(cd "$(dirname "$0")/.." && pwd)"
exec java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$here/classes:$here/lib/*" Elector "$@"
EOF
chmod +x "$tmp/bin/elector"
# The classpath is complete: the elector builds its locks, its config and a
# client (the HTTP client found), with no cluster.
"$tmp/bin/elector" --check | grep -qx 'classpath ok' \
  || { say "the elector does not start from $tmp (its output is above)"; exit 1; }
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
touch "$dir/.complete"
say "ready in $(($(date +%s) - start))s ($(ls "$dir/lib" | wc -l) jars, $(du -sh "$dir/lib" | cut -f1)); run: $launcher lease|configmap NAMESPACE LOCK IDENTITY (KUBECONFIG set)"
echo "$launcher"
