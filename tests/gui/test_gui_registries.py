"""The permission sheet: "Allow the package registries" (issue 18 item 4), and the rules
"Always" saves shown with the person's folder-relative paths.

The requests come from the real permission bridge (the egress proxy's question), so
the sheet shows what the host derived, not what a test made up.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.env.registries import registry_domains
from piwork.gui.text import always_rules, registry_rules_offered
from piwork.gui.widgets import PermissionSheet
from piwork.policy import Action, AuditLog, Choice, Decider, PermissionRequest, PolicyStore
from piwork.policy.rules import TaskContext
from piwork.run.permissions import PermissionBridge
from piwork.tasks import TaskStatus
from tests.helpers.gui import FakeRun, button, message_box, permission_request, say, until


class _Host:
    """What the bridge needs from a session; nothing here decides anything."""

    stopping = False
    paused = False
    task_id = "t1"

    def emit(self, kind: object, **data: Any) -> None:
        pass

    def note(self, kind: str, data: Any) -> None:
        pass

    async def set_status(self, status: TaskStatus) -> None:
        pass


class _Capture:
    def __init__(self) -> None:
        self.asked: list[PermissionRequest] = []

    async def permission(self, request: PermissionRequest) -> Choice | None:
        self.asked.append(request)
        return Choice.DENY

    async def question(self, *args: object) -> str | bool | None:
        return None


def _asked(
    tmp_path: Path, folder: Path, domain: str, loop: asyncio.AbstractEventLoop | None = None
) -> PermissionRequest:
    """The request the bridge hands a front end when the proxy asks about ``domain``."""
    capture = _Capture()
    decider = Decider(PolicyStore(tmp_path / "policy.json"), AuditLog(tmp_path / "audit.jsonl"))
    bridge = PermissionBridge(_Host(), decider, capture)
    bridge.context = TaskContext(task_id="t1", working_folder=folder)
    own = loop is None  # a loop of its own, never installed as the thread's (pytest's stays)
    run_on = asyncio.new_event_loop() if loop is None else loop
    try:
        assert not run_on.run_until_complete(bridge.domain_policy(domain, 443))
    finally:
        if own:
            run_on.close()
    [request] = capture.asked
    return request


def _sheet(qtbot: QtBot, req: PermissionRequest, folder: Path) -> PermissionSheet:
    sheet = PermissionSheet(
        "x",
        "",
        str(folder),
        always_rules(req, Choice.ALWAYS_FOLDER),
        always_rules(req, Choice.ALWAYS_EVERYWHERE),
        registry_rules=registry_rules_offered(req),
    )
    qtbot.addWidget(sheet)
    return sheet


def test_a_registry_question_offers_one_answer_that_shows_every_rule_it_saves(
    qtbot: QtBot, tmp_path: Path
) -> None:
    folder = tmp_path / "proj"
    folder.mkdir()
    req = _asked(tmp_path, folder, "pypi.org")
    sheet = _sheet(qtbot, req, folder)
    got: list[Any] = []
    sheet.answered.connect(got.append)
    sheet.show()
    assert sheet.registry_label is not None
    shown = sheet.registry_label.text()
    offered = registry_rules_offered(req)
    assert {r.pattern for r in offered} == set(registry_domains())
    for rule in offered:
        assert rule.human() in shown and str(folder) in rule.human()
    button = sheet.buttons[Choice.ALLOW_REGISTRIES]
    assert button.text() == "Allow the package registries" and button.isEnabled()
    # Enter on it is still Deny: Enter never saves rules.
    assert not button.isDefault() and not button.autoDefault()
    button.setFocus()
    qtbot.keyClick(sheet, Qt.Key.Key_Return)
    button.click()
    assert got == [Choice.DENY, Choice.ALLOW_REGISTRIES]


def test_another_host_gets_no_registries_answer(qtbot: QtBot, tmp_path: Path) -> None:
    folder = tmp_path / "proj"
    folder.mkdir()
    sheet = _sheet(qtbot, _asked(tmp_path, folder, "example.com"), folder)
    assert sheet.registry_label is None
    assert Choice.ALLOW_REGISTRIES not in sheet.buttons
    assert list(sheet.buttons) == [
        Choice.ALLOW_ONCE,
        Choice.ALWAYS_FOLDER,
        Choice.ALWAYS_EVERYWHERE,
        Choice.DENY,
    ]


def test_the_window_passes_the_registries_answer_on_without_a_second_question(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    """Folder-scoped rules, like "Always allow in this folder": no "every task" box."""
    from piwork.gui.window import MainWindow

    folder = tmp_path / "proj"
    folder.mkdir()
    answers: list[object] = []
    request = _asked(tmp_path, folder, "pypi.org", qloop)

    async def ask(run: FakeRun, prompt: str) -> None:
        answers.append(await run.asker.permission(request))

    win = MainWindow(paths=gui_paths, tray=False)
    qtbot.addWidget(win)
    win.model.session_factory = FakeRun.factory(ask)

    async def scenario() -> None:
        win.new_folder = folder
        say(win, "install six")
        await until(lambda: win.sheet is not None, 10, "the permission sheet")
        button(win.sheet, "Allow the package registries").click()
        await until(lambda: answers, 10, "the answer reaches the runner")

    qloop.run_until_complete(scenario())
    assert answers == [Choice.ALLOW_REGISTRIES]
    assert message_box("Allow in every folder?") is None


def test_always_shows_the_path_relative_to_the_persons_folder(qtbot: QtBot, tmp_path: Path) -> None:
    """The sheet says ``docs/old.txt``; the rule saved still names the guest path the
    policy matches requests against (only the words change)."""
    folder = tmp_path / "proj"
    folder.mkdir()
    ctx = TaskContext(task_id="t1", working_folder=folder)
    policy = tmp_path / "policy.json"
    decider = Decider(PolicyStore(policy), AuditLog(tmp_path / "audit.jsonl"))
    req = permission_request(Action.DELETE, "/mnt/work/docs/old.txt", "rm docs/old.txt")
    req = dataclasses.replace(req, proposals=decider.proposals(req, ctx))
    sheet = _sheet(qtbot, req, folder)
    text = sheet.rule_label.text()
    assert "/mnt/" not in text
    assert "allow deleting docs/old.txt (and everything inside it)" in text
    assert f"allow delete docs/old.txt (folder:{folder})" in sheet.rule_label.toolTip()
    decider.record_answer(req, Choice.ALWAYS_FOLDER, ctx)
    [saved] = PolicyStore(policy).load()
    assert saved.pattern == "/mnt/work/docs/old.txt"


def test_the_conversation_says_what_the_one_answer_did() -> None:
    from piwork.gui.words import permission_line

    line = permission_line(
        {
            "decision": "Allow the package registries",
            "by": "person",
            "action": "network",
            "tool": "network",
            "target": "network pypi.org",
        }
    )
    assert line == "You allowed (the package registries, in this folder): reach pypi.org"


def test_the_sheets_headline_names_the_persons_folder_not_the_guests(tmp_path: Path) -> None:
    """The headline is still built from the host-validated targets (policy.prompt); only
    the words for a path in the person's folder change."""
    from piwork.gui.text import plain_request
    from piwork.policy.rules import Target

    pip = dataclasses.replace(
        permission_request(Action.NETWORK, None, "pip install six"),
        targets=(
            Target(Action.NETWORK, op="network", domain="pypi.org", command="pip install six"),
            Target(Action.WRITE, op="write", path="/mnt/work", command="pip install six"),
        ),
    )
    assert plain_request(pip).splitlines()[0] == (
        "The agent wants to connect to pypi.org; change or create your folder"
    )
    rm = permission_request(Action.DELETE, "/mnt/work/docs/old.txt", "rm -r docs/old.txt")
    assert plain_request(rm).splitlines()[0] == "The agent wants to delete docs/old.txt"
    outside = permission_request(Action.OUTSIDE_SCOPE, "/etc/hosts", "echo x > /etc/hosts")
    assert "/etc/hosts" in plain_request(outside).splitlines()[0]
