"""One app per piwork home: a second launch raises the first window and exits.

Why: two windows over one task store fight over the same tasks. The second
instance used to try to run a task the first one owned, fail to claim it, and
show it as "failed" while it was running fine next door (issue 16). A local
socket named after the piwork state directory is the rendezvous: the first
instance listens; a later one connects, says ``raise``, and exits. If the first
died, its socket file is stale: nobody answers, so the new one removes it and
becomes the listener.
"""

from __future__ import annotations

import hashlib
import os

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from piwork.config import Paths
from piwork.errors import PersonError

RAISE = b"raise\n"


def server_name(paths: Paths) -> str:
    """Per user and per piwork home (tests and PIWORK_HOME get their own)."""
    digest = hashlib.sha256(str(paths.state.resolve()).encode()).hexdigest()[:16]
    return f"piwork-{os.getuid()}-{digest}"


class AlreadyRunning(RuntimeError, PersonError):
    """Another instance holds the socket but did not answer (busy or hung)."""


def ask_first_to_raise(name: str, timeout_ms: int = 3000) -> bool:
    """True if another instance listens on ``name`` and showed its window; False if
    nobody listens. Raises AlreadyRunning if one listens but does not answer: its
    socket must not be taken over then."""
    sock = QLocalSocket()
    sock.connectToServer(name)
    if not sock.waitForConnected(timeout_ms):
        return False
    sock.write(RAISE)
    sock.flush()
    sock.waitForBytesWritten(timeout_ms)
    # Wait for the first instance's acknowledgement, so the raise really happened.
    ok = sock.waitForReadyRead(timeout_ms) and bytes(sock.readAll().data()).startswith(b"ok")
    sock.disconnectFromServer()
    if not ok:
        raise AlreadyRunning(
            "piwork is already running but did not answer; switch to its window, "
            "or end that process if it hangs"
        )
    return True


class SingleInstance(QObject):
    """The first instance's listener; ``raise_requested`` fires on each later launch."""

    raise_requested = Signal()

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not self.server.listen(name):
            # A stale socket from a dead instance (ask_first_to_raise found nobody).
            QLocalServer.removeServer(name)
            if not self.server.listen(name):
                raise OSError(f"cannot listen on {name}: {self.server.errorString()}")
        self.server.newConnection.connect(self._accept)

    def _accept(self) -> None:
        while self.server.hasPendingConnections():
            sock = self.server.nextPendingConnection()
            if sock is None:
                return
            sock.readyRead.connect(lambda s=sock: self._read(s))
            sock.disconnected.connect(sock.deleteLater)

    def _read(self, sock: QLocalSocket) -> None:
        data = bytes(sock.readAll().data())
        if data.startswith(RAISE.strip()):
            self.raise_requested.emit()
            sock.write(b"ok\n")
            sock.flush()

    def close(self) -> None:
        self.server.close()


def claim(paths: Paths) -> SingleInstance | None:
    """Become the one instance, or (None) hand over to the running one."""
    name = server_name(paths)
    if ask_first_to_raise(name):
        return None
    return SingleInstance(name)
