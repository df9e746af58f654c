"""What a task's VM is made of: the guest paths, the task directories, the
configuration, and the one place a VM spec and its saved VM are derived (``vm_spec``,
``saved_vm_for``).
"""

from __future__ import annotations

import json
import logging
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from piwork import arch as arches
from piwork.env import TaskEnv
from piwork.pack.manifest import Manifest
from piwork.vm.accel import AccelChoice
from piwork.vm.command import Share, Transport, VmSpec
from piwork.vm.template import (
    Template,
    default_root,
    template_for,
)

log = logging.getLogger(__name__)

GUEST_STATE = "/mnt/state"
GUEST_WORK = "/mnt/work"
GUEST_OUTPUTS = "/mnt/outputs"
GUEST_UPLOADS = "/mnt/uploads"
GUEST_SESSION = f"{GUEST_STATE}/session.jsonl"
GUEST_AGENT_DIR = f"{GUEST_STATE}/agent"
GUEST_EXTENSIONS = "/opt/piwork/extensions"
GATE_EXTENSION = f"{GUEST_EXTENSIONS}/permission-gate.ts"
ASK_USER_EXTENSION = f"{GUEST_EXTENSIONS}/ask-user.ts"
PROJECT_EXTENSION = f"{GUEST_EXTENSIONS}/project.ts"
TASK_EXTENSIONS = (GATE_EXTENSION, ASK_USER_EXTENSION, PROJECT_EXTENSION)
"""The extensions a task's pi runs with; a saved VM's pi is primed with them all."""

PRIME_PROVIDER = "piwork-idle"
PRIME_MODEL = "idle"
PRIME_DIR = "/tmp/piwork-prime"
"""The primed pi's working directory and home: in the guest's own RAM, never a share."""


def pi_flags(extensions: list[str] | tuple[str, ...]) -> list[str]:
    """pi's arguments every task has (besides its session and model).

    Nothing here depends on the task: a saved VM's pi keeps the arguments it was
    primed with. What the folder may load is pi's project trust, read from the
    agent dir's settings.json whenever pi enters a folder
    (:mod:`piwork.pisettings`). The tools are pi's defaults (read, bash,
    edit, write) and the extensions' (ask_user), plus what a trusted project's
    settings add (``defaultTools``, e.g. ``+codemode``) and MCP servers bring.
    """
    argv = ["--mode", "rpc", "--offline", "--no-themes"]
    for ext in extensions:
        argv += ["-e", ext]
    return argv


def prime_op() -> dict[str, Any]:
    """The supervisor's ``prime``: what pi's ``main()`` runs with in a saved VM being made.

    No task is in it: an in-memory session, a working directory and home in the
    guest's RAM, and one model that nobody serves (a closed port on the guest's
    loopback; pi needs a model to start). The agent dir is the task's path, so
    pi keeps it: the task's own is mounted over it after the restore, and pi
    reads it again when the host switches it to the task's session. What pi
    writes there meanwhile stays under that mount, in the guest's RAM.
    """
    models = {
        "providers": {
            PRIME_PROVIDER: {
                "baseUrl": "http://127.0.0.1:9/v1",
                "api": "openai-completions",
                "apiKey": "none",
                "models": [
                    {
                        "id": PRIME_MODEL,
                        "name": PRIME_MODEL,
                        "contextWindow": 128000,
                        "maxTokens": 4096,
                        "reasoning": False,
                        "input": ["text"],
                    }
                ],
            }
        }
    }
    return {
        "argv": [
            *pi_flags(TASK_EXTENSIONS),
            *("--no-session", "--provider", PRIME_PROVIDER, "--model", PRIME_MODEL),
        ],
        "env": {
            "PI_CODING_AGENT_DIR": GUEST_AGENT_DIR,
            "PI_OFFLINE": "1",
            "HOME": f"{PRIME_DIR}/home",
            "TERM": "dumb",
        },
        "cwd": PRIME_DIR,
        "files": {"models.json": json.dumps(models)},
    }


@dataclass(frozen=True)
class TaskDirs:
    """Host directories of one task, shared into the guest at fixed paths."""

    state: Path
    outputs: Path
    uploads: Path
    work: Path | None = None

    def shares(self) -> list[Share]:
        shares = [
            Share("pwstate", self.state, guard_git=False),  # piwork's own: no host git there
            Share("pwout", self.outputs),
            Share("pwup", self.uploads, readonly=True),
        ]
        if self.work is not None:
            shares.append(Share("pwwork", self.work))
        return shares

    @property
    def guest_cwd(self) -> str:
        return GUEST_WORK if self.work is not None else GUEST_OUTPUTS


@dataclass
class AgentVmConfig:
    pack_dir: Path
    manifest: Manifest
    accel: AccelChoice
    dirs: TaskDirs
    log_dir: Path
    gateway_port: int
    egress_port: int | None = None
    transport: Transport = Transport.VIRTIO
    memory_mb: int = 1024
    cpus: int = 2
    boot_stall_timeout: float = 90.0
    task_id: str = "adhoc"
    provider: str = "piwork-demo"
    model: str = "demo"
    extra_env: dict[str, str] = field(default_factory=dict)
    extensions: list[str] = field(default_factory=list)
    trust_project: bool = True
    """The folder's AGENTS.md, .pi settings, skills, prompts and extensions load
    (:mod:`piwork.pisettings`; the agent dir's settings.json says the rest)."""
    warm_start: bool = False
    """Restore the saved VM (piwork.vm.template) if it can; else boot, saying why."""
    template_root: Path | None = None  # default: next to the pack cache
    moved_aside_dir: Path | None = None
    """Where git metadata the guest created goes after the run (default: beside log_dir)."""
    env: TaskEnv | None = None
    """The task's writable environment disk (piwork.env), hot-plugged after the VM is up;
    None with a workbench pack: the guest's installs live in RAM until power-off."""


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def socket_dir(preferred: Path) -> Path:
    """AF_UNIX paths are limited to ~104 bytes; fall back to a short temp dir.

    Measured with the longest name put there (the console socket beside the
    QMP one: ``cqmp-<pid>-<id>.sock``), not a short stand-in.
    """
    longest = f"cqmp-{4194304}-{2**48:x}.sock"
    if len(str(preferred / longest)) < 100:
        preferred.mkdir(parents=True, exist_ok=True)
        return preferred
    return Path(tempfile.mkdtemp(prefix="piwork-"))


def vm_spec(
    cfg: AgentVmConfig,
    sock_dir: Path,
    tag: str,
    *,
    host_tcp_port: int | None = None,
    tcp_secret_file: Path | None = None,
) -> VmSpec:
    """The VM a task with ``cfg`` runs in: the one place it is put together, so
    the saved VM it would restore (:func:`saved_vm_for`) is the one ``doctor`` reports."""
    return VmSpec(
        pack_dir=cfg.pack_dir,
        manifest=cfg.manifest,
        accel=cfg.accel,
        qmp_socket=sock_dir / f"qmp-{tag}.sock",
        console_log=cfg.log_dir / "console.log",
        transport=cfg.transport,
        rpc_socket=sock_dir / f"rpc-{tag}.sock" if cfg.transport is Transport.VIRTIO else None,
        host_tcp_port=host_tcp_port,
        tcp_secret_file=tcp_secret_file,
        net_socket=sock_dir / f"net-{tag}.sock",
        memory_mb=cfg.memory_mb,
        cpus=cfg.cpus,
        shares=cfg.dirs.shares(),
        name=f"piwork-{cfg.task_id}",
        qemu_binary=arches.of_manifest(cfg.manifest.arch).qemu,
    )


def saved_vm_for(cfg: AgentVmConfig) -> Template:
    """The saved VM (``piwork.vm.template``) a task with ``cfg`` restores on a warm start.

    Raises TemplateUnavailable when there can be none (e.g. QEMU's version is unknown).
    """
    spec = vm_spec(cfg, cfg.log_dir, "probe")  # socket paths are not part of the key
    return template_for(spec, cfg.template_root or default_root(cfg.pack_dir))


StageCallback = Callable[[str, float], None]
LineCallback = Callable[[dict[str, Any]], None]
BootModeCallback = Callable[[str, dict[str, Any]], None]
