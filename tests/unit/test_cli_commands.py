"""`piwork`'s parser loads only the command module a command needs.

Every command module together costs ~0.8 s of imports (the runner, aiohttp,
pydantic models): `piwork tasks list` and the app (`piwork` alone) must not
pay for `piwork run`'s. The table of which module adds which command is
checked against what the modules really register.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from piwork.cli.main import COMMAND_MODULES, build_parser


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


@pytest.mark.parametrize("module", list(COMMAND_MODULES))
def test_the_table_names_exactly_the_commands_each_module_registers(module: str) -> None:
    import importlib

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    importlib.import_module(module).register(sub)
    assert _commands(parser) == set(COMMAND_MODULES[module])


def test_every_command_parses_with_only_its_module() -> None:
    everything = _commands(build_parser())
    assert everything == {c for names in COMMAND_MODULES.values() for c in names}
    for command in everything:
        # the command's own parser is there, and `--help` of it is its own
        assert command in _commands(build_parser([command, "--help"]))
        assert _commands(build_parser([command])) <= everything


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(["--help"]).parse_args(["--help"])
    out = capsys.readouterr().out
    listed = {
        line.split()[0] for line in out.splitlines() if line.startswith("    ") and line.split()
    }
    assert {c for names in COMMAND_MODULES.values() for c in names} <= listed, out


def test_a_word_that_names_no_command_loads_them_all_so_argparse_lists_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser(["tsaks", "list"]).parse_args(["tsaks", "list"])
    err = capsys.readouterr().err
    assert "invalid choice: 'tsaks'" in err
    for command in ("run", "tasks", "policy", "env"):
        assert command in err


def _imported_after(argv: list[str]) -> dict[str, bool]:
    code = (
        "import sys, json\n"
        "from piwork.cli.main import build_parser\n"
        f"build_parser({argv!r})\n"
        "print(json.dumps({m: m in sys.modules for m in "
        "('piwork.runner', 'aiohttp', 'piwork.cli.run_cmd', 'piwork.cli.tasks_cmd')}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded: dict[str, bool] = json.loads(out.stdout)
    return loaded


def test_tasks_policy_and_the_app_do_not_import_the_runner() -> None:
    for argv in (["tasks", "list"], ["policy", "list"], [], ["--version"]):
        loaded = _imported_after(argv)
        assert not loaded["piwork.runner"], argv
        assert not loaded["aiohttp"], argv
        assert not loaded["piwork.cli.run_cmd"], argv
    assert _imported_after(["tasks", "list"])["piwork.cli.tasks_cmd"]
    run = _imported_after(["run", "--help"])
    assert run["piwork.runner"] and not run["piwork.cli.tasks_cmd"]
