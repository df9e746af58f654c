"""Default limits from settings.json: merged per key, errors name the file and the key."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from piwork.tasks.settings import DEFAULT_LIMITS, SettingsError, load_task_settings


def write(path: Path, doc: object) -> Path:
    path.write_bytes(orjson.dumps(doc))
    return path


def test_a_missing_file_means_built_in_defaults(tmp_path: Path) -> None:
    assert load_task_settings(tmp_path / "none.json").default_limits == DEFAULT_LIMITS


def test_the_default_path_comes_from_piwork_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    (tmp_path / "config").mkdir()
    write(tmp_path / "config" / "settings.json", {"tasks": {"defaultLimits": {"maxTurns": 4}}})
    assert load_task_settings().default_limits.max_turns == 4


def test_keys_merge_with_defaults_and_null_means_unlimited(tmp_path: Path) -> None:
    path = write(
        tmp_path / "s.json",
        {
            "other": {"ignored": True},
            "tasks": {"defaultLimits": {"maxTurns": 5, "maxTokens": None}},
        },
    )
    limits = load_task_settings(path).default_limits
    assert limits.max_turns == 5
    assert limits.max_tokens is None
    assert limits.max_wall_time_seconds == DEFAULT_LIMITS.max_wall_time_seconds


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "must hold a JSON object"),
        (b'{"tasks": 3}', "'tasks' must be an object"),
        (b'{"tasks": {"defaultLimits": 3}}', "must be an object"),
        (b'{"tasks": {"defaultLimits": {"maxTurns": -1}}}', "tasks.defaultLimits.maxTurns"),
        (b'{"tasks": {"defaultLimits": {"maxTurnz": 1}}}', "tasks.defaultLimits.maxTurnz"),
        (b'{"tasks": {"defaultLimitz": {}}}', "tasks.defaultLimitz"),
    ],
)
def test_broken_settings_are_clear_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "settings.json"
    path.write_bytes(content)
    with pytest.raises(SettingsError, match="settings") as info:
        load_task_settings(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
