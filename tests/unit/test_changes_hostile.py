"""A hostile guest's change sets: nothing it reports leaves the folder, follows a link, or
grows the host without bound; what it cannot be trusted with waits for the person.

The wire is the real host end (``piwork.changes.wire.LayerClient``) over a real
socket pair, fed what a guest root could send; the engine, journal, store and
folder are the real ones.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import random
import socket
from pathlib import Path

import pytest

from piwork.changes.engine import Answer, FolderChanges
from piwork.changes.entry import EntryError, Kind, parse_entry
from piwork.changes.history import describe, file_diff
from piwork.changes.holds import git_alias, refused_prefix
from piwork.changes.wire import MAX_LINE, LayerClient, LayerError
from tests.helpers.changes import Judge, Layer


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "raw",
    [
        b"../x",
        b"a/../../x",
        b"/etc/passwd",
        b"a//b",
        b"a/./b",
        b"",
        b"a\0b",
        b"x" * 5000,
        b"a/" + b"n" * 300,
    ],
)
def test_paths_that_could_leave_the_folder_are_refused(raw: bytes) -> None:
    with pytest.raises(EntryError):
        parse_entry({"p": b64(raw), "k": "file", "m": 420, "s": 1, "h": "0" * 64})


@pytest.mark.parametrize(
    "entry",
    [
        {"k": "file", "m": 420, "s": -1, "h": "0" * 64},
        {"k": "file", "m": 420, "s": 1 << 40, "h": "0" * 64},
        {"k": "file", "m": 420, "s": 1, "h": "not-a-sha"},
        {"k": "file", "m": 0o17777, "s": 1, "h": "0" * 64},
        {"k": "file", "m": True, "s": 1, "h": "0" * 64},
        {"k": "link", "m": 511, "t": b64(b"")},
        {"k": "link", "m": 511, "t": b64(b"a\0b")},
        {"k": "link", "m": 511, "t": b64(b"x" * 5000)},
        {"k": "socket"},
        {"k": "file", "m": 420, "s": 1, "h": "0" * 64, "p": "%%%not base64"},
    ],
)
def test_malformed_entries_are_refused(entry: dict[str, object]) -> None:
    entry = {"p": b64(b"ok"), **entry}
    with pytest.raises(EntryError):
        parse_entry(entry)


def test_names_that_are_not_utf8_keep_their_bytes() -> None:
    c = parse_entry({"p": b64(b"caf\xe9/\xff\xfe"), "k": "gone"})
    assert os.fsencode(c.path) == b"caf\xe9/\xff\xfe"


async def _client(guest_lines: list[bytes]) -> tuple[LayerClient, socket.socket]:
    host, guest = socket.socketpair()
    guest.sendall(b"".join(guest_lines))
    guest.shutdown(socket.SHUT_WR)
    reader, writer = await asyncio.open_connection(sock=host, limit=MAX_LINE + 1024)
    return LayerClient(reader, writer), guest


def line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


async def test_a_scan_keeps_only_valid_entries_each_once_and_at_most_the_maximum() -> None:
    good = {"p": b64(b"a.txt"), "k": "file", "m": 420, "s": 1, "h": "0" * 64}
    lines = [line({"e": good}), line({"e": good}), line({"e": {"p": b64(b"../x"), "k": "gone"}})]
    lines += [line({"e": {"p": b64(f"f{i}".encode()), "k": "gone"}}) for i in range(50)]
    lines.append(line({"done": {"count": 53, "truncated": False, "errors": ["x" * 9999]}}))
    client, guest = await _client(lines)
    scan = await client.scan(10)
    assert [c.path for c in scan.changes] == ["a.txt"] + [f"f{i}" for i in range(7)]
    assert scan.truncated  # the guest sent more than asked: nothing past the maximum kept
    assert "a path reported twice" in scan.refused
    assert any("'..'" in r for r in scan.refused)
    assert len(scan.errors[0]) <= 300
    guest.close()


async def test_an_endless_line_ends_the_conversation() -> None:
    client, guest = await _client([b"{" + b"x" * (MAX_LINE + 10)])
    with pytest.raises(LayerError):
        await client.scan(10)
    guest.close()


async def test_a_read_is_bounded_and_checked_against_the_scan() -> None:
    from piwork.changes.entry import Change
    from piwork.changes.wire import FileChanged

    data = b"hello"
    c = Change("a", Kind.FILE, 0o644, 5, hashlib.sha256(data).hexdigest())
    client, guest = await _client([line({"size": 5}), b"HELLO"])
    with pytest.raises(FileChanged):  # bytes that are not what the scan said
        await client.read(c, 100)
    guest.close()
    client, guest = await _client([line({"size": 1 << 30})])
    with pytest.raises(LayerError):  # more than asked for
        await client.read(c, 100)
    guest.close()
    client, guest = await _client([line({"size": 5}), b"hel"])
    with pytest.raises(LayerError):  # cut short
        await client.read(c, 100)
    guest.close()


def test_every_spelling_of_git_is_git() -> None:
    for name in (".git", ".GIT", ".Git.", ".git ", ".git:x", "git~1", ".g\u200cit"):
        assert git_alias(name), name
    assert refused_prefix("a/.GIT/config") == "a/.GIT"
    assert refused_prefix("a\\.git/x") == "a\\.git"
    assert refused_prefix("src/gitignore") is None


async def test_a_link_planted_in_the_folder_is_replaced_never_written_through(
    tmp_path: Path,
) -> None:
    """The person's folder holds a link (theirs); the agent writes that path: the
    link is replaced, the file it points to is never touched."""
    folder = tmp_path / "f"
    folder.mkdir()
    target = tmp_path / "outside.txt"
    target.write_text("outside\n")
    os.symlink(target, folder / "link")
    os.symlink(tmp_path, folder / "dirlink")
    layer = Layer()
    layer.write("link", b"agent\n")
    layer.write("dirlink/escape.txt", b"escape\n")
    engine = FolderChanges(tmp_path / "task", folder)
    out = await engine.take(layer, Judge(answer=Answer.ALLOW), turn=1, label="turn 1")
    assert target.read_text() == "outside\n"
    assert not (tmp_path / "escape.txt").exists()
    assert (folder / "link").read_text() == "agent\n" and not (folder / "link").is_symlink()
    # replacing the person's link to a folder by a folder is a replacement: asked, and
    # allowed here; the new file lands in a real folder, not through the link
    assert (folder / "dirlink" / "escape.txt").read_text() == "escape\n"
    assert not (folder / "dirlink").is_symlink()
    assert ("dirlink/escape.txt", "added") in out.applied


async def test_nothing_outside_the_folder_changes_whatever_the_layer_says(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    (tmp_path / "sibling.txt").write_text("keep\n")
    layer = Layer()
    for p in ("a/b/c.txt", "x.txt"):
        layer.write(p, b"data\n")
    layer.delete("nope/none")
    layer.link("l", "../sibling.txt")
    engine = FolderChanges(tmp_path / "task", folder)
    await engine.take(layer, Judge(answer=Answer.ALLOW), turn=1, label="turn 1")
    assert_only(tmp_path, folder)


def assert_only(tmp_path: Path, folder: Path) -> None:
    assert (tmp_path / "sibling.txt").read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "sibling.txt", "task"]
    assert not os.path.lexists(folder / "l")  # a link out of the folder waits


def crafted_lines(n_bytes: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return b"".join(rng.choice((b"a\n", b"b\n")) for _ in range(n_bytes // 2))


def test_crafted_diffs_are_bounded(tmp_path: Path) -> None:
    from piwork.changes.entry import Change
    from piwork.changes.store import ObjectStore

    store = ObjectStore(tmp_path / "o")

    def put(data: bytes, path: str) -> Change:
        return Change(path, Kind.FILE, 0o644, len(data), store.put(data))

    def pair(path: str, a: bytes, b: bytes) -> tuple[Change, Change]:
        return put(a, path), put(b, path)

    net = {
        "huge.txt": pair("huge.txt", crafted_lines(4 << 20, 1), crafted_lines(4 << 20, 3)),
        "small.txt": pair("small.txt", crafted_lines(64 << 10, 2), crafted_lines(64 << 10, 4)),
        "tiny.txt": pair("tiny.txt", b"one\n", b"two\n"),
    }
    by_path = {c.path: c for c in describe(store, net)}
    assert by_path["huge.txt"].diff is None and "over 1 MiB" in (by_path["huge.txt"].note or "")
    assert "+two" in (by_path["tiny.txt"].diff or "")
    slow = file_diff(store, "small.txt", *net["small.txt"], timeout=0.0001)
    assert slow[1] is None and "longer than" in (slow[2] or "")
    spent = describe(store, net, budget=0.0)
    assert all(c.diff is None for c in spent)
    capped = describe(store, net, diffs=1)
    assert [c.note for c in capped][1:] == ["no diff: only the first 1 files get one"] * 2


async def test_a_change_set_over_the_maximum_waits_for_the_next_one(tmp_path: Path) -> None:
    from piwork.changes.engine import Limits

    folder = tmp_path / "f"
    folder.mkdir()
    layer = Layer()
    for i in range(30):
        layer.write(f"f{i:02d}", b"x")
    engine = FolderChanges(tmp_path / "task", folder, limits=Limits(max_entries=10))
    out = await engine.take(layer, Judge(), turn=1, label="turn 1")
    assert out.truncated and len(out.applied) == 10
    engine.limits = Limits()
    await engine.take(layer, Judge(), turn=2, label="turn 2")
    assert sorted(os.listdir(folder)) == [f"f{i:02d}" for i in range(30)]
