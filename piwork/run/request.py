"""What a front end asks of a run (:class:`RunRequest`) and gets back (:class:`Outcome`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from piwork.agent import VmExit
from piwork.errors import UsageError, VmError
from piwork.models.providers import Provider
from piwork.rpc.models import AssistantOutcome
from piwork.tasks import Limits, StopReason, Task, TaskStatus, TaskStore
from piwork.tasks.model import LimitKind
from piwork.tasks.settings import load_task_settings, merge_limits
from piwork.vm.command import Transport

DEFAULT_RESUME_PROMPT = (
    "piwork resumed this task after an interruption. Continue where you left off; "
    "if the work is already finished, say so briefly."
)


@dataclass
class RunRequest:
    prompt: str | None
    folder: Path | None = None
    model: str | None = None  # PROVIDER/MODEL, or "demo"; default: the task's, else demo
    task_id: str | None = None  # resume this task instead of creating one
    title: str | None = None
    accel: str | None = None
    transport: Transport = Transport.VIRTIO
    memory_mb: int = 1024
    cpus: int = 2
    allow_net: tuple[str, ...] = ()
    limits: Limits | None = None
    limit_overrides: dict[str, Any] = field(default_factory=dict)
    """Single limits to change (``Limits`` field names), e.g. from ``--max-tokens``:
    applied over ``limits``, else the settings defaults (new task) or the task's
    own limits (resume), so one flag never drops the others."""
    extra_providers: tuple[Provider, ...] = ()
    boot_stall_timeout: float = 90.0
    assume_yes: bool = False
    egress_allow_private_networks: bool = False
    """For tests and local setups only: let allowed names that resolve to loopback or
    private addresses through the egress proxy (it refuses them by default, so an
    allowed name cannot lead the guest to the host's own services)."""
    warm_start: bool = True
    """Restore the pack's saved VM template instead of booting (cold boot if it cannot)."""
    clean_env: bool = False
    """A new task starts from a clean workbench, not the folder's last environment (piwork.env)."""
    host: str | None = None
    """Run the VM on this remote host (``piwork hosts``), not here."""


@dataclass
class Outcome:
    task_id: str
    status: str
    reason: str | None
    message: str | None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == TaskStatus.STOPPED.value and self.reason == StopReason.COMPLETED.value

    @property
    def exit_code(self) -> int:
        if self.ok:
            return 0
        return {"cancelled": 130, "limit": 3}.get(self.reason or "", 1)


class RunError(UsageError, RuntimeError):
    """A failure the person can act on; ``str()`` says what to do."""


class VmStartFailed(VmError, RuntimeError):
    """The VM exited before pi was ready (killed, crashed, out of memory).

    ``str()`` says what happened, what to do (``piwork resume``, ``piwork
    doctor``) and the console's last lines; ``summary`` is the first part only
    (what the task records as its stop message)."""

    def __init__(self, summary: str, console_tail: str = "") -> None:
        self.summary = summary
        tail = console_tail if console_tail.strip() else "(none: the VM printed nothing yet)"
        super().__init__(f"{summary}\n\nLast console output:\n{tail}")

    @classmethod
    def from_exit(cls, task_id: str, exc: BaseException, gone: VmExit) -> VmStartFailed:
        """What failed (``exc``'s first line), how QEMU ended, and what to do next."""
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        cause = re.sub(r" \(exit status -?\d+\)", "", cause)
        return cls(
            f"the VM exited while starting: {cause} (QEMU {gone.status}). "
            f"`piwork resume {task_id}` tries again; if it fails again, `piwork doctor` "
            f"checks QEMU and the accelerator. Console log: {gone.console_log}",
            gone.console_tail,
        )


StopWhy = tuple[StopReason, str | None, LimitKind | None]
"""Why a run ends: the reason, a message for people, and the limit if one was hit."""


def ending(last: AssistantOutcome | None) -> StopWhy:
    """How a run that nothing stopped ended: as pi's last assistant message says."""
    if last is not None and last.stop_reason == "error":
        return StopReason.ERROR, f"model error: {last.error_message}", None
    if last is not None and last.stop_reason == "aborted":
        return StopReason.CANCELLED, "aborted", None
    return StopReason.COMPLETED, None, None


def pi_gone_reason(gone: dict[str, Any], stderr_tail: list[str], task_id: str) -> StopWhy:
    """pi (or its VM) went away mid-run: what it said, and how to go on."""
    what = gone.get("message") or f"pi exited: {gone}"
    tail = "\n".join(stderr_tail[-10:])
    resume = f"; `piwork resume {task_id}` continues the task"
    return StopReason.ERROR, f"{what}{resume}\n{tail}".rstrip(), None


def transition(
    store: TaskStore,
    task_id: str,
    status: TaskStatus,
    reason: StopReason | None,
    message: str | None,
    limit: LimitKind | None,
) -> Task | None:
    """Move the task to ``status``; ``None`` if it is there already (a stop is always written)."""
    current = store.get(task_id).record.status
    if current == status and status is not TaskStatus.STOPPED:
        return None
    return store.transition(task_id, status, reason=reason, message=message, limit=limit)


def open_task(store: TaskStore, req: RunRequest) -> Task:
    """The request's task: loaded (and updated) to resume, or created. Not claimed yet."""
    store.mark_interrupted()
    if req.task_id:
        task = store.get(req.task_id)
        if req.folder is not None:
            task = store.bind_folder(task.id, req.folder)
        if req.model and req.model != task.record.model:
            task = store.update(task.id, model=req.model)
        if req.limits is not None or req.limit_overrides:
            limits = merge_limits(req.limits or task.record.limits, req.limit_overrides)
            if limits != task.record.limits:
                task = store.update(task.id, limits=limits)
        return task
    title = req.title or (req.prompt or "untitled task").strip().splitlines()[0][:80]
    base = req.limits or load_task_settings().default_limits
    return store.create(
        title, req.folder, model=req.model or "demo", limits=merge_limits(base, req.limit_overrides)
    )


__all__ = [
    "DEFAULT_RESUME_PROMPT",
    "Outcome",
    "RunError",
    "RunRequest",
    "StopWhy",
    "Transport",
    "VmStartFailed",
    "ending",
    "open_task",
    "pi_gone_reason",
    "transition",
]
