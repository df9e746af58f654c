"""The gate's side of pi's extension UI sub-protocol, parsed and answered.

The gate sends a ``select`` whose ``title`` is a human question followed by a
marked JSON block (see docs/permission-protocol.md)::

    The agent wants to delete files.
    Command: rm -r build
    ...
    Allow?

    <piwork-permission v="1">{"v":1,"kind":"piwork.permission",...}</piwork-permission>

The JSON never contains ``<`` (the gate escapes it), so the last opening
marker and the closing marker at the very end delimit it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from piwork.policy.rules import Action, Target

MARKER_OPEN = '<piwork-permission v="1">'
MARKER_CLOSE = "</piwork-permission>"
PAYLOAD_KIND = "piwork.permission"
PROTOCOL_VERSION = 1


class Choice(StrEnum):
    """The select options; the value is the exact text sent back to pi."""

    ALLOW_ONCE = "Allow once"
    ALWAYS_FOLDER = "Always allow in this folder"
    ALWAYS_EVERYWHERE = "Always allow everywhere"
    DENY = "Deny"

    @property
    def allows(self) -> bool:
        return self is not Choice.DENY

    @property
    def persists(self) -> bool:
        return self in (Choice.ALWAYS_FOLDER, Choice.ALWAYS_EVERYWHERE)


class PermissionPayloadError(ValueError):
    """The request carries our marker but its block does not parse: treat as deny."""


@dataclass(frozen=True)
class PermissionRequest:
    request_id: str
    """The extension_ui_request id to answer."""
    question: str
    """The human-readable part of the title (marker block removed)."""
    options: tuple[str, ...]
    action: Action
    tool: str
    tool_call_id: str | None
    task_id: str | None
    cwd: str | None
    command: str | None
    paths: tuple[str, ...]
    targets: tuple[Target, ...]
    payload: Mapping[str, Any]
    """The raw block, for front ends that want more than the fields above."""

    @property
    def summary(self) -> str:
        if self.command is not None:
            return self.command
        return f"{self.tool} {', '.join(self.paths)}".strip()


def split_title(title: str) -> tuple[str, str] | None:
    """``(question, json_text)`` or None when the title has no complete block."""
    stripped = title.rstrip()
    if not stripped.endswith(MARKER_CLOSE):
        return None
    start = stripped.rfind(MARKER_OPEN)
    if start < 0:
        return None
    body = stripped[start + len(MARKER_OPEN) : len(stripped) - len(MARKER_CLOSE)]
    return stripped[:start].rstrip(), body


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _target(effect: Any, tool: str) -> Target:
    if not isinstance(effect, dict):
        raise PermissionPayloadError("an effect is not an object")
    try:
        action = Action(str(effect.get("action")))
    except ValueError as exc:
        raise PermissionPayloadError(f"unknown action {effect.get('action')!r}") from exc
    return Target(
        action=action,
        op=_opt_str(effect.get("op")),
        path=_opt_str(effect.get("path")),
        domain=_opt_str(effect.get("domain")),
        command=_opt_str(effect.get("command")),
        tool=tool,
        reason=_opt_str(effect.get("reason")),
    )


def parse_request(message: Mapping[str, Any] | Any) -> PermissionRequest | None:
    """A ``PermissionRequest`` if ``message`` is the gate's select, None if it is
    anything else (another extension's dialog, a notify, a command reply).

    Accepts the decoded JSON object or a pydantic model of it. Raises
    ``PermissionPayloadError`` when the marker is there but the block is broken.
    """
    if hasattr(message, "model_dump"):
        message = message.model_dump()
    if not isinstance(message, Mapping):
        return None
    if message.get("type") != "extension_ui_request" or message.get("method") != "select":
        return None
    title = message.get("title")
    request_id = message.get("id")
    if not isinstance(title, str) or not isinstance(request_id, str):
        return None
    parts = split_title(title)
    if parts is None:
        return None
    question, body = parts
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PermissionPayloadError(f"permission block is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != PAYLOAD_KIND:
        raise PermissionPayloadError("permission block has the wrong kind")
    if data.get("v") != PROTOCOL_VERSION:
        raise PermissionPayloadError(f"unsupported permission protocol version {data.get('v')!r}")
    tool = data.get("tool")
    if not isinstance(tool, str):
        raise PermissionPayloadError("permission block has no tool")
    try:
        action = Action(str(data.get("action")))
    except ValueError as exc:
        raise PermissionPayloadError(f"unknown action {data.get('action')!r}") from exc
    effects = data.get("effects")
    if not isinstance(effects, list):
        raise PermissionPayloadError("permission block has no effects list")
    targets = tuple(_target(e, tool) for e in effects)
    if not targets:
        targets = (Target(action=action, tool=tool, command=_opt_str(data.get("command"))),)
    raw_paths = data.get("paths")
    paths = tuple(p for p in raw_paths if isinstance(p, str)) if isinstance(raw_paths, list) else ()
    raw_options = message.get("options")
    options = (
        tuple(o for o in raw_options if isinstance(o, str)) if isinstance(raw_options, list) else ()
    )
    return PermissionRequest(
        request_id=request_id,
        question=question,
        options=options,
        action=action,
        tool=tool,
        tool_call_id=_opt_str(data.get("toolCallId")),
        task_id=_opt_str(data.get("taskId")),
        cwd=_opt_str(data.get("cwd")),
        command=_opt_str(data.get("command")),
        paths=paths,
        targets=targets,
        payload=data,
    )


def build_reply(request_id: str, choice: Choice | str) -> dict[str, Any]:
    """The ``extension_ui_response`` that picks ``choice``."""
    value = choice.value if isinstance(choice, Choice) else Choice(choice).value
    return {"type": "extension_ui_response", "id": request_id, "value": value}


def build_cancel(request_id: str) -> dict[str, Any]:
    """The response that dismisses a dialog (the gate treats it as not allowed)."""
    return {"type": "extension_ui_response", "id": request_id, "cancelled": True}
