"""The words of a permission prompt: the host-validated targets first, the guest's text second.

Everything in a permission request comes from the guest, but its targets have
been re-judged on the host (``validate_request`` / ``host_target``): paths are
normalized and either under the task's mounts or ``outside-scope``, domains
are validated host names, commands are bounded and printable. The question
and the command summary are free text the guest wrote. A forged request can
say "pip download … from pypi.org" while its single effect opens
``exfil.attacker.example`` (security review finding 10); a prompt that leads
with the guest's words gets "Allow once" for a domain the person never saw.

So every front end builds its prompt from these functions: the headline
names what will actually be allowed (paths, domains, the command for a shell
effect), and the guest's text follows, labelled as the agent's own words.
The terminal (``piwork.cli.render.permission_prompt_text``) and the app's
permission sheet (``piwork.gui.text.plain_request``) both use them.
"""

from __future__ import annotations

from collections.abc import Callable

from piwork.policy.request import PermissionRequest, clean_command, validate_request
from piwork.policy.rules import Action, Target
from piwork.textsafe import sanitize

MAX_HEADLINE_TARGETS = 6
MAX_TARGET_CHARS = 300

_SEVERITY = (
    Action.OUTSIDE_SCOPE,
    Action.DELETE,
    Action.MOVE,
    Action.PRIVATE_NETWORK,
    Action.NETWORK,
    Action.SHELL,
    Action.CONNECTOR,
    Action.WRITE,
    Action.READ,
)

_VERBS = {
    Action.READ: "read",
    Action.WRITE: "change or create",
    Action.DELETE: "delete",
    Action.MOVE: "move or rename",
    Action.OUTSIDE_SCOPE: "touch, outside the task's folders,",
    Action.NETWORK: "connect to",
    Action.PRIVATE_NETWORK: "reach",
    Action.SHELL: "run",
    Action.CONNECTOR: "use the tool",
}


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TARGET_CHARS else text[: MAX_TARGET_CHARS - 1] + "…"


def target_phrase(target: Target, shown_path: Callable[[str], str] | None = None) -> str:
    """``delete /mnt/work/build``, ``connect to pypi.org``, ``run `make```: one validated target.

    ``shown_path`` words a validated path as the front end's reader knows it (the app
    says ``build`` for ``/mnt/work/build``); the target itself is the host's."""
    t = target
    if t.action is Action.PRIVATE_NETWORK:
        # Only the host makes these targets (policy.request.HOST_ONLY_ACTIONS): the
        # reason names the address the egress proxy resolved.
        what = f"{t.domain or 'a host'}, which resolves to {t.reason or 'a private address'}"
    elif t.action is Action.NETWORK:
        what = t.domain or "a host it did not name"
    elif t.action is Action.SHELL:
        what = f"`{t.command}`" if t.command else "a command it did not show"
    elif t.action is Action.CONNECTOR:
        what = t.tool or "a tool it did not name"
    elif t.action is Action.OUTSIDE_SCOPE and t.path is None:
        what = "a path it did not name or that is not a plain path"
    else:
        shown = shown_path(t.path) if shown_path and t.path else t.path
        what = shown or "a path it did not name"
    return f"{_VERBS[t.action]} {sanitize(_clip(what), one_line=True)}"


def headline_targets(request: PermissionRequest) -> list[Target]:
    """The validated targets worth a headline: every one but reads (unless all are reads),
    most serious first, duplicates dropped."""
    targets = validate_request(request).targets
    notable = [t for t in targets if t.action is not Action.READ] or list(targets)
    seen: set[tuple[Action, str | None, str | None, str | None, str | None]] = set()
    out: list[Target] = []
    for t in sorted(notable, key=lambda t: _SEVERITY.index(t.action)):
        key = (t.action, t.path, t.domain, t.command if t.action is Action.SHELL else None, t.tool)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def headline(request: PermissionRequest, shown_path: Callable[[str], str] | None = None) -> str:
    """One line: what allowing this request actually lets the agent do."""
    targets = headline_targets(request)
    phrases = [target_phrase(t, shown_path) for t in targets[:MAX_HEADLINE_TARGETS]]
    if len(targets) > MAX_HEADLINE_TARGETS:
        phrases.append(f"and {len(targets) - MAX_HEADLINE_TARGETS} more")
    return "The agent wants to " + "; ".join(phrases)


def command_line(request: PermissionRequest) -> str | None:
    """``Command: …`` when the request carries a command that the headline does not
    already show as the target (the command is what runs, but not what it reaches)."""
    if request.command is None:
        return None
    shown = {t.command for t in headline_targets(request) if t.action is Action.SHELL}
    cmd = sanitize(_clip(request.command), one_line=True)
    if clean_command(request.command) in shown or not cmd:
        return None
    return f"Command: {cmd}"


def guest_note(request: PermissionRequest) -> str | None:
    """The question the guest wrote, labelled as unverified, or None when empty."""
    text = sanitize(request.question).strip()
    return f"The agent's own description (not checked): {text}" if text else None
