"""``piwork env build``: a project's Dockerfile subset, built inside a piwork VM into a layer.

Why a VM and not the host: a RUN step is arbitrary code (install scripts,
``curl | sh``); it runs where every agent command runs, in the guest, under
the same egress proxy and network policy, never on the person's machine.

How, step by step:

1. The file is parsed (:mod:`piwork.env.dockerfile`); every ``COPY`` source is
   staged from the build folder into a private directory, never through a
   symlink that leads out of the folder, and hashed as staged (what is hashed
   is what the VM copies).
2. The cache key is the sha256 of the pack, the base layer, every step's
   meaning (with the ENV and WORKDIR in force) and the staged bytes. A layer
   with that key already built is reused: the folder's head moves to it and no
   VM boots ("cached").
3. Otherwise a VM starts the usual way (the warm template when there is one)
   with a fresh environment disk (over the base layer for ``FROM LAYER``), the
   staged sources as its read-only uploads share, and the egress proxy with the
   person's policy. Each RUN/COPY goes to pi's own bash over RPC
   (:meth:`piwork.agent.PiDoor.run_bash`), its output to a log on the outputs
   share that the host streams to the terminal (made safe to print: it is
   guest text). A step that fails stops the build with its file:line and exit
   code, and the disk is deleted: no layer.
4. At the end the ENV and WORKDIR are written to ``/etc/piwork/env.sh`` in the
   environment (tasks' bash reads it via ``BASH_ENV``), the VM powers off, and
   the disk is frozen into a read-only layer named by the key. The folder's
   next ``piwork run`` starts from it (unless ``--clean-env``).

The host never opens the disk the VM wrote (docs/security.md): it renames it.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import errno
import hashlib
import os
import secrets
import shlex
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from piwork import sharefs
from piwork.agent import AgentVm, AgentVmConfig, TaskDirs
from piwork.config import Paths
from piwork.env.dockerfile import (
    BASE_PIWORK,
    BuildFile,
    DockerfileError,
    Step,
    compile_pattern,
    env_script,
    is_pattern,
    parse,
)
from piwork.env.store import (
    BUILD_ENV_FILE,
    DEFAULT_SIZE_BYTES,
    EnvError,
    TaskEnv,
    create_disk,
    store_for,
)
from piwork.errors import UsageError
from piwork.models.scripted import pi_provider_config
from piwork.net.host import host_network
from piwork.net.mirrors import mirror_hosts, mirrors_for
from piwork.pack import ensure_pack, load_manifest
from piwork.policy import AuditLog, Decider, PolicyStore
from piwork.policy.rules import TaskContext
from piwork.proxy.egress import REASONS, EgressDecision, EgressProxy
from piwork.resources import vm_budget
from piwork.rpc.client import RpcError
from piwork.run.digest import EventKind
from piwork.run.environment import guest_network_env
from piwork.run.permissions import Asker, DenyAsker, PermissionBridge
from piwork.tasks import TaskStatus
from piwork.textsafe import sanitize
from piwork.vm.accel import probe
from piwork.vm.command import GATEWAY_GUEST_ADDR

BUILD_FORMAT = 1
"""In the cache key: a change in how builds are made rebuilds every environment."""
LAYER_PREFIX = "b-"
IMAGE_PREFIX = "i-"
"""Imported images' ids (piwork.env.importer): ``FROM i-...`` builds on one."""
BUILD_PROVIDER = "piwork-build"
"""pi needs a model to start; the build never calls one (its gateway port is closed)."""
STEP_LOG = "piwork-build-step.log"
GUEST_UPLOADS = "/mnt/uploads"
GUEST_OUTPUTS = "/mnt/outputs"

Say = Callable[[str], None]


class BuildFailed(EnvError):
    """A step failed, or the VM did; the message names the step's file:line."""


class ContextError(UsageError, ValueError):
    """A COPY source is missing, or would leave the build folder."""


@dataclass
class Staged:
    """What COPY sources became in the private staging folder (the VM's uploads share)."""

    root: Path
    digest: str
    items: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    """(step index, source index) -> ("file", basename) or ("dir", "")."""
    links: dict[tuple[int, int], list[tuple[str, str]]] = field(default_factory=dict)
    """Symlinks inside a copied folder (relative path, target): made by ``ln -s`` in the VM."""


MAX_CONTEXT_ENTRIES = 200_000
"""A COPY of more files and folders than this is refused (it would not be a build input)."""


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def stage_context(build: BuildFile, context: Path, dest: Path) -> Staged:
    """Copy every COPY source into ``dest`` (regular files and folders only) and hash it.

    A source that is (or passes through) a symlink is followed only while it stays in
    ``context``; inside a copied folder a symlink is kept as a link when its target is
    relative and stays in the folder, else the build is refused. Device nodes, FIFOs
    and sockets are refused.

    Only the source's own path is resolved (``resolve()``, to follow a link that stays
    in the folder); what that gives is then opened, walked and read beneath the folder
    one component at a time without following any link (``piwork.sharefs``), so a
    link swapped in after a check is refused, never followed out of the folder.
    """
    root = context.resolve()
    h = hashlib.sha256()
    staged = Staged(dest, "")
    for si, step in enumerate(build.steps):
        if step.kind != "COPY":
            continue
        where = f"{build.path.name}:{step.line}"
        for ki, src in enumerate(step.sources):
            if is_pattern(src):
                slot = dest / f"{si}-{ki}"
                slot.mkdir(parents=True)
                h.update(f"\0src {si} {ki} {src}\0".encode())
                staged.items[(si, ki)] = ("dir", "")
                with _changed_means_refused(where, src):
                    staged.links[(si, ki)] = _stage_matches(root, src, slot, h, where)
                continue
            given = root / src
            if not os.path.lexists(given):
                raise ContextError(f"{where}: COPY {src}: no such file in {root}")
            real = given.resolve()
            if not _inside(real, root):
                raise ContextError(
                    f"{where}: COPY {src}: it is a symlink that leads out of the build folder "
                    f"({real}); only files inside {root} can be copied"
                )
            rel = real.relative_to(root).as_posix()
            slot = dest / f"{si}-{ki}"
            slot.mkdir(parents=True)
            h.update(f"\0src {si} {ki} {src}\0".encode())
            with _changed_means_refused(where, src):
                mode = (os.stat(root) if rel == "." else sharefs.lstat_beneath(root, rel)).st_mode
                if stat.S_ISDIR(mode):
                    staged.items[(si, ki)] = ("dir", "")
                    staged.links[(si, ki)] = _stage_tree(root, rel, slot, h, where, src)
                elif stat.S_ISREG(mode):
                    name = PurePosixPath(src).name if src != "." else real.name
                    staged.items[(si, ki)] = ("file", name)
                    _stage_file(root, rel, slot / name, h, name)
                else:
                    raise ContextError(f"{where}: COPY {src}: not a regular file or folder")
    staged.digest = h.hexdigest()
    return staged


@contextlib.contextmanager
def _changed_means_refused(where: str, src: str) -> Iterator[None]:
    """A link or a vanished file met while staging: the folder changed under the build."""
    try:
        yield
    except sharefs.UnsafePathError as exc:
        raise ContextError(
            f"{where}: COPY {src}: it changed while it was being copied "
            f"({exc.strerror or exc}); run the build again once nothing changes the build folder"
        ) from exc
    except FileNotFoundError as exc:
        raise ContextError(
            f"{where}: COPY {src}: a file went away while it was being copied; run "
            "the build again once nothing changes the build folder"
        ) from exc


def _stage_matches(root: Path, src: str, slot: Path, h: Any, where: str) -> list[tuple[str, str]]:
    """A wildcard source (``COPY *.txt /dst/``) as Docker copies it: each matching file into
    the folder, each matching folder's contents merged into it. The folder it names is
    resolved like any source (a link in it is followed only while it stays inside); the
    matches are then staged like sources of their own."""
    parent_src, _, pattern = src.rpartition("/")
    regex = compile_pattern(pattern, f"{where}: COPY {src}")
    parent = (root / parent_src).resolve() if parent_src else root
    if not _inside(parent, root):
        raise ContextError(
            f"{where}: COPY {src}: {parent_src} is a symlink that leads out of the build folder"
        )
    parent_rel = parent.relative_to(root).as_posix()
    try:
        fd = (
            os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            if parent_rel == "."
            else sharefs.open_beneath(root, parent_rel, os.O_RDONLY | os.O_DIRECTORY)
        )
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ContextError(f"{where}: COPY {src}: no folder {parent_src} in {root}") from exc
    try:
        with os.scandir(fd) as it:
            names = sorted(e.name for e in it if regex.fullmatch(e.name))
    finally:
        os.close(fd)
    if not names:
        raise ContextError(f"{where}: COPY {src}: no file in {parent} matches {pattern}")
    links: list[tuple[str, str]] = []
    for name in names:
        rel = name if parent_rel == "." else f"{parent_rel}/{name}"
        real = (root / rel).resolve()
        if not _inside(real, root):
            raise ContextError(
                f"{where}: COPY {src}: {name} is a symlink that leads out of the build folder "
                f"({real}); only files inside {root} can be copied"
            )
        real_rel = real.relative_to(root).as_posix()
        h.update(f"m {name}\n".encode())
        mode = (os.stat(root) if real_rel == "." else sharefs.lstat_beneath(root, real_rel)).st_mode
        try:
            if stat.S_ISDIR(mode):
                links += _stage_tree(root, real_rel, slot, h, where, f"{src} ({name})")
            elif stat.S_ISREG(mode):
                if os.path.lexists(slot / name):
                    raise FileExistsError(name)
                _stage_file(root, real_rel, slot / name, h, name)
            else:
                raise ContextError(f"{where}: COPY {src}: {name} is not a regular file or folder")
        except FileExistsError as exc:
            clash = exc.args[0] if exc.args else name
            raise ContextError(
                f"{where}: COPY {src}: two matches give the same name ({clash}) in the "
                "destination; copy them with separate COPY lines"
            ) from exc
    return sorted(links)


def _stage_file(root: Path, rel: str, dst: Path, h: Any, name: str) -> None:
    """Copy ``root/rel`` (reached without following a link) to ``dst`` and hash it."""
    fd = sharefs.open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fin:
        st = os.fstat(fin.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise sharefs.UnsafePathError(errno.EINVAL, f"{rel} is no longer a regular file")
        mode = st.st_mode & 0o777
        fh = hashlib.sha256()
        with open(dst, "wb") as fout:
            for chunk in iter(lambda: fin.read(1 << 20), b""):
                fh.update(chunk)
                fout.write(chunk)
    os.chmod(dst, mode | 0o400)
    h.update(f"f {name} {mode:o} {fh.hexdigest()}\n".encode())


def _link_stays_inside(links: dict[str, str], link: str, target: str) -> bool:
    """Whether the link ``link`` (a path in the copied folder) resolves inside the folder,
    following the folder's own links as the guest will once they are copied (40 hops)."""
    if target.startswith("/"):
        return False
    at = link.split("/")[:-1]
    todo = target.split("/")
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not at:
                return False
            at.pop()
            continue
        inner = links.get("/".join([*at, part]))
        if inner is None:
            at.append(part)
            continue
        hops += 1
        if hops > 40 or inner.startswith("/"):
            return False
        todo = inner.split("/") + todo
    return True


def _stage_tree(
    root: Path, top: str, slot: Path, h: Any, where: str, src: str
) -> list[tuple[str, str]]:
    """Copy the folder ``root/top`` into ``slot``, walked by descriptor (sharefs)."""
    links: dict[str, str] = {}
    under = None if top == "." else top
    walk = sharefs.walk_beneath(root, under=under, max_entries=MAX_CONTEXT_ENTRIES + 1)
    for count, entry in enumerate(walk, 1):
        if count > MAX_CONTEXT_ENTRIES:
            raise ContextError(
                f"{where}: COPY {src} holds more than {MAX_CONTEXT_ENTRIES} files and folders; "
                "copy the parts the environment needs"
            )
        rel = entry.path
        full = rel if under is None else f"{under}/{rel}"
        shown = f"{src.rstrip('/')}/{rel}"
        if entry.is_link:
            target = sharefs.readlink_beneath(root, full)
            links[rel] = target
            h.update(f"l {rel} {target}\n".encode())
        elif entry.is_dir:
            (slot / rel).mkdir()  # FileExistsError: two wildcard matches give this name
            os.chmod(slot / rel, (entry.stat.st_mode & 0o777) | 0o700)
            h.update(f"d {rel} {entry.stat.st_mode & 0o777:o}\n".encode())
        elif entry.is_file:
            if os.path.lexists(slot / rel):
                raise FileExistsError(rel)
            _stage_file(root, full, slot / rel, h, rel)
        else:
            raise ContextError(
                f"{where}: COPY {shown} is not a regular file, folder or symlink "
                "(a device, FIFO or socket): remove it from what is copied"
            )
    # Checked once every link is known: one may lead through another.
    for rel, target in sorted(links.items()):
        if not _link_stays_inside(links, rel, target):
            raise ContextError(
                f"{where}: COPY {src.rstrip('/')}/{rel} is a symlink to {target}, outside the "
                "copied folder: replace it with the file, or copy its target too"
            )
    return sorted(links.items())


def cache_key(
    build: BuildFile,
    pack_id: str,
    base_layer: str | None,
    staged_digest: str,
    image: str | None = None,
) -> str:
    payload = {
        "format": BUILD_FORMAT,
        "pack": pack_id,
        "base": base_layer,
        "image": image,
        "steps": build.canonical(),
        "copied": staged_digest,
    }
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


# --------------------------------------------------------------- guest commands
def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prelude(step: Step) -> list[str]:
    lines = [f"export {key}={shlex.quote(value)}" for key, value in step.env]
    wd = shlex.quote(step.workdir)
    lines.append(f"mkdir -p {wd} && cd {wd} || exit 125")
    return lines


def run_script(step: Step, timeout: int) -> str:
    """The bash command for a RUN step: Docker's ``/bin/sh -c``, its ENV, in its WORKDIR,
    bounded by ``timeout`` (exit 124), all output to the streamed log."""
    lines = _prelude(step)
    lines.append(
        f'timeout -k 10 {timeout} /bin/sh -c "$(printf %s {_b64(step.command)} '
        f'| base64 -d)" > {GUEST_OUTPUTS}/{STEP_LOG} 2>&1 < /dev/null'
    )
    return "\n".join(lines)


def copy_script(step: Step, index: int, staged: Staged) -> str:
    """The bash command for a COPY step: from the read-only uploads share, as root."""
    lines = [*_prelude(step), "set -e", f"exec > {GUEST_OUTPUTS}/{STEP_LOG} 2>&1"]
    # Plain cp: files become root's (as Docker's COPY), modes kept under umask 022; the
    # options busybox's cp also knows (an imported image may have no GNU cp).
    cp = "cp -dR"
    dest = step.dest
    for ki, src in enumerate(step.sources):
        kind, name = staged.items[(index, ki)]
        slot = f"{GUEST_UPLOADS}/{index}-{ki}"
        if kind == "dir":
            target = dest.rstrip("/") or "/"
            lines.append(f"mkdir -p {shlex.quote(target)}")
            lines.append(f"{cp} {slot}/. {shlex.quote(target)}/")
            for rel, link in staged.links.get((index, ki), []):
                path = shlex.quote(f"{target.rstrip('/')}/{rel}")
                lines.append(f'mkdir -p "$(dirname {path})" && ln -sfn {shlex.quote(link)} {path}')
        elif dest.endswith("/"):
            lines.append(f"mkdir -p {shlex.quote(dest)}")
            lines.append(f"{cp} {shlex.quote(f'{slot}/{name}')} {shlex.quote(dest)}")
        else:
            q = shlex.quote(dest)
            lines.append(
                f"if [ -d {q} ]; then {cp} {shlex.quote(f'{slot}/{name}')} {q}/; else "
                f'mkdir -p "$(dirname {q})" && {cp} {shlex.quote(f"{slot}/{name}")} {q}; fi'
            )
        lines.append(f"echo {shlex.quote(f'copied {src} to {dest}')}")
    return "\n".join(lines)


def finish_script(build: BuildFile) -> str:
    """Write what tasks' bash reads (ENV, WORKDIR) into the environment, and flush."""
    script = env_script(build.env, build.workdir)
    return (
        f"mkdir -p {shlex.quote(str(PurePosixPath(BUILD_ENV_FILE).parent))} && "
        f"printf %s {_b64(script)} | base64 -d > {BUILD_ENV_FILE} && "
        f"mkdir -p {shlex.quote(build.workdir)} && sync && echo written"
    )


# --------------------------------------------------------------- the build
@dataclass
class BuildResult:
    layer: str
    cached: bool
    steps_run: int = 0
    seconds: float = 0.0


class _BuildHost:
    """The permission bridge's view of a build: no task record, questions in the terminal."""

    def __init__(self) -> None:
        self.last_by: str | None = None
        """Who decided the last network question (rule, person, no-terminal)."""

    stopping = False
    task_id: str | None = None
    paused = False

    def emit(self, kind: EventKind, **data: Any) -> None:
        if kind is EventKind.PERMISSION and data.get("decision") != "ask":
            self.last_by = str(data.get("by") or "")

    def note(self, kind: str, data: Any) -> None:
        return None

    async def set_status(self, status: TaskStatus) -> None:
        return None


def decision_line(decision: EgressDecision, by: str) -> str:
    """``network: HOST:PORT allowed|denied (by …)``, or for a refusal that was not the
    person's policy, its real reason (the private-address guard, the upstream proxy,
    a name that does not resolve) and what to do."""
    where = f"{decision.host}:{decision.port}"
    if decision.allowed:
        return f"network: {where} allowed ({by})"
    if decision.reason == "policy":
        return f"network: {where} denied ({by})"
    said_why = REASONS.get(decision.reason, decision.reason)
    return f"network: {where} refused by {said_why}: {sanitize(decision.detail, one_line=True)}"


BY_SAID = {
    "rule": "by your policy",
    "person": "by you",
    "no-terminal": "no one to ask: your policy does not allow it",
}


async def _stream(log: Path, name: str, out: Say, stop: asyncio.Event) -> None:
    """Print what the step writes to its log, as it comes (guest text: made safe)."""
    fd: int | None = None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    try:
        while True:
            done = stop.is_set()
            if fd is None:
                with contextlib.suppress(OSError):
                    fd = sharefs.open_beneath(log, name, os.O_RDONLY | os.O_NONBLOCK)
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        os.close(fd)
                        fd = None
            if fd is not None:
                while chunk := os.read(fd, 1 << 16):
                    text = pending + decoder.decode(chunk).replace("\r\n", "\n").replace("\r", "\n")
                    *lines, pending = text.split("\n")
                    for line in lines:
                        out(sanitize(line))
                    await asyncio.sleep(0)  # a chatty step never starves the egress proxy
            if done:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
        tail = pending + decoder.decode(b"", final=True)
        if tail:
            out(sanitize(tail))
    finally:
        if fd is not None:
            os.close(fd)


def _closed_port() -> int:
    """A local port nothing listens on: where the build's (unused) model gateway would be."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def build_env(
    folder: Path,
    file: Path,
    *,
    paths: Paths,
    out: Say,
    say: Say,
    asker: Asker | None = None,
    step_timeout: int = 3600,
    memory_mb: int = 1024,
    cpus: int = 2,
    accel: str | None = None,
    egress_allow_private_networks: bool = False,
    warm_start: bool = True,
) -> BuildResult:
    """Build ``file`` with ``folder`` as its context; the folder's head becomes the layer.

    ``out`` gets the steps' output lines, ``say`` piwork's own messages. With no
    ``asker``, a network host the policy does not allow is denied (and said).
    """
    t0 = time.monotonic()
    damage = PolicyStore(paths.policy_file).check()  # its network questions need the policy
    if damage is not None:
        raise damage
    store = store_for(paths)
    first = parse(file)
    base_layer: str | None = None
    image: str | None = None
    inherited: tuple[dict[str, str], str] = ({}, "/")
    if first.base.startswith(IMAGE_PREFIX) and store.image_path(first.base).is_file():
        image = first.base  # an imported image (piwork env import), nothing over it yet
        inherited = store.image_settings(image)  # its config's Env and WorkingDir
    elif first.base != BASE_PIWORK:
        layer = store.layer(first.base)
        if layer is None:
            raise DockerfileError(
                f"{file.name}:{first.base_line}: FROM {first.base}: no such layer or imported "
                "image (piwork env show FOLDER lists a folder's layers, piwork env import makes "
                "an image; FROM piwork starts clean)"
            )
        base_layer, image = layer.id, layer.image
        inherited = store.build_settings(layer.id)
    build = parse(file, inherited_env=inherited[0], inherited_workdir=inherited[1])
    pack_dir = await asyncio.to_thread(ensure_pack, log=say)
    manifest = load_manifest(pack_dir)
    if not manifest.workbench:
        raise EnvError("this runtime pack has no Debian workbench to build an environment on")
    builds = store.root / "builds"
    builds.mkdir(parents=True, exist_ok=True)
    work = builds / f"tmp-{os.getpid()}-{secrets.token_hex(4)}"
    work.mkdir(mode=0o700)
    try:
        staged = await asyncio.to_thread(stage_context, build, folder, work / "context")
        key = cache_key(build, manifest.pack_id, base_layer, staged.digest, image)
        layer_id = LAYER_PREFIX + key[:24]
        if store.layer(layer_id) is not None:
            store.use_layer(folder, layer_id)
            say(f"cached: layer {layer_id} (same file, files and base); no VM started")
            return BuildResult(layer_id, cached=True, seconds=time.monotonic() - t0)
        # The same caps as a task's VM (settings.json vm.maxMemoryMb/maxCpus, host reserve).
        with vm_budget(memory_mb, cpus):
            n = await _build_in_vm(
                build, staged, work, folder, paths=paths, out=out, say=say, asker=asker,
                manifest_dir=pack_dir, base_layer=base_layer, image=image,
                step_timeout=step_timeout, memory_mb=memory_mb, cpus=cpus, accel=accel,
                warm_start=warm_start,
                egress_allow_private_networks=egress_allow_private_networks,
            )  # fmt: skip
        meta = {
            "file": str(file),
            "key": key,
            "env": [list(p) for p in build.env],
            "workdir": build.workdir,
            "steps": len(build.steps),
        }
        store.add_built_layer(work / "env.qcow2", layer_id, base_layer, folder, meta, image)
        return BuildResult(layer_id, cached=False, steps_run=n, seconds=time.monotonic() - t0)
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)


async def _build_in_vm(
    build: BuildFile,
    staged: Staged,
    work: Path,
    folder: Path,
    *,
    paths: Paths,
    out: Say,
    say: Say,
    asker: Asker | None,
    manifest_dir: Path,
    base_layer: str | None,
    image: str | None,
    step_timeout: int,
    memory_mb: int,
    cpus: int,
    accel: str | None,
    warm_start: bool,
    egress_allow_private_networks: bool,
) -> int:
    store = store_for(paths)
    disk = work / "env.qcow2"
    parent = store.layer(base_layer) if base_layer else None
    await asyncio.to_thread(
        create_disk, disk, DEFAULT_SIZE_BYTES, parent.path if parent is not None else None
    )
    dirs = TaskDirs(work / "state", work / "outputs", staged.root, work / "work")
    for d in (dirs.state / "agent", dirs.outputs, dirs.work):
        assert d is not None
        d.mkdir(parents=True, exist_ok=True)
    staged.root.mkdir(exist_ok=True)
    gateway = f"http://{GATEWAY_GUEST_ADDR[0]}/v1"
    models = {"providers": {BUILD_PROVIDER: pi_provider_config(gateway, "none", "no model")}}
    (dirs.state / "agent" / "models.json").write_bytes(orjson.dumps(models))
    if asker is None:
        say("no terminal to ask on: network hosts your policy does not allow are denied")
    host = _BuildHost()
    bridge = PermissionBridge(
        host,
        Decider(PolicyStore(paths.policy_file), AuditLog(paths.audit_log)),
        asker or DenyAsker(),
    )
    bridge.context = TaskContext(working_folder=folder)
    bridge.mirror_hosts = tuple(mirror_hosts(mirrors_for(paths, folder)))
    token = secrets.token_urlsafe(24)

    said: set[tuple[str, int, bool]] = set()

    def on_decision(decision: EgressDecision) -> None:
        by = BY_SAID.get(host.last_by or "", host.last_by or decision.reason)
        host.last_by = None
        seen = (decision.host, decision.port, decision.allowed)
        if seen not in said:  # once per host: apt opens many connections
            said.add(seen)
            say(decision_line(decision, by))

    manifest = load_manifest(manifest_dir)
    net = await asyncio.to_thread(host_network, paths, folder)
    net.guest.write(dirs.state)
    async with EgressProxy(
        bridge.domain_policy,
        on_decision=on_decision,
        allow_private_networks=egress_allow_private_networks,
        token=token,
        private_policy=bridge.private_policy,
        upstream=net.upstream,
        proxy_ssl=net.proxy_ssl,
    ) as egress:
        cfg = AgentVmConfig(
            pack_dir=manifest_dir,
            manifest=manifest,
            accel=probe(accel, manifest.arch),
            dirs=dirs,
            log_dir=work / "logs",
            gateway_port=_closed_port(),
            egress_port=egress.port,
            memory_mb=memory_mb,
            cpus=cpus,
            task_id="env-build",
            provider=BUILD_PROVIDER,
            model="none",
            extra_env={**net.guest.env(), **guest_network_env(token)},
            warm_start=warm_start,
            env=TaskEnv(
                disk,
                base_layer,
                DEFAULT_SIZE_BYTES,
                image=store.image_path(image) if image is not None else None,
            ),
        )
        say(f"starting a build VM ({cfg.accel.accel.value})")
        agent = AgentVm(cfg, on_boot_mode=lambda msg, _data: say(msg))
        ran = 0
        try:
            async with agent:
                await agent.wait_pi_ready()
                total = len(build.steps)
                for index, step in enumerate(build.steps):
                    where = f"{build.path.name}:{step.line}"
                    shown = sanitize(step.text, one_line=True, limit=200)
                    say(f"step {index + 1}/{total} ({where}): {shown}")
                    if step.kind == "RUN":
                        script = run_script(step, step_timeout)
                    elif step.kind == "COPY":
                        script = copy_script(step, index, staged)
                    else:
                        continue  # ENV and WORKDIR apply to the steps after them
                    code = await _run_step(agent, script, dirs.outputs, out, step_timeout + 60)
                    ran += 1
                    if code != 0:
                        if code is None:
                            why = "was stopped before it finished"
                        elif code == 124 and step.kind == "RUN":
                            why = f"timed out after {step_timeout} s (--step-timeout)"
                        else:
                            why = f"failed with exit code {code}"
                        raise BuildFailed(f"{where}: {step.kind} {why}; no layer was made")
                code = await _run_step(
                    agent, finish_script(build), dirs.outputs, out, 300, quiet=True
                )
                if code != 0:
                    raise BuildFailed(f"writing the environment's ENV/WORKDIR failed (exit {code})")
        except RpcError as exc:
            raise BuildFailed(f"the build VM stopped answering: {exc}") from exc
    return ran


async def _run_step(
    agent: AgentVm, script: str, outputs: Path, out: Say, timeout: float, *, quiet: bool = False
) -> int | None:
    stop = asyncio.Event()
    with contextlib.suppress(OSError):  # gone, or something the guest put there: the
        sharefs.unlink_beneath(outputs, STEP_LOG)  # step's redirection then says so
    streamer = asyncio.create_task(
        _stream(outputs, STEP_LOG, (lambda _l: None) if quiet else out, stop)
    )
    try:
        result = await agent.run_bash(script, timeout)
    finally:
        stop.set()
        await streamer
    if result.output.strip() and not quiet:
        # What the step wrote before its redirection (a cd that failed): said too.
        for line in result.output.strip().splitlines()[-20:]:
            out(sanitize(line))
    return result.exit_code if not result.cancelled else None
