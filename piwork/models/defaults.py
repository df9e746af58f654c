"""The default model: what the app and ``piwork run`` (without ``--model``) use.

Stored in ``settings.json`` under ``models.default`` (other sections are kept as
they are). Until a real model is configured the default is the offline demo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from piwork.config import get_paths
from piwork.fsutil import atomic_write_bytes

DEMO = "demo"


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def default_model(path: Path | None = None) -> str:
    """``PROVIDER/MODEL`` from settings, else ``"demo"``."""
    doc = _read(path or get_paths().settings_file)
    section = doc.get("models")
    value = section.get("default") if isinstance(section, dict) else None
    return value if isinstance(value, str) and value.strip() else DEMO


def set_default_model(ref: str, path: Path | None = None) -> None:
    path = path or get_paths().settings_file
    doc = _read(path)
    section = doc.get("models")
    section = dict(section) if isinstance(section, dict) else {}
    section["default"] = ref
    doc["models"] = section
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))


def read_section(name: str, path: Path | None = None) -> dict[str, Any]:
    section = _read(path or get_paths().settings_file).get(name)
    return dict(section) if isinstance(section, dict) else {}


def write_section(name: str, values: dict[str, Any], path: Path | None = None) -> None:
    path = path or get_paths().settings_file
    doc = _read(path)
    doc[name] = values
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
