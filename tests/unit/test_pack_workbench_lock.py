"""Two pack builds that need the same workbench image build it once (piwork.pack.workbench).

The image is minutes of mmdebstrap; two builds at once (the suite's two workers: the
shared pack and test_pack_build's own) must not both make it, nor remove the one the
other just finished. The build itself is replaced here by a slow stand-in that makes
the cache entry; the real build runs in tests/unit/test_pack_build.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import orjson
import pytest

from piwork.config import repo_root
from piwork.pack import workbench


def test_two_builds_of_one_spec_at_once_make_the_image_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[str] = []

    def slow_build(
        spec: workbench.WorkbenchSpec,
        key: str,
        cache: Path,
        log: workbench.Log,
        arch: object = None,
    ) -> workbench.WorkbenchImage:
        builds.append(key)
        time.sleep(0.5)  # the other thread asks meanwhile
        final = cache / key
        final.mkdir(parents=True)
        (final / workbench.IMAGE_NAME).write_bytes(b"image")
        meta = {"packages": {"bash": "5"}, "tree_bytes": 1, "seconds": 0.5}
        (final / workbench.PACKAGES_NAME).write_bytes(orjson.dumps(meta))
        found = workbench.cached_image(final)
        assert found is not None
        return found

    monkeypatch.setattr(workbench, "build_image", slow_build)
    spec_file = repo_root() / workbench.SPEC_FILE
    results: list[workbench.WorkbenchImage] = []

    def ensure() -> None:
        results.append(workbench.ensure_image(spec_file, tmp_path, lambda _msg: None))

    threads = [threading.Thread(target=ensure) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # a deadlock would be stopped by pytest-timeout
    assert len(builds) == 1
    assert len(results) == 2 and results[0].image == results[1].image
    assert results[0].image.read_bytes() == b"image"
