"""A ``.git`` the guest makes in the task's outputs share is moved out of it (no VM).

The working folder needs no such guard any more: the guest never writes it
(tests/vm/test_vm_changes_attack.py). The outputs share it writes directly:
every git metadata entry there (a ``.git`` directory or file, a bare-looking
directory) is moved aside, through directory fds, never following a link.
"""

from __future__ import annotations

import os
from pathlib import Path

from piwork.vm import gitguard


def make_outputs(root: Path) -> Path:
    out = root / "outputs"
    (out / "report").mkdir(parents=True)
    (out / "report" / "a.md").write_text("# report\n")
    (out / "repo" / ".git").mkdir(parents=True)
    (out / "repo" / ".git" / "config").write_text("[core]\n\tfsmonitor = evil\n")
    (out / "wt" / ".git").parent.mkdir(parents=True)
    (out / "wt" / ".git").write_text("gitdir: ../store/wt.git\n")
    (out / "bare" / "objects").mkdir(parents=True)
    (out / "bare" / "refs").mkdir()
    (out / "bare" / "HEAD").write_text("ref: refs/heads/x\n")
    (out / "esc\x1b]52;c;cm0K\x07\n" / ".git").mkdir(parents=True)  # a name made to print
    (root / "outside").mkdir()
    (out / "linked").symlink_to(root / "outside")
    return out


def test_scan_finds_dirs_gitlinks_and_bare_repos_without_following_links(tmp_path: Path) -> None:
    out = make_outputs(tmp_path)
    (tmp_path / "outside" / ".git").mkdir()
    found = {e.path.relative_to(out).as_posix(): e.kind for e in gitguard.scan(out)}
    assert found == {
        "repo/.git": "dir",
        "wt/.git": "file",
        "bare": "bare",
        "esc\x1b]52;c;cm0K\x07\n/.git": "dir",
    }


def test_git_metadata_in_the_outputs_is_moved_aside_and_said_inertly(tmp_path: Path) -> None:
    out = make_outputs(tmp_path)
    dest = tmp_path / "task" / "moved-aside"
    moved, failed = gitguard.move_aside([out], dest)
    assert failed == []
    assert sorted(m.original.relative_to(out).as_posix() for m in moved) == [
        "bare",
        "esc\x1b]52;c;cm0K\x07\n/.git",
        "repo/.git",
        "wt/.git",
    ]
    for m in moved:
        assert not os.path.lexists(m.original)
        assert dest in m.now.parents
        assert "moved aside" in m.note() and "\x1b" not in m.note() and "\n" not in m.note()
    assert (out / "report" / "a.md").read_text() == "# report\n"
    assert gitguard.move_aside([out], dest) == ([], [])  # nothing left the second time


def test_a_bare_looking_share_root_is_disarmed_in_place(tmp_path: Path) -> None:
    out = tmp_path / "plain"
    out.mkdir()
    for d in ("objects", "refs"):
        (out / d).mkdir()
    (out / "HEAD").write_text("ref: refs/heads/main\n")
    moved, failed = gitguard.move_aside([out], tmp_path / "dest")
    assert failed == [] and [m.now for m in moved] == [out / "HEAD.piwork-moved"]
    assert gitguard.scan(out) == []  # git no longer takes it for a repository


def test_an_entry_swapped_after_the_scan_is_left_for_the_next_call(tmp_path: Path) -> None:
    out = make_outputs(tmp_path)
    (out / "src" / ".git").mkdir(parents=True)
    [entry] = [e for e in gitguard.scan(out) if e.path == out / "src" / ".git"]
    os.rename(out / "src" / ".git", out / "src" / "elsewhere")
    (out / "src" / ".git").mkdir()  # another inode under the same name
    assert gitguard._move_one(out, entry, tmp_path / "dest") is None
    assert (out / "src" / ".git").is_dir()
    moved, _ = gitguard.move_aside([out], tmp_path / "dest")
    assert out / "src" / ".git" in [m.original for m in moved]
