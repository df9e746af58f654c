"""The guest is hostile: what guest root does in its shares never reaches the host.

One task, two boots of the real VM with the real pi, driven through the
runner (``TaskSession``) with the scripted model server as the only double.
Guest root, through pi's bash tool:

* run 1 plants ``state/agent/models.json -> <host file>`` and replaces
  ``state/home`` (which the host makes at every start) with a link to a host
  directory; in the working folder it makes a setuid/setgid file, a character
  and a block device node, and a symlink it then reads through;
* run 2 (a resume: the host rewrites models.json and makes state/home again)
  must leave the host file and the host directory as they were, and pi must
  still get its model config (the run completes).

A planted link in place of the ``state/agent`` directory itself is covered
without a boot in tests/unit/test_runner_state.py. With 9p's mapped-xattr
model a link the guest makes is a plain file on the host; these checks hold
either way (they failed with security_model=none and a plain write).

Run alone: ``.venv/bin/pytest tests/vm/test_vm_trust.py -s``.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from piwork.config import get_paths
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash
from piwork.runner import RunRequest, TaskSession
from tests.helpers.vm import scripted_provider

pytestmark = pytest.mark.vm

HOST_TEXT = "# the person's file: the guest must never change it\n"


def guest_script(victim: Path, victim_dir: Path) -> object:
    plant_file = (
        f"ln -sf {victim} /mnt/state/agent/models.json; "
        f"rm -rf /mnt/state/home; ln -s {victim_dir} /mnt/state/home; "
        "cd /mnt/work && echo x > suid && chmod 6755 suid; "
        "mknod cdev c 1 3; mknod bdev b 7 0; "
        "mkdir -p sub && echo through-the-link > sub/target.txt && ln -s sub/target.txt link; "
        "cat link > read-via-link.txt; "
        "{ readlink host-made-link; cat host-made-link/target.txt; } > host-link-view.txt 2>&1; "
        "stat -c '%n %a %F' suid cdev bdev link > guest-view.txt"
    )

    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        text = req.last_user_text
        if i == 0 and "PLANT-FILE" in text:
            return ToolCalls([bash(plant_file)])
        return Text(f"done: {text[:20]}")

    return choose


def assert_folder_got_plain_files(folder: Path) -> None:
    st = os.lstat(folder / "suid")
    assert stat.S_ISREG(st.st_mode) and not st.st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert os.readlink(folder / "link") == "sub/target.txt"
    assert not os.path.lexists(folder / "cdev") and not os.path.lexists(folder / "bdev")


async def run_once(req: RunRequest, prompt: str) -> str:
    async with TaskSession(req, paths=get_paths()) as session:
        assert session.task is not None
        outcome = await session.run_prompt(prompt)
        assert outcome.ok, (outcome.reason, outcome.message)
        return session.task.id


async def test_guest_links_and_modes_in_shares_never_reach_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    victim = tmp_path / "bashrc"
    victim.write_text(HOST_TEXT)
    victim_dir = tmp_path / "host-dir"
    victim_dir.mkdir()
    (victim_dir / "models.json").write_text(HOST_TEXT)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "host-made-link").symlink_to("sub")  # made by the person, before the task

    server = ScriptedModelServer(guest_script(victim, victim_dir), model_id="scripted")  # type: ignore[arg-type]
    async with server:
        provider = scripted_provider(server)
        base = dict(
            model="scripted/scripted",
            extra_providers=(provider,),
            assume_yes=True,
            boot_stall_timeout=180.0,
        )
        t = time.monotonic()
        task_id = await run_once(
            RunRequest(prompt=None, folder=folder, **base),  # type: ignore[arg-type]
            "PLANT-FILE please",
        )
        t1 = time.monotonic() - t

        # Item 4: guest root's modes and device nodes stay in the guest's view.
        view = (folder / "guest-view.txt").read_text()
        assert "suid 6755 regular" in view, view  # the agent sees what it asked for
        assert "link 777 symbolic link" in view, view
        assert (folder / "read-via-link.txt").read_text() == "through-the-link\n"
        # The folder is read-only to QEMU with no mapping: the guest sees the person's
        # own link as a link, and follows it within its own view (docs/security.md).
        assert (folder / "host-link-view.txt").read_text() == "sub\nthrough-the-link\n"
        # What the change set brought: the file without its set-uid/set-gid bits, the
        # agent's link inside the folder as a link; no device node at all.
        assert_folder_got_plain_files(folder)

        # Item 3: the resume rewrites models.json and makes state/home, but never
        # through what the guest planted; pi still finds its config.
        await run_once(RunRequest(prompt=None, task_id=task_id, **base), "and finish")  # type: ignore[arg-type]
        assert victim.read_text() == HOST_TEXT
        assert sorted(p.name for p in victim_dir.iterdir()) == ["models.json"]
        assert (victim_dir / "models.json").read_text() == HOST_TEXT
        print(f"\nfirst run (boot + plant): {t1:.1f}s; both: {time.monotonic() - t:.1f}s")
