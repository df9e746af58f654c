"""``piwork models``: which providers and models are configured, and which have keys.

Built-in providers come with piwork; more OpenAI-compatible endpoints (Ollama,
vLLM, LM Studio) go in ``<config dir>/providers.json``. Pick one with
``piwork run --model PROVIDER/MODEL``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from piwork.auth import KeyStore, KeyStoreError
from piwork.models.providers import Provider, ProviderConfigError, load_providers, providers_file


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list configured model providers and whether each has a key",
        description="List model providers (built-in and from providers.json), their models, "
        "and whether a key is stored. Use one with `piwork run --model PROVIDER/MODEL`.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_cmd_models)


def _key_status(provider: Provider, store: KeyStore | None, store_error: str | None) -> str:
    if provider.auth == "none":
        return "not needed"
    if store is None:
        return f"unknown ({store_error})"
    try:
        where = store.where(provider.credential_name)
    except KeyStoreError as exc:
        return f"unknown ({exc})"
    if where is not None:
        return f"stored ({where.backend})"
    if not provider.key_required:
        return "none (optional)"
    return f"missing: piwork auth set {provider.credential_name}"


def _cmd_models(args: argparse.Namespace) -> int:
    try:
        catalog = load_providers()
    except ProviderConfigError as exc:
        print(f"piwork: {exc}", file=sys.stderr)
        return 1
    store: KeyStore | None
    store_error: str | None = None
    try:
        store = KeyStore()
    except KeyStoreError as exc:
        store, store_error = None, str(exc)

    rows: list[dict[str, Any]] = []
    for provider in catalog.values():
        status = _key_status(provider, store, store_error)
        rows.append(
            {
                "provider": provider.name,
                "api": provider.api,
                "baseUrl": provider.base_url,
                "builtin": provider.pi_builtin,
                "key": status,
                "hasKey": status.startswith("stored") or provider.auth == "none",
                "defaultModel": provider.default_model,
                "models": list(provider.model_ids()),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        default = f"{row['provider']}/{row['defaultModel']}" if row["defaultModel"] else "-"
        print(f"{row['provider']}  ({row['api']}, {row['baseUrl']})")
        print(f"  key:     {row['key']}")
        print(f"  default: {default}")
        more = " (and the rest of pi's catalog)" if row["builtin"] else ""
        print(f"  models:  {', '.join(row['models']) or '-'}{more}")
    print(f"\nAdd OpenAI-compatible endpoints in {providers_file()}.")
    return 0
