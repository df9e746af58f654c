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

COMMAND_MODULES: tuple[str, ...] = (
    "piwork.cli.run_cmd",
    "piwork.cli.pack_cmd",
    "piwork.cli.doctor_cmd",
    "piwork.cli.tasks_cmd",
    "piwork.cli.policy_cmd",
    "piwork.cli.auth_cmd",
    "piwork.cli.models_cmd",
    "piwork.cli.bench_cmd",
    "piwork.cli.changes_cmd",
    "piwork.cli.preview_cmd",
    "piwork.cli.env_cmd",
    "piwork.cli.hosts_cmd",
    "piwork.gui.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="piwork",
        description="Run the pi coding agent in a QEMU VM sandbox, headless.",
    )
    parser.add_argument("--version", action="version", version=f"piwork {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command group not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None and not (sys.argv[1:] if argv is None else list(argv)):
        # `piwork` alone opens the desktop app (`piwork gui`).
        from piwork.gui.cli import open_app

        return open_app()
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
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
