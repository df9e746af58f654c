"""The screenshot script renders every screen from a real VM run under a real X server.

The committed PNGs in docs/screenshots/ come from the same script:
``xvfb-run -a -s "-screen 0 1440x900x24" .venv/bin/python tests/gui/screenshots.py OUT``
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from .screenshots import SHOTS as EXPECTED

pytestmark = pytest.mark.vm  # two real tasks in real VMs

SCRIPT = Path(__file__).with_name("screenshots.py")


def test_screenshots_render_under_xvfb(tmp_path: Path) -> None:
    xvfb_run = shutil.which("xvfb-run")
    assert xvfb_run, "xvfb-run is missing: scripts/setup.sh installs xvfb"
    env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}  # a real X server
    proc = subprocess.run(
        [xvfb_run, "-a", "-s", "-screen 0 1440x900x24", sys.executable, str(SCRIPT), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in EXPECTED:
        img = QImage(str(tmp_path / f"{name}.png"))
        assert not img.isNull(), name
        assert img.width() >= 800 and img.height() >= 500, (name, img.size())
        # Not a blank frame: many distinct colours across a sample of pixels.
        colours = {
            img.pixel(x, y) for x in range(0, img.width(), 23) for y in range(0, img.height(), 17)
        }
        assert len(colours) > 8, name
