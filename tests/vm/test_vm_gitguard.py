"""The person's ``.git`` cannot be changed by the guest, whatever guest root does.

SECURITY-REVIEW.md finding 1 (critical) and the chain at the end of its
section 4. Real VM, real pi, driven through the runner (``TaskSession``) with
the scripted model server as the only double. ``assume_yes``: the gate lets
everything through, because what is tested here must hold when the gate is
wrong; it is enforced by the host (QEMU runs in a mount namespace where every
``.git`` of the folder is read-only, piwork/vm/confine.py).

* guest root writes ``.git/config``, ``.git/hooks/x``, an existing executable
  hook, a nested repository's ``sub/.git/config``, a gitlink's target; then
  tries ``umount``, ``mount -o remount,rw``, a fresh 9p mount of the same tag,
  a bind mount over ``.git``, ``rm -rf``, ``mv``, a hard link; it renames the
  nested repository's folder and makes a hostile ``.git`` where it was, and one
  in a folder that was no repository;
* the review's chain: pi's write tool makes ``.GIT/x``, then the "read-only"
  ``x='1 sh -c …'; timeout $x ls`` appends ``core.fsmonitor`` to ``.git/config``.

Afterwards every ``.git`` is byte-identical (content, mode, xattrs), the new
ones are out of the folder (moved into the task directory, and the person is
told; the first at the next model call, while the VM still runs), and a host
``git status`` in each folder writes no marker, while the
same payload on an unprotected copy does (so the payload is live).

Run alone: ``.venv/bin/pytest tests/vm/test_vm_gitguard.py -s``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

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


def fsmonitor(marker: Path) -> str:
    return f'[core]\n\tfsmonitor = "touch {marker}; false"\n'


def chain_command(marker: Path) -> str:
    """The review's chain command: one unquoted expansion gives ``timeout`` a shell."""
    return (
        "x='1 sh -c printf${IFS}\"[core]\\n\\tfsmonitor=touch\\040"
        f"{marker};false\\n\">>.git/config'; timeout $x ls"
    )


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(cwd.parent.parent),
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def make_repo(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    assert git(path, "init", "-q", "-b", "main").returncode == 0
    (path / "README").write_text("the person's project\n")
    git(path, "add", "README")
    assert (
        git(path, "-c", "user.name=p", "-c", "user.email=p@x", "commit", "-qm", "x").returncode == 0
    )


def snapshot(root: Path) -> dict[str, tuple[int, str, tuple[str, ...]]]:
    """Every entry under ``root``: mode, content hash, xattr names (mapped-xattr writes them)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(dirpath) / name
            st = p.lstat()
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
            xattrs = tuple(sorted(os.listxattr(p, follow_symlinks=False)))
            out[str(p.relative_to(root))] = (st.st_mode, hashlib.sha256(data).hexdigest(), xattrs)
    return out


def make_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    make_repo(folder)
    hook = folder / ".git" / "hooks" / "post-checkout"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    make_repo(folder / "sub")
    (folder / "plain").mkdir()
    (folder / "plain" / "notes.txt").write_text("not a repository\n")
    # A gitlink whose repository lives elsewhere in the folder (as `git worktree` or
    # `git submodule absorbgitdirs` make them).
    make_repo(folder / "store" / "lib")
    os.rename(folder / "store" / "lib" / ".git", folder / "store" / "lib.git")
    (folder / "store" / "lib" / ".git").write_text("gitdir: ../lib.git\n")
    return folder


STEPS = 21


def guest_attack(marker: Path) -> str:
    evil = fsmonitor(marker).replace("\n", "\\n").replace("\t", "\\t").replace('"', '\\"')
    steps = [
        "id -u",
        f'printf "{evil}" >> .git/config',
        "echo evil > .git/hooks/x",
        "echo 'touch PWNED' > .git/hooks/post-checkout",
        "chmod 6755 .git/hooks/post-checkout",
        f'printf "{evil}" >> sub/.git/config',
        f'printf "{evil}" >> store/lib.git/config',
        "echo 'gitdir: /tmp' > store/lib/.git",
        "ln .git/config cfg-hardlink && echo x >> cfg-hardlink",
        "rm -rf .git",
        "mv .git g2",
        f"umount {W}/.git",
        f"mount -o remount,rw {W}",
        f"mkdir -p /tmp/w2 && mount -t 9p -o trans=virtio,version=9p2000.L pwwork /tmp/w2"
        f' && printf "{evil}" >> /tmp/w2/.git/config',
        f"mkdir -p /tmp/fake && mount --bind /tmp/fake {W}/.git && echo x > {W}/.git/config"
        f" && umount {W}/.git",
        # The tag cannot be mounted twice (EBUSY, step 13), so a lazy umount would only
        # lose the share for the rest of the run: a plain umount is tried instead.
        f"cd / && umount {W} && mount -t 9p -o trans=virtio,version=9p2000.L,access=any"
        f' pwwork {W} && cd {W} && printf "{evil}" >> .git/config',
        # A nested repository's folder renamed, a hostile .git where it was; a new
        # .git in a folder that was no repository; a bare-looking directory.
        "mv sub sub-renamed && mkdir -p sub/.git",
        f'printf "{evil}" > sub/.git/config && echo "ref: refs/heads/main" > sub/.git/HEAD'
        " && mkdir -p sub/.git/objects sub/.git/refs",
        "mkdir -p plain/.git/objects plain/.git/refs && echo 'ref: refs/heads/main'"
        f' > plain/.git/HEAD && printf "{evil}" > plain/.git/config',
        "mkdir -p bare/objects bare/refs && echo 'ref: refs/heads/main' > bare/HEAD"
        f' && printf "{evil}" > bare/config',
        "echo still-writable > made-by-guest.txt",
    ]
    assert len(steps) == STEPS
    for i, step in enumerate(steps):
        print(f"step {i}: {step}")
    # The log lives in the guest's /tmp until the end (one step remounts the working
    # folder; appends through two 9p mounts with their own cached sizes would clash),
    # then goes to the outputs share, which no step touches.
    lines = [f"cd {W}"] + [
        f'( {s} ) >> /tmp/attack-log.txt 2>&1; echo "rc=$? :: step {i}" >> /tmp/attack-log.txt'
        for i, s in enumerate(steps)
    ]
    lines.append("cat /tmp/attack-log.txt > /mnt/outputs/attack-log.txt")
    return "\n".join(lines)


def script(marker: Path, chain_marker: Path, folder: Path, seen: dict[str, bool]) -> object:
    def choose(req: ChatRequest) -> Step:
        i = req.assistant_turns_since_user
        text = req.last_user_text
        if "ATTACK" in text and i == 0:
            return ToolCalls([bash(guest_attack(marker), timeout=300)])
        if "ATTACK" in text and i == 1:
            # The model call right after the attack: the host moved the new .git
            # entries aside before forwarding it (the VM still runs).
            seen["plain/.git after the turn"] = (folder / "plain" / ".git").exists()
        if "CHAIN" in text and i == 0:
            return ToolCalls([write_tool(f"{W}/.GIT/x", "poison\n")])
        if "CHAIN" in text and i == 1:
            return ToolCalls([bash(f"cd {W} && {chain_command(chain_marker)}")])
        return Text("done")

    return choose


def assert_payload_is_live(tmp_path: Path, marker: Path, chain_marker: Path) -> None:
    """Control: both payloads run on an unprotected repository (busybox sh, as in the guest)."""
    ctl = tmp_path / "control"
    make_repo(ctl)
    with (ctl / ".git" / "config").open("a") as fh:
        fh.write(fsmonitor(marker))
    git(ctl, "status")
    assert marker.exists(), "the fsmonitor payload did not run on an unprotected repo"
    marker.unlink()
    ctl2 = tmp_path / "control2"
    make_repo(ctl2)
    sh = [shutil.which("busybox") or "sh"] + (["sh"] if shutil.which("busybox") else [])
    subprocess.run([*sh, "-c", chain_command(chain_marker)], cwd=ctl2, check=False, timeout=30)
    git(ctl2, "status")
    assert chain_marker.exists(), "the chain command did not work on an unprotected repo"
    chain_marker.unlink()


async def test_guest_root_cannot_change_the_persons_git_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    marker = tmp_path / "PWNED-status"
    chain_marker = tmp_path / "PWNED-chain"
    assert_payload_is_live(tmp_path, marker, chain_marker)
    folder = make_folder(tmp_path)
    protected = {rel: snapshot(folder / rel) for rel in (".git", "sub/.git", "store/lib.git")}
    gitlink = (folder / "store" / "lib" / ".git").read_bytes()

    events: list[RunEvent] = []
    seen: dict[str, bool] = {}
    server = ScriptedModelServer(
        script(marker, chain_marker, folder, seen),  # type: ignore[arg-type]
        model_id="scripted",
    )
    async with server:
        req = scripted_request(server, folder, assume_yes=True, boot_stall_timeout=180.0)
        async with TaskSession(req, events.append, paths=get_paths()) as session:
            assert session.task is not None
            task_dir = session.task.dir
            outputs = session.task.outputs_dir
            for prompt in ("ATTACK please", "CHAIN please"):
                outcome = await session.run_prompt(prompt)
                assert outcome.ok, (prompt, outcome.reason, outcome.message)

    log = (outputs / "attack-log.txt").read_text()
    print("\nwhat guest root saw:\n" + log)
    print("folder now:", sorted(str(p.relative_to(folder)) for p in folder.glob("*/*")))
    assert log.splitlines()[0] == "0", log  # the attacks ran as guest root
    assert log.splitlines()[-1] == f"rc=0 :: step {STEPS - 1}", log  # the last: a plain write
    assert (folder / "made-by-guest.txt").read_text() == "still-writable\n"
    st = (folder / "made-by-guest.txt").stat()
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())  # the person's file
    assert (folder / ".GIT" / "x").read_text() == "poison\n"  # the chain's first step ran

    # The person's metadata: byte-identical, where the person left it (the renamed
    # folder carries its repository along: the same one, untouched).
    assert snapshot(folder / ".git") == protected[".git"]
    assert snapshot(folder / "sub-renamed" / ".git") == protected["sub/.git"]
    assert snapshot(folder / "store" / "lib.git") == protected["store/lib.git"]
    assert (folder / "store" / "lib" / ".git").read_bytes() == gitlink
    assert not (folder / "g2").exists() and not (folder / "cfg-hardlink").exists()

    # What the guest created is out of the folder, in the task directory, and said.
    for rel in ("sub/.git", "plain/.git", "bare"):
        assert not (folder / rel).exists(), rel
    assert seen == {"plain/.git after the turn": False}  # gone at the next checkpoint
    moved = task_dir / "moved-aside"
    assert sorted(p.name for p in moved.rglob("config")) == ["config", "config", "config"]
    notices = [e.data.get("message", "") for e in events if e.kind is EventKind.NOTICE]
    said = [n for n in notices if "moved aside git metadata" in n]
    assert len(said) == 3, notices
    # At start, the person was told the agent cannot commit (.git, sub/.git, store/lib.git
    # and the gitlink store/lib/.git).
    assert any("git metadata (4 entries) is read-only" in n for n in notices), notices

    for where in (
        folder,
        folder / "sub",
        folder / "sub-renamed",
        folder / "plain",
        folder / "bare",
    ):
        if where.exists():
            git(where, "status")
    assert not marker.exists(), "host git ran the guest's fsmonitor"
    assert not chain_marker.exists(), "host git ran the chain's fsmonitor"
