"""A policy the host cannot read is never a looser policy (issue 28, item 5), in real VMs.

The new user's story from the issue, with the real pi, its gate extension and the
scripted model: the person denies writes in ``secret/`` for their folder, then
``policy.json`` is truncated (another tool's crash, a bad sync). Before, piwork moved
the file aside, ran the next task on the built-in defaults alone (which allow writes in
the folder) and the denied write was made; ``piwork policy list`` said "no rules",
exit 0.

Boots (TCG): one in-process session (the rule denies; the file is damaged mid-run: the
next write is denied and the run ends), then the CLI: the next run refuses with one line
and boots nothing, ``policy list`` fails, ``policy restore`` brings the rule back, and a
last run (one more boot) is denied by it again.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import cast

import pytest

from piwork.models.providers import Provider
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Text, ToolCalls, write
from piwork.policy import AuditLog, PolicyStore, Rule, Scope, Verdict
from piwork.policy.rules import Action
from piwork.runner import EventKind, RunEvent, RunRequest, TaskSession
from tests.helpers.cli import make_home, run_cli
from tests.helpers.vm import ScriptedAsker, per_prompt, private_paths, scripted_provider

pytestmark = pytest.mark.vm

GUEST_SECRET = "/mnt/work/secret/plan.txt"


def _results(server: ScriptedModelServer) -> dict[str, str]:
    last = server.chat_requests[-1]
    exchanges = ChatRequest(body=last.body, headers=last.headers).tool_exchanges()
    return {x.id: x.result or "" for x in exchanges}


async def test_a_truncated_policy_never_lets_the_denied_write_through(
    tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    home = tmp_path / "home"
    folder = tmp_path / "project"
    (folder / "secret").mkdir(parents=True)
    env = make_home(tmp_path, model_server)
    paths = private_paths(home.resolve())
    secret = folder / "secret" / "plan.txt"

    # The person's rule, as they would set it.
    code, out, err = await run_cli(
        env, "policy", "deny", "write", "secret/**", "--folder", str(folder)
    )
    assert code == 0, err
    policy = paths.policy_file
    good = policy.read_bytes()

    # -- a live task: the rule denies; then the file is damaged under it.
    events: list[RunEvent] = []
    person = ScriptedAsker()  # never asked: the rule decides, then the damage does
    req = RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        extra_providers=(cast(Provider, scripted_provider(model_server)),),
    )
    async with TaskSession(req, events.append, person, paths=paths) as session:  # type: ignore[arg-type]
        model_server.script = per_prompt(
            ToolCalls([write("secret/plan.txt", "by the rule\n", id="call_rule")]), Text("ok")
        )
        outcome = await asyncio.wait_for(session.run_prompt("write the plan"), 600)
        assert outcome.ok, outcome
        assert not secret.exists()
        assert "Permission denied" in _results(model_server)["call_rule"]

        policy.write_bytes(good[: len(good) // 3])  # truncated by something else
        model_server.script = per_prompt(
            ToolCalls([write("secret/plan.txt", "on the defaults\n", id="call_damaged")]),
            Text("ok"),
        )
        outcome = await asyncio.wait_for(session.run_prompt("write it again"), 600)
        assert not outcome.ok, "the run ends: nothing more is decided on a damaged policy"
        assert outcome.message is not None and "piwork policy restore" in outcome.message
        task_id = outcome.task_id
    assert not secret.exists(), "the write the person denied was made"
    assert person.permissions == []
    errors = [e.data["message"] for e in events if e.kind is EventKind.ERROR]
    assert any(str(policy) in m and "damaged" in m for m in errors), errors
    decided = [
        (e["decision"], e["decidedBy"])
        for e in AuditLog(paths.audit_log).read()
        if e.get("task") == task_id and e.get("action") == "write"
    ]
    assert decided == [("deny", "rule"), ("deny", "unusable-policy")]

    # -- the next run, as a person starts it: refused before anything boots.
    model_server.script = per_prompt(
        ToolCalls([write("secret/plan.txt", "next run\n", id="call_next")]), Text("done")
    )
    calls_before = len(model_server.chat_requests)
    tasks_before = sorted(p.name for p in paths.tasks.iterdir())
    code, out, err = await run_cli(
        env, "run", "write the plan", "--folder", str(folder),
        "--model", "scripted/scripted", "--yes", timeout=400,
    )  # fmt: skip
    assert code == 1, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    [line] = lines
    assert line.startswith(f"piwork: the policy file {policy} is damaged")
    assert "policy.json.damaged-" in line and "`piwork policy restore`" in line
    assert not secret.exists()
    assert len(model_server.chat_requests) == calls_before, "no model call: nothing ran"
    assert sorted(p.name for p in paths.tasks.iterdir()) == tasks_before, "no task was made"

    # -- `policy list` says what happened, and fails.
    code, out, err = await run_cli(env, "policy", "list")
    assert code == 1 and out == ""
    assert "damaged" in err and str(policy) in err and "piwork policy restore" in err

    # -- the way back.
    code, out, err = await run_cli(env, "policy", "restore")
    assert code == 0, err
    assert "1 rule(s)" in out and "the damaged file is kept at" in out
    assert [r.pattern for r in PolicyStore(policy).load()] == ["secret/**"]
    code, out, err = await run_cli(env, "policy", "list", "--json")
    assert code == 0
    [rule] = json.loads(out)["rules"]
    assert Rule.from_json(rule).verdict is Verdict.DENY
    assert Rule.from_json(rule).scope == Scope.folder(folder)
    assert Rule.from_json(rule).action is Action.WRITE

    # -- and the next run is denied by it again, with --yes.
    code, out, err = await run_cli(
        env, "run", "write the plan", "--folder", str(folder),
        "--model", "scripted/scripted", "--yes", timeout=400,
    )  # fmt: skip
    assert code == 0, err[-3000:]
    assert not secret.exists()
    assert "Permission denied" in _results(model_server)["call_next"]
