"""pi's model catalog, taken out of the pack's pi at build: what ``piwork models`` and the
app list, and which of pi's APIs each model speaks (the gateway must carry it).

pi-ai ships its catalog as data, one JSON file per provider
(``dist/providers/data/<provider>.json``: ``{api: {"<type>:<id>": model}}``). The
builder keeps the chat models of each, slimmed to what piwork shows or routes by, in
the pack's ``pi-models.json`` (listed in the manifest, so verified like the rest).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from piwork.pack.errors import PackError

FILE_NAME = "pi-models.json"
DATA_DIR = Path("dist") / "providers" / "data"
"""Inside pi-ai's package."""


MODELS_JSON_FIELDS = frozenset(
    {
        "id", "name", "api", "baseUrl", "reasoning", "thinkingLevelMap", "input", "inputLimits",
        "cost", "promptCache", "contextWindow", "maxTokens", "samplingParams",
        "samplingParamsByThinkingLevel", "headers", "compat",
    }
)  # fmt: skip
"""What a ``models`` entry of pi's models.json may hold (docs/models-configuration.md)."""


class CatalogModel(BaseModel):
    """One chat model as pi's catalog has it (every other field is kept: ``pi_entry``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    id: str
    name: str | None = None
    api: str
    reasoning: bool = False
    input: list[str] = Field(default_factory=lambda: ["text"])
    context_window: int | None = Field(default=None, alias="contextWindow")
    max_tokens: int | None = Field(default=None, alias="maxTokens")

    def pi_entry(self) -> dict[str, Any]:
        """The model as a ``models`` entry of pi's models.json (its documented fields)."""
        whole = self.model_dump(by_alias=True, exclude_none=True)
        return {k: v for k, v in whole.items() if k in MODELS_JSON_FIELDS}


class PiCatalog(BaseModel):
    model_config = ConfigDict(extra="ignore")

    pi: str
    providers: dict[str, list[CatalogModel]]

    def models(self, provider: str) -> list[CatalogModel]:
        return self.providers.get(provider, [])

    def find(self, provider: str, model_id: str) -> CatalogModel | None:
        return next((m for m in self.models(provider) if m.id == model_id), None)


def extract(pi_ai_dir: Path, pi_version: str) -> dict[str, Any]:
    """The catalog document from an installed pi-ai (its chat models, per provider)."""
    data = pi_ai_dir / DATA_DIR
    if not data.is_dir():
        raise PackError(f"{data} is missing: pi-ai's model catalog moved (see {__name__})")
    providers: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(p for p in data.glob("*.json") if not p.name.startswith(".")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise PackError(f"pi's model catalog {path} is unreadable: {exc}") from exc
        models: list[dict[str, Any]] = []
        for api, entries in doc.items() if isinstance(doc, dict) else ():
            for key, model in entries.items() if isinstance(entries, dict) else ():
                if not key.startswith("chat:") or not isinstance(model, dict):
                    continue
                models.append({**model, "api": api})
        providers[path.stem] = sorted(models, key=lambda m: str(m.get("id")))
    return {"pi": pi_version, "providers": providers}


def write(pi_ai_dir: Path, pi_version: str, out: Path) -> int:
    """Write the catalog to ``out``; returns the number of models in it."""
    doc = extract(pi_ai_dir, pi_version)
    out.write_bytes(orjson.dumps(doc))
    return sum(len(v) for v in doc["providers"].values())


def load(pack_dir: Path) -> PiCatalog | None:
    """The catalog of a built pack (None for a pack without one, or a damaged one)."""
    try:
        return PiCatalog.model_validate(orjson.loads((pack_dir / FILE_NAME).read_bytes()))
    except (OSError, orjson.JSONDecodeError, ValidationError):
        return None
