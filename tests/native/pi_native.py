"""The real pi, run natively with the host's node, in RPC mode (no VM).

Shared by the native tests: start pi with its own agent dir and arguments,
send commands, read events, answer dialogs, wait until the agent is idle.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from piwork.agent.spec import TASK_EXTENSIONS, pi_flags
from piwork.models.scripted import ScriptedModelServer
from piwork.pack.node import installed_pi, pi_node
from piwork.pack.node import pi_cli as pinned_pi_cli
from piwork.pisettings import TRUST_ENV, PiSettings, agent_settings, mcp_json

REPO = Path(__file__).resolve().parents[2]
PI_PACKAGE = installed_pi(REPO)
EXTENSIONS = REPO / "runtime-pack" / "extensions"
TIMEOUT_S = 30
DIALOGS = {"select", "confirm", "input", "editor"}

JSON = dict[str, Any]
Answer = Callable[[JSON], JSON]


def node_binary() -> str:
    """The node pi needs (the pinned one where this host runs it)."""
    return pi_node(REPO)


def pi_cli() -> Path:
    cli = pinned_pi_cli(REPO)
    assert cli.is_file(), f"{cli} missing: run `npm ci` in {REPO / 'runtime-pack' / 'pi'}"
    return cli


class NativePi:
    """pi --mode rpc on a subprocess: JSON lines in, JSON lines out.

    With ``answer``, every dialog (select/confirm/input/editor) is answered by
    it as soon as it is read; an answer holding ``"hold"`` is not sent.
    """

    def __init__(self, proc: asyncio.subprocess.Process, answer: Answer | None = None) -> None:
        self.proc = proc
        self.answer = answer
        self.events: list[JSON] = []
        self.dialogs: list[JSON] = []
        self.replies: dict[str, JSON] = {}
        self.stderr = ""

    async def send(self, command: JSON) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()

    async def next_event(self) -> JSON:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"pi exited early (code {await self.proc.wait()})")
        event: JSON = json.loads(line)
        self.events.append(event)
        if event.get("type") == "extension_ui_request" and event.get("method") in DIALOGS:
            self.dialogs.append(event)
            if self.answer is not None:
                reply = {"type": "extension_ui_response", "id": event["id"], **self.answer(event)}
                if "hold" not in reply:
                    await self.send(reply)
        return event

    async def response(self, request_id: str) -> JSON:
        while True:
            event = await self.next_event()
            if event.get("type") == "response" and event.get("id") == request_id:
                return event

    async def run_until_idle(self) -> None:
        """Wait for agent_end, then confirm with get_state (auto-retry can
        follow an agent_end with another attempt)."""
        n = 0
        while True:
            event = await self.next_event()
            if event.get("type") != "agent_end":
                continue
            n += 1
            await self.send({"id": f"state-{n}", "type": "get_state"})
            state = await self.response(f"state-{n}")
            assert state["success"], state
            if not state["data"]["isStreaming"]:
                return

    def of_type(self, kind: str) -> list[JSON]:
        return [e for e in self.events if e.get("type") == kind]


def piwork_args(*, trust: bool = True) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment piwork starts pi with in the guest
    (piwork.agent.pi_flags, its extensions by their paths here), less what
    :func:`running_native_pi` adds itself."""
    exts = [str(EXTENSIONS / Path(e).name) for e in TASK_EXTENSIONS]
    args = [a for a in pi_flags(exts) if a not in ("--mode", "rpc", "--offline")]
    return args, {TRUST_ENV: "1" if trust else "0", "PI_TELEMETRY": "0"}


def write_agent_settings(tmp_path: Path, settings: PiSettings | None = None) -> None:
    """pi's agent-dir settings.json and mcp.json as the host writes them for a run."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir(exist_ok=True)
    s = settings or PiSettings()
    (agent_dir / "settings.json").write_text(json.dumps(agent_settings(s)))
    (agent_dir / "mcp.json").write_text(json.dumps(mcp_json(s)))


@asynccontextmanager
async def running_native_pi(
    tmp_path: Path,
    models_json: JSON,
    args: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    answer: Answer | None = None,
) -> AsyncIterator[NativePi]:
    """Start ``pi --mode rpc --offline ARGS`` with its own agent dir and home."""
    agent_dir, home = tmp_path / "agent", tmp_path / "home"
    for folder in (agent_dir, home):
        folder.mkdir(exist_ok=True)
    (agent_dir / "models.json").write_text(json.dumps(models_json))
    full_env = {**os.environ, "PI_CODING_AGENT_DIR": str(agent_dir), "HOME": str(home)}
    full_env.update(env or {})
    proc = await asyncio.create_subprocess_exec(
        node_binary(),
        str(pi_cli()),
        "--mode",
        "rpc",
        "--offline",
        *args,
        cwd=cwd,
        env=full_env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=64 * 1024 * 1024,  # every message_update carries the whole message
    )
    pi = NativePi(proc, answer)
    try:
        # stdin stays open until we are done: EOF makes pi exit at once.
        async with asyncio.timeout(TIMEOUT_S):
            yield pi
    finally:
        if proc.returncode is None:
            proc.kill()
        _, stderr = await proc.communicate()
        pi.stderr = stderr.decode(errors="replace")


PERMISSION = re.compile(r'<piwork-permission v="1">(.*?)</piwork-permission>', re.S)


def permission(dialog: JSON) -> JSON | None:
    """The gate's machine-readable request in a dialog's title (None: not the gate's)."""
    m = PERMISSION.search(str(dialog.get("title", "")))
    return json.loads(m.group(1)) if m else None


async def run_piwork_pi(
    tmp_path: Path,
    work: Path,
    model: ScriptedModelServer,
    prompt: str,
    *,
    settings: PiSettings | None = None,
    answer: Answer | None = None,
    env: dict[str, str] | None = None,
    then: tuple[str, ...] = (),
) -> NativePi:
    """One prompt to its end with pi as piwork starts it in the guest (its flags and
    extensions, the agent dir's settings.json and mcp.json from ``settings``), on the
    scripted ``model``, in ``work``; then the commands named in ``then`` (their replies
    in ``pi.replies``); returns the finished pi (its events and dialogs)."""
    settings = settings or PiSettings()
    write_agent_settings(tmp_path, settings)
    flags, full_env = piwork_args(trust=settings.trust_project)
    full_env |= {"PIWORK_SCOPE_DIRS": str(work), "PIWORK_READONLY_DIRS": "",
                 "PIWORK_TASK_ID": "t-native", **(env or {})}  # fmt: skip
    models = {"providers": {"scripted": model.pi_provider()}}
    args = ["--no-session", "--provider", "scripted", "--model", model.model_id, *flags]
    async with running_native_pi(
        tmp_path, models, args, cwd=work, env=full_env, answer=answer
    ) as pi:
        await pi.send({"id": "p1", "type": "prompt", "message": prompt})
        assert (await pi.response("p1"))["success"]
        await pi.run_until_idle()
        for command in then:
            await pi.send({"id": command, "type": command})
            pi.replies[command] = await pi.response(command)
    return pi
