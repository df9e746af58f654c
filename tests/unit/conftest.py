"""Fixtures shared by the unit tests (helpers live in tests/helpers)."""

from __future__ import annotations

import asyncio
import stat
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from piwork.config import get_paths
from piwork.models.providers import (
    ModelCost,
    ModelSpec,
    Provider,
    demo_provider,
)
from piwork.pack import ensure_pack, load_manifest
from piwork.pack.cpio import read_newc
from piwork.proxy.gateway import ModelGateway, UsageRecord
from piwork.tasks.store import TaskStore
from tests.helpers.checkpoints import Run
from tests.helpers.egress import Origin
from tests.helpers.gateway import (
    FakeUpstream,
    World,
    _dict_keys,
    _serve,
    anthropic_app,
    google_app,
    openai_app,
)


@pytest.fixture(scope="module")
def guest_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guest's file tree: the pack's initramfs with its disk at /opt/piwork."""
    pack_dir = ensure_pack()
    manifest = load_manifest(pack_dir)
    assert manifest.rootfs is not None
    root = tmp_path_factory.mktemp("guest")
    with (pack_dir / manifest.initrd).open("rb") as fh:
        for m in read_newc(fh):
            dest = root / m.name
            kind = stat.S_IFMT(m.mode)
            if kind == stat.S_IFDIR:
                dest.mkdir(parents=True, exist_ok=True)
            elif kind == stat.S_IFLNK:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(m.data.decode())
            elif kind == stat.S_IFREG:
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(m.data)
                dest.chmod(stat.S_IMODE(m.mode))
            # device nodes: not needed to run node
    subprocess.run(
        ["fsck.erofs", f"--extract={root / 'opt' / 'piwork'}", str(pack_dir / manifest.rootfs)],
        check=True,
        capture_output=True,
    )
    return root


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    f = tmp_path / "work"
    f.mkdir()
    return f


@pytest.fixture
def make_run(folder: Path) -> Iterator[Any]:
    store = TaskStore(get_paths().tasks)

    def make() -> Run:
        return Run(store.create("checkpoint test", folder), folder)

    yield make
    store.close()


@pytest.fixture
async def world() -> AsyncIterator[World]:
    fakes = [FakeUpstream() for _ in range(4)]
    runners = []
    for fake, make in zip(fakes, (openai_app, anthropic_app, google_app, openai_app), strict=True):
        runner, fake.url = await _serve(await make(fake))
        runners.append(runner)
    oa, an, go, demo = fakes
    providers = [
        Provider(
            name="openai-test",
            api="openai-completions",
            base_url=f"{oa.url}/v1",
            auth="bearer",
            models=(
                ModelSpec(id="gpt-test", cost=ModelCost(input=2.0, output=8.0, cacheRead=0.5)),
            ),
        ),
        Provider(
            name="openai-resp-test",
            api="openai-responses",
            base_url=f"{oa.url}/v1",
            auth="bearer",
            key_name="openai-test",
            models=(ModelSpec(id="gpt-resp"),),
        ),
        Provider(
            name="anthropic-test",
            api="anthropic-messages",
            base_url=an.url,
            auth="x-api-key",
            models=(ModelSpec(id="claude-test"),),
        ),
        Provider(
            name="google-test",
            api="google-generative-ai",
            base_url=f"{go.url}/v1beta",
            auth="x-goog-api-key",
            models=(ModelSpec(id="gemini-test"),),
        ),
        demo_provider(f"{demo.url}/v1"),
    ]
    usage: list[UsageRecord] = []
    gateway = ModelGateway(
        providers, _dict_keys, task_id="t-1", on_usage=usage.append, read_timeout=1.0
    )
    async with gateway, aiohttp.ClientSession() as client:
        yield World(oa, an, go, demo, providers, gateway, usage, client)
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    requests: list[tuple[str, str, dict[str, str]]] = []
    echo_connections: list[int] = []
    echo_received = bytearray()

    async def hello(request: web.Request) -> web.Response:
        requests.append((request.method, request.path_qs, dict(request.headers)))
        body = await request.read()
        return web.Response(text=f"hello from origin; got {len(body)} bytes")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hello)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        echo_connections.append(1)
        while data := await reader.read(1024):
            echo_received.extend(data)
            writer.write(data.upper())
            await writer.drain()
        writer.close()

    echo_server = await asyncio.start_server(echo, "127.0.0.1", 0)
    echo_port = echo_server.sockets[0].getsockname()[1]
    yield Origin(http_port, echo_port, requests, echo_connections, echo_received)
    echo_server.close()
    await runner.cleanup()
