"""A stand-in manifest and accelerator for unit tests, and the real launcher run in
the pack's guest tree (``guest_tree`` fixture, tests/unit/conftest.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from piwork.pack.manifest import Manifest
from piwork.vm.accel import Accel, AccelChoice

MANIFEST = Manifest(
    pack_id="pack-1",
    kernel="vmlinuz",
    initrd="initrd.cpio",
    cmdline="console=ttyS0",
    versions={},
    files=[],
    created_at="2026-11-22T00:00:00Z",
    builder="test",
)


TCG = AccelChoice(Accel.TCG, "test", ["-accel", "tcg"])


NODE = "/opt/piwork/node/bin/node"


LAUNCHER = "/opt/piwork/launcher/launch.mjs"


EXTENSIONS = ("permission-gate", "ask-user")


def _lines(sock: socket.socket, deadline: float) -> Iterator[str]:
    buf = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode()


def launch(
    root: Path,
    go: dict[str, object],
    stdin: bytes,
    *node_flags: str,
    timeout: float = 120,
    script: str | None = LAUNCHER,
) -> tuple[dict[str, object], str, str]:
    """The real launcher in the guest tree, started as the supervisor starts it, then
    told ``go``: its "loaded" message, pi's stdout and stderr. ``script=None``: node runs
    what ``node_flags`` say (``--snapshot-blob``), not launch.mjs itself."""
    ours, theirs = socket.socketpair()
    env = {
        "PATH": "/bin",
        "HOME": "/root",
        "NODE_DEBUG_NATIVE": "COMPILE_CACHE",
        # As the supervisor starts it: the extensions to load before "go".
        "PIWORK_WARM_EXTENSIONS": ":".join(f"/opt/piwork/extensions/{e}.ts" for e in EXTENSIONS),
    }
    cmd = ["unshare", "--user", "--map-root-user", f"--root={root}", "--wd=/tmp"]
    cmd += [NODE, *node_flags, *([script] if script else [])]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        # The control socket is the launcher's fd 3, as the supervisor gives it.
        # dup2 clears close-on-exec; every other descriptor of ours has it set.
        close_fds=False,
        preexec_fn=lambda: os.dup2(theirs.fileno(), 3),
    )
    theirs.close()
    try:
        first = next(_lines(ours, time.monotonic() + 120), None)
        if first is None:
            proc.kill()
            _out, err = proc.communicate(timeout=30)
            raise AssertionError(f"the launcher said nothing on fd 3: {err.decode()[-2000:]}")
        ours.sendall(json.dumps(go).encode() + b"\n")
        out, err = proc.communicate(stdin, timeout=timeout)
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return json.loads(first), out.decode(), err.decode()
