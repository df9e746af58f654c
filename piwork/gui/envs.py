"""What the app shows of task environments (``piwork.env``): Qt-free, read from the EnvStore.

Each folder keeps what its tasks installed (apt, pip, npm): a chain of frozen
layers plus the last task's own disk, which the folder's next task freezes and
starts from. Settings → Environments lists them with their sizes (reset and
remove go through ``EnvStore`` itself, as ``piwork env`` does); the context
panel shows the selected task's disk. Sizes are the space the sparse qcow2
files really take on this computer (``allocated_bytes``); nothing here opens
or mounts a disk (the guest wrote them: docs/security.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from piwork.config import Paths
from piwork.env import ENV_DISK, EnvStore, allocated_bytes, store_for
from piwork.gui.text import sanitize


@dataclass(frozen=True)
class LayerInfo:
    id: str
    bytes: int
    from_task: str | None
    created_at: float
    users: int
    """Tasks whose disk sits on this layer (they keep it until they are deleted)."""

    def line(self, titles: dict[str, str] | None = None) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created_at))
        made = f"from {task_words(self.from_task, titles)}, " if self.from_task else ""
        tasks = "1 task" if self.users == 1 else f"{self.users} tasks"
        return f"{made}{when}; used by {tasks}"


@dataclass(frozen=True)
class FolderInfo:
    folder: Path
    layers: tuple[LayerInfo, ...]
    """Newest first: the layer the next task starts on, then its parents."""
    last_task: str | None
    """The task whose disk the next task freezes and starts from (None: it starts on the
    newest layer, or clean)."""
    last_task_bytes: int

    @property
    def bytes(self) -> int:
        return sum(la.bytes for la in self.layers) + self.last_task_bytes

    def next_start(self, titles: dict[str, str] | None = None) -> str:
        """Where the folder's next task starts, in words (tasks by their titles)."""
        n = len(self.layers)
        saved = f"what {n} earlier task{'' if n == 1 else 's'} installed"
        if self.last_task:
            over = f" (and {saved})" if self.layers else ""
            return f"the next task starts with what {task_words(self.last_task, titles)} left{over}"
        if self.layers:
            return f"the next task starts with {saved}"
        return "the next task starts clean"


def task_words(task_id: str, titles: dict[str, str] | None) -> str:
    """A task as a person knows it: by its title ("task 3f2a…" only when it is gone)."""
    title = (titles or {}).get(task_id)
    if title:
        return f"“{sanitize(title, limit=40, keep_newlines=False)}”"
    return "a task since deleted" if titles is not None else f"task {task_id}"


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def folder_envs(paths: Paths, store: EnvStore | None = None) -> list[FolderInfo]:
    """Every folder with a saved environment, as ``piwork env list`` and ``show`` see it."""
    store = store or store_for(paths)
    out: list[FolderInfo] = []
    for rec in store.folders():
        layers = tuple(
            LayerInfo(la.id, la.bytes, la.from_task, la.created_at, len(store.users(la.id)))
            for la in store.chain(rec.head)
        )
        last = Path(rec.last_task_dir) if rec.last_task_dir else None
        disk = last / ENV_DISK if last is not None else None
        alive = disk is not None and disk.is_file()  # a deleted task's disk is gone
        out.append(
            FolderInfo(
                folder=Path(rec.folder),
                layers=layers,
                last_task=last.name if last is not None and alive else None,
                last_task_bytes=allocated_bytes(disk) if disk is not None and alive else 0,
            )
        )
    return out


def folder_env(paths: Paths, folder: Path) -> FolderInfo | None:
    folder = folder.expanduser().resolve()
    return next((f for f in folder_envs(paths) if f.folder == folder), None)


def task_env_line(paths: Paths, task_id: str | None) -> str:
    """The selected task's environment disk, as ``piwork tasks show`` says it ("" if none)."""
    if not task_id:
        return ""
    task_dir = paths.tasks / task_id
    env = store_for(paths).task_env(task_dir)
    if env is None:
        return ""
    base = "started with what earlier tasks installed" if env.base else "started clean"
    cap = f"{env.size / 2**30:.0f} GiB"
    return f"Environment: {mb(allocated_bytes(env.disk))} of {cap}, {base}"
