"""Settings apply at once and save themselves (issue 16 item 4); rules are visible and
can be added (item 6)."""

from __future__ import annotations

import asyncio
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
