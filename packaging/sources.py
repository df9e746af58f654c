"""Copy the pack's build inputs (``runtime-pack/``, ``vm-image/``) into a built package.

Used by ``setup.py`` so a wheel carries them as ``piwork/_sources/...`` and
``piwork pack build`` works from an installed wheel (``piwork.config.repo_root``
finds them there). No imports beyond the standard library: this runs in pip's
isolated build environment. The skip rules are those of
``piwork.pack.inputs.input_files`` (tests/gui/test_packaging.py keeps them equal),
so the installed copy hashes to the same pack id as the checkout.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

INPUT_DIRS = ("vm-image", "runtime-pack")
SKIP_DIRS = frozenset({"node_modules", "tests", "test", "__pycache__", ".pytest_cache"})
SKIP_SUFFIXES = (".pyc", ".swp", "~")
SKIP_NAMES = frozenset({".DS_Store"})


def copy_sources(src_root: Path, dest_root: Path) -> list[str]:
    """Copy the input files (with their mode bits) from ``src_root`` to ``dest_root``."""
    copied: list[str] = []
    for top in INPUT_DIRS:
        for dirpath, dirnames, filenames in os.walk(src_root / top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in filenames:
                if name in SKIP_NAMES or name.endswith(SKIP_SUFFIXES):
                    continue
                src = Path(dirpath) / name
                if not src.is_file() or src.is_symlink():
                    continue
                rel = src.relative_to(src_root)
                dst = dest_root / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
                copied.append(rel.as_posix())
    return sorted(copied)
