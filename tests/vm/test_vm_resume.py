"""Tasks survive crashes: kill -9 QEMU or kill -9 piwork mid-task, then `piwork resume`.

Both tests drive the real CLI (`python -m piwork.cli.main`) as subprocesses,
each with its own ``PIWORK_HOME`` whose ``providers.json`` points at the
scripted model server running in this (pytest) process. Two boots per test.

The resume time on this machine is printed (run with ``-s`` to see it)::

    .venv/bin/pytest tests/vm/test_vm_resume.py -s -k qemu
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from piwork.agent import GUEST_SESSION
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash
from piwork.runner import DEFAULT_RESUME_PROMPT
from tests.helpers.cli import Cli, make_home, run_cli, task_dir
from tests.helpers.procs import alive, qemu_children

pytestmark = pytest.mark.vm

RESUMED_MARK = DEFAULT_RESUME_PROMPT[:40]
SLEEP_CMD = "sleep 600; echo never"


# --------------------------------------------------------------------------- helpers


def crash_script(first_prompt: str) -> Callable[[ChatRequest], Step]:
    """First run: a file, then a long tool (the crash lands there). Resume: check, finish."""

    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        if RESUMED_MARK in req.last_user_text:
            if i == 0:
                return ToolCalls([bash("cat one.txt")])
            return Text("resumed and finished")
        if first_prompt in req.last_user_text:
            if i == 0:
                return ToolCalls([bash("echo one > one.txt")])
            if i == 1:
                return ToolCalls([bash(SLEEP_CMD)])
        return Text(f"unexpected request at turn {i}: {req.last_user_text[:80]!r}")

    return choose


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def tool_started(command: str) -> Callable[[dict[str, Any]], bool]:
    return lambda ev: ev["event"] == "tool_start" and command in str(ev.get("arg"))


def transcript(env: dict[str, str], task_id: str) -> list[dict[str, Any]]:
    lines = (task_dir(env, task_id) / "transcript.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def check_transcript(records: list[dict[str, Any]]) -> None:
    """Contiguous seqs; no pi line recorded twice; the crash run's lines are all there."""
    seqs = [r["seq"] for r in records]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"seq not contiguous: {seqs}"
    keyed = [
        json.dumps(r["data"], sort_keys=True)
        for r in records
        if r["kind"] == "pi"
        and r["data"].get("type")
        in ("message_end", "tool_execution_start", "tool_execution_end", "response")
    ]
    dupes = {k[:200] for k in keyed if keyed.count(k) > 1}
    assert not dupes, f"pi lines recorded twice: {dupes}"

    def tool_events(kind: str, command: str) -> list[dict[str, Any]]:
        return [
            r
            for r in records
            if r["kind"] == "pi"
            and r["data"].get("type") == kind
            and command in json.dumps(r["data"].get("args", {}))
        ]

    assert len(tool_events("tool_execution_start", "echo one > one.txt")) == 1
    assert len(tool_events("tool_execution_start", SLEEP_CMD)) == 1
    assert len(tool_events("tool_execution_start", "cat one.txt")) == 1


def check_session_file(env: dict[str, str], task_id: str, first_prompt: str) -> None:
    """One pi session, continued: one header, unique entry ids, the first prompt once."""
    entries = [
        json.loads(line)
        for line in (task_dir(env, task_id) / "state" / "session.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert [e["type"] for e in entries].count("session") == 1
    ids = [e["id"] for e in entries if "id" in e and e["type"] != "session"]
    assert len(ids) == len(set(ids)), "pi session entries duplicated"
    users = [
        e
        for e in entries
        if e["type"] == "message" and e["message"]["role"] == "user"
        and first_prompt in json.dumps(e["message"]["content"])
    ]  # fmt: skip
    assert len(users) == 1


def check_model_saw_history(server: ScriptedModelServer, first_prompt: str, since: int) -> None:
    """The first request after the resume carries the crashed run's messages."""
    chats = [ChatRequest(r.body, r.headers) for r in server.chat_requests[since:]]
    resumed = [c for c in chats if RESUMED_MARK in c.last_user_text]
    assert resumed, "the model was never asked after the resume"
    first = resumed[0]
    user_texts = [json.dumps(m.get("content")) for m in first.messages if m.get("role") == "user"]
    assert sum(first_prompt in t for t in user_texts) == 1, user_texts
    calls = {
        x.arguments.get("command"): x.result for x in first.tool_exchanges(since_last_user=False)
    }
    assert "echo one > one.txt" in calls, calls
    assert SLEEP_CMD in calls, calls  # the call that was running when the VM died
    final = resumed[-1].tool_exchanges()
    assert [x.arguments.get("command") for x in final] == ["cat one.txt"]
    assert final[0].result is not None and "one" in final[0].result


async def resume(env: dict[str, str], log: Path, task_id: str) -> tuple[int, Cli, float]:
    started = time.monotonic()
    cli = await Cli.start(env, log, "resume", task_id, "--yes", "--json")
    try:
        code = await cli.finish(timeout=420)
    finally:
        cli.kill()
    return code, cli, time.monotonic() - started


def report_resume(label: str, cli: Cli, wall: float) -> None:
    ready = next(e for e in cli.events if e["event"] == "ready")
    done = cli.events[-1]
    print(
        f"\n[resume timing] {label}: pi ready (session loaded, {ready['messages']} messages) "
        f"{ready['seconds']:.1f}s after `piwork resume` started the task; "
        f"resume prompt answered after {done['timings'].get('prompt_to_idle', 0):.1f}s; "
        f"whole `piwork resume` command {wall:.1f}s wall"
    )


# --------------------------------------------------------------------------- tests


@dataclass
class CrashRun:
    """A `piwork run` whose scripted model has it sleeping in the guest, ready to crash."""

    cli: Cli
    task_id: str
    env: dict[str, str]
    folder: Path
    chats_before: int
    qemu_pid: int


async def start_crash_run(
    tmp_path: Path, model_server: ScriptedModelServer, prompt: str
) -> CrashRun:
    model_server.script = crash_script(prompt)
    chats_before = len(model_server.chat_requests)
    env = make_home(tmp_path, model_server)
    folder = tmp_path / "project"
    folder.mkdir()
    cli = await Cli.start(
        env, tmp_path / "run.log", "run", prompt, "--folder", str(folder),
        "--model", "scripted/scripted", "--yes", "--json",
    )  # fmt: skip
    try:
        task_id = (await cli.wait_event(lambda e: e["event"] == "task", 60))["id"]
        await cli.wait_event(tool_started(SLEEP_CMD), 300)
        await asyncio.sleep(3.0)  # the gate lets `sleep` through: it runs now
        qemu = qemu_children(cli.proc.pid)
        assert len(qemu) == 1, f"expected one QEMU child of piwork, found {qemu}"
    except BaseException:
        cli.kill()
        raise
    return CrashRun(cli, task_id, env, folder, chats_before, qemu[0])


async def test_kill_9_qemu_mid_task_then_resume_continues_the_same_session(
    tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    prompt = "Write one.txt, then wait (qemu crash test)"
    run = await start_crash_run(tmp_path, model_server, prompt)
    cli, task_id, env, folder = run.cli, run.task_id, run.env, run.folder
    chats_before = run.chats_before
    try:
        os.kill(run.qemu_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        code = await cli.finish(timeout=60)  # a runner that hangs here fails the test
        noticed = time.monotonic() - killed_at
    finally:
        cli.kill()
    assert (folder / "one.txt").read_text() == "one\n"
    done = cli.events[-1]
    assert done["event"] == "done", cli.events[-5:]
    assert done["reason"] == "error" and code == 1, (done, cli.stderr)
    assert "VM stopped unexpectedly" in done["message"] and "piwork resume" in done["message"]
    print(f"\n[qemu kill] piwork noticed the dead VM and ended the run in {noticed:.1f}s")

    rc, out, err = await run_cli(env, "tasks", "show", task_id, "--json")
    assert rc == 0, err
    record = json.loads(out)["task"]
    assert record["status"] == "stopped" and record["stop"]["reason"] == "error"

    code, resumed, wall = await resume(env, tmp_path / "resume.log", task_id)
    assert code == 0, (resumed.events[-3:], resumed.stderr)
    ready = next(e for e in resumed.events if e["event"] == "ready")
    assert ready["session"] == GUEST_SESSION and ready["messages"] >= 4
    assert resumed.events[-1]["reason"] == "completed"
    texts = "".join(e.get("delta", "") for e in resumed.events if e["event"] == "text")
    assert "resumed and finished" in texts
    report_resume("after kill -9 of QEMU", resumed, wall)

    check_model_saw_history(model_server, prompt, chats_before)
    records = transcript(env, task_id)
    check_transcript(records)
    check_session_file(env, task_id, prompt)
    rc, out, err = await run_cli(env, "tasks", "show", task_id, "--json")
    record = json.loads(out)["task"]
    assert record["status"] == "stopped" and record["stop"]["reason"] == "completed"


async def test_kill_9_piwork_mid_task_shows_interrupted_and_resumes(
    tmp_path: Path, model_server: ScriptedModelServer
) -> None:
    prompt = "Write one.txt, then wait (host crash test)"
    run = await start_crash_run(tmp_path, model_server, prompt)
    cli, task_id, env, chats_before = run.cli, run.task_id, run.env, run.chats_before
    try:
        os.kill(cli.proc.pid, signal.SIGKILL)
        await asyncio.wait_for(cli.proc.wait(), 10)
    finally:
        cli.kill()
    assert await asyncio.to_thread(wait_gone, run.qemu_pid, 15), "QEMU outlived the piwork process"
    raw = json.loads((task_dir(env, task_id) / "task.json").read_text())
    assert raw["status"] == "running"  # what the dead process left behind

    rc, out, err = await run_cli(env, "tasks", "list", "--json")
    assert rc == 0, err
    listed = {t["id"]: t for t in json.loads(out)}
    assert listed[task_id]["status"] == "interrupted", listed
    assert listed[task_id]["interruptedFrom"] == "running"

    code, resumed, wall = await resume(env, tmp_path / "resume.log", task_id)
    assert code == 0, (resumed.events[-3:], resumed.stderr)
    assert resumed.events[-1]["reason"] == "completed"
    ready = next(e for e in resumed.events if e["event"] == "ready")
    assert ready["messages"] >= 4
    # The resume restored the saved VM (issue 8) rather than booting.
    modes = [e for e in resumed.events if e["event"] == "notice" and "warm" in e]
    assert [e["warm"] for e in modes] == [True], modes
    report_resume("after kill -9 of piwork", resumed, wall)

    check_model_saw_history(model_server, prompt, chats_before)
    records = transcript(env, task_id)
    check_transcript(records)
    statuses = [r["data"] for r in records if r["kind"] == "status"]
    assert any(s.get("to") == "interrupted" for s in statuses), statuses
    check_session_file(env, task_id, prompt)
    rc, out, err = await run_cli(env, "tasks", "list", "--all", "--json")
    listed = {t["id"]: t for t in json.loads(out)}
    assert listed[task_id]["status"] == "stopped"
    assert listed[task_id]["stop"]["reason"] == "completed"
