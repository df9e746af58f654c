"""The app's memory over a long run of real tasks (issue 33): RSS every 30 s.

    xvfb-run -a -s "-screen 0 1440x900x24" sh -c \\
        'openbox & .venv/bin/python benchmarks/gui_memory_run.py --minutes 10'

The real window under a real X server with a window manager, real runner, QEMU and pi;
the scripted model server stands in for the remote LLM. The person's part is played
through the window: type a task, press Enter, answer the permission sheet, switch
between tasks, send follow-ups. Tasks run back to back (two at a time) for
``--minutes``; every 30 s one line of JSON: minute, this process's RSS and PSS (QEMU
children are not counted: ``piwork bench`` measures them), tasks done, steps seen.
The last line sums it up. Figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def memory() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            out[key.lower() + "_mib"] = round(int(rest.split()[0]) / 1024, 1)
    return out


async def run(minutes: float) -> dict[str, Any]:
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from piwork.config import get_paths
    from piwork.gui.prefs import Prefs
    from piwork.gui.window import MainWindow
    from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, bash
    from piwork.policy import Choice

    paths = get_paths()
    paragraph = "Reading the next part of the project and noting what I find. " * 4

    def script(req: Any) -> Any:
        i = req.assistant_turns_since_user
        if i < 3:
            return ToolCalls(
                [bash(f"ls -la; echo step {i} > step{i}.txt; sleep 2")], text=paragraph
            )
        return Text("Done: " + paragraph)

    end = time.monotonic() + minutes * 60
    samples: list[dict[str, Any]] = []
    done = 0
    async with ScriptedModelServer(script, model_id="scripted", chunk_delay=0.01) as server:
        win = MainWindow(paths=paths, prefs=Prefs(max_tasks=2, keep_warm_seconds=30), tray=False)
        win.extra_run_args = {"extra_providers": (server.as_provider(name="scripted"),)}
        win.model_pick.addItem("scripted", "scripted/scripted")
        win.resize(1280, 800)
        win.show()
        await asyncio.sleep(2)
        t0 = time.monotonic()
        samples.append({"minute": 0.0, **memory(), "tasks_done": 0})
        next_sample = t0 + 30
        n = 0
        try:
            while time.monotonic() < end:
                # Working or queued: a new task only once one of the two has ended.
                live = [t for t in win.tasks if t.state.can_stop]
                if len(live) < 2:
                    n += 1
                    folder = Path(tempfile.mkdtemp(prefix=f"piwork-mem-{n}-"))
                    win.new_task()
                    win.new_folder = folder
                    win.model_pick.setCurrentIndex(win.model_pick.findData("scripted/scripted"))
                    win.composer.setFocus()
                    QTest.keyClicks(win.composer, f"task {n}: look at the project")
                    QTest.keyClick(win.composer, Qt.Key.Key_Return)
                for t in win.tasks:  # answer what is asked, as a person would
                    if t.permissions and win.current() is not t:
                        win.select(t)
                    if win.current() is t and win.sheet is not None:
                        win.sheet.buttons[Choice.ALWAYS_FOLDER].click()
                done = sum(1 for t in win.tasks if t.label == "done")
                if time.monotonic() >= next_sample:
                    next_sample += 30
                    s = {
                        "minute": round((time.monotonic() - t0) / 60, 1),
                        **memory(),
                        "tasks_done": done,
                        "tasks_live": sum(1 for t in win.tasks if t.live),
                        "tasks_listed": len(win.tasks),
                    }
                    samples.append(s)
                    print(json.dumps(s), flush=True)
                await asyncio.sleep(0.5)
        finally:
            await win.quit_cleanly(exit_app=False)
    rss = [s["rss_mib"] for s in samples]
    return {
        "minutes": minutes,
        "tasks_started": n,
        "tasks_done": done,
        "rss_first_mib": rss[0],
        "rss_last_mib": rss[-1],
        "rss_max_mib": max(rss),
        "samples": len(samples),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    args = ap.parse_args()
    os.environ.setdefault("PIWORK_HOME", tempfile.mkdtemp(prefix="piwork-gui-mem-"))
    os.environ.setdefault("PIWORK_PACK_CACHE", str(Path.home() / ".cache" / "piwork"))
    from piwork.gui.app import make_app
    from piwork.gui.loop import new_loop

    app = make_app(["piwork"])
    loop = new_loop(app)
    asyncio.set_event_loop(loop)
    try:
        result = loop.run_until_complete(run(args.minutes))
    finally:
        loop.close()
    result["platform"] = app.platformName()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
