#!/usr/bin/env bash
# Writes the krew plugin manifest of a release from the template
# krew/lock-janitor.yaml: VERSION becomes the crate version, and each
# platform's sha256 the sha256 of the archive in DIST that its uri names.
# Refuses an archive that is missing or lacks what the platform's `files`
# and `bin` name (krew would install a plugin that does not run).
#
#   hack/krew-manifest.sh [DIST]    DIST default dist/; writes DIST/lock-janitor.yaml
#
# `make release` runs it after packing the archives.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dist="${1:-dist}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
[ -n "$version" ] || { echo "krew-manifest: no version in Cargo.toml" >&2; exit 1; }
python3 -c 'import yaml' 2>/dev/null || { echo "krew-manifest: python3 with PyYAML is needed (pip install pyyaml)" >&2; exit 1; }

python3 - "$version" "$dist" krew/lock-janitor.yaml <<'EOF'
import hashlib, os, sys, tarfile
import yaml

version, dist, template = sys.argv[1:4]
def fail(msg):
    sys.exit(f"krew-manifest: FAIL: {msg}")

# The template's comments are about the template: the manifest gets its own.
lines = [l for l in open(template).read().splitlines(keepends=True) if not l.startswith("#")]
lines = [l.replace("VERSION", version) for l in lines]
out, archive = [f"# lock-janitor v{version} for krew, written by hack/krew-manifest.sh from {template}.\n"], None
for line in lines:
    key = line.strip()
    if key.startswith("uri:"):
        archive = os.path.join(dist, key.split()[-1].rsplit("/", 1)[-1])
        if not os.path.isfile(archive):
            fail(f"{archive} (named by a uri in {template}) does not exist; run 'make release'")
    if key == "sha256: SHA256":
        if archive is None:
            fail(f"a sha256 before any uri in {template}")
        sha = hashlib.sha256(open(archive, "rb").read()).hexdigest()
        line = line.replace("SHA256", f'"{sha}"')
        archive = None
    out.append(line)
text = "".join(out)
if "SHA256" in text:
    fail(f"{template}: a SHA256 placeholder left over")

manifest = yaml.safe_load(text)
plats = manifest["spec"]["platforms"]
seen = set()
for p in plats:
    sel = p["selector"]["matchLabels"]
    seen.add((sel["os"], sel["arch"]))
    path = os.path.join(dist, p["uri"].rsplit("/", 1)[-1])
    with tarfile.open(path) as tf:
        names = {os.path.normpath(m.name) for m in tf.getmembers() if m.isfile()}
        execs = {os.path.normpath(m.name) for m in tf.getmembers() if m.isfile() and m.mode & 0o111}
    for f in p["files"]:
        if os.path.normpath(f["from"]) not in names:
            fail(f"{path} has no {f['from']} (files of {sel})")
    if os.path.normpath(p["bin"]) not in execs:
        fail(f"{path}: bin {p['bin']} is missing or not executable")
want = {(o, a) for o in ("linux", "darwin") for a in ("amd64", "arm64")}
if seen != want:
    fail(f"platforms {sorted(seen)}, want {sorted(want)}")
if manifest["spec"]["version"] != f"v{version}":
    fail(f"spec.version {manifest['spec']['version']}, want v{version}")
dest = os.path.join(dist, "lock-janitor.yaml")
with open(dest, "w") as fh:
    fh.write(text)
print(f"krew-manifest: {dest}: {len(plats)} platforms, sha256 of each archive", file=sys.stderr)
EOF
