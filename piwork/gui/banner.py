"""The banner after the app died: it says so, names the tasks the crash cut off (only
those: a task that had finished, its VM kept warm, is still done), and offers the first
one back."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPushButton

from piwork.gui.appstate import Crash
from piwork.gui.controller import TaskController
from piwork.gui.model import TasksModel
from piwork.gui.state import Phase
from piwork.gui.text import sanitize
from piwork.gui.widgets import plain_label


def cut_off(model: TasksModel, crash: Crash | None) -> list[TaskController]:
    """Tasks the last run's death interrupted: this start found their owner gone
    (``TaskStore.mark_interrupted``), or the dead app had them working, and their
    records say "interrupted". A task that had finished (its VM only kept warm) is
    not one of them, whatever the app had live (issue 33 item 3)."""
    return [
        t
        for t in model.tasks
        if t.task_id
        and t.state.phase is Phase.INTERRUPTED
        and (t.task_id in model.interrupted or (crash is not None and t.task_id in crash.live))
    ]


class CrashBanner(QFrame):
    resume = Signal(object)  # TaskController: "Continue it"
    dismissed = Signal()

    def __init__(self, crash: Crash | None, lost: list[TaskController]) -> None:
        super().__init__()
        self.setObjectName("crashBanner")
        lay = QHBoxLayout(self)
        if lost:
            names = ", ".join(
                f"“{sanitize(c.title, limit=50, keep_newlines=False)}”" for c in lost[:3]
            )
            more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
            what = "piwork closed unexpectedly last time" if crash else "A task was cut off"
            msg = f"{what}. Interrupted: {names}{more}. Nothing you typed was lost."
        else:
            msg = "piwork closed unexpectedly last time. Nothing you typed was lost."
        self.text = plain_label()
        self.text.setTextFormat(Qt.TextFormat.PlainText)
        self.text.setText(msg)
        self.text.setWordWrap(True)
        lay.addWidget(self.text, 1)
        self.continue_btn: QPushButton | None = None
        if lost:
            again = QPushButton("Continue it" if len(lost) == 1 else "Continue the first")
            again.clicked.connect(lambda _=False, c=lost[0]: self.resume.emit(c))
            lay.addWidget(again)
            self.continue_btn = again
        dismiss = QPushButton("Dismiss")
        dismiss.clicked.connect(self.dismissed)
        lay.addWidget(dismiss)
