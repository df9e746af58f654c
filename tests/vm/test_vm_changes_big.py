"""A 150,000-file folder keeps undo (issue 34): an edit and two deletes anywhere in it are
shown by ``piwork changes`` and brought back by ``piwork undo``.

Before change sets, the task-start checkpoint of such a folder (a JavaScript
project with ``node_modules``) spent its 100,000-file cap on ``node_modules``, so
the person's own ``src/`` was never recorded and undo restored nothing. Now a
checkpoint records what a change set touches: real VM, real pi, the runner,
``--yes`` (the deletes are allowed once), then the CLI as a person runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.models.scripted import ScriptedModelServer, Text, ToolCalls, bash
from piwork.runner import TaskSession
from tests.helpers.vm import per_prompt, piwork_cli, private_paths, scripted_request

pytestmark = pytest.mark.vm

PACKAGES = 300
FILES_PER_PACKAGE = 500


def make_big_folder(root: Path) -> Path:
    """300 packages x 500 files under node_modules, and the person's src/: 150,022 files."""
    folder = root / "big"
    for p in range(PACKAGES):
        for sub in range(5):
            d = folder / "node_modules" / f"pkg{p:03d}" / f"lib{sub}"
            d.mkdir(parents=True)
            for f in range(FILES_PER_PACKAGE // 5):
                (d / f"f{f:03d}.js").write_text(f"module.exports = {p * 1000 + sub * 100 + f};\n")
    (folder / "src").mkdir()
    for i in range(20):
        (folder / "src" / f"m{i:02d}.js").write_text(f"export const v = {i};\n")
    (folder / "src" / "app.js").write_text("console.log('app');\n")
    (folder / "src" / "old.js").write_text("console.log('old');\n")
    (folder / "package.json").write_text('{"name": "big"}\n')
    return folder


async def test_a_150000_file_folder_keeps_undo(tmp_path: Path) -> None:
    folder = make_big_folder(tmp_path)
    paths = private_paths(tmp_path / "home")
    deep = "node_modules/pkg150/lib2/f042.js"
    before = {p: (folder / p).read_bytes() for p in ("src/app.js", "src/old.js", deep)}
    server = ScriptedModelServer([Text("x")], model_id="scripted")
    command = f"cd /mnt/work && echo '// edited' >> src/app.js && rm src/old.js {deep}"
    server.script = per_prompt(ToolCalls([bash(command)]), Text("done"))  # type: ignore[assignment]
    async with server:
        req = scripted_request(server, folder, assume_yes=True, boot_stall_timeout=180.0)
        async with TaskSession(req, lambda ev: None, paths=paths) as session:
            assert session.task is not None
            task_id = session.task.id
            outcome = await session.run_prompt("edit app.js, delete old.js and one module file")
            assert outcome.ok, outcome
    assert (folder / "src" / "app.js").read_text() == "console.log('app');\n// edited\n"
    assert not (folder / "src" / "old.js").exists() and not (folder / deep).exists()

    shown = piwork_cli(paths, "changes", task_id, "--json")
    assert shown.returncode == 0, shown.stderr
    changes = {c["path"]: c["status"] for c in json.loads(shown.stdout)["changes"]}
    assert changes == {"src/app.js": "modified", "src/old.js": "deleted", deep: "deleted"}

    undone = piwork_cli(paths, "undo", task_id)
    assert undone.returncode == 0, undone.stderr
    assert {p: (folder / p).read_bytes() for p in before} == before
    # The task's history holds what changed, not the folder.
    size = sum(f.stat().st_size for f in (tmp_path / "home").rglob("changes/**/*") if f.is_file())
    print(f"the task's change history: {size} bytes")
    assert size < 4 << 20
