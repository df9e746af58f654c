"""The working folder with a remote copy, three-way, against a real sshd (the "remote" is a
directory here that the agent's side is simulated in; the sync only sees it through SSH)."""

from __future__ import annotations

import os
from pathlib import Path

from piwork.hosts.connect import connect, fingerprint_matcher
from piwork.hosts.sync import Conflict, FolderSync
from tests.helpers.hosts import Sshd


def lexists(p: Path) -> bool:
    return os.path.lexists(p)


def read(p: Path) -> str:
    return p.read_text()


async def test_three_way_sync_keeps_the_persons_edit_and_never_follows_links(
    sshd: Sshd, tmp_path: Path
) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    (local / "sub").mkdir(parents=True)
    for name in ("agent-only.txt", "both.txt", "agent-deletes.txt", "person-only.txt"):
        (local / name).write_text(f"{name} v0\n")
    (local / "sub" / "deep.txt").write_text("deep v0\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("the person's file outside the folder\n")
    os.symlink(victim, local / "persons-link")  # the person's own link
    sync = FolderSync(local, str(remote))
    conn = await connect(sshd.host(), fingerprint_matcher(sshd.fingerprint, None))
    try:
        assert await sync.upload(conn) == 5
        assert not lexists(remote / "persons-link")
        # The agent's side (in the VM) and the person's side (here) both work:
        (remote / "agent-only.txt").write_text("agent v1\n")
        (remote / "both.txt").write_text("agent v1\n")
        (local / "both.txt").write_text("person v1\n")
        (remote / "agent-deletes.txt").unlink()
        (local / "person-only.txt").write_text("person v1\n")
        (remote / "sub" / "deep.txt").write_text("deep v1\n")
        (remote / "new.txt").write_text("made by the agent\n")
        (remote / "persons-link").write_text("the agent wrote where the person has a link\n")
        # Git metadata changed or made in the remote copy never comes back (host git
        # would run what its config names), in any spelling git accepts:
        (remote / ".git").mkdir()
        (remote / ".git" / "config").write_text("[core]\n\tfsmonitor = touch PWNED\n")
        (remote / "sub" / ".GIT").mkdir()
        (remote / "sub" / ".GIT" / "config").write_text("[core]\n\tpager = touch PWNED\n")
        os.symlink("/etc/passwd", remote / "planted")  # never comes back
        os.symlink(tmp_path, remote / "planted-dir")
        seen: list[Conflict] = []
        res = await sync.sync_back(conn, seen.append)
        again = await sync.sync_back(conn)
    finally:
        conn.close()
        await conn.wait_closed()
    assert sorted(res.fetched) == ["agent-only.txt", "new.txt", "sub/deep.txt"]
    assert res.deleted == ["agent-deletes.txt"]
    assert [c.path for c in res.conflicts] == ["both.txt", "persons-link"] == [c.path for c in seen]
    assert read(local / "agent-only.txt") == "agent v1\n"
    assert read(local / "both.txt") == "person v1\n"  # the person's version stays
    assert read(local / "both.txt.agent-1") == "agent v1\n"  # the agent's beside it
    assert read(local / "person-only.txt") == "person v1\n"
    assert read(local / "sub" / "deep.txt") == "deep v1\n"
    assert not lexists(local / "agent-deletes.txt")
    assert (local / "persons-link").is_symlink()  # not replaced, not written through
    assert read(victim) == "the person's file outside the folder\n"
    assert not lexists(local / "planted") and not lexists(local / "planted-dir")
    assert "persons-link" in res.conflicts[1].path and "beside" in res.conflicts[0].describe()
    assert (again.fetched, again.deleted, again.conflicts) == ([], [], [])
    assert not lexists(local / ".git") and not lexists(local / "sub" / ".GIT")
    assert {".git/config", "sub/.GIT/config"} <= set(res.skipped)
