"""The newc writer: what the kernel unpacks must be exactly the tree we meant."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from piwork.pack.cpio import (
    HEADER_LEN,
    TRAILER,
    CpioEntry,
    entries_from_tree,
    read_newc,
    write_newc,
    write_tree,
)


def make_tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "busybox").write_bytes(b"\x7fELF" + bytes(range(256)) * 3)
    (root / "bin" / "busybox").chmod(0o755)
    (root / "bin" / "sh").symlink_to("/bin/busybox")
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "passwd").chmod(0o600)  # the archive normalises this to 0644
    (root / "empty").mkdir()
    (root / "odd-sized-a").write_bytes(b"a")
    (root / "odd-sized-abc").write_bytes(b"abc")
    (root / "zero").write_bytes(b"")
    return root


def archive(root: Path, tmp: Path, **kw: object) -> Path:
    dest = tmp / "out.cpio"
    write_tree(root, dest, **kw)  # type: ignore[arg-type]
    return dest


def test_round_trip_through_real_cpio(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    out = archive(src, tmp_path)
    dest = tmp_path / "extracted"
    dest.mkdir()
    with out.open("rb") as fh:
        subprocess.run(["cpio", "-idm", "--quiet"], stdin=fh, cwd=dest, check=True)
    assert (dest / "bin" / "busybox").read_bytes() == (src / "bin" / "busybox").read_bytes()
    assert os.readlink(dest / "bin" / "sh") == "/bin/busybox"
    assert (dest / "etc" / "passwd").read_text() == "root:x:0:0:root:/root:/bin/sh\n"
    assert (dest / "empty").is_dir()
    assert (dest / "odd-sized-abc").read_bytes() == b"abc"
    assert (dest / "zero").read_bytes() == b""
    assert stat.S_IMODE((dest / "bin" / "busybox").stat().st_mode) == 0o755


def test_members_are_sorted_parents_first_with_normalised_metadata(tmp_path: Path) -> None:
    out = archive(make_tree(tmp_path / "src"), tmp_path, mtime=0)
    with out.open("rb") as fh:
        members = list(read_newc(fh))
    names = [m.name for m in members]
    assert names == sorted(names, key=lambda n: n.split("/"))
    assert names.index("bin") < names.index("bin/busybox")
    by_name = {m.name: m for m in members}
    assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 for m in members)
    assert stat.S_ISLNK(by_name["bin/sh"].mode) and by_name["bin/sh"].data == b"/bin/busybox"
    assert stat.S_ISDIR(by_name["empty"].mode) and by_name["empty"].nlink == 2
    assert stat.S_IMODE(by_name["etc/passwd"].mode) == 0o644


def test_every_member_and_its_data_start_on_a_four_byte_boundary(tmp_path: Path) -> None:
    out = archive(make_tree(tmp_path / "src"), tmp_path)
    blob = out.read_bytes()
    assert len(blob) % 4 == 0
    pos = 0
    while True:
        assert pos % 4 == 0 and blob[pos : pos + 6] == b"070701"
        namesize = int(blob[pos + 94 : pos + 102], 16)
        filesize = int(blob[pos + 54 : pos + 62], 16)
        name = blob[pos + HEADER_LEN : pos + HEADER_LEN + namesize - 1].decode()
        data_at = pos + HEADER_LEN + namesize
        data_at += (4 - data_at % 4) % 4
        assert data_at % 4 == 0
        if name == TRAILER:
            break
        pos = data_at + filesize
        pos += (4 - pos % 4) % 4


def test_same_tree_gives_same_bytes_whatever_the_timestamps(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b, symlinks=True)
    os.utime(b / "bin" / "busybox", (1_000_000, 1_000_000))
    (tmp_path / "out-a").mkdir()
    (tmp_path / "out-b").mkdir()
    first = archive(a, tmp_path / "out-a").read_bytes()
    second = archive(b, tmp_path / "out-b").read_bytes()
    assert first == second


def test_extra_members_add_device_nodes_and_override_modes(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src")
    (src / "tmp").mkdir()
    out = archive(
        src,
        tmp_path,
        extra=[
            CpioEntry("dev/console", "chardev", 0o600, rdev=(5, 1)),
            CpioEntry("tmp", "dir", 0o1777),
            CpioEntry("etc/motd", "file", 0o644, data=b"hello\n"),
        ],
    )
    with out.open("rb") as fh:
        by_name = {m.name: m for m in read_newc(fh)}
    assert stat.S_ISCHR(by_name["dev/console"].mode) and by_name["dev/console"].rdev == (5, 1)
    assert stat.S_ISDIR(by_name["dev"].mode)  # implicit parent
    assert stat.S_IMODE(by_name["tmp"].mode) == 0o1777
    assert by_name["etc/motd"].data == b"hello\n"


def test_large_files_are_streamed_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "src" / "big"
    big.parent.mkdir()
    with big.open("wb") as fh:
        fh.truncate(5 * (1 << 20) + 3)
    reads: list[int] = []
    real_open = Path.open

    def spying_open(self: Path, *args: object, **kwargs: object) -> object:
        fh = real_open(self, *args, **kwargs)  # type: ignore[call-overload]
        if self == big:
            real_read = fh.read

            def read(n: int = -1) -> bytes:
                reads.append(n)
                return bytes(real_read(n))

            fh.read = read
        return fh

    monkeypatch.setattr(Path, "open", spying_open)
    out = io.BytesIO()
    write_newc(entries_from_tree(big.parent), out)
    assert reads and all(0 < n <= (1 << 20) for n in reads)
    assert len(out.getvalue()) > 5 * (1 << 20)


def test_rejects_duplicate_and_invalid_names() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        write_newc([CpioEntry("a", "dir"), CpioEntry("a/", "dir")], io.BytesIO())
    with pytest.raises(ValueError, match="invalid"):
        write_newc([CpioEntry(TRAILER, "file", data=b"")], io.BytesIO())
