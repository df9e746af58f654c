"""``settings.json``: one reader, one writer, one error behaviour for every section.

Each section belongs to its owner, who types it (``tasks`` in
``piwork.tasks.settings``, ``vm`` in ``piwork.resources``, ``models`` in
``piwork.models.defaults``, ``auth`` in ``piwork.auth.keys``, ``gui`` in
``piwork.gui.prefs``); this module only reads and writes the file. A missing
file is ``{}``. A file that cannot be read or is not a JSON object raises
:class:`SettingsDamaged` (one line: which file, where a copy of the damaged
bytes is, and ``piwork restore settings``, which puts the last good copy
back: :mod:`piwork.jsonstore`); a section that is not an object raises
:class:`SettingsError`. Both for every section alike: limits, the key backend
and the VM's caps are the person's decisions, never replaced by defaults on a
guess. The writer never overwrites a file it cannot read (the person's other
sections are never lost to a typo), and a section is replaced under a lock,
so two writers never drop each other's sections.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from piwork.config import get_paths
from piwork.errors import PersonError
from piwork.jsonstore import DamagedFile, JsonFile

RESTORE_COMMAND = "piwork restore settings"


class SettingsError(ValueError, PersonError):
    """settings.json cannot be used. ``str()`` names the file and what is wrong."""


class SettingsDamaged(DamagedFile, SettingsError):
    """settings.json does not parse (or is gone beside its last good copy)."""


def settings_path(path: Path | None = None) -> Path:
    return path if path is not None else get_paths().settings_file


def parse_settings(raw: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError("it must hold a JSON object")
    return doc


def settings_file(path: Path | None = None) -> JsonFile[dict[str, Any]]:
    return JsonFile(
        settings_path(path),
        parse_settings,
        what="settings file",
        restore_command=RESTORE_COMMAND,
        error=SettingsDamaged,
    )


def read_settings(path: Path | None = None) -> dict[str, Any]:
    """The whole document (``{}`` if there is none yet)."""
    return settings_file(path).read() or {}


def read_section(name: str, path: Path | None = None) -> dict[str, Any]:
    """One section (``{}`` if absent); its owner validates its fields."""
    section = read_settings(path).get(name, {})
    if not isinstance(section, dict):
        raise SettingsError(f"settings file {settings_path(path)}: '{name}' must be an object")
    return dict(section)


def update_section(
    name: str, change: Callable[[dict[str, Any]], dict[str, Any]], path: Path | None = None
) -> dict[str, Any]:
    """Read-modify-write one section under the file's lock, durably; returns the new section."""
    file = settings_file(path)
    with file.locked():
        doc = file.read() or {}
        section = doc.get(name, {})
        if not isinstance(section, dict):
            raise SettingsError(f"settings file {file.path}: '{name}' must be an object")
        doc[name] = change(dict(section))
        file.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        return dict(doc[name])


def write_section(name: str, values: dict[str, Any], path: Path | None = None) -> None:
    """Replace one section, durably, keeping every other section as it is."""
    update_section(name, lambda _old: values, path)


__all__ = [
    "SettingsDamaged",
    "SettingsError",
    "parse_settings",
    "read_section",
    "read_settings",
    "settings_file",
    "settings_path",
    "update_section",
    "write_section",
]
