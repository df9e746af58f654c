"""Settings → Environments, "Start clean" on a new task, and the task's environment size
in the context panel (issue 18 item 2, the app's side of ``piwork env``).

The environments are made by the real EnvStore (real qcow2 files from qemu-img) in
a private piwork home; reset and remove go through it as ``piwork env`` does.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.env import ENV_DISK, allocated_bytes, store_for
from piwork.gui.envs import mb
from piwork.gui.prefs import Prefs
from tests.helpers.gui import say, until

pytestmark = pytest.mark.skipif(
    shutil.which("qemu-img") is None or shutil.which("qemu-io") is None,
    reason="task environments are qcow2 disks: needs qemu-utils (scripts/setup.sh)",
)


def _two_tasks(paths: Paths, folder: Path) -> tuple[str, str, str]:
    """Task "install numpy" on ``folder`` writes 3 MB to its disk; "run the tests" then
    starts from it (the first's disk is frozen into a layer). Returns the layer's id and
    the two tasks' ids."""
    from piwork.tasks import TaskStore

    tasks = TaskStore(paths.tasks)
    t1 = tasks.create("install numpy", folder).id
    t2 = tasks.create("run the tests", folder).id
    tasks.close()
    store = store_for(paths)
    store.prepare(paths.tasks / t1, folder)
    # What an install in the VM does to the disk, done by QEMU's own tool (host-made disk).
    subprocess.run(
        ["qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 3M", str(paths.tasks / t1 / ENV_DISK)],
        check=True,
        capture_output=True,
    )
    env = store.prepare(paths.tasks / t2, folder)
    assert env.base is not None
    return env.base, t1, t2


def _rows(dlg: Any) -> list[list[str]]:
    out = []
    for i in range(dlg.envs.topLevelItemCount()):
        top = dlg.envs.topLevelItem(i)
        out.append([top.text(c) for c in range(3)])
        for j in range(top.childCount()):
            out.append([top.child(j).text(c) for c in range(3)])
    return out


def _box_button(box: QMessageBox, text: str) -> Any:
    [b] = [b for b in box.buttons() if b.text().replace("&", "") == text]
    return b


def test_environments_lists_each_folder_its_layers_and_sizes_and_resets_after_asking(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.settings import SettingsDialog

    folder = tmp_path / "proj"
    folder.mkdir()
    layer, _t1, t2 = _two_tasks(gui_paths, folder)
    store = store_for(gui_paths)
    layer_bytes = allocated_bytes(store.layers_dir / f"{layer}.qcow2")
    assert layer_bytes > 3_000_000  # the 3 MB t1 wrote is in the frozen layer
    t2_bytes = allocated_bytes(gui_paths.tasks / t2 / ENV_DISK)

    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    rows = _rows(dlg)
    assert rows[0] == [
        str(folder),
        mb(layer_bytes + t2_bytes),
        # Tasks by their titles, no ids, no "layers" (issue 33 item 13).
        "the next task starts with what “run the tests” left (and what 1 earlier task installed)",
    ]
    assert rows[1][:2] == ["what “run the tests” installed", mb(t2_bytes)]
    assert rows[2][:2] == ["saved earlier", mb(layer_bytes)]
    assert "from “install numpy”" in rows[2][2] and "used by 2 tasks" in rows[2][2]
    assert layer not in " ".join(" ".join(r) for r in rows)

    # Nothing selected: nothing to reset. A layer's row selects its folder.
    assert not dlg.env_reset_btn.isEnabled()
    dlg.envs.setCurrentItem(dlg.envs.topLevelItem(0).child(1))
    assert dlg.env_reset_btn.isEnabled() and dlg.selected_env_folder() == folder

    # Reset asks first; Cancel (the default) changes nothing.
    dlg.env_reset_btn.click()
    box = dlg.env_box
    assert box is not None and str(folder) in box.text()
    assert box.defaultButton() is _box_button(box, "Cancel")
    box.defaultButton().click()
    rec = store.folder(folder)
    assert rec is not None and rec.head == layer

    dlg.env_reset_btn.click()
    _box_button(dlg.env_box, "Reset").click()
    rec = store.folder(folder)
    assert rec is not None and rec.head is None and rec.last_task_dir is None
    assert _rows(dlg)[0][2] == "the next task starts clean"
    assert "clean workbench" in dlg.env_status.text()
    # Tasks keep their own disks: t1 and t2 still sit on the layer, so it stays.
    assert store.layer(layer) is not None


def test_remove_forgets_the_folder(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.settings import SettingsDialog

    folder = tmp_path / "proj"
    folder.mkdir()
    _two_tasks(gui_paths, folder)
    dlg = SettingsDialog(gui_paths, Prefs())
    qtbot.addWidget(dlg)
    dlg.envs.setCurrentItem(dlg.envs.topLevelItem(0))
    dlg.env_rm_btn.click()
    assert dlg.env_box is not None and "Forget" in dlg.env_box.text()
    _box_button(dlg.env_box, "Remove").click()
    assert store_for(gui_paths).folder(folder) is None
    assert dlg.envs.topLevelItemCount() == 0 and "forgotten" in dlg.env_status.text()


def test_the_context_panel_shows_the_tasks_environment_size(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.context import ContextPanel

    folder = tmp_path / "proj"
    folder.mkdir()
    _layer, _t1, t2 = _two_tasks(gui_paths, folder)
    panel = ContextPanel(gui_paths)
    qtbot.addWidget(panel)
    panel.show_task(t2, folder, None)
    size = allocated_bytes(gui_paths.tasks / t2 / ENV_DISK)
    assert panel.env_label.text() == (
        f"Environment: {mb(size)} of 16 GiB, started with what earlier tasks installed"
    )
    panel.show_task("t-none", folder, None)  # a task that never ran: no line
    assert panel.env_label.text() == "" and panel.env_label.isHidden()


class _Captured(Exception):
    pass


def test_start_clean_reaches_the_new_tasks_run_request_and_is_for_new_tasks_only(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The box is ``piwork run --clean-env``: the window hands it to the runner's request.
    (The session is stopped at its door here: what it does with the flag is the runner's,
    tested with real disks in tests/unit and tests/vm.)"""
    from piwork.gui.window import MainWindow

    seen: list[Any] = []

    class Door:
        def __init__(self, req: Any, *args: object, **kwargs: object) -> None:
            seen.append(req)

        async def __aenter__(self) -> None:
            raise _Captured("stopped at the door")

        async def __aexit__(self, *exc: object) -> None:
            return None

    folder = tmp_path / "proj"
    folder.mkdir()
    win = MainWindow(paths=gui_paths, tray=False)
    qtbot.addWidget(win)
    win.model.session_factory = Door
    win.new_task()
    assert win.clean_env.isVisibleTo(win) and not win.clean_env.isChecked()
    win.new_folder = folder
    win.clean_env.setChecked(True)
    say(win, "install things")
    ctl = win.current()
    assert ctl is not None
    qloop.run_until_complete(until(lambda: seen, 10, "the run starts"))
    assert seen[0].clean_env is True and seen[0].folder == folder
    # The task has its environment now: the box is for the next new task, unticked.
    assert not win.clean_env.isVisibleTo(win)
    win.new_task()
    assert win.clean_env.isVisibleTo(win) and not win.clean_env.isChecked()
    say(win, "another")
    qloop.run_until_complete(until(lambda: len(seen) == 2, 10, "the second run starts"))
    assert seen[1].clean_env is False


def test_start_clean_says_what_the_new_task_would_otherwise_start_from(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from PySide6.QtWidgets import QFileDialog

    from piwork.gui.compose import CLEAN_ENV_TIP
    from piwork.gui.window import MainWindow

    folder = tmp_path / "proj"
    folder.mkdir()
    _two_tasks(gui_paths, folder)
    win = MainWindow(paths=gui_paths, tray=False)
    qtbot.addWidget(win)
    win.new_task()
    assert win.clean_env.toolTip() == CLEAN_ENV_TIP  # no folder yet
    # The person clicks "Folder…" and picks the folder in the dialog.
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    win.folder_btn.click()
    tip = win.clean_env.toolTip()
    assert "starts with what “run the tests” left" in tip and " MB)" in tip
    assert CLEAN_ENV_TIP in tip
