"""Fast GUI tests (no VM): the pieces of the window with real Qt widgets, offscreen."""

from __future__ import annotations

import asyncio
import dataclasses
import html
import json
import os
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QTextFormat
from pytestqt.qtbot import QtBot

from piwork.config import Paths
from piwork.gui.context import ContextPanel
from piwork.gui.controller import TaskController
from piwork.gui.history import load_history
from piwork.gui.prefs import Prefs, model_choices
from piwork.gui.state import status_label
from piwork.gui.text import always_rules, plain_request, sanitize, shown_rule
from piwork.gui.watch import relative_beneath
from piwork.gui.widgets import Composer, MessageView, PermissionSheet, QuestionBar, ToolRow
from piwork.policy import (
    Action,
    AuditLog,
    Choice,
    Decider,
    PermissionRequest,
    PolicyStore,
    Rule,
    Scope,
    TaskContext,
    Verdict,
)
from piwork.run.pool import Pool
from piwork.tasks import TaskStore
from tests.helpers.gui import (
    FakeRun,
    activate,
    button,
    message_box,
    permission_request,
    press,
    rail_menu,
    say,
    shown,
    until,
)

# ----------------------------------------------------------------------------- text


def test_sanitize_strips_control_and_bidi_characters_and_bounds_length() -> None:
    evil = "rm \x1b[31mred\x07 a\u202etxt.exe\u200b\r\nnext" + "x" * 10_000
    out = sanitize(evil, limit=50)
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\u200b" not in out and "\r" not in out
    assert out.startswith("rm [31mred atxt.exe\nnext") and len(out) == 50
    assert "\n" not in sanitize("a\nb", keep_newlines=False)


@pytest.mark.parametrize("choice", [Choice.ALWAYS_FOLDER, Choice.ALWAYS_EVERYWHERE])
@pytest.mark.parametrize(
    "req",
    [
        permission_request(Action.DELETE, "/mnt/work/victim.txt", "rm victim.txt"),
        permission_request(Action.SHELL, None, "make test"),
        permission_request(Action.OUTSIDE_SCOPE, "/etc/hosts", "echo x > /etc/hosts"),
    ],
)
def test_the_sheet_shows_exactly_the_rule_that_always_saves(
    qtbot: QtBot, tmp_path: Path, req: PermissionRequest, choice: Choice
) -> None:
    policy = tmp_path / "policy.json"
    folder = tmp_path / "work"
    ctx = TaskContext(task_id="t1", working_folder=folder)
    decider = Decider(PolicyStore(policy), AuditLog(tmp_path / "audit.jsonl"))
    # The runner attaches the policy's own proposals before it asks a front end.
    req = dataclasses.replace(req, proposals=decider.proposals(req, ctx))
    sheet = PermissionSheet(
        "x",
        "",
        str(folder),
        always_rules(req, Choice.ALWAYS_FOLDER),
        always_rules(req, Choice.ALWAYS_EVERYWHERE),
    )
    qtbot.addWidget(sheet)
    decider.record_answer(req, choice, ctx)
    saved = PolicyStore(policy).load()
    assert [r.describe() for r in always_rules(req, choice)] == [r.describe() for r in saved]
    assert saved
    label = "this folder" if choice is Choice.ALWAYS_FOLDER else "everywhere"
    [line] = [ln for ln in sheet.rule_label.text().split("\n“") if label in ln.split(":")[0]]
    tip = sheet.rule_label.toolTip()
    for r in saved:  # as stored, with a path in the folder shown relative to it
        shown = shown_rule(r)
        assert shown.human() in line and html.escape(shown.describe()) in tip
    assert "/mnt/work" not in line and "/mnt/work" not in tip


def test_allow_once_and_deny_save_no_rule_preview(tmp_path: Path) -> None:
    req = permission_request(Action.DELETE, "/mnt/work/x", "rm x")
    ctx = TaskContext(task_id="t", working_folder=None)
    req = dataclasses.replace(
        req, proposals=Decider(PolicyStore(tmp_path / "p")).proposals(req, ctx)
    )
    for c in (Choice.ALLOW_ONCE, Choice.DENY):
        assert always_rules(req, c) == ()
    assert "delete" in plain_request(req) and "rm x" in plain_request(req)


# ----------------------------------------------------------------------------- widgets


def test_permission_sheet_enter_denies_and_never_always(qtbot: QtBot) -> None:
    folder_rule = Rule(Action.DELETE, Verdict.ALLOW, Scope.folder(Path("/f")), pattern="x")
    everywhere = Rule(Action.DELETE, Verdict.ALLOW, Scope.global_(), pattern="x")
    sheet = PermissionSheet("wants to delete x", "q", "/f", [folder_rule], [everywhere])
    qtbot.addWidget(sheet)
    got: list[Any] = []
    sheet.answered.connect(got.append)
    sheet.show()
    # The sheet says it in words; the exact rules are its tooltip.
    assert "allow delete x (folder:/f)" not in sheet.rule_label.text()
    assert "allow delete x (folder:/f)" in sheet.rule_label.toolTip()
    assert "allow delete x (global)" in sheet.rule_label.toolTip()
    for b in (Choice.ALWAYS_FOLDER, Choice.ALWAYS_EVERYWHERE):
        assert not sheet.buttons[b].isDefault() and not sheet.buttons[b].autoDefault()
        sheet.buttons[b].setFocus()
        qtbot.keyClick(sheet, Qt.Key.Key_Return)
    sheet.buttons[Choice.ALLOW_ONCE].setFocus()
    qtbot.keyClick(sheet, Qt.Key.Key_Return)
    assert got == [Choice.DENY, Choice.DENY, Choice.ALLOW_ONCE]
    sheet.buttons[Choice.ALWAYS_FOLDER].click()
    assert got[-1] is Choice.ALWAYS_FOLDER


def test_a_request_that_cannot_be_remembered_disables_always(qtbot: QtBot) -> None:
    sheet = PermissionSheet("x", "", None, [], [])
    qtbot.addWidget(sheet)
    assert not sheet.buttons[Choice.ALWAYS_FOLDER].isEnabled()
    assert sheet.buttons[Choice.DENY].isEnabled()


def test_streamed_markdown_is_throttled_rendered_and_code_highlighted(qtbot: QtBot) -> None:
    view = MessageView("agent")
    qtbot.addWidget(view)
    view.show()
    text = "# Title\n\nSome **bold** text.\n\n```python\ndef f():\n    return 1\n```\n"
    text += "word " * 10_000  # ~50 KB
    for i in range(0, len(text), 7):
        view.append(text[i : i + 7])
    # Until the last words are on screen.
    qtbot.waitUntil(
        lambda: view.body.document().toPlainText().rstrip().endswith("word word"), timeout=5000
    )
    deltas = len(range(0, len(text), 7))
    assert view.renders <= 3 < deltas
    doc = view.body.document()
    plain = doc.toPlainText()
    assert "Title" in plain and "**" not in plain and "```" not in plain
    code = [
        doc.findBlockByNumber(i)
        for i in range(doc.blockCount())
        if doc.findBlockByNumber(i).blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence)
    ]
    assert code and code[0].text().startswith("def f")
    # pygments coloured the keyword: the layout carries extra formats on that block.
    assert code[0].layout().formats()


def test_composer_enter_sends_alt_enter_queues_shift_enter_newlines(qtbot: QtBot) -> None:
    c = Composer()
    qtbot.addWidget(c)
    sent: list[str] = []
    queued: list[str] = []
    c.send.connect(sent.append)
    c.queue_follow_up.connect(queued.append)
    c.setPlainText("hello")
    qtbot.keyClick(c, Qt.Key.Key_Return)
    qtbot.keyClick(c, Qt.Key.Key_Return, Qt.KeyboardModifier.AltModifier)
    qtbot.keyClick(c, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert sent == ["hello"] and queued == ["hello"]
    assert c.toPlainText().count("\n") == 1


def test_question_bar_select_options_are_buttons(qtbot: QtBot) -> None:
    bar = QuestionBar("select", "Which colour?", None, ["red", "blue\x1b[0m"])
    qtbot.addWidget(bar)
    got: list[Any] = []
    bar.answered.connect(got.append)
    assert [b.text() for b in bar.option_buttons] == ["red", "blue[0m"]
    bar.option_buttons[1].click()
    assert got == ["blue\x1b[0m"]  # the answer is the option as pi sent it


def test_an_ampersand_in_guest_text_is_shown_and_plants_no_shortcut(qtbot: QtBot) -> None:
    """Qt takes a lone '&' in a button for a mnemonic: 'make && make test' would read
    'make & make test', and '&Deny' would give the guest's button Alt+D."""
    row = ToolRow("t1", "bash", "make && make test")
    qtbot.addWidget(row)
    shown = row.head.text().replace("&&", "&")  # what Qt draws
    assert "make && make test" in shown
    assert "&" not in row.head.text().replace("&&", "")  # no single '&': no mnemonic
    bar = QuestionBar("select", "Which?", None, ["&Deny"])
    qtbot.addWidget(bar)
    assert bar.option_buttons[0].text() == "&&Deny"


# ----------------------------------------------------------------------------- context panel


def test_the_file_piwork_puts_in_place_is_not_a_change_of_its_own(tmp_path: Path) -> None:
    """Applying a change set writes ``.NAME.piwork-XXXXXXXX`` and renames it over NAME:
    "Files changed" lists NAME, never the name it passed through (seen in a screenshot)."""
    (tmp_path / "sub").mkdir()
    for rel in (".PIWORK_DEMO.md.piwork-2f5b6334", "sub/.a.txt.piwork-0123abcd"):
        (tmp_path / rel).write_text("x")
        assert relative_beneath(tmp_path, str(tmp_path / rel)) is None
        (tmp_path / rel).unlink()
        assert relative_beneath(tmp_path, str(tmp_path / rel)) is None
    for rel in (".env", "notes.piwork-1234", ".x.piwork-12345678.md"):
        assert relative_beneath(tmp_path, str(tmp_path / rel)) == rel


def test_context_panel_never_follows_a_link_out_of_the_folder(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    root = tmp_path / "work"
    (root / "sub").mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    (root / "link.txt").symlink_to(secret)
    (root / "sub-link").symlink_to(tmp_path)
    (root / "ok.md").write_text("# Heading\n\n*hi*")
    assert relative_beneath(root, str(root / "link.txt")) is None
    assert relative_beneath(root, str(secret)) is None
    assert relative_beneath(root, str(root / "ok.md")) == "ok.md"
    panel = ContextPanel()
    qtbot.addWidget(panel)
    panel.root = root
    qloop.run_until_complete(panel.preview_file("link.txt"))
    assert "host secret" not in panel.preview_text.toPlainText()
    qloop.run_until_complete(panel.preview_file("sub-link/secret.txt"))
    assert "host secret" not in panel.preview_text.toPlainText()
    qloop.run_until_complete(panel.preview_file("ok.md"))
    assert panel.preview_text.toPlainText().startswith("Heading")


def test_context_panel_previews_csv_images_and_html_as_source(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    root = tmp_path / "work"
    root.mkdir()
    (root / "t.csv").write_text("name,n\nalpha,1\nbeta,2\n")
    (root / "p.html").write_text("<b>bold</b><script>x()</script>")
    img = QImage(8, 8, QImage.Format.Format_RGB32)
    img.fill(Qt.GlobalColor.red)
    img.save(str(root / "i.png"))
    panel = ContextPanel()
    qtbot.addWidget(panel)
    panel.root = root
    qloop.run_until_complete(panel.preview_file("t.csv"))
    t = panel.preview_table
    assert panel.preview.currentWidget() is t
    assert (t.rowCount(), t.columnCount()) == (2, 2)
    assert t.horizontalHeaderItem(0).text() == "name" and t.item(1, 0).text() == "beta"
    qloop.run_until_complete(panel.preview_file("p.html"))
    assert panel.preview_text.toPlainText() == "<b>bold</b><script>x()</script>"
    qloop.run_until_complete(panel.preview_file("i.png"))
    assert panel.preview.currentWidget() is panel.preview_image
    assert not panel.preview_image.pixmap().isNull()


def test_changed_files_show_new_files_and_not_links(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    root = tmp_path / "work"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    other = tmp_path / "other-task"
    other.mkdir()
    panel = ContextPanel()
    qtbot.addWidget(panel)
    seen: dict[str, str] = {}
    shown: list[str] = []

    async def go() -> None:
        panel.watch("t1", root, None)
        panel.watch("t2", other, None)
        panel.show_task("t1", root, None)
        await asyncio.sleep(0.8)
        (root / "new.txt").write_text("x")
        (other / "theirs.txt").write_text("z")
        (root / "planted").symlink_to(outside / "target")
        for _ in range(100):
            if "new.txt" in panel.changed:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.6)
        seen.update(panel.changed)
        panel.show_task("t2", other, None)  # the other task's changes were kept for it
        shown.extend(panel.files.item(i).text() for i in range(panel.files.count()))
        panel.stop_watching()

    qloop.run_until_complete(go())
    assert seen.get("new.txt") == "added"
    assert "planted" not in seen and "theirs.txt" not in seen
    assert shown == ["A  theirs.txt"]


# ----------------------------------------------------------------------------- history, rail


def test_history_replays_a_transcript(tmp_path: Path) -> None:
    path = tmp_path / "transcript.jsonl"
    recs: list[tuple[str, Any]] = [
        ("prompt", {"message": "do it"}),
        (
            "pi",
            {
                "type": "tool_execution_start",
                "toolCallId": "c1",
                "toolName": "bash",
                "args": {"command": "ls"},
            },
        ),
        (
            "pi",
            {
                "type": "tool_execution_end",
                "toolCallId": "c1",
                "toolName": "bash",
                "result": {"content": [{"type": "text", "text": "a.txt"}]},
                "isError": False,
            },
        ),
        (
            "pi",
            {
                "type": "message_end",
                "message": {"role": "assistant", "content": [{"type": "text", "text": "**done**"}]},
            },
        ),
        ("steer", {"message": "faster"}),
    ]
    path.write_text(
        "".join(
            json.dumps({"seq": i + 1, "t": "2026-01-01T00:00:00Z", "kind": k, "data": d}) + "\n"
            for i, (k, d) in enumerate(recs)
        )
    )
    calls: list[tuple[Any, ...]] = []

    class Sink:
        def user(self, text: str, mode: str | None = None) -> None:
            calls.append(("user", text, mode))

        def text(self, delta: str) -> None:
            calls.append(("text", delta))

        def text_end(self) -> None:
            calls.append(("end",))

        def tool_start(self, call_id: str, name: str, arg: str) -> None:
            calls.append(("tool", call_id, name, arg))

        def tool_end(
            self, call_id: str, name: str, ok: bool, text: str, seconds: float | None = None
        ) -> None:
            calls.append(("tool_end", call_id, ok, text))

        def deny(self, call_id: str) -> None:
            calls.append(("deny", call_id))

        def interrupt(self) -> None:
            pass

        def notice(self, text: str, kind: str = "notice") -> None:
            calls.append(("notice", text))

    assert load_history(path, Sink()) == 5
    assert calls == [
        ("user", "do it", None),
        ("tool", "c1", "bash", "ls"),
        ("tool_end", "c1", True, "a.txt"),
        ("text", "**done**"),
        ("end",),
        ("user", "faster", "steer"),
    ]


def _window(qtbot: QtBot, paths: Paths) -> Any:
    from piwork.gui.window import MainWindow

    win = MainWindow(paths=paths, prefs=Prefs.load(paths))
    qtbot.addWidget(win)
    return win


def test_rail_lists_tasks_renames_archives_and_deletes(
    qtbot: QtBot,
    qloop: asyncio.AbstractEventLoop,
    gui_paths: Paths,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from PySide6.QtWidgets import QInputDialog

    store = TaskStore(gui_paths.tasks)
    ids = [store.create(f"task {i}", None).id for i in range(3)]
    store.close()
    win = _window(qtbot, gui_paths)
    activate(win)
    assert [c.task_id for c in win.tasks] == ids[::-1]  # newest first
    assert "new" in win.rail.item(0).text()
    qtbot.keyClick(win.composer, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    assert win.current() is win.tasks[2]
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("renamed\x1b task", True))
    rail_menu(win, 0, "Rename…")
    store = TaskStore(gui_paths.tasks)
    assert store.get(ids[2]).record.title == "renamed\x1b task"
    store.close()
    assert "\x1b" not in win.rail.item(0).text()
    # Archive asks first (issue 33 item 14): Cancel keeps the task.
    rail_menu(win, 0, "Archive…")
    press(message_box("Archive the task?"), "Cancel")
    assert ids[2] in [c.task_id for c in win.tasks]
    rail_menu(win, 0, "Archive…")
    assert "Settings → Archived" in message_box("Archive the task?").text()
    press(message_box("Archive the task?"), "Archive")
    assert ids[2] not in [c.task_id for c in win.tasks]
    assert ids[2] in Prefs.load(gui_paths).archived
    rail_menu(win, 0, "Delete…")
    press(message_box("Delete the task?"), "Delete")
    store = TaskStore(gui_paths.tasks)
    assert [t.id for t in store.list()] == [ids[0], ids[2]]
    store.close()
    # A fresh window keeps the archived one out of the rail.
    win2 = _window(qtbot, gui_paths)
    activate(win2)
    assert [c.task_id for c in win2.tasks] == [ids[0]]
    qtbot.keyClick(win2.composer, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert win2.current() is None and win2.send_btn.text() == "Send"
    # ... and Settings → Archived brings it back, by its title.
    win2.open_settings()
    dlg = win2.settings_dialog
    dlg.tabs.setCurrentIndex(dlg.tabs.indexOf(dlg.archived.parentWidget()))
    assert [dlg.archived.item(i).text() for i in range(dlg.archived.count())] == ["renamed task"]
    dlg.archived.setCurrentRow(0)
    button(dlg, "Bring back").click()
    assert [c.task_id for c in win2.tasks] == [ids[2], ids[0]]
    assert win2.current() is win2.tasks[0] and ids[2] not in Prefs.load(gui_paths).archived
    dlg.reject()


def test_a_notification_is_sent_while_the_window_is_not_focused(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    from piwork.gui.window import MainWindow

    async def work(run: FakeRun, prompt: str) -> None:
        await run.release.wait()

    win = MainWindow(paths=gui_paths, prefs=Prefs(keep_warm_seconds=0), tray=False)
    qtbot.addWidget(win)
    win.model.session_factory = FakeRun.factory(work)

    async def scenario() -> None:
        await shown(win)
        say(win, "a long job")
        ctl = win.current()
        assert ctl is not None
        await until(lambda: ctl.session is not None, 10, "the task runs")
        win.hide()  # the person is elsewhere when it finishes
        ctl.session.release.set()  # type: ignore[union-attr]
        await until(lambda: win.notifications, 10, "a notification")

    qloop.run_until_complete(scenario())
    assert win.notifications == ["done"]


def test_status_labels_and_pool_limit(qloop: asyncio.AbstractEventLoop) -> None:
    assert status_label("stopped", "error") == "failed"
    assert status_label("stopped", "cancelled") == "stopped by you"
    assert status_label("interrupted", None) == "interrupted"
    # Stored as working, yet not run by this window: another piwork holds it.
    assert status_label("waiting_permission", None) == "open in another piwork"
    pool = Pool(1)
    a, b = TaskController(pool), TaskController(pool)
    pool.track(a)
    assert not pool.has_slot(b) and pool.has_slot(a)


def test_settings_show_default_model_rules_and_never_a_key(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths, tmp_path: Path
) -> None:
    from piwork.gui.settings import SettingsDialog
    from piwork.models.custom import add_provider
    from piwork.policy import Rule, Scope, Verdict

    add_provider(
        "local", "http://localhost:11434/v1", ["qwen"], path=gui_paths.config / "providers.json"
    )
    PolicyStore(gui_paths.policy_file).add(
        Rule(Action.SHELL, Verdict.ALLOW, Scope.folder(tmp_path), pattern="make")
    )
    prefs = Prefs.load(gui_paths)
    dlg = SettingsDialog(gui_paths, prefs)
    qtbot.addWidget(dlg)
    assert "local/qwen" in [r for r, _ in model_choices(gui_paths)]
    assert "demo" in dlg.default_pick.currentText() and "not a real" in dlg.default_note.text()
    dlg.default_pick.setCurrentIndex(dlg.default_pick.findData("local/qwen"))
    from piwork.models.defaults import default_model

    assert default_model(gui_paths.settings_file) == "local/qwen"
    assert any("allow running the command `make`" in t for t in dlg.rule_texts())
    dlg.tabs.setCurrentIndex(1)  # Permissions
    dlg.rules.setCurrentCell(0, 0)
    button(dlg, "Delete selected rule").click()
    assert PolicyStore(gui_paths.policy_file).load() == []
    assert dlg.key_field.echoMode().name == "Password"


def test_models_cli_add_rm_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from piwork.cli.main import main

    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    assert main(["models", "add", "ollama", "http://localhost:11434/v1", "llama3", "qwen"]) == 0
    doc = json.loads((tmp_path / "home/config/providers.json").read_text())
    assert [m["id"] for m in doc["providers"]["ollama"]["models"]] == ["llama3", "qwen"]
    assert main(["models", "default", "ollama/qwen"]) == 0
    assert main(["models", "default", "nope/x"]) == 1
    from piwork.models.defaults import default_model

    assert default_model() == "ollama/qwen"
    assert main(["models", "add", "piwork-demo", "http://x/v1", "m"]) == 1  # reserved name
    assert main(["models", "rm", "ollama"]) == 0
    assert main(["models", "rm", "ollama"]) == 1
    assert os.path.exists(tmp_path / "home/config/providers.json")


def test_the_sheets_rules_box_is_as_tall_as_its_lines_and_long_ones_scroll(
    qtbot: QtBot, tmp_path: Path
) -> None:
    """Two short rules sat in the middle of a ~70 px box of empty space (the scroll area
    kept room for a scroll bar); many rules still scroll inside 130 px."""
    from piwork.gui.widgets import FitScroll
    from piwork.policy import Action, Rule, Scope, Verdict

    def sheet_for(patterns: list[str], width: int = 900) -> PermissionSheet:
        rules = [Rule(Action.NETWORK, Verdict.ALLOW, Scope.global_(), pattern=p) for p in patterns]
        sheet = PermissionSheet("x", "", str(tmp_path), rules[:1], rules)
        qtbot.addWidget(sheet)
        sheet.resize(width, 400)
        sheet.show()
        qtbot.waitExposed(sheet)
        sheet.resize(width, sheet.sizeHint().height())  # as the window's layout sizes it
        qtbot.wait(50)
        return sheet

    short = sheet_for(["pypi.org"])
    box = short.findChild(FitScroll)
    assert box is not None
    lines = short.rule_label.heightForWidth(box.viewport().width())
    assert box.height() <= lines + 4, (box.height(), lines)
    assert not box.verticalScrollBar().isVisible()
    long = sheet_for([f"host{i}.example.org" for i in range(40)], width=420)
    box = long.findChild(FitScroll)
    assert box is not None and box.height() == 130
    assert box.verticalScrollBar().maximum() > 0  # the rest scrolls into view


def test_a_long_model_name_does_not_widen_the_window(
    qtbot: QtBot, qloop: asyncio.AbstractEventLoop, gui_paths: Paths
) -> None:
    """The model picker was as wide as its longest name (the window at least ~1160 px,
    more with a long custom one); it is sized for ~24 characters, the list shows all."""
    from piwork.gui.window import MainWindow

    win = MainWindow(paths=gui_paths, prefs=Prefs(), tray=False)
    qtbot.addWidget(win)
    name = "a-provider/" + "very-long-model-name-" * 5
    win.model_pick.addItem(name, "x/y")
    win.show()
    qtbot.waitExposed(win)
    pick = win.model_pick
    assert pick.minimumSizeHint().width() < pick.fontMetrics().horizontalAdvance(name) / 2
