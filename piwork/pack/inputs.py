"""The content hash of a pack's build inputs, which names the pack (``pack_id``).

Two builds from the same inputs must produce the same pack, so the hash covers
everything that shapes the pack's bytes and nothing else: the builder's format
version and its bundling switch (``bundle.KEPT_EXTERNAL``), the Debian pins,
the npm lock file, and every file under ``vm-image/``
and ``runtime-pack/`` (path, content, executable bit) except installed
``node_modules`` and tests. Changing any guest file therefore yields a new pack;
running ``npm install`` in the source tree does not.

The architecture (:mod:`piwork.arch`) is part of the hash: an arm64 pack's
inputs are the amd64 ones plus ``vm-image/pins-arm64.toml`` and an ``arch``
line. An amd64 pack's hash is what it was before arm64 packs existed: it leaves
out the other architectures' pin files and adds no line, so adding arm64 packs
rebuilt nobody's amd64 pack.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from piwork import arch as arches
from piwork.pack.bundle import KEPT_EXTERNAL
from piwork.pack.manifest import PACK_FORMAT

# Bump when the builder's output changes for the same inputs (layout, pruning
# rules, cpio details): the old packs are then simply not found any more.
BUILDER_VERSION = 8

INPUT_DIRS: tuple[str, ...] = ("vm-image", "runtime-pack")
_SKIP_DIR_NAMES = frozenset({"node_modules", "tests", "test", "__pycache__", ".pytest_cache"})
_SKIP_FILE_SUFFIXES = (".pyc", ".swp", "~")
_SKIP_FILE_NAMES = frozenset({".DS_Store"})
PACK_ID_LEN = 16


def pins_file(arch: arches.Arch) -> str:
    """The pin file of ``arch``'s Debian ingredients (``vm-image/pins.toml`` for amd64)."""
    return PINS_AMD64 if arch is arches.AMD64 else f"vm-image/pins-{arch.debian}.toml"


PINS_AMD64 = "vm-image/pins.toml"


def _other_arches_pins(arch: arches.Arch) -> frozenset[str]:
    return frozenset(pins_file(a) for a in arches.ARCHES.values() if a is not arch)


def input_files(source_root: Path, arch: arches.Arch | None = None) -> list[str]:
    """Sorted '/'-separated paths (relative to ``source_root``) that feed the hash of
    ``arch``'s pack (default: amd64's)."""
    skip = _other_arches_pins(arch or arches.AMD64)
    found: list[str] = []
    for top in INPUT_DIRS:
        base = source_root / top
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIR_NAMES)
            for name in filenames:
                if name in _SKIP_FILE_NAMES or name.endswith(_SKIP_FILE_SUFFIXES):
                    continue
                path = Path(dirpath) / name
                rel = path.relative_to(source_root).as_posix()
                if path.is_file() and rel not in skip:
                    found.append(rel)
    return sorted(found)


def inputs_digest(source_root: Path, arch: arches.Arch | None = None) -> str:
    """Full sha256 hex digest of the build inputs under ``source_root`` for ``arch``
    (default: :func:`piwork.arch.selected`)."""
    arch = arch or arches.selected()
    h = hashlib.sha256()
    h.update(f"piwork-pack format={PACK_FORMAT} builder={BUILDER_VERSION}\n".encode())
    # The builder's one switch that changes the bundle for the same files (which
    # packages stay outside it): a pack made the other way must not be found.
    h.update(f"kept-external={','.join(sorted(KEPT_EXTERNAL))}\n".encode())
    if arch is not arches.AMD64:
        h.update(f"arch={arch.debian}\n".encode())
    for rel in input_files(source_root, arch):
        path = source_root / rel
        executable = bool(path.stat().st_mode & 0o111)
        content = hashlib.sha256(path.read_bytes()).hexdigest()
        h.update(f"{rel}\0{'x' if executable else '-'}\0{content}\n".encode())
    return h.hexdigest()


def compute_pack_id(source_root: Path, arch: arches.Arch | None = None) -> str:
    """The pack id for the source tree and ``arch`` (default: :func:`piwork.arch.selected`):
    a short prefix of :func:`inputs_digest`."""
    return inputs_digest(source_root, arch)[:PACK_ID_LEN]
