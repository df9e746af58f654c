"""Tasks as the window sees them: one ``TaskController`` per task, a ``Pool`` for the limit.

Qt-free (the views listen to its ``piwork.gui.events.Event``s): the task's fields
become one ``TaskState`` (``piwork.gui.state``) that every view draws from.

Async model: the whole app runs on ONE thread under ``qasync`` — asyncio's
selector loop driven by Qt's event loop (``piwork.gui.loop`` says why, and which
PySide6 build it needs). The pool, queue and keep-warm rules are Qt-free, in
``piwork.run.pool``. Under qasync the runner's event sink and
the Asker run on the Qt thread, so they touch widgets and emit signals
directly, and nothing in the window ever blocks on QEMU, sockets or disk: the
runner awaits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from piwork.errors import describe
from piwork.gui.events import Event
from piwork.gui.state import WORKING, Phase, TaskState, ended_phase
from piwork.policy import Choice, PermissionRequest
from piwork.preview import PreviewChoice, PreviewQuestion
from piwork.preview.state import loopback_address
from piwork.run.pool import CLOSE, Pool
from piwork.runner import EventKind, Outcome, RunEvent, RunRequest, TaskSession
from piwork.tasks import TaskBusy

log = logging.getLogger(__name__)


_BACKGROUND: set[asyncio.Future[Any]] = set()


def spawn(coro: Any) -> asyncio.Future[Any]:
    """Run ``coro`` in the background, keeping a reference until it ends (and logging failures)."""
    fut: asyncio.Future[Any] = asyncio.ensure_future(coro)
    _BACKGROUND.add(fut)

    def done(f: asyncio.Future[Any]) -> None:
        _BACKGROUND.discard(f)
        if not f.cancelled() and f.exception() is not None:
            log.error("background job failed", exc_info=f.exception())

    fut.add_done_callback(done)
    return fut


@dataclass
class PendingPermission:
    request: PermissionRequest
    future: asyncio.Future[Choice | None]


@dataclass
class PendingQuestion:
    method: str
    title: str
    message: str | None
    options: list[str] | None
    future: asyncio.Future[str | bool | None]


@dataclass
class PendingPreview:
    question: PreviewQuestion
    future: asyncio.Future[PreviewChoice | None]


def preview_url(url: object) -> str | None:
    """The URL of a preview event if it is one piwork builds (http on loopback), else None.

    The event comes from this process, but its port numbers came from the guest: the
    window opens nothing but plain ``http://`` on a loopback address (a preview's own
    ``127.a.b.c``) or under ``.localhost``.
    """
    if not isinstance(url, str) or len(url) > 300:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname or ""
    if parts.scheme != "http" or port is None:
        return None
    named = host in ("localhost", "127.0.0.1") or host.endswith(".localhost")
    if not named and loopback_address(host) is None:
        return None
    return url


class GuiAsker:
    """The runner's ``Asker``: each question becomes a future the window answers."""

    def __init__(self, ctl: TaskController) -> None:
        self.ctl = ctl

    async def permission(self, request: PermissionRequest) -> Choice | None:
        fut: asyncio.Future[Choice | None] = asyncio.get_running_loop().create_future()
        pending = PendingPermission(request, fut)
        self.ctl.permissions.append(pending)
        self.ctl.changed.emit()
        self.ctl.permission_asked.emit(pending)
        try:
            return await fut
        finally:
            with contextlib.suppress(ValueError):
                self.ctl.permissions.remove(pending)
            self.ctl.changed.emit()

    async def preview(self, q: PreviewQuestion) -> PreviewChoice | None:
        """The preview question (three answers, each showing the rule it stores)."""
        fut: asyncio.Future[PreviewChoice | None] = asyncio.get_running_loop().create_future()
        pending = PendingPreview(q, fut)
        self.ctl.preview_questions.append(pending)
        self.ctl.changed.emit()
        self.ctl.preview_asked.emit(pending)
        try:
            return await fut
        finally:
            with contextlib.suppress(ValueError):
                self.ctl.preview_questions.remove(pending)
            self.ctl.changed.emit()

    async def question(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> str | bool | None:
        fut: asyncio.Future[str | bool | None] = asyncio.get_running_loop().create_future()
        self.ctl.question = PendingQuestion(method, title, message, options, fut)
        self.ctl.changed.emit()
        self.ctl.question_asked.emit(self.ctl.question)
        try:
            return await fut
        finally:
            self.ctl.question = None
            self.ctl.changed.emit()


@dataclass
class RunOptions:
    model: str | None = None
    folder: Path | None = None
    memory_mb: int = 1024
    cpus: int = 2
    accel: str | None = None
    host: str | None = None
    """A remote host's name (``piwork hosts``); None: this computer."""
    clean_env: bool = False
    """A new task starts from the clean workbench, not the folder's saved environment."""
    extra: dict[str, Any] = field(default_factory=dict)


class TaskController:
    """One task in the window: its live session (if any), pending questions, status.

    Events (``connect``/``emit``, like Qt signals): ``run_event(RunEvent)``,
    ``changed()``, ``permission_asked(PendingPermission)``,
    ``question_asked(PendingQuestion)``, ``preview_asked(PendingPreview)``,
    ``finished(Outcome | Exception)`` and ``closed()`` (the session ended, VM off).
    """

    def __init__(
        self,
        pool: Pool,
        *,
        task_id: str | None = None,
        title: str = "new task",
        status: str = "idle",
        reason: str | None = None,
        folder: Path | None = None,
        model: str | None = None,
    ) -> None:
        self.run_event = Event("run_event")
        self.changed = Event("changed")
        self.permission_asked = Event("permission_asked")
        self.question_asked = Event("question_asked")
        self.preview_asked = Event("preview_asked")
        self.finished = Event("finished")
        self.closed = Event("closed")
        self.pool = pool
        self.task_id = task_id
        self.title = title
        self.status = status
        self.reason = reason
        self.folder = folder
        self.model = model
        self.host: str | None = None  # the remote host it runs on (None: this computer)
        self.session: TaskSession | None = None
        self.permissions: list[PendingPermission] = []
        self.question: PendingQuestion | None = None
        self.preview_questions: list[PendingPreview] = []
        self.previews: dict[int, str] = {}  # open previews of the live session: port -> URL
        self.last_activity = ""
        self.tokens = 0
        self.cost = 0.0
        self.elapsed_before = 0.0  # time worked in earlier runs (task.json's wall time)
        self._clock: float | None = None  # monotonic start of the current run, while busy
        self.stopping = False  # the person asked to stop: pi's "aborted" is not an error
        self._job: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[str] = asyncio.Queue(maxsize=64)
        self._queued_prompt: str | None = None
        self.asker = GuiAsker(self)
        # What runs a prompt: the real runner (tests of the window's own logic inject a
        # double with TaskSession's methods, as httpx takes a MockTransport).
        self.session_factory: Any = TaskSession
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ state
    @property
    def paused(self) -> bool:
        """The runner's pause state is the truth (a status event may say "running"
        while the VM is still frozen)."""
        if self.session is not None:
            return self.session.paused
        return self.status == "paused"

    @property
    def asks(self) -> int:
        """Open questions for the person: permissions, previews, the agent's own."""
        return len(self.permissions) + len(self.preview_questions) + (1 if self.question else 0)

    @property
    def state(self) -> TaskState:
        """The one state every view draws from (``piwork.gui.state``)."""
        if self.status == "queued":
            return TaskState(Phase.QUEUED)
        if not self.live:
            return TaskState(ended_phase(self.status, self.reason))
        if self.status not in WORKING:
            # Done, its VM kept warm (or powering off): the run's ending is its phase.
            phase = ended_phase(self.status, self.reason)
            return TaskState(phase, warm=self.session is not None, live=True)
        if self.session is None:
            return TaskState(Phase.STARTING, live=True)
        if self.paused:
            return TaskState(Phase.PAUSED, asks=self.asks, live=True)
        if self.stopping:
            return TaskState(Phase.STOPPING, live=True)
        if self.asks:
            return TaskState(Phase.WAITING, asks=self.asks, live=True)
        return TaskState(Phase.RUNNING, live=True)

    @property
    def label(self) -> str:
        return self.state.label

    @property
    def elapsed(self) -> float:
        """Time worked on the task: earlier runs plus the current one, waits included
        (a clock that stops while the task waits for the person reads as a hang)."""
        if self._clock is None:
            return self.elapsed_before
        return self.elapsed_before + time.monotonic() - self._clock

    def _clock_for(self, status: str) -> None:
        working = status in ("starting", "running", "waiting_permission", "waiting_input")
        if working and self._clock is None:
            self._clock = time.monotonic()
        elif not working and status != "paused" and self._clock is not None:
            self.elapsed_before += time.monotonic() - self._clock
            self._clock = None

    @property
    def live(self) -> bool:
        return self._job is not None and not self._job.done()

    @property
    def busy(self) -> bool:
        """A prompt is being worked on (not just a warm idle VM)."""
        return self.live and self.status in (
            "starting",
            "running",
            "waiting_permission",
            "waiting_input",
            "paused",
        )

    def on_run_event(self, ev: RunEvent) -> None:
        """The runner's event sink: the task's fields follow, then the views hear of it."""
        if threading.current_thread() is not threading.main_thread():
            # The runner reports pack-build progress from a worker thread: widgets
            # may only be touched on the Qt thread, so hop over to the loop.
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.on_run_event, ev)
            return
        d = ev.data
        if ev.kind is EventKind.TASK:
            self.task_id = d.get("id") or self.task_id
            self.title = str(d.get("title") or self.title)
            self.model = d.get("model") or self.model
            if d.get("folder"):
                self.folder = Path(d["folder"])
        elif ev.kind is EventKind.STATUS:
            self.status = str(d.get("status"))
            self.reason = d.get("reason")
            self._clock_for(self.status)
        elif ev.kind is EventKind.USAGE:
            self.tokens = int(d.get("tokens") or 0)
            self.cost = float(d.get("cost") or 0.0)
        elif ev.kind is EventKind.DONE:
            self.tokens = int(d.get("tokens") or self.tokens)
        elif ev.kind is EventKind.PREVIEW:
            self._preview_event(d)
        self.last_activity = time.strftime("%H:%M")
        self.run_event.emit(ev)
        self.changed.emit()

    def _preview_event(self, d: dict[str, Any]) -> None:
        port = d.get("port")
        if not isinstance(port, int) or isinstance(port, bool):
            return
        url = preview_url(d.get("url"))
        if d.get("state") == "opened" and url is not None:
            self.previews[port] = url
        else:
            self.previews.pop(port, None)

    # ------------------------------------------------------------ running
    def submit(self, prompt: str, opts: RunOptions) -> None:
        """Send a message: to the warm session, or start (resume) one, or queue it."""
        if self.live and self.session is not None and not self.busy:
            self._inbox.put_nowait(prompt)
            # Busy from now on, not from the runner's first status event: a close or a
            # quit in between must not take the task for an idle warm VM.
            self.status, self.reason = "starting", None
            self.stopping = False
            self._clock_for("starting")
            self.changed.emit()
            return
        if self.live:
            raise RuntimeError("the task is running: steer or queue a follow-up instead")
        if opts.host is None and self.host is not None:
            opts = replace(opts, host=self.host)  # a follow-up runs where the task ran
        self.host = opts.host
        self._opts = opts
        if not self.pool.has_slot(self):
            self._queued_prompt = prompt
            self.status, self.reason = "queued", None
            self.pool.enqueue(self)
            self.changed.emit()
            return
        self._start(prompt)

    def _start(self, prompt: str) -> None:
        self.status, self.reason = "starting", None
        self.stopping = False
        self._clock_for("starting")
        self.changed.emit()
        self._job = asyncio.ensure_future(self._run(prompt, self._opts))
        # ``live`` turns false only once the job is done (after its last signals):
        # say so, so the window can enable what waits for the VM to be off (undo).
        self._job.add_done_callback(self._job_done)
        self.pool.track(self)

    def _job_done(self, _job: asyncio.Future[None]) -> None:
        with contextlib.suppress(RuntimeError):  # the window may be gone (quit)
            self.changed.emit()

    def start_queued(self) -> None:
        prompt, self._queued_prompt = self._queued_prompt, None
        if prompt is not None:
            self._start(prompt)

    async def _run(self, prompt: str, opts: RunOptions) -> None:
        req = RunRequest(
            prompt=prompt,
            folder=None if self.task_id else opts.folder,
            model=opts.model,
            task_id=self.task_id,
            memory_mb=opts.memory_mb,
            cpus=opts.cpus,
            accel=opts.accel,
            host=opts.host,
            clean_env=opts.clean_env and not self.task_id,  # a resume keeps its own disk
            **opts.extra,
        )
        result: Outcome | BaseException | None = None
        self._loop = asyncio.get_running_loop()
        try:
            async with self.session_factory(
                req, self.on_run_event, self.asker, paths=self.pool.paths
            ) as s:
                self.session = s
                while True:
                    result = await s.run_prompt(prompt)
                    self.finished.emit(result)
                    # Keep the VM warm for a follow-up, unless another task needs the slot.
                    try:
                        prompt = await self.pool.next_prompt(self._inbox)
                    except TimeoutError:
                        break
                    self._clock_for("starting")
        except asyncio.CancelledError:
            self.status, self.reason = "stopped", "cancelled"
        except TaskBusy as exc:
            # Another piwork process runs this task: it is not failed, just not ours.
            self.status, self.reason = "running", None
            self.run_event.emit(
                RunEvent(
                    EventKind.ERROR,
                    {"message": f"this task is open in another piwork process ({exc})"},
                    0.0,
                    self.task_id,
                )
            )
            self.finished.emit(exc)
        except Exception as exc:  # shown to the person; the task record says what happened
            log.exception("task failed")
            self.status, self.reason = "stopped", "error"
            message, _code = describe(exc, self.pool.paths.logs / "piwork.log")  # as the CLI
            self.run_event.emit(RunEvent(EventKind.ERROR, {"message": message}, 0.0, self.task_id))
            self.finished.emit(exc)
        finally:
            self.session = None
            self.previews.clear()  # the session's previews closed with it
            self._clock_for("stopped")
            self._cancel_questions()
            self.closed.emit()
            self.changed.emit()
            self.pool.released(self)

    def _cancel_questions(self) -> None:
        for p in list(self.permissions):
            if not p.future.done():
                p.future.set_result(None)
        if self.question is not None and not self.question.future.done():
            self.question.future.set_result(None)
        for pv in list(self.preview_questions):
            if not pv.future.done():
                pv.future.set_result(None)

    def answer_permission(self, pending: PendingPermission, choice: Choice) -> None:
        if not pending.future.done():
            pending.future.set_result(choice)

    def answer_preview(self, pending: PendingPreview, choice: PreviewChoice | None) -> None:
        if not pending.future.done():
            pending.future.set_result(choice)

    def answer_question(self, answer: str | bool | None) -> None:
        q = self.question
        if q is not None and not q.future.done():
            q.future.set_result(answer)

    async def stop(self) -> None:
        """Cancel the current run (ends "cancelled", resumable); a queued task leaves the queue."""
        if self.status == "queued":
            self.pool.dequeue(self)
            self._queued_prompt = None
            self.status, self.reason = "stopped", "cancelled"
            self.changed.emit()
            return
        if self.session is not None and self.busy:
            self.stopping = True
            await self.session.stop()
        elif self._job is not None and not self._job.done() and self.session is None:
            self._job.cancel()  # still booting: cancelling start-up closes the VM

    async def shut_down(self) -> None:
        """Stop and power off (quit): the task stays resumable."""
        await self.stop()
        job = self._job
        if job is not None and not job.done():
            if self.session is not None:
                # Leave the warm wait once the (stopped) run has ended: graceful power-off.
                self._inbox.put_nowait(CLOSE)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(job), timeout=60)
            if not job.done():
                job.cancel()
                with contextlib.suppress(BaseException):
                    await job

    @property
    def warm(self) -> bool:
        """Finished, its VM kept on for a follow-up."""
        return self.live and self.session is not None and not self.busy

    async def end(self) -> None:
        """ "End task": stop what runs and power the VM off now; the task keeps its state
        (done, or stopped by you) and can be continued later in a new VM."""
        await self.shut_down()
        self.changed.emit()

    async def steer(self, text: str) -> None:
        if self.session is not None:
            await self.session.steer(text)

    async def follow_up(self, text: str) -> None:
        if self.session is not None:
            await self.session.follow_up(text)

    async def pause(self) -> None:
        if self.session is not None:
            await self.session.pause_vm()
            self.changed.emit()  # the runner's pause state is the truth: draw it now

    async def resume_vm(self) -> None:
        if self.session is not None:
            await self.session.resume_vm()
            self.changed.emit()
