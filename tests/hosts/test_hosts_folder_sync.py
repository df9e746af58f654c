"""The working folder with a remote copy (``--host``): sent over a real sshd, its changes
brought back through the same change-set engine as a local run, three-way against the
copy that was sent (issue 34; review-2 finding 4).

The remote guest's view is a directory here (a layer over the copy, as the remote
VM's overlay is); the engine, its holds and the person's folder are the real ones.
"""

from __future__ import annotations

import os
from pathlib import Path

from piwork.changes.engine import Answer, FolderChanges
from piwork.changes.folder import Seen
from piwork.changes.sources import person_changed_since
from piwork.hosts.connect import connect, fingerprint_matcher
from piwork.hosts.sync import FolderSync
from tests.helpers.changes import Judge, MirrorLayer
from tests.helpers.hosts import Sshd


class RemoteLayer(MirrorLayer):
    """The remote VM's layer: changes against the copy as it was sent (the baseline)."""

    def __init__(self, view: Path, start: Path, baseline: dict[str, str]) -> None:
        super().__init__(view, start)
        self.baseline = baseline

    def person_changed(self, seen: Seen, written: tuple[int, ...] | None) -> bool:
        base = self.baseline.get(seen.change.path)
        if base is None and written is None:
            return seen.change.kind.value != "gone"
        return person_changed_since(seen, written, 0, base)


def lexists(p: Path) -> bool:
    return os.path.lexists(p)


async def test_a_remote_copys_changes_come_back_three_way_and_never_as_git_metadata(
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
    (local / "meta").mkdir()  # what a `--separate-git-dir` repository's metadata looks like
    sync = FolderSync(local, str(remote))
    conn = await connect(sshd.host(), fingerprint_matcher(sshd.fingerprint, None))
    try:
        assert await sync.upload(conn) == 5
    finally:
        conn.close()
        await conn.wait_closed()
    assert not lexists(remote / "persons-link")
    layer = RemoteLayer(tmp_path / "view", remote, dict(sync.baseline))
    view = layer.view
    # The agent's side (the remote VM) and the person's side (here) both work:
    (view / "agent-only.txt").write_text("agent v1\n")
    (view / "both.txt").write_text("agent v1\n")
    (local / "both.txt").write_text("person v1\n")
    (view / "agent-deletes.txt").unlink()
    (local / "person-only.txt").write_text("person v1\n")
    (view / "sub" / "deep.txt").write_text("deep v1\n")
    (view / "new.txt").write_text("made by the agent\n")
    (view / "persons-link").write_text("the agent wrote where the person has a link\n")
    # Finding 4: git metadata from the remote, in every form local mode guards against.
    (view / ".git").mkdir()
    (view / ".git" / "config").write_text("[core]\n\tfsmonitor = touch PWNED\n")
    (view / "sub" / ".GIT").mkdir()
    (view / "sub" / ".GIT" / "config").write_text("[core]\n\tpager = touch PWNED\n")
    for d in ("objects", "refs"):
        (view / "meta" / d).mkdir(parents=True)
    (view / "meta" / "HEAD").write_text("ref: refs/heads/main\n")
    (view / "meta" / "config").write_text("[core]\n\tfsmonitor = touch PWNED\n")
    (view / "mirror.git" / "objects" / "info").mkdir(parents=True)
    (view / "mirror.git" / "refs").mkdir()
    (view / "mirror.git" / "HEAD").write_text("ref: refs/heads/main\n")
    (view / "mirror.git" / "objects" / "info" / "alternates").write_text("/tmp\n")
    (view / "app" / ".githooks").mkdir(parents=True)
    (view / "app" / ".githooks" / "pre-commit").write_text("touch PWNED\n")
    os.symlink("/etc/passwd", view / "planted")
    os.symlink(tmp_path, view / "planted-dir")

    engine = FolderChanges(tmp_path / "task", local)
    judge = Judge(answer=Answer.ALLOW)  # the person allows the delete
    out = await engine.take(layer, judge, turn=1, label="turn 1")
    again = await engine.take(layer, judge, turn=2, label="turn 2")

    applied = dict(out.applied)
    assert applied["agent-only.txt"] == "modified" and applied["sub/deep.txt"] == "modified"
    assert applied["new.txt"] == "added" and applied["agent-deletes.txt"] == "deleted"
    assert (local / "agent-only.txt").read_text() == "agent v1\n"
    assert (local / "both.txt").read_text() == "person v1\n"  # the person's version stays
    assert (local / "both.txt.agent-1").read_text() == "agent v1\n"  # the agent's beside it
    assert (local / "person-only.txt").read_text() == "person v1\n"
    assert not lexists(local / "agent-deletes.txt")
    assert victim.read_text() == "the person's file outside the folder\n"
    # The person's link: replacing it is asked (allowed here), and as the person's
    # link was not in the copy sent, it is theirs: it stays, the agent's file beside it.
    assert (local / "persons-link").is_symlink()
    assert (local / "persons-link.agent-1").read_text().startswith("the agent wrote")
    assert ("both.txt", "both.txt.agent-1") in out.conflicts
    waiting = {r.root for r in engine.journal.waiting().values()}
    for root in (".git", "sub/.GIT", "meta", "mirror.git", "planted", "planted-dir"):
        assert root in waiting, (root, waiting)
        assert not lexists(local / root) or root == "meta", root
    assert not any((local / "meta").iterdir())  # the person's empty folder, untouched
    assert again.empty
