"""The new-task page: a first run that shows the product, then "Connect a model".

Why a page and not a dialog: the first thing a person should see is piwork doing
its job on their screen (a VM, a permission prompt, a change they can undo), not
a form. The demo needs no key and no network; its new file comes in unasked and
its one move of a file of the folder asks first (see ``piwork.models.demo``).
Step 2 lists every provider with whether a key is stored, so "what do I do next"
has an answer on the same page.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QLabel, QPushButton, QVBoxLayout, QWidget

from piwork.auth import KeyStore
from piwork.config import Paths
from piwork.gui.text import sanitize
from piwork.gui.widgets import plain_label
from piwork.models.providers import PROVIDERS_FILE_NAME, load_providers

DEMO_PROMPT = "Show me what piwork does with this folder."
DEMO_FILES = {
    "README.md": "# Demo project\n\nA small folder for piwork's offline demo to look at.\n",
    "notes.txt": "buy milk\nship piwork\n",
}


def demo_folder(base: Path | None = None) -> Path:
    """A folder made for the demo (never one of the person's own): ``piwork-demo`` in
    their Documents. Not under piwork's data: a working folder there is refused (it
    would expose every task's transcript to the agent)."""
    if base is None:
        import platformdirs

        base = Path(platformdirs.user_documents_dir()) / "piwork-demo"
    folder = base
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in DEMO_FILES.items():
        if not (folder / name).exists():
            (folder / name).write_text(text)
    return folder


def key_status(paths: Paths) -> list[tuple[str, str]]:
    """``(provider, status)`` for every provider that needs a key, in catalogue order."""
    try:
        catalog = load_providers(paths.config / PROVIDERS_FILE_NAME)
    except Exception as exc:
        return [("providers.json", f"cannot be read: {sanitize(exc, limit=200)}")]
    store = KeyStore(paths=paths)
    out: list[tuple[str, str]] = []
    for p in catalog.values():
        if p.name == "piwork-demo":
            continue
        if p.auth == "none" or not p.key_required:
            out.append((p.name, "no key needed"))
            continue
        try:
            where = store.where(p.credential_name)
        except Exception:
            where = None
        out.append((p.name, "key stored" if where is not None else "no key yet"))
    return out


class WelcomePage(QWidget):
    """Step 1: run the offline demo. Step 2: connect a real model (key status)."""

    run_demo = Signal()
    open_settings = Signal()

    def __init__(self, paths: Paths) -> None:
        super().__init__()
        self.paths = paths
        self.setObjectName("welcome")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(40, 30, 40, 30)
        lay.setSpacing(14)
        title = plain_label("Give piwork a task: describe it below and press Enter.")
        title.setObjectName("welcomeTitle")
        title.setWordWrap(True)
        lay.addWidget(title)
        step1 = QFrame()
        step1.setObjectName("welcomeStep")
        s1 = QVBoxLayout(step1)
        s1.addWidget(self._bold("1. See it work (offline, no key)"))
        s1.addWidget(
            self._text(
                "The demo model is a script, not a real model. In a VM it looks at a small "
                "folder piwork made for it, writes a summary there and renames notes.txt. "
                "piwork brings the new file in, asks you once before the rename (a move of "
                "your file), and shows the changes under “Files changed”, where you can "
                "undo them."
            )
        )
        self.demo_btn = QPushButton("Run the demo")
        self.demo_btn.clicked.connect(self.run_demo.emit)
        s1.addWidget(self.demo_btn, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(step1)
        step2 = QFrame()
        step2.setObjectName("welcomeStep")
        s2 = QVBoxLayout(step2)
        s2.addWidget(self._bold("2. Connect a model"))
        s2.addWidget(
            self._text(
                "For real work, store a provider's key in Settings → Models (it stays on "
                "this computer; the VM never sees it), then pick the model below."
            )
        )
        self.keys = self._text("")
        self.keys.setObjectName("keyStatus")
        s2.addWidget(self.keys)
        settings = QPushButton("Open Settings…")
        settings.clicked.connect(self.open_settings.emit)
        s2.addWidget(settings, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(step2)
        hint = self._text("Ctrl+N new task · Ctrl+1..9 switch tasks · Esc stops a running task")
        hint.setObjectName("welcomeHint")
        lay.addWidget(hint)
        lay.addStretch(1)
        self.refresh()

    @staticmethod
    def _bold(text: str) -> QLabel:
        label = plain_label(text)
        label.setObjectName("welcomeStepTitle")
        return label

    @staticmethod
    def _text(text: str) -> QLabel:
        label = plain_label(text)
        label.setWordWrap(True)
        return label

    def refresh(self) -> None:
        rows = key_status(self.paths)
        self.keys.setText(
            "\n".join(f"• {name}: {status}" for name, status in rows) or "No providers configured."
        )
