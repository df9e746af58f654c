"""``piwork env``: the environments tasks leave behind (installed packages, tools).

Each task has a writable disk over the pack's Debian workbench; a new task on
a folder starts from what the folder's last task left (``piwork.env``).

  piwork env build [FOLDER] [-f FILE]
                              build the folder's environment from its piwork.Dockerfile
                              (FROM piwork, RUN, COPY, ENV, WORKDIR), the RUN steps inside
                              a piwork VM; the folder's next task starts from the result
  piwork env import IMAGE.tar [FOLDER]
                              an OCI or `docker save` archive as FOLDER's userland instead
                              of the pack's Debian (unpacked without a daemon: skopeo, umoci)
  piwork env list             one line per folder: its saved environment
  piwork env show FOLDER      the layers it is made of, their sizes, the tasks on them
  piwork env reset FOLDER     the folder's next task starts clean
  piwork env rm FOLDER        forget the folder (and delete layers nothing uses)
  piwork env allow-registries [--folder DIR]
                              allow Debian, PyPI and npm (apt, pip, npm) in one answer:
                              saves one network rule per registry domain, printed
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from piwork.env import EnvStore, default_store
from piwork.env.dockerfile import DEFAULT_NAMES
from piwork.env.registries import WHAT_IT_ALLOWS, registry_rules
from piwork.env.store import MAX_CHAIN_LAYERS
from piwork.policy.rules import Scope
from piwork.policy.store import PolicyError, PolicyStore
from piwork.textsafe import sanitize

BUILD_DESCRIPTION = (
    "Build FOLDER's environment from a Dockerfile subset: FROM piwork (or FROM LAYER-ID, or "
    "FROM IMAGE-ID from piwork env import), RUN, COPY (from FOLDER; COPY *.txt /dst/ "
    "matches as Docker does), ENV, WORKDIR. The RUN "
    "steps run inside a piwork VM, through the egress proxy and your network policy; the "
    "result is a read-only layer cached by the hash of its inputs, and FOLDER's next task "
    "starts from it. In tasks, ENV applies to the agent's bash; WORKDIR is where a shell "
    "outside the task's folders starts (the agent itself starts in the task's folder)."
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    env = subparsers.add_parser(
        "env",
        help="saved task environments (what the agent installed), per folder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = env.add_subparsers(dest="env_command", metavar="ACTION")

    def usage(_args: argparse.Namespace) -> int:
        env.print_help()
        return 2

    env.set_defaults(func=usage)
    p = sub.add_parser(
        "build",
        help="build the folder's environment from its piwork.Dockerfile (in a VM)",
        description=BUILD_DESCRIPTION,
    )
    p.add_argument("folder", nargs="?", default=".", help="the build folder (default: .)")
    p.add_argument(
        "-f",
        "--file",
        help=f"the file to build (default: {' or '.join(DEFAULT_NAMES)} in FOLDER)",
    )
    p.add_argument(
        "--step-timeout",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="stop a RUN step that takes longer (default: 3600)",
    )
    p.add_argument("--memory", type=int, default=1024, help="the build VM's memory in MiB")
    p.add_argument("--cpus", type=int, default=2, help="the build VM's CPUs")
    p.add_argument("--accel", default=None, help="kvm, hvf, tcg (default: the best available)")
    p.set_defaults(func=cmd_build)
    p = sub.add_parser(
        "import",
        help="use an OCI or docker-save archive as the folder's userland",
        description="Unpack IMAGE.tar (an OCI archive or `docker save` output) without a "
        "daemon (skopeo, umoci --rootless), make it a read-only image cached by the "
        "archive's sha256, and run FOLDER's next tasks on it instead of the pack's Debian "
        "workbench, from a blank writable disk. `piwork env reset FOLDER` goes back.",
    )
    p.add_argument("archive", help="the image archive (.tar)")
    p.add_argument("folder", nargs="?", default=".", help="the working folder (default: .)")
    p.set_defaults(func=cmd_import)
    p = sub.add_parser("list", help="folders with a saved environment")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser(
        "allow-registries", help="allow the package registries (Debian, PyPI, npm) at once"
    )
    p.add_argument("--folder", help="only for tasks on this folder (default: everywhere)")
    p.set_defaults(func=cmd_allow_registries)
    for name, func, text in (
        ("show", cmd_show, "the layers of a folder's environment"),
        ("reset", cmd_reset, "the folder's next task starts from the clean workbench"),
        ("rm", cmd_rm, "forget the folder's environment"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("folder", help="the working folder")
        if name == "show":
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _folder(arg: str) -> Path:
    return Path(arg).expanduser().resolve()


def _summary(store: EnvStore) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for rec in store.folders():
        chain = store.chain(rec.head)
        rows.append(
            {
                "folder": rec.folder,
                "head": rec.head,
                "layers": len(chain),
                "bytes": sum(la.bytes for la in chain),
                "last_task": Path(rec.last_task_dir).name if rec.last_task_dir else None,
                "image": rec.image,
            }
        )
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    rows = _summary(default_store())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no saved environments (a task on a folder saves one)")
        return 0
    for r in rows:
        saved = f"{r['layers']} saved layer(s), {_mb(int(str(r['bytes'])))}" if r["head"] else ""
        if r["last_task"]:
            state = f"the next task starts from what task {r['last_task']} left"
            state += f" (over {saved})" if saved else ""
        else:
            state = f"the next task starts from {saved}" if saved else "clean"
        if r["image"]:
            state += f", on imported image {r['image']}"
        print(f"{r['folder']}\n  {state}")
    return 0


def _not_saved(command: str, folder: Path) -> int:
    """No record for ``folder``: a path that does not exist is a wrong argument (exit 2),
    an existing folder simply has none (exit 1). A record outlives its folder, so a
    missing folder is looked up first (``piwork env rm`` of a deleted folder works)."""
    listed = "piwork env list shows the folders that have one"
    if not folder.exists():
        print(
            f"piwork env {command}: {folder} does not exist and has no saved environment "
            f"({listed})",
            file=sys.stderr,
        )
        return 2
    print(f"piwork env {command}: no environment saved for {folder} ({listed})", file=sys.stderr)
    return 1


def cmd_show(args: argparse.Namespace) -> int:
    store = default_store()
    rec = store.folder(_folder(args.folder))
    if rec is None:
        return _not_saved("show", _folder(args.folder))
    chain = store.chain(rec.head)
    layers = [
        {
            "id": la.id,
            "bytes": la.bytes,
            "from_task": la.from_task,
            "built_from": la.build.get("file") if la.build else None,
            "merged": list(la.merged),
            "created_at": la.created_at,
            "tasks": store.users(la.id),
        }
        for la in chain
    ]
    if args.json:
        shown = {
            "folder": rec.folder,
            "head": rec.head,
            "image": rec.image,
            "chain_length": len(chain),
            "max_chain_length": MAX_CHAIN_LAYERS,
            "layers": layers,
        }
        print(json.dumps(shown, indent=2))
        return 0
    print(rec.folder)
    if rec.image:
        print(f"  on imported image {rec.image} (piwork env import), not the pack's Debian")
    if not chain:
        base = "the imported image" if rec.image else "the pack's workbench"
        print(f"  clean: the next task starts from {base}")
    else:
        print(
            f"  chain of {len(chain)} layer(s), newest first (merged into one when a new "
            f"task would make it longer than {MAX_CHAIN_LAYERS})"
        )
    for la in layers:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(str(la["created_at"]))))
        if la["merged"]:
            origin = f"merged from {len(la['merged'])} layers"  # type: ignore[arg-type]
            origin += f" (newest from task {la['from_task']})" if la["from_task"] else ""
        elif la["built_from"]:
            origin = f"built from {la['built_from']}"
        else:
            origin = f"from task {la['from_task']}"
        print(
            f"  layer {la['id']}  {_mb(int(str(la['bytes'])))}  {origin}"
            f"  ({when}); used by {len(la['tasks'])} task(s)"  # type: ignore[arg-type]
        )
    if rec.last_task_dir:
        print(f"  next task starts from: task {Path(rec.last_task_dir).name}'s disk (frozen then)")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    folder = _folder(args.folder)
    if not default_store().reset(folder):
        return _not_saved("reset", folder)
    print(f"{folder}: the next task starts from the clean workbench")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    folder = _folder(args.folder)
    if not default_store().rm(folder):
        return _not_saved("rm", folder)
    print(f"{folder}: environment forgotten")
    return 0


def cmd_allow_registries(args: argparse.Namespace) -> int:
    if args.folder and not _folder(args.folder).is_dir():
        print(
            f"piwork env allow-registries: {_folder(args.folder)} is not a folder; name an "
            "existing working folder, or leave --folder out to allow the registries everywhere",
            file=sys.stderr,
        )
        return 2
    from piwork.config import get_paths
    from piwork.net.mirrors import all_mirror_hosts, mirror_hosts, mirrors_for

    paths = get_paths()
    if args.folder:
        scope = Scope.folder(_folder(args.folder))
        mirrors = mirror_hosts(mirrors_for(paths, _folder(args.folder)))
    else:
        scope, mirrors = Scope.global_(), all_mirror_hosts(paths)
    store = PolicyStore()
    rules = registry_rules(scope, mirrors)
    try:
        store.load()
        for rule in rules:
            store.add(rule)
    except (PolicyError, OSError) as exc:
        print(f"piwork env: cannot save the rules: {exc}", file=sys.stderr)
        return 1
    print(f"saved {len(rules)} rules in {store.path}:")
    for rule in rules:
        print(f"  {rule.id}: {rule.describe()}")
    print(WHAT_IT_ALLOWS)
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    import asyncio

    from piwork.cli.run_cmd import TerminalAsker, TerminalConsole, _interactive
    from piwork.config import get_paths
    from piwork.env.build import build_env
    from piwork.env.dockerfile import find_file
    from piwork.run.permissions import Asker

    folder = _folder(args.folder)
    if not folder.is_dir():
        print(
            f"piwork env build: {folder} is not a folder; name the build folder (the one "
            "with piwork.Dockerfile), or run it there",
            file=sys.stderr,
        )
        return 2
    file = find_file(folder, args.file)

    def say(message: str) -> None:
        print(f"piwork env build: {message}", file=sys.stderr, flush=True)

    def out(line: str) -> None:
        print(f"  | {line}", flush=True)

    async def go() -> int:
        console: TerminalConsole | None = None
        asker: Asker | None = None  # no terminal: the build denies what the policy leaves open
        if _interactive():
            console = TerminalConsole()
            console.start()
            asker = TerminalAsker(console)
        try:
            result = await build_env(
                folder,
                file,
                paths=get_paths(),
                out=out,
                say=say,
                asker=asker,
                step_timeout=args.step_timeout,
                memory_mb=args.memory,
                cpus=args.cpus,
                accel=args.accel,
            )
        finally:
            if console is not None:
                console.close()
        if not result.cached:
            say(
                f"built layer {result.layer} ({result.steps_run} step(s) in the VM, "
                f"{result.seconds:.0f} s)"
            )
        print(f"{folder}: the next task starts from layer {result.layer}")
        return 0

    return int(asyncio.run(go()))


def cmd_import(args: argparse.Namespace) -> int:
    from piwork.env.importer import check_archive, import_image

    folder = _folder(args.folder)
    if not folder.is_dir():
        print(
            f"piwork env import: {folder} is not a folder; name the working folder whose "
            "tasks should run on the image",
            file=sys.stderr,
        )
        return 2
    archive = Path(args.archive).expanduser().resolve()
    check_archive(archive)  # before the store is touched: a usage error (exit 2)
    store = default_store()
    result = import_image(store, archive)
    # File names and the config come from the archive: printed inert, one line each.
    for change in result.removed[:20]:
        print(f"piwork env import: {sanitize(change, one_line=True)}", file=sys.stderr)
    if len(result.removed) > 20:
        print(f"piwork env import: and {len(result.removed) - 20} more", file=sys.stderr)
    how = "cached" if result.cached else f"imported, {_mb(result.bytes)}"
    print(f"image {result.id} ({how})")
    if result.env or result.workdir:
        names = sanitize(" ".join(name for name, _ in result.env), one_line=True)
        workdir = sanitize(result.workdir or "/", one_line=True)
        print(f"  its Env ({names or 'none'}) and WorkingDir ({workdir}) apply to tasks' shells")
    store.use_image(folder, result.id)
    print(f"{folder}: the next task runs on image {result.id} (piwork env reset goes back)")
    return 0
