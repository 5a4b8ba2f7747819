#!/usr/bin/env python3
"""Writes link-time stubs (.tbd) of the two macOS frameworks the binary uses.

    cargo metadata --format-version 1 --locked | hack/darwin-stubs.py OUT_DIR

zig links Mach-O binaries without Apple's SDK (it ships libSystem's stubs),
but the TLS stack (rustls-platform-verifier, rustls-native-certs through
security-framework) also links CoreFoundation and Security. A .tbd file is
what the SDK itself holds for each framework: a text list of the symbols a
dylib exports and its install name; the linker needs nothing more to write
the load command, and the binary binds to the real framework at run time.

The symbols are read from the `extern "C"` blocks of the -sys crates that
declare them (core-foundation-sys, security-framework-sys, at the versions in
Cargo.lock), so the stubs follow the dependency tree. Writes
OUT_DIR/<Name>.framework/<Name>.tbd; pass `-F OUT_DIR` to the linker.
"""
import json
import os
import re
import sys

# -sys crate -> the framework its #[link(name = ..., kind = "framework")] names.
CRATES = {
    "core-foundation-sys": "CoreFoundation",
    "security-framework-sys": "Security",
}
TARGETS = "[ x86_64-macos, arm64-macos ]"


def extern_blocks(text):
    """Yields the bodies of `extern "C" { ... }` blocks."""
    for m in re.finditer(r'extern\s+"C"\s*\{', text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        yield text[m.end():i - 1]


def symbols(src_dir):
    syms = set()
    for dirpath, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                text = re.sub(r"//[^\n]*", "", fh.read())
            for body in extern_blocks(text):
                syms.update(re.findall(r"\bfn\s+([A-Za-z_]\w*)", body))
                syms.update(re.findall(r"\bstatic\s+(?:mut\s+)?([A-Za-z_]\w*)", body))
                syms.update(re.findall(r'link_name\s*=\s*"([^"]+)"', body))
    return syms


def main():
    out = sys.argv[1]
    meta = json.load(sys.stdin)
    found = {}
    for pkg in meta["packages"]:
        fw = CRATES.get(pkg["name"])
        if fw:
            src = os.path.join(os.path.dirname(pkg["manifest_path"]), "src")
            found.setdefault(fw, set()).update(symbols(src))
    for crate, fw in CRATES.items():
        if fw not in found or not found[fw]:
            sys.exit(f"darwin-stubs: no symbols found for {fw} (crate {crate} not in cargo metadata?)")
    for fw, syms in sorted(found.items()):
        d = os.path.join(out, f"{fw}.framework")
        os.makedirs(d, exist_ok=True)
        names = ", ".join(f"'_{s}'" for s in sorted(syms))
        with open(os.path.join(d, f"{fw}.tbd"), "w") as fh:
            fh.write(
                "--- !tapi-tbd\n"
                "tbd-version: 4\n"
                f"targets: {TARGETS}\n"
                f"install-name: '/System/Library/Frameworks/{fw}.framework/Versions/A/{fw}'\n"
                "exports:\n"
                f"  - targets: {TARGETS}\n"
                f"    symbols: [ {names} ]\n"
                "...\n"
            )
        print(f"darwin-stubs: {fw}: {len(syms)} symbols -> {d}/{fw}.tbd", file=sys.stderr)


if __name__ == "__main__":
    main()
