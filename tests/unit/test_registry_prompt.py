"""`piwork run`'s terminal prompt offers the package registries as one answer.

stdin is a real pseudo-terminal; the question comes from the real permission
bridge (the egress proxy's ask for pypi.org) and the answer lands in the real
policy file. The person sees each rule ``[r]`` stores before typing it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwork.cli import run_cmd
from piwork.config import Paths
from piwork.env.registries import registry_domains, registry_rules
from piwork.policy import PolicyStore, Scope
from piwork.policy.rules import TaskContext
from piwork.runner import RunRequest, TaskSession
from piwork.tasks import TaskStatus


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """stdin becomes a pty; returns the fd to type into."""
    master, slave = os.openpty()
    tty_in = os.fdopen(slave, "r", buffering=1)
    monkeypatch.setattr(sys, "stdin", tty_in)
    yield master
    tty_in.close()
    os.close(master)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "proj").mkdir()
    return tmp_path / "proj"


async def _ask(
    tmp_path: Path, folder: Path, terminal: int, lines: list[bytes], domain: str
) -> tuple[bool, Paths]:
    """The egress proxy asks about ``domain``; ``lines`` are typed at the prompt."""
    paths = Paths(data=tmp_path / "d", cache=tmp_path / "c", state=tmp_path / "s",
                  config=tmp_path / "cfg")  # fmt: skip
    console = run_cmd.TerminalConsole()
    session = TaskSession(RunRequest(prompt="x"), asker=run_cmd.TerminalAsker(console), paths=paths)
    task = session.store.create("installs")
    session.adopt(task)
    session.task = session.store.transition(task.id, TaskStatus.RUNNING)
    session.permissions.context = TaskContext(task_id=task.id, working_folder=folder)
    console.start()
    try:
        answer = asyncio.create_task(session.permissions.domain_policy(domain, 443))
        for line in lines:
            await asyncio.sleep(0.2)
            os.write(terminal, line + b"\n")
        allowed = await asyncio.wait_for(answer, 10)
    finally:
        console.close()
        session.store.close()
    return allowed, paths


async def test_r_saves_every_registry_rule_it_showed(
    terminal: int, tmp_path: Path, folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    allowed, paths = await _ask(tmp_path, folder, terminal, [b"r"], "pypi.org")
    assert allowed
    err = capsys.readouterr().err
    assert "connect to pypi.org" in err
    assert "[r] the package registries" in err
    assert "no `npm publish`, no uploads" in err  # what the answer allows, said plainly
    saved = PolicyStore(paths.policy_file).load()
    assert {r.pattern for r in saved} == set(registry_domains())
    assert all(r.scope == Scope.folder(folder) for r in saved)
    # Every rule it saved was on the screen before the answer, in words.
    shown = err.split("[n] deny >")[0]
    for rule in registry_rules(Scope.folder(folder)):
        assert rule.human() in shown


async def test_r_is_not_an_answer_for_another_host(
    terminal: int, tmp_path: Path, folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Typed anyway, ``r`` is ignored (asked again) and nothing is saved."""
    allowed, paths = await _ask(tmp_path, folder, terminal, [b"r", b"n"], "example.com")
    assert not allowed
    err = capsys.readouterr().err
    assert "package registries" not in err
    assert err.count("[n] deny >") == 2
    assert PolicyStore(paths.policy_file).load() == []
