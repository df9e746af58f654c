"""The ``gateway`` section of settings.json: which provider-side tools a person enabled.

    {"gateway": {"serverTools": ["web_search"]}}

Nothing is enabled by default. An enabled kind is still asked about at each run
like a network destination (the MCP server's host, the domains a search or
fetch is limited to, or "any site"), and its fees count toward the task's cost.
See ``piwork.proxy.allowlist.SERVER_TOOL_KINDS`` for the kinds.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from piwork.proxy.allowlist import SERVER_TOOL_KINDS
from piwork.settings import SettingsError, read_section, settings_path

SECTION = "gateway"


class GatewaySettings(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    server_tools: frozenset[str] = Field(default_factory=frozenset)

    @field_validator("server_tools")
    @classmethod
    def _known(cls, value: frozenset[str]) -> frozenset[str]:
        unknown = sorted(value - SERVER_TOOL_KINDS.keys())
        if unknown:
            raise ValueError(
                f"unknown server tool kind(s) {', '.join(unknown)}; "
                f"known: {', '.join(SERVER_TOOL_KINDS)}"
            )
        return value


def load_gateway_settings(path: Path | None = None) -> GatewaySettings:
    """The section, validated; a bad value is a :class:`SettingsError` naming the file."""
    section = read_section(SECTION, path)
    try:
        return GatewaySettings.model_validate(section)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in (SECTION, *e['loc']))}: {e['msg']}" for e in exc.errors()
        )
        raise SettingsError(f"settings file {settings_path(path)}: {problems}") from exc


__all__ = ["SECTION", "GatewaySettings", "load_gateway_settings"]
