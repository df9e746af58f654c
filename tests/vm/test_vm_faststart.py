"""Warm start (issue 8): tasks restored from one saved VM, and every fallback to a cold boot.

The template lives next to the pack cache and is made by the first warm start
on a machine, so these tests (and the rest of the VM suite) share it.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from piwork.agent import GUEST_SESSION, AgentVm
from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, bash
from piwork.pack.manifest import Manifest
from piwork.rpc import models as m
from piwork.vm.template import META, RAM, STATE, default_root, template_for
from tests.helpers.vm import (
    agent_config,
    apply_changes,
    make_task_dirs,
    per_prompt,
    write_models_json,
)

pytestmark = pytest.mark.vm


async def test_two_restored_vms_at_once_each_work_in_their_own_folder_and_session(
    pack: tuple[Path, Manifest], model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    model_server.script = per_prompt(
        ToolCalls(
            [
                bash(
                    "ls /mnt/work > /tmp/s; echo $PIWORK_TASK_ID >> /tmp/s; "
                    "mv /tmp/s seen.txt; date +%Y"
                )
            ]
        ),
        Text("done"),
    )
    agents = []
    for name in ("one", "two"):
        dirs = make_task_dirs(tmp_path / name)
        write_models_json(dirs)
        assert dirs.work is not None
        (dirs.work / f"only-in-{name}.txt").write_text(name)
        cfg = agent_config(pack, dirs, model_server, tmp_path / name / "logs")
        cfg.task_id = f"task-{name}"
        agents.append(AgentVm(cfg))
    async with AsyncExitStack() as stack:
        # The first warm start on a machine makes the template; start them together.
        await asyncio.gather(*(stack.enter_async_context(a) for a in agents))
        for a in agents:
            assert a.boot_mode.get("warm") is True, a.boot_mode
            assert a.boot_mode["message"].startswith("restored in ")
        states = await asyncio.gather(*(a.wait_pi_ready() for a in agents))
        assert [s.session_file for s in states] == [GUEST_SESSION, GUEST_SESSION]
        events: list[list[object]] = [[], []]
        for a, ev in zip(agents, events, strict=True):
            a.rpc.add_listener(ev.append)
        await asyncio.gather(*(a.rpc.prompt("look around") for a in agents))
        await asyncio.gather(*(a.rpc.wait_idle(timeout=180) for a in agents))
        for name, a, ev in zip(("one", "two"), agents, events, strict=True):
            work = a.cfg.dirs.work
            assert work is not None
            await apply_changes(a, work.parent / "task-dir")
            seen = (work / "seen.txt").read_text().split()
            assert seen == [f"only-in-{name}.txt", f"task-{name}"], seen
            # Each session file is in its own task's state folder, holding its own prompt.
            session = (a.cfg.dirs.state / "session.jsonl").read_text()
            assert "look around" in session
            # The guest's wall clock came from the host, not from the template's day.
            ends = [e for e in ev if isinstance(e, m.ToolExecutionEnd)]
            year = m.tool_outcome(ends[0]).text.strip()
            assert year == str(datetime.date.today().year)


async def test_a_truncated_state_file_boots_cold_and_the_task_still_runs(
    pack: tuple[Path, Manifest], model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    dirs = make_task_dirs(tmp_path / "task")
    write_models_json(dirs)
    cfg = agent_config(pack, dirs, model_server, tmp_path / "logs")
    shared = template_for(AgentVm(cfg).spec, default_root(pack[0]))
    shared.check()  # made by the test above (or any earlier warm start)
    # A private copy of the template with its state file cut short.
    root = tmp_path / "templates"
    broken = root / shared.dir.name
    broken.mkdir(parents=True)
    os.link(shared.ram, broken / RAM)
    shutil.copyfile(shared.dir / META, broken / META)
    data = shared.state.read_bytes()
    (broken / STATE).write_bytes(data[: len(data) // 2])
    cfg.template_root = root
    modes: list[str] = []
    agent = AgentVm(cfg, on_boot_mode=lambda msg, _data: modes.append(msg))
    async with agent:
        state = await agent.wait_pi_ready()
        assert state.session_file == GUEST_SESSION
    assert modes == ["cold boot: the saved VM's state file is truncated or changed"]
    assert not broken.exists(), "the broken template is moved away for the next task to remake"
    assert shared.dir.exists()
