"""What the app keeps across its own death: composer drafts and a "was running" marker.

Qt-free. Both files live under ``<state>/gui/`` and are written with
:func:`piwork.fsutil.atomic_write_bytes` (temp file, fsync, rename), because the
moments they matter are exactly the ones where the process dies mid-write:

* ``drafts.json``: what the person typed and did not send, per task (``"new"`` for
  the new-task composer). Saved a moment after each keystroke, so an abort (the
  ``none_dealloc`` crash of issue 16, an OOM kill, a power cut) loses at most the
  last half second of typing.
* ``running.json``: written at start with this process's identity and the tasks it
  has live, removed on a clean quit. Found at the next start with its process gone,
  it means the app died: the window says so and offers those tasks back.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from piwork.config import Paths
from piwork.fsutil import atomic_write_bytes
from piwork.tasks.store import OwnerInfo

NEW = "new"  # the draft key of the new-task composer
MAX_DRAFT = 200_000  # characters kept per draft


@dataclass(frozen=True)
class Crash:
    """The previous run of the app ended without a clean quit."""

    since: str  # when that run started (ISO time)
    live: tuple[str, ...]  # task ids it had live when it last wrote


class AppState:
    def __init__(self, paths: Paths) -> None:
        self.dir = paths.state / "gui"
        self.drafts_file = self.dir / "drafts.json"
        self.running_file = self.dir / "running.json"
        self._drafts = self._read(self.drafts_file)
        self._me = OwnerInfo.current()

    @staticmethod
    def _read(path: Path) -> dict[str, str]:
        try:
            raw = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict):
            return {}
        return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}

    # ------------------------------------------------------------ drafts
    def draft(self, key: str) -> str:
        return self._drafts.get(key, "")

    def save_draft(self, key: str, text: str) -> None:
        """Store (or, for empty text, forget) the draft for ``key``; durable on return."""
        text = text[:MAX_DRAFT]
        if self._drafts.get(key, "") == text:
            return
        if text.strip():
            self._drafts[key] = text
        else:
            self._drafts.pop(key, None)
        atomic_write_bytes(self.drafts_file, json.dumps(self._drafts).encode())

    # ------------------------------------------------------------ crash marker
    def previous_crash(self) -> Crash | None:
        """Call once at start, before :meth:`mark_running`: did the last run die?"""
        try:
            raw = json.loads(self.running_file.read_bytes())
            owner = OwnerInfo.parse(json.dumps(raw["owner"]).encode())
            live = tuple(str(t) for t in raw.get("live", []) if isinstance(t, str))
            since = str(raw.get("since", ""))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if owner is None or owner.alive():
            return None
        return Crash(since, live)

    def mark_running(self, live: list[str]) -> None:
        owner = json.loads(self._me.to_json())
        payload = {"owner": owner, "since": owner.get("since", ""), "live": sorted(live)}
        atomic_write_bytes(self.running_file, json.dumps(payload).encode())

    def clean_exit(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.running_file.unlink()
