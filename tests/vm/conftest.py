"""VM fixtures: the real pack, real QEMU (TCG here), the real pi.

One booted VM is shared by the tests of a module where the tests allow it;
the scripted model server (the test double for the remote LLM only) can be
given a new script per test.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from piwork.agent import AgentVm
from piwork.models.scripted import ScriptedModelServer, Text
from piwork.pack.manifest import Manifest
from tests.helpers.vm import agent_config, make_task_dirs, write_models_json


@pytest.fixture(scope="module")
async def model_server() -> AsyncIterator[ScriptedModelServer]:
    server = ScriptedModelServer([Text("nothing scripted yet")], model_id="scripted")
    async with server:
        yield server


@pytest.fixture(scope="module")
def vm_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("vm")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
async def shared_agent(
    pack: tuple[Path, Manifest], model_server: ScriptedModelServer, vm_root: Path
) -> AsyncIterator[AgentVm]:
    """One booted VM with pi ready, shared by a module's tests."""
    dirs = make_task_dirs(vm_root / "task")
    write_models_json(dirs)
    agent = AgentVm(agent_config(pack, dirs, model_server, vm_root / "logs"))
    async with agent:
        await agent.wait_pi_ready()
        yield agent
    assert not agent.vm.running
