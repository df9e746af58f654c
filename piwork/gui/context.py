"""The right-hand panel: working folder, files changed (live), preview, usage, and each
turn's changes with their diff, **Undo this turn** and **Undo the undo**.

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
import contextlib
import csv
import io
import logging
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
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
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from piwork import sharefs
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
from piwork.config import Paths, get_paths
from piwork.gui.text import sanitize
from piwork.gui.widgets import InertBrowser, file_kind, open_preview, set_inert_markdown
from piwork.tasks.store import TaskStoreError

log = logging.getLogger(__name__)
MAX_PREVIEW = 512 * 1024
MAX_FILES = 500
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
    return TaskTurns(out, undone)


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


def relative_beneath(root: Path, changed: str) -> str | None:
    """``changed`` relative to ``root`` if it is a regular file beneath it (no link on the way)."""
    try:
        rel = Path(changed).relative_to(root)
    except ValueError:
        return None
    if not rel.parts or ".." in rel.parts:
        return None
    try:
        st = sharefs.lstat_beneath(root, rel.as_posix())
    except OSError:
        return rel.as_posix()  # deleted (or unreachable): still a change to list
    if not stat.S_ISREG(st.st_mode):
        return None
    return rel.as_posix()


class ContextPanel(QWidget):
    def __init__(self, paths: Paths | None = None) -> None:
        super().__init__()
        self.paths = paths or get_paths()
        self.setObjectName("contextPanel")
        self.setMinimumWidth(260)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        self.folder_label = QLabel("No task selected")
        self.folder_label.setWordWrap(True)
        self.folder_label.setObjectName("panelFolder")
        lay.addWidget(self.folder_label)
        self.open_btn = QPushButton("Open in file manager")
        self.open_btn.clicked.connect(self._open_folder)
        self.open_btn.setEnabled(False)  # until a task with a folder is shown
        lay.addWidget(self.open_btn)
        # Previews: the selected task's open previews (hidden when it has none).
        self.previews_box = QWidget()
        self.previews_box.setObjectName("previews")
        pl = QVBoxLayout(self.previews_box)
        pl.setContentsMargins(0, 4, 0, 4)
        pl.addWidget(QLabel("Previews"))
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
        turns_page = QWidget()
        tl = QVBoxLayout(turns_page)
        tl.setContentsMargins(0, 4, 0, 0)
        self.turns = QTreeWidget()
        self.turns.setObjectName("turnChanges")
        self.turns.setHeaderHidden(True)
        self.turns.setRootIsDecorated(True)
        self.turns.currentItemChanged.connect(self._turn_item)
        tl.addWidget(self.turns, 1)
        self.checkpoints = QLabel()
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
        self.tabs.addTab(turns_page, "Turns")
        lay.addWidget(self.tabs, 2)
        self.preview_title = QLabel("Preview")
        self.preview_title.setObjectName("previewTitle")
        lay.addWidget(self.preview_title)
        self.preview = QStackedWidget()
        self.preview_text = InertBrowser()  # previews guest files: loads nothing
        self.preview_image = QLabel()
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
        self.usage = QLabel()
        self.usage.setObjectName("usage")
        lay.addWidget(self.usage)
        # The task's environment disk (what it installed), as `piwork tasks show` says it.
        self.env_label = QLabel()
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
        self._watches: dict[str, tuple[asyncio.Future[None], asyncio.Event]] = {}
        self._changes: dict[str, dict[str, str]] = {}
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
        self._preview_gen = 0
        self.conflict_box: QMessageBox | None = None
        self._show_checkpoint_state()

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
        self._running = running
        self._warm = warm
        self.changed = self._changes.setdefault(task_id or "", {})
        self.files.clear()
        for rel, status in self.changed.items():
            self._add_item(rel, status)
        self.folder_label.setText(
            f"Working folder: {folder}" if folder else "Working folder: (none for this task)"
        )
        self.open_btn.setEnabled(folder is not None)
        self.refresh_env()
        self._gen += 1
        self._again = False
        self._note = None
        self.turn_changes, self.undone = [], None
        self.turns.clear()
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
        if self._job is not None:
            # A late result is dropped (the generation changed); an undo still finishes
            # and is recorded (see _undo_done), the new task's turns load after it.
            self._again = True
        self.refresh_checkpoints()

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
            top.addWidget(QLabel(f"Port {port}"), 1)
            btn = QPushButton("Open")
            btn.setToolTip(url)
            btn.clicked.connect(lambda _=False, u=url: open_preview(u))
            top.addWidget(btn)
            rv.addLayout(top)
            link = QLabel(url)
            link.setObjectName("previewUrl")
            link.setToolTip(url)
            link.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            rv.addWidget(link)
            self.preview_buttons[port] = btn
            self.previews_rows.addWidget(row)
        self.previews_box.setVisible(bool(previews))

    def watch(self, task_id: str, folder: Path | None, outputs: Path | None) -> None:
        """Record changes under the task's folder and outputs, selected or not."""
        if task_id in self._watches:
            return
        roots = [p for p in (folder, outputs) if p is not None and p.is_dir()]
        if not roots:
            return
        stop = asyncio.Event()
        job = asyncio.ensure_future(self._watch_files(task_id, folder, roots, stop))
        self._watches[task_id] = (job, stop)

    def unwatch(self, task_id: str) -> None:
        entry = self._watches.pop(task_id, None)
        if entry is not None:
            job, stop = entry
            stop.set()  # the watcher's thread polls it; a loop cannot close while it runs
            job.cancel()

    def stop_watching(self) -> None:
        for task_id in list(self._watches):
            self.unwatch(task_id)

    async def _watch_files(
        self, task_id: str, folder: Path | None, roots: list[Path], stop: asyncio.Event
    ) -> None:
        from watchfiles import Change, awatch

        names = {Change.added: "added", Change.modified: "modified", Change.deleted: "deleted"}
        try:
            async for changes in awatch(
                *roots,
                recursive=True,
                step=200,
                debounce=400,
                rust_timeout=1000,
                stop_event=stop,
            ):
                for kind, p in changes:
                    for root in roots:
                        rel = relative_beneath(root, p)
                        if rel is None:
                            continue
                        label = rel if root == folder else f"outputs/{rel}"
                        self.note_change(label, names.get(kind, "modified"), task_id=task_id)
                        break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a watcher failure must not take the window down
            log.warning("file watcher stopped: %s", exc)

    def note_change(self, rel: str, status: str, *, task_id: str | None = None) -> None:
        rel = sanitize(rel, limit=300, keep_newlines=False)
        changes = self._changes.setdefault(task_id or self.task_id or "", {})
        if rel not in changes and len(changes) >= MAX_FILES:
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
                    self.preview_text.setPlainText(f"cannot preview {rel}: {exc.strerror or exc}")
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
        if self.root is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.root)))

    # ------------------------------------------------------------ checkpoints
    def on_changes_event(self, data: dict[str, object], *, task_id: str | None = None) -> None:
        """The runner's ``changes`` event after a turn: note its files, reload the turns."""
        task_id = task_id or self.task_id
        files = data.get("files")
        for f in files if isinstance(files, list) else []:
            if isinstance(f, dict) and isinstance(f.get("path"), str):
                self.note_change(f["path"], str(f.get("status") or "modified"), task_id=task_id)
        if task_id == self.task_id:
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
        for tc in result.turns:
            for f in tc.files:
                self.note_change(f.path, f.status, task_id=self.task_id)
        keep = self._selected()
        self.turn_changes, self.undone = result.turns, result.undone
        turns = result.turns
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
        self._preview_gen += 1  # a file preview still being read must not replace the diff
        self.diff_view.setPlainText(diff_text(files, self.task_id, turn))
        what = sanitize(path, limit=120, keep_newlines=False) if path else "all files"
        self.preview_title.setText(f"Diff — turn {turn}, {what}")
        self.preview.setCurrentWidget(self.diff_view)

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
            self.note_change(p, "modified", task_id=task_id)
        for p in result.removed:
            self.note_change(p, "deleted", task_id=task_id)
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
