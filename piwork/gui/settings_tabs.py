"""Settings → Packs (the runtime packs in the cache: build, verify, remove unused) and
Settings → Environments (each folder's saved environment: what its tasks installed, its
layers and sizes; reset and remove ask first, as ``piwork env reset|rm``)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QMessageBox,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from piwork.config import Paths
from piwork.gui.asking import ask
from piwork.gui.controller import spawn
from piwork.gui.text import sanitize
from piwork.gui.widgets import plain_label, plain_tip


def _row(cells: list[str]) -> QTreeWidgetItem:
    """A tree row whose cells are whole in their tooltips (a long one ends in "…")."""
    item = QTreeWidgetItem(cells)
    for col, text in enumerate(cells):
        item.setToolTip(col, plain_tip(text))
    return item


class EnvsTab(QWidget):
    def __init__(self, paths: Paths) -> None:
        super().__init__()
        self.paths = paths
        lay = QVBoxLayout(self)
        intro = plain_label(
            "What tasks install (apt, pip, npm) is kept per working folder: a new task on a "
            "folder starts from what the folder's last task left. Reset makes the next task "
            "start clean; tasks already made keep their own disks."
        )
        intro.setWordWrap(True)
        lay.addWidget(intro)
        self.envs = QTreeWidget()
        self.envs.setObjectName("envTree")
        self.envs.setColumnCount(3)
        self.envs.setHeaderLabels(["Folder / layer", "Size", "Details"])
        self.envs.setRootIsDecorated(True)
        self.envs.itemSelectionChanged.connect(self._env_selected)
        lay.addWidget(self.envs, 1)
        row = QHBoxLayout()
        self.env_reset_btn = QPushButton("Reset…")
        self.env_reset_btn.setToolTip("The folder's next task starts from the clean workbench")
        self.env_reset_btn.clicked.connect(lambda: self.ask_env("reset"))
        self.env_rm_btn = QPushButton("Remove…")
        self.env_rm_btn.setToolTip("Forget the folder's environment")
        self.env_rm_btn.clicked.connect(lambda: self.ask_env("rm"))
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.refresh_envs)
        for b in (self.env_reset_btn, self.env_rm_btn, refresh):
            row.addWidget(b)
        row.addStretch(1)
        lay.addLayout(row)
        self.env_status = plain_label()
        self.env_status.setObjectName("envStatus")
        self.env_status.setWordWrap(True)
        lay.addWidget(self.env_status)
        self.env_box: QMessageBox | None = None
        self.refresh_envs()

    def refresh_envs(self) -> None:
        from piwork.gui.envs import folder_envs, mb, task_words
        from piwork.gui.words import task_titles

        self.envs.clear()
        titles = task_titles(self.paths)
        try:
            infos = folder_envs(self.paths)
        except Exception as exc:  # a broken store is said, never a crashed dialog
            infos = []
            self.env_status.setText(f"cannot read the environments: {sanitize(exc, limit=400)}")
        self._env_folders: list[Path] = []
        for info in infos:
            top = _row(
                [sanitize(str(info.folder), limit=400), mb(info.bytes), info.next_start(titles)]
            )
            top.setData(0, Qt.ItemDataRole.UserRole, str(info.folder))
            if info.last_task:
                top.addChild(
                    _row(
                        [
                            f"what {task_words(info.last_task, titles)} installed",
                            mb(info.last_task_bytes),
                            "frozen into a layer when the next task starts",
                        ]
                    )
                )
            for la in info.layers:
                top.addChild(_row(["saved earlier", mb(la.bytes), la.line(titles)]))
            self.envs.addTopLevelItem(top)
            top.setExpanded(True)
            self._env_folders.append(info.folder)
        # Sizes and names fit; the details column takes the rest of the width and a long
        # line ends in "…", whole in its tooltip (no sideways scrolling to read a row).
        for col in (0, 1):
            self.envs.resizeColumnToContents(col)
        self.envs.setColumnWidth(0, min(self.envs.columnWidth(0), 360))
        if not infos and not self.env_status.text():
            self.env_status.setText(
                "No saved environments yet: a task on a folder saves what it installs."
            )
        self._env_selected()

    def selected_env_folder(self) -> Path | None:
        item = self.envs.currentItem()
        while item is not None and item.parent() is not None:
            item = item.parent()
        data = item.data(0, Qt.ItemDataRole.UserRole) if item is not None else None
        return Path(data) if isinstance(data, str) else None

    def _env_selected(self) -> None:
        chosen = self.selected_env_folder() is not None
        self.env_reset_btn.setEnabled(chosen)
        self.env_rm_btn.setEnabled(chosen)

    def ask_env(self, what: str) -> None:
        """Reset or remove the selected folder's environment, after asking (Cancel is the
        default: Enter never deletes)."""
        from piwork.gui.envs import folder_env, mb

        folder = self.selected_env_folder()
        if folder is None:
            return
        info = folder_env(self.paths, folder)
        size = f" ({mb(info.bytes)})" if info is not None else ""
        shown = sanitize(str(folder), limit=400)
        box = QMessageBox(self)
        box.setTextFormat(Qt.TextFormat.PlainText)  # guest paths and links: never rich text
        box.setIcon(QMessageBox.Icon.Warning)
        if what == "reset":
            box.setWindowTitle("Reset the environment?")
            box.setText(f"Reset the environment of {shown}{size}?")
            box.setInformativeText(
                "The folder's next task starts from the clean workbench: nothing its tasks "
                "installed. Tasks already made keep their own disks; saved layers no task "
                "uses any more are deleted."
            )
            label = "Reset"
        else:
            box.setWindowTitle("Remove the environment?")
            box.setText(f"Forget the environment of {shown}{size}?")
            box.setInformativeText(
                "The folder leaves this list and its next task starts clean. Tasks already "
                "made keep their own disks; saved layers no task uses any more are deleted."
            )
            label = "Remove"
        go = box.addButton(label, QMessageBox.ButtonRole.DestructiveRole)
        cancel = box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(cancel)
        self.env_box = box

        def answered(_r: int) -> None:
            if box.clickedButton() is go:
                self._apply_env(what, folder)

        box.finished.connect(answered)
        box.open()

    def _apply_env(self, what: str, folder: Path) -> None:
        from piwork.env import EnvError, store_for

        store = store_for(self.paths)
        try:
            done = store.reset(folder) if what == "reset" else store.rm(folder)
        except (EnvError, OSError) as exc:
            self.env_status.setText(f"could not {what}: {sanitize(exc, limit=400)}")
            return
        shown = sanitize(str(folder), limit=400)
        if not done:
            self.env_status.setText(f"{shown} has no saved environment (any more).")
        elif what == "reset":
            self.env_status.setText(f"{shown}: the next task starts from the clean workbench.")
        else:
            self.env_status.setText(f"{shown}: environment forgotten.")
        self.refresh_envs()


class PacksTab(QWidget):
    def __init__(self) -> None:
        super().__init__()
        lay = QVBoxLayout(self)
        self.packs = QListWidget()
        lay.addWidget(self.packs, 1)
        row = QHBoxLayout()
        for label, fn in (
            ("Build", self._build_pack),
            ("Verify", self._verify_pack),
            ("Remove unused…", self._remove_unused),
        ):
            b = QPushButton(label)
            b.clicked.connect(fn)
            row.addWidget(b)
        row.addStretch(1)
        lay.addLayout(row)
        self.pack_status = plain_label()
        self.pack_status.setWordWrap(True)
        lay.addWidget(self.pack_status)
        self.remove_box: QMessageBox | None = None
        self._fill_packs()

    def _fill_packs(self) -> None:
        from piwork.pack import find_pack, list_packs

        self.packs.clear()
        try:
            current = find_pack()
            self._pack_infos = list_packs()
        except Exception as exc:
            self.pack_status.setText(sanitize(exc, limit=500))
            self._pack_infos = []
            current = None
        self._current_pack = current
        for p in self._pack_infos:
            mark = "● current" if current is not None and p.path == current else ""
            ok = "complete" if p.complete else f"incomplete {p.error}"
            self.packs.addItem(f"{p.pack_id[:16]}  {p.size / 1e6:.0f} MB  {ok}  {mark}")

    def _build_pack(self) -> None:
        from piwork.pack import ensure_pack

        self.pack_status.setText("building the pack…")

        async def go() -> None:
            try:
                await asyncio.to_thread(ensure_pack, log=lambda m: print(f"pack: {m}", flush=True))
                self.pack_status.setText("pack ready")
            except Exception as exc:
                self.pack_status.setText(f"build failed: {sanitize(exc, limit=800)}")
            self._fill_packs()

        spawn(go())

    def _verify_pack(self) -> None:
        from piwork.pack import verify

        if self._current_pack is None:
            self.pack_status.setText("no pack for this source tree: Build one")
            return
        res = verify(self._current_pack)
        self.pack_status.setText(
            "pack verified" if res.ok else "problems: " + "; ".join(res.problems()[:5])
        )

    def _remove_unused(self) -> None:
        unused = [
            p
            for p in self._pack_infos
            if self._current_pack is None or p.path != self._current_pack
        ]
        if not unused:
            self.pack_status.setText("No unused packs: only the current one is here.")
            return
        n = len(unused)
        # Asked without a nested event loop (QMessageBox.question blocked the app's
        # asyncio tasks while it was open); Cancel is the default.
        self.remove_box = ask(
            self,
            "Remove unused packs?",
            f"Remove {'the 1 pack' if n == 1 else f'{n} packs'} not built from this "
            "piwork's sources? Another piwork install sharing this cache rebuilds its "
            "pack when it next runs.",
            "Remove",
            lambda: self._remove(unused),
        )

    def _remove(self, unused: list[Any]) -> None:
        gone = 0
        for p in unused:
            shutil.rmtree(p.path, ignore_errors=True)
            gone += 1
        self.pack_status.setText(f"Removed {gone} unused pack{'' if gone == 1 else 's'}.")
        self._fill_packs()
