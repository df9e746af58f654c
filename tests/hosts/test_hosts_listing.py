"""A malicious remote host's listings (review 2, finding 13), against piwork's real client code.

The remote here is an asyncssh server in this process (the same library piwork's
client uses, speaking real SSH and SFTP over loopback) whose answers are the
attack: SFTP directories with a NUL in a name, a tree deeper than any folder, more
entries than any task makes, a file that never ends; a ``sha256sum`` listing that
never ends or holds records no listing can. The real sshd tests (tests/hosts/
conftest.py) cannot serve these: no file system stores a NUL in a name.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import asyncssh
import pytest

from piwork.agent import AgentVm, TaskDirs
from piwork.hosts import listing
from piwork.hosts.listing import ListingTooLarge
from piwork.hosts.sync import remote_hashes
from piwork.hosts.vm import RemoteAgentVm, download_tree

Names = Callable[[str], Iterable[asyncssh.SFTPName] | None]


def _name(name: str | bytes, kind: int, size: int = 0) -> asyncssh.SFTPName:
    """An entry as a v3 server sends it: its type is in the mode bits."""
    raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else name
    return asyncssh.SFTPName(raw, b"", asyncssh.SFTPAttrs(size=size, permissions=kind | 0o644))


DIR, FILE = stat.S_IFDIR, stat.S_IFREG


class Remote:
    """What the hostile host answers: ``names(path)`` per directory (None: the real one),
    ``endless`` files that never end, ``listing`` bytes for any command it is asked to run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names: Names = lambda path: None
        self.endless: set[str] = set()
        self.listing: Callable[[], AsyncIterator[bytes]] | None = None
        self.commands: list[str] = []


def _sftp_factory(
    remote: Remote,
) -> Callable[[asyncssh.SSHServerChannel[bytes]], asyncssh.SFTPServer]:
    class Hostile(asyncssh.SFTPServer):
        async def scandir(self, path: bytes) -> AsyncIterator[asyncssh.SFTPName]:
            planted = remote.names(path.decode(errors="surrogateescape"))
            if planted is None:
                async for real in super().scandir(path):
                    yield real
                return
            for entry in planted:
                yield entry

        def open(self, path: bytes, pflags: int, attrs: asyncssh.SFTPAttrs) -> object:
            if path.decode(errors="surrogateescape") in remote.endless:
                return ("endless", path)
            return super().open(path, pflags, attrs)

        def read(self, file_obj: object, offset: int, size: int) -> bytes:
            if isinstance(file_obj, tuple) and file_obj[0] == "endless":
                return b"x" * size  # whatever was announced: it never ends
            return cast(bytes, super().read(file_obj, offset, size))

        def close(self, file_obj: object) -> None:
            if not (isinstance(file_obj, tuple) and file_obj[0] == "endless"):
                super().close(file_obj)

    return Hostile


@contextlib.asynccontextmanager
async def hostile_remote(
    tmp_path: Path,
) -> AsyncIterator[tuple[Remote, asyncssh.SSHClientConnection]]:
    remote = Remote(tmp_path / "remote")
    remote.root.mkdir()
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    user_key = asyncssh.generate_private_key("ssh-ed25519")

    async def process(proc: asyncssh.SSHServerProcess[bytes]) -> None:
        remote.commands.append(str(proc.command))
        if remote.listing is not None and "sha256sum" in str(proc.command):
            with contextlib.suppress(OSError, asyncssh.Error):
                async for chunk in remote.listing():
                    proc.stdout.write(chunk)
                    await proc.stdout.drain()
        proc.exit(0)

    server = await asyncssh.listen(
        "127.0.0.1", 0, server_host_keys=[host_key],
        authorized_client_keys=asyncssh.import_authorized_keys(
            user_key.export_public_key().decode()
        ),
        sftp_factory=_sftp_factory(remote), process_factory=process, encoding=None,
    )  # fmt: skip
    port = server.sockets[0].getsockname()[1]
    conn = await asyncssh.connect(
        "127.0.0.1", port, username="piwork", client_keys=[user_key], known_hosts=None,
        config=[],
    )  # fmt: skip
    try:
        yield remote, conn
    finally:
        conn.close()
        await conn.wait_closed()
        server.close()
        await server.wait_closed()


def task_dirs(root: Path) -> TaskDirs:
    d = TaskDirs(root / "state", root / "outputs", root / "uploads", None)
    for p in (d.state, d.outputs, d.uploads):
        p.mkdir(parents=True)
    return d


# --------------------------------------------------------------------------- SFTP listings


async def test_names_no_path_can_take_are_skipped_not_raised(tmp_path: Path) -> None:
    local = task_dirs(tmp_path / "local")
    async with hostile_remote(tmp_path) as (remote, conn):
        there = task_dirs(remote.root)
        (there.outputs / "work.txt").write_text("the agent's work\n")
        (there.outputs / os.fsdecode(b"\xff\xfe-not-utf8")).write_bytes(b"x")
        out = str(there.outputs)

        def names(path: str) -> list[asyncssh.SFTPName] | None:
            if path != out:
                return None
            return [
                _name("work.txt", FILE, 17),
                _name("nul\0name", FILE, 1),
                _name("../escape", FILE, 1),
                _name("a/b", DIR),
                _name("x" * 300, FILE, 1),
                _name(b"\xff\xfe-not-utf8", FILE, 1),
            ]

        remote.names = names
        skipped = await download_tree(conn, there, local)
    assert (local.outputs / "work.txt").read_text() == "the agent's work\n"
    # A name that is not UTF-8 is a name: it comes with its bytes, as os.fsdecode keeps them.
    assert {p.name for p in local.outputs.iterdir()} == {
        os.fsdecode(b"\xff\xfe-not-utf8"),
        "work.txt",
    }
    assert any("nul\\x00name" in s for s in skipped)
    assert not (tmp_path / "escape").exists() and not (local.outputs.parent / "escape").exists()


async def test_depth_entries_and_bytes_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "MAX_FILE_BYTES", 1 << 20)
    monkeypatch.setattr("piwork.hosts.vm.MAX_FILE_BYTES", 1 << 20)
    local = task_dirs(tmp_path / "local")
    async with hostile_remote(tmp_path) as (remote, conn):
        there = task_dirs(remote.root)
        out = str(there.outputs)
        remote.endless = {f"{out}/endless.bin"}

        def deep(path: str) -> list[asyncssh.SFTPName] | None:
            if path == out:
                return [_name("endless.bin", FILE, 10), _name("d", DIR)]
            if path.startswith(out + "/d"):
                return [_name("d", DIR)]  # a tree that never ends
            return None

        remote.names = deep
        skipped = await download_tree(conn, there, local)
        assert f"{out}/endless.bin" in skipped  # a file past the bound: skipped, not kept
        assert not list(local.outputs.glob("*endless*"))
        depth = sum(1 for _ in local.outputs.rglob("d"))
        assert depth == listing.MAX_DEPTH
        assert any(s.endswith("/d") for s in skipped)

        monkeypatch.setattr(listing, "MAX_ENTRIES", 2000)  # the same check, sooner
        remote.names = lambda path: (
            (_name(f"f{i}", FILE) for i in itertools.count()) if path == out else None
        )
        with pytest.raises(ListingTooLarge, match="more than 2000"):
            await download_tree(conn, there, local)


async def test_stop_brings_the_disk_back_and_removes_the_run_dir_whatever_is_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NUL in a name used to raise ValueError past stop()'s handling: the environment
    disk stayed there and the run dir was never removed."""
    local = task_dirs(tmp_path / "local")
    async with hostile_remote(tmp_path) as (remote, conn):
        there = task_dirs(remote.root)
        out = str(there.outputs)
        remote.names = lambda path: [_name("nul\0", FILE, 1)] if path == out else None
        brought: list[bool] = []

        async def nothing(self: AgentVm, *, graceful: bool = True) -> None:
            return None

        async def bring_back(self: RemoteAgentVm) -> bool:
            brought.append(True)
            return True

        monkeypatch.setattr(AgentVm, "stop", nothing)
        monkeypatch.setattr(RemoteAgentVm, "_bring_env_back", bring_back)
        agent = RemoteAgentVm.__new__(RemoteAgentVm)
        agent.link = cast(Any, SimpleNamespace(conn=conn, root=str(remote.root)))
        agent.remote_dirs = there
        agent.cfg = cast(Any, SimpleNamespace(dirs=local))
        agent.folder_sync = None
        agent.progress = None
        agent.rundir = str(remote.root / "run" / "r1")
        await agent.stop()
        # And a listing past every bound does not stop it either.
        monkeypatch.setattr(listing, "MAX_ENTRIES", 2000)
        remote.names = lambda path: (
            (_name(f"f{i}", FILE) for i in itertools.count()) if path == out else None
        )
        await agent.stop()
    assert brought == [True, True]
    assert remote.commands.count(f"rm -rf -- {agent.rundir}") == 2


# --------------------------------------------------------------------------- sha256 listing


async def test_the_sha256_listing_is_streamed_checked_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = "a" * 64
    records = [
        f"{good}  ./ok.txt",
        f"{good}  ./sub/deep.txt",
        f"{good}  ./../escape",
        f"{good}  /etc/passwd",
        f"{'z' * 64}  ./bad-digest",
        f"{good[:-1]}  ./short-digest",
        f"{good}  ./" + "/".join(["d"] * (listing.MAX_DEPTH + 5)),
        f"{good}  ./" + "n" * 300,
        f"{good}  ./a//b",
    ]

    async def some() -> AsyncIterator[bytes]:
        data = b"".join(r.encode() + b"\0" for r in records)
        for i in range(0, len(data), 7):  # in small pieces: records split across reads
            yield data[i : i + 7]

    async with hostile_remote(tmp_path) as (remote, conn):
        remote.listing = some
        assert await remote_hashes(conn, "/w") == {"ok.txt": good, "sub/deep.txt": good}

        async def endless_record() -> AsyncIterator[bytes]:
            yield good.encode() + b"  ./"
            while True:  # one record that never ends: never held whole
                yield b"x" * 65536

        remote.listing = endless_record
        with pytest.raises(ListingTooLarge, match="too long"):
            await remote_hashes(conn, "/w")

        monkeypatch.setattr(listing, "MAX_ENTRIES", 1000)

        async def too_many() -> AsyncIterator[bytes]:
            i = 0
            while True:
                yield b"".join(f"{good}  ./f{i + j}".encode() + b"\0" for j in range(100))
                i += 100

        remote.listing = too_many
        with pytest.raises(ListingTooLarge, match="more than 1000"):
            await remote_hashes(conn, "/w")


def test_names_and_paths_from_a_remote() -> None:
    assert listing.name_ok("ok.txt") and listing.name_ok("é" * 100)
    for bad in ("", ".", "..", "a/b", "nul\0", "x" * 256, "é" * 128):
        assert not listing.name_ok(bad), bad
    assert listing.rel_ok("a/b/c.txt")
    for bad in ("/abs", "a//b", "a/../b", "a/./b", "/".join(["d"] * 70), "a/" + "b" * 4096):
        assert not listing.rel_ok(bad), bad[:20]


@pytest.fixture(autouse=True)
def _no_real_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    os.makedirs(tmp_path / "home", exist_ok=True)
