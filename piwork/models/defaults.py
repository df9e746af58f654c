"""The default model: what the app and ``piwork run`` (without ``--model``) use.

Stored in ``settings.json`` under ``models.default`` (read and written by
``piwork.settings``, which keeps the other sections). Until a real model is
configured the default is the offline demo.
"""

from __future__ import annotations

from pathlib import Path

from piwork.settings import read_section, update_section, write_section

DEMO = "demo"


def default_model(path: Path | None = None) -> str:
    """``PROVIDER/MODEL`` from settings, else ``"demo"``."""
    value = read_section("models", path).get("default")
    return value if isinstance(value, str) and value.strip() else DEMO


def set_default_model(ref: str, path: Path | None = None) -> None:
    update_section("models", lambda section: {**section, "default": ref}, path)


__all__ = ["DEMO", "default_model", "read_section", "set_default_model", "write_section"]
