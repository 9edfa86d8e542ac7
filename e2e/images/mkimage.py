#!/usr/bin/env python3
"""Writes a docker-archive image tarball (what `ctr images import` takes) from local files,
without a Docker engine or a registry.

usage: mkimage.py OUT.tar REPO:TAG --entrypoint /bin/x [--user 65532] [--env K=V] FILE=/path/in/image ...

The image has one layer: the given files (mode 0755), /etc/passwd and /etc/group with a
nonroot user, and /tmp. Timestamps are fixed so the same inputs give the same image ID.
"""
import argparse, hashlib, io, json, os, tarfile

def add_bytes(tar, path, data, mode=0o644):
    info = tarfile.TarInfo(path.lstrip("/"))
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))

def add_dir(tar, path, mode=0o755):
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = 0
    tar.addfile(info)

def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("ref")
    p.add_argument("--entrypoint", required=True)
    p.add_argument("--user", default="65532")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("files", nargs="+")
    a = p.parse_args()

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as t:
        for d in ["etc", "tmp", "bin"]:
            add_dir(t, d, 0o1777 if d == "tmp" else 0o755)
        add_bytes(t, "etc/passwd", b"root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n")
        add_bytes(t, "etc/group", b"root:x:0:\nnonroot:x:65532:\n")
        for spec in a.files:
            src, dst = spec.split("=", 1)
            with open(src, "rb") as f:
                add_bytes(t, dst, f.read(), 0o755)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()

    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": [a.entrypoint],
            "User": a.user,
            "Env": ["PATH=/bin"] + a.env,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "proxyfleet e2e/images/mkimage.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.split(":")[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [a.ref], "Layers": [layer_name]}]

    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with tarfile.open(a.out, "w", format=tarfile.GNU_FORMAT) as t:
        add_bytes(t, config_name, config_bytes)
        add_dir(t, diff_id.split(":")[1])
        add_bytes(t, layer_name, layer_bytes)
        add_bytes(t, "manifest.json", json.dumps(manifest).encode())
    print(f"{a.out}: {a.ref} ({len(layer_bytes) // 1024} KiB layer)")

if __name__ == "__main__":
    main()
