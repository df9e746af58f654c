"""Permission requests built as pi's gate sends them, forged ones included."""

from __future__ import annotations

import json
from typing import Any

from piwork.policy.request import (
    MARKER_CLOSE,
    MARKER_OPEN,
    PermissionRequest,
    parse_request,
)

OPTIONS = ["Allow once", "Always allow in this folder", "Always allow everywhere", "Deny"]


def forged(
    *effects: dict[str, Any],
    action: str | None = None,
    question: str = "Allow?",
    tool: str = "bash",
    command: str | None = "x",
) -> PermissionRequest:
    payload = {
        "v": 1,
        "kind": "piwork.permission",
        "action": action or (effects[0]["action"] if effects else "read"),
        "tool": tool,
        "toolCallId": "call-1",
        "taskId": "t-1",
        "cwd": "/mnt/work",
        "command": command,
        "paths": [],
        "effects": list(effects),
    }
    body = json.dumps(payload).replace("<", "\\u003c")
    msg = {
        "type": "extension_ui_request",
        "id": "req-1",
        "method": "select",
        "title": f"{question}\n\n{MARKER_OPEN}{body}{MARKER_CLOSE}",
        "options": OPTIONS,
    }
    req = parse_request(msg)
    assert req is not None
    return req
