"""``piwork trust`` and ``piwork mcp``: what pi in the VM may load from the folder, and
the MCP servers it connects to (``settings.json`` → ``pi``, piwork.pisettings)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from piwork.pisettings import McpServer, PiSettings, load_pi_settings, save_pi_settings


def register(subparsers: Any) -> None:
    trust = subparsers.add_parser(
        "trust",
        help="show or set whether pi loads the folder's AGENTS.md, .pi settings and extensions",
        description="Project trust (on by default): the folder's AGENTS.md/CLAUDE.md, "
        ".pi/settings.json, .pi/mcp.json, skills, prompt templates and extensions load in "
        "the VM, and each task says what was loaded. Off: none of them does.",
    )
    trust.add_argument("state", nargs="?", choices=("on", "off"))
    trust.set_defaults(func=_cmd_trust)

    mcp = subparsers.add_parser(
        "mcp",
        help="list, add or remove the MCP servers pi connects to",
        description="MCP servers for pi in the VM. A command (stdio) server runs in the VM, "
        "in the task's environment; a URL (streamable HTTP) server is reached through the "
        "egress proxy, so its domain is asked like any other. Keys never go into the VM: "
        "headers that would carry one are refused.",
    )
    mcp.add_argument("--json", action="store_true", help="machine-readable output")
    mcp.set_defaults(func=_cmd_mcp_list)
    sub = mcp.add_subparsers(dest="mcp_command", metavar="ACTION")
    add = sub.add_parser(
        "add",
        help="add or replace a server",
        usage="piwork mcp add NAME [OPTIONS] [-- COMMAND ARGS...]",
        description="e.g. `piwork mcp add files -- npx -y @modelcontextprotocol/server-"
        "filesystem .` or `piwork mcp add docs --url https://docs.example.com/mcp`. "
        "Options: " + "; ".join(f"{' '.join(o)}: {h}" for o, h in _ADD_OPTIONS),
    )
    add.add_argument("name", help="letters, digits, _ and -")
    add.add_argument("rest", nargs=argparse.REMAINDER, help="OPTIONS, then -- COMMAND ARGS...")
    add.set_defaults(func=_cmd_mcp_add)
    rm = sub.add_parser("rm", help="remove a server")
    rm.add_argument("name")
    rm.set_defaults(func=_cmd_mcp_rm)


_ADD_OPTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("--url", "URL"), "a streamable HTTP server's URL"),
    (("--header", "NAME=VALUE"), "a header for an HTTP server (never a credential)"),
    (("--env", "NAME=VALUE"), "a variable for a command server's environment (in the VM)"),
    (("--exposure", "KIND"), "codemode, deferred, direct or hidden (pi's default: codemode)"),
    (("--description", "TEXT"), "what the server offers, in a sentence"),
)


def _add_options() -> argparse.ArgumentParser:
    """The options of `piwork mcp add`, parsed from what comes before its `--`."""
    p = argparse.ArgumentParser(prog="piwork mcp add NAME", add_help=False, exit_on_error=False)
    p.add_argument("--url")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--exposure", choices=("codemode", "deferred", "direct", "hidden"))
    p.add_argument("--description")
    return p


def _cmd_trust(args: argparse.Namespace) -> int:
    settings = load_pi_settings()
    if args.state is not None:
        settings = settings.model_copy(update={"trust_project": args.state == "on"})
        save_pi_settings(settings)
    if settings.trust_project:
        print("project trust: on (the folder's AGENTS.md, .pi settings, skills, prompts and "
              "extensions load in the VM; `piwork trust off` to stop)")  # fmt: skip
    else:
        print("project trust: off (nothing from the folder loads, AGENTS.md included; "
              "`piwork trust on` to load it)")  # fmt: skip
    return 0


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name:
            raise ValueError(f"{what} {v!r}: expected NAME=VALUE")
        out[name] = value
    return out


def _cmd_mcp_add(args: argparse.Namespace) -> int:
    rest: list[str] = list(args.rest)
    cut = rest.index("--") if "--" in rest else len(rest)
    command = rest[cut + 1 :]
    try:
        opts = _add_options().parse_args(rest[:cut])
        server = McpServer(
            command=command[0] if command else None,
            args=command[1:],
            env=_pairs(opts.env, "--env"),
            url=opts.url,
            headers=_pairs(opts.header, "--header"),
            exposure=opts.exposure,
            description=opts.description,
        )
        settings = load_pi_settings()
        servers = {**settings.mcp_servers, args.name: server}
        settings = PiSettings(trust_project=settings.trust_project, mcp_servers=servers)
    except (ValidationError, ValueError, argparse.ArgumentError) as exc:
        print(f"piwork mcp add: {_first_error(exc)}", file=sys.stderr)
        return 2
    save_pi_settings(settings)
    where = server.url or " ".join(command)
    print(f"added MCP server {args.name}: {where}")
    return 0


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()[:3])
    return str(exc)


def _cmd_mcp_rm(args: argparse.Namespace) -> int:
    settings = load_pi_settings()
    if args.name not in settings.mcp_servers:
        print(f"piwork mcp rm: no MCP server named {args.name!r} (see `piwork mcp`)",
              file=sys.stderr)  # fmt: skip
        return 1
    servers = {k: v for k, v in settings.mcp_servers.items() if k != args.name}
    save_pi_settings(settings.model_copy(update={"mcp_servers": servers}))
    print(f"removed MCP server {args.name}")
    return 0


def _cmd_mcp_list(args: argparse.Namespace) -> int:
    settings = load_pi_settings()
    if args.json:
        doc = {name: s.model_dump(exclude_none=True) for name, s in settings.mcp_servers.items()}
        print(json.dumps(doc, indent=2))
        return 0
    if not settings.mcp_servers:
        print("no MCP servers (add one with `piwork mcp add NAME -- COMMAND ARGS` or "
              "`piwork mcp add NAME --url URL`)")  # fmt: skip
        return 0
    for name, s in settings.mcp_servers.items():
        kind = f"url {s.url}" if s.url else "command " + " ".join([s.command or "", *s.args])
        extra = [f"exposure {s.exposure}"] if s.exposure else []
        extra += [] if s.enabled else ["disabled"]
        print(f"{name}: {kind}" + (f" ({', '.join(extra)})" if extra else ""))
    return 0
