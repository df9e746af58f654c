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
    # The same text as a .md file in the context panel's preview.
    from pathlib import Path
    panel = ContextPanel()
    panel._show_preview("notes.md", "markdown", sys.argv[1].encode())
    panel.resize(400, 600)
    panel.show()
    app.processEvents()
    print("preview", int(panel.preview_text.document().size().height()), flush=True)
    print("text", view.body.document().toPlainText().replace("\\n", " "), flush=True)
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
