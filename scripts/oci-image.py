#!/usr/bin/env python3
"""Make a one-layer OCI image archive from a directory, with no registry and no image tool
(issue 37: the test node's pause and test images). The archive is an OCI image layout
(oci-layout, index.json, blobs/sha256/...) in a tar, which `ctr images import` reads; the
manifest carries the `io.containerd.image.name` annotation, so it is imported under --name.

    scripts/oci-image.py --name sharegpu.local/pause:1 --rootfs DIR --out pause.tar \
        --entrypoint /pause

The layer is an uncompressed tar of DIR, owned by root, with fixed times, sorted: the same files
give the same digests. Standard library only (runs with the system python3).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path


def layer_tar(rootfs: Path) -> bytes:
    """DIR as a tar layer: root-owned, mtime 0, entries in sorted order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = sorted(p for p in rootfs.rglob("*"))
        for path in paths:
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(rootfs)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def dumps(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build(name: str, rootfs: Path, entrypoint: list[str], cmd: list[str], env: list[str]) -> bytes:
    layer_digest, layer = blob(layer_tar(rootfs))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint or None, "Cmd": cmd or None, "Env": env, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "created": "1970-01-01T00:00:00Z",
    }
    config_digest, config_bytes = blob(dumps(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_bytes),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": len(layer),
            }
        ],
    }
    manifest_digest, manifest_bytes = blob(dumps(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rpartition(":")[2],
                },
            }
        ],
    }
    files = {
        "oci-layout": dumps({"imageLayoutVersion": "1.0.0"}),
        "index.json": dumps(index),
    }
    blobs = ((layer_digest, layer), (config_digest, config_bytes), (manifest_digest, manifest_bytes))
    for digest, data in blobs:
        files["blobs/sha256/" + digest.removeprefix("sha256:")] = data
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="image reference, e.g. sharegpu.local/pause:1")
    ap.add_argument("--rootfs", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--entrypoint", nargs="*", default=[])
    ap.add_argument("--cmd", nargs="*", default=[])
    ap.add_argument("--env", nargs="*", default=["PATH=/bin"])
    args = ap.parse_args()
    if not args.rootfs.is_dir():
        ap.error(f"{args.rootfs}: not a directory")
    data = build(args.name, args.rootfs, args.entrypoint, args.cmd, args.env)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, args.out)
    print(f"oci-image: {args.name} -> {args.out} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
