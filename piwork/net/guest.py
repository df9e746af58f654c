"""What the guest gets of the network settings at each start: CAs, mirrors, variables.

The host writes two files into the task's state share (``/mnt/state/network``
in the guest) before the VM starts, and adds variables to pi's environment
(and so to every command the agent runs):

* ``ca.pem``: the extra certificate authorities (:mod:`piwork.net.cas`),
  certificates only. The workbench's ``network.sh`` (run by ``setup.sh`` at
  start) puts them in the root's system store (``/usr/local/share/
  ca-certificates/piwork/`` and ``/etc/ssl/certs/ca-certificates.crt``: apt,
  curl, wget, git, Python), so they stay trusted by whatever the agent runs,
  and takes them out again when the host no longer has them;
  ``NODE_EXTRA_CA_CERTS`` (node, npm, pi itself), ``PIP_CERT`` and
  ``REQUESTS_CA_BUNDLE`` (pip and requests in any venv, which would use their
  own bundles otherwise) name the files.
* ``debian-mirror``: the Debian mirror's URL for apt's sources (the other
  mirrors are variables: :func:`piwork.net.mirrors.guest_env`).

Nothing here is secret: a proxy's credentials and the host's keys never reach
these files or variables. The guest can change the files (they are in a share
it writes); it changes only what its own programs trust.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from piwork import sharefs
from piwork.net import cas as netcas
from piwork.net.config import MirrorSettings
from piwork.net.mirrors import guest_env

GUEST_DIR = "network"
"""Inside the task's state share (the guest mounts it at /mnt/state)."""
CA_FILE = "ca.pem"
DEBIAN_FILE = "debian-mirror"
GUEST_STATE = PurePosixPath("/mnt/state")  # piwork.agent.spec.GUEST_STATE
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
"""The workbench's system store; network.sh makes sure it holds the extra CAs."""


@dataclass(frozen=True)
class GuestNetwork:
    """The network settings one task's guest gets."""

    cas: tuple[netcas.CaCert, ...] = ()
    mirrors: MirrorSettings = field(default_factory=MirrorSettings)

    def env(self) -> dict[str, str]:
        """Variables for pi's environment (only for what is set: nothing otherwise)."""
        out: dict[str, str] = {}
        if self.cas:
            out["NODE_EXTRA_CA_CERTS"] = str(GUEST_STATE / GUEST_DIR / CA_FILE)
            out["PIP_CERT"] = SYSTEM_BUNDLE
            out["REQUESTS_CA_BUNDLE"] = SYSTEM_BUNDLE
        out.update(guest_env(self.mirrors))
        return out

    def files(self) -> dict[str, bytes | None]:
        """What :meth:`write` puts in the state share (``None``: removed)."""
        debian = self.mirrors.debian
        return {
            CA_FILE: netcas.bundle(self.cas) or None,
            DEBIAN_FILE: (debian + "\n").encode() if debian else None,
        }

    def write(self, state_root: Path) -> bool:
        """Write (or remove) the files beneath ``state_root``, never through a link the
        guest made. Returns True when a link of the guest's had to be removed."""
        replaced = False
        for name, data in self.files().items():
            rel = f"{GUEST_DIR}/{name}"
            if data is not None:
                replaced = sharefs.replace_beneath(state_root, rel, data) or replaced
                continue
            try:
                sharefs.unlink_beneath(state_root, rel)
            except FileNotFoundError:
                pass
            except (OSError, sharefs.UnsafePathError):
                # Not ours to keep (a directory, a link above it): the guest's own doing.
                # Writing an empty file in its place would need the same path, so say nothing.
                pass
        return replaced


__all__ = ["CA_FILE", "DEBIAN_FILE", "GUEST_DIR", "GuestNetwork"]
