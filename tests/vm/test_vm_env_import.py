"""``piwork env import``: an image archive the test writes itself becomes a task's userland.

The archive is a ``docker save`` file built here from Debian's static busybox and
a marker file (no registry, no daemon). After ``piwork env import IMAGE.tar
FOLDER`` a task on the folder (real QEMU, the real pi, the scripted model) runs
its bash tool on that image instead of the pack's Debian: the marker is there,
Debian's files are not, and what the task writes lands on its own disk over the
image. ``piwork env build`` with ``FROM <image id>`` runs its RUN step in the
image and its ENV reaches the next task (busybox sh: no BASH_ENV, the wrapper
reads the file), as the image's own Env and WorkingDir do (in tasks and in the
build); ``piwork env reset`` gives the next task Debian again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from piwork.config import Paths
from piwork.env import store_for
from tests.helpers.oci_archive import busybox_image
from tests.helpers.vm import bash_task, piwork_cli, private_paths

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2400)]

MARKER = b"imported image marker 7f3a\n"
CHECK = (
    "cat /etc/piwork-marker; ls /etc/debian_version 2>&1 || echo NO-DEBIAN; "
    'echo "shell $0"; echo written > /root/kept.txt && cat /root/kept.txt; pwd'
)


async def _bash(paths: Paths, folder: Path, command: str) -> str:
    return (await bash_task(paths, folder, command))[0]


async def test_an_imported_image_is_the_tasks_userland_until_reset(tmp_path: Path) -> None:
    paths = private_paths(tmp_path / "home")
    folder = tmp_path / "project"
    folder.mkdir()
    # The image's own config: its Env and WorkingDir reach the task's shell (and a build).
    config = {"Env": ["PATH=/bin", "IMG_CONFIG=from-the-image"], "WorkingDir": "/srv/app"}
    archive = busybox_image(tmp_path / "image.tar", MARKER, config=config)

    imported = piwork_cli(paths, "env", "import", str(archive), str(folder))
    assert imported.returncode == 0, imported.stderr
    assert "image i-" in imported.stdout and "the next task runs on image" in imported.stdout
    rec = store_for(paths).folder(folder.resolve())
    assert rec is not None and rec.image is not None
    again = piwork_cli(paths, "env", "import", str(archive), str(folder))
    assert f"image {rec.image} (cached)" in again.stdout

    result = await _bash(paths, folder, 'echo "cfg=$IMG_CONFIG wd=$PIWORK_WORKDIR"; ' + CHECK)
    assert "cfg=from-the-image wd=/srv/app" in result
    assert MARKER.decode().strip() in result
    assert "NO-DEBIAN" in result  # the pack's Debian image is not under it
    assert "shell /bin/sh" in result  # the image's busybox sh: it has no bash
    assert "written" in result and "/mnt/work" in result

    # A build on the image (FROM its id): RUN in the image's own shell, ENV for its tasks.
    (folder / "piwork.Dockerfile").write_text(
        f"FROM {rec.image}\nENV IMG_VAR=from-the-build\n"
        'RUN echo "built on $(cat /etc/piwork-marker) in $(pwd) with $IMG_CONFIG" '
        "> /etc/built.txt && cat /etc/built.txt\n"
    )
    built = piwork_cli(paths, "env", "build", str(folder))
    assert built.returncode == 0, built.stderr
    assert "  | built on imported image marker 7f3a in /srv/app with from-the-image" in built.stdout
    rec2 = store_for(paths).folder(folder.resolve())
    assert rec2 is not None and rec2.image == rec.image and rec2.head is not None
    layer = store_for(paths).layer(rec2.head)
    assert layer is not None and layer.image == rec.image
    result = await _bash(
        paths, folder, 'cat /etc/built.txt; echo "var=$IMG_VAR cfg=$IMG_CONFIG"; ' + CHECK
    )
    assert "built on imported image marker 7f3a" in result
    assert "var=from-the-build cfg=from-the-image" in result and "NO-DEBIAN" in result

    # Back to the pack's Debian workbench.
    assert piwork_cli(paths, "env", "reset", str(folder)).returncode == 0
    result = await _bash(paths, folder, "cat /etc/debian_version; cat /etc/piwork-marker 2>&1")
    assert "No such file" in result and MARKER.decode().strip() not in result
    assert result.split()[0][:2].isdigit()  # e.g. 12.x
