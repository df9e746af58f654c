"""The task's own folders (state, outputs) back from a remote run dir: what the guest
planted there is never followed. (The working folder has its own three-way sync:
test_hosts_folder_sync.py.)"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from piwork.agent import TaskDirs
from piwork.hosts.connect import connect, fingerprint_matcher
from piwork.hosts.vm import download_tree, upload_tree
from tests.helpers.hosts import Sshd


def lexists(p: Path) -> bool:
    return os.path.lexists(p)


def dirs_under(root: Path) -> TaskDirs:
    d = TaskDirs(root / "state", root / "outputs", root / "uploads", root / "work")
    for p in (d.state, d.outputs, d.uploads, d.work):
        assert p is not None
        p.mkdir(parents=True)
    return d


def plant(remote: TaskDirs, secret: Path) -> None:
    """What a hostile guest can leave in its writable shares."""
    w = remote.outputs
    (w / "ok.txt").write_text("the agent's work\n")
    (w / "sub").mkdir()
    (w / "sub" / "deep.txt").write_text("deep\n")
    os.symlink(secret, w / "passwd-link")  # a file link out of the folder
    os.symlink(secret.parent, w / "dir-link")  # a directory link out of it
    os.symlink("/", remote.state / "root")
    (w / "over-local-link.txt").write_text("must not go through the local link\n")


async def test_download_never_follows_links_either_side(sshd: Sshd, tmp_path: Path) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("outside the folder\n")
    local = dirs_under(tmp_path / "local")
    remote = dirs_under(tmp_path / "remote")
    victim = tmp_path / "victim.txt"
    victim.write_text("the person's file\n")
    os.symlink(victim, local.outputs / "over-local-link.txt")  # a link here, where a file comes
    (local.state / "mine.txt").write_text("uploaded once\n")
    os.symlink(victim, local.state / "link-not-sent")
    conn = await connect(sshd.host(), fingerprint_matcher(sshd.fingerprint, None))
    try:
        await upload_tree(conn, local, remote)
        assert (remote.state / "mine.txt").read_text() == "uploaded once\n"
        assert not lexists(remote.state / "link-not-sent")  # links are not sent
        plant(remote, secret)
        skipped = await download_tree(conn, remote, local)
    finally:
        conn.close()
        await conn.wait_closed()
    out = local.outputs
    assert (out / "ok.txt").read_text() == "the agent's work\n"
    assert (out / "sub" / "deep.txt").read_text() == "deep\n"
    for name in ("passwd-link", "dir-link"):
        assert not lexists(out / name)
    assert not lexists(local.state / "root")
    assert victim.read_text() == "the person's file\n"  # not written through the link
    assert (out / "over-local-link.txt").is_symlink()
    assert str(out / "over-local-link.txt") in skipped
    assert {str(remote.outputs / "passwd-link"), str(remote.outputs / "dir-link")} <= set(skipped)
    assert not await asyncio.to_thread(lambda: list((tmp_path / "local").rglob(".*piwork-sync")))
