"""Package mirrors: a folder's or everyone's PyPI index, npm registry and Debian mirror.

Set once (``piwork network mirror set pypi URL [--folder DIR]``, or the app's
Settings → Network); every task on that folder (or every task) uses them: pip
through ``PIP_INDEX_URL``, npm through ``npm_config_registry``, apt through its
sources (the guest rewrites ``http://deb.debian.org/debian`` to the mirror at
each start, and back when the mirror is removed; ``…/debian-security`` becomes
``<mirror>-security``, the layout of Debian's own mirrors). "Allow the package
registries" and ``piwork env allow-registries`` cover the mirrors' hosts too
(:func:`mirror_hosts`).

A mirror URL carries no credentials: the guest sees it, and nothing secret
may enter the VM. A mirror that needs a login is reached through an
authenticating upstream proxy instead (:mod:`piwork.net.upstream`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from piwork.config import Paths
from piwork.errors import UsageError
from piwork.net import config as netconfig
from piwork.net.config import MirrorSettings

KINDS: dict[str, str] = {
    "pypi": "PyPI index for pip (its index-url), e.g. https://pypi.example.com/simple",
    "npm": "npm registry, e.g. https://npm.example.com/",
    "debian": "Debian mirror for apt (replaces http://deb.debian.org/debian), "
    "e.g. http://debian.example.com/debian",
}
DEBIAN_DEFAULT = "http://deb.debian.org/debian"


class MirrorError(ValueError, UsageError):
    """A mirror setting piwork cannot use; says what to give instead."""


def validate(kind: str, url: str) -> str:
    """The URL as it will be used, or :class:`MirrorError` saying why not."""
    if kind not in KINDS:
        raise MirrorError(f"unknown mirror kind {kind!r}: choose one of {', '.join(KINDS)}")
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MirrorError(f"{kind} mirror {url!r}: give an http:// or https:// URL ({KINDS[kind]})")
    if parts.username or parts.password:
        raise MirrorError(
            f"{kind} mirror {url!r}: no user name or password in a mirror URL (the VM would "
            "see it); use a mirror that needs no login, or reach it through an "
            "authenticating upstream proxy (`piwork network proxy set`)"
        )
    if any(c.isspace() or c in "'\"\\`$;" for c in text) or parts.query or parts.fragment:
        raise MirrorError(f"{kind} mirror {url!r}: a plain URL with no spaces, quotes or query")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise MirrorError(f"{kind} mirror {url!r}: bad port ({exc})") from None
    return text.rstrip("/") if kind == "debian" else text


def mirrors_for(paths: Paths, folder: Path | None) -> MirrorSettings:
    """The mirrors a task on ``folder`` uses: the folder's, else everyone's."""
    settings = netconfig.load(paths)
    if folder is not None:
        own = settings.folder_mirrors.get(netconfig.folder_key(folder))
        if own is not None:
            return own.merged_over(settings.mirrors)
    return settings.mirrors


def set_mirror(paths: Paths, kind: str, url: str | None, folder: Path | None = None) -> None:
    """Set (``url``) or remove (``None``) one mirror, for ``folder`` or for everyone."""
    value = validate(kind, url) if url is not None else None
    if kind not in KINDS:
        raise MirrorError(f"unknown mirror kind {kind!r}: choose one of {', '.join(KINDS)}")
    settings = netconfig.load(paths)
    if folder is None:
        settings.mirrors = settings.mirrors.model_copy(update={kind: value})
    else:
        key = netconfig.folder_key(folder)
        own = settings.folder_mirrors.get(key, MirrorSettings()).model_copy(update={kind: value})
        if own.items():
            settings.folder_mirrors[key] = own
        else:
            settings.folder_mirrors.pop(key, None)
    netconfig.save(paths, settings)


def mirror_hosts(mirrors: MirrorSettings) -> list[str]:
    """The host names the mirrors are on (what "Allow the package registries" adds)."""
    hosts: list[str] = []
    for _kind, url in mirrors.items():
        host = urlsplit(url).hostname
        if host and host not in hosts:
            hosts.append(host.lower())
    return hosts


def all_mirror_hosts(paths: Paths) -> list[str]:
    """Every configured mirror's host, everyone's and each folder's."""
    settings = netconfig.load(paths)
    hosts = mirror_hosts(settings.mirrors)
    for own in settings.folder_mirrors.values():
        hosts += [h for h in mirror_hosts(own) if h not in hosts]
    return hosts


def guest_env(mirrors: MirrorSettings) -> dict[str, str]:
    """pip's and npm's settings for the guest (apt's are its sources: piwork.net.guest)."""
    env: dict[str, str] = {}
    if mirrors.pypi:
        env["PIP_INDEX_URL"] = mirrors.pypi
        parts = urlsplit(mirrors.pypi)
        if parts.scheme == "http" and parts.hostname:
            env["PIP_TRUSTED_HOST"] = parts.hostname  # pip refuses a plain-HTTP index otherwise
    if mirrors.npm:
        env["npm_config_registry"] = mirrors.npm
    return env


__all__ = [
    "DEBIAN_DEFAULT",
    "KINDS",
    "MirrorError",
    "all_mirror_hosts",
    "guest_env",
    "mirror_hosts",
    "mirrors_for",
    "set_mirror",
    "validate",
]
