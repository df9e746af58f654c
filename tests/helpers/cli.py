"""``piwork`` run as a person runs it: a subprocess with a private ``PIWORK_HOME``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from piwork.models.scripted import (
    ScriptedModelServer,
)

PIWORK = [sys.executable, "-m", "piwork.cli.main"]


def write_providers(config: Path, server: ScriptedModelServer) -> None:
    """``config/providers.json`` naming the scripted server as the provider ``scripted``
    (no key), as a person's would after ``piwork`` is told about a local model server."""
    model = {
        "id": "scripted",
        "name": "scripted test model",
        "contextWindow": 128000,
        "maxTokens": 4096,
        "reasoning": False,
        "input": ["text"],
    }
    providers = {
        "providers": {
            "scripted": {
                "baseUrl": server.base_url,
                "api": "openai-completions",
                "auth": "none",
                "models": [model],
            }
        }
    }
    config.mkdir(parents=True, exist_ok=True)
    (config / "providers.json").write_text(json.dumps(providers))


def make_home(root: Path, server: ScriptedModelServer) -> dict[str, str]:
    """A private PIWORK_HOME whose providers.json has the scripted server (no key)."""
    home = root / "home"
    write_providers(home / "config", server)
    return {**os.environ, "PIWORK_HOME": str(home)}


class Cli:
    """One `piwork` subprocess whose --json events the test reads as they come."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, env: dict[str, str], log: Path, *args: str) -> Cli:
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *PIWORK, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=err, env=env,
            )  # fmt: skip
        return cls(proc, log)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    async def next_event(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            return None
        ev: dict[str, Any] = json.loads(line)
        self.events.append(ev)
        return ev

    async def wait_event(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                ev = await self.next_event()
                if ev is None:
                    raise AssertionError(
                        f"piwork ended before the awaited event; events: "
                        f"{[e['event'] for e in self.events]}\nstderr: {self.stderr}"
                    )
                if pred(ev):
                    return ev

    async def finish(self, timeout: float) -> int:
        """Read the remaining events and wait for the exit; a hang fails the test."""
        try:
            async with asyncio.timeout(timeout):
                while await self.next_event() is not None:
                    pass
                return await self.proc.wait()
        except TimeoutError:
            raise AssertionError(
                f"piwork did not exit within {timeout:.0f}s; last events "
                f"{self.events[-5:]}\nstderr: {self.stderr}"
            ) from None

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def run_cli(env: dict[str, str], *args: str, timeout: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *PIWORK, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def task_dir(env: dict[str, str], task_id: str) -> Path:
    return Path(env["PIWORK_HOME"], "data", "tasks", task_id)


async def piwork(home: Path, *args: str, timeout: float = 400) -> tuple[int, str, str]:
    """``piwork`` with no terminal (stdin /dev/null, pipes) and a private ``PIWORK_HOME``,
    without blocking the loop that serves the scripted model; killed after ``timeout``
    (a run boots a VM under TCG on a busy machine)."""
    proc = await asyncio.create_subprocess_exec(
        *PIWORK,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PIWORK_HOME": str(home)},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def changes(home: Path, task_id: str, turn: int) -> dict[str, str]:
    code, out, err = await piwork(home, "changes", task_id, "--turn", str(turn), "--json")
    assert code == 0, err
    return {c["path"]: c["status"] for c in json.loads(out)["changes"]}


def always_allow(action: str) -> dict[str, Any]:
    return {
        "id": f"r-test-{action}",
        "action": action,
        "verdict": "allow",
        "scope": "global",
        "scopeValue": None,
        "pattern": None,
        "created": "2025-01-01T00:00:00+00:00",
    }
