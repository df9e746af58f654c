"""Remote hosts in the app: the new-task host picker and the Settings list, read from
the hosts file (``piwork hosts add``) without connecting to any host."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.prefs import Prefs
from piwork.hosts import store
from tests.helpers.gui import say, until


@pytest.fixture
def hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two stored hosts, written by the store itself (as ``piwork hosts add`` does)."""
    path = tmp_path / "hosts.json"
    monkeypatch.setattr(store, "hosts_file", lambda: path)
    store.save(
        {
            "box": store.parse_target("box", "pi@box.example"),
            "gpu": store.parse_target("gpu", "me@10.0.0.7:2222"),
        }
    )
    return path


class RecordingSession:
    """Records the RunRequest the controller builds, then ends the run (no VM: the
    request is what this test is about)."""

    requests: ClassVar[list[Any]] = []

    def __init__(self, req: Any, sink: Any, asker: Any, *, paths: Any) -> None:
        RecordingSession.requests.append(req)

    async def __aenter__(self) -> RecordingSession:
        raise RuntimeError("recorded")

    async def __aexit__(self, *exc: object) -> None:
        return None


def test_the_picker_lists_stored_hosts_and_a_new_task_runs_on_the_chosen_one(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    hosts: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from piwork.gui.window import MainWindow

    RecordingSession.requests = []
    win = MainWindow(paths=gui_paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    win.model.session_factory = RecordingSession
    pick = win.host_pick
    assert [pick.itemText(i) for i in range(pick.count())] == ["This computer", "box", "gpu"]
    assert pick.currentData() is None
    pick.setCurrentIndex(pick.findData("gpu"))

    async def scenario() -> None:
        say(win, "build it over there")
        await until(lambda: RecordingSession.requests, 10, "the run is requested")
        await until(lambda: not win.tasks[0].live, 10, "the run ends")

    qloop.run_until_complete(asyncio.wait_for(scenario(), 30))
    [req] = RecordingSession.requests
    assert req.host == "gpu" and req.prompt == "build it over there"
    ctl = win.tasks[0]
    assert ctl.host == "gpu"
    # The selected task shows its own host and the picker is for new tasks only.
    assert pick.currentData() == "gpu" and not pick.isEnabled()

    # A follow-up runs where the task ran, whatever the picker says for new tasks.
    async def again() -> None:
        say(win, "and again")
        await until(lambda: len(RecordingSession.requests) == 2, 10, "the second run")
        await until(lambda: not ctl.live, 10, "the run ends")

    qloop.run_until_complete(asyncio.wait_for(again(), 30))
    assert RecordingSession.requests[1].host == "gpu"

    # A host added meanwhile (``piwork hosts add``) is offered for the next new task.
    store.save({**store.load(), "lab": store.parse_target("lab", "me@lab.example")})
    win.new_task()
    assert pick.isEnabled()
    assert [pick.itemText(i) for i in range(pick.count())] == [
        "This computer",
        "box",
        "gpu",
        "lab",
    ]
    # "This computer" is no host at all.
    pick.setCurrentIndex(0)

    async def local() -> None:
        say(win, "here please")
        await until(lambda: len(RecordingSession.requests) == 3, 10, "the third run")
        await until(lambda: not win.tasks[0].live, 10, "the run ends")

    qloop.run_until_complete(asyncio.wait_for(local(), 30))
    assert RecordingSession.requests[2].host is None


def test_an_unreadable_hosts_file_leaves_this_computer_and_says_what_to_fix(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from PySide6.QtWidgets import QLabel

    from piwork.gui.settings import SettingsDialog
    from piwork.gui.window import MainWindow

    path = tmp_path / "hosts.json"
    path.write_text("{not json")
    monkeypatch.setattr(store, "hosts_file", lambda: path)
    win = MainWindow(paths=gui_paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    assert win.host_pick.count() == 1 and win.host_pick.itemText(0) == "This computer"
    assert (
        "is damaged" in win.host_pick.toolTip()
        and "fix the file by hand" in win.host_pick.toolTip()
    )
    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    assert dlg.hosts.count() == 0
    note = dlg.findChild(QLabel, "hostsNote")
    assert note is not None and "fix the file by hand" in note.text()
    assert "piwork hosts add NAME user@box" in note.text()


def test_settings_lists_the_hosts_read_only_with_the_command_to_add_one(
    qtbot: QtBot, gui_paths: Paths, hosts: Path
) -> None:
    from PySide6.QtWidgets import QLabel

    from piwork.gui.settings import SettingsDialog

    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    items = [dlg.hosts.item(i).text() for i in range(dlg.hosts.count())]
    assert items == ["box  pi@box.example", "gpu  me@10.0.0.7:2222"]
    note = dlg.findChild(QLabel, "hostsNote")
    assert note is not None and "piwork hosts add NAME user@box" in note.text()


def test_remote_hosts_are_read_again_when_the_tab_is_shown(
    qtbot: QtBot, gui_paths: Paths, hosts: Path
) -> None:
    """Issue 33 item 15: a host added with `piwork hosts add` while Settings is open."""
    from piwork.gui.settings import SettingsDialog

    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    dlg.show()
    store.save({**store.load(), "lab": store.parse_target("lab", "me@lab.example")})
    page = dlg.hosts.parentWidget()
    dlg.tabs.setCurrentIndex(dlg.tabs.indexOf(page))
    items = [dlg.hosts.item(i).text() for i in range(dlg.hosts.count())]
    assert "lab  me@lab.example" in items
