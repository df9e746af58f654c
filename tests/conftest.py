"""Suite-wide isolation: no test touches the person's real tasks, policy or keys.

Every test session gets a private ``PIWORK_HOME``. Runtime packs are large and
content-addressed, so they stay in the real user cache (``PIWORK_PACK_CACHE``)
where a second run finds them; a pack is only reused when its inputs match.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import platformdirs
import pytest

if TYPE_CHECKING:
    from piwork.pack.manifest import Manifest

os.environ.setdefault("PIWORK_PACK_CACHE", platformdirs.user_cache_dir("piwork"))
os.environ["PIWORK_HOME"] = tempfile.mkdtemp(prefix="piwork-test-home-")


@pytest.fixture(scope="session")
def pack() -> tuple[Path, Manifest]:
    """The runtime pack (built once, cached by content hash) and its manifest."""
    from piwork.pack import ensure_pack, load_manifest

    pack_dir = ensure_pack()
    return pack_dir, load_manifest(pack_dir)


# scripts/test.sh runs the suite on two workers (pytest-xdist, ``--dist loadfile``: a
# file's tests stay together, in order, so module-scoped VMs and scenario files work as
# they do serially). A worker takes the next file when it is nearly done with its own,
# so the longest files must come first or one worker ends minutes after the other.
# Seconds per file measured here (2 cores, TCG, other jobs running: read them as an
# order, not a speed); the --durations table at the end of every run shows what to
# add. A file not listed: one with VM tests before one without, each in its own order.
HEAVY_FILES = {
    "tests/vm/test_vm_workbench.py": 1350,
    "tests/unit/test_pack_build.py": 550,
    "tests/vm/test_vm_trust.py": 280,
    "tests/vm/test_vm_network.py": 230,
    "tests/unit/test_gate_shells.py": 210,
    "tests/vm/test_vm_preview.py": 150,
    "tests/vm/test_vm_env_chain.py": 150,
    "tests/vm/test_vm_resume.py": 130,
}
VM_FILE = 60
"""The weight of an unlisted file with a test marked ``vm``."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (each worker collects, all in the same order): heaviest files first."""
    if not hasattr(config, "workerinput"):
        return
    weight: dict[Path, int] = {}
    for item in items:
        path = item.path
        rel = path.relative_to(config.rootpath).as_posix()
        vm = VM_FILE if item.get_closest_marker("vm") else 0
        weight[path] = max(weight.get(path, 0), HEAVY_FILES.get(rel, vm))
    items.sort(key=lambda item: -weight[item.path])  # stable: a file keeps its order


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: hand the figures its tests reported to the controller."""
    from tests.helpers.figures import FIGURES

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["figures"] = list(FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On the xdist controller: keep the figures a finished worker reported."""
    from tests.helpers.figures import FIGURES

    FIGURES.extend(getattr(node, "workeroutput", {}).get("figures", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures tests reported (tests/helpers/figures.py): fuzz cases, the containment score."""
    from tests.helpers.figures import FIGURES

    if FIGURES:
        terminalreporter.section("figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
