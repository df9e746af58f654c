"""``settings.json``: one reader, one writer, one error behaviour for every section.

Each section belongs to its owner, who types it (``tasks`` in
``piwork.tasks.settings``, ``vm`` in ``piwork.resources``, ``models`` in
``piwork.models.defaults``, ``auth`` in ``piwork.auth.keys``, ``gui`` in
``piwork.gui.prefs``); this module only reads and writes the file. A missing
or empty file is ``{}``. A file that cannot be read, is not JSON, or whose
section is not an object raises :class:`SettingsError` naming the file and
what is wrong, for every section alike (it used to be ignored by some readers
and fatal for others). The writer never overwrites a file it cannot read,
so the person's other sections are never lost to a typo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from piwork.config import get_paths
from piwork.errors import PersonError
from piwork.fsutil import atomic_write_bytes


class SettingsError(ValueError, PersonError):
    """settings.json cannot be used. ``str()`` names the file and what is wrong."""


def settings_path(path: Path | None = None) -> Path:
    return path if path is not None else get_paths().settings_file


def read_settings(path: Path | None = None) -> dict[str, Any]:
    """The whole document (``{}`` if there is none yet)."""
    path = settings_path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc.strerror}") from exc
    try:
        doc = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise SettingsError(f"settings file {path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise SettingsError(f"settings file {path} must hold a JSON object")
    return doc


def read_section(name: str, path: Path | None = None) -> dict[str, Any]:
    """One section (``{}`` if absent); its owner validates its fields."""
    section = read_settings(path).get(name, {})
    if not isinstance(section, dict):
        raise SettingsError(f"settings file {settings_path(path)}: '{name}' must be an object")
    return dict(section)


def write_section(name: str, values: dict[str, Any], path: Path | None = None) -> None:
    """Replace one section, durably, keeping every other section as it is."""
    path = settings_path(path)
    doc = read_settings(path)
    doc[name] = values
    atomic_write_bytes(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))


__all__ = ["SettingsError", "read_section", "read_settings", "settings_path", "write_section"]
