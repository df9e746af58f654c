"""pi's model catalog as the pack keeps it (pi-models.json): every chat model of the
pinned pi, per provider, with the API it speaks; a damaged file is no catalog."""

from __future__ import annotations

import json
from pathlib import Path

from piwork.config import repo_root
from piwork.pack import node, picatalog

PI_AI = repo_root() / node.PI_SOURCE / "node_modules" / node.PI_AI_PACKAGE


def test_the_pinned_pis_chat_models_with_their_api(tmp_path: Path) -> None:
    n = picatalog.write(PI_AI, "1.6.0", tmp_path / picatalog.FILE_NAME)
    cat = picatalog.load(tmp_path)
    assert cat is not None and cat.pi == "1.6.0"
    assert n == sum(len(v) for v in cat.providers.values()) > 100
    assert not any(name.startswith(".") for name in cat.providers)
    sonnet = cat.find("openrouter", "anthropic/claude-sonnet-4.5")
    assert sonnet is not None and sonnet.api == "anthropic-messages"
    entry = sonnet.pi_entry()
    assert entry["id"] == "anthropic/claude-sonnet-4.5" and "contextWindow" in entry
    assert set(entry) <= picatalog.MODELS_JSON_FIELDS  # what pi's models.json accepts
    # Image and classifier models are not chat models.
    assert all(m.id != "black-forest-labs/flux.2-pro" for m in cat.models("openrouter"))


def test_a_missing_or_damaged_catalog_is_none(tmp_path: Path) -> None:
    assert picatalog.load(tmp_path) is None
    (tmp_path / picatalog.FILE_NAME).write_text(json.dumps({"pi": 1}))
    assert picatalog.load(tmp_path) is None
    (tmp_path / picatalog.FILE_NAME).write_bytes(b"\xff")
    assert picatalog.load(tmp_path) is None
