"""The "Turns" tab of the context panel: each turn's changes with its diff, **Undo this
turn** and **Undo the undo**.

Checkpoints go through the same API as ``piwork changes`` and ``piwork undo``
(:mod:`piwork.checkpoints`). Those functions block (git runs as a subprocess), so
the pane never calls them on the window's thread: it runs them with
``asyncio.to_thread`` on the app's qasync loop and fills the widgets when the
result comes back. A generation counter drops results that arrive after the person
switched to another task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QMessageBox,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from piwork.checkpoints import (
    CheckpointError,
    FileChange,
    TaskRunning,
    UndoConflict,
    UndoResult,
    list_checkpoints,
    task_changes,
    undo,
)
from piwork.config import Paths
from piwork.gui.text import sanitize
from piwork.gui.widgets import plain_label
from piwork.tasks.store import TaskStoreError

MAX_TURNS = 50  # newest turns listed (older ones: `piwork changes TASK --turn N`)
MAX_DIFF_LINES = 1500  # lines of diff shown at once; the rest is summarised
MARK = {"added": "A", "modified": "M", "deleted": "D", "type_changed": "T"}
RUNNING_TIP = "The agent is working on this task: stop it (or wait until it is done), then undo."


@dataclass(frozen=True)
class TurnChanges:
    turn: int
    files: tuple[FileChange, ...]

    def counts(self) -> str:
        n: dict[str, int] = {}
        for f in self.files:
            n[f.status] = n.get(f.status, 0) + 1
        order = ("added", "modified", "deleted", "type_changed")
        return ", ".join(f"{n[k]} {k.replace('_', ' ')}" for k in order if n.get(k))


@dataclass(frozen=True)
class TaskTurns:
    turns: list[TurnChanges]
    # (turn, checkpoint) when the task's last act was undoing that turn: "Undo the
    # undo" goes back to that pre-undo checkpoint. Read from the checkpoints'
    # labels, so it survives a restart of the app.
    undone: tuple[int, str] | None
    # What the task changed in the folder all told (first checkpoint to now): what
    # "Files changed" lists once the VM is off; None while it runs (reading it would
    # checkpoint the whole folder again).
    net: tuple[FileChange, ...] | None = None


def load_turns(task_id: str, paths: Paths, *, include_open: bool = True) -> TaskTurns:
    """Each turn's changes, newest turns only (blocking: git; call it off the Qt thread).

    A turn with no checkpoint after it yet is the one running now (or the one a
    crash cut short): it is listed only with ``include_open``, since reading it
    means checkpointing the whole folder again.
    """
    checkpoints = list_checkpoints(task_id, paths=paths)
    turns = sorted({c.turn for c in checkpoints if c.turn is not None})[-MAX_TURNS:]
    out = []
    for t in turns:
        first = next(i for i, c in enumerate(checkpoints) if c.turn == t)
        closed = any(c.turn != t for c in checkpoints[first + 1 :])
        if not closed and not include_open:
            continue
        files = task_changes(task_id, turn=t, paths=paths)
        if files:
            out.append(TurnChanges(t, tuple(files)))
    undone = None
    if len(checkpoints) >= 2:
        last, before = checkpoints[-1], checkpoints[-2]
        words = last.label.split()
        if before.label == "before undo" and words[:2] == ["undo", "turn"] and len(words) == 3:
            with contextlib.suppress(ValueError):
                undone = (int(words[2]), before.id)
    net = tuple(task_changes(task_id, paths=paths)) if include_open and checkpoints else None
    return TaskTurns(out, undone, net)


def bounded_diff(text: str, limit: int = MAX_DIFF_LINES) -> tuple[str, int]:
    """(what to show, total lines): at most ``limit`` lines, guest text made safe to show."""
    lines = text.splitlines()
    shown = "\n".join(sanitize(ln, limit=2000) for ln in lines[:limit])
    return shown, len(lines)


def diff_text(changes: list[FileChange], task_id: str, turn: int) -> str:
    """The unified diff of ``changes`` as the panel shows it, bounded to MAX_DIFF_LINES."""
    parts: list[str] = []
    for ch in changes:
        path = sanitize(ch.path, limit=300, keep_newlines=False)
        if ch.binary:
            parts.append(f"# {path}: binary file {ch.status}")
        elif ch.diff is None:
            parts.append(
                f"# {path}: diff too large to show here; "
                f"`piwork changes {task_id} --turn {turn}` prints it"
            )
        elif not ch.diff.strip():
            parts.append(f"# {path}: {ch.status} (no text change)")
        else:
            parts.append(ch.diff.rstrip("\n"))
    shown, total = bounded_diff("\n".join(parts))
    if total > MAX_DIFF_LINES:
        note = (
            f"# diff too large, {total:,} lines: showing the first {MAX_DIFF_LINES:,} "
            f"(`piwork changes {task_id} --turn {turn}` prints all of it)"
        )
        shown = note + "\n" + shown + "\n" + note
    return shown


class TurnsPane(QWidget):
    """The "Turns" tab: each turn's changes from the checkpoints, Undo this turn, Undo
    the undo. The diff of the selected turn or file is shown by the panel below
    (``diff_shown``); every file a load or an undo touched is reported
    (``file_changed``) for "Files changed"."""

    diff_shown = Signal(str, str)  # title, diff text
    file_changed = Signal(str, str, str)  # path, status, task id
    net_changes = Signal(str, object)  # task id, [(path, status)]: all the task changed

    def __init__(self, paths: Paths) -> None:
        super().__init__()
        self.paths = paths
        tl = QVBoxLayout(self)
        tl.setContentsMargins(0, 4, 0, 0)
        self.turns = QTreeWidget()
        self.turns.setObjectName("turnChanges")
        self.turns.setHeaderHidden(True)
        self.turns.setRootIsDecorated(True)
        self.turns.currentItemChanged.connect(self._turn_item)
        tl.addWidget(self.turns, 1)
        self.checkpoints = plain_label()
        self.checkpoints.setWordWrap(True)
        self.checkpoints.setObjectName("checkpoints")
        tl.addWidget(self.checkpoints)
        row = QHBoxLayout()
        self.undo_btn = QPushButton("Undo this turn")
        self.redo_btn = QPushButton("Undo the undo")
        self.undo_btn.clicked.connect(lambda: self.undo_turn())
        self.redo_btn.clicked.connect(lambda: self.undo_undo())
        row.addWidget(self.undo_btn)
        row.addWidget(self.redo_btn)
        tl.addLayout(row)
        self.task_id: str | None = None
        self.root: Path | None = None
        # Checkpoints of the shown task: its turns, and (turn, pre-undo checkpoint)
        # when its last act was undoing that turn ("Undo the undo" goes back there).
        self.turn_changes: list[TurnChanges] = []
        self.undone: tuple[int, str] | None = None  # from the shown task's checkpoints
        self._running = False
        self._warm = False
        # Set by the window: powers a warm task's VM off (undo needs the folder quiet;
        # a VM that is on could write during the undo).
        self.release_vm: Callable[[str], Awaitable[None]] | None = None
        self._gen = 0  # bumped when another task is shown: late results are dropped
        self._again = False
        self._note: str | None = None  # the last outcome to show (an error, a refusal)
        self._job: asyncio.Future[None] | None = None
        self.conflict_box: QMessageBox | None = None
        self._newest: int | None = None  # the newest turn listed (a newer one is shown)
        self._show_checkpoint_state()

    def show_task(
        self, task_id: str | None, root: Path | None, *, running: bool, warm: bool
    ) -> None:
        """Show ``task_id``'s turns (the folder ``root``); ``running``: undo is refused;
        ``warm``: done, its VM only kept on (undo powers it off first)."""
        self.task_id, self.root = task_id, root
        self._running, self._warm = running, warm
        self._gen += 1
        self._again = False
        self._note = None
        self.turn_changes, self.undone = [], None
        self._newest = None
        self.turns.clear()
        if self._job is not None:
            # A late result is dropped (the generation changed); an undo still finishes
            # and is recorded (see _undo_done), the new task's turns load after it.
            self._again = True
        self.refresh_checkpoints()

    def set_running(self, running: bool, *, warm: bool = False) -> None:
        """Whether the agent works on the shown task (undo is refused then), or the task
        is done with its VM kept warm (undo powers the VM off first)."""
        self._warm = warm
        if running != self._running:
            was, self._running = self._running, running
            if was and not running:
                self.refresh_checkpoints()  # the VM is off: its last turn is recorded
            self._show_checkpoint_state()

    @property
    def loading(self) -> bool:
        return self._job is not None and not self._job.done()

    def _run_off_thread(
        self,
        work: Callable[[], object],
        done: Callable[[object], None],
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``work()`` in a worker thread (never on the window's thread), then ``done(result)``
        back on the Qt thread (an exception is passed as the result). One job at a time:
        the buttons are disabled while one runs, and a refresh asked for meanwhile runs
        after it."""

        async def job() -> None:
            try:
                if before is not None:
                    await before()
                result: object = await asyncio.to_thread(work)
            except Exception as exc:  # shown in the panel: what blocks it and what to do
                result = exc
            try:
                done(result)
            finally:
                self._job = None
                if self._again:
                    self._again = False
                    self.refresh_checkpoints()
                else:
                    self._show_checkpoint_state()

        self._job = asyncio.ensure_future(job())
        self._show_checkpoint_state()

    def refresh_checkpoints(self) -> None:
        """Reload the shown task's turns (in a worker thread); keep the selection."""
        if self.task_id is None or self.root is None:
            self._show_checkpoint_state()
            return
        if self.loading:
            self._again = True
            return
        task_id, paths, running = self.task_id, self.paths, self._running
        gen = self._gen

        def loaded(result: object) -> None:
            if gen == self._gen:  # still the task it was loaded for
                self._turns_loaded(result)

        self._run_off_thread(lambda: load_turns(task_id, paths, include_open=not running), loaded)

    def _turns_loaded(self, result: object) -> None:
        if isinstance(result, BaseException):
            self.turn_changes = []
            self.undone = None
            self.turns.clear()
            self._show_checkpoint_state(f"Checkpoints: {self._error_text(result)}")
            return
        assert isinstance(result, TaskTurns)
        self._note = None
        # "Files changed" is filled from the checkpoints too, so it is not empty after
        # a restart (the live watcher only sees changes while the app runs).
        if result.net is not None:
            # The folder as the checkpoints say it is now: an undone change is gone.
            self.net_changes.emit(self.task_id or "", [(f.path, f.status) for f in result.net])
        else:
            for tc in result.turns:
                for f in tc.files:
                    self.file_changed.emit(f.path, f.status, self.task_id or "")
        keep = self._selected()
        self.turn_changes, self.undone = result.turns, result.undone
        turns = result.turns
        newest = turns[-1].turn if turns else None
        if newest is not None and self._newest is not None and newest > self._newest:
            # A new turn (a follow-up) changed files: show it, not the old turn the
            # person had open (issue 33 item 10); the same file if the new turn has it.
            path = keep[1] if keep is not None else None
            has = path is not None and any(f.path == path for f in turns[-1].files)
            keep = (newest, path if has else None)
        self._newest = newest
        self.turns.clear()
        select: QTreeWidgetItem | None = None
        for tc in reversed(turns):  # newest turn first
            top = QTreeWidgetItem([f"Turn {tc.turn} · {tc.counts()}"])
            top.setData(0, Qt.ItemDataRole.UserRole, (tc.turn, None))
            top.setToolTip(0, f"what the agent changed in turn {tc.turn}")
            for f in tc.files:
                path = sanitize(f.path, limit=300, keep_newlines=False)
                child = QTreeWidgetItem([f"{MARK.get(f.status, '?')}  {path}"])
                child.setData(0, Qt.ItemDataRole.UserRole, (tc.turn, f.path))
                child.setToolTip(0, f.status.replace("_", " ") + (" (binary)" if f.binary else ""))
                top.addChild(child)
                if keep == (tc.turn, f.path):
                    select = child
            self.turns.addTopLevelItem(top)
            top.setExpanded(True)
            if keep == (tc.turn, None) or (select is None and keep is None and tc is turns[-1]):
                select = top
        if select is None and self.turns.topLevelItemCount():
            select = self.turns.topLevelItem(0)
        if select is not None:
            self.turns.setCurrentItem(select)
        self._show_checkpoint_state()

    def _selected(self) -> tuple[int, str | None] | None:
        item = self.turns.currentItem()
        data = item.data(0, Qt.ItemDataRole.UserRole) if item is not None else None
        return (int(data[0]), data[1]) if isinstance(data, (tuple, list)) else None

    def selected_turn(self) -> int | None:
        sel = self._selected()
        return sel[0] if sel is not None else None

    def _turn_item(self, item: QTreeWidgetItem | None, _prev: QTreeWidgetItem | None) -> None:
        self._show_checkpoint_state()
        sel = self._selected()
        if sel is None or self.task_id is None:
            return
        turn, path = sel
        tc = next((t for t in self.turn_changes if t.turn == turn), None)
        if tc is None:
            return
        files = [f for f in tc.files if path is None or f.path == path]
        what = sanitize(path, limit=120, keep_newlines=False) if path else "all files"
        self.diff_shown.emit(f"Diff — turn {turn}, {what}", diff_text(files, self.task_id, turn))

    def _show_checkpoint_state(self, message: str | None = None) -> None:
        """Buttons and the status line from what is known (no I/O)."""
        turn = self.selected_turn()
        undone = self.undone
        idle = not self.loading and self.task_id is not None
        self.undo_btn.setEnabled(idle and not self._running and turn is not None)
        self.redo_btn.setEnabled(idle and not self._running and undone is not None)
        for b in (self.undo_btn, self.redo_btn):
            b.setToolTip(RUNNING_TIP if self._running else "")
        if not self._running:
            self.undo_btn.setToolTip(
                f"Put back the files turn {turn} changed, as they were before it"
                if turn is not None
                else "Pick a turn above"
            )
            if undone is not None:
                self.redo_btn.setToolTip(f"Bring back what undoing turn {undone[0]} took away")
        if message is not None:
            self._note = message  # kept until the next load or action
        message = self._note
        if message is None:
            if self.task_id is None:
                message = "No task"
            elif self.root is None:
                message = "This task has no working folder, so no checkpoints"
            elif self.loading:
                message = "Reading checkpoints…"
            elif not self.turn_changes:
                message = "No changes recorded yet (each turn is checkpointed as it ends)"
            elif undone is not None:
                message = f"Turn {undone[0]} undone. “Undo the undo” brings it back."
            else:
                n = len(self.turn_changes)
                message = f"{n} turn{'s' if n != 1 else ''} changed files"
            if self._running and self.task_id is not None:
                message += " · undo waits until the task's VM is off"
        self.checkpoints.setText(message)

    @staticmethod
    def _error_text(exc: BaseException) -> str:
        if isinstance(exc, (CheckpointError, TaskStoreError, OSError)):
            return sanitize(exc, limit=600)
        return f"{type(exc).__name__}: {sanitize(exc, limit=400)}"

    # ------------------------------------------------------------ undo
    def undo_turn(self, turn: int | None = None, *, force: bool = False) -> None:
        """Undo a turn's changes (default: the selected turn), like ``piwork undo --turn N``."""
        turn = self.selected_turn() if turn is None else turn
        if self.task_id is None or turn is None or self._running or self.loading:
            return
        task_id, paths = self.task_id, self.paths

        def work() -> UndoResult:
            return undo(task_id, turn=turn, force=force, paths=paths)

        self._run_off_thread(
            work,
            lambda r: self._undo_done(r, task_id, turn, f"undo turn {turn}"),
            self._release_first(task_id),
        )
        self.checkpoints.setText(
            f"Powering the task's VM off, then undoing turn {turn}…"
            if self._warm
            else f"Undoing turn {turn}…"
        )

    def _release_first(self, task_id: str) -> Callable[[], Awaitable[None]] | None:
        """A done task's warm VM is powered off before an undo: the guest must not write
        into the folder while it is being put back (``piwork undo`` refuses a live task
        for the same reason). A follow-up boots a new VM."""
        release = self.release_vm
        if not self._warm or release is None:
            return None
        return lambda: release(task_id)

    def undo_undo(self, *, force: bool = False) -> None:
        """Go back to the checkpoint taken just before the undo (``piwork undo --to``)."""
        entry = self.undone
        if self.task_id is None or entry is None or self._running or self.loading:
            return
        task_id, paths, (turn, before) = self.task_id, self.paths, entry

        def work() -> UndoResult:
            return undo(task_id, to=before, force=force, paths=paths)

        self._run_off_thread(
            work,
            lambda r: self._undo_done(r, task_id, None, f"bring back turn {turn}"),
            self._release_first(task_id),
        )
        self.checkpoints.setText(f"Bringing back turn {turn}…")

    def _undo_done(self, result: object, task_id: str, turn: int | None, what: str) -> None:
        if task_id != self.task_id:
            return  # done all the same: that task's checkpoints say so when it is shown
        if isinstance(result, UndoConflict):
            self._ask_force(result, turn, what)
            self._show_checkpoint_state(f"Not done: {what} would overwrite files changed since")
            return
        if isinstance(result, TaskRunning):
            self._show_checkpoint_state(f"Not done: {self._error_text(result)}")
            return
        if isinstance(result, BaseException):
            self._show_checkpoint_state(f"Not done: {self._error_text(result)}")
            return
        assert isinstance(result, UndoResult)
        self.undone = (turn, result.checkpoint_before) if turn is not None else None
        for p in result.restored:
            self.file_changed.emit(p, "modified", task_id)
        for p in result.removed:
            self.file_changed.emit(p, "deleted", task_id)
        self.refresh_checkpoints()

    def _ask_force(self, exc: UndoConflict, turn: int | None, what: str) -> None:
        """Show the conflicting files and ask before overwriting them (``--force``)."""
        lines = "\n".join(
            f"• {sanitize(p, limit=200, keep_newlines=False)}: "
            f"{sanitize(exc.reasons.get(p, 'changed'), limit=120, keep_newlines=False)}"
            for p in exc.conflicts[:20]
        )
        more = f"\n… and {len(exc.conflicts) - 20} more" if len(exc.conflicts) > 20 else ""
        box = QMessageBox(self)
        box.setTextFormat(Qt.TextFormat.PlainText)  # guest paths and links: never rich text
        box.setIcon(QMessageBox.Icon.Warning)
        box.setWindowTitle("Overwrite changed files?")
        box.setText(f"To {what}, piwork would overwrite files changed after the agent's changes:")
        box.setInformativeText(
            lines + more + "\n\nThe folder as it is now is checkpointed first, so this "
            "can be undone too."
        )
        overwrite = box.addButton("Overwrite them", QMessageBox.ButtonRole.DestructiveRole)
        keep = box.addButton("Cancel", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(keep)  # Enter never overwrites
        self.conflict_box = box
        task_id = self.task_id

        def answered(_r: int) -> None:
            self.conflict_box = None
            if box.clickedButton() is not overwrite or task_id != self.task_id:
                self._show_checkpoint_state()
                return
            if turn is not None:
                self.undo_turn(turn, force=True)
            else:
                self.undo_undo(force=True)

        box.finished.connect(answered)
        box.open()
