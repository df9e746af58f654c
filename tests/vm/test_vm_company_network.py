"""On a company network, as a new user: the agent pip-installs from PyPI and apt-gets a package.

This machine's network is the case (FACTS.md): the package registries resolve
to an inspecting gateway at 203.0.113.80 (a documentation range, "private" to
the egress proxy) and TLS is re-signed by CAs the host trusts in
``/usr/local/share/ca-certificates``. From a fresh ``PIWORK_HOME``, the test
does only what the README tells a new user: ``piwork doctor`` (which names the
registries that resolve that way and the commands to run), those commands, a
model in ``providers.json`` (here a scripted one: no real LLM is reachable), and
``piwork run --yes``. Nothing reaches into piwork: the CAs come from the host,
the private-address allowance from the commands doctor printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from piwork.models.scripted import ChatRequest, ScriptedModelServer, Text, ToolCalls, bash

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1800)]

STEP = 900
PIP = (
    "python3 -m venv /root/v && /root/v/bin/pip install -q --disable-pip-version-check "
    "six==1.16.0 && /root/v/bin/python -c 'import six; print(\"six\", six.__version__)'"
)
APT = (
    "apt-get update -q 2>&1 | tail -n 1; apt-get install -y -q tree 2>&1 | tail -n 1; "
    "tree --version"
)


def cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIWORK_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "piwork.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.fixture
def model() -> Iterator[ScriptedModelServer]:
    server = ScriptedModelServer(
        [
            ToolCalls([bash(PIP, timeout=STEP)]),
            ToolCalls([bash(APT, timeout=STEP)]),
            Text("installed six and tree"),
        ],
        model_id="scripted",
    ).start_in_thread()
    try:
        yield server
    finally:
        server.stop()


def test_pip_and_apt_work_with_what_the_readme_says(
    model: ScriptedModelServer, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    folder = tmp_path / "project"
    folder.mkdir()

    doctor = cli(home, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    registries = checks["package registries"]
    print("doctor:", registries)
    if registries["warning"]:  # this lab's case: the registries resolve to 203.0.113.80
        assert "resolve to" in registries["detail"], registries
        assert registries["fix"].startswith("piwork network allow-private --registries")
        done = cli(home, "network", "allow-private", "--registries")
        assert done.returncode == 0, done.stderr
    extra_cas = checks["extra CAs"]["detail"]
    print("doctor:", extra_cas)
    allowed = cli(home, "env", "allow-registries")
    assert allowed.returncode == 0, allowed.stderr

    # A model: the README's providers.json (an OpenAI-compatible endpoint).
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "providers.json").write_bytes(
        orjson.dumps(
            {
                "providers": {
                    "scripted": {
                        "baseUrl": model.base_url,
                        "models": [
                            {
                                "id": "scripted",
                                "name": "scripted",
                                "contextWindow": 128000,
                                "maxTokens": 4096,
                            }
                        ],
                    }
                }
            }
        )
    )
    run = cli(
        home, "run", "Install six from PyPI in a venv and tree with apt", "--folder", str(folder),
        "--model", "scripted/scripted", "--yes", "--json", timeout=1700,
    )  # fmt: skip
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    print(
        "\n".join(
            f"{e['event']}: {e.get('message') or ''}"
            for e in events
            if e["event"] in ("notice", "error")
        )
    )
    last = ChatRequest(body=model.chat_requests[-1].body, headers=model.chat_requests[-1].headers)
    results = [ex.result or "" for ex in last.tool_exchanges()]
    print(
        "\n--- pip ---\n"
        + results[0]
        + "\n--- apt ---\n"
        + (results[1] if len(results) > 1 else "")
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "six 1.16.0" in results[0], results[0]
    assert "tree v2" in results[1], results[1]
    denied = [e for e in events if e["event"] == "permission" and e.get("decision") == "deny"]
    assert denied == [], denied
