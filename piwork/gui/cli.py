"""``piwork gui`` (and ``piwork`` alone): open the desktop app.

Importing this module does not import Qt, so the headless CLI keeps working on
a machine without PySide6 or a display.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gui",
        help="open the desktop app (also: `piwork` with no arguments)",
        description="Open the piwork window: delegate tasks, watch them, answer permission "
        "prompts, review changed files.",
    )
    p.add_argument(
        "--setup", action="store_true", help="show the first-run setup screen even if ready"
    )
    p.set_defaults(func=lambda args: open_app(args))


def open_app(args: argparse.Namespace | None = None) -> int:
    if importlib.util.find_spec("PySide6") is None or importlib.util.find_spec("qasync") is None:
        print(
            "piwork: the desktop app needs the `gui` extra: pip install 'piwork[gui]' "
            "(scripts/setup.sh installs it). The headless commands work without it: "
            "piwork --help",
            file=sys.stderr,
        )
        return 2
    if (
        sys.platform.startswith("linux")
        and not os.environ.get("DISPLAY")
        and not os.environ.get("WAYLAND_DISPLAY")
        and not os.environ.get("QT_QPA_PLATFORM")
    ):
        print(
            "piwork: no display to open a window on (DISPLAY is not set). "
            'Run `piwork run "..."` for the headless agent, or `xvfb-run piwork gui`.',
            file=sys.stderr,
        )
        return 2
    from piwork.gui.app import main

    return main(force_setup=bool(getattr(args, "setup", False)))
