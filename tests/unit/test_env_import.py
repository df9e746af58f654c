"""``piwork env import``: archives the test writes itself (no registry), real skopeo, umoci
and mkfs.erofs; the archive's paths and modes are attacks."""

from __future__ import annotations

import stat
import tarfile
from pathlib import Path

import pytest

from piwork.env.importer import archive_kind, import_image, sanitize, unpack
from piwork.env.store import EnvError, EnvStore
from tests.oci_archive import busybox_image, docker_save, entry


def store(tmp_path: Path) -> EnvStore:
    return EnvStore(tmp_path / "data" / "envs", tmp_path / "data" / "tasks")


def test_an_archive_becomes_a_cached_read_only_image(tmp_path: Path) -> None:
    archive = busybox_image(tmp_path / "image.tar", b"marker\n")
    assert archive_kind(archive) == "docker-archive"
    s = store(tmp_path)
    first = import_image(s, archive)
    assert not first.cached and first.id.startswith("i-")
    assert first.path == s.image_path(first.id) and first.path.is_file()
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o400
    with first.path.open("rb") as fh:
        fh.seek(1024)
        assert fh.read(4) == bytes.fromhex("e2e1f5e0")  # erofs superblock magic
    again = import_image(s, archive)
    assert again.cached and again.id == first.id
    assert [p.name for p in s.images_dir.iterdir() if p.name.startswith("tmp-")] == []


def test_an_archive_without_a_shell_or_not_an_image_is_refused(tmp_path: Path) -> None:
    no_shell = docker_save(tmp_path / "x.tar", [[entry("etc/marker", b"x")]])
    with pytest.raises(EnvError, match="has no /bin/sh"):
        import_image(store(tmp_path), no_shell)
    plain = tmp_path / "plain.tar"
    with tarfile.open(plain, "w") as tar:
        tar.add(no_shell, arcname="something")
    with pytest.raises(EnvError, match="neither an OCI archive"):
        import_image(store(tmp_path), plain)
    (tmp_path / "text.tar").write_text("not a tar")
    with pytest.raises(EnvError, match="not a tar archive"):
        import_image(store(tmp_path), tmp_path / "text.tar")


def test_hostile_paths_stay_inside_and_special_files_and_bits_do_not_survive(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = [
        entry("../../escape-dotdot", b"x"),
        entry("/abs-escape-piwork-test", b"x"),
        entry("evil", kind=tarfile.SYMTYPE, link=str(outside), mode=0o777),
        entry("evil/through-link", b"x"),
        entry("rel", kind=tarfile.SYMTYPE, link="../" * 12 + str(outside).lstrip("/")),
        entry("rel/through-rel", b"x"),
        entry("etc", kind=tarfile.DIRTYPE, mode=0o755),
        entry("etc/passwd", b"root:x:0:0::/root:/bin/sh\n"),
        entry("hl", kind=tarfile.LNKTYPE, link="/etc/passwd"),
        entry("dev", kind=tarfile.DIRTYPE, mode=0o755),
        entry("dev/mem-like", kind=tarfile.CHRTYPE),
        entry("dev/blk", kind=tarfile.BLKTYPE),
        entry("dev/fifo", kind=tarfile.FIFOTYPE),
        entry("bin", kind=tarfile.DIRTYPE, mode=0o755),
        entry("bin/suid", b"#!/bin/sh\n", mode=0o4755),
        entry("bin/sgid", b"#!/bin/sh\n", mode=0o2755),
        entry("shared", kind=tarfile.DIRTYPE, mode=0o2775),
    ]
    archive = docker_save(tmp_path / "evil.tar", [evil])
    work = tmp_path / "work"
    work.mkdir()
    rootfs = unpack(archive, work)
    changed = sanitize(rootfs)
    # Nothing left the unpacked root: not by '..', an absolute name or a symlinked parent.
    assert list(outside.iterdir()) == []
    for escaped in ("/abs-escape-piwork-test", "/escape-dotdot", str(tmp_path / "escape-dotdot")):
        assert not Path(escaped).exists(), escaped
    assert (rootfs / "abs-escape-piwork-test").is_file()
    assert (rootfs / outside.relative_to("/") / "through-link").is_file()
    # A hard link to an absolute name links inside the root, not to the host's file.
    assert (rootfs / "hl").read_bytes() == b"root:x:0:0::/root:/bin/sh\n"
    # No device node, FIFO or set-uid/set-gid bit is left for the image.
    for path in rootfs.rglob("*"):
        st = path.lstat()
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)
        if not stat.S_ISLNK(st.st_mode):
            assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), path
    assert "cleared the set-uid/set-gid bit of bin/suid" in changed
    assert "removed dev/fifo (not a file, folder or symlink)" in changed
    # umoci, rootless, makes no device: the node is an empty regular file.
    assert (rootfs / "dev" / "mem-like").stat().st_size == 0


def test_an_oci_archive_is_read_too(tmp_path: Path) -> None:
    """skopeo turns the test's docker-save file into an OCI archive; that imports the same."""
    import shutil
    import subprocess

    docker = busybox_image(tmp_path / "image.tar", b"marker\n")
    oci = tmp_path / "image-oci.tar"
    policy = tmp_path / "policy.json"
    policy.write_text('{"default": [{"type": "insecureAcceptAnything"}]}')
    skopeo = shutil.which("skopeo")
    assert skopeo is not None
    subprocess.run(
        [skopeo, "--policy", str(policy), "copy", "--quiet",
         f"docker-archive:{docker}", f"oci-archive:{oci}:test"],
        check=True,
    )  # fmt: skip
    assert archive_kind(oci) == "oci-archive"
    work = tmp_path / "work"
    work.mkdir()
    rootfs = unpack(oci, work)
    assert (rootfs / "etc" / "piwork-marker").read_bytes() == b"marker\n"
    assert (rootfs / "bin" / "sh").is_symlink()
    result = import_image(store(tmp_path), oci)
    assert result.path.is_file() and not result.cached


def test_images_nothing_uses_are_collected_after_a_grace_time(tmp_path: Path) -> None:
    import os

    s = store(tmp_path)
    folder = tmp_path / "project"
    folder.mkdir()
    imported = import_image(s, busybox_image(tmp_path / "image.tar", b"m\n"))
    meta = s.images_dir / f"{imported.id}.json"
    s.use_image(folder, imported.id)
    old = meta.stat().st_mtime - 7200
    os.utime(meta, (old, old))
    # A task on the folder runs on it: kept after the folder is reset, while the task is.
    task = tmp_path / "data" / "tasks" / "t1"
    task.mkdir(parents=True)
    env = s.prepare(task, folder, size=64 << 20)
    assert env.image == imported.path
    s.reset(folder)
    assert imported.path.is_file()
    (task / "env.json").unlink()  # the task is deleted (piwork tasks rm)
    assert imported.id in s.gc()
    assert not imported.path.exists() and not meta.exists()
    # One just imported is kept whatever uses it (the import points the folder at it next).
    again = import_image(s, tmp_path / "image.tar")
    assert not again.cached and imported.id not in s.gc() and again.path.is_file()
