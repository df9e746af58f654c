"""The hosts a person added (``piwork hosts add``), kept in the settings dir.

One JSON file, ``<config>/hosts.json``, written durably with its last good
copy beside it (:mod:`piwork.jsonstore`); a file that does not parse is
refused with the way back (``piwork hosts restore``), never read as "no
hosts". Host keys the person accepted on first use go to
``<config>/known_hosts`` (OpenSSH format), next to (never instead of) the files
ssh_config names.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from piwork.config import get_paths
from piwork.errors import PersonError
from piwork.jsonstore import DamagedFile, JsonFile, Restored

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
TARGET_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9_.][A-Za-z0-9_.-]*)@)?(?P<host>[A-Za-z0-9.-]+|\[[0-9a-fA-F:.]+\])(?::(?P<port>\d{1,5}))?$"
)
DEFAULT_ROOT = ".cache/piwork-remote"
"""Relative to the remote user's home: packs, the watchdog and task folders live under it."""


class HostError(PersonError):
    """A host entry problem; the message says what to do."""


class HostsDamaged(DamagedFile, HostError):
    """hosts.json cannot be used (see :mod:`piwork.jsonstore`)."""


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


def parse_hosts(raw: bytes) -> dict[str, Host]:
    doc = orjson.loads(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts", []), list):
        raise ValueError('expected {"hosts": [...]}')
    hosts = [Host.model_validate(h) for h in doc.get("hosts", [])]
    return {h.name: h for h in hosts}


def hosts_store() -> JsonFile[dict[str, Host]]:
    return JsonFile(
        hosts_file(),
        parse_hosts,
        what="hosts file",
        restore_command="piwork hosts restore",
        fresh="remove it and add the hosts again with `piwork hosts add`",
        error=HostsDamaged,
    )


def load() -> dict[str, Host]:
    return hosts_store().load() or {}


def _dump(hosts: dict[str, Host]) -> bytes:
    data = {"hosts": [h.model_dump(exclude_none=True) for h in hosts.values()]}
    return orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"


def save(hosts: dict[str, Host]) -> None:
    """Durably (fsync of the file and its directory): a crash leaves the old or the new."""
    hosts_store().save(_dump(hosts))


def update(change: Callable[[dict[str, Host]], dict[str, Host]]) -> dict[str, Host]:
    """Read-modify-write under the file's lock (two ``hosts add`` never drop each other)."""
    file = hosts_store()
    with file.locked():
        hosts = change(file.read() or {})
        file.write(_dump(hosts))
        return hosts


def restore() -> Restored:
    return hosts_store().restore()


def unknown(name: str, hosts: dict[str, Host]) -> HostError:
    known = ", ".join(sorted(hosts)) or "none yet"
    return HostError(
        f"no host named {name!r} (known: {known}); add it with: piwork hosts add {name} user@box"
    )


def get(name: str) -> Host:
    hosts = load()
    if name not in hosts:
        raise unknown(name, hosts)
    return hosts[name]
