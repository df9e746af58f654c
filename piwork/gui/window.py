"""The main window: task rail | conversation + composer | context panel."""

from __future__ import annotations

import asyncio
import contextlib
import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from piwork.config import Paths, get_paths
from piwork.gui.appstate import NEW, AppState, Crash
from piwork.gui.context import ContextPanel
from piwork.gui.controller import (
    PendingPermission,
    PendingPreview,
    PendingQuestion,
    RunOptions,
    TaskController,
    spawn,
)
from piwork.gui.history import load_history
from piwork.gui.hosts import host_names
from piwork.gui.prefs import Prefs, model_choices
from piwork.gui.text import (
    always_rules,
    plain_request,
    registry_rules_offered,
    rule_text,
    sanitize,
)
from piwork.gui.welcome import DEMO_PROMPT, WelcomePage, demo_folder
from piwork.gui.widgets import (
    Composer,
    MessageView,
    NoticeRow,
    PermissionSheet,
    PreviewRow,
    PreviewSheet,
    QuestionBar,
    ToolRow,
)
from piwork.gui.words import permission_line, person_paths
from piwork.models.defaults import DEMO
from piwork.policy import Choice, needs_confirmation
from piwork.preview import PreviewChoice
from piwork.run.pool import Pool
from piwork.runner import EventKind, RunEvent
from piwork.tasks import TaskStore

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
CLEAN_ENV_TIP = (
    "Start the new task from the clean workbench, not from what the folder's last task "
    "installed (piwork run --clean-env)"
)
ICON = Path(__file__).with_name("icons") / "piwork.svg"
STYLE = """
#rail { background: #f4f5f7; border: none; }
#rail::item { padding: 6px 8px; border-bottom: 1px solid #e3e5e8; }
#rail::item:selected { background: #dbe7ff; color: black; }
#msg-you { background: #eef3ff; border-radius: 8px; }
#msg-agent { background: white; border: 1px solid #e6e6e6; border-radius: 8px; }
#msgHead { color: #555; font-weight: bold; }
#toolHead { text-align: left; border: none; padding: 3px; color: #333; }
#toolHead[state="err"] { color: #b00020; }
#toolHead[state="ok"] { color: #1b5e20; }
#notice-notice { color: #777; padding: 2px 10px; }
#notice-error { color: #b00020; padding: 2px 10px; }
#notice-boot { color: #555; padding: 2px 10px; }
#permissionSheet { background: #fff8e1; border: 1px solid #f0c36d; border-radius: 8px; }
#sheetTitle { font-weight: bold; font-size: 11pt; }
#sheetDetail { color: #555; }
#sheetRule { font-family: "DejaVu Sans Mono"; background: #fffdf5; padding: 4px; }
#questionBar { background: #e8f5e9; border: 1px solid #a5d6a7; border-radius: 8px; }
#usage { color: #444; }
#welcomeTitle { font-size: 13pt; font-weight: bold; }
#welcomeStep { background: #f7f9fc; border: 1px solid #e3e7ee; border-radius: 8px; }
#welcomeStepTitle { font-weight: bold; }
#welcomeHint { color: #777; }
"""


_TECHNICAL = ("accelerator:", "pack:", "restored in", "cold boot", "using the offline demo model")


def technical_notice(message: str) -> bool:
    """Start-up details a person does not need in the conversation (kept in the boot
    row's tooltip): the accelerator, pack progress, warm/cold boot."""
    return message.startswith(_TECHNICAL)


def composer_hint(ctl: TaskController | None) -> str:
    """What Enter does now, for the selected task's state (the composer's placeholder)."""
    if ctl is None:
        return "Describe a new task… · Enter starts it · Shift+Enter new line"
    if ctl.status == "queued":
        return "Queued: it starts when a running task ends · Esc takes it off the queue"
    if ctl.busy and ctl.session is None:
        return "The agent is starting… type now; Enter sends once it is ready"
    if ctl.paused:
        return "Paused · press Continue, then Enter talks to the agent"
    if ctl.busy:
        return (
            "Enter steers the agent now · Alt+Enter queues a follow-up for after this turn "
            "· Shift+Enter new line"
        )
    return "Enter continues this task with a new message · Shift+Enter new line"


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
        who = {"steer": "you (steer)", "follow_up": "you (queued follow-up)"}.get(mode or "", "you")
        self.current = None
        self.boot_row, self.boot_details = None, []  # the next start gets its own row
        self.add(MessageView(who if who != "you" else "you", text, markdown=False))

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
            self.boot_row.setToolTip("\n".join(self.boot_details[-30:]))

    def tool_end(self, call_id: str, name: str, ok: bool, text: str) -> None:
        row = self.tools.get(call_id)
        if row is None:
            row = ToolRow(call_id, name, "")
            self.tools[call_id] = row
            self.add(row)
        row.finish(ok, text)

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


class MainWindow(QMainWindow):
    def __init__(
        self, *, paths: Paths | None = None, prefs: Prefs | None = None, tray: bool | None = None
    ) -> None:
        """``tray``: whether the desktop has a system tray (None: ask Qt; tests choose)."""
        super().__init__()
        self.paths = paths or get_paths()
        self.prefs = prefs or Prefs.load(self.paths)
        self.setWindowTitle("piwork")
        self.setWindowIcon(QIcon(str(ICON)))
        self.pool = Pool(
            self.prefs.max_tasks, paths=self.paths, keep_warm=self.prefs.keep_warm_seconds
        )
        self.pool.on_change = self._pool_changed
        self.extra_run_args: dict[str, Any] = {}
        self.demo_base: Path | None = None  # where the demo's folder goes (None: Documents)
        self.tasks: list[TaskController] = []
        self.conversations: dict[int, Conversation] = {}
        self._spin = 0
        self._quitting = False
        self._in_tray = False  # closed to the tray: quit by itself once nothing is live
        self.state = AppState(self.paths)
        self.crash: Crash | None = self.state.previous_crash()
        self._draft_key: str | None = None  # no draft is shown yet
        self._draft_timer = QTimer(self)
        self._draft_timer.setSingleShot(True)
        self._draft_timer.setInterval(400)
        self._draft_timer.timeout.connect(self._save_draft)
        self._build()
        self._load_tasks()
        self._tray_setup(available=tray)
        self._offer_after_crash()
        self._mark_running()
        self._timer = QTimer(self)
        self._timer.setInterval(120)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    # ------------------------------------------------------------ layout
    def _build(self) -> None:
        self.setStyleSheet(STYLE)
        split = QSplitter()
        # Rail
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        self.new_btn = QPushButton("+ New task")
        self.new_btn.setToolTip("Ctrl+N")
        self.new_btn.clicked.connect(self.new_task)
        ll.addWidget(self.new_btn)
        self.rail = QListWidget()
        self.rail.setObjectName("rail")
        self.rail.setIconSize(QSize(10, 10))
        self.rail.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.rail.setWordWrap(True)
        self.rail.currentRowChanged.connect(self._select_row)
        self.rail.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.rail.customContextMenuRequested.connect(self._rail_menu)
        ll.addWidget(self.rail)
        self.settings_btn = QPushButton("Settings")
        self.settings_btn.clicked.connect(self.open_settings)
        ll.addWidget(self.settings_btn)
        left.setMinimumWidth(180)
        split.addWidget(left)
        # Centre
        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(0, 0, 0, 0)
        self.header = QLabel("")
        self.header.setObjectName("taskHeader")
        self.header.setContentsMargins(12, 6, 12, 0)
        cl.addWidget(self.header)
        self.crash_host = QVBoxLayout()
        cl.addLayout(self.crash_host)
        self.stack = QStackedWidget()
        self.empty = WelcomePage(self.paths)
        self.empty.run_demo.connect(self.start_demo)
        self.empty.open_settings.connect(self.open_settings)
        self.stack.addWidget(self.empty)
        cl.addWidget(self.stack, 1)
        self.sheet_host = QVBoxLayout()
        cl.addLayout(self.sheet_host)
        self.question_host = QVBoxLayout()
        cl.addLayout(self.question_host)
        bar = QHBoxLayout()
        self.model_pick = QComboBox()
        self.model_pick.setToolTip("Model for a new task")
        self._fill_models()
        bar.addWidget(self.model_pick)
        self.host_pick = QComboBox()
        self.host_pick.setObjectName("hostPick")
        self._fill_hosts()
        bar.addWidget(self.host_pick)
        self.folder_btn = QPushButton("Folder…")
        self.folder_btn.setToolTip("Working folder for a new task")
        self.folder_btn.clicked.connect(self._pick_folder)
        bar.addWidget(self.folder_btn)
        self.folder_lbl = QLabel("no folder")
        bar.addWidget(self.folder_lbl, 1)
        self.clean_env = QCheckBox("Start clean")
        self.clean_env.setObjectName("startClean")
        self.clean_env.setToolTip(CLEAN_ENV_TIP)
        bar.addWidget(self.clean_env)
        self.pause_btn = QPushButton("Pause")
        self.pause_btn.clicked.connect(self._pause_clicked)
        bar.addWidget(self.pause_btn)
        self.end_btn = QPushButton("End task")
        self.end_btn.setToolTip(
            "The task is done and its VM is kept on for a follow-up: power it off now "
            "(you can still continue the task later)"
        )
        self.end_btn.clicked.connect(self._end_clicked)
        bar.addWidget(self.end_btn)
        cl.addLayout(bar)
        row = QHBoxLayout()
        self.composer = Composer()
        self.composer.send.connect(self._send_text)
        self.composer.queue_follow_up.connect(self._queue_text)
        self.composer.textChanged.connect(self._draft_timer.start)
        row.addWidget(self.composer, 1)
        self.send_btn = QPushButton("Send")
        self.send_btn.setMinimumWidth(80)
        self.send_btn.clicked.connect(self._send_clicked)
        row.addWidget(self.send_btn)
        cl.addLayout(row)
        split.addWidget(centre)
        # Context
        self.context = ContextPanel(self.paths)
        self.context.release_vm = self._release_vm
        split.addWidget(self.context)
        # At 1280 px the diff gets ~500 px: about 70 columns of a diff line, readable.
        split.setSizes([200, 560, 520])
        split.setStretchFactor(1, 1)
        self.setCentralWidget(split)
        self.new_folder: Path | None = None
        self.resize(1280, 800)
        # Keyboard
        QShortcut(QKeySequence("Ctrl+N"), self, self.new_task)
        QShortcut(QKeySequence("Ctrl+Return"), self, self._send_clicked)
        QShortcut(QKeySequence("Ctrl+Enter"), self, self._send_clicked)
        QShortcut(QKeySequence("Escape"), self, self._esc)
        QShortcut(QKeySequence("Ctrl+,"), self, self.open_settings)
        for i in range(1, 10):
            QShortcut(QKeySequence(f"Ctrl+{i}"), self, lambda i=i: self.select_index(i - 1))
        self.setTabOrder(self.composer, self.send_btn)
        self.setTabOrder(self.send_btn, self.model_pick)
        self.setTabOrder(self.model_pick, self.folder_btn)
        self.setTabOrder(self.folder_btn, self.pause_btn)
        self.setTabOrder(self.pause_btn, self.rail)
        self.setTabOrder(self.rail, self.new_btn)
        self._update_composer()

    def _fill_models(self) -> None:
        self.model_pick.clear()
        default = self.prefs.default_model
        for ref, label in model_choices(self.paths):
            self.model_pick.addItem(label, ref)
        i = self.model_pick.findData(default)
        if i < 0:
            self.model_pick.addItem(default, default)
            i = self.model_pick.count() - 1
        self.model_pick.setCurrentIndex(i)

    # ------------------------------------------------------------ tasks
    def _load_tasks(self) -> None:
        store = TaskStore(self.paths.tasks)
        try:
            # Tasks whose owner died (this app's crash, a killed CLI) read "interrupted",
            # not "running"; a task another live process owns is left as it is (flock).
            self.interrupted = store.mark_interrupted()
            for t in store.list():
                r = t.record
                if t.id in self.prefs.archived:
                    continue
                ctl = TaskController(
                    self.pool,
                    task_id=t.id,
                    title=r.title,
                    status=r.status.value,
                    reason=r.stop.reason.value if r.stop else None,
                    folder=r.working_folder,
                    model=r.model,
                )
                ctl.tokens = r.usage.total_tokens
                ctl.cost = r.usage.cost_usd
                ctl.elapsed_before = r.wall_seconds()
                self._add(ctl, history=True)
        finally:
            store.close()
        if self.tasks:
            self.rail.setCurrentRow(0)
        else:
            self._switch_draft(NEW)

    def _add(self, ctl: TaskController, *, history: bool = False) -> None:
        conv = Conversation()
        self.conversations[id(ctl)] = conv
        self.stack.addWidget(conv)
        if history and ctl.task_id:
            load_history(self.paths.tasks / ctl.task_id / "transcript.jsonl", conv)
        ctl.run_event.connect(lambda ev, c=ctl: self._on_event(c, ev))
        ctl.changed.connect(self._refresh_rail)
        ctl.permission_asked.connect(lambda p, c=ctl: self._on_permission(c, p))
        ctl.question_asked.connect(lambda q, c=ctl: self._on_question(c, q))
        ctl.preview_asked.connect(lambda q, c=ctl: self._on_preview_question(c, q))
        ctl.finished.connect(lambda r, c=ctl: self._on_finished(c, r))
        ctl.closed.connect(lambda c=ctl: self.context.unwatch(c.task_id or ""))
        self.tasks.insert(0, ctl)
        item = QListWidgetItem()
        self.rail.insertItem(0, item)
        self._refresh_rail()

    def current(self) -> TaskController | None:
        row = self.rail.currentRow()
        return self.tasks[row] if 0 <= row < len(self.tasks) else None

    def conversation(self, ctl: TaskController) -> Conversation:
        return self.conversations[id(ctl)]

    def new_task(self) -> None:
        self.rail.clearSelection()
        self.rail.setCurrentRow(-1)
        self._switch_draft(NEW)
        self.stack.setCurrentWidget(self.empty)
        self.new_folder = None
        self.folder_lbl.setText("no folder")
        self.clean_env.setChecked(False)
        self._show_folder_env()
        self._fill_hosts()  # a host added with `piwork hosts add` meanwhile is offered
        self._update_composer()
        self.composer.setFocus()

    def select_index(self, i: int) -> None:
        if 0 <= i < len(self.tasks):
            self.rail.setCurrentRow(i)

    def select(self, ctl: TaskController) -> None:
        self.select_index(self.tasks.index(ctl))

    # ------------------------------------------------------------ drafts and crashes
    def _draft_key_for(self, ctl: TaskController | None) -> str | None:
        if ctl is None:
            return NEW
        return ctl.task_id  # None while a new task has no id yet: nothing to key it by

    def _save_draft(self) -> None:
        """Durable on return (fsync + rename): typed text survives the app dying."""
        self._draft_timer.stop()
        if self._draft_key is not None:
            try:
                self.state.save_draft(self._draft_key, self.composer.toPlainText())
            except OSError as exc:  # a full disk must not take the window down
                self.header.setToolTip(f"could not save the draft: {exc}")

    def _switch_draft(self, key: str | None) -> None:
        """Keep the text typed for the task being left; show the one typed for ``key``."""
        if key == self._draft_key:
            return
        self._save_draft()
        self._draft_key = key
        self.composer.blockSignals(True)
        self.composer.setPlainText(self.state.draft(key) if key is not None else "")
        self.composer.blockSignals(False)

    def _live_ids(self) -> list[str]:
        return [c.task_id for c in self.tasks if c.task_id and (c.live or c.status == "queued")]

    def _mark_running(self) -> None:
        if self._quitting:
            return
        with contextlib.suppress(OSError):  # only the next start's crash notice needs it
            self.state.mark_running(self._live_ids())

    def _offer_after_crash(self) -> None:
        """The last run died: say so, and offer back the tasks it had running."""
        self.crash_banner: QFrame | None = None
        lost = [
            c
            for c in self.tasks
            if c.task_id
            and (c.task_id in self.interrupted or (self.crash and c.task_id in self.crash.live))
        ]
        if self.crash is None and not lost:
            return
        box = QFrame()
        box.setObjectName("crashBanner")
        lay = QHBoxLayout(box)
        if lost:
            names = ", ".join(f"“{sanitize(c.title, limit=50)}”" for c in lost[:3])
            more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
            msg = (
                "piwork closed unexpectedly last time. "
                f"Interrupted: {names}{more}. Nothing you typed was lost."
            )
        else:
            msg = "piwork closed unexpectedly last time. Nothing you typed was lost."
        text = QLabel(msg)
        text.setWordWrap(True)
        lay.addWidget(text, 1)
        if lost:
            again = QPushButton("Continue it" if len(lost) == 1 else "Continue the first")
            again.clicked.connect(lambda _=False, c=lost[0]: self.continue_interrupted(c))
            lay.addWidget(again)
            self.crash_continue = again
        dismiss = QPushButton("Dismiss")
        dismiss.clicked.connect(self._dismiss_crash)
        lay.addWidget(dismiss)
        self.crash_host.addWidget(box)
        self.crash_banner = box
        if lost:
            self.select(lost[0])

    def _dismiss_crash(self) -> None:
        if self.crash_banner is not None:
            self._clear(self.crash_host)
            self.crash_banner = None

    def continue_interrupted(self, ctl: TaskController) -> None:
        """Resume a task the crash cut off, in a new VM, from its saved session."""
        self._dismiss_crash()
        self.select(ctl)
        if not ctl.live:
            ctl.submit(
                "piwork stopped unexpectedly while you were working on this task. "
                "Check where you got to and continue.",
                self.run_options(None),
            )

    def _select_row(self, row: int) -> None:
        ctl = self.current()
        self._switch_draft(self._draft_key_for(ctl))
        if ctl is None:
            self.stack.setCurrentWidget(self.empty)
            self.context.show_task(None, None, None)
        else:
            self.stack.setCurrentWidget(self.conversation(ctl))
            outputs = self.paths.tasks / ctl.task_id / "outputs" if ctl.task_id else None
            self.context.show_task(
                ctl.task_id, ctl.folder, outputs, running=ctl.busy, warm=ctl.warm
            )
        self._show_sheets()
        self.redraw()

    def _refresh_rail(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        """Draw every view from the tasks' state: the rail, and the header, usage, pause
        and end buttons, composer and context panel of the selected task. Called on every
        change of any task and on every selection change, never left to a timer, so no
        view can show another task's state or a stale one."""
        sel = self.current()
        for i, ctl in enumerate(self.tasks):
            item = self.rail.item(i)
            if item is None:
                continue
            label = ctl.label
            spin = SPINNER[self._spin % len(SPINNER)] + " " if ctl.busy and not ctl.paused else ""
            badge = ""
            if (ctl.permissions or ctl.question or ctl.preview_questions) and ctl is not sel:
                n = len(ctl.permissions) + len(ctl.preview_questions) + (1 if ctl.question else 0)
                badge = f"  ⚠ {n}"
            when = f" · {ctl.last_activity}" if ctl.last_activity else ""
            item.setText(
                f"{sanitize(ctl.title, limit=60, keep_newlines=False)}{badge}\n{spin}{label}{when}"
            )
            item.setToolTip(f"Ctrl+{i + 1}" if i < 9 else "")
        if sel is not None:
            if self._draft_key is None and sel.task_id:
                self._draft_key = sel.task_id  # the new task got its id: key its draft
            self.header.setText(
                f"<b>{html.escape(sanitize(sel.title, limit=120))}</b> — {html.escape(sel.label)}"
            )
            self.header.setToolTip(f"model: {sel.model}" if sel.model else "")
            self.context.set_usage(sel.tokens, sel.cost, sel.elapsed)
            self.context.set_running(sel.busy, warm=sel.warm)
            self.context.set_previews(sel.previews)
        else:
            self.header.setText("New task")
            self.header.setToolTip("")
            self.context.set_usage(None, None, None)
            self.context.set_previews({})
        self._update_composer()

    def _tick(self) -> None:
        """Animation only: the rail's spinner and the selected task's running clock."""
        if any(c.busy for c in self.tasks):
            self._spin += 1
            for i, ctl in enumerate(self.tasks):
                item = self.rail.item(i)
                if item is not None and ctl.busy and not ctl.paused:
                    lines = item.text().split("\n", 1)
                    if len(lines) == 2 and lines[1][:1] in SPINNER:
                        glyph = SPINNER[self._spin % len(SPINNER)]
                        item.setText(f"{lines[0]}\n{glyph}{lines[1][1:]}")
            sel = self.current()
            if sel is not None and sel.busy:
                self.context.set_usage(sel.tokens, sel.cost, sel.elapsed)

    # ------------------------------------------------------------ composer
    def _update_composer(self) -> None:
        ctl = self.current()
        running = ctl is not None and ctl.busy
        self.send_btn.setText("Stop" if running else "Send")
        self.model_pick.setEnabled(ctl is None)
        self.folder_btn.setEnabled(ctl is None)
        self.host_pick.setEnabled(ctl is None)
        self.clean_env.setVisible(ctl is None)  # a task's environment is chosen once
        if ctl is not None:  # the task's own host, not the new-task choice
            host = ctl.host
            i = self.host_pick.findData(host) if host else 0
            if host and i < 0:
                self.host_pick.addItem(host, host)
                i = self.host_pick.count() - 1
            self.host_pick.setCurrentIndex(i)
        if ctl is not None:  # show the task's own model and folder, not the new-task choice
            ref = ctl.model or "demo"
            i = self.model_pick.findData(ref)
            if i < 0:
                self.model_pick.addItem(ref, ref)
                i = self.model_pick.count() - 1
            self.model_pick.setCurrentIndex(i)
            self.folder_lbl.setText(str(ctl.folder) if ctl.folder else "no folder")
        elif self.new_folder is None:
            self.folder_lbl.setText("no folder")
        self.pause_btn.setVisible(running and ctl is not None and ctl.session is not None)
        self.pause_btn.setText("Continue" if ctl is not None and ctl.paused else "Pause")
        self.end_btn.setVisible(ctl is not None and ctl.warm)
        self.composer.setPlaceholderText(composer_hint(ctl))

    def _fill_hosts(self) -> None:
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

    async def _release_vm(self, task_id: str) -> None:
        ctl = next((c for c in self.tasks if c.task_id == task_id), None)
        if ctl is not None and ctl.live and not ctl.busy:
            await ctl.end()

    def start_demo(self) -> TaskController:
        """The first-run demo: the offline demo model on a folder piwork made for it."""
        self.new_task()
        self.new_folder = demo_folder(self.demo_base)
        self.folder_lbl.setText(str(self.new_folder))
        i = self.model_pick.findData(DEMO)
        if i >= 0:
            self.model_pick.setCurrentIndex(i)
        self._send_text(DEMO_PROMPT)
        ctl = self.current()
        assert ctl is not None
        return ctl

    def _end_clicked(self) -> None:
        ctl = self.current()
        if ctl is not None and ctl.live:
            spawn(ctl.end())

    def _pick_folder(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Working folder for the new task")
        if d:
            self.new_folder = Path(d)
            self.folder_lbl.setText(d)
            self._show_folder_env()

    def _show_folder_env(self) -> None:
        """The "Start clean" box says what the new task would otherwise start from."""
        from piwork.gui.envs import folder_env, mb

        info = None
        if self.new_folder is not None:
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # plain tip
                info = folder_env(self.paths, self.new_folder)
        if info is None or not info.bytes:
            self.clean_env.setToolTip(CLEAN_ENV_TIP)
            return
        self.clean_env.setToolTip(
            f"{sanitize(str(info.folder), limit=300)}: {info.next_start()} ({mb(info.bytes)}). "
            + CLEAN_ENV_TIP
        )

    def _send_clicked(self) -> None:
        ctl = self.current()
        if ctl is not None and ctl.busy:
            self.confirm_stop(ctl)
            return
        text = self.composer.toPlainText().strip()
        if text:
            self._send_text(text)

    def run_options(self, model: str | None, host: str | None = None) -> RunOptions:
        return RunOptions(
            model=model,
            folder=self.new_folder,
            host=host,
            memory_mb=self.prefs.memory_mb,
            cpus=self.prefs.cpus,
            accel=self.prefs.accel or None,
            clean_env=self.clean_env.isChecked(),
            extra=dict(self.extra_run_args),
        )

    def _send_text(self, text: str) -> None:
        ctl = self.current()
        self.composer.clear()
        if ctl is None:
            model = self.model_pick.currentData() or self.prefs.default_model
            ctl = TaskController(
                self.pool, title=text.splitlines()[0][:80], folder=self.new_folder, model=model
            )
            host = self.host_pick.currentData()
            self._add(ctl)
            self.select(ctl)
            ctl.submit(text, self.run_options(model, host))
            return
        if ctl.busy:
            if ctl.session is None:  # still booting: keep the text rather than drop it
                self.composer.setPlainText(text)
                self.conversation(ctl).notice(
                    "the agent is still starting: send again once it is ready"
                )
                return
            if ctl.paused:  # a frozen VM cannot take a message: keep the text
                self.composer.setPlainText(text)
                self.conversation(ctl).notice("the task is paused: press Continue first")
                return
            spawn(ctl.steer(text))
            return
        ctl.submit(text, self.run_options(None))
        self._update_composer()

    def _queue_text(self, text: str) -> None:
        ctl = self.current()
        if ctl is None or not ctl.busy:
            self._send_text(text)
            return
        if ctl.session is None:
            self.conversation(ctl).notice(
                "the agent is still starting: queue again once it is ready"
            )
            return
        self.composer.clear()
        spawn(ctl.follow_up(text))

    def _pause_clicked(self) -> None:
        ctl = self.current()
        if ctl is None:
            return
        if ctl.paused:
            spawn(ctl.resume_vm())
        else:
            spawn(ctl.pause())

    def _esc(self) -> None:
        ctl = self.current()
        if ctl is not None and (ctl.busy or ctl.status == "queued"):
            self.confirm_stop(ctl)

    def confirm_stop(self, ctl: TaskController) -> None:
        box = QMessageBox(self)
        box.setWindowTitle("Stop the task?")
        box.setText(f"Stop “{sanitize(ctl.title, limit=80)}”? You can continue it later.")
        stop = box.addButton("Stop", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton("Keep running", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(stop)
        self._stop_box = box
        box.finished.connect(lambda _r: self._stop_answer(ctl, box.clickedButton() is stop))
        box.open()

    def _stop_answer(self, ctl: TaskController, yes: bool) -> None:
        if yes:
            spawn(ctl.stop())

    # ------------------------------------------------------------ events
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
                conv.notice(msg)
        elif k is EventKind.ERROR:
            conv.notice(str(d.get("message", "")), "error")
        elif k is EventKind.PERMISSION:
            line = permission_line(d)
            if line is not None:
                conv.notice(line)
            if d.get("decision") == "cancelled":
                self._show_sheets()
        elif k is EventKind.TASK and ctl.task_id:
            outputs = self.paths.tasks / ctl.task_id / "outputs"
            self.context.watch(ctl.task_id, ctl.folder, outputs)
            if self.current() is ctl:
                self.context.show_task(
                    ctl.task_id, ctl.folder, outputs, running=ctl.busy, warm=ctl.warm
                )
        elif k is EventKind.DONE:
            conv.text_end()
            done_msg: Any = d.get("message")
            if ctl.stopping or d.get("reason") == "cancelled":
                done_msg = None  # "stopped by the person" is what the label already says
            turns = int(d.get("turns") or 0)
            conv.notice(
                f"— {ctl.label.capitalize()}"
                + (f": {sanitize(str(done_msg), limit=300)}" if done_msg else "")
                + f" · {int(d.get('tokens') or 0):,} tokens, {turns} turn"
                + ("" if turns == 1 else "s")
                + " —"
            )
        elif k is EventKind.CHANGES and ctl.task_id:  # a turn ended: its files and counts
            self.context.on_changes_event(d, task_id=ctl.task_id)
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

    def _notify(self, ctl: TaskController, what: str) -> None:
        if self.isActiveWindow():
            return
        if self.tray is None:
            # No tray to speak from: ask the task bar to draw attention to the window.
            QApplication.alert(self)
            self.notifications.append(what)
            return
        self.tray.showMessage(
            "piwork",
            f"{sanitize(ctl.title, limit=60)}: {what}",
            QSystemTrayIcon.MessageIcon.Information,
            8000,
        )
        self.notifications.append(what)

    def _on_finished(self, ctl: TaskController, result: object) -> None:
        self._notify(ctl, ctl.label)
        self._update_composer()

    # ------------------------------------------------------------ questions
    def _on_permission(self, ctl: TaskController, pending: PendingPermission) -> None:
        self._notify(ctl, "waiting for your permission")
        self._show_sheets()

    def _on_preview_question(self, ctl: TaskController, q: PendingPreview) -> None:
        self._notify(ctl, "asks to open a preview")
        self._show_sheets()

    def _on_question(self, ctl: TaskController, q: PendingQuestion) -> None:
        self._notify(ctl, "the agent asks you something")
        self._show_sheets()

    def _clear(self, layout: QVBoxLayout) -> None:
        while layout.count():
            item = layout.takeAt(0)
            w = item.widget() if item is not None else None
            if w is not None:
                w.hide()
                w.deleteLater()

    def _show_sheets(self) -> None:
        """Show the selected task's first pending permission (the rest queue) and question."""
        self._clear(self.sheet_host)
        self._clear(self.question_host)
        self.sheet: PermissionSheet | None = None
        self.question_bar: QuestionBar | None = None
        self.preview_sheet: PreviewSheet | None = None
        ctl = self.current()
        if ctl is None:
            return
        pending = [p for p in ctl.permissions if not p.future.done()]
        if pending:
            p = pending[0]
            req = p.request
            folder = ctl.folder
            sheet = PermissionSheet(
                person_paths(plain_request(req)),
                person_paths(sanitize(req.question, limit=600)),
                str(folder) if folder else None,
                always_rules(req, Choice.ALWAYS_FOLDER),
                always_rules(req, Choice.ALWAYS_EVERYWHERE),
                queued=len(pending) - 1,
                registry_rules=registry_rules_offered(req),
            )
            sheet.answered.connect(lambda c, p=p, t=ctl: self._answer(t, p, c))
            self.sheet_host.addWidget(sheet)
            self.sheet = sheet
            sheet.buttons[Choice.DENY].setFocus()
        previews = [p for p in ctl.preview_questions if not p.future.done()]
        if previews and self.sheet is None:
            pv = previews[0]
            psheet = PreviewSheet(pv.question, queued=len(previews) - 1)
            psheet.answered.connect(lambda c, p=pv, t=ctl: self._answer_preview(t, p, c))
            self.sheet_host.addWidget(psheet)
            self.preview_sheet = psheet
            psheet.buttons[PreviewChoice.NEVER].setFocus()
        q = ctl.question
        if q is not None and not q.future.done():
            bar = QuestionBar(q.method, q.title, q.message, q.options)
            bar.answered.connect(lambda a, t=ctl: self._answer_q(t, a))
            self.question_host.addWidget(bar)
            self.question_bar = bar

    def _answer(self, ctl: TaskController, p: PendingPermission, c: Choice) -> None:
        rules = always_rules(p.request, c)
        if c is Choice.ALWAYS_EVERYWHERE and needs_confirmation(rules):
            self._confirm_everywhere(ctl, p, rules)
            return
        ctl.answer_permission(p, c)
        QTimer.singleShot(0, self._show_sheets)

    def _confirm_everywhere(self, ctl: TaskController, p: PendingPermission, rules: Any) -> None:
        """A global rule for network, delete, move or outside-scope is confirmed a second
        time (as the CLI asks for "yes"); "Back" (the default) returns to the sheet."""
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Warning)
        box.setWindowTitle("Allow in every folder?")
        box.setText("This stores a rule for EVERY task, in every folder:")
        box.setInformativeText(rule_text(rules))
        store = box.addButton("Store the rule", QMessageBox.ButtonRole.DestructiveRole)
        back = box.addButton("Back", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(back)
        self._everywhere_box = box

        def answered(_r: int) -> None:
            if box.clickedButton() is store and not p.future.done():
                ctl.answer_permission(p, Choice.ALWAYS_EVERYWHERE)
                QTimer.singleShot(0, self._show_sheets)

        box.finished.connect(answered)
        box.open()

    def _answer_preview(
        self, ctl: TaskController, p: PendingPreview, c: PreviewChoice | None
    ) -> None:
        ctl.answer_preview(p, c)
        QTimer.singleShot(0, self._show_sheets)

    def _answer_q(self, ctl: TaskController, answer: object) -> None:
        ctl.answer_question(answer)  # type: ignore[arg-type]
        QTimer.singleShot(0, self._show_sheets)

    # ------------------------------------------------------------ rail menu
    def _rail_menu(self, pos: Any) -> None:
        ctl = self.current()
        if ctl is None:
            return
        menu = QMenu(self)
        if ctl.live and not ctl.busy:
            menu.addAction("End task", lambda: spawn(ctl.end()))
        menu.addAction("Rename…", lambda: self.rename(ctl))
        menu.addAction("Archive", lambda: self.archive(ctl))
        menu.addAction("Delete…", lambda: self.delete(ctl))
        menu.exec(self.rail.mapToGlobal(pos))

    def rename(self, ctl: TaskController, title: str | None = None) -> None:
        if title is None:
            title, ok = QInputDialog.getText(self, "Rename task", "Title", text=ctl.title)
            if not ok:
                return
        title = " ".join(title.split())
        if not title:
            return
        if ctl.task_id:
            store = TaskStore(self.paths.tasks)
            try:
                store.update(ctl.task_id, title=title)
            finally:
                store.close()
        ctl.title = title
        self._refresh_rail()

    def _remove(self, ctl: TaskController) -> None:
        i = self.tasks.index(ctl)
        self.rail.takeItem(i)
        self.tasks.pop(i)
        conv = self.conversations.pop(id(ctl))
        self.stack.removeWidget(conv)
        conv.deleteLater()
        self._refresh_rail()

    def archive(self, ctl: TaskController) -> None:
        if ctl.busy:
            QMessageBox.information(self, "piwork", "Stop the task before archiving it.")
            return
        if ctl.live:  # done, VM kept warm: power it off, then archive
            spawn(self._after_end(ctl, lambda: self.archive(ctl)))
            return
        if ctl.task_id:
            self.prefs.archived.add(ctl.task_id)
            self.prefs.save(self.paths)
        self._remove(ctl)

    async def _after_end(self, ctl: TaskController, then: Any) -> None:
        await ctl.end()
        then()

    def delete(self, ctl: TaskController, *, confirmed: bool = False) -> None:
        if ctl.busy:
            QMessageBox.information(self, "piwork", "Stop the task before deleting it.")
            return
        if ctl.live:
            spawn(self._after_end(ctl, lambda: self.delete(ctl, confirmed=confirmed)))
            return
        if not confirmed:
            ans = QMessageBox.question(
                self,
                "Delete task?",
                f"Delete “{sanitize(ctl.title, limit=80)}” and its transcript? "
                "Files in its working folder are kept.",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )
            if ans != QMessageBox.StandardButton.Yes:
                return
        if ctl.task_id:
            store = TaskStore(self.paths.tasks)
            try:
                store.rm(ctl.task_id)
            finally:
                store.close()
        self._remove(ctl)

    # ------------------------------------------------------------ settings
    def open_settings(self) -> None:
        from piwork.gui.settings import SettingsDialog

        dlg = SettingsDialog(self.paths, self.prefs, self)
        dlg.applied.connect(self._settings_applied)
        dlg.finished.connect(lambda _r: self._settings_closed())
        self.settings_dialog = dlg
        dlg.open()

    def _settings_applied(self) -> None:
        """A limit changed in Settings: used now, by tasks already running too."""
        self.pool.keep_warm = self.prefs.keep_warm_seconds
        self.pool.set_limit(self.prefs.max_tasks)

    def _settings_closed(self) -> None:
        self._settings_applied()
        self._fill_models()
        self.empty.refresh()  # key status on the welcome page

    # ------------------------------------------------------------ tray and quit
    def _tray_setup(self, *, available: bool | None = None) -> None:
        """A tray icon where the desktop has a tray (stock GNOME has none: then closing
        the window asks instead of hiding it somewhere the person cannot reach)."""
        self.notifications: list[str] = []
        self.tray: QSystemTrayIcon | None = None
        # Hiding the last window must not end the event loop: quitting goes through
        # request_quit (or _quit_if_idle), which powers the VMs off first.
        QApplication.setQuitOnLastWindowClosed(False)
        if available is None:
            available = QSystemTrayIcon.isSystemTrayAvailable()
        if not available:
            return
        self.tray = QSystemTrayIcon(QIcon(str(ICON)), self)
        menu = QMenu()
        self.show_action = QAction("Show piwork", menu)
        self.show_action.triggered.connect(self.show_from_tray)
        menu.addAction(self.show_action)
        quit_action = QAction("Quit", menu)
        quit_action.triggered.connect(self.request_quit)
        menu.addAction(quit_action)
        self.tray_menu = menu
        self.tray.setContextMenu(menu)
        self.tray.activated.connect(lambda _r: self.show_from_tray())
        self.tray.setToolTip("piwork")
        self.tray.show()

    def show_from_tray(self) -> None:
        """Also what a second launch of the app does (piwork.gui.instance)."""
        self._in_tray = False
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def _busy_tasks(self) -> list[TaskController]:
        """Tasks that would be cut off by quitting: working, waiting for the person, or
        queued. A finished task whose VM is only kept warm is not one of them."""
        return [c for c in self.tasks if c.busy or c.status == "queued" or c.permissions]

    def closeEvent(self, e: QCloseEvent) -> None:
        if self._quitting:
            e.accept()
            return
        busy = self._busy_tasks()
        if not busy:
            # Nothing is being worked on: closing the window quits (warm VMs power off).
            e.ignore()
            spawn(self.quit_cleanly())
            return
        e.ignore()
        if self.tray is not None:
            self.hide()
            self._in_tray = True
            self.tray.showMessage(
                "piwork",
                "Tasks keep running here. Quit from this menu.",
                QSystemTrayIcon.MessageIcon.Information,
                5000,
            )
            return
        self._ask_close(busy)

    def _ask_close(self, busy: list[TaskController]) -> None:
        """No tray to hide in: minimise (tasks keep running, the window stays in the
        task bar) or stop them and quit."""
        box = QMessageBox(self)
        box.setWindowTitle("Tasks are still running")
        n = len(busy)
        box.setText(
            ("A task is" if n == 1 else f"{n} tasks are")
            + " still running. Keep working in the background, or stop and quit? "
            "Stopped tasks can be continued later."
        )
        keep = box.addButton("Minimise", QMessageBox.ButtonRole.AcceptRole)
        stop = box.addButton("Stop and quit", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton("Cancel", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(keep)
        self.close_box = box

        def answered(_r: int) -> None:
            if box.clickedButton() is keep:
                self.showMinimized()
            elif box.clickedButton() is stop:
                spawn(self.quit_cleanly())

        box.finished.connect(answered)
        box.open()

    def _pool_changed(self) -> None:
        self._refresh_rail()
        self._mark_running()
        self._quit_if_idle()

    def _quit_if_idle(self) -> None:
        """Hidden in the tray with nothing left running: the process should not linger."""
        if self._quitting or not self._in_tray or self.isVisible():
            return
        if any(c.live or c.status == "queued" for c in self.tasks):
            return
        spawn(self.quit_cleanly())

    def request_quit(self, *, confirmed: bool = False) -> None:
        live = [c for c in self.tasks if c.live or c.status == "queued"]
        if live and not confirmed:
            ans = QMessageBox.question(
                self,
                "Quit piwork?",
                f"{len(live)} task(s) are running. Quitting stops them cleanly; "
                "you can continue each later.",
                QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                QMessageBox.StandardButton.Cancel,
            )
            if ans != QMessageBox.StandardButton.Yes:
                return
        spawn(self.quit_cleanly())

    def on_app_quit(self) -> None:
        self._save_draft()
        with contextlib.suppress(OSError):
            self.state.clean_exit()

    async def quit_cleanly(self, *, exit_app: bool = True) -> None:
        self._quitting = True
        self._save_draft()
        await asyncio.gather(*(c.shut_down() for c in self.tasks), return_exceptions=True)
        self.state.clean_exit()
        self.context.stop_watching()
        if self.tray is not None:
            self.tray.hide()
        self.close()
        if exit_app:
            with contextlib.suppress(RuntimeError):
                QApplication.quit()
