"""The prompt's headline is the host-validated target; the guest's words come second.

Security review finding 10: a forged gate request whose question and command
say ``pip download … --index-url https://pypi.org/simple`` but whose single
effect is ``network exfil.attacker.example`` was shown to the person as the
pypi text, and "Allow once" opened the hidden domain. The terminal prompt and
the app's permission sheet now lead with what the host validated.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from piwork.cli.render import permission_prompt_text
from piwork.gui.text import plain_request
from piwork.policy.decider import Decider
from piwork.policy.prompt import command_line, guest_note, headline
from piwork.policy.request import PermissionRequest
from piwork.policy.rules import TaskContext
from tests.helpers.policy import forged

CTX = TaskContext(task_id="t-1", working_folder=Path("/home/u/proj"))
PYPI = "pip download requests --index-url https://pypi.org/simple"


def exfil() -> PermissionRequest:
    return forged(
        {"action": "network", "op": "network", "domain": "exfil.attacker.example", "command": PYPI},
        question=f"The agent wants to use the network.\nCommand: {PYPI}\n- network: pypi.org",
        command=PYPI,
    )


@pytest.fixture
def decider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Decider:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    return Decider()


def test_the_forged_pypi_request_is_headlined_with_the_real_domain(decider: Decider) -> None:
    req = exfil()
    req = replace(req, proposals=decider.proposals(req, CTX))
    text = permission_prompt_text(req, color=False)
    first = text.strip().splitlines()[0]
    assert first == "The agent wants to connect to exfil.attacker.example"
    # the guest's words are still there, below and labelled
    rest = text.strip().splitlines()[1:]
    assert any(line.strip() == f"Command: {PYPI}" for line in rest)
    assert any("(not checked)" in line and "use the network" in line for line in rest)
    assert "pypi.org" not in first
    sheet = plain_request(req).splitlines()
    assert sheet[0] == "The agent wants to connect to exfil.attacker.example"
    assert sheet[1:] == [f"Command: {PYPI}"]


def test_a_forged_target_the_host_rejects_is_headlined_as_the_hosts_judgement() -> None:
    # a "read" of a path outside the mounts is outside-scope on the host
    req = forged({"action": "read", "op": "read", "path": "/etc/shadow"}, question="Read a.txt?")
    assert headline(req) == "The agent wants to touch, outside the task's folders, /etc/shadow"
    # a malformed domain is an unknown host, never the guest's text
    bad = forged({"action": "network", "op": "network", "domain": "*.example.com"})
    assert headline(bad) == "The agent wants to connect to a host it did not name"


def test_every_notable_target_is_in_the_headline_most_serious_first() -> None:
    req = forged(
        {"action": "write", "op": "write", "path": "/mnt/work/out.txt"},
        {"action": "read", "op": "read", "path": "/mnt/work/a.txt"},
        {"action": "delete", "op": "delete", "path": "/mnt/work/build"},
        {"action": "shell", "op": "exec", "command": "make  all"},
        command="make all && rm -r build > out.txt",
    )
    assert headline(req) == (
        "The agent wants to delete /mnt/work/build; run `make all`; "
        "change or create /mnt/work/out.txt"
    )
    assert command_line(req) == "Command: make all && rm -r build > out.txt"
    only = forged({"action": "shell", "op": "exec", "command": "npm test"}, command="npm test")
    assert headline(only) == "The agent wants to run `npm test`"
    assert command_line(only) is None, "the command is already the headline"


def test_guest_text_in_the_prompt_is_inert() -> None:
    req = forged(
        {"action": "delete", "op": "delete", "path": "/mnt/work/x"},
        question="ok\x1b[2J\u202e",
        command="rm x\x1b]52;c;ZXZpbA==\x07",
    )
    text = permission_prompt_text(req, color=False) + plain_request(req)
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert (
        guest_note(forged({"action": "delete", "op": "delete", "path": "/mnt/work/x"}, question=""))
        is None
    )
