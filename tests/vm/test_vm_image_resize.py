"""pi's image tool resizes in the guest (issue 18 item 6): real QEMU, real pi.

pi's ``read`` tool shrinks a picture larger than 2000 px with photon
(``@silvia-odwyer/photon-node``, WebAssembly) before the model sees it, and
says so in the tool result. The scripted model (the test double for the
remote LLM only) is declared vision-capable, asks pi to read a 2400x100 PNG,
and the test checks both what pi wrote and the picture itself: the PNG the
model received is 2000x83. Once with the agent alone, once through a whole
task run (permission gate, workbench disk, egress proxy), as a person runs it.

The scripts are linear (a step per assistant turn of the conversation), not
restarted at each user message: pi hands a tool result's picture to an
``openai-completions`` model as a user message ("Attached image(s) from tool
result:"), so a per-prompt script would ask for the picture again, forever.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from piwork.agent import AgentVm
from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, pi_provider_config, read
from piwork.pack.manifest import Manifest
from piwork.policy import Choice
from piwork.rpc import models as m
from piwork.runner import RunRequest, TaskSession
from piwork.tasks.model import Limits
from piwork.vm.command import GATEWAY_GUEST_ADDR
from tests.helpers.images import images_sent, png, png_size
from tests.helpers.vm import (
    SCRIPTED_PROVIDER,
    ScriptedAsker,
    agent_config,
    make_task_dirs,
    private_paths,
    prompt_events,
)

pytestmark = pytest.mark.vm

WIDTH, HEIGHT = 2400, 100
SHOWN = (2000, 83)  # pi's limit is 2000 px a side; 100 * 2000 / 2400 rounds to 83


def assert_resized(server: ScriptedModelServer) -> None:
    """The model's last request carries pi's note and the resized picture, once."""
    # What pi writes (dist/utils/image-resize.js formatDimensionNote).
    note = f"[Image: original {WIDTH}x{HEIGHT}, displayed at {SHOWN[0]}x{SHOWN[1]}."
    requests = server.chat_requests
    assert len(requests) == 2, f"{len(requests)} model requests"
    final = requests[-1].body
    assert note in json.dumps(final), json.dumps(final)[:2000]
    pictures = images_sent(final)
    assert len(pictures) == 1, f"{len(pictures)} images sent"
    assert png_size(pictures[0]) == SHOWN


@pytest.fixture
async def vision_agent(
    pack: tuple[Path, Manifest], model_server: ScriptedModelServer, tmp_path: Path
) -> AsyncIterator[AgentVm]:
    """A VM whose pi sees the scripted model as vision-capable (input text + image)."""
    dirs = make_task_dirs(tmp_path / "task")
    base = f"http://{GATEWAY_GUEST_ADDR[0]}/v1"
    provider = pi_provider_config(base, "scripted", "scripted vision model")
    provider["models"][0]["input"] = ["text", "image"]
    (dirs.state / "agent" / "models.json").write_text(
        json.dumps({"providers": {SCRIPTED_PROVIDER: provider}})
    )
    assert dirs.work is not None
    (dirs.work / "wide.png").write_bytes(png(WIDTH, HEIGHT))
    agent = AgentVm(agent_config(pack, dirs, model_server, tmp_path / "logs"))
    async with agent:
        await agent.wait_pi_ready()
        yield agent
    assert not agent.vm.running


async def test_pi_resizes_a_wide_png_before_the_model_sees_it(
    vision_agent: AgentVm, model_server: ScriptedModelServer
) -> None:
    model_server.script = [ToolCalls([read("wide.png")]), Text("seen")]
    events = await prompt_events(vision_agent, "look at wide.png", timeout=300)
    ends = [e for e in events if isinstance(e, m.ToolExecutionEnd)]
    assert [e.tool_name for e in ends] == ["read"], ends
    assert not ends[0].is_error, m.tool_outcome(ends[0]).text
    assert_resized(model_server)
    # pi is still there, answering (a crash in its WebAssembly would kill it).
    state = await vision_agent.rpc.get_state()
    assert state.is_streaming is False


async def test_a_task_run_resizes_the_picture_too(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "wide.png").write_bytes(png(WIDTH, HEIGHT))
    steps = ScriptedModelServer([ToolCalls([read("wide.png")]), Text("seen")], model_id="scripted")
    async with steps as server:
        provider = server.as_provider(
            SCRIPTED_PROVIDER,
            name="scripted vision model",
            contextWindow=128_000,
            maxTokens=4096,
            reasoning=False,
            input=("text", "image"),
        )
        req = RunRequest(
            prompt=None,
            folder=folder,
            model=f"{SCRIPTED_PROVIDER}/scripted",
            extra_providers=(provider,),
            limits=Limits(),
        )
        asker = ScriptedAsker(permission=lambda _req: Choice.ALLOW_ONCE)
        paths = private_paths(tmp_path / "home")
        async with TaskSession(req, lambda _e: None, asker, paths=paths) as session:  # type: ignore[arg-type]
            outcome = await session.run_prompt("look at wide.png")
            assert outcome.ok, (outcome, session.agent and session.agent.stderr_tail)
        assert_resized(server)
