"""The questions for the person under the selected task's conversation: the permission
sheet (one at a time, the rest counted), the preview question and the agent's own
question. Rebuilt only when what is asked changes, so a sheet keeps its focus while the
agent streams.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QMessageBox, QVBoxLayout, QWidget

from piwork.gui.controller import PendingPermission, PendingPreview, TaskController
from piwork.gui.model import TasksModel
from piwork.gui.qtlink import listen
from piwork.gui.text import (
    always_rules,
    plain_request,
    registry_rules_offered,
    replaced_files,
    rule_text,
    sanitize,
)
from piwork.gui.widgets import PermissionSheet, PreviewSheet, QuestionBar
from piwork.gui.words import person_paths
from piwork.policy import Choice, needs_confirmation
from piwork.preview import PreviewChoice


def clear(layout: QVBoxLayout) -> None:
    while layout.count():
        item = layout.takeAt(0)
        w = item.widget() if item is not None else None
        if w is not None:
            w.hide()
            w.deleteLater()


class SheetArea(QWidget):
    answered = Signal()  # the person answered something (the window moves focus back)

    def __init__(self, model: TasksModel) -> None:
        super().__init__()
        self.model = model
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.sheet_host = QVBoxLayout()
        self.question_host = QVBoxLayout()
        lay.addLayout(self.sheet_host)
        lay.addLayout(self.question_host)
        self.sheet: PermissionSheet | None = None
        self.preview_sheet: PreviewSheet | None = None
        self.question_bar: QuestionBar | None = None
        self.everywhere_box: QMessageBox | None = None
        self._shown: tuple[object, ...] | None = None
        listen(self, model.selected_changed, lambda _t: self.redraw())
        listen(self, model.asked, lambda _t, _w: self.redraw())
        listen(self, model.changed, self._changed)

    def _changed(self, task: TaskController) -> None:
        if task is self.model.selected:
            self.redraw()

    @staticmethod
    def _asked(task: TaskController | None) -> tuple[object, ...]:
        if task is None:
            return ()
        perms = [p for p in task.permissions if not p.future.done()]
        previews = [p for p in task.preview_questions if not p.future.done()]
        q = task.question if task.question is not None and not task.question.future.done() else None
        return (id(task), *(id(p) for p in perms), "|", *(id(p) for p in previews), "|", id(q))

    def redraw(self, *, force: bool = False) -> None:
        """Show the selected task's first pending permission (the rest queue) and question."""
        task = self.model.selected
        key = self._asked(task)
        if key == self._shown and not force:
            return
        self._shown = key
        clear(self.sheet_host)
        clear(self.question_host)
        self.sheet = self.preview_sheet = self.question_bar = None
        if task is None:
            return
        pending = [p for p in task.permissions if not p.future.done()]
        if pending:
            self._permission(task, pending[0], len(pending) - 1)
        previews = [p for p in task.preview_questions if not p.future.done()]
        if previews and self.sheet is None:
            pv = previews[0]
            psheet = PreviewSheet(pv.question, queued=len(previews) - 1)
            psheet.answered.connect(lambda c, p=pv, t=task: self._answer_preview(t, p, c))
            self.sheet_host.addWidget(psheet)
            self.preview_sheet = psheet
            psheet.buttons[PreviewChoice.NEVER].setFocus()
        q = task.question
        if q is not None and not q.future.done():
            bar = QuestionBar(q.method, q.title, q.message, q.options)
            bar.answered.connect(lambda a, t=task: self._answer_question(t, a))
            self.question_host.addWidget(bar)
            self.question_bar = bar

    def _permission(self, task: TaskController, p: PendingPermission, queued: int) -> None:
        req = p.request
        replaced = replaced_files(req, task.folder)
        warning = (
            f"⚠ This replaces {', '.join(replaced[:5])}"
            + (f" and {len(replaced) - 5} more" if len(replaced) > 5 else "")
            + ", already in your folder."
            if replaced
            else ""
        )
        sheet = PermissionSheet(
            person_paths(plain_request(req)) + (f"\n{warning}" if warning else ""),
            person_paths(sanitize(req.question, limit=600)),
            str(task.folder) if task.folder else None,
            always_rules(req, Choice.ALWAYS_FOLDER),
            always_rules(req, Choice.ALWAYS_EVERYWHERE),
            queued=queued,
            registry_rules=registry_rules_offered(req),
        )
        sheet.answered.connect(lambda c, p=p, t=task: self._answer(t, p, c))
        self.sheet_host.addWidget(sheet)
        self.sheet = sheet
        sheet.buttons[Choice.DENY].setFocus()

    def _done(self) -> None:
        QTimer.singleShot(0, self.redraw)
        self.answered.emit()

    def _answer(self, task: TaskController, p: PendingPermission, c: Choice) -> None:
        rules = always_rules(p.request, c)
        if c is Choice.ALWAYS_EVERYWHERE and needs_confirmation(rules):
            self._confirm_everywhere(task, p, rules)
            return
        task.answer_permission(p, c)
        self._done()

    def _confirm_everywhere(self, task: TaskController, p: PendingPermission, rules: Any) -> None:
        """A global rule for network, delete, move or outside-scope is confirmed a second
        time (as the CLI asks for "yes"); "Back" (the default) returns to the sheet."""
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Warning)
        box.setWindowTitle("Allow in every folder?")
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.setText("This stores a rule for EVERY task, in every folder:")
        box.setInformativeText(rule_text(rules))
        store = box.addButton("Store the rule", QMessageBox.ButtonRole.DestructiveRole)
        back = box.addButton("Back", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(back)
        self.everywhere_box = box

        def answered(_r: int) -> None:
            if box.clickedButton() is store and not p.future.done():
                task.answer_permission(p, Choice.ALWAYS_EVERYWHERE)
                self._done()

        box.finished.connect(answered)
        box.open()

    def _answer_preview(
        self, task: TaskController, p: PendingPreview, c: PreviewChoice | None
    ) -> None:
        task.answer_preview(p, c)
        self._done()

    def _answer_question(self, task: TaskController, answer: object) -> None:
        task.answer_question(answer)  # type: ignore[arg-type]
        self._done()
