"""First run: what is missing (the same checks as ``piwork doctor``), and a pack build."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from piwork.config import Paths
from piwork.doctor import Check, run_checks
from piwork.gui.controller import spawn
from piwork.gui.text import sanitize


def blocking(checks: list[Check]) -> list[Check]:
    """Checks that stop tasks from running (warnings do not)."""
    return [c for c in checks if not c.ok and not c.warning]


class SetupScreen(QDialog):
    """Lists each check with what fixes it; builds the pack with a progress bar."""

    def __init__(
        self,
        paths: Paths,
        parent: QWidget | None = None,
        *,
        checks: Callable[[Paths], list[Check]] = run_checks,
    ) -> None:
        super().__init__(parent)
        self.paths = paths
        self._checks = checks
        self.setWindowTitle("Set up piwork")
        self.resize(760, 520)
        lay = QVBoxLayout(self)
        head = QLabel(
            "<h2>Welcome to piwork</h2>"
            "The agent runs inside a small virtual machine. These pieces are needed:"
        )
        head.setTextFormat(Qt.TextFormat.RichText)  # our own words, no guest text
        head.setWordWrap(True)
        lay.addWidget(head)
        self.list = QListWidget()
        self.list.setObjectName("setupChecks")
        self.list.setWordWrap(True)
        lay.addWidget(self.list, 1)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setValue(0)
        self.progress.setFormat("runtime pack: not built")
        lay.addWidget(self.progress)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumHeight(110)
        self.log.setPlaceholderText("The pack build's progress appears here.")
        lay.addWidget(self.log)
        row = QHBoxLayout()
        self.recheck = QPushButton("Check again")
        self.recheck.clicked.connect(self.refresh)
        self.build = QPushButton("Build the runtime pack")
        self.build.clicked.connect(self.start_build)
        self.go = QPushButton("Continue")
        self.go.clicked.connect(self.accept)
        row.addWidget(self.recheck)
        row.addStretch(1)
        row.addWidget(self.build)
        row.addWidget(self.go)
        lay.addLayout(row)
        self.refresh()

    def refresh(self) -> None:
        self.list.clear()
        results = self._checks(self.paths)
        self.results = results
        for c in results:
            mark = "✓" if c.ok and not c.warning else ("!" if c.ok else "✗")
            detail = sanitize(c.detail, limit=300)
            if c.ok:
                # Working pieces in a few words; the technical why (CPU flags, paths) is
                # in the tooltip, for whoever wants it.
                short = detail.split(" (", 1)[0]
                if c.name == "accelerator" and short.startswith("tcg"):
                    short = "software emulation: works, tasks start and run slower"
                text = f"{mark}  {c.name}: {short}"
            else:
                text = f"{mark}  {c.name}: {detail}"
            if c.fix and (not c.ok or c.warning):
                text += f"\n     fix: {sanitize(c.fix, limit=300)}"
            it = QListWidgetItem(text)
            it.setToolTip(detail)
            it.setForeground(
                Qt.GlobalColor.darkGreen
                if c.ok and not c.warning
                else (Qt.GlobalColor.darkYellow if c.ok else Qt.GlobalColor.darkRed)
            )
            self.list.addItem(it)
        missing = blocking(results)
        pack_missing = any(c.name == "runtime pack" and not c.ok for c in results)
        self.build.setEnabled(pack_missing)
        if not pack_missing:
            self.progress.setValue(100)
            self.progress.setFormat("runtime pack: ready")
        self.go.setEnabled(not missing)
        self.go.setToolTip("" if not missing else "fix the items marked ✗ first")

    def start_build(self) -> None:
        from piwork.pack import ensure_pack

        self.build.setEnabled(False)
        self.progress.setRange(0, 0)  # busy: the builder reports steps, not a percentage
        self.progress.setFormat("building the runtime pack…")
        steps: list[str] = []

        def log(msg: str) -> None:
            # Called on the builder's thread: hand the line to the loop's thread.
            loop.call_soon_threadsafe(self._log_line, msg, steps)

        loop = asyncio.get_running_loop()

        async def go() -> None:
            try:
                await asyncio.to_thread(ensure_pack, log=log)
                self.progress.setRange(0, 100)
                self.progress.setValue(100)
                self.progress.setFormat("runtime pack: ready")
            except Exception as exc:
                self.progress.setRange(0, 100)
                self.progress.setValue(0)
                self.progress.setFormat("pack build failed")
                self.log.appendPlainText(f"failed: {sanitize(exc, limit=2000)}")
            self.refresh()

        self._build_job = spawn(go())

    def _log_line(self, msg: str, steps: list[str]) -> None:
        steps.append(msg)
        self.log.appendPlainText(sanitize(msg, limit=500))
        self.progress.setFormat(f"building the runtime pack… step {len(steps)}")
