"""The centre of the window: the selected task's header and conversation (or the welcome
page for a new task). Each task has its own ``Conversation``; the pane makes it when the
model adds the task (reading its history when it comes from the store), shows the
selected one, and turns the runner's events into rows.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QLabel,
    QScrollArea,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from piwork.config import Paths
from piwork.gui.controller import TaskController
from piwork.gui.history import load_history
from piwork.gui.model import TasksModel
from piwork.gui.qtlink import listen
from piwork.gui.text import sanitize
from piwork.gui.welcome import WelcomePage
from piwork.gui.widgets import MessageView, NoticeRow, PreviewRow, ToolRow, plain_tip
from piwork.gui.words import (
    RESUME_PROMPT,
    RESUMED,
    ended_line,
    is_denied,
    permission_line,
    person_notice,
    person_paths,
    stopped_words,
)
from piwork.runner import EventKind, RunEvent

_TECHNICAL = ("accelerator:", "pack:", "restored in", "cold boot", "using the offline demo model")


def technical_notice(message: str) -> bool:
    """Start-up details a person does not need in the conversation (kept in the boot
    row's tooltip): the accelerator, pack progress, warm/cold boot."""
    return message.startswith(_TECHNICAL)


class Conversation(QScrollArea):
    """One task's conversation: a column of messages, tool rows and notices."""

    def __init__(self) -> None:
        super().__init__()
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        inner = QWidget()
        self.col = QVBoxLayout(inner)
        self.col.setContentsMargins(12, 12, 12, 12)
        self.col.setSpacing(6)
        self.col.addStretch(1)
        self.setWidget(inner)
        self.current: MessageView | None = None
        self.tools: dict[str, ToolRow] = {}
        self.denied: set[str] = set()  # steps whose permission was denied
        self.previews: dict[int, PreviewRow] = {}  # the latest row of each guest port
        self.boot_row: NoticeRow | None = None
        self.boot_details: list[str] = []
        self.verticalScrollBar().rangeChanged.connect(self._stick)
        self._follow = True

    def _stick(self, _min: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    def add(self, w: QWidget) -> QWidget:
        self.col.insertWidget(self.col.count() - 1, w)
        return w

    def user(self, text: str, mode: str | None = None) -> None:
        if text == RESUME_PROMPT and mode is None:
            self.current = None
            self.notice(RESUMED)  # piwork's words to the agent, not the person's
            return
        who = {"steer": "you (steer)", "follow_up": "you (queued follow-up)"}.get(mode or "", "you")
        if mode is None:
            self.current = None
            self.boot_row, self.boot_details = None, []  # the next start gets its own row
        # A steer while the agent writes goes under its message, and the message goes on
        # in its own bubble above (one message to pi): it is never cut in two.
        self.add(MessageView(who, text, markdown=False))

    def text(self, delta: str) -> None:
        if self.current is None:
            self.current = MessageView("agent")
            self.add(self.current)
        self.current.append(delta)

    def text_end(self) -> None:
        if self.current is not None:
            self.current.flush()
        self.current = None

    def tool_start(self, call_id: str, name: str, arg: str) -> None:
        if self.current is not None:
            self.current.flush()
        self.current = None
        row = ToolRow(call_id, name, person_paths(arg))
        self.tools[call_id] = row
        self.add(row)

    def boot(self, line: str, detail: str | None = None) -> None:
        """Start-up progress in one row that updates (stages and the accelerator are
        in its tooltip, not a row each)."""
        if self.boot_row is None:
            self.boot_row = NoticeRow(line, "boot")
            self.add(self.boot_row)
        else:
            self.boot_row.setText(line)
        if detail:
            self.boot_details.append(detail)
            self.boot_row.setToolTip(plain_tip("\n".join(self.boot_details[-30:])))

    def tool_end(
        self, call_id: str, name: str, ok: bool, text: str, seconds: float | None = None
    ) -> None:
        row = self.tools.get(call_id)
        if row is None:
            row = ToolRow(call_id, name, "")
            self.tools[call_id] = row
            self.add(row)
        row.finish(ok, text, seconds=seconds, denied=call_id in self.denied)

    def deny(self, call_id: str) -> None:
        """A permission for step ``call_id`` was denied: its failure is that denial."""
        if call_id:
            self.denied.add(call_id)

    def interrupt(self) -> None:
        """The run ended: a step still open never finished (no spinner left behind)."""
        for row in self.tools.values():
            row.interrupt()

    def notice(self, text: str, kind: str = "notice") -> None:
        self.add(NoticeRow(text, kind))

    def preview(self, port: int, state: str, url: str | None, reason: str | None) -> None:
        """A preview event: "opened" adds a row (or reopens the port's row), "closed"
        greys it, "refused" says why."""
        row = self.previews.get(port)
        if state == "opened":
            if row is None or row.url is None:
                row = PreviewRow(port, url)
                self.previews[port] = row
                self.add(row)
            else:
                row.set_open(url)
        elif state == "closed":
            if row is not None:
                row.set_closed(reason)
        elif state == "refused":
            if row is None or row.url is not None:
                row = PreviewRow(port, None)
                self.previews[port] = row
                self.add(row)
            row.set_refused(reason or "not opened")

    def messages(self) -> list[MessageView]:
        out = []
        for i in range(self.col.count()):
            item = self.col.itemAt(i)
            w = item.widget() if item is not None else None
            if isinstance(w, MessageView):
                out.append(w)
        return out

    def tool_rows(self) -> list[ToolRow]:
        return list(self.tools.values())


class ConversationPane(QWidget):
    """The header ("title — state") over the selected task's conversation."""

    def __init__(self, model: TasksModel, paths: Paths) -> None:
        super().__init__()
        self.model = model
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.header = QLabel("New task")
        self.header.setTextFormat(Qt.TextFormat.RichText)  # the title in bold, escaped
        self.header.setObjectName("taskHeader")
        self.header.setContentsMargins(12, 6, 12, 0)
        lay.addWidget(self.header)
        self.banner_host = QVBoxLayout()  # the crash banner goes here (window wires it)
        lay.addLayout(self.banner_host)
        self.stack = QStackedWidget()
        self.welcome = WelcomePage(paths)
        self.stack.addWidget(self.welcome)
        lay.addWidget(self.stack, 1)
        self.conversations: dict[int, Conversation] = {}
        listen(self, model.added, self._added)
        listen(self, model.removed, self._removed)
        listen(self, model.selected_changed, lambda _t: self.redraw())
        listen(self, model.changed, self._changed)
        listen(self, model.run_event, self._on_event)

    def conversation(self, task: TaskController) -> Conversation:
        return self.conversations[id(task)]

    def _added(self, task: TaskController, restored: bool) -> None:
        conv = Conversation()
        self.conversations[id(task)] = conv
        self.stack.addWidget(conv)
        if restored and task.task_id:
            load_history(self.model.paths.tasks / task.task_id / "transcript.jsonl", conv)

    def _removed(self, task: TaskController) -> None:
        conv = self.conversations.pop(id(task), None)
        if conv is not None:
            self.stack.removeWidget(conv)
            conv.deleteLater()

    def _changed(self, task: TaskController) -> None:
        if task is self.model.selected:
            self.redraw()

    def redraw(self) -> None:
        sel = self.model.selected
        if sel is None:
            self.stack.setCurrentWidget(self.welcome)
            self.header.setText("New task")
            self.header.setToolTip("")
            return
        self.stack.setCurrentWidget(self.conversation(sel))
        state = sel.state
        extra = " · its VM is kept on for a follow-up" if state.warm else ""
        self.header.setText(
            f"<b>{html.escape(sanitize(sel.title, limit=120, keep_newlines=False))}</b>"
            f" — {html.escape(state.label)}{extra}"
        )
        self.header.setToolTip(plain_tip(f"model: {sel.model}") if sel.model else "")

    # ------------------------------------------------------------ the runner's events
    def _words(self, ctl: TaskController, message: str) -> str:
        """A runner message in the window's words: no task ids, Enter for `piwork resume`."""
        titles = {t.task_id: t.title for t in self.model.tasks if t.task_id}
        return person_notice(message, ctl.task_id, titles)

    def _on_event(self, ctl: TaskController, ev: RunEvent) -> None:
        conv = self.conversation(ctl)
        d = ev.data
        k = ev.kind
        if k is EventKind.PROMPT:
            conv.user(str(d.get("message", "")), d.get("mode"))
        elif k is EventKind.TEXT:
            conv.text(str(d.get("delta", "")))
        elif k is EventKind.TEXT_END:
            conv.text_end()
            if d.get("error") and not ctl.stopping:  # pi's "aborted" after a Stop is no error
                conv.notice(f"The model reported an error: {d['error']}", "error")
        elif k is EventKind.TOOL_START:
            conv.tool_start(str(d.get("id")), str(d.get("name")), str(d.get("arg") or ""))
        elif k is EventKind.TOOL_END:
            conv.tool_end(
                str(d.get("id")), str(d.get("name")), bool(d.get("ok")), str(d.get("text") or "")
            )
        elif k is EventKind.BOOT:
            secs = float(d.get("seconds") or 0)
            conv.boot(
                f"Starting the task's VM… {secs:.0f} s",
                f"{d.get('stage')}: {secs:.1f} s",
            )
        elif k is EventKind.READY:
            conv.boot(f"The agent is ready ({float(d.get('seconds') or 0):.0f} s to start)")
        elif k is EventKind.NOTICE:
            msg = str(d.get("message", ""))
            if technical_notice(msg):
                if msg.startswith("using the offline demo model"):
                    msg = "model: the offline demo (scripted, not a real LLM)"  # no CLI flags
                conv.boot(conv.boot_row.text() if conv.boot_row else "Starting…", msg)
            else:
                conv.notice(self._words(ctl, msg))
        elif k is EventKind.ERROR:
            conv.notice(self._words(ctl, str(d.get("message", ""))), "error")
        elif k is EventKind.PERMISSION:
            line = permission_line(d)
            if line is not None:
                conv.notice(line)
            if is_denied(d):
                conv.deny(str(d.get("call") or ""))
        elif k is EventKind.DONE:
            conv.text_end()
            conv.interrupt()
            done_msg: Any = d.get("message")
            if ctl.stopping or d.get("reason") == "cancelled":
                done_msg = None  # "stopped by the person" is what the label already says
            turns = int(d.get("turns") or 0)
            ended = stopped_words(str(d["reason"])) if d.get("reason") else ctl.label.capitalize()
            conv.notice(
                ended_line(
                    ended,
                    sanitize(self._words(ctl, str(done_msg)), limit=300) if done_msg else None,
                    int(d.get("tokens") or 0),
                    turns,
                )
            )
        elif k is EventKind.PREVIEW:
            port = d.get("port")
            if isinstance(port, int) and not isinstance(port, bool):
                reason = d.get("reason")
                conv.preview(
                    port,
                    str(d.get("state")),
                    ctl.previews.get(port),  # the checked URL (http on loopback), or None
                    str(reason) if reason else None,
                )
