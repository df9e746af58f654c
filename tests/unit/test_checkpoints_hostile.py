"""Checkpoints attacked from the folder, one test per security-review finding
(2, 6, 7, 12, 13, 14, 15): the real ShadowRepo and RunRecorder, the real git.

Finding 6 (ignored files recorded, a planted .gitignore hides nothing) is
``test_ignored_files_are_recorded_and_a_planted_gitignore_hides_nothing`` in
test_checkpoints.py; the scripted agent flow is at the end of this file.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from piwork.checkpoints import MAX_FILES, list_checkpoints, repo_for, task_changes, undo
from piwork.checkpoints import shadow as shadow_mod
from piwork.checkpoints.api import describe, turn_range
from piwork.checkpoints.shadow import PATH_MAX, ShadowRepo, refused_prefix
from piwork.cli.main import main
from piwork.config import get_paths
from piwork.settings import settings_file
from tests.helpers.checkpoints import Run, changes

POISON = [".GIT/x", "git~1/x", ".git./x", ".git /x", "sub/.Git/config", "GIT~1/y", ".gIt::$DATA/z"]


@contextlib.contextmanager
def file_cap(n: int) -> Iterator[None]:
    settings = get_paths().settings_file
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_bytes(orjson.dumps({"tasks": {"checkpointMaxFileBytes": n}}))
    try:
        yield
    finally:
        settings_file(settings).remove()  # and its last good copy: no settings at all


def recorded(run: Run) -> set[str]:
    return repo_for(run.task).paths_in("refs/heads/checkpoints")


def notes_of(run: Run) -> list[str]:
    return [n for c in list_checkpoints(run.id) for n in c.notes]


# --------------------------------------------------------------------------- finding 2


@pytest.mark.parametrize("poison", POISON)
def test_a_name_git_refuses_never_fails_a_checkpoint_or_the_undo(
    make_run: Any, poison: str
) -> None:
    run: Run = make_run()
    f = run.folder
    (f / "thesis.txt").write_text("chapter one\n")
    run.start()
    run.turn()
    target = f / poison
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("[core]\n\tfsmonitor = evil\n")
    (f / "thesis.txt").write_text("")
    run.turn()  # "before turn 2" must be recorded despite the poison path
    (f / "later.txt").write_text("damage done after the poison\n")
    run.end()
    labels = [c.label for c in list_checkpoints(run.id)]
    assert labels == ["task start", "before turn 1", "before turn 2", "task end"]
    assert changes(run.id, 1) == {"thesis.txt": "modified"}
    assert changes(run.id, 2) == {"later.txt": "added"}
    assert any(n.startswith(poison.rsplit("/", 1)[0]) and ".git" in n for n in notes_of(run))
    assert not any(p.lower().startswith((".git", "git~", "sub/.git")) for p in recorded(run))
    undo(run.id)
    assert (f / "thesis.txt").read_text() == "chapter one\n"
    assert not (f / "later.txt").exists()
    assert target.read_text().startswith("[core]")  # not recorded, so left alone


def test_refused_prefix_covers_gits_rules() -> None:
    for p in POISON:
        assert refused_prefix(p) is not None, p
    assert refused_prefix(".git\u200c/x") == ".git\u200c"  # HFS-ignorable character
    assert refused_prefix("a\\.git/x") == "a\\.git"  # NTFS: backslash separates
    assert refused_prefix(".gitmodules", link=True) == ".gitmodules"
    for ok in (".gitignore", ".github/x", "git", ".git.x/y", "...", "gitx", ".gitmodules"):
        assert refused_prefix(ok) is None, ok


def test_a_name_git_refuses_that_the_filter_misses_is_still_noted(
    make_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop: if git refuses a path our filter passed, it is noted, not fatal."""
    monkeypatch.setattr(shadow_mod, "refused_prefix", lambda path, link=False: None)
    run: Run = make_run()
    f = run.folder
    run.start()
    run.turn()
    (f / ".GIT").mkdir()
    (f / ".GIT" / "x").write_text("x")
    (f / "ok.txt").write_text("ok")
    run.end()
    assert changes(run.id, 1) == {"ok.txt": "added"}
    assert any(n.startswith(".GIT/x: a name git refused") for n in notes_of(run))


def test_a_file_that_becomes_a_folder_while_it_is_recorded_is_noted(
    make_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guest races the snapshot: a listed file is a folder by the time git hashes it."""
    run: Run = make_run()
    f = run.folder
    run.start()
    run.turn()
    for i in range(5):
        (f / f"f{i}.txt").write_text(str(i))
    repo = run.rec.repo
    real_add = ShadowRepo._add

    def racing_add(self: ShadowRepo, paths: list[str], notes: Any) -> None:
        if "f3.txt" in paths and (f / "f3.txt").is_file():
            (f / "f3.txt").unlink()
            (f / "f3.txt").mkdir()
            (f / "f3.txt" / "inner").write_text("in")
        real_add(self, paths, notes)

    monkeypatch.setattr(ShadowRepo, "_add", racing_add)
    run.end()
    assert changes(run.id, 1) == {f"f{i}.txt": "added" for i in (0, 1, 2, 4)}
    assert any(n.startswith("f3.txt: changed while it was recorded") for n in notes_of(run))
    monkeypatch.setattr(ShadowRepo, "_add", real_add)
    with repo.locked():
        assert "f3.txt/inner" in repo.paths_in(repo.snapshot().tree)


# --------------------------------------------------------------------------- finding 7


def test_undo_moves_unrecorded_files_aside_instead_of_deleting_them(make_run: Any) -> None:
    """The review's case: `notes` was a file, the agent renames data/ over it. data/
    holds a file over the size cap (in no checkpoint) and a nested repository."""
    with file_cap(1000):
        run: Run = make_run()
        f = run.folder
        (f / "notes").write_text("my notes\n")
        (f / "data").mkdir()
        (f / "data" / "dataset.csv").write_text("a,b\n")
        (f / "data" / "big.bin").write_bytes(b"B" * 5000)
        nested = f / "data" / "lib"
        nested.mkdir()
        subprocess.run(["git", "init", "-q", str(nested)], check=True)
        (nested / "code.py").write_text("x = 1\n")
        run.start()
        run.turn()
        (f / "notes").unlink()
        (f / "data").rename(f / "notes")
        run.end()
        result = undo(run.id)
    assert (f / "notes").read_text() == "my notes\n"
    assert (f / "data" / "dataset.csv").read_text() == "a,b\n"
    assert result.moved_aside == ["notes/big.bin", "notes/lib"]
    assert result.aside_dir is not None
    aside = Path(result.aside_dir)
    assert aside.is_relative_to(run.task.dir)
    assert (aside / "notes" / "big.bin").read_bytes() == b"B" * 5000
    assert (aside / "notes" / "lib" / "code.py").read_text() == "x = 1\n"
    assert (aside / "notes" / "lib" / ".git" / "HEAD").is_file()


def test_the_reviews_finding_7_as_written(make_run: Any) -> None:
    """`notes` a file, `data/dataset.csv` ignored; the agent ignores `notes/`, deletes
    `notes` and renames data/ to notes/. Undo used to delete dataset.csv."""
    run: Run = make_run()
    f = run.folder
    (f / ".gitignore").write_text("data/\n")
    (f / "notes").write_text("my notes\n")
    (f / "data").mkdir()
    (f / "data" / "dataset.csv").write_text("weeks,of,data\n")
    run.start()
    run.turn()
    (f / ".gitignore").write_text("data/\nnotes/\n")
    (f / "notes").unlink()
    (f / "data").rename(f / "notes")
    run.end()
    result = undo(run.id)
    assert (f / "notes").read_text() == "my notes\n"
    assert (f / "data" / "dataset.csv").read_text() == "weeks,of,data\n"
    assert (f / ".gitignore").read_text() == "data/\n"
    assert result.moved_aside == []


def test_undo_keeps_an_unrecorded_file_where_a_folder_is_restored(make_run: Any) -> None:
    """The other direction: the target needs a folder where an unrecorded file is."""
    with file_cap(1000):
        run: Run = make_run()
        f = run.folder
        (f / "src").mkdir()
        (f / "src" / "main.c").write_text("int main;\n")
        run.start()
        run.turn()
        (f / "src" / "main.c").unlink()
        (f / "src").rmdir()
        (f / "src").write_bytes(b"S" * 5000)  # over the cap: in no checkpoint
        run.end()
        result = undo(run.id)
    assert (f / "src" / "main.c").read_text() == "int main;\n"
    assert result.moved_aside == ["src"]
    assert (Path(result.aside_dir or "") / "src").read_bytes() == b"S" * 5000


# --------------------------------------------------------------------------- finding 12


def test_size_cap_holds_for_a_file_grown_after_lstat(
    make_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with file_cap(1000):
        run: Run = make_run()
        f = run.folder
        (f / "grows.bin").write_bytes(b"small")
        run.start()
        run.turn()
        (f / "grows.bin").write_bytes(b"still small")
        real_add = ShadowRepo._add

        def grow_then_add(self: ShadowRepo, paths: list[str], notes: Any) -> None:
            os.truncate(f / "grows.bin", 64 * 1024 * 1024)  # past lstat, before git reads
            real_add(self, paths, notes)

        monkeypatch.setattr(ShadowRepo, "_add", grow_then_add)
        run.end()
        monkeypatch.setattr(ShadowRepo, "_add", real_add)
        repo = repo_for(run.task)
        sizes = repo.run("ls-tree", "-r", "-l", "refs/heads/checkpoints").decode()
        assert "grows.bin" not in sizes
        assert any(
            n.startswith("grows.bin: 67108864 bytes") and "checkpointMaxFileBytes" in n
            for n in notes_of(run)
        )
        result = undo(run.id, turn=1)  # recorded small, now unrecordable: left alone
        assert result.skipped == ["grows.bin"]
        assert (f / "grows.bin").stat().st_size == 64 * 1024 * 1024


# --------------------------------------------------------------------------- finding 13


def test_u2028_in_names_keeps_turns_and_notes(make_run: Any) -> None:
    run: Run = make_run()
    f = run.folder
    run.start()
    run.turn()
    nested = f / "n" / "x\u2028y"
    nested.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(nested)], check=True)
    (f / "a\u2028b\u2029c\x85d.txt").write_text("recorded\n")
    run.turn()
    run.end()
    commits = repo_for(run.task).log()
    assert [c.turn for c in commits] == [None, 1, 2, None]
    assert turn_range(commits, 1)[0].label == "before turn 1"
    assert any(n.startswith("n/x\u2028y: a git repository") for n in commits[-1].notes)
    assert changes(run.id, 1) == {"a\u2028b\u2029c\x85d.txt": "added"}
    undo(run.id, turn=1)
    assert not (f / "a\u2028b\u2029c\x85d.txt").exists()


# --------------------------------------------------------------------------- finding 14


def make_deep(root: Path, levels: int, name_len: int = 250) -> tuple[str, int]:
    """Folders nested past PATH_MAX (built by fd: no path that long can be opened)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    rel = []
    try:
        for i in range(levels):
            name = f"{i:02d}" + "d" * (name_len - 2)
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            rel.append(name)
        wfd = os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, b"deep\n")
        os.close(wfd)
        return "/".join(rel), fd
    except BaseException:
        os.close(fd)
        raise


def test_folders_deeper_than_path_max_are_noted(make_run: Any) -> None:
    run: Run = make_run()
    f = run.folder
    (f / "moved.txt").write_text("moved into the depths\n")
    run.start()
    run.turn()
    deep, fd = make_deep(f, 20)
    try:
        os.rename(f / "moved.txt", "moved.txt", dst_dir_fd=fd)
    finally:
        os.close(fd)
    run.end()
    notes = notes_of(run)
    deep_notes = [n for n in notes if "path limit" in n]
    assert deep_notes, notes
    noted = deep_notes[0].split(": nested deeper")[0]
    assert len(os.fsencode(noted)) + 1 >= PATH_MAX - 1 and deep.startswith(noted)
    assert changes(run.id, 1) == {"moved.txt": "deleted"}
    # Undo brings the file back and leaves the deep folder alone.
    undo(run.id, turn=1)
    assert (f / "moved.txt").read_text() == "moved into the depths\n"
    assert (f / deep.split("/")[0]).is_dir()


# --------------------------------------------------------------------------- finding 15


def crafted_lines(n_bytes: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return b"".join(rng.choice((b"a\n", b"b\n")) for _ in range(n_bytes // 2))


def test_crafted_diffs_are_bounded(make_run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run: Run = make_run()
    f = run.folder
    (f / "huge.txt").write_bytes(crafted_lines(4 * 1024 * 1024, 1))
    (f / "small.txt").write_bytes(crafted_lines(64 * 1024, 2))
    (f / "tiny.txt").write_text("one\n")
    run.start()
    run.turn()
    (f / "huge.txt").write_bytes(crafted_lines(4 * 1024 * 1024, 3))
    (f / "small.txt").write_bytes(crafted_lines(64 * 1024, 4))
    (f / "tiny.txt").write_text("two\n")
    run.end()
    by_path = {c.path: c for c in task_changes(run.id, turn=1)}
    assert by_path["huge.txt"].diff is None
    assert "over 1 MiB" in (by_path["huge.txt"].note or "")
    assert by_path["tiny.txt"].diff is not None and "+two" in by_path["tiny.txt"].diff
    repo = repo_for(run.task)
    commits = repo.log()
    before, after = turn_range(commits, 1)
    assert after is not None
    # Each diff is killed at its time limit; then the whole budget runs out.
    monkeypatch.setattr(shadow_mod, "DIFF_TIMEOUT", 0.0001)
    slow = repo.file_diff(before.id, after.id, "small.txt", timeout=0.0001)
    assert slow[1] is None and "longer than" in (slow[2] or "")
    spent = describe(repo, before.id, after.id, budget=0.0)
    assert all(c.diff is None for c in spent)
    assert {c.path: c.note for c in spent}[
        "tiny.txt"
    ] == "no diff: the 0 s allowed for diffs ran out"
    capped = describe(repo, before.id, after.id, diffs=1)
    assert [c.note for c in capped][1:] == ["no diff: only the first 1 files get one"] * 2


# --------------------------------------------------------------------------- count cap


def test_new_files_past_the_count_cap_are_noted_and_left_alone(
    make_run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shadow_mod, "MAX_FILES", 5)
    run: Run = make_run()
    f = run.folder
    for i in range(3):
        (f / f"keep{i}.txt").write_text("k")
    run.start()
    run.turn()
    for i in range(4):
        (f / f"new{i}.txt").write_text("n")
    run.end()
    assert changes(run.id, 1) == {"new0.txt": "added", "new1.txt": "added"}
    assert any("over the 5-file checkpoint limit" in n for n in notes_of(run))
    undo(run.id, turn=1)
    assert sorted(p.name for p in f.iterdir()) == [
        "keep0.txt",
        "keep1.txt",
        "keep2.txt",
        "new2.txt",
        "new3.txt",
    ]
    assert MAX_FILES == 100_000  # the shipped cap docs/security.md states


# --------------------------------------------------------------------------- the flow


def test_scripted_flow_deletes_ignored_files_and_renames_over_a_recorded_one(
    make_run: Any,
) -> None:
    """At unit level through the real RunRecorder (the VM version drives real pi):
    the agent deletes an ignored `.env` and `data/`, and renames over a recorded
    file; `piwork undo` brings all of them back."""
    run: Run = make_run()
    f = run.folder
    (f / ".gitignore").write_text(".env\ndata/\n")
    (f / ".env").write_text("TOKEN=secret\n")
    (f / "data").mkdir()
    (f / "data" / "rows.csv").write_text("1,2\n")
    (f / "report.md").write_text("# the person's report\n")
    (f / "draft.md").write_text("# the agent's draft\n")
    run.start()
    run.turn()
    (f / ".env").unlink()
    run.turn()
    (f / "data" / "rows.csv").unlink()
    (f / "data").rmdir()
    (f / "draft.md").rename(f / "report.md")
    run.end()
    assert changes(run.id) == {
        ".env": "deleted",
        "data/rows.csv": "deleted",
        "draft.md": "deleted",
        "report.md": "modified",
    }
    undo(run.id)
    assert (f / ".env").read_text() == "TOKEN=secret\n"
    assert (f / "data" / "rows.csv").read_text() == "1,2\n"
    assert (f / "report.md").read_text() == "# the person's report\n"
    assert (f / "draft.md").read_text() == "# the agent's draft\n"


# --------------------------------------------------------------------------- names not UTF-8


def test_names_that_are_not_utf8_are_recorded_noted_and_reported(make_run: Any) -> None:
    """A name git and the file system take but JSON cannot (invalid UTF-8): the
    checkpoint metadata, the runner's `changes` event and the review all survive."""
    run: Run = make_run()
    f = run.folder
    run.start()
    run.turn()
    bad = os.fsdecode(b"bad\xff.txt")
    (f / bad).write_text("x\n")
    nested = f / os.fsdecode(b"repo\xfe")
    nested.mkdir()
    subprocess.run(["git", "init", "-q", str(nested)], check=True)
    run.end()
    orjson.dumps(run.events)  # the runner writes this event to the transcript
    assert [fl["path"] for fl in run.events[0]["files"]] == ["bad\\xff.txt"]
    assert any(n.startswith("repo\\xfe: a git repository") for n in notes_of(run))
    assert changes(run.id, 1) == {bad: "added"}
    assert main(["changes", run.id, "--json"]) == 0  # JSON output survives the name too
    assert main(["changes", run.id]) == 0
    undo(run.id, turn=1)
    assert not (f / bad).exists() and nested.is_dir()
