"""Turning runner events into terminal output (human) or JSON lines (scripts)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import orjson

from piwork.env.registries import WHAT_IT_ALLOWS
from piwork.policy.request import Choice, PermissionRequest
from piwork.runner import RunEvent
from piwork.textsafe import sanitize

BOOT_LABELS = {
    "init": "kernel up",
    "modules": "drivers",
    "mounts": "shares",
    "network": "network",
    "supervisor": "supervisor",
}


def _one_line(text: str | None, width: int = 90) -> str:
    if not text:
        return ""
    line = sanitize(" ".join(text.split()), one_line=True)
    return line if len(line) <= width else line[: width - 1] + "…"


class JsonRenderer:
    """One JSON object per line on stdout, for scripts."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def __call__(self, ev: RunEvent) -> None:
        self.out.write(orjson.dumps(ev.to_json(), default=str).decode() + "\n")
        self.out.flush()


class TerminalRenderer:
    """Assistant text on stdout as it streams; progress and tool steps around it."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.color = self.out.isatty()
        self._mid_line = False  # assistant text left the cursor mid-line
        self._boot_parts: list[str] = []
        self._tools: dict[str, tuple[str, str]] = {}

    def _style(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def _line(self, text: str, *, err: bool = False) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False
        stream = self.err if err else self.out
        stream.write(text + "\n")
        stream.flush()

    def __call__(self, ev: RunEvent) -> None:
        handler = getattr(self, f"_on_{ev.kind.value}", None)
        if handler is not None:
            handler(ev.data, ev)

    def _on_task(self, d: dict[str, Any], ev: RunEvent) -> None:
        verb = "resuming" if d.get("resumed") else "task"
        folder = f" in {d['folder']}" if d.get("folder") else ""
        self._line(self._style(f"piwork: {verb} {d['id']} “{d['title']}”{folder}", "2"), err=True)

    def _on_notice(self, d: dict[str, Any], ev: RunEvent) -> None:
        self._line(self._style(f"piwork: {sanitize(d['message'])}", "2"), err=True)

    def _on_boot(self, d: dict[str, Any], ev: RunEvent) -> None:
        if d["stage"] == "restored":
            return  # the "restored in X s" notice already said it
        label = BOOT_LABELS.get(d["stage"], d["stage"])
        self._line(self._style(f"piwork: booting… {label} ({d['seconds']:.1f}s)", "2"), err=True)

    def _on_ready(self, d: dict[str, Any], ev: RunEvent) -> None:
        self._line(self._style(f"piwork: agent ready in {d['seconds']:.1f}s", "2"), err=True)

    def _on_prompt(self, d: dict[str, Any], ev: RunEvent) -> None:
        mode = d.get("mode")
        if mode:
            self._line(self._style(f"» ({mode}) {_one_line(d['message'])}", "36"), err=True)

    def _on_text(self, d: dict[str, Any], ev: RunEvent) -> None:
        self.out.write(sanitize(d["delta"]))
        self.out.flush()
        self._mid_line = not d["delta"].endswith("\n")

    def _on_text_end(self, d: dict[str, Any], ev: RunEvent) -> None:
        if self._mid_line:
            self.out.write("\n")
            self.out.flush()
            self._mid_line = False
        if d.get("stop_reason") == "error" and d.get("error"):
            self._line(self._style(f"model error: {sanitize(d['error'])}", "31"), err=True)

    def _on_tool_start(self, d: dict[str, Any], ev: RunEvent) -> None:
        self._tools[d["id"]] = (d["name"], _one_line(d.get("arg"), 70))

    def _on_tool_end(self, d: dict[str, Any], ev: RunEvent) -> None:
        name, arg = self._tools.pop(d["id"], (d["name"], ""))
        if d["ok"]:
            status = self._style("ok", "32")
        else:
            status = self._style("error", "31") + ": " + _one_line(d.get("text"), 80)
        self._line(f"  ▸ {self._style(sanitize(name, one_line=True), '1')} {arg}  {status}")

    def _on_permission(self, d: dict[str, Any], ev: RunEvent) -> None:
        if d["decision"] == "ask":
            return  # the asker shows the question itself
        who = {
            "rule": "by policy",
            "person": "by you",
            "no-terminal": "no terminal to ask",
            "assume-yes": "--yes",
            "cancelled": "the task stopped first",
        }.get(d.get("by") or "", d.get("by") or "")
        color = "32" if d["decision"] not in ("Deny", "cancelled") else "33"
        action, decision = sanitize(d["action"], one_line=True), sanitize(d["decision"])
        text = f"  ⚑ {action}: {_one_line(d['target'], 60)} — {decision} ({sanitize(who)})"
        self._line(self._style(text, color), err=True)

    def _on_preview(self, d: dict[str, Any], ev: RunEvent) -> None:
        port = d.get("port")
        if d.get("state") == "opened":
            url = sanitize(str(d.get("url")), one_line=True)
            self._line(self._style(f"piwork: preview of port {port}: {url}", "1;36"), err=True)
        elif d.get("state") == "refused":
            why = sanitize(str(d.get("reason") or ""), one_line=True)
            self._line(self._style(f"piwork: port {port} not previewed ({why})", "2"), err=True)
        elif d.get("state") == "closed":
            self._line(self._style(f"piwork: preview of port {port} closed", "2"), err=True)

    def _on_error(self, d: dict[str, Any], ev: RunEvent) -> None:
        self._line(self._style(f"piwork: error: {sanitize(d['message'])}", "31"), err=True)

    def _on_done(self, d: dict[str, Any], ev: RunEvent) -> None:
        reason = d.get("reason")
        took = f"{ev.elapsed:.1f}s"
        stats = f"{d.get('turns', 0)} turns, {d.get('tokens', 0)} tokens"
        if reason == "completed":
            text = self._style(f"✓ completed in {took} ({stats}; task {ev.task_id})", "32")
        else:
            msg = f": {sanitize(d['message'])}" if d.get("message") else ""
            text = self._style(f"✗ {reason}{msg} (after {took}; task {ev.task_id})", "31")
        self._line(text, err=True)


REGISTRIES_LABEL = "[r] the package registries (Debian, PyPI, npm: apt, pip, npm)"

ALWAYS_LABELS = {
    Choice.ALWAYS_FOLDER: "[a] always in this folder",
    Choice.ALWAYS_EVERYWHERE: "[e] always everywhere",
}


def permission_prompt_text(request: PermissionRequest, *, color: bool = True) -> str:
    """What the terminal shows before asking: the host-validated targets as the
    headline (``piwork.policy.prompt``), the command and the guest's own
    (sanitized) question below it, then for each "Always" choice exactly the
    rule(s) it would store, derived by the host (``request.proposals``, see
    ``Decider.proposed_rules``)."""
    from piwork.policy.decider import describe_rules
    from piwork.policy.prompt import command_line, guest_note, headline

    bold = ("\x1b[1m", "\x1b[0m") if color else ("", "")
    lines = [f"\n{bold[0]}{headline(request)}{bold[1]}"]
    extras = (command_line(request), guest_note(request))
    lines += ["  " + extra.replace("\n", "\n    ") for extra in extras if extra]
    if request.proposals:
        for choice, label in ALWAYS_LABELS.items():
            rules = request.proposals.get(choice, ())
            lines.append(f"  {label} stores: {sanitize(describe_rules(rules), one_line=True)}")
    registries = request.proposals.get(Choice.ALLOW_REGISTRIES, ())
    if registries:
        lines.append(f"  {REGISTRIES_LABEL} stores {len(registries)} rules:")
        lines += [f"      {sanitize(r.human(), one_line=True)}" for r in registries]
        lines.append(f"      {WHAT_IT_ALLOWS}")
    return "\n".join(lines)


def permission_keys_line(request: PermissionRequest) -> str:
    """The answer keys; ``[r]`` only when the host offered the package registries."""
    registries = "  [r] the package registries" if registry_offered(request) else ""
    return (
        "  [y] allow once  [a] always in this folder  [e] always everywhere"
        f"{registries}  [n] deny > "
    )


def registry_offered(request: PermissionRequest) -> bool:
    return bool(request.proposals.get(Choice.ALLOW_REGISTRIES))


def renderer_for(json_mode: bool) -> JsonRenderer | TerminalRenderer:
    return JsonRenderer() if json_mode else TerminalRenderer()
