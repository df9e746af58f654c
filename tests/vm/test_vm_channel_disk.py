"""Faults in a real VM (issue 11), one task through both, its data dir on a small tmpfs:

1. the host drops its connection to the guest channel (the virtio-serial socket)
   several times while pi streams an answer: the channel reconnects, the guest
   supervisor replays its ring, and every pi event arrives exactly once, in
   order; the run ends normally;
2. the disk holding the task's data fills up mid-run: the run stops with the
   "disk is full" error, nothing written before is lost, QEMU is gone, and once
   space is freed the task resumes and completes.

Drop points are drawn from a seeded generator (printed; set PIWORK_FAULT_SEED
to replay one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from piwork.config import Paths, get_paths
from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, bash, split_text
from piwork.rpc import models as m
from piwork.runner import EventKind, RunEvent
from piwork.tasks import TaskStatus, TaskStore
from piwork.tasks.transcript import read_records
from piwork.vm.channel import Endpoint
from tests.helpers.disk import SmallDisk
from tests.helpers.faults import (
    Story,
    assert_no_orphans,
    check_after_fault,
    counting,
    open_session,
    ports_of,
    resume_to_completion,
)
from tests.helpers.procs import alive

pytestmark = pytest.mark.vm

DISK_SIZE = "24m"  # room for a task (state share, logs, transcript); filled on purpose
WORDS = 160
DROPS = 3
RECONNECT_PAUSE = 0.5


@pytest.fixture(scope="module")
def small_data_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmallDisk]:
    mnt = tmp_path_factory.mktemp("small-data-disk")
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE},mode=0700", "tmpfs", str(mnt)],
        check=True,
    )
    try:
        yield SmallDisk(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="module")
async def story(
    model_server: ScriptedModelServer,
    small_data_disk: SmallDisk,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Story]:
    home = tmp_path_factory.mktemp("channel-disk-home")
    paths = Paths(
        data=small_data_disk.root / "data",
        cache=get_paths().cache,
        state=home / "state",
        config=home / "config",
    )
    yield Story(paths, tmp_path_factory.mktemp("channel-disk-folder"), model_server)
    model_server.chunk_delay = 0.0


class SlowEndpoint(Endpoint):
    """The channel's socket, opened after a pause (the guest keeps producing meanwhile)."""

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        await asyncio.sleep(RECONNECT_PAUSE)
        return await super().open()


def seeded() -> random.Random:
    seed = int(os.environ.get("PIWORK_FAULT_SEED") or time.time_ns() % 1_000_000)
    print(f"\n[fault seed] PIWORK_FAULT_SEED={seed}")
    return random.Random(seed)


async def test_channel_dropped_mid_stream_delivers_every_event_once_in_order(
    story: Story,
) -> None:
    rng = seeded()
    answer = " ".join(f"w{i:03d}" for i in range(WORDS))
    pieces = split_text(answer)
    drop_at = sorted(rng.sample(range(5, len(pieces) - 30), DROPS))
    print(f"dropping the channel after text pieces {drop_at} of {len(pieces)}")
    events: list[RunEvent] = []
    session = await open_session(story, events)
    assert session.task is not None and session.agent is not None
    story.task_id = session.task.id
    ports = ports_of(session)
    items: list[object] = []
    session.add_item_listener(items.append)
    channel = session.agent.channel
    # Each new connection waits a moment, so the guest has lines to replay; the
    # hello reply says how far the supervisor got (its lastSeq) beyond the host.
    channel.endpoint = SlowEndpoint(unix_path=channel.endpoint.unix_path)
    replayed: list[int] = []
    on_transient = channel._on_transient

    def count_replay(msg: dict[str, Any]) -> bool:
        if msg.get("ev") == "hello":
            replayed.append(int(msg["lastSeq"]) - channel.last_seq)
        return on_transient(msg)

    channel._on_transient = count_replay  # type: ignore[method-assign]
    try:
        story.server.chunk_delay = 0.05  # streamed slowly enough to cut into
        story.server.script = counting(Text(answer))
        run = asyncio.ensure_future(session.run_prompt("say the words"))
        drops: list[float] = []
        for at in drop_at:
            while sum(e.kind is EventKind.TEXT for e in events) < at:
                assert not run.done(), f"the answer ended before drop {len(drops) + 1}"
                await asyncio.sleep(0.01)
            t = time.monotonic()
            await channel.reconnect()  # the host end closes; a new connection says hello
            drops.append(time.monotonic() - t)
        outcome = await asyncio.wait_for(run, 120)
    finally:
        story.server.chunk_delay = 0.0
        await session.__aexit__(None, None, None)
    print(
        f"reconnected {len(drops)}x in {[round(d, 2) for d in drops]}s, the guest replayed "
        f"{replayed} lines; run: {outcome.reason}"
    )
    assert outcome.ok, outcome
    assert channel.reconnects >= DROPS and channel.gaps == []
    assert len(replayed) == DROPS and all(n > 0 for n in replayed), replayed
    # Exactly once, in order: a duplicate or a lost delta would change the text.
    deltas = [str(e.data["delta"]) for e in events if e.kind is EventKind.TEXT]
    assert "".join(deltas).strip() == answer and len(deltas) == len(pieces), deltas
    updates = [m.text_delta(i) for i in items if isinstance(i, m.MessageUpdate)]
    assert "".join(d for d in updates if d).strip() == answer
    # The transcript holds each of pi's lines once, too.
    store = check_after_fault(story)
    assert store.get(story.task_id).record.status is TaskStatus.STOPPED
    logged = [
        r.data["assistantMessageEvent"].get("delta", "")
        for r in story.records
        if r.kind == "pi"
        and r.data.get("type") == "message_update"
        and r.data["assistantMessageEvent"].get("type") == "text_delta"
    ]
    assert "".join(logged).strip() == answer
    await assert_no_orphans(story.task_id, ports)


async def test_disk_full_mid_run_stops_with_the_reason_and_the_task_resumes(
    story: Story, small_data_disk: SmallDisk
) -> None:
    assert story.task_id is not None, "runs after the channel test (same task)"
    events: list[RunEvent] = []
    session = await open_session(story, events)
    ports = ports_of(session)
    qemu = session.agent.vm.pid if session.agent is not None else None
    items: list[object] = []
    session.add_item_listener(items.append)
    ticks = "for i in $(seq 1 300); do echo tick-$i; sleep 0.2; done"
    try:
        story.server.script = counting(ToolCalls([bash(ticks)]), Text("ticked"))
        run = asyncio.ensure_future(session.run_prompt("tick for a minute"))
        deadline = time.monotonic() + 120
        while not any(
            isinstance(i, m.ToolExecutionUpdate) and "tick-3" in str(i.partial_result)
            for i in items
        ):
            assert time.monotonic() < deadline and not run.done(), "the ticks never streamed"
            await asyncio.sleep(0.05)
        story.records, _ = read_records(session.store.get(story.task_id).transcript_path)
        small_data_disk.fill()
        filled_at = time.monotonic()
        outcome = await asyncio.wait_for(run, 60)
        took = time.monotonic() - filled_at
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.__aexit__(None, None, None), 60)
    print(f"disk full: stopped in {took:.1f}s: {outcome.reason}: {outcome.message}")
    assert outcome.reason == "error", outcome
    said = outcome.message or ""
    assert said.startswith("the disk is full") and f"`piwork resume {story.task_id}`" in said
    assert outcome.status == "interrupted", outcome  # task.json could not say "stopped"
    assert [e for e in events if e.kind is EventKind.DONE], "no done event"
    assert qemu is not None and not alive(qemu), "QEMU outlived the stopped run"
    await assert_no_orphans(story.task_id, ports)

    small_data_disk.free()
    TaskStore(story.paths.tasks).mark_interrupted()  # as `piwork tasks` and resume do
    store = check_after_fault(story)
    assert store.get(story.task_id).record.status is TaskStatus.INTERRUPTED

    # Resumed once there is room again: the task completes in a new VM.
    await resume_to_completion(story, events, "go on", "back with room to write")
