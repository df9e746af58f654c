"""What piwork needs on this host, what is missing, and the command that fixes it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from piwork import arch as arches
from piwork.config import Paths
from piwork.vm.accel import Accel, probe
from piwork.vm.command import find_qemu

MIN_FREE_BYTES = 2 * 1024**3
APT_FIX = "apt-get update && apt-get install -y qemu-system-x86 busybox-static cpio kmod"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    # A warning does not stop piwork from working (e.g. slow TCG).
    warning: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def check_qemu() -> Check:
    wanted = arches.selected().qemu
    qemu = find_qemu(wanted)
    if qemu is None:
        return Check("qemu", False, f"{wanted} not found", APT_FIX)
    return Check("qemu", True, f"{qemu}: {_version([qemu, '--version'])}")


def check_accel() -> Check:
    choice = probe()
    if choice.accel is Accel.TCG:
        return Check(
            "accelerator",
            True,
            f"tcg: {choice.reason}",
            "On a machine with working KVM: add your user to the kvm group; override with --accel",
            warning=True,
        )
    return Check("accelerator", True, f"{choice.accel.value}: {choice.reason}")


def check_architectures() -> list[Check]:
    """Which architectures' packs this host can build and boot, and how fast (issue 32)."""
    checks = []
    for target in arches.ARCHES.values():
        builds = "builds here" + ("" if arches.host() is target else " (emulated: qemu-user)")
        if not arches.runs_here(target):
            builds = "cannot build here (install qemu-user-static: scripts/setup.sh)"
        qemu = find_qemu(target.qemu)
        accel = probe(None, target.machine)
        speed = " (emulated: slow)" if accel.is_emulated else ""
        boots = (
            f"boots with {target.qemu} under {accel.accel.value}{speed}"
            if qemu
            else f"cannot boot ({target.qemu} not found)"
        )
        ok = qemu is not None and arches.runs_here(target)
        checks.append(Check(f"{target.debian} packs", True, f"{builds}; {boots}", warning=not ok))
    return checks


def check_build_tools() -> list[Check]:
    checks = []
    for tool, pkg in (
        ("apt-get", "(a Debian/Ubuntu host is needed to build packs)"),
        ("dpkg-deb", "dpkg"),
        ("depmod", "kmod"),
        ("npm", "nodejs npm"),
        ("mkfs.erofs", "erofs-utils"),
        ("mmdebstrap", "mmdebstrap"),
    ):
        path = shutil.which(tool)
        checks.append(
            Check(
                f"build tool {tool}",
                path is not None,
                path or f"{tool} not found (needed by `piwork pack build`)",
                "" if path else f"apt-get install -y {pkg}",
            )
        )
    return checks


def check_git() -> Check:
    path = shutil.which("git")
    return Check(
        "git (checkpoints)",
        path is not None,
        path or "git not found: tasks run without checkpoints, so `piwork undo` has nothing",
        "" if path else "apt-get install -y git",
    )


def check_pack() -> Check:
    try:
        from piwork.pack import find_pack
    except ImportError as exc:  # pragma: no cover - packaging error
        return Check("runtime pack", False, f"pack module unavailable: {exc}")
    try:
        found = find_pack()
    except Exception as exc:
        return Check("runtime pack", False, f"cannot look for packs: {exc}", "piwork pack build")
    if found is None:
        return Check(
            "runtime pack", False, "no pack built for this source tree", "piwork pack build"
        )
    return Check("runtime pack", True, str(found))


def check_warm_start() -> Check:
    """Warm start is on by default; say whether the saved VM for this pack exists."""
    try:
        from piwork.agent import AgentVmConfig, TaskDirs, saved_vm_for
        from piwork.pack import find_pack, load_manifest
        from piwork.run.request import RunRequest
        from piwork.vm.accel import probe
        from piwork.vm.template import TemplateUnavailable

        pack_dir = find_pack()
        if pack_dir is None:
            return Check("warm start", True, "on; no pack yet", warning=True)
        run = RunRequest(prompt=None)  # the VM a default `piwork run --folder` boots
        tpl = saved_vm_for(
            AgentVmConfig(
                pack_dir=pack_dir,
                manifest=load_manifest(pack_dir),
                accel=probe(None),
                dirs=TaskDirs(Path("s"), Path("o"), Path("u"), Path("w")),
                log_dir=Path("logs"),
                gateway_port=0,
                transport=run.transport,
                memory_mb=run.memory_mb,
                cpus=run.cpus,
            )
        )
        try:
            tpl.check()
        except TemplateUnavailable as exc:
            return Check(
                "warm start",
                True,
                f"on; {exc}: the next task makes it (one boot), later tasks restore it",
                warning=True,
            )
        primed = (
            "pi primed in it"
            if tpl.primed_with() is not None
            else "pi loaded in it, not primed (tasks run pi's main() after the restore)"
        )
        return Check("warm start", True, f"on; saved VM ready at {tpl.dir}, {primed}")
    except Exception as exc:
        return Check("warm start", True, f"on; cannot look for the saved VM: {exc}", warning=True)


def check_disk(paths: Paths) -> Check:
    target = paths.cache
    probe_dir: Path = target
    while not probe_dir.exists():
        probe_dir = probe_dir.parent
    free = shutil.disk_usage(probe_dir).free
    ok = free >= MIN_FREE_BYTES
    return Check(
        "disk space",
        ok,
        f"{free / 1024**3:.1f} GiB free under {probe_dir}",
        "" if ok else "free at least 2 GiB (packs are ~300 MB each; `piwork pack list`)",
    )


# The shared libraries the PySide6 wheels load (Debian package -> library).
QT_RUNTIME_LIBS: tuple[tuple[str, str], ...] = (
    ("libegl1", "libEGL.so.1"),
    ("libgl1", "libGL.so.1"),
    ("libfontconfig1", "libfontconfig.so.1"),
    ("libxkbcommon0", "libxkbcommon.so.0"),
    ("libdbus-1-3", "libdbus-1.so.3"),
    ("libxcb-cursor0", "libxcb-cursor.so.0"),
    ("libxcb-icccm4", "libxcb-icccm.so.4"),
    ("libxcb-keysyms1", "libxcb-keysyms.so.1"),
    ("libxkbcommon-x11-0", "libxkbcommon-x11.so.0"),
)


def check_qt_runtime() -> Check:
    """The desktop app's libraries (a warning: the headless commands work without them)."""
    import ctypes.util

    missing = [
        pkg
        for pkg, lib in QT_RUNTIME_LIBS
        if ctypes.util.find_library(lib[3:].split(".so")[0]) is None
    ]
    try:
        import importlib.util

        pyside = importlib.util.find_spec("PySide6") is not None
    except (ImportError, ValueError):
        pyside = False
    if not pyside:
        missing.insert(0, "PySide6 (pip install 'piwork[gui]')")
    if not missing:
        return Check("desktop app (Qt)", True, "PySide6 and the Qt runtime libraries are present")
    return Check(
        "desktop app (Qt)",
        True,  # the headless commands work without them: a warning, not a failure
        "missing: " + ", ".join(missing),
        "scripts/setup.sh (or apt-get install -y "
        + " ".join(p for p, _ in QT_RUNTIME_LIBS if p in missing)
        + "); needed only for the window",
        warning=True,
    )


def check_git_guard() -> Check:
    """Can QEMU run with the folder's .git read-only (piwork.vm.gitguard)?"""
    from piwork.vm.gitguard import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        return Check("git protection", True, "on: a folder's .git is read-only to the VM")
    return Check(
        "git protection",
        True,
        f"unavailable ({reason}): a folder holding a .git cannot be given to a task",
        "allow unprivileged user namespaces (Debian: sysctl -w kernel.unprivileged_userns_clone=1;"
        " Ubuntu 24.04: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0)",
        warning=True,
    )


def _proxy_reachable(host: str, port: int, timeout: float = 3.0) -> str | None:
    """None if a TCP connection to the proxy opens, else why not."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def check_network(
    paths: Paths,
    *,
    probe_proxy: bool = True,
    resolver: Callable[[str], list[str]] | None = None,
) -> list[Check]:
    """The upstream proxy, the extra CAs, the mirrors, and the registries that resolve to
    private addresses (refused in the sandbox until allowed), each with what to do."""
    from piwork.net.addresses import resolve
    from piwork.net.status import ALLOW_PRIVATE_REGISTRIES, network_status

    status = network_status(paths, resolver=resolver or resolve)
    checks: list[Check] = []
    up = status.upstream
    if up.any is None:
        checks.append(Check("upstream proxy", True, "none: the gateway and the egress proxy "
                            "connect directly"))  # fmt: skip
    for proxy in dict.fromkeys(p for p in (up.tunnel, up.plain) if p is not None):
        why = _proxy_reachable(proxy.host, proxy.port) if probe_proxy else None
        checks.append(
            Check(
                "upstream proxy",
                why is None,
                f"{proxy.url} (from {proxy.source})" + (f": cannot connect ({why})" if why else ""),
                f"check its address: `piwork network proxy set URL` (or fix {proxy.source})"
                if why
                else "",
            )
        )
    expired = [c for c in status.cas if c.expired]
    names = ", ".join(c.subject for c in status.cas[:4]) + (" …" if len(status.cas) > 4 else "")
    checks.append(
        Check(
            "extra CAs",
            True,
            f"{len(status.cas)} trusted and installed in the VM ({names})"
            if status.cas
            else "none (the public CAs only; `piwork network ca add FILE` for an inspecting "
            "proxy's)",
            f"remove or replace the expired: {', '.join(c.subject for c in expired)} "
            "(`piwork network ca list`)"
            if expired
            else "",
            warning=bool(expired),
        )
    )
    if status.mirrors.items():
        mirrors = ", ".join(f"{k} {v}" for k, v in status.mirrors.items())
        checks.append(Check("package mirrors", True, mirrors))
    refused = status.refused_registries
    if refused:
        where = refused[0].private or ""
        checks.append(
            Check(
                "package registries",
                True,  # piwork works; installs in the VM do not until this is allowed
                f"{', '.join(r.host for r in refused)} resolve to {where} (not a public "
                "address: your network's proxy or mirror answers there); the sandbox refuses "
                "them until you allow it",
                f"{ALLOW_PRIVATE_REGISTRIES} (and `piwork env allow-registries`)",
                warning=True,
            )
        )
    else:
        said = "; ".join(r.describe() for r in status.registries[:2])
        checks.append(Check("package registries", True, said or "not looked up"))
    for problem in status.problems:
        checks.append(Check("network settings", False, problem, "fix settings.json's network"))
    return checks


def run_checks(paths: Paths) -> list[Check]:
    return [
        check_qemu(),
        check_accel(),
        *check_architectures(),
        *check_build_tools(),
        check_git(),
        check_pack(),
        check_warm_start(),
        check_git_guard(),
        check_disk(paths),
        check_qt_runtime(),
        *check_network(paths),
    ]
