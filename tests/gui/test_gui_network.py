"""Settings → Network: the same settings as `piwork network`, edited in the window.

The tab is driven as a person would (typing in its fields, pressing its
buttons); what it saves is read back through piwork.net, and a screenshot of
the tab is written for a person to look at (``PIWORK_SHOTS`` or the test's tmp).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import trustme
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from piwork.auth import KeyStore
from piwork.config import Paths
from piwork.gui.network_tab import NetworkTab
from piwork.net import config as netconfig
from piwork.net.mirrors import mirrors_for
from piwork.net.status import network_status
from piwork.net.upstream import key_name
from tests.helpers.net import private_network_home


@pytest.fixture
def paths(gui_paths: Paths, monkeypatch: pytest.MonkeyPatch) -> Paths:
    private_network_home(monkeypatch, gui_paths)
    return gui_paths


def test_the_network_tab_saves_what_is_typed(
    qtbot: QtBot, paths: Paths, tmp_path: Path, qloop: asyncio.AbstractEventLoop
) -> None:
    tab = NetworkTab(paths)
    qtbot.addWidget(tab)
    tab.resize(840, 500)  # the Settings dialog's size: the tab scrolls
    tab.show()

    qtbot.keyClicks(tab.proxy_url, "http://alice@proxy.corp:3128")
    qtbot.keyClicks(tab.no_proxy, "intranet.corp")
    qtbot.keyClicks(tab.proxy_password, "tab-secret-pw")
    tab.save_proxy()
    settings = netconfig.load(paths)
    assert settings.proxy.url == "http://alice@proxy.corp:3128"
    assert settings.proxy.no_proxy == "intranet.corp"
    assert KeyStore(paths=paths).get(key_name("proxy.corp", 3128)) == "tab-secret-pw"
    assert "tab-secret-pw" not in paths.settings_file.read_text()
    assert tab.proxy_password.text() == ""  # never shown again
    assert "http://alice@proxy.corp:3128 (from piwork settings" in tab.status_text.toPlainText()

    ca = trustme.CA(organization_name="Tab Corp Root")
    pem = tmp_path / "tabcorp.pem"
    pem.write_bytes(ca.cert_pem.bytes() + ca.issue_cert("x.corp").private_key_pem.bytes())
    tab.add_ca_file(pem)
    assert "a private key left out" in tab.message.text()
    texts = [tab.ca_list.item(i).text() for i in range(tab.ca_list.count())]
    assert any("Tab Corp Root" in t and "added: tabcorp" in t for t in texts), texts

    tab.mirror_fields["pypi"].setText("https://repo.corp/pypi/simple")
    tab.mirror_fields["debian"].setText("http://repo.corp/debian")
    tab.save_mirrors()
    m = mirrors_for(paths, None)
    assert (m.pypi, m.debian, m.npm) == (
        "https://repo.corp/pypi/simple",
        "http://repo.corp/debian",
        None,
    )
    tab.mirror_fields["npm"].setText("https://u:p@npm.corp/")
    tab.save_mirrors()
    assert "no user name or password" in tab.message.text()

    qtbot.mouseClick(tab.allow_registries, Qt.MouseButton.LeftButton)
    assert "pypi.org" in tab.message.text() and "repo.corp" in tab.message.text()
    status = network_status(paths, lookup=False)
    assert {r.pattern for r in status.private_rules} >= {"pypi.org", "deb.debian.org", "repo.corp"}

    qloop.run_until_complete(asyncio.wait_for(tab.lookup(), 60))
    shown = tab.status_text.toPlainText()
    assert "package registries from this host:" in shown
    assert "refused until allowed" not in shown  # all allowed now

    shots = Path(os.environ.get("PIWORK_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    assert tab.grab().save(str(shots / "settings-network.png"))
    print("screenshot:", shots / "settings-network.png")
