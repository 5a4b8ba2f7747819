#!/usr/bin/env bash
# A lock kind is one folder under src/kinds/ and its registration in
# src/kinds/mod.rs (`pub mod NAME;` and its line in KINDS): nothing else in
# the crate may name it. Checked by taking each kind out of a copy of the
# tree (its folder and every line of src/kinds/mod.rs that names it) and
# checking that the library, its unit tests (the shared freeing-write tests
# iterate the registration) and the binary still build. A resource's
# catch-all kind (named by `kinds::of` as well) cannot be taken out and is
# skipped. `make lint` runs it; `hack/kind-locality.sh NAME` checks one kind.
# The end-to-end tests (tests/) may name a kind: they are not the crate.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
CARGO="${CARGO:-cargo}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
kinds=("$@")
if [ ${#kinds[@]} -eq 0 ]; then
  for d in src/kinds/*/; do kinds+=("$(basename "$d")"); done
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for kind in "${kinds[@]}"; do
  [ -d "src/kinds/$kind" ] || { echo "kind-locality: no folder src/kinds/$kind" >&2; exit 2; }
  # Named by kinds::of's fallback: its resource's catch-all.
  if grep -q "=> &$kind::" src/kinds/mod.rs; then
    echo "kind-locality: $kind: its resource's catch-all (kinds::of), kept"
    continue
  fi
  copy="$work/$kind"
  mkdir -p "$copy"
  git ls-files -z --cached --others --exclude-standard -- Cargo.toml Cargo.lock src testenv testsupport examples tests benches 2>/dev/null |
    tar --null -T - -cf - | tar -xf - -C "$copy"
  rm -rf "$copy/src/kinds/$kind"
  sed -i "/^pub mod $kind;$/d; /^ *&$kind::[A-Za-z]*,$/d" "$copy/src/kinds/mod.rs"
  if (cd "$copy" && "$CARGO" check --locked -q -p lock-janitor --lib --bins --profile test 2>"$work/$kind.log"); then
    echo "kind-locality: $kind: one folder and its registration"
  else
    echo "kind-locality: $kind is named outside src/kinds/$kind/ and its registration:" >&2
    grep -E '^(error|warning)|-->' "$work/$kind.log" >&2 || cat "$work/$kind.log" >&2
    status=1
  fi
done
exit $status
