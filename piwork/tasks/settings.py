"""Task defaults from the user's ``settings.json``.

The file is shared with other parts of piwork; tasks read only their section::

    {"tasks": {"defaultLimits": {"maxTurns": 100, "maxWallTimeSeconds": 7200,
                                 "maxTokens": 10000000, "maxCostUsd": null}}}

A key left out keeps the built-in default; an explicit ``null`` means
unlimited. A missing file means all built-in defaults; a broken one is an
error that names the file and the bad key, never a silent fallback.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from piwork.settings import SettingsError as SettingsError  # its import location, kept
from piwork.settings import read_section, settings_path
from piwork.tasks.model import Limits

SECTION = "tasks"

#: Built-in defaults: generous enough for real work, small enough that a
#: looping agent stops on its own within a couple of hours.
DEFAULT_LIMITS = Limits(
    max_turns=100,
    max_wall_time_seconds=2 * 3600,
    max_tokens=10_000_000,
    max_cost_usd=None,
)

#: Checkpoint defaults (``tasks.checkpointMaxFileBytes`` / ``tasks.checkpointMaxBytes``).
DEFAULT_CHECKPOINT_MAX_FILE_BYTES = 50 * 1024 * 1024
DEFAULT_CHECKPOINT_MAX_BYTES = 2 * 1024 * 1024 * 1024


def merge_limits(base: Limits, overrides: Mapping[str, Any]) -> Limits:
    """``base`` with the fields in ``overrides`` replaced (and validated).

    One ``--max-*`` flag changes one limit: the others keep their value from
    ``base`` (the settings defaults for a new task, the task's own on resume).
    """
    return Limits.model_validate({**base.model_dump(), **overrides})


class TaskSettings(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    default_limits: Limits = Field(default_factory=lambda: DEFAULT_LIMITS.model_copy())
    #: Checkpoints (piwork.checkpoints) skip files larger than this, with a note.
    checkpoint_max_file_bytes: int = Field(default=DEFAULT_CHECKPOINT_MAX_FILE_BYTES, ge=0)
    #: ``piwork tasks gc`` drops a task's oldest checkpoints beyond this many bytes.
    checkpoint_max_bytes: int | None = Field(default=DEFAULT_CHECKPOINT_MAX_BYTES, ge=0)


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in (SECTION, *err["loc"]))
        lines.append(f"  {where}: {err['msg']}")
    return "\n".join(lines)


def load_task_settings(path: Path | None = None) -> TaskSettings:
    """Read the ``tasks`` section of ``settings.json`` (default: ``get_paths().settings_file``)."""
    path = settings_path(path)
    section = read_section(SECTION, path)  # SettingsError: the file is unusable
    merged: dict[str, Any] = dict(section)
    limits = section.get("defaultLimits")
    if limits is not None:
        if not isinstance(limits, dict):
            raise SettingsError(
                f"settings file {path}: '{SECTION}.defaultLimits' must be an object"
            )
        merged["defaultLimits"] = {**DEFAULT_LIMITS.model_dump(by_alias=True), **limits}
    try:
        return TaskSettings.model_validate(merged)
    except ValidationError as exc:
        raise SettingsError(
            f"settings file {path} has invalid task settings:\n{_describe(exc)}"
        ) from exc
