"""The app's tasks and which one is shown: the model every view of the window draws from.

Qt-free (napari's ``ViewerModel``: state and events, no widgets). The window's
parts (``rail``, ``conversation``, ``composer``, ``sheets``, ``banner``) each take
this model, listen to its events and say what the person did through Qt signals;
``MainWindow`` wires them in one place. A view never asks another view what a task's
state is: it reads ``task.state`` (``piwork.gui.state``), so no two can disagree.

Events: ``added(task, restored)`` (``restored``: it comes from the task store, its
history is to be read), ``removed(task)``, ``selected(task | None)``,
``changed(task)``, ``state_changed(task)`` (its ``TaskState`` is another),
``run_event(task, RunEvent)``, ``asked(task, what)`` (a question for the person:
"permission", "preview" or "question"), ``finished(task, outcome)`` and
``closed(task)`` (its VM is off).
"""

from __future__ import annotations

from typing import Any

from piwork.config import Paths
from piwork.gui.controller import TaskController
from piwork.gui.events import Event
from piwork.gui.prefs import Prefs
from piwork.gui.state import TaskState
from piwork.run.pool import Pool
from piwork.tasks import Task, TaskStore
from piwork.tasks.store import TaskStoreError


def when(iso: object) -> str:
    """A record's time as the rail shows it: "14:05" today, "3 Mar" before."""
    import datetime as dt

    try:
        t = dt.datetime.fromisoformat(str(iso).replace("Z", "+00:00")).astimezone()
    except ValueError:
        return ""
    now = dt.datetime.now().astimezone()
    return t.strftime("%H:%M") if t.date() == now.date() else f"{t.day} {t:%b}"


class TasksModel:
    def __init__(self, paths: Paths, prefs: Prefs, pool: Pool) -> None:
        self.paths, self.prefs, self.pool = paths, prefs, pool
        self.tasks: list[TaskController] = []  # newest first, as the rail lists them
        self.selected: TaskController | None = None
        self.interrupted: list[str] = []  # ids the last start found cut off by a crash
        self._session_factory: Any = None  # None: the real runner (tests pass a double)
        self.added = Event("added")
        self.removed = Event("removed")
        self.selected_changed = Event("selected")
        self.changed = Event("changed")
        self.run_event = Event("run_event")
        self.asked = Event("asked")
        self.finished = Event("finished")
        self.closed = Event("closed")
        self.state_changed = Event("state_changed")  # a task's TaskState is another now
        self._states: dict[int, TaskState] = {}

    # ------------------------------------------------------------ the list
    def load(self) -> None:
        """The stored tasks (not archived), newest first. Tasks whose owner died (this
        app's crash, a killed CLI) are marked "interrupted" first, not left "running"; a
        task another live process owns is left as it is (its lock says so)."""
        store = TaskStore(self.paths.tasks)
        try:
            self.interrupted = store.mark_interrupted()
            for t in store.list():
                if t.id not in self.prefs.archived:
                    self.add(self._stored(t), restored=True)
        finally:
            store.close()

    def _stored(self, t: Task) -> TaskController:
        r = t.record
        task = self.new(
            task_id=t.id,
            title=r.title,
            status=r.status.value,
            reason=r.stop.reason.value if r.stop else None,
            folder=r.working_folder,
            model=r.model,
        )
        task.tokens, task.cost = r.usage.total_tokens, r.usage.cost_usd
        task.elapsed_before = r.wall_seconds()
        task.last_activity = when(r.updated_at)
        return task

    def load_one(self, task_id: str) -> TaskController | None:
        """Bring an archived task back into the list (newest first)."""
        self.prefs.archived.discard(task_id)
        self.prefs.save(self.paths)
        store = TaskStore(self.paths.tasks)
        try:
            t = store.get(task_id)
        except TaskStoreError:  # gone meanwhile (deleted from the CLI): nothing to bring back
            return None
        finally:
            store.close()
        task = self._stored(t)
        self.add(task, restored=True)
        self.select(task)
        return task

    @property
    def session_factory(self) -> Any:
        """What runs a prompt for every task of the model: the real runner, or a test's
        double (set on the tasks already listed too)."""
        return self._session_factory

    @session_factory.setter
    def session_factory(self, factory: Any) -> None:
        self._session_factory = factory
        for task in self.tasks:
            task.session_factory = factory

    def new(self, **fields: Any) -> TaskController:
        """A task of this model (not listed until ``add``)."""
        task = TaskController(self.pool, **fields)
        if self._session_factory is not None:
            task.session_factory = self._session_factory
        return task

    def add(self, task: TaskController, *, restored: bool = False) -> None:
        task.run_event.connect(lambda ev, t=task: self.run_event.emit(t, ev))
        task.changed.connect(lambda t=task: self._changed(t))
        task.permission_asked.connect(lambda _p, t=task: self.asked.emit(t, "permission"))
        task.preview_asked.connect(lambda _q, t=task: self.asked.emit(t, "preview"))
        task.question_asked.connect(lambda _q, t=task: self.asked.emit(t, "question"))
        task.finished.connect(lambda r, t=task: self.finished.emit(t, r))
        task.closed.connect(lambda t=task: self.closed.emit(t))
        self.tasks.insert(0, task)
        self.added.emit(task, restored)

    def _changed(self, task: TaskController) -> None:
        if task not in self.tasks:
            return
        self.changed.emit(task)
        state = task.state
        if self._states.get(id(task)) != state:
            self._states[id(task)] = state
            self.state_changed.emit(task)

    def remove(self, task: TaskController) -> None:
        if task not in self.tasks:
            return
        if task is self.selected:
            self.select(None)
        self.tasks.remove(task)
        self.removed.emit(task)

    def select(self, task: TaskController | None) -> None:
        if task is not None and task not in self.tasks:
            return
        if task is self.selected:
            return
        self.selected = task
        self.selected_changed.emit(task)

    def find(self, task_id: str) -> TaskController | None:
        return next((t for t in self.tasks if t.task_id == task_id), None)

    # ------------------------------------------------------------ the store
    def rename(self, task: TaskController, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            return
        if task.task_id:
            store = TaskStore(self.paths.tasks)
            try:
                store.update(task.task_id, title=title)
            finally:
                store.close()
        task.title = title
        self.changed.emit(task)

    def archive(self, task: TaskController) -> None:
        """Out of the rail, kept on disk; ``unarchive`` brings it back."""
        if task.task_id:
            self.prefs.archived.add(task.task_id)
            self.prefs.save(self.paths)
        self.remove(task)

    def delete(self, task: TaskController) -> None:
        if task.task_id:
            store = TaskStore(self.paths.tasks)
            try:
                store.rm(task.task_id)
            finally:
                store.close()
        self.remove(task)

    # ------------------------------------------------------------ what runs
    def busy_tasks(self) -> list[TaskController]:
        """Tasks quitting would cut off: working, waiting for the person, or queued. A
        finished task whose VM is only kept warm is not one of them."""
        return [t for t in self.tasks if t.state.busy or t.state.can_stop or t.permissions]

    def working_ids(self) -> list[str]:
        """Ids of the tasks working now (what a crash would interrupt; a warm VM of a
        finished task is not working: after a crash that task is still done)."""
        return [t.task_id for t in self.tasks if t.task_id and t.state.can_stop]

    def live(self) -> list[TaskController]:
        """Tasks with a VM on (working or warm) or queued for one."""
        return [t for t in self.tasks if t.live or t.status == "queued"]
