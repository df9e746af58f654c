"""`piwork hosts add|list|rm|check`: remote boxes a task's VM can run on (issue 21)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from piwork.hosts import store
from piwork.hosts.check import HostReport, number, run_check
from piwork.hosts.connect import HostKeyInfo, connect, fingerprint_matcher
from piwork.hosts.remote import remote_root
from piwork.jsonstore import NothingToRestore
from piwork.textsafe import sanitize


def _ask(info: HostKeyInfo) -> bool:
    print(info.describe(), file=sys.stderr)
    if not sys.stdin.isatty():
        return False
    try:
        answer = input("Trust this key and continue? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _confirm(args: argparse.Namespace) -> Any:
    return fingerprint_matcher(args.host_key_fingerprint, _ask)


async def _check(host: store.Host, args: argparse.Namespace) -> HostReport:
    conn = await connect(host, _confirm(args))
    try:
        root = await remote_root(conn, host, create=False)
        return await run_check(conn, root)
    finally:
        conn.close()
        await conn.wait_closed()


def _print_report(host: store.Host, rep: HostReport) -> None:
    # Every value came from the remote: checked for its type by parse(), printed inert here.
    v = rep.values
    mem = number(v, "mem_available_kb") // 1024
    disk = number(v, "disk_free_kb") // (1024 * 1024)
    qemu = sanitize(v.get("qemu_version") or "not installed", one_line=True, limit=200)
    print(f"{host.name} ({host.target})")
    print(f"  qemu     {qemu}")
    kvm = (
        "usable"
        if v.get("kvm_rw") == "1"
        else ("not usable" if v.get("kvm_exists") == "1" else "absent")
    )
    print(f"  /dev/kvm {kvm}")
    print(f"  accel    {rep.accel.accel.value}: {sanitize(rep.accel.reason, one_line=True)}")
    print(f"  disk     {disk} GiB free")
    print(f"  memory   {mem} MiB available")
    fwd = {"1": "allowed", "0": "REFUSED by sshd"}.get(v.get("ssh_streamlocal", ""), "not probed")
    print(f"  sockets  SSH channels to unix sockets: {fwd}")
    for p in rep.problems:
        print(f"  ✗ {sanitize(p, one_line=True)}")


def _exists(name: str) -> store.HostError:
    return store.HostError(f"host {name!r} exists; remove it first: piwork hosts rm {name}")


def cmd_add(args: argparse.Namespace) -> int:
    if args.name in store.load():
        raise _exists(args.name)
    host = store.parse_target(args.name, args.target, identity=args.identity, root=args.root)
    if not args.no_connect:
        rep = asyncio.run(_check(host, args))
        _print_report(host, rep)

    def add(hosts: dict[str, store.Host]) -> dict[str, store.Host]:
        if host.name in hosts:  # added meanwhile by another command
            raise _exists(host.name)
        return {**hosts, host.name: host}

    store.update(add)
    print(f"added {host.name} ({host.target})")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    hosts = store.load()
    if args.json:
        sys.stdout.write(orjson.dumps([h.model_dump() for h in hosts.values()]).decode() + "\n")
        return 0
    if not hosts:
        print("no hosts; add one with: piwork hosts add NAME user@box[:port]")
    for h in hosts.values():
        print(f"{h.name:<16} {h.target:<32} root={h.root}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    def remove(hosts: dict[str, store.Host]) -> dict[str, store.Host]:
        if args.name not in hosts:
            raise store.unknown(args.name, hosts)
        return {name: h for name, h in hosts.items() if name != args.name}

    store.update(remove)
    print(f"removed {args.name} (its trusted host key stays in {store.known_hosts_file()})")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    try:
        restored = store.restore()
    except NothingToRestore as exc:
        raise store.HostError(str(exc)) from exc
    print(f"restored {restored.path} from {restored.source}: {len(store.load())} host(s)")
    if restored.kept is not None:
        print(f"the damaged file is kept at {restored.kept}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    host = store.get(args.name)
    rep = asyncio.run(_check(host, args))
    if args.json:
        sys.stdout.write(orjson.dumps({"host": host.name, **rep.to_json()}).decode() + "\n")
    else:
        _print_report(host, rep)
    return 0 if rep.ok else 1


def _run(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except store.HostError as exc:
            print(f"piwork: {exc}", file=sys.stderr)
            return 1

    return wrapped


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hosts = subparsers.add_parser("hosts", help="remote boxes (SSH) a task's VM can run on")
    sub = hosts.add_subparsers(dest="hosts_command", metavar="ACTION")

    def usage(_args: argparse.Namespace) -> int:
        hosts.print_help()
        return 2

    hosts.set_defaults(func=usage)
    fp_help = (
        "accept the host's key on first use only if its fingerprint is this (SHA256:...); "
        "needed when not at a terminal"
    )
    p = sub.add_parser("add", help="add a host and check it (asks to trust its key)")
    p.add_argument("name")
    p.add_argument("target", metavar="user@box[:port]")
    p.add_argument("--identity", "-i", help="private key file to log in with")
    p.add_argument("--root", help=f"remote directory piwork owns (default ~/{store.DEFAULT_ROOT})")
    p.add_argument("--host-key-fingerprint", help=fp_help)
    p.add_argument("--no-connect", action="store_true", help="only record it; connect later")
    p.set_defaults(func=_run(cmd_add))

    p = sub.add_parser("list", help="list hosts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run(cmd_list))

    p = sub.add_parser("rm", help="remove a host")
    p.add_argument("name")
    p.set_defaults(func=_run(cmd_rm))

    p = sub.add_parser(
        "restore", help="put back the last good copy of a damaged hosts file (keeps the damaged)"
    )
    p.set_defaults(func=_run(cmd_restore))

    p = sub.add_parser("check", help="QEMU, /dev/kvm, the accelerator, disk and memory there")
    p.add_argument("name")
    p.add_argument("--json", action="store_true")
    p.add_argument("--host-key-fingerprint", help=fp_help)
    p.set_defaults(func=_run(cmd_check))
