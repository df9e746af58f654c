"""Settings: models and keys, custom providers, policy rules and audit, limits and VM, packs,
the folders' saved environments.

Every edit applies and saves itself at once (there is no Save button to forget, and
Close never drops an edit): ``applied`` tells the window to use the new values now,
for tasks already running too (the task limit, keep-warm).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from piwork.auth import KeyStore
from piwork.config import Paths
from piwork.gui.asking import message_box
from piwork.gui.network_tab import NetworkTab
from piwork.gui.pi_tab import PiTab
from piwork.gui.policy_tab import PolicyTab
from piwork.gui.prefs import Prefs, model_choices
from piwork.gui.settings_tabs import EnvsTab, PacksTab
from piwork.gui.text import sanitize
from piwork.gui.widgets import plain_label, plain_labels
from piwork.models.custom import add_provider, remove_provider
from piwork.models.defaults import DEMO, set_default_model
from piwork.models.providers import (
    PROVIDERS_FILE_NAME,
    Provider,
    load_custom_providers,
    load_providers,
)


def _tab(tab: str, name: str) -> Any:
    return property(lambda self: getattr(getattr(self, tab), name))


class SettingsDialog(QDialog):
    applied = Signal()  # a limit or VM setting changed (and is saved)
    unarchived = Signal(str)  # a task id brought back from the archive

    def __init__(self, paths: Paths, prefs: Prefs, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.paths, self.prefs = paths, prefs
        self.setWindowTitle("piwork settings")
        self.resize(860, 560)
        lay = QVBoxLayout(self)
        self.tabs = QTabWidget()
        lay.addWidget(self.tabs)
        self.tabs.addTab(self._models_tab(), "Models")
        self.policy_tab = PolicyTab(paths)  # piwork.gui.policy_tab
        self.tabs.addTab(self.policy_tab, "Permissions")
        self.tabs.addTab(self._limits_tab(), "Limits and VM")
        self.packs_tab = PacksTab()
        self.tabs.addTab(self.packs_tab, "Packs")
        self.envs_tab = EnvsTab(paths)
        self.tabs.addTab(self.envs_tab, "Environments")
        self.tabs.addTab(self._hosts_tab(), "Remote hosts")
        self.tabs.addTab(PiTab(paths), "pi")  # project trust, MCP servers (piwork.gui.pi_tab)
        self.tabs.addTab(NetworkTab(paths), "Network")  # piwork.gui.network_tab (piwork.net)
        self.tabs.addTab(self._archive_tab(), "Archived")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        plain_labels(self)  # the form rows' labels too

    # The Permissions tab's parts, by name.
    rules = _tab("policy_tab", "rules")
    builtin = _tab("policy_tab", "builtin")
    audit = _tab("policy_tab", "audit")
    add_rule_dialog = _tab("policy_tab", "add_rule_dialog")
    add_rule = _tab("policy_tab", "add_rule")
    rule_texts = _tab("policy_tab", "rule_texts")
    refresh_policy = _tab("policy_tab", "refresh_policy")
    packs = _tab("packs_tab", "packs")
    pack_status = _tab("packs_tab", "pack_status")
    # The Environments tab's parts, by name.
    envs = _tab("envs_tab", "envs")
    env_box = _tab("envs_tab", "env_box")
    env_status = _tab("envs_tab", "env_status")
    env_reset_btn = _tab("envs_tab", "env_reset_btn")
    env_rm_btn = _tab("envs_tab", "env_rm_btn")
    refresh_envs = _tab("envs_tab", "refresh_envs")
    selected_env_folder = _tab("envs_tab", "selected_env_folder")
    ask_env = _tab("envs_tab", "ask_env")

    # ------------------------------------------------------------ models
    def _models_tab(self) -> QWidget:
        w = QWidget()
        form = QFormLayout(w)
        self.default_pick = QComboBox()
        self._fill_default()
        self.default_pick.currentIndexChanged.connect(self._default_changed)
        self.default_note = plain_label()
        form.addRow("Default model", self.default_pick)
        form.addRow("", self.default_note)
        self._update_default_note()
        # keys: written to the keyring, never read back into the window
        krow = QHBoxLayout()
        self.key_provider = QComboBox()
        for p in self._catalog().values():
            if p.auth != "none":
                self.key_provider.addItem(p.name, p.credential_name)
        self.key_field = QLineEdit()
        self.key_field.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_field.setPlaceholderText("paste a key (stored in the keyring, never shown)")
        save = QPushButton("Save key")
        save.clicked.connect(self._save_key)
        krow.addWidget(self.key_provider)
        krow.addWidget(self.key_field, 1)
        krow.addWidget(save)
        form.addRow("Provider key", krow)
        self.key_status = plain_label()
        form.addRow("", self.key_status)
        # custom providers
        self.custom_list = QListWidget()
        self._fill_custom()
        form.addRow("Custom providers", self.custom_list)
        crow = QHBoxLayout()
        self.c_name = QLineEdit()
        self.c_name.setPlaceholderText("name")
        self.c_url = QLineEdit()
        self.c_url.setPlaceholderText("http://localhost:11434/v1")
        self.c_models = QLineEdit()
        self.c_models.setPlaceholderText("model ids, comma separated")
        self.c_key = QCheckBox("needs a key")
        add = QPushButton("Add / update")
        add.clicked.connect(self._add_custom)
        rm = QPushButton("Remove")
        rm.clicked.connect(self._remove_custom)
        for x, stretch in (
            (self.c_name, 1),
            (self.c_url, 3),
            (self.c_models, 2),
            (self.c_key, 0),
            (add, 0),
            (rm, 0),
        ):
            crow.addWidget(x, stretch)
        form.addRow("", crow)
        self.custom_list.currentRowChanged.connect(self._custom_selected)
        return w

    def _catalog(self) -> dict[str, Provider]:
        try:
            return dict(load_providers(self.paths.config / PROVIDERS_FILE_NAME))
        except Exception:
            return {}

    def _fill_default(self) -> None:
        self.default_pick.blockSignals(True)
        self.default_pick.clear()
        for ref, label in model_choices(self.paths):
            self.default_pick.addItem(label, ref)
        i = self.default_pick.findData(self.prefs.default_model)
        self.default_pick.setCurrentIndex(max(0, i))
        self.default_pick.blockSignals(False)

    def _update_default_note(self) -> None:
        self.default_note.setText(
            "The demo is an offline script, not a real LLM: pick a real model once configured."
            if self.prefs.default_model == DEMO
            else "Used by new tasks here and by `piwork run` without --model."
        )

    def _default_changed(self) -> None:
        ref = self.default_pick.currentData()
        if ref:
            set_default_model(ref, self.paths.settings_file)
            self.prefs.default_model = ref
            self._update_default_note()

    def _save_key(self) -> None:
        value = self.key_field.text().strip()
        name = self.key_provider.currentData()
        self.key_field.clear()
        if not value or not name:
            return
        try:
            KeyStore(paths=self.paths).set(name, value)
        except Exception as exc:
            self.key_status.setText(f"not saved: {sanitize(exc, limit=300)}")
            return
        self.key_status.setText(f"key for {name} saved")

    def _fill_custom(self) -> None:
        self.custom_list.clear()
        try:
            self._custom = load_custom_providers(self.paths.config / PROVIDERS_FILE_NAME)
        except Exception as exc:
            self._custom = []
            self.custom_list.addItem(f"providers.json problem: {sanitize(exc, limit=300)}")
            return
        for p in self._custom:
            self.custom_list.addItem(f"{p.name}  {p.base_url}  {', '.join(p.model_ids())}")

    def _custom_selected(self, row: int) -> None:
        if 0 <= row < len(self._custom):
            p = self._custom[row]
            self.c_name.setText(p.name)
            self.c_url.setText(p.base_url)
            self.c_models.setText(", ".join(p.model_ids()))
            self.c_key.setChecked(p.key_required)

    def _add_custom(self) -> None:
        models = [m.strip() for m in self.c_models.text().split(",") if m.strip()]
        try:
            add_provider(
                self.c_name.text().strip(),
                self.c_url.text().strip(),
                models,
                key_required=self.c_key.isChecked(),
                path=self.paths.config / PROVIDERS_FILE_NAME,
            )
        except Exception as exc:
            box = message_box(self, "Provider not saved", sanitize(exc, limit=1500))
            box.setIcon(QMessageBox.Icon.Warning)
            box.open()
            self.provider_box = box
            return
        self._fill_custom()
        self._fill_default()

    def _remove_custom(self) -> None:
        name = self.c_name.text().strip()
        if name:
            remove_provider(name, path=self.paths.config / PROVIDERS_FILE_NAME)
            self._fill_custom()
            self._fill_default()

    # ------------------------------------------------------------ limits / VM
    def _limits_tab(self) -> QWidget:
        w = QWidget()
        form = QFormLayout(w)
        self.max_tasks = QSpinBox()
        self.max_tasks.setRange(1, 16)
        self.max_tasks.setValue(self.prefs.max_tasks)
        form.addRow("Tasks running at once (more wait “queued”)", self.max_tasks)
        self.memory = QSpinBox()
        self.memory.setRange(256, 65536)
        self.memory.setSingleStep(256)
        self.memory.setSuffix(" MB")
        self.memory.setValue(self.prefs.memory_mb)
        form.addRow("VM memory", self.memory)
        self.cpus = QSpinBox()
        self.cpus.setRange(1, 64)
        self.cpus.setValue(self.prefs.cpus)
        form.addRow("VM CPUs", self.cpus)
        self.accel = QComboBox()
        for label, val in (("best available", ""), ("KVM", "kvm"), ("HVF", "hvf"), ("TCG", "tcg")):
            self.accel.addItem(label, val)
        self.accel.setCurrentIndex(max(0, self.accel.findData(self.prefs.accel)))
        form.addRow("Accelerator", self.accel)
        self.keep_warm = QSpinBox()
        self.keep_warm.setRange(0, 3600)
        self.keep_warm.setSuffix(" s")
        self.keep_warm.setValue(int(self.prefs.keep_warm_seconds))
        form.addRow("Keep a finished task's VM for a follow-up", self.keep_warm)
        for spin in (self.max_tasks, self.memory, self.cpus, self.keep_warm):
            spin.valueChanged.connect(self._save_limits)
        self.accel.currentIndexChanged.connect(self._save_limits)
        note = plain_label(
            "Changes apply at once and are saved. Memory, CPUs and the accelerator are used "
            "by the next VM a task starts."
        )
        note.setWordWrap(True)
        form.addRow("", note)
        try:
            from piwork.tasks.settings import load_task_settings

            lim = load_task_settings(self.paths.settings_file).default_limits

            def shown(v: object, unit: str = "") -> str:
                return "no limit" if v is None else f"{v}{unit}"

            form.addRow(
                "Task limits (settings.json)",
                plain_label(
                    f"turns {shown(lim.max_turns)}, time {shown(lim.max_wall_time_seconds, ' s')}, "
                    f"tokens {shown(lim.max_tokens)}, cost "
                    + ("no limit" if lim.max_cost_usd is None else f"${lim.max_cost_usd}")
                ),
            )
        except Exception as exc:
            form.addRow("Task limits", plain_label(sanitize(exc, limit=300)))
        return w

    def _save_limits(self) -> None:
        self.prefs.max_tasks = self.max_tasks.value()
        self.prefs.memory_mb = self.memory.value()
        self.prefs.cpus = self.cpus.value()
        self.prefs.accel = self.accel.currentData() or ""
        self.prefs.keep_warm_seconds = float(self.keep_warm.value())
        self.prefs.save(self.paths)
        self.applied.emit()

    def _archive_tab(self) -> QWidget:
        """The archived tasks, by title; "Bring back" returns one to the task list."""
        w = QWidget()
        lay = QVBoxLayout(w)
        lay.addWidget(plain_label("Archived tasks (out of the task list; nothing is deleted):"))
        self.archived = QListWidget()
        self.archived.setObjectName("archivedTasks")
        lay.addWidget(self.archived, 1)
        back = QPushButton("Bring back")
        back.clicked.connect(self._unarchive)
        lay.addWidget(back)
        self._fill_archived()
        return w

    def _fill_archived(self) -> None:
        from piwork.tasks import TaskStore

        self.archived.clear()
        store = TaskStore(self.paths.tasks)
        try:
            for t in store.list():
                if t.id in self.prefs.archived:
                    item = QListWidgetItem(sanitize(t.record.title, limit=120, keep_newlines=False))
                    item.setData(Qt.ItemDataRole.UserRole, t.id)
                    self.archived.addItem(item)
        finally:
            store.close()
        if not self.archived.count():
            self.archived.addItem("No archived tasks.")

    def _unarchive(self) -> None:
        item = self.archived.currentItem()
        task_id = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        if isinstance(task_id, str):
            self.unarchived.emit(task_id)
            self._fill_archived()

    def _hosts_tab(self) -> QWidget:
        """The stored remote hosts, read-only: adding one checks the host's key and
        login, which is ``piwork hosts add``'s job in a terminal."""
        w = QWidget()
        lay = QVBoxLayout(w)
        self.hosts = QListWidget()
        self.hosts.setObjectName("hostList")
        lay.addWidget(self.hosts, 1)
        self.hosts_note = plain_label()
        self.hosts_note.setObjectName("hostsNote")
        self.hosts_note.setWordWrap(True)
        self.hosts_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.hosts_note)
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.refresh_hosts)
        lay.addWidget(refresh)
        self.refresh_hosts()
        # Read again each time the tab is shown: `piwork hosts add` runs in a terminal
        # while this dialog is open (issue 33 item 15).
        self.tabs.currentChanged.connect(lambda i: self._tab_shown(i, w))
        return w

    def _tab_shown(self, index: int, hosts_page: QWidget) -> None:
        if self.tabs.widget(index) is hosts_page:
            self.refresh_hosts()

    def refresh_hosts(self) -> None:
        from piwork.gui.hosts import ADD_HINT, host_lines

        lines, error = host_lines()
        self.hosts.clear()
        for line in lines:
            self.hosts.addItem(line)
        self.hosts_note.setText(
            (error + "\n" if error else "")
            + ("" if lines else "No remote hosts yet. ")
            + ADD_HINT
            + " (in a terminal). A new task's host is chosen next to its model."
        )
