"""A task driven turn by turn like the runner, for the checkpoint tests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from piwork.checkpoints import (
    RunRecorder,
    repo_for,
    task_changes,
)
from piwork.tasks.store import Task


class Run:
    """A task with a working folder and a recorder, driven turn by turn like the runner."""

    def __init__(self, task: Task, folder: Path) -> None:
        self.task = task
        self.folder = folder
        self.events: list[dict[str, Any]] = []
        self.rec = RunRecorder(repo_for(task), self.events.append, turn_start_wait=0.01)

    def start(self) -> None:
        asyncio.run(self.rec.start())

    def turn(self) -> None:
        async def go() -> None:
            self.rec.turn_started()
            await self.rec.before_model_call()

        asyncio.run(go())

    def end(self) -> None:
        asyncio.run(self.rec.end())

    @property
    def id(self) -> str:
        return self.task.id


def changes(task_id: str, turn: int | None = None) -> dict[str, str]:
    return {c.path: c.status for c in task_changes(task_id, turn=turn)}
