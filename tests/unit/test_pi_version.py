"""pi's version is one pinned input: the pack carries the pinned pi, and a pack whose
pi this host does not speak is refused before anything boots, saying which pi it has
and which this piwork needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.agent import AgentVm, AgentVmConfig, TaskDirs
from piwork.config import repo_root
from piwork.pack import node
from piwork.pack.inputs import compute_pack_id, input_files
from piwork.rpc.version import UnsupportedPi, check_pi, speaks, spoken
from tests.helpers.pack import MANIFEST, TCG


def _pinned() -> str:
    pins = json.loads((repo_root() / node.PI_SOURCE / "package.json").read_text())
    return str(pins["dependencies"][node.PI_PACKAGE])


def test_the_pinned_pi_is_one_this_host_speaks() -> None:
    """Moving to a later pi is this one pin (and its lock): the suite then says whether
    the host still speaks it."""
    assert speaks(_pinned()), f"runtime-pack/pi pins pi {_pinned()}; the host speaks {spoken()}"
    lock = json.loads((repo_root() / node.PI_SOURCE / "package-lock.json").read_text())
    locked = lock["packages"][f"node_modules/{node.PI_PACKAGE}"]["version"]
    assert locked == _pinned(), "package-lock.json is stale: npm install --package-lock-only"


def test_the_pin_and_its_lock_are_inputs_of_the_pack_id() -> None:
    files = input_files(repo_root())
    assert f"{node.PI_SOURCE.as_posix()}/package.json" in files
    assert f"{node.PI_SOURCE.as_posix()}/package-lock.json" in files


def test_another_pin_makes_another_pack(tmp_path: Path) -> None:
    src = tmp_path / "src"
    pi = src / node.PI_SOURCE
    pi.mkdir(parents=True)
    (pi / "package-lock.json").write_text("{}")
    (pi / "package.json").write_text(json.dumps({"dependencies": {node.PI_PACKAGE: "1.6.0"}}))
    first = compute_pack_id(src)
    (pi / "package.json").write_text(json.dumps({"dependencies": {node.PI_PACKAGE: "1.7.0"}}))
    assert compute_pack_id(src) != first


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("1.6.0", True),
        ("1.6.3", True),
        ("1.12.0", True),
        ("1.5.9", False),
        ("0.73.1", False),
        ("2.0.0", False),
        ("1.7.0-beta.1", False),
        ("", False),
        (None, False),
    ],
)
def test_speaks(version: str | None, ok: bool) -> None:
    assert speaks(version) is ok


def test_the_refusal_says_which_pi_the_pack_has_and_which_is_needed() -> None:
    with pytest.raises(UnsupportedPi) as err:
        check_pi("0.73.1", "runtime pack abc")
    text = str(err.value)
    assert "runtime pack abc runs pi 0.73.1" in text
    assert spoken() in text and "piwork pack build" in text


async def test_a_pack_with_an_old_pi_is_refused_before_qemu_starts(tmp_path: Path) -> None:
    old = MANIFEST.model_copy(update={"versions": {**MANIFEST.versions, "pi": "0.73.1"}})
    cfg = AgentVmConfig(
        pack_dir=tmp_path / "packs" / "pack-1",
        manifest=old,
        accel=TCG,
        dirs=TaskDirs(tmp_path / "s", tmp_path / "o", tmp_path / "u", tmp_path / "w"),
        log_dir=tmp_path / "task" / "logs",
        gateway_port=1,
    )
    agent = AgentVm(cfg)
    with pytest.raises(UnsupportedPi, match=r"runs pi 0\.73\.1"):
        await agent.start()
    assert not agent.vm.running
