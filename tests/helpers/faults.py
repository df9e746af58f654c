"""The fault suite's shared task (``Story``) and what must hold after every fault."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from piwork.config import Paths
from piwork.models.providers import Provider
from piwork.models.scripted import (
    ChatRequest,
    ScriptedModelServer,
    Step,
    Text,
)
from piwork.policy import Choice
from piwork.policy.store import PolicyStore
from piwork.runner import Asker, RunEvent, RunRequest, TaskSession
from piwork.tasks import TaskStatus, TaskStore
from piwork.tasks.transcript import Record, read_records
from tests.helpers.vm import ScriptedAsker, scripted_provider


@dataclass
class Story:
    paths: Paths
    folder: Path
    server: ScriptedModelServer
    task_id: str | None = None
    records: list[Record] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    def request(self) -> RunRequest:
        return RunRequest(
            prompt=None,
            folder=self.folder if self.task_id is None else None,
            task_id=self.task_id,
            model="scripted/scripted",
            title="faults",
            extra_providers=(cast(Provider, scripted_provider(self.server)),),
        )


def counting(*steps: Step) -> Callable[[ChatRequest], Step]:
    """The n-th model call (of this script) gets steps[n]; the last step repeats."""
    calls = [0]

    def choose(_req: ChatRequest) -> Step:
        step = steps[min(calls[0], len(steps) - 1)]
        calls[0] += 1
        return step

    return choose


def processes_of(task_id: str, ports: tuple[int, ...]) -> list[tuple[int, str]]:
    """Live processes that belong to this task's VM: its QEMU (named after the task)
    and anything started with its gateway/egress port as the last argument (the
    per-connection relays of the old guestfwd design; the netmux starts none)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().split(") ", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z":
            continue
        cmd = raw.replace(b"\0", b" ").decode("utf-8", "replace")
        relay = any(cmd.rstrip().endswith(f" {p}") for p in ports)
        if f"piwork-{task_id}" in cmd or relay:
            found.append((int(entry), cmd[:120]))
    return found


async def assert_no_orphans(task_id: str, ports: tuple[int, ...]) -> None:
    left: list[tuple[int, str]] = []
    for _ in range(50):  # children reaped by their parents' exit can lag a moment
        left = processes_of(task_id, ports)
        if not left:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"orphan processes of task {task_id}: {left}")


def check_after_fault(story: Story) -> TaskStore:
    """task.json and the policy parse; every transcript line seen before is still there."""
    assert story.task_id is not None
    store = TaskStore(story.paths.tasks)
    record = store.get(story.task_id).record  # parses and validates task.json
    assert record.status is not TaskStatus.RUNNING, record.status
    PolicyStore(story.paths.policy_file).load()  # parses (or is absent: no rules)
    after, problems = read_records(store.get(story.task_id).transcript_path)
    assert problems == [], problems
    before = story.records
    assert [(r.seq, r.kind, r.data) for r in after[: len(before)]] == [
        (r.seq, r.kind, r.data) for r in before
    ], "a transcript line written before the fault was lost or changed"
    seqs = [r.seq for r in after]
    assert seqs == sorted(set(seqs))
    story.records = after
    return store


def ports_of(session: TaskSession) -> tuple[int, ...]:
    gateway = session.gateway
    return (gateway.port,) if gateway is not None else ()


async def open_session(
    story: Story, events: list[RunEvent], asker: object | None = None
) -> TaskSession:
    session = TaskSession(
        story.request(),
        events.append,
        cast(Asker, asker or ScriptedAsker(permission=Choice.ALLOW_ONCE)),
        paths=story.paths,
    )
    await asyncio.wait_for(session.__aenter__(), 300)
    return session


async def resume_to_completion(
    story: Story, events: list[RunEvent], prompt: str, answer: str
) -> None:
    """Resume the story's task in a new VM and run one prompt to completion; then the
    task is stopped (completed), its files parse and nothing of its VM is left."""
    events.clear()
    session = await open_session(story, events)
    ports = ports_of(session)
    try:
        story.server.script = counting(Text(answer))
        outcome = await asyncio.wait_for(session.run_prompt(prompt), 180)
        assert outcome.ok, outcome
    finally:
        await session.__aexit__(None, None, None)
    store = check_after_fault(story)
    assert story.task_id is not None
    assert store.get(story.task_id).record.status is TaskStatus.STOPPED
    await assert_no_orphans(story.task_id, ports)
