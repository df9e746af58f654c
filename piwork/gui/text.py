"""Qt-free helpers the window uses: guest text sanitizing and the "Always" rule preview.

Both are single functions on purpose (the lead can switch the rule preview to
the policy's own function once it exists, in one place).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from piwork.policy import Choice, PermissionRequest, PolicyStore, Rule, Scope, TaskContext, Verdict
from piwork.policy.decider import persist_pattern

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f]")
MAX_GUEST_TEXT = 4000


def sanitize(text: object, *, limit: int = MAX_GUEST_TEXT, keep_newlines: bool = True) -> str:
    """Text from the guest made safe to show: no control or bidi-override characters, bounded.

    The guest is hostile: a file name or command may carry terminal escapes,
    right-to-left overrides that reverse what the person reads, or megabytes.
    """
    s = str(text)
    s = _CONTROL.sub("", s)
    # Bidi controls and other format characters (Cf) can make "rm a" read as "a mr".
    s = "".join(ch for ch in s if unicodedata.category(ch) != "Cf")
    if not keep_newlines:
        s = s.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    else:
        s = s.replace("\r", "")
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return s


def always_rules(
    request: PermissionRequest,
    choice: Choice,
    *,
    task_id: str | None,
    folder: Path | None,
    policy_file: Path,
) -> list[str]:
    """Exactly the rules an "Always" answer would store, as ``piwork policy list`` shows them.

    Mirrors ``Decider.record_answer`` without writing: one rule per target not
    already allowed, pattern from ``persist_pattern``, scope from the choice
    (folder; task when the task has no folder; global for "everywhere").
    """
    if not choice.persists:
        return []
    ctx = TaskContext(task_id=task_id, working_folder=folder)
    if choice is Choice.ALWAYS_EVERYWHERE:
        scope = Scope.global_()
    elif folder is not None:
        scope = Scope.folder(folder)
    elif task_id is not None:
        scope = Scope.task(task_id)
    else:
        scope = Scope.global_()
    from piwork.policy import Decider

    current = Decider(PolicyStore(policy_file)).evaluate(request, ctx)
    out: list[str] = []
    keys: set[object] = set()
    for td in current.targets:
        if td.verdict is Verdict.ALLOW:
            continue
        ok, pattern = persist_pattern(td.target)
        if not ok:
            continue
        rule = Rule(action=td.target.action, verdict=Verdict.ALLOW, scope=scope, pattern=pattern)
        if rule.key in keys:
            continue
        keys.add(rule.key)
        out.append(sanitize(rule.describe(), limit=400, keep_newlines=False))
    return out


def plain_request(request: PermissionRequest) -> str:
    """What the agent wants, in plain words."""
    verbs = {
        "read": "read",
        "write": "change or create",
        "delete": "delete",
        "move": "move or rename",
        "shell": "run a command",
        "network": "connect to the network",
        "outside-scope": "touch something outside the working folder",
        "connector": "use a connector",
    }
    verb = verbs.get(request.action.value, request.action.value)
    what = sanitize(request.summary, limit=300, keep_newlines=False)
    return f"The agent wants to {verb}: {what}"
