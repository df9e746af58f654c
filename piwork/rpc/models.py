"""pi's RPC vocabulary as pydantic models, and helpers the front ends need.

Facts come from pi 1.6's ``docs/rpc.md``, ``rpc-commands.md``, ``json.md`` and
``rpc-extension-ui.md``, and its ``dist/modes/rpc/rpc-types.d.ts`` (the pi the
host speaks: :mod:`piwork.rpc.version`). pi evolves, so every model
that describes something pi *sends* ignores nothing and rejects nothing:
unknown fields are kept (``model_extra``), unknown event types become
:class:`UnknownEvent`, unknown UI methods :class:`UnknownUiRequest`, and a known
event whose fields no longer validate degrades to :class:`UnknownEvent` with
``parse_error`` set instead of raising.

Large, frequent events keep nested payloads as plain dicts so parsing a line
costs one ``orjson.loads`` and a shallow validation; typed views such as
:class:`AssistantMessage` are built only when a helper asks.

Field names are snake_case in Python and camelCase on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"]
QueueMode = Literal["all", "one-at-a-time"]
StopReason = Literal["stop", "length", "toolUse", "error", "aborted"]


class _Incoming(BaseModel):
    """Something pi wrote: tolerant of fields we do not know yet."""

    model_config = ConfigDict(
        extra="allow",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        protected_namespaces=(),
    )


class _Outgoing(BaseModel):
    """Something we write: strict, so a typo fails here and not inside the VM."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        protected_namespaces=(),
    )

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


# ---------------------------------------------------------------------------
# Commands (host -> pi stdin)
# ---------------------------------------------------------------------------


class ImageContent(_Outgoing):
    type: Literal["image"] = "image"
    data: str
    """Base64 bytes."""
    mime_type: str


class Command(_Outgoing):
    """Base of every command. ``id`` is filled in by the client."""

    type: str
    id: str | None = None


class PromptCommand(Command):
    """Start a run. While pi is streaming, ``streaming_behavior`` is required."""

    type: Literal["prompt"] = "prompt"
    message: str
    images: list[ImageContent] | None = None
    streaming_behavior: Literal["steer", "followUp"] | None = None


class SteerCommand(Command):
    type: Literal["steer"] = "steer"
    message: str
    images: list[ImageContent] | None = None


class FollowUpCommand(Command):
    type: Literal["follow_up"] = "follow_up"
    message: str
    images: list[ImageContent] | None = None


class AbortCommand(Command):
    """pi replies only once the run has stopped (``agent.waitForIdle``)."""

    type: Literal["abort"] = "abort"


class GetStateCommand(Command):
    type: Literal["get_state"] = "get_state"


class GetMessagesCommand(Command):
    type: Literal["get_messages"] = "get_messages"


class SetModelCommand(Command):
    type: Literal["set_model"] = "set_model"
    provider: str
    model_id: str


class GetAvailableModelsCommand(Command):
    type: Literal["get_available_models"] = "get_available_models"


class SetThinkingLevelCommand(Command):
    type: Literal["set_thinking_level"] = "set_thinking_level"
    level: ThinkingLevel


class SetSteeringModeCommand(Command):
    type: Literal["set_steering_mode"] = "set_steering_mode"
    mode: QueueMode


class SetFollowUpModeCommand(Command):
    type: Literal["set_follow_up_mode"] = "set_follow_up_mode"
    mode: QueueMode


class CompactCommand(Command):
    type: Literal["compact"] = "compact"
    custom_instructions: str | None = None


class SetAutoCompactionCommand(Command):
    type: Literal["set_auto_compaction"] = "set_auto_compaction"
    enabled: bool


class SetAutoRetryCommand(Command):
    type: Literal["set_auto_retry"] = "set_auto_retry"
    enabled: bool


class AbortRetryCommand(Command):
    type: Literal["abort_retry"] = "abort_retry"


class BashCommand(Command):
    type: Literal["bash"] = "bash"
    command: str
    exclude_from_context: bool | None = None


class AbortBashCommand(Command):
    type: Literal["abort_bash"] = "abort_bash"


class GetSessionStatsCommand(Command):
    type: Literal["get_session_stats"] = "get_session_stats"


class ExportHtmlCommand(Command):
    type: Literal["export_html"] = "export_html"
    output_path: str | None = None


class NewSessionCommand(Command):
    type: Literal["new_session"] = "new_session"
    parent_session: str | None = None


class SwitchSessionCommand(Command):
    type: Literal["switch_session"] = "switch_session"
    session_path: str


class GetLastAssistantTextCommand(Command):
    type: Literal["get_last_assistant_text"] = "get_last_assistant_text"


class SetSessionNameCommand(Command):
    type: Literal["set_session_name"] = "set_session_name"
    name: str


class GetCommandsCommand(Command):
    type: Literal["get_commands"] = "get_commands"


class ClearQueueCommand(Command):
    """Remove queued steering and follow-up messages; pi returns their text."""

    type: Literal["clear_queue"] = "clear_queue"


class GetAvailableThinkingLevelsCommand(Command):
    type: Literal["get_available_thinking_levels"] = "get_available_thinking_levels"


class GetEntriesCommand(Command):
    """Session entries in append order; ``since`` (an entry id) returns only later ones."""

    type: Literal["get_entries"] = "get_entries"
    since: str | None = None


def command_to_wire(command: Command | Mapping[str, Any]) -> dict[str, Any]:
    """A command as the dict that goes on the wire (without changing the input)."""
    if isinstance(command, Command):
        return command.to_wire()
    wire = dict(command)
    if not isinstance(wire.get("type"), str):
        raise ValueError(f"a command needs a string 'type': {wire!r}")
    return wire


# ---------------------------------------------------------------------------
# Responses and the data some of them carry
# ---------------------------------------------------------------------------


class Response(_Incoming):
    """``{"id"?, "type":"response", "command", "success", "data"?, "error"?}``.

    pi omits ``id`` for a JSON parse error (``command == "parse"``) and for an
    unknown command type.
    """

    type: Literal["response"] = "response"
    id: str | None = None
    command: str = ""
    success: bool = False
    data: Any = None
    error: str | None = None


class SessionState(_Incoming):
    """``get_state`` data. ``model`` is pi's full Model object, or absent."""

    model: dict[str, Any] | None = None
    thinking_level: str | None = None
    is_streaming: bool = False
    is_compacting: bool = False
    steering_mode: str | None = None
    follow_up_mode: str | None = None
    session_file: str | None = None
    session_id: str | None = None
    session_name: str | None = None
    auto_compaction_enabled: bool | None = None
    message_count: int = 0
    pending_message_count: int = 0


class TokenTotals(_Incoming):
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total: int = 0


class ContextUsage(_Incoming):
    tokens: int | None = None
    """``None`` right after a compaction, until a fresh response reports usage."""
    context_window: int | None = None
    percent: float | None = None


class SessionStats(_Incoming):
    """``get_session_stats`` data."""

    session_file: str | None = None
    session_id: str | None = None
    user_messages: int = 0
    assistant_messages: int = 0
    tool_calls: int = 0
    tool_results: int = 0
    total_messages: int = 0
    tokens: TokenTotals = Field(default_factory=TokenTotals)
    cost: float = 0.0
    context_usage: ContextUsage | None = None


class BashResult(_Incoming):
    """``bash`` data."""

    output: str = ""
    exit_code: int | None = None
    cancelled: bool = False
    truncated: bool = False
    full_output_path: str | None = None


# ---------------------------------------------------------------------------
# Messages (typed views, built on demand)
# ---------------------------------------------------------------------------


class UsageCost(_Incoming):
    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    total: float = 0.0


class Usage(_Incoming):
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total_tokens: int = 0
    cost: UsageCost = Field(default_factory=UsageCost)


class AssistantMessage(_Incoming):
    role: Literal["assistant"] = "assistant"
    content: list[dict[str, Any]] = Field(default_factory=list)
    provider: str | None = None
    model: str | None = None
    usage: Usage = Field(default_factory=Usage)
    stop_reason: str | None = None
    """One of :data:`StopReason` today; kept as ``str`` so new reasons pass."""
    error_message: str | None = None
    timestamp: int | None = None

    @property
    def text(self) -> str:
        return _join_text(self.content)


# ---------------------------------------------------------------------------
# Events (pi stdout, no id)
# ---------------------------------------------------------------------------


class PiEvent(_Incoming):
    """Base of every event. Match on the subclass, or on ``type``."""

    type: str


class AgentStart(PiEvent):
    type: Literal["agent_start"] = "agent_start"


class AgentEnd(PiEvent):
    """One low-level run ended. A retry, compaction recovery or queued message may follow
    (``will_retry`` says a retry will); :class:`AgentSettled` says pi is done."""

    type: Literal["agent_end"] = "agent_end"
    messages: list[dict[str, Any]] = Field(default_factory=list)
    will_retry: bool = False


class AgentSettled(PiEvent):
    """pi will not continue by itself (no retry, compaction recovery or queued message)."""

    type: Literal["agent_settled"] = "agent_settled"
    aborted: bool = False


class TurnStart(PiEvent):
    type: Literal["turn_start"] = "turn_start"


class TurnEnd(PiEvent):
    type: Literal["turn_end"] = "turn_end"
    message: dict[str, Any] = Field(default_factory=dict)
    tool_results: list[dict[str, Any]] = Field(default_factory=list)


class MessageStart(PiEvent):
    type: Literal["message_start"] = "message_start"
    message: dict[str, Any] = Field(default_factory=dict)


class MessageUpdate(PiEvent):
    """Streaming delta (delta-only on the wire since pi 1.x: no partial message); ``usage``
    is the latest cumulative usage the provider reported."""

    type: Literal["message_update"] = "message_update"
    assistant_message_event: dict[str, Any] = Field(default_factory=dict)
    usage: dict[str, Any] = Field(default_factory=dict)


class MessageEnd(PiEvent):
    type: Literal["message_end"] = "message_end"
    message: dict[str, Any] = Field(default_factory=dict)


class ToolExecutionStart(PiEvent):
    """Emitted before an extension's ``tool_call`` hook, so before any permission prompt.

    A call another tool made (a codemode script's ``tools.X()``) carries the calling
    tool's id as ``parent_tool_call_id``; pi numbers it ``<parent id>/<n>``."""

    type: Literal["tool_execution_start"] = "tool_execution_start"
    tool_call_id: str = ""
    tool_name: str = ""
    args: dict[str, Any] = Field(default_factory=dict)
    parent_tool_call_id: str | None = None


class ToolExecutionUpdate(PiEvent):
    """``partial_result`` is cumulative, not a delta: replace, don't append."""

    type: Literal["tool_execution_update"] = "tool_execution_update"
    tool_call_id: str = ""
    tool_name: str = ""
    args: dict[str, Any] = Field(default_factory=dict)
    partial_result: Any = None
    parent_tool_call_id: str | None = None


class ToolExecutionEnd(PiEvent):
    type: Literal["tool_execution_end"] = "tool_execution_end"
    tool_call_id: str = ""
    tool_name: str = ""
    result: Any = None
    is_error: bool = False
    parent_tool_call_id: str | None = None
    duration_ms: float | None = None
    """How long the tool's ``execute()`` took; absent when it did not run (blocked)."""


class QueueUpdate(PiEvent):
    type: Literal["queue_update"] = "queue_update"
    steering: list[str] = Field(default_factory=list)
    follow_up: list[str] = Field(default_factory=list)


class CompactionStart(PiEvent):
    type: Literal["compaction_start"] = "compaction_start"
    reason: str | None = None
    """``manual``, ``threshold`` or ``overflow``."""


class CompactionEnd(PiEvent):
    type: Literal["compaction_end"] = "compaction_end"
    reason: str | None = None
    result: dict[str, Any] | None = None
    aborted: bool = False
    will_retry: bool = False
    """True after an overflow compaction: pi continues the run by itself."""
    error_message: str | None = None


class AutoRetryStart(PiEvent):
    type: Literal["auto_retry_start"] = "auto_retry_start"
    attempt: int = 0
    max_attempts: int = 0
    delay_ms: int = 0
    error_message: str = ""


class AutoRetryEnd(PiEvent):
    type: Literal["auto_retry_end"] = "auto_retry_end"
    success: bool = False
    attempt: int = 0
    final_error: str | None = None


class SessionInfoChanged(PiEvent):
    type: Literal["session_info_changed"] = "session_info_changed"
    name: str | None = None


class ThinkingLevelChanged(PiEvent):
    type: Literal["thinking_level_changed"] = "thinking_level_changed"
    level: str | None = None


class ExtensionError(PiEvent):
    type: Literal["extension_error"] = "extension_error"
    extension_path: str | None = None
    event: str | None = None
    error: str | None = None


class UnknownEvent(PiEvent):
    """An event this version of piwork does not know, with all its fields kept."""

    type: str = ""
    parse_error: str | None = None
    """Set when the type is known but its fields did not validate."""


EVENT_TYPES: dict[str, type[PiEvent]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        AgentStart,
        AgentEnd,
        AgentSettled,
        TurnStart,
        TurnEnd,
        MessageStart,
        MessageUpdate,
        MessageEnd,
        ToolExecutionStart,
        ToolExecutionUpdate,
        ToolExecutionEnd,
        QueueUpdate,
        CompactionStart,
        CompactionEnd,
        AutoRetryStart,
        AutoRetryEnd,
        SessionInfoChanged,
        ThinkingLevelChanged,
        ExtensionError,
    )
}


# ---------------------------------------------------------------------------
# Extension UI sub-protocol
# ---------------------------------------------------------------------------


class UiRequest(_Incoming):
    """``extension_ui_request``. Dialogs block pi until answered."""

    is_dialog: ClassVar[bool] = False

    type: Literal["extension_ui_request"] = "extension_ui_request"
    id: str = ""
    method: str = ""


class _DialogRequest(UiRequest):
    is_dialog: ClassVar[bool] = True


class SelectRequest(_DialogRequest):
    """Answer with a value (one of ``options``) or cancel."""

    method: Literal["select"] = "select"
    title: str = ""
    options: list[str] = Field(default_factory=list)
    timeout: float | None = None
    """Milliseconds after which pi resolves the dialog itself, without telling us."""


class ConfirmRequest(_DialogRequest):
    method: Literal["confirm"] = "confirm"
    title: str = ""
    message: str = ""
    timeout: float | None = None


class InputRequest(_DialogRequest):
    method: Literal["input"] = "input"
    title: str = ""
    placeholder: str | None = None
    timeout: float | None = None


class EditorRequest(_DialogRequest):
    """No timeout and no abort signal in pi: only an answer ends it."""

    method: Literal["editor"] = "editor"
    title: str = ""
    prefill: str | None = None


class NotifyRequest(UiRequest):
    method: Literal["notify"] = "notify"
    message: str = ""
    notify_type: str | None = None
    """``info`` (when absent), ``warning`` or ``error``."""


class SetStatusRequest(UiRequest):
    method: Literal["setStatus"] = "setStatus"
    status_key: str = ""
    status_text: str | None = None
    """Absent means: clear this key."""


class SetWidgetRequest(UiRequest):
    method: Literal["setWidget"] = "setWidget"
    widget_key: str = ""
    widget_lines: list[str] | None = None
    widget_placement: str | None = None


class SetTitleRequest(UiRequest):
    method: Literal["setTitle"] = "setTitle"
    title: str = ""


class SetEditorTextRequest(UiRequest):
    method: Literal["set_editor_text"] = "set_editor_text"
    text: str = ""


class UnknownUiRequest(UiRequest):
    """A UI method we do not know. Not treated as a dialog: we cannot tell."""

    parse_error: str | None = None


UI_METHODS: dict[str, type[UiRequest]] = {
    cls.model_fields["method"].default: cls
    for cls in (
        SelectRequest,
        ConfirmRequest,
        InputRequest,
        EditorRequest,
        NotifyRequest,
        SetStatusRequest,
        SetWidgetRequest,
        SetTitleRequest,
        SetEditorTextRequest,
    )
}

DIALOG_METHODS = frozenset(m for m, cls in UI_METHODS.items() if cls.is_dialog)


class UiResponse(_Outgoing):
    """``extension_ui_response``: exactly one of value / confirmed / cancelled."""

    type: Literal["extension_ui_response"] = "extension_ui_response"
    id: str
    value: str | None = None
    confirmed: bool | None = None
    cancelled: Literal[True] | None = None


def ui_value(request_id: str, value: str) -> UiResponse:
    """Answer to select (one of its options), input or editor."""
    return UiResponse(id=request_id, value=value)


def ui_confirmed(request_id: str, confirmed: bool) -> UiResponse:
    """Answer to confirm."""
    return UiResponse(id=request_id, confirmed=confirmed)


def ui_cancelled(request_id: str) -> UiResponse:
    """Dismiss any dialog; pi's extension sees ``undefined`` (or ``false`` for confirm)."""
    return UiResponse(id=request_id, cancelled=True)


# ---------------------------------------------------------------------------
# Parsing one decoded line
# ---------------------------------------------------------------------------

Incoming = Response | PiEvent | UiRequest


def parse_event(obj: Mapping[str, Any]) -> PiEvent:
    """An event model for a decoded line; never raises."""
    kind = obj.get("type")
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is not None:
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            return _unknown_event(obj, _short_error(exc))
    return _unknown_event(obj, None)


def _unknown_event(obj: Mapping[str, Any], error: str | None) -> UnknownEvent:
    fields = dict(obj)
    kind = fields.pop("type", "")
    fields.pop("parseError", None)
    fields.pop("parse_error", None)
    return UnknownEvent.model_validate(
        {**fields, "type": kind if isinstance(kind, str) else str(kind), "parseError": error}
    )


def parse_ui_request(obj: Mapping[str, Any]) -> UiRequest:
    """A UI request model for a decoded line; never raises."""
    method = obj.get("method")
    cls = UI_METHODS.get(method) if isinstance(method, str) else None
    error: str | None = None
    if cls is not None:
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            error = _short_error(exc)
    fields = dict(obj)
    raw_id = fields.pop("id", "")
    raw_method = fields.pop("method", "")
    fields.pop("parseError", None)
    return UnknownUiRequest.model_validate(
        {
            **fields,
            "type": "extension_ui_request",
            "id": raw_id if isinstance(raw_id, str) else str(raw_id),
            "method": raw_method if isinstance(raw_method, str) else str(raw_method),
            "parseError": error,
        }
    )


def parse_response(obj: Mapping[str, Any]) -> Response:
    """A response model; fields of the wrong type are coerced rather than rejected."""
    try:
        return Response.model_validate(obj)
    except ValidationError as exc:
        raw_id = obj.get("id")
        return Response(
            id=raw_id if isinstance(raw_id, str) else None,
            command=str(obj.get("command", "")),
            success=False,
            error=f"unreadable response from pi: {_short_error(exc)}",
        )


def parse_incoming(obj: Mapping[str, Any]) -> Incoming:
    """Dispatch on ``type`` first, so only the needed model is built."""
    kind = obj.get("type")
    if kind == "response":
        return parse_response(obj)
    if kind == "extension_ui_request":
        return parse_ui_request(obj)
    return parse_event(obj)


def _short_error(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors()[:3]
    )


# ---------------------------------------------------------------------------
# Helpers for front ends
# ---------------------------------------------------------------------------


def _join_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    ]
    return "".join(parts)


def text_delta(event: MessageUpdate) -> str | None:
    """The assistant text added by this update, or ``None`` if it adds none."""
    ame = event.assistant_message_event
    if ame.get("type") == "text_delta":
        delta = ame.get("delta")
        return delta if isinstance(delta, str) else None
    return None


def thinking_delta(event: MessageUpdate) -> str | None:
    """The thinking text added by this update, or ``None``."""
    ame = event.assistant_message_event
    if ame.get("type") == "thinking_delta":
        delta = ame.get("delta")
        return delta if isinstance(delta, str) else None
    return None


# The argument that best says what a built-in tool call does.
_KEY_ARGS: dict[str, tuple[str, ...]] = {
    "bash": ("command",),
    "read": ("path",),
    "write": ("path",),
    "edit": ("path",),
    "ls": ("path",),
    "grep": ("pattern", "path"),
    "find": ("pattern", "path"),
}
_GENERIC_KEY_ARGS = ("path", "command", "file", "url", "pattern", "query")


@dataclass(frozen=True, slots=True)
class ToolCallSummary:
    tool_call_id: str
    tool_name: str
    key_arg: str | None
    """e.g. the bash command or the file path; ``None`` when nothing fits."""


def tool_call_summary(event: ToolExecutionStart) -> ToolCallSummary:
    args = event.args
    key: str | None = None
    for name in _KEY_ARGS.get(event.tool_name, ()) + _GENERIC_KEY_ARGS:
        value = args.get(name)
        if isinstance(value, str) and value:
            key = value
            break
    else:
        key = next((v for v in args.values() if isinstance(v, str) and v), None)
    return ToolCallSummary(event.tool_call_id, event.tool_name, key)


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    tool_call_id: str
    tool_name: str
    ok: bool
    text: str
    """The text parts of the result (for an error: pi's message, e.g. a block reason)."""


def tool_outcome(event: ToolExecutionEnd) -> ToolOutcome:
    result = event.result
    content = result.get("content") if isinstance(result, dict) else result
    return ToolOutcome(event.tool_call_id, event.tool_name, not event.is_error, _join_text(content))


@dataclass(frozen=True, slots=True)
class AssistantOutcome:
    stop_reason: str | None
    error_message: str | None
    usage: Usage
    text: str


def assistant_outcome(event: MessageEnd) -> AssistantOutcome | None:
    """How an assistant message ended; ``None`` for user/tool/other messages."""
    if event.message.get("role") != "assistant":
        return None
    try:
        msg = AssistantMessage.model_validate(event.message)
    except ValidationError as exc:
        return AssistantOutcome(
            stop_reason=str(event.message.get("stopReason") or "error"),
            error_message=f"unreadable assistant message: {_short_error(exc)}",
            usage=Usage(),
            text="",
        )
    return AssistantOutcome(msg.stop_reason, msg.error_message, msg.usage, msg.text)
