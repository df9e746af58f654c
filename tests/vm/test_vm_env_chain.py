"""A folder's environment stays a short chain: many tasks in a row, each keeping what the
ones before it installed.

Each new task on a folder freezes the last task's disk into a read-only layer; past
``MAX_CHAIN_LAYERS`` the chain is merged into one standalone layer on the host
(``qemu-img convert``, never a mount). Real QEMU and the real pi (the scripted model is
the only test double): every task writes a file into the guest's root through the
agent's bash, and the last one, starting on a merged layer, reads every earlier task's
file byte for byte from its own VM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.env import store_for
from piwork.env.store import MAX_CHAIN_LAYERS
from tests.helpers.vm import bash_task, private_paths

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2400)]


async def test_many_tasks_on_a_folder_keep_a_bounded_chain_and_everything_installed(
    tmp_path: Path,
) -> None:
    paths = private_paths(tmp_path / "home")
    folder = tmp_path / "project"
    folder.mkdir()
    store = store_for(paths)
    n = MAX_CHAIN_LAYERS + 2  # the last two tasks start on a merged layer
    lengths = []
    for i in range(n):
        # What a task installs: a file in the guest's root (the writable disk), with a
        # line per earlier task it saw, so the last one proves each was there for each.
        out, task_id = await bash_task(
            paths,
            folder,
            f"cat /opt/chain/*.txt 2>/dev/null | wc -l; mkdir -p /opt/chain && "
            f"printf 'task {i} was here\\n' > /opt/chain/{i:02d}.txt && echo wrote {i}",
        )
        assert f"wrote {i}" in out and out.split()[0] == str(i), out
        env = store.task_env(paths.tasks / task_id)
        assert env is not None
        lengths.append(len(store.chain(env.base)))
    print("chain length per task:", lengths)
    assert max(lengths) <= MAX_CHAIN_LAYERS
    assert lengths[-1] == 1  # the task that went past the bound sits on one merged layer
    out, task_id = await bash_task(paths, folder, "cat /opt/chain/*.txt")
    assert out.strip().splitlines() == [f"task {i} was here" for i in range(n)], out
    env = store.task_env(paths.tasks / task_id)
    assert env is not None
    chain = store.chain(env.base)
    assert len(chain) <= MAX_CHAIN_LAYERS and chain[-1].merged
