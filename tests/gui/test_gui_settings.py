"""Settings apply at once and save themselves (issue 16 item 4); rules are visible and
can be added (item 6)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QDialog
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.policy import DEFAULT_RULES, Action, PolicyStore, ScopeKind, Verdict
from tests.helpers.gui import button


def test_limits_apply_to_the_running_app_and_are_saved_without_a_save_button(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    from piwork.gui.window import MainWindow

    win = MainWindow(paths=gui_paths, prefs=Prefs(keep_warm_seconds=300, max_tasks=2), tray=False)
    qtbot.addWidget(win)
    win.open_settings()
    dlg = win.settings_dialog
    dlg.keep_warm.setValue(20)
    dlg.max_tasks.setValue(3)
    # Applied now (a VM already warm re-reads keep_warm every second: piwork.run.pool) ...
    assert win.pool.keep_warm == 20 and win.pool.limit == 3
    # ... and saved, with no Save button to forget; Close keeps it.
    dlg.reject()
    again = Prefs.load(gui_paths)
    assert again.keep_warm_seconds == 20 and again.max_tasks == 3
    from PySide6.QtWidgets import QPushButton

    assert "Save" not in [b.text() for b in dlg.findChildren(QPushButton)]


def test_builtin_rules_are_listed_and_a_rule_can_be_added(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: object
) -> None:
    from piwork.gui.settings import SettingsDialog

    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    shown = [dlg.builtin.item(i).text() for i in range(dlg.builtin.count())]
    assert len(shown) == len(DEFAULT_RULES)
    assert any("ask moving or renaming" in t for t in shown)
    dlg.add_rule()
    add = dlg.add_rule_dialog
    add.verdict.setCurrentIndex(add.verdict.findData(Verdict.ALLOW))
    add.action.setCurrentIndex(add.action.findData(Action.SHELL))
    add.pattern.setText("make test")
    assert "make test" in add.preview.text() and "every task" in add.preview.text()
    add.done(QDialog.DialogCode.Accepted)
    [rule] = PolicyStore(gui_paths.policy_file).load()
    assert (rule.action, rule.verdict, rule.pattern) == (Action.SHELL, Verdict.ALLOW, "make test")
    assert rule.scope.kind is ScopeKind.GLOBAL
    assert any("make test" in t for t in dlg.rule_texts())


def test_no_unused_packs_means_no_question(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, monkeypatch: Any
) -> None:
    import piwork.pack
    from piwork.gui.settings import SettingsDialog

    monkeypatch.setattr(piwork.pack, "list_packs", lambda: [])  # a cache with no other pack
    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    dlg.tabs.setCurrentIndex(dlg.tabs.indexOf(dlg.packs.parentWidget()))
    button(dlg, "Remove unused…").click()  # would block on a modal question if it asked
    assert dlg.pack_status.text() == "No unused packs: only the current one is here."


def test_add_rule_opens_on_ask_enter_stores_nothing_and_the_rule_is_not_cut(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """Issue 33 item 6: not "allow any command everywhere" with OK as the default."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from piwork.gui.settings import SettingsDialog

    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    dlg.show()
    dlg.tabs.setCurrentIndex(1)
    button(dlg, "Add rule…").click()
    add = dlg.add_rule_dialog
    assert add.verdict.currentText() == "Ask"
    assert "asking" in add.preview.text() or "ask" in add.preview.text()
    QTest.keyClick(add, Qt.Key.Key_Return)  # Enter: Cancel, never a stored rule
    assert not add.isVisible() and PolicyStore(gui_paths.policy_file).load() == []
    button(dlg, "Add rule…").click()
    add = dlg.add_rule_dialog
    add.verdict.setCurrentIndex(add.verdict.findText("Allow"))
    assert add.warning.isVisible() and "EVERY task" in add.warning.text()
    add.pattern.setText("make test")
    assert not add.warning.isVisible()
    qtbot.waitUntil(lambda: add.preview.height() >= add.preview.heightForWidth(add.preview.width()))
    button(add, "Add the rule").click()
    [rule] = PolicyStore(gui_paths.policy_file).load()
    assert rule.pattern == "make test"


def test_rules_and_the_audit_log_speak_the_persons_words(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """Issue 33 item 7: the person's paths, task titles, no "cancelled (cancelled)"."""
    from piwork.gui.settings import SettingsDialog
    from piwork.policy import AuditEntry, AuditLog, Rule, Scope
    from piwork.tasks import TaskStore

    folder = tmp_path / "proj"
    folder.mkdir()
    store = TaskStore(gui_paths.tasks)
    task = store.create("Tidy the docs", folder)
    store.close()
    PolicyStore(gui_paths.policy_file).add(
        Rule(Action.WRITE, Verdict.ALLOW, Scope.folder(folder), pattern="/mnt/work/docs/**")
    )
    log = AuditLog(gui_paths.audit_log)
    for decision, by in (("cancelled", "cancelled"), ("deny", "person")):
        log.append(
            AuditEntry(
                task=task.id, action="delete", target="/mnt/work/docs/old.md",
                decision=decision, decided_by=by, tool="bash",
            )
        )  # fmt: skip
    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    row = [dlg.rules.item(0, j).text() for j in range(dlg.rules.columnCount())]
    assert not any("/mnt/" in cell for cell in row), row
    assert "docs/**" in row[0] and str(folder) in row[2], row
    audit = dlg.audit.toPlainText()
    assert "“Tidy the docs”" in audit and task.id not in audit, audit
    assert "/mnt/" not in audit and "(cancelled)" not in audit, audit
    assert "Question withdrawn" in audit and "You denied: docs/old.md" in audit, audit


def test_the_model_picker_marks_models_whose_provider_has_no_key(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """Issue 33 item 13: not raw model ids that fail only once the task starts."""
    from piwork.gui.window import MainWindow
    from piwork.models.custom import add_provider

    providers = gui_paths.config / "providers.json"
    add_provider("acme", "https://api.acme.example/v1", ["big"], key_required=True, path=providers)
    add_provider("local", "http://localhost:11434/v1", ["qwen"], path=providers)
    win = MainWindow(paths=gui_paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    pick = win.model_pick
    shown = {pick.itemData(i): pick.itemText(i) for i in range(pick.count())}
    assert shown["acme/big"] == "acme/big  · no key yet"
    assert shown["local/qwen"] == "local/qwen"
    assert "not a real model" in shown["demo"]


def permissions_tab(qtbot: QtBot, paths: Paths) -> tuple[Any, Any]:
    """Settings open on the Permissions tab, as a person opens it."""
    from piwork.gui.settings import SettingsDialog

    dlg = SettingsDialog(paths, Prefs())
    qtbot.addWidget(dlg)
    dlg.show()
    dlg.tabs.setCurrentWidget(dlg.policy_tab)
    return dlg, dlg.policy_tab


def test_a_damaged_policy_file_is_a_banner_editing_waits_and_restore_puts_it_back(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """A ``policy.json`` cut short (another tool, a bad sync) is never shown as "no rules":
    the tab names the file and ``piwork policy restore``, the rules cannot be edited (the
    store would refuse, and the buttons raised from their slots), and the banner's button
    puts the last good copy back."""
    from piwork.policy import Rule, Scope

    store = PolicyStore(gui_paths.policy_file)
    store.add(Rule(Action.SHELL, Verdict.DENY, Scope.global_(), pattern="rm -rf"))
    gui_paths.policy_file.write_bytes(gui_paths.policy_file.read_bytes()[:25])  # torn
    dlg, tab = permissions_tab(qtbot, gui_paths)
    assert tab.banner.isVisible()
    text = tab.banner_text.text()
    assert str(gui_paths.policy_file) in text and "`piwork policy restore`" in text
    assert "no task starts until" in tab.banner_title.text()
    assert tab.restore_btn.isVisible()
    for w in (tab.add_btn, tab.delete_btn, tab.reset_btn, tab.rules):
        assert not w.isEnabled(), w
    damaged = gui_paths.policy_file.read_bytes()
    tab.add_btn.click()  # disabled: nothing opens, nothing is written
    dlg.add_rule()  # and the slot itself refuses (a shortcut, a stale click)
    assert dlg.add_rule_dialog is None
    assert gui_paths.policy_file.read_bytes() == damaged
    tab.restore_btn.click()
    assert not tab.banner.isVisible()
    assert tab.add_btn.isEnabled() and tab.rules.isEnabled()
    assert any("rm -rf" in t for t in dlg.rule_texts())
    [rule] = PolicyStore(gui_paths.policy_file).load()
    assert rule.pattern == "rm -rf"


def test_a_policy_damaged_with_no_good_copy_says_how_to_start_over(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    gui_paths.policy_file.parent.mkdir(parents=True, exist_ok=True)
    gui_paths.policy_file.write_bytes(b'{"version": 1, "rules": [')  # never good
    _dlg, tab = permissions_tab(qtbot, gui_paths)
    assert tab.banner.isVisible() and not tab.restore_btn.isVisible()
    assert "no earlier good copy" in tab.banner_text.text()
    assert "piwork policy reset --yes" in tab.banner_text.text()
    assert not tab.add_btn.isEnabled()


def test_a_policy_damaged_while_the_tab_is_open_shows_the_banner_instead_of_raising(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    from piwork.policy import Rule, Scope

    dlg, tab = permissions_tab(qtbot, gui_paths)
    assert not tab.banner.isVisible() and tab.add_btn.isEnabled()
    dlg.add_rule()
    add = dlg.add_rule_dialog
    add.pattern.setText("make test")
    PolicyStore(gui_paths.policy_file).add(Rule(Action.SHELL, Verdict.ASK, Scope.global_()))
    gui_paths.policy_file.write_bytes(b"{")  # damaged behind the open dialog
    add.done(QDialog.DialogCode.Accepted)  # the store refuses; the tab says why
    assert tab.banner.isVisible() and "`piwork policy restore`" in tab.banner_text.text()
    assert gui_paths.policy_file.read_bytes() == b"{"


def test_add_rule_offers_a_private_network_address(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """A name on the company network (it resolves to a private address) is asked on its
    own (piwork.net); a person can allow one here, as `piwork network allow-private` does."""
    dlg, tab = permissions_tab(qtbot, gui_paths)
    dlg.add_rule()
    add = dlg.add_rule_dialog
    i = add.action.findData(Action.PRIVATE_NETWORK)
    assert i >= 0 and "private address" in add.action.itemText(i)
    add.action.setCurrentIndex(i)
    add.verdict.setCurrentIndex(add.verdict.findData(Verdict.ALLOW))
    add.pattern.setText("repo.corp")
    add.done(QDialog.DialogCode.Accepted)
    [rule] = PolicyStore(gui_paths.policy_file).load()
    assert (rule.action, rule.verdict, rule.pattern) == (
        Action.PRIVATE_NETWORK,
        Verdict.ALLOW,
        "repo.corp",
    )
    assert any("repo.corp" in t for t in tab.rule_texts())


def test_removing_unused_packs_asks_without_blocking_and_keeps_the_current_one(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    monkeypatch: Any,
    tmp_path: Path,
) -> None:
    """The question is a sheet like the window's others (no nested event loop: the
    app's tasks keep running while it is open); Cancel is the default; Remove removes
    only the packs not built from these sources."""
    import piwork.pack
    from piwork.gui.settings import SettingsDialog
    from piwork.pack.cache import PackInfo

    packs = tmp_path / "packs"

    def pack(name: str) -> PackInfo:
        (packs / name).mkdir(parents=True)
        return PackInfo(name, packs / name, "", {}, 1, True)

    infos = [pack("current"), pack("old-1"), pack("old-2")]
    monkeypatch.setattr(piwork.pack, "find_pack", lambda: packs / "current")
    monkeypatch.setattr(piwork.pack, "list_packs", lambda: [i for i in infos if i.path.exists()])
    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    dlg.show()
    dlg.tabs.setCurrentWidget(dlg.packs_tab)
    button(dlg, "Remove unused…").click()  # returns at once: the box is open, not exec'd
    box = dlg.packs_tab.remove_box
    assert box is not None and box.isVisible() and "2 packs" in box.text()
    assert box.defaultButton().text() == "Cancel"
    [remove] = [b for b in box.buttons() if b.text() == "Remove"]
    remove.click()
    assert sorted(p.name for p in packs.iterdir()) == ["current"]
    assert dlg.pack_status.text() == "Removed 2 unused packs."
