"""Run QEMU in its own mount namespace where the person's git metadata is read-only.

This file runs as a standalone script between piwork and QEMU (stdlib only, no
piwork import: it must start fast and must not depend on the package's state):

    python -I confine.py --parent PID [--ro PATH]... -- qemu-system-x86_64 ...

Why here and not in the guest: a read-only mount made inside the VM is undone
by guest root with one ``umount``. This one is made on the host, in a mount
namespace only QEMU lives in, so QEMU's own 9p server gets EROFS when the guest
asks it to write there, and nothing the guest sends can change that.

Steps, all without real root (an unprivileged user namespace):

1. ``unshare(CLONE_NEWUSER | CLONE_NEWNS)``, identity uid/gid map (one id each:
   the person's own), mounts made slaves of the host's;
2. every ``--ro`` path (opened ``O_PATH|O_NOFOLLOW`` first, so a link is never
   followed) is bind-mounted onto itself, then remounted read-only keeping the
   flags the kernel locks (nosuid, nodev, noexec; atime flags are kept by the
   kernel when none is given), then checked: same inode, read-only;
3. a second, nested user namespace (identity map again): QEMU's capabilities,
   if it has any (piwork running as root), are in that child namespace, which
   does not own the mount namespace, so QEMU itself cannot unmount or remount
   anything; mounts copied into any namespace it makes are locked;
4. the parent-death signal is set again (SIGKILL, as ``setpriv`` did) and the
   parent checked, then QEMU is exec'd in place: same pid, a direct child of
   piwork, owned by the person (files it creates are the person's).

Exit status 125 with one ``piwork-confine: ...`` line on stderr on any failure,
before QEMU starts: the caller never gets an unprotected VM by accident.
``--check`` does steps 1-3 on a scratch directory and exits 0, so a host
without user namespaces is found before a VM is launched.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import tempfile

from piwork.errors import VmError

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
PR_SET_PDEATHSIG = 1
EXIT_FAILED = 125

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_void_p,
]


class ConfineError(VmError):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise ConfineError(f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _new_userns(uid: int, gid: int, flags: int = 0) -> None:
    """A user namespace (plus ``flags``) where we are still ``uid``/``gid``."""
    _check(_libc.unshare(CLONE_NEWUSER | flags), "unshare (user namespace)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def _mount(src: bytes | None, dst: bytes, flags: int, what: str) -> None:
    _check(_libc.mount(src, dst, None, flags, None), what)


def make_readonly(path: str) -> None:
    """Bind ``path`` onto itself read-only in this mount namespace, then verify it."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        before = os.fstat(fd)
        keep = os.statvfs(path).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
        via_fd = f"/proc/self/fd/{fd}".encode()
        _mount(via_fd, via_fd, MS_BIND, f"bind mount of {path}")
        target = os.fsencode(path)
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | keep
        _mount(None, target, flags, f"read-only remount of {path}")
    finally:
        os.close(fd)
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        after = os.fstat(fd)
        readonly = os.fstatvfs(fd).f_flag & MS_RDONLY
    finally:
        os.close(fd)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) or not readonly:
        raise ConfineError(f"{path} is not read-only after the mount (it changed underneath?)")


def confine(readonly: list[str]) -> None:
    uid, gid = os.getuid(), os.getgid()
    _new_userns(uid, gid, CLONE_NEWNS)
    _mount(None, b"/", MS_REC | MS_SLAVE, "making mounts private to QEMU")
    for path in readonly:
        make_readonly(path)
    _new_userns(uid, gid)  # QEMU's capabilities (if any) no longer cover the mounts


def check() -> None:
    """Everything :func:`confine` does, on a scratch directory; raise if the host cannot."""
    with tempfile.TemporaryDirectory(prefix="piwork-confine-") as tmp:
        os.mkdir(os.path.join(tmp, ".git"))
        pid = os.fork()
        if pid == 0:  # the namespaces are per process: try them in a child
            try:
                confine([os.path.join(tmp, ".git")])
                probe = os.path.join(tmp, ".git", "probe")
                try:
                    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600))
                except OSError:
                    os._exit(0)
                sys.stderr.write("piwork-confine: the read-only mount did not hold\n")
                os._exit(EXIT_FAILED)
            except (OSError, ConfineError) as exc:
                sys.stderr.write(f"piwork-confine: {exc}\n")
                os._exit(EXIT_FAILED)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise SystemExit(code)


def main(argv: list[str]) -> int:
    readonly: list[str] = []
    parent = 0
    i = 0
    try:
        while i < len(argv):
            arg = argv[i]
            if arg == "--check":
                check()
                return 0
            if arg == "--ro":
                readonly.append(argv[i + 1])
                i += 2
            elif arg == "--parent":
                parent = int(argv[i + 1])
                i += 2
            elif arg == "--":
                i += 1
                break
            else:
                raise ConfineError(f"unknown argument {arg!r}")
        command = argv[i:]
        if not command:
            raise ConfineError("no command to run")
        confine(readonly)
        if parent:
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
            if os.getppid() != parent:  # piwork died before the signal was armed
                raise ConfineError(f"the parent process {parent} is gone; not starting")
        os.execvp(command[0], command)
    except (OSError, ConfineError, IndexError, ValueError) as exc:
        sys.stderr.write(f"piwork-confine: {exc}\n")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
