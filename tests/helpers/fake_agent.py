"""A small stand-in for ``piwork.agent.AgentVm`` behind the session's ``Agent`` door.

As httpx's MockTransport stands in for the network, this stands in for the VM
and pi so a test can drive a whole ``TaskSession`` (start, prompt, steer,
pause, stop, close) through its public methods, with everything else real:
the task store, transcript, policy, gateway, egress proxy and demo model
server. It claims nothing about the VM; tests/vm/ do that with real QEMU and pi.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from piwork.agent import AgentVmConfig, VmExit
from piwork.rpc import models as m


class NoVmDoors:
    """The agent door's parts that need a VM (git guard, previews, the folder's layer):
    nothing behind them in a test double."""

    async def move_aside_new_git(self) -> list[Any]:
        return []

    def take_git_reports(self) -> tuple[list[Any], str | None]:
        return [], None

    def preview_mux(self) -> None:
        return None

    def folder_source(self) -> None:
        return None

    @property
    def vm_alive(self) -> bool:
        return True


class FakeAgent(NoVmDoors):
    """Plays ``script`` (pi's lines) for every prompt; records what the session asked."""

    def __init__(
        self,
        cfg: AgentVmConfig,
        *,
        script: list[dict[str, Any]],
        on_stage: Callable[[str, float], None] | None = None,
        on_supervisor_event: Callable[[dict[str, Any]], None] | None = None,
        on_boot_mode: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.script = script
        self.on_stage = on_stage
        self.calls: list[tuple[str, Any]] = []
        self.pi_exit: asyncio.Future[dict[str, Any]] | None = None
        self.stderr_tail: list[str] = []
        self.timings: dict[str, float] = {"booted": 0.0}
        self.idle = asyncio.Event()  # wait_idle returns once set (at once by default)
        self.idle.set()
        self.prompted = asyncio.Event()
        self._tap: Any = None
        self._listeners: list[Callable[[Any], None]] = []

    def connect(self, *, line_tap: Any, ui_handler: Any, listener: Any) -> None:
        self._tap = line_tap
        self._listeners.append(listener)

    def add_listener(self, listener: Callable[[Any], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def start(self) -> None:
        self.calls.append(("start", self.cfg.task_id))
        self.pi_exit = asyncio.get_running_loop().create_future()
        if self.on_stage is not None:
            self.on_stage("booted", 0.0)

    async def wait_pi_ready(self, timeout: float = 180.0) -> m.SessionState:
        return m.SessionState.model_validate({"sessionFile": "/mnt/state/session.jsonl"})

    async def stop(self, *, graceful: bool = True) -> None:
        self.calls.append(("stop", graceful))

    async def prompt(self, text: str) -> None:
        self.calls.append(("prompt", text))
        self.prompted.set()
        for line in self.script:
            self._tap(orjson.dumps(line), line)
            item = m.parse_event(line)
            for listener in list(self._listeners):
                listener(item)

    async def wait_idle(self) -> None:
        await self.idle.wait()

    async def steer(self, text: str) -> None:
        self.calls.append(("steer", text))

    async def follow_up(self, text: str) -> None:
        self.calls.append(("follow_up", text))

    async def abort(self, timeout: float = 30) -> Any:
        self.calls.append(("abort", timeout))

    def open_dialogs(self) -> list[m.UiRequest]:
        return []

    async def cancel_open_dialogs(self) -> list[m.UiRequest]:
        return []

    async def pause(self) -> None:
        self.calls.append(("pause", None))

    async def resume(self) -> None:
        self.calls.append(("resume", None))

    async def exit_diagnosis(self, wait: float = 1.0) -> VmExit | None:
        return None

    @property
    def qemu_pid(self) -> int | None:
        return None
