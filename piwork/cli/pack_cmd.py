"""``piwork pack build | verify | list | path``: runtime packs from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from piwork.config import repo_root
from piwork.pack import build as pack_build
from piwork.pack import cache
from piwork.pack.errors import PackError
from piwork.pack.inputs import compute_pack_id


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pack = subparsers.add_parser("pack", help="build, verify and list runtime packs")
    sub = pack.add_subparsers(dest="pack_command", metavar="ACTION")

    def usage(_args: argparse.Namespace) -> int:
        pack.print_help()
        return 2

    pack.set_defaults(func=usage)

    p = sub.add_parser("build", help="build the pack for this source tree (cached)")
    p.add_argument("--force", action="store_true", help="rebuild even if the pack exists")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.add_argument(
        "--arch",
        choices=["amd64", "arm64", "x86_64", "aarch64"],
        help="the guest architecture (default: $PIWORK_ARCH, else this machine's)",
    )
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("verify", help="re-hash a pack's files against its manifest")
    p.add_argument(
        "pack_id",
        nargs="?",
        metavar="PACK_ID",
        help="pack to verify (default: the current source tree's pack)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("list", help="list installed packs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("path", help="print the current source tree's pack directory")
    p.set_defaults(func=cmd_path)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def _error(msg: str) -> int:
    print(f"piwork: {msg}", file=sys.stderr)  # one prefix for every error (piwork.cli.main)
    return 1


def cmd_build(args: argparse.Namespace) -> int:
    try:
        result = pack_build.build_pack(force=args.force, arch=args.arch)
    except PackError as exc:
        return _error(str(exc))
    m = result.manifest
    if args.json:
        _print_json(
            {
                "pack_dir": str(result.pack_dir),
                "built": result.built,
                "seconds": round(result.seconds, 1),
                "manifest": m.model_dump(mode="json"),
            }
        )
    else:
        state = "built" if result.built else "up to date (cached)"
        print(f"pack {m.pack_id} ({m.arch}) {state}: {result.pack_dir}")
        for key, value in sorted(m.versions.items()):
            print(f"  {key:15} {value}")
        for f in m.files:
            print(f"  {f.path:15} {f.size / 1e6:8.1f} MB  sha256 {f.sha256[:16]}…")
        if m.workbench and "workbench_bytes" in m.stats:
            print(
                f"  workbench: {len(m.packages)} Debian packages, "
                f"{m.stats.get('workbench_tree_bytes', 0) / 1e6:.0f} MB unpacked -> "
                f"{m.stats['workbench_bytes'] / 1e6:.0f} MB image (lz4hc erofs), "
                f"built in {m.stats.get('workbench_build_ms', 0) / 1000:.0f} s (cached apart)"
            )
        if result.built:
            print(f"  build time: {result.seconds:.0f} s")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        pack_id = args.pack_id or compute_pack_id(repo_root())
        result = cache.verify(cache.pack_path(pack_id))
    except PackError as exc:
        return _error(str(exc))
    if args.json:
        _print_json(result.to_json())
    elif result.ok:
        print(f"pack {pack_id}: OK ({result.checked} files match the manifest)")
    else:
        print(f"pack {pack_id}: BROKEN")
        for problem in result.problems():
            print(f"  {problem}")
    return 0 if result.ok else 1


def cmd_list(args: argparse.Namespace) -> int:
    infos = cache.list_packs()
    if args.json:
        _print_json([i.to_json() for i in infos])
        return 0
    if not infos:
        print(f"no packs in {cache.packs_dir()} (run `piwork pack build`)")
        return 0
    current = compute_pack_id(repo_root())
    for i in infos:
        mark = "*" if i.pack_id == current else " "
        state = "complete" if i.complete else f"INCOMPLETE {i.error}".strip()
        v = i.versions
        print(
            f"{mark} {i.pack_id}  {i.created_at or '?':25}  {i.size / 1e6:7.1f} MB  {state}  "
            f"kernel {v.get('kernel', '?')}  node {v.get('node', '?')}  pi {v.get('pi', '?')}"
        )
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    found = pack_build.find_pack()
    if found is None:
        pack_id = compute_pack_id(repo_root())
        return _error(
            f"pack {pack_id} for this source tree is not built "
            f"(run `piwork pack build`); it would be {cache.pack_path(pack_id)}"
        )
    print(found)
    return 0
