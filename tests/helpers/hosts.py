"""A real OpenSSH server on 127.0.0.1, started by the test, with generated keys.

Debian's ``/usr/sbin/sshd`` (scripts/apt-packages.txt) runs in the foreground
(``-D``) from a config in a temp dir: its own host key, an authorized_keys file
holding a user key made for the test, a free port on loopback only. The
``sshd`` fixture (tests/hosts/conftest.py) gives the client side a private
``HOME`` and ``PIWORK_HOME``; teardown stops sshd and every session process it
forked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from piwork.hosts.store import Host
from tests.helpers.procs import descendants

SSHD = "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    dir: Path
    user: str
    user_key: Path
    host_key_pub: str
    fingerprint: str
    log: Path
    proc: subprocess.Popen[bytes]

    def host(self, name: str = "box", **extra: str) -> Host:
        return Host(
            name=name,
            hostname="127.0.0.1",
            user=self.user,
            port=self.port,
            identity=str(self.user_key),
            root=extra.get("root", str(self.dir / "remote-root")),
        )

    def sessions(self) -> list[int]:
        """Pids of sshd's per-connection processes (children of the listener)."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )


def _fingerprint(pub: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True
    )
    return out.stdout.split()[1]


@contextlib.contextmanager
def running_sshd(d: Path) -> Iterator[Sshd]:
    """Debian's sshd on a free loopback port with keys made in ``d``; stopped on exit."""
    if not os.path.exists(SSHD):
        raise RuntimeError(f"{SSHD} is missing: run scripts/setup.sh (openssh-server)")
    d.mkdir(parents=True, exist_ok=True)
    _keygen(d / "host_key")
    _keygen(d / "user_key")
    shutil.copy(d / "user_key.pub", d / "authorized_keys")
    port = _free_port()
    user = (
        os.environ.get("USER")
        or subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    )
    (d / "sshd_config").write_text(
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        f"HostKey {d / 'host_key'}\n"
        f"PidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\n"
        "StrictModes no\n"
        "UsePAM no\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\n"
        "AllowStreamLocalForwarding yes\n"
        # OpenSSH permits direct-streamlocal only where local TCP forwarding is on
        # (session.c: channel_permit_all is keyed on AllowTcpForwarding).
        "AllowTcpForwarding local\n"
        "X11Forwarding no\n"
        # A remote that takes what it is offered: finding 9's test sends PIWORK_* vars.
        "AcceptEnv PIWORK_*\n"
        "Subsystem sftp internal-sftp\n"
        "LogLevel VERBOSE\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    log = d / "sshd.log"
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {log.read_text()}")
            time.sleep(0.05)
        yield Sshd(
            port=port,
            dir=d,
            user=user,
            user_key=d / "user_key",
            host_key_pub=(d / "host_key.pub").read_text(),
            fingerprint=_fingerprint(d / "host_key.pub"),
            log=log,
            proc=proc,
        )
    finally:
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def files_holding(root: Path, needle: bytes) -> list[str]:
    hits = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath, f)
            if p.is_symlink() or not p.is_file():
                continue
            with p.open("rb") as fh:
                if needle in fh.read():
                    hits.append(str(p))
    return hits


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "piwork.cli.main", *args],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        env={**os.environ}, cwd=Path(__file__).parents[2],
    )  # fmt: skip
