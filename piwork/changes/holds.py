"""What the host could be made to run from the folder: the one list (docs/change-sets.md).

A change the agent made is *held* (kept out of the person's folder until the
person says so) when it lands in, or makes, something that runs programs on
the host without the person deciding to run them: git metadata (host git runs
what its config and hooks name), hook managers, editor and shell integrations
that run code when a folder is opened or entered, a Python virtual
environment (editors run its interpreter), the programs npm scripts and hooks
put first on ``PATH``. The list is :data:`RUNNABLE`; the policy extends it: a
rule ``ask write <pattern>`` (``piwork policy add``) holds what it matches,
``allow write <pattern>`` in a folder lets a held kind through there.

Structural cases no name pattern catches are found here too: a folder that
looks like a git directory (``HEAD`` + ``objects/`` + ``refs/``, git's own
test: a bare repository, or the target of a ``gitdir:`` file), a ``gitdir:``
file under any name, the hooks folder ``core.hooksPath`` names in the person's
repositories, a virtual environment (a folder holding ``pyvenv.cfg``), and a
link whose target is absolute or climbs out of the folder.

The person's *existing* git metadata is never written at all (the agent's
commits there are offered as patches, :mod:`piwork.changes.patches`): that is
:func:`git_metadata` with ``existing=True``.
"""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from piwork.changes.entry import Change, Kind


@dataclass(frozen=True)
class Runnable:
    name: str
    """A file or folder name (matched at any depth), or ``a/b`` for a name under another."""
    why: str


RUNNABLE: tuple[Runnable, ...] = (
    Runnable(".git", "git metadata: host git runs the programs its config and hooks name"),
    Runnable(".gitmodules", "git submodules: host git fetches and checks out what it names"),
    Runnable(".husky", "husky's git hooks: host git runs them on commit"),
    Runnable(".githooks", "a git hooks folder (core.hooksPath): host git runs them on commit"),
    Runnable(".pre-commit-config.yaml", "pre-commit: the commands host git's hook runs"),
    Runnable(".pre-commit-hooks.yaml", "pre-commit hooks this folder defines"),
    Runnable(".vscode", "VS Code: tasks and settings it runs when it opens the folder"),
    Runnable(".idea", "JetBrains IDEs: run configurations and tools"),
    Runnable(".devcontainer", "dev containers: commands the editor runs to build one"),
    Runnable(".envrc", "direnv: runs when a shell enters the folder"),
    Runnable(".npmrc", "npm's configuration: it can name programs npm runs"),
    Runnable(".yarnrc.yml", "yarn's configuration: yarnPath runs a program for every yarn command"),
    Runnable(".yarnrc", "yarn's configuration: it can name programs yarn runs"),
    Runnable("pyvenv.cfg", "a Python virtual environment: editors run its interpreter"),
    Runnable("node_modules/.bin", "programs npm scripts and git hooks (husky) run first"),
)
"""The names; each is also a default policy rule ``ask write **/<name>`` (piwork.policy.rules)."""

# Code points HFS+ ignores in names (git's is_hfs_dotgit skips them too).
_HFS_IGNORABLE = re.compile("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]")
_SHORT_NAME = re.compile(r"git~[0-9]+")
_GITMODULES_SHORT = re.compile(r"gitmod~[0-9]+")
GITDIR_PREFIX = b"gitdir:"
GITDIR_LOOK_WHY = "a git directory (HEAD, objects, refs): host git reads its config"
GITDIR_WHY = "a gitdir: file: it makes a folder a git repository for host git"


def git_alias(name: str) -> bool:
    """Would git (on some file system) take this name for ``.git``? ``.GIT``, ``.git.``,
    ``.git ``, ``.git:x``, the 8.3 short name ``git~1``, HFS-ignorable characters."""
    n = _HFS_IGNORABLE.sub("", name).lower().split(":", 1)[0].rstrip(". ")
    return n == ".git" or bool(_SHORT_NAME.fullmatch(n))


def _alias_of(name: str) -> str:
    """The list name this component stands for (case and git's aliases folded)."""
    if git_alias(name):
        return ".git"
    n = _HFS_IGNORABLE.sub("", name).lower().split(":", 1)[0].rstrip(". ")
    if n == ".gitmodules" or _GITMODULES_SHORT.fullmatch(n):
        return ".gitmodules"
    return n


def refused_prefix(path: str) -> str | None:
    """The part of ``path`` up to its first component git takes for ``.git`` (any
    spelling, backslashes counting as separators), or None."""
    parts = path.split("/")
    for i, comp in enumerate(parts):
        if any(git_alias(sub) for sub in comp.split("\\")):
            return "/".join(parts[: i + 1])
    return None


_SINGLE = {r.name: r.why for r in RUNNABLE if "/" not in r.name}
_PAIRS = {tuple(r.name.split("/")): r.why for r in RUNNABLE if "/" in r.name}


@dataclass(frozen=True)
class Held:
    root: str
    """The unit the person answers for: the folder or file that makes it runnable."""
    why: str
    existing_git: bool = False
    """The person's own git metadata (never applied: the agent's commits become patches)."""


Has = Callable[[str], bool]
"""``has(rel)``: the agent's view of the folder has an entry at ``rel``."""


def link_leaves(path: str, target: str) -> bool:
    """A link target that is absolute or climbs out of the folder (judged as text)."""
    if target.startswith("/") or "\0" in target:
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return joined == ".." or joined.startswith("../")


def runnable(
    change: Change,
    has: Has,
    person_has: Has,
    hooks_dirs: frozenset[str] = frozenset(),
    head: bytes | None = None,
) -> Held | None:
    """Why ``change`` would let the host be made to run something, or None.

    ``has``/``person_has``: the agent's view and the person's folder; ``hooks_dirs``:
    the ``core.hooksPath`` folders of the person's repositories (relative paths);
    ``head``: the first bytes of a file change (for ``gitdir:`` files).
    """
    parts = change.path.split("/")
    for i in range(len(parts)):
        prefix = "/".join(parts[: i + 1])
        name = _alias_of(parts[i])
        if name == ".git":
            return Held(prefix, _SINGLE[".git"], existing_git=person_has(prefix))
        if i > 0 and (parts[i - 1].lower(), name) in _PAIRS:
            return Held(prefix, _PAIRS[(parts[i - 1].lower(), name)])
        if name in _SINGLE and (i < len(parts) - 1 or name != "pyvenv.cfg"):
            return Held(prefix, _SINGLE[name])
        if prefix in hooks_dirs:
            return Held(prefix, "a git hook of yours (or what one points to): host git runs it")
        if i < len(parts) - 1 or change.kind is Kind.DIR:
            if all(has(f"{prefix}/{n}") for n in ("HEAD", "objects", "refs")):
                existing = all(person_has(f"{prefix}/{n}") for n in ("HEAD", "objects", "refs"))
                return Held(prefix, GITDIR_LOOK_WHY, existing_git=existing)
            if has(f"{prefix}/pyvenv.cfg"):
                return Held(prefix, _SINGLE["pyvenv.cfg"])
    if parts[-1].lower() == "pyvenv.cfg":
        parent = "/".join(parts[:-1])
        return Held(parent or change.path, _SINGLE["pyvenv.cfg"])
    if (
        change.kind is Kind.LINK
        and change.target is not None
        and link_leaves(change.path, change.target)
    ):
        return Held(change.path, "a link that points outside the folder")
    if change.kind is Kind.FILE and head is not None and head.lstrip().startswith(GITDIR_PREFIX):
        return Held(change.path, GITDIR_WHY)
    return None


def git_env() -> dict[str, str]:
    """Host git reading the person's own configuration (their repositories, untouched)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_OPTIONAL_LOCKS"] = "0"
    return env


def hook_paths(folder: Path, repo: str) -> set[str]:
    """What host git runs as hooks of the person's repository at ``repo``, inside the folder
    (folder-relative): its hooks folder when it is there (``core.hooksPath``), and the
    target of every hook that is a link into the folder (``.git/hooks/pre-commit ->
    ../../hooks/pre-commit``, the usual "install the hooks" step). Found with the person's
    own git and configuration (``rev-parse --git-path hooks``, which knows linked
    worktrees and includes): their repository's metadata is never written by the guest,
    so reading it runs nothing the agent chose. A hook that is a hard link needs nothing:
    piwork replaces a file by renaming a new one over it, never writing through a link."""
    cwd = folder / repo if repo else folder
    try:
        out = subprocess.run(
            ["git", "-C", str(cwd), "rev-parse", "--path-format=absolute", "--git-path", "hooks"],
            capture_output=True, env=git_env(), timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return set()
    text = os.fsdecode(out.stdout.strip())
    if out.returncode != 0 or not text:
        return set()
    hooks = Path(posixpath.normpath(text))
    found: set[str] = set()
    inside = _relative(hooks, folder)
    if inside is not None:
        found.add(inside)
    try:
        entries = list(os.scandir(hooks))
    except OSError:
        return found
    for e in entries[:256]:
        if not e.is_symlink():
            continue
        try:
            target = os.readlink(e.path)
        except OSError:
            continue
        resolved = Path(posixpath.normpath(posixpath.join(str(hooks), target)))
        rel = _relative(resolved, folder)
        if rel is not None:
            found.add(rel)
    return found


def _relative(path: Path, folder: Path) -> str | None:
    try:
        rel = path.relative_to(folder).as_posix()
    except ValueError:
        try:
            rel = path.relative_to(folder.resolve()).as_posix()
        except ValueError:
            return None
    return None if rel in (".", "") else rel
