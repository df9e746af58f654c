"""A stand-in for a piwork process holding a remote QEMU: tests kill it with SIGKILL.

``python -m tests.helpers.holder NAME-JSON FINGERPRINT LEASE`` connects to the
host (the test's sshd), starts ``qemu-system-x86_64 -machine none`` under the
watchdog, prints ``<pid> <rundir>`` and keeps the heartbeat going until killed.
"""

from __future__ import annotations

import asyncio
import sys

from piwork.hosts.connect import connect, fingerprint_matcher
from piwork.hosts.remote import remote_root
from piwork.hosts.store import Host
from piwork.hosts.watchdog import RemoteQemu

IDLE_QEMU = [
    "qemu-system-x86_64", "-machine", "none", "-nodefaults", "-display", "none",
    "-monitor", "none", "-serial", "none",
]  # fmt: skip


async def main() -> None:
    host = Host.model_validate_json(sys.argv[1])
    conn = await connect(host, fingerprint_matcher(sys.argv[2], None))
    root = await remote_root(conn, host, create=True)
    qemu = RemoteQemu(conn, root, IDLE_QEMU, lease=int(sys.argv[3]))
    await qemu.start()
    print(qemu.pid, qemu.rundir, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
