"""Host entries: what `piwork hosts add` accepts, and clear errors for what it does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.hosts import store


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))


@pytest.mark.parametrize(
    ("target", "user", "hostname", "port"),
    [
        ("alice@box", "alice", "box", None),
        ("alice@box.example.org:2222", "alice", "box.example.org", 2222),
        ("box", None, "box", None),
        ("bob@[2001:db8::1]:22", "bob", "2001:db8::1", 22),
    ],
)
def test_targets_parse(target: str, user: str | None, hostname: str, port: int | None) -> None:
    h = store.parse_target("b1", target)
    assert (h.user, h.hostname, h.port) == (user, hostname, port)


@pytest.mark.parametrize(
    ("name", "target", "says"),
    [
        ("b1", "alice@box:0", "use 1-65535"),
        ("b1", "alice@box:70000", "use 1-65535"),
        ("b1", "alice@box;rm -rf /", "user@box or user@box:port"),
        ("b1", "-oProxyCommand=x", "user@box or user@box:port"),
        ("../x", "alice@box", "bad host name"),
        ("", "alice@box", "bad host name"),
    ],
)
def test_bad_input_is_refused_with_what_to_write(name: str, target: str, says: str) -> None:
    with pytest.raises(store.HostError, match=says):
        store.parse_target(name, target)


def test_root_written_for_the_shell_is_home_relative() -> None:
    assert store.parse_target("b1", "a@box", root="~/pw").root == "pw"
    assert store.parse_target("b1", "a@box", root="/srv/pw").root == "/srv/pw"


def test_save_load_round_trip_and_a_broken_file_says_what_to_do() -> None:
    h = store.parse_target("b1", "a@box:2200", identity="~/.ssh/id_box")
    store.save({h.name: h})
    assert store.load() == {"b1": h}
    assert json.loads(store.hosts_file().read_text())["hosts"][0]["port"] == 2200
    store.hosts_file().write_text("{not json")
    with pytest.raises(store.HostError, match="fix or remove the file"):
        store.load()
    store.hosts_file().unlink()
    with pytest.raises(store.HostError, match="piwork hosts add nope user@box"):
        store.get("nope")
