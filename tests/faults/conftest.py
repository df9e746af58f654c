"""Fault fixtures: a tiny real filesystem that fills up (tmpfs; needs root, as CI has)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.disk import SmallDisk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(mnt)], check=True
    )
    try:
        yield SmallDisk(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Soak tests (``@pytest.mark.soak``) run only with PIWORK_SOAK=1: deselected, not skipped."""
    if os.environ.get("PIWORK_SOAK") == "1":
        return
    keep = [item for item in items if item.get_closest_marker("soak") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
