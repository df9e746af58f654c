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
    with pytest.raises(store.HostsDamaged, match="piwork hosts restore") as caught:
        store.load()
    assert str(store.hosts_file()) in str(caught.value)
    with pytest.raises(store.HostsDamaged):  # nothing is written over it
        store.update(lambda hosts: {})
    assert store.hosts_file().read_text() == "{not json"
    store.restore()
    assert store.load() == {"b1": h}
    with pytest.raises(store.HostError, match="piwork hosts add nope user@box"):
        store.get("nope")


def test_hosts_cli_refuses_a_damaged_file_and_restores_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from piwork.cli.main import main

    assert main(["hosts", "add", "b1", "a@box", "--no-connect"]) == 0
    assert main(["hosts", "add", "b2", "a@box2", "--no-connect"]) == 0
    store.hosts_file().write_bytes(store.hosts_file().read_bytes()[:30])
    capsys.readouterr()
    assert main(["hosts", "list"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert "hosts.json is damaged" in line and "`piwork hosts restore`" in line
    assert main(["hosts", "add", "b3", "a@box3", "--no-connect"]) == 1
    assert main(["hosts", "restore"]) == 0
    assert "2 host(s)" in capsys.readouterr().out
    assert sorted(store.load()) == ["b1", "b2"]
