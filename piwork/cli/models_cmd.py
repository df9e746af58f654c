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
from piwork.models.providers import (
    Provider,
    ProviderConfigError,
    load_providers,
    pi_catalog_models,
    providers_file,
)

MODELS_SHOWN = 12


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list configured model providers and whether each has a key",
        description="List model providers (built-in and from providers.json), their models, "
        "and whether a key is stored. Use one with `piwork run --model PROVIDER/MODEL`.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--all", action="store_true", help="every model of each provider")
    parser.set_defaults(func=_cmd_models)
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION")
    add = sub.add_parser(
        "add",
        help="add or change a custom OpenAI-compatible provider",
        description="Add (or replace) an OpenAI-compatible endpoint (Ollama, vLLM, LM Studio) "
        "in providers.json. Store its key with `piwork auth set NAME` if it needs one.",
    )
    add.add_argument("name", help="provider name (lowercase letters, digits, . _ -)")
    add.add_argument("base_url", help="e.g. http://localhost:11434/v1")
    add.add_argument("models", nargs="+", help="model ids it serves")
    add.add_argument("--key-required", action="store_true", help="the endpoint needs a key")
    add.set_defaults(func=_cmd_add)
    rm = sub.add_parser("rm", help="remove a custom provider")
    rm.add_argument("name")
    rm.set_defaults(func=_cmd_rm)
    default = sub.add_parser(
        "default", help="show or set the default model (used by `piwork run` and the app)"
    )
    default.add_argument("model", nargs="?", help="PROVIDER/MODEL, or 'demo'")
    default.set_defaults(func=_cmd_default)


def _cmd_add(args: argparse.Namespace) -> int:
    from piwork.models.custom import add_provider

    try:
        add_provider(args.name, args.base_url, args.models, key_required=args.key_required)
    except (ProviderConfigError, ValueError) as exc:
        print(f"piwork: {exc}", file=sys.stderr)
        return 1
    print(f"added {args.name} ({args.base_url}): {', '.join(args.models)}")
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    from piwork.models.custom import remove_provider

    try:
        gone = remove_provider(args.name)
    except (ProviderConfigError, ValueError) as exc:
        print(f"piwork: {exc}", file=sys.stderr)
        return 1
    if not gone:
        print(
            f"piwork: no custom provider named {args.name!r} (see `piwork models`)", file=sys.stderr
        )
        return 1
    print(f"removed {args.name}")
    return 0


def _cmd_default(args: argparse.Namespace) -> int:
    from piwork.models.defaults import DEMO, default_model, set_default_model

    if args.model is None:
        ref = default_model()
        print(
            ref
            + (
                "  (the offline demo; set a real one with `piwork models default P/M`)"
                if ref == DEMO
                else ""
            )
        )
        return 0
    if args.model != DEMO:
        from piwork.models.providers import parse_model_ref

        try:
            parse_model_ref(args.model, load_providers())
        except Exception as exc:
            print(f"piwork: unknown model {args.model!r}: {exc}", file=sys.stderr)
            return 1
    set_default_model(args.model)
    print(f"default model: {args.model}")
    return 0


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
        catalog = load_providers(pi_models=True)
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
        models: list[str] = row["models"]
        shown = models if args.all or len(models) <= MODELS_SHOWN else models[:MODELS_SHOWN]
        more = f" (+{len(models) - len(shown)} more: --all)" if len(shown) < len(models) else ""
        print(f"  models:  {', '.join(shown) or '-'}{more}")
    if pi_catalog_models() is None:
        print("\nThe built-in providers list pi's whole catalog once the pack is built "
              "(`piwork pack build`).")  # fmt: skip
    print(f"\nAdd OpenAI-compatible endpoints in {providers_file()}.")
    return 0
