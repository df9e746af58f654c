"""How long a checkpoint of a large folder takes: first (everything is new) and
incremental (a few files changed). Figures for ``piwork bench``, not assertions.

``piwork bench`` finds :func:`measure` through ``EXTRA_MEASUREMENT_MODULES``
in ``piwork.bench``; ``python -m piwork.checkpoints.bench`` prints the figures alone.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from piwork.checkpoints.shadow import ShadowRepo

FILES = 10_000
TOTAL_BYTES = 200 * 1024 * 1024
FIGURE = "checkpoint of a 10,000-file, 200 MB folder (s)"


def _make_folder(root: Path, files: int, total: int) -> None:
    size = total // files
    block = os.urandom(size)  # incompressible, like most real content
    for i in range(files):
        d = root / f"d{i // 100:03d}"
        if i % 100 == 0:
            d.mkdir()
        # Distinct content per file, so every file is a new object.
        (d / f"f{i:05d}.bin").write_bytes(i.to_bytes(8, "little") + block[8:])


def checkpoint_figures(files: int = FILES, total: int = TOTAL_BYTES) -> dict[str, float]:
    """Seconds for the first checkpoint, an unchanged one and one after 10 edits."""
    with tempfile.TemporaryDirectory(prefix="piwork-bench-ckpt-") as tmp:
        root = Path(tmp)
        folder = root / "folder"
        folder.mkdir()
        _make_folder(folder, files, total)
        repo = ShadowRepo(root / "shadow", folder, max_file_bytes=total)
        repo.init()
        out: dict[str, float] = {}
        t = time.monotonic()
        repo.commit(repo.snapshot(), "task start", None)
        out[f"{FIGURE}: first"] = time.monotonic() - t
        t = time.monotonic()
        repo.commit(repo.snapshot(), "before turn 1", 1)
        out[f"{FIGURE}: unchanged"] = time.monotonic() - t
        for i in range(0, files, files // 10):
            p = folder / f"d{i // 100:03d}" / f"f{i:05d}.bin"
            p.write_bytes(b"edited " + p.read_bytes()[:1000])
        (folder / "new.txt").write_text("new\n")
        t = time.monotonic()
        repo.commit(repo.snapshot(), "before turn 2", 2)
        out[f"{FIGURE}: incremental"] = time.monotonic() - t
        return out


def measure(ctx: Any) -> dict[str, float]:
    """The hook ``piwork bench`` calls (``piwork.bench.EXTRA_MEASUREMENT_MODULES``)."""
    return checkpoint_figures()


if __name__ == "__main__":
    for k, v in checkpoint_figures().items():
        print(f"{k:<60} {v:8.2f}")
