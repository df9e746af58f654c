"""An asyncio client for pi's RPC mode, independent of how lines travel.

The layer below (the guest channel) owns the byte stream. It gives the client
each line pi wrote (:meth:`RpcClient.feed_line`) and a coroutine to write one
line to pi's stdin (``send_line``). Everything here is about pi's protocol:

* requests get a unique ``id`` and are matched to replies that may come back
  out of order; the two replies pi sends *without* an id (JSON parse error,
  unknown command) go to the oldest pending request of that command type or,
  if there is none, out as an :class:`UnmatchedResponse` item;
* every other line (events, extension UI requests, reports about bad lines) is
  delivered in order to each subscriber and listener;
* extension dialogs are handed to a ``ui_handler`` running as its own task,
  because pi's tool call waits for the dialog while the host may be waiting on
  a reply: :meth:`RpcClient.feed_line` never blocks, so the client keeps
  reading and answering whatever it is awaiting;
* :meth:`RpcClient.wait_idle` decides when pi has really finished, which
  ``agent_end`` alone does not say (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import EllipsisType, TracebackType
from typing import Any, Final, Self

from piwork.errors import ProtocolError
from piwork.rpc.framing import (
    DEFAULT_MAX_LINE_BYTES,
    LineDecoder,
    MalformedLine,
    OversizedLine,
    decode_line,
    encode_line,
)
from piwork.rpc.models import (
    AbortBashCommand,
    AbortCommand,
    AbortRetryCommand,
    AgentEnd,
    AgentSettled,
    AgentStart,
    AutoRetryEnd,
    AutoRetryStart,
    BashCommand,
    BashResult,
    Command,
    CompactCommand,
    CompactionEnd,
    CompactionStart,
    FollowUpCommand,
    GetAvailableModelsCommand,
    GetCommandsCommand,
    GetLastAssistantTextCommand,
    GetMessagesCommand,
    GetSessionStatsCommand,
    GetStateCommand,
    ImageContent,
    NewSessionCommand,
    PiEvent,
    PromptCommand,
    Response,
    SessionState,
    SessionStats,
    SetAutoCompactionCommand,
    SetAutoRetryCommand,
    SetModelCommand,
    SetSessionNameCommand,
    SetThinkingLevelCommand,
    SteerCommand,
    SwitchSessionCommand,
    ThinkingLevel,
    UiRequest,
    UiResponse,
    command_to_wire,
    parse_event,
    parse_incoming,
    ui_cancelled,
)

log = logging.getLogger(__name__)

SendLine = Callable[[bytes], Awaitable[None]]
Timeout = float | EllipsisType | None
"""Seconds; ``...`` (the default) picks the command's usual timeout; ``None`` waits
while the connection lives."""


@dataclass(frozen=True, slots=True)
class UnmatchedResponse:
    """A reply no pending request was waiting for (late, foreign, or id-less)."""

    response: Response
    reason: str


ClientItem = PiEvent | UiRequest | MalformedLine | OversizedLine | UnmatchedResponse
"""What subscribers and listeners receive: every line pi wrote that is not a
reply to one of our requests, in the order pi wrote them."""

UiHandler = Callable[[UiRequest], Awaitable[UiResponse | None]]
LineTap = Callable[[bytes, "dict[str, Any] | MalformedLine"], None]
"""Sees each line pi wrote, already parsed once, before anything acts on it."""
Listener = Callable[[ClientItem], None]


@dataclass(frozen=True)
class PreparedLine:
    """A pi line parsed (and perhaps recorded) off the loop: see RpcClient.prepare_line."""

    raw: bytes
    obj: dict[str, Any] | MalformedLine
    tapped: bool


class RpcError(ProtocolError):
    """pi answered ``success: false`` (or could not answer)."""

    def __init__(self, command: str, error: str, response: Response | None = None) -> None:
        super().__init__(f"pi command {command!r} failed: {error}")
        self.command = command
        self.error = error
        self.response = response


class RpcTimeout(RpcError, TimeoutError):
    """No reply in time. A reply that arrives later becomes an UnmatchedResponse."""


class RpcConnectionLost(RpcError):
    """The channel to pi is gone; nothing pending will be answered."""


DEFAULT_TIMEOUT: Final = 60.0
MAX_OPEN_DIALOGS: Final = 32
"""Dialogs pi may hold open at once; more are answered ``cancelled`` at once."""
# Commands whose reply legitimately waits for model calls, runs or shells.
COMMAND_TIMEOUTS: Final[Mapping[str, float | None]] = {
    "prompt": 300.0,  # reply after preflight, which may compact first
    "abort": 120.0,  # reply after the run has stopped
    "compact": 900.0,
    "bash": 900.0,
    "new_session": 120.0,
    "switch_session": 120.0,
}

# pi builds its objects with these keys first (rpc-mode.js), so the head of a
# line that was too large to keep still says what it was.
_RESPONSE_HEAD = re.compile(rb'^\{(?:"id":"([^"\\]*)",)?"type":"response","command":"([^"\\]*)"')
_EVENT_HEAD = re.compile(rb'^\{"type":"([A-Za-z_]+)"')

_LIFECYCLE = (
    AgentStart,
    AgentEnd,
    AgentSettled,
    AutoRetryStart,
    AutoRetryEnd,
    CompactionStart,
    CompactionEnd,
)


class _End:
    """Marks the end of a subscription's stream."""


_END: Final = _End()


@dataclass(slots=True)
class _Pending:
    command: str
    future: asyncio.Future[Response]


@dataclass(slots=True)
class _OpenDialog:
    request: UiRequest
    deadline: float | None
    """Loop time after which pi has resolved the dialog by itself (its ``timeout``)."""


@dataclass(slots=True)
class _Activity:
    """What the event stream says about pi being busy, for :meth:`RpcClient.wait_idle`."""

    run_active: bool = False
    compacting: bool = False
    restart_deadline: float | None = None
    """Set while pi is expected to start a run by itself (auto-retry, overflow compaction)."""
    prompt_outstanding: bool = False
    """A prompt was sent and no run has started or ended since."""
    version: int = 0
    last_event_at: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class EventSubscription:
    """One subscriber's ordered view of the stream; see :meth:`RpcClient.events`."""

    def __init__(self, client: RpcClient) -> None:
        self._client = client
        self._queue: asyncio.Queue[ClientItem | _End] = asyncio.Queue()
        self._done = False

    def _put(self, item: ClientItem | _End) -> None:
        self._queue.put_nowait(item)

    def close(self) -> None:
        """Stop receiving; iteration ends after what is already queued."""
        if self in self._client._subscriptions:
            self._client._subscriptions.remove(self)
            self._queue.put_nowait(_END)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ClientItem:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, _End):
            self._done = True
            raise StopAsyncIteration
        return item

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RpcClient:
    """pi's RPC protocol over any line transport.

    ``send_line`` must write one complete line (the bytes include the ``\\n``).
    The client serializes its own calls to it.
    """

    def __init__(
        self,
        send_line: SendLine,
        *,
        ui_handler: UiHandler | None = None,
        default_timeout: float | None = DEFAULT_TIMEOUT,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        restart_grace: float = 10.0,
    ) -> None:
        self._send_line = send_line
        self._ui_handler = ui_handler
        self.default_timeout = default_timeout
        self.restart_grace = restart_grace
        """How long after its announced delay pi may take to start a retry it announced."""
        self._decoder = LineDecoder(max_line_bytes)
        self._id_prefix = f"pw{secrets.token_hex(3)}"
        self._next_seq = 0
        self._send_lock = asyncio.Lock()
        self._pending: dict[str, _Pending] = {}
        self._subscriptions: list[EventSubscription] = []
        self._listeners: list[Listener] = []
        self._open_dialogs: dict[str, _OpenDialog] = {}
        self._ui_tasks: dict[str, asyncio.Task[None]] = {}
        self._activity = _Activity()
        self._closed: BaseException | None = None
        self._frozen = False
        self._freeze_changed = asyncio.Event()
        self._line_tap: LineTap | None = None
        self._tap_thread_safe = False
        self._refusals: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------
    # Input from the layer below
    # ------------------------------------------------------------------

    def feed_line(self, raw: bytes) -> None:
        """Handle one line pi wrote (without, or with, its line ending). Never blocks."""
        if self._closed is not None:
            return
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw or raw.isspace():
            return
        obj = decode_line(raw)
        if self._line_tap is not None:
            try:
                self._line_tap(raw, obj)  # the transcript first: it must not miss a line
            except Exception:
                log.exception("RPC line tap failed")
        self._dispatch(raw, obj)

    def prepare_line(self, raw: bytes) -> PreparedLine | None:
        """The heavy half of :meth:`feed_line`, safe in a worker thread (for big lines).

        Parses the line and, if the tap was set ``thread_safe``, records it; the
        result goes to :meth:`feed_prepared` on the loop, in stream order.
        """
        raw = raw.removesuffix(b"\n").removesuffix(b"\r")
        if not raw or raw.isspace():
            return None
        obj = decode_line(raw)
        tapped = False
        tap = self._line_tap
        if tap is not None and self._tap_thread_safe:
            tapped = True
            try:
                tap(raw, obj)
            except Exception:
                log.exception("RPC line tap failed")
        return PreparedLine(raw, obj, tapped)

    def feed_prepared(self, prepared: PreparedLine | None) -> None:
        """Handle a line :meth:`prepare_line` made ready (on the event loop)."""
        if self._closed is not None or prepared is None:
            return
        raw, obj = prepared.raw, prepared.obj
        if not prepared.tapped and self._line_tap is not None:
            try:
                self._line_tap(raw, obj)
            except Exception:
                log.exception("RPC line tap failed")
        self._dispatch(raw, obj)

    def _dispatch(self, raw: bytes, obj: dict[str, Any] | MalformedLine) -> None:
        if isinstance(obj, MalformedLine):
            self._sniff_head(raw[:200])
            self._deliver(obj)
            return
        item = parse_incoming(obj)
        if isinstance(item, Response):
            self._on_response(item)
        elif isinstance(item, UiRequest):
            self._on_ui_request(item)
        else:
            self._on_event(item)

    def feed_report(self, report: OversizedLine | MalformedLine) -> None:
        """Pass on a line the framing layer could not keep."""
        if self._closed is not None:
            return
        head = report.head if isinstance(report, OversizedLine) else report.head.encode()
        self._sniff_head(head)
        self._deliver(report)

    def feed_bytes(self, chunk: bytes) -> None:
        """For a raw pi stdout stream: split it here, then :meth:`feed_line` each line."""
        for line in self._decoder.feed(chunk):
            if isinstance(line, OversizedLine):
                self.feed_report(line)
            else:
                self.feed_line(line)

    def connection_lost(self, exc: BaseException | None = None) -> None:
        """The channel to pi is gone for good: fail everything that waits on pi.

        Pending requests raise :class:`RpcConnectionLost`, UI handler tasks are
        cancelled, subscriptions end, ``wait_idle`` raises. See :meth:`reset`
        to use the client again with a new pi process.
        """
        if self._closed is not None:
            return
        reason = str(exc) if exc is not None else "connection closed"
        self._closed = exc if exc is not None else ConnectionError(reason)
        self._forget_pi(f"connection to pi lost: {reason}", exc)
        for sub in list(self._subscriptions):
            sub._put(_END)
        self._subscriptions.clear()

    def reset(self, reason: str = "pi was restarted") -> None:
        """Start over with a new pi process behind the same channel.

        What the old process owed is failed with :class:`RpcConnectionLost` (it
        will never answer), its dialogs, half-read line and run state are
        forgotten, and a client closed by :meth:`connection_lost` accepts
        requests again. Live subscriptions continue; ended ones stay ended.
        """
        self._forget_pi(reason, None)
        self._decoder = LineDecoder(self._decoder.max_line_bytes)
        self._closed = None

    def _forget_pi(self, reason: str, exc: BaseException | None) -> None:
        for pending in self._pending.values():
            if not pending.future.done():
                err = RpcConnectionLost(pending.command, reason)
                err.__cause__ = exc
                pending.future.set_exception(err)
        self._pending.clear()
        for task in self._ui_tasks.values():
            task.cancel()
        self._open_dialogs.clear()
        act = self._activity
        act.run_active = act.compacting = act.prompt_outstanding = False
        act.restart_deadline = None
        self._bump_activity()
        self._freeze_flip()  # wakes waiters parked on a frozen guest, so they see the loss

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def aclose(self) -> None:
        """Stop: like :meth:`connection_lost`, then wait for UI handler tasks to end."""
        self.connection_lost(None)
        tasks = list(self._ui_tasks.values())
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------
    # Frozen guest
    # ------------------------------------------------------------------

    def freeze(self) -> None:
        """pi cannot answer for now (its VM is paused): stop every reply clock.

        While frozen, request timeouts do not run and :meth:`wait_idle` does not
        poll pi; a pause of any length is not a failure. :meth:`thaw` restarts
        the clocks where they stopped.
        """
        if not self._frozen:
            self._frozen = True
            self._freeze_flip()

    def thaw(self) -> None:
        """pi runs again: reply clocks resume, and the pause does not count as silence."""
        if self._frozen:
            self._frozen = False
            self._activity.last_event_at = asyncio.get_running_loop().time()
            self._freeze_flip()

    @property
    def frozen(self) -> bool:
        return self._frozen

    def _freeze_flip(self) -> None:
        self._freeze_changed.set()
        self._freeze_changed = asyncio.Event()

    async def _await_reply(
        self, future: asyncio.Future[Response], timeout: float | None
    ) -> Response:
        """The reply, or TimeoutError after ``timeout`` seconds of *unfrozen* waiting."""
        if timeout is None:
            return await future
        loop = asyncio.get_running_loop()
        budget = timeout
        while True:
            changed: asyncio.Future[Any] = asyncio.ensure_future(self._freeze_changed.wait())
            started = loop.time()
            frozen = self._frozen
            try:
                waiters: set[asyncio.Future[Any]] = {future, changed}
                done, _ = await asyncio.wait(
                    waiters,
                    timeout=None if frozen else max(budget, 0.0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                changed.cancel()
            if future.done():
                return future.result()
            if not frozen:
                budget -= loop.time() - started
                if not done or budget <= 0:
                    raise TimeoutError

    # ------------------------------------------------------------------
    # Requests
    # ------------------------------------------------------------------

    async def request(
        self,
        command: Command | Mapping[str, Any],
        *,
        timeout: Timeout = ...,
        check: bool = True,
    ) -> Response:
        """Send a command and wait for its reply.

        ``timeout`` defaults to :data:`COMMAND_TIMEOUTS` or ``default_timeout``;
        ``None`` waits as long as the connection lives. With ``check`` (the
        default) ``success: false`` raises :class:`RpcError`.
        """
        wire = command_to_wire(command)
        cmd_type: str = wire["type"]
        self._raise_if_closed(cmd_type)
        req_id = self._new_id()
        wire["id"] = req_id
        line = encode_line(wire)
        if timeout is ...:
            timeout = COMMAND_TIMEOUTS.get(cmd_type, self.default_timeout)
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = _Pending(cmd_type, future)
        if cmd_type == "prompt" and not wire.get("streamingBehavior"):
            self._activity.prompt_outstanding = True
        try:
            await self._send(line, cmd_type)
            response = await self._await_reply(future, timeout)
        except TimeoutError as exc:
            raise RpcTimeout(cmd_type, f"no reply within {timeout} s") from exc
        finally:
            self._pending.pop(req_id, None)
            if not future.done():
                future.cancel()
        if check and not response.success:
            raise RpcError(cmd_type, response.error or "(no error text)", response)
        return response

    async def prompt(
        self,
        message: str,
        *,
        images: list[ImageContent] | None = None,
        streaming_behavior: str | None = None,
        timeout: Timeout = ...,
    ) -> Response:
        """Start a run (or queue, with ``streaming_behavior`` "steer"/"followUp").

        The reply means "accepted"; the run's outcome arrives as events.
        """
        cmd = PromptCommand.model_validate(
            {"message": message, "images": images, "streamingBehavior": streaming_behavior}
        )
        return await self.request(cmd, timeout=timeout)

    async def steer(
        self, message: str, *, images: list[ImageContent] | None = None, timeout: Timeout = ...
    ) -> Response:
        return await self.request(SteerCommand(message=message, images=images), timeout=timeout)

    async def follow_up(
        self, message: str, *, images: list[ImageContent] | None = None, timeout: Timeout = ...
    ) -> Response:
        return await self.request(FollowUpCommand(message=message, images=images), timeout=timeout)

    async def abort(self, *, timeout: Timeout = ...) -> Response:
        """Stop the run. pi answers once it stopped, which needs open dialogs answered:
        call :meth:`cancel_open_dialogs` too (pi does not dismiss them on abort)."""
        return await self.request(AbortCommand(), timeout=timeout)

    async def get_state(self, *, timeout: Timeout = ...) -> SessionState:
        response = await self.request(GetStateCommand(), timeout=timeout)
        return SessionState.model_validate(response.data or {})

    async def get_messages(self, *, timeout: Timeout = ...) -> list[dict[str, Any]]:
        response = await self.request(GetMessagesCommand(), timeout=timeout)
        messages = _data_field(response, "messages")
        return messages if isinstance(messages, list) else []

    async def get_session_stats(self, *, timeout: Timeout = ...) -> SessionStats:
        response = await self.request(GetSessionStatsCommand(), timeout=timeout)
        return SessionStats.model_validate(response.data or {})

    async def set_model(
        self, provider: str, model_id: str, *, timeout: Timeout = ...
    ) -> dict[str, Any]:
        """Switch model (pi persists it in settings.json); returns pi's Model object."""
        response = await self.request(
            SetModelCommand(provider=provider, model_id=model_id), timeout=timeout
        )
        return response.data if isinstance(response.data, dict) else {}

    async def get_available_models(self, *, timeout: Timeout = ...) -> list[dict[str, Any]]:
        response = await self.request(GetAvailableModelsCommand(), timeout=timeout)
        models = _data_field(response, "models")
        return models if isinstance(models, list) else []

    async def set_thinking_level(self, level: ThinkingLevel, *, timeout: Timeout = ...) -> Response:
        return await self.request(SetThinkingLevelCommand(level=level), timeout=timeout)

    async def compact(
        self,
        custom_instructions: str | None = None,
        *,
        timeout: Timeout = ...,
    ) -> dict[str, Any]:
        cmd = CompactCommand(custom_instructions=custom_instructions)
        response = await self.request(cmd, timeout=timeout)
        return response.data if isinstance(response.data, dict) else {}

    async def set_auto_compaction(self, enabled: bool, *, timeout: Timeout = ...) -> Response:
        return await self.request(SetAutoCompactionCommand(enabled=enabled), timeout=timeout)

    async def set_auto_retry(self, enabled: bool, *, timeout: Timeout = ...) -> Response:
        return await self.request(SetAutoRetryCommand(enabled=enabled), timeout=timeout)

    async def abort_retry(self, *, timeout: Timeout = ...) -> Response:
        return await self.request(AbortRetryCommand(), timeout=timeout)

    async def bash(self, command: str, *, timeout: Timeout = ...) -> BashResult:
        response = await self.request(BashCommand(command=command), timeout=timeout)
        return BashResult.model_validate(response.data or {})

    async def abort_bash(self, *, timeout: Timeout = ...) -> Response:
        return await self.request(AbortBashCommand(), timeout=timeout)

    async def new_session(
        self, parent_session: str | None = None, *, timeout: Timeout = ...
    ) -> bool:
        """Returns False if an extension cancelled the switch."""
        response = await self.request(
            NewSessionCommand(parent_session=parent_session), timeout=timeout
        )
        return _data_field(response, "cancelled") is not True

    async def switch_session(self, session_path: str, *, timeout: Timeout = ...) -> bool:
        """Returns False if an extension cancelled the switch."""
        response = await self.request(
            SwitchSessionCommand(session_path=session_path), timeout=timeout
        )
        return _data_field(response, "cancelled") is not True

    async def get_last_assistant_text(self, *, timeout: Timeout = ...) -> str | None:
        response = await self.request(GetLastAssistantTextCommand(), timeout=timeout)
        text = _data_field(response, "text")
        return text if isinstance(text, str) else None

    async def set_session_name(self, name: str, *, timeout: Timeout = ...) -> Response:
        return await self.request(SetSessionNameCommand(name=name), timeout=timeout)

    async def get_commands(self, *, timeout: Timeout = ...) -> list[dict[str, Any]]:
        response = await self.request(GetCommandsCommand(), timeout=timeout)
        commands = _data_field(response, "commands")
        return commands if isinstance(commands, list) else []

    # ------------------------------------------------------------------
    # Events
    # ------------------------------------------------------------------

    def events(self) -> EventSubscription:
        """A new subscription; it receives items from this call on, in order.

        ``async for item in client.events(): ...`` ends when the connection is
        lost or the subscription is closed. Each subscription has its own
        unbounded queue, so a slow subscriber delays nobody else.
        """
        sub = EventSubscription(self)
        if self._closed is not None:
            sub._put(_END)
        else:
            self._subscriptions.append(sub)
        return sub

    def set_line_tap(self, tap: LineTap | None, *, thread_safe: bool = False) -> None:
        """Call ``tap(raw, parsed)`` for every line pi wrote, replies included, in order.

        The line is parsed once, here; the tap gets that result (a dict or a
        :class:`MalformedLine`) so a recorder need not parse it again. A
        ``thread_safe`` tap may be called from a worker thread for a big line
        (:meth:`prepare_line`), while the loop waits for it: still in order.
        """
        self._line_tap = tap
        self._tap_thread_safe = thread_safe

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(item)`` synchronously for each item; returns an unsubscribe."""
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    # ------------------------------------------------------------------
    # Extension UI
    # ------------------------------------------------------------------

    def set_ui_handler(self, handler: UiHandler | None) -> None:
        """Called (as its own task) for each dialog: select, confirm, input, editor.

        Return a :class:`UiResponse` to answer, or ``None`` to leave the dialog
        open for :meth:`answer_ui`. If it raises, the dialog is cancelled so pi
        does not wait forever. Fire-and-forget requests (notify, setStatus, ...)
        only go to the event stream.
        """
        self._ui_handler = handler

    @property
    def open_dialogs(self) -> dict[str, UiRequest]:
        """Dialogs pi is still waiting on (minus those its own timeout resolved)."""
        self._prune_dialogs()
        return {req_id: d.request for req_id, d in self._open_dialogs.items()}

    async def answer_ui(
        self,
        request_id: str,
        *,
        value: str | None = None,
        confirmed: bool | None = None,
        cancelled: bool = False,
    ) -> bool:
        """Answer an open dialog with one of value / confirmed / cancelled."""
        given = sum((value is not None, confirmed is not None, cancelled))
        if given != 1:
            raise ValueError("answer_ui takes exactly one of value, confirmed, cancelled")
        if cancelled:
            response = ui_cancelled(request_id)
        else:
            response = UiResponse(id=request_id, value=value, confirmed=confirmed)
        return await self.respond_ui(response)

    async def respond_ui(self, response: UiResponse) -> bool:
        """Send a UI response if its dialog is still open; False if it is not."""
        self._prune_dialogs()
        if self._closed is not None or self._open_dialogs.pop(response.id, None) is None:
            return False
        await self._send(encode_line(response.to_wire()), "extension_ui_response")
        return True

    async def cancel_open_dialogs(self) -> list[str]:
        """Answer every open dialog with ``cancelled: true``; returns their ids.

        Use on stop/abort: pi's abort does not dismiss dialogs, so without this
        an abort can wait forever. Handler tasks for these dialogs are cancelled.
        """
        self._prune_dialogs()
        ids = list(self._open_dialogs)
        current = asyncio.current_task()
        for req_id in ids:
            task = self._ui_tasks.get(req_id)
            if task is not None and task is not current:
                task.cancel()
        sent: list[str] = []
        for req_id in ids:
            if await self.respond_ui(ui_cancelled(req_id)):
                sent.append(req_id)
        return sent

    # ------------------------------------------------------------------
    # Completion
    # ------------------------------------------------------------------

    async def wait_idle(
        self,
        timeout: float | None = None,
        *,
        poll_interval: float = 15.0,
        settle: float = 1.0,
    ) -> SessionState:
        """Wait until pi has finished everything started so far; returns its state.

        ``agent_end`` is not the end (pi 1.x says so with ``agent_settled``): with
        auto-retry each failed attempt ends with ``agent_end`` and then
        ``auto_retry_start``, and during the back-off
        ``get_state`` already reports ``isStreaming: false``. pi also flips
        ``isStreaming`` off before it has written the run's last events. So this
        resolves only when the events say no run, compaction or self-started
        retry is pending *and* ``get_state`` then confirms neither streaming nor
        compacting, with no lifecycle event in between.

        Edge cases: a retry pi announced but did not start within its delay plus
        ``self.restart_grace`` is treated as dropped; a prompt that started no run
        (an extension command) counts as done once pi stays idle for ``settle``
        seconds; if no event arrives for ``poll_interval`` seconds during a run,
        pi is asked directly, in case an end event was lost.
        """
        act = self._activity
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while True:
                self._raise_if_closed("wait_idle")
                if self._frozen:
                    # A paused VM says nothing and cannot answer: wait for the thaw.
                    thawed = self._freeze_changed
                    await thawed.wait()
                    continue
                version = act.version
                stale = False
                if self._busy_by_events():
                    wait = poll_interval
                    if act.restart_deadline is not None:
                        wait = min(wait, max(0.0, act.restart_deadline - loop.time()))
                    if await self._activity_since(version, wait):
                        continue
                    if act.restart_deadline is not None and loop.time() >= act.restart_deadline:
                        act.restart_deadline = None
                    if not (act.run_active or act.compacting):
                        continue
                    if loop.time() - act.last_event_at < poll_interval:
                        continue  # the run is alive, just long
                    stale = True
                state = await self.get_state()
                if act.version != version:
                    continue
                if state.is_streaming or state.is_compacting:
                    # Events not seen yet (just after a prompt reply) or lost.
                    quick = act.prompt_outstanding and not stale
                    await self._activity_since(version, settle if quick else poll_interval)
                    continue
                if stale or act.prompt_outstanding:
                    # pi says idle but we expected events: confirm it stays idle.
                    if await self._activity_since(version, settle):
                        continue
                    state = await self.get_state()
                    if act.version != version or state.is_streaming or state.is_compacting:
                        continue
                    act.run_active = act.compacting = act.prompt_outstanding = False
                return state

    # ------------------------------------------------------------------
    # Internals
    # ------------------------------------------------------------------

    def _new_id(self) -> str:
        self._next_seq += 1
        return f"{self._id_prefix}-{self._next_seq}"

    def _raise_if_closed(self, command: str) -> None:
        if self._closed is not None:
            raise RpcConnectionLost(command, f"connection to pi lost: {self._closed}")

    async def _send(self, line: bytes, what: str) -> None:
        self._raise_if_closed(what)
        async with self._send_lock:
            await self._send_line(line)

    def _deliver(self, item: ClientItem) -> None:
        for sub in self._subscriptions:
            sub._put(item)
        for listener in list(self._listeners):
            try:
                listener(item)
            except Exception:
                log.exception("RPC event listener failed on %s", type(item).__name__)

    def _on_response(self, response: Response) -> None:
        pending: _Pending | None = None
        req_id = response.id
        if req_id is not None:
            pending = self._pending.pop(req_id, None)
            reason = "no pending request has this id (late or foreign reply)"
        else:
            # pi drops the id only for a parse error and an unknown command.
            for key, candidate in self._pending.items():
                if candidate.command == response.command:
                    pending = self._pending.pop(key)
                    break
            reason = "reply without id and no pending request of this command"
        if pending is None or pending.future.done():
            self._deliver(UnmatchedResponse(response, reason))
            return
        if pending.command == "prompt" and (
            not response.success or _data_field(response, "disposition") == "handled"
        ):
            # Rejected, or handled without a run (an extension command): no events follow.
            self._activity.prompt_outstanding = False
        pending.future.set_result(response)

    def _on_ui_request(self, request: UiRequest) -> None:
        if request.is_dialog and request.id and request.id not in self._open_dialogs:
            self._prune_dialogs()
            if len(self._open_dialogs) >= MAX_OPEN_DIALOGS:
                # pi opens one dialog per parallel tool call; this many is a guest
                # flooding us. Refuse it (cancelled) rather than queue it for a person.
                limit = MAX_OPEN_DIALOGS
                log.warning("pi opened more than %d dialogs; cancelling %s", limit, request.id)
                self._deliver(request)
                refusal = self._send(
                    encode_line(ui_cancelled(request.id).to_wire()), "extension_ui_response"
                )
                task = asyncio.get_running_loop().create_task(refusal)
                self._refusals.add(task)
                task.add_done_callback(self._refusals.discard)
                task.add_done_callback(_swallow)
                return
        if request.is_dialog and request.id:
            deadline = None
            timeout = getattr(request, "timeout", None)
            if isinstance(timeout, int | float) and timeout > 0:
                deadline = asyncio.get_running_loop().time() + timeout / 1000
            self._open_dialogs[request.id] = _OpenDialog(request, deadline)
        self._deliver(request)
        if request.is_dialog and request.id and self._ui_handler is not None:
            task = asyncio.get_running_loop().create_task(
                self._run_ui_handler(self._ui_handler, request),
                name=f"pi-ui-{request.method}-{request.id}",
            )
            self._ui_tasks[request.id] = task
            rid = request.id

            def forget(_task: asyncio.Task[None]) -> None:
                if self._ui_tasks.get(rid) is _task:
                    del self._ui_tasks[rid]

            task.add_done_callback(forget)

    async def _run_ui_handler(self, handler: UiHandler, request: UiRequest) -> None:
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("UI handler failed on %s %s; cancelling it", request.method, request.id)
            response = ui_cancelled(request.id)
        if response is None:
            return
        if response.id != request.id:
            log.warning("UI handler answered %s with id %s; fixing", request.id, response.id)
            response = response.model_copy(update={"id": request.id})
        try:
            await self.respond_ui(response)
        except Exception:
            log.exception("could not send UI response for %s", request.id)

    def _prune_dialogs(self) -> None:
        if not self._open_dialogs:
            return
        now = asyncio.get_running_loop().time()
        expired = [
            req_id
            for req_id, d in self._open_dialogs.items()
            if d.deadline is not None and d.deadline <= now
        ]
        for req_id in expired:
            del self._open_dialogs[req_id]

    def _on_event(self, event: PiEvent) -> None:
        self._track(event)
        self._deliver(event)

    def _track(self, event: PiEvent) -> None:
        act = self._activity
        loop = asyncio.get_running_loop()
        act.last_event_at = loop.time()
        if not isinstance(event, _LIFECYCLE):
            return
        if isinstance(event, AgentStart):
            act.run_active = True
            act.restart_deadline = None
            act.prompt_outstanding = False
        elif isinstance(event, AgentEnd):
            act.run_active = False
            act.prompt_outstanding = False
            if event.will_retry:
                act.restart_deadline = loop.time() + self.restart_grace
        elif isinstance(event, AgentSettled):
            # pi says it will not continue by itself: no retry or recovery is pending.
            act.run_active = act.prompt_outstanding = False
            act.restart_deadline = None
        elif isinstance(event, AutoRetryStart):
            act.restart_deadline = loop.time() + event.delay_ms / 1000 + self.restart_grace
        elif isinstance(event, AutoRetryEnd):
            act.restart_deadline = None
        elif isinstance(event, CompactionStart):
            act.compacting = True
        elif isinstance(event, CompactionEnd):
            act.compacting = False
            if event.will_retry:
                act.restart_deadline = loop.time() + self.restart_grace
        self._bump_activity()

    def _bump_activity(self) -> None:
        act = self._activity
        act.version += 1
        act.changed.set()
        act.changed = asyncio.Event()

    def _busy_by_events(self) -> bool:
        act = self._activity
        if act.restart_deadline is not None:
            if asyncio.get_running_loop().time() < act.restart_deadline:
                return True
            act.restart_deadline = None
        return act.run_active or act.compacting

    async def _activity_since(self, version: int, wait: float) -> bool:
        """True once a lifecycle event arrived after ``version``; False after ``wait`` s."""
        act = self._activity
        if act.version != version:
            return True
        changed = act.changed
        try:
            async with asyncio.timeout(wait):
                await changed.wait()
        except TimeoutError:
            return act.version != version
        return True

    def _sniff_head(self, head: bytes) -> None:
        """Act on what a line we could not parse evidently was."""
        match = _RESPONSE_HEAD.match(head)
        if match is not None:
            req_id = match.group(1).decode(errors="replace") if match.group(1) else ""
            pending = self._pending.pop(req_id, None)
            if pending is not None and not pending.future.done():
                pending.future.set_exception(
                    RpcError(pending.command, "pi's reply was too large or unreadable")
                )
            return
        match = _EVENT_HEAD.match(head)
        if match is not None:
            self._track(parse_event({"type": match.group(1).decode()}))


def _swallow(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("could not refuse a dialog: %s", task.exception())


def _data_field(response: Response, key: str) -> Any:
    return response.data.get(key) if isinstance(response.data, dict) else None


__all__ = [
    "COMMAND_TIMEOUTS",
    "DEFAULT_TIMEOUT",
    "ClientItem",
    "EventSubscription",
    "Listener",
    "RpcClient",
    "RpcConnectionLost",
    "RpcError",
    "RpcTimeout",
    "UiHandler",
    "UnmatchedResponse",
]
