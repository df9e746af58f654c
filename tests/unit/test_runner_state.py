"""The runner's own writes into the task's state share never follow a guest link."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from piwork.config import get_paths
from piwork.run.environment import write_state_file
from piwork.runner import RunRequest, TaskSession


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TaskSession:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    s = TaskSession(RunRequest(prompt="hi", model="demo"), paths=get_paths())
    s.task = s.open_task()
    return s


def test_a_link_in_place_of_the_agent_dir_is_replaced_not_followed(
    session: TaskSession, tmp_path: Path
) -> None:
    assert session.task is not None
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "models.json").write_text("host file")
    state = session.task.state_dir
    (state / "agent").symlink_to(outside)
    write_state_file(session.task, "agent/models.json", b'{"providers": {}}')
    assert (outside / "models.json").read_text() == "host file"
    assert sorted(p.name for p in outside.iterdir()) == ["models.json"]
    assert not (state / "agent").is_symlink() and (state / "agent").is_dir()
    assert orjson.loads((state / "agent" / "models.json").read_bytes()) == {"providers": {}}
    session.store.close()


def test_a_link_at_models_json_is_replaced_not_written_through(
    session: TaskSession, tmp_path: Path
) -> None:
    assert session.task is not None
    victim = tmp_path / "bashrc"
    victim.write_text("host file")
    (session.task.state_dir / "agent").mkdir()
    (session.task.state_dir / "agent" / "models.json").symlink_to(victim)
    write_state_file(session.task, "agent/models.json", b"{}")
    assert victim.read_text() == "host file"
    assert (session.task.state_dir / "agent" / "models.json").read_bytes() == b"{}"
    session.store.close()
