#!/usr/bin/env python3
"""Functions over 100 lines (issue 47): orchestration should read in one
screen (about 60 lines) and none may pass 100. `make lint` runs it.

    hack/long-functions.py              # fails on a function over the limit not allowlisted
    hack/long-functions.py --over 60    # lists every function over 60 lines (no failure)
    hack/long-functions.py --all        # also looks in tests/ (the test functions, exempt)

A function runs from its `fn` line to the first line after its opening brace
that is a `}` at the `fn` line's indentation (rustfmt's layout; no crate
needed); attributes and doc comments are not counted. A declaration without
a body (`fn f();`) and a one-line body are skipped. The allowlist,
hack/long-functions.allow, names `path function` pairs, one a line, with a
comment saying why.

Checked: src/, examples/, testenv/src/, testsupport/src/. Not checked:
tests/ (the end-to-end test functions are scripts of steps against a real
control plane; many are over 100 lines, and --all lists them)."""
import os
import re
import sys

LIMIT = 100
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CHECKED = ["src", "examples", "testenv/src", "testsupport/src"]
EXEMPT = ["tests"]
ALLOW = os.path.join(ROOT, "hack", "long-functions.allow")

FN = re.compile(
    r'^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|async|unsafe|extern\s+"[^"]*")\s+)*'
    r"fn\s+([A-Za-z_][A-Za-z0-9_]*)"
)


def functions(path):
    """(lines, first line, name) of each function with a body in `path`."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        indent, name = m.group(1), m.group(2)
        # The signature ends at the first line that ends in `{` (a body) or `;`
        # (none); a body that opens and closes on one line is not counted.
        body = None
        for j in range(i, len(lines)):
            s = lines[j].split("//")[0].rstrip()
            if s.endswith("{"):
                body = j
                break
            if s.endswith(";") or (s.endswith("}") and "{" in s):
                break
        if body is None:
            continue
        for k in range(body + 1, len(lines)):
            if lines[k].startswith(indent + "}"):
                found.append((k - i + 1, i + 1, name))
                break
    return found


def scan(dirs, over):
    out = []
    for d in dirs:
        top = os.path.join(ROOT, d)
        for base, subdirs, files in os.walk(top):
            subdirs.sort()
            for f in sorted(files):
                if f.endswith(".rs"):
                    path = os.path.join(base, f)
                    rel = os.path.relpath(path, ROOT)
                    out += [(n, rel, ln, name) for n, ln, name in functions(path) if n > over]
    return sorted(out, key=lambda r: (-r[0], r[1], r[2]))


def allowlist():
    allowed = set()
    if os.path.exists(ALLOW):
        for line in open(ALLOW, encoding="utf-8"):
            line = line.split("#")[0].strip()
            if line:
                path, name = line.split()
                allowed.add((path, name))
    return allowed


def main(argv):
    over = LIMIT
    dirs = list(CHECKED)
    if "--over" in argv:
        over = int(argv[argv.index("--over") + 1])
    if "--all" in argv:
        dirs += EXEMPT
    listing = over != LIMIT or "--all" in argv
    found = scan(dirs, over)
    if listing:
        for n, rel, ln, name in found:
            print(f"{n:5} {rel}:{ln} {name}")
        return 0
    allowed = allowlist()
    bad = [r for r in found if (r[1], r[3]) not in allowed]
    for n, rel, ln, name in found:
        if (rel, name) in allowed:
            print(f"long-functions: allowlisted: {rel}:{ln} {name} is {n} lines")
    stale = allowed - {(r[1], r[3]) for r in found}
    for rel, name in sorted(stale):
        print(f"long-functions: {rel} {name} is no longer over {LIMIT} lines (or gone): "
              "take it out of hack/long-functions.allow")
    for n, rel, ln, name in bad:
        print(f"long-functions: {rel}:{ln} {name} is {n} lines, over {LIMIT}: "
              "split it into named steps (about 60 lines reads in one screen)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
