"""Templates and ports (issue 28's server pieces), to the contract the SDKs share.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import json
import tarfile
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from moat import (
    ConflictError,
    Environment,
    InvalidRequestError,
    Moat,
    MoatError,
    NotFoundError,
    PortUnreachableError,
    TemplateFailedError,
)

from conftest import wait_until



def _blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_oci_layout(layout: Path, tag: str, files: dict[str, bytes], env: list[str]) -> None:
    """A one-layer OCI image layout, written by hand (no registry, no network)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    layer = _blob(layout, gzip.compress(raw.getvalue()))
    config = _blob(layout, json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": env, "WorkingDir": "/", "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode())
    manifest = _blob(layout, json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }).encode())
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_text(json.dumps({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest,
                       "annotations": {"org.opencontainers.image.ref.name": tag}}],
    }))


def test_templates_list_has_host(moat: Moat) -> None:
    host = {t["name"]: t for t in moat.templates.list()}["host"]
    assert host["source"] == "builtin" and host["state"] == "ready"
    assert moat.templates.get("host")["name"] == "host"
    with pytest.raises(NotFoundError):
        moat.templates.get("no-such-template")


def test_import_an_oci_layout_waits_until_ready_and_remove(moat: Moat, tmp_path: Path) -> None:
    layout = tmp_path / "image"
    write_oci_layout(layout, "v1", {"hello.txt": b"from an image\n"}, ["FOO=bar", "PATH=/usr/bin:/bin"])
    progress: list[dict[str, Any]] = []
    template = moat.templates.import_(f"oci:{layout}:v1", name="pysdk-img:v1", on_progress=progress.append)
    assert template["state"] == "ready" and template["name"] == "pysdk-img:v1"
    assert "FOO=bar" in template["config"]["env"]
    assert progress and progress[0]["state"] in ("importing", "ready")
    assert "pysdk-img:v1" in [t["name"] for t in moat.templates.list()]
    with pytest.raises(ConflictError):
        moat.templates.import_(f"oci:{layout}:v1", name="pysdk-img:v1")  # the name is taken
    moat.templates.remove("pysdk-img:v1")
    with pytest.raises(NotFoundError):
        moat.templates.get("pysdk-img:v1")


def test_a_bad_source_or_name_is_a_typed_error(moat: Moat, tmp_path: Path) -> None:
    # `host` is both a name the contract refuses and one that exists: either answer names it.
    with pytest.raises((InvalidRequestError, ConflictError)) as caught:
        moat.templates.import_(f"oci:{tmp_path}", name="host")
    assert caught.value.field == "name" or caught.value.code == "conflict"
    with pytest.raises(InvalidRequestError) as caught:
        moat.templates.import_(f"oci:{tmp_path}", name="Bad Name")
    assert caught.value.field == "name"
    # An empty directory is no image: refused at once or failed while importing.
    with pytest.raises((InvalidRequestError, TemplateFailedError)):
        moat.templates.import_(f"oci:{tmp_path}:latest", name="pysdk-empty", timeout=120)
    try:
        moat.templates.remove("pysdk-empty")
    except NotFoundError:
        pass


def test_build_a_template_and_create_from_it(moat: Moat) -> None:
    template = moat.templates.build(
        "pysdk-built", base="host", run=["mkdir -p /opt/app", "echo built > /opt/app/marker"], timeout=300
    )
    assert template["state"] == "ready"
    env = moat.create("pysdk-built", ram_mb=128)
    try:
        assert env.info["template"] == "host"  # the base: the built files are a fork of its snapshot
        assert env.run("cat /opt/app/marker").stdout == "built\n"
        # Deleting a built template leaves the environments made from it their own copies.
        moat.templates.remove("pysdk-built")
        assert env.run("cat /opt/app/marker").stdout == "built\n"
        with pytest.raises(NotFoundError):
            moat.templates.get("pysdk-built")
    finally:
        env.destroy()


def _serve(env: Environment, port: int) -> None:
    env.files.write("/workspace/www/hello.txt", "hello from inside\n")
    env.start(["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd="/workspace/www")

    def up() -> bool:
        return env.run(["python3", "-c", f"import urllib.request as u; u.urlopen('http://127.0.0.1:{port}/')"]).ok

    wait_until(up, timeout=20, what="the server inside to listen")


def _open(url: str) -> tuple[int, bytes]:
    """GET a preview URL without any token, connecting to loopback whatever its host name."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection("127.0.0.1", parts.port or 80, timeout=10)
    try:
        conn.request("GET", (parts.path or "/") + "hello.txt", headers={"Host": parts.netloc})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_ports_proxy_and_preview_urls(moat: Moat, env: Environment) -> None:
    _serve(env, 8000)
    answer = moat.transport.request("GET", env.port_path(8000, "/hello.txt"))
    assert answer.status == 200 and answer.body == b"hello from inside\n"
    with pytest.raises(PortUnreachableError) as caught:
        moat.transport.request("GET", env.port_path(8001, "/"))
    assert caught.value.status == 502 and caught.value.code == "port_unreachable"

    url = env.get_url(8000, ttl_s=120)
    assert url.startswith("http://")
    assert _open(url) == (200, b"hello from inside\n")
    previews = env.previews()
    assert len(previews) == 1 and previews[0]["port"] == 8000 and "url" not in previews[0]
    env.revoke_preview(previews[0]["id"])
    assert _open(url)[0] >= 400
    assert env.previews() == []


def test_a_preview_of_an_unknown_environment_is_not_found(moat: Moat) -> None:
    with pytest.raises(NotFoundError):
        Environment(moat, {"id": "000000000000"}).get_url(8000)
    with pytest.raises(MoatError):
        Environment(moat, {"id": "000000000000"}).previews()
