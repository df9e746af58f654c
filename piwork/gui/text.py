"""Qt-free helpers the window uses: guest text sanitizing and the "Always" rule preview
(which only shows what the policy module derived: see ``always_rules``)."""

from __future__ import annotations

import dataclasses
import re
import stat
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from piwork import textsafe
from piwork.gui.words import person_paths
from piwork.policy import Action, Choice, PermissionRequest, Rule, describe_rules
from piwork.policy.rules import PATH_ACTIONS

MAX_GUEST_TEXT = 4000


def sanitize(text: object, *, limit: int = MAX_GUEST_TEXT, keep_newlines: bool = True) -> str:
    """Text from the guest made safe to show: no control or bidi-override characters, bounded.

    The guest is hostile: a file name or command may carry terminal escapes,
    right-to-left overrides that reverse what the person reads, or megabytes.
    A widget does not interpret escapes, so they are removed rather than shown
    (``textsafe``'s "strip" mode; the CLI uses its "escape" mode on the same
    set of characters).
    """
    return textsafe.sanitize(text, mode="strip", one_line=not keep_newlines, limit=limit)


def button_text(text: object, *, limit: int) -> str:
    """Guest text for a button's one line: sanitised, and every ``&`` doubled.

    Qt reads a single ``&`` in a button's text as a mnemonic marker: it is not
    shown and the next letter becomes an Alt shortcut. So ``make && make test``
    would read ``make & make test``, and a guest could plant shortcuts."""
    return sanitize(text, limit=limit, keep_newlines=False).replace("&", "&&")


def always_rules(request: PermissionRequest, choice: Choice) -> tuple[Rule, ...]:
    """Exactly the rules an "Always" answer (``choice``) would store.

    No derivation here: the runner fills ``request.proposals`` from the policy's
    own ``Decider.proposed_rules`` (the function ``record_answer`` stores from)
    before it asks, as the CLI's TerminalAsker shows them. Empty for "Allow
    once"/"Deny", and when nothing can be remembered for the request.
    """
    return tuple(request.proposals.get(choice, ())) if choice.persists else ()


def registry_rules_offered(request: PermissionRequest) -> tuple[Rule, ...]:
    """The rules "Allow the package registries" saves; empty when the host did not offer it
    (``piwork.env.registries.registry_offer``, attached by the runner like ``proposals``)."""
    return tuple(request.proposals.get(Choice.ALLOW_REGISTRIES, ()))


def shown_rule(rule: Rule) -> Rule:
    """``rule`` with its path pattern as the person knows it: ``/mnt/work/a.txt`` is
    ``a.txt`` in their folder, ``/mnt/outputs/x`` is ``outputs/x`` (``person_paths``).

    For display only: the policy stores the guest path (it is what requests carry), and
    the app never saves the copy. A pattern elsewhere (``/etc/hosts``) is left as it is.
    """
    pattern = rule.pattern
    m = _GUEST_PREFIX.match(pattern or "")
    if rule.action not in PATH_ACTIONS or pattern is None or m is None:
        return rule
    # Only the leading guest folder: the rest of the path is the person's own names.
    return dataclasses.replace(rule, pattern=person_paths(m.group(0)) + pattern[m.end() :])


_GUEST_PREFIX = re.compile(r"/mnt/(?:work|outputs)(?:/|\Z)")


def person_path(path: str) -> str:
    """A validated guest path as the person knows it: their folder itself is "your
    folder" (not "."), a path in it is relative to it, the outputs are ``outputs/…``;
    any other path (``/etc/hosts``) as it is."""
    if path == "/mnt/work":
        return "your folder"
    if path == "/mnt/outputs":
        return "the task's outputs"
    m = _GUEST_PREFIX.match(path)
    return person_paths(m.group(0)) + path[m.end() :] if m else path


def rule_words(rules: Sequence[Rule]) -> str:
    """What storing ``rules`` allows, in plain words only (``describe_rules``), paths in
    the person's folder relative to it: what the permission sheet shows."""
    return sanitize(describe_rules([shown_rule(r) for r in rules]), limit=600, keep_newlines=False)


def rule_syntax(rules: Sequence[Rule]) -> str:
    """The same rules exactly as ``piwork policy list`` prints them (the sheet's tooltip)."""
    exact = "; ".join(shown_rule(r).describe() for r in rules)
    return sanitize(exact, limit=600, keep_newlines=False)


def rule_text(rules: Sequence[Rule]) -> str:
    """What storing ``rules`` allows in plain words (``describe_rules``, as the CLI says it),
    then each rule as ``piwork policy list`` and Settings show it; paths in the person's
    folder shown relative to it (``shown_rule``)."""
    rules = [shown_rule(r) for r in rules]
    if not rules:
        return sanitize(describe_rules(rules), limit=400, keep_newlines=False)
    exact = "; ".join(r.describe() for r in rules)
    return (
        sanitize(describe_rules(rules), limit=600, keep_newlines=False)
        + "\n    rule: "
        + sanitize(exact, limit=600, keep_newlines=False)
    )


def plain_request(request: PermissionRequest) -> str:
    """What the agent wants, in plain words: the host-validated targets first
    (``piwork.policy.prompt.headline``: a forged request cannot put its own words
    there), then the command it runs. The guest's question is shown separately."""
    from piwork.policy.prompt import command_line, headline

    lines = [headline(request, person_path), command_line(request)]
    return sanitize("\n".join(line for line in lines if line), limit=900)


def replaced_files(request: PermissionRequest, folder: Path | None) -> list[str]:
    """Files in the person's folder that allowing ``request`` would replace: a move's
    destination (the last of its targets, as the gate lists ``mv``'s operands) that
    already exists, checked on the host, now, beneath the folder without following a
    link (``sharefs``). Paths relative to the folder, for the sheet's warning."""
    from piwork import sharefs

    if folder is None:
        return []
    moves = [t.path for t in request.targets if t.action is Action.MOVE and t.path]
    if len(moves) < 2:
        return []
    *sources, dest = moves
    m = _GUEST_PREFIX.match(dest)
    if m is None or not dest.startswith("/mnt/work"):
        return []
    rel = dest[m.end() :].strip("/")
    candidates = [rel] if rel else []
    try:
        st = sharefs.lstat_beneath(folder, rel) if rel else None
    except OSError:
        st = None
    if st is None or stat.S_ISDIR(st.st_mode):  # "mv a b dir/": each lands inside it
        candidates = [f"{rel}/{PurePosixPath(s).name}".lstrip("/") for s in sources]
    out = []
    for cand in candidates:
        try:
            st = sharefs.lstat_beneath(folder, cand)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            out.append(sanitize(cand, limit=200, keep_newlines=False))
    return out
