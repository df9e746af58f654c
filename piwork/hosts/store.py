"""The hosts a person added (``piwork hosts add``), kept in the settings dir.

One JSON file, ``<config>/hosts.json``, written atomically; host keys the
person accepted on first use go to ``<config>/known_hosts`` (OpenSSH format),
next to (never instead of) the files ssh_config names.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from piwork.config import get_paths

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
TARGET_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9_.][A-Za-z0-9_.-]*)@)?(?P<host>[A-Za-z0-9.-]+|\[[0-9a-fA-F:.]+\])(?::(?P<port>\d{1,5}))?$"
)
DEFAULT_ROOT = ".cache/piwork-remote"
"""Relative to the remote user's home: packs, the watchdog and task folders live under it."""


class HostError(Exception):
    """A host entry problem; the message says what to do."""


class Host(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    hostname: str
    user: str | None = None
    port: int | None = None
    identity: str | None = Field(
        default=None, description="A private key file to log in with (like ssh -i)."
    )
    root: str = Field(
        default=DEFAULT_ROOT,
        description="The remote directory piwork owns (relative: under the remote home).",
    )

    @property
    def target(self) -> str:
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.hostname}{port}"


def parse_target(name: str, target: str, **extra: str | None) -> Host:
    """``user@box[:port]`` -> :class:`Host`; a clear error for anything else."""
    if not NAME_RE.match(name):
        raise HostError(
            f"bad host name {name!r}: use letters, digits, '.', '_' or '-' (at most 63)"
        )
    m = TARGET_RE.match(target)
    if m is None:
        raise HostError(f"bad target {target!r}: write it as user@box or user@box:port")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise HostError(f"bad port {port} in {target!r}: use 1-65535")
    hostname = m["host"].strip("[]")
    fields = {k: v for k, v in extra.items() if v is not None}
    if "root" in fields:  # "~/x" is written for the remote shell: it means home-relative
        fields["root"] = fields["root"].removeprefix("~/") or DEFAULT_ROOT
    try:
        return Host(name=name, hostname=hostname, user=m["user"], port=port, **fields)
    except ValidationError as exc:
        raise HostError(str(exc)) from exc


def hosts_file() -> Path:
    return get_paths().config / "hosts.json"


def known_hosts_file() -> Path:
    """Where host keys accepted through piwork are added (OpenSSH known_hosts format)."""
    return get_paths().config / "known_hosts"


def load() -> dict[str, Host]:
    path = hosts_file()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise HostError(f"cannot read {path}: {exc} (fix or remove the file)") from exc
    try:
        hosts = [Host.model_validate(h) for h in raw.get("hosts", [])]
    except (ValidationError, AttributeError) as exc:
        raise HostError(f"{path} is not a piwork hosts file: {exc}") from exc
    return {h.name: h for h in hosts}


def save(hosts: dict[str, Host]) -> None:
    """Write atomically: a crash leaves the old file or the new one, never half."""
    path = hosts_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"hosts": [h.model_dump(exclude_none=True) for h in hosts.values()]}
    fd, tmp = tempfile.mkstemp(prefix=".hosts-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def get(name: str) -> Host:
    hosts = load()
    if name not in hosts:
        known = ", ".join(sorted(hosts)) or "none yet"
        raise HostError(
            f"no host named {name!r} (known: {known}); "
            f"add it with: piwork hosts add {name} user@box"
        )
    return hosts[name]
