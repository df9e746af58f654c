"""`piwork restore`: every file holding a person's decisions, damaged, found and put back.

Each store is damaged the way the issue tells it (a truncation by another tool, a bad
sync that removed it): the store refuses it (never read as empty), `piwork restore`
lists it and exits 1, and `piwork restore NAME|FILE` brings back the last good copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.cli.main import main
from piwork.config import get_paths
from piwork.hosts import store as hosts
from piwork.jsonstore import DamagedFile
from piwork.models.custom import add_provider
from piwork.models.providers import load_custom_providers
from piwork.policy import Action, PolicyStore, Rule, Verdict
from piwork.settings import read_section, write_section
from piwork.tasks.settings import load_task_settings


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    return tmp_path


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def test_every_decision_store_refuses_damage_and_restore_brings_it_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = get_paths()
    PolicyStore().add(Rule(Action.WRITE, Verdict.DENY, pattern="secret/**"))
    write_section("tasks", {"defaultLimits": {"maxCostUsd": 2.5}})
    hosts.save({"b1": hosts.parse_target("b1", "a@box")})
    add_provider("local", "http://127.0.0.1:11434/v1", ["m1"])
    assert main(["restore"]) == 0
    assert "nothing to restore" in capsys.readouterr().out

    files = {
        "policy": paths.policy_file,
        "settings": paths.settings_file,
        "hosts": hosts.hosts_file(),
        "providers": paths.config / "providers.json",
    }
    for path in files.values():
        _truncate(path)
    readers = {
        "policy": lambda: PolicyStore().effective_rules(),
        "settings": lambda: load_task_settings(),
        "hosts": lambda: hosts.load(),
        "providers": lambda: load_custom_providers(),
    }
    for name, read in readers.items():
        with pytest.raises(DamagedFile) as caught:
            read()
        assert str(files[name]) in str(caught.value), name
        assert "\n" not in str(caught.value)
    assert main(["restore"]) == 1
    err = capsys.readouterr().err
    assert all(str(p) in err for p in files.values())
    for name in files:
        assert main(["restore", name]) == 0, capsys.readouterr().err
        assert "damaged file is kept at" in capsys.readouterr().out
    assert [r.pattern for r in PolicyStore().load()] == ["secret/**"]
    assert load_task_settings().default_limits.max_cost_usd == 2.5
    assert list(hosts.load()) == ["b1"]
    assert [p.name for p in load_custom_providers()] == ["local"]
    assert read_section("tasks")["defaultLimits"] == {"maxCostUsd": 2.5}
    assert main(["restore"]) == 0


def test_a_settings_file_removed_beside_its_last_good_copy_is_damage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_section("tasks", {"defaultLimits": {"maxTurns": 3}})
    get_paths().settings_file.unlink()
    with pytest.raises(DamagedFile, match="missing"):
        load_task_settings()
    assert main(["restore", str(get_paths().settings_file)]) == 0
    assert load_task_settings().default_limits.max_turns == 3


def test_restore_names_what_it_knows(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    assert main(["restore", str(home / "elsewhere.json")]) == 2
    assert "none of the files" in capsys.readouterr().err
    assert main(["restore", "policy"]) == 1
    assert "not damaged" in capsys.readouterr().err


def test_an_environment_record_is_found_and_restored_by_its_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from piwork.env.store import EnvDamaged, record_file, store_for, write_record

    env = store_for(get_paths())
    record = env.folders_dir / "0123456789abcdef.json"
    env.folders_dir.mkdir(parents=True)
    write_record(record, {"folder": "/p", "head": "L1", "last_task_dir": None, "image": None})
    _truncate(record)
    with pytest.raises(EnvDamaged) as caught:
        env.folders()
    assert f"`piwork restore {record}`" in str(caught.value)
    assert main(["restore"]) == 1
    assert str(record) in capsys.readouterr().err
    assert main(["restore", str(record)]) == 0
    assert "restored" in capsys.readouterr().out
    assert record_file(record).load() == {
        "folder": "/p", "head": "L1", "last_task_dir": None, "image": None,
    }  # fmt: skip
