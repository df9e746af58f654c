"""The right-hand panel: working folder, files changed (live), preview, usage, checkpoints.

Every host file access under the working folder or the task's outputs goes
through ``piwork.sharefs`` (one component at a time, ``O_NOFOLLOW``): the guest
can plant links there, and the panel must never follow one out of the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import logging
import stat
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QImage, QPixmap
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from piwork import sharefs
from piwork.gui.text import sanitize
from piwork.gui.widgets import file_kind

log = logging.getLogger(__name__)
MAX_PREVIEW = 512 * 1024
MAX_FILES = 500


def checkpoints_api() -> Any | None:
    """``piwork.checkpoints`` when it is installed (another branch builds it), else None."""
    try:
        import piwork.checkpoints as ck  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return ck


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
    def __init__(self) -> None:
        super().__init__()
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
        lay.addWidget(self.open_btn)
        lay.addWidget(QLabel("Files changed in this task"))
        self.files = QListWidget()
        self.files.setObjectName("changedFiles")
        self.files.currentItemChanged.connect(self._preview_item)
        lay.addWidget(self.files, 2)
        lay.addWidget(QLabel("Preview"))
        self.preview = QStackedWidget()
        self.preview_text = QTextBrowser()
        self.preview_text.setOpenLinks(False)
        self.preview_image = QLabel()
        self.preview_image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.preview_table = QTableWidget()
        for w in (self.preview_text, self.preview_image, self.preview_table):
            self.preview.addWidget(w)
        lay.addWidget(self.preview, 3)
        self.checkpoints = QLabel()
        self.checkpoints.setWordWrap(True)
        self.checkpoints.setObjectName("checkpoints")
        lay.addWidget(self.checkpoints)
        row = QHBoxLayout()
        self.undo_btn = QPushButton("Undo this turn")
        self.redo_btn = QPushButton("Undo the undo")
        self.undo_btn.clicked.connect(self._undo_turn)
        self.redo_btn.clicked.connect(self._undo_undo)
        row.addWidget(self.undo_btn)
        row.addWidget(self.redo_btn)
        lay.addLayout(row)
        self.usage = QLabel()
        self.usage.setObjectName("usage")
        lay.addWidget(self.usage)
        self.root: Path | None = None
        self.outputs: Path | None = None
        self.task_id: str | None = None
        self.changed: dict[str, str] = {}  # display name -> status
        self._watches: dict[str, tuple[asyncio.Future[None], asyncio.Event]] = {}
        self._changes: dict[str, dict[str, str]] = {}
        self._last_turn: int | None = None
        self._undo_checkpoint: str | None = None
        self._refresh_checkpoints()

    # ------------------------------------------------------------ task binding
    def show_task(self, task_id: str | None, folder: Path | None, outputs: Path | None) -> None:
        """Show ``task_id``'s folder and the changes recorded for it (watched while it runs)."""
        self.task_id, self.root, self.outputs = task_id, folder, outputs
        self.changed = self._changes.setdefault(task_id or "", {})
        self.files.clear()
        for rel, status in self.changed.items():
            self._add_item(rel, status)
        self.folder_label.setText(
            f"Working folder: {folder}" if folder else "Working folder: (none for this task)"
        )
        self.open_btn.setEnabled(folder is not None)
        self._refresh_checkpoints()

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

    def set_usage(self, tokens: int, cost: float, elapsed: float) -> None:
        m, s = divmod(int(elapsed), 60)
        self.usage.setText(f"Tokens {tokens:,}   Cost ${cost:.4f}   Elapsed {m}:{s:02d}")

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

    def preview_file(self, rel: str) -> None:
        where = self._resolve(rel)
        if where is None:
            return
        root, sub = where
        try:
            data = sharefs.read_beneath(root, sub, max_bytes=MAX_PREVIEW)
        except OSError as exc:
            self.preview_text.setPlainText(f"cannot preview {rel}: {exc.strerror or exc}")
            self.preview.setCurrentWidget(self.preview_text)
            return
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
            self.preview_text.setMarkdown(text)
            self.preview.setCurrentWidget(self.preview_text)
        else:  # text, and HTML shown as source (never rendered: it came from the agent)
            self.preview_text.setPlainText(text)
            self.preview.setCurrentWidget(self.preview_text)

    def _open_folder(self) -> None:
        if self.root is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.root)))

    # ------------------------------------------------------------ checkpoints
    def on_changes_event(self, data: dict[str, Any]) -> None:
        """A ``changes`` event (checkpoints branch): the turn's files, with their status."""
        turn = data.get("turn")
        self._last_turn = turn if isinstance(turn, int) else None
        for f in data.get("files") or []:
            if isinstance(f, dict) and isinstance(f.get("path"), str):
                self.note_change(f["path"], str(f.get("status") or "modified"))
        self._refresh_checkpoints()

    def _refresh_checkpoints(self) -> None:
        ck = checkpoints_api()
        if ck is None:
            self.checkpoints.setText("Checkpoints: not available in this build")
            self.undo_btn.setEnabled(False)
            self.redo_btn.setEnabled(False)
            return
        if self.task_id is None:
            self.checkpoints.setText("Checkpoints: no task")
            self.undo_btn.setEnabled(False)
            self.redo_btn.setEnabled(False)
            return
        try:
            changes = ck.task_changes(self.task_id, turn=self._last_turn)
        except Exception as exc:
            self.checkpoints.setText(f"Checkpoints: {sanitize(exc, limit=300)}")
            self.undo_btn.setEnabled(False)
            return
        lines = [f"{c.status[:1].upper()} {sanitize(c.path, limit=200)}" for c in changes[:30]]
        turn = f"turn {self._last_turn}" if self._last_turn is not None else "last turn"
        self.checkpoints.setText(f"Changes in {turn}:\n" + ("\n".join(lines) or "(none)"))
        self.undo_btn.setEnabled(bool(changes))
        self.redo_btn.setEnabled(self._undo_checkpoint is not None)

    def _undo_turn(self) -> None:
        ck = checkpoints_api()
        if ck is None or self.task_id is None:
            return
        try:
            res = ck.undo(self.task_id, turn=self._last_turn)
        except Exception as exc:  # UndoConflict / TaskRunning: say what blocks it
            conflicts = getattr(exc, "conflicts", None)
            msg = f"cannot undo: {type(exc).__name__}"
            if conflicts:
                msg += " (changed since: " + ", ".join(sanitize(c) for c in conflicts[:5]) + ")"
            self.checkpoints.setText(msg)
            return
        self._undo_checkpoint = res.checkpoint_before
        self._refresh_checkpoints()

    def _undo_undo(self) -> None:
        ck = checkpoints_api()
        if ck is None or self.task_id is None or self._undo_checkpoint is None:
            return
        with contextlib.suppress(Exception):
            ck.undo(self.task_id, to=self._undo_checkpoint)
            self._undo_checkpoint = None
        self._refresh_checkpoints()
