"""The host-side protection of the person's git metadata, without a VM.

The confine helper is run for real (a real user and mount namespace, a real
read-only bind mount); the process in it stands in for QEMU only in that it
tries, as QEMU's 9p server would for a hostile guest, to write, remove,
rename, unmount and remount. tests/vm/test_vm_gitguard.py does the same from
guest root in a real VM.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from piwork.vm import gitguard
from piwork.vm.confine import EXIT_FAILED

pytestmark = pytest.mark.skipif(
    gitguard.unavailable_reason() is not None,
    reason="needs unprivileged user namespaces",
)


def make_folder(root: Path) -> Path:
    folder = root / "proj"
    (folder / ".git" / "hooks").mkdir(parents=True)
    (folder / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (folder / "src").mkdir()
    (folder / "src" / "a.py").write_text("print(1)\n")
    (folder / "nested" / ".git").mkdir(parents=True)
    (folder / "nested" / ".git" / "config").write_text("[core]\n")
    (folder / "mods" / "sub").mkdir(parents=True)
    (folder / "data").mkdir()
    (folder / "data" / "x.git" / "objects").mkdir(parents=True)
    (folder / "data" / "x.git" / "refs").mkdir()
    (folder / "data" / "x.git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "wt").mkdir()
    (folder / "wt" / ".git").write_text("gitdir: ../store/wt.git\n")
    (folder / "store" / "wt.git").mkdir(parents=True)
    (folder / "store" / "wt.git" / "config").write_text("[core]\n")
    (folder / "far").mkdir()
    (folder / "far" / ".git").write_text(f"gitdir: {root / 'outside'}\n")
    (root / "outside").mkdir()
    (folder / "linked").symlink_to(root / "outside")
    return folder


def test_scan_finds_dirs_gitlinks_their_targets_and_bare_repos(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    found = {(e.path.relative_to(folder).as_posix(), e.kind) for e in gitguard.scan(folder)}
    assert found == {
        (".git", "dir"),
        ("nested/.git", "dir"),
        ("data/x.git", "bare"),
        ("wt/.git", "file"),
        ("store/wt.git", "gitdir"),
        ("far/.git", "file"),  # its target is outside the folder: not the guest's to reach
    }


def test_outermost_drops_entries_inside_others(tmp_path: Path) -> None:
    a = gitguard.GitEntry(tmp_path / ".git", "dir", 1, 1)
    b = gitguard.GitEntry(tmp_path / ".git" / "modules" / "x", "gitdir", 1, 2)
    c = gitguard.GitEntry(tmp_path / "z" / ".git", "dir", 1, 3)
    assert gitguard.outermost([c, b, a]) == [tmp_path / ".git", tmp_path / "z" / ".git"]


def run_confined(protection: gitguard.Protection, script: str) -> subprocess.CompletedProcess[str]:
    argv = gitguard.launch_argv(["/bin/sh", "-c", script], protection)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


def test_confined_process_cannot_change_git_metadata_even_with_mount_tricks(
    tmp_path: Path,
) -> None:
    folder = make_folder(tmp_path)
    protection = gitguard.protect([folder])
    before = {
        p: tree_bytes(folder / p) for p in (".git", "nested/.git", "data/x.git", "store/wt.git")
    }
    gitlink = (folder / "wt" / ".git").read_bytes()
    attacks = [
        "printf '[core]\\n\\tfsmonitor = touch PWNED\\n' >> .git/config",
        "echo x > .git/hooks/pre-commit",
        "echo x > nested/.git/config",
        "echo x > data/x.git/HEAD",
        "echo 'gitdir: /tmp' > wt/.git",
        "echo x > store/wt.git/config",
        "rm -rf .git",
        "mv .git moved",
        "mv nested/.git nested/g",
        "umount .git",
        "umount -l .git",
        "mount -o remount,rw .git",
        "mount -o remount,bind,rw .git",
        "mount --bind src .git",
        "unshare --user --map-root-user --mount sh -c 'umount .git; mount -o remount,rw .git;"
        " echo x >> .git/config'",
        "touch src/ok",  # the rest of the folder stays writable
        "mkdir -p newrepo/.git && echo 'made' > newrepo/.git/config",
    ]
    script = "cd " + str(folder) + "; " + "; ".join(f"{a} 2>/dev/null" for a in attacks) + "; true"
    proc = run_confined(protection, script)
    assert proc.returncode == 0, proc.stderr
    assert (folder / "src" / "ok").exists()
    assert not (folder / "moved").exists()
    for rel, content in before.items():
        assert tree_bytes(folder / rel) == content, rel
    assert (folder / "wt" / ".git").read_bytes() == gitlink
    # The new repository the "guest" made is there until the run ends.
    assert (folder / "newrepo" / ".git" / "config").read_text() == "made\n"


def test_files_made_in_the_namespace_belong_to_the_person(tmp_path: Path) -> None:
    """What QEMU's 9p server does for ``mapped-xattr``: create, then set ``user.virtfs.*``."""
    folder = make_folder(tmp_path)
    made = folder / "made"
    code = (
        f"import os; open({str(made)!r}, 'w').write('x'); "
        f"os.setxattr({str(made)!r}, 'user.virtfs.uid', b'0'); print(os.getuid())"
    )
    proc = run_confined(gitguard.protect([folder]), f'{sys.executable} -I -c "{code}"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(os.getuid())  # the same uid inside as outside
    st = os.stat(made)
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert os.getxattr(made, "user.virtfs.uid") == b"0"


def test_the_confined_process_dies_with_its_parent(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG survives the namespaces: a kill -9 of piwork takes QEMU with it."""
    parent = (  # piwork's part: it launches QEMU this way (machine.py)
        "import subprocess, sys, time\n"
        "from pathlib import Path\n"
        "from piwork.vm import gitguard\n"
        "from piwork.vm.machine import tied_argv\n"
        "protection = gitguard.protect([Path(sys.argv[1])])\n"
        "argv = tied_argv(gitguard.launch_argv(['sleep', '120'], protection))\n"
        "p = subprocess.Popen(argv, start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    (tmp_path / ".git").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", parent, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    time.sleep(1.0)  # the helper has set its namespaces up and exec'd
    assert _alive(pid)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the confined child outlived its parent"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1].split()[0] != "Z"  # a zombie is gone
    except (FileNotFoundError, ProcessLookupError, IndexError):  # gone mid-read: reaped
        return False


def test_new_git_metadata_is_moved_aside_and_the_persons_stays(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    protection = gitguard.protect([folder])
    # The person's nested repo, renamed by the guest: still the person's (same inode).
    os.rename(folder / "nested", folder / "renamed")
    (folder / "nested" / ".git").mkdir(parents=True)
    (folder / "nested" / ".git" / "config").write_text("[core]\n\tfsmonitor = evil\n")
    (folder / "src" / ".git").write_text("gitdir: ../store/wt.git\n")
    (folder / "esc\x1b]52;c;cm0K\x07\n" / ".git").mkdir(parents=True)  # a name made to print
    (folder / "bare" / "objects").mkdir(parents=True)
    (folder / "bare" / "refs").mkdir()
    (folder / "bare" / "HEAD").write_text("ref: refs/heads/x\n")
    dest = tmp_path / "task" / "moved-aside"
    moved, failed = gitguard.move_aside_new(protection, dest)
    assert failed == []
    assert sorted(m.original.relative_to(folder).as_posix() for m in moved) == [
        "bare",
        "esc\x1b]52;c;cm0K\x07\n/.git",
        "nested/.git",
        "src/.git",
    ]
    for m in moved:
        assert not m.original.exists()
        assert dest in m.now.parents
        assert "moved aside" in m.note() and "\x1b" not in m.note() and "\n" not in m.note()
    assert (folder / "renamed" / ".git" / "config").read_text() == "[core]\n"
    assert (folder / ".git" / "config").exists()
    assert gitguard.move_aside_new(protection, dest) == ([], [])  # nothing new the second time


def test_a_new_bare_looking_share_root_is_disarmed_in_place(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    protection = gitguard.protect([folder])
    for d in ("objects", "refs"):
        (folder / d).mkdir()
    (folder / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "config").write_text("[core]\n\tfsmonitor = evil\n")
    moved, failed = gitguard.move_aside_new(protection, tmp_path / "dest")
    assert failed == [] and [m.now for m in moved] == [folder / "HEAD.piwork-moved"]
    assert not (folder / "HEAD").exists()
    assert gitguard.scan(folder) == []  # git no longer takes it for a repository


def test_an_entry_swapped_after_the_scan_is_left_for_the_next_call(tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    protection = gitguard.protect([folder])
    (folder / "src" / ".git").mkdir()
    [entry] = [e for e in gitguard.scan(folder) if e.path == folder / "src" / ".git"]
    os.rename(folder / "src" / ".git", folder / "src" / "elsewhere")
    (folder / "src" / ".git").mkdir()  # another inode under the same name
    assert gitguard._move_one(folder, entry, tmp_path / "dest") is None
    assert (folder / "src" / ".git").is_dir()
    moved, _ = gitguard.move_aside_new(protection, tmp_path / "dest")
    assert [m.original for m in moved] == [folder / "src" / ".git"]


def test_helper_failure_starts_nothing(tmp_path: Path) -> None:
    """A path that cannot be mounted stops the launch with a reason; the command never runs."""
    marker = tmp_path / "ran"
    argv = [
        sys.executable,
        "-I",
        str(gitguard.CONFINE_SCRIPT),
        "--ro",
        str(tmp_path / "missing" / ".git"),
        "--",
        "/bin/sh",
        "-c",
        f"touch {marker}",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == EXIT_FAILED
    assert proc.stderr.startswith("piwork-confine: ")
    assert not marker.exists()


def test_fails_closed_without_namespaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = make_folder(tmp_path)
    protection = gitguard.protect([folder])
    monkeypatch.setattr(gitguard, "unavailable_reason", lambda: "no user namespaces here")
    with pytest.raises(gitguard.GitGuardError, match="user and mount namespace") as info:
        gitguard.launch_argv(["qemu"], protection)
    assert "unprivileged_userns_clone" in str(info.value)
    empty = gitguard.protect([tmp_path / "proj" / "src"])
    assert gitguard.launch_argv(["qemu"], empty) == ["qemu"]  # nothing to protect: runs


def test_doctor_says_whether_git_is_protected(monkeypatch: pytest.MonkeyPatch) -> None:
    from piwork.doctor import check_git_guard

    assert check_git_guard().detail.startswith("on:")
    monkeypatch.setattr(gitguard, "unavailable_reason", lambda: "no user namespaces here")
    check = check_git_guard()
    assert check.warning and "no user namespaces here" in check.detail
    assert "unprivileged_userns_clone" in check.fix


@pytest.mark.skipif(shutil.which("git") is None, reason="needs host git")
def test_a_hooks_path_inside_the_folder_is_protected_too(tmp_path: Path) -> None:
    folder = tmp_path / "proj"
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "config", "core.hooksPath", ".githooks"], check=True)
    hook = folder / ".githooks" / "pre-commit"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    protection = gitguard.protect([folder])
    assert folder / ".githooks" in protection.readonly
    proc = run_confined(protection, f"echo 'touch PWNED' > {hook}; echo x > {hook.parent}/post-x")
    assert "Read-only file system" in proc.stderr
    assert hook.read_text() == "#!/bin/sh\nexit 0\n"
    assert not (hook.parent / "post-x").exists()


def test_odd_names_are_mounted_as_they_are(tmp_path: Path) -> None:
    """Paths go to mount(2) as bytes (no option string, no mountinfo parsing)."""
    folder = tmp_path / "proj"
    odd = folder / "a dir,with=commas\nand a newline" / os.fsdecode(b"\xff-not-utf8")
    (odd / ".git").mkdir(parents=True)
    (odd / ".git" / "config").write_text("[core]\n")
    protection = gitguard.protect([folder])
    assert protection.readonly == (odd / ".git",)
    code = f"open({str(odd / '.git' / 'config')!r}, 'a').write('x')"
    proc = run_confined(protection, f"{sys.executable} -I -c {shlex.quote(code)}")
    assert "Read-only file system" in proc.stderr, proc.stderr
    assert (odd / ".git" / "config").read_text() == "[core]\n"


async def test_a_launch_with_git_to_protect_and_no_namespaces_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed at the VM launch itself: a clear VmError, no process, no QEMU run."""
    from piwork.pack.manifest import Manifest
    from piwork.vm.accel import probe
    from piwork.vm.command import Share, VmSpec
    from piwork.vm.machine import VirtualMachine, VmError

    folder = make_folder(tmp_path)
    marker = tmp_path / "qemu-ran"
    fake_qemu = tmp_path / "qemu"
    fake_qemu.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake_qemu.chmod(0o755)
    manifest = Manifest(
        pack_id="p", kernel="k", initrd="i", cmdline="", versions={}, files=[],
        created_at="now", builder="test",
    )  # fmt: skip
    spec = VmSpec(
        pack_dir=tmp_path,
        manifest=manifest,
        accel=probe("tcg"),
        qmp_socket=tmp_path / "q.sock",
        console_log=tmp_path / "console.log",
        rpc_socket=tmp_path / "r.sock",
        shares=[Share("pwstate", tmp_path, guard_git=False), Share("pwwork", folder)],
        qemu_binary=str(fake_qemu),
    )
    monkeypatch.setattr(gitguard, "unavailable_reason", lambda: "no user namespaces here")
    vm = VirtualMachine(spec)
    with pytest.raises(VmError, match=r"the VM was not started: .*no user namespaces here"):
        await vm.launch()
    assert vm.proc is None and not marker.exists()
