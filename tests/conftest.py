"""Suite-wide isolation: no test touches the person's real tasks, policy or keys.

Every test session gets a private ``PIWORK_HOME``. Runtime packs are large and
content-addressed, so they stay in the real user cache (``PIWORK_PACK_CACHE``)
where a second run finds them; a pack is only reused when its inputs match.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures tests reported (tests/helpers/figures.py): fuzz cases, the containment score."""
    from tests.helpers.figures import FIGURES

    if FIGURES:
        terminalreporter.section("figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
