"""How long the host takes to apply a change set of 1, 100 and 10,000 files (no VM).

The engine's host half (compare with the folder, checkpoint, apply, journal) on
a 10,000-file folder, from changes already in the store; the whole pipeline
with a real VM (scan and transfer too) is ``benchmarks/changesets.py``.
Figures for ``piwork bench`` (found through ``EXTRA_MEASUREMENT_MODULES``), not
assertions; ``python -m piwork.changes.bench`` prints them alone.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from piwork.changes.engine import Answer, FolderChanges
from piwork.changes.entry import Change, Kind
from piwork.changes.sources import StoredSource
from piwork.policy.rules import Target, Verdict

FOLDER_FILES = 10_000


class _AllowAll:
    def verdicts(self, targets: list[Target]) -> list[tuple[Verdict, bool]]:
        return [(Verdict.ALLOW, True)] * len(targets)

    async def ask(self, targets: list[Target], question: str) -> Answer:
        return Answer.ALLOW


def _apply_seconds(root: Path, n: int) -> float:
    folder = root / f"folder-{n}"
    for i in range(FOLDER_FILES):
        d = folder / f"d{i // 100:03d}"
        if i % 100 == 0:
            d.mkdir(parents=True)
        (d / f"f{i}.txt").write_text(f"original {i}\n")
    engine = FolderChanges(root / f"task-{n}", folder)
    changes = []
    for i in range(n):
        data = f"changed {i}\n".encode()
        sha = engine.store.put(data)
        changes.append(Change(f"d{i // 100:03d}/f{i}.txt", Kind.FILE, 0o644, len(data), sha))
    engine.store.sync()
    source = StoredSource(changes, engine.store, {})
    t = time.monotonic()
    out = asyncio.run(engine.take(source, _AllowAll(), turn=1, label="turn 1"))
    took = time.monotonic() - t
    engine.close()
    assert len(out.applied) == n, out
    return took


def measure(ctx: Any = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="piwork-changes-bench-") as tmp:
        return {
            f"apply a change set of {n:,} files on the host (s)": round(
                _apply_seconds(Path(tmp), n), 3
            )
            for n in (1, 100, 10_000)
        }


if __name__ == "__main__":
    for k, v in measure().items():
        print(f"{k}: {v}")
