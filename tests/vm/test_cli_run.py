"""`piwork run` as a person or a script runs it: a real VM, the real pi, the demo model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vm

PIWORK = [sys.executable, "-m", "piwork.cli.main"]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PIWORK, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ},
    )


def test_headless_run_over_tcp_transport_writes_into_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "README.md").write_text("# A small project\n")
    (folder / "notes.txt").write_text("buy milk\n")
    proc = run_cli(
        "run", "Summarise this folder", "--folder", str(folder), "--model", "demo",
        "--json", "--transport", "tcp", "--yes",  # the demo's rename asks: allow it
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "task" and kinds[-1] == "done"
    assert events[-1]["reason"] == "completed"
    assert "ready" in kinds and kinds.count("tool_end") == 5
    assert all(e["ok"] for e in events if e["event"] == "tool_end")
    notices = " ".join(e.get("message", "") for e in events if e["event"] == "notice")
    assert "demo model" in notices and "accelerator: " in notices
    demo = (folder / "PIWORK_DEMO.md").read_text()
    assert "README.md" in demo and "demo model" in demo
    # The rename of notes.txt was asked (a move of the person's file); --yes allowed it.
    assert (folder / "notes.md").read_text() == "buy milk\n"
    assert not (folder / "notes.txt").exists()

    task_id = events[0]["task"]
    shown = run_cli("tasks", "show", task_id, "--json")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    record = record.get("task", record)
    assert record["status"] == "stopped" and record["stop"]["reason"] == "completed"
    transcript = Path(os.environ["PIWORK_HOME"], "data", "tasks", task_id, "transcript.jsonl")
    kinds_logged = {json.loads(line)["kind"] for line in transcript.read_text().splitlines()}
    assert {"task_created", "status", "prompt", "pi", "supervisor"} <= kinds_logged


def test_a_missing_folder_is_refused_before_anything_boots(tmp_path: Path) -> None:
    proc = run_cli("run", "hello", "--folder", str(tmp_path / "nope"), "--model", "demo")
    assert proc.returncode != 0
    assert "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ctrl_c_during_boot_cancels_cleanly(tmp_path: Path) -> None:
    """Interrupting start-up stops at once: no traceback, no QEMU left, task cancelled."""
    import signal
    import time

    folder = tmp_path / "project"
    folder.mkdir()
    proc = subprocess.Popen(
        [*PIWORK, "run", "hello", "--folder", str(folder), "--model", "demo", "--json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    task_id = None
    for line in proc.stdout:
        event = json.loads(line)
        task_id = task_id or event.get("task")
        if event["event"] == "boot":
            break
    qemu = subprocess.run(
        ["pgrep", "-P", str(proc.pid), "-f", "qemu-system"], capture_output=True, text=True
    ).stdout.split()
    assert len(qemu) == 1, qemu
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "never retrieved" not in err, err[-2000:]
    deadline = time.monotonic() + 10
    while Path(f"/proc/{qemu[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{qemu[0]}").exists(), "QEMU outlived the interrupted run"
    assert task_id is not None
    shown = run_cli("tasks", "show", task_id, "--json")
    record = json.loads(shown.stdout)
    record = record.get("task", record)
    assert record["status"] == "stopped" and record["stop"]["reason"] == "cancelled"
