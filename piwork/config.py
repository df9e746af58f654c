"""Where piwork keeps things on the host, and the few settings it reads.

Every path comes from platformdirs so the app behaves like a native citizen on
Linux, macOS and Windows. ``PIWORK_HOME`` overrides all of them at once: tests
and CI use it to get a private, throw-away world without touching the user's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "piwork"


@dataclass(frozen=True)
class Paths:
    """The host directories piwork owns."""

    data: Path
    cache: Path
    state: Path
    config: Path

    @property
    def tasks(self) -> Path:
        return self.data / "tasks"

    @property
    def packs(self) -> Path:
        return self.cache / "packs"

    @property
    def downloads(self) -> Path:
        return self.cache / "downloads"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def runtime(self) -> Path:
        """Sockets and other per-process files; short paths keep AF_UNIX happy."""
        return self.state / "run"

    @property
    def policy_file(self) -> Path:
        return self.data / "policy.json"

    @property
    def audit_log(self) -> Path:
        return self.data / "audit.jsonl"

    @property
    def settings_file(self) -> Path:
        return self.config / "settings.json"


def _pack_cache_override() -> Path | None:
    value = os.environ.get("PIWORK_PACK_CACHE")
    return Path(value).expanduser() if value else None


def get_paths() -> Paths:
    """Return the directories for this user, honouring ``PIWORK_HOME``."""
    home = os.environ.get("PIWORK_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        paths = Paths(
            data=root / "data", cache=root / "cache", state=root / "state", config=root / "config"
        )
    else:
        paths = Paths(
            data=Path(platformdirs.user_data_dir(APP_NAME)),
            cache=Path(platformdirs.user_cache_dir(APP_NAME)),
            state=Path(platformdirs.user_state_dir(APP_NAME)),
            config=Path(platformdirs.user_config_dir(APP_NAME)),
        )
    override = _pack_cache_override()
    if override is not None:
        # Packs are large and content-addressed: sharing one cache between
        # otherwise isolated homes (tests) is safe and saves minutes.
        paths = Paths(data=paths.data, cache=override, state=paths.state, config=paths.config)
    return paths


def repo_root() -> Path:
    """Where ``runtime-pack/`` and ``vm-image/`` are: the source checkout, or the copy an
    installed wheel carries in ``piwork/_sources`` (setup.py puts it there)."""
    here = Path(__file__).resolve().parent
    checkout = here.parent
    if (checkout / "vm-image").is_dir() and (checkout / "runtime-pack").is_dir():
        return checkout
    installed = here / "_sources"
    if (installed / "vm-image").is_dir():
        return installed
    return checkout
