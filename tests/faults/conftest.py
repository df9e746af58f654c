"""Fault fixtures: a tiny real filesystem that fills up (tmpfs; needs root, as CI has)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class SmallDisk:
    """A mounted tmpfs of a few hundred KiB, and a way to fill and free it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.filler = root / ".filler"

    def fill(self) -> None:
        """Take every free byte (the next write gets ENOSPC)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (65536, 4096, 1):
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * size) == size:
                        pass
        finally:
            os.close(fd)

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.filler.unlink()


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
