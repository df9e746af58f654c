"""Add, change and remove custom OpenAI-compatible providers in ``providers.json``.

The same functions back ``piwork models add|rm`` and the app's settings. Every
write is validated by the same model that reads the file, then written
atomically, so a bad entry never lands on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from piwork.models.providers import (
    CustomProviderConfig,
    ProviderConfigError,
    providers_file,
    providers_store,
)


def _read(path: Path) -> dict[str, Any]:
    """The file as a document (checked like the reader checks it: a damaged one is refused,
    never replaced by one that holds only the change)."""
    if providers_store(path).read() is None:
        return {"providers": {}}
    doc = orjson.loads(path.read_bytes())
    doc.setdefault("providers", {})
    return dict(doc)


def _write(path: Path, doc: dict[str, Any]) -> None:
    """Checked by the reader's own parser (reserved names, per-provider checks), then written
    durably with its last good copy; a bad entry never lands on disk."""
    providers_store(path).write(orjson.dumps(doc, option=orjson.OPT_INDENT_2))


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
    entry = {
        "baseUrl": base_url,
        "api": "openai-completions",
        "auth": "bearer",
        "keyRequired": key_required,
        "models": [{"id": m} for m in models],
    }
    CustomProviderConfig.model_validate(entry)
    with providers_store(path).locked():
        doc = _read(path)
        _write(path, {**doc, "providers": {**doc["providers"], name: entry}})


def remove_provider(name: str, *, path: Path | None = None) -> bool:
    path = path or providers_file()
    with providers_store(path).locked():
        doc = _read(path)
        if name not in doc["providers"]:
            return False
        del doc["providers"][name]
        _write(path, doc)
    return True
