"""The bottom of the window: the new task's model, host and folder, the selected task's
Pause / End buttons, and the composer with Send (Stop while the task works).

The composer's hint and the buttons come from the selected task's ``TaskState``, so
the hint says exactly what Enter will do. What the person typed and did not send is
kept per task (``AppState`` drafts), durable a moment after each keystroke.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from piwork.config import Paths
from piwork.gui.appstate import NEW, AppState
from piwork.gui.controller import TaskController
from piwork.gui.hosts import host_names
from piwork.gui.model import TasksModel
from piwork.gui.prefs import model_choices
from piwork.gui.qtlink import listen
from piwork.gui.state import Phase, hint_for
from piwork.gui.text import sanitize
from piwork.gui.widgets import Composer, plain_label

CLEAN_ENV_TIP = (
    "Start the new task from the clean workbench, not from what the folder's last task "
    "installed (piwork run --clean-env)"
)


class ComposePanel(QWidget):
    """Says what the person did through signals: ``send(text)`` (Enter or Send),
    ``queue(text)`` (Alt+Enter), ``stop()`` (Send while it reads Stop), ``pause()``
    (Pause / Continue) and ``end()`` (End task)."""

    send = Signal(str)
    queue = Signal(str)
    stop = Signal()
    pause = Signal()
    end = Signal()

    def __init__(self, model: TasksModel, state: AppState) -> None:
        super().__init__()
        self.model = model
        self.paths: Paths = model.paths
        self.state = state
        self.new_folder: Path | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        bar = QHBoxLayout()
        self.model_pick = QComboBox()
        self.model_pick.setToolTip("Model for a new task")
        # Sized for ~24 characters, not the longest model name (which made the window
        # at least ~1160 px wide); the open list shows every name whole.
        self.model_pick.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.model_pick.setMinimumContentsLength(24)
        self.fill_models()
        bar.addWidget(self.model_pick)
        self.host_pick = QComboBox()
        self.host_pick.setObjectName("hostPick")
        self.fill_hosts()
        bar.addWidget(self.host_pick)
        self.folder_btn = QPushButton("Folder…")
        self.folder_btn.setToolTip("Working folder for a new task")
        self.folder_btn.clicked.connect(self.pick_folder)
        bar.addWidget(self.folder_btn)
        self.folder_lbl = plain_label("no folder")
        self.folder_lbl.setObjectName("folderLabel")
        bar.addWidget(self.folder_lbl, 1)
        self.clean_env = QCheckBox("Start clean")
        self.clean_env.setObjectName("startClean")
        self.clean_env.setToolTip(CLEAN_ENV_TIP)
        bar.addWidget(self.clean_env)
        self.pause_btn = QPushButton("Pause")
        self.pause_btn.clicked.connect(self.pause)
        bar.addWidget(self.pause_btn)
        self.end_btn = QPushButton("End task")
        self.end_btn.setToolTip(
            "The task is done and its VM is kept on for a follow-up: power it off now "
            "(you can still continue the task later)"
        )
        self.end_btn.clicked.connect(self.end)
        bar.addWidget(self.end_btn)
        lay.addLayout(bar)
        row = QHBoxLayout()
        self.composer = Composer()
        self.composer.send.connect(self.send)
        self.composer.queue_follow_up.connect(self.queue)
        row.addWidget(self.composer, 1)
        self.send_btn = QPushButton("Send")
        self.send_btn.setMinimumWidth(80)
        self.send_btn.clicked.connect(self._send_clicked)
        row.addWidget(self.send_btn)
        lay.addLayout(row)
        self._draft_key: str | None = None
        self._draft_timer = QTimer(self)
        self._draft_timer.setSingleShot(True)
        self._draft_timer.setInterval(400)
        self._draft_timer.timeout.connect(self.save_draft)
        self.composer.textChanged.connect(self._draft_timer.start)
        self.draft_error: str | None = None
        listen(self, model.selected_changed, self._selected)
        listen(self, model.changed, lambda _t: self.redraw())

    # ------------------------------------------------------------ pickers
    def fill_models(self) -> None:
        self.model_pick.clear()
        default = self.model.prefs.default_model
        for ref, label in model_choices(self.paths):
            self.model_pick.addItem(label, ref)
        i = self.model_pick.findData(default)
        if i < 0:
            self.model_pick.addItem(default, default)
            i = self.model_pick.count() - 1
        self.model_pick.setCurrentIndex(i)

    def fill_hosts(self) -> None:
        """ "This computer" and the stored hosts (read from the hosts file: nothing connects
        until a task starts on one)."""
        names, error = host_names()
        chosen = self.host_pick.currentData()
        self.host_pick.clear()
        self.host_pick.addItem("This computer", None)
        for name in names:
            self.host_pick.addItem(name, name)
        self.host_pick.setCurrentIndex(max(0, self.host_pick.findData(chosen)) if chosen else 0)
        self.host_pick.setToolTip(
            error or "Where a new task's VM runs (add a host: piwork hosts add NAME user@box)"
        )

    def pick_folder(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Working folder for the new task")
        if d:
            self.set_folder(Path(d))
        # Back to the composer: the person types the task next, and a key pressed on
        # "Folder…" would open the dialog again (issue 33 item 4).
        self.composer.setFocus()

    def set_folder(self, folder: Path | None) -> None:
        self.new_folder = folder
        self.folder_lbl.setText(str(folder) if folder else "no folder")
        self._show_folder_env()

    def _show_folder_env(self) -> None:
        """The "Start clean" box says what the new task would otherwise start from."""
        from piwork.gui.envs import folder_env, mb
        from piwork.gui.words import task_titles

        info = None
        if self.new_folder is not None:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # plain tip
                info = folder_env(self.paths, self.new_folder)
        if info is None or not info.bytes:
            self.clean_env.setToolTip(CLEAN_ENV_TIP)
            return
        self.clean_env.setToolTip(
            f"{sanitize(str(info.folder), limit=300)}: {info.next_start(task_titles(self.paths))} "
            f"({mb(info.bytes)}). " + CLEAN_ENV_TIP
        )

    def reset_new_task(self) -> None:
        """The new-task composer: no folder, not clean, hosts re-read."""
        self.set_folder(None)
        self.clean_env.setChecked(False)
        self.fill_hosts()  # a host added with `piwork hosts add` meanwhile is offered
        self.redraw()
        self.composer.setFocus()

    def chosen_model(self) -> str:
        return str(self.model_pick.currentData() or self.model.prefs.default_model)

    def _send_clicked(self) -> None:
        task = self.model.selected
        if task is not None and task.state.can_stop:
            self.stop.emit()
            return
        text = self.composer.toPlainText().strip()
        if text:
            self.send.emit(text)

    # ------------------------------------------------------------ drafts
    def save_draft(self) -> None:
        """Durable on return (fsync + rename): typed text survives the app dying."""
        self._draft_timer.stop()
        if self._draft_key is not None:
            try:
                self.state.save_draft(self._draft_key, self.composer.toPlainText())
                self.draft_error = None
            except OSError as exc:  # a full disk must not take the window down
                self.draft_error = f"could not save the draft: {exc}"
                self.composer.setToolTip(self.draft_error)

    def _switch_draft(self, key: str | None) -> None:
        """Keep the text typed for the task being left; show the one typed for ``key``."""
        if key == self._draft_key:
            return
        self.save_draft()
        self._draft_key = key
        self.composer.blockSignals(True)
        self.composer.setPlainText(self.state.draft(key) if key is not None else "")
        self.composer.blockSignals(False)

    def _selected(self, task: TaskController | None) -> None:
        self._switch_draft(NEW if task is None else task.task_id)
        self.redraw()

    # ------------------------------------------------------------ drawing
    def redraw(self) -> None:
        task = self.model.selected
        if task is not None and self._draft_key is None and task.task_id:
            self._draft_key = task.task_id  # the new task got its id: key its draft
        state = task.state if task is not None else None
        stoppable = state is not None and state.can_stop
        self.send_btn.setText("Stop" if stoppable else "Send")
        for w in (self.model_pick, self.folder_btn, self.host_pick):
            w.setEnabled(task is None)
        self.clean_env.setVisible(task is None)  # a task's environment is chosen once
        if task is not None:  # the task's own host, model and folder, not the new task's
            self._show_choice(self.host_pick, task.host, first_is_none=True)
            self._show_choice(self.model_pick, task.model or "demo")
            self.folder_lbl.setText(str(task.folder) if task.folder else "no folder")
        else:
            self.folder_lbl.setText(str(self.new_folder) if self.new_folder else "no folder")
        # The buttons keep their place (they are disabled, not hidden) so the row does
        # not jump as a task changes state (issue 33 item 15); End shows only for a task.
        self.pause_btn.setVisible(task is not None)
        ready = task is not None and task.session is not None
        self.pause_btn.setEnabled(ready and state is not None and state.can_pause)
        paused = state is not None and state.phase is Phase.PAUSED
        self.pause_btn.setText("Continue" if paused else "Pause")
        self.end_btn.setVisible(task is not None)
        self.end_btn.setEnabled(state is not None and state.warm)
        self.composer.setPlaceholderText(hint_for(state))

    @staticmethod
    def _show_choice(pick: QComboBox, value: str | None, *, first_is_none: bool = False) -> None:
        i = pick.findData(value) if value else (0 if first_is_none else -1)
        if value and i < 0:
            pick.addItem(value, value)
            i = pick.count() - 1
        pick.setCurrentIndex(i)
