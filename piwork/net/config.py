"""The ``network`` section of settings.json: proxy, certificate authorities, mirrors.

::

    {"network": {
        "proxy": {"url": "http://proxy.corp:3128", "noProxy": "intranet.corp,10.0.0.0/8",
                  "useSystem": true},
        "cas": {"useHostCas": true},
        "mirrors": {"pypi": "https://pypi.corp/simple", "npm": null, "debian": null},
        "folderMirrors": {"/home/me/src/app": {"npm": "https://npm.corp/"}}}}

No secret is ever in this file: a proxy password lives in the keyring
(:mod:`piwork.net.upstream`), and the certificates the person adds are files
in ``<config>/network/cas/`` (:mod:`piwork.net.cas`). ``piwork network …``
and the app's Settings → Network write it; a hand edit is validated the same
way, and a bad value is an error naming the key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from piwork.config import Paths
from piwork.settings import SettingsError, read_section, write_section

SECTION = "network"

_MODEL = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ProxySettings(BaseModel):
    model_config = _MODEL

    url: str | None = None
    """``http://host:port``, ``https://…``, ``socks5://…`` or ``socks5h://…``; no password."""
    no_proxy: str = ""
    """Hosts reached directly, ``NO_PROXY``'s syntax (names, ``.suffix``, IPs, CIDRs, ``*``)."""
    use_system: bool = True
    """With no ``url``: take the proxy from the environment / the system settings."""

    @field_validator("url")
    @classmethod
    def _no_password(cls, value: str | None) -> str | None:
        if value is not None and "@" in value.partition("://")[2].partition("/")[0]:
            user = value.partition("://")[2].partition("@")[0]
            if ":" in user:
                raise ValueError(
                    "a proxy password does not belong in settings.json: "
                    "`piwork network proxy set URL` stores it in the keyring"
                )
        return value


class CaSettings(BaseModel):
    model_config = _MODEL

    use_host_cas: bool = True
    """Trust (and give the guest) the certificate authorities this host added."""


class MirrorSettings(BaseModel):
    model_config = _MODEL

    pypi: str | None = None
    npm: str | None = None
    debian: str | None = None

    def merged_over(self, base: MirrorSettings) -> MirrorSettings:
        """These values, each missing one taken from ``base``."""
        return MirrorSettings(
            pypi=self.pypi or base.pypi, npm=self.npm or base.npm, debian=self.debian or base.debian
        )

    def items(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in (("pypi", self.pypi), ("npm", self.npm), ("debian", self.debian))
                if v]  # fmt: skip


class NetworkSettings(BaseModel):
    model_config = _MODEL

    proxy: ProxySettings = Field(default_factory=ProxySettings)
    cas: CaSettings = Field(default_factory=CaSettings)
    mirrors: MirrorSettings = Field(default_factory=MirrorSettings)
    folder_mirrors: dict[str, MirrorSettings] = Field(default_factory=dict)
    """Keyed by the folder's resolved absolute path; a folder's values win over ``mirrors``."""


def _describe(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in (SECTION, *err['loc']))}: {err['msg']}" for err in exc.errors()
    )


def load(paths: Paths) -> NetworkSettings:
    """The section (defaults when absent). Raises :class:`SettingsError` naming a bad key."""
    section = read_section(SECTION, paths.settings_file)
    try:
        return NetworkSettings.model_validate(section)
    except ValidationError as exc:
        raise SettingsError(f"settings file {paths.settings_file}: {_describe(exc)}") from exc


def save(paths: Paths, settings: NetworkSettings) -> None:
    data: dict[str, Any] = settings.model_dump(by_alias=True, exclude_defaults=True)
    write_section(SECTION, data, paths.settings_file)


def update(paths: Paths, change: Callable[[NetworkSettings], object]) -> NetworkSettings:
    """Load, ``change`` in place, save; the saved settings."""
    settings = load(paths)
    change(settings)
    save(paths, settings)
    return settings


def folder_key(folder: Path) -> str:
    return str(Path(folder).expanduser().resolve())


__all__ = [
    "CaSettings",
    "MirrorSettings",
    "NetworkSettings",
    "ProxySettings",
    "SettingsError",
    "folder_key",
    "load",
    "save",
    "update",
]
