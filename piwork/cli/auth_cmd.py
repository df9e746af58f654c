"""``piwork auth``: provider API keys, kept on the host and never shown back.

piwork auth set PROVIDER [--stdin] [--file-backend]
piwork auth list [--json]
piwork auth rm PROVIDER
piwork auth import-pi [PATH] [--overwrite] [--file-backend]
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

from piwork.auth import KeyStore, KeyStoreError, default_pi_auth_path, import_pi_auth
from piwork.models.providers import ProviderConfigError, load_providers


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "auth",
        help="store provider API keys on the host (OS keyring)",
        description="Provider API keys live in the OS keyring (or, only if you ask, a 0600 "
        "file). They never enter the VM: the host's model gateway adds them to requests.",
    )
    sub = parser.add_subparsers(dest="auth_command", metavar="ACTION")

    def _help(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=_help)

    p_set = sub.add_parser("set", help="store a key (prompts without echo)")
    p_set.add_argument("provider", help="provider name, e.g. anthropic, openai, openrouter, google")
    p_set.add_argument("--stdin", action="store_true", help="read the key from standard input")
    p_set.add_argument(
        "--file-backend",
        action="store_true",
        help="store in a 0600 file under the config directory instead of the OS keyring",
    )
    p_set.set_defaults(func=_cmd_set)

    p_list = sub.add_parser("list", help="which providers have keys, and where (never values)")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=_cmd_list)

    p_rm = sub.add_parser("rm", help="delete a provider's key")
    p_rm.add_argument("provider")
    p_rm.set_defaults(func=_cmd_rm)

    p_imp = sub.add_parser("import-pi", help="copy API keys from pi's auth.json, once")
    p_imp.add_argument(
        "path", nargs="?", type=Path, help=f"pi auth file (default: {default_pi_auth_path()})"
    )
    p_imp.add_argument("--overwrite", action="store_true", help="replace keys piwork already has")
    p_imp.add_argument("--file-backend", action="store_true", help="store in the 0600 file")
    p_imp.set_defaults(func=_cmd_import)


def _fail(message: str) -> int:
    print(f"piwork: {message}", file=sys.stderr)
    return 1


def _store(args: argparse.Namespace) -> KeyStore:
    return KeyStore(file_backend=True if getattr(args, "file_backend", False) else None)


def _known_provider_names() -> set[str] | None:
    try:
        catalog = load_providers()
    except ProviderConfigError:
        return None
    return {p.credential_name for p in catalog.values()}


def _read_key(args: argparse.Namespace) -> str:
    if args.stdin or not sys.stdin.isatty():
        return sys.stdin.read().strip()
    return getpass.getpass(f"API key for {args.provider} (input hidden): ").strip()


def _cmd_set(args: argparse.Namespace) -> int:
    known = _known_provider_names()
    if known is not None and args.provider not in known:
        print(
            f"piwork: note: {args.provider!r} is not a configured provider yet "
            f"(known: {', '.join(sorted(known))}); storing the key anyway.",
            file=sys.stderr,
        )
    try:
        store = _store(args)
        store.ensure_writable()  # fail before asking for a key we could not keep
        value = _read_key(args)
        if not value:
            return _fail("no key given; nothing stored")
        stored = store.set(args.provider, value)
    except (KeyStoreError, EOFError) as exc:
        return _fail(str(exc) or "no key given")
    print(f"Stored the key for {args.provider} in {stored.location}.")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    try:
        store = _store(args)
        keys = store.list()
    except KeyStoreError as exc:
        return _fail(str(exc))
    if args.json:
        print(
            json.dumps(
                [
                    {"provider": k.provider, "backend": k.backend, "location": k.location}
                    for k in keys
                ]
            )
        )
        return 0
    if not keys:
        hint = "" if store.keyring_available else " (no OS keyring here; see `piwork auth set -h`)"
        print(f"No keys stored{hint}. Add one with `piwork auth set PROVIDER`.")
        return 0
    width = max(len(k.provider) for k in keys)
    for k in keys:
        print(f"{k.provider:<{width}}  {k.location}")
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    try:
        removed = _store(args).delete(args.provider)
    except KeyStoreError as exc:
        return _fail(str(exc))
    if not removed:
        return _fail(f"no key stored for {args.provider!r}")
    print(f"Removed the key for {args.provider}.")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    try:
        results = import_pi_auth(args.path, store=_store(args), overwrite=args.overwrite)
    except KeyStoreError as exc:
        return _fail(str(exc))
    if not results:
        print("pi's auth file holds no providers.")
        return 0
    width = max(len(r.provider) for r in results)
    for r in results:
        mark = "imported" if r.imported else "skipped "
        print(f"{r.provider:<{width}}  {mark}  {r.reason}")
    return 0
