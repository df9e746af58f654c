"""A tiny real filesystem that fills up (tmpfs; needs root, as CI has)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


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
