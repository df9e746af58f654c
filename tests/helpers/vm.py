"""A real VM's pieces for the tests: task dirs, pi's models.json, the agent config, scripted
prompts, an asker whose answers the test decides, and whole tasks run through the runner."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from piwork.agent import AgentVm, AgentVmConfig, TaskDirs
from piwork.config import Paths, get_paths
from piwork.models.scripted import (
    ChatRequest,
    Script,
    ScriptedModelServer,
    Step,
    Text,
    ToolCalls,
    bash,
    pi_provider_config,
)
from piwork.pack.manifest import Manifest
from piwork.policy import Choice
from piwork.runner import RunEvent, RunRequest, TaskSession
from piwork.vm.accel import probe
from piwork.vm.command import GATEWAY_GUEST_ADDR, Transport

SCRIPTED_PROVIDER = "scripted"


def make_task_dirs(root: Path, *, with_work: bool = True) -> TaskDirs:
    dirs = TaskDirs(
        state=root / "state",
        outputs=root / "outputs",
        uploads=root / "uploads",
        work=root / "work" if with_work else None,
    )
    for d in (dirs.state / "agent", dirs.outputs, dirs.uploads):
        d.mkdir(parents=True, exist_ok=True)
    if dirs.work is not None:
        dirs.work.mkdir(parents=True, exist_ok=True)
    return dirs


def write_models_json(dirs: TaskDirs, model_id: str = "scripted") -> None:
    """pi's models.json pointing at the guestfwd address (here straight to the server)."""
    base = f"http://{GATEWAY_GUEST_ADDR[0]}/v1"
    providers = {SCRIPTED_PROVIDER: pi_provider_config(base, model_id, "scripted test model")}
    (dirs.state / "agent" / "models.json").write_text(json.dumps({"providers": providers}))


def agent_config(
    pack: tuple[Path, Manifest],
    dirs: TaskDirs,
    server: ScriptedModelServer,
    log_dir: Path,
    *,
    transport: Transport = Transport.VIRTIO,
    warm_start: bool = True,
    template_root: Path | None = None,
) -> AgentVmConfig:
    """Warm start by default: the suite restores one saved VM instead of booting each time."""
    return AgentVmConfig(
        pack_dir=pack[0],
        manifest=pack[1],
        accel=probe(),
        dirs=dirs,
        log_dir=log_dir,
        gateway_port=server.port,
        transport=transport,
        provider=SCRIPTED_PROVIDER,
        model="scripted",
        warm_start=warm_start,
        template_root=template_root,
    )


def per_prompt(*steps: Step) -> Callable[[ChatRequest], Step]:
    """A script that restarts at every user message (the shared VM's session grows):
    ``steps`` are the model's turns of one prompt."""

    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        return steps[i] if i < len(steps) else Text("(script finished)")

    return choose


def scripted_provider(server: ScriptedModelServer, name: str = SCRIPTED_PROVIDER) -> object:
    """The scripted server as a custom provider, so runner tests go through the gateway."""
    return server.as_provider(
        name,
        name="scripted test model",
        contextWindow=128_000,
        maxTokens=4096,
        reasoning=False,
        input=("text",),
    )


class ScriptedAsker:
    """An Asker whose answers the test decides; it records every question."""

    def __init__(self, permission: object = None, answer: object = None) -> None:
        self.permission_answer = permission
        self.answer = answer
        self.permissions: list[object] = []
        self.questions: list[tuple[str, str]] = []

    async def permission(self, request: object) -> object:
        self.permissions.append(request)
        answer = self.permission_answer
        return answer(request) if callable(answer) else answer

    async def question(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> object:
        self.questions.append((method, title))
        return self.answer(title) if callable(self.answer) else self.answer


async def prompt_events(agent: AgentVm, text: str, *, timeout: float) -> list[object]:
    """Every RPC event pi sends while it runs the prompt ``text`` to its end."""
    events: list[object] = []
    unsubscribe = agent.rpc.add_listener(events.append)
    try:
        await agent.rpc.prompt(text)
        await agent.rpc.wait_idle(timeout=timeout)
    finally:
        unsubscribe()
    return events


def scripted_request(server: ScriptedModelServer, folder: Path, **options: Any) -> RunRequest:
    """A task on ``folder`` whose model is ``server`` (through the gateway, as a provider)."""
    return RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        extra_providers=(scripted_provider(server),),  # type: ignore[arg-type]
        **options,
    )


async def bash_task(
    paths: Paths, folder: Path, command: str, *, timeout: float = 1200
) -> tuple[str, str]:
    """One task on ``folder`` whose agent runs ``command`` in bash (every ask
    allowed once): (what the model got back from bash, the task's id)."""
    server = ScriptedModelServer([Text("nothing scripted yet")], model_id="scripted")
    events: list[RunEvent] = []
    async with server:
        asker = ScriptedAsker(permission=Choice.ALLOW_ONCE)
        req = scripted_request(server, folder)
        async with TaskSession(req, events.append, asker, paths=paths) as session:  # type: ignore[arg-type]
            server.script = cast(Script, per_prompt(ToolCalls([bash(command)]), Text("done")))
            outcome = await asyncio.wait_for(session.run_prompt("go"), timeout)
            assert session.task is not None
            task_id = session.task.id
    assert outcome.ok, outcome
    last = server.chat_requests[-1]
    result = ChatRequest(body=last.body, headers=last.headers).tool_exchanges()[0].result or ""
    print(f"--- task {task_id}'s bash ---\n{result}")
    return result, task_id


def private_paths(home: Path) -> Paths:
    """What ``get_paths()`` gives with ``PIWORK_HOME=home`` (the pack cache stays shared)."""
    return Paths(
        data=home / "data", cache=get_paths().cache, state=home / "state", config=home / "config"
    )


def piwork_cli(
    paths: Paths,
    *args: str,
    timeout: float = 600,
    path_env: str | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``piwork ARGS`` as a person runs it, in ``paths``' home (no terminal: nobody to ask;
    ``input``: what is piped to its stdin)."""
    env = {**os.environ, "PIWORK_HOME": str(paths.data.parent)}
    if path_env is not None:
        env["PATH"] = path_env
    proc = subprocess.run(
        [sys.executable, "-m", "piwork.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **({"input": input} if input is not None else {"stdin": subprocess.DEVNULL}),
        check=False,
    )
    print(f"--- piwork {' '.join(args)}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


class _AllowAll:
    """Every change set question answered yes (a test that drives AgentVm directly)."""

    def verdicts(self, targets: list[Any]) -> list[tuple[Any, bool]]:
        from piwork.policy.rules import Verdict

        return [(Verdict.ALLOW, True)] * len(targets)

    async def ask(self, targets: list[Any], question: str) -> Any:
        from piwork.changes.engine import Answer

        return Answer.ALLOW


async def apply_changes(agent: AgentVm, task_dir: Path) -> Any:
    """What the agent changed in its layer over the working folder, taken and applied to
    the folder as a run does before each model call (piwork.changes), everything allowed.
    For tests that drive ``AgentVm`` without the runner."""
    from piwork.changes.engine import FolderChanges

    source = agent.folder_source()
    assert source is not None and agent.cfg.dirs.work is not None
    engine = FolderChanges(task_dir, agent.cfg.dirs.work)
    try:
        return await engine.take(source, _AllowAll(), turn=None, label="test")
    finally:
        engine.close()
