#!/usr/bin/env python3
"""Checks what `make release` wrote into dist/ beyond the archives' files:

    hack/check_release.py DIST VERSION

- image/: an OCI layout whose index.json names one image index with exactly
  linux/amd64 and linux/arm64; each image runs as 65532, has the entrypoint
  `/lock-janitor run`, the OCI labels source/version/licenses, and one layer
  holding only /lock-janitor; every blob's digest matches its content;
- sbom.cdx.json: CycloneDX, describing lock-janitor VERSION, with kube among
  its components;
- lock-janitor.yaml (when present; hack/release.sh checks it is): the krew
  manifest names every archive with its sha256;
- lock-janitor-VERSION.tgz: appVersion VERSION, default image
  ghcr.io/lock-janitor/lock-janitor (tag empty: the appVersion);
- the macOS binaries (when their archives are there): Mach-O for their
  architecture whose oldest macOS (LC_BUILD_VERSION minos) is $MACOS_MIN, so
  they start on every macOS from there on, not only on the SDK's.
Called by hack/release.sh; prints what failed and exits 1.
"""
import glob
import gzip
import hashlib
import io
import json
import os
import sys
import struct
import tarfile

import yaml

errors = []


def check(ok, msg):
    if not ok:
        errors.append(msg)
    return ok


def macho_minos(data):
    """(cputype, minos 'X.Y') of a thin 64-bit Mach-O executable."""
    magic, cputype, _, _, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
    if magic != 0xFEEDFACF:
        return None, None
    off = 32
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, off)
        if cmd == 0x32:  # LC_BUILD_VERSION: platform, minos, sdk, ntools
            v = struct.unpack_from("<I", data, off + 12)[0]
        elif cmd == 0x24:  # LC_VERSION_MIN_MACOSX: version, sdk
            v = struct.unpack_from("<I", data, off + 8)[0]
        else:
            off += size
            continue
        return cputype, f"{v >> 16}.{(v >> 8) & 0xFF}"
    return cputype, None


def main():
    dist, version = sys.argv[1], sys.argv[2]
    image = os.path.join(dist, "image")

    def blob(desc):
        algo, hexd = desc["digest"].split(":", 1)
        path = os.path.join(image, "blobs", algo, hexd)
        data = open(path, "rb").read()
        check(hashlib.sha256(data).hexdigest() == hexd, f"blob {desc['digest']} does not match its content")
        check(len(data) == desc["size"], f"blob {desc['digest']} size {len(data)}, descriptor says {desc['size']}")
        return data

    layout = json.load(open(os.path.join(image, "oci-layout")))
    check(layout.get("imageLayoutVersion") == "1.0.0", f"oci-layout {layout}")
    top = json.load(open(os.path.join(image, "index.json")))
    mans = top.get("manifests", [])
    if check(len(mans) == 1 and mans[0]["mediaType"] == "application/vnd.oci.image.index.v1+json",
             f"index.json should name one image index: {mans}"):
        check(mans[0].get("annotations", {}).get("org.opencontainers.image.ref.name") == version,
              "index.json: ref.name is not the version")
        idx = json.loads(blob(mans[0]))
        plats = sorted((m["platform"]["os"], m["platform"]["architecture"]) for m in idx["manifests"])
        check(plats == [("linux", "amd64"), ("linux", "arm64")], f"index platforms {plats}")
        for m in idx["manifests"]:
            arch = m["platform"]["architecture"]
            man = json.loads(blob(m))
            check(man["mediaType"] == "application/vnd.oci.image.manifest.v1+json", f"{arch}: manifest media type {man['mediaType']}")
            cfg = json.loads(blob(man["config"]))
            c = cfg.get("config", {})
            check(cfg.get("architecture") == arch and cfg.get("os") == "linux", f"{arch}: config says {cfg.get('os')}/{cfg.get('architecture')}")
            check(c.get("User") == "65532:65532", f"{arch}: user {c.get('User')!r}, want 65532:65532")
            check(c.get("Entrypoint") == ["/lock-janitor", "run"], f"{arch}: entrypoint {c.get('Entrypoint')}")
            labels = c.get("Labels", {})
            for k, want in (("source", "https://github.com/lock-janitor/lock-janitor"), ("version", version), ("licenses", "Apache-2.0")):
                check(labels.get(f"org.opencontainers.image.{k}") == want, f"{arch}: label {k} = {labels.get('org.opencontainers.image.' + k)!r}")
            check(len(man["layers"]) == 1, f"{arch}: {len(man['layers'])} layers, want 1")
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(man["layers"][0])))) as tf:
                names = [(t.name, t.mode, t.uid) for t in tf.getmembers()]
            check(names == [("lock-janitor", 0o755, 0)], f"{arch}: layer holds {names}, want only lock-janitor 0755 root-owned (no shell)")
            check(len(cfg.get("rootfs", {}).get("diff_ids", [])) == 1, f"{arch}: rootfs diff_ids")

    sbom = json.load(open(os.path.join(dist, "sbom.cdx.json")))
    check(sbom.get("bomFormat") == "CycloneDX", "sbom.cdx.json is not CycloneDX")
    comp = sbom.get("metadata", {}).get("component", {})
    check(comp.get("name") == "lock-janitor" and comp.get("version") == version,
          f"SBOM describes {comp.get('name')} {comp.get('version')}")
    names = {c.get("name") for c in sbom.get("components", [])}
    check({"kube", "k8s-openapi", "tokio", "rustls"} <= names, "SBOM components lack kube/k8s-openapi/tokio/rustls")
    check("proptest" not in names, "SBOM lists the dev-dependency proptest (not shipped)")

    krew_path = os.path.join(dist, "lock-janitor.yaml")
    krew = yaml.safe_load(open(krew_path)) if os.path.exists(krew_path) else {"spec": {"platforms": []}}
    for p in krew["spec"]["platforms"]:
        a = os.path.join(dist, p["uri"].rsplit("/", 1)[-1])
        check(os.path.isfile(a) and hashlib.sha256(open(a, "rb").read()).hexdigest() == p["sha256"],
              f"krew sha256 of {p['uri']} does not match {a}")

    with tarfile.open(os.path.join(dist, f"lock-janitor-{version}.tgz")) as tf:
        chart = yaml.safe_load(tf.extractfile("lock-janitor/Chart.yaml"))
        values = yaml.safe_load(tf.extractfile("lock-janitor/values.yaml"))
    check(chart.get("version") == version and chart.get("appVersion") == version,
          f"chart version {chart.get('version')} appVersion {chart.get('appVersion')}, want {version}")
    img = values.get("image", {})
    # [registry/]repository, as the chart's lock-janitor.image helper joins them.
    repo = "/".join(p for p in (img.get("registry"), img.get("repository")) if p)
    check(repo == "ghcr.io/lock-janitor/lock-janitor" and not img.get("tag") and not img.get("digest"),
          f"chart default image {img}")

    want_min = os.environ.get("MACOS_MIN", "11.0")
    cpu = {"amd64": 0x01000007, "arm64": 0x0100000C}
    for a in sorted(glob.glob(os.path.join(dist, f"lock-janitor_{version}_darwin_*.tar.gz"))):
        arch = a.rsplit("_", 1)[-1][: -len(".tar.gz")]
        with tarfile.open(a) as tf:
            data = tf.extractfile("./lock-janitor").read()
        cputype, minos = macho_minos(data)
        check(cputype == cpu.get(arch), f"{os.path.basename(a)}: Mach-O cputype {cputype}, want {arch}")
        check(minos == want_min, f"{os.path.basename(a)}: runs on macOS {minos} and newer, want {want_min} (MACOSX_DEPLOYMENT_TARGET)")

    for e in errors:
        print(f"check-release: {e}")
    if errors:
        sys.exit(1)
    print(f"check-release: image index, SBOM ({len(names)} components), krew manifest, chart OK", file=sys.stderr)


if __name__ == "__main__":
    main()
