"""The app's settings (``settings.json`` section ``gui``) and the model list. Qt-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from piwork.config import Paths
from piwork.models.defaults import DEMO, default_model, read_section, write_section
from piwork.models.providers import PROVIDERS_FILE_NAME, ProviderConfigError, load_providers

SECTION = "gui"


@dataclass
class Prefs:
    max_tasks: int = 2
    memory_mb: int = 1024
    cpus: int = 2
    accel: str = ""  # "" = best available
    keep_warm_seconds: float = 300.0
    default_model: str = DEMO
    archived: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, paths: Paths) -> Prefs:
        s = read_section(SECTION, paths.settings_file)
        p = cls()

        def num(key: str, default: Any, lo: float, hi: float) -> Any:
            v = s.get(key, default)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return default
            return type(default)(min(hi, max(lo, v)))

        p.max_tasks = num("maxTasks", p.max_tasks, 1, 16)
        p.memory_mb = num("memoryMb", p.memory_mb, 256, 65536)
        p.cpus = num("cpus", p.cpus, 1, 64)
        p.keep_warm_seconds = num("keepWarmSeconds", p.keep_warm_seconds, 0, 3600)
        accel = s.get("accel")
        p.accel = accel if accel in ("", "kvm", "hvf", "tcg") else ""
        arch = s.get("archived")
        p.archived = {a for a in arch if isinstance(a, str)} if isinstance(arch, list) else set()
        p.default_model = default_model(paths.settings_file)
        return p

    def save(self, paths: Paths) -> None:
        write_section(
            SECTION,
            {
                "maxTasks": self.max_tasks,
                "memoryMb": self.memory_mb,
                "cpus": self.cpus,
                "accel": self.accel,
                "keepWarmSeconds": self.keep_warm_seconds,
                "archived": sorted(self.archived),
            },
            paths.settings_file,
        )


def model_choices(paths: Paths) -> list[tuple[str, str]]:
    """``(ref, label)`` for the model picker: the labelled demo first, then every model."""
    out = [(DEMO, "demo (offline, scripted — not a real model)")]
    try:
        catalog = load_providers(paths.config / PROVIDERS_FILE_NAME, pi_models=True)
    except (ProviderConfigError, OSError):
        return out
    keys = None
    for p in catalog.values():
        if p.name == "piwork-demo":
            continue
        mark = ""
        if p.auth != "none" and p.key_required:
            # Which models can run now: a provider without its key is marked (issue 33).
            from piwork.auth import KeyStore

            keys = keys or KeyStore(paths=paths)
            try:
                stored = keys.where(p.credential_name) is not None
            except Exception:  # an unreachable keyring: say nothing rather than guess
                stored = True
            mark = "" if stored else "  · no key yet"
        for mid in p.model_ids():
            out.append((f"{p.name}/{mid}", f"{p.name}/{mid}{mark}"))
    return out
