"""Memory of the desktop app's process: idle, and with two tasks running at once.

    xvfb-run -a -s "-screen 0 1440x900x24" .venv/bin/python benchmarks/gui_memory.py

(or with ``QT_QPA_PLATFORM=offscreen``). The window is the real one, the tasks
are real (real runner, real QEMU, real pi; the scripted model server stands in
for the remote LLM and makes each task run ``sleep``). Figures are this
process's RSS and PSS from /proc/self/smaps_rollup (the QEMU children are not
counted: ``piwork bench`` measures them). Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def memory() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            out[f"{key} (MiB)"] = round(int(rest.split()[0]) / 1024, 1)
    return out


async def until(cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.2)


async def measure() -> dict[str, Any]:
    from piwork.config import get_paths
    from piwork.gui.prefs import Prefs
    from piwork.gui.window import MainWindow
    from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, bash

    paths = get_paths()
    paths.policy_file.parent.mkdir(parents=True, exist_ok=True)
    rule = {
        "id": "r-bench-shell",
        "action": "shell",
        "verdict": "allow",
        "scope": "global",
        "scopeValue": None,
        "pattern": None,
        "created": "2025-01-01T00:00:00+00:00",
    }
    paths.policy_file.write_text(json.dumps({"version": 1, "rules": [rule]}))
    steps = [ToolCalls([bash("sleep 40")]), Text("slept")]

    def script(req: Any) -> Any:
        i = req.assistant_turns_since_user
        return steps[i] if i < len(steps) else Text("done")

    result: dict[str, Any] = {}
    async with ScriptedModelServer(script, model_id="scripted") as server:
        provider = server.as_provider()
        win = MainWindow(paths=paths, prefs=Prefs(max_tasks=2, keep_warm_seconds=0))
        win.extra_run_args = {"extra_providers": (provider,)}
        win.model_pick.addItem("scripted", "scripted/scripted")
        win.model_pick.setCurrentIndex(win.model_pick.count() - 1)
        win.show()
        await asyncio.sleep(3.0)
        result["idle"] = memory()
        ctls = []
        for n in (1, 2):
            folder = Path(tempfile.mkdtemp(prefix=f"piwork-bench-{n}-"))
            win.new_task()
            win.new_folder = folder
            win.composer.setPlainText(f"task {n}: wait")
            win.send_btn.click()
            ctl = win.current()
            assert ctl is not None
            ctls.append(ctl)
        try:
            await until(
                lambda: all(
                    any("sleep" in r.arg and r.ok is None for r in win.conversation(c).tool_rows())
                    for c in ctls
                ),
                600,
            )
            await asyncio.sleep(2.0)
            result["two tasks running"] = memory()
            result["tasks live"] = sum(1 for c in ctls if c.busy)
        finally:
            await win.quit_cleanly(exit_app=False)
    return result


def main() -> int:
    home = tempfile.mkdtemp(prefix="piwork-gui-bench-")
    os.environ["PIWORK_HOME"] = home
    os.environ.setdefault("PIWORK_PACK_CACHE", str(Path.home() / ".cache" / "piwork"))
    from piwork.gui.app import make_app
    from piwork.gui.loop import new_loop

    app = make_app(["piwork"])
    loop = new_loop(app)
    asyncio.set_event_loop(loop)
    try:
        result = loop.run_until_complete(measure())
    finally:
        loop.close()
    result["platform"] = app.platformName()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
