"""The terminal console of `piwork run`: controls in every mode, questions in turn.

stdin is a real pseudo-terminal here; the task session is a stand-in that
records which controls reached it (the console is what is under test).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from piwork.cli import run_cmd
from piwork.runner import Outcome, RunRequest


class FakeSession:
    """Stands in for TaskSession: counts controls; the run ends when told to stop."""

    last: FakeSession | None = None

    def __init__(self, req: RunRequest, sink: Any, asker: Any, **kwargs: Any) -> None:
        self.calls: list[str] = []
        self.paused = False
        self.agent = object()
        self._stopped = asyncio.Event()
        FakeSession.last = self

    async def __aenter__(self) -> FakeSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def run_prompt(self, text: str) -> Outcome:
        await asyncio.wait_for(self._stopped.wait(), 10)
        return Outcome("t1", "stopped", "cancelled", "stopped by the person")

    async def pause_vm(self) -> None:
        self.calls.append("pause")
        self.paused = True

    async def resume_vm(self) -> None:
        self.calls.append("continue")
        self.paused = False

    async def steer(self, text: str) -> None:
        self.calls.append(f"steer:{text}")

    async def follow_up(self, text: str) -> None:
        self.calls.append(f"follow:{text}")

    async def stop(self, message: str = "") -> None:
        self.calls.append("stop")
        self._stopped.set()


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """stdin becomes a pty; returns the fd to type into."""
    master, slave = os.openpty()
    tty_in = os.fdopen(slave, "r", buffering=1)
    monkeypatch.setattr(sys, "stdin", tty_in)
    monkeypatch.setattr(run_cmd, "_interactive", lambda: True)
    monkeypatch.setattr(run_cmd, "TaskSession", FakeSession)
    yield master
    tty_in.close()
    os.close(master)


def _args(**over: Any) -> argparse.Namespace:
    base = dict(json=False, yes=False, policy=None)
    base.update(over)
    return argparse.Namespace(**base)


async def _drive(master: int, args: argparse.Namespace, lines: list[str]) -> FakeSession:
    run = asyncio.create_task(run_cmd._run(args, RunRequest(prompt="x"), "x"))
    await asyncio.sleep(0.2)
    for line in lines:
        os.write(master, line.encode() + b"\n")
        await asyncio.sleep(0.15)
    code = await asyncio.wait_for(run, 10)
    assert code == 130
    session = FakeSession.last
    assert session is not None
    return session


@pytest.mark.parametrize("mode", [{"yes": True}, {}, {"json": True}, {"yes": True, "json": True}])
async def test_every_control_works_in_every_terminal_mode(
    terminal: int, mode: dict[str, bool]
) -> None:
    lines = ["/pause", "/continue", "go left", "/follow then right", "/stop"]
    session = await _drive(terminal, _args(**mode), lines)
    assert session.calls == ["pause", "continue", "steer:go left", "follow:then right", "stop"]


async def test_a_line_that_cannot_be_acted_on_says_why(
    terminal: int, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["/continue", "/pause", "/pause", "steer while frozen", "/follow", "/nope", "/stop"]
    session = await _drive(terminal, _args(yes=True), lines)
    assert session.calls == ["pause", "stop"]
    err = capsys.readouterr().err
    for why in ("not paused", "already paused", "/continue first", "/follow needs", "commands:"):
        assert why in err, (why, err)


async def test_overlapping_questions_are_asked_in_turn_and_each_answered_once(
    terminal: int,
) -> None:
    console = run_cmd.TerminalConsole()
    asker = run_cmd.TerminalAsker(console)
    console.start()
    try:
        first = asyncio.create_task(asker.question("input", "first?", None, None))
        second = asyncio.create_task(asker.question("confirm", "second?", None, None))
        await asyncio.sleep(0.1)
        os.write(terminal, b"answer one\n")
        await asyncio.sleep(0.1)
        os.write(terminal, b"y\n")
        assert await asyncio.wait_for(first, 3) == "answer one"
        assert await asyncio.wait_for(second, 3) is True
    finally:
        console.close()


async def test_a_question_cancelled_by_a_stop_gives_the_terminal_to_the_next(
    terminal: int,
) -> None:
    console = run_cmd.TerminalConsole()
    asker = run_cmd.TerminalAsker(console)
    console.start()
    try:
        first = asyncio.create_task(asker.question("input", "first?", None, None))
        second = asyncio.create_task(asker.question("input", "second?", None, None))
        await asyncio.sleep(0.1)
        first.cancel()  # pi's own dialog timeout, or /stop cancelled it
        await asyncio.sleep(0.1)
        os.write(terminal, b"for the second\n")
        assert await asyncio.wait_for(second, 3) == "for the second"
    finally:
        console.close()


async def test_a_preview_question_takes_its_turn_and_shows_what_each_answer_stores(
    terminal: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    from piwork.policy.rules import TaskContext
    from piwork.preview import PreviewChoice
    from piwork.preview.policy import question_for

    console = run_cmd.TerminalConsole()
    asker = run_cmd.TerminalAsker(console)
    q = question_for(8000, TaskContext(task_id="0123456789ab", working_folder=Path("/srv/x")))
    console.start()
    try:
        answer = asyncio.create_task(asker.preview(q))
        await asyncio.sleep(0.1)
        os.write(terminal, b"maybe\n")  # not an answer: asked again
        await asyncio.sleep(0.1)
        os.write(terminal, b"a\n")
        assert await asyncio.wait_for(answer, 3) is PreviewChoice.FOLDER
    finally:
        console.close()
    err = capsys.readouterr().err
    assert "port 8000" in err and "in tasks on /srv/x" in err and "in task 0123456789ab" in err
