"""The model providers piwork knows, and the `models.json` the guest's pi gets.

Keys never enter the VM. pi inside the guest talks to every provider through
the host's model gateway (``piwork.proxy.gateway``) with a placeholder key;
the gateway swaps the placeholder for the real credential on the way out.
So a provider here is *routing* data: where its API lives upstream, which of
pi's wire protocols (`api`) it speaks, and how the credential is presented.

Two kinds of providers:

* built-ins pi already has a model catalog for (``anthropic``, ``openai``,
  ``openrouter``, ``google``). The guest config only *overrides* their
  ``baseUrl`` and ``apiKey``, so pi keeps its own model list, context windows
  and prices;
* custom OpenAI-compatible endpoints the person configures in
  ``<config dir>/providers.json`` (Ollama, vLLM, LM Studio, ...), plus the
  offline demo provider ``piwork-demo`` whose upstream is only known at run
  time. pi knows nothing about these, so their models are spelled out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from piwork.config import get_paths
from piwork.errors import PersonError
from piwork.jsonstore import DamagedFile, JsonFile
from piwork.vm.command import GATEWAY_GUEST_ADDR

ApiType = Literal[
    "openai-completions", "openai-responses", "anthropic-messages", "google-generative-ai"
]
"""pi's wire protocols (``api`` in models.json) that the gateway can carry."""

AuthStyle = Literal["bearer", "x-api-key", "x-goog-api-key", "none"]
"""How the real credential is presented upstream.

``bearer``: ``Authorization: Bearer <key>`` (OpenAI, OpenRouter, most
OpenAI-compatible servers); ``x-api-key``: Anthropic; ``x-goog-api-key``:
Google AI Studio; ``none``: nothing is added (local servers)."""

GUEST_PLACEHOLDER_KEY = "piwork-gateway-placeholder"
"""The ``apiKey`` pi in the guest sends. Meaningless outside the gateway."""

DEFAULT_GATEWAY_BASE = f"http://{GATEWAY_GUEST_ADDR[0]}"  # defined once: piwork.vm.command
"""The gateway as the guest sees it: a netmux address on the guest's lo (guest-protocol.md)."""

DEMO_PROVIDER = "piwork-demo"
PROVIDERS_FILE_NAME = "providers.json"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class ProviderConfigError(ValueError, PersonError):
    """``providers.json`` is unreadable or invalid; the message says where."""


class ModelCost(BaseModel):
    """US dollars per million tokens, as pi's models.json spells it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = 0.0
    output: float = 0.0
    cache_read: float = Field(default=0.0, alias="cacheRead")
    cache_write: float = Field(default=0.0, alias="cacheWrite")

    def to_pi(self) -> dict[str, float]:
        return {
            "input": self.input,
            "output": self.output,
            "cacheRead": self.cache_read,
            "cacheWrite": self.cache_write,
        }


class ModelSpec(BaseModel):
    """One model of a custom provider (pi's ``ModelDefinition``, the useful part)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    id: str = Field(min_length=1)
    name: str | None = None
    reasoning: bool | None = None
    input: tuple[Literal["text", "image"], ...] | None = None
    context_window: int | None = Field(default=None, alias="contextWindow", gt=0)
    max_tokens: int | None = Field(default=None, alias="maxTokens", gt=0)
    cost: ModelCost | None = None
    compat: dict[str, Any] | None = None

    def to_pi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning is not None:
            out["reasoning"] = self.reasoning
        if self.input is not None:
            out["input"] = list(self.input)
        if self.context_window is not None:
            out["contextWindow"] = self.context_window
        if self.max_tokens is not None:
            out["maxTokens"] = self.max_tokens
        if self.cost is not None:
            out["cost"] = self.cost.to_pi()
        if self.compat is not None:
            out["compat"] = dict(self.compat)
        return out


def _check_upstream_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base URL must be http(s)://host[:port][/path], got {value!r}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(
            f"base URL must not carry a query, fragment or credentials: {value!r} "
            "(store keys with `piwork auth set`)"
        )
    return value.rstrip("/")


class Provider(BaseModel):
    """Where one provider's API lives and how the gateway authenticates to it."""

    model_config = ConfigDict(frozen=True)

    name: str
    api: ApiType
    base_url: str
    """Upstream base, exactly what pi would use as ``baseUrl`` without piwork."""
    auth: AuthStyle
    key_required: bool = True
    """Refuse requests (with a readable message) when no key is stored."""
    key_name: str | None = None
    """Key store entry holding the credential; defaults to ``name``."""
    pi_builtin: bool = False
    """pi has a catalog for this provider: the guest config only overrides it."""
    default_model: str | None = None
    known_models: tuple[str, ...] = ()
    """For display (``piwork models``) on built-ins; never rendered to the guest."""
    models: tuple[ModelSpec, ...] = ()
    """Rendered into the guest config (required for custom providers)."""
    compat: dict[str, Any] | None = None
    upstream_headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers the gateway adds on the way out. Host-side only: they
    may hold secrets, so they are never rendered into the guest config."""
    alt_apis: dict[ApiType, str] = Field(default_factory=dict)
    """Other pi APIs some of this built-in provider's models speak, with that API's
    upstream base URL (pi 1.x: OpenRouter's Claude models speak anthropic-messages at
    https://openrouter.ai/api). Such a model is routed through :meth:`route`."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError(
                f"provider name {value!r} must be lowercase letters, digits, '.', '_' or '-'"
            )
        return value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        return _check_upstream_url(value)

    @property
    def credential_name(self) -> str:
        return self.key_name or self.name

    @property
    def upstream_origin(self) -> str:
        """``scheme://host[:port]`` of the upstream."""
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def upstream_path_prefix(self) -> str:
        """The upstream base URL's path ('' or '/v1', '/api/v1', ...)."""
        return urlsplit(self.base_url).path.rstrip("/")

    def gateway_base_url(self, gateway_base: str = DEFAULT_GATEWAY_BASE) -> str:
        """The ``baseUrl`` pi in the guest uses for this provider."""
        return f"{gateway_base.rstrip('/')}/p/{self.name}{self.upstream_path_prefix}"

    def model_ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.models) or self.known_models

    def route(self, api: str) -> Provider | None:
        """The provider as the gateway sees it for a model speaking ``api``: this one for
        its own API, a sibling (``<name>-<api>``, same key and auth) for one of
        :attr:`alt_apis`, None for an API piwork does not carry for it."""
        if api == self.api:
            return self
        for alt, base in self.alt_apis.items():
            if alt == api:
                return Provider(
                    name=f"{self.name}-{alt}",
                    api=alt,
                    base_url=base,
                    auth=self.auth,
                    key_required=self.key_required,
                    key_name=self.credential_name,
                    upstream_headers=self.upstream_headers,
                )
        return None

    def find_model(self, model_id: str) -> ModelSpec | None:
        return next((m for m in self.models if m.id == model_id), None)


BUILTIN_PROVIDERS: tuple[Provider, ...] = (
    Provider(
        name="anthropic",
        api="anthropic-messages",
        base_url="https://api.anthropic.com",
        auth="x-api-key",
        pi_builtin=True,
        # pi's own default (core/model-resolver.js defaultModelPerProvider); the list is what
        # piwork shows without a pack, which lists pi's whole catalog once built.
        default_model="claude-opus-5-5",
        known_models=("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5"),
    ),
    Provider(
        # pi's built-in "openai" speaks the Responses API.
        name="openai",
        api="openai-responses",
        base_url="https://api.openai.com/v1",
        auth="bearer",
        pi_builtin=True,
        default_model="gpt-6.2-sol",
        known_models=("gpt-6.2-sol", "gpt-6.2-astra", "gpt-5.5"),
    ),
    Provider(
        # OpenAI through Chat Completions, for people who prefer it; same key.
        name="openai-chat",
        api="openai-completions",
        base_url="https://api.openai.com/v1",
        auth="bearer",
        key_name="openai",
        default_model="gpt-4.1",
        models=(
            ModelSpec(
                id="gpt-4.1",
                name="GPT-4.1 (chat completions)",
                contextWindow=1047576,
                maxTokens=32768,
                input=("text", "image"),
                cost=ModelCost(input=2.0, output=8.0, cacheRead=0.5),
            ),
            ModelSpec(
                id="gpt-4.1-mini",
                name="GPT-4.1 mini (chat completions)",
                contextWindow=1047576,
                maxTokens=32768,
                input=("text", "image"),
                cost=ModelCost(input=0.4, output=1.6, cacheRead=0.1),
            ),
        ),
    ),
    Provider(
        name="openrouter",
        api="openai-completions",
        base_url="https://openrouter.ai/api/v1",
        auth="bearer",
        pi_builtin=True,
        default_model="moonshotai/kimi-k2.7-code",
        known_models=(
            "moonshotai/kimi-k2.7-code",
            "openai/gpt-6.2-sol",
            "anthropic/claude-sonnet-5.5",
        ),
        # pi 1.x sends OpenRouter's Claude models through its Anthropic-compatible API.
        alt_apis={"anthropic-messages": "https://openrouter.ai/api"},
    ),
    Provider(
        name="google",
        api="google-generative-ai",
        base_url="https://generativelanguage.googleapis.com/v1beta",
        auth="x-goog-api-key",
        pi_builtin=True,
        default_model="gemini-4-argon",
        known_models=("gemini-4-argon", "gemini-3.8-flash", "gemini-2.5-pro"),
    ),
)


def demo_provider(base_url: str, models: Iterable[ModelSpec] | None = None) -> Provider:
    """The offline demo provider (``piwork.models.demo``), upstream known at run time.

    It needs no key; the gateway still fronts it so the guest sees one path
    for every model.
    """
    specs = (
        tuple(models)
        if models is not None
        else (
            ModelSpec(
                id="demo",
                name="piwork demo model (offline, scripted — not a real LLM)",
                contextWindow=128_000,
                maxTokens=4096,
                reasoning=False,
                input=("text",),
            ),
        )
    )
    return Provider(
        name=DEMO_PROVIDER,
        api="openai-completions",
        base_url=base_url,
        auth="none",
        key_required=False,
        default_model=specs[0].id if specs else None,
        models=specs,
    )


# --- providers.json ---------------------------------------------------------


class CustomProviderConfig(BaseModel):
    """One entry of ``providers.json``: an OpenAI-compatible (or other) endpoint."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    base_url: str = Field(alias="baseUrl")
    api: ApiType = "openai-completions"
    auth: AuthStyle = "bearer"
    key_required: bool = Field(default=False, alias="keyRequired")
    key_name: str | None = Field(default=None, alias="keyName")
    default_model: str | None = Field(default=None, alias="defaultModel")
    models: tuple[ModelSpec, ...] = Field(min_length=1)
    compat: dict[str, Any] | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent upstream by the gateway only (not visible to the guest)."""

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        return _check_upstream_url(value)


class ProvidersFile(BaseModel):
    """``<config dir>/providers.json``."""

    model_config = ConfigDict(extra="forbid")

    providers: dict[str, CustomProviderConfig] = Field(default_factory=dict)


def providers_file() -> Path:
    return get_paths().config / PROVIDERS_FILE_NAME


class ProvidersDamaged(DamagedFile, ProviderConfigError):
    """providers.json cannot be used (see :mod:`piwork.jsonstore`)."""


def providers_store(path: Path | None = None) -> JsonFile[list[Provider]]:
    """``providers.json``: read strictly, written durably with its last good copy."""
    return JsonFile(
        path or providers_file(),
        _parse_custom_providers,
        what="providers file",
        restore_command="piwork restore providers",
        fresh="remove it and add the providers again with `piwork models add`",
        error=ProvidersDamaged,
    )


def load_custom_providers(path: Path | None = None) -> list[Provider]:
    """Read the person's custom endpoints; a missing file means none."""
    return providers_store(path).read() or []


def _parse_custom_providers(raw: bytes) -> list[Provider]:
    try:
        parsed = ProvidersFile.model_validate(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise ProviderConfigError(f"not valid JSON: {exc}") from exc
    except ValidationError as exc:
        raise ProviderConfigError(f"invalid: {exc}") from exc
    builtin_names = {p.name for p in BUILTIN_PROVIDERS} | {DEMO_PROVIDER}
    out: list[Provider] = []
    for name, cfg in parsed.providers.items():
        if name in builtin_names:
            raise ProviderConfigError(
                f"provider name {name!r} is reserved for piwork's built-in "
                "provider; choose another name"
            )
        try:
            out.append(
                Provider(
                    name=name,
                    api=cfg.api,
                    base_url=cfg.base_url,
                    auth=cfg.auth,
                    key_required=cfg.key_required,
                    key_name=cfg.key_name,
                    default_model=cfg.default_model or cfg.models[0].id,
                    models=cfg.models,
                    compat=cfg.compat,
                    upstream_headers=dict(cfg.headers),
                )
            )
        except ValidationError as exc:
            raise ProviderConfigError(f"provider {name!r} is invalid: {exc}") from exc
    return out


def load_providers(
    path: Path | None = None, *, extra: Iterable[Provider] = (), pi_models: bool = False
) -> dict[str, Provider]:
    """Built-ins, then ``providers.json``, then ``extra`` (e.g. the demo provider).

    ``pi_models``: the built-ins list every chat model of pi's own catalog, as the pack
    built from this source has it (``piwork.pack.picatalog``), when that pack is built;
    otherwise the few models piwork names itself."""
    catalog: dict[str, Provider] = {p.name: p for p in BUILTIN_PROVIDERS}
    if pi_models:
        listed = pi_catalog_models()
        for name, provider in list(catalog.items()):
            ids = listed.get(name) if listed is not None else None
            if ids:
                # piwork's default and picks first, then the rest of pi's catalog.
                first = [m for m in (provider.default_model, *provider.known_models) if m in ids]
                ordered = tuple(dict.fromkeys([*first, *ids]))
                catalog[name] = provider.model_copy(update={"known_models": ordered})
    for provider in (*load_custom_providers(path), *extra):
        catalog[provider.name] = provider
    return catalog


def pi_catalog_models() -> dict[str, list[str]] | None:
    """Each provider's chat model ids in pi's catalog, from the pack built from this
    source (None when it is not built: nothing is built for a listing)."""
    from piwork.pack import find_pack, picatalog

    pack_dir = find_pack()
    found = picatalog.load(pack_dir) if pack_dir is not None else None
    if found is None:
        return None
    return {name: [m.id for m in models] for name, models in found.providers.items()}


def parse_model_ref(ref: str, providers: Mapping[str, Provider]) -> tuple[Provider, str]:
    """``PROVIDER/MODEL`` (or just ``PROVIDER``) -> the provider and a model id.

    Only the first ``/`` separates: ``openrouter/anthropic/claude-sonnet-4.5``
    is model ``anthropic/claude-sonnet-4.5`` on ``openrouter``.
    """
    name, _, model = ref.partition("/")
    provider = providers.get(name)
    if provider is None:
        known = ", ".join(sorted(providers)) or "none"
        raise ValueError(
            f"unknown provider {name!r} in --model {ref!r}; configured providers: {known} "
            "(see `piwork models`)"
        )
    if not model:
        if provider.default_model is None:
            raise ValueError(f"provider {name!r} has no default model; use --model {name}/MODEL")
        model = provider.default_model
    return provider, model


# --- the guest's models.json ------------------------------------------------


def _as_list(providers: Iterable[Provider] | Mapping[str, Provider]) -> list[Provider]:
    if isinstance(providers, Mapping):
        return list(providers.values())
    return list(providers)


def render_guest_models_json(
    providers: Iterable[Provider] | Mapping[str, Provider],
    gateway_base: str = DEFAULT_GATEWAY_BASE,
    *,
    placeholder: str = GUEST_PLACEHOLDER_KEY,
) -> dict[str, Any]:
    """pi's ``models.json`` for the guest: every provider behind the gateway.

    Takes no keys at all, so none can leak into the result: ``apiKey`` is the
    placeholder, and host-only ``upstream_headers`` are left out.
    """
    rendered: dict[str, Any] = {}
    for provider in _as_list(providers):
        entry: dict[str, Any] = {
            "baseUrl": provider.gateway_base_url(gateway_base),
            "api": provider.api,
            "apiKey": placeholder,
        }
        if provider.compat:
            entry["compat"] = dict(provider.compat)
        if provider.models:
            entry["models"] = [m.to_pi() for m in provider.models]
        elif not provider.pi_builtin:
            # pi rejects a custom provider without models; skip it rather
            # than make the whole file unloadable.
            continue
        rendered[provider.name] = entry
    return {"providers": rendered}
