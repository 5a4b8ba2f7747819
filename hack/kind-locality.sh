#!/usr/bin/env bash
# A lock kind is one folder under src/kinds/ and its registration in
# src/kinds/mod.rs (`pub mod NAME;` and its line in KINDS): nothing else in
# the crate depends on it at compile time. Checked by taking each kind out
# of a copy of the tree (its folder and those two lines) and checking that
# the library, its unit tests (the shared freeing-write tests iterate the
# registration and each kind's cases) and the binary still build. What
# this does not see: a mention that still compiles (a comment, a string,
# a word of the shared vocabulary such as `lock::Unmanageable`'s) and the
# end-to-end tests and examples (tests/, examples/), which may name a kind.
# A resource's catch-all kind (named by `kinds::of` as well) cannot be taken
# out and is skipped. `make lint` runs it; `hack/kind-locality.sh NAME`
# checks one kind.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
CARGO="${CARGO:-cargo}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
kinds=("$@")
if [ ${#kinds[@]} -eq 0 ]; then
  # A kind's folder: its mod.rs implements the Kind trait.
  for d in src/kinds/*/; do
    grep -q '^impl Kind for ' "$d/mod.rs" 2>/dev/null && kinds+=("$(basename "$d")")
  done
fi
# The body of kinds::of, and the KINDS list.
of_body="$(sed -n '/^pub fn of(/,/^}/p' src/kinds/mod.rs)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for kind in "${kinds[@]}"; do
  [ -d "src/kinds/$kind" ] || { echo "kind-locality: no folder src/kinds/$kind" >&2; exit 2; }
  if grep -q "&$kind::" <<<"$of_body"; then
    echo "kind-locality: $kind: its resource's catch-all (kinds::of), kept"
    continue
  fi
  copy="$work/$kind"
  mkdir -p "$copy"
  git ls-files -z --cached --others --exclude-standard -- Cargo.toml Cargo.lock src testenv testsupport examples tests |
    tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$copy"
  rm -rf "$copy/src/kinds/$kind"
  mod="$copy/src/kinds/mod.rs"
  before=$(wc -l <"$mod")
  sed -i "/^pub mod $kind;\$/d; /^pub static KINDS/,/^\];/{/^ *&$kind::[A-Za-z0-9_]*,\$/d}" "$mod"
  removed=$((before - $(wc -l <"$mod")))
  if [ "$removed" -ne 2 ]; then
    echo "kind-locality: $kind: expected its two registration lines in src/kinds/mod.rs (\`pub mod $kind;\` and its KINDS line), removed $removed" >&2
    exit 2
  fi
  if (cd "$copy" && "$CARGO" check --locked -q -p lock-janitor --lib --bins --profile test 2>"$work/$kind.log"); then
    echo "kind-locality: $kind: one folder and its registration"
  else
    echo "kind-locality: $kind: the crate depends on it outside src/kinds/$kind/ and its registration:" >&2
    grep -E '^(error|warning)|-->' "$work/$kind.log" >&2 || cat "$work/$kind.log" >&2
    status=1
  fi
done
exit $status
