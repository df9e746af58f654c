"""`piwork network`: the upstream proxy, extra certificate authorities, mirrors, private addresses.

Set once, used by every task (or a folder's): the model gateway and the egress
proxy go out through the upstream proxy and trust the extra CAs; the VM gets
the CAs and the mirrors at start. Nothing here puts a secret in the VM: a proxy
password goes to the keyring, and a mirror URL may not carry one.

  piwork network show [--folder DIR] [--json]
  piwork network proxy set URL [--no-proxy HOSTS] [--password-stdin]
  piwork network proxy clear | system on|off
  piwork network ca add FILE [--name NAME] | rm NAME | host on|off
  piwork network mirror set pypi|npm|debian URL [--folder DIR] | rm KIND [--folder DIR]
  piwork network allow-private DOMAIN... | --registries  [--folder DIR]
  piwork network forget-private DOMAIN [--folder DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from piwork.config import Paths, get_paths
from piwork.errors import PersonError, UsageError
from piwork.textsafe import sanitize


def _paths() -> Paths:
    return get_paths()


def _folder(arg: str | None) -> Path | None:
    if not arg:
        return None
    folder = Path(arg).expanduser().resolve()
    if not folder.is_dir():
        raise UsageError(f"{folder} is not a folder: name an existing working folder")
    return folder


def _where(folder: Path | None) -> str:
    return f"for tasks on {folder}" if folder else "for every task"


# --- show ---------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    from piwork.net.status import network_status

    status = network_status(_paths(), _folder(args.folder), lookup=not args.no_lookup)
    if args.json:
        print(orjson.dumps(status.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(status.lines()))
    return 0


# --- proxy --------------------------------------------------------------------


def cmd_proxy_set(args: argparse.Namespace) -> int:
    from piwork.auth import KeyStore
    from piwork.net import config as netconfig
    from piwork.net.upstream import key_name, parse_proxy_url

    paths = _paths()
    proxy = parse_proxy_url(args.url)
    password = proxy.password
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    if password and not proxy.username:
        raise UsageError(
            "a proxy password needs a user name: give the URL as scheme://USER@host:port"
        )
    if password:
        keys = KeyStore(paths=paths)
        keys.ensure_writable()
        keys.set(key_name(proxy.host, proxy.port), password)
    user = f"{proxy.username}@" if proxy.username else ""
    host = f"[{proxy.host}]" if ":" in proxy.host else proxy.host
    url = f"{proxy.kind.value}://{user}{host}:{proxy.port}"
    settings = netconfig.load(paths)
    settings.proxy.url = url
    if args.no_proxy is not None:
        settings.proxy.no_proxy = args.no_proxy
    netconfig.save(paths, settings)
    print(f"upstream proxy: {url} for the model gateway and the egress proxy")
    if password:
        print(f"  its password is in the keyring ({key_name(proxy.host, proxy.port)}), never in "
              "settings.json or the VM")  # fmt: skip
    if settings.proxy.no_proxy:
        print(f"  direct: {settings.proxy.no_proxy}")
    return 0


def cmd_proxy_clear(args: argparse.Namespace) -> int:
    from piwork.net import config as netconfig

    settings = netconfig.update(_paths(), lambda s: setattr(s.proxy, "url", None))
    system = "the environment's or the system's proxy, if any" if settings.proxy.use_system else (
        "no proxy (`piwork network proxy system on` to use the environment's)"
    )  # fmt: skip
    print(f"upstream proxy setting removed: piwork uses {system}")
    return 0


def _switch(args: argparse.Namespace, section: str, name: str, said: tuple[str, str]) -> int:
    """``on``/``off`` for one boolean of the network settings; says what it now means."""
    from piwork.net import config as netconfig

    on = args.state == "on"
    netconfig.update(_paths(), lambda s: setattr(getattr(s, section), name, on))
    print(said[0] if on else said[1])
    return 0


def cmd_proxy_system(args: argparse.Namespace) -> int:
    return _switch(args, "proxy", "use_system", (
        "with no proxy set, piwork uses HTTPS_PROXY/HTTP_PROXY and the system settings",
        "piwork ignores HTTPS_PROXY/HTTP_PROXY and the system settings",
    ))  # fmt: skip


# --- certificate authorities -------------------------------------------------------------


def cmd_ca_add(args: argparse.Namespace) -> int:
    from piwork.net.cas import add_ca

    name, certs, notes = add_ca(_paths(), Path(args.file).expanduser(), args.name)
    print(f"added {name}: {len(certs)} certificate(s), trusted by the gateway and installed in "
          "the VM at each task's start:")  # fmt: skip
    for cert in certs:
        print(f"  {sanitize(cert.describe(), one_line=True)}")
    for note in notes:
        print(f"  note: {sanitize(note, one_line=True)}")
    return 0


def cmd_ca_rm(args: argparse.Namespace) -> int:
    from piwork.net.cas import added_names, remove_ca

    if not remove_ca(_paths(), args.name):
        names = ", ".join(added_names(_paths())) or "none"
        raise PersonError(f"no added CA named {args.name!r} (added: {names})")
    print(f"removed {args.name}: the next task's VM no longer trusts it")
    return 0


def cmd_ca_list(args: argparse.Namespace) -> int:
    from piwork.net.status import network_status

    status = network_status(_paths(), lookup=False)
    for cert in status.cas:
        print(sanitize(cert.describe(), one_line=True))
    if not status.cas:
        print("no extra certificate authorities (`piwork network ca add FILE`)")
    return 0


def cmd_ca_host(args: argparse.Namespace) -> int:
    return _switch(args, "cas", "use_host_cas", (
        "the host's extra CAs are trusted and installed in the VM",
        "the host's extra CAs are left out (only the ones you add are used)",
    ))  # fmt: skip


# --- mirrors ------------------------------------------------------------------


def cmd_mirror_set(args: argparse.Namespace) -> int:
    from piwork.net.mirrors import mirrors_for, set_mirror

    paths = _paths()
    folder = _folder(args.folder)
    set_mirror(paths, args.kind, args.url, folder)
    print(f"{args.kind} mirror {_where(folder)}: {getattr(mirrors_for(paths, folder), args.kind)}")
    print("  `piwork env allow-registries` (and the app's \"Allow the package registries\") "
          "cover its host")  # fmt: skip
    return 0


def cmd_mirror_rm(args: argparse.Namespace) -> int:
    from piwork.net.mirrors import set_mirror

    folder = _folder(args.folder)
    set_mirror(_paths(), args.kind, None, folder)
    print(f"{args.kind} mirror removed {_where(folder)}")
    return 0


# --- private addresses ----------------------------------------------------------------


def cmd_allow_private(args: argparse.Namespace) -> int:
    from piwork.net.private import allow_private, registry_hosts

    paths = _paths()
    folder = _folder(args.folder)
    domains = list(args.domains or [])
    if args.registries:
        domains += registry_hosts(paths, folder)
    rules = allow_private(paths, domains, folder)
    print(f"the sandbox may reach these at a private or reserved address, {_where(folder)}:")
    for rule in rules:
        print(f"  {rule.id}: {rule.describe()}")
    print("  (each still needs its network rule: `piwork env allow-registries` for the "
          "registries; `piwork policy rm ID` takes one back)")  # fmt: skip
    return 0


def cmd_forget_private(args: argparse.Namespace) -> int:
    from piwork.net.private import forget_private

    folder = _folder(args.folder)
    n = forget_private(_paths(), args.domain, folder)
    print(f"removed {n} rule(s) for {args.domain} {_where(folder)}")
    return 0 if n else 1


def register(sub: Any) -> None:
    net = sub.add_parser(
        "network",
        help="upstream proxy, certificate authorities, package mirrors, private addresses",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = net.add_subparsers(dest="network_command", metavar="ACTION")

    def show_parser(p: argparse.ArgumentParser) -> None:
        p.add_argument("--folder", metavar="DIR", help="a folder's mirrors and rules")
        p.add_argument("--json", action="store_true")
        p.add_argument("--no-lookup", action="store_true", help="do not resolve the registries")
        p.set_defaults(func=cmd_show)

    show_parser(net)
    show_parser(actions.add_parser("show", help="the settings and how the registries resolve"))

    proxy = actions.add_parser("proxy", help="the upstream proxy (HTTP CONNECT or SOCKS5)")
    pa = proxy.add_subparsers(dest="proxy_command", metavar="ACTION", required=True)
    p = pa.add_parser("set", help="use this proxy (http://, https://, socks5://, socks5h://)")
    p.add_argument("url", help="scheme://[USER@]host:port")
    p.add_argument("--no-proxy", metavar="HOSTS", help="reached directly (NO_PROXY syntax)")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the proxy password from stdin into the keyring")  # fmt: skip
    p.set_defaults(func=cmd_proxy_set)
    pa.add_parser("clear", help="remove the proxy setting").set_defaults(func=cmd_proxy_clear)
    p = pa.add_parser("system", help="with no proxy set: use HTTPS_PROXY and the system's")
    p.add_argument("state", choices=["on", "off"])
    p.set_defaults(func=cmd_proxy_system)

    ca = actions.add_parser("ca", help="extra certificate authorities (TLS inspection)")
    ca_actions = ca.add_subparsers(dest="ca_command", metavar="ACTION", required=True)
    p = ca_actions.add_parser("add", help="trust a CA certificate (PEM or DER; keys are left out)")
    p.add_argument("file")
    p.add_argument("--name", help="a name for it (default: the file's)")
    p.set_defaults(func=cmd_ca_add)
    p = ca_actions.add_parser("rm", help="stop trusting a CA you added")
    p.add_argument("name")
    p.set_defaults(func=cmd_ca_rm)
    ca_actions.add_parser("list", help="every extra CA piwork trusts").set_defaults(
        func=cmd_ca_list
    )
    p = ca_actions.add_parser("host", help="use the host's own extra CAs (default on)")
    p.add_argument("state", choices=["on", "off"])
    p.set_defaults(func=cmd_ca_host)

    mirror = actions.add_parser("mirror", help="PyPI, npm and Debian mirrors")
    ma = mirror.add_subparsers(dest="mirror_command", metavar="ACTION", required=True)
    p = ma.add_parser("set", help="use a mirror (for a folder, or for every task)")
    p.add_argument("kind", choices=["pypi", "npm", "debian"])
    p.add_argument("url")
    p.add_argument("--folder", metavar="DIR")
    p.set_defaults(func=cmd_mirror_set)
    p = ma.add_parser("rm", help="back to the public registry")
    p.add_argument("kind", choices=["pypi", "npm", "debian"])
    p.add_argument("--folder", metavar="DIR")
    p.set_defaults(func=cmd_mirror_rm)

    p = actions.add_parser(
        "allow-private",
        help="let the sandbox reach domains that resolve to private addresses",
    )
    p.add_argument("domains", nargs="*", metavar="DOMAIN")
    p.add_argument("--registries", action="store_true",
                   help="the package registries and mirrors (when they resolve to your "
                   "network's proxy)")  # fmt: skip
    p.add_argument("--folder", metavar="DIR", help="only for tasks on this folder")
    p.set_defaults(func=cmd_allow_private)
    p = actions.add_parser("forget-private", help="take back allow-private for a domain")
    p.add_argument("domain")
    p.add_argument("--folder", metavar="DIR")
    p.set_defaults(func=cmd_forget_private)
