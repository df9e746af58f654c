"""Warm start: a saved VM with pi loaded, restored for each task.

A *template* is one VM booted until the supervisor has pi's modules loaded
(the launcher's "preloaded" event) and, primed, pi's own ``main()`` run with
no task in it (``prime_op`` in piwork.agent.spec; the "primed" event), with
the 9p devices present but nothing
mounted and no connection open to any host service (the netmux port is
never connected while the template runs, so the guest holds no stream and
refuses connections), then saved with QEMU's
migration: ``stop``, ``x-ignore-shared``, ``migrate exec:cat > state``. Guest
RAM lives in ``ram`` (a ``memory-backend-file``: ``share=on`` while the
template runs, so the file *is* the RAM); ``state`` holds only device state.

A task restores it with its own command line (its own ``-fsdev`` folders in
the same order and tags, sockets, its own netmux to its own gateway) plus
``-incoming defer`` and ``migrate-incoming exec:cat state``; the RAM file is
mapped ``share=off`` (copy-on-write, read on demand). The supervisor then
mounts the task's folders, sets the clock and binds pi to the task's
environment and working directory; the host then switches it to the task's
session (pi builds its session, models, resources and extensions again) and
model. An unprimed template's pi runs ``main()`` with the task's arguments
instead. Nothing task-specific is in the template.

A template belongs to one (pack, QEMU build, accelerator, machine shape):
:func:`template_key` hashes all of them, so a change means another directory
and a cold boot until it is built. Files are built in a temporary directory
and renamed into place, then made read-only; ``meta.json`` records the
state file's size and SHA-256, checked before every restore. Anything wrong
raises :class:`TemplateUnavailable` with a reason: the caller boots cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson

from piwork import arch as arches
from piwork import errors
from piwork.fsutil import atomic_write_bytes, fsync_dir, sha256_file
from piwork.vm.channel import GuestChannel
from piwork.vm.command import Transport, VmSpec, guest_arch

TEMPLATE_FORMAT = 5
"""2: no network card; the netmux virtio-serial port instead (a format-1 template
had a NIC and cannot be restored without one: its key no longer matches). Every
VM piwork starts has the netmux port, so the key needs no field for it.
3: the pack's read-only disk (root.erofs) is part of the device layout too.
4: the workbench image and the (empty) virtio-scsi controller the task's
environment disk is hot-plugged on after restore: the template itself holds
no writable disk, so nothing a clone's disk holds can disagree with the saved
page cache (the guest mounts it only after restore, as it does the 9p shares).
5: pi's main() has run in the saved VM (primed, see :func:`boot_and_save`): a format-4
template's pi cannot be bound to a task, and would be rebuilt anyway."""
META = "meta.json"
RAM = "ram"
STATE = "state"


class TemplateUnavailable(errors.VmError):
    """No usable template: the message is the reason, shown as "cold boot: <reason>"."""


UNKNOWN_QEMU = "unknown"
"""The version part of :func:`qemu_identity` when ``qemu --version`` failed."""


def qemu_identity(binary: str) -> str:
    """The QEMU build: its version line plus the binary's size and mtime.

    A failed version probe (killed, timed out) is not remembered: the next call
    asks again."""
    identity = _qemu_identity(binary)
    if identity.startswith(f"{UNKNOWN_QEMU}|"):
        _qemu_identity.cache_clear()
    return identity


@lru_cache(maxsize=8)
def _qemu_identity(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        return "missing"
    st = os.stat(path)
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        out = UNKNOWN_QEMU
    return f"{out}|{st.st_size}|{int(st.st_mtime)}"


def template_key(spec: VmSpec) -> dict[str, Any]:
    """Everything a restored VM must share with its template."""
    return {
        "format": TEMPLATE_FORMAT,
        "pack": spec.manifest.pack_id,
        "qemu": qemu_identity(spec.qemu_binary),
        "accel": spec.accel.accel.value,
        "accel_args": spec.accel.qemu_args,
        "memory_mb": spec.memory_mb,
        "cpus": spec.cpus,
        "transport": spec.transport.value,
        "cmdline": spec.manifest.cmdline,
        # The kernel file and the read-only disk shape the device layout and RAM.
        "kernel": spec.manifest.kernel,
        "rootfs": spec.manifest.rootfs,
        "workbench": spec.manifest.workbench,
        "shares": [[s.tag, s.readonly] for s in spec.shares],
        "extra_kernel_args": spec.extra_kernel_args,
    }


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()[:24]


def default_root(pack_dir: Path) -> Path:
    """Next to the pack cache (``<cache>/packs/<id>`` → ``<cache>/templates``)."""
    return pack_dir.parent.parent / "templates"


@dataclass(frozen=True)
class Template:
    dir: Path
    key: dict[str, Any]

    @property
    def ram(self) -> Path:
        return self.dir / RAM

    @property
    def state(self) -> Path:
        return self.dir / STATE

    def primed_with(self) -> tuple[str, ...] | None:
        """The extensions its pi was primed with (``meta.json``'s ``primed``); None: the
        saved VM's pi is only loaded, and a task's start runs pi's main() as usual."""
        try:
            primed = orjson.loads((self.dir / META).read_bytes()).get("primed")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            return None
        if not isinstance(primed, list) or not all(isinstance(p, str) for p in primed):
            return None
        return tuple(primed)

    def check(self) -> None:
        """Raise TemplateUnavailable unless the files are complete and match the key."""
        try:
            meta = orjson.loads((self.dir / META).read_bytes())
        except FileNotFoundError:
            raise TemplateUnavailable("no saved VM for this pack and machine yet") from None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise TemplateUnavailable(f"the saved VM's meta.json is unreadable ({exc})") from None
        if meta.get("key") != self.key:
            raise TemplateUnavailable("the saved VM belongs to another pack, QEMU or machine")
        try:
            size = self.state.stat().st_size
            ram_size = self.ram.stat().st_size
        except OSError as exc:
            raise TemplateUnavailable(f"the saved VM is incomplete ({exc})") from None
        if size != meta.get("state_size") or ram_size != self.key["memory_mb"] << 20:
            raise TemplateUnavailable("the saved VM's state file is truncated or changed")
        if sha256_file(self.state) != meta.get("state_sha256"):
            raise TemplateUnavailable("the saved VM's state file is corrupt")


def template_for(spec: VmSpec, root: Path) -> Template:
    key = template_key(spec)
    if str(key["qemu"]).startswith(f"{UNKNOWN_QEMU}|"):
        # Without its version a saved VM could be matched to another QEMU build
        # (or a stray one made for "unknown"): boot instead.
        raise TemplateUnavailable(
            f"cannot tell which QEMU this is ('{spec.qemu_binary} --version' failed)"
        )
    return Template(root / key_digest(key), key)


def usable(spec: VmSpec) -> str | None:
    """Why this VM cannot be warm-started at all (None: it can)."""
    if spec.transport is not Transport.VIRTIO:
        return "warm start needs the virtio transport"
    if guest_arch(spec) is not arches.AMD64:
        # Every clone of one saved VM would start with the same kernel RNG state;
        # vmgenid tells a restored x86 guest to reseed, and QEMU has no vmgenid
        # for other machines.
        return (
            f"warm start needs vmgenid, which QEMU has for x86 guests only ({spec.manifest.arch})"
        )
    return None


@contextlib.asynccontextmanager
async def build_lock(root: Path, digest: str) -> AsyncIterator[None]:
    """One builder per template across processes; others wait, then find it made."""
    fd = await asyncio.to_thread(_open_lock, root / f".{digest}.lock")
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _open_lock(path: Path) -> int:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        path.parent.chmod(0o700)  # guest RAM images: this user's only
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


async def save_vm(qmp_execute: Any, state_path: Path, timeout: float = 120.0) -> None:
    """Stop the VM and write its device state (RAM stays in the shared file)."""
    await qmp_execute("stop")
    await qmp_execute(
        "migrate-set-capabilities",
        {"capabilities": [{"capability": "x-ignore-shared", "state": True}]},
    )
    await qmp_execute("migrate", {"uri": f"exec:cat > {shlex.quote(str(state_path))}"})
    await _wait_migration(qmp_execute, timeout)


@dataclass
class PreloadWatch:
    """What a template build hears from the guest: pi loaded (``preloaded``), then,
    if it was asked to, whether pi's main() ran (``primed``: ok and error)."""

    loaded: asyncio.Event
    primed: asyncio.Event
    prime_result: dict[str, Any]

    def on_event(self, msg: dict[str, Any]) -> None:
        ev = msg.get("ev")
        if ev == "preloaded":
            self.loaded.set()
        elif ev == "primed" and not self.primed.is_set():
            self.prime_result.update(ok=msg.get("ok") is True, error=msg.get("error"))
            self.primed.set()


def preload_watch() -> PreloadWatch:
    """The guest events a template build waits for; give ``.on_event`` to its channel."""
    return PreloadWatch(asyncio.Event(), asyncio.Event(), {})


async def boot_and_save(
    vm: Any,
    channel: GuestChannel,
    watch: PreloadWatch,
    state: Path,
    stall_timeout: float,
    prime: dict[str, Any] | None = None,
) -> tuple[float, str | None]:
    """Boot ``vm`` (a local or a remote machine) until pi is preloaded, prime it if
    ``prime`` (the supervisor's ``prime`` op) is given, save its state to ``state``
    with no host connection in it, power it off.

    Returns the boot's seconds and why priming failed (None: primed, or not asked).
    A failed prime is not fatal: the supervisor has loaded a fresh, unprimed pi by
    the time it says so, and the template is saved with that one (``loaded`` is
    waited for again). ``channel`` is the VM's RPC channel made with ``watch.on_event``.
    """
    t = time.monotonic()
    await vm.launch()
    await asyncio.gather(vm.wait_booted(stall_timeout), channel.start(timeout=600))
    await asyncio.wait_for(watch.loaded.wait(), 600)
    prime_error: str | None = None
    if prime is not None:
        watch.loaded.clear()
        await channel.send_op("prime", **prime)
        await asyncio.wait_for(watch.primed.wait(), 600)
        if not watch.prime_result.get("ok"):
            prime_error = str(watch.prime_result.get("error") or "no reason given")[:500]
            await asyncio.wait_for(watch.loaded.wait(), 600)  # the unprimed pi it loaded instead
    boot = time.monotonic() - t
    await channel.close()  # no host connection in the saved state
    await save_vm(vm.qmp_execute, state)
    await vm.shutdown(grace=0)
    return boot, prime_error


async def restore_vm(qmp_execute: Any, state_path: Path, timeout: float = 60.0) -> None:
    """Load a template's device state into a QEMU started with ``-incoming defer``."""
    await qmp_execute(
        "migrate-set-capabilities",
        {"capabilities": [{"capability": "x-ignore-shared", "state": True}]},
    )
    await qmp_execute("migrate-incoming", {"uri": f"exec:cat {shlex.quote(str(state_path))}"})
    deadline = time.monotonic() + timeout
    while True:
        mig = (await qmp_execute("query-migrate")).get("status")
        if mig == "completed":
            break
        if mig in ("failed", "cancelled"):
            raise TemplateUnavailable(f"restoring the saved VM failed (migration {mig})")
        if time.monotonic() > deadline:
            raise TemplateUnavailable(f"restoring the saved VM took over {timeout:.0f}s")
        await asyncio.sleep(0.01)
    # The template was saved stopped, so the clone arrives paused: run it.
    if (await qmp_execute("query-status")).get("status") != "running":
        await qmp_execute("cont")


async def _wait_migration(qmp_execute: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        info = await qmp_execute("query-migrate")
        status = info.get("status")
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise TemplateUnavailable(f"saving the VM failed: {info.get('error-desc', status)}")
        if time.monotonic() > deadline:
            raise TemplateUnavailable(f"saving the VM took over {timeout:.0f}s")
        await asyncio.sleep(0.05)


def commit(tmp_dir: Path, tpl: Template, extra: dict[str, Any]) -> None:
    """Seal a built template: fsync, read-only, meta.json last, rename into place."""
    for name in (RAM, STATE):
        fd = os.open(tmp_dir / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        (tmp_dir / name).chmod(0o400)  # read-only, and only for this user
    state = tmp_dir / STATE
    meta = {
        "key": tpl.key,
        "state_size": state.stat().st_size,
        "state_sha256": sha256_file(state),
        "created_at": time.time(),
        **extra,
    }
    atomic_write_bytes(tmp_dir / META, orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    if tpl.dir.exists():
        shutil.rmtree(tpl.dir, ignore_errors=True)  # an invalid one (checked by the caller)
    os.rename(tmp_dir, tpl.dir)
    fsync_dir(tpl.dir.parent)


def sweep_unfinished(tpl: Template) -> list[Path]:
    """Remove what dead builders left of this template (a build or a discard cut short
    by kill -9: up to a guest's RAM each). Call with its :func:`build_lock` held: then
    no other process is building it, so every such directory is stale."""
    gone = []
    for leftover in tpl.dir.parent.glob(f"{tpl.dir.name}.*-*"):
        if leftover.name.startswith((f"{tpl.dir.name}.tmp-", f"{tpl.dir.name}.bad-")):
            shutil.rmtree(leftover, ignore_errors=True)
            gone.append(leftover)
    return gone


def discard_template(tpl: Template) -> None:
    """Move a broken template out of the way (a running clone keeps its mapping)."""
    aside = tpl.dir.with_name(f"{tpl.dir.name}.bad-{os.getpid()}-{time.monotonic_ns()}")
    with contextlib.suppress(FileNotFoundError):
        os.rename(tpl.dir, aside)
    shutil.rmtree(aside, ignore_errors=True)
