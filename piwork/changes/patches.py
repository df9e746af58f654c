"""The agent's commits, offered as patches (issue 34 item 5).

Git works for the agent in the VM: ``git commit``, branches and stash change the
repository's metadata in the agent's layer, which never reaches the person's
``.git`` (:mod:`piwork.changes.holds`: *kept*). What the person gets is the
commits as patch files (``<task>/patches/<repository>.patch``, ``git am`` applies
them): made on the host by the host's git, in a throw-away bare repository
piwork sets up itself (its own configuration, no hooks) whose object store
borrows the person's (``objects/info/alternates``) and holds the objects the
agent added. From the layer only objects (under ``objects/``, by name shape)
and the commit the agent's branch names (40 hex digits) are taken; no
configuration, hook or ref text of the agent's is ever read by git.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from piwork.changes.engine import FolderChanges, Source
from piwork.changes.entry import Change, Kind, display
from piwork.changes.holds import git_env
from piwork.changes.journal import State

PATCHES_DIR = "patches"
MAX_PATCH_BYTES = 64 << 20
GIT_TIMEOUT = 60.0
_LOOSE = re.compile(r"objects/[0-9a-f]{2}/[0-9a-f]{38}")
_PACK = re.compile(r"objects/pack/pack-[0-9a-f]{40}\.(?:pack|idx)")
_SHA = re.compile(rb"[0-9a-f]{40}")


@dataclass(frozen=True)
class Patches:
    repo: str
    """The repository's folder, relative to the working folder ("" for the folder itself)."""
    file: Path
    commits: int


def _clean_env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
    }


def _git(args: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, timeout=GIT_TIMEOUT, check=False
    )


async def export_commits(engine: FolderChanges, source: Source, task_dir: Path) -> list[Patches]:
    """Patch files of the commits the agent made in the person's repositories (if any)."""
    rows = engine.journal.layer()
    repos: dict[str, dict[str, Change]] = {}
    for path, row in rows.items():
        if row.state is State.KEPT and row.root and row.root.endswith(".git"):
            rel = path[len(row.root) + 1 :] if path.startswith(row.root + "/") else ""
            if rel and row.change.kind is Kind.FILE:
                repos.setdefault(row.root, {})[rel] = row.change
    out = []
    for root, files in sorted(repos.items()):
        head = await _agent_head(engine, source, root, files)
        if head is None:
            continue
        objects = [c for rel, c in files.items() if _LOOSE.fullmatch(rel) or _PACK.fullmatch(rel)]
        data: dict[str, bytes] = {}
        async for change, blob, _why in source.read_many(objects, engine.limits.max_file_bytes):
            if blob is not None:
                data[change.path[len(root) + 1 :]] = blob
        made = _format(engine.folder, root, head, data, task_dir / PATCHES_DIR)
        if made is not None:
            out.append(made)
    return out


async def _agent_head(
    engine: FolderChanges, source: Source, root: str, files: dict[str, Change]
) -> str | None:
    """The commit the agent's current branch names in its copy (40 hex digits), if it moved."""
    head_change = files.get("HEAD")
    if head_change is not None:
        text = await _read(engine, source, head_change)
    else:
        try:
            text = (engine.folder / root / "HEAD").read_bytes()[:256]
        except OSError:
            return None
    text = text.strip()
    if _SHA.fullmatch(text):
        return text.decode()
    m = re.fullmatch(rb"ref: (refs/heads/[A-Za-z0-9._/-]{1,200})", text)
    if m is None:
        return None
    ref = m.group(1).decode()
    ref_change = files.get(ref)
    if ref_change is None:
        return None  # the branch did not move in the agent's copy
    value = (await _read(engine, source, ref_change)).strip()
    return value.decode() if _SHA.fullmatch(value) else None


async def _read(engine: FolderChanges, source: Source, change: Change) -> bytes:
    if change.size > 4096:
        return b""
    async for _c, data, _why in source.read_many([change], 4096):
        return data or b""
    return b""


def _format(
    folder: Path, root: str, head: str, objects: dict[str, bytes], dest: Path
) -> Patches | None:
    repo = root[: -len(".git")].rstrip("/")
    person = folder / repo if repo else folder
    env = git_env()
    base = _git(["rev-parse", "--verify", "-q", "HEAD^{commit}"], cwd=person, env=env)
    store = _git(
        ["rev-parse", "--path-format=absolute", "--git-path", "objects"], cwd=person, env=env
    )
    if base.returncode != 0 or store.returncode != 0:
        return None
    base_sha = base.stdout.strip().decode()
    if base_sha == head:
        return None
    with tempfile.TemporaryDirectory(prefix="piwork-patches-") as tmp:
        scratch = Path(tmp, "repo.git")
        clean = _clean_env(Path(tmp))
        if _git(["init", "-q", "--bare", str(scratch)], cwd=Path(tmp), env=clean).returncode != 0:
            return None
        (scratch / "objects" / "info" / "alternates").write_text(
            os.fsdecode(store.stdout.strip()) + "\n"
        )
        for rel, blob in objects.items():
            target = scratch / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blob)
        count = _git(["rev-list", "--count", f"{base_sha}..{head}"], cwd=scratch, env=clean)
        patch = _git(
            ["-c", "core.hooksPath=/dev/null", "format-patch", "--stdout", "--no-signature",
             f"{base_sha}..{head}"],
            cwd=scratch, env=clean,
        )  # fmt: skip
    if count.returncode != 0 or patch.returncode != 0 or not patch.stdout:
        return None
    if len(patch.stdout) > MAX_PATCH_BYTES:
        return None
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", display(repo) or "folder")[:100] + ".patch"
    out = dest / name
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(patch.stdout)
    return Patches(repo, out, int(count.stdout.strip() or 0))
