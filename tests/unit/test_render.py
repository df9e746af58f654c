"""The terminal renderer: what a person sees on stderr while a VM starts."""

from __future__ import annotations

import io

from piwork.cli.render import TerminalRenderer
from piwork.runner import EventKind, RunEvent


def test_a_restore_is_said_once_not_as_a_notice_and_a_boot_stage() -> None:
    out, err = io.StringIO(), io.StringIO()
    render = TerminalRenderer(out, err)
    render(RunEvent(EventKind.NOTICE, {"message": "restored in 0.3 s", "warm": True}, 0.3))
    render(RunEvent(EventKind.BOOT, {"stage": "restored", "seconds": 0.3}, 0.3))
    render(RunEvent(EventKind.BOOT, {"stage": "kernel", "seconds": 2.1}, 2.1))
    lines = err.getvalue().splitlines()
    assert [line for line in lines if "restored" in line] == ["piwork: restored in 0.3 s"]
    assert any("booting" in line and "2.1s" in line for line in lines)


def test_an_open_preview_prints_its_url_and_a_refused_one_says_why() -> None:
    out, err = io.StringIO(), io.StringIO()
    render = TerminalRenderer(out, err)
    url = "http://01234567-8000.localhost:41234/"
    render(RunEvent(EventKind.PREVIEW, {"port": 8000, "url": url, "state": "opened"}, 1.0))
    render(
        RunEvent(
            EventKind.PREVIEW,
            {"port": 3000, "url": None, "state": "refused", "reason": "no one to ask\x1b[2J"},
            1.0,
        )
    )
    render(RunEvent(EventKind.PREVIEW, {"port": 8000, "url": url, "state": "closed"}, 2.0))
    lines = err.getvalue().splitlines()
    assert lines[0] == f"piwork: preview of port 8000: {url}"
    assert "port 3000 not previewed (no one to ask" in lines[1] and "\x1b[2J" not in lines[1]
    assert lines[2] == "piwork: preview of port 8000 closed"
