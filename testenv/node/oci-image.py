#!/usr/bin/env python3
"""Writes a one-layer OCI image archive (an OCI layout in a tar) from local
files, for `ctr -n k8s.io images import` on the real node: no registry, no
Docker, nothing pulled. Deterministic: files are stored with mtime 0 and
root ownership, so the same inputs give the same digests.

  oci-image.py --name REF --out FILE.tar [--user UID:GID] [--entrypoint JSON]
               [--cmd JSON] [--env K=V]... SRC:DEST[:MODE]...

An image built by `make release` (an OCI layout directory) is imported the
same way after `tar -C dist/image -cf image.tar .`.
"""
import argparse, hashlib, io, json, os, sys, tarfile


def add_file(tar, src, dest, mode):
    data = open(src, "rb").read()
    dest = dest.lstrip("/")
    parts = dest.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d not in add_file.dirs:
            add_file.dirs.add(d)
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(ti)
    ti = tarfile.TarInfo(dest)
    ti.size, ti.mode, ti.mtime = len(data), mode, 0
    tar.addfile(ti, io.BytesIO(data))


add_file.dirs = set()


def blob(out, data, media_type):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    out.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--user", default="")
    ap.add_argument("--entrypoint", type=json.loads, default=None)
    ap.add_argument("--cmd", type=json.loads, default=None)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()

    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as lt:
        for spec in a.files:
            src, dest, *mode = spec.split(":")
            add_file(lt, src, dest, int(mode[0], 8) if mode else 0o755)
    layer = layer_buf.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()

    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            k: v
            for k, v in {
                "User": a.user or None,
                "Entrypoint": a.entrypoint,
                "Cmd": a.cmd,
                "Env": ["PATH=/"] + a.env,
                "WorkingDir": "/",
            }.items()
            if v is not None
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "testenv/node/oci-image.py"}],
    }
    with tarfile.open(a.out + ".tmp", mode="w", format=tarfile.PAX_FORMAT) as out:
        cfg = blob(out, json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
        lay = blob(out, layer, "application/vnd.oci.image.layer.v1.tar")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": cfg,
            "layers": [lay],
        }
        man = blob(out, json.dumps(manifest, sort_keys=True).encode(), manifest["mediaType"])
        man["platform"] = {"architecture": "amd64", "os": "linux"}
        man["annotations"] = {
            "io.containerd.image.name": a.name,
            "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1],
        }
        for name, data in [
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [man]}).encode()),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            out.addfile(info, io.BytesIO(data))
    os.replace(a.out + ".tmp", a.out)
    print(f"{a.name} {man['digest']}")


if __name__ == "__main__":
    sys.exit(main())
