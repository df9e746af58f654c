"""The "waiting for you" notice names each path once, and only the first time it waits."""

from __future__ import annotations

from typing import Any

from piwork.changes.engine import Outcome
from piwork.run.records import FolderCheckpoints


def test_a_waiting_path_is_named_once() -> None:
    said: list[dict[str, Any]] = []
    records = FolderCheckpoints(
        lambda kind, **data: said.append(data),
        lambda _k, _d: None,
        judge=lambda: None,  # type: ignore[arg-type,return-value]
    )
    # A move waits as its source and as its destination's new file (which shows twice).
    waiting = [("notes.md", "asked", "move"), ("notes.txt", "asked", "move"),
               ("notes.md", "asked", "new")]  # fmt: skip
    records._report(Outcome(waiting=waiting), turn=1)
    records._report(Outcome(waiting=waiting), turn=2)
    notices = [d["message"] for d in said if "message" in d]
    assert len(notices) == 1
    assert "not in your folder yet: notes.md, notes.txt (" in notices[0]
