"""``piwork bench --host`` against a throwaway Debian sshd on loopback (no box needed).

The measurements are ``piwork bench --host``'s (piwork.hosts.bench); this only
starts an sshd on 127.0.0.1 with generated keys (as tests/hosts do: root and
openssh-server needed), adds it as the host ``bench`` in a private piwork home
(the pack cache stays the person's: packs are big) and runs the command.

Run: .venv/bin/python -m benchmarks.remote [--delay-ms 50] [--rounds 1] [--json]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

from piwork.config import get_paths
from piwork.hosts import store
from piwork.hosts.bench import trust
from tests.hosts.conftest import running_sshd


def main(argv: list[str]) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="pwb-"))
    os.environ.setdefault("PIWORK_PACK_CACHE", str(get_paths().cache))
    os.environ["HOME"] = str(tmp / "home")
    os.environ["PIWORK_HOME"] = str(tmp / "piwork")
    (tmp / "home" / ".ssh").mkdir(parents=True)
    try:
        with running_sshd(tmp / "sshd") as sshd:
            host = sshd.host("bench", root=str(tmp / "r"))  # short: AF_UNIX paths
            asyncio.run(trust(host, sshd.fingerprint))
            store.save({host.name: host})
            from piwork.cli.main import main as piwork

            rounds = [] if "--rounds" in argv else ["--rounds", "1"]
            return piwork(["bench", "--host", host.name, *rounds, *argv])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
