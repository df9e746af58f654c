"""The main window: task rail | conversation + composer | context panel, wired in one place.

The parts (``TaskRail``, ``ConversationPane``, ``SheetArea``, ``ComposePanel``,
``ContextPanel``, ``CrashBanner``) each draw from the Qt-free ``TasksModel``
(``piwork.gui.model``) and say what the person did through Qt signals; this module
connects them and turns those requests into the model's actions (napari's
``QtViewer`` over its ``ViewerModel``). No part calls another part.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from PySide6.QtGui import QCloseEvent, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QInputDialog,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QSystemTrayIcon,
    QVBoxLayout,
    QWidget,
)

from piwork.config import Paths, get_paths
from piwork.gui.appstate import AppState, Crash
from piwork.gui.asking import ACCEPT, DESTRUCTIVE, REJECT, ask, choose, inform, tray_icon
from piwork.gui.banner import CrashBanner, cut_off
from piwork.gui.compose import ComposePanel
from piwork.gui.context import ContextPanel
from piwork.gui.controller import RunOptions, TaskController, spawn
from piwork.gui.conversation import Conversation, ConversationPane
from piwork.gui.model import TasksModel
from piwork.gui.prefs import Prefs
from piwork.gui.qtlink import listen
from piwork.gui.rail import TaskRail
from piwork.gui.sheets import SheetArea
from piwork.gui.state import Enter, Phase
from piwork.gui.text import sanitize
from piwork.gui.welcome import DEMO_PROMPT, demo_folder
from piwork.gui.words import RESUME_PROMPT
from piwork.models.defaults import DEMO
from piwork.run.pool import Pool

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
#toolHead[state="denied"] { color: #8a6d00; }
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


def _part(part: str, name: str) -> Any:
    return property(lambda self: getattr(getattr(self, part), name))


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
        self.model = TasksModel(self.paths, self.prefs, self.pool)
        self.extra_run_args: dict[str, Any] = {}
        self.demo_base: Path | None = None  # where the demo's folder goes (None: Documents)
        self._quitting = False
        self._in_tray = False  # closed to the tray: quit by itself once nothing is live
        self.state = AppState(self.paths)
        self.crash: Crash | None = self.state.previous_crash()
        self.crash_banner: CrashBanner | None = None
        self.box: QMessageBox | None = None  # the last question the window asked
        self._build()
        self.model.load()
        if self.model.tasks:
            self.model.select(self.model.tasks[0])
        else:
            self.compose.redraw()
        self._tray_setup(available=tray)
        self._offer_after_crash()
        self._mark_running()

    # ------------------------------------------------------------ layout and wiring
    def _build(self) -> None:
        self.setStyleSheet(STYLE)
        m = self.model
        split = QSplitter()
        self.rail_view = rail = TaskRail(m)
        split.addWidget(rail)
        centre = QWidget()
        cl = QVBoxLayout(centre)
        cl.setContentsMargins(0, 0, 0, 0)
        self.pane = ConversationPane(m, self.paths)
        cl.addWidget(self.pane, 1)
        self.sheets = SheetArea(m)
        cl.addWidget(self.sheets)
        self.compose = ComposePanel(m, self.state)
        cl.addWidget(self.compose)
        split.addWidget(centre)
        self.context = ContextPanel(self.paths)
        self.context.release_vm = self._release_vm
        self.context.follow(m)
        split.addWidget(self.context)
        # At 1280 px the diff gets ~500 px: about 70 columns of a diff line, readable.
        split.setSizes([200, 560, 520])
        split.setStretchFactor(1, 1)
        self.setCentralWidget(split)
        self.resize(1280, 800)
        # What the person asked for, from each part.
        rail.new_task.connect(self.new_task)
        rail.settings.connect(self.open_settings)
        rail.rename.connect(self.rename)
        rail.archive.connect(self.archive)
        rail.delete.connect(self.delete)
        rail.end.connect(lambda t: spawn(t.end()))
        self.pane.welcome.run_demo.connect(self.start_demo)
        self.pane.welcome.open_settings.connect(self.open_settings)
        self.compose.send.connect(self.send_text)
        self.compose.queue.connect(self._queue_text)
        self.compose.stop.connect(lambda: self._stop_selected())
        self.compose.pause.connect(self._pause_clicked)
        self.compose.end.connect(self._end_clicked)
        self.sheets.answered.connect(self.compose.composer.setFocus)
        listen(self, m.selected_changed, lambda _t: self.sheets.redraw())
        listen(self, m.finished, lambda t, _r: self._notify(t, t.label))
        listen(self, m.asked, self._asked)
        listen(self, m.state_changed, lambda _t: self._pool_changed())
        # Keyboard
        QShortcut(QKeySequence("Ctrl+N"), self, self.new_task)
        QShortcut(QKeySequence("Ctrl+Return"), self, self.compose._send_clicked)
        QShortcut(QKeySequence("Ctrl+Enter"), self, self.compose._send_clicked)
        QShortcut(QKeySequence("Escape"), self, self._stop_selected)
        QShortcut(QKeySequence("Ctrl+,"), self, self.open_settings)
        for i in range(1, 10):
            QShortcut(QKeySequence(f"Ctrl+{i}"), self, lambda i=i: self.select_index(i - 1))
        c = self.compose
        order = [c.composer, c.send_btn, c.model_pick, c.folder_btn, c.pause_btn]
        for a, b in zip([*order, rail.list], [*order[1:], rail.list, rail.new_btn], strict=True):
            self.setTabOrder(a, b)

    # ------------------------------------------------------------ the parts, by name
    # The widgets a person finds on screen, by name (tests and the screenshot scripts).
    composer = _part("compose", "composer")
    send_btn = _part("compose", "send_btn")
    pause_btn = _part("compose", "pause_btn")
    end_btn = _part("compose", "end_btn")
    model_pick = _part("compose", "model_pick")
    host_pick = _part("compose", "host_pick")
    folder_btn = _part("compose", "folder_btn")
    clean_env = _part("compose", "clean_env")
    sheet = _part("sheets", "sheet")
    preview_sheet = _part("sheets", "preview_sheet")
    question_bar = _part("sheets", "question_bar")
    header = _part("pane", "header")
    rail = _part("rail_view", "list")

    @property
    def tasks(self) -> list[TaskController]:
        return self.model.tasks

    def current(self) -> TaskController | None:
        return self.model.selected

    def conversation(self, task: TaskController) -> Conversation:
        return self.pane.conversation(task)

    @property
    def new_folder(self) -> Path | None:
        return self.compose.new_folder

    @new_folder.setter
    def new_folder(self, folder: Path | None) -> None:
        self.compose.set_folder(folder)

    @property
    def crash_continue(self) -> Any:
        return self.crash_banner.continue_btn if self.crash_banner is not None else None

    # ------------------------------------------------------------ selecting
    def new_task(self) -> None:
        self.model.select(None)
        self.compose.reset_new_task()

    def select_index(self, i: int) -> None:
        if 0 <= i < len(self.model.tasks):
            self.model.select(self.model.tasks[i])

    def select(self, task: TaskController) -> None:
        self.model.select(task)

    # ------------------------------------------------------------ sending
    def run_options(self, model: str | None, host: str | None = None) -> RunOptions:
        return RunOptions(
            model=model,
            folder=self.compose.new_folder,
            host=host,
            memory_mb=self.prefs.memory_mb,
            cpus=self.prefs.cpus,
            accel=self.prefs.accel or None,
            clean_env=self.compose.clean_env.isChecked(),
            extra=dict(self.extra_run_args),
        )

    def send_text(self, text: str) -> None:
        """Enter: what the selected task's state says Enter does (its hint says the same)."""
        task = self.model.selected
        if task is None:
            model = self.compose.chosen_model()
            task = self.model.new(
                title=text.splitlines()[0][:80], folder=self.compose.new_folder, model=model
            )
            host = self.compose.host_pick.currentData()
            self.compose.composer.clear()
            self.model.add(task)
            self.model.select(task)
            task.submit(text, self.run_options(model, host))
            return
        enter = task.state.enter
        if enter is Enter.HOLD:
            return  # the hint says why; the text stays where it is
        self.compose.composer.clear()
        if enter is Enter.STEER:
            spawn(task.steer(text))
        else:
            task.submit(text, self.run_options(None))

    def _queue_text(self, text: str) -> None:
        task = self.model.selected
        if task is None or task.state.enter is not Enter.STEER:
            self.send_text(text)
            return
        self.compose.composer.clear()
        spawn(task.follow_up(text))

    def start_demo(self) -> TaskController:
        """The first-run demo: the offline demo model on a folder piwork made for it."""
        self.new_task()
        self.compose.set_folder(demo_folder(self.demo_base))
        i = self.compose.model_pick.findData(DEMO)
        if i >= 0:
            self.compose.model_pick.setCurrentIndex(i)
        self.send_text(DEMO_PROMPT)
        task = self.model.selected
        assert task is not None
        return task

    def _pause_clicked(self) -> None:
        task = self.model.selected
        if task is not None:
            spawn(task.resume_vm() if task.state.phase is Phase.PAUSED else task.pause())

    def _end_clicked(self) -> None:
        task = self.model.selected
        if task is not None and task.live:
            spawn(task.end())

    async def _release_vm(self, task_id: str) -> None:
        task = self.model.find(task_id)
        if task is not None and task.state.warm:
            await task.end()

    def _stop_selected(self) -> None:
        task = self.model.selected
        if task is not None and task.state.can_stop:
            self.confirm_stop(task)

    def confirm_stop(self, task: TaskController) -> None:
        title = sanitize(task.title, limit=80, keep_newlines=False)
        box, (stop, _keep) = choose(
            self,
            "Stop the task?",
            f"Stop “{title}”? You can continue it later.",
            [("Stop", DESTRUCTIVE), ("Keep running", REJECT)],
        )
        self.box = box
        box.finished.connect(lambda _r: box.clickedButton() is stop and spawn(task.stop()))
        box.open()

    # ------------------------------------------------------------ notices
    def _asked(self, task: TaskController, what: str) -> None:
        words = {
            "permission": "waiting for your permission",
            "preview": "asks to open a preview",
        }.get(what, "the agent asks you something")
        self._notify(task, words)

    def _notify(self, task: TaskController, what: str) -> None:
        if self.isActiveWindow():
            return
        self.notifications.append(what)
        if self.tray is None:
            # No tray to speak from: ask the task bar to draw attention to the window.
            QApplication.alert(self)
            return
        title = sanitize(task.title, limit=60, keep_newlines=False)
        self.tray.showMessage(
            "piwork", f"{title}: {what}", QSystemTrayIcon.MessageIcon.Information, 8000
        )

    # ------------------------------------------------------------ crashes
    def _mark_running(self) -> None:
        if self._quitting:
            return
        with contextlib.suppress(OSError):  # only the next start's crash notice needs it
            self.state.mark_running(self.model.working_ids())

    def _offer_after_crash(self) -> None:
        """The last run died, or a task was cut off: say so, and offer the task back."""
        lost = cut_off(self.model, self.crash)
        if self.crash is None and not lost:
            return
        banner = CrashBanner(self.crash, lost)
        banner.resume.connect(self.continue_interrupted)
        banner.dismissed.connect(self._dismiss_crash)
        self.pane.banner_host.addWidget(banner)
        self.crash_banner = banner
        if lost:
            self.model.select(lost[0])

    def _dismiss_crash(self) -> None:
        if self.crash_banner is not None:
            self.crash_banner.hide()
            self.crash_banner.deleteLater()
            self.crash_banner = None

    def continue_interrupted(self, task: TaskController) -> None:
        """Resume a task the crash cut off, in a new VM, from its saved session."""
        self._dismiss_crash()
        self.model.select(task)
        if not task.live:
            task.submit(RESUME_PROMPT, self.run_options(None))

    # ------------------------------------------------------------ the rail's menu
    def rename(self, task: TaskController, title: str | None = None) -> None:
        if title is None:
            title, ok = QInputDialog.getText(self, "Rename task", "Title", text=task.title)
            if not ok:
                return
        self.model.rename(task, title)

    def archive(self, task: TaskController, *, confirmed: bool = False) -> None:
        """Out of the list after asking; Settings → Archived brings it back."""
        self._put_away(task, "archive", confirmed, self.model.archive)

    def delete(self, task: TaskController, *, confirmed: bool = False) -> None:
        self._put_away(task, "delete", confirmed, self.model.delete)

    def _put_away(self, task: TaskController, what: str, confirmed: bool, then: Any) -> None:
        if task.state.busy:
            self.box = inform(self, f"Stop the task before you {what} it.")
            return
        title = sanitize(task.title, limit=80, keep_newlines=False)
        if not confirmed:
            self.box = ask(
                self,
                f"{what.capitalize()} the task?",
                f"Archive “{title}”? It leaves the list; its transcript and files are kept, "
                "and Settings → Archived brings it back."
                if what == "archive"
                else f"Delete “{title}” and its transcript? Files in its working folder are kept.",
                what.capitalize(),
                lambda: self._put_away(task, what, True, then),
            )
            return
        if task.live:  # done, VM kept warm: power it off first
            spawn(self._after_end(task, lambda: then(task)))
            return
        then(task)

    async def _after_end(self, task: TaskController, then: Any) -> None:
        await task.end()
        then()

    # ------------------------------------------------------------ settings
    def open_settings(self) -> None:
        from piwork.gui.settings import SettingsDialog

        dlg = SettingsDialog(self.paths, self.prefs, self)
        dlg.applied.connect(self._settings_applied)
        dlg.unarchived.connect(self._unarchived)
        dlg.finished.connect(lambda _r: self._settings_closed())
        self.settings_dialog = dlg
        dlg.open()

    def _unarchived(self, task_id: str) -> None:
        if self.model.find(task_id) is None:
            self.model.load_one(task_id)

    def _settings_applied(self) -> None:
        """A limit changed in Settings: used now, by tasks already running too."""
        self.pool.keep_warm = self.prefs.keep_warm_seconds
        self.pool.set_limit(self.prefs.max_tasks)

    def _settings_closed(self) -> None:
        self._settings_applied()
        self.compose.fill_models()
        self.compose.redraw()
        self.pane.welcome.refresh()  # key status on the welcome page

    # ------------------------------------------------------------ tray and quit
    def _tray_setup(self, *, available: bool | None = None) -> None:
        """A tray icon where the desktop has a tray (stock GNOME has none: then closing
        the window asks instead of hiding it somewhere the person cannot reach)."""
        self.notifications: list[str] = []
        # Hiding the last window must not end the event loop: quitting goes through
        # request_quit (or _quit_if_idle), which powers the VMs off first.
        QApplication.setQuitOnLastWindowClosed(False)
        self.tray = tray_icon(self, ICON, self.show_from_tray, self.request_quit, available)

    def show_from_tray(self) -> None:
        """Also what a second launch of the app does (piwork.gui.instance)."""
        self._in_tray = False
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()

    def closeEvent(self, e: QCloseEvent) -> None:
        e.ignore()
        if self._quitting:
            e.accept()
            return
        busy = self.model.busy_tasks()
        if not busy:
            # Nothing is being worked on: closing the window quits (warm VMs power off).
            spawn(self.quit_cleanly())
            return
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
        self._ask_close(len(busy))

    def _ask_close(self, n: int) -> None:
        """No tray to hide in: minimise (tasks keep running, the window stays in the
        task bar) or stop them and quit."""
        box, (keep, stop, _cancel) = choose(
            self,
            "Tasks are still running",
            ("A task is" if n == 1 else f"{n} tasks are")
            + " still running. Keep working in the background, or stop and quit? "
            "Stopped tasks can be continued later.",
            [("Minimise", ACCEPT), ("Stop and quit", DESTRUCTIVE), ("Cancel", REJECT)],
        )
        self.close_box = self.box = box

        def answered(_r: int) -> None:
            if box.clickedButton() is keep:
                self.showMinimized()
            elif box.clickedButton() is stop:
                spawn(self.quit_cleanly())

        box.finished.connect(answered)
        box.open()

    def _pool_changed(self) -> None:
        self.rail_view.redraw()
        self._mark_running()
        self._quit_if_idle()

    def _quit_if_idle(self) -> None:
        """Hidden in the tray with nothing left running: the process should not linger."""
        if self._quitting or not self._in_tray or self.isVisible():
            return
        if self.model.live():
            return
        spawn(self.quit_cleanly())

    def request_quit(self, *, confirmed: bool = False) -> None:
        live = self.model.live()
        if live and not confirmed:
            self.box = ask(
                self,
                "Quit piwork?",
                f"{len(live)} task(s) are running. Quitting stops them cleanly; "
                "you can continue each later.",
                "Quit",
                lambda: self.request_quit(confirmed=True),
            )
            return
        spawn(self.quit_cleanly())

    def on_app_quit(self) -> None:
        self.compose.save_draft()
        with contextlib.suppress(OSError):
            self.state.clean_exit()

    async def quit_cleanly(self, *, exit_app: bool = True) -> None:
        self._quitting = True
        self.compose.save_draft()
        await asyncio.gather(*(t.shut_down() for t in self.model.tasks), return_exceptions=True)
        self.state.clean_exit()
        self.context.stop_watching()
        if self.tray is not None:
            self.tray.hide()
        self.close()
        if exit_app:
            with contextlib.suppress(RuntimeError):
                QApplication.quit()
