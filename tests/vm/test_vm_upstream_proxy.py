"""Behind an upstream proxy: every model call and every agent download goes through it.

The test starts two proxies on 127.0.0.1 (tests/helpers/net.py), an HTTP
CONNECT proxy and a SOCKS5 proxy, both wanting a user name and password, and
sets them with ``piwork network proxy set … --password-stdin`` (the password
goes to the keyring). The model is a scripted server behind TLS for
``model.test``, a name this host cannot resolve (only the proxies can, as a
company proxy resolves names the host cannot), signed by a test CA the person
adds with ``piwork network ca add``. So a model call that succeeds went through
the proxy. The agent's downloads are pip's, from PyPI (in this lab pypi.org
resolves to the inspecting gateway at 203.0.113.80, a private address to the
egress proxy): refused, naming the private-address guard, until ``piwork
network allow-private`` allows it; then through each proxy.

Three warm-started tasks: HTTP proxy (refused), HTTP proxy (allowed), SOCKS5.
The proxies must see CONNECT/SOCKS targets and encrypted bytes only: never the
model key, the guest's gateway token or a request path; the guest never sees
the proxy, its password or its address.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
import trustme

from piwork.auth import KeyStore
from piwork.config import Paths
from piwork.models.providers import Provider
from piwork.models.scripted import ChatRequest, Script, ScriptedModelServer, Text, ToolCalls, bash
from piwork.policy import Choice
from piwork.policy.request import PermissionRequest
from piwork.policy.rules import Action
from piwork.runner import Outcome, RunEvent, RunRequest, TaskSession
from tests.helpers.net import HttpConnectProxy, ProxyLog, Socks5Proxy, TlsFront
from tests.helpers.vm import ScriptedAsker, per_prompt, piwork_cli, private_paths

pytestmark = [pytest.mark.vm, pytest.mark.timeout(1500)]

SECRET = "sk-corp-model-key-7c1d0e5f9a8b2c3d4e5f"
PROXY_USER, PROXY_PW = "alice", "proxy-pw-4f2a9c1e7b"
PIP = (
    "python3 -m pip download --no-deps --disable-pip-version-check --retries 1 --timeout 60 "
    "-d /tmp/dl six==1.16.0 2>&1 | grep -v '^ *$' | tail -n 12; ls /tmp/dl 2>&1"
)
ENV = "env | grep -i -e proxy -e _CERT -e CA_ | sort"


@dataclass
class World:
    paths: Paths
    server: ScriptedModelServer
    provider: Provider
    front: TlsFront
    http: HttpConnectProxy
    socks: Socks5Proxy
    asked: list[PermissionRequest] = field(default_factory=list)

    def set_proxy(self, url: str) -> None:
        done = piwork_cli(
            self.paths, "network", "proxy", "set", url, "--password-stdin", input=PROXY_PW + "\n"
        )
        assert done.returncode == 0, done.stderr

    async def task(self, folder: Path, *commands: str) -> tuple[Outcome, list[str], TaskSession]:
        def answer(req: PermissionRequest) -> Choice:
            self.asked.append(req)
            return Choice.DENY if req.action is Action.PRIVATE_NETWORK else Choice.ALLOW_ONCE

        events: list[RunEvent] = []
        req = RunRequest(
            prompt=None, folder=folder, model="corp/scripted", extra_providers=(self.provider,)
        )
        steps = [ToolCalls([bash(c, timeout=300)]) for c in commands]
        self.server.script = cast(Script, per_prompt(*steps, Text("done")))
        async with TaskSession(
            req,
            events.append,
            ScriptedAsker(permission=answer),
            paths=self.paths,  # type: ignore[arg-type]
        ) as session:
            outcome = await asyncio.wait_for(session.run_prompt("download six"), 900)
        last = self.server.chat_requests[-1]
        results = [
            ex.result or ""
            for ex in ChatRequest(body=last.body, headers=last.headers).tool_exchanges()
        ]
        return outcome, results, session


@pytest.fixture(scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    home = tmp_path_factory.mktemp("proxyhome")
    paths = private_paths(home)
    paths.config.mkdir(parents=True)
    paths.settings_file.write_bytes(orjson.dumps({"auth": {"fileBackend": True}}))
    KeyStore(paths=paths).set("corp", SECRET)
    ca = trustme.CA(organization_name="piwork test inspecting CA")
    ca.cert_pem.write_to_path(str(home / "corp-ca.pem"))
    added = piwork_cli(paths, "network", "ca", "add", str(home / "corp-ca.pem"), "--name", "corp")
    assert added.returncode == 0, added.stderr
    for args in (("env", "allow-registries"),):
        assert piwork_cli(paths, *args).returncode == 0
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("model.test").configure_cert(server_ctx)
    hosts = {"model.test": "127.0.0.1"}
    creds = (PROXY_USER, PROXY_PW)
    server = ScriptedModelServer([Text("-")], model_id="scripted", api_key=SECRET)
    async with server:
        front = TlsFront(server.port, server_ctx)
        http = HttpConnectProxy(hosts=hosts, credentials=creds)
        socks = Socks5Proxy(hosts=hosts, credentials=creds)
        async with front, http, socks:
            base = server.as_provider("corp", name="corp model")
            provider = base.model_copy(
                update={
                    "base_url": f"https://model.test:{front.port}/v1",
                    "auth": "bearer",
                    "key_required": True,
                }
            )
            yield World(paths, server, provider, front, http, socks)


def assert_saw_only_targets(log: ProxyLog, front: TlsFront, *, downloads: bool) -> None:
    targets = set(log.targets)
    assert ("model.test", front.port) in targets, log.targets
    if downloads:
        assert {("pypi.org", 443), ("files.pythonhosted.org", 443)} <= targets, log.targets
    for head in log.heads:
        assert head.startswith(("CONNECT ", "SOCKS5 CONNECT ")), head
    for secret in (SECRET, "chat/completions", "piwork:", "six-1.16.0"):
        assert secret.encode() not in log.seen, secret


async def test_model_calls_and_downloads_go_through_the_proxies(
    world: World, tmp_path: Path
) -> None:
    with pytest.raises(OSError):
        socket.getaddrinfo("model.test", 443)  # only the proxies know it
    pypi = {info[4][0] for info in socket.getaddrinfo("pypi.org", 443)}
    print("pypi.org resolves here to", pypi)

    # 1: HTTP CONNECT proxy; PyPI resolves privately here: the guard asks, is denied
    world.set_proxy(f"http://{PROXY_USER}@127.0.0.1:{world.http.port}")
    folder = tmp_path / "one"
    folder.mkdir()
    outcome, res, _ = await world.task(folder, PIP, ENV)
    print("--- refused ---\n" + "\n---\n".join(res))
    assert outcome.ok, outcome
    private = [r for r in world.asked if r.action is Action.PRIVATE_NETWORK]
    assert private and private[0].targets[0].domain == "pypi.org", world.asked
    assert "pypi.org resolves to 203.0.113.80" in private[0].question
    assert "403 Forbidden by piwork: pypi.org resolves to a private address" in res[0], res[0]
    assert "six-1.16.0" not in res[0]
    assert ("pypi.org", 443) not in world.http.log.targets
    # the guest's proxy is piwork's egress proxy; the upstream one, its password and
    # address are the host's alone
    assert "http://piwork:" in res[1] and "10.0.2.101:3128" in res[1]
    for hidden in (PROXY_PW, str(world.http.port), PROXY_USER):
        assert hidden not in res[1], hidden
    assert "NODE_EXTRA_CA_CERTS=/mnt/state/network/ca.pem" in res[1]
    assert_saw_only_targets(world.http.log, world.front, downloads=False)
    assert world.http.log.auth and all(a is not None for a in world.http.log.auth)

    # 2: allowed (as doctor says); the same proxy carries the download
    done = piwork_cli(world.paths, "network", "allow-private", "pypi.org", "files.pythonhosted.org")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "two"
    folder.mkdir()
    outcome, res, session = await world.task(folder, PIP)
    print("--- via HTTP CONNECT ---\n" + res[0])
    assert outcome.ok and "six-1.16.0-py2.py3-none-any.whl" in res[0], res[0]
    assert_saw_only_targets(world.http.log, world.front, downloads=True)
    notes = transcript_egress(session)
    assert notes and all(
        n["detail"].startswith("via http://alice@127.0.0.1") for n in notes if n.get("allowed")
    )

    # 3: SOCKS5 (names resolved by the proxy), password from the keyring too
    world.set_proxy(f"socks5h://{PROXY_USER}@127.0.0.1:{world.socks.port}")
    before = len(world.http.log.targets)
    folder = tmp_path / "three"
    folder.mkdir()
    outcome, res, _ = await world.task(folder, PIP)
    print("--- via SOCKS5 ---\n" + res[0])
    assert outcome.ok and "six-1.16.0-py2.py3-none-any.whl" in res[0], res[0]
    assert_saw_only_targets(world.socks.log, world.front, downloads=True)
    assert set(world.socks.log.auth) == {PROXY_USER}
    assert len(world.http.log.targets) == before  # nothing went the old way
    assert world.server.chat_requests, "the model was called"


def transcript_egress(session: TaskSession) -> list[dict[str, Any]]:
    task = session.task
    assert task is not None
    path = session.store.get(task.id).dir / "transcript.jsonl"
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [r["data"] for r in rows if r.get("kind") == "egress" and "reason" in r.get("data", {})]
