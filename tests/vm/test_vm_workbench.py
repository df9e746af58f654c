"""The workbench: a Debian userland the agent builds, tests and installs in, and keeps.

One scenario, four VM starts, driven through the runner (``TaskSession``, the
API the CLI uses) with the real pi and a scripted model:

1. a new task on a folder: bash, git, gcc, a venv + ``pip install`` of a wheel
   from PyPI, ``npm install -g``, ``apt-get install``, rg, jq, a real sdist's
   own test suite (six, fetched from PyPI by the test) with ``pip install -e .``
   and pytest; then kill -9 QEMU;
2. ``resume``: the restored VM (a warm start: the saved template) reads back
   everything installed, a random blob byte for byte;
3. a new task on the same folder starts from that environment;
4. ``piwork env reset``: the next task starts clean; with PyPI denied by the
   policy, ``pip install`` fails with the proxy's reason and installs nothing.

This lab inspects TLS with its own certificate authority, which the host
trusts (``/usr/local/share/ca-certificates``): piwork gives the guest the
host's extra CAs at every start (``piwork.net``), so nothing here installs
one. The package registries are allowed by the rules ``piwork env
allow-registries`` saves; in this lab they resolve to a TEST-NET address (the
inspecting gateway), which the egress proxy refuses as private until allowed:
the test runs ``piwork network allow-private --registries``, as ``piwork
doctor`` tells a person to. Any network question is denied (none may be asked).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from piwork.config import Paths
from piwork.env import store_for
from piwork.env.registries import registry_rules
from piwork.models.scripted import ChatRequest, Script, ScriptedModelServer, Text, ToolCalls, bash
from piwork.policy import Choice
from piwork.policy.request import PermissionRequest
from piwork.policy.rules import Action, Rule, Scope, Verdict
from piwork.policy.store import PolicyStore
from piwork.runner import Outcome, RunEvent, RunRequest, TaskSession
from tests.helpers.vm import ScriptedAsker, per_prompt, private_paths, scripted_provider

# Four VM starts and real installs under TCG (apt-get update alone parses Debian's
# package lists in an emulated CPU): far past the suite's 600 s default.
pytestmark = [pytest.mark.vm, pytest.mark.timeout(3000)]

STEP_TIMEOUT = 900
PROMPT_TIMEOUT = 1800.0
SIX = "six-1.16.0"
HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello from C"); return 0; }\n'
CHECK_ALL = (
    "tree --version | head -1; "
    "/root/venv/bin/python -c 'import six; print(\"six\", six.__version__)'; "
    'node -e \'console.log("is-number", require("/usr/local/lib/node_modules/is-number")(42))\'; '
    "/root/hello; sha256sum /root/blob; git -C /root/proj log --format=%s"
)


def fetch_sdist(dest: Path) -> None:
    """six's sdist from PyPI (a real project's own tests; not written here), found
    through the simple index (PEP 503), as pip finds it."""
    with urllib.request.urlopen("https://pypi.org/simple/six/", timeout=60) as r:
        index = r.read().decode()
    found = re.search(rf'href="(https://[^"#]+/{SIX}\.tar\.gz)(?:#sha256=([0-9a-f]+))?"', index)
    assert found, "six 1.16.0's sdist is not in PyPI's simple index"
    url, sha = found.groups()
    with urllib.request.urlopen(url, timeout=60) as r:
        data = r.read()
    if sha:
        assert hashlib.sha256(data).hexdigest() == sha
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
    assert (dest / SIX / "test_six.py").is_file()


def asker() -> ScriptedAsker:
    """Tool steps run; any egress question is denied (the registries are rules already)."""

    def answer(req: PermissionRequest) -> Choice:
        return Choice.DENY if req.tool == "network" else Choice.ALLOW_ONCE

    return ScriptedAsker(permission=answer)


def network_questions(a: ScriptedAsker) -> list[str]:
    return [
        str(cast(PermissionRequest, p).targets[0].domain)
        for p in a.permissions
        if cast(PermissionRequest, p).tool == "network"
    ]


class Session:
    """One TaskSession (a VM) and the results of its bash steps as the model saw them."""

    def __init__(self, server: ScriptedModelServer, paths: Paths, folder: Path) -> None:
        self.server, self.paths, self.folder = server, paths, folder
        self.events: list[RunEvent] = []
        self.asker = asker()

    def request(self, task_id: str | None = None) -> RunRequest:
        return RunRequest(
            prompt=None,
            folder=self.folder if task_id is None else None,
            task_id=task_id,
            model="scripted/scripted",
            extra_providers=(scripted_provider(self.server),),  # type: ignore[arg-type]
        )

    def open(self, task_id: str | None = None) -> TaskSession:
        return TaskSession(
            self.request(task_id),
            self.events.append,
            self.asker,  # type: ignore[arg-type]
            paths=self.paths,
        )

    async def run(self, session: TaskSession, *steps: object) -> tuple[Outcome, list[str]]:
        self.server.script = cast(Script, per_prompt(*steps, Text("done")))
        before = len(self.server.chat_requests)
        outcome = await asyncio.wait_for(session.run_prompt("work"), PROMPT_TIMEOUT)
        last = self.server.chat_requests[-1]
        assert len(self.server.chat_requests) > before
        chat = ChatRequest(body=last.body, headers=last.headers)
        return outcome, [ex.result or "" for ex in chat.tool_exchanges()]


def sh(command: str) -> ToolCalls:
    return ToolCalls([bash(command, timeout=STEP_TIMEOUT)])


def piwork_cli(paths: Paths, *args: str) -> str:
    env = {**os.environ, "PIWORK_HOME": str(paths.data.parent)}
    proc = subprocess.run(
        [sys.executable, "-m", "piwork.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def check_installed(result: str, blob_hash: str) -> None:
    assert "tree v2" in result, result
    assert "six 1.16.0" in result, result
    assert "is-number true" in result, result
    assert "hello from C" in result, result
    assert f"{blob_hash}  /root/blob" in result, result
    assert "first commit" in result, result


async def wait_for(pred: Callable[[], bool], timeout: float) -> None:
    for _ in range(int(timeout / 0.2)):
        if pred():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not reached within {timeout:.0f}s")


async def test_installs_persist_across_a_crash_a_resume_and_a_new_task_until_reset(
    tmp_path: Path,
) -> None:
    paths = private_paths(tmp_path / "home")
    policy = PolicyStore(paths.policy_file)
    policy.load()
    policy.add_many(registry_rules(Scope.global_()))  # = `piwork env allow-registries`
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "hello.c").write_text(HELLO_C)
    fetch_sdist(folder)
    # What `piwork doctor` says to do on a network whose registries resolve privately.
    assert "allow private-network pypi.org" in piwork_cli(
        paths, "network", "allow-private", "--registries"
    )
    server = ScriptedModelServer([Text("nothing scripted yet")], model_id="scripted")
    async with server:
        s = Session(server, paths, folder)

        # ---- 1: a new task installs things, then QEMU is killed mid-step
        steps = [
            sh(
                'echo "bash $BASH_VERSION"; mkdir -p /root/proj && cd /root/proj && git init -q '
                "&& git -c user.name=t -c user.email=t@example.com commit -q --allow-empty "
                "-m 'first commit' && git log --format=%s"
            ),
            sh("gcc -O2 -o /root/hello hello.c && /root/hello"),
            sh(
                "python3 -m venv /root/venv && /root/venv/bin/pip install -q "
                "--disable-pip-version-check six==1.16.0 && "
                "/root/venv/bin/python -c 'import six; print(\"six\", six.__version__)'"
            ),
            sh(
                "npm install -g --no-audit --no-fund --loglevel=error is-number@7.0.0 && "
                'node -e \'console.log("is-number", '
                'require("/usr/local/lib/node_modules/is-number")(42))\''
            ),
            sh(
                "apt-get update -q 2>&1 | tail -n 2; "
                "apt-get install -y -q tree 2>&1 | tail -n 1; tree --version"
            ),
            sh("rg -c puts hello.c; echo '{\"a\": [1, 2, 3]}' | jq '.a | length'"),
            sh(
                f"cd {SIX} && . /root/venv/bin/activate && pip install -q "
                "--disable-pip-version-check pytest && pip install -q -e . && "
                "python3 -m pytest -q test_six.py 2>&1 | tail -n 2"
            ),
            sh("head -c 1048576 /dev/urandom > /root/blob && sha256sum /root/blob"),
            sh("sleep 600; echo never"),
        ]
        async with s.open() as first:
            assert first.agent is not None and first.task is not None
            task_id = first.task.id
            run = asyncio.create_task(s.run(first, *steps))
            n_before = len(server.chat_requests)
            # The model is asked for the last step (the sleep) once the others ran.
            # (or the run ends early: pi died, and waiting on would only hide why)
            await wait_for(
                lambda: run.done() or len(server.chat_requests) - n_before >= len(steps), 1500
            )
            assert not run.done(), f"the first task ended early: {run.result()[0]}"
            await asyncio.sleep(3)
            last = server.chat_requests[-1]
            results = [
                ex.result or ""
                for ex in ChatRequest(body=last.body, headers=last.headers).tool_exchanges()
            ]
            proc = first.agent.vm.proc
            assert proc is not None
            os.kill(proc.pid, signal.SIGKILL)
            crashed, _ = await asyncio.wait_for(run, 120)
            assert not crashed.ok
        print("\n--- first task ---\n" + "\n---\n".join(results))
        assert "bash 5.2" in results[0] and "first commit" in results[0]
        assert "hello from C" in results[1]
        assert "six 1.16.0" in results[2]
        assert "is-number true" in results[3]
        assert "tree v2" in results[4], results[4]
        assert results[5].split() == ["1", "3"]
        assert " passed" in results[6] and "failed" not in results[6], results[6]
        blob_hash = results[7].split()[0]
        assert len(blob_hash) == 64
        assert network_questions(s.asker) == []

        # ---- 2: resume after the crash: a restored VM with a non-empty environment
        async with s.open(task_id) as resumed:
            outcome, res = await s.run(resumed, sh(CHECK_ALL))
        assert outcome.ok, outcome
        print("\n--- resumed ---\n" + res[0])
        check_installed(res[0], blob_hash)
        restored = [e for e in s.events if e.data.get("warm") is True]
        assert restored, "the resume did not restore the saved VM"
        shown = piwork_cli(paths, "tasks", "show", task_id)
        assert "MB used of 16 GiB" in shown, shown

        # ---- 3: a new task on the same folder starts from that environment
        async with s.open() as second:
            outcome, res = await s.run(second, sh(CHECK_ALL))
            assert second.task is not None
            second_id = second.task.id
        assert outcome.ok, outcome
        check_installed(res[0], blob_hash)
        env = store_for(paths).task_env(paths.tasks / second_id)
        assert env is not None and env.base is not None
        layer = store_for(paths).layer(env.base)
        assert layer is not None and layer.from_task == task_id

        # ---- 4: reset; PyPI denied: pip fails with the proxy's reason, nothing installed
        assert "next task starts from the clean workbench" in piwork_cli(
            paths, "env", "reset", str(folder)
        )
        policy.load()
        policy.add_many(
            [
                Rule(Action.NETWORK, Verdict.DENY, Scope.global_(), pattern=domain)
                for domain in ("pypi.org", "files.pythonhosted.org")
            ]
        )
        async with s.open() as clean:
            outcome, res = await s.run(
                clean,
                sh(
                    "command -v tree || echo NO-TREE; ls /root/venv /root/blob 2>&1 | head -n 2; "
                    "ls /usr/local/lib/node_modules 2>&1 | head -n 1"
                ),
                sh(
                    # pip's own defaults: it says why each retry failed. The workbench's
                    # own pip, run in a venv of its own (step 1 made a venv with pip
                    # already: ensurepip byte-compiles pip and setuptools, ~100 s
                    # under TCG, for nothing this step checks).
                    "python3 -m venv --without-pip --system-site-packages /root/v2 && "
                    "/root/v2/bin/python -m pip install "
                    "--disable-pip-version-check six==1.16.0 2>&1 | tail -n 4; "
                    "echo pip-rc=${PIPESTATUS[0]}; "
                    "/root/v2/bin/python -c 'import six' 2>&1 | tail -n 1"
                ),
            )
        assert outcome.ok, outcome
        print("\n--- after reset ---\n" + "\n---\n".join(res))
        assert "NO-TREE" in res[0], res[0]
        for gone in ("/root/venv", "/root/blob", "/usr/local/lib/node_modules"):
            assert f"cannot access '{gone}'" in res[0], res[0]
        assert "Forbidden by piwork network policy: pypi.org" in res[1], res[1]
        assert "pip-rc=0" not in res[1]
        assert "ModuleNotFoundError: No module named 'six'" in res[1]
        assert network_questions(s.asker) == []
