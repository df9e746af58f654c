"""Write a ``docker save`` archive from tar entries: test images made here, no registry."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from pathlib import Path

Entry = tuple[tarfile.TarInfo, bytes | None]


def entry(
    name: str,
    data: bytes | None = None,
    *,
    kind: bytes = tarfile.REGTYPE,
    mode: int = 0o644,
    link: str = "",
) -> Entry:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = link
    if kind == tarfile.REGTYPE:
        info.size = len(data or b"")
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, data


def layer_tar(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def docker_save(
    path: Path,
    layers: list[list[Entry]],
    tag: str = "piwork-test:latest",
    config: Mapping[str, object] | None = None,
) -> Path:
    """``path``: a docker-save (v1.2 manifest.json) archive with ``layers``, bottom first;
    ``config``: the image's run config (``Env``, ``WorkingDir``...), default ``PATH=/bin``."""
    blobs = [layer_tar(entries) for entries in layers]
    diff_ids = [f"sha256:{hashlib.sha256(b).hexdigest()}" for b in blobs]
    config_blob = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": config if config is not None else {"Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
    ).encode()
    config_name = f"{hashlib.sha256(config_blob).hexdigest()}.json"
    layer_names = [f"{d.split(':')[1]}/layer.tar" for d in diff_ids]
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [tag], "Layers": layer_names}]
    ).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in [
            (config_name, config_blob),
            *zip(layer_names, blobs, strict=True),
            ("manifest.json", manifest),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


TOOLS = [
    "sh",
    "cat",
    "ls",
    "echo",
    "env",
    "id",
    "sync",
    "uname",
    "mkdir",
    "base64",
    "timeout",
    "printf",
    "cp",
    "ln",
    "dirname",
    "tr",
]
"""busybox applets linked in the test image: a shell and what piwork env build's steps use."""


def busybox_image(
    path: Path,
    marker: bytes,
    busybox: Path = Path("/bin/busybox"),
    config: Mapping[str, object] | None = None,
    extra: list[Entry] | None = None,
) -> Path:
    """A tiny image: Debian's static busybox as /bin/sh and friends, and a marker file."""
    entries = [
        entry("bin", kind=tarfile.DIRTYPE, mode=0o755),
        entry("bin/busybox", busybox.read_bytes(), mode=0o755),
        *[entry(f"bin/{tool}", kind=tarfile.SYMTYPE, link="busybox", mode=0o777) for tool in TOOLS],
        entry("etc", kind=tarfile.DIRTYPE, mode=0o755),
        entry("etc/piwork-marker", marker),
        entry("root", kind=tarfile.DIRTYPE, mode=0o700),
        *(extra or []),
    ]
    return docker_save(path, [entries], config=config)
