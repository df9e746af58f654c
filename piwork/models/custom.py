"""Add, change and remove custom OpenAI-compatible providers in ``providers.json``.

The same functions back ``piwork models add|rm`` and the app's settings. Every
write is validated by the same model that reads the file, then written
atomically, so a bad entry never lands on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from piwork.fsutil import atomic_write_bytes
from piwork.models.providers import (
    CustomProviderConfig,
    ProviderConfigError,
    ProvidersFile,
    load_custom_providers,
    providers_file,
)


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {"providers": {}}
    doc = orjson.loads(raw)
    if not isinstance(doc, dict):
        raise ProviderConfigError(f"{path} must hold a JSON object")
    doc.setdefault("providers", {})
    return doc


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Validate with the reader's own checks on a side file, then replace atomically."""
    ProvidersFile.model_validate(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    check = path.with_name(path.name + ".check")
    try:
        atomic_write_bytes(check, data)
        load_custom_providers(check)  # reserved names and per-provider checks
    finally:
        check.unlink(missing_ok=True)
    atomic_write_bytes(path, data)


def add_provider(
    name: str,
    base_url: str,
    models: list[str],
    *,
    key_required: bool = False,
    path: Path | None = None,
) -> None:
    """Add (or replace) ``name``: an OpenAI-compatible endpoint serving ``models``."""
    path = path or providers_file()
    if not models:
        raise ProviderConfigError("give at least one model id")
    doc = _read(path)
    old = doc["providers"]
    entry = {
        "baseUrl": base_url,
        "api": "openai-completions",
        "auth": "bearer",
        "keyRequired": key_required,
        "models": [{"id": m} for m in models],
    }
    CustomProviderConfig.model_validate(entry)
    _write(path, {**doc, "providers": {**old, name: entry}})


def remove_provider(name: str, *, path: Path | None = None) -> bool:
    path = path or providers_file()
    doc = _read(path)
    if name not in doc["providers"]:
        return False
    del doc["providers"][name]
    _write(path, doc)
    return True
