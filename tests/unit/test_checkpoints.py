"""The folder's history (piwork.checkpoints over piwork.changes): record, review, undo.

The agent writes its own copy of the folder (``run.view``, as its tools write
/mnt/work over the overlay); the run's recorder (``piwork.run.records``) takes
the change set before each model call and at the end, applies it (deletes
allowed, as with ``--yes``) and records a checkpoint with the previous version
of every path it touched. Everything but the VM is real.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from piwork.changes.engine import Answer
from piwork.checkpoints import (
    CHECKPOINTS_DIR,
    CheckpointError,
    TaskRunning,
    UndoConflict,
    list_checkpoints,
    task_changes,
    undo,
)
from piwork.cli.main import main
from piwork.config import get_paths
from piwork.tasks.store import TaskStore
from tests.helpers.changes import Judge
from tests.helpers.checkpoints import Run, changes


def tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def three_turns(run: Run) -> None:
    f = run.folder
    (f / "a.txt").write_text("alpha\n")
    (f / "b.txt").write_text("bravo\n")
    (f / "c.txt").write_text("charlie\n")
    run.start()
    v = run.view
    run.turn()  # the model call of turn 1
    (v / "a.txt").write_text("ALPHA overwritten\n")
    (v / "d.txt").write_text("new file\n")
    run.turn()  # turn 2: truncate b, delete c
    (v / "b.txt").write_text("")
    (v / "c.txt").unlink()
    run.turn()  # turn 3: modify d, add e
    (v / "d.txt").write_text("new file, edited\n")
    (v / "e.bin").write_bytes(b"\x00\x01\x02binary")
    run.end()


def test_changes_per_turn_and_events(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    assert changes(run.id, 1) == {"a.txt": "modified", "d.txt": "added"}
    assert changes(run.id, 2) == {"b.txt": "modified", "c.txt": "deleted"}
    assert changes(run.id, 3) == {"d.txt": "modified", "e.bin": "added"}
    assert changes(run.id) == {
        "a.txt": "modified",
        "b.txt": "modified",
        "c.txt": "deleted",
        "d.txt": "added",
        "e.bin": "added",
    }
    by_path = {c.path: c for c in task_changes(run.id, turn=2)}
    assert by_path["b.txt"].diff is not None and "-bravo" in by_path["b.txt"].diff
    bin_change = {c.path: c for c in task_changes(run.id, turn=3)}["e.bin"]
    assert bin_change.binary and bin_change.diff is None
    assert [e["turn"] for e in run.events] == [1, 2, 3]
    ev2 = run.events[1]
    assert (ev2["added"], ev2["modified"], ev2["deleted"]) == (0, 1, 1)
    assert {x["path"]: x["status"] for x in ev2["files"]} == {
        "b.txt": "modified",
        "c.txt": "deleted",
    }
    labels = [c.label for c in list_checkpoints(run.id)]
    assert labels == ["task start", "turn 1", "turn 2", "turn 3", "task end"]
    # The history is in the task dir, never in the folder or a guest share.
    assert (run.task.dir / CHECKPOINTS_DIR / "journal.sqlite").is_file()
    assert sorted(os.listdir(run.folder)) == ["a.txt", "b.txt", "d.txt", "e.bin"]


def test_undo_one_turn_only_and_undo_the_undo(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    f = run.folder
    after_task = tree_digest(f)
    result = undo(run.id, turn=2)
    assert result.restored == ["b.txt", "c.txt"] and result.removed == []
    assert (f / "b.txt").read_text() == "bravo\n"
    assert (f / "c.txt").read_text() == "charlie\n"
    assert (f / "a.txt").read_text() == "ALPHA overwritten\n"
    assert (f / "d.txt").read_text() == "new file, edited\n"
    undo(run.id, to=result.checkpoint_before)
    assert tree_digest(f) == after_task


def test_undo_turn_removes_what_it_added(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    result = undo(run.id, turn=3, files=["e.bin"])
    assert result.removed == ["e.bin"] and result.restored == []
    assert not (run.folder / "e.bin").exists()
    assert (run.folder / "d.txt").read_text() == "new file, edited\n"


def test_undo_whole_task(make_run: Any) -> None:
    run = make_run()
    f = run.folder
    (f / "a.txt").write_text("alpha\n")
    (f / "b.txt").write_text("bravo\n")
    before = tree_digest(f)
    run.start()
    run.turn()
    (run.view / "a.txt").write_text("x")
    (run.view / "sub").mkdir()
    (run.view / "sub" / "new.txt").write_text("n")
    run.turn()
    (run.view / "b.txt").unlink()
    run.end()
    assert tree_digest(f) != before
    undo(run.id)
    assert tree_digest(f) == before


def test_conflicts_need_force(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    f = run.folder
    (f / "b.txt").write_text("the person edited this after the task\n")
    with pytest.raises(UndoConflict) as info:
        undo(run.id, turn=2)
    assert info.value.conflicts == ["b.txt"]
    assert "--force" in str(info.value)
    assert (f / "b.txt").read_text() == "the person edited this after the task\n"
    assert not (f / "c.txt").exists()  # nothing was done
    result = undo(run.id, turn=2, force=True)
    assert (f / "b.txt").read_text() == "bravo\n"
    undo(run.id, to=result.checkpoint_before)  # the person's edit comes back
    assert (f / "b.txt").read_text() == "the person edited this after the task\n"


def test_later_turn_touching_same_file_is_a_conflict(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    with pytest.raises(UndoConflict) as info:
        undo(run.id, turn=1)
    assert info.value.conflicts == ["d.txt"]
    assert "after that turn" in str(info.value)


def test_undo_refuses_while_task_is_owned(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    store = TaskStore(get_paths().tasks)
    try:
        with store.claim(run.id), pytest.raises(TaskRunning):
            undo(run.id, turn=2)
    finally:
        store.close()
    assert (run.folder / "b.txt").read_text() == ""


def test_a_link_the_agent_makes_inside_is_a_link_one_pointing_out_waits(
    make_run: Any, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not copy me\n")
    run = make_run()
    (run.folder / "keep.txt").write_text("k\n")
    run.start()
    run.turn()
    os.symlink("keep.txt", run.view / "link-in")
    os.symlink(outside / "secret.txt", run.view / "link-out")
    run.end()
    assert changes(run.id, 1) == {"link-in": "added"}
    assert os.readlink(run.folder / "link-in") == "keep.txt"
    assert not os.path.lexists(run.folder / "link-out")
    assert any("link-out" in n for n in run.notices)
    stored = b"".join(
        p.read_bytes() for p in (run.task.dir / CHECKPOINTS_DIR).rglob("*") if p.is_file()
    )
    assert b"do not copy me" not in stored


def test_the_persons_git_metadata_never_changes(make_run: Any) -> None:
    run = make_run()
    f = run.folder
    (f / ".git").mkdir()
    (f / ".git" / "config").write_text("[core]\n")
    before = tree_digest(f / ".git")
    run.start()
    run.turn()
    (run.view / ".git" / "config").write_text('[core]\n\tfsmonitor = "touch /tmp/x"\n')
    (run.view / ".git" / "hooks").mkdir()
    (run.view / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
    (run.view / "app.py").write_text("print(1)\n")
    run.end()
    assert tree_digest(f / ".git") == before
    assert changes(run.id, 1) == {"app.py": "added"}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_changes_json_per_turn(make_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    run: Run = make_run()
    three_turns(run)
    code, out, _ = run_cli(capsys, "changes", run.id[:6], "--turn", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    assert {c["path"]: c["status"] for c in doc["changes"]} == {
        "b.txt": "modified",
        "c.txt": "deleted",
    }
    assert doc["checkpoints"][0]["label"] == "task start"
    code, out, _ = run_cli(capsys, "changes", run.id)
    assert code == 0
    assert "D c.txt" in out and "A e.bin  (binary)" in out and "+ALPHA overwritten" in out


def test_undo_conflict_force_and_undo_of_undo(
    make_run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run: Run = make_run()
    three_turns(run)
    f: Path = run.folder
    (f / "c.txt").write_text("recreated by the person\n")
    code, _, err = run_cli(capsys, "undo", run.id, "--turn", "2")
    assert code == 4 and "c.txt" in err and "--force" in err
    assert (f / "b.txt").read_text() == ""
    code, out, _ = run_cli(capsys, "undo", run.id, "--turn", "2", "--force")
    assert code == 0 and "restored b.txt" in out
    assert (f / "c.txt").read_text() == "charlie\n"
    before = out.split("--to ")[1].split("`")[0]
    code, out, _ = run_cli(capsys, "undo", run.id, "--to", before)
    assert code == 0
    assert (f / "c.txt").read_text() == "recreated by the person\n"
    assert (f / "b.txt").read_text() == ""


def test_undo_refused_while_running(make_run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    run: Run = make_run()
    three_turns(run)
    store = TaskStore(get_paths().tasks)
    try:
        with store.claim(run.id):
            code, _, err = run_cli(capsys, "undo", run.id, "--turn", "1")
    finally:
        store.close()
    assert code == 5 and "running" in err
    assert (run.folder / "d.txt").exists()


def test_show_prints_the_history_size_and_gc_keeps_what_is_named(
    make_run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run: Run = make_run()
    run.start()
    for i in range(3):
        run.turn()
        (run.view / f"blob{i}.bin").write_bytes(os.urandom(200_000))
    run.end()
    code, out, _ = run_cli(capsys, "tasks", "show", run.id)
    assert code == 0 and "checkpoints" in out and "MiB" in out
    stray = run.task.dir / CHECKPOINTS_DIR / "objects" / "ab" / ("ab" + "0" * 62)
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"named by nothing")
    code, out, _ = run_cli(capsys, "tasks", "gc")
    assert code == 0 and not stray.exists()
    undo(run.id)
    assert not list(run.folder.iterdir())


def test_file_becomes_folder_and_folder_becomes_file(make_run: Any) -> None:
    run: Run = make_run()
    f = run.folder
    (f / "x").write_text("a file\n")
    (f / "d").mkdir()
    (f / "d" / "inner.txt").write_text("inner\n")
    before = tree_digest(f)
    run.start()
    run.turn()
    v = run.view
    (v / "x").unlink()
    (v / "x").mkdir()
    (v / "x" / "y.txt").write_text("now a folder\n")
    (v / "d" / "inner.txt").unlink()
    (v / "d").rmdir()
    (v / "d").write_text("now a file\n")
    run.end()
    assert changes(run.id, 1) == {
        "x": "type_changed",
        "x/y.txt": "added",
        "d": "type_changed",
        "d/inner.txt": "deleted",
    }
    undo(run.id, turn=1)
    assert tree_digest(f) == before


def test_task_without_folder_has_no_checkpoints() -> None:
    store = TaskStore(get_paths().tasks)
    try:
        task = store.create("no folder")
    finally:
        store.close()
    assert list_checkpoints(task.id) == [] and task_changes(task.id) == []


def test_unknown_checkpoint_and_turn(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        undo(run.id, to="ffffffffffff")
    with pytest.raises(CheckpointError, match="turn 9"):
        task_changes(run.id, turn=9)


def test_undo_restores_a_link_as_a_link(make_run: Any, tmp_path: Path) -> None:
    outside = tmp_path / "outside3.txt"
    outside.write_text("outside\n")
    run: Run = make_run()
    os.symlink(outside, run.folder / "out-link")
    run.start()
    run.turn()
    (run.view / "out-link").unlink()
    run.end()
    assert changes(run.id, 1) == {"out-link": "deleted"}
    undo(run.id, turn=1)
    assert (run.folder / "out-link").is_symlink()
    assert os.readlink(run.folder / "out-link") == str(outside)
    assert outside.read_text() == "outside\n"


def _git(cwd: Path, *args: str) -> str:
    import subprocess

    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", "-c", "user.name=p", "-c", "user.email=p@x", *args],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def test_the_agents_commits_come_as_a_patch_and_its_git_metadata_never(make_run: Any) -> None:
    run: Run = make_run()
    f = run.folder
    _git(f, "init", "-q", "-b", "main")
    (f / "app.py").write_text("print(1)\n")
    _git(f, "add", "-A")
    _git(f, "commit", "-qm", "the person's commit")
    git_before = tree_digest(f / ".git")
    run.start()
    run.turn()
    (run.view / "app.py").write_text("print(2)\n")
    _git(run.view, "commit", "-qam", "the agent's first commit")
    (run.view / "new.py").write_text("x = 1\n")
    _git(run.view, "add", "new.py")
    _git(run.view, "commit", "-qm", "the agent's second commit")
    _git(run.view, "config", "core.fsmonitor", "touch PWNED")
    run.end()
    assert tree_digest(f / ".git") == git_before  # the person's repository is as it was
    assert (f / "app.py").read_text() == "print(2)\n"  # the working tree's changes apply
    patch = run.task.dir / "patches" / "folder.patch"
    assert patch.is_file(), run.notices
    text = patch.read_text()
    assert text.count("Subject: [PATCH") == 2 and "the agent's second commit" in text
    assert any("2 commit(s)" in n and "git am" in n for n in run.notices)
    # The person applies them to a clone of their repository.
    clone = f.parent / "clone"
    _git(f.parent, "clone", "-q", str(f), str(clone))
    _git(clone, "am", "-q", str(patch))
    assert "the agent's second commit" in _git(clone, "log", "--oneline")
    assert (clone / "new.py").read_text() == "x = 1\n"


def test_what_waits_is_listed_and_applied_or_kept_out_later(
    make_run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """No one to ask during the run: deletes and host-runnable files wait; `piwork apply`
    applies some (as the person's answer, checkpointed, undoable), keeps others out."""
    from piwork.changes.api import waiting_changes

    run: Run = make_run()
    run.judge = Judge(answer=Answer.NOBODY)
    f = run.folder
    (f / "old.txt").write_text("old\n")
    (f / "gone.txt").write_text("gone\n")
    run.start()
    run.turn()
    (run.view / "old.txt").unlink()
    (run.view / "gone.txt").unlink()
    (run.view / ".envrc").write_text("export X=1\n")
    (run.view / "app.py").write_text("print(1)\n")
    run.end()
    assert (f / "app.py").exists() and (f / "old.txt").exists() and not (f / ".envrc").exists()
    waiting = {w.path: w for w in waiting_changes(run.id)}
    assert set(waiting) == {"old.txt", "gone.txt", ".envrc"}
    assert waiting[".envrc"].kind == "held" and waiting["old.txt"].kind == "asked"
    assert waiting[".envrc"].diff is not None and "+export X=1" in waiting[".envrc"].diff

    code, out, _ = run_cli(capsys, "apply", run.id, "--list")
    assert code == 0 and "waiting for you" in out and "+export X=1" in out
    code, out, err = run_cli(capsys, "apply", run.id, ".envrc", "old.txt")
    assert code == 2 and "--yes" in err  # no terminal to confirm on
    code, out, err = run_cli(capsys, "apply", run.id, ".envrc", "old.txt", "--yes")
    assert code == 0, err
    assert (f / ".envrc").read_text() == "export X=1\n" and not (f / "old.txt").exists()
    code, out, err = run_cli(capsys, "apply", run.id, "--keep-out", "--yes")
    assert code == 0 and "kept out" in out
    assert (f / "gone.txt").read_text() == "gone\n"
    assert waiting_changes(run.id) == []
    assert "waiting for you" not in run_cli(capsys, "changes", run.id)[1]
    # The applied changes are checkpointed like any other: undo takes them back.
    undo(run.id)
    assert (f / "old.txt").read_text() == "old\n" and not (f / ".envrc").exists()
