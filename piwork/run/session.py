"""One task's life, sequenced: open/claim the task, start, run a prompt, stop/steer/pause, close.

The session only sequences a run; its collaborators are their own modules:
``environment`` builds everything before the VM, ``permissions`` answers
pi's dialogs and the egress proxy, ``usage`` meters and enforces limits,
``digest`` turns pi's events into :class:`RunEvent` data. The VM and pi are
reached through one door, an :class:`Agent` (``piwork.agent.AgentVm`` in
production; tests inject a small double through ``agent_factory``). Nothing
here prints or reads a terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from piwork.agent import Agent, AgentFactory, AgentVm, AgentVmConfig
from piwork.aio import discard
from piwork.config import Paths, get_paths
from piwork.net.mirrors import mirror_hosts, mirrors_for
from piwork.policy.rules import TaskContext
from piwork.preview import Previews
from piwork.proxy.gateway import ModelGateway
from piwork.resources import ResourceError, vm_budget
from piwork.rpc import models as m
from piwork.run import environment
from piwork.run.digest import EventKind, EventSink, PiItem, RunEvent, digest
from piwork.run.permissions import (
    Asker,
    PermissionBridge,
    allowed_domains,
)
from piwork.run.records import FolderCheckpoints, FolderGuard, TranscriptNotes
from piwork.run.request import (
    DEFAULT_RESUME_PROMPT,
    Outcome,
    RunError,
    RunRequest,
    StopWhy,
    VmStartFailed,
    ending,
    open_task,
)
from piwork.run.status import (
    LEFT_CANCELLED,
    LEFT_RUNNING,
    StatusRecorder,
    end_not_recorded,
    leaving_status,
    run_ended_by,
)
from piwork.run.usage import UsageMeter, refuse_if_used_up
from piwork.tasks import StopReason, Task, TaskStatus, TaskStore, TaskWriteError
from piwork.tasks.model import LimitKind

log = logging.getLogger(__name__)
__all__ = ["ABORT_CONFIRM_S", "LEFT_CANCELLED", "LEFT_RUNNING", "TaskSession", "run_task"]

ABORT_CONFIRM_S = 1.5
"""How long a stop waits for pi to confirm the abort before ending the run anyway."""


def _is_interrupt(et: type[BaseException] | None) -> bool:
    return et is not None and issubclass(et, (asyncio.CancelledError, KeyboardInterrupt))


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
        agent_factory: AgentFactory = AgentVm,
    ) -> None:
        self.req = req
        self.sink = sink or (lambda ev: None)
        self.paths = paths or get_paths()
        self.t0 = time.monotonic()
        self.store = TaskStore(self.paths.tasks, fsync_delay=0.05)
        self.task: Task | None = None
        self.agent: Agent | None = None
        self.agent_factory = agent_factory
        self.permissions = PermissionBridge.for_run(
            self, self.paths, asker, policy_file=policy_file, assume_yes=req.assume_yes
        )
        self.permissions.on_unusable_policy = lambda msg: self._end_run(StopReason.ERROR, msg)
        self.usage: UsageMeter | None = None
        self.gateway: ModelGateway | None = None
        self.timings: dict[str, float] = {}
        self._stack = contextlib.AsyncExitStack()
        self._last_assistant: m.AssistantOutcome | None = None
        self._stop: StopWhy | None = None
        self._limit_hit = asyncio.Event()
        self._run_lock = asyncio.Lock()
        self._paused = False
        self._closing = False
        self.transcript = TranscriptNotes(self.store, self.emit, self._disk_full)
        self.checkpoints = FolderCheckpoints(self.emit, self.note)
        self.guard = FolderGuard(self.emit, self.note)
        self.status = StatusRecorder(self.store, self.emit)
        self._abort_inflight: asyncio.Future[Any] | None = None
        self._start_failure: str | None = None  # why start() failed: the task's stop message
        self.previews: Previews | None = None
        """The task's previews (guest ports opened in the browser): ``previews.list()``."""

    # ------------------------------------------------------------ state seen from outside
    @property
    def asker(self) -> Asker:
        """Who is asked when the policy cannot decide (a front end may swap it)."""
        return self.permissions.asker

    @asker.setter
    def asker(self, asker: Asker) -> None:
        self.permissions.asker = asker

    @property
    def task_id(self) -> str | None:
        return self.task.id if self.task is not None else None

    @property
    def stop_reason(self) -> StopWhy | None:
        """Why the current run is ending (reason, message, limit), once something said so."""
        return self._stop

    @property
    def stopping(self) -> bool:
        return self._stop is not None

    @property
    def stop_requested(self) -> bool:
        """A stop, a limit or a full disk has asked the current run to end."""
        return self._limit_hit.is_set()

    @property
    def paused(self) -> bool:
        """The VM is frozen by :meth:`pause_vm` until :meth:`resume_vm`."""
        return self._paused

    # ------------------------------------------------------------ events and records
    def emit(self, kind: EventKind, **data: Any) -> None:
        ev = RunEvent(kind, data, time.monotonic() - self.t0, self.task_id)
        try:
            self.sink(ev)
        except Exception:  # a broken front end must not break the task
            log.exception("event sink failed")

    def note(self, kind: str, data: Any) -> None:
        """Append to the task transcript; a disk error becomes a task error, not a crash."""
        self.transcript.note(kind, data)

    def _disk_full(self, message: str) -> None:
        if self._stop is None:  # going on would only pile records up in memory
            self._end_run(StopReason.ERROR, message)

    def _end_run(
        self, reason: StopReason, message: str | None, limit: LimitKind | None = None
    ) -> None:
        if self._stop is None:
            self._stop = (reason, message, limit)
        self._limit_hit.set()  # wakes run_prompt, which aborts and finishes

    async def set_status(
        self,
        status: TaskStatus,
        *,
        reason: StopReason | None = None,
        message: str | None = None,
        limit: LimitKind | None = None,
    ) -> None:
        assert self.task is not None
        task = await self.status.set(
            self.task.id, status, reason=reason, message=message, limit=limit
        )
        self.task = task or self.task

    # ------------------------------------------------------------ open and start
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

    def open_task(self) -> Task:
        """The request's task: loaded (and updated) to resume, or created. Not claimed yet."""
        return open_task(self.store, self.req)

    def adopt(self, task: Task) -> None:
        """Claim ``task`` for this session (released at :meth:`close`) and run it here."""
        self._stack.enter_context(self.store.claim(task.id))
        self.task = task
        self.transcript.task_id = task.id
        folder = Path(task.record.working_folder) if task.record.working_folder else None
        self.permissions.context = TaskContext(task_id=task.id, working_folder=folder)
        self.permissions.mirror_hosts = tuple(mirror_hosts(mirrors_for(self.paths, folder)))
        self.usage = UsageMeter(
            self.store, task, emit=self.emit, note=self.note, on_limit=self._on_limit
        )

    def defer(self, callback: Callable[..., object], *args: Any) -> None:
        """Call ``callback(*args)`` at :meth:`close`, after the VM is off (LIFO)."""
        self._stack.callback(callback, *args)

    def attach_agent(self, agent: Agent) -> None:
        """Take pi's lines, dialogs and events from ``agent`` (what :meth:`start` boots)."""
        self.agent = agent
        self.transcript.bind_loop()
        agent.connect(line_tap=self.transcript.pi_line, ui_handler=self.permissions.on_ui_request,
                      listener=self._on_item)  # fmt: skip

    def add_item_listener(self, listener: Callable[[PiItem], None]) -> Callable[[], None]:
        """Also see every raw pi item (tests and benchmarks time them)."""
        return self._live("listen to pi").add_listener(listener)

    def _live(self, what: str) -> Agent:
        """The agent, or a RunError naming the state found (not started, or closed)."""
        if self.agent is None:
            state = "closed" if self._closing else "not started"
            raise RunError(f"cannot {what}: the task's VM is {state}")
        return self.agent

    async def start(self) -> None:
        self.permissions.allow_net = allowed_domains(self.req.allow_net)
        # A policy the host cannot read is never a looser one: nothing starts on it.
        damage = await asyncio.to_thread(self.permissions.decider.store.check)
        if damage is not None:
            raise damage
        # Store work that may wait on another process's lock runs off the event loop.
        task = await asyncio.to_thread(self.open_task)
        self.task = task
        refuse_if_used_up(task)
        await asyncio.to_thread(self.adopt, task)
        await asyncio.to_thread(self.store.transcript, task.id)  # opened (and locked) now
        try:  # refuse now, clearly, rather than hang or meet the OOM killer later
            self._stack.enter_context(vm_budget(self.req.memory_mb, self.req.cpus))
        except ResourceError as exc:
            raise RunError(str(exc)) from exc
        record = task.record
        folder = self.permissions.context.working_folder
        self.checkpoints.begin(task)
        self.emit(EventKind.TASK, id=task.id, title=record.title,
                  folder=str(folder) if folder else None, model=record.model,
                  resumed=bool(self.req.task_id))  # fmt: skip
        assert self.usage is not None
        hooks = environment.EnvironmentHooks(
            emit=self.emit,
            on_usage=self.usage.on_gateway_usage,
            before_model_call=self._before_model_call,
            admit=self.usage.admits,
            domain_policy=self.permissions.domain_policy,
            on_egress_decision=self.permissions.on_egress_decision,
            on_gateway=lambda gateway: setattr(self, "gateway", gateway),
            private_policy=self.permissions.private_policy,
            ask_server_tool=self.permissions.server_tool_policy,
        )
        try:
            env = await environment.prepare(
                self._stack, task, self.paths, hooks,
                extra_providers=self.req.extra_providers,
                egress_allow_private_networks=self.req.egress_allow_private_networks,
                accel=self.req.accel,
            )  # fmt: skip
        except environment.ModelNotFound as exc:
            raise RunError(str(exc)) from exc
        self.usage.gateway_prices = env.gateway_prices
        task_env = await env.task_env(
            self.paths, task, folder, self.emit, clean=self.req.clean_env, host=self.req.host
        )
        self.timings.update(env.timings)
        await self.set_status(TaskStatus.RUNNING)
        r = self.req
        cfg = env.agent_config(task, folder, transport=r.transport, memory_mb=r.memory_mb,
                               cpus=r.cpus, boot_stall_timeout=r.boot_stall_timeout,
                               warm_start=r.warm_start, env=task_env)  # fmt: skip
        await self._boot(cfg)

    async def _boot(self, cfg: AgentVmConfig) -> None:
        agent = await environment.open_agent(
            cfg, self.agent_factory, self._stack, self.emit, self._on_supervisor_event,
            host=self.req.host,
        )  # fmt: skip
        self.attach_agent(agent)
        t = time.monotonic()
        try:
            await agent.start()
            state = await agent.wait_pi_ready()
        except Exception as exc:
            raise await self._vm_start_failed(agent, exc) from exc
        self._start_previews(agent)
        self.timings["boot_to_pi_ready"] = time.monotonic() - t
        self.timings["start_to_pi_ready"] = time.monotonic() - self.t0
        self.timings.update({f"vm_{k}": v for k, v in agent.timings.items()})
        self.guard.started(agent, self.timings)
        self.emit(EventKind.READY, seconds=self.timings["start_to_pi_ready"],
                  session=state.session_file, messages=state.message_count)  # fmt: skip

    def _start_previews(self, agent: Agent) -> None:
        """Guest servers the person allows open on loopback URLs (piwork.preview)."""
        mux = agent.preview_mux()
        if mux is not None and self.task is not None:
            self.previews = self.permissions.previews(self.task)
            self.previews.start(mux, self.asker, lambda d: self.emit(EventKind.PREVIEW, **d))

    async def _before_model_call(self) -> None:
        """The folder is made safe and brought here first (records.FolderGuard), then the
        turn is recorded: the gateway holds the model call until both are done."""
        if self.agent is not None:
            await self.guard.before_model_call(self.agent)
        await self.checkpoints.before_model_call()

    async def _vm_start_failed(self, agent: Agent, exc: Exception) -> Exception:
        """A start that failed because QEMU exited says so, and what to do next."""
        gone = await agent.exit_diagnosis(1.0)
        if gone is None:
            return exc  # the VM still runs: the error is about something else
        failure = VmStartFailed.from_exit(str(self.task_id), exc, gone)
        self._start_failure = failure.summary
        return failure

    # ------------------------------------------------------------ close
    async def close(self, *, graceful: bool = True, cancelled: bool = False) -> None:
        self._closing = True
        if self.usage is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.usage.flush(), 10)
        if self.previews is not None:
            with contextlib.suppress(Exception):
                await self.previews.close()  # before the VM goes: connections refused from now
        try:
            if self.agent is not None:
                await self.agent.stop(graceful=graceful)
                self.guard.report(self.agent)
        finally:
            self.agent = None
            # Record the end (a no-op if the run already did); a second Ctrl-C
            # here must not skip the cleanup below.
            with contextlib.suppress(asyncio.CancelledError):
                await self.checkpoints.end(self.timings)
            now = self.status.current(self.task_id)
            leaving = leaving_status(now, cancelled=cancelled, start_failure=self._start_failure)
            if leaving is not None:  # the task is still live: say how it was left
                with contextlib.suppress(Exception):
                    await self.set_status(TaskStatus.STOPPED, reason=leaving[0], message=leaving[1])
            await self._stack.aclose()
            self.store.close()

    # ------------------------------------------------------------ what pi says
    def _on_supervisor_event(self, msg: dict[str, Any]) -> None:
        self.note("supervisor", msg)
        if self.previews is not None:
            self.previews.on_supervisor_message(msg)
        if msg.get("ev") == "exit" and self._stop is None and not self._closing:
            self.emit(EventKind.ERROR, message=f"pi exited unexpectedly: {msg}")

    def _on_item(self, item: PiItem) -> None:
        for ev in digest(item):
            self.emit(ev.kind, **ev.data)
        if isinstance(item, m.MessageEnd):
            outcome = m.assistant_outcome(item)
            if outcome is not None:
                self._last_assistant = outcome
                if self.usage is not None:
                    self.usage.account(outcome.usage)
        elif isinstance(item, m.TurnStart):
            self.checkpoints.turn_started()
        elif isinstance(item, m.TurnEnd) and self.usage is not None:
            self.usage.account(None, turns=1)

    async def _watch_wall_time(self) -> None:
        if self.usage is not None:
            self._on_limit(await self.usage.wall_time_reached())

    def _on_limit(self, limit: LimitKind) -> None:
        """Stop the run; the gateway refuses further calls while the limit stands."""
        if self._stop is None:
            self._end_run(StopReason.LIMIT, f"limit reached: {limit.value}", limit)

    # ------------------------------------------------------------ controls
    async def run_prompt(self, text: str) -> Outcome:
        """Send ``text`` and wait until the agent is really finished (or stopped)."""
        agent = self._live("run a prompt")
        assert self.task is not None  # an agent is attached only to an adopted task
        async with self._run_lock:
            if self._abort_inflight is not None:  # a stop pi had not confirmed yet
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._abort_inflight)
                self._abort_inflight = None
            self._last_assistant = None
            self.note("prompt", {"message": text})
            self.emit(EventKind.PROMPT, message=text)
            await self.set_status(TaskStatus.RUNNING)  # a no-op if it is already
            t = time.monotonic()
            work = asyncio.ensure_future(self._prompt_and_wait(agent, text))
            limit = asyncio.ensure_future(self._limit_hit.wait())
            clock = asyncio.ensure_future(self._watch_wall_time())
            assert agent.pi_exit is not None
            pi_gone: asyncio.Future[Any] = agent.pi_exit
            try:
                done, _ = await asyncio.wait(
                    {work, limit, pi_gone}, return_when=asyncio.FIRST_COMPLETED
                )
            except asyncio.CancelledError:
                discard(work, limit, clock)
                raise
            limit.cancel()
            clock.cancel()
            if self._stop is None:
                self._stop = run_ended_by(work, pi_gone, agent.stderr_tail, self.task.id)
            if work not in done:
                with contextlib.suppress(Exception):
                    await self._abort_run()
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work
            self.timings["prompt_to_idle"] = time.monotonic() - t
            await self.checkpoints.end(self.timings)
            if self.usage is not None:
                await self.usage.flush()
            return await self._finish()

    @staticmethod
    async def _prompt_and_wait(agent: Agent, text: str) -> None:
        await agent.prompt(text)
        await agent.wait_idle()

    async def _finish(self) -> Outcome:
        assert self.task is not None
        reason, message, limit = self._stop or ending(self._last_assistant)
        status: TaskStatus | None = None
        try:
            await self.set_status(TaskStatus.STOPPED, reason=reason, message=message, limit=limit)
        except TaskWriteError as exc:  # task.json keeps its last state; the run still ends
            self.emit(EventKind.ERROR, message=end_not_recorded(exc, self.task.id))
            status = TaskStatus.INTERRUPTED
        self._stop = None
        self._limit_hit.clear()
        if status is None:
            record = (await asyncio.to_thread(self.store.get, self.task.id)).record
            status = record.status
        else:  # task.json could not be written: what this session last knew
            record = (self.usage.task if self.usage is not None else self.task).record
        outcome = Outcome(self.task.id, status.value, reason.value, message, dict(self.timings))
        self.emit(EventKind.DONE, status=outcome.status, reason=outcome.reason, message=message,
                  tokens=record.usage.total_tokens, turns=record.usage.turns,
                  timings={k: round(v, 2) for k, v in self.timings.items()})  # fmt: skip
        return outcome

    async def _abort_run(self) -> None:
        """Answer every open dialog (pi would hang on them), then abort the run."""
        assert self.agent is not None
        self.permissions.cancelled(await self.agent.cancel_open_dialogs())
        if self._paused:
            await self.resume_vm()
        abort = asyncio.ensure_future(self.agent.abort(30))
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
        elif not abort.cancelled() and (failed := abort.exception()) is not None:
            raise failed

    async def stop(self, message: str = "stopped by the person") -> None:
        """Cancel the task's current run: it ends ``cancelled`` within seconds."""
        self._end_run(StopReason.CANCELLED, message)

    async def steer(self, text: str) -> None:
        agent = self._live("steer")
        self.note("steer", {"message": text})
        self.emit(EventKind.PROMPT, message=text, mode="steer")
        await agent.steer(text)

    async def follow_up(self, text: str) -> None:
        agent = self._live("follow up")
        self.note("follow_up", {"message": text})
        self.emit(EventKind.PROMPT, message=text, mode="follow_up")
        await agent.follow_up(text)

    async def pause_vm(self) -> None:
        """Freeze the whole guest (QMP stop): no CPU, no events, until resumed."""
        agent = self._live("pause")
        if not self._run_lock.locked() or self._stop is not None:
            raise RunError("nothing to pause: the agent is not running a prompt")
        await agent.pause()
        self._paused = True
        if self.previews is not None:
            self.previews.pause()
        await self.set_status(TaskStatus.PAUSED)

    async def resume_vm(self) -> None:
        await self._live("resume").resume()
        self._paused = False
        if self.previews is not None:
            self.previews.resume()
        await self.set_status(TaskStatus.RUNNING)


async def run_task(
    req: RunRequest, sink: EventSink | None = None, asker: Asker | None = None
) -> Outcome:
    """Start (or resume) a task, run its prompt to the end, power the VM off."""
    async with TaskSession(req, sink, asker) as session:
        prompt = req.prompt
        if prompt is None:
            prompt = DEFAULT_RESUME_PROMPT
        return await session.run_prompt(prompt)
