"""`piwork env`: the registry rules it saves, and the folder environments it manages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest

from piwork.cli.main import main
from piwork.config import Paths, get_paths
from piwork.env import store_for
from piwork.env.store import MAX_CHAIN_LAYERS, EnvStore
from piwork.policy.rules import Action, Verdict
from piwork.policy.store import PolicyStore


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules and environments made here stay out of the session's home."""
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))


def test_allow_registries_saves_exactly_the_registry_rules_and_prints_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "proj"
    folder.mkdir()
    assert main(["env", "allow-registries", "--folder", str(folder)]) == 0
    out = capsys.readouterr().out
    rules = [r for r in PolicyStore(get_paths().policy_file).load() if r.action is Action.NETWORK]
    assert sorted(r.pattern or "" for r in rules) == [
        "deb.debian.org",
        "files.pythonhosted.org",
        "pypi.org",
        "registry.npmjs.org",
    ]
    assert all(r.verdict is Verdict.ALLOW and r.scope.value == str(folder) for r in rules)
    for r in rules:  # what was saved is what was shown
        assert f"{r.id}: {r.describe()}" in out
    # ... and what it does not stop, plainly (review 2, finding 8)
    assert "refuses anything but a download" in out and "no `npm publish`" in out
    assert "shared CDNs" in out


def _tasks_on_a_folder(tmp_path: Path, names: list[str]) -> tuple[Paths, EnvStore, Path]:
    """A folder ``proj`` and one prepared environment disk per task name, in order."""
    paths = get_paths()
    store = store_for(paths)
    folder = tmp_path / "proj"
    folder.mkdir()
    for name in names:
        (paths.tasks / name).mkdir(parents=True)
        store.prepare(paths.tasks / name, folder, size=1 << 26)
    return paths, store, folder


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img")
def test_list_show_reset_and_rm_of_a_folders_environment(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, store, folder = _tasks_on_a_folder(tmp_path, ["t1", "t2"])
    assert main(["env", "list"]) == 0
    listed = capsys.readouterr().out
    assert (
        f"{folder}\n  the next task starts from what task t2 left (over 1 saved layer(s)" in listed
    )
    assert main(["env", "show", str(folder)]) == 0
    shown = capsys.readouterr().out
    assert "from task t1" in shown and "used by 2 task(s)" in shown
    assert "chain of 1 layer(s)" in shown
    assert main(["env", "reset", str(folder)]) == 0
    assert "starts from the clean workbench" in capsys.readouterr().out
    assert store.folder(folder) is not None and store.folder(folder).head is None  # type: ignore[union-attr]
    assert main(["env", "rm", str(folder)]) == 0
    assert main(["env", "show", str(folder)]) == 1
    assert "no environment saved" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="needs qemu-img")
def test_show_says_the_chain_length_and_a_merged_layer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    paths, store, folder = _tasks_on_a_folder(
        tmp_path, [f"t{i}" for i in range(MAX_CHAIN_LAYERS + 1)]
    )
    assert main(["env", "show", str(folder), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["chain_length"] == MAX_CHAIN_LAYERS == shown["max_chain_length"]
    (paths.tasks / "last").mkdir()
    store.prepare(paths.tasks / "last", folder, size=1 << 26)  # one more: merged
    assert main(["env", "show", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "chain of 1 layer(s)" in out
    assert (
        f"merged from {MAX_CHAIN_LAYERS + 1} layers (newest from task t{MAX_CHAIN_LAYERS})" in out
    )


def test_env_build_refuses_a_file_it_cannot_build_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "proj"
    folder.mkdir()
    assert main(["env", "build", str(folder)]) == 2
    assert "no piwork.Dockerfile or Dockerfile.piwork in" in capsys.readouterr().err
    (folder / "piwork.Dockerfile").write_text("FROM piwork\nRUN true\nADD https://x/y /y\n")
    assert main(["env", "build", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "piwork.Dockerfile:3: ADD is not supported" in err and "use COPY" in err
    (folder / "other.Dockerfile").write_text("FROM piwork\nCOPY ../outside /x\n")
    assert main(["env", "build", str(folder), "-f", "other.Dockerfile"]) == 2
    assert "other.Dockerfile:2: COPY ../outside: '..' would leave" in capsys.readouterr().err
    assert not (get_paths().data / "envs" / "layers").exists()


def test_env_import_of_a_missing_unreadable_or_bad_archive_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A wrong path on the command line exits 2 and says how to make an archive."""
    folder = tmp_path / "proj"
    folder.mkdir()
    assert main(["env", "import", str(tmp_path / "nope.tar"), str(folder)]) == 2
    err = capsys.readouterr().err
    assert "nope.tar: no such file" in err and "docker save IMAGE -o FILE.tar" in err
    assert main(["env", "import", str(tmp_path), str(folder)]) == 2
    assert "not a file" in capsys.readouterr().err
    locked = tmp_path / "locked.tar"
    locked.write_text("x")
    locked.chmod(0)
    with mock.patch("pathlib.Path.open", side_effect=PermissionError(13, "Permission denied")):
        # (root reads a mode-0 file anyway: the refusal the kernel gives others, stood in)
        assert main(["env", "import", str(locked), str(folder)]) == 2
    assert "cannot be read (Permission denied)" in capsys.readouterr().err
    (tmp_path / "bad.tar").write_text("not a tar")
    assert main(["env", "import", str(tmp_path / "bad.tar"), str(folder)]) == 2
    assert "not a tar archive" in capsys.readouterr().err
    assert main(["env", "import", str(tmp_path / "bad.tar"), str(tmp_path / "gone")]) == 2
    assert "gone is not a folder" in capsys.readouterr().err
    assert store_for(get_paths()).folder(folder.resolve()) is None
    assert not (get_paths().data / "envs" / "images").exists()


def test_the_other_env_commands_say_a_wrong_path_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    for action in ("show", "reset", "rm"):
        assert main(["env", action, str(gone)]) == 2, action
        err = capsys.readouterr().err
        assert "does not exist and has no saved environment" in err and "env list" in err
    here = tmp_path / "here"
    here.mkdir()
    assert main(["env", "show", str(here)]) == 1  # a real folder with nothing saved
    assert main(["env", "allow-registries", "--folder", str(gone)]) == 2
    assert "leave --folder out" in capsys.readouterr().err
    assert main(["env", "build", str(gone)]) == 2
    assert main(["env", "build", str(here), "-f", "missing.Dockerfile"]) == 2
    assert "missing.Dockerfile: no such file" in capsys.readouterr().err
