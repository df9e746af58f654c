"""The app's memory over a long run of real tasks (issue 33): RSS every 30 s.

    /work/coord/vmlock timeout 1200 xvfb-run -a -s "-screen 0 1440x900x24" sh -c \\
        'openbox & .venv/bin/python benchmarks/gui_memory_run.py --minutes 10'

The real window under a real X server with a window manager, real runner, QEMU and pi;
the scripted model server stands in for the remote LLM. The person's part is played
through the window, one task after another as a person works: type a task, press
Enter, answer the permission sheet if one opens (these commands stay in the task's
folder, which the built-in rules allow without asking), wait until the task has ended; send
the finished task a follow-up every other time (its VM is still warm); look back at an
earlier task in the rail; then start the next one. At most one task works at a time
(``max_tasks=1``), so the run holds one VM slot. A task that neither starts nor ends
within ``--task-timeout`` seconds ends the run with an error: the driver never piles
tasks up behind one that is stuck (its first version queued 83 behind two).

A sampler, apart from the person, prints one line of JSON every 30 s: minute, this
process's RSS and PSS (QEMU children are not counted: ``piwork bench`` measures them),
tasks ended so far. The last line sums it up. Figures are printed, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
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


async def run(minutes: float, task_timeout: float) -> dict[str, Any]:
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from piwork.config import get_paths
    from piwork.gui.controller import TaskController
    from piwork.gui.prefs import Prefs
    from piwork.gui.state import Phase
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

    t0 = time.monotonic()
    end = t0 + minutes * 60
    samples: list[dict[str, Any]] = []
    ended: Counter[str] = Counter()
    durations: list[float] = []
    counts = {"tasks_started": 0, "follow_ups": 0, "sheets_answered": 0}

    def sample() -> dict[str, Any]:
        s = {
            "minute": round((time.monotonic() - t0) / 60, 2),
            **memory(),
            "runs_ended": sum(ended.values()),
            "tasks_listed": len(win.tasks),
        }
        samples.append(s)
        print(json.dumps(s), flush=True)
        return s

    async def sampler() -> None:
        while True:
            await asyncio.sleep(30)
            sample()

    def type_and_enter(text: str) -> None:
        win.composer.setFocus()
        QTest.keyClicks(win.composer, text)
        QTest.keyClick(win.composer, Qt.Key.Key_Return)

    async def until_ended(task: TaskController, what: str) -> None:
        """Wait, as a person does, answering the permission sheet when it opens."""
        started = time.monotonic()
        while True:
            await asyncio.sleep(0.5)
            phase = task.state.phase
            if not task.state.busy and phase not in (Phase.QUEUED, Phase.NEW):
                break
            if win.current() is task and win.sheet is not None and win.sheet.isVisible():
                win.sheet.buttons[Choice.ALWAYS_FOLDER].click()
                counts["sheets_answered"] += 1
            if time.monotonic() - started > task_timeout:
                raise RuntimeError(f"{what} still {task.state.label} after {task_timeout:.0f} s")
        durations.append(round(time.monotonic() - started, 1))
        ended[task.state.label] += 1

    async with ScriptedModelServer(script, model_id="scripted", chunk_delay=0.01) as server:
        win = MainWindow(paths=paths, prefs=Prefs(max_tasks=1, keep_warm_seconds=30), tray=False)
        win.extra_run_args = {"extra_providers": (server.as_provider(name="scripted"),)}
        win.model_pick.addItem("scripted", "scripted/scripted")
        win.resize(1280, 800)
        win.show()
        await asyncio.sleep(2)
        t0 = time.monotonic()
        end = t0 + minutes * 60
        sample()
        ticker = asyncio.ensure_future(sampler())
        n = 0
        try:
            while time.monotonic() < end:
                n += 1
                counts["tasks_started"] = n
                before = len(win.tasks)
                win.new_task()
                win.new_folder = Path(tempfile.mkdtemp(prefix=f"piwork-mem-{n}-"))
                win.model_pick.setCurrentIndex(win.model_pick.findData("scripted/scripted"))
                type_and_enter(f"task {n}: look at the project")
                task = win.current()
                if task is None or len(win.tasks) != before + 1:
                    raise RuntimeError(f"Enter did not start task {n}")
                await until_ended(task, f"task {n}")
                if n % 2 == 0 and time.monotonic() < end:
                    type_and_enter("now write down what you found")
                    counts["follow_ups"] += 1
                    await until_ended(task, f"the follow-up to task {n}")
                if len(win.tasks) > 1:  # look back at an earlier task's history
                    win.select(win.tasks[n % (len(win.tasks) - 1)])
                    await asyncio.sleep(1.5)
        finally:
            ticker.cancel()
            sample()
            await win.quit_cleanly(exit_app=False)
    rss = [s["rss_mib"] for s in samples]
    per_minute = Counter(int(s["minute"]) for s in samples)
    return {
        "minutes": minutes,
        **counts,
        "runs_ended": dict(ended),
        "run_seconds_min_median_max": [
            min(durations, default=0),
            sorted(durations)[len(durations) // 2] if durations else 0,
            max(durations, default=0),
        ],
        "rss_first_mib": rss[0],
        "rss_peak_mib": max(rss),
        "rss_last_mib": rss[-1],
        "samples": len(samples),
        "samples_per_minute": [per_minute[m] for m in range(max(per_minute) + 1)],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--task-timeout", type=float, default=300.0)
    args = ap.parse_args()
    os.environ.setdefault("PIWORK_HOME", tempfile.mkdtemp(prefix="piwork-gui-mem-"))
    os.environ.setdefault("PIWORK_PACK_CACHE", str(Path.home() / ".cache" / "piwork"))
    from piwork.gui.app import make_app
    from piwork.gui.loop import new_loop

    app = make_app(["piwork"])
    loop = new_loop(app)
    asyncio.set_event_loop(loop)
    try:
        result = loop.run_until_complete(run(args.minutes, args.task_timeout))
    finally:
        loop.close()
    result["platform"] = app.platformName()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
