"""Fixtures shared by the unit tests (helpers live in tests/helpers)."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piwork.config import get_paths
from piwork.pack import ensure_pack, load_manifest
from piwork.pack.cpio import read_newc
from piwork.tasks.store import TaskStore
from tests.helpers.checkpoints import Run


@pytest.fixture(scope="module")
def guest_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guest's file tree: the pack's initramfs with its disk at /opt/piwork."""
    pack_dir = ensure_pack()
    manifest = load_manifest(pack_dir)
    assert manifest.rootfs is not None
    root = tmp_path_factory.mktemp("guest")
    with (pack_dir / manifest.initrd).open("rb") as fh:
        for m in read_newc(fh):
            dest = root / m.name
            kind = stat.S_IFMT(m.mode)
            if kind == stat.S_IFDIR:
                dest.mkdir(parents=True, exist_ok=True)
            elif kind == stat.S_IFLNK:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(m.data.decode())
            elif kind == stat.S_IFREG:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(m.data)
                dest.chmod(stat.S_IMODE(m.mode))
            # device nodes: not needed to run node
    subprocess.run(
        ["fsck.erofs", f"--extract={root / 'opt' / 'piwork'}", str(pack_dir / manifest.rootfs)],
        check=True,
        capture_output=True,
    )
    return root


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    f = tmp_path / "work"
    f.mkdir()
    return f


@pytest.fixture
def make_run(folder: Path) -> Iterator[Any]:
    store = TaskStore(get_paths().tasks)

    def make() -> Run:
        return Run(store.create("checkpoint test", folder), folder)

    yield make
    store.close()
