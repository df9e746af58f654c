"""`piwork trust` and `piwork mcp`: the person's pi settings (settings.json → pi)."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.cli.main import main
from piwork.pisettings import McpServer, load_pi_settings


@pytest.fixture
def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "config" / "settings.json"


def test_trust_is_on_until_turned_off(
    settings_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trust"]) == 0
    assert "project trust: on" in capsys.readouterr().out
    assert main(["trust", "off"]) == 0
    assert load_pi_settings(settings_file).trust_project is False
    assert "AGENTS.md included" in capsys.readouterr().out
    assert main(["trust", "on"]) == 0
    assert load_pi_settings(settings_file).trust_project is True


def test_mcp_servers_are_added_listed_and_removed(
    settings_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mcp", "add", "files", "--env", "ROOT=.", "--", "npx", "-y", "srv", "."]) == 0
    assert main(["mcp", "add", "docs", "--url", "https://docs.example.com/mcp",
                 "--exposure", "direct", "--header", "X-Team=a"]) == 0  # fmt: skip
    servers = load_pi_settings(settings_file).mcp_servers
    assert servers == {
        "files": McpServer(command="npx", args=["-y", "srv", "."], env={"ROOT": "."}),
        "docs": McpServer(url="https://docs.example.com/mcp", exposure="direct",
                          headers={"X-Team": "a"}),
    }  # fmt: skip
    capsys.readouterr()
    assert main(["mcp"]) == 0
    listed = capsys.readouterr().out
    assert "files: command npx -y srv ." in listed
    assert "docs: url https://docs.example.com/mcp (exposure direct)" in listed
    assert main(["mcp", "rm", "files"]) == 0
    assert set(load_pi_settings(settings_file).mcp_servers) == {"docs"}
    assert main(["mcp", "rm", "files"]) == 1


def test_a_credential_header_is_refused_and_nothing_is_saved(
    settings_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["mcp", "add", "docs", "--url", "https://d.example/mcp", "--header", "Authorization=x"]
    assert main(args) == 2
    assert "would carry a credential into the VM" in capsys.readouterr().err
    assert load_pi_settings(settings_file).mcp_servers == {}
