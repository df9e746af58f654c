"""The package registries as one answer, and "Start clean", in the real window with a real
VM (real runner, QEMU, pi and its permission gate; the scripted model is the stand-in
for a remote LLM only).

* The agent runs ``pip install``: pi's gate asks to reach pypi.org, the sheet offers
  "Allow the package registries"; picking it saves the four registry rules for the
  folder, the real gate lets the command run (it was sent one of its own options),
  and no further question comes for the registries during the run.
* A new task on the folder with "Start clean" ticked starts from the clean workbench;
  the next one without it starts from what the folder's last task left.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.env import store_for
from piwork.env.registries import registry_domains
from piwork.gui.prefs import Prefs
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash
from piwork.net.private import allow_private
from piwork.policy import Action, Choice, PolicyStore, Scope
from piwork.runner import EventKind, RunEvent
from tests.helpers.gui import say, scripted_provider, shown, until

pytestmark = pytest.mark.vm

BOOT = 360.0  # one TCG boot on a shared, loaded 2-core machine
STEP = 240.0
PIP = (
    "echo gate-let-it-run; pip install --break-system-packages --no-cache-dir --timeout 15 "
    "--retries 0 six==1.16.0 2>&1 | tail -n 3; true"
)


def script(req: ChatRequest) -> Step:
    if "[pip]" in req.last_user_text and req.assistant_turns_since_user == 0:
        return ToolCalls([bash(PIP, id="call_pip", timeout=300)], text="Installing six.")
    return Text("done")


def test_one_answer_allows_the_registries_and_start_clean_starts_clean(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.window import MainWindow

    folder = tmp_path / "proj"
    folder.mkdir()
    # Where the registries resolve to a private or reserved address (an inspecting
    # company gateway, as on the machine these tests were written on), a person has run
    # `piwork network allow-private --registries` once, as `piwork network` advises;
    # elsewhere these rules are never consulted.
    allow_private(gui_paths, list(registry_domains()))

    async def scenario() -> None:
        server = ScriptedModelServer(script, model_id="scripted")
        async with server:
            win = MainWindow(paths=gui_paths, prefs=Prefs(keep_warm_seconds=0), tray=False)
            win.extra_run_args = {"extra_providers": (scripted_provider(server),)}
            qtbot.addWidget(win)
            await shown(win)
            win.model_pick.addItem("scripted", "scripted/scripted")
            win.model_pick.setCurrentIndex(win.model_pick.count() - 1)
            try:
                # ---- the registries, one answer
                win.new_folder = folder
                say(win, "[pip] install six")
                first = win.current()
                assert first is not None
                events: list[RunEvent] = []
                first.run_event.connect(events.append)
                await until(lambda: win.sheet is not None, BOOT, "the gate asks about pypi.org")
                sheet = win.sheet
                assert sheet is not None and "pypi.org" in sheet.what.text()
                assert sheet.registry_label is not None
                for domain in registry_domains():
                    assert domain in sheet.registry_label.text()
                asked = len(first.permissions)
                sheet.buttons[Choice.ALLOW_REGISTRIES].click()
                await until(lambda: first.label == "done", STEP, "the task finishes")
                # No other question came (the proxy's for pypi.org and its file host
                # are answered by the saved rules).
                assert asked == 1 and not first.permissions and win.sheet is None
                ends = [e for e in events if e.kind is EventKind.TOOL_END]
                assert ends and "gate-let-it-run" in str(ends[0].data.get("text"))
                rules = [
                    r
                    for r in PolicyStore(gui_paths.policy_file).load()
                    if r.action is not Action.PRIVATE_NETWORK
                ]
                assert {r.pattern for r in rules} == set(registry_domains())
                assert all(r.scope == Scope.folder(folder) for r in rules)
                decided = [
                    e.data for e in events if e.kind is EventKind.PERMISSION and e.data.get("by")
                ]
                assert decided and decided[0]["decision"] == "Allow the package registries"
                await until(lambda: not first.live, 60, "the first VM is off")

                # ---- Start clean, then not
                store = store_for(gui_paths)
                bases: list[Any] = []
                for clean in (True, False):
                    win.new_task()
                    win.new_folder = folder
                    win.clean_env.setChecked(clean)
                    say(win, f"nothing to do (clean={clean})")
                    ctl = win.current()
                    assert ctl is not None and ctl is not first
                    await until(lambda c=ctl: c.label == "done", BOOT, f"task clean={clean}")
                    await until(lambda c=ctl: not c.live, 60, "its VM is off")
                    assert ctl.task_id is not None
                    env = store.task_env(gui_paths.tasks / ctl.task_id)
                    assert env is not None
                    bases.append(env.base)
                assert bases[0] is None  # the clean workbench
                assert bases[1] is not None  # what the clean task left, frozen
            finally:
                await win.quit_cleanly(exit_app=False)

    qloop.run_until_complete(scenario())
