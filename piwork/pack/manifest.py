"""The runtime pack manifest: what a pack holds and how to boot it.

A pack is a directory ``<cache>/packs/<pack_id>/`` with a ``manifest.json``
written last. ``pack_id`` is the content hash of the build *inputs* (pins,
lock file, guest files, builder version), so a second build with the same
inputs finds the finished pack and does nothing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from piwork.fsutil import sha256_file

PACK_FORMAT = 1
MANIFEST_NAME = "manifest.json"
__all__ = ["MANIFEST_NAME", "PACK_FORMAT", "Manifest", "PackFile", "sha256_file"]


class PackFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str = Field(description="Path relative to the pack directory, '/'-separated.")
    sha256: str
    size: int


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = PACK_FORMAT
    pack_id: str
    arch: str = "x86_64"
    kernel: str = Field(description="Relative path of the kernel image.")
    initrd: str = Field(description="Relative path of the initramfs (newc cpio).")
    rootfs: str | None = Field(
        default=None,
        description="Relative path of the read-only disk image /init mounts at /opt/piwork.",
    )
    workbench: str | None = Field(
        default=None,
        description="Relative path of the workbench image (Debian userland for the agent's bash).",
    )
    packages: dict[str, str] = Field(
        default_factory=dict,
        description="Every Debian package in the workbench image -> its exact version.",
    )
    cmdline: str = Field(description="Base kernel command line; the host appends transport args.")
    versions: dict[str, str] = Field(description="kernel, busybox, node, pi, libc, ...")
    files: list[PackFile]
    created_at: str
    builder: str = Field(description="piwork version that built the pack.")
    stats: dict[str, int] = Field(
        default_factory=dict,
        description="Build figures: sizes before/after pruning and stripping, file counts.",
    )

    def file(self, rel: str) -> PackFile:
        for f in self.files:
            if f.path == rel:
                return f
        raise KeyError(rel)
