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
    except KeyboardInterrupt:
        print("piwork: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
