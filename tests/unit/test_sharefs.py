"""Host-side file access inside shares: a link the guest planted is never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from piwork.sharefs import (
    UnsafePathError,
    lstat_beneath,
    open_beneath,
    read_beneath,
    walk_beneath,
    write_atomic_beneath,
)


@pytest.fixture
def share(tmp_path: Path) -> Path:
    root = tmp_path / "share"
    root.mkdir()
    return root


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    f = tmp_path / "victim.txt"
    f.write_text("host secret\n")
    return f


def test_write_replaces_a_planted_link_instead_of_writing_through_it(
    share: Path, victim: Path
) -> None:
    (share / "agent").mkdir()
    (share / "agent" / "models.json").symlink_to(victim)
    write_atomic_beneath(share, "agent/models.json", b"{}")
    assert victim.read_text() == "host secret\n"
    target = share / "agent" / "models.json"
    assert not target.is_symlink()
    assert target.read_bytes() == b"{}"


def test_write_refuses_a_linked_directory_on_the_way(share: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (share / "agent").symlink_to(outside)
    with pytest.raises(UnsafePathError):
        write_atomic_beneath(share, "agent/models.json", b"{}")
    assert list(outside.iterdir()) == []


def test_write_creates_missing_directories(share: Path) -> None:
    write_atomic_beneath(share, "a/b/c.txt", b"x")
    assert (share / "a" / "b" / "c.txt").read_bytes() == b"x"
    assert [p.name for p in (share / "a" / "b").iterdir()] == ["c.txt"]  # no temp left


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../x", "a/../../x", "a/\0b", "."])
def test_malformed_paths_are_refused_before_any_lookup(share: Path, bad: str) -> None:
    with pytest.raises(UnsafePathError):
        write_atomic_beneath(share, bad, b"x")
    with pytest.raises(UnsafePathError):
        open_beneath(share, bad)


def test_read_refuses_a_link_at_the_end(share: Path, victim: Path) -> None:
    (share / "preview.md").symlink_to(victim)
    with pytest.raises(UnsafePathError):
        read_beneath(share, "preview.md", max_bytes=100)


def test_read_refuses_a_fifo_and_bounds_the_size(share: Path) -> None:
    os.mkfifo(share / "pipe")
    with pytest.raises(UnsafePathError):
        read_beneath(share, "pipe", max_bytes=100)
    (share / "big").write_bytes(b"x" * 5000)
    assert read_beneath(share, "big", max_bytes=1000) == b"x" * 1000


def test_lstat_reports_the_link_itself(share: Path, victim: Path) -> None:
    (share / "l").symlink_to(victim)
    assert lstat_beneath(share, "l").st_size == len(str(victim))


def test_walk_lists_links_as_links_and_never_enters_them(share: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (share / "d").mkdir()
    (share / "d" / "f").write_text("f")
    (share / "escape").symlink_to(outside)
    (share / ".git").mkdir()
    (share / ".git" / "HEAD").write_text("ref")
    entries = {e.path: e for e in walk_beneath(share, skip_dirs=frozenset({".git"}))}
    assert set(entries) == {"d", "d/f", "escape", ".git"}
    assert entries["escape"].is_link
    assert entries["d"].is_dir and entries["d/f"].is_file


def test_walk_under_a_subfolder_never_reaches_it_through_a_link(
    share: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside-under"
    outside.mkdir()
    (outside / "secret").write_text("s")
    (share / "a" / "b").mkdir(parents=True)
    (share / "a" / "b" / "f").write_text("f")
    (share / "a" / "link").symlink_to(outside)
    (share / "alias").symlink_to("a")
    assert [e.path for e in walk_beneath(share, under="a/b")] == ["f"]
    for through in ("a/link", "alias/b"):
        with pytest.raises(UnsafePathError):
            list(walk_beneath(share, under=through))
    with pytest.raises(UnsafePathError):
        list(walk_beneath(share, under="../outside-under"))


def test_walk_is_bounded(share: Path) -> None:
    for i in range(50):
        (share / f"f{i}").write_text("")
    assert len(list(walk_beneath(share, max_entries=10))) == 10


def test_mkdir_creates_missing_dirs_and_never_follows_a_planted_link(
    share: Path, tmp_path: Path
) -> None:
    from piwork.sharefs import mkdir_beneath

    mkdir_beneath(share, "home")
    assert (share / "home").is_dir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (share / "a").symlink_to(outside)
    with pytest.raises(UnsafePathError):
        mkdir_beneath(share, "a/b")
    assert list(outside.iterdir()) == []
    (share / "dangling").symlink_to(tmp_path / "made-by-host")
    mkdir_beneath(share, "dangling")  # left alone, not followed
    assert not (tmp_path / "made-by-host").exists()


def test_unlink_and_readlink_act_on_the_link_itself(share: Path, victim: Path) -> None:
    from piwork.sharefs import readlink_beneath, unlink_beneath

    (share / "ln").symlink_to(victim)
    assert readlink_beneath(share, "ln") == str(victim)
    unlink_beneath(share, "ln")
    assert not (share / "ln").is_symlink() and victim.read_text() == "host secret\n"


def test_rmtree_of_a_share_removes_links_not_their_targets(share: Path, tmp_path: Path) -> None:
    """``tasks rm`` relies on shutil.rmtree's fd-based walk: links are unlinked, never entered."""
    import shutil

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (share / "sub").mkdir()
    (share / "sub" / "dir-link").symlink_to(outside)
    (share / "file-link").symlink_to(outside / "keep.txt")
    assert shutil.rmtree.avoids_symlink_attacks
    shutil.rmtree(share)
    assert (outside / "keep.txt").read_text() == "keep"
