"""Issue 17's "every change is recorded" in one real VM run: the real pi, the gate,
the host policy, a scripted model. The agent writes ``.GIT/x`` (git takes it for
``.git``: it waits for the person and never reaches the folder), deletes the
person's gitignored ``.env`` and ``data/``, and renames its draft over a file of
the person's. ``piwork undo`` brings every one of them back.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import cast

import pytest

from piwork.models.providers import Provider
from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, bash, write
from piwork.pack.manifest import Manifest
from piwork.policy import Choice
from piwork.runner import Asker, RunRequest, TaskSession
from tests.helpers.cli import always_allow, changes, piwork
from tests.helpers.vm import ScriptedAsker, per_prompt, private_paths, scripted_provider

pytestmark = pytest.mark.vm

ORIGINALS = {
    ".gitignore": ".env\ndata/\n",
    ".env": "API_TOKEN=the-person's-secret\n",
    "data/rows.csv": "id,value\n1,42\n",
    "data/raw/big.csv": "id,value\n" + "".join(f"{i},{i * i}\n" for i in range(2000)),
    "report.md": "# The person's report\n\nWeeks of work.\n",
    "draft.md": "# The agent's draft\n",
}


async def test_undo_restores_ignored_files_and_a_file_renamed_over(
    pack: tuple[Path, Manifest], model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    paths = private_paths(home)
    folder = tmp_path / "project"
    for rel, text in ORIGINALS.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)

    policy = tmp_path / "policy.json"
    rules = [always_allow(a) for a in ("write", "delete", "shell")]
    policy.write_text(json.dumps({"version": 1, "rules": rules}))
    model_server.script = per_prompt(
        ToolCalls(
            [
                write(".GIT/x", "[core]\n\tfsmonitor = evil\n", id="t1_poison"),
                bash("rm .env", id="t1_rm_env"),
            ]
        ),
        ToolCalls(
            [bash("rm -rf data", id="t2_rm_data"), bash("mv draft.md report.md", id="t2_mv")]
        ),
        Text("done"),
    )
    req = RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        extra_providers=(cast(Provider, scripted_provider(model_server)),),
    )
    person = ScriptedAsker(permission=Choice.ALLOW_ONCE)
    session = TaskSession(req, lambda e: None, cast(Asker, person), paths=paths, policy_file=policy)
    async with session:
        assert session.task is not None
        task_id = session.task.id
        outcome = await asyncio.wait_for(session.run_prompt("clean up"), timeout=300)
        assert outcome.ok, outcome

    # The agent really did it.
    assert not (folder / ".env").exists() and not (folder / "data").exists()
    assert (folder / "report.md").read_text() == ORIGINALS["draft.md"]
    assert not (folder / "draft.md").exists()
    assert not (folder / ".GIT").exists()  # git metadata in any spelling: it waits

    # Each turn shows exactly its effects; .GIT waits for the person.
    code, out, err = await piwork(home, "changes", task_id, "--json")
    assert code == 0, err
    shown = json.loads(out)
    labels = [c["label"] for c in shown["checkpoints"]]
    # (a checkpoint is taken only when a change set holds something: the run's end took
    # nothing new here, so there is no "task end")
    assert labels[0] == "task start", labels
    assert "turn 1" in labels and "turn 2" in labels, labels
    assert {w["root"] for w in shown["waiting"]} == {".GIT"}
    assert await changes(home, task_id, 1) == {".env": "deleted"}
    assert await changes(home, task_id, 2) == {
        "data/rows.csv": "deleted",
        "data/raw/big.csv": "deleted",
        "draft.md": "deleted",
        "report.md": "modified",
    }
    code, out, err = await piwork(home, "changes", task_id)
    assert code == 0, err
    assert "waiting for you" in out and ".GIT/x" in out

    # Undo the whole task: everything is back, byte for byte.
    code, out, err = await piwork(home, "undo", task_id)
    assert code == 0, err
    for rel, text in ORIGINALS.items():
        assert (folder / rel).read_text() == text, rel
    assert not (folder / ".GIT").exists()
