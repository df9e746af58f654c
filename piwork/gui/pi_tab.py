"""Settings → pi: whether pi loads the folder's own setup (project trust), and the MCP
servers it connects to; the same settings as ``piwork trust`` and ``piwork mcp``
(settings.json → pi, piwork.pisettings). Every change saves itself at once."""

from __future__ import annotations

from pydantic import ValidationError
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from piwork.config import Paths
from piwork.gui.text import sanitize
from piwork.pisettings import McpServer, PiSettings, load_pi_settings, save_pi_settings
from piwork.settings import SettingsError

EXPOSURES = ("codemode", "direct", "deferred", "hidden")


class PiTab(QWidget):
    def __init__(self, paths: Paths) -> None:
        super().__init__()
        self.paths = paths
        lay = QVBoxLayout(self)
        self.trust = QCheckBox(
            "Load the folder's own pi setup: AGENTS.md / CLAUDE.md, .pi settings and "
            "mcp.json, skills, prompt templates and extensions"
        )
        self.trust.setObjectName("piTrust")
        self.trust.setToolTip(
            "They run in the VM, like the agent. Each task says what was loaded. "
            "Off: nothing from the folder loads, AGENTS.md included."
        )
        self.trust.toggled.connect(self._trust_changed)
        lay.addWidget(self.trust)
        intro = QLabel(
            "MCP servers: a command runs in the VM, in the task's environment; a URL is "
            "reached through the network policy (its host is asked like any other). Keys "
            "never go into the VM, so a header that would carry one is refused."
        )
        intro.setWordWrap(True)
        lay.addWidget(intro)
        self.servers = QListWidget()
        self.servers.setObjectName("mcpServers")
        lay.addWidget(self.servers, 1)
        form = QFormLayout()
        self.name = QLineEdit()
        self.name.setPlaceholderText("docs")
        self.where = QLineEdit()
        self.where.setPlaceholderText("https://example.com/mcp   or   npx -y some-mcp-server .")
        self.exposure = QComboBox()
        self.exposure.addItems(EXPOSURES)
        form.addRow("Name", self.name)
        form.addRow("URL or command", self.where)
        form.addRow("Tools reached through", self.exposure)
        lay.addLayout(form)
        row = QHBoxLayout()
        self.add_btn = QPushButton("Add")
        self.add_btn.clicked.connect(self.add_server)
        self.rm_btn = QPushButton("Remove")
        self.rm_btn.clicked.connect(self.remove_server)
        row.addWidget(self.add_btn)
        row.addWidget(self.rm_btn)
        row.addStretch(1)
        lay.addLayout(row)
        self.status = QLabel("")
        self.status.setObjectName("piStatus")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        self.refresh()

    def _load(self) -> PiSettings | None:
        try:
            return load_pi_settings(self.paths.settings_file)
        except SettingsError as exc:
            self.status.setText(sanitize(str(exc)))
            return None

    def refresh(self) -> None:
        settings = self._load()
        if settings is None:
            return
        self.trust.blockSignals(True)
        self.trust.setChecked(settings.trust_project)
        self.trust.blockSignals(False)
        self.servers.clear()
        for name, s in settings.mcp_servers.items():
            where = s.url or " ".join([s.command or "", *s.args])
            self.servers.addItem(sanitize(f"{name}  {where}  ({s.exposure or 'codemode'})"))

    def _save(self, settings: PiSettings, said: str) -> None:
        save_pi_settings(settings, self.paths.settings_file)
        self.status.setText(said)
        self.refresh()

    def _trust_changed(self, on: bool) -> None:
        settings = self._load()
        if settings is not None:
            said = "the folder's setup loads" if on else "nothing from the folder loads"
            self._save(settings.model_copy(update={"trust_project": on}), f"Saved: {said}.")

    def add_server(self) -> None:
        settings = self._load()
        if settings is None:
            return
        name, where = self.name.text().strip(), self.where.text().strip()
        words = where.split()
        is_url = where.startswith(("http://", "https://"))
        try:
            server = McpServer(
                url=where if is_url else None,
                command=words[0] if words and not is_url else None,
                args=words[1:] if not is_url else [],
                exposure=self.exposure.currentText(),  # type: ignore[arg-type]
            )
            servers = {**settings.mcp_servers, name: server}
            updated = PiSettings(trust_project=settings.trust_project, mcp_servers=servers)
        except (ValidationError, ValueError) as exc:
            msgs = exc.errors() if isinstance(exc, ValidationError) else [{"msg": str(exc)}]
            why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in msgs[:2])
            self.status.setText(sanitize(f"Not added: {why}"))
            return
        self.name.clear()
        self.where.clear()
        self._save(updated, f"Added MCP server {name}.")

    def remove_server(self) -> None:
        settings = self._load()
        row = self.servers.currentRow()
        if settings is None or row < 0:
            return
        name = list(settings.mcp_servers)[row]
        servers = {k: v for k, v in settings.mcp_servers.items() if k != name}
        self._save(settings.model_copy(update={"mcp_servers": servers}), f"Removed {name}.")
