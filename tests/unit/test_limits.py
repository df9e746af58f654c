"""Keys and limits: a task reaches only its own provider and model, every model
response counts toward its limits, and the `--max-*` flags change one limit each.

The runner's real start-up is used up to the point where it would fetch the
runtime pack (stubbed to wait there): the gateway, its routing and the guest's
models.json are exactly what a booted task gets, and the test plays the guest
by calling the gateway with the token from that models.json.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from piwork.cli.main import build_parser
from piwork.cli.run_cmd import _common_request
from piwork.config import get_paths
from piwork.models.providers import ModelSpec, Provider
from piwork.runner import RunRequest, TaskSession
from piwork.tasks import StopReason
from piwork.tasks.model import LimitKind
from piwork.tasks.settings import DEFAULT_LIMITS


@dataclass
class Upstream:
    """A fake OpenAI-compatible provider that records what reached it."""

    tokens_per_answer: int = 400
    seen: list[str] = field(default_factory=list)
    url: str = ""


async def _serve(up: Upstream) -> web.AppRunner:
    async def chat(request: web.Request) -> web.Response:
        up.seen.append(request.headers.get("Authorization", ""))
        body = await request.json()
        return web.json_response(
            {
                "model": body.get("model"),
                "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": up.tokens_per_answer - 10, "completion_tokens": 10},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    up.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    return runner


def _provider(name: str, up: Upstream, models: tuple[str, ...]) -> Provider:
    return Provider(
        name=name,
        api="openai-completions",
        base_url=f"{up.url}/v1",
        auth="bearer",
        models=tuple(ModelSpec(id=m) for m in models),
    )


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path / "home"))
    yield tmp_path / "home"


@dataclass
class Booting:
    """A TaskSession stopped just before the VM: its gateway is live."""

    session: TaskSession
    models_json: dict[str, Any]
    gateway: str
    release: threading.Event


@pytest.fixture
async def booting(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Booting, Upstream, Upstream]]:
    from piwork.auth import KeyStore

    mine, other = Upstream(), Upstream()
    runners = [await _serve(mine), await _serve(other)]
    store = KeyStore(paths=get_paths())
    store.set("mine", "sk-MINE-key", file_backend=True)
    store.set("other", "sk-OTHER-key", file_backend=True)

    release = threading.Event()
    reached = threading.Event()

    def ensure_pack_waits(**_: object) -> Path:
        reached.set()
        release.wait(30)
        raise RuntimeError("the test ends the start-up here")

    monkeypatch.setattr("piwork.run.environment.ensure_pack", ensure_pack_waits)
    req = RunRequest(
        prompt="hi",
        model="mine/cheap",
        extra_providers=(
            _provider("mine", mine, ("cheap", "pricey")),
            _provider("other", other, ("any",)),
        ),
        limit_overrides={"max_tokens": 1000},
    )
    session = TaskSession(req, paths=get_paths())
    start = asyncio.ensure_future(session.start())
    await asyncio.to_thread(reached.wait, 30)
    assert session.task is not None and session.gateway is not None
    models = json.loads((session.task.state_dir / "agent" / "models.json").read_text())
    try:
        yield Booting(session, models, session.gateway.url, release), mine, other
    finally:
        release.set()
        with pytest.raises(RuntimeError, match="ends the start-up"):
            await start
        await session.close(graceful=False)
        for r in runners:
            await r.cleanup()


async def _chat(gateway: str, token: str, provider: str, model: str) -> int:
    async with (
        aiohttp.ClientSession() as client,
        client.post(
            f"{gateway}/p/{provider}/v1/chat/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"model": model, "messages": [{"role": "user", "content": "x"}]},
        ) as resp,
    ):
        await resp.read()
        return resp.status


async def test_the_guest_sees_and_reaches_only_the_tasks_provider_and_model(
    booting: tuple[Booting, Upstream, Upstream],
) -> None:
    b, mine, other = booting
    providers = b.models_json["providers"]
    assert list(providers) == ["mine"]
    assert [m["id"] for m in providers["mine"]["models"]] == ["cheap"]
    token = providers["mine"]["apiKey"]

    assert await _chat(b.gateway, token, "other", "any") == 404
    assert other.seen == []  # the other key was never sent anywhere
    assert await _chat(b.gateway, token, "mine", "pricey") == 403
    assert mine.seen == []
    assert await _chat(b.gateway, token, "mine", "cheap") == 200
    assert mine.seen == ["Bearer sk-MINE-key"]


async def test_usage_seen_by_the_gateway_stops_the_task_at_its_token_limit(
    booting: tuple[Booting, Upstream, Upstream],
) -> None:
    """Calls the guest makes itself (not pi) count too, and past the limit none get out."""
    b, mine, _ = booting
    token = b.models_json["providers"]["mine"]["apiKey"]
    session = b.session
    assert session.task is not None
    assert session.task.record.limits.max_tokens == 1000
    assert session.task.record.limits.max_turns == DEFAULT_LIMITS.max_turns

    assert await _chat(b.gateway, token, "mine", "cheap") == 200
    assert await _chat(b.gateway, token, "mine", "cheap") == 200
    assert session.usage is not None
    await session.usage.flush()  # usage reaches task.json off the event loop
    assert not session.stop_requested  # 800 of 1000 tokens
    assert await _chat(b.gateway, token, "mine", "cheap") == 200
    await session.usage.flush()
    assert session.stop_requested
    assert session.stop_reason is not None
    assert session.stop_reason[0] is StopReason.LIMIT
    assert session.stop_reason[2] is LimitKind.TOKENS
    assert session.store.get(session.task.id).record.usage.total_tokens == 1200

    assert await _chat(b.gateway, token, "mine", "cheap") == 429
    assert len(mine.seen) == 3  # refused at the gateway, never sent upstream


def _request(*argv: str) -> RunRequest:
    return _common_request(build_parser().parse_args(list(argv)))


def test_one_max_flag_keeps_the_other_default_limits(home: Path) -> None:
    req = _request("run", "hi", "--max-tokens", "5000")
    req.prompt, req.model = "hi", "demo"
    task = TaskSession(req, paths=get_paths()).open_task()
    limits = task.record.limits
    assert limits.max_tokens == 5000
    assert limits.max_turns == DEFAULT_LIMITS.max_turns
    assert limits.max_wall_time_seconds == DEFAULT_LIMITS.max_wall_time_seconds


def test_resume_raises_the_limit_that_stopped_the_task_and_keeps_the_rest(home: Path) -> None:
    req = _request("run", "hi", "--max-tokens", "100", "--max-turns", "7")
    req.prompt, req.model = "hi", "demo"
    first = TaskSession(req, paths=get_paths())
    task = first.open_task()
    first.store.close()

    again = _request("resume", task.id, "--max-tokens", "20000", "--max-cost", "1.5")
    again.task_id = task.id
    resumed = TaskSession(again, paths=get_paths())
    limits = resumed.open_task().record.limits
    resumed.store.close()
    assert limits.max_tokens == 20000
    assert limits.max_cost_usd == 1.5
    assert limits.max_turns == 7


@pytest.mark.parametrize("bad", ["0", "-5", "lots"])
def test_max_flags_refuse_nonsense(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "hi", "--max-tokens", bad])
    assert "--max-tokens" in capsys.readouterr().err


async def test_a_task_at_its_limit_is_not_started_again_without_a_higher_one(home: Path) -> None:
    from piwork.runner import RunError
    from piwork.tasks.model import Usage

    req = _request("run", "hi", "--max-tokens", "100")
    req.prompt, req.model = "hi", "demo"
    first = TaskSession(req, paths=get_paths())
    task = first.open_task()
    first.store.add_usage(task.id, Usage(input_tokens=150))
    first.store.close()

    again = _request("resume", task.id)
    again.task_id = task.id
    with pytest.raises(RunError, match="--max-tokens"):
        async with TaskSession(again, paths=get_paths()):
            pass


async def test_raising_the_limit_lets_model_calls_through_again(
    booting: tuple[Booting, Upstream, Upstream],
) -> None:
    b, mine, _ = booting
    token = b.models_json["providers"]["mine"]["apiKey"]
    session = b.session
    assert session.task is not None
    for _ in range(3):
        assert await _chat(b.gateway, token, "mine", "cheap") == 200
    assert session.usage is not None
    await session.usage.flush()  # usage reaches task.json off the event loop
    assert await _chat(b.gateway, token, "mine", "cheap") == 429
    rec = session.store.get(session.task.id).record
    session.store.update(session.task.id, limits=rec.limits.model_copy(update={"max_tokens": 5000}))
    assert await _chat(b.gateway, token, "mine", "cheap") == 200
    assert len(mine.seen) == 4


async def test_usage_already_in_task_json_is_not_counted_twice_while_the_writer_returns(
    booting: tuple[Booting, Upstream, Upstream],
) -> None:
    """The window between task.json holding a delta and the writer clearing it as
    in flight: a model call admitted then must see 800 of 1000 tokens, not 1200."""
    b, mine, _ = booting
    token = b.models_json["providers"]["mine"]["apiKey"]
    session = b.session
    assert session.task is not None
    assert session.usage is not None
    usage = session.usage
    seen_in_window: list[str | None] = []
    real_add = session.store.add_usage

    def add_then_ask(task_id: str, delta: Any) -> Any:
        task = real_add(task_id, delta)
        seen_in_window.append(usage.admits())  # the file already has delta
        return task

    session.store.add_usage = add_then_ask  # type: ignore[method-assign]
    for _ in range(2):
        assert await _chat(b.gateway, token, "mine", "cheap") == 200
        await usage.flush()
    assert seen_in_window == [None, None]
    assert await _chat(b.gateway, token, "mine", "cheap") == 200  # 800 < 1000
    assert len(mine.seen) == 3
