"""The model gateway: pi's provider requests leave the VM here, keys join them here.

The guest reaches this server through the netmux (10.0.2.100:80 on the
guest's lo -> a stream on the ``piwork.net`` port -> 127.0.0.1:<port>,
``piwork.vm.netmux``). pi in the guest has a ``models.json``
whose every ``baseUrl`` is ``http://10.0.2.100/p/<provider><upstream path>``
and whose ``apiKey`` is a placeholder (``piwork.models.providers``). For each
request the gateway:

1. picks the provider from ``/p/<provider>/...`` (unknown: a clear 404);
2. removes every credential the guest sent (``Authorization``, ``x-api-key``,
   ``x-goog-api-key``, ``api-key``, ``?key=``, and any header carrying the
   placeholder) and adds the real key from the host's key store;
3. checks the call against what pi's SDKs send (``piwork.proxy.allowlist``:
   method and path, every body key and tool type, header names and the values
   that switch features on, the query) and sends the *parsed* body upstream,
   re-serialised; provider-side tools (MCP connectors, web search/fetch, code
   execution, URL context) are refused with the reason unless the person
   enabled them, and then asked about like a network destination;
   the response body comes down chunk by chunk, so Server-Sent Events reach pi
   as the provider produces them;
4. turns failures into errors shaped like the provider's own, so pi shows a
   sentence (``errorMessage``) rather than a stack trace; upstream error
   bodies are scrubbed of the key before the guest sees them;
5. logs one line per request (provider, model, status, duration; never
   headers or bodies) and reports token usage read off the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from piwork.models.providers import GUEST_PLACEHOLDER_KEY, ApiType, Provider
from piwork.net.upstream import CA_HINT
from piwork.proxy.allowlist import (
    SERVER_TOOL_FEES_USD,
    CheckedBody,
    check_body,
    check_headers,
    check_query,
)
from piwork.proxy.schema import Refused, ServerToolUse, loads_strict

log = logging.getLogger(__name__)

KeyProvider = Callable[[str], "str | Awaitable[str | None] | None"]
"""Credential name -> key (or None). Sync callables run in a worker thread
(keyring calls may block on D-Bus); async ones are awaited."""

UsageCallback = Callable[["UsageRecord"], None]
ServerToolAsker = Callable[[str, ServerToolUse], Awaitable[bool]]
"""``(provider name, use) -> allowed?``: asked once per kind and destinations per run,
before a call using an enabled provider-side tool goes upstream."""

# RFC 9110 hop-by-hop headers. Request headers go through an allowlist
# (piwork.proxy.allowlist.check_headers): credentials and anything else unknown never pass.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_RESPONSE_DROP = _HOP_BY_HOP | {"set-cookie", "content-length"}

_MODEL_ID = r"[A-Za-z0-9._:@+-]{1,200}"
"""A model id in a path: no ``%``, ``/`` or ``..`` an upstream might decode into another path."""


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: re.Pattern[str]
    inference: bool
    """A model call: it must name a model (body or path), and an allowed one."""


def _ep(method: str, path: str, *, inference: bool = False) -> Endpoint:
    return Endpoint(method, re.compile(path), inference)


_MODEL_LISTING = (_ep("GET", r"/models"), _ep("GET", rf"/models/{_MODEL_ID}"))
ENDPOINTS: dict[ApiType, tuple[Endpoint, ...]] = {
    # What pi's providers call (pi-ai dist/providers/*.js), relative to the
    # provider's base URL path. Anthropic's SDK adds /v1 itself; the others' base
    # URLs carry their version (/v1, /api/v1, /v1beta). Everything else the key
    # could reach (batches, files, vector stores, fine-tuning, deletes) is refused.
    "anthropic-messages": (
        _ep("POST", r"/v1/messages", inference=True),
        _ep("GET", r"/v1/models"),
        _ep("GET", rf"/v1/models/{_MODEL_ID}"),
    ),
    "openai-completions": (_ep("POST", r"/chat/completions", inference=True), *_MODEL_LISTING),
    "openai-responses": (_ep("POST", r"/responses", inference=True), *_MODEL_LISTING),
    "google-generative-ai": (
        _ep(
            "POST",
            r"/models/[A-Za-z0-9._@+-]{1,200}:(?:streamGenerateContent|generateContent)",
            inference=True,
        ),
        *_MODEL_LISTING,
    ),
}


def endpoint_for(api: ApiType, method: str, path: str) -> Endpoint | None:
    """The allowed endpoint ``method path`` (relative to the base URL's path) is, if any."""
    for ep in ENDPOINTS[api]:
        if ep.method == method and ep.path.fullmatch(path):
            return ep
    return None


_MODEL_IN_PATH = re.compile(r"/models/([^/:?]+)")
_ERROR_BODY_LIMIT = 64 * 1024
_SSE_LINE_LIMIT = 1024 * 1024
_JSON_USAGE_LIMIT = 4 * 1024 * 1024
_BODY_LIMIT = 64 * 1024 * 1024
"""A model call's body is read whole (up to this), parsed and checked before
anything goes upstream."""
_PARSE_INLINE_LIMIT = 256 * 1024
"""Bodies larger than this are parsed and checked off the event loop."""
_BYTES_PER_TOKEN = 4


# --- usage -------------------------------------------------------------------


@dataclass(frozen=True)
class UsageRecord:
    """Tokens one model request used, as the provider reported them.

    ``input_tokens`` excludes cache reads/writes (OpenAI and Google count
    cached tokens inside the prompt; they are moved out here so the fields
    add up the same way for every provider).
    """

    task_id: str | None
    provider: str
    model: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float | None
    """Only when piwork knows the model's prices (custom providers);
    pi's own ``message_end`` usage carries cost for its built-in models."""
    status: int
    duration_s: float
    estimated: bool = False
    """The response carried no usage the gateway could read (a stream cut
    short, a request shaped to omit it): the counts are estimated from the
    bytes each way (about 4 bytes a token), so nothing goes uncounted."""
    server_tool_calls: Mapping[str, int] = field(default_factory=dict)
    """Provider-side tool calls (only where the person enabled them), by kind;
    their fees (``SERVER_TOOL_FEES_USD``) are in ``cost_usd``."""


@dataclass
class UsageTotals:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, rec: UsageRecord) -> None:
        self.requests += 1
        self.input_tokens += rec.input_tokens
        self.output_tokens += rec.output_tokens
        self.cache_read_tokens += rec.cache_read_tokens
        self.cache_write_tokens += rec.cache_write_tokens
        self.cost_usd += rec.cost_usd or 0.0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class _UsageReader:
    """Reads token counts off a response while it streams past, cheaply.

    Only SSE ``data:`` lines mentioning usage are parsed; everything else is
    a substring test. Last report wins (providers send cumulative counts).
    """

    api: ApiType
    sse: bool
    watch_tools: bool = False
    """The call carries provider-side tools: read every event for their calls."""
    found: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    server_calls: dict[str, int] = field(default_factory=dict)
    _buf: bytearray = field(default_factory=bytearray)
    _overflow: bool = False

    def feed(self, chunk: bytes) -> None:
        if not self.sse:
            if not self._overflow:
                self._buf += chunk
                if len(self._buf) > _JSON_USAGE_LIMIT:
                    self._overflow = True
                    self._buf.clear()
            return
        self._buf += chunk
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > _SSE_LINE_LIMIT:  # absurd line: give up on it
                    self._buf.clear()
                return
            line = bytes(self._buf[:nl]).strip()
            del self._buf[: nl + 1]
            if line.startswith(b"data:") and (b"sage" in line or self.watch_tools):
                self._parse(line[5:].strip())  # usage / usageMetadata / tool calls

    def finish(self) -> None:
        if not self.sse and not self._overflow and self._buf:
            self._parse(bytes(self._buf))
        self._buf.clear()

    def _parse(self, payload: bytes) -> None:
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if isinstance(obj, dict):
            self._event(obj)

    def _event(self, obj: dict[str, Any]) -> None:
        if self.watch_tools:
            self._server_tool_event(obj)
        if self.api == "anthropic-messages":
            usage: Any = None
            if obj.get("type") == "message_start" and isinstance(obj.get("message"), dict):
                usage = obj["message"].get("usage")
            elif obj.get("type") in ("message_delta", None) or "usage" in obj:
                usage = obj.get("usage")
            if isinstance(usage, dict):
                self.found = True
                if "input_tokens" in usage:
                    self.input_tokens = _int(usage["input_tokens"])
                if "output_tokens" in usage:
                    self.output_tokens = _int(usage["output_tokens"])
                if "cache_read_input_tokens" in usage:
                    self.cache_read = _int(usage["cache_read_input_tokens"])
                if "cache_creation_input_tokens" in usage:
                    self.cache_write = _int(usage["cache_creation_input_tokens"])
        elif self.api == "google-generative-ai":
            meta = obj.get("usageMetadata")
            if isinstance(meta, dict):
                self.found = True
                cached = _int(meta.get("cachedContentTokenCount"))
                self.cache_read = cached
                self.input_tokens = max(_int(meta.get("promptTokenCount")) - cached, 0)
                self.output_tokens = _int(meta.get("candidatesTokenCount")) + _int(
                    meta.get("thoughtsTokenCount")
                )
        elif self.api == "openai-responses":
            response = obj.get("response") if "response" in obj else obj
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                self.found = True
                details = usage.get("input_tokens_details")
                cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
                self.cache_read = cached
                self.input_tokens = max(_int(usage.get("input_tokens")) - cached, 0)
                self.output_tokens = _int(usage.get("output_tokens"))
        else:  # openai-completions (OpenAI, OpenRouter, Ollama, vLLM, ...)
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self.found = True
                details = usage.get("prompt_tokens_details")
                cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
                self.cache_read = cached
                self.input_tokens = max(_int(usage.get("prompt_tokens")) - cached, 0)
                self.output_tokens = _int(usage.get("completion_tokens"))

    def _server_tool_event(self, obj: dict[str, Any]) -> None:
        """Provider-side tool calls, as each API reports them."""
        if self.api == "anthropic-messages":
            message = obj.get("message")
            usage = obj.get("usage") or (
                message.get("usage") if isinstance(message, dict) else None
            )
            used = usage.get("server_tool_use") if isinstance(usage, dict) else None
            if isinstance(used, dict):  # cumulative: last report wins
                for field_name, count in used.items():
                    kind = field_name.removesuffix("_requests")
                    if kind in SERVER_TOOL_FEES_USD and _int(count) > 0:
                        self.server_calls[kind] = _int(count)
        elif self.api == "openai-responses":
            item = obj.get("item")
            if obj.get("type") == "response.output_item.done" and isinstance(item, dict):
                kind = _RESPONSES_TOOL_ITEMS.get(str(item.get("type")))
                if kind is not None:
                    self.server_calls[kind] = self.server_calls.get(kind, 0) + 1
        elif self.api == "google-generative-ai":
            for cand in obj.get("candidates") or ():
                if isinstance(cand, dict) and cand.get("groundingMetadata"):
                    self.server_calls["google_search"] = 1  # billed per prompt
                if isinstance(cand, dict) and cand.get("urlContextMetadata"):
                    self.server_calls["url_context"] = 1


_RESPONSES_TOOL_ITEMS = {
    "web_search_call": "web_search",
    "mcp_call": "mcp",
    "code_interpreter_call": "code_execution",
}


# --- errors the agent can read ----------------------------------------------

ErrorKind = Literal[
    "authentication_error",
    "permission_error",
    "not_found_error",
    "rate_limit_error",
    "invalid_request_error",
    "api_error",
    "overloaded_error",
    "timeout_error",
]

_GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


_ERROR_KINDS: dict[int, ErrorKind] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def _error_kind(status: int) -> ErrorKind:
    return _ERROR_KINDS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(api: ApiType | None, status: int, message: str) -> dict[str, Any]:
    """An error in the provider's own shape, so pi's SDK surfaces ``message``."""
    kind = _error_kind(status)
    if api == "anthropic-messages":
        # The Anthropic SDK shows a top-level "message" verbatim, else the JSON.
        return {"type": "error", "error": {"type": kind, "message": message}, "message": message}
    if api == "google-generative-ai":
        return {
            "error": {
                "code": status,
                "message": message,
                "status": _GOOGLE_STATUS.get(status, "UNKNOWN"),
            }
        }
    return {"error": {"message": message, "type": kind, "code": kind}}


def _json_error(
    api: ApiType | None, status: int, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    out = {"X-Piwork-Gateway": "error"}
    out.update(headers or {})
    return web.Response(
        status=status,
        body=orjson.dumps(error_body(api, status, message)),
        content_type="application/json",
        headers=out,
    )


def _provider_message(body: bytes) -> str:
    """The human part of an upstream error body, whatever its dialect."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, list) and data and isinstance(data[0], dict):  # Google sometimes
        data = data[0]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return text[:500] if text else "(empty response body)"


def _redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    return text


# --- the server ----------------------------------------------------------------


class ModelGateway:
    """One task's model gateway: an aiohttp server on loopback.

    ``async with ModelGateway(providers, keys) as gw:`` then point the guest
    relay at ``gw.port``. ``guest_token``, when set, must be the ``apiKey`` the
    guest sends (render it as the placeholder): other local processes then
    cannot spend the person's keys through this port.
    """

    def __init__(
        self,
        providers: Iterable[Provider] | Mapping[str, Provider],
        key_provider: KeyProvider,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        task_id: str | None = None,
        on_usage: UsageCallback | None = None,
        guest_token: str | None = None,
        placeholder: str = GUEST_PLACEHOLDER_KEY,
        connect_timeout: float = 30.0,
        read_timeout: float = 600.0,
        connector: Callable[[], aiohttp.BaseConnector] | None = None,
        before_forward: Callable[[], Awaitable[None]] | None = None,
        allowed_models: Iterable[str] | None = None,
        admit: Callable[[], str | None] | None = None,
        max_concurrent: int = 8,
        server_tools: Iterable[str] = (),
        ask_server_tool: ServerToolAsker | None = None,
    ) -> None:
        items = providers.values() if isinstance(providers, Mapping) else providers
        self._providers: dict[str, Provider] = {p.name: p for p in items}
        self._key_provider = key_provider
        self._host = host
        self._want_port = port
        self._port: int | None = None
        self.task_id = task_id
        self._on_usage = on_usage
        self._guest_token = guest_token
        self._placeholders = tuple(t for t in (placeholder, guest_token) if t)
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=connect_timeout,
            sock_connect=connect_timeout,
            sock_read=read_timeout,
        )
        # How calls leave: the upstream proxy and the trusted CAs (piwork.net.upstream
        # .gateway_connector); None: direct, the system's CAs.
        self._connector = connector
        # Awaited before each model call is forwarded (the runner checkpoints the
        # folder there: the guest cannot act on a reply it has not received).
        self._before_forward = before_forward
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.totals = UsageTotals()
        self._allowed_models = frozenset(allowed_models) if allowed_models is not None else None
        self._admit = admit
        self._max_concurrent = max_concurrent
        """Bounds how far past a limit parallel calls can go (each is admitted
        before any of them reports usage), and the host's work per guest."""
        self._inflight = 0
        """Asked before every request: ``None`` lets it through, a message refuses it
        (429). The runner answers from the task's limits, read afresh each time."""
        self._server_tools = frozenset(server_tools)
        """Provider-side tool kinds the person enabled (``gateway.serverTools``)."""
        self._ask_server_tool = ask_server_tool
        self._server_tool_answers: dict[tuple[str, tuple[str, ...]], asyncio.Future[bool]] = {}

    # --- lifecycle -------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("ModelGateway is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        self._session = aiohttp.ClientSession(
            timeout=self._timeout,
            auto_decompress=False,  # relay bytes exactly as received
            trust_env=False,  # no ambient proxies or ~/.netrc credentials (piwork.net decides)
            connector=self._connector() if self._connector is not None else None,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._want_port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            await self._session.close()
            raise
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self._port = int(sockets[0].getsockname()[1]) if sockets else self._want_port
        log.info("model gateway listening on %s:%s (task %s)", self._host, self._port, self.task_id)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        session, self._session = self._session, None
        if runner is not None:
            await runner.cleanup()
        if session is not None:
            await session.close()

    async def __aenter__(self) -> ModelGateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- request handling --------------------------------------------------------

    async def _get_key(self, name: str) -> str | None:
        if inspect.iscoroutinefunction(self._key_provider):
            result = await self._key_provider(name)
        else:
            result = await asyncio.to_thread(self._key_provider, name)
            if inspect.isawaitable(result):
                result = await result
        return result if isinstance(result, str) and result else None

    def _guest_credential(self, request: web.Request) -> str | None:
        h = request.headers
        auth = h.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        for name in ("x-api-key", "x-goog-api-key", "api-key"):
            if name in h:
                return h[name].strip()
        return request.rel_url.query.get("key")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        raw_path = request.rel_url.raw_path
        parts = raw_path.split("/", 3)  # ["", "p", name, rest]
        if len(parts) < 3 or parts[1] != "p" or not parts[2]:
            return _json_error(
                None,
                404,
                "piwork gateway: expected /p/<provider>/<api path>; "
                f"configured providers: {', '.join(sorted(self._providers)) or 'none'}",
            )
        name = unquote(parts[2])
        provider = self._providers.get(name)
        if provider is None:
            return _json_error(
                None,
                404,
                f"piwork gateway: unknown provider {name!r}; configured providers: "
                f"{', '.join(sorted(self._providers)) or 'none'} (see `piwork models`)",
            )
        api = provider.api
        rest = "/" + (parts[3] if len(parts) > 3 else "")
        segments = [unquote(s).lower() for s in rest.split("/")]
        if any(s in (".", "..") or "/" in s or "\\" in s for s in segments):
            return _json_error(api, 400, "piwork gateway: path traversal is not allowed")
        prefix = provider.upstream_path_prefix
        if prefix and not (rest == prefix or rest.startswith(prefix + "/")):
            return _json_error(
                api, 404, f"piwork gateway: {name} serves only paths under {prefix}/, not {rest}"
            )
        if self._guest_token is not None:
            presented = self._guest_credential(request) or ""
            if not hmac.compare_digest(presented.encode(), self._guest_token.encode()):
                return _json_error(api, 401, "piwork gateway: this request lacks the task's token")
        endpoint = endpoint_for(api, request.method, rest[len(prefix) :])
        if endpoint is None:
            allowed = ", ".join(f"{e.method} {prefix}{e.path.pattern}" for e in ENDPOINTS[api])
            return _json_error(
                api,
                403,
                f"piwork gateway: {request.method} {rest} is not a model call; a task's key "
                f"reaches only the inference and model-listing endpoints of {name} ({allowed})",
            )
        refusal = self._admit() if self._admit is not None else None
        if refusal is not None:
            return _json_error(api, 429, f"piwork gateway: {refusal}")

        if self._inflight >= self._max_concurrent:
            return _json_error(
                api,
                429,
                f"piwork gateway: at most {self._max_concurrent} model requests at a time "
                "per task; retry when one finishes",
            )
        self._inflight += 1
        try:
            return await self._forward(request, provider, name, rest, started, endpoint)
        finally:
            self._inflight -= 1

    async def _forward(
        self,
        request: web.Request,
        provider: Provider,
        name: str,
        rest: str,
        started: float,
        endpoint: Endpoint,
    ) -> web.StreamResponse:
        api = provider.api
        try:
            query = check_query(
                api, request.rel_url.raw_query_string, listing=not endpoint.inference
            )
            guest_headers = check_headers(api, request.headers.items(), enabled=self._server_tools)
            checked = await self._read_body(request, provider, endpoint)
        except Refused as refusal:
            log.info("gateway refused task=%s provider=%s: %s", self.task_id, name, refusal)
            return _json_error(api, refusal.status, f"piwork gateway: {refusal}")
        model = self._model_from_path(rest)
        if checked is not None and model is None:
            value = checked.body.get("model")
            model = value if isinstance(value, str) else None
        if endpoint.inference and model is None:
            return _json_error(
                api,
                403,
                f"piwork gateway: a model call must name its model{self._allowed_hint(name)}",
            )
        if self._allowed_models is not None and model is not None:  # noqa: SIM102
            if model not in self._allowed_models:
                return _json_error(
                    api,
                    403,
                    f"piwork gateway: this task may only use "
                    f"{', '.join(sorted(self._allowed_models))} of {name}, not {model}",
                )
        if checked is not None and checked.uses:
            refusal_text = await self._server_tools_allowed(name, checked.uses)
            if refusal_text is not None:
                return _json_error(api, 403, f"piwork gateway: {refusal_text}")
        try:
            key = await self._get_key(provider.credential_name)
        except Exception as exc:  # key store trouble must not become a traceback
            log.warning("key lookup for %s failed: %s", provider.credential_name, exc)
            return _json_error(
                api,
                401,
                f"piwork could not read the API key for {provider.credential_name!r} "
                f"on the host: {exc}",
            )
        if key is None and provider.key_required:
            return _json_error(
                api,
                401,
                f"No API key for provider {provider.name!r} is stored on the host. "
                f"Add one with `piwork auth set {provider.credential_name}` and retry.",
            )

        if self._before_forward is not None and request.method == "POST":
            await self._before_forward()
        url = URL(provider.upstream_origin + rest + query, encoded=True)
        headers = self._upstream_headers(guest_headers, provider, key)
        body = orjson.dumps(checked.body) if checked is not None else None
        sent = len(body) if body is not None else 0
        if body is not None:
            headers["Content-Type"] = "application/json"
        uses = checked.uses if checked is not None else ()
        assert self._session is not None
        status = 0
        try:
            async with self._session.request(
                request.method,
                url,
                headers=headers,
                data=body,
                allow_redirects=False,
            ) as upstream:
                status = upstream.status
                if status >= 400:
                    return await self._upstream_error(upstream, provider, model, key)
                return await self._stream_back(
                    request, upstream, provider, model, started, sent, uses
                )
        except TimeoutError:
            status = 504
            return _json_error(
                api,
                504,
                f"{provider.name} did not answer in time (via piwork gateway, "
                f"{provider.upstream_origin}); try again later.",
            )
        except aiohttp.ClientConnectorCertificateError as exc:
            status = 502
            return _json_error(
                api,
                502,
                f"piwork gateway: the certificate of {provider.upstream_origin} is not trusted "
                f"here ({exc.certificate_error}); {CA_HINT}",
            )
        except aiohttp.ClientConnectorError as exc:
            status = 502
            return _json_error(
                api,
                502,
                f"piwork gateway could not reach {provider.name} at "
                f"{provider.upstream_origin}: {exc.os_error.strerror or exc.os_error}",
            )
        except aiohttp.ClientError as exc:
            status = 502
            return _json_error(
                api,
                502,
                f"piwork gateway: request to {provider.name} failed: "
                f"{_redact(str(exc) or type(exc).__name__, [key or ''])}",
            )
        finally:
            log.info(
                "model request task=%s provider=%s model=%s %s status=%s %.2fs",
                self.task_id,
                provider.name,
                model or "?",
                request.method,
                status or "-",
                time.monotonic() - started,
            )

    async def _read_body(
        self, request: web.Request, provider: Provider, endpoint: Endpoint
    ) -> CheckedBody | None:
        """The call's body, read whole, parsed and checked (``None`` for a body-less GET)."""
        buf = bytearray()
        if request.body_exists:
            async for chunk in request.content.iter_any():
                buf += chunk
                if len(buf) > _BODY_LIMIT:
                    raise Refused("", "request body too large", status=413)
        if not endpoint.inference:
            if buf:
                raise Refused("", "a model listing carries no body", status=400)
            return None
        raw = bytes(buf)

        def parse_and_check() -> CheckedBody:
            return check_body(
                provider.api, loads_strict(raw), enabled=self._server_tools, compat=provider.compat
            )

        if len(raw) > _PARSE_INLINE_LIMIT:
            checked = await asyncio.to_thread(parse_and_check)
        else:
            checked = parse_and_check()
        if checked.stripped:
            log.info("gateway removed %s from a call (task %s)", checked.stripped, self.task_id)
        return checked

    def _allowed_hint(self, name: str) -> str:
        if self._allowed_models is None:
            return ""
        return f" ({', '.join(sorted(self._allowed_models))} of {name})"

    async def _server_tools_allowed(
        self, provider: str, uses: tuple[ServerToolUse, ...]
    ) -> str | None:
        """``None`` when every provider-side tool in the call is allowed, else why not.

        Each kind and set of destinations is asked once per run (concurrent calls
        wait for the same answer); with no one to ask, the answer is no.
        """
        for use in uses:
            key = (use.kind, use.destinations)
            fut = self._server_tool_answers.get(key)
            if fut is None:
                fut = asyncio.get_running_loop().create_future()
                self._server_tool_answers[key] = fut
                try:
                    ok = (
                        await self._ask_server_tool(provider, use)
                        if self._ask_server_tool is not None
                        else False
                    )
                except Exception as exc:
                    log.warning("asking about %s failed: %s", use.kind, exc)
                    del self._server_tool_answers[key]
                    ok = False
                except BaseException:
                    del self._server_tool_answers[key]
                    fut.cancel()
                    raise
                if not fut.done():
                    fut.set_result(bool(ok))
            if not await asyncio.shield(fut):
                where = ", ".join(use.destinations) or "any site"
                return f"{use.where}: the provider-side {use.kind} tool ({where}) was not allowed"
        return None

    def _upstream_headers(
        self, guest: CIMultiDict[str], provider: Provider, key: str | None
    ) -> CIMultiDict[str]:
        """The allowlisted guest headers, then the host's own, then the key."""
        out: CIMultiDict[str] = CIMultiDict()
        for hname, value in guest.items():
            if any(p in value for p in self._placeholders):
                continue  # a placeholder in a header we don't know: drop it
            out.add(hname, value)
        out["Accept-Encoding"] = "identity"  # keep the stream readable for usage
        for hname, value in provider.upstream_headers.items():
            out[hname] = value
        if key is not None:
            if provider.auth == "bearer":
                out["Authorization"] = f"Bearer {key}"
            elif provider.auth == "x-api-key":
                out["x-api-key"] = key
            elif provider.auth == "x-goog-api-key":
                out["x-goog-api-key"] = key
        return out

    @staticmethod
    def _model_from_path(rest: str) -> str | None:
        m = _MODEL_IN_PATH.search(rest)
        return unquote(m.group(1)) if m else None

    def _response_headers(self, upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
        named = {t.strip().lower() for t in upstream.headers.get("Connection", "").split(",")}
        out: CIMultiDict[str] = CIMultiDict()
        for hname, value in upstream.headers.items():
            lname = hname.lower()
            if lname in _RESPONSE_DROP or lname in named:
                continue
            out.add(hname, value)
        return out

    async def _stream_back(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        provider: Provider,
        model: str | None,
        started: float,
        sent_bytes: int = 0,
        uses: tuple[ServerToolUse, ...] = (),
    ) -> web.StreamResponse:
        received = [0]
        ctype = upstream.headers.get("Content-Type", "")
        reader = _UsageReader(
            api=provider.api, sse="text/event-stream" in ctype, watch_tools=bool(uses)
        )
        try:
            return await self._relay_response(request, upstream, provider, reader, received)
        finally:
            # Every answered request is counted, even one cut short or shaped
            # to carry no usage: a task's limits must see all the spending.
            reader.finish()
            if uses and not reader.server_calls:
                # The answer did not say (or not readably): one call per kind it
                # could have used, so an enabled tool is never free.
                reader.server_calls = {u.kind: 1 for u in uses}
            if reader.found:
                self._report_usage(provider, model, reader, upstream.status, started)
            else:
                est = _UsageReader(api=provider.api, sse=False)
                est.input_tokens = -(-sent_bytes // _BYTES_PER_TOKEN)
                est.output_tokens = -(-received[0] // _BYTES_PER_TOKEN)
                est.server_calls = reader.server_calls
                self._report_usage(provider, model, est, upstream.status, started, estimated=True)

    async def _relay_response(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        provider: Provider,
        reader: _UsageReader,
        received: list[int],
    ) -> web.StreamResponse:
        out = web.StreamResponse(
            status=upstream.status, reason=upstream.reason, headers=self._response_headers(upstream)
        )
        if upstream.content_length is not None and not upstream.headers.get("Transfer-Encoding"):
            out.content_length = upstream.content_length
        await out.prepare(request)
        # From here on the status line is gone: failures can only be told by
        # cutting the guest's connection, which pi reports as a broken stream.
        chunks = upstream.content.iter_any()
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("upstream %s broke off mid-response: %s", provider.name, exc)
                if request.transport is not None:
                    request.transport.close()
                return out
            received[0] += len(chunk)
            reader.feed(chunk)
            try:
                await out.write(chunk)
            except (ConnectionError, aiohttp.ClientConnectionError):
                log.info("guest went away mid-response (provider=%s)", provider.name)
                return out
        with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionError):
            await out.write_eof()
        return out

    def _report_usage(
        self,
        provider: Provider,
        model: str | None,
        reader: _UsageReader,
        status: int,
        started: float,
        *,
        estimated: bool = False,
    ) -> None:
        cost: float | None = None
        fees = sum(SERVER_TOOL_FEES_USD[k] * n for k, n in reader.server_calls.items())
        spec = provider.find_model(model) if model else None
        if spec is not None and spec.cost is not None:
            c = spec.cost
            cost = (
                reader.input_tokens * c.input
                + reader.output_tokens * c.output
                + reader.cache_read * c.cache_read
                + reader.cache_write * c.cache_write
            ) / 1_000_000
        if fees:
            cost = (cost or 0.0) + fees
        rec = UsageRecord(
            task_id=self.task_id,
            provider=provider.name,
            model=model,
            input_tokens=reader.input_tokens,
            output_tokens=reader.output_tokens,
            cache_read_tokens=reader.cache_read,
            cache_write_tokens=reader.cache_write,
            cost_usd=cost,
            status=status,
            duration_s=time.monotonic() - started,
            estimated=estimated,
            server_tool_calls=dict(reader.server_calls),
        )
        self.totals.add(rec)
        log.info(
            "usage task=%s provider=%s model=%s in=%d out=%d cache_read=%d cache_write=%d",
            self.task_id,
            provider.name,
            model or "?",
            rec.input_tokens,
            rec.output_tokens,
            rec.cache_read_tokens,
            rec.cache_write_tokens,
        )
        if self._on_usage is not None:
            try:
                self._on_usage(rec)
            except Exception:
                log.exception("usage callback failed")

    async def _upstream_error(
        self,
        upstream: aiohttp.ClientResponse,
        provider: Provider,
        model: str | None,
        key: str | None,
    ) -> web.Response:
        body = bytearray()
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async for chunk in upstream.content.iter_any():
                body += chunk
                if len(body) >= _ERROR_BODY_LIMIT:
                    break
        status = upstream.status
        said = _redact(_provider_message(bytes(body)), [key or "", *self._placeholders])
        name = provider.name
        if status in (401, 403):
            message = (
                f"{name} rejected the API key piwork holds for it (HTTP {status}): {said} "
                f"- set a valid key on the host with `piwork auth set {provider.credential_name}`."
            )
        elif status == 429:
            retry = upstream.headers.get("Retry-After")
            message = f"{name} rate limit or quota exceeded (HTTP 429): {said}" + (
                f" - retry after {retry} s." if retry else ""
            )
        elif status == 404:
            message = f"{name} says not found (HTTP 404) for model {model or '?'}: {said}"
        else:
            message = f"{name} returned HTTP {status}: {said}"
        keep = {
            h: upstream.headers[h]
            for h in ("Retry-After", "retry-after-ms", "x-should-retry")
            if h in upstream.headers
        }
        log.info("upstream error provider=%s model=%s status=%s", name, model or "?", status)
        return _json_error(provider.api, status, message, keep)


__all__ = [
    "KeyProvider",
    "ModelGateway",
    "ServerToolAsker",
    "UsageCallback",
    "UsageRecord",
    "UsageTotals",
    "error_body",
]
