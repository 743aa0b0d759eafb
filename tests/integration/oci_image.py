#!/usr/bin/env python3
"""Writes an OCI image offline for the template tests: an OCI image layout
directory (oci), or what `docker save` writes (docker-archive), from a JSON
description given as the only argument:

  {"format": "oci" | "docker-archive", "out": PATH, "tag": "latest",
   "config": {"Env": [...], "WorkingDir": ..., "User": ..., "Cmd": [...]},
   "layers": [[ENTRY, ...], ...], "gzip": true}

An ENTRY is {"name", "type": file|dir|symlink|hardlink|char|block|fifo,
"data" (text), "host" (a host file whose bytes it holds), "zeros" (that
many zero bytes), "target" (links), "mode", "uid", "gid", "major", "minor"}
or {"many": N, "prefix": "d/"} (N empty files: a bomb of tiny files).
Names are written as given, hostile ones included ("../x", "/x").
"""

import gzip
import hashlib
import io
import json
import os
import sys
import tarfile


class Zeros(io.RawIOBase):
    def __init__(self, n):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def layer_tar(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            if "many" in e:
                for i in range(e["many"]):
                    info = tarfile.TarInfo(f'{e.get("prefix", "")}{i}')
                    tar.addfile(info)
                continue
            info = tarfile.TarInfo(e["name"])
            info.mode = e.get("mode", 0o644)
            info.uid = e.get("uid", 0)
            info.gid = e.get("gid", 0)
            kind = e.get("type", "file")
            data = None
            if kind == "file":
                if "host" in e:
                    with open(e["host"], "rb") as f:
                        raw = f.read()
                    info.mode = e.get("mode", os.stat(e["host"]).st_mode & 0o7777)
                    info.size = len(raw)
                    data = io.BytesIO(raw)
                elif "zeros" in e:
                    info.size = e["zeros"]
                    data = io.BufferedReader(Zeros(e["zeros"]))
                else:
                    raw = e.get("data", "").encode()
                    info.size = len(raw)
                    data = io.BytesIO(raw)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = e.get("mode", 0o755)
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = e["target"]
            elif kind == "hardlink":
                info.type = tarfile.LNKTYPE
                info.linkname = e["target"]
            elif kind in ("char", "block"):
                info.type = tarfile.CHRTYPE if kind == "char" else tarfile.BLKTYPE
                info.devmajor = e.get("major", 1)
                info.devminor = e.get("minor", 3)
                info.mode = e.get("mode", 0o666)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, data)
    return buf.getvalue()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def main():
    spec = json.loads(sys.argv[1])
    tars = [layer_tar(entries) for entries in spec["layers"]]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": spec.get("config", {}),
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha(t) for t in tars]},
    }
    config_bytes = json.dumps(config).encode()
    tag = spec.get("tag", "latest")
    out = spec["out"]
    if spec["format"] == "docker-archive":
        with tarfile.open(out, "w") as archive:
            def add(name, b):
                info = tarfile.TarInfo(name)
                info.size = len(b)
                archive.addfile(info, io.BytesIO(b))
            names = []
            for t in tars:
                name = sha(t) + "/layer.tar"
                add(name, t)
                names.append(name)
            add(sha(config_bytes) + ".json", config_bytes)
            manifest = [{"Config": sha(config_bytes) + ".json", "RepoTags": ["moat-test:" + tag], "Layers": names}]
            add("manifest.json", json.dumps(manifest).encode())
        return
    blobs = os.path.join(out, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)

    def blob(b):
        with open(os.path.join(blobs, sha(b)), "wb") as f:
            f.write(b)
        return {"digest": "sha256:" + sha(b), "size": len(b)}

    layers = []
    for t in tars:
        if spec.get("gzip", True):
            d = blob(gzip.compress(t, compresslevel=1))
            d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
        else:
            d = blob(t)
            d["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
        layers.append(d)
    c = blob(config_bytes)
    c["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": c,
                "layers": layers}
    m = blob(json.dumps(manifest).encode())
    m["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    m["annotations"] = {"org.opencontainers.image.ref.name": tag}
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [m]}, f)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)


if __name__ == "__main__":
    main()
