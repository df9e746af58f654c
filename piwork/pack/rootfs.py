"""The pack's read-only disk image: node, pi and the guest programs.

Everything under ``/opt/piwork`` of the guest tree (node, pi's tree and
bundle, supervisor, launcher, extensions) goes into one uncompressed erofs
image, ``root.erofs``, which every VM attaches as a read-only virtio-blk disk
and ``/init`` mounts at ``/opt/piwork``. The initramfs keeps only busybox,
/init, the C libraries and the kernel modules: the kernel no longer copies and
unpacks ~170 MB into guest RAM on every boot, the guest reads just the pages it
touches, and those pages sit once in the host's page cache for all VMs.

``mkfs.erofs`` (Debian ``erofs-utils``, pinned in scripts/apt-packages.txt)
builds it without root. Modes are normalised first (0755 / 0644, like the
cpio writer), owners are root, timestamps and UUID are fixed, host xattrs are
left out: the same tree gives the same image.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from piwork.pack.errors import PackError
from piwork.pack.ingredients import run

IMAGE_NAME = "root.erofs"
MOUNT_POINT = "opt/piwork"
FS_TYPE = "erofs"
FIXED_UUID = "7069776f-726b-4000-8000-000000000001"


def normalise_modes(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for d in dirnames:
            if not (base / d).is_symlink():
                (base / d).chmod(0o755)
        for f in filenames:
            p = base / f
            if p.is_symlink():
                continue
            p.chmod(0o755 if p.stat().st_mode & 0o111 else 0o644)
    root.chmod(0o755)


def build_image(tree: Path, dest: Path) -> int:
    """Write ``tree`` as an erofs image at ``dest``; return its size in bytes."""
    if shutil.which("mkfs.erofs") is None:
        raise PackError(
            "mkfs.erofs not found: building a pack makes a read-only erofs disk image "
            "(Debian/Ubuntu: apt-get install erofs-utils, or run scripts/setup.sh)"
        )
    normalise_modes(tree)
    run(
        [
            "mkfs.erofs",
            "--quiet",
            "--all-root",
            "-x-1",  # no xattrs from the build host
            "-T0",
            f"-U{FIXED_UUID}",
            str(dest),
            str(tree),
        ],
        what="mkfs.erofs",
    )
    return dest.stat().st_size
