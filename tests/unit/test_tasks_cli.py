"""`piwork tasks list | show | rm | export` against a private PIWORK_HOME."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from piwork.cli.main import main
from piwork.tasks.model import StopReason, TaskStatus
from piwork.tasks.store import Task, TaskStore


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TaskStore]:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with TaskStore() as s:
        yield s


@pytest.fixture
def tasks(store: TaskStore) -> tuple[Task, Task]:
    done = store.create("finished one")
    store.transition(done.id, TaskStatus.STOPPED, reason=StopReason.COMPLETED)
    live = store.create("orphan")
    lease = store.claim(live.id)
    store.transition(live.id, TaskStatus.RUNNING)
    store.append_event(live.id, "pi", {"type": "agent_start"})
    lease.release()  # its owner "dies"
    return done, live


def test_list_hides_stopped_tasks_and_shows_orphans_as_interrupted(
    tasks: tuple[Task, Task], capsys: pytest.CaptureFixture[str]
) -> None:
    done, live = tasks
    assert main(["tasks", "list"]) == 0
    out = capsys.readouterr()
    assert live.id in out.out and "interrupted (was running)" in out.out
    assert done.id not in out.out and "1 stopped task(s) not shown" in out.out
    assert f"task {live.id} was interrupted" in out.err

    assert main(["tasks", "list", "--all", "--json"]) == 0
    listed = orjson.loads(capsys.readouterr().out)
    assert {t["id"]: t["status"] for t in listed} == {done.id: "stopped", live.id: "interrupted"}


def test_show_with_transcript(tasks: tuple[Task, Task], capsys: pytest.CaptureFixture[str]) -> None:
    _, live = tasks
    assert main(["tasks", "show", live.id[:6], "--json", "--transcript"]) == 0
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["task"]["id"] == live.id
    assert [r["kind"] for r in shown["transcript"]] == ["task_created", "status", "pi", "status"]
    assert main(["tasks", "show", live.id, "--transcript"]) == 0
    out = capsys.readouterr().out
    assert "interrupted" in out and "agent_start" in out


def test_show_unknown_id_is_an_error(store: TaskStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tasks", "show", "ffff"]) == 1
    assert "no task with id 'ffff'" in capsys.readouterr().err


def test_rm_refuses_an_owned_task_unless_forced(
    store: TaskStore, capsys: pytest.CaptureFixture[str]
) -> None:
    task = store.create("busy")
    store.claim(task.id)
    store.transition(task.id, TaskStatus.RUNNING)
    # A second store stands in for the CLI in another process.
    assert main(["tasks", "rm", task.id]) == 1
    assert "in use by process" in capsys.readouterr().err
    assert main(["tasks", "rm", task.id, "--force"]) == 0
    assert not task.dir.exists()


def test_export_writes_a_tarball(
    tasks: tuple[Task, Task], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done, _ = tasks
    out = tmp_path / "out.tar.gz"
    assert main(["tasks", "export", done.id, "-o", str(out)]) == 0
    with tarfile.open(out) as tar:
        names = sorted(tar.getnames())
        assert names == [f"{done.id}/{n}" for n in ("export.json", "task.json", "transcript.jsonl")]
        member = tar.extractfile(f"{done.id}/task.json")
        assert member is not None
        assert orjson.loads(member.read())["status"] == "stopped"
    assert main(["tasks", "export", done.id, "--files"]) == 0
    with tarfile.open(tmp_path / f"piwork-task-{done.id}.tar.gz") as tar:
        assert f"{done.id}/state" in tar.getnames()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_export_files_never_reads_through_a_link_the_guest_planted(
    store: TaskStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guest can swap a file for a link after any listing: the export must not follow it."""
    import os

    task = store.create("exported")
    victim = tmp_path / "host-secret.txt"
    victim.write_text("HOST SECRET")
    (task.state_dir / "notes.txt").write_text("guest notes")
    (task.state_dir / "agent").mkdir()
    (task.state_dir / "agent" / "models.json").symlink_to(victim)
    (task.outputs_dir / "escape").symlink_to(tmp_path)
    # Simulate the swap racing the listing: every lstat inside the task answers
    # as if the link were still the regular file it replaced.
    real_lstat = os.lstat

    def racing_lstat(path: object, *a: object, **kw: object) -> os.stat_result:
        if str(path).startswith(str(task.dir)) and not a and not kw:
            return os.stat(path)  # type: ignore[arg-type]
        return real_lstat(path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", racing_lstat)
    out = tmp_path / "files.tar.gz"
    assert main(["tasks", "export", task.id, "--files", "-o", str(out)]) == 0
    monkeypatch.setattr(os, "lstat", real_lstat)
    with tarfile.open(out) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.isfile() else None
            assert f is None or b"HOST SECRET" not in f.read(), member.name
        link = tar.getmember(f"{task.id}/state/agent/models.json")
        assert link.issym() and link.linkname == str(victim)
        notes = tar.extractfile(f"{task.id}/state/notes.txt")
        assert notes is not None and notes.read() == b"guest notes"
        assert tar.getmember(f"{task.id}/outputs/escape").issym()
