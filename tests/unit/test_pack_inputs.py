"""The pack id: a hash of exactly what shapes the pack, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.config import repo_root
from piwork.pack import inputs
from piwork.pack.bundle import KEPT_EXTERNAL
from piwork.pack.inputs import compute_pack_id, input_files


def make_source(root: Path) -> Path:
    files = {
        "vm-image/pins.toml": '[debian]\nsuite = "bookworm"\n',
        "vm-image/init": "#!/bin/sh\necho init\n",
        "runtime-pack/pi/package.json": "{}\n",
        "runtime-pack/pi/package-lock.json": '{"lockfileVersion": 3}\n',
        "runtime-pack/supervisor/supervisor.js": "console.log('hi')\n",
        "runtime-pack/pi/node_modules/left-pad/index.js": "module.exports = 1\n",
        "runtime-pack/tests/supervisor.test.mjs": "test()\n",
        "piwork/unrelated.py": "x = 1\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "vm-image/init").chmod(0o755)
    return root


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_source(tmp_path / "src")


def test_covers_guest_files_pins_and_lock_but_not_node_modules_or_tests(src: Path) -> None:
    assert input_files(src) == [
        "runtime-pack/pi/package-lock.json",
        "runtime-pack/pi/package.json",
        "runtime-pack/supervisor/supervisor.js",
        "vm-image/init",
        "vm-image/pins.toml",
    ]


def test_is_stable_for_the_same_tree(src: Path, tmp_path: Path) -> None:
    other = make_source(tmp_path / "elsewhere")
    assert compute_pack_id(src) == compute_pack_id(src) == compute_pack_id(other)


@pytest.mark.parametrize(
    "rel",
    [
        "vm-image/init",
        "vm-image/pins.toml",
        "runtime-pack/pi/package-lock.json",
        "runtime-pack/supervisor/supervisor.js",
    ],
)
def test_changes_when_an_input_changes(src: Path, rel: str) -> None:
    before = compute_pack_id(src)
    (src / rel).write_text((src / rel).read_text() + "# changed\n")
    assert compute_pack_id(src) != before


def test_changes_when_a_guest_file_is_added_or_its_exec_bit_flips(src: Path) -> None:
    before = compute_pack_id(src)
    (src / "runtime-pack/extensions").mkdir()
    (src / "runtime-pack/extensions/gate.ts").write_text("export {}\n")
    added = compute_pack_id(src)
    assert added != before
    (src / "runtime-pack/extensions/gate.ts").chmod(0o755)
    assert compute_pack_id(src) != added


def test_ignores_node_modules_tests_and_the_host_package(src: Path) -> None:
    before = compute_pack_id(src)
    (src / "runtime-pack/pi/node_modules/left-pad/index.js").write_text("changed\n")
    (src / "runtime-pack/pi/node_modules/new-dep").mkdir()
    (src / "runtime-pack/pi/node_modules/new-dep/index.js").write_text("x\n")
    (src / "runtime-pack/tests/supervisor.test.mjs").write_text("changed\n")
    (src / "piwork/unrelated.py").write_text("x = 2\n")
    assert compute_pack_id(src) == before


def test_changes_when_the_builder_version_changes(
    src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = compute_pack_id(src)
    monkeypatch.setattr(inputs, "BUILDER_VERSION", inputs.BUILDER_VERSION + 1)
    assert compute_pack_id(src) != before


def test_changes_when_a_package_is_kept_out_of_the_bundle(
    src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Same files, another bundle: a pack built the other way must not be reused.
    before = compute_pack_id(src)
    monkeypatch.setattr(inputs, "KEPT_EXTERNAL", KEPT_EXTERNAL | {"some-package"})
    assert compute_pack_id(src) != before


def test_the_real_tree_has_its_pins_and_lock_in_the_hash() -> None:
    files = input_files(repo_root())
    assert "vm-image/pins.toml" in files
    assert "runtime-pack/pi/package-lock.json" in files
    assert not any("node_modules" in f for f in files)
