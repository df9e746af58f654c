"""PolicyStore: atomic persistence, survival of kill -9 mid-write, a damaged file never loosens."""

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

from piwork.jsonstore import NothingToRestore
from piwork.policy.rules import Action, Rule, Scope, Verdict
from piwork.policy.store import PolicyDamaged, PolicyStore


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PolicyStore:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    return PolicyStore()


def test_default_location_honours_piwork_home(store: PolicyStore, tmp_path: Path) -> None:
    assert store.path == tmp_path.resolve() / "data" / "policy.json"


def test_missing_file_means_no_rules(store: PolicyStore) -> None:
    assert store.load() == []
    assert store.check() is None


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


DAMAGE = [
    b"{not json",
    b"",
    b"  \n",
    b'{"version": 1, "rules": [{"action": "teleport", "verdict": "allow"}]}',
    b'{"version": 99, "rules": []}',
    b"[]",
]


def _deny_writes(store: PolicyStore, folder: Path) -> Rule:
    return store.add(Rule(Action.WRITE, Verdict.DENY, Scope.folder(folder), pattern="secret/**"))


@pytest.mark.parametrize("content", DAMAGE)
def test_a_damaged_file_is_refused_never_read_as_no_rules(
    store: PolicyStore, content: bytes, tmp_path: Path
) -> None:
    rule = _deny_writes(store, tmp_path)
    store.path.write_bytes(content)  # another tool truncated or garbled it
    with pytest.raises(PolicyDamaged) as caught:
        store.effective_rules()
    err = caught.value
    text = str(err)
    assert "\n" not in text, "one line"
    assert str(store.path) in text and "damaged" in text
    assert "`piwork policy restore`" in text and str(store.file.last_good) in text
    assert store.path.read_bytes() == content, "left in place: every reader keeps refusing"
    assert err.kept is not None and err.kept.read_bytes() == content
    assert str(err.kept) in text
    assert store.check() is not None
    # Nothing is written over it: an add would otherwise drop the person's other rules.
    with pytest.raises(PolicyDamaged):
        store.add(Rule(Action.READ, Verdict.ALLOW))
    assert store.path.read_bytes() == content
    # A second read keeps no second copy of the same damage.
    with pytest.raises(PolicyDamaged):
        store.load()
    assert store.file.damaged_copies() == [err.kept]
    # Restore puts the last good copy back: the deny rule is there again.
    restored = store.restore()
    assert restored.kept == err.kept
    assert [r.id for r in store.load()] == [rule.id]
    with pytest.raises(NothingToRestore, match="not damaged"):
        store.restore()


def test_a_vanished_file_with_its_last_good_copy_beside_it_is_damage(
    store: PolicyStore, tmp_path: Path
) -> None:
    rule = _deny_writes(store, tmp_path)
    store.path.unlink()  # a bad sync removed it
    with pytest.raises(PolicyDamaged, match="missing"):
        store.load()
    store.restore()
    assert [r.id for r in store.load()] == [rule.id]


def test_an_unreadable_file_is_damage_too(store: PolicyStore, tmp_path: Path) -> None:
    _deny_writes(store, tmp_path)
    store.path.unlink()
    store.path.mkdir()  # EISDIR on open: any read error, not only a parse error
    with pytest.raises(PolicyDamaged, match="cannot read it"):
        store.load()


def test_a_hand_edit_that_parses_becomes_the_last_good_copy(store: PolicyStore) -> None:
    store.add(Rule(Action.READ, Verdict.ALLOW, pattern="a/**"))
    doc = orjson.loads(store.path.read_bytes())
    doc["rules"] = []
    store.path.write_bytes(orjson.dumps(doc))
    assert store.load() == []
    assert store.file.last_good.read_bytes() == store.path.read_bytes()


def test_no_last_good_copy_says_how_to_start_over(store: PolicyStore) -> None:
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.write_bytes(b"{oops")  # written by something else before piwork ever read it
    with pytest.raises(PolicyDamaged) as caught:
        store.load()
    assert "no earlier good copy" in str(caught.value)
    assert "piwork policy reset --yes" in str(caught.value)
    with pytest.raises(NothingToRestore, match="no last good copy"):
        store.restore()
    # The person chooses to start over: the damaged bytes stay in their copy.
    assert store.reset() == 0
    assert store.load() == []
    assert caught.value.kept is not None and caught.value.kept.read_bytes() == b"{oops"


def test_a_damaged_last_good_copy_is_not_restored(store: PolicyStore) -> None:
    store.add(Rule(Action.READ, Verdict.ALLOW))
    store.path.write_bytes(b"")
    store.file.last_good.write_bytes(b"{half")
    with pytest.raises(PolicyDamaged, match="no earlier good copy"):
        store.load()
    with pytest.raises(NothingToRestore, match="damaged too"):
        store.restore()
    assert store.path.read_bytes() == b""


def test_damaged_copies_are_bounded(store: PolicyStore) -> None:
    store.add(Rule(Action.READ, Verdict.ALLOW))
    for i in range(9):
        store.path.write_bytes(b"{bad %d" % i)
        with pytest.raises(PolicyDamaged):
            store.load()
    copies = store.file.damaged_copies()
    assert len(copies) == 5
    assert copies[-1].read_bytes() == b"{bad 8"


def test_a_run_policy_file_gets_nothing_written_beside_it(tmp_path: Path) -> None:
    ci = tmp_path / "ci" / "policy.json"
    ci.parent.mkdir()
    ci.write_bytes(b'{"version": 1, "rules": []}')
    store = PolicyStore(ci, keep_copies=False)
    assert store.load() == []
    ci.write_bytes(b"{")
    with pytest.raises(PolicyDamaged, match="fix the file by hand"):
        store.load()
    assert sorted(p.name for p in ci.parent.iterdir()) == ["policy.json", "policy.json.lock"]


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
        assert store.check() is None, f"torn file after kill at {delay}s: {store.check()}"
        rules = store.load()
        assert policy.exists()
        data = orjson.loads(policy.read_bytes())
        assert len(data["rules"]) == len(rules) >= 1
        assert all(r.action is Action.SHELL for r in rules)


@pytest.mark.timeout(20)
def test_a_crash_inside_the_first_write_leaves_a_usable_policy(
    store: PolicyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 between the two files of the first save (what the kill test above hit
    under load, at 0.05 s): the person's next run must not find a "damaged" policy."""
    from piwork import jsonstore

    written: list[Path] = []
    real = jsonstore.atomic_write_bytes

    def crash_after_one(path: Path, data: bytes) -> None:
        if written:
            raise KeyboardInterrupt("killed")  # nothing after this line runs
        real(path, data)
        written.append(path)

    monkeypatch.setattr(jsonstore, "atomic_write_bytes", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        store.add(Rule(Action.SHELL, Verdict.ALLOW, pattern="make"))
    monkeypatch.undo()
    assert store.check() is None, store.check()
    assert [r.pattern for r in store.load()] == ["make"]
    store.add(Rule(Action.SHELL, Verdict.ALLOW, pattern="ls"))
    assert sorted(r.pattern for r in store.load()) == ["ls", "make"]


def test_a_read_inside_a_read_modify_write_does_not_wait_for_itself(store: PolicyStore) -> None:
    """flock locks per open file: a nested lock of the same file in one thread would
    wait forever (`hosts rm` did, looking the host up inside its update)."""
    store.add(Rule(Action.READ, Verdict.ALLOW))
    with store.file.locked():
        assert len(store.load()) == 1
        store.add(Rule(Action.WRITE, Verdict.DENY))
    assert len(store.load()) == 2
