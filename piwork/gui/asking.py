"""The window's questions to the person, all alike: plain text (a task's title may come
from the guest), an explicit default, answered through ``finished`` (never a nested
event loop: the app's asyncio tasks keep running while a question is open). And the
tray icon, the window's other way to reach the person."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QIcon
from PySide6.QtWidgets import QMenu, QMessageBox, QSystemTrayIcon, QWidget


def message_box(parent: QWidget, title: str, text: str) -> QMessageBox:
    box = QMessageBox(parent)
    box.setWindowTitle(title)
    box.setTextFormat(Qt.TextFormat.PlainText)
    box.setText(text)
    return box


def inform(parent: QWidget, text: str) -> QMessageBox:
    box = message_box(parent, "piwork", text)
    box.addButton(QMessageBox.StandardButton.Ok)
    box.open()
    return box


def ask(
    parent: QWidget, title: str, text: str, yes: str, then: Callable[[], object]
) -> QMessageBox:
    """A question whose default is Cancel: Enter never archives, deletes or quits."""
    box = message_box(parent, title, text)
    go = box.addButton(yes, QMessageBox.ButtonRole.DestructiveRole)
    cancel = box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(cancel)
    box.finished.connect(lambda _r: box.clickedButton() is go and then())
    box.open()
    return box


def choose(
    parent: QWidget, title: str, text: str, answers: list[tuple[str, QMessageBox.ButtonRole]]
) -> tuple[QMessageBox, list[object]]:
    """A question with the given answers (the first is the default); returns the box and
    its buttons, in order."""
    box = message_box(parent, title, text)
    buttons = [box.addButton(label, role) for label, role in answers]
    box.setDefaultButton(buttons[0])
    return box, list(buttons)


ACCEPT = QMessageBox.ButtonRole.AcceptRole
DESTRUCTIVE = QMessageBox.ButtonRole.DestructiveRole
REJECT = QMessageBox.ButtonRole.RejectRole


def tray_icon(
    parent: QWidget,
    icon: Path,
    show: Callable[[], object],
    quit_app: Callable[[], object],
    available: bool | None,
) -> QSystemTrayIcon | None:
    """The tray icon with "Show piwork" and "Quit", where the desktop has a tray (None:
    ask Qt); None where it has none."""
    if available is None:
        available = QSystemTrayIcon.isSystemTrayAvailable()
    if not available:
        return None
    tray = QSystemTrayIcon(QIcon(str(icon)), parent)
    menu = QMenu(parent)
    for label, fn in (("Show piwork", show), ("Quit", quit_app)):
        action = QAction(label, menu)
        action.triggered.connect(lambda _=False, fn=fn: fn())
        menu.addAction(action)
    tray.setContextMenu(menu)
    tray.activated.connect(lambda _r: show())
    tray.setToolTip("piwork")
    tray.show()
    return tray
