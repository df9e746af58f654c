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
