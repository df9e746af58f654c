"""One task's life: task store + model gateway + VM + pi + policy + limits.

This is the single API the CLI and the GUI drive. It emits :class:`RunEvent`
objects (already digested for people: text deltas, one record per tool step,
boot progress, questions) and asks the front end through an :class:`Asker`
when the policy cannot decide. Nothing here prints or reads a terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import re
import secrets
import signal
import stat
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import orjson

from piwork import sharefs
from piwork.agent import GATE_EXTENSION, GUEST_EXTENSIONS, AgentVm, AgentVmConfig, TaskDirs
from piwork.aio import discard
from piwork.auth import KeyStore
from piwork.checkpoints import RunRecorder
from piwork.config import Paths, get_paths
from piwork.models.demo import DEMO_MODEL_ID, DEMO_PROVIDER, demo_server
from piwork.models.providers import (
    PROVIDERS_FILE_NAME,
    Provider,
    demo_provider,
    load_providers,
    parse_model_ref,
    render_guest_models_json,
)
from piwork.models.scripted import ScriptedModelServer
from piwork.pack import ensure_pack, load_manifest
from piwork.policy import AuditLog, Choice, DecidedBy, Decider, PolicyStore
from piwork.policy.request import (
    PermissionPayloadError,
    PermissionRequest,
    parse_request,
    validate_request,
)
from piwork.policy.rules import Action, Target, TaskContext, Verdict
from piwork.proxy.egress import (
    AllowNetError,
    EgressProxy,
    domain_allowed,
    guest_proxy_env,
    normalize_allowed_domain,
    proxy_url_with_token,
)
from piwork.proxy.gateway import ModelGateway, UsageRecord
from piwork.resources import ResourceError, vm_budget
from piwork.rpc import models as m
from piwork.rpc.client import ClientItem
from piwork.rpc.framing import MalformedLine, OversizedLine
from piwork.tasks import Limits, StopReason, Task, TaskStatus, TaskStore, TaskWriteError
from piwork.tasks.model import LimitKind
from piwork.tasks.model import Usage as TaskUsage
from piwork.tasks.settings import load_task_settings, merge_limits
from piwork.tasks.transcript import TranscriptFull, TranscriptWriteError, compact_pi_line
from piwork.vm.accel import probe
from piwork.vm.command import EGRESS_GUEST_ADDR, GATEWAY_GUEST_ADDR, Transport

log = logging.getLogger(__name__)

ABORT_CONFIRM_S = 1.5
"""How long a stop waits for pi to confirm the abort before ending the run anyway."""

DEFAULT_RESUME_PROMPT = (
    "piwork resumed this task after an interruption. Continue where you left off; "
    "if the work is already finished, say so briefly."
)


class EventKind(StrEnum):
    NOTICE = "notice"  # something the person should know (TCG, pack build, retry)
    TASK = "task"  # the task record was created or loaded
    BOOT = "boot"  # a boot stage reached
    READY = "ready"  # pi answered its first request
    STATUS = "status"  # task status changed
    PROMPT = "prompt"  # a message was sent to the agent
    TEXT = "text"  # assistant text delta
    TEXT_END = "text_end"  # an assistant message finished
    TOOL_START = "tool_start"
    TOOL_END = "tool_end"
    PERMISSION = "permission"  # a permission request and how it was decided
    QUESTION = "question"  # the agent asked the person something
    USAGE = "usage"
    ERROR = "error"
    DONE = "done"
    # What one agent turn changed in the working folder (piwork.checkpoints):
    # {"turn", "checkpoint" (id of the checkpoint before the turn), "added",
    # "modified", "deleted", "type_changed", "files": [{"path", "status"}] (at
    # most 200), "truncated" (files left out)}. Sent when the next checkpoint is
    # taken: at the next model call or at the end of the run.
    CHANGES = "changes"


@dataclass(frozen=True)
class RunEvent:
    kind: EventKind
    data: dict[str, Any]
    elapsed: float
    task_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.kind.value,
            "t": round(self.elapsed, 3),
            "task": self.task_id,
            **self.data,
        }


EventSink = Callable[[RunEvent], None]


class Asker(Protocol):
    """How the runner asks the person. Front ends implement it."""

    async def permission(self, request: PermissionRequest) -> Choice | None:
        """The person's choice; ``None`` means no one can answer (deny and say so)."""

    async def question(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> str | bool | None:
        """Answer an input/confirm/select/editor dialog; ``None`` cancels it."""


class DenyAsker:
    """For runs with no person to ask: every undecided permission is denied."""

    def __init__(self, reason: str = "no terminal to ask on") -> None:
        self.reason = reason

    async def permission(self, request: PermissionRequest) -> Choice | None:
        return None

    async def question(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> str | bool | None:
        return None


class AllowAsker(DenyAsker):
    """``--yes``: allow everything the policy did not deny, once."""

    async def permission(self, request: PermissionRequest) -> Choice | None:
        return Choice.ALLOW_ONCE


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


def _is_interrupt(et: type[BaseException] | None) -> bool:
    return et is not None and issubclass(et, (asyncio.CancelledError, KeyboardInterrupt))


class RunError(RuntimeError):
    """A failure the person can act on; ``str()`` says what to do."""


class VmStartFailed(RuntimeError):
    """The VM exited before pi was ready (killed, crashed, out of memory).

    ``str()`` says what happened, what to do (``piwork resume``, ``piwork
    doctor``) and the console's last lines; ``summary`` is the first part only
    (what the task records as its stop message)."""

    def __init__(self, summary: str, console_tail: str = "") -> None:
        self.summary = summary
        tail = console_tail if console_tail.strip() else "(none: the VM printed nothing yet)"
        super().__init__(f"{summary}\n\nLast console output:\n{tail}")


_LIMIT_FLAGS = {
    LimitKind.TURNS: "--max-turns",
    LimitKind.WALL_TIME: "--max-minutes",
    LimitKind.TOKENS: "--max-tokens",
    LimitKind.COST: "--max-cost",
}


def _only_model(provider: Provider, model_id: str) -> Provider:
    """``provider`` with just ``model_id`` in its rendered model list (if it lists models)."""
    picked = tuple(spec for spec in provider.models if spec.id == model_id)
    return provider.model_copy(update={"models": picked}) if picked else provider


def _resolve_model(ref: str, catalog: dict[str, Provider]) -> tuple[Provider, str]:
    if ref in ("demo", DEMO_PROVIDER, f"{DEMO_PROVIDER}/{DEMO_MODEL_ID}"):
        return catalog[DEMO_PROVIDER], DEMO_MODEL_ID
    return parse_model_ref(ref, catalog)


class TaskSession:
    """A live task: ``async with TaskSession(req, sink, asker) as s: await s.run_prompt(...)``."""

    def __init__(
        self,
        req: RunRequest,
        sink: EventSink | None = None,
        asker: Asker | None = None,
        *,
        paths: Paths | None = None,
        policy_file: Path | None = None,
    ) -> None:
        self.req = req
        self.sink = sink or (lambda ev: None)
        self.asker: Asker = asker or (AllowAsker() if req.assume_yes else DenyAsker())
        self.paths = paths or get_paths()
        self.t0 = time.monotonic()
        self.store = TaskStore(self.paths.tasks, fsync_delay=0.05)
        self.task: Task | None = None
        self.agent: AgentVm | None = None
        if policy_file is not None and not policy_file.is_file():
            raise RunError(f"policy file {policy_file} does not exist (see `piwork policy list`)")
        self.decider = Decider(
            PolicyStore(policy_file or self.paths.policy_file), AuditLog(self.paths.audit_log)
        )
        self.timings: dict[str, float] = {}
        self._stack = contextlib.AsyncExitStack()
        self._last_assistant: m.AssistantOutcome | None = None
        self._stop_reason: tuple[StopReason, str | None, LimitKind | None] | None = None
        self._limit_hit = asyncio.Event()
        self._run_lock = asyncio.Lock()
        self._paused = False
        self._closing = False
        self._ctx = TaskContext()
        self._ckpt: RunRecorder | None = None
        self._net_once: set[str] = set()
        self._usage_due = TaskUsage()
        self._usage_writer: asyncio.Task[None] | None = None
        """Domains the person allowed once at the gate's prompt, for this turn: the
        egress proxy lets them through instead of asking a second time."""
        self._usage_report = False
        self._usage_inflight = TaskUsage()  # taken from _usage_due, not yet in task.json
        self._gateway: ModelGateway | None = None
        self._gateway_prices = False
        self._allow_net: tuple[str, ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._status_lock = asyncio.Lock()
        self._abort_inflight: asyncio.Future[Any] | None = None
        self._start_failure: str | None = None  # why start() failed: the task's stop message

    # ------------------------------------------------------------ events
    def emit(self, kind: EventKind, **data: Any) -> None:
        ev = RunEvent(kind, data, time.monotonic() - self.t0, self.task.id if self.task else None)
        try:
            self.sink(ev)
        except Exception:  # a broken front end must not break the task
            log.exception("event sink failed")

    def _note(self, kind: str, data: Any) -> None:
        """Append to the task transcript; a disk error becomes a task error, not a crash."""
        if self.task is None:
            return
        try:
            self.store.append_event(self.task.id, kind, data)
        except Exception as exc:
            if self._loop is not None and threading.get_ident() != self._loop_thread:
                # A big pi line is recorded from a worker thread (the loop waits for
                # it): what follows touches loop objects, so it runs on the loop.
                self._loop.call_soon_threadsafe(self._note_failed, exc)
            else:
                self._note_failed(exc)

    def _note_failed(self, exc: Exception) -> None:
        if isinstance(exc, TranscriptWriteError):
            self.emit(EventKind.ERROR, message=f"cannot write the transcript: {exc}")
            if (isinstance(exc, TranscriptFull) or exc.errno == errno.ENOSPC) and (
                self._stop_reason is None
            ):
                # Going on would only pile records up in memory: stop, and say why.
                task_id = self.task.id if self.task is not None else "<task>"
                why = os.strerror(exc.errno or errno.ENOSPC)
                self._stop_reason = (
                    StopReason.ERROR,
                    f"the disk is full, so the task's transcript cannot be saved "
                    f"({exc.path}: {why}); free some space, then "
                    f"`piwork resume {task_id}` continues the task",
                    None,
                )
                self._limit_hit.set()
        else:
            self.emit(EventKind.ERROR, message=f"cannot write the transcript: {exc}")

    async def _set_status(
        self,
        status: TaskStatus,
        *,
        reason: StopReason | None = None,
        message: str | None = None,
        limit: LimitKind | None = None,
    ) -> None:
        assert self.task is not None
        task_id = self.task.id

        def write() -> Task | None:
            current = self.store.get(task_id).record.status
            if current == status and status is not TaskStatus.STOPPED:
                return None
            return self.store.transition(
                task_id, status, reason=reason, message=message, limit=limit
            )

        # task.json is read and rewritten (lock wait, two fsyncs) off the event loop;
        # the lock keeps status changes in the order they were asked for.
        async with self._status_lock:
            task = await asyncio.to_thread(write)
        if task is None:
            return
        self.task = task
        self.emit(
            EventKind.STATUS,
            status=status.value,
            reason=reason.value if reason else None,
            message=message,
        )

    # ------------------------------------------------------------ setup
    async def __aenter__(self) -> TaskSession:
        try:
            await self.start()
        except BaseException as exc:
            await self.close(graceful=False, cancelled=_is_interrupt(type(exc)))
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close(graceful=et is None, cancelled=_is_interrupt(et))

    def _open_task(self) -> Task:
        self.store.mark_interrupted()
        req = self.req
        if req.task_id:
            task = self.store.get(req.task_id)
            if req.folder is not None:
                task = self.store.bind_folder(task.id, req.folder)
            if req.model and req.model != task.record.model:
                task = self.store.update(task.id, model=req.model)
            if req.limits is not None or req.limit_overrides:
                limits = merge_limits(req.limits or task.record.limits, req.limit_overrides)
                if limits != task.record.limits:
                    task = self.store.update(task.id, limits=limits)
        else:
            title = req.title or (req.prompt or "untitled task").strip().splitlines()[0][:80]
            base = req.limits or load_task_settings().default_limits
            task = self.store.create(
                title,
                req.folder,
                model=req.model or "demo",
                limits=merge_limits(base, req.limit_overrides),
            )
        return task

    async def start(self) -> None:
        try:
            self._allow_net = tuple(normalize_allowed_domain(d) for d in self.req.allow_net)
        except AllowNetError as exc:
            raise RunError(str(exc)) from exc
        # Store work that may wait on another process's lock runs off the event loop.
        self.task = await asyncio.to_thread(self._open_task)
        task = self.task
        used_up = task.record.limit_reached()
        if used_up is not None:
            flag = _LIMIT_FLAGS[used_up]
            raise RunError(
                f"task {task.id} has used up its {used_up.value.replace('_', ' ')} limit; "
                f"resume it with a higher {flag} (e.g. `piwork resume {task.id} {flag} ...`)"
            )
        self._stack.enter_context(await asyncio.to_thread(self.store.claim, task.id))
        await asyncio.to_thread(self.store.transcript, task.id)  # opened (and locked) now
        try:  # refuse now, clearly, rather than hang or meet the OOM killer later
            self._stack.enter_context(vm_budget(self.req.memory_mb, self.req.cpus))
        except ResourceError as exc:
            raise RunError(str(exc)) from exc
        record = task.record
        folder = Path(record.working_folder) if record.working_folder else None
        self._ctx = TaskContext(task_id=task.id, working_folder=folder)
        await self._checkpoint_start()
        self.emit(
            EventKind.TASK,
            id=task.id,
            title=record.title,
            folder=str(folder) if folder else None,
            model=record.model,
            resumed=bool(self.req.task_id),
        )
        # Model access: the guest only ever sees the gateway and a per-run token.
        catalog = load_providers(
            self.paths.config / PROVIDERS_FILE_NAME, extra=self.req.extra_providers
        )
        model_ref = record.model or "demo"
        if model_ref in ("demo", DEMO_PROVIDER) or model_ref.startswith(f"{DEMO_PROVIDER}/"):
            server: ScriptedModelServer = demo_server()
            await self._stack.enter_async_context(server)
            catalog[DEMO_PROVIDER] = demo_provider(server.base_url)
            self.emit(
                EventKind.NOTICE,
                message="using the offline demo model (scripted, not a real LLM); "
                "choose a real one with --model PROVIDER/MODEL",
            )
        try:
            provider, model_id = _resolve_model(model_ref, catalog)
        except Exception as exc:
            raise RunError(f"unknown model {model_ref!r}: {exc}. See `piwork models`.") from exc
        token = secrets.token_urlsafe(24)
        # Only this task's provider and model are reachable: the guest can never
        # spend another of the person's keys, nor pick a pricier model.
        provider = _only_model(provider, model_id)
        self._gateway_prices = any(spec.cost is not None for spec in provider.models)
        gateway = ModelGateway(
            {provider.name: provider},
            KeyStore(paths=self.paths),
            task_id=task.id,
            on_usage=self._on_gateway_usage,
            guest_token=token,
            before_forward=self._checkpoint_before_model_call,
            allowed_models=(model_id,),
            admit=self._gateway_admits,
        )
        await self._stack.enter_async_context(gateway)
        self._gateway = gateway
        # Only the VM may use the egress proxy: it gets this run's token in its
        # proxy URL when pi starts (never on disk, the command line or a template).
        egress_token = secrets.token_urlsafe(24)
        egress = EgressProxy(
            self._domain_policy,
            on_decision=self._on_egress_decision,
            allow_private_networks=self.req.egress_allow_private_networks,
            token=egress_token,
        )
        await self._stack.enter_async_context(egress)
        models_json = render_guest_models_json([provider], placeholder=token)
        self._write_state_file(
            "agent/models.json", orjson.dumps(models_json, option=orjson.OPT_INDENT_2)
        )

        # The pack and the accelerator.
        t = time.monotonic()
        pack_dir = await asyncio.to_thread(
            ensure_pack, log=lambda msg: self.emit(EventKind.NOTICE, message=msg)
        )
        manifest = load_manifest(pack_dir)
        self.timings["pack"] = time.monotonic() - t
        accel = probe(self.req.accel)
        self.emit(
            EventKind.NOTICE,
            message=f"accelerator: {accel.accel.value} ({accel.reason})",
            accel=accel.accel.value,
        )

        await self._set_status(TaskStatus.RUNNING)
        cfg = AgentVmConfig(
            pack_dir=pack_dir,
            manifest=manifest,
            accel=accel,
            dirs=TaskDirs(task.state_dir, task.outputs_dir, task.uploads_dir, folder),
            log_dir=task.dir / "logs",
            gateway_port=gateway.port,
            egress_port=egress.port,
            transport=self.req.transport,
            memory_mb=self.req.memory_mb,
            cpus=self.req.cpus,
            boot_stall_timeout=self.req.boot_stall_timeout,
            task_id=task.id,
            provider=provider.name,
            model=model_id,
            extensions=[GATE_EXTENSION, f"{GUEST_EXTENSIONS}/ask-user.ts"],
            extra_env={
                "PIWORK_READONLY_DIRS": "/mnt/uploads:/opt/piwork",
                **guest_proxy_env(
                    proxy_url_with_token(
                        f"http://{EGRESS_GUEST_ADDR[0]}:{EGRESS_GUEST_ADDR[1]}", egress_token
                    ),
                    (GATEWAY_GUEST_ADDR[0],),
                ),
            },
            warm_start=self.req.warm_start,
        )
        callbacks: dict[str, Any] = dict(
            on_stage=lambda name, secs: self.emit(EventKind.BOOT, stage=name, seconds=secs),
            on_supervisor_event=self._on_supervisor_event,
            # "restored in 1.2 s" / "cold boot: <reason>" (data: warm, restored, cold_reason)
            on_boot_mode=lambda msg, data: self.emit(EventKind.NOTICE, message=msg, **data),
        )
        if self.req.host is None:
            agent = AgentVm(cfg, **callbacks)
        else:  # issue 21: QEMU on a remote host over SSH; gateway, proxy and keys stay here
            from piwork.hosts.store import HostError
            from piwork.hosts.vm import open_remote_agent

            try:
                agent = await open_remote_agent(
                    self.req.host,
                    cfg,
                    self._stack,
                    notice=lambda msg: self.emit(EventKind.NOTICE, message=msg),
                    **callbacks,
                )
            except HostError as exc:
                raise RunError(str(exc)) from exc
        self.agent = agent
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        agent.rpc.set_line_tap(self._on_pi_line, thread_safe=True)  # see _note
        agent.rpc.set_ui_handler(self._on_ui_request)
        agent.rpc.add_listener(self._on_item)
        t = time.monotonic()
        try:
            await agent.start()
            state = await agent.wait_pi_ready()
        except Exception as exc:
            raise await self._vm_start_failed(agent, exc) from exc
        self.timings["boot_to_pi_ready"] = time.monotonic() - t
        self.timings["start_to_pi_ready"] = time.monotonic() - self.t0
        self.timings.update({f"vm_{k}": v for k, v in agent.timings.items()})
        self.emit(
            EventKind.READY,
            seconds=self.timings["start_to_pi_ready"],
            session=state.session_file,
            messages=state.message_count,
        )

    async def _vm_start_failed(self, agent: AgentVm, exc: Exception) -> Exception:
        """A start that failed because QEMU exited says so, and what to do next."""
        vm = agent.vm
        if vm.proc is None or not await vm.wait_exit(1.0):
            return exc  # the VM still runs: the error is about something else
        assert self.task is not None
        code = vm.proc.returncode or 0
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        cause = re.sub(r" \(exit status -?\d+\)", "", cause)
        try:
            status = f"killed by {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        except ValueError:
            status = f"status {code}"
        summary = (
            f"the VM exited while starting: {cause} (QEMU {status}). "
            f"`piwork resume {self.task.id}` tries again; if it fails again, `piwork doctor` "
            f"checks QEMU and the accelerator. Console log: {vm.spec.console_log}"
        )
        self._start_failure = summary
        return VmStartFailed(summary, vm.console_tail())

    def _write_state_file(self, rel: str, data: bytes) -> None:
        """Write a host-made file into the task's state share (the guest can write it).

        Never follows a link the guest planted: the file is replaced atomically
        beneath the share root, and a link standing where a directory of ours
        belongs is removed (not followed) before the write is tried again.
        """
        assert self.task is not None
        root = self.task.state_dir
        try:
            sharefs.write_atomic_beneath(root, rel, data, mode=0o644)
        except sharefs.UnsafePathError:
            parent = str(Path(rel).parent)
            if parent != "." and not stat.S_ISDIR(sharefs.lstat_beneath(root, parent).st_mode):
                sharefs.unlink_beneath(root, parent)
                self.emit(EventKind.NOTICE, message=f"replaced a link the guest made at {parent}/")
            sharefs.write_atomic_beneath(root, rel, data, mode=0o644)

    async def close(self, *, graceful: bool = True, cancelled: bool = False) -> None:
        self._closing = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._flush_usage(), 10)
        try:
            if self.agent is not None:
                await self.agent.stop(graceful=graceful)
        finally:
            self.agent = None
            # Record the end (a no-op if the run already did); a second Ctrl-C
            # here must not skip the cleanup below.
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpoint_end()
            try:
                current: TaskStatus | None = (
                    self.store.get(self.task.id).record.status if self.task is not None else None
                )
            except Exception as exc:  # task.json unreadable: still release everything below
                log.error("cannot read the task's state while closing: %s", exc)
                current = None
            if current is not None and current not in (
                TaskStatus.STOPPED,
                TaskStatus.IDLE,
                TaskStatus.INTERRUPTED,
            ):
                # Leaving while the task is live (crash, Ctrl-C twice): say so.
                with contextlib.suppress(Exception):
                    if cancelled:
                        await self._set_status(
                            TaskStatus.STOPPED,
                            reason=StopReason.CANCELLED,
                            message="stopped by the person before the task finished",
                        )
                    else:
                        await self._set_status(
                            TaskStatus.STOPPED,
                            reason=StopReason.ERROR,
                            message=self._start_failure
                            or "piwork stopped before the task finished",
                        )
            await self._stack.aclose()
            self.store.close()

    # ------------------------------------------------------------ checkpoints
    # The folder is recorded at task start, before every model call (the gateway
    # awaits _checkpoint_before_model_call before forwarding, so a turn's tools
    # cannot have run yet: they need the reply) and at the end of each run. A
    # failed checkpoint is reported, not fatal: the task goes on without it.
    async def _checkpoint_start(self) -> None:
        assert self.task is not None
        try:
            self._ckpt = RunRecorder.for_task(self.task, self._on_changes)
            if self._ckpt is not None:
                self._ckpt.begin()  # overlaps the boot; the first model call waits for it
        except Exception as exc:
            self._ckpt = None
            self.emit(EventKind.ERROR, message=f"checkpoints are off for this run: {exc}")

    async def _checkpoint_before_model_call(self) -> None:
        sync = getattr(self.agent, "sync_folder", None)  # a VM on a remote host (issue 21):
        if sync is not None:  # its folder changes come here first, so the checkpoint sees them
            await sync()
        await self._checkpoint(lambda rec: rec.before_model_call())

    async def _checkpoint_end(self) -> None:
        await self._checkpoint(lambda rec: rec.end())
        if self._ckpt is not None and self._ckpt.timings:
            self.timings["checkpoint_max"] = max(self._ckpt.timings)

    async def _checkpoint(self, step: Callable[[RunRecorder], Awaitable[object]]) -> None:
        if self._ckpt is None:
            return
        try:
            await step(self._ckpt)
        except Exception as exc:
            self.emit(
                EventKind.ERROR,
                message=f"could not checkpoint the working folder ({exc}); "
                "changes made from here on may not be undoable",
            )

    def _on_changes(self, data: dict[str, Any]) -> None:
        self._note("changes", data)
        self.emit(EventKind.CHANGES, **data)

    # ------------------------------------------------------------ hooks from below
    def _on_pi_line(self, raw: bytes, parsed: dict[str, Any] | MalformedLine) -> None:
        """Every line pi wrote, parsed once by the RPC client, stored as deltas."""
        if isinstance(parsed, MalformedLine):
            data: Any = {"malformed": raw[:2000].decode("utf-8", "replace")}
        else:
            data = compact_pi_line(parsed)
        self._note("pi", data)

    def _on_supervisor_event(self, msg: dict[str, Any]) -> None:
        self._note("supervisor", msg)
        if msg.get("ev") == "exit" and self._stop_reason is None and not self._closing:
            self.emit(EventKind.ERROR, message=f"pi exited unexpectedly: {msg}")

    def _on_gateway_usage(self, rec: UsageRecord) -> None:
        self._note(
            "model_call",
            {
                "provider": rec.provider,
                "model": rec.model,
                "status": rec.status,
                "inputTokens": rec.input_tokens,
                "outputTokens": rec.output_tokens,
                "seconds": round(rec.duration_s, 3),
                **({"estimated": True} if rec.estimated else {}),
            },
        )
        # The gateway sees every model call, pi's or any other guest code's:
        # its counts are what the task's token (and, where priced, cost) limits use.
        self._add_usage(
            TaskUsage(
                input_tokens=rec.input_tokens,
                output_tokens=rec.output_tokens,
                cache_read_tokens=rec.cache_read_tokens,
                cache_write_tokens=rec.cache_write_tokens,
                cost_usd=rec.cost_usd or 0.0,
            ),
            report=True,
        )

    def _on_item(self, item: ClientItem) -> None:
        if isinstance(item, m.MessageUpdate):
            delta = m.text_delta(item)
            if delta:
                self.emit(EventKind.TEXT, delta=delta)
        elif isinstance(item, m.MessageEnd):
            outcome = m.assistant_outcome(item)
            if outcome is not None:
                self._last_assistant = outcome
                self.emit(
                    EventKind.TEXT_END,
                    stop_reason=outcome.stop_reason,
                    error=outcome.error_message,
                )
                self._account(outcome.usage)
        elif isinstance(item, m.ToolExecutionStart):
            s = m.tool_call_summary(item)
            self.emit(EventKind.TOOL_START, id=s.tool_call_id, name=s.tool_name, arg=s.key_arg)
        elif isinstance(item, m.ToolExecutionEnd):
            o = m.tool_outcome(item)
            self.emit(EventKind.TOOL_END, id=o.tool_call_id, name=o.tool_name, ok=o.ok, text=o.text)
        elif isinstance(item, m.TurnStart):
            if self._ckpt is not None:
                self._ckpt.turn_started()
        elif isinstance(item, m.TurnEnd):
            self._net_once.clear()  # "allow once" lasts one turn
            self._account(None, turns=1)
        elif isinstance(item, m.AutoRetryStart):
            self.emit(
                EventKind.NOTICE,
                message=f"model call failed ({item.error_message}); retrying in "
                f"{item.delay_ms / 1000:.0f}s (attempt {item.attempt}/{item.max_attempts})",
            )
        elif isinstance(item, m.ExtensionError):
            self.emit(EventKind.NOTICE, message=f"extension error: {item.error}")
        elif isinstance(item, m.NotifyRequest):
            self.emit(EventKind.NOTICE, message=f"agent: {item.message}")
        elif isinstance(item, (MalformedLine, OversizedLine)):
            self.emit(EventKind.NOTICE, message=f"unreadable line from pi: {item}")

    def _account(self, usage: m.Usage | None, *, turns: int = 0) -> None:
        """Turns from pi; tokens come from the gateway (which sees every call).

        pi's own usage only adds cost, and only for providers whose prices the
        gateway does not know (pi's built-ins carry their price list).
        """
        delta = TaskUsage(turns=turns)
        if usage is not None and not self._gateway_prices:
            delta = TaskUsage(turns=turns, cost_usd=max(usage.cost.total, 0.0))
        self._add_usage(delta, report=usage is not None)

    def _add_usage(self, delta: TaskUsage, *, report: bool) -> None:
        if self.task is None:
            return
        # task.json is rewritten (two fsyncs) off the event loop; deltas that arrive
        # while a write is under way are added up and written together.
        self._usage_due = self._usage_due.plus(delta)
        self._usage_report = self._usage_report or report
        if self._usage_writer is None or self._usage_writer.done():
            self._usage_writer = asyncio.get_running_loop().create_task(
                self._write_usage(), name="task-usage-writer"
            )

    async def _write_usage(self) -> None:
        while self.task is not None and (self._usage_due != TaskUsage() or self._usage_report):
            delta, self._usage_due = self._usage_due, TaskUsage()
            report, self._usage_report = self._usage_report, False
            self._usage_inflight = delta
            try:
                self.task = await asyncio.to_thread(self.store.add_usage, self.task.id, delta)
            except Exception as exc:
                self._usage_due = delta.plus(self._usage_due)  # kept for the next write
                self.emit(EventKind.ERROR, message=f"cannot record usage: {exc}")
                return
            finally:
                self._usage_inflight = TaskUsage()
            if report or delta.total_tokens or delta.cost_usd:
                u = self.task.record.usage
                self.emit(EventKind.USAGE, tokens=u.total_tokens, cost=u.cost_usd, turns=u.turns)
            limit = self.task.record.limit_reached()
            if limit is not None:
                self._on_limit(limit)

    async def _flush_usage(self) -> None:
        """Wait for usage accounted so far to be in task.json."""
        writer = self._usage_writer
        if writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(writer)

    def _gateway_admits(self) -> str | None:
        """Before every model call: refused while any of the task's limits is used up
        (read afresh, so raising a limit lets calls through again)."""
        if self.task is None:
            return None
        try:
            record = self.store.get(self.task.id).record
            # Usage is this session's own count: what the writer last put in task.json
            # (self.task, replaced on the loop in the same step that clears the
            # in-flight delta) plus what is still on its way, so a burst of calls cannot
            # slip past the limit while the writer catches up, and a delta the file
            # already holds is never counted twice. Limits are read afresh.
            pending = self._usage_due.plus(self._usage_inflight)
            used = self.task.record.usage.plus(pending)
            limit = record.limits.exceeded(used, record.wall_seconds())
        except Exception as exc:  # cannot tell: refuse rather than spend blindly
            return f"cannot read this task's limits ({exc})"
        if limit is None:
            return None
        return (
            f"this task reached its {limit.value.replace('_', ' ')} limit; "
            f"`piwork resume` with a higher {_LIMIT_FLAGS[limit]} continues it"
        )

    def _on_limit(self, limit: LimitKind) -> None:
        """Stop the run; the gateway refuses further calls while the limit stands."""
        if self._stop_reason is None:
            self._stop_reason = (StopReason.LIMIT, f"limit reached: {limit.value}", limit)
            self._limit_hit.set()

    # ------------------------------------------------------------ dialogs
    async def _on_ui_request(self, req: m.UiRequest) -> m.UiResponse | None:
        """Answer a dialog pi opened: a permission from policy or the person, else a question."""
        if isinstance(req, m.SelectRequest):
            try:
                perm = parse_request(req)
            except PermissionPayloadError as exc:
                self.emit(EventKind.ERROR, message=f"unreadable permission request, denied: {exc}")
                return m.ui_value(req.id, Choice.DENY.value)
            if perm is not None:
                return m.ui_value(req.id, (await self._answer_permission(perm)).value)
        return await self._answer_question(req)

    async def _answer_permission(self, perm: PermissionRequest) -> Choice:
        perm = validate_request(perm, self._ctx)  # the guest's request is untrusted input
        # The policy read and the audit fsync happen off the event loop.
        decision = await asyncio.to_thread(self.decider.decide, perm, self._ctx)
        base = dict(
            action=perm.action.value, tool=perm.tool, target=perm.summary, question=perm.question
        )
        if decision.verdict is not Verdict.ASK:
            choice = decision.reply_choice
            self.emit(
                EventKind.PERMISSION,
                **base,
                decision=choice.value,
                by="rule",
                rule=decision.rule.describe() if decision.rule else None,
            )
            self._note("permission", {**base, "decision": choice.value, "by": "rule"})
            return choice
        await self._set_status(TaskStatus.WAITING_PERMISSION)
        self.emit(EventKind.PERMISSION, **base, decision="ask", by=None)
        # Front ends show exactly the rules each "Always" would store (host-derived).
        perm = dataclasses.replace(perm, proposals=self.decider.proposals(perm, self._ctx))
        try:
            answer = await self.asker.permission(perm)
        finally:
            if self._stop_reason is None and self.task is not None:
                await self._set_status(TaskStatus.RUNNING)
        if answer is None:
            by = DecidedBy.ASSUME_YES if self.req.assume_yes else DecidedBy.NO_TERMINAL
            answer = Choice.ALLOW_ONCE if self.req.assume_yes else Choice.DENY
        elif isinstance(self.asker, AllowAsker):
            by = DecidedBy.ASSUME_YES  # --yes answered, not a person: the audit must say so
        else:
            by = DecidedBy.PERSON
        if answer is Choice.ALLOW_ONCE and perm.action is Action.NETWORK and perm.tool != "network":
            self._net_once.update(t.domain.lower() for t in perm.targets if t.domain)
        recorded = await asyncio.to_thread(
            self.decider.record_answer, perm, answer, self._ctx, decided_by=by
        )
        self.emit(
            EventKind.PERMISSION,
            **base,
            decision=answer.value,
            by=by,
            rules=[r.describe() for r in recorded.created_rules],
        )
        self._note("permission", {**base, "decision": answer.value, "by": by})
        return answer

    async def _answer_question(self, req: m.UiRequest) -> m.UiResponse:
        title = str(getattr(req, "title", ""))
        message = getattr(req, "message", None) or getattr(req, "placeholder", None)
        options = getattr(req, "options", None)
        await self._set_status(TaskStatus.WAITING_INPUT)
        self.emit(EventKind.QUESTION, method=req.method, title=title, options=options)
        try:
            answer = await self.asker.question(req.method, title, message, options)
        finally:
            if self._stop_reason is None and self.task is not None:
                await self._set_status(TaskStatus.RUNNING)
        self._note("question", {"method": req.method, "title": title, "answer": answer})
        if answer is None:
            return m.ui_cancelled(req.id)
        if req.method == "confirm":
            return m.ui_confirmed(req.id, bool(answer))
        return m.ui_value(req.id, str(answer))

    async def _domain_policy(self, host: str, port: int) -> bool:
        """The egress proxy asks here before the guest reaches a new host."""
        if host.lower() in self._net_once:
            self._note(
                "egress", {"host": host, "port": port, "decision": "allow", "by": "allow-once"}
            )
            return True
        if domain_allowed(host, self._allow_net):
            self._note(
                "egress", {"host": host, "port": port, "decision": "allow", "by": "--allow-net"}
            )
            return True
        target = Target(
            Action.NETWORK,
            op="network",
            domain=host,
            reason=f"connects to {host}:{port} through the egress proxy",
        )
        perm = PermissionRequest(
            request_id=f"egress-{secrets.token_hex(4)}",
            question=f"The agent wants to connect to {host} (port {port}). Allow?",
            options=tuple(c.value for c in Choice),
            action=Action.NETWORK,
            tool="network",
            tool_call_id=None,
            task_id=self.task.id if self.task else None,
            cwd=None,
            command=None,
            paths=(),
            targets=(target,),
            payload={},
        )
        return (await self._answer_permission(perm)).allows

    def _on_egress_decision(self, decision: Any) -> None:
        self._note(
            "egress",
            {
                "host": decision.host,
                "port": decision.port,
                "allowed": decision.allowed,
                "reason": decision.reason,
            },
        )

    # ------------------------------------------------------------ controls
    @property
    def rpc(self) -> Any:
        assert self.agent is not None
        return self.agent.rpc

    async def run_prompt(self, text: str) -> Outcome:
        """Send ``text`` and wait until the agent is really finished (or stopped)."""
        assert self.task is not None and self.agent is not None
        async with self._run_lock:
            if self._abort_inflight is not None:  # a stop pi had not confirmed yet
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._abort_inflight)
                self._abort_inflight = None
            self._last_assistant = None
            self._note("prompt", {"message": text})
            self.emit(EventKind.PROMPT, message=text)
            await self._set_status(TaskStatus.RUNNING)  # a no-op if it is already
            t = time.monotonic()
            work = asyncio.ensure_future(self._prompt_and_wait(text))
            limit = asyncio.ensure_future(self._limit_hit.wait())
            clock = asyncio.ensure_future(self._watch_wall_time())
            assert self.agent.pi_exit is not None
            pi_gone: asyncio.Future[Any] = self.agent.pi_exit
            try:
                done, _ = await asyncio.wait(
                    {work, limit, pi_gone}, return_when=asyncio.FIRST_COMPLETED
                )
            except asyncio.CancelledError:
                discard(work, limit, clock)
                raise
            limit.cancel()
            clock.cancel()
            if work not in done:
                if pi_gone in done and self._stop_reason is None:
                    self._stop_reason = self._pi_gone_reason(pi_gone.result())
                with contextlib.suppress(Exception):
                    await self._abort_run()
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work
            else:
                exc = work.exception()
                if exc is not None and self._stop_reason is None:
                    # pi or its VM died: that (not the lost connection it caused) is the error.
                    self._stop_reason = (
                        self._pi_gone_reason(pi_gone.result())
                        if pi_gone.done()
                        else (StopReason.ERROR, f"{type(exc).__name__}: {exc}", None)
                    )
            self.timings["prompt_to_idle"] = time.monotonic() - t
            await self._checkpoint_end()
            await self._flush_usage()
            return await self._finish()

    async def _watch_wall_time(self, every: float = 2.0) -> None:
        """Usage events cannot catch a wall-time limit during a long tool call: poll it."""
        assert self.task is not None
        while True:
            await asyncio.sleep(every)
            task = await asyncio.to_thread(self.store.get, self.task.id)
            limit = task.record.limit_reached()
            if limit is not None and self._stop_reason is None:
                self._on_limit(limit)
                return

    def _pi_gone_reason(self, gone: dict[str, Any]) -> tuple[StopReason, str, None]:
        assert self.task is not None and self.agent is not None
        what = gone.get("message") or f"pi exited: {gone}"
        tail = "\n".join(self.agent.stderr_tail[-10:])
        resume = f"; `piwork resume {self.task.id}` continues the task"
        return StopReason.ERROR, f"{what}{resume}\n{tail}".rstrip(), None

    async def _prompt_and_wait(self, text: str) -> None:
        await self.rpc.prompt(text)
        await self.rpc.wait_idle()

    async def _finish(self) -> Outcome:
        assert self.task is not None
        if self._stop_reason is not None:
            reason, message, limit = self._stop_reason
        else:
            last = self._last_assistant
            if last is not None and last.stop_reason == "error":
                reason, message, limit = (
                    StopReason.ERROR,
                    f"model error: {last.error_message}",
                    None,
                )
            elif last is not None and last.stop_reason == "aborted":
                reason, message, limit = StopReason.CANCELLED, "aborted", None
            else:
                reason, message, limit = StopReason.COMPLETED, None, None
        status: TaskStatus | None = None
        try:
            await self._set_status(TaskStatus.STOPPED, reason=reason, message=message, limit=limit)
        except TaskWriteError as exc:
            # task.json keeps its last state (the disk is full, or gone): the run
            # still ends, and says why. Once this process lets the task go, the
            # next look at it (`piwork tasks`, resume) finds it interrupted.
            full = exc.errno == errno.ENOSPC
            self.emit(
                EventKind.ERROR,
                message=f"cannot record the end of the task ({exc}); "
                + ("free some disk space, then " if full else "")
                + f"`piwork resume {self.task.id}` continues it",
            )
            status = TaskStatus.INTERRUPTED
        self._stop_reason = None
        self._limit_hit.clear()
        if status is None:
            record = (await asyncio.to_thread(self.store.get, self.task.id)).record
            status = record.status
        else:
            record = self.task.record
        outcome = Outcome(self.task.id, status.value, reason.value, message, dict(self.timings))
        self.emit(
            EventKind.DONE,
            status=outcome.status,
            reason=outcome.reason,
            message=message,
            tokens=record.usage.total_tokens,
            turns=record.usage.turns,
            timings={k: round(v, 2) for k, v in self.timings.items()},
        )
        return outcome

    async def _abort_run(self) -> None:
        """Answer every open dialog (pi would hang on them), then abort the run."""
        opened = list(self.rpc.open_dialogs.values())
        await self.rpc.cancel_open_dialogs()
        for dialog in opened:
            with contextlib.suppress(Exception):
                perm = parse_request(dialog) if isinstance(dialog, m.SelectRequest) else None
                if perm is not None:
                    self.decider.record_cancelled(perm, self._ctx)
                    # Tell front ends (and the transcript) the open question is gone.
                    fields = dict(
                        action=perm.action.value,
                        tool=perm.tool,
                        target=perm.summary,
                        decision="cancelled",
                        by=DecidedBy.CANCELLED,
                    )
                    self.emit(EventKind.PERMISSION, **fields, question=perm.question)
                    self._note("permission", fields)
        if self._paused:
            await self.resume_vm()
        abort = asyncio.ensure_future(self.rpc.abort(timeout=30))
        abort.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
        await asyncio.wait({abort}, timeout=ABORT_CONFIRM_S)
        if not abort.done():
            # A stop must not wait on pi: a guest flooding the channel (or a pi too
            # busy to answer) would hold it for as long as it likes. The run ends
            # now; the next prompt waits for the confirmation first, and closing
            # the task powers the VM off.
            self._abort_inflight = abort
            self.emit(
                EventKind.NOTICE,
                message=f"pi has not confirmed the stop within {ABORT_CONFIRM_S:.1f} s; "
                "the run is stopped here regardless",
            )
        elif not abort.cancelled() and abort.exception() is not None:
            raise abort.exception()

    async def stop(self, message: str = "stopped by the person") -> None:
        """Cancel the task's current run: it ends ``cancelled`` within seconds."""
        if self._stop_reason is None:
            self._stop_reason = (StopReason.CANCELLED, message, None)
        self._limit_hit.set()  # wakes run_prompt, which aborts and finishes

    async def steer(self, text: str) -> None:
        self._note("steer", {"message": text})
        self.emit(EventKind.PROMPT, message=text, mode="steer")
        await self.rpc.steer(text)

    async def follow_up(self, text: str) -> None:
        self._note("follow_up", {"message": text})
        self.emit(EventKind.PROMPT, message=text, mode="follow_up")
        await self.rpc.follow_up(text)

    @property
    def paused(self) -> bool:
        """The VM is frozen by :meth:`pause_vm` until :meth:`resume_vm`."""
        return self._paused

    async def pause_vm(self) -> None:
        """Freeze the whole guest (QMP stop): no CPU, no events, until resumed."""
        assert self.agent is not None
        if not self._run_lock.locked() or self._stop_reason is not None:
            raise RunError("nothing to pause: the agent is not running a prompt")
        self.rpc.freeze()  # a frozen pi cannot answer: no reply may time out meanwhile
        try:
            await self.agent.vm.pause()
        except BaseException:
            self.rpc.thaw()
            raise
        self._paused = True
        await self._set_status(TaskStatus.PAUSED)

    async def resume_vm(self) -> None:
        assert self.agent is not None
        await self.agent.vm.resume()
        self.rpc.thaw()
        self._paused = False
        await self._set_status(TaskStatus.RUNNING)


async def run_task(
    req: RunRequest, sink: EventSink | None = None, asker: Asker | None = None
) -> Outcome:
    """Start (or resume) a task, run its prompt to the end, power the VM off."""
    async with TaskSession(req, sink, asker) as session:
        prompt = req.prompt
        if prompt is None:
            prompt = DEFAULT_RESUME_PROMPT
        return await session.run_prompt(prompt)
