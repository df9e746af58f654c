"""The checkpoints issue's acceptance in one real VM run: the real pi, the gate, the
host policy, a scripted model. The agent overwrites, truncates and deletes files
across three turns (and makes a symlink pointing out of the folder, which waits
for the person); each turn's change set is applied at the next model call (the
last at the end of the run), and ``piwork changes`` and ``piwork undo`` work on
what the host recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import cast

import pytest

from piwork.models.providers import Provider
from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, bash, write
from piwork.pack.manifest import Manifest
from piwork.policy import Choice
from piwork.runner import Asker, EventKind, RunEvent, RunRequest, TaskSession
from tests.helpers.cli import always_allow, changes, piwork
from tests.helpers.vm import ScriptedAsker, per_prompt, private_paths, scripted_provider

pytestmark = pytest.mark.vm


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, check=True, text=True).stdout


def digest(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
            key = f"{st.st_mode:o}:{st.st_mtime_ns}:{hashlib.sha256(data).hexdigest()}"
            out[str(p.relative_to(root))] = key
    return out


async def test_agent_changes_are_recorded_per_turn_and_undoable(
    pack: tuple[Path, Manifest], model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    paths = private_paths(home)
    folder = tmp_path / "project"
    folder.mkdir()
    originals = {
        "a.txt": "alpha, the original\n",
        "b.txt": "bravo, to be truncated\n",
        "c.txt": "charlie, to be deleted\n",
        "e.txt": "echo, deleted in turn 3\n",
    }
    for name, text in originals.items():
        (folder / name).write_text(text)
    # The folder is a git repository of its own: checkpointing must not touch it.
    sh("git", "init", "-q", str(folder))
    sh("git", "-C", str(folder), "add", "a.txt")
    sh("git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t")
    dot_git = digest(folder / ".git")

    # `: > b.txt` and `rm` go through always-allow rules; the person allows the rest.
    policy = tmp_path / "policy.json"
    rules = [always_allow(a) for a in ("write", "delete", "shell")]
    policy.write_text(json.dumps({"version": 1, "rules": rules}))
    model_server.script = per_prompt(
        ToolCalls(
            [
                write("a.txt", "alpha, overwritten by the agent\n", id="t1_write"),
                bash("ln -s /etc/hostname link-out", id="t1_ln"),
            ]
        ),
        ToolCalls([bash(": > b.txt", id="t2_truncate"), bash("rm c.txt", id="t2_rm")]),
        ToolCalls([bash("rm e.txt", id="t3_rm"), write("f.txt", "foxtrot\n", id="t3_write")]),
        Text("done"),
    )
    events: list[RunEvent] = []
    req = RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        extra_providers=(cast(Provider, scripted_provider(model_server)),),
    )
    person = ScriptedAsker(permission=Choice.ALLOW_ONCE)
    session = TaskSession(req, events.append, cast(Asker, person), paths=paths, policy_file=policy)
    async with session:
        assert session.task is not None
        task_id = session.task.id
        outcome = await asyncio.wait_for(session.run_prompt("tidy up"), timeout=300)
        assert outcome.ok, outcome
        # The VM is still running: undo refuses.
        code, _, err = await piwork(home, "undo", task_id, "--turn", "2")
        assert code == 5 and "running" in err, err

    # The agent really did it.
    assert (folder / "a.txt").read_text() == "alpha, overwritten by the agent\n"
    assert (folder / "b.txt").read_text() == ""
    assert not (folder / "c.txt").exists() and not (folder / "e.txt").exists()
    assert (folder / "f.txt").read_text() == "foxtrot\n"
    # A link pointing out of the folder waits for the person (it is not in the folder).
    assert not (folder / "link-out").is_symlink() and not (folder / "link-out").exists()
    code, out, err = await piwork(home, "changes", task_id, "--json")
    waiting = {w["path"]: w["why"] for w in json.loads(out)["waiting"]}
    assert waiting == {"link-out": "a link that points outside the folder"}, waiting

    # The runner's per-turn events: each turn's change set, taken at the next model call.
    per_turn = {e.data["turn"]: e.data for e in events if e.kind is EventKind.CHANGES}
    assert sorted(per_turn) == [1, 2, 3]
    assert {f["path"]: f["status"] for f in per_turn[2]["files"]} == {
        "b.txt": "modified",
        "c.txt": "deleted",
    }
    assert (per_turn[2]["modified"], per_turn[2]["deleted"], per_turn[2]["added"]) == (1, 1, 0)

    # `piwork changes` lists exactly the effects, per turn.
    assert await changes(home, task_id, 1) == {"a.txt": "modified"}
    assert await changes(home, task_id, 2) == {"b.txt": "modified", "c.txt": "deleted"}
    assert await changes(home, task_id, 3) == {"e.txt": "deleted", "f.txt": "added"}
    code, out, err = await piwork(home, "changes", task_id)
    assert code == 0, err
    assert "-bravo, to be truncated" in out and "+alpha, overwritten by the agent" in out

    # Undo turn 2 only.
    code, out, err = await piwork(home, "undo", task_id, "--turn", "2")
    assert code == 0, err
    assert (folder / "b.txt").read_text() == originals["b.txt"]
    assert (folder / "c.txt").read_text() == originals["c.txt"]
    assert (folder / "a.txt").read_text() == "alpha, overwritten by the agent\n"
    assert not (folder / "e.txt").exists()
    assert (folder / "f.txt").read_text() == "foxtrot\n"

    # Undo the undo.
    before_undo = out.split("--to ")[1].split("`")[0]
    code, out, err = await piwork(home, "undo", task_id, "--to", before_undo)
    assert code == 0, err
    assert (folder / "b.txt").read_text() == ""
    assert not (folder / "c.txt").exists()

    # The folder's own .git was never touched.
    assert digest(folder / ".git") == dot_git
