"""Settings → Network: the upstream proxy, extra CAs, package mirrors, private addresses.

The same settings and wording as ``piwork network`` (piwork.net): every edit is
saved at once; the proxy password goes to the keyring and is never shown again;
a CA file is read for its certificates only. "Check the registries" resolves the
package registries here (in a thread) and says which the sandbox refuses and
why, with the one button that allows them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from piwork.auth import KeyStore
from piwork.config import Paths
from piwork.gui.controller import spawn
from piwork.gui.text import sanitize
from piwork.net import cas as netcas
from piwork.net import config as netconfig
from piwork.net.mirrors import KINDS, mirrors_for, set_mirror
from piwork.net.private import allow_private, registry_hosts
from piwork.net.status import NetworkStatus, network_status
from piwork.net.upstream import key_name, parse_proxy_url


class NetworkTab(QWidget):
    def __init__(self, paths: Paths, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.paths = paths
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea()  # the Settings dialog is shorter than this tab
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        outer.addWidget(scroll)
        inner = QWidget()
        scroll.setWidget(inner)
        lay = QVBoxLayout(inner)

        proxy = QGroupBox("Upstream proxy (the model gateway and the egress proxy go through it)")
        form = QFormLayout(proxy)
        self.proxy_url = QLineEdit()
        self.proxy_url.setObjectName("proxyUrl")
        self.proxy_url.setPlaceholderText("http://USER@proxy.example.com:3128  or  socks5h://…")
        self.no_proxy = QLineEdit()
        self.no_proxy.setPlaceholderText("intranet.example.com, 10.0.0.0/8 (reached directly)")
        self.proxy_password = QLineEdit()
        self.proxy_password.setEchoMode(QLineEdit.EchoMode.Password)
        self.proxy_password.setPlaceholderText(
            "stored in the keyring, never shown or sent to the VM"
        )
        row = QHBoxLayout()
        save = QPushButton("Save proxy")
        save.clicked.connect(self.save_proxy)
        clear = QPushButton("Clear")
        clear.clicked.connect(self.clear_proxy)
        self.use_system = QCheckBox("With none set, use HTTPS_PROXY / the system's settings")
        self.use_system.toggled.connect(self._use_system_changed)
        row.addWidget(self.use_system, 1)
        row.addWidget(clear)
        row.addWidget(save)
        form.addRow("Proxy URL", self.proxy_url)
        form.addRow("No proxy for", self.no_proxy)
        form.addRow("Password", self.proxy_password)
        form.addRow(row)
        lay.addWidget(proxy)

        cas = QGroupBox("Certificate authorities (trusted by the gateway, installed in the VM)")
        cas_lay = QVBoxLayout(cas)
        self.ca_list = QListWidget()
        self.ca_list.setObjectName("caList")
        self.ca_list.setMaximumHeight(110)
        cas_lay.addWidget(self.ca_list)
        row = QHBoxLayout()
        self.use_host_cas = QCheckBox("Use this computer's extra CAs")
        self.use_host_cas.toggled.connect(self._use_host_cas_changed)
        add = QPushButton("Add CA…")
        add.clicked.connect(self._pick_ca)
        self.remove_ca = QPushButton("Remove")
        self.remove_ca.clicked.connect(self._remove_ca)
        row.addWidget(self.use_host_cas, 1)
        row.addWidget(add)
        row.addWidget(self.remove_ca)
        cas_lay.addLayout(row)
        lay.addWidget(cas)

        mirrors = QGroupBox("Package mirrors (pip, npm, apt in the VM)")
        m_form = QFormLayout(mirrors)
        self.mirror_folder = QLineEdit()
        self.mirror_folder.setPlaceholderText("empty: every task; or a folder's path")
        self.mirror_folder.editingFinished.connect(self._fill_mirrors)
        m_form.addRow("For", self.mirror_folder)
        self.mirror_fields: dict[str, QLineEdit] = {}
        for kind, hint in KINDS.items():
            field = QLineEdit()
            field.setPlaceholderText(hint)
            self.mirror_fields[kind] = field
            m_form.addRow({"pypi": "PyPI", "npm": "npm", "debian": "Debian"}[kind], field)
        save_m = QPushButton("Save mirrors")
        save_m.clicked.connect(self.save_mirrors)
        m_form.addRow(save_m)
        lay.addWidget(mirrors)

        private = QGroupBox("Private addresses and the package registries")
        p_lay = QVBoxLayout(private)
        self.status_text = QPlainTextEdit()
        self.status_text.setObjectName("networkStatus")
        self.status_text.setReadOnly(True)
        self.status_text.setMaximumHeight(150)
        p_lay.addWidget(self.status_text)
        row = QHBoxLayout()
        check = QPushButton("Check the registries")
        check.clicked.connect(lambda: spawn(self.lookup()))
        self.allow_registries = QPushButton("Allow the registries at private addresses")
        self.allow_registries.setObjectName("allowPrivateRegistries")
        self.allow_registries.clicked.connect(self.allow_private_registries)
        row.addWidget(check)
        row.addStretch(1)
        row.addWidget(self.allow_registries)
        p_lay.addLayout(row)
        lay.addWidget(private)

        self.message = QLabel()
        self.message.setObjectName("networkMessage")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.message)
        self.refresh()

    # ------------------------------------------------------------ reading
    def refresh(self, status: NetworkStatus | None = None) -> None:
        """Show the settings (``status``: with registry lookups already made)."""
        settings = self._settings()
        status = status or network_status(self.paths, lookup=False)
        self.proxy_url.setText(settings.proxy.url or "")
        self.no_proxy.setText(settings.proxy.no_proxy)
        for box, value in ((self.use_system, settings.proxy.use_system),
                           (self.use_host_cas, settings.cas.use_host_cas)):  # fmt: skip
            box.blockSignals(True)
            box.setChecked(value)
            box.blockSignals(False)
        added = set(status.added_cas)
        self.ca_list.clear()
        for cert in status.cas:
            item = QListWidgetItem(sanitize(cert.describe(), limit=300))
            name = cert.source.removeprefix("added: ")
            item.setData(Qt.ItemDataRole.UserRole, name if name in added else None)
            self.ca_list.addItem(item)
        if not status.cas:
            self.ca_list.addItem("none: the public CAs only")
        self._fill_mirrors()
        self.status_text.setPlainText(
            "\n".join(sanitize(line, limit=400) for line in status.lines())
        )
        refused = status.refused_registries
        self.allow_registries.setEnabled(bool(refused) or not status.registries)

    def _settings(self) -> netconfig.NetworkSettings:
        try:
            return netconfig.load(self.paths)
        except Exception as exc:
            self._say(str(exc))
            return netconfig.NetworkSettings()

    def _folder(self) -> Path | None:
        text = self.mirror_folder.text().strip()
        return Path(text).expanduser() if text else None

    def _fill_mirrors(self) -> None:
        try:
            mirrors = mirrors_for(self.paths, self._folder())
        except Exception as exc:
            self._say(str(exc))
            return
        for kind, field in self.mirror_fields.items():
            field.setText(getattr(mirrors, kind) or "")

    async def lookup(self) -> None:
        """Resolve the registries off the GUI thread, then show what they mean."""
        self.status_text.setPlainText("looking up the package registries…")
        status = await asyncio.to_thread(network_status, self.paths, None)
        self.refresh(status)

    # ------------------------------------------------------------ editing
    def _say(self, text: str) -> None:
        self.message.setText(sanitize(text, limit=600))

    def _attempt(self, action: str, fn: object) -> bool:
        try:
            fn()  # type: ignore[operator]
        except Exception as exc:
            self._say(f"{action}: {exc}")
            return False
        return True

    def save_proxy(self) -> None:
        url = self.proxy_url.text().strip()
        password = self.proxy_password.text()

        def save() -> None:
            settings = netconfig.load(self.paths)
            if not url:
                settings.proxy.url = None
            else:
                proxy = parse_proxy_url(url)
                if proxy.password is not None:
                    raise ValueError("put the password in the Password field, not the URL")
                if password:
                    if not proxy.username:
                        raise ValueError("a password needs a user name: scheme://USER@host:port")
                    keys = KeyStore(paths=self.paths)
                    keys.ensure_writable()
                    keys.set(key_name(proxy.host, proxy.port), password)
                settings.proxy.url = proxy.url
            settings.proxy.no_proxy = self.no_proxy.text().strip()
            netconfig.save(self.paths, settings)

        if self._attempt("proxy not saved", save):
            self.proxy_password.clear()
            self._say("proxy saved: the next task goes through it" if url else "proxy cleared")
            self.refresh()

    def clear_proxy(self) -> None:
        self.proxy_url.clear()
        self.save_proxy()

    def _use_system_changed(self, on: bool) -> None:
        self._toggle(lambda s: setattr(s.proxy, "use_system", on))

    def _use_host_cas_changed(self, on: bool) -> None:
        self._toggle(lambda s: setattr(s.cas, "use_host_cas", on))

    def _toggle(self, change: Callable[[netconfig.NetworkSettings], object]) -> None:
        if self._attempt("not saved", lambda: netconfig.update(self.paths, change)):
            self.refresh()

    def _pick_ca(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "A CA certificate (PEM or DER)",
            "",
            "Certificates (*.pem *.crt *.cer *.der);;All (*)",
        )
        if path:
            self.add_ca_file(Path(path))

    def add_ca_file(self, path: Path) -> None:
        try:
            name, certs, notes = netcas.add_ca(self.paths, path)
        except Exception as exc:
            self._say(f"not added: {exc}")
            return
        self._say(f"added {name}: {len(certs)} certificate(s)" + "".join(f"; {n}" for n in notes))
        self.refresh()

    def _remove_ca(self) -> None:
        item = self.ca_list.currentItem()
        name = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        if not name:
            self._say("pick a CA you added (this computer's own are turned off with the box)")
            return
        netcas.remove_ca(self.paths, str(name))
        self._say(f"removed {name}")
        self.refresh()

    def save_mirrors(self) -> None:
        folder = self._folder()

        def save() -> None:
            if folder is not None and not folder.is_dir():
                raise ValueError(f"{folder} is not a folder")
            for kind, field in self.mirror_fields.items():
                set_mirror(self.paths, kind, field.text().strip() or None, folder)

        if self._attempt("mirrors not saved", save):
            self._say("mirrors saved " + (f"for tasks on {folder}" if folder else "for every task"))
            self.refresh()

    def allow_private_registries(self) -> None:
        def allow() -> None:
            rules = allow_private(self.paths, registry_hosts(self.paths, None))
            self._say(
                "the sandbox may reach the package registries at private addresses: "
                + ", ".join(r.pattern or "" for r in rules)
            )

        if self._attempt("not allowed", allow):
            spawn(self.lookup())


__all__ = ["NetworkTab"]
