"""pi 1.x in the VM, through the whole run (TaskSession, the gateway, the egress
proxy, the host policy, the person played by the test), with the scripted model:

* the folder's AGENTS.md reaches the model's system prompt, and the person is told
  what pi loaded from the folder (project trust is on by default);
* a delete made from a codemode script is asked exactly like a direct one, and the
  answer holds (codemode is on because the trusted folder's .pi/settings.json says so);
* a small stdio MCP server the test writes is started in the VM and used;
* an HTTP MCP server's domain is asked by the egress proxy before it is reached.

One warm-started session for all of it (TCG: each prompt takes a while).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from piwork.config import Paths
from piwork.models.providers import Provider
from piwork.models.scripted import (
    ChatRequest,
    ScriptedModelServer,
    Step,
    Text,
    ToolCall,
    ToolCalls,
    bash,
)
from piwork.pack.manifest import Manifest
from piwork.pisettings import McpServer, PiSettings, save_pi_settings
from piwork.policy import Action, Choice, PermissionRequest
from piwork.runner import Asker, EventKind, Outcome, RunEvent, RunRequest, TaskSession
from tests.helpers.mcp_http_server import McpHttpServer, host_name
from tests.helpers.vm import private_paths, scripted_provider

pytestmark = pytest.mark.vm

MARK = "piwork-agents-md-mark-7f3e"
HELPERS = Path(__file__).resolve().parents[1] / "helpers"
Answer = Callable[[PermissionRequest], Choice]


@dataclass
class Person:
    """Answers the gate's questions with ``tool_answer``, every network question with
    allow once; records each question."""

    tool_answer: Answer = field(default=lambda _req: Choice.DENY)
    requests: list[PermissionRequest] = field(default_factory=list)
    network: list[PermissionRequest] = field(default_factory=list)
    """Every network question of the session (pi connects MCP servers at its start)."""

    async def permission(self, request: object) -> Choice:
        assert isinstance(request, PermissionRequest)
        self.requests.append(request)
        if request.action is Action.NETWORK:
            self.network.append(request)
            return Choice.ALLOW_ONCE
        return self.tool_answer(request)

    async def question(self, *_a: object) -> None:
        return None

    def tool_requests(self) -> list[PermissionRequest]:
        return [r for r in self.requests if r.action is not Action.NETWORK]


@dataclass
class Live:
    session: TaskSession
    person: Person
    events: list[RunEvent]
    folder: Path
    server: ScriptedModelServer
    mcp: McpHttpServer
    mcp_host: str

    async def run(self, prompt: str, *steps: Step, answer: Answer | None = None) -> Outcome:
        def choose(req: ChatRequest) -> Step:
            i = req.assistant_turns_since_user
            return steps[i] if i < len(steps) else Text("(script finished)")

        self.server.script = choose
        if answer is not None:
            self.person.tool_answer = answer
        self.person.requests.clear()
        return await asyncio.wait_for(self.session.run_prompt(prompt), timeout=600)

    def result_of(self, call_id: str) -> str:
        last = self.server.chat_requests[-1]
        for x in ChatRequest(body=last.body, headers=last.headers).tool_exchanges():
            if x.id == call_id:
                return x.result or ""
        raise AssertionError(f"no result for {call_id}")


def make_folder(folder: Path) -> None:
    (folder / ".pi").mkdir()
    (folder / "AGENTS.md").write_text(f"# Rules of this project\nEnd every answer with {MARK}.\n")
    (folder / ".pi" / "settings.json").write_text(json.dumps({"defaultTools": ["+codemode"]}))
    shutil.copyfile(HELPERS / "mcp_stdio_server.py", folder / "mcp_server.py")


@pytest.fixture(scope="module")
async def live(
    pack: tuple[Path, Manifest],
    model_server: ScriptedModelServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Live]:
    paths: Paths = private_paths(tmp_path_factory.mktemp("pi1x-home"))
    folder = tmp_path_factory.mktemp("pi1x-folder")
    make_folder(folder)
    name, addr = host_name()
    async with McpHttpServer(addr) as mcp:
        servers = {
            # In the VM: the workbench's python3 runs the server the test wrote in the folder.
            "shouter": McpServer(command="python3", args=["/mnt/work/mcp_server.py"]),
            "remote": McpServer(url=f"http://{name}:{mcp.port}/mcp"),
        }
        paths.config.mkdir(parents=True, exist_ok=True)
        save_pi_settings(PiSettings(mcp_servers=servers), paths.settings_file)
        person = Person()
        events: list[RunEvent] = []
        req = RunRequest(
            prompt=None,
            folder=folder,
            model="scripted/scripted",
            extra_providers=(cast(Provider, scripted_provider(model_server)),),
            egress_allow_private_networks=True,  # the test's MCP server is on this machine
        )
        async with TaskSession(req, events.append, cast(Asker, person), paths=paths) as session:
            yield Live(session, person, events, folder, model_server, mcp, name)


async def test_agents_md_reaches_the_model_and_the_person_is_told_what_loaded(live: Live) -> None:
    outcome = await live.run("hello", Text("hi"))
    assert outcome.ok, outcome
    system = [m for m in live.server.chat_requests[-1].body["messages"] if m["role"] == "system"]
    assert MARK in json.dumps(system)
    notices = [str(e.data.get("message")) for e in live.events if e.kind is EventKind.NOTICE]
    (told,) = [n for n in notices if n.startswith("pi loaded from the project")]
    assert "context: AGENTS.md" in told and "settings: .pi/settings.json" in told, told


async def test_a_delete_from_a_codemode_script_is_asked_like_a_direct_one(live: Live) -> None:
    for name in ("script-victim.txt", "direct-victim.txt"):
        (live.folder / name).write_text("precious\n")
    code = "await tools.bash({ command: 'rm script-victim.txt' });\nreturn 'removed';"
    outcome = await live.run(
        "clean up",
        ToolCalls([ToolCall("codemode", {"code": code}, "call_cm")]),
        ToolCalls([bash("rm direct-victim.txt", id="call_direct")]),
        Text("kept both"),
        answer=lambda _req: Choice.DENY,
    )
    assert outcome.ok, outcome
    assert (live.folder / "script-victim.txt").read_text() == "precious\n"
    assert (live.folder / "direct-victim.txt").read_text() == "precious\n"
    # Two questions, one per rm, the same in all but the call that made it.
    scripted, direct = live.person.tool_requests()
    assert scripted.tool_call_id is not None and scripted.tool_call_id.startswith("call_cm/")
    assert direct.tool_call_id == "call_direct"
    for r, file in ((scripted, "script-victim.txt"), (direct, "direct-victim.txt")):
        assert (r.action, r.tool, r.command) == (Action.DELETE, "bash", f"rm {file}")
        assert [(t.action, t.path) for t in r.targets] == [(Action.DELETE, f"/mnt/work/{file}")]
    assert "Script failed" in live.result_of("call_cm")
    assert "Permission denied by the user" in live.result_of("call_cm")


def shout(call_id: str, server: str, text: str) -> ToolCalls:
    """A codemode script calling one MCP tool (pi waits for the server it names)."""
    code = f"const r = await tools.mcp__{server}__shout({{ text: {json.dumps(text)} }});\n"
    code += "return r.content[0].text;"
    return ToolCalls([ToolCall("codemode", {"code": code}, call_id)])


async def test_a_stdio_mcp_server_the_test_wrote_is_used(live: Live) -> None:
    outcome = await live.run(
        "shout", shout("call_stdio", "shouter", "from the vm"), Text("done"),
        answer=lambda _req: Choice.ALLOW_ONCE,
    )  # fmt: skip
    assert outcome.ok, outcome
    assert "SHOUTED: FROM THE VM" in live.result_of("call_stdio")
    # The MCP call met the gate like any tool call: a connector, asked.
    (req,) = live.person.tool_requests()
    assert (req.action, req.tool) == (Action.CONNECTOR, "mcp__shouter__shout")


async def test_an_http_mcp_servers_domain_is_asked_by_the_proxy(live: Live) -> None:
    outcome = await live.run(
        "shout remotely", shout("call_http", "remote", "over http"), Text("done"),
        answer=lambda _req: Choice.ALLOW_ONCE,
    )  # fmt: skip
    assert outcome.ok, outcome
    assert "SHOUTED: OVER HTTP" in live.result_of("call_http")
    assert "tools/call" in live.mcp.methods
    # The egress proxy asked about the server's host before pi reached it (the question
    # names it; a one-label name like this machine's is no domain a rule could hold).
    asked = [r.question for r in live.person.network]
    assert f"connect to {live.mcp_host} (port {live.mcp.port})" in " ".join(asked), asked
