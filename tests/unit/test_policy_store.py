"""PolicyStore: atomic persistence, survival of kill -9 mid-write, corrupt files moved aside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from piwork.policy.rules import Action, Rule, Scope, Verdict
from piwork.policy.store import PolicyCorruptError, PolicyStore


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PolicyStore:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    return PolicyStore()


def test_default_location_honours_piwork_home(store: PolicyStore, tmp_path: Path) -> None:
    assert store.path == tmp_path.resolve() / "data" / "policy.json"


def test_missing_file_means_no_rules(store: PolicyStore) -> None:
    assert store.load() == []
    assert store.notice is None


def test_add_persists_and_replaces_same_key(store: PolicyStore) -> None:
    a = store.add(Rule(Action.NETWORK, Verdict.ALLOW, pattern="pypi.org"))
    store.add(Rule(Action.DELETE, Verdict.DENY, Scope.task("t")))
    b = store.add(Rule(Action.NETWORK, Verdict.DENY, pattern="pypi.org"))
    rules = PolicyStore(store.path).load()
    assert [r.id for r in rules][-1] == b.id
    assert a.id not in {r.id for r in rules}
    assert len(rules) == 2


def test_remove_by_id_or_prefix_and_reset(store: PolicyStore) -> None:
    r1 = store.add(Rule(Action.SHELL, Verdict.ALLOW, pattern="make"))
    r2 = store.add(Rule(Action.SHELL, Verdict.ALLOW, pattern="npm test"))
    assert store.remove(r1.id[:8] + "nope") is None
    assert store.remove(r1.id) == r1
    assert store.remove(r2.id[:6]) == r2
    store.add(Rule(Action.SHELL, Verdict.ALLOW, pattern="x"))
    assert store.reset() == 1
    assert store.load() == []


def test_writes_leave_no_temp_files(store: PolicyStore) -> None:
    for i in range(5):
        store.add(Rule(Action.SHELL, Verdict.ALLOW, pattern=f"cmd{i}"))
    leftovers = [p.name for p in store.path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"",
        b'{"version": 1, "rules": [{"action": "teleport", "verdict": "allow"}]}',
        b'{"version": 99, "rules": []}',
        b"[]",
    ],
)
def test_corrupt_file_is_moved_aside_with_a_clear_message(
    store: PolicyStore, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(content)
    assert store.load() == []
    notice = store.notice
    assert isinstance(notice, PolicyCorruptError)
    assert notice.moved_to.name.startswith("policy.json.corrupt-")
    assert notice.moved_to.read_bytes() == content, "the bad file is kept, not reset"
    assert not store.path.exists()
    assert str(store.path) in str(notice) and str(notice.moved_to) in str(notice)
    assert str(notice.moved_to) in caplog.text
    # the next write starts a fresh file and keeps the moved one
    store.add(Rule(Action.READ, Verdict.ALLOW))
    assert len(store.load()) == 1
    assert notice.moved_to.exists()


WRITER = textwrap.dedent(
    """
    import os, sys
    from piwork.policy.rules import Action, Rule, Verdict
    from piwork.policy.store import PolicyStore
    store = PolicyStore()
    i = 0
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    while True:
        # big notes make each write span many blocks
        store.add(Rule(Action.SHELL, Verdict.ALLOW, pattern=f"cmd{i % 50}", note="x" * 20000))
        i += 1
    """
)


def test_kill_9_during_writes_never_leaves_a_torn_file(tmp_path: Path) -> None:
    env = {**os.environ, "PIWORK_HOME": str(tmp_path)}
    policy = tmp_path.resolve() / "data" / "policy.json"
    for delay in (0.05, 0.15, 0.3, 0.5):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER], env=env, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        store = PolicyStore(policy)
        rules = store.load()
        assert store.notice is None, f"torn file after kill at {delay}s: {store.notice}"
        assert policy.exists()
        data = orjson.loads(policy.read_bytes())
        assert len(data["rules"]) == len(rules) >= 1
        assert all(r.action is Action.SHELL for r in rules)
