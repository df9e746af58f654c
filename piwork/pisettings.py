"""How pi in the guest is configured, besides its models: project trust and MCP servers.

The person's choices live in ``settings.json``'s ``pi`` section (:class:`PiSettings`):

* ``trust_project`` (default on): the folder's ``AGENTS.md``/``CLAUDE.md``,
  ``.pi/settings.json``, ``.pi/mcp.json``, skills, prompt templates and
  extensions load in the VM, where the VM is the boundary (pi's own
  ``docs/security.md``: RPC mode loads none of the protected ones unless trust
  was decided). Off: none of them, context files included.
* ``mcp_servers``: MCP servers pi connects to. A ``command`` server runs in the
  VM (its command and environment are inside it); a ``url`` server is reached
  through the egress proxy under the person's network policy, so its domain is
  asked like any other. Credentials never go to the VM: a header that would
  carry one is refused here (see :data:`CREDENTIAL_HEADERS`).

Each run the host writes pi's agent dir (``/mnt/state/agent`` in the guest) from
them: ``settings.json`` (``defaultProjectTrust``, telemetry off, the built-in
llama.cpp probe off) and ``mcp.json``; and moves aside what would make pi load
anything else from there (user-level extensions, skills, prompts, themes,
context and system-prompt files a run may have left), so the person's choice
holds on the next run whatever the last one wrote. What pi did load is reported
by the guest's ``project`` extension (:func:`project_report_text`).
"""

from __future__ import annotations

import re
import stat
import time
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from piwork import sharefs
from piwork.settings import SettingsError, read_section, settings_path, write_section
from piwork.textsafe import sanitize

SECTION = "pi"
AGENT_DIR = "agent"
"""pi's agent dir inside the task's state folder (``/mnt/state/agent`` in the guest)."""
TRUST_ENV = "PIWORK_TRUST_PROJECT"
"""pi's environment: "1" or "0", for the guest's project extension (context files)."""
REPORT_KEY = "piwork-project"
"""The ``setStatus`` key the guest's project extension reports what pi loaded under."""

# What pi loads from its agent dir besides piwork's own files (docs/configuration.md):
# only the host decides what is there when a run starts.
AGENT_DIR_LOADED = (
    "extensions",
    "skills",
    "prompts",
    "themes",
    "packages",
    "AGENTS.md",
    "AGENTS.MD",
    "AGENTS.override.md",
    "CLAUDE.md",
    "CLAUDE.MD",
    "SYSTEM.md",
    "APPEND_SYSTEM.md",
    "trust.json",
)
MOVED_ASIDE_PREFIX = ".piwork-moved-"

_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,100}$")
CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")
"""Headers piwork refuses to send into the VM; so is any whose name says token, key,
secret or auth (the guest would hold the credential)."""
_CREDENTIAL_WORDS = ("token", "key", "secret", "auth", "password", "session")


class McpServer(BaseModel):
    """One MCP server, as pi's ``mcp.json`` spells it (docs/mcp.md), credentials left out."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(default=None, min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """The stdio server's environment, inside the VM (not for secrets)."""
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    exposure: Literal["codemode", "deferred", "direct", "hidden"] | None = None
    description: str | None = None
    enabled: bool = True
    timeout: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_kind(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server has either a command (stdio) or a url (HTTP)")
        if self.url is not None and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"MCP server url must be http(s)://host/...: {self.url!r}")
        if self.command is None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for command (stdio) servers")
        if self.url is None and self.headers:
            raise ValueError("headers are for url (HTTP) servers")
        return self

    @field_validator("headers")
    @classmethod
    def _no_credentials(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            low = name.lower()
            if not _HEADER_NAME.match(name):
                raise ValueError(f"not a header name: {name!r}")
            if low in CREDENTIAL_HEADERS or any(w in low for w in _CREDENTIAL_WORDS):
                raise ValueError(
                    f"header {name!r} would carry a credential into the VM, where the agent "
                    "can read it: piwork keeps keys on the host (see docs/security.md, MCP)"
                )
        return value

    def to_pi(self) -> dict[str, Any]:
        """The ``mcp.json`` entry. A stdio server's command runs through ``/bin/bash``,
        which in the VM is the workbench's (runtime-pack/workbench/bash): the server
        runs in the task's environment, with its PATH (python3, whatever the person
        installed with ``piwork env``), as the agent's own commands do."""
        out: dict[str, Any] = self.model_dump(exclude_none=True, exclude_defaults=True)
        if self.command is not None:
            out["command"] = "/bin/bash"
            out["args"] = ["-c", 'exec "$0" "$@"', self.command, *self.args]
        if not self.enabled:
            out["enabled"] = False
        return out


class PiSettings(BaseModel):
    """``settings.json`` → ``pi``."""

    model_config = ConfigDict(extra="forbid")

    trust_project: bool = True
    mcp_servers: dict[str, McpServer] = Field(default_factory=dict)

    @field_validator("mcp_servers")
    @classmethod
    def _names(cls, value: dict[str, McpServer]) -> dict[str, McpServer]:
        seen: set[str] = set()
        for name in value:
            if not _SERVER_NAME.match(name):
                raise ValueError(f"MCP server name {name!r}: letters, digits, '_' and '-' only")
            folded = name.replace("-", "_").lower()
            if folded in seen:
                raise ValueError(f"MCP server names {name!r} and another differ only in - and _")
            seen.add(folded)
        return value


def load_pi_settings(path: Path | None = None) -> PiSettings:
    """The person's pi settings (defaults when the section is absent)."""
    raw = read_section(SECTION, path)
    try:
        return PiSettings.model_validate(raw)
    except ValidationError as exc:
        raise SettingsError(f"settings file {settings_path(path)}: '{SECTION}': {exc}") from exc


def save_pi_settings(settings: PiSettings, path: Path | None = None) -> None:
    write_section(SECTION, settings.model_dump(mode="json", exclude_defaults=True), path)


def agent_settings(settings: PiSettings) -> dict[str, Any]:
    """pi's agent-dir ``settings.json`` (docs/settings.md)."""
    return {
        # Read again by pi whenever it enters a folder (also after a warm start's switch).
        "defaultProjectTrust": "always" if settings.trust_project else "never",
        "enableInstallTelemetry": False,
        # pi 1.x re-sends the prompt to keep a provider's cache warm, by default also for
        # up to 30 minutes between runs: model calls nobody asked for, at the person's cost.
        "cacheWarming": "streaming",
        # The built-in llama.cpp extension looks for a local server; there is none in the VM.
        "extensions": ["-builtin:llama.cpp"],
        "quietStartup": True,
    }


def mcp_json(settings: PiSettings) -> dict[str, Any]:
    """pi's agent-dir ``mcp.json`` (user-level servers; a trusted project may add its own)."""
    return {"mcpServers": {name: s.to_pi() for name, s in settings.mcp_servers.items()}}


def write_agent_dir(state_dir: Path, settings: PiSettings) -> list[str]:
    """Write pi's agent-dir files for a run and move aside what else pi would load from
    there; returns the names moved aside (beneath ``state_dir/agent``, never following a
    link the guest made)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved: list[str] = []

    def aside(rel: str) -> None:
        name = rel.rpartition("/")[2]
        sharefs.rename_beneath(state_dir, rel, f"{MOVED_ASIDE_PREFIX}{stamp}-{name}")
        moved.append(rel)

    if _kind(state_dir, AGENT_DIR) not in (None, stat.S_IFDIR):
        aside(AGENT_DIR)  # a link (or file) the guest put where pi's agent dir belongs
    sharefs.mkdir_beneath(state_dir, AGENT_DIR)
    for name in AGENT_DIR_LOADED:
        if _kind(state_dir, f"{AGENT_DIR}/{name}") is not None:
            aside(f"{AGENT_DIR}/{name}")
    for name, doc in (
        ("settings.json", agent_settings(settings)),
        ("mcp.json", mcp_json(settings)),
    ):
        rel = f"{AGENT_DIR}/{name}"
        if _kind(state_dir, rel) == stat.S_IFDIR:
            aside(rel)
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
        sharefs.write_atomic_beneath(state_dir, rel, data, mode=0o644)
    return moved


def _kind(root: Path, rel: str) -> int | None:
    """The file type at ``root/rel`` (not following a link), or None if nothing is there."""
    try:
        return stat.S_IFMT(sharefs.lstat_beneath(root, rel).st_mode)
    except FileNotFoundError:
        return None


# --- what pi loaded, as the guest reports it ------------------------------------------

_REPORT_LIMIT = 64 * 1024
_LIST_LIMIT = 50


class ProjectReport(BaseModel):
    """The guest's report (untrusted: bounded, shown as text, never acted on)."""

    model_config = ConfigDict(extra="ignore")

    v: Literal[1]
    trusted: bool
    settings: list[str] = Field(default_factory=list)
    context_files: list[str] = Field(default_factory=list, alias="contextFiles")
    skills: list[str] = Field(default_factory=list)
    prompts: list[str] = Field(default_factory=list)
    extensions: list[str] = Field(default_factory=list)
    mcp_servers: list[str] = Field(default_factory=list, alias="mcpServers")
    error: str | None = None
    """The extension could not list what pi loaded (why)."""


def parse_project_report(text: str) -> ProjectReport | None:
    if len(text) > _REPORT_LIMIT:
        return None
    try:
        return ProjectReport.model_validate(orjson.loads(text))
    except (orjson.JSONDecodeError, ValidationError):
        return None


def _names(items: list[str]) -> str:
    shown = [sanitize(x, one_line=True, limit=200) for x in items[:_LIST_LIMIT]]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" (+{more} more)" if more > 0 else "")


def project_report_text(text: str) -> str | None:
    """One line for people from the guest's report, or None if it is not one."""
    report = parse_project_report(text)
    if report is None:
        return None
    parts = [
        (label, items)
        for label, items in (
            ("settings", report.settings),
            ("context", report.context_files),
            ("skills", report.skills),
            ("prompt templates", report.prompts),
            ("extensions", report.extensions),
            ("MCP servers", report.mcp_servers),
        )
        if items
    ]
    loaded = "; ".join(f"{label}: {_names(items)}" for label, items in parts)
    if report.error is not None:
        why = sanitize(report.error, one_line=True, limit=300)
        return f"could not list what pi loaded from the project ({why})"
    if not report.trusted:
        head = "project files not loaded (project trust is off: `piwork trust on`)"
        return f"{head}; loaded: {loaded}" if loaded else head
    return (
        f"pi loaded from the project: {loaded}" if loaded else "pi loaded nothing from the project"
    )


__all__ = [
    "AGENT_DIR",
    "REPORT_KEY",
    "TRUST_ENV",
    "McpServer",
    "PiSettings",
    "ProjectReport",
    "agent_settings",
    "load_pi_settings",
    "mcp_json",
    "parse_project_report",
    "project_report_text",
    "save_pi_settings",
    "write_agent_dir",
]
