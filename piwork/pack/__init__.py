"""Runtime packs: build, find, verify and list them.

The runner needs only :func:`ensure_pack` (or :func:`find_pack`) and
:func:`load_manifest`; see ``piwork/pack/build.py`` for what a pack holds.
"""

from __future__ import annotations

from piwork.pack.build import BuildResult, build_pack, ensure_pack, find_pack
from piwork.pack.cache import PackInfo, VerifyResult, list_packs, load_manifest, verify
from piwork.pack.errors import ManifestError, PackError, PinUnavailableError
from piwork.pack.manifest import Manifest, PackFile

__all__ = [
    "BuildResult",
    "Manifest",
    "ManifestError",
    "PackError",
    "PackFile",
    "PackInfo",
    "PinUnavailableError",
    "VerifyResult",
    "build_pack",
    "ensure_pack",
    "find_pack",
    "list_packs",
    "load_manifest",
    "verify",
]
