"""The permission issue's acceptance, in real VMs: the real pi with the gate
extension, a scripted model, the host policy, and the person played by a
``ScriptedAsker``.

Boots (TCG, ~30-40 s each): one shared session for prompt / deny / allow once /
outside scope / "Always allow" / stop; a second run for "Always allow persists";
two headless CLI runs (no terminal; ``--policy FILE``).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import struct
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from piwork.config import Paths
from piwork.models.providers import Provider
from piwork.models.scripted import (
    ChatRequest,
    ScriptedModelServer,
    Step,
    Text,
    ToolCalls,
    ToolExchange,
    bash,
    write,
)
from piwork.pack.manifest import Manifest
from piwork.policy import Action, AuditLog, Choice, PermissionRequest
from piwork.runner import AllowAsker, Asker, EventKind, Outcome, RunEvent, RunRequest, TaskSession
from tests.helpers.cli import piwork, write_providers
from tests.helpers.vm import ScriptedAsker, per_prompt, private_paths, scripted_provider

pytestmark = pytest.mark.vm

GUEST_WORK = "/mnt/work"
LN_TRICK = "ln -s .. ../../up && echo pwned > ../../up/state/pwned.txt"


# --------------------------------------------------------------------------- helpers


class Person(ScriptedAsker):
    """A ScriptedAsker whose answer function may also be async (to block on a dialog)."""

    async def permission(self, request: object) -> object:
        self.permissions.append(request)
        answer = self.permission_answer
        result = answer(request) if callable(answer) else answer
        if isinstance(result, Awaitable):
            result = await result
        return result

    @property
    def requests(self) -> list[PermissionRequest]:
        return [r for r in self.permissions if isinstance(r, PermissionRequest)]


def as_asker(person: Person) -> Asker:
    return cast(Asker, person)


def last_exchanges(server: ScriptedModelServer) -> list[ToolExchange]:
    """The tool calls of the current prompt with the results the model RECEIVED."""
    last = server.chat_requests[-1]
    return ChatRequest(body=last.body, headers=last.headers).tool_exchanges()


def audit_entries(paths: Paths, task_id: str) -> list[dict[str, Any]]:
    return [e for e in AuditLog(paths.audit_log).read() if e.get("task") == task_id]


def transcript(paths: Paths, task_id: str, kind: str) -> list[Any]:
    path = paths.tasks / task_id / "transcript.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["data"] for r in records if r["kind"] == kind]


def policy_rules(paths: Paths) -> list[dict[str, Any]]:
    if not paths.policy_file.exists():
        return []
    rules: list[dict[str, Any]] = json.loads(paths.policy_file.read_text())["rules"]
    return rules


@dataclass
class Live:
    session: TaskSession
    person: Person
    events: list[RunEvent]
    paths: Paths
    folder: Path
    server: ScriptedModelServer

    @property
    def task_id(self) -> str:
        assert self.session.task is not None
        return self.session.task.id

    async def run(self, prompt: str, *steps: Step, answer: object = None) -> Outcome:
        self.server.script = per_prompt(*steps)
        self.person.permission_answer = answer
        self.person.permissions.clear()
        self.events.clear()
        return await asyncio.wait_for(self.session.run_prompt(prompt), timeout=300)

    def tool_ends(self) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.kind is EventKind.TOOL_END]


def run_request(folder: Path, server: ScriptedModelServer) -> RunRequest:
    return RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        extra_providers=(cast(Provider, scripted_provider(server)),),
    )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("perm-home")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("perm-folder")
    # Inside the folder, pointing out of it: in the guest this is the guest's /etc.
    # Made as the agent's own `ln -s` leaves a link under 9p mapped-xattr (a plain
    # host file holding the target, typed as a link in an xattr; docs/security.md):
    # a link the person made on the host is not followed in the guest at all.
    link = folder / "etc-link"
    link.write_text("/etc")
    os.setxattr(link, "user.virtfs.mode", struct.pack("<I", stat.S_IFLNK | 0o777))
    return folder


@pytest.fixture(scope="module")
async def live(
    pack: tuple[Path, Manifest], model_server: ScriptedModelServer, home: Path, folder: Path
) -> AsyncIterator[Live]:
    paths = private_paths(home)
    person = Person()
    events: list[RunEvent] = []
    session = TaskSession(
        run_request(folder, model_server), events.append, as_asker(person), paths=paths
    )
    async with session:
        yield Live(session, person, events, paths, folder, model_server)


# --------------------------------------------------------------------------- one session


async def test_a_delete_is_prompted_and_deny_keeps_the_file_and_tells_the_model(
    live: Live,
) -> None:
    victim = live.folder / "victim.txt"
    victim.write_text("precious\n")
    outcome = await live.run(
        "delete victim.txt",
        ToolCalls([bash("rm victim.txt", id="call_rm_deny")]),
        Text("I did not delete it."),
        answer=Choice.DENY,
    )
    assert outcome.ok, outcome
    assert victim.read_text() == "precious\n"

    # The person was asked exactly once, about a delete of that file.
    [req] = live.person.requests
    assert req.action is Action.DELETE
    assert req.tool == "bash" and req.command == "rm victim.txt"
    assert req.tool_call_id == "call_rm_deny"
    assert req.task_id == live.task_id
    assert [(t.action, t.path) for t in req.targets] == [
        (Action.DELETE, f"{GUEST_WORK}/victim.txt")
    ]
    assert "delete" in req.question and "rm victim.txt" in req.question
    assert "<piwork-permission" not in req.question

    # The model received the denial as the tool result.
    [exchange] = last_exchanges(live.server)
    assert exchange.id == "call_rm_deny"
    assert exchange.result is not None
    assert "Permission denied by the user" in exchange.result
    assert "rm victim.txt" in exchange.result
    assert [e["ok"] for e in live.tool_ends()] == [False]

    # Audited and in the transcript; nothing persisted.
    [entry] = [
        e for e in audit_entries(live.paths, live.task_id) if e["requestId"] == req.request_id
    ]
    assert entry["decision"] == "deny" and entry["decidedBy"] == "person"
    assert entry["action"] == "delete" and entry["target"] == f"{GUEST_WORK}/victim.txt"
    assert entry["toolCallId"] == "call_rm_deny" and entry["choice"] == "Deny"
    noted = transcript(live.paths, live.task_id, "permission")
    assert {"action": "delete", "decision": "Deny", "by": "person"}.items() <= noted[-1].items()
    assert policy_rules(live.paths) == []


async def test_allow_once_deletes_and_asks_again_next_time(live: Live) -> None:
    for name in ("once-a.txt", "once-b.txt"):
        (live.folder / name).write_text("x\n")
    outcome = await live.run(
        "delete two files",
        ToolCalls([bash("rm once-a.txt", id="call_once_a")]),
        ToolCalls([bash("rm once-b.txt", id="call_once_b")]),
        Text("both gone"),
        answer=Choice.ALLOW_ONCE,
    )
    assert outcome.ok, outcome
    assert not (live.folder / "once-a.txt").exists()
    assert not (live.folder / "once-b.txt").exists()
    assert [r.targets[0].path for r in live.person.requests] == [
        f"{GUEST_WORK}/once-a.txt",
        f"{GUEST_WORK}/once-b.txt",
    ]
    assert [e["ok"] for e in live.tool_ends()] == [True, True]
    results = [x.result or "" for x in last_exchanges(live.server)]
    assert not any("Permission" in r for r in results), results
    # "Allow once" is not remembered.
    assert policy_rules(live.paths) == []
    allowed = [e for e in audit_entries(live.paths, live.task_id) if e["choice"] == "Allow once"]
    assert [e["target"] for e in allowed][-2:] == [
        f"{GUEST_WORK}/once-a.txt",
        f"{GUEST_WORK}/once-b.txt",
    ]


async def test_an_outside_scope_write_through_a_symlink_in_the_folder_is_caught(
    live: Live,
) -> None:
    def answer(req: PermissionRequest) -> Choice:
        # Deny the writes; let the final `ls` look at the guest's /etc so the
        # test can see nothing was written there.
        return Choice.ALLOW_ONCE if req.command and req.command.startswith("ls ") else Choice.DENY

    outcome = await live.run(
        "configure the system",
        ToolCalls([write("etc-link/piwork-evil.conf", "pwned\n", id="call_write_etc")]),
        ToolCalls([bash("echo pwned > etc-link/piwork-evil2.conf", id="call_bash_etc")]),
        # A link made and written through in one command: up -> /mnt, the host's task state.
        ToolCalls([bash(f"mkdir -p a/b && cd a/b && {LN_TRICK}", id="call_ln_trick")]),
        ToolCalls([bash("ls /etc/piwork-evil.conf /etc/piwork-evil2.conf", id="call_ls")]),
        Text("could not"),
        answer=answer,
    )
    assert outcome.ok, outcome
    write_req, bash_req, ln_req, ls_req = live.person.requests
    for req, op in ((write_req, "write"), (bash_req, "write")):
        assert req.action is Action.OUTSIDE_SCOPE, req.payload
        assert any(
            t.action is Action.OUTSIDE_SCOPE and t.op == op and t.path is not None
            and t.path.startswith("/etc/piwork-evil")
            for t in req.targets
        ), req.targets  # fmt: skip
    assert write_req.tool == "write" and write_req.paths == ("/etc/piwork-evil.conf",)
    assert "/etc/piwork-evil2.conf" in bash_req.paths
    assert ln_req.action is Action.OUTSIDE_SCOPE, ln_req.targets
    assert any(t.action is Action.OUTSIDE_SCOPE and t.path == "/mnt" for t in ln_req.targets)
    assert ls_req.action is Action.OUTSIDE_SCOPE

    by_id = {x.id: x.result or "" for x in last_exchanges(live.server)}
    assert "Permission denied by the user" in by_id["call_write_etc"]
    assert "Permission denied by the user" in by_id["call_bash_etc"]
    assert "Permission denied by the user" in by_id["call_ln_trick"]
    assert live.session.task is not None
    assert not (live.session.task.state_dir / "pwned.txt").exists()
    assert not (live.folder / "up").is_symlink()
    # Nothing reached the guest's /etc.
    assert "No such file" in by_id["call_ls"], by_id["call_ls"]
    assert by_id["call_ls"].count("No such file") == 2
    assert (live.folder / "etc-link").read_text() == "/etc"
    denied = [
        e
        for e in audit_entries(live.paths, live.task_id)
        if e["action"] == "outside-scope" and e["decision"] == "deny"
    ]
    assert {e["toolCallId"] for e in denied} >= {"call_write_etc", "call_bash_etc", "call_ln_trick"}


async def test_always_allow_in_the_folder_persists_so_a_second_run_does_not_ask(
    live: Live, model_server: ScriptedModelServer
) -> None:
    target = live.folder / "always.txt"
    target.write_text("first\n")
    outcome = await live.run(
        "delete always.txt",
        ToolCalls([bash("rm always.txt", id="call_always_1")]),
        Text("deleted"),
        answer=Choice.ALWAYS_FOLDER,
    )
    assert outcome.ok, outcome
    assert not target.exists()
    [req] = live.person.requests
    assert req.action is Action.DELETE
    [rule] = policy_rules(live.paths)
    assert rule["action"] == "delete" and rule["verdict"] == "allow"
    assert rule["scope"] == "folder" and rule["scopeValue"] == str(live.folder.resolve())
    assert rule["pattern"] == f"{GUEST_WORK}/always.txt"

    # A second run (a new task, a new VM) in the same folder, same host policy.
    target.write_text("second\n")
    (live.folder / "other.txt").write_text("keep\n")
    person = Person(permission=Choice.DENY)
    events: list[RunEvent] = []
    model_server.script = per_prompt(
        ToolCalls([bash("rm always.txt", id="call_always_2")]),
        ToolCalls([bash("rm other.txt", id="call_other")]),
        Text("done"),
    )
    second = TaskSession(
        run_request(live.folder, model_server), events.append, as_asker(person), paths=live.paths
    )
    async with second:
        assert second.task is not None and second.task.id != live.task_id
        outcome = await asyncio.wait_for(second.run_prompt("delete again"), timeout=300)
        task_id = second.task.id
        closing = time.monotonic()
    # The guest powers itself off (no waiting out the host's timeout, then QMP quit).
    assert time.monotonic() - closing < 10
    assert outcome.ok, outcome
    assert not target.exists(), "the remembered delete did not run"
    assert (live.folder / "other.txt").read_text() == "keep\n"
    # Only the other file was asked about: the rule is the exact path, not "any delete".
    assert [r.targets[0].path for r in person.requests] == [f"{GUEST_WORK}/other.txt"]
    entries = audit_entries(live.paths, task_id)
    by_call = {e["toolCallId"]: e for e in entries}
    assert by_call["call_always_2"]["decidedBy"] == "rule"
    assert by_call["call_always_2"]["decision"] == "allow"
    assert by_call["call_always_2"]["rule"] == rule["id"]
    assert by_call["call_other"]["decidedBy"] == "person"
    assert by_call["call_other"]["decision"] == "deny"
    decided = [e.data for e in events if e.kind is EventKind.PERMISSION]
    assert {"decision": "Allow once", "by": "rule"}.items() <= decided[0].items()


async def test_assume_yes_allows_what_the_policy_asks_and_is_audited_as_such(live: Live) -> None:
    """``--yes`` (AllowAsker): no person was asked, so the audit must not say one was."""
    (live.folder / "yes.txt").write_text("x\n")
    live.session.asker = AllowAsker()
    try:
        outcome = await live.run(
            "delete yes.txt", ToolCalls([bash("rm yes.txt", id="call_yes")]), Text("gone")
        )
    finally:
        live.session.asker = as_asker(live.person)
    assert outcome.ok, outcome
    assert not (live.folder / "yes.txt").exists()
    assert live.person.requests == []
    [entry] = [e for e in audit_entries(live.paths, live.task_id) if e["toolCallId"] == "call_yes"]
    assert entry["decision"] == "allow" and entry["choice"] == "Allow once"
    assert entry["decidedBy"] == "assume-yes"
    decided = [e.data for e in live.events if e.kind is EventKind.PERMISSION]
    assert decided[-1]["by"] == "assume-yes"
    assert transcript(live.paths, live.task_id, "permission")[-1]["by"] == "assume-yes"


async def test_stop_while_a_permission_dialog_is_open_ends_cancelled_within_seconds(
    live: Live,
) -> None:
    keep = live.folder / "keep-on-stop.txt"
    keep.write_text("still here\n")
    asked = asyncio.Event()

    async def never(req: PermissionRequest) -> Choice:
        asked.set()
        await asyncio.Event().wait()  # the person walked away
        raise AssertionError("unreachable")

    run = asyncio.ensure_future(
        live.run(
            "delete keep-on-stop.txt",
            ToolCalls([bash("rm keep-on-stop.txt", id="call_stop")]),
            Text("should never be reached"),
            answer=never,
        )
    )
    try:
        await asyncio.wait_for(asked.wait(), timeout=120)
        t = time.monotonic()
        await live.session.stop()
        outcome = await asyncio.wait_for(asyncio.shield(run), timeout=30)
        took = time.monotonic() - t
    finally:
        if not run.done():
            run.cancel()
    assert outcome.status == "stopped" and outcome.reason == "cancelled", outcome
    assert took < 8.0, f"stop took {took:.1f} s with a dialog open"
    assert keep.read_text() == "still here\n"
    [req] = live.person.requests
    assert req.tool_call_id == "call_stop"
    [entry] = [e for e in audit_entries(live.paths, live.task_id) if e["toolCallId"] == "call_stop"]
    assert entry["decision"] == "cancelled" and entry["decidedBy"] == "cancelled"
    assert live.session.agent is not None and not live.session.agent.open_dialogs()
    # Front ends and the transcript learn the open question is gone.
    decided = [e.data for e in live.events if e.kind is EventKind.PERMISSION]
    assert [(d["decision"], d["by"]) for d in decided] == [
        ("ask", None),
        ("cancelled", "cancelled"),
    ]
    noted = transcript(live.paths, live.task_id, "permission")[-1]
    assert {"action": "delete", "decision": "cancelled", "by": "cancelled"}.items() <= noted.items()

    # The session is still usable, and the model learns the call was cancelled.
    outcome = await live.run("are you there?", Text("yes"))
    assert outcome.ok, outcome
    history = ChatRequest(body=live.server.chat_requests[-1].body, headers={}).tool_exchanges(
        since_last_user=False
    )
    [stopped] = [x for x in history if x.id == "call_stop"]
    assert stopped.result is not None and "rm keep-on-stop.txt" in stopped.result
    assert "Permission denied" not in stopped.result
    assert keep.exists()


# --------------------------------------------------------------------------- headless CLI


async def test_headless_run_without_a_terminal_denies_and_says_so(
    tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    home = tmp_path / "home"
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "headless.txt").write_text("keep\n")
    write_providers(home / "config", model_server)
    model_server.script = per_prompt(
        ToolCalls([bash("rm headless.txt", id="call_headless")]),
        Text("I could not delete it."),
    )
    code, out, err = await piwork(
        home, "run", "delete headless.txt", "--folder", str(folder), "--model", "scripted/scripted"
    )
    assert code == 0, err[-3000:]
    assert (folder / "headless.txt").read_text() == "keep\n"
    assert "no terminal to ask on" in err and "--yes or --policy" in err
    assert "Deny (no terminal to ask)" in err, err[-3000:]
    assert "I could not delete it." in out
    [exchange] = last_exchanges(model_server)
    assert "Permission denied by the user" in (exchange.result or "")
    paths = private_paths(home.resolve())
    [entry] = [e for e in AuditLog(paths.audit_log).read() if e["toolCallId"] == "call_headless"]
    assert entry["decision"] == "deny" and entry["decidedBy"] == "no-terminal"
    assert entry["target"] == f"{GUEST_WORK}/headless.txt"


async def test_headless_run_with_a_policy_file_decides_from_it(
    tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    home = tmp_path / "home"
    folder = tmp_path / "project"
    folder.mkdir()
    for name in ("allowed.txt", "denied.txt"):
        (folder / name).write_text("x\n")
    write_providers(home / "config", model_server)
    policy = tmp_path / "ci-policy.json"
    rule = {
        "id": "r-ci-delete",
        "action": "delete",
        "verdict": "allow",
        "scope": "global",
        "scopeValue": None,
        "pattern": "allowed.txt",
        "created": "2025-01-01T00:00:00+00:00",
    }
    policy.write_text(json.dumps({"version": 1, "rules": [rule]}))
    model_server.script = per_prompt(
        ToolCalls([bash("rm allowed.txt", id="call_policy_allowed")]),
        ToolCalls([bash("rm denied.txt", id="call_policy_denied")]),
        Text("done"),
    )
    code, out, err = await piwork(
        home, "run", "clean up", "--folder", str(folder), "--model", "scripted/scripted",
        "--policy", str(policy), "--json",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    assert not (folder / "allowed.txt").exists()
    assert (folder / "denied.txt").read_text() == "x\n"
    events = [json.loads(line) for line in out.splitlines()]
    decided = [e for e in events if e["event"] == "permission" and e["decision"] != "ask"]
    assert [(e["target"], e["decision"], e["by"]) for e in decided] == [
        ("rm allowed.txt", "Allow once", "rule"),
        ("rm denied.txt", "Deny", "no-terminal"),
    ]
    assert decided[0]["rule"] == "allow delete allowed.txt (global)"
    by_id = {x.id: x.result or "" for x in last_exchanges(model_server)}
    assert "Permission denied" not in by_id["call_policy_allowed"]
    assert "Permission denied by the user" in by_id["call_policy_denied"]
    # The person's own policy was neither read nor written.
    assert json.loads(policy.read_text())["rules"] == [rule]
    assert not private_paths(home.resolve()).policy_file.exists()
