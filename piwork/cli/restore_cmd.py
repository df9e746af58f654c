"""`piwork restore [NAME|FILE]`: see which files holding your decisions are damaged, and put
their last good copies back (:mod:`piwork.jsonstore`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from piwork.config import get_paths
from piwork.env.store import record_file
from piwork.env.store import store_for as env_store_for
from piwork.hosts.store import hosts_store
from piwork.jsonstore import LAST_GOOD, DamagedFile, JsonFile, NothingToRestore
from piwork.models.providers import providers_store
from piwork.policy.store import policy_file
from piwork.settings import settings_file

NAMES = ("policy", "settings", "hosts", "providers")


def _named() -> dict[str, JsonFile[Any]]:
    paths = get_paths()
    return {
        "policy": policy_file(paths.policy_file),
        "settings": settings_file(paths.settings_file),
        "hosts": hosts_store(),
        "providers": providers_store(),
    }


def _env_records() -> Iterator[JsonFile[Any]]:
    """Every environment record there is (or whose last good copy is all that is left)."""
    paths = get_paths()
    env = env_store_for(paths)
    dirs = [env.folders_dir, env.layers_dir, env.images_dir]
    seen: set[Path] = set()
    for d in dirs:
        for p in sorted(d.glob("*.json*")) if d.is_dir() else []:
            path = p.with_name(p.name.removesuffix(LAST_GOOD))
            if path.suffix == ".json" and path not in seen:
                seen.add(path)
                yield record_file(path)
    for p in sorted(paths.tasks.glob("*/env.json*")) if paths.tasks.is_dir() else []:
        path = p.with_name(p.name.removesuffix(LAST_GOOD))
        if path.name == "env.json" and path not in seen:
            seen.add(path)
            yield record_file(path)


def _all() -> list[JsonFile[Any]]:
    return [*_named().values(), *_env_records()]


def _find(what: str) -> JsonFile[Any] | None:
    named = _named()
    if what in named:
        return named[what]
    want = Path(what).expanduser().absolute()
    for file in _all():
        if file.path.absolute() == want:
            return file
    return None


def cmd_restore(args: argparse.Namespace) -> int:
    if args.what is None:
        damaged = [d for d in (f.check() for f in _all()) if d is not None]
        if not damaged:
            print("every file holding your decisions reads fine; nothing to restore")
            return 0
        for d in damaged:
            print(f"piwork: {d}", file=sys.stderr)
        return 1
    file = _find(args.what)
    if file is None:
        print(
            f"piwork: {args.what} is none of the files piwork keeps your decisions in; "
            f"name one of {', '.join(NAMES)}, or a file a message named",
            file=sys.stderr,
        )
        return 2
    try:
        restored = file.restore()
        file.load()
    except (NothingToRestore, DamagedFile, OSError) as exc:
        print(f"piwork: {exc}", file=sys.stderr)
        return 1
    print(f"restored {restored.path} from {restored.source}")
    if restored.kept is not None:
        print(f"the damaged file is kept at {restored.kept}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "restore",
        help="list damaged files holding your decisions, or put one's last good copy back",
        description="Without an argument: list every file holding your decisions (policy, "
        "settings, hosts, providers, environments) that cannot be read, and exit 1 if there "
        "is one. With one: put that file's last good copy back; the damaged one is kept.",
    )
    p.add_argument("what", nargs="?", metavar="NAME|FILE", help=", ".join(NAMES) + ", or a path")
    p.set_defaults(func=cmd_restore)
