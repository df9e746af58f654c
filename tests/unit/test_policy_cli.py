"""`piwork policy`: list / allow / deny / ask / rm / reset / log, readable and --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.cli.main import main
from piwork.policy.audit import AuditEntry, AuditLog


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["policy", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_add_list_rm_reset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "allow", "network", "github.com")
    assert code == 0 and "allow network github.com (global)" in out
    code, out, _ = run(capsys, "deny", "delete", ".git/**", "--folder", str(tmp_path), "--json")
    rule = json.loads(out)
    assert rule["scope"] == "folder" and rule["scopeValue"] == str(tmp_path.resolve())
    run(capsys, "ask", "shell", "make", "--task", "t-1")

    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "github.com" in out and ".git/**" in out and "task:t-1" in out
    assert "default-delete" in out  # defaults are shown

    code, out, _ = run(capsys, "list", "--json")
    data = json.loads(out)
    assert len(data["rules"]) == 3 and len(data["defaults"]) == 11

    code, out, _ = run(capsys, "rm", rule["id"])
    assert code == 0 and "removed" in out
    code, _, err = run(capsys, "rm", "nope")
    assert code == 1 and "no rule" in err
    code, _, err = run(capsys, "rm", "default-delete")
    assert code == 1 and "built-in" in err

    code, out, _ = run(capsys, "reset", "--yes", "--json")
    assert json.loads(out) == {"removed": 2}


def test_reset_refuses_without_confirmation(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "reset")
    assert code == 1 and "--yes" in err


def test_bad_action_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["policy", "allow", "teleport"])


def test_a_damaged_file_fails_list_and_restore_brings_the_rules_back(
    capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    policy = home.resolve() / "data" / "policy.json"
    code, out, _ = run(capsys, "deny", "write", "secret/**", "--folder", str(home), "--json")
    rule_id = json.loads(out)["id"]
    policy.write_bytes(policy.read_bytes()[:25])  # truncated
    code, out, err = run(capsys, "list")
    assert code == 1 and out == ""
    [line] = err.splitlines()
    assert line.startswith("piwork: the policy file ") and str(policy) in line
    assert "policy.json.damaged-" in line and "`piwork policy restore`" in line
    code, _, err = run(capsys, "list", "--json")
    assert code == 1 and "damaged" in err
    code, _, err = run(capsys, "allow", "write", "x")
    assert code == 1 and "damaged" in err
    code, out, err = run(capsys, "restore")
    assert code == 0, err
    assert "1 rule(s)" in out and "policy.json.damaged-" in out
    code, out, _ = run(capsys, "list", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)["rules"]] == [rule_id]
    code, _, err = run(capsys, "restore")
    assert code == 1 and "not damaged" in err


def test_log(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "log")
    assert code == 0 and "No decisions" in out
    log = AuditLog()
    log.append(
        AuditEntry(
            task="t-1",
            action="delete",
            target="/mnt/work/b",
            decision="deny",
            decided_by="person",
            command="rm -r b",
        )
    )
    log.append(
        AuditEntry(
            task="t-2",
            action="write",
            target="/mnt/work/a",
            decision="allow",
            decided_by="rule",
            rule="default-write",
        )
    )
    code, out, _ = run(capsys, "log")
    assert "rm -r b" in out and "rule (default-write)" in out
    code, out, _ = run(capsys, "log", "--task", "t-2", "--json")
    lines = [json.loads(x) for x in out.splitlines()]
    assert [e["task"] for e in lines] == ["t-2"]
