"""Four tasks at once (issue 11), each in its own VM and folder, one data dir; two of
them ask the person a permission question (one allowed, one denied). Nothing crosses
over: events, questions, files, transcripts and usage stay with their task.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import cast

import pytest

from piwork.config import Paths, get_paths
from piwork.models.providers import Provider
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash
from piwork.policy import Choice
from piwork.policy.request import PermissionRequest
from piwork.policy.rules import Action
from piwork.runner import Asker, EventKind, Outcome, RunEvent, RunRequest, TaskSession
from piwork.tasks import TaskStore
from piwork.tasks.transcript import read_records
from tests.helpers.vm import ScriptedAsker, scripted_provider

pytestmark = pytest.mark.vm

TASKS = 4
ASKING = {0: Choice.ALLOW_ONCE, 1: Choice.DENY}  # tasks whose model deletes a file


def steps_for(n: int) -> list[Step]:
    steps: list[Step] = [ToolCalls([bash(f"echo task-{n} > mark.txt")])]
    if n in ASKING:
        steps.append(ToolCalls([bash("rm victim.txt")]))
    steps.append(Text(f"done task-{n}"))
    return steps


def script(req: ChatRequest) -> Step:
    found = re.search(r"task-(\d)", req.last_user_text)
    assert found is not None, req.last_user_text
    steps = steps_for(int(found.group(1)))
    return steps[min(req.assistant_turns_since_user, len(steps) - 1)]


async def run_one(
    n: int, folder: Path, paths: Paths, server: ScriptedModelServer
) -> tuple[Outcome, str, list[RunEvent], ScriptedAsker]:
    events: list[RunEvent] = []
    asker = ScriptedAsker(permission=ASKING.get(n, Choice.DENY))
    req = RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        title=f"task-{n}",
        extra_providers=(cast(Provider, scripted_provider(server)),),
    )
    async with TaskSession(req, events.append, cast(Asker, asker), paths=paths) as session:
        assert session.task is not None
        outcome = await session.run_prompt(f"task-{n}: leave your mark")
        return outcome, session.task.id, events, asker


async def test_four_tasks_at_once_keep_to_themselves(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    paths = Paths(
        data=home / "data", cache=get_paths().cache, state=home / "state", config=home / "config"
    )
    folders = [tmp_path / f"folder-{n}" for n in range(TASKS)]
    for folder in folders:
        folder.mkdir()
        (folder / "victim.txt").write_text("keep me\n")
    model_server.script = script
    results = await asyncio.wait_for(
        asyncio.gather(*(run_one(n, folders[n], paths, model_server) for n in range(TASKS))),
        600,
    )
    ids = [task_id for _, task_id, _, _ in results]
    assert len(set(ids)) == TASKS
    store = TaskStore(paths.tasks)
    for n, (outcome, task_id, events, asker) in enumerate(results):
        assert outcome.ok, (n, outcome)
        # Files: its own mark in its own folder, the delete only where it was allowed.
        assert sorted(p.name for p in folders[n].iterdir()) == (
            ["mark.txt"] if n == 0 else ["mark.txt", "victim.txt"]
        ), n
        assert (folders[n] / "mark.txt").read_text() == f"task-{n}\n"
        # Questions: only the tasks whose model deleted were asked, once, about their file
        # (from the turn's change set, with the exact path: docs/change-sets.md).
        asked = [r for r in asker.permissions if isinstance(r, PermissionRequest)]
        if n in ASKING:
            deleted = [(Action.DELETE, "/mnt/work/victim.txt")]
            assert [[(t.action, t.path) for t in r.targets] for r in asked] == [deleted], n
        else:
            assert asked == [], n
        # Events: every one is this task's, and the text is its own.
        assert {e.task_id for e in events} == {task_id}
        text = "".join(str(e.data.get("delta", "")) for e in events if e.kind is EventKind.TEXT)
        assert text == f"done task-{n}", (n, text)
        decisions = [
            e.data["decision"]
            for e in events
            if e.kind is EventKind.PERMISSION and e.data.get("by") != "rule"
        ]
        if n in ASKING:
            assert decisions == ["ask", ASKING[n].value], (n, decisions)
        else:
            assert decisions == [], (n, decisions)
        # Transcript and usage: its own model calls, turns and nothing of the others.
        records, problems = read_records(store.get(task_id).transcript_path)
        assert problems == []
        blob = str([r.data for r in records])
        others = {f"task-{m}" for m in range(TASKS)} - {f"task-{n}"}
        assert not [o for o in others if o in blob], n
        calls = [r for r in records if r.kind == "model_call"]
        assert len(calls) == len(steps_for(n)), (n, len(calls))
        usage = store.get(task_id).record.usage
        assert usage.turns == len(steps_for(n)), (n, usage)
        assert usage.input_tokens == sum(c.data["inputTokens"] for c in calls)
        assert usage.output_tokens == sum(c.data["outputTokens"] for c in calls)
