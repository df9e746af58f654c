"""pi's RPC protocol: JSONL framing, message models, and an asyncio client.

Transport-agnostic: the guest channel layer feeds lines in and gives a
``send_line`` coroutine; see :class:`piwork.rpc.client.RpcClient`.
"""

from piwork.rpc.client import (
    ClientItem,
    EventSubscription,
    RpcClient,
    RpcConnectionLost,
    RpcError,
    RpcTimeout,
    UiHandler,
    UnmatchedResponse,
)
from piwork.rpc.framing import (
    LineDecoder,
    MalformedLine,
    OversizedLine,
    decode_line,
    encode_line,
)
from piwork.rpc.models import (
    AssistantOutcome,
    PiEvent,
    Response,
    SessionState,
    SessionStats,
    ToolCallSummary,
    ToolOutcome,
    UiRequest,
    UiResponse,
    UnknownEvent,
    assistant_outcome,
    text_delta,
    thinking_delta,
    tool_call_summary,
    tool_outcome,
    ui_cancelled,
    ui_confirmed,
    ui_value,
)

__all__ = [
    "AssistantOutcome",
    "ClientItem",
    "EventSubscription",
    "LineDecoder",
    "MalformedLine",
    "OversizedLine",
    "PiEvent",
    "Response",
    "RpcClient",
    "RpcConnectionLost",
    "RpcError",
    "RpcTimeout",
    "SessionState",
    "SessionStats",
    "ToolCallSummary",
    "ToolOutcome",
    "UiHandler",
    "UiRequest",
    "UiResponse",
    "UnknownEvent",
    "UnmatchedResponse",
    "assistant_outcome",
    "decode_line",
    "encode_line",
    "text_delta",
    "thinking_delta",
    "tool_call_summary",
    "tool_outcome",
    "ui_cancelled",
    "ui_confirmed",
    "ui_value",
]
