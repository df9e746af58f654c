"""Working-folder validation: clear refusals for anything that is not a project folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.config import get_paths
from piwork.tasks.folders import FolderError, validate_working_folder


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "pwhome"))


def test_an_ordinary_project_folder_is_accepted_and_resolved(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    link = tmp_path / "link"
    link.symlink_to(proj)
    assert validate_working_folder(proj) == proj.resolve()
    assert validate_working_folder(link) == proj.resolve()
    assert validate_working_folder(str(proj)) == proj.resolve()


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FolderError, match="does not exist") as info:
        validate_working_folder(tmp_path / "nope")
    assert info.value.code == "missing"


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(FolderError, match="not a directory") as info:
        validate_working_folder(f)
    assert info.value.code == "not_dir"


SYSTEM_FOLDERS = ["/", "/etc", "/usr", "/bin", "/dev", "/proc", "/sys", "/var", "/tmp", "/usr/lib"]


@pytest.mark.parametrize("path", [p for p in SYSTEM_FOLDERS if Path(p).is_dir()])
def test_system_folders_are_refused(path: str) -> None:
    with pytest.raises(FolderError, match="system folder") as info:
        validate_working_folder(path)
    assert info.value.code == "system"


def test_a_symlink_to_a_system_folder_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "etc-link"
    link.symlink_to("/etc")
    with pytest.raises(FolderError, match=r"/etc.*points there"):
        validate_working_folder(link)


def test_the_home_folder_itself_is_refused_but_a_folder_inside_it_is_fine(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "code").mkdir(parents=True)
    with pytest.raises(FolderError, match="whole home folder") as info:
        validate_working_folder(home, home=home)
    assert info.value.code == "home"
    assert validate_working_folder(home / "code", home=home) == (home / "code").resolve()


def test_credential_folders_in_home_are_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh" / "keys").mkdir(parents=True)
    with pytest.raises(FolderError, match="credentials") as info:
        validate_working_folder(home / ".ssh" / "keys", home=home)
    assert info.value.code == "secrets"


def test_piwork_own_data_and_its_ancestors_are_refused(tmp_path: Path) -> None:
    tasks = get_paths().tasks
    (tasks / "abc").mkdir(parents=True)
    for path in (get_paths().data, tasks / "abc", tmp_path / "pwhome"):
        with pytest.raises(FolderError, match="piwork's") as info:
            validate_working_folder(path)
        assert info.value.code == "piwork"


@pytest.mark.parametrize(
    ("sub", "why"),
    [
        (".config", "settings and saved logins"),
        (".config/gh", "settings and saved logins"),
        (".local/share", "~/.local/bin"),
        (".local", "~/.local/bin"),
        (".gnupg", "credentials"),
        (".password-store", "credentials"),
        (".mozilla/firefox", "browser profile"),
    ],
)
def test_settings_and_data_folders_in_home_are_refused_with_the_reason(
    tmp_path: Path, sub: str, why: str
) -> None:
    home = tmp_path / "home"
    (home / sub).mkdir(parents=True)
    with pytest.raises(FolderError, match=why) as info:
        validate_working_folder(home / sub, home=home)
    assert info.value.code == "secrets"
    assert "Choose a project folder" in str(info.value)


def test_xdg_dirs_outside_home_are_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "elsewhere" / "conf"
    (conf / "app").mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(conf))
    with pytest.raises(FolderError, match="settings") as info:
        validate_working_folder(conf / "app", home=tmp_path / "home")
    assert info.value.code == "secrets"


def test_a_project_beside_the_dot_folders_is_fine(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / "src" / ".config-project").mkdir(parents=True)
    project = home / "src" / ".config-project"
    assert validate_working_folder(project, home=home) == project.resolve()
