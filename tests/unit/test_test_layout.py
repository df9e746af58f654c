"""The suite's own layout: no test code imports a test module or a conftest.

What two test modules share lives in ``tests/helpers`` (plain code) or in a
``conftest.py`` (fixtures, which pytest hands down without an import). A test
module imported by another runs its module-level code twice under two names,
re-registers its fixtures where they were never meant to be, and ties two
files together so that renaming a helper breaks a test in another folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _module_of(path: Path) -> list[str]:
    return ["tests", *path.relative_to(TESTS).with_suffix("").parts]


def _forbidden(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return last == "conftest" or last.startswith("test_")


def imported_test_code(text: str, path: Path) -> list[str]:
    """``line: module`` for each import of a test module or a conftest in ``text``,
    the source of the file at ``path`` in the tree (relative imports resolve from it)."""
    package = _module_of(path)[:-1]
    found = []
    for node in ast.walk(ast.parse(text, str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = [f"{module}.{a.name}" for a in node.names]
            if node.module:
                names.append(module)
        found += [f"{node.lineno}: {n}" for n in names if _forbidden(n)]
    return found


def test_no_test_code_imports_a_test_module_or_a_conftest() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 100  # the whole suite was read
    bad = [
        f"{f.relative_to(TESTS)}:{h}" for f in files for h in imported_test_code(f.read_text(), f)
    ]
    assert bad == [], "move what is shared to tests/helpers or a fixture:\n" + "\n".join(bad)


def test_the_check_sees_each_spelling_of_such_an_import() -> None:
    # The rule must catch every spelling, or the test above passes for nothing.
    here = TESTS / "vm" / "test_example.py"
    for line in (
        "from .conftest import x",
        "from . import conftest",
        "from .test_vm_agent import y",
        "from . import test_vm_agent as base",
        "from ..unit.test_checkpoints import Run",
        "from tests.vm.conftest import pack",
        "import tests.hosts.test_hosts_run",
        "def f():\n    from .test_vm_resume import Cli\n",
    ):
        assert imported_test_code(line, here), line
    fine = ("from tests.helpers.vm import per_prompt", "from ..helpers import vm", "import os")
    for line in fine:
        assert imported_test_code(line, here) == [], line
