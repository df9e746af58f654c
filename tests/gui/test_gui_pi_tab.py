"""Settings → pi: project trust and MCP servers, saved at once to settings.json → pi
(the same as `piwork trust` and `piwork mcp`); a header-borne key is refused."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.pisettings import McpServer, load_pi_settings


def test_trust_and_mcp_servers_are_saved_as_they_change(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    from piwork.gui.pi_tab import PiTab
    from piwork.gui.settings import SettingsDialog

    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    (tab,) = [dlg.tabs.widget(i) for i in range(dlg.tabs.count()) if dlg.tabs.tabText(i) == "pi"]
    assert isinstance(tab, PiTab)
    assert tab.trust.isChecked()  # on by default
    tab.trust.setChecked(False)
    assert load_pi_settings(gui_paths.settings_file).trust_project is False

    tab.name.setText("files")
    tab.where.setText("npx -y @modelcontextprotocol/server-filesystem .")
    tab.add_btn.click()
    tab.name.setText("docs")
    tab.where.setText("https://docs.example.com/mcp")
    tab.exposure.setCurrentText("direct")
    tab.add_btn.click()
    servers = load_pi_settings(gui_paths.settings_file).mcp_servers
    assert servers == {
        "files": McpServer(command="npx", args=["-y", "@modelcontextprotocol/server-filesystem",
                                                 "."], exposure="codemode"),
        "docs": McpServer(url="https://docs.example.com/mcp", exposure="direct"),
    }  # fmt: skip
    assert tab.servers.count() == 2 and "Added MCP server docs" in tab.status.text()

    tab.name.setText("bad name")
    tab.where.setText("https://x.example/mcp")
    tab.add_btn.click()
    assert tab.status.text().startswith("Not added:") and "letters, digits" in tab.status.text()

    tab.servers.setCurrentRow(0)
    tab.rm_btn.click()
    assert set(load_pi_settings(gui_paths.settings_file).mcp_servers) == {"docs"}
    if os.environ.get("PIWORK_SHOTS"):
        dlg.tabs.setCurrentWidget(tab)
        dlg.show()
        qtbot.waitExposed(dlg)
        dlg.grab().save(str(Path(os.environ["PIWORK_SHOTS"]) / "settings-pi.png"))
