#!/usr/bin/env bash
# The build of a Java peer: a leader-election candidate in Java on a client
# library from Maven Central, run by the end-to-end tests as a real peer
# nobody here wrote. A peer is a directory testenv/peers/NAME/ holding a
# pom.xml (its dependencies, pinned: the library and slf4j-simple) and
# Elector.java (the class Elector, its main; any other .java there is compiled
# beside it). The peers:
#   java     the official Kubernetes Java client (io.kubernetes:client-java-extended),
#            tests/e2e/java.rs
#   fabric8  fabric8's Kubernetes client (io.fabric8:kubernetes-client),
#            tests/e2e/fabric8.rs (hack/fabric8-peer.sh is this script for it)
# Prints the path of its launcher, bin/elector (a shell script that execs
# java with the classpath: run it with the elector's arguments). Built once
# per hash of pom.xml and the .java files, in the cache beside the control
# plane's binaries:
#   ${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lock-janitor}/NAME-peer/<hash>/
#     lib/      the jars (mvn dependency:copy-dependencies)
#     classes/  Elector.class (javac)
#     bin/elector
# Maven's local repository is NAME-peer/m2/ in that cache, shared by every
# build of that peer (so that a changed pom downloads only what changed, and
# nothing depends on ~/.m2); ~/.m2/settings.xml still applies (mirrors,
# proxies). Idempotent and quick when it is there (a file test); safe to run
# from several processes at once (a lock per peer, and the build is moved
# into place only once complete). Needs java and javac (>= 17) and mvn, and
# Maven Central.
#
#   hack/java-peer.sh NAME           build it if missing, print its launcher
#   hack/java-peer.sh NAME --print   only print where its launcher is (or will be)
#   hack/java-peer.sh NAME PROPERTY=VALUE...   with Maven properties of the pom
#       overridden (another release of its library: fabric8.version=7.9.0);
#       they are in the key, so each set is a build of its own
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${1:-}"
src="$root/testenv/peers/$name"
if [ -z "$name" ] || [ ! -f "$src/pom.xml" ] || [ ! -f "$src/Elector.java" ]; then
  echo "usage: hack/java-peer.sh NAME [--print] (NAME a directory of testenv/peers/ with pom.xml and Elector.java: $(cd "$root/testenv/peers" && ls -d */pom.xml 2>/dev/null | cut -d/ -f1 | xargs))" >&2
  exit 2
fi
shift
print=false
props=()
for arg in "$@"; do
  case "$arg" in
    --print) print=true ;;
    ?*=*) props+=("-D$arg") ;;
    *) echo "java-peer.sh: $arg is neither --print nor PROPERTY=VALUE" >&2; exit 2 ;;
  esac
done
sources=("$src"/*.java)
key="$( (cat "$src/pom.xml" "${sources[@]}"; [ ${#props[@]} -eq 0 ] || printf '%s\n' "${props[@]}") | sha256sum | cut -c1-16)"
base="${LOCK_JANITOR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lock-janitor}/$name-peer"
dir="$base/$key"
launcher="$dir/bin/elector"
say() { echo "$name-peer: $*" >&2; }

if $print; then echo "$launcher"; exit 0; fi
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
  || { say "$(javac -version 2>&1) is too old: the Java peers need Java >= 17"; exit 1; }
start=$(date +%s)
tmp="$base/.new-$key-$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib" "$tmp/classes" "$tmp/bin"
say "building the peer testenv/peers/$name${props[*]:+ (${props[*]})} ($(javac -version 2>&1)) in $dir"
# -f: the pom where it is (this goal writes nothing beside it). Its output
# (colour codes even with -B) is shown only if it fails.
mvn -B -q -f "$src/pom.xml" -Dmaven.repo.local="$base/m2" ${props[@]+"${props[@]}"} \
  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp/lib" >"$tmp/mvn.log" 2>&1 \
  || { cat "$tmp/mvn.log" >&2; say "mvn could not fetch the dependencies of $src/pom.xml (Maven Central reachable?)"; exit 1; }
rm -f "$tmp/mvn.log"
javac -nowarn -d "$tmp/classes" -cp "$tmp/lib/*" "${sources[@]}" >&2
# The launcher finds its directory from where it is, so the build can move.
# SerialGC and C1 only: a small, short-lived process on a busy test machine.
cat >"$tmp/bin/elector" <<'LAUNCHER'
#!/bin/sh
here="$(cd "$(dirname "$0")/.." && pwd)"
exec java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$here/classes:$here/lib/*" Elector "$@"
LAUNCHER
chmod +x "$tmp/bin/elector"
# The classpath is complete: the elector builds its locks, its config and a
# client, with no cluster.
"$tmp/bin/elector" --check | grep -qx 'classpath ok' \
  || { say "the elector does not start from $tmp (its output is above)"; exit 1; }
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
touch "$dir/.complete"
say "ready in $(($(date +%s) - start))s ($(ls "$dir/lib" | wc -l) jars, $(du -sh "$dir/lib" | cut -f1)); run: $launcher lease|configmap NAMESPACE LOCK IDENTITY (KUBECONFIG set)"
echo "$launcher"
