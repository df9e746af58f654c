"""``piwork env build``: a project's piwork.Dockerfile built inside a piwork VM, then used.

One scenario, three VM starts (real QEMU, the real pi; the scripted model is the
only test double, for the LLM):

1. ``piwork env build FOLDER`` (the CLI, no terminal) on a file with ENV, WORKDIR,
   COPY of a file, of a folder and of a wildcard, and RUN steps whose output streams to the
   terminal; a RUN step that reaches a host the policy does not allow is denied
   (no one to ask) and the proxy's reason reaches the step;
2. a task on the folder (``TaskSession``, the runner ``piwork run`` uses): the
   agent's bash sees the COPY'd files, the ENV (PATH too), what RUN wrote, and
   WORKDIR where a shell outside the task's folders starts;
3. the same build again says "cached" and boots no VM (no QEMU on PATH: it
   could not); a build whose RUN fails gives its file:line and exit code, and
   leaves no layer (the folder's head is unchanged).

A second test: a build whose RUN reaches a new host asks (an asker double
answers, as the terminal would) and, allowed, gets through the egress proxy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import cast

import pytest

from piwork.config import Paths
from piwork.env import store_for
from piwork.policy import Choice
from tests.helpers.vm import ScriptedAsker, bash_task, piwork_cli, private_paths

pytestmark = [pytest.mark.vm, pytest.mark.timeout(2400)]

DOCKERFILE = """\
# The project's environment (a Dockerfile subset).
FROM piwork
ENV GREETING="hello from ENV" \\
    TOOL_HOME=/opt/tool
WORKDIR /opt/tool
COPY data.txt ./
COPY scripts/ bin/
RUN echo "ran as $(id -u) in $PWD: $GREETING" > ran.txt && \\
    ./bin/tool.sh >> ran.txt && cat ran.txt
RUN curl -sS --max-time 120 http://example.org/ 2>&1; echo "curl exit $?"
ENV PATH=$TOOL_HOME/bin:$PATH
COPY conf/*.cfg conf/
"""
FAILING = """\
FROM piwork
RUN echo "first step ran" > /root/first.txt
RUN echo "about to fail" && exit 7
RUN echo never
"""
DATA = "data copied from the build folder\n"


def env_build(
    paths: Paths, *args: str, path_env: str | None = None
) -> subprocess.CompletedProcess[str]:
    return piwork_cli(paths, "env", "build", *args, timeout=1500, path_env=path_env)


def layers(paths: Paths) -> set[str]:
    return {p.stem for p in (paths.data / "envs" / "layers").glob("*.qcow2")}


async def test_env_build_then_a_task_uses_it_cached_rebuild_and_failing_step(
    tmp_path: Path,
) -> None:
    paths = private_paths(tmp_path / "home")
    folder = tmp_path / "project"
    (folder / "scripts").mkdir(parents=True)
    (folder / "data.txt").write_text(DATA)
    (folder / "scripts" / "tool.sh").write_text('#!/bin/sh\necho "tool ok from $0"\n')
    os.chmod(folder / "scripts" / "tool.sh", 0o755)
    (folder / "conf").mkdir()
    for name in ("a.cfg", "b.cfg", "not-copied.txt"):
        (folder / "conf" / name).write_text(f"config {name}\n")
    (folder / "piwork.Dockerfile").write_text(DOCKERFILE)
    (folder / "fail.Dockerfile").write_text(FAILING)

    # ---- 1: the build, in a VM
    built = env_build(paths, str(folder))
    assert built.returncode == 0, built.stderr[-3000:]
    assert "  | ran as 0 in /opt/tool: hello from ENV" in built.stdout
    assert "  | tool ok from ./bin/tool.sh" in built.stdout
    assert "copied data.txt to /opt/tool/" in built.stdout
    # No one to ask: the host is denied, said in the terminal, and the step sees why.
    assert "no terminal to ask on" in built.stderr
    assert "network: example.org:80 denied (no one to ask" in built.stderr
    assert "network access to example.org:80 is not allowed" in built.stdout
    assert "piwork.Dockerfile:8" in built.stderr  # each step is shown with its line
    store = store_for(paths)
    rec = store.folder(folder.resolve())
    assert rec is not None and rec.head is not None and rec.head.startswith("b-")
    layer = store.layer(rec.head)
    assert layer is not None and layer.build is not None
    assert oct(layer.path.stat().st_mode & 0o777) == "0o400"
    assert f"starts from layer {rec.head}" in built.stdout

    # ---- 2: a task on the folder starts from the layer
    check = (
        'cat /opt/tool/data.txt; echo "GREETING=$GREETING"; cat /opt/tool/ran.txt; '
        'tool.sh; echo "cwd $PWD"; ls /opt/tool/conf; cat /opt/tool/conf/*; '
        "cd / && env -u PIWORK_BUILD_ENV bash -c 'echo \"outside $PWD\"'"
    )
    result, task_id = await bash_task(paths, folder, check, timeout=900)
    assert DATA.strip() in result
    assert "GREETING=hello from ENV" in result
    assert "ran as 0 in /opt/tool: hello from ENV" in result
    assert "tool ok from /opt/tool/bin/tool.sh" in result  # PATH from ENV
    assert "cwd /mnt/work" in result  # the agent starts in the task's folder
    assert "outside /opt/tool" in result  # WORKDIR: where a shell elsewhere starts
    # COPY conf/*.cfg conf/: the matching files, into the folder, the others not.
    assert "config a.cfg\nconfig b.cfg" in result and "not-copied" not in result
    env = store.task_env(paths.tasks / task_id)
    assert env is not None and env.base == rec.head

    # ---- 3: the same build is cached (and could not boot: no QEMU on PATH)
    no_qemu = tmp_path / "bin"
    no_qemu.mkdir()
    for tool in ("sh", "env"):
        found = shutil.which(tool)
        assert found is not None
        os.symlink(found, no_qemu / tool)
    before = layers(paths)
    again = env_build(paths, str(folder), path_env=str(no_qemu))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"cached: layer {rec.head}" in again.stderr
    assert "starting a build VM" not in again.stderr
    assert layers(paths) == before

    # A failing RUN: its line and exit code, no layer, the folder's head unchanged.
    failed = env_build(paths, str(folder), "-f", "fail.Dockerfile")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "fail.Dockerfile:3: RUN failed with exit code 7; no layer was made" in failed.stderr
    assert "  | about to fail" in failed.stdout
    assert "never" not in failed.stdout
    assert layers(paths) == before
    rec2 = store.folder(folder.resolve())
    assert rec2 is not None and rec2.head == rec.head
    assert not list((paths.data / "envs" / "builds").iterdir())  # the build's disk is gone


async def test_a_build_asks_before_a_new_host_and_reaches_it_when_allowed(tmp_path: Path) -> None:
    """The question a task's terminal would show (here a scripted asker answers it): once
    per host, and an allowed host is reached through the egress proxy. In this lab Debian's
    mirror resolves to a TEST-NET interceptor, which the proxy counts as private: allowed
    for this test only, as test_vm_workbench does."""
    from piwork.env.build import build_env
    from piwork.policy.request import PermissionRequest

    paths = private_paths(tmp_path / "home")
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "piwork.Dockerfile").write_text(
        "FROM piwork\n"
        "RUN curl -sS -o /dev/null -w 'mirror said %{http_code}\\n' "
        "http://deb.debian.org/debian/dists/bookworm/Release\n"
    )
    asker = ScriptedAsker(permission=Choice.ALLOW_ONCE)
    out: list[str] = []
    said: list[str] = []
    result = await build_env(
        folder.resolve(),
        folder / "piwork.Dockerfile",
        paths=paths,
        out=out.append,
        say=said.append,
        asker=asker,  # type: ignore[arg-type]
        egress_allow_private_networks=True,
    )
    print("\n".join(said + out))
    asked = [cast(PermissionRequest, p) for p in asker.permissions]
    assert [p.targets[0].domain for p in asked] == ["deb.debian.org"]
    assert "network: deb.debian.org:80 allowed (by you)" in said
    assert "mirror said 200" in out
    assert not result.cached and result.layer.startswith("b-")
