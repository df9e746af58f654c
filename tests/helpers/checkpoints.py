"""A task driven turn by turn like the runner, for the checkpoint tests.

The agent writes its own copy of the folder (``run.view``, as its tools write
/mnt/work over the overlay in the VM); the run's recorder
(:class:`piwork.run.records.FolderCheckpoints`) takes the change set before each
model call and at the end, applies it (everything allowed, as with ``--yes``) and
records a checkpoint with the previous version of every path it touched.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from piwork.changes.engine import Answer
from piwork.checkpoints import task_changes
from piwork.run.records import FolderCheckpoints
from piwork.tasks.store import Task
from tests.helpers.changes import Judge, MirrorLayer


class _Agent:
    def __init__(self, layer: MirrorLayer) -> None:
        self.layer = layer

    def folder_source(self) -> MirrorLayer:
        return self.layer


class Run:
    """A task with a working folder, the agent's copy of it, and the run's recorder."""

    def __init__(self, task: Task, folder: Path, view: Path | None = None) -> None:
        self.task = task
        self.folder = folder
        self.view_dir = view if view is not None else folder.with_name(folder.name + ".agent")
        self.events: list[dict[str, Any]] = []
        self.notices: list[str] = []
        self.judge = Judge(answer=Answer.ALLOW)
        self.rec = FolderCheckpoints(self._emit, lambda k, d: None, lambda: self.judge,
                                     turn_start_wait=0.01)  # fmt: skip
        self.agent: _Agent | None = None

    def _emit(self, kind: Any, **data: Any) -> None:
        if kind.value == "changes":
            self.events.append(data)
        elif kind.value in ("notice", "error"):
            self.notices.append(str(data.get("message")))

    @property
    def view(self) -> Path:
        assert self.agent is not None, "start() first: the agent's copy is made then"
        return self.agent.layer.view

    def start(self) -> None:
        self.agent = _Agent(MirrorLayer(self.view_dir, self.folder))
        self.rec.begin(self.task)

    def turn(self) -> None:
        async def go() -> None:
            self.rec.turn_started()
            await self.rec.before_model_call(self.agent)  # type: ignore[arg-type]

        asyncio.run(go())

    def end(self) -> None:
        asyncio.run(self.rec.end(self.agent, {}))  # type: ignore[arg-type]
        assert self.rec.engine is not None
        self.rec.engine.close()

    @property
    def id(self) -> str:
        return self.task.id


def changes(task_id: str, turn: int | None = None) -> dict[str, str]:
    return {c.path: c.status for c in task_changes(task_id, turn=turn)}
