"""A wheel carries the pack's build inputs, and they hash to the checkout's pack id."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

from piwork.arch import ARCHES
from piwork.config import repo_root
from piwork.pack.inputs import compute_pack_id, input_files

ROOT = Path(__file__).resolve().parents[2]


def _sources_module() -> object:
    spec = importlib.util.spec_from_file_location("piwork_sources", ROOT / "packaging/sources.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_copied_sources_build_the_same_pack(tmp_path: Path) -> None:
    mod = _sources_module()
    copied = mod.copy_sources(ROOT, tmp_path)  # type: ignore[attr-defined]
    # Every arch's inputs (an installed piwork builds the pack for its own machine).
    assert copied == sorted({f for a in ARCHES.values() for f in input_files(ROOT, a)})
    for arch in ARCHES.values():
        assert compute_pack_id(tmp_path, arch) == compute_pack_id(ROOT, arch), arch.debian
    assert os.stat(tmp_path / "vm-image/init").st_mode & stat.S_IXUSR
    assert not (tmp_path / "runtime-pack/pi/node_modules").exists()


def test_repo_root_is_the_checkout_here() -> None:
    assert repo_root() == ROOT


def test_desktop_entry_opens_the_app() -> None:
    text = (ROOT / "packaging/piwork.desktop").read_text()
    assert "Exec=piwork gui" in text and "Icon=piwork" in text
    assert (ROOT / "packaging/piwork.svg").read_text().startswith("<svg")


def test_doctor_lists_the_qt_runtime() -> None:
    from piwork.doctor import QT_RUNTIME_LIBS, check_qt_runtime

    check = check_qt_runtime()
    assert check.name == "desktop app (Qt)" and check.ok  # installed by scripts/setup.sh here
    assert {"libegl1", "libxcb-cursor0", "libxkbcommon0"} <= {p for p, _ in QT_RUNTIME_LIBS}
    apt = (ROOT / "scripts/apt-packages.txt").read_text()
    for pkg, _ in QT_RUNTIME_LIBS:
        assert f"\n{pkg}=" in apt, pkg  # pinned where setup.sh installs from


def test_piwork_alone_without_a_display_says_what_to_do(
    monkeypatch: object, capsys: object
) -> None:
    import pytest

    from piwork.cli.main import main

    mp: pytest.MonkeyPatch = monkeypatch  # type: ignore[assignment]
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        mp.delenv(var, raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "no display" in err and "piwork run" in err
