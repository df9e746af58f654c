"""The permission issue's acceptance, in real VMs: the real pi with the gate
extension, a scripted model, the host policy, and the person played by a
``ScriptedAsker``.

Boots (TCG, ~30-40 s each): one shared session for prompt / deny / allow once /
outside the folder / "Always allow" / stop; a second run for "Always allow
persists"; two headless CLI runs (no terminal; ``--policy FILE``). Deletes are
asked from the change set of the turn that made them (issue 34).
"""

from __future__ import annotations

import asyncio
import json
import os
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
    # The person's link, pointing out of the folder: the read-only share shows it as
    # a link (security_model=none), and in the guest it leads to the guest's /etc.
    (folder / "etc-link").symlink_to("/etc")
    # The files the tests' agent deletes are the person's before the task begins: a file
    # the person adds or changes during a task is theirs (the guest caches what it read
    # of the folder, so piwork cannot tell which version the agent acted on), and the
    # agent's delete of it is a conflict that keeps the person's file (docs/change-sets.md).
    for name in ("victim.txt", "once-a.txt", "once-b.txt", "yes.txt", "keep-on-stop.txt"):
        (folder / name).write_text("precious\n" if name == "victim.txt" else "x\n")
    (folder / "always.txt").write_text("first\n")
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
#
# The gate no longer asks about the folder (issue 34): what the agent changed
# there arrives as a change set at the next model call, and a delete or a move
# is asked then, by the host, naming the exact paths (tool "changes"). The
# agent's copy keeps its change whatever the answer; the person's folder keeps
# theirs unless they allow it.


def change_questions(person: Person) -> list[PermissionRequest]:
    return [r for r in person.requests if r.tool == "changes"]


def by_target(paths: Paths, task_id: str, target: str) -> list[dict[str, Any]]:
    return [e for e in audit_entries(paths, task_id) if e["target"].endswith(target)]


async def test_a_delete_is_asked_from_its_change_set_and_deny_keeps_the_file(
    live: Live,
) -> None:
    victim = live.folder / "victim.txt"
    outcome = await live.run(
        "delete victim.txt",
        ToolCalls([bash("rm victim.txt", id="call_rm_deny")]),
        Text("I deleted it."),
        answer=Choice.DENY,
    )
    assert outcome.ok, outcome
    assert victim.read_text() == "precious\n"

    # The person was asked exactly once, about a delete of that file, by the host.
    [req] = live.person.requests
    assert req.action is Action.DELETE and req.tool == "changes"
    assert req.task_id == live.task_id and req.tool_call_id is None
    assert [(t.action, t.path) for t in req.targets] == [
        (Action.DELETE, f"{GUEST_WORK}/victim.txt")
    ]
    assert "delete: victim.txt" in req.question
    assert "<piwork-permission" not in req.question
    # The command ran in the agent's copy: its tool result is the command's own.
    assert [e["ok"] for e in live.tool_ends()] == [True]

    # Audited and in the transcript; nothing persisted.
    [entry] = by_target(live.paths, live.task_id, "/victim.txt")
    assert entry["decision"] == "deny" and entry["decidedBy"] == "person"
    assert entry["action"] == "delete" and entry["choice"] == "Deny"
    noted = transcript(live.paths, live.task_id, "permission")
    assert {"action": "delete", "decision": "Deny", "by": "person"}.items() <= noted[-1].items()
    assert policy_rules(live.paths) == []


async def test_allow_once_deletes_and_asks_again_next_time(live: Live) -> None:
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
    assert [r.targets[0].path for r in change_questions(live.person)] == [
        f"{GUEST_WORK}/once-a.txt",
        f"{GUEST_WORK}/once-b.txt",
    ]
    # "Allow once" is not remembered.
    assert policy_rules(live.paths) == []
    for name in ("once-a.txt", "once-b.txt"):
        [entry] = by_target(live.paths, live.task_id, f"/{name}")
        assert entry["choice"] == "Allow once" and entry["decidedBy"] == "person"


async def test_what_the_agent_writes_outside_the_folder_is_its_own_and_a_link_out_waits(
    live: Live,
) -> None:
    """The guest's own file system (its /etc through the person's link, /tmp) is the
    task's: nothing asks. A link the agent makes pointing out of the folder waits."""
    outcome = await live.run(
        "configure the system",
        ToolCalls([write("etc-link/piwork-evil.conf", "pwned\n", id="call_write_etc")]),
        ToolCalls([bash("echo pwned > etc-link/piwork-evil2.conf", id="call_bash_etc")]),
        ToolCalls([bash(f"mkdir -p a/b && cd a/b && {LN_TRICK}", id="call_ln_trick")]),
        ToolCalls([bash("ls /etc/piwork-evil2.conf", id="call_ls")]),
        Text("done"),
        answer=Choice.DENY,
    )
    assert outcome.ok, outcome
    assert live.person.requests == []
    by_id = {x.id: x.result or "" for x in last_exchanges(live.server)}
    # bash wrote through the person's link into the guest's own /etc (pi's write tool
    # did not land there in this run: where it went is not checked here)
    assert "No such file" not in by_id["call_ls"], by_id["call_ls"]
    assert_host_untouched(live.folder)
    from piwork.changes.api import waiting_changes

    waiting = {w.path: w.why for w in waiting_changes(live.task_id, paths=live.paths)}
    assert waiting.get("up") == "a link that points outside the folder", waiting


def assert_host_untouched(folder: Path) -> None:
    assert not Path("/etc/piwork-evil.conf").exists()
    assert not Path("/etc/piwork-evil2.conf").exists()
    assert not (folder / "up").is_symlink() and not (folder / "up").exists()
    assert (folder / "etc-link").is_symlink() and os.readlink(folder / "etc-link") == "/etc"


async def test_always_allow_in_the_folder_persists_so_a_second_run_does_not_ask(
    live: Live, model_server: ScriptedModelServer
) -> None:
    target = live.folder / "always.txt"
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
    assert time.monotonic() - closing < 10
    assert outcome.ok, outcome
    assert not target.exists(), "the remembered delete did not happen"
    assert (live.folder / "other.txt").read_text() == "keep\n"
    # Only the other file was asked about: the rule is the exact path, not "any delete".
    assert [r.targets[0].path for r in person.requests] == [f"{GUEST_WORK}/other.txt"]
    [remembered] = by_target(live.paths, task_id, "/always.txt")
    assert remembered["decidedBy"] == "rule" and remembered["decision"] == "allow"
    assert remembered["rule"] == rule["id"]
    [other] = by_target(live.paths, task_id, "/other.txt")
    assert other["decidedBy"] == "person" and other["decision"] == "deny"


async def test_assume_yes_allows_what_the_policy_asks_and_is_audited_as_such(live: Live) -> None:
    """``--yes`` (AllowAsker): no person was asked, so the audit must not say one was."""
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
    [entry] = by_target(live.paths, live.task_id, "/yes.txt")
    assert entry["decision"] == "allow" and entry["choice"] == "Allow once"
    assert entry["decidedBy"] == "assume-yes"
    decided = [e.data for e in live.events if e.kind is EventKind.PERMISSION]
    assert decided[-1]["by"] == "assume-yes"
    assert transcript(live.paths, live.task_id, "permission")[-1]["by"] == "assume-yes"


async def test_stop_while_a_change_set_question_is_open_ends_cancelled_within_seconds(
    live: Live,
) -> None:
    keep = live.folder / "keep-on-stop.txt"
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
    assert took < 8.0, f"stop took {took:.1f} s with a question open"
    assert keep.read_text() == "x\n"
    [req] = live.person.requests
    assert req.tool == "changes" and req.targets[0].path == f"{GUEST_WORK}/keep-on-stop.txt"
    [entry] = by_target(live.paths, live.task_id, "/keep-on-stop.txt")
    assert entry["decision"] == "cancelled" and entry["decidedBy"] == "cancelled"
    decided = [e.data for e in live.events if e.kind is EventKind.PERMISSION]
    assert [(d["decision"], d["by"]) for d in decided] == [
        ("ask", None),
        ("cancelled", "cancelled"),
    ]
    # The delete waits for the person (piwork apply), and the session is still usable.
    from piwork.changes.api import waiting_changes

    assert "keep-on-stop.txt" in {w.path for w in waiting_changes(live.task_id, paths=live.paths)}
    outcome = await live.run("are you there?", Text("yes"))
    assert outcome.ok, outcome
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
    # Nobody to ask: the delete is not made in the folder, the run says it waits.
    assert (folder / "headless.txt").read_text() == "keep\n"
    assert "no terminal to ask on" in err and "--yes or --policy" in err
    assert "waiting for you" in err and "piwork apply" in err, err[-3000:]
    assert "I could not delete it." in out
    paths = private_paths(home.resolve())
    audit = AuditLog(paths.audit_log).read()
    [entry] = [e for e in audit if e["target"].endswith("/headless.txt")]
    assert entry["decision"] == "deny" and entry["decidedBy"] == "no-terminal"
    # `piwork apply` applies it later.
    task = json.loads((await piwork(home, "tasks", "list", "--all", "--json"))[1])
    task_id = task[0]["id"] if isinstance(task, list) else task["tasks"][0]["id"]
    code, out, err = await piwork(home, "apply", task_id, "--yes")
    assert code == 0, err
    assert not (folder / "headless.txt").exists()


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
        (f"changes {GUEST_WORK}/allowed.txt", "Allow once", "rule"),
        (f"changes {GUEST_WORK}/denied.txt", "Deny", "no-terminal"),
    ]
    assert decided[0]["rule"] == "allow delete allowed.txt (global)"
    waiting = [e for e in events if e["event"] == "changes" and e.get("waiting")]
    assert [w["path"] for e in waiting for w in e["waiting"]] == ["denied.txt"]
    # The person's own policy was neither read nor written.
    assert json.loads(policy.read_text())["rules"] == [rule]
    assert not private_paths(home.resolve()).policy_file.exists()
