"""The right-hand panel: working folder, files changed (live), preview, usage, and each
turn's changes with their diff, **Undo this turn** and **Undo the undo** (the Turns
tab, ``piwork.gui.turns``).

Every host file access under the working folder or the task's outputs goes
through ``piwork.sharefs`` (one component at a time, ``O_NOFOLLOW``): the guest
can plant links there, and the panel must never follow one out of the folder.

Checkpoints (the "Turns" tab) go through the same API as ``piwork changes`` and
``piwork undo`` (:mod:`piwork.checkpoints`). Those functions block (git runs as
a subprocess), so the panel never calls them on the window's thread: it runs
them with ``asyncio.to_thread`` on the app's qasync loop (the pattern
``app.py`` uses for the doctor checks; see controller.py for why qasync) and
fills the widgets when the result comes back. A generation counter drops
results that arrive after the person switched to another task.
"""

from __future__ import annotations

import asyncio
import csv
import io
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QImage,
    QPixmap,
    QSyntaxHighlighter,
    QTextCharFormat,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from piwork import sharefs
from piwork.config import Paths, get_paths
from piwork.gui.qtlink import listen
from piwork.gui.text import sanitize
from piwork.gui.turns import TurnsPane
from piwork.gui.watch import FolderWatch, still_there
from piwork.gui.widgets import (
    InertBrowser,
    file_kind,
    open_preview,
    plain_label,
    set_inert_markdown,
)
from piwork.runner import EventKind, RunEvent

if TYPE_CHECKING:
    from piwork.gui.controller import TaskController
    from piwork.gui.model import TasksModel

log = logging.getLogger(__name__)
MAX_PREVIEW = 512 * 1024
MAX_FILES = 500
MAX_TURNS = 50  # newest turns listed (older ones: `piwork changes TASK --turn N`)
MAX_DIFF_LINES = 1500  # lines of diff shown at once; the rest is summarised
MARK = {"added": "A", "modified": "M", "deleted": "D", "type_changed": "T"}
RUNNING_TIP = "The agent is working on this task: stop it (or wait until it is done), then undo."


class DiffHighlighter(QSyntaxHighlighter):
    """Colours a unified diff line by line: additions, deletions, hunks, file headers."""

    def __init__(self, doc: QTextDocument) -> None:
        super().__init__(doc)

        def fmt(fg: str, bg: str | None = None, bold: bool = False) -> QTextCharFormat:
            f = QTextCharFormat()
            f.setForeground(QColor(fg))
            if bg:
                f.setBackground(QColor(bg))
            if bold:
                f.setFontWeight(QFont.Weight.Bold)
            return f

        self.added = fmt("#1b5e20", "#e6ffec")
        self.removed = fmt("#b00020", "#ffebe9")
        self.hunk = fmt("#6f42c1")
        self.header = fmt("#333333", bold=True)
        self.note = fmt("#8a6d00", "#fff8e1", bold=True)

    def highlightBlock(self, text: str) -> None:
        if text.startswith(("+++", "---", "diff ", "index ", "new file", "deleted file")):
            f = self.header
        elif text.startswith("+"):
            f = self.added
        elif text.startswith("-"):
            f = self.removed
        elif text.startswith("@@"):
            f = self.hunk
        elif text.startswith("# "):
            f = self.note
        else:
            return
        self.setFormat(0, len(text), f)


def _part(name: str) -> Any:
    return property(lambda self: getattr(self.turns_pane, name))


class ContextPanel(QWidget):
    def __init__(self, paths: Paths | None = None) -> None:
        super().__init__()
        self.paths = paths or get_paths()
        self.setObjectName("contextPanel")
        self.setMinimumWidth(260)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        self.folder_label = plain_label("No task selected")
        self.folder_label.setWordWrap(True)
        self.folder_label.setObjectName("panelFolder")
        lay.addWidget(self.folder_label)
        self.open_btn = QPushButton("Open in file manager")
        self.open_btn.clicked.connect(self._open_folder)
        self.open_btn.setEnabled(False)  # until a task with a folder is shown
        lay.addWidget(self.open_btn)
        self.open_note = plain_label()  # what became of "Open in file manager"
        self.open_note.setObjectName("openNote")
        self.open_note.setWordWrap(True)
        self.open_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.open_note.hide()
        lay.addWidget(self.open_note)
        # Previews: the selected task's open previews (hidden when it has none).
        self.previews_box = QWidget()
        self.previews_box.setObjectName("previews")
        pl = QVBoxLayout(self.previews_box)
        pl.setContentsMargins(0, 4, 0, 4)
        pl.addWidget(plain_label("Previews"))
        self.previews_rows = QVBoxLayout()
        pl.addLayout(self.previews_rows)
        self.preview_buttons: dict[int, QPushButton] = {}  # port -> its "Open" button
        self._previews_shown: dict[int, str] = {}
        self.previews_box.hide()
        lay.addWidget(self.previews_box)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("contextTabs")
        # Files: what changed in the folder (live, by watchfiles), previewed below.
        self.files = QListWidget()
        self.files.setObjectName("changedFiles")
        self.files.setToolTip("Files changed in this task (live)")
        self.files.currentItemChanged.connect(self._preview_item)
        self.tabs.addTab(self.files, "Files changed")
        # Turns: each turn's changes from the checkpoints, the diff below, undo.
        self.turns_pane = TurnsPane(self.paths)
        self.turns_pane.diff_shown.connect(self._show_diff)
        self.turns_pane.file_changed.connect(
            lambda path, status, task_id: self.note_change(path, status, task_id=task_id)
        )
        self.turns_pane.net_changes.connect(self.set_changes)
        self.tabs.addTab(self.turns_pane, "Turns")
        lay.addWidget(self.tabs, 2)
        self.preview_title = plain_label("Preview")
        self.preview_title.setObjectName("previewTitle")
        lay.addWidget(self.preview_title)
        self.preview = QStackedWidget()
        self.preview_text = InertBrowser()  # previews guest files: loads nothing
        self.preview_image = plain_label()
        self.preview_image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.preview_table = QTableWidget()
        self.diff_view = QPlainTextEdit()
        self.diff_view.setObjectName("diffView")
        self.diff_view.setReadOnly(True)
        self.diff_view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        mono = QFont("DejaVu Sans Mono")
        mono.setStyleHint(QFont.StyleHint.Monospace)
        mono.setPointSizeF(max(7.0, self.font().pointSizeF() * 0.9))
        self.diff_view.setFont(mono)
        self._diff_colours = DiffHighlighter(self.diff_view.document())
        for w in (self.preview_text, self.preview_image, self.preview_table, self.diff_view):
            self.preview.addWidget(w)
        lay.addWidget(self.preview, 3)
        self.usage = plain_label()
        self.usage.setObjectName("usage")
        lay.addWidget(self.usage)
        # The task's environment disk (what it installed), as `piwork tasks show` says it.
        self.env_label = plain_label()
        self.env_label.setObjectName("taskEnv")
        self.env_label.setWordWrap(True)  # the panel can be narrow: never cut the size off
        self.env_label.setToolTip(
            "What this task installed (apt, pip, npm) lives on its own disk; "
            "Settings → Environments lists each folder's"
        )
        lay.addWidget(self.env_label)
        self.root: Path | None = None
        self.outputs: Path | None = None
        self.task_id: str | None = None
        self.changed: dict[str, str] = {}  # display name -> status
        self.watcher = FolderWatch(self._watched)
        self._changes: dict[str, dict[str, str]] = {}
        self._preview_gen = 0

    # ------------------------------------------------------------ the model
    def follow(self, model: TasksModel) -> None:
        """Draw the model's selected task, and note every task's changes as they come."""
        self.model = model
        listen(self, model.selected_changed, self._task_selected)
        listen(self, model.changed, self._task_changed)
        listen(self, model.run_event, self._run_event)
        listen(self, model.closed, lambda t: self.unwatch(t.task_id or ""))
        self._clock = QTimer(self)
        self._clock.setInterval(500)
        self._clock.timeout.connect(self._tick)
        self._clock.start()
        self._task_selected(model.selected)

    def _outputs(self, task: TaskController) -> Path | None:
        return self.paths.tasks / task.task_id / "outputs" if task.task_id else None

    def _task_selected(self, task: TaskController | None) -> None:
        if task is None:
            self.show_task(None, None, None)
        else:
            state = task.state
            self.show_task(
                task.task_id, task.folder, self._outputs(task), running=state.busy, warm=state.warm
            )
        self._task_changed(task)

    def _task_changed(self, task: TaskController | None) -> None:
        if task is not self.model.selected:
            return
        if task is None:
            self.set_usage(None, None, None)
            self.set_previews({})
            return
        state = task.state
        self.set_usage(task.tokens, task.cost, task.elapsed)
        self.set_running(state.busy, warm=state.warm)
        self.set_previews(task.previews)

    def _tick(self) -> None:
        """The selected task's running clock."""
        task = self.model.selected
        if task is not None and task.state.busy:
            self.set_usage(task.tokens, task.cost, task.elapsed)

    def _run_event(self, task: TaskController, ev: RunEvent) -> None:
        if ev.kind is EventKind.TASK and task.task_id:
            self.watch(task.task_id, task.folder, self._outputs(task))
            if task is self.model.selected:
                self._task_selected(task)
        elif ev.kind is EventKind.CHANGES and task.task_id:  # a turn ended: its files
            self.on_changes_event(ev.data, task_id=task.task_id)

    # ------------------------------------------------------------ task binding
    def show_task(
        self,
        task_id: str | None,
        folder: Path | None,
        outputs: Path | None,
        *,
        running: bool = False,
        warm: bool = False,
    ) -> None:
        """Show ``task_id``'s folder and the changes recorded for it (watched while it runs);
        ``running``: the agent works on it (undo is refused then); ``warm``: it is done
        and its VM is only kept on for a follow-up (undo powers it off first)."""
        self.task_id, self.root, self.outputs = task_id, folder, outputs
        self.changed = self._changes.setdefault(task_id or "", {})
        self.files.clear()
        for rel, status in self.changed.items():
            self._add_item(rel, status)
        self.folder_label.setText(
            f"Working folder: {folder}" if folder else "Working folder: (none for this task)"
        )
        self.open_btn.setEnabled(folder is not None)
        self.open_note.hide()
        self.refresh_env()
        # Nothing of the task shown before may stay: its diff, preview or their title.
        self._preview_gen += 1
        self.diff_view.clear()
        self.preview_text.clear()
        self.preview_image.clear()
        self.preview_table.clear()
        self.preview_table.setRowCount(0)
        self.preview_table.setColumnCount(0)
        self.preview_title.setText("Preview")
        self.preview.setCurrentWidget(self.preview_text)
        self.turns_pane.show_task(task_id, folder, running=running, warm=warm)

    def _show_diff(self, title: str, text: str) -> None:
        self._preview_gen += 1  # a file preview still being read must not replace the diff
        self.diff_view.setPlainText(text)
        self.preview_title.setText(title)
        self.preview.setCurrentWidget(self.diff_view)

    # The Turns tab's parts, by the names a person knows them (tests find them here).
    turns = _part("turns")
    checkpoints = _part("checkpoints")
    undo_btn = _part("undo_btn")
    redo_btn = _part("redo_btn")
    undone = _part("undone")
    turn_changes = _part("turn_changes")
    conflict_box = _part("conflict_box")
    loading = _part("loading")
    selected_turn = _part("selected_turn")
    undo_turn = _part("undo_turn")
    undo_undo = _part("undo_undo")
    refresh_checkpoints = _part("refresh_checkpoints")

    @property
    def release_vm(self) -> Callable[[str], Awaitable[None]] | None:
        return self.turns_pane.release_vm

    @release_vm.setter
    def release_vm(self, fn: Callable[[str], Awaitable[None]] | None) -> None:
        self.turns_pane.release_vm = fn

    def set_previews(self, previews: dict[int, str]) -> None:
        """Show these open previews (port -> URL) of the selected task, nothing else."""
        if previews == self._previews_shown:
            return
        self._previews_shown = dict(previews)
        while self.previews_rows.count():
            item = self.previews_rows.takeAt(0)
            w = item.widget() if item is not None else None
            if w is not None:
                w.hide()
                w.deleteLater()
        self.preview_buttons = {}
        for port, url in sorted(previews.items()):
            # Port and button on one line, the URL on its own (a narrow panel must not
            # cut it: it is what the person may copy into another browser).
            row = QWidget()
            rv = QVBoxLayout(row)
            rv.setContentsMargins(0, 0, 0, 2)
            rv.setSpacing(0)
            top = QHBoxLayout()
            top.addWidget(plain_label(f"Port {port}"), 1)
            btn = QPushButton("Open")
            btn.setToolTip(url)
            btn.clicked.connect(lambda _=False, u=url: open_preview(u))
            top.addWidget(btn)
            rv.addLayout(top)
            link = plain_label(url)
            link.setObjectName("previewUrl")
            link.setToolTip(url)
            link.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            rv.addWidget(link)
            self.preview_buttons[port] = btn
            self.previews_rows.addWidget(row)
        self.previews_box.setVisible(bool(previews))

    def watch(self, task_id: str, folder: Path | None, outputs: Path | None) -> None:
        """Record changes under the task's folder and outputs, selected or not."""
        self.watcher.watch(task_id, folder, outputs)

    def unwatch(self, task_id: str) -> None:
        self.watcher.unwatch(task_id)

    def stop_watching(self) -> None:
        self.watcher.stop()

    def _watched(self, task_id: str, label: str, status: str, gone: bool) -> None:
        """What the watcher saw; ``gone``: a file of the outputs already moved away (a
        batch may list its "deleted" before its "added")."""
        if gone:
            if label not in self._changes.get(task_id, {}):
                return
            status = "deleted"
        self.note_change(label, status, task_id=task_id)

    def set_changes(self, task_id: str, changes: list[tuple[str, str]]) -> None:
        """What the task changed in the folder all told (from the checkpoints, the VM
        off): it replaces what the watcher saw, so an undone change leaves the list and
        a file the agent only passed through its outputs is not listed (issue 33 item 5).
        Files still in the task's outputs stay, under "outputs/"."""
        old = self._changes.get(task_id, {})
        kept = {
            rel: status
            for rel, status in old.items()
            if rel.startswith("outputs/") and self._exists(task_id, rel)
        }
        net = {sanitize(p, limit=300, keep_newlines=False): st for p, st in changes[:MAX_FILES]}
        self._changes[task_id] = {**net, **kept}
        if task_id == (self.task_id or ""):
            self.changed = self._changes[task_id]
            self.files.clear()
            for rel, status in self.changed.items():
                self._add_item(rel, status)

    def _exists(self, task_id: str, rel: str) -> bool:
        return still_there(self.paths.tasks / task_id / "outputs", rel[len("outputs/") :])

    def note_change(self, rel: str, status: str, *, task_id: str | None = None) -> None:
        rel = sanitize(rel, limit=300, keep_newlines=False)
        changes = self._changes.setdefault(task_id or self.task_id or "", {})
        if rel not in changes and len(changes) >= MAX_FILES:
            return
        if status == "deleted" and changes.get(rel) == "added":
            # Made and removed in this task (e.g. a draft moved out of its outputs):
            # nothing to show.
            del changes[rel]
            if changes is self.changed:
                for i in range(self.files.count()):
                    if self.files.item(i).data(Qt.ItemDataRole.UserRole) == rel:
                        self.files.takeItem(i)
                        break
            return
        changes[rel] = status
        if changes is not self.changed:
            return  # another task's change: shown when that task is selected
        for i in range(self.files.count()):
            it = self.files.item(i)
            if it.data(Qt.ItemDataRole.UserRole) == rel:
                it.setText(f"{status[:1].upper()}  {rel}")
                return
        self._add_item(rel, status)

    def _add_item(self, rel: str, status: str) -> None:
        it = QListWidgetItem(f"{status[:1].upper()}  {rel}")
        it.setData(Qt.ItemDataRole.UserRole, rel)
        it.setToolTip(status)
        self.files.addItem(it)

    def set_usage(self, tokens: int | None, cost: float | None, elapsed: float | None) -> None:
        """The shown task's figures; all None for no task (nothing carried over)."""
        if tokens is None or elapsed is None:
            self.usage.setText("")
            return
        h, rest = divmod(int(elapsed), 3600)
        m, s = divmod(rest, 60)
        clock = f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
        # A cost is shown only when the model has prices (the demo and local models
        # have none: "$0.0000" would read as a measured zero).
        money = f"   Cost ${cost:.4f}" if cost else ""
        self.usage.setText(f"Tokens {tokens:,}{money}   Time {clock}")

    # ------------------------------------------------------------ preview
    def _resolve(self, rel: str) -> tuple[Path, str] | None:
        if rel.startswith("outputs/") and self.outputs is not None:
            return self.outputs, rel[len("outputs/") :]
        if self.root is not None:
            return self.root, rel
        return None

    def _preview_item(self, item: QListWidgetItem | None) -> None:
        if item is not None:
            self.preview_file(str(item.data(Qt.ItemDataRole.UserRole)))

    def preview_file(self, rel: str) -> asyncio.Future[None] | None:
        """Preview ``rel``: read in a worker thread (the window never waits on disk), shown
        when read unless another preview was asked for meanwhile. Await the result to wait."""
        where = self._resolve(rel)
        if where is None:
            return None
        self.preview_title.setText(f"Preview — {sanitize(rel, limit=120, keep_newlines=False)}")
        root, sub = where
        self._preview_gen += 1
        gen = self._preview_gen

        async def job() -> None:
            try:
                data = await asyncio.to_thread(
                    sharefs.read_beneath, root, sub, max_bytes=MAX_PREVIEW
                )
            except OSError as exc:
                if gen == self._preview_gen:
                    gone = self.changed.get(rel) == "deleted"
                    self.preview_text.setPlainText(
                        f"{rel} was deleted in this task: nothing to show"
                        if gone
                        else f"cannot preview {rel}: {exc.strerror or exc}"
                    )
                    self.preview.setCurrentWidget(self.preview_text)
                return
            if gen == self._preview_gen:
                self._show_preview(rel, sub, data)

        return asyncio.ensure_future(job())

    def _show_preview(self, rel: str, sub: str, data: bytes) -> None:
        kind = file_kind(sub)
        if kind == "image":
            img = QImage.fromData(data)
            if img.isNull():
                self.preview_text.setPlainText(f"{rel}: not an image Qt can read")
                self.preview.setCurrentWidget(self.preview_text)
                return
            pm = QPixmap.fromImage(img).scaled(
                360,
                360,
                Qt.AspectRatioMode.KeepAspectRatio,
                Qt.TransformationMode.SmoothTransformation,
            )
            self.preview_image.setPixmap(pm)
            self.preview.setCurrentWidget(self.preview_image)
            return
        text = sanitize(data.decode("utf-8", "replace"), limit=MAX_PREVIEW)
        if kind == "csv":
            dialect = "excel-tab" if sub.lower().endswith(".tsv") else "excel"
            rows = list(csv.reader(io.StringIO(text), dialect=dialect))[:500]
            width = max((len(r) for r in rows), default=0)
            self.preview_table.clear()
            self.preview_table.setRowCount(max(0, len(rows) - 1))
            self.preview_table.setColumnCount(width)
            if rows:
                self.preview_table.setHorizontalHeaderLabels(
                    rows[0] + [""] * (width - len(rows[0]))
                )
            for r, row in enumerate(rows[1:]):
                for c, cell in enumerate(row):
                    self.preview_table.setItem(r, c, QTableWidgetItem(cell))
            self.preview_table.resizeColumnsToContents()
            self.preview.setCurrentWidget(self.preview_table)
        elif kind == "markdown":
            set_inert_markdown(self.preview_text.document(), text)
            self.preview.setCurrentWidget(self.preview_text)
        else:  # text, and HTML shown as source (never rendered: it came from the agent)
            self.preview_text.setPlainText(text)
            self.preview.setCurrentWidget(self.preview_text)

    def _open_folder(self) -> None:
        """Ask the desktop to open the folder, and say what happened: where no file
        manager answers (a bare window manager), the path to open by hand (issue 33)."""
        if self.root is None:
            return
        ok = QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.root)))
        self.open_note.setText(
            f"Opened in your file manager: {self.root}"
            if ok
            else f"No file manager answered on this desktop. The folder is: {self.root}"
        )
        self.open_note.show()

    # ------------------------------------------------------------ checkpoints
    def on_changes_event(self, data: dict[str, object], *, task_id: str | None = None) -> None:
        """The runner's ``changes`` event after a turn: note its files, reload the turns."""
        task_id = task_id or self.task_id
        files = data.get("files")
        for f in files if isinstance(files, list) else []:
            if isinstance(f, dict) and isinstance(f.get("path"), str):
                self.note_change(f["path"], str(f.get("status") or "modified"), task_id=task_id)
        if task_id == self.task_id:
            self.turns_pane.refresh_checkpoints()

    def set_running(self, running: bool, *, warm: bool = False) -> None:
        """Whether the agent works on the shown task (undo is refused then), or the task
        is done with its VM kept warm (undo powers the VM off first)."""
        self.turns_pane.set_running(running, warm=warm)
        self.refresh_env()  # the disk grows while the agent installs

    def refresh_env(self) -> None:
        """The shown task's environment size (one stat: cheap enough for every redraw)."""
        from piwork.gui.envs import task_env_line

        try:
            line = task_env_line(self.paths, self.task_id)
        except (OSError, ValueError, TypeError):  # a torn env.json: say nothing, keep the panel
            line = ""
        self.env_label.setText(line)
        self.env_label.setVisible(bool(line))
