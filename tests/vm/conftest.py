"""VM fixtures: the real pack, real QEMU (TCG here), the real pi.

What is shared, and how to use it
---------------------------------
A VM test pays for pi's work under TCG, and for a VM start: a cold boot takes
tens of seconds, a warm start (the saved VM, restored) about one. So:

* ``pack`` (tests/conftest.py, session): the runtime pack, built once per
  machine and source tree and cached by content hash.
* The saved VM (the warm-start template) is made by the first warm start of a
  pack and kept in the pack cache; every ``TaskSession`` and every
  ``agent_config(...)`` (tests/helpers/vm.py, ``warm_start=True`` by default)
  restores it. Ask for a cold boot (``warm_start=False``) only when the boot
  itself is under test.
* ``shared_agent`` (module): one booted VM with pi ready, for the tests of a
  module that can share it (prompts, RPCs, reconnects, host-side limits).
  Give it work through ``model_server`` and ``per_prompt(...)`` (which restarts
  the script at every user message, so the shared session's growth does not
  matter) and use names of your own in its folder: the module's other tests ran
  in the same VM before yours.
* ``model_server`` (module): the scripted OpenAI-compatible server, the test
  double for the remote LLM only. Before every test its script goes back to the
  one it was made with (``_fresh_script`` below): a test that forgets to script
  the model gets "nothing scripted yet", never the previous test's answers.
* ``vm_root`` (module): a temp dir for the module's VM files, removed after it.

A test that needs a VM of its own (a fault, a kill, a boot, another transport)
makes one with ``AgentVm(agent_config(pack, dirs, model_server, log_dir))`` or
runs a task through ``TaskSession``; helpers are in tests/helpers/vm.py.

scripts/test.sh runs the suite on two workers (pytest-xdist, ``--dist
loadfile``): a module's tests run on one worker, in file order, so module-scoped
fixtures are shared exactly as in a serial run; session-scoped ones exist once
per worker. Two VMs may run at once (the other worker's): a test must not count
every QEMU on the machine, only its own (``tests/helpers/procs.py``).
"""

from __future__ import annotations

import shutil
import weakref
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from piwork.agent import AgentVm
from piwork.models.scripted import Script, ScriptedModelServer, Text
from piwork.pack.manifest import Manifest
from tests.helpers.vm import agent_config, make_task_dirs, write_models_json


@pytest.fixture(scope="module")
async def model_server() -> AsyncIterator[ScriptedModelServer]:
    server = ScriptedModelServer([Text("nothing scripted yet")], model_id="scripted")
    async with server:
        yield server


_FIRST_SCRIPTS: weakref.WeakKeyDictionary[ScriptedModelServer, Script] = weakref.WeakKeyDictionary()


@pytest.fixture(autouse=True)
def _fresh_script(request: pytest.FixtureRequest) -> None:
    """A test that uses ``model_server`` starts with the script the server was made with."""
    if "model_server" not in request.fixturenames:
        return
    server: ScriptedModelServer = request.getfixturevalue("model_server")
    first = _FIRST_SCRIPTS.setdefault(server, server.script)
    server.script = first


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
