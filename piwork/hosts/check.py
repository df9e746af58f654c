"""What a remote box offers a task's VM: QEMU, /dev/kvm, the accelerator, disk, memory.

One POSIX ``sh`` script runs on the remote and prints ``key=value`` lines; the
accelerator is then chosen here by the same rules as for this machine
(:func:`piwork.vm.accel.choose_accel`), so a box with a ``/dev/kvm`` that
guests hang on is reported as TCG, with the reason.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import asyncssh

from piwork.errors import VmError
from piwork.textsafe import sanitize
from piwork.vm.accel import AccelChoice, HostFacts, choose_accel
from piwork.vm.template import UNKNOWN_QEMU

PROBE = r"""
root=$1
q=$(command -v "$2" 2>/dev/null || true)
echo "qemu_path=$q"
if [ -n "$q" ]; then
  echo "qemu_version=$("$q" --version 2>/dev/null | head -n 1)"
  echo "qemu_stat=$(stat -L -c '%s|%Y' "$q" 2>/dev/null)"
fi
if [ -e /dev/kvm ]; then echo kvm_exists=1; else echo kvm_exists=0; fi
if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then echo kvm_rw=1; else echo kvm_rw=0; fi
echo "cpu_flags=$(grep -m 1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2)"
echo "system=$(uname -s)"
echo "arch=$(uname -m)"
d=$root
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo "disk_free_kb=$(df -Pk "$d" | awk 'NR==2 {print $4}')"
echo "mem_available_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null)"
for t in setpriv sha256sum setsid flock; do
  if command -v "$t" >/dev/null 2>&1; then echo "tool_$t=1"; else echo "tool_$t=0"; fi
done
"""
"""Reads only; creates nothing (the root may not exist yet: df looks at its nearest parent)."""


class CheckError(RuntimeError, VmError):
    pass


@dataclass
class HostReport:
    values: dict[str, str]
    accel: AccelChoice
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def qemu_identity(self) -> str:
        """The remote QEMU build, as :func:`piwork.vm.template.qemu_identity` says it for
        this machine's (version line, size, mtime): a saved VM there is keyed on it."""
        version = self.values.get("qemu_version") or UNKNOWN_QEMU
        stat = self.values.get("qemu_stat") or "?|?"
        return f"{version}|{stat}"

    def to_json(self) -> dict[str, object]:
        return {
            **self.values,
            "accel": self.accel.accel.value,
            "accel_reason": self.accel.reason,
            "problems": self.problems,
        }


NUMBERS = frozenset({"disk_free_kb", "mem_available_kb"})
FLAGS = frozenset(
    {"kvm_exists", "kvm_rw", "ssh_streamlocal", "tool_setpriv", "tool_sha256sum",
     "tool_setsid", "tool_flock"}
)  # fmt: skip
TEXTS = frozenset({"qemu_path", "qemu_version", "qemu_stat", "cpu_flags", "system", "arch"})
MAX_VALUE = 8192
"""The longest value kept (``cpu_flags`` is ~1,500 characters on a big x86 box)."""
MAX_OUTPUT = 64 * 1024


def parse(output: str) -> dict[str, str]:
    """The probe's ``key=value`` lines, as the remote sent them: untrusted input.

    Only the keys the probe prints are kept, each checked for its type: numbers are
    ASCII digits, flags ``0``/``1``, text bounded (and printed only through the
    sanitiser); anything else is dropped, as if the probe had not said it.
    """
    values: dict[str, str] = {}
    for line in output[:MAX_OUTPUT].splitlines():
        key, sep, value = line.partition("=")
        value = value.strip()
        if not sep or len(value) > MAX_VALUE:
            continue
        if key in NUMBERS:
            ok = value.isascii() and value.isdigit() and len(value) <= 20
        elif key in FLAGS:
            ok = value in ("0", "1")
        else:
            ok = key in TEXTS
        if ok:
            values[key] = value
    return values


def number(values: dict[str, str], key: str) -> int:
    """A number :func:`parse` kept (0 when the remote did not say it)."""
    value = values.get(key, "")
    return int(value) if value.isascii() and value.isdigit() else 0


def report(values: dict[str, str]) -> HostReport:
    facts = HostFacts(
        system=values.get("system", ""),
        dev_kvm_exists=values.get("kvm_exists") == "1",
        dev_kvm_rw=values.get("kvm_rw") == "1",
        cpu_flags=frozenset(values.get("cpu_flags", "").split()),
        hvf_supported=False,
    )
    problems = []
    if values.get("system") != "Linux":
        system = sanitize(values.get("system") or "an unknown system", one_line=True, limit=60)
        problems.append(f"the remote runs {system}, not Linux")
    if not values.get("qemu_path"):
        problems.append(
            "QEMU is not installed on the remote: apt-get install qemu-system-x86 (Debian/Ubuntu)"
        )
    if values.get("ssh_streamlocal") == "0":
        problems.append(
            "the remote sshd refuses channels to unix sockets: set AllowStreamLocalForwarding yes "
            "and AllowTcpForwarding yes (or local) in its sshd_config"
        )
    for tool in ("sha256sum", "setsid", "flock"):
        if values.get(f"tool_{tool}") != "1":
            problems.append(f"{tool} is missing on the remote (coreutils / util-linux)")
    return HostReport(values, choose_accel(facts), problems)


STREAMLOCAL_PROBE = r"""
d=$(mktemp -d) || exit 1
timeout 20 "$1" -machine none -nodefaults -display none -S -monitor none -serial none \
  -chardev "socket,id=p,path=$d/p.sock,server=on,wait=off" </dev/null >/dev/null 2>&1 &
i=0
while [ ! -S "$d/p.sock" ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
echo "$! $d"
"""


async def streamlocal_allowed(conn: asyncssh.SSHClientConnection, qemu: str) -> bool:
    """Whether sshd lets us open channels to unix sockets there (QEMU's sockets need it).

    sshd answers "open failed" alike for a refused channel and a missing socket,
    so a real one is made: an idle QEMU (``-machine none``, at most 20 s) listening
    on a socket in a temp dir, then removed.
    """
    result = await conn.run("sh -s -- " + shlex.quote(qemu), input=STREAMLOCAL_PROBE,
                            check=False, timeout=30)  # fmt: skip
    pid, _, tmp = str(result.stdout or "").strip().partition(" ")
    if result.exit_status != 0 or not pid.isdigit() or not tmp.startswith("/"):
        raise CheckError(f"could not start the socket probe there: {result.stderr!s}".strip())
    try:
        _r, w = await conn.open_unix_connection(f"{tmp}/p.sock")
        w.close()
        return True
    except asyncssh.ChannelOpenError:
        return False
    finally:
        await conn.run(f"kill {pid}; rm -rf -- {shlex.quote(tmp)}", check=False)


async def run_check(
    conn: asyncssh.SSHClientConnection,
    root: str,
    qemu: str = "qemu-system-x86_64",
    *,
    probe_sockets: bool = True,
) -> HostReport:
    """What the box offers; ``probe_sockets`` also tries a channel to a real socket (~1 s)."""
    cmd = "sh -s -- " + shlex.join([root, qemu])
    result = await conn.run(cmd, input=PROBE, check=False, timeout=60)
    if result.exit_status != 0:
        raise CheckError(f"the probe failed on the remote: {result.stderr!s}".strip())
    values = parse(str(result.stdout))
    if probe_sockets and values.get("qemu_path"):
        allowed = await streamlocal_allowed(conn, values["qemu_path"])
        values["ssh_streamlocal"] = "1" if allowed else "0"
    return report(values)
