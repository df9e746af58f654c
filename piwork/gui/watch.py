"""The live "Files changed": what changes under a task's folder and outputs while it runs
(watchfiles), reported per task, whether its task is shown or not.

Every path is checked beneath its root one component at a time (``piwork.sharefs``,
no link followed): the guest can plant links in both places.
"""

from __future__ import annotations

import asyncio
import logging
import re
import stat
from collections.abc import Callable
from pathlib import Path

from piwork import sharefs

log = logging.getLogger(__name__)

# The name piwork writes a file (or link) under before renaming it into place when it
# applies a change set (``piwork.changes.folder``): never a change of its own.
_APPLY_TEMP = re.compile(r"\..+\.piwork-[0-9a-f]{8}")


def relative_beneath(root: Path, changed: str) -> str | None:
    """``changed`` relative to ``root`` if it is a regular file beneath it (no link on the way)
    and not a file piwork is putting in place."""
    try:
        rel = Path(changed).relative_to(root)
    except ValueError:
        return None
    if not rel.parts or ".." in rel.parts or _APPLY_TEMP.fullmatch(rel.name):
        return None
    try:
        st = sharefs.lstat_beneath(root, rel.as_posix())
    except OSError:
        return rel.as_posix()  # deleted (or unreachable): still a change to list
    if not stat.S_ISREG(st.st_mode):
        return None
    return rel.as_posix()


def still_there(root: Path, rel: str) -> bool:
    try:
        sharefs.lstat_beneath(root, rel)
    except OSError:
        return False
    return True


class FolderWatch:
    """One watcher per task: ``seen(task_id, label, status, gone)`` for each change,
    ``label`` relative to the folder (the outputs' under "outputs/")."""

    def __init__(self, seen: Callable[[str, str, str, bool], None]) -> None:
        self.seen = seen
        self._watches: dict[str, tuple[asyncio.Future[None], asyncio.Event]] = {}

    def watch(self, task_id: str, folder: Path | None, outputs: Path | None) -> None:
        if task_id in self._watches:
            return
        roots = [p for p in (folder, outputs) if p is not None and p.is_dir()]
        if not roots:
            return
        stop = asyncio.Event()
        job = asyncio.ensure_future(self._watch(task_id, folder, roots, stop))
        self._watches[task_id] = (job, stop)

    def unwatch(self, task_id: str) -> None:
        entry = self._watches.pop(task_id, None)
        if entry is not None:
            job, stop = entry
            stop.set()  # the watcher's thread polls it; a loop cannot close while it runs
            job.cancel()

    def stop(self) -> None:
        for task_id in list(self._watches):
            self.unwatch(task_id)

    async def _watch(
        self, task_id: str, folder: Path | None, roots: list[Path], stop: asyncio.Event
    ) -> None:
        from watchfiles import Change, awatch

        names = {Change.added: "added", Change.modified: "modified", Change.deleted: "deleted"}
        try:
            async for changes in awatch(
                *roots, recursive=True, step=200, debounce=400, rust_timeout=1000, stop_event=stop
            ):
                for kind, p in changes:
                    for root in roots:
                        rel = relative_beneath(root, p)
                        if rel is None:
                            continue
                        outputs = root != folder
                        label = f"outputs/{rel}" if outputs else rel
                        gone = outputs and not still_there(root, rel)
                        self.seen(task_id, label, names.get(kind, "modified"), gone)
                        break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a watcher failure must not take the window down
            log.warning("file watcher stopped: %s", exc)
