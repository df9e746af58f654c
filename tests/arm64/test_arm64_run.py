"""`piwork run` on the arm64 pack: the real pi in an arm64 guest runs the demo task end to
end (its move asks and is allowed), under qemu-system-aarch64 (TCG on an x86 host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from piwork import arch
from piwork.pack.manifest import Manifest
from tests.helpers.figures import report

pytestmark = [pytest.mark.vm, pytest.mark.timeout(3600)]


def test_the_demo_task_runs_end_to_end_in_an_arm64_vm(
    arm64_pack: tuple[Path, Manifest], tmp_path: Path
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "README.md").write_text("# A small project\n")
    (folder / "notes.txt").write_text("buy milk\n")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "piwork.cli.main", "run", "Summarise this folder",
         "--folder", str(folder), "--model", "demo", "--json", "--yes"],
        capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL,
        env={**os.environ, arch.ENV_VAR: "arm64"},
    )  # fmt: skip
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "task" and kinds[-1] == "done" and events[-1]["reason"] == "completed"
    assert kinds.count("tool_end") == 5 and all(e["ok"] for e in events if e["event"] == "tool_end")
    notices = " ".join(e.get("message", "") for e in events if e["event"] == "notice")
    assert "demo model" in notices
    if arch.host() is not arch.ARM64:
        assert "accelerator: tcg (an aarch64 guest on this" in notices, notices
    # The demo's last step renames notes.txt: the permission prompt, answered by --yes.
    demo = (folder / "PIWORK_DEMO.md").read_text()
    assert "README.md" in demo and "demo model" in demo
    assert (folder / "notes.md").is_file() and not (folder / "notes.txt").exists()
    ready = next(e for e in events if e["event"] == "ready")
    report(
        f"arm64 demo task ({arm64_pack[1].pack_id}, cold boot): pi ready after "
        f"{ready['seconds']:.1f}s, whole `piwork run` {wall:.1f}s"
    )
