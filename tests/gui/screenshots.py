"""Render the app's main screens to PNG under a real X server (run it with ``xvfb-run``).

    xvfb-run -a -s "-screen 0 1440x900x24" \
        .venv/bin/python tests/gui/screenshots.py docs/screenshots

The window is the real one; the task states are driven through the same paths the
runner uses (``RunEvent``s into the task's event sink, a real ``PermissionRequest``
waiting in the Asker, real files in a real working folder). No VM is booted here: the
VM-backed behaviour is what tests/gui/test_gui_vm.py checks.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

SHOTS = ("setup", "running", "permission", "finished", "finished-files", "settings")


def main(out: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="piwork-shots-"))
    os.environ["PIWORK_HOME"] = str(home)
    os.environ["PIWORK_PACK_CACHE"] = str(home / "empty-pack-cache")  # a genuine first run
    import qasync

    from piwork.gui.app import make_app

    app = make_app(["piwork"])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    out.mkdir(parents=True, exist_ok=True)
    with loop:
        loop.run_until_complete(shoot(app, home, out))


async def settle(app: Any, secs: float = 0.4) -> None:
    await asyncio.sleep(secs)  # the qasync loop runs Qt meanwhile (no nested processEvents)


async def wait_for(cond: Any, timeout: float) -> bool:
    for _ in range(int(timeout / 0.1)):
        if cond():
            return True
        await asyncio.sleep(0.1)
    return bool(cond())


async def shoot(app: Any, home: Path, out: Path) -> None:
    from piwork.checkpoints import RunRecorder, repo_for
    from piwork.config import get_paths
    from piwork.gui.controller import PendingPermission, TaskController
    from piwork.gui.prefs import Prefs
    from piwork.gui.setup_screen import SetupScreen
    from piwork.gui.window import MainWindow
    from piwork.models.custom import add_provider
    from piwork.policy import (
        Action,
        AuditLog,
        Choice,
        Decider,
        PermissionRequest,
        PolicyStore,
        Target,
        TaskContext,
    )
    from piwork.runner import EventKind, RunEvent
    from piwork.tasks import TaskStore

    paths = get_paths()
    setup = SetupScreen(paths)
    setup.resize(900, 560)
    setup.show()
    await settle(app, 1.0)
    setup.grab().save(str(out / "setup.png"))
    setup.close()

    folder = home / "quarterly-report"
    folder.mkdir()
    (folder / "sales.csv").write_text(
        "region,q1,q2,q3\nNorth,120,135,160\nSouth,98,101,117\nEast,143,150,149\nWest,88,97,121\n"
    )
    (folder / "notes.md").write_text("# Notes\n\nNumbers from the finance export.\n")

    win = MainWindow(paths=paths, prefs=Prefs())
    win.resize(1360, 820)
    win.show()
    await settle(app)

    def feed(ctl: TaskController, kind: EventKind, t: float, **data: Any) -> None:
        ctl._sink(RunEvent(kind, data, t, ctl.task_id))

    # --- a finished task: a real task record and real checkpoints, taken by the
    # runner's own recorder turn by turn around the agent's edits.
    store = TaskStore(paths.tasks)
    try:
        record = store.create("Summarise the sales figures", folder)
    finally:
        store.close()
    recorder = RunRecorder(repo_for(record), lambda _e: None, turn_start_wait=0.01)

    async def turn() -> None:
        recorder.turn_started()
        await recorder.before_model_call()

    await recorder.start()
    await turn()  # turn 1 reads sales.csv
    await turn()  # turn 2 writes the summary
    done = TaskController(win.pool, title=record.record.title, folder=folder)
    win._add(done)
    done.task_id = record.id
    feed(
        done,
        EventKind.TASK,
        0.0,
        id=done.task_id,
        title=done.title,
        folder=str(folder),
        model="anthropic/claude-sonnet-4-5",
    )
    feed(done, EventKind.PROMPT, 0.1, message="Summarise sales.csv by region and write summary.md")
    feed(done, EventKind.STATUS, 0.2, status="running", reason=None)
    feed(done, EventKind.TOOL_START, 3.0, id="c1", name="read", arg="sales.csv")
    feed(
        done,
        EventKind.TOOL_END,
        3.4,
        id="c1",
        name="read",
        ok=True,
        text=(folder / "sales.csv").read_text(),
    )
    summary = (
        "# Sales summary\n\n| region | total | trend |\n|---|---|---|\n"
        "| North | 415 | ↑ |\n| South | 316 | ↑ |\n| East | 442 | → |\n| West | 306 | ↑ |\n"
    )
    (folder / "summary.md").write_text(summary)
    feed(done, EventKind.TOOL_START, 5.0, id="c2", name="write", arg="summary.md")
    feed(done, EventKind.TOOL_END, 5.1, id="c2", name="write", ok=True, text="wrote 164 bytes")
    await turn()  # turn 3 updates the notes
    (folder / "notes.md").write_text(
        "# Notes\n\nNumbers from the finance export (Q1 to Q3).\n\n"
        "- summary.md: totals and trend per region\n"
    )
    feed(done, EventKind.TOOL_START, 6.0, id="c3", name="edit", arg="notes.md")
    feed(done, EventKind.TOOL_END, 6.1, id="c3", name="edit", ok=True, text="1 edit")
    await turn()  # turn 4 answers
    await recorder.end()
    for chunk in (
        "I wrote **summary.md** and noted it in notes.md: East sold the most (442), ",
        "and every region except East grew each quarter.",
    ):
        feed(done, EventKind.TEXT, 7.0, delta=chunk)
    feed(done, EventKind.TEXT_END, 7.5, stop_reason="stop", error=None)
    feed(done, EventKind.USAGE, 7.5, tokens=18432, cost=0.0412, turns=4)
    feed(done, EventKind.STATUS, 7.6, status="stopped", reason="completed")
    feed(
        done,
        EventKind.DONE,
        7.6,
        status="stopped",
        reason="completed",
        message=None,
        tokens=18432,
        turns=4,
        timings={},
    )

    # --- a running task: boot stages, tool rows, Markdown streaming
    run = TaskController(win.pool, title="Fix the failing date parser test", folder=folder)
    win._add(run)
    run.task_id = "9b1e0c77a2d4"
    feed(
        run,
        EventKind.TASK,
        0.0,
        id=run.task_id,
        title=run.title,
        folder=str(folder),
        model="anthropic/claude-sonnet-4-5",
    )
    feed(
        run, EventKind.PROMPT, 0.1, message="The test for parse_date fails on 29 February. Fix it."
    )
    for stage, s in (("kernel", 2.1), ("init", 3.4), ("pi ready", 9.8)):
        feed(run, EventKind.BOOT, s, stage=stage, seconds=s)
    feed(run, EventKind.STATUS, 10.0, status="running", reason=None)
    feed(run, EventKind.TOOL_START, 11.0, id="r1", name="bash", arg="pytest -x tests/test_dates.py")
    feed(
        run,
        EventKind.TOOL_END,
        14.2,
        id="r1",
        name="bash",
        ok=False,
        text="FAILED tests/test_dates.py::test_leap_day - ValueError: day is out of range",
    )
    feed(run, EventKind.TOOL_START, 15.0, id="r2", name="read", arg="src/dates.py")
    feed(
        run, EventKind.TOOL_END, 15.2, id="r2", name="read", ok=True, text="def parse_date(s): ..."
    )
    md = (
        "The parser builds the date **before** checking the year, so `29 Feb` fails "
        "in non-leap *default* years. The fix:\n\n```python\ndef parse_date(text: str) -> date:\n"
        "    day, month, year = split(text)\n    return date(year, month, day)  # year first\n"
        "```\n\nNow running the tests again"
    )
    for i in range(0, len(md), 9):
        feed(run, EventKind.TEXT, 16.0, delta=md[i : i + 9])
    feed(run, EventKind.TOOL_START, 18.0, id="r3", name="bash", arg="pytest -x tests/")
    run.status = "running"
    run._job = asyncio.ensure_future(asyncio.sleep(3600))  # shown as live
    win.select(run)
    await settle(app, 1.0)
    win.grab().save(str(out / "running.png"))

    # --- a permission prompt with the exact rule "Always" would save
    req0 = PermissionRequest(
        request_id="p1",
        question="The agent wants to delete a file in the working folder: rm old-draft.docx",
        options=tuple(c.value for c in Choice),
        action=Action.DELETE,
        tool="bash",
        tool_call_id="r4",
        task_id=run.task_id,
        cwd="/mnt/work",
        command="rm old-draft.docx",
        paths=("/mnt/work/old-draft.docx",),
        targets=(
            Target(
                Action.DELETE, op="rm", path="/mnt/work/old-draft.docx", command="rm old-draft.docx"
            ),
        ),
        payload={},
    )
    # What the runner does before it asks: attach the policy's own proposals.
    ctx = TaskContext(task_id=run.task_id, working_folder=folder)
    req = replace(req0, proposals=Decider(PolicyStore(paths.policy_file)).proposals(req0, ctx))
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    run.permissions.append(PendingPermission(req, fut))
    run.permission_asked.emit(run.permissions[0])
    run.changed.emit()
    await settle(app, 0.8)
    win.grab().save(str(out / "permission.png"))
    run.permissions.clear()
    win._show_sheets()

    # --- finished task: each turn's changes and a diff (the Turns tab)
    win.select(done)
    for name, status in (("summary.md", "added"), ("notes.md", "modified")):
        win.context.note_change(name, status)
    ok = await wait_for(lambda: win.context.turns.topLevelItemCount() > 0, 30)
    assert ok, "the finished task's turns never loaded"
    win.context.tabs.setCurrentIndex(1)
    panel = win.context
    top = panel.turns.topLevelItem(0)
    notes = next(
        top.child(i) for i in range(top.childCount()) if "notes.md" in top.child(i).text(0)
    )
    panel.turns.setCurrentItem(notes)
    await settle(app, 0.8)
    win.grab().save(str(out / "finished.png"))
    # The Files tab: the changed files, live, with a preview (Markdown rendered).
    panel.tabs.setCurrentIndex(0)
    panel.files.setCurrentRow(1)
    await settle(app, 0.8)
    win.grab().save(str(out / "finished-files.png"))

    # --- settings with a saved rule
    # A rule saved the way the runner saves one (and audited), and a custom provider.
    shell = Target(Action.SHELL, op="bash", command="pytest -x tests/")
    Decider(PolicyStore(paths.policy_file), AuditLog(paths.audit_log)).record_answer(
        replace(
            req,
            request_id="p2",
            action=Action.SHELL,
            command="pytest -x tests/",
            paths=(),
            targets=(shell,),
        ),
        Choice.ALWAYS_FOLDER,
        TaskContext(task_id=run.task_id, working_folder=folder),
    )
    add_provider(
        "ollama",
        "http://localhost:11434/v1",
        ["qwen2.5-coder:14b", "llama3.1:8b"],
        path=paths.config / "providers.json",
    )
    win.open_settings()
    dlg = win.settings_dialog
    dlg.tabs.setCurrentIndex(1)
    dlg.refresh_policy()
    await settle(app, 0.6)
    dlg.grab().save(str(out / "settings-permissions.png"))
    dlg.tabs.setCurrentIndex(0)
    await settle(app, 0.4)
    dlg.grab().save(str(out / "settings.png"))
    dlg.reject()
    run._job.cancel()
    for c in win.tasks:
        c._job = None
    win.context.stop_watching()
    win._quitting = True
    win.close()
    await asyncio.sleep(0.2)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots"))
