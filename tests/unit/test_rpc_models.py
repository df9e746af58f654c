"""pi's vocabulary: what we send must be exactly pi's wire format; what pi sends
must parse even when pi has grown new fields, events or UI methods."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from piwork.rpc.models import (
    DIALOG_METHODS,
    AgentEnd,
    AgentSettled,
    AutoRetryStart,
    CompactionEnd,
    ConfirmRequest,
    EditorRequest,
    GetStateCommand,
    ImageContent,
    MessageEnd,
    MessageUpdate,
    NotifyRequest,
    PromptCommand,
    QueueUpdate,
    Response,
    SelectRequest,
    SessionState,
    SessionStats,
    SetModelCommand,
    SetStatusRequest,
    SetWidgetRequest,
    SwitchSessionCommand,
    ToolExecutionEnd,
    ToolExecutionStart,
    UnknownEvent,
    UnknownUiRequest,
    assistant_outcome,
    command_to_wire,
    parse_incoming,
    text_delta,
    thinking_delta,
    tool_call_summary,
    tool_outcome,
    ui_cancelled,
    ui_confirmed,
    ui_value,
)

# --- commands -------------------------------------------------------------


def test_commands_serialize_to_pis_camel_case_without_unset_fields() -> None:
    assert command_to_wire(SetModelCommand(provider="gw", model_id="m1")) == {
        "type": "set_model",
        "provider": "gw",
        "modelId": "m1",
    }
    assert command_to_wire(SwitchSessionCommand(session_path="/mnt/state/s.jsonl")) == {
        "type": "switch_session",
        "sessionPath": "/mnt/state/s.jsonl",
    }
    assert command_to_wire(GetStateCommand()) == {"type": "get_state"}


def test_prompt_with_images_and_streaming_behavior() -> None:
    cmd = PromptCommand(
        message="look",
        images=[ImageContent(data="QUJD", mime_type="image/png")],
        streaming_behavior="followUp",
    )

    assert command_to_wire(cmd) == {
        "type": "prompt",
        "message": "look",
        "images": [{"type": "image", "data": "QUJD", "mimeType": "image/png"}],
        "streamingBehavior": "followUp",
    }


def test_commands_reject_typos_before_anything_reaches_pi() -> None:
    with pytest.raises(ValidationError):
        PromptCommand.model_validate({"message": "x", "streamingBehaviour": "steer"})
    with pytest.raises(ValidationError):
        PromptCommand.model_validate({"message": "x", "streamingBehavior": "later"})


def test_a_plain_dict_command_passes_through_but_needs_a_type() -> None:
    assert command_to_wire({"type": "cycle_model"}) == {"type": "cycle_model"}
    with pytest.raises(ValueError, match="type"):
        command_to_wire({"message": "no type"})


# --- responses and state --------------------------------------------------


def test_get_state_data_parses_with_extra_fields_kept() -> None:
    data = {
        "model": {"id": "m1", "provider": "gw"},
        "thinkingLevel": "off",
        "isStreaming": True,
        "isCompacting": False,
        "steeringMode": "all",
        "followUpMode": "one-at-a-time",
        "sessionFile": "/mnt/state/session.jsonl",
        "sessionId": "abc",
        "autoCompactionEnabled": True,
        "messageCount": 4,
        "pendingMessageCount": 1,
        "isRetrying": False,  # a field a later pi might add
    }

    state = SessionState.model_validate(data)

    assert state.is_streaming is True
    assert state.session_file == "/mnt/state/session.jsonl"
    assert state.pending_message_count == 1
    assert state.session_name is None
    assert state.model_extra == {"isRetrying": False}


def test_session_stats_tolerate_null_context_usage_after_compaction() -> None:
    stats = SessionStats.model_validate(
        {
            "tokens": {"input": 5, "output": 7, "cacheRead": 0, "cacheWrite": 0, "total": 12},
            "cost": 0.25,
            "contextUsage": {"tokens": None, "contextWindow": 1000, "percent": None},
        }
    )

    assert stats.tokens.total == 12
    assert stats.context_usage is not None
    assert stats.context_usage.tokens is None


def test_a_response_is_recognised_by_type_even_without_id() -> None:
    item = parse_incoming(
        {"type": "response", "command": "parse", "success": False, "error": "Failed to parse"}
    )

    assert isinstance(item, Response)
    assert item.id is None
    assert item.command == "parse"
    assert item.success is False


def test_a_response_with_mistyped_fields_still_parses_as_a_failure() -> None:
    item = parse_incoming({"type": "response", "id": "r1", "command": "x", "success": "maybe"})

    assert isinstance(item, Response)
    assert item.id == "r1"
    assert item.success is False
    assert item.error is not None and "unreadable" in item.error


# --- events ---------------------------------------------------------------


def test_known_events_parse_to_their_models() -> None:
    ev = parse_incoming(
        {
            "type": "auto_retry_start",
            "attempt": 1,
            "maxAttempts": 3,
            "delayMs": 2000,
            "errorMessage": "500 server error",
        }
    )
    assert isinstance(ev, AutoRetryStart)
    assert (ev.attempt, ev.max_attempts, ev.delay_ms) == (1, 3, 2000)

    q = parse_incoming({"type": "queue_update", "steering": ["a"], "followUp": ["b"]})
    assert isinstance(q, QueueUpdate)
    assert q.follow_up == ["b"]

    c = parse_incoming(
        {
            "type": "compaction_end",
            "reason": "overflow",
            "result": None,
            "aborted": False,
            "willRetry": True,
        }
    )
    assert isinstance(c, CompactionEnd)
    assert c.will_retry is True


def test_pi_1x_events_parse_settled_retry_and_nested_tool_calls() -> None:
    """What pi 1.x adds (docs/json.md): agent_settled, agent_end's willRetry, and the
    parent of a tool call another tool made (a codemode script's tools.X())."""
    settled = parse_incoming({"type": "agent_settled", "aborted": True})
    assert isinstance(settled, AgentSettled) and settled.aborted is True
    end = parse_incoming({"type": "agent_end", "messages": [], "willRetry": True})
    assert isinstance(end, AgentEnd) and end.will_retry is True
    start = parse_incoming(
        {
            "type": "tool_execution_start",
            "toolCallId": "call_1/2",
            "toolName": "bash",
            "args": {"command": "rm a"},
            "parentToolCallId": "call_1",
        }
    )
    assert isinstance(start, ToolExecutionStart)
    assert (start.tool_call_id, start.parent_tool_call_id) == ("call_1/2", "call_1")
    done = parse_incoming(
        {
            "type": "tool_execution_end",
            "toolCallId": "call_1",
            "toolName": "codemode",
            "result": {"content": []},
            "isError": False,
            "durationMs": 12.5,
        }
    )
    assert isinstance(done, ToolExecutionEnd)
    assert (done.parent_tool_call_id, done.duration_ms) == (None, 12.5)
    upd = parse_incoming(
        {"type": "message_update", "usage": {"input": 3}, "assistantMessageEvent": {"type": "x"}}
    )
    assert isinstance(upd, MessageUpdate) and upd.usage == {"input": 3}


def test_unknown_event_types_become_unknown_events_with_their_fields() -> None:
    ev = parse_incoming({"type": "session_tree_changed", "leaf": "x1", "depth": 3})

    assert isinstance(ev, UnknownEvent)
    assert ev.type == "session_tree_changed"
    assert ev.model_extra == {"leaf": "x1", "depth": 3}
    assert ev.parse_error is None


def test_a_known_event_with_incompatible_fields_degrades_instead_of_raising() -> None:
    ev = parse_incoming({"type": "agent_end", "messages": "not a list"})

    assert isinstance(ev, UnknownEvent)
    assert ev.type == "agent_end"
    assert ev.parse_error is not None and "messages" in ev.parse_error


def test_lines_without_type_do_not_crash() -> None:
    ev = parse_incoming({"hello": 1})

    assert isinstance(ev, UnknownEvent)
    assert ev.type == ""


def test_new_fields_on_known_events_are_kept() -> None:
    ev = parse_incoming({"type": "agent_end", "messages": [], "reason": "done"})

    assert isinstance(ev, AgentEnd)
    assert ev.model_extra == {"reason": "done"}


# --- extension UI ---------------------------------------------------------


def test_ui_requests_parse_by_method() -> None:
    sel = parse_incoming(
        {
            "type": "extension_ui_request",
            "id": "u1",
            "method": "select",
            "title": "Allow bash: rm -rf build?",
            "options": ["Allow once", "Always allow", "Deny"],
            "timeout": 30000,
        }
    )
    assert isinstance(sel, SelectRequest)
    assert sel.is_dialog
    assert sel.options[2] == "Deny"
    assert sel.timeout == 30000

    status = parse_incoming(
        {"type": "extension_ui_request", "id": "u2", "method": "setStatus", "statusKey": "gate"}
    )
    assert isinstance(status, SetStatusRequest)
    assert not status.is_dialog
    assert status.status_text is None

    widget = parse_incoming(
        {
            "type": "extension_ui_request",
            "id": "u3",
            "method": "setWidget",
            "widgetKey": "w",
            "widgetLines": ["a", "b"],
            "widgetPlacement": "belowEditor",
        }
    )
    assert isinstance(widget, SetWidgetRequest)
    assert widget.widget_lines == ["a", "b"]

    note = parse_incoming(
        {"type": "extension_ui_request", "id": "u4", "method": "notify", "message": "hi"}
    )
    assert isinstance(note, NotifyRequest)


def test_dialog_methods_are_exactly_the_blocking_ones() -> None:
    assert {"select", "confirm", "input", "editor"} == DIALOG_METHODS
    assert EditorRequest.is_dialog and ConfirmRequest.is_dialog


def test_an_unknown_ui_method_is_kept_but_not_treated_as_a_dialog() -> None:
    req = parse_incoming(
        {"type": "extension_ui_request", "id": "u9", "method": "pickColor", "palette": ["red"]}
    )

    assert isinstance(req, UnknownUiRequest)
    assert req.method == "pickColor"
    assert req.id == "u9"
    assert not req.is_dialog
    assert req.model_extra == {"palette": ["red"]}


def test_ui_response_builders_match_pis_three_shapes() -> None:
    assert ui_value("u1", "Deny").to_wire() == {
        "type": "extension_ui_response",
        "id": "u1",
        "value": "Deny",
    }
    assert ui_confirmed("u2", False).to_wire() == {
        "type": "extension_ui_response",
        "id": "u2",
        "confirmed": False,
    }
    assert ui_cancelled("u3").to_wire() == {
        "type": "extension_ui_response",
        "id": "u3",
        "cancelled": True,
    }
    assert ui_value("u4", "").to_wire()["value"] == ""


# --- helpers for front ends -----------------------------------------------


def update(ame: dict[str, Any]) -> MessageUpdate:
    ev = parse_incoming(
        {"type": "message_update", "message": {"role": "assistant"}, "assistantMessageEvent": ame}
    )
    assert isinstance(ev, MessageUpdate)
    return ev


def test_text_delta_only_for_text_deltas() -> None:
    assert text_delta(update({"type": "text_delta", "contentIndex": 0, "delta": "Hel"})) == "Hel"
    assert text_delta(update({"type": "text_end", "content": "Hello"})) is None
    assert text_delta(update({"type": "thinking_delta", "delta": "hmm"})) is None
    assert thinking_delta(update({"type": "thinking_delta", "delta": "hmm"})) == "hmm"
    assert text_delta(update({"type": "text_delta", "delta": 5})) is None


@pytest.mark.parametrize(
    ("tool", "args", "key"),
    [
        ("bash", {"command": "ls -la", "timeout": 5}, "ls -la"),
        ("read", {"path": "src/a.py", "offset": 3}, "src/a.py"),
        ("edit", {"path": "b.py", "edits": [{"oldText": "x", "newText": "y"}]}, "b.py"),
        ("grep", {"pattern": "TODO", "path": "src"}, "TODO"),
        ("ask_user", {"question": "Which?"}, "Which?"),
        ("noargs", {}, None),
    ],
)
def test_tool_call_summary_picks_the_telling_argument(
    tool: str, args: dict[str, Any], key: str | None
) -> None:
    ev = ToolExecutionStart(tool_call_id="c1", tool_name=tool, args=args)

    summary = tool_call_summary(ev)

    assert (summary.tool_call_id, summary.tool_name, summary.key_arg) == ("c1", tool, key)


def test_tool_outcome_reports_ok_or_error_with_text() -> None:
    ok = ToolExecutionEnd.model_validate(
        {
            "toolCallId": "c1",
            "toolName": "bash",
            "result": {
                "content": [
                    {"type": "text", "text": "a\n"},
                    {"type": "image"},
                    {"type": "text", "text": "b"},
                ]
            },
            "isError": False,
        }
    )
    blocked = ToolExecutionEnd.model_validate(
        {
            "toolCallId": "c2",
            "toolName": "write",
            "result": {"content": [{"type": "text", "text": "Blocked by user"}]},
            "isError": True,
        }
    )

    assert tool_outcome(ok).ok is True
    assert tool_outcome(ok).text == "a\nb"
    assert tool_outcome(blocked).ok is False
    assert tool_outcome(blocked).text == "Blocked by user"


def test_assistant_outcome_reads_stop_reason_error_and_usage() -> None:
    ev = MessageEnd(
        message={
            "role": "assistant",
            "content": [{"type": "text", "text": "Done."}],
            "usage": {
                "input": 10,
                "output": 3,
                "cacheRead": 0,
                "cacheWrite": 0,
                "totalTokens": 13,
                "cost": {"total": 0.01},
            },
            "stopReason": "error",
            "errorMessage": "500 Internal Server Error",
        }
    )

    outcome = assistant_outcome(ev)

    assert outcome is not None
    assert outcome.stop_reason == "error"
    assert outcome.error_message == "500 Internal Server Error"
    assert outcome.usage.total_tokens == 13
    assert outcome.usage.cost.total == 0.01
    assert outcome.text == "Done."


def test_assistant_outcome_is_none_for_other_roles() -> None:
    assert assistant_outcome(MessageEnd(message={"role": "user", "content": "hi"})) is None


def test_parsing_a_large_message_update_keeps_the_payload_raw() -> None:
    partial = {"role": "assistant", "content": [{"type": "text", "text": "z" * 2_000_000}]}
    line = orjson.dumps(
        {
            "type": "message_update",
            "message": partial,
            "assistantMessageEvent": {"type": "text_delta", "delta": "z", "partial": partial},
        }
    )

    ev = parse_incoming(orjson.loads(line))

    assert isinstance(ev, MessageUpdate)
    assert ev.message == partial
    assert text_delta(ev) == "z"
