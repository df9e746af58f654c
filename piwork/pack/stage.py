"""Run the pack's node on the build host as the guest sees its tree.

pi and the pack's bundle know their files by their guest paths
(``/opt/piwork/...``: ``import.meta.url`` literals, the snapshot's heap), so a
build step that runs them on the host does so in a private mount namespace
(``unshare``) where the build's staged copy of ``/opt/piwork`` is mounted at
``/opt/piwork``. Where ``unshare`` is not allowed, :func:`private_opt` says so
(None) and the caller does less.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

GUEST_ROOT = Path("opt") / "piwork"


def private_opt(stage_root: Path, binds: dict[Path, Path], pid: bool) -> list[str] | None:
    """A command prefix that runs in a private mount namespace where /opt holds only
    ``binds`` (namespace path -> host path) and /opt/piwork is the stage; None where
    ``unshare`` is not allowed. The prefix ends with ``bash -c SCRIPT``: the command
    follows as ``$0 "$@"``."""
    userns = [] if os.geteuid() == 0 else ["--map-root-user"]
    all_binds = {Path("/") / GUEST_ROOT: stage_root / GUEST_ROOT, **binds}
    mount = " && ".join(
        ["mount -t tmpfs piwork /opt"]
        + [
            f"mkdir -p {inside} && mount --bind {host} {inside}"
            for inside, host in all_binds.items()
        ]
    )
    prefix = ["unshare", "--mount", "--propagation", "private"]
    prefix += ["--pid", "--fork"] if pid else []
    prefix += [*userns, "bash", "-c"]
    probe = subprocess.run([*prefix, mount], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        return None
    return [*prefix, f'{mount} && exec "$0" "$@"']


def inside(path: Path, stage_root: Path) -> Path:
    """``path`` as the namespace sees it (the stage is at /opt/piwork there)."""
    try:
        return Path("/") / GUEST_ROOT / path.relative_to(stage_root / GUEST_ROOT)
    except ValueError:
        return path
