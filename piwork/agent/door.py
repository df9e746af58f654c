"""The door a run uses to reach pi: :class:`PiDoor` (prompt, steer, follow up, abort,
wait, dialogs), the :class:`Agent` protocol a run is given, and how a VM ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from piwork import errors
from piwork.changes.sources import LayerSource
from piwork.rpc.client import LineTap, Listener, RpcClient, UiHandler
from piwork.rpc.models import BashResult, Response, SessionState, UiRequest
from piwork.vm import gitguard
from piwork.vm.netmux import NetMux

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VmExit:
    """How the VM ended while starting: what a person (and the task record) is told."""

    code: int
    status: str
    """e.g. ``killed by SIGKILL`` or ``status 1``."""
    console_log: Path
    console_tail: str


class PiGone(errors.VmError, RuntimeError):
    """pi (or the supervisor, or the VM under it) went away; the message says how."""


class PiDoor:
    """What a run may ask of pi: prompt, steer, follow up, abort, wait, its dialogs.

    The only way above this module to reach pi's RPC client; :class:`AgentVm`
    adds the VM. A test double (tests/helpers/guest_double.py) reuses it over a
    fake guest, so the session runs against the same door either way.
    """

    rpc: RpcClient
    pi_exit: asyncio.Future[dict[str, Any]] | None
    stderr_tail: list[str]

    def connect(self, *, line_tap: LineTap, ui_handler: UiHandler, listener: Listener) -> None:
        """Where pi's raw lines (from a worker thread for big ones), dialogs and events go."""
        self.rpc.set_line_tap(line_tap, thread_safe=True)
        self.rpc.set_ui_handler(ui_handler)
        self.rpc.add_listener(listener)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        return self.rpc.add_listener(listener)

    async def prompt(self, text: str) -> None:
        await self.rpc.prompt(text)

    async def wait_idle(self) -> None:
        await self.rpc.wait_idle()

    async def steer(self, text: str) -> None:
        await self.rpc.steer(text)

    async def follow_up(self, text: str) -> None:
        await self.rpc.follow_up(text)

    async def abort(self, timeout: float = 30) -> Response:
        return await self.rpc.abort(timeout=timeout)

    def open_dialogs(self) -> list[UiRequest]:
        return list(self.rpc.open_dialogs.values())

    async def run_bash(self, command: str, timeout: float | None) -> BashResult:
        """Run ``command`` through pi's own bash (RPC ``bash``: the shell its tool uses,
        in the workbench root, no model involved). ``piwork env build`` runs its steps
        here; the output the result carries is pi's tail of it, so callers that want
        all of it redirect it to a file on a share."""
        return await self.rpc.bash(command, timeout=timeout)

    async def cancel_open_dialogs(self) -> list[UiRequest]:
        """Answer every open dialog with a cancel (pi would hang on them); returns them."""
        opened = self.open_dialogs()
        await self.rpc.cancel_open_dialogs()
        return opened


def guest_timings(msg: dict[str, Any]) -> dict[str, float]:
    """The guest's own account of pi's start (seconds), for ``piwork bench`` only.

    Untrusted numbers from the VM: kept only if they are plain numbers of
    milliseconds between 0 and an hour, and used for nothing but printing.
    """

    def seconds(v: object) -> float | None:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        return v / 1000 if 0 <= v < 3_600_000 else None  # NaN fails both tests

    ev = msg.get("ev")
    out: dict[str, float] = {}
    if ev in ("first-output", "preloaded"):
        s = seconds(msg.get("ms"))
        if s is not None:
            out[f"guest_{str(ev).replace('-', '_')}"] = s
    if ev == "preloaded":
        s = seconds(msg.get("node"))
        if s is not None:
            out["guest_launcher_node"] = s
    parts = {"started": ("prepare", "go", "bind"), "ready": ("node", "main")}.get(str(ev), ())
    if parts and isinstance(msg.get("ms"), dict):
        prefix = "guest_supervisor_" if ev == "ready" else "guest_"
        for key in parts:
            s = seconds(msg["ms"].get(key))
            if s is not None:
                out[f"{prefix}{key}"] = s
    return out


class Agent(Protocol):
    """The door to the VM and pi that a run uses: :class:`AgentVm`, or a test double."""

    pi_exit: asyncio.Future[dict[str, Any]] | None
    stderr_tail: list[str]
    timings: dict[str, float]

    def connect(self, *, line_tap: LineTap, ui_handler: UiHandler, listener: Listener) -> None: ...
    def add_listener(self, listener: Listener) -> Callable[[], None]: ...
    async def start(self) -> None: ...
    async def wait_pi_ready(self, timeout: float = ...) -> SessionState: ...
    async def stop(self, *, graceful: bool = True) -> None: ...
    async def prompt(self, text: str) -> None: ...
    async def wait_idle(self) -> None: ...
    async def steer(self, text: str) -> None: ...
    async def follow_up(self, text: str) -> None: ...
    async def abort(self, timeout: float = ...) -> Any: ...
    def open_dialogs(self) -> list[UiRequest]: ...
    async def cancel_open_dialogs(self) -> list[UiRequest]: ...
    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def exit_diagnosis(self, wait: float = ...) -> VmExit | None: ...
    def preview_mux(self) -> NetMux | None: ...
    def folder_source(self) -> LayerSource | None:
        """Where the agent's changes to the working folder come from (piwork.changes)."""
        ...

    @property
    def vm_alive(self) -> bool: ...
    async def move_aside_new_git(self) -> list[gitguard.MovedAside]: ...
    def take_git_reports(self) -> tuple[list[gitguard.MovedAside], str | None]: ...
    @property
    def qemu_pid(self) -> int | None: ...


AgentFactory = Callable[..., Agent]
"""``factory(cfg, on_stage=, on_supervisor_event=, on_boot_mode=)``, like ``AgentVm``."""
