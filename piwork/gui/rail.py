"""The task rail: "+ New task", every task with its state, Settings. Draws from the model.

Each row is the task's title and, on a line of its own, its state (the same words as
the header: ``TaskState.label``), a spinner while it works, a badge when it waits for
the person and the time it last did something. The row's height follows its text, so
a title that wraps never pushes the state out of sight (issue 33 item 12).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget

from piwork.gui.controller import TaskController
from piwork.gui.model import TasksModel
from piwork.gui.qtlink import listen
from piwork.gui.state import Phase
from piwork.gui.text import sanitize
from piwork.gui.widgets import plain_tip

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class TaskRail(QWidget):
    """Says what the person picked (``new_task``, ``settings``, ``rename``, ``archive``,
    ``delete``, ``end``) through signals; selecting a row selects the task in the model."""

    new_task = Signal()
    settings = Signal()
    rename = Signal(object)  # TaskController
    archive = Signal(object)
    delete = Signal(object)
    end = Signal(object)

    def __init__(self, model: TasksModel) -> None:
        super().__init__()
        self.model = model
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.new_btn = QPushButton("+ New task")
        self.new_btn.setToolTip("Ctrl+N")
        self.new_btn.clicked.connect(self.new_task)
        lay.addWidget(self.new_btn)
        self.list = QListWidget()
        self.list.setObjectName("rail")
        self.list.setIconSize(QSize(10, 10))
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setWordWrap(False)  # the title is elided to one line (row_text)
        self.list.currentRowChanged.connect(self._row_chosen)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.viewport().installEventFilter(self)
        lay.addWidget(self.list)
        self.settings_btn = QPushButton("Settings")
        self.settings_btn.clicked.connect(self.settings)
        lay.addWidget(self.settings_btn)
        self.setMinimumWidth(180)
        self.menu: QMenu | None = None
        self._spin = 0
        listen(self, model.added, lambda t, _r: self._added(t))
        listen(self, model.removed, self._removed)
        listen(self, model.changed, lambda _t: self.redraw())
        listen(self, model.selected_changed, self._selected)

        self._timer = QTimer(self)
        self._timer.setInterval(120)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def _added(self, task: TaskController) -> None:
        self.list.blockSignals(True)
        self.list.insertItem(self.model.tasks.index(task), QListWidgetItem())
        self.list.blockSignals(False)
        self.redraw()

    def _removed(self, task: TaskController) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        for _ in self.model.tasks:
            self.list.addItem(QListWidgetItem())
        self._select_row(self.model.selected)
        self.list.blockSignals(False)
        self.redraw()

    def _select_row(self, task: TaskController | None) -> None:
        row = self.model.tasks.index(task) if task in self.model.tasks else -1
        if row < 0:
            self.list.clearSelection()
        self.list.setCurrentRow(row)

    def _selected(self, task: TaskController | None) -> None:
        self.list.blockSignals(True)
        self._select_row(task)
        self.list.blockSignals(False)
        self.redraw()

    def _row_chosen(self, row: int) -> None:
        tasks = self.model.tasks
        self.model.select(tasks[row] if 0 <= row < len(tasks) else None)

    def row_text(self, task: TaskController) -> str:
        state = task.state
        working = state.busy and state.phase is not Phase.PAUSED
        spin = SPINNER[self._spin % len(SPINNER)] + " " if working else ""
        badge = f"  ⚠ {state.asks}" if state.asks and task is not self.model.selected else ""
        when = f" · {task.last_activity}" if task.last_activity else ""
        # One line for the title, elided to the rail's width: a title that wraps would
        # take the row's second line, where the state is.
        title = sanitize(task.title, limit=200, keep_newlines=False)
        room = self.list.viewport().width() - 24 - self.fontMetrics().horizontalAdvance(badge)
        width = max(60, room)
        title = self.fontMetrics().elidedText(title, Qt.TextElideMode.ElideRight, width)
        return f"{title}{badge}\n{spin}{state.label}{when}"

    def redraw(self) -> None:
        for i, task in enumerate(self.model.tasks):
            item = self.list.item(i)
            if item is None:
                continue
            item.setText(self.row_text(task))
            title = sanitize(task.title, limit=300, keep_newlines=False)
            item.setToolTip(plain_tip(title + (f"  (Ctrl+{i + 1})" if i < 9 else "")))

    def eventFilter(self, watched: QObject, e: QEvent) -> bool:
        if e.type() == QEvent.Type.Resize:
            self.redraw()  # titles are elided to the list's width
        return False

    def _tick(self) -> None:
        """Animation only: the spinner of working tasks."""
        if any(t.state.busy for t in self.model.tasks):
            self._spin += 1
            self.redraw()

    def _menu(self, pos: Any) -> None:
        task = self.model.selected
        if task is None:
            return
        menu = QMenu(self)
        if task.state.warm:
            menu.addAction("End task", lambda: self.end.emit(task))
        menu.addAction("Rename…", lambda: self.rename.emit(task))
        menu.addAction("Archive…", lambda: self.archive.emit(task))
        menu.addAction("Delete…", lambda: self.delete.emit(task))
        self.menu = menu
        menu.popup(self.list.mapToGlobal(pos))
