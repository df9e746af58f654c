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

import ipaddress
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import orjson

from piwork.errors import ProtocolError
from piwork.policy.rules import Action, Target, TaskContext

if TYPE_CHECKING:
    from piwork.policy.rules import Rule

MARKER_OPEN = '<piwork-permission v="1">'
MARKER_CLOSE = "</piwork-permission>"
PAYLOAD_KIND = "piwork.permission"
PROTOCOL_VERSION = 1


class Choice(StrEnum):
    """The person's answers. The gate's four select options (``GATE_CHOICES``) are the
    exact text sent back to pi; the others are the host's own and reach pi as
    :attr:`gate_reply`."""

    ALLOW_ONCE = "Allow once"
    ALWAYS_FOLDER = "Always allow in this folder"
    ALWAYS_EVERYWHERE = "Always allow everywhere"
    DENY = "Deny"
    ALLOW_REGISTRIES = "Allow the package registries"
    """Offered only when all a request still asks about is a package registry domain
    (``piwork.env.registries``): saves one rule per registry domain, in this folder."""

    @property
    def allows(self) -> bool:
        return self is not Choice.DENY

    @property
    def persists(self) -> bool:
        """An "Always": the policy derives the rules to store from the request's targets."""
        return self in (Choice.ALWAYS_FOLDER, Choice.ALWAYS_EVERYWHERE)

    @property
    def gate_reply(self) -> Choice:
        """What pi's gate is sent: one of its own options (it knows no others; the
        rules an answer stores live on the host, never in the guest)."""
        if self in GATE_CHOICES:
            return self
        return Choice.ALLOW_ONCE if self.allows else Choice.DENY


GATE_CHOICES: tuple[Choice, ...] = (
    Choice.ALLOW_ONCE,
    Choice.ALWAYS_FOLDER,
    Choice.ALWAYS_EVERYWHERE,
    Choice.DENY,
)
"""The gate's select options (runtime-pack/extensions/gate/classify.js ``OPTION_LIST``)."""


class PermissionPayloadError(ValueError, ProtocolError):
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
    """The raw block, for front ends that want more than the fields above.
    Guest text: never store or print it without validating/sanitizing."""
    proposals: Mapping[Choice, tuple[Rule, ...]] = field(default_factory=dict)
    """Filled by the runner before it asks a front end: for each "Always" choice,
    exactly the rules ``record_answer`` would store (``decider.proposed_rules``).
    Empty tuple: that choice remembers nothing and only allows this once."""

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


HOST_ONLY_ACTIONS = frozenset({Action.PRIVATE_NETWORK})
"""Asked by the host alone (the egress proxy's private-address question): a guest
request naming one is forged, and is judged as an unknown command instead."""


def _guest_action(value: Any) -> Action:
    try:
        action = Action(str(value))
    except ValueError as exc:
        raise PermissionPayloadError(f"unknown action {value!r}") from exc
    return Action.SHELL if action in HOST_ONLY_ACTIONS else action


def _target(effect: Any, tool: str) -> Target:
    if not isinstance(effect, dict):
        raise PermissionPayloadError("an effect is not an object")
    action = _guest_action(effect.get("action"))
    if action is Action.SHELL and effect.get("action") != Action.SHELL.value:
        return Target(
            Action.SHELL,
            op="exec",
            command=_opt_str(effect.get("command")),
            tool=tool,
            reason="the request named a question only piwork itself asks; asked as a command",
        )
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
    action = _guest_action(data.get("action"))
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
    value = Choice(choice).gate_reply.value
    return {"type": "extension_ui_response", "id": request_id, "value": value}


def build_cancel(request_id: str) -> dict[str, Any]:
    """The response that dismisses a dialog (the gate treats it as not allowed)."""
    return {"type": "extension_ui_response", "id": request_id, "cancelled": True}


# ---------------------------------------------------------------------------
# Host-side validation: the request is untrusted input.
#
# The gate runs in the guest, and guest root can forge a request line into pi's
# stdout. So the host never takes the guest's word for what a target is: it
# re-derives each target's action from the path/domain against the task's
# fixed mount points, drops malformed values, and only then matches rules or
# derives "Always" rules from it.

WRITABLE_ROOTS: tuple[str, ...] = ("/mnt/work", "/mnt/outputs")
"""Guest mounts of the task's working folder and outputs: writes, deletes and moves
inside them are "in scope"."""
READABLE_ROOTS: tuple[str, ...] = (*WRITABLE_ROOTS, "/mnt/uploads", "/opt/piwork")
"""Where reads are in scope (uploads and the runtime pack are read-only)."""

MAX_PATH = 4096
MAX_COMMAND = 2000
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff]"
)
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
_TOOL = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")

# Which actions each guest-side op may legitimately carry.
_OP_ACTIONS: dict[str, frozenset[Action]] = {
    "read": frozenset({Action.READ, Action.OUTSIDE_SCOPE}),
    "write": frozenset({Action.WRITE, Action.OUTSIDE_SCOPE}),
    "delete": frozenset({Action.DELETE, Action.OUTSIDE_SCOPE}),
    "move": frozenset({Action.MOVE, Action.OUTSIDE_SCOPE}),
    "exec": frozenset({Action.SHELL}),
    "network": frozenset({Action.NETWORK}),
    "connector": frozenset({Action.CONNECTOR}),
    "private-network": frozenset({Action.PRIVATE_NETWORK}),  # host-made only (HOST_ONLY_ACTIONS)
}


def has_control(text: str) -> bool:
    """True when ``text`` holds a terminal control or text-reordering character."""
    return bool(_CONTROL.search(text))


def clean_path(value: str | None) -> str | None:
    """``value`` if it is a plain, normalized absolute guest path, else None.

    Rejected: relative, empty, ``..``/``.``/``//`` components, a trailing ``/``,
    control characters, over-long. (Glob characters are allowed in a path: they
    are escaped when a path becomes a rule pattern.)
    """
    if not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_PATH:
        return None
    if has_control(value) or value.startswith("//"):
        return None
    if posixpath.normpath(value) != value:
        return None
    return value


def clean_domain(value: str | None) -> str | None:
    """A lower-case host name with at least two labels, or an IP literal; else None.

    Rejected: wildcards, ``*``, empty, a bare TLD, ports, paths, user-info, and
    anything that is not LDH labels.
    """
    if not isinstance(value, str):
        return None
    d = value.strip().lower().removesuffix(".")
    if d.startswith("[") and d.endswith("]"):
        d = d[1:-1]
    try:
        return str(ipaddress.ip_address(d))
    except ValueError:
        pass
    if not d or len(d) > 253:
        return None
    labels = d.split(".")
    if len(labels) < 2 or not all(_LABEL.match(label) for label in labels):
        return None
    if labels[-1].isdigit():  # 1.2.3 is not a name and not an address
        return None
    return d


def clean_command(value: str | None) -> str | None:
    """The command with whitespace runs folded, if it is non-empty, printable and bounded."""
    if (
        not isinstance(value, str)
        or len(value) > MAX_COMMAND
        or has_control(value.replace("\t", " ").replace("\n", " "))
    ):
        return None
    folded = " ".join(value.split())
    return folded or None


def clean_tool(value: str | None) -> str | None:
    """A tool name: letters, digits and ``_.:-`` only (no glob characters)."""
    if not isinstance(value, str) or not _TOOL.match(value):
        return None
    return value


def is_inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def host_target(target: Target, ctx: TaskContext | None = None) -> Target:
    """The host's own judgement of one guest-sent target.

    The action is re-derived from the op and the (validated) path or domain: a
    ``read``/``write``/``delete``/``move`` whose path is missing, malformed or not
    under the task's mounts becomes ``outside-scope`` (asks by default); an op
    that does not fit its action becomes ``shell`` (asks); a malformed domain
    becomes an unknown host; a malformed tool name becomes no tool. Idempotent.
    """
    del ctx  # the mount points are the same for every task
    action = target.action
    op = target.op
    if action is Action.PREVIEW or (
        op is not None and (op not in _OP_ACTIONS or action not in _OP_ACTIONS[op])
    ):
        # (A preview is asked by the host itself: a guest request naming one is forged.)
        return Target(
            Action.SHELL,
            op="exec",
            command=clean_command(target.command),
            tool=clean_tool(target.tool),
            reason=f"request did not add up (op {op!r} with action {action.value}); asked",
        )
    path = clean_path(target.path)
    domain = clean_domain(target.domain) if target.domain is not None else None
    if action is Action.PRIVATE_NETWORK and domain is None and target.domain is not None:
        # The egress proxy's own question (a host-made target): an intranet name
        # ("artifactory", "localhost") is a valid destination there.
        label = target.domain.strip().lower().removesuffix(".")
        domain = label if _LABEL.match(label) and not label.isdigit() else None
    command = clean_command(target.command)
    tool = clean_tool(target.tool)
    if action is Action.READ:
        if path is None or not is_inside(path, READABLE_ROOTS):
            action = Action.OUTSIDE_SCOPE
    elif action in (Action.WRITE, Action.DELETE, Action.MOVE) and (
        path is None or not is_inside(path, WRITABLE_ROOTS)
    ):
        action = Action.OUTSIDE_SCOPE
    return Target(
        action=action,
        op=op,
        path=path,
        domain=domain,
        command=command,
        tool=tool,
        reason=target.reason,
    )


_SEVERITY = (
    Action.READ,
    Action.WRITE,
    Action.CONNECTOR,
    Action.SHELL,
    Action.NETWORK,
    Action.PRIVATE_NETWORK,
    Action.MOVE,
    Action.DELETE,
    Action.OUTSIDE_SCOPE,
)


def validate_request(
    request: PermissionRequest, ctx: TaskContext | None = None
) -> PermissionRequest:
    """``request`` with host-judged targets (``host_target``) and the headline action
    recomputed from them (the most serious). Idempotent; the decider calls it on
    every request, so front ends and the runner cannot skip it."""
    targets = tuple(host_target(t, ctx) for t in request.targets) or (
        host_target(Target(request.action, tool=request.tool, command=request.command), ctx),
    )
    action = max((t.action for t in targets), key=_SEVERITY.index)
    if targets == request.targets and action is request.action:
        return request
    return replace(request, targets=targets, action=action)
