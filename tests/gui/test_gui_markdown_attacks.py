"""The agent's Markdown is inert (SECURITY-REVIEW.md finding 9, issue 17 item 5).

Guest text reaches three views: the conversation (``MessageView``), the history
re-render (the same class), and the ``.md`` preview of the context panel. Each
attack runs in a subprocess where it can hurt (``/dev/zero`` under a memory cap, a
FIFO that would block), so a regression fails the test instead of hanging or
killing pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from piwork.gui.widgets import MessageView

RENDER = textwrap.dedent(
    """
    import os, resource, sys
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    resource.setrlimit(resource.RLIMIT_AS, (2_500_000_000, 2_500_000_000))
    from PySide6.QtWidgets import QApplication
    app = QApplication([])
    from piwork.gui.widgets import MessageView
    from piwork.gui.context import ContextPanel
    view = MessageView("agent", sys.argv[1])
    view.resize(600, 400)
    view.show()
    app.processEvents()
    print("height", int(view.body.document().size().height()), flush=True)
    # The same text as a .md file the agent wrote, previewed in the context panel.
    import asyncio, tempfile
    from pathlib import Path
    from piwork.gui.loop import new_loop
    loop = new_loop(app)
    asyncio.set_event_loop(loop)
    folder = Path(tempfile.mkdtemp())
    (folder / "notes.md").write_text(sys.argv[1])
    panel = ContextPanel()
    panel.show_task("t1", folder, None)
    loop.run_until_complete(panel.preview_file("notes.md"))
    panel.resize(400, 600)
    panel.show()
    app.processEvents()
    print("preview", int(panel.preview_text.document().size().height()), flush=True)
    print("text", view.body.document().toPlainText().replace("\\n", " "), flush=True)
    os._exit(0)
    """
)


def render(markdown: str, tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PIWORK_HOME=str(tmp_path / "home"))
    proc = subprocess.run(
        [sys.executable, "-c", RENDER, markdown],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"rendering died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    out = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out[key] = value
    return out


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.png"
    os.mkfifo(path)
    return path


def test_dev_zero_as_an_image_is_never_read(tmp_path: Path) -> None:
    out = render("hi ![x](/dev/zero) there", tmp_path)
    assert int(out["height"]) < 100 and int(out["preview"]) < 100
    assert "[x]" in out["text"]


def test_a_fifo_as_an_image_does_not_block_the_window(tmp_path: Path, fifo: Path) -> None:
    out = render(f"hi ![pic]({fifo}) and ![b](file://{fifo})", tmp_path)
    assert "[pic]" in out["text"] and "[b]" in out["text"]


def test_a_host_image_is_not_shown(tmp_path: Path) -> None:
    from PySide6.QtGui import QImage

    img = QImage(400, 300, QImage.Format.Format_RGB32)
    img.fill(0xFF0000)
    host = tmp_path / "secret.png"
    assert img.save(str(host))
    # Markdown image, an HTML <img> (raw HTML is off) and a reference-style image.
    md = f"hello ![s]({host})\n\n<img src='{host}'>\n\n![r][ref]\n\n[ref]: {host}\n"
    out = render(md, tmp_path)
    # A 300 px image would make the document over 300 px tall.
    assert int(out["height"]) < 200 and int(out["preview"]) < 200, out


def _links(view: MessageView) -> list[tuple[str, str]]:
    """(shown text, real target) of every link in the rendered message."""
    doc = view.body.document()
    out = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            fmt = frag.charFormat()
            if fmt.isAnchor():
                out.append((frag.text(), fmt.anchorHref()))
            it += 1
        block = block.next()
    return out


@pytest.mark.parametrize(
    "target", ["smb://attacker.example/share/x.desktop", "vscode://file/etc/passwd"]
)
def test_a_non_web_link_behind_https_text_is_never_opened(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch, target: str
) -> None:
    opened: list[Any] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url))
    view = MessageView("agent", f"see [https://docs.python.org/3/]({target})")
    qtbot.addWidget(view)
    [(text, href)] = _links(view)
    assert text == "https://docs.python.org/3/" and href == target
    view.body.anchorClicked.emit(QUrl(href))  # what a left click on the link does
    box = view.body.link_box
    assert isinstance(box, QMessageBox)
    assert target.split("/")[0] in box.informativeText()  # the real scheme is shown
    for b in box.buttons():
        b.click()
    assert opened == []


def test_a_web_link_opens_only_after_the_real_address_was_shown(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[QUrl] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url))
    view = MessageView("agent", "read [the docs](https://evil.example/phish)")
    qtbot.addWidget(view)
    [(_text, href)] = _links(view)
    view.body.anchorClicked.emit(QUrl(href))
    box = view.body.link_box
    assert isinstance(box, QMessageBox) and opened == []
    assert "https://evil.example/phish" in box.informativeText()
    [go] = [b for b in box.buttons() if b.text() == "Open in browser"]
    go.click()
    assert [u.toString() for u in opened] == ["https://evil.example/phish"]


def test_guest_text_in_a_permission_sheet_is_not_rich_text(qtbot: QtBot, tmp_path: Path) -> None:
    """QLabel guesses rich text from a leading tag, and rich text loads <img src>."""
    from piwork.gui.widgets import PermissionSheet

    sheet = PermissionSheet(f"<img src='{tmp_path}/x.png'> rm -rf", "<b>q</b>", None, [], [])
    qtbot.addWidget(sheet)
    assert sheet.what.text().startswith("<img") and sheet.what.textFormat().name == "PlainText"


# --------------------------------------------------------------------------- guest paths
# SECURITY-REVIEW-2.md finding 5: a label guesses rich text from a tag anywhere in its
# first line, and rich text loads <img src>. The guest names its folders "<img src=" and
# "dev" and a file 'zero">': the path relative to the folder is then <img src="/dev/zero">.
# The window shows that path in "Files changed", the preview's title, the Turns tree and
# diff title, the checkpoints line and the undo-conflict question; each is driven here in
# the real window, in a subprocess where a load would hurt.
GUEST_PATHS = textwrap.dedent(
    """
    import asyncio, json, os, resource, sys
    from pathlib import Path
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    resource.setrlimit(resource.RLIMIT_AS, (2_500_000_000, 2_500_000_000))
    from piwork.gui.app import make_app
    from piwork.gui.loop import new_loop
    app = make_app(["piwork"])
    loop = new_loop(app)
    asyncio.set_event_loop(loop)
    from PySide6.QtWidgets import QApplication, QLabel, QMessageBox
    from piwork.checkpoints import RunRecorder, repo_for
    from piwork.config import get_paths
    from piwork.gui.window import MainWindow
    from piwork.tasks import TaskStore

    src, folder = sys.argv[1], Path(sys.argv[2])
    rel = '<img src="' + src + '">'
    target = folder / rel
    paths = get_paths()
    store = TaskStore(paths.tasks)
    task = store.create("guest paths", folder)
    store.close()

    async def main() -> dict:
        rec = RunRecorder(repo_for(task), lambda e: None, turn_start_wait=0.01)
        await rec.start()
        rec.turn_started()
        await rec.before_model_call()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("the agent wrote this\\n")
        await rec.end()
        target.write_text("the person changed it since\\n")  # so the undo conflicts
        win = MainWindow(paths=paths, tray=False)
        win.show()
        panel = win.context
        for _ in range(300):
            if panel.turn_changes and not panel.loading:
                break
            await asyncio.sleep(0.1)
        seen = {}
        # "Files changed": click the file; its preview title names it.
        files = panel.files
        [row] = [i for i in range(files.count()) if rel in files.item(i).text()]
        files.setCurrentRow(row)
        await asyncio.sleep(0.5)
        seen["files"] = files.item(row).text()
        seen["preview title"] = panel.preview_title.text()
        # Turns: the file's row, its diff and the diff's title.
        panel.tabs.setCurrentIndex(1)
        top = panel.turns.topLevelItem(0)
        panel.turns.setCurrentItem(top.child(0))
        await asyncio.sleep(0.3)
        seen["diff title"] = panel.preview_title.text()
        # Undo: the person's later edit conflicts, the question names the file.
        panel.undo_btn.click()
        for _ in range(300):
            if panel.conflict_box is not None:
                break
            await asyncio.sleep(0.1)
        box = panel.conflict_box
        seen["conflict"] = box.informativeText() if box is not None else None
        seen["checkpoints"] = panel.checkpoints.text()
        app.processEvents()
        labels = []
        for w in QApplication.allWidgets():
            if isinstance(w, QLabel) and "<img" in w.text():
                hint = w.sizeHint()
                labels.append([w.objectName(), w.textFormat().name, hint.width(), hint.height()])
        if box is not None:
            box.reject()
        await win.quit_cleanly(exit_app=False)
        return {"seen": seen, "labels": labels}

    print(json.dumps(loop.run_until_complete(main())), flush=True)
    os._exit(0)  # the results are out; Qt's and qasync's teardown order is not the test
    """
)


def guest_paths(src: str, tmp_path: Path) -> dict[str, Any]:
    import json

    folder = tmp_path / "work"
    folder.mkdir()
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PIWORK_HOME=str(tmp_path / "home"))
    proc = subprocess.run(
        [sys.executable, "-c", GUEST_PATHS, src, str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,  # a FIFO read would block: the test fails instead of hanging
    )
    assert proc.returncode == 0, f"the window died (rc {proc.returncode}): {proc.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def assert_plain(out: dict[str, Any], src: str) -> None:
    seen = out["seen"]
    shown = f'<img src="{src}">'
    assert shown in seen["files"] and shown in seen["preview title"], seen
    assert shown in seen["diff title"] and shown in (seen["conflict"] or ""), seen
    # Every label that carries the path shows it as text: a loaded picture (or a 1 GB
    # one from /dev/zero) would make it hundreds of pixels tall, if the process lived.
    assert len(out["labels"]) >= 2, out["labels"]
    for name, fmt, _w, h in out["labels"]:
        assert fmt == "PlainText" and h < 200, (name, fmt, h)


def test_a_guest_path_naming_dev_zero_is_shown_as_text(tmp_path: Path) -> None:
    assert_plain(guest_paths("/dev/zero", tmp_path), "/dev/zero")


def test_a_guest_path_naming_a_fifo_is_shown_as_text(tmp_path: Path, fifo: Path) -> None:
    assert_plain(guest_paths(str(fifo), tmp_path), str(fifo))


def test_a_guest_path_naming_a_host_picture_is_shown_as_text(tmp_path: Path) -> None:
    from PySide6.QtGui import QImage

    img = QImage(400, 300, QImage.Format.Format_RGB32)
    img.fill(0xFF0000)
    host = tmp_path / "holiday.png"
    assert img.save(str(host))
    assert_plain(guest_paths(str(host), tmp_path), str(host))


def test_every_label_of_the_window_is_plain_text_unless_it_escapes(
    qtbot: QtBot, qloop: Any, tmp_path: Path
) -> None:
    """The audit as a rule: a QLabel that guesses (AutoText) is a finding waiting for a
    guest string. Only the task header is rich text, and it escapes the title."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QLabel

    from piwork.config import Paths
    from piwork.gui.settings import SettingsDialog
    from piwork.gui.window import MainWindow

    home = tmp_path / "home"
    paths = Paths(data=home / "d", cache=home / "c", state=home / "s", config=home / "cfg")
    win = MainWindow(paths=paths, tray=False)
    qtbot.addWidget(win)
    dlg = SettingsDialog(paths, win.prefs, win)
    qtbot.addWidget(dlg)
    guessing = [
        (w.objectName() or type(w.parent()).__name__, w.text()[:40])
        for w in win.findChildren(QLabel) + dlg.findChildren(QLabel)
        if w.textFormat() is Qt.TextFormat.AutoText and w.objectName() != "qt_msgboxex_icon_label"
    ]
    assert guessing == [], "\n".join(map(str, guessing))
    assert win.header.textFormat() is Qt.TextFormat.RichText
