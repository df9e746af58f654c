"""The arm64 pack and VM, under emulation (issue 32): opt-in, ``PIWORK_ARM64=1``.

On an x86_64 host everything arm64 is emulated: the pack build runs the arm64
node (smoke tests, V8 code cache and snapshot) and the workbench's maintainer
scripts through qemu-user (binfmt_misc), and the VM boots under
qemu-system-aarch64 with TCG. That is minutes of CPU the default suite's 20
minutes do not have, so these tests are deselected (not skipped) unless
``PIWORK_ARM64=1`` (then ``scripts/test.sh`` runs them with the rest; docs/arm64.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from piwork.pack.manifest import Manifest

ENV = "PIWORK_ARM64"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(ENV) == "1":
        return
    here = Path(__file__).parent
    keep = [i for i in items if here not in Path(str(i.fspath)).parents]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@pytest.fixture(scope="session")
def arm64_pack() -> tuple[Path, Manifest]:
    """The arm64 pack for this source tree (built once, cached by content hash)."""
    from piwork.pack import build_pack, load_manifest

    result = build_pack(arch="arm64")
    print(
        f"arm64 pack {result.manifest.pack_id}: "
        + (f"built in {result.seconds:.0f}s" if result.built else "cached")
    )
    return result.pack_dir, load_manifest(result.pack_dir)
