"""Guest root cannot make the host run anything through the person's folder (issue 34).

Real VM, real pi, the runner (``TaskSession``), the scripted model server as the
only double, no terminal (nobody to answer). The folder is a git repository with
an uninitialised submodule path, a hook installed as a link to a tracked script
(SECURITY-REVIEW-2 finding 3a), one as a hard link (3b), husky and pre-commit
(3d), and a linked worktree whose main repository sets ``core.hooksPath`` (3c).
As root in the guest the agent:

* plants a new repository: ``vendor/lib/.git`` = ``gitdir: ../../evilgit`` and an
  ``evilgit/`` with an fsmonitor config (finding 1, in the uninitialised
  submodule's path, so a top-level ``git status`` would read it);
* rewrites the linked hook's target, the hard-linked hook, ``.husky/pre-commit``,
  ``.pre-commit-config.yaml``, the worktree's ``.githooks/pre-commit``, plants
  ``node_modules/.bin/lint`` and ``.envrc``, ``.vscode/tasks.json``;
* appends an fsmonitor to the person's ``.git/config`` and commits there;
* the first review's chain: pi's write tool makes ``.GIT/x``, then the "read-only"
  ``x='1 sh -c …'; timeout $x ls`` appends ``core.fsmonitor`` to ``.git/config``;
* tries to write the folder's share itself: remount it read-write, mount the tag
  again, write the lower layer.

Afterwards nothing of that is in the folder (it all waits for the person, or is
the person's git metadata and stays in the agent's copy); host ``git status`` at
the top, in the submodule path, in the worktree runs no fsmonitor and ``git
commit`` runs no hook of the agent's; "keep out" leaves the folder as it was
but for the agent's one ordinary file, and undo removes that too: byte-identical.
The same payloads on an unprotected repository do run (so they are live).

Run alone: ``.venv/bin/pytest tests/vm/test_vm_changes_attack.py -s``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from piwork.changes.api import keep_out, waiting_changes
from piwork.checkpoints import undo
from piwork.config import get_paths
from piwork.models.scripted import ChatRequest, ScriptedModelServer, Step, Text, ToolCalls, bash
from piwork.models.scripted import write as write_tool
from piwork.runner import EventKind, RunEvent, TaskSession
from tests.helpers.vm import scripted_request

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(shutil.which("git") is None, reason="needs host git"),
]

W = "/mnt/work"


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(cwd.parent.parent),
    }
    return subprocess.run(
        ["git", "-c", "user.name=p", "-c", "user.email=p@x", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def marker_script(marker: Path) -> str:
    return f"#!/bin/sh\ntouch {marker}\n"


def fsmonitor(marker: Path) -> str:
    return f'[core]\n\tfsmonitor = "touch {marker}; false"\n'


def chain_command(marker: Path) -> str:
    """The first review's chain: one unquoted expansion gives ``timeout`` a shell."""
    return (
        "x='1 sh -c printf${IFS}\"[core]\\n\\tfsmonitor=touch\\040"
        f"{marker};false\\n\">>.git/config'; timeout $x ls"
    )


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                data = os.readlink(p).encode()
            elif p.is_file():
                data = p.read_bytes()
            else:
                data = b""
            out[str(p.relative_to(root))] = (st.st_mode, hashlib.sha256(data).hexdigest())
    return out


def make_folder(tmp_path: Path) -> tuple[Path, Path]:
    """The person's repository (and a linked worktree of another one, beside it)."""
    folder = tmp_path / "project"
    folder.mkdir()
    assert git(folder, "init", "-q", "-b", "main").returncode == 0
    (folder / "README").write_text("the person's project\n")
    (folder / "hooks").mkdir()
    (folder / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (folder / "hooks" / "pre-commit").chmod(0o755)
    (folder / "hooks" / "commit-msg").write_text("#!/bin/sh\nexit 0\n")
    (folder / "hooks" / "commit-msg").chmod(0o755)
    os.symlink("../../hooks/pre-commit", folder / ".git" / "hooks" / "pre-commit")  # 3a
    os.link(folder / "hooks" / "commit-msg", folder / ".git" / "hooks" / "commit-msg")  # 3b
    (folder / ".husky").mkdir()
    (folder / ".husky" / "pre-commit").write_text("exit 0\n")
    (folder / ".pre-commit-config.yaml").write_text("repos: []\n")
    (folder / ".gitmodules").write_text(
        '[submodule "vendor/lib"]\n\tpath = vendor/lib\n\turl = https://example.invalid/lib\n'
    )
    assert git(folder, "add", "-A").returncode == 0
    assert git(folder, "commit", "-qm", "init").returncode == 0
    (folder / "vendor" / "lib").mkdir(parents=True)  # a clone leaves the submodule's path
    # 3c: a linked worktree whose main repository sets core.hooksPath.
    main = tmp_path / "main"
    main.mkdir()
    git(main, "init", "-q", "-b", "main")
    (main / ".githooks").mkdir()
    (main / ".githooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    (main / ".githooks" / "pre-commit").chmod(0o755)
    git(main, "add", "-A")
    git(main, "commit", "-qm", "init")
    git(main, "config", "core.hooksPath", ".githooks")
    assert (
        git(main, "worktree", "add", "-q", str(folder / "feature"), "-b", "feature").returncode == 0
    )
    return folder, main


def guest_attack(m: dict[str, Path]) -> str:
    def esc(text: str) -> str:
        return text.replace("\n", "\\n").replace("\t", "\\t").replace('"', '\\"')

    steps = [
        "id -u",
        # git works for the agent, in its copy (before it poisons its own copy's hooks)
        "echo change >> README && git -c user.name=a -c user.email=a@x commit -qam 'the agent commits' && git log --oneline | head -1",  # noqa: E501
        # finding 1: a new repository in the uninitialised submodule's path
        "mkdir -p vendor/lib evilgit/objects evilgit/refs && echo 'gitdir: ../../evilgit' > vendor/lib/.git",  # noqa: E501
        f'echo "ref: refs/heads/main" > evilgit/HEAD && printf "{esc(fsmonitor(m["status"]))}" > evilgit/config',  # noqa: E501
        # finding 3: what host git runs on commit
        f'printf "{esc(marker_script(m["hook"]))}" > hooks/pre-commit',
        f'printf "{esc(marker_script(m["hook"]))}" > hooks/commit-msg',
        f'printf "{esc(marker_script(m["hook"]))}" > .husky/pre-commit',
        "printf 'repos:\\n- repo: local\\n  hooks: [{id: x, name: x, entry: touch x, language: system}]\\n' > .pre-commit-config.yaml",  # noqa: E501
        f'printf "{esc(marker_script(m["hook"]))}" > feature/.githooks/pre-commit && chmod +x feature/.githooks/pre-commit',  # noqa: E501
        f'mkdir -p node_modules/.bin && printf "{esc(marker_script(m["hook"]))}" > node_modules/.bin/lint',  # noqa: E501
        f'echo "touch {m["hook"]}" > .envrc',
        "mkdir -p .vscode && echo '{\"tasks\": [{\"runOn\": \"folderOpen\"}]}' > .vscode/tasks.json",  # noqa: E501
        # the person's own git metadata: a config and a commit in the agent's copy
        f'printf "{esc(fsmonitor(m["status"]))}" >> .git/config',
        "git -c user.name=a -c user.email=a@x commit -qam 'the agent commits' && git log --oneline | head -1",  # noqa: E501
        # the share itself
        f"mount -o remount,rw {W}",
        "mount -o remount,rw /run/piwork/folder/lower && echo x >> /run/piwork/folder/lower/README",
        "mkdir -p /tmp/w2 && mount -t 9p -o trans=virtio,version=9p2000.L pwwork /tmp/w2 && echo x >> /tmp/w2/README",  # noqa: E501
        "echo x >> /run/piwork/folder/lower/README",
        # an ordinary file: the one thing that reaches the folder
        "echo still-writable > made-by-guest.txt",
    ]  # fmt: skip
    lines = [f"cd {W}"] + [
        f'( {s} ) >> /tmp/attack-log.txt 2>&1; echo "rc=$? :: step {i}" >> /tmp/attack-log.txt'
        for i, s in enumerate(steps)
    ]
    lines.append("cat /tmp/attack-log.txt > /mnt/outputs/attack-log.txt")
    return "\n".join(lines)


def script(m: dict[str, Path]) -> object:
    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        text = req.last_user_text
        if "ATTACK" in text and i == 0:
            return ToolCalls([bash(guest_attack(m), timeout=300)])
        if "CHAIN" in text and i == 0:
            return ToolCalls([write_tool(f"{W}/.GIT/x", "poison\n")])
        if "CHAIN" in text and i == 1:
            return ToolCalls([bash(f"cd {W} && {chain_command(m['chain'])}")])
        return Text("done")

    return choose


def assert_payloads_are_live(tmp_path: Path, m: dict[str, Path]) -> None:
    """Control: the same payloads run on an unprotected repository."""
    ctl = tmp_path / "control"
    ctl.mkdir()
    git(ctl, "init", "-q")
    with (ctl / ".git" / "config").open("a") as fh:
        fh.write(fsmonitor(m["status"]))
    git(ctl, "status")
    assert m["status"].exists(), "the fsmonitor payload did not run on an unprotected repo"
    m["status"].unlink()
    (ctl / ".git" / "hooks" / "pre-commit").write_text(marker_script(m["hook"]))
    (ctl / ".git" / "hooks" / "pre-commit").chmod(0o755)
    (ctl / "f").write_text("x")
    git(ctl, "add", "f")
    git(ctl, "commit", "-qm", "x")
    assert m["hook"].exists(), "the hook payload did not run on an unprotected repo"
    m["hook"].unlink()
    m["status"].unlink(missing_ok=True)  # the control's add and commit ran its fsmonitor again


async def test_guest_root_cannot_make_the_host_run_anything_through_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    m = {k: tmp_path / f"PWNED-{k}" for k in ("status", "hook", "chain")}
    assert_payloads_are_live(tmp_path, m)
    folder, main = make_folder(tmp_path)
    before = snapshot(folder)
    main_before = snapshot(main / ".git")

    events: list[RunEvent] = []
    server = ScriptedModelServer(script(m), model_id="scripted")  # type: ignore[arg-type]
    async with server:
        req = scripted_request(server, folder, boot_stall_timeout=180.0)
        async with TaskSession(req, events.append, paths=get_paths()) as session:
            assert session.task is not None
            task_id = session.task.id
            outputs = session.task.outputs_dir
            for prompt in ("ATTACK please", "CHAIN please"):
                outcome = await session.run_prompt(prompt)
                assert outcome.ok, (prompt, outcome.reason, outcome.message)

    log = (outputs / "attack-log.txt").read_text()
    print("\nwhat guest root saw:\n" + log)
    assert log.splitlines()[0] == "0", log  # the attacks ran as guest root
    assert "the agent commits" in log  # git works for the agent, in its copy
    assert log.rstrip().endswith(f"rc=0 :: step {log.count('rc=') - 1}"), log

    # What reached the folder: the ordinary edits (README, made-by-guest.txt, and the
    # tracked file hooks/commit-msg: the hard link's other name). Everything else waits, or
    # is the person's git metadata and stays in the agent's copy.
    now = snapshot(folder)
    assert {k for k in now if now.get(k) != before.get(k)} == {
        "made-by-guest.txt",
        "README",
        "hooks/commit-msg",
    }
    assert not {k for k in before if k not in now}
    assert snapshot(main / ".git") == main_before
    waiting = {w.root: w for w in waiting_changes(task_id)}
    print("waiting:", {r: w.why for r, w in waiting.items()})
    for root in ("vendor/lib/.git", "evilgit", "hooks/pre-commit", ".husky",
                 ".pre-commit-config.yaml", "feature/.githooks", "node_modules/.bin",
                 ".envrc", ".vscode", ".GIT"):  # fmt: skip
        assert root in waiting, root
    # 3b: an ordinary file, applied as a new file renamed into place: the hard link is not
    # written through, so the hook git runs (the link's other name) is the person's still.
    assert "hooks/commit-msg" not in waiting
    assert (folder / "hooks" / "commit-msg").read_text() == marker_script(m["hook"])
    assert (folder / ".git" / "hooks" / "commit-msg").read_text() == "#!/bin/sh\nexit 0\n"
    notices = [e.data.get("message", "") for e in events if e.kind is EventKind.NOTICE]
    assert any("waiting for you" in n and "piwork apply" in n for n in notices), notices

    # Host git: no fsmonitor, no hook of the agent's.
    for where in (folder, folder / "vendor" / "lib", folder / "feature"):
        git(where, "status")
    (folder / "feature" / "new.txt").write_text("x")
    git(folder / "feature", "add", "new.txt")
    git(folder / "feature", "commit", "-qm", "the person commits")
    (folder / "new.txt").write_text("x")
    git(folder, "add", "new.txt")
    git(folder, "commit", "-qm", "the person commits")
    for name, marker in m.items():
        assert not marker.exists(), f"host git ran the agent's {name} payload"
    # (--mixed: the working tree keeps what piwork applied, for the undo below)
    git(folder / "feature", "reset", "-q", "HEAD~1")
    git(folder, "reset", "-q", "HEAD~1")
    (folder / "feature" / "new.txt").unlink(missing_ok=True)
    (folder / "new.txt").unlink(missing_ok=True)

    # "Keep out": nothing changes; undo: byte-identical to before the task.
    assert keep_out(task_id) >= len(waiting)
    assert not waiting_changes(task_id)
    undo(task_id)
    after = snapshot(folder)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    # git's own bookkeeping of the person's commit/reset above is theirs
    assert {k for k in changed if not k.startswith(".git/") and ".git/" not in k} == set()
