"""The pack cache: hits, atomic builds, locking, verify, corrupt manifests.

The expensive part of a build (``_build_into``) is replaced by a fake that
writes a tiny pack, so these tests are about the cache's promises only.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from piwork.pack import build, cache
from piwork.pack.errors import ManifestError
from piwork.pack.inputs import compute_pack_id
from piwork.pack.manifest import MANIFEST_NAME, Manifest, PackFile, sha256_file


def make_source(root: Path) -> Path:
    for rel, text in {
        "vm-image/pins.toml": "# pins\n",
        "vm-image/init": "#!/bin/sh\n",
        "runtime-pack/pi/package-lock.json": "{}\n",
        "runtime-pack/supervisor/supervisor.js": "//\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


class FakeBuilder:
    """Stands in for ``build._build_into``; can fail half-way or be slow."""

    def __init__(self, fail_with: BaseException | None = None, delay: float = 0.0) -> None:
        self.calls = 0
        self.fail_with = fail_with
        self.delay = delay
        self.seen_dirs: list[Path] = []

    def __call__(self, out: Path, pack_id: str, w: object, progress: object) -> Manifest:
        self.calls += 1
        self.seen_dirs.append(out)
        (out / "vmlinuz").write_bytes(b"kernel")
        time.sleep(self.delay)
        if self.fail_with is not None:
            raise self.fail_with
        (out / "initrd.cpio").write_bytes(b"070701" + b"0" * 200)
        m = Manifest(
            pack_id=pack_id,
            kernel="vmlinuz",
            initrd="initrd.cpio",
            cmdline=build.CMDLINE,
            versions={"node": "22.23.3"},
            files=[
                PackFile(path=n, sha256=sha256_file(out / n), size=(out / n).stat().st_size)
                for n in ("vmlinuz", "initrd.cpio")
            ],
            created_at="2026-01-01T00:00:00+00:00",
            builder="test",
        )
        (out / MANIFEST_NAME).write_text(m.model_dump_json())
        return m


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_source(tmp_path / "src")


@pytest.fixture
def packs(tmp_path: Path) -> Path:
    return tmp_path / "packs"


def run_build(src: Path, packs: Path, **kw: object) -> build.BuildResult:
    return build.build_pack(
        source_root=src,
        packs=packs,
        downloads=packs.parent / "dl",
        log=lambda _m: None,
        **kw,  # type: ignore[arg-type]
    )


def test_first_build_builds_and_second_is_a_cache_hit(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeBuilder()
    monkeypatch.setattr(build, "_build_into", fake)
    first = run_build(src, packs)
    assert first.built and first.pack_dir == packs / compute_pack_id(src)
    assert (first.pack_dir / MANIFEST_NAME).is_file()
    second = run_build(src, packs)
    assert not second.built and second.pack_dir == first.pack_dir and fake.calls == 1
    assert build.find_pack(src, packs) == first.pack_dir


def test_force_rebuilds_in_place(src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBuilder()
    monkeypatch.setattr(build, "_build_into", fake)
    first = run_build(src, packs)
    again = run_build(src, packs, force=True)
    assert again.built and again.pack_dir == first.pack_dir and fake.calls == 2
    assert [p.name for p in packs.iterdir() if not p.name.startswith(".lock-")] == [
        first.pack_dir.name
    ]


def test_a_changed_input_means_a_new_pack(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "_build_into", FakeBuilder())
    first = run_build(src, packs)
    (src / "vm-image/init").write_text("#!/bin/sh\necho changed\n")
    assert build.find_pack(src, packs) is None
    assert run_build(src, packs).pack_dir != first.pack_dir


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failed_build_leaves_no_pack_and_no_scratch(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    fake = FakeBuilder(fail_with=error)
    monkeypatch.setattr(build, "_build_into", fake)
    with pytest.raises(type(error)):
        run_build(src, packs)
    assert not (packs / compute_pack_id(src)).exists()
    assert not fake.seen_dirs[0].exists()
    assert build.find_pack(src, packs) is None


def test_leftovers_of_a_killed_build_are_removed_by_the_next(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What kill -9 leaves behind: a scratch dir nobody holds a lock for.
    pack_id = compute_pack_id(src)
    for name in (f".tmp-{pack_id}-dead1", ".tmp-0123456789abcdef-dead2"):
        (packs / name / "_work").mkdir(parents=True)
    monkeypatch.setattr(build, "_build_into", FakeBuilder())
    run_build(src, packs)
    assert sorted(p.name for p in packs.iterdir() if not p.name.startswith(".lock-")) == [pack_id]


def test_scratch_dir_of_a_live_build_is_left_alone(packs: Path) -> None:
    live = packs / ".tmp-aaaaaaaaaaaaaaaa-live"
    live.mkdir(parents=True)
    with cache.pack_lock(packs, "aaaaaaaaaaaaaaaa"):
        assert cache.clean_stale_tmp(packs) == []
        assert live.is_dir()
    assert cache.clean_stale_tmp(packs) == [live]


def test_concurrent_builds_of_one_pack_build_it_once(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeBuilder(delay=0.5)
    monkeypatch.setattr(build, "_build_into", fake)
    results: list[build.BuildResult] = []
    threads = [
        threading.Thread(target=lambda: results.append(run_build(src, packs))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls == 1
    assert sorted(r.built for r in results) == [False, True]
    assert cache.verify(results[0].pack_dir).ok


def test_verify_reports_a_flipped_byte_a_missing_and_an_extra_file(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "_build_into", FakeBuilder())
    pack = run_build(src, packs).pack_dir
    assert cache.verify(pack).ok
    blob = bytearray((pack / "initrd.cpio").read_bytes())
    blob[100] ^= 0x01
    (pack / "initrd.cpio").write_bytes(bytes(blob))
    result = cache.verify(pack)
    assert not result.ok and result.mismatched == ["initrd.cpio"]
    (pack / "vmlinuz").unlink()
    (pack / "stray.txt").write_text("?")
    result = cache.verify(pack)
    assert result.missing == ["vmlinuz"] and result.extra == ["stray.txt"]
    assert result.problems() == ["mismatch: initrd.cpio", "missing: vmlinuz", "extra: stray.txt"]


def test_a_corrupt_manifest_is_a_clear_error(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "_build_into", FakeBuilder())
    pack = run_build(src, packs).pack_dir
    (pack / MANIFEST_NAME).write_text('{"pack_id": "x", "kernel": 3')
    with pytest.raises(ManifestError, match=r"corrupt.*piwork pack build"):
        cache.load_manifest(pack)
    (pack / MANIFEST_NAME).write_text('{"pack_id": "x"}')
    with pytest.raises(ManifestError, match="corrupt"):
        cache.load_manifest(pack)
    (pack / MANIFEST_NAME).unlink()
    with pytest.raises(ManifestError, match="does not exist"):
        cache.load_manifest(pack)


def test_a_manifest_in_the_wrong_directory_is_not_trusted(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "_build_into", FakeBuilder())
    pack = run_build(src, packs).pack_dir
    moved = pack.with_name("ffffffffffffffff")
    os.rename(pack, moved)
    with pytest.raises(ManifestError, match="pack_id"):
        cache.load_manifest(moved)


def test_list_shows_complete_and_broken_packs(
    src: Path, packs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "_build_into", FakeBuilder())
    good = run_build(src, packs).pack_dir
    (packs / "deadbeefdeadbeef").mkdir()
    (packs / "deadbeefdeadbeef" / MANIFEST_NAME).write_text("not json")
    infos = {i.pack_id: i for i in cache.list_packs(packs)}
    assert infos[good.name].complete and infos[good.name].versions == {"node": "22.23.3"}
    assert not infos["deadbeefdeadbeef"].complete and "corrupt" in infos["deadbeefdeadbeef"].error
    (good / "initrd.cpio").write_bytes(b"short")
    assert not {i.pack_id: i for i in cache.list_packs(packs)}[good.name].complete
