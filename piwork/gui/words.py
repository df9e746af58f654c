"""The person's words for what the guest says: their paths, decisions in plain language.

Qt-free; used by the conversation, the permission sheet and the notices.
"""

from __future__ import annotations

import re
from typing import Any

# What "Continue it" after a crash sends the agent: piwork's words, not the person's, so
# the conversation shows them as a notice, never under "You" (issue 33 item 9).
RESUME_PROMPT = (
    "piwork stopped unexpectedly while you were working on this task. "
    "Check where you got to and continue."
)
RESUMED = "piwork asked the agent to continue where the crash cut it off"

# Where the guest sees the person's folders (piwork.agent): shown as the person knows them.
_GUEST_DIRS = (("/mnt/work/", ""), ("/mnt/work", "."), ("/mnt/outputs/", "outputs/"))
_GUEST_DIR_RE = re.compile(r"/mnt/(?:work|outputs)(?:/|\b)")


def person_paths(text: str) -> str:
    """Guest paths as paths relative to the person's folder ("/mnt/work/a.txt" -> "a.txt",
    the task's outputs as "outputs/...")."""

    def swap(m: re.Match[str]) -> str:
        hit = m.group(0)
        for guest, shown in _GUEST_DIRS:
            if hit == guest or (hit.rstrip("/") == guest and not guest.endswith("/")):
                return shown
        return hit

    return _GUEST_DIR_RE.sub(swap, text)


def permission_line(d: dict[str, Any]) -> str | None:
    """A permission decision in words (None for the ask itself: the sheet shows it)."""
    dec = str(d.get("decision") or "")
    if dec == "ask":
        return None
    what = person_paths(str(d.get("target") or d.get("action") or "the request"))
    tool, action = str(d.get("tool") or ""), str(d.get("action") or "")
    for word in (tool, action):  # "write a.txt" -> "a.txt": the verb comes from the line
        if word and what.startswith(word + " "):
            what = what[len(word) + 1 :]
    verb = {
        "read": "read",
        "write": "change",
        "delete": "delete",
        "move": "move",
        "outside-scope": "reach outside the folder:",
        "network": "reach",
        "shell": "run",
        "connector": "use",
    }.get(action, action)
    if tool == "bash":  # the target is the command itself: show it, and what it does
        does = {
            "outside-scope": "reaches outside the folder",
            "network": "uses the network",
            "write": "changes files",
            "delete": "deletes files",
            "move": "moves files",
            "read": "reads files",
        }.get(action, action.replace("-", " ") if action != "shell" else "")
        deed = f"{what} ({does})" if does else what
    else:
        deed = f"{verb} {what}"
    by = str(d.get("by") or "")
    allowed = dec not in ("Deny", "deny", "cancelled")
    if dec == "cancelled" or by == "cancelled":
        return f"Question withdrawn (the task stopped): {deed}"
    if by == "rule":
        return f"{'Allowed' if allowed else 'Denied'} by the rules: {deed}"
    if by == "no-terminal":
        return f"Denied (nobody was there to ask): {deed}"
    if by == "assume-yes":
        return f"Allowed (--yes): {deed}"
    if not allowed:
        return f"You denied: {deed}"
    how = {
        "Always allow in this folder": " (always, in this folder)",
        "Always allow everywhere": " (always, everywhere)",
        "Allow the package registries": " (the package registries, in this folder)",
    }.get(dec, "")
    return f"You allowed{how}: {deed}"


def stopped_words(reason: str) -> str:
    """How a stopped run ended, said to the person ("Stopped by you", not "cancelled")."""
    return {
        "completed": "Done",
        "cancelled": "Stopped by you",  # a Stop, Esc, Ctrl-C or quit: always the person
        "error": "Failed",
        "limit": "Stopped at a limit",
    }.get(reason, "Stopped")


def is_denied(d: dict[str, Any]) -> bool:
    """A permission event or record that ended in "no" (by the person, a rule, nobody)."""
    return str(d.get("decision") or "") in ("Deny", "deny")


def ended_line(ended: str, message: str | None, tokens: int, steps: int) -> str:
    """The line under a finished run, live and in a reopened task alike: how it ended,
    what it cost, how many steps (model calls) it took."""
    what = f": {message}" if message else ""
    return f"— {ended}{what} · {tokens:,} tokens, {steps} step{'' if steps == 1 else 's'} —"


# What the runner says to both front ends names a task by its id and says what to do in
# CLI commands ("`piwork resume 3f2a1b2c4d5e` continues it"). In the window the task is
# the one on screen, and continuing it is Enter below (issue 33 item 13).
_TASK_ID = r"[0-9a-f]{12}"
_RESUME = re.compile(rf"`piwork resume (?P<id>{_TASK_ID})`")
_SENTENCE = re.compile(r"(^|[.!?]\s+)(a new message|this task)")
_NAMED = re.compile(rf"\b(?P<word>[Tt]ask) (?P<id>{_TASK_ID})\b")
_BARE_ID = re.compile(rf"(?<![0-9a-zA-Z/._-]){_TASK_ID}(?![0-9a-zA-Z/._-])")


def person_notice(text: str, task_id: str | None, titles: dict[str, str]) -> str:
    """A runner message as the window says it: this task is "this task", another by its
    title, and `piwork resume` of this task is the composer's Enter. A command the window
    cannot do (a higher limit, another host: ``piwork resume ID --max-turns N``) stays as
    it is, to copy into a terminal: there the id is what the command needs."""

    def resume(m: re.Match[str]) -> str:
        return "a new message to this task (Enter below)" if m.group("id") == task_id else m[0]

    def named(m: re.Match[str]) -> str:
        if m.group("id") == task_id:
            return f"{m.group('word')[0]}his task"
        title = titles.get(m.group("id"))
        return f"the task “{title[:60]}”" if title else m.group(0)

    text = _RESUME.sub(resume, text)
    text = _NAMED.sub(named, text)
    command = re.compile(r"`[^`]*`")
    # A bare id outside a command: this task, or the other task's title.
    out: list[str] = []
    last = 0
    for m in command.finditer(text):
        out.append(_bare_ids(text[last : m.start()], task_id, titles))
        out.append(m.group(0))
        last = m.end()
    out.append(_bare_ids(text[last:], task_id, titles))
    return _SENTENCE.sub(lambda m: m[1] + m[2][0].upper() + m[2][1:], "".join(out))


def _bare_ids(text: str, task_id: str | None, titles: dict[str, str]) -> str:
    def swap(m: re.Match[str]) -> str:
        if m.group(0) == task_id:
            return "this task"
        title = titles.get(m.group(0))
        return f"“{title[:60]}”" if title else m.group(0)

    return _BARE_ID.sub(swap, text)


VERDICT_WORDS = {"allow": "allowed", "ask": "asks you", "deny": "denied"}


def task_titles(paths: Any) -> dict[str, str]:
    """Task id -> title, for lines that name a task (the audit log): ids are not words."""
    from piwork.tasks import TaskStore

    store = TaskStore(paths.tasks)
    try:
        return {t.id: t.record.title for t in store.list()}
    finally:
        store.close()


def audit_line(e: dict[str, Any], titles: dict[str, str]) -> str:
    """One audit entry as a person reads it: when, which task (by its title), and the
    decision in the words the conversation uses (``permission_line``)."""
    when = str(e.get("ts") or e.get("time") or "").replace("T", " ")[:16]
    task = str(e.get("task") or "")
    name = titles.get(task) or ("a deleted task" if task else "no task")
    line = permission_line(
        {
            "action": e.get("action"),
            "tool": e.get("tool"),
            "target": e.get("target"),
            "decision": e.get("choice") or e.get("decision"),
            "by": e.get("decidedBy"),
        }
    )
    return f"{when}  “{name[:60]}”  {line or ''}"
