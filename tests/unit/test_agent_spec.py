"""The VM a task runs in is put together in one place (piwork.agent.vm_spec), so the
saved VM `piwork doctor` reports is the one a warm start restores."""

from __future__ import annotations

from pathlib import Path

from piwork.agent import AgentVm, AgentVmConfig, TaskDirs, saved_vm_for
from piwork.vm.template import template_for
from tests.helpers.pack import MANIFEST, TCG


def _cfg(tmp_path: Path, **kw: object) -> AgentVmConfig:
    base: dict[str, object] = dict(
        pack_dir=tmp_path / "packs" / "pack-1",
        manifest=MANIFEST,
        accel=TCG,
        dirs=TaskDirs(tmp_path / "s", tmp_path / "o", tmp_path / "u", tmp_path / "w"),
        log_dir=tmp_path / "task" / "logs",
        gateway_port=1,
        template_root=tmp_path / "templates",
    )
    base.update(kw)
    return AgentVmConfig(**base)  # type: ignore[arg-type]


async def test_doctor_and_a_warm_start_find_the_same_saved_vm(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    agent = AgentVm(cfg)  # builds its spec; starts nothing
    restored = template_for(agent.spec, tmp_path / "templates")
    assert saved_vm_for(cfg).dir == restored.dir
    # Another task's folders and sockets change nothing; its memory does.
    other = _cfg(tmp_path, dirs=TaskDirs(tmp_path / "x", tmp_path / "y", tmp_path / "z",
                                         tmp_path / "q"))  # fmt: skip
    assert saved_vm_for(other).dir == restored.dir
    assert saved_vm_for(_cfg(tmp_path, memory_mb=2048)).dir != restored.dir
