"""Fixtures for the remote-host tests: ``sshd`` (a real OpenSSH server on loopback,
tests/helpers/hosts.py) with a private ``HOME`` and ``PIWORK_HOME``, ``box`` (that
host added as ``piwork hosts add`` does) and ``short_root`` (a short remote run dir).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from piwork.hosts import store
from piwork.hosts.connect import connect, fingerprint_matcher
from tests.helpers.hosts import Sshd, running_sshd


@pytest.fixture
def sshd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sshd]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "piwork-home"))
    try:
        with running_sshd(tmp_path / "sshd") as server:
            yield server
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
async def box(sshd: Sshd, short_root: Path) -> AsyncIterator[store.Host]:
    """The host ``box`` added as ``piwork hosts add`` does: its key accepted once."""
    host = sshd.host(root=str(short_root))
    conn = await connect(host, fingerprint_matcher(sshd.fingerprint, None))
    conn.close()
    await conn.wait_closed()
    store.save({host.name: host})
    yield host


@pytest.fixture
def short_root() -> Iterator[Path]:
    """AF_UNIX paths are short (~107 bytes): the remote run dir must be too."""
    root = Path(tempfile.mkdtemp(prefix="pwr-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)
