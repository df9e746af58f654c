"""`piwork` command line: a thin front end over the runner and the stores.

Each command group lives in its own module exposing
``register(subparsers) -> None``; the parser sets ``func`` (a callable taking
the parsed namespace and returning an exit code) on every leaf command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from piwork import __version__
from piwork.errors import describe

COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    # module: the top-level commands its register() adds
    "piwork.cli.run_cmd": ("run", "resume"),
    "piwork.cli.pack_cmd": ("pack",),
    "piwork.cli.doctor_cmd": ("doctor",),
    "piwork.cli.tasks_cmd": ("tasks",),
    "piwork.cli.policy_cmd": ("policy",),
    "piwork.cli.auth_cmd": ("auth",),
    "piwork.cli.models_cmd": ("models",),
    "piwork.cli.pi_cmd": ("trust", "mcp"),
    "piwork.cli.bench_cmd": ("bench",),
    "piwork.cli.changes_cmd": ("changes", "undo"),
    "piwork.cli.preview_cmd": ("preview",),
    "piwork.cli.env_cmd": ("env",),
    "piwork.cli.hosts_cmd": ("hosts",),
    "piwork.cli.network_cmd": ("network",),
    "piwork.cli.restore_cmd": ("restore",),
    "piwork.gui.cli": ("gui",),
}


def _modules_for(argv: Sequence[str] | None) -> list[str]:
    """The command modules a parse of ``argv`` needs (all of them if ``argv`` is None).

    Importing every command module costs ~0.8 s (the runner, aiohttp, pydantic
    models), which `piwork tasks list` or the app (`piwork` alone) should not
    pay. The command is the first word that is not an option (the top-level
    parser's options take no value); a word that names no command loads them
    all, so argparse lists the choices.
    """
    if argv is None:
        return list(COMMAND_MODULES)
    word = next((a for a in argv if not a.startswith("-")), None)
    if word is None:
        # `piwork --help` lists them all; `piwork` alone (the app) and `--version` need none.
        return list(COMMAND_MODULES) if {"-h", "--help"} & set(argv) else []
    owners = [m for m, names in COMMAND_MODULES.items() if word in names]
    return owners or list(COMMAND_MODULES)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv`` (only the modules it needs), or for every command if None."""
    parser = argparse.ArgumentParser(
        prog="piwork",
        description="Run the pi coding agent in a QEMU VM sandbox, headless.",
    )
    parser.add_argument("--version", action="version", version=f"piwork {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _modules_for(argv):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command group not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words)
    args = parser.parse_args(words)
    if args.command is None and not words:
        # `piwork` alone opens the desktop app (`piwork gui`).
        from piwork.gui.cli import open_app

        return open_app()
    func = getattr(args, "func", None)
    if func is None:
        build_parser().print_help()  # every command, as `piwork --help`
        return 2
    try:
        return int(func(args))
    except Exception as exc:  # the one place the CLI shows an error: see piwork.errors
        return fail(exc)
    except KeyboardInterrupt as exc:
        return fail(exc)


def fail(exc: BaseException) -> int:
    """``piwork: <message>`` on stderr; the exit code of the error's kind (piwork.errors)."""
    from piwork.config import get_paths
    from piwork.textsafe import sanitize

    message, code = describe(exc, get_paths().logs / "piwork.log")
    # Messages can carry guest text (pi's stderr tail, the console): inert, always.
    print(f"piwork: {sanitize(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
