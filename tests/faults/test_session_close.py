"""TaskSession.close releases everything even when the task's record is unreadable."""

from __future__ import annotations

from pathlib import Path

from piwork.config import Paths
from piwork.runner import RunRequest, TaskSession
from piwork.tasks import TaskStatus


async def test_close_cleans_up_when_task_json_cannot_be_read(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "d", tmp_path / "c", tmp_path / "s", tmp_path / "cfg")
    session = TaskSession(RunRequest(prompt="x"), paths=paths)
    task = session.store.create("about to be corrupted")
    session.adopt(task)
    session.task = session.store.transition(task.id, TaskStatus.RUNNING)
    cleaned: list[str] = []
    session.defer(cleaned.append, "gateway, proxy and demo server closed")
    task.task_json.write_bytes(b"{ torn")  # store.get now raises CorruptTask
    await session.close()
    assert cleaned == ["gateway, proxy and demo server closed"]
    assert session.store.owner(task.id) is None, "the task's lease was not released"
