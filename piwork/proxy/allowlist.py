"""What a model call may carry through the gateway, per API type: body, headers, query.

Security review 2, finding 2: the gateway checked method and path but forwarded
the body as sent, so provider-side tools rode along with the person's key:
Anthropic ``mcp_servers`` and ``web_fetch``, OpenAI Responses ``{"type":"mcp"}``
and ``web_search``, Gemini ``url_context``. The provider then fetched the
attacker's URL with the folder's data, with no network question and no cost
counted. The same holds for anything else that makes the *provider* reach out
or read state the task never made: image and file URLs (the provider
downloads them), stored responses, prompts, conversations, threads and cached
contents (another task's data under the same key), other models (fallbacks).

So each body is parsed and checked against what pi's own SDKs send (pi 0.73.1
and 1.6: ``@mariozechner/pi-ai`` / ``@earendil-works/pi-ai``), every key and
tool type named; the checked value is what goes upstream, re-serialised.
Provider-side tools are refused with a reason unless the person enabled their
kind (``"gateway": {"serverTools": [...]}`` in settings.json); then the gateway
asks about them like a network destination and counts their fees.

Headers: a name allowlist (others are dropped), and values checked where
they switch features on (``anthropic-beta``) or change what the request
means (method overrides, ``Content-Encoding``: refused).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from multidict import CIMultiDict

from piwork.models.providers import ApiType
from piwork.proxy.schema import (
    ANY,
    BOOL,
    INT,
    NULL,
    NUM,
    STR,
    Arr,
    Obj,
    Refused,
    ServerToolUse,
    Spec,
    Tagged,
    Walk,
    check,
    either,
    enum,
)

# --- provider-side tools --------------------------------------------------------------

SERVER_TOOL_KINDS: dict[str, str] = {
    "web_search": "the provider searches the web for the model",
    "web_fetch": "the provider fetches web pages the model names",
    "code_execution": "the provider runs code in its own sandbox (billed by the hour)",
    "mcp": "the provider connects to an MCP server URL",
    "google_search": "Google searches the web for the model (grounding)",
    "url_context": "Google fetches the URLs the prompt names",
}
"""The kinds a person can enable (``gateway.serverTools``); every other
provider-side tool is refused whatever the settings say."""

SERVER_TOOL_FEES_USD: dict[str, float] = {
    # Published per-call prices (mid 2026), rounded up; tokens the results bring
    # are in the provider's usage and counted as usual.
    "web_search": 0.01,  # Anthropic and OpenAI: $10 per 1,000 searches
    "web_fetch": 0.0,  # tokens only
    "code_execution": 0.05,  # a container hour, counted per call
    "mcp": 0.0,  # tokens only
    "google_search": 0.035,  # Gemini grounding: $35 per 1,000 prompts
    "url_context": 0.0,  # tokens only
}

_ENABLE_HINT = (
    "piwork refuses provider-side tools: the provider would reach out with what the "
    "request holds, outside the egress policy and its questions, and bill it"
)


def _refuse_kind(kind: str, where: str) -> Refused:
    return Refused(
        where,
        f"{kind} is a provider-side tool ({SERVER_TOOL_KINDS[kind]}); {_ENABLE_HINT}. "
        f'The person can enable it with "gateway": {{"serverTools": ["{kind}"]}} in '
        "settings.json; each use then asks like a network destination",
    )


def _never(where: str, what: str, why: str) -> Refused:
    return Refused(where, f"{what}: {why}; piwork never forwards it")


def _use(kind: str, where: str, walk: Walk, destinations: Iterable[str] = ()) -> None:
    if kind not in walk.enabled:
        raise _refuse_kind(kind, where)
    walk.uses.append(ServerToolUse(kind, where, tuple(destinations)))


def _host_of(url: Any, where: str) -> str:
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme != "https" or not parts.hostname:
        raise Refused(where, "an MCP server must be an https:// URL with a host name")
    return parts.hostname.lower().rstrip(".")


def _domains(value: Any, where: str) -> tuple[str, ...]:
    """A provider tool's ``allowed_domains``: the only sites it may reach, or () for any."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(d, str) for d in value):
        raise Refused(where, "allowed_domains must be a non-empty list of domain names")
    out = []
    for d in value:
        host = d.strip().lower().removeprefix("*.").split("/", 1)[0].rstrip(".")
        if not host or any(c in host for c in "*:@ "):
            raise Refused(where, f"{d!r} is not a domain name")
        out.append(host)
    return tuple(out)


# --- shared pieces ----------------------------------------------------------------------

_DATA_IMAGE = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,", re.IGNORECASE)


class _DataUrl(Spec):
    """An image given inline; a URL here is one the provider would download."""

    def check(self, value: Any, where: str, walk: Walk) -> None:
        if not isinstance(value, str) or not _DATA_IMAGE.match(value):
            raise Refused(
                where,
                "images go inline as data:image/...;base64 URLs (pi's way); a web URL here is "
                "one the provider would fetch, outside the egress policy",
            )


DATA_URL = _DataUrl()

# --- anthropic-messages -------------------------------------------------------------------

_CACHE = Obj({"type": enum("ephemeral"), "ttl": enum("5m", "1h")})
_ANTHROPIC_TOOL = Obj(
    {
        "type": enum("custom"),
        "name": STR,
        "description": STR,
        "input_schema": ANY,
        "eager_input_streaming": BOOL,
        "strict": BOOL,
        "cache_control": _CACHE,
        "defer_loading": BOOL,
        "input_examples": ANY,
    }
)
_ANTHROPIC_TOOL_TYPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"web_search_\d+"), "web_search"),
    (re.compile(r"web_fetch_\d+"), "web_fetch"),
    (re.compile(r"code_execution_\d+"), "code_execution"),
    (re.compile(r"mcp_toolset"), "mcp"),
)


def _anthropic_tool(tag: Any, value: dict[str, Any], where: str, walk: Walk) -> None:
    kind = next((k for p, k in _ANTHROPIC_TOOL_TYPES if p.fullmatch(str(tag))), None)
    if kind is None:
        raise Refused(
            where,
            f"tool type {tag!r} is a tool Anthropic defines (server-side or its own client "
            "tools); pi sends only its own tools (no type)",
        )
    _use(kind, where, walk, _domains(value.get("allowed_domains"), f"{where}.allowed_domains"))


_ANTHROPIC_TOOLS = Arr(
    Tagged("type", {None: _ANTHROPIC_TOOL, "custom": _ANTHROPIC_TOOL}, _anthropic_tool)
)


def _image_source(tag: Any, value: dict[str, Any], where: str, walk: Walk) -> None:
    raise Refused(
        f"{where}.type",
        f"image source {tag!r}: only base64 images are forwarded (a URL source is fetched by "
        "the provider; a file source reads files stored under the key)",
    )


_ANTHROPIC_IMAGE = Obj(
    {
        "type": enum("image"),
        "source": Tagged(
            "type", {"base64": Obj({"type": STR, "media_type": STR, "data": STR})}, _image_source
        ),
        "cache_control": _CACHE,
    }
)
_ANTHROPIC_TEXT = Obj({"type": enum("text"), "text": STR, "cache_control": _CACHE})
_ANTHROPIC_RESULT_CONTENT = either(
    STR, Arr(Tagged("type", {"text": _ANTHROPIC_TEXT, "image": _ANTHROPIC_IMAGE}))
)
_ANTHROPIC_SERVER_BLOCKS = {
    "web_search_tool_result": "web_search",
    "web_fetch_tool_result": "web_fetch",
    "code_execution_tool_result": "code_execution",
    "bash_code_execution_tool_result": "code_execution",
    "text_editor_code_execution_tool_result": "code_execution",
    "mcp_tool_use": "mcp",
    "mcp_tool_result": "mcp",
}
_SERVER_TOOL_NAMES = {
    "web_search": "web_search",
    "web_fetch": "web_fetch",
    "code_execution": "code_execution",
    "bash_code_execution": "code_execution",
    "text_editor_code_execution": "code_execution",
}


def _anthropic_block(tag: Any, value: dict[str, Any], where: str, walk: Walk) -> None:
    """History of provider-side tool use: forwarded only while that kind is enabled."""
    kind = _ANTHROPIC_SERVER_BLOCKS.get(str(tag))
    if tag == "server_tool_use":
        kind = _SERVER_TOOL_NAMES.get(str(value.get("name")))
    if kind is None:
        raise Refused(
            f"{where}.type",
            f"content block {tag!r} is not one pi sends (documents, files and container "
            "uploads can name URLs or files stored under the key)",
        )
    _use(kind, where, walk)


_ANTHROPIC_BLOCK = Tagged(
    "type",
    {
        "text": _ANTHROPIC_TEXT,
        "image": _ANTHROPIC_IMAGE,
        "tool_use": Obj(
            {"type": STR, "id": STR, "name": STR, "input": ANY, "cache_control": _CACHE}
        ),
        "tool_result": Obj(
            {
                "type": STR,
                "tool_use_id": STR,
                "content": _ANTHROPIC_RESULT_CONTENT,
                "is_error": BOOL,
                "cache_control": _CACHE,
            }
        ),
        "thinking": Obj({"type": STR, "thinking": STR, "signature": STR}),
        "redacted_thinking": Obj({"type": STR, "data": STR}),
        # pi 1.6: tools added and withdrawn mid-conversation (inline-tools beta).
        "tool_addition": Obj(
            {
                "type": STR,
                "tool": Obj({"type": enum("tool_definition"), "definition": _ANTHROPIC_TOOL}),
                "cache_control": _CACHE,
            }
        ),
        "tool_removal": Obj(
            {
                "type": STR,
                "tool": Obj({"type": enum("tool_reference"), "name": STR}),
                "cache_control": _CACHE,
            }
        ),
    },
    _anthropic_block,
)
_EFFORT = Obj({"effort": STR})
_ANTHROPIC_MESSAGE = Obj(
    {
        "role": enum("user", "assistant", "system"),
        "content": either(STR, Arr(_ANTHROPIC_BLOCK)),
        "output_config": _EFFORT,  # pi 1.6: effort markers on system messages
    }
)


def _anthropic_unknown(key: str, value: Any, where: str, walk: Walk) -> None:
    if key == "mcp_servers":
        if not isinstance(value, list):
            raise Refused(where, "expected a list of MCP servers", status=400)
        hosts = [_host_of(s.get("url") if isinstance(s, dict) else None, f"{where}[{i}].url")
                 for i, s in enumerate(value)]  # fmt: skip
        _use("mcp", where, walk, hosts)
        return
    reasons = {
        "container": "a code-execution container id (state kept by the provider)",
        "thread": "a stored conversation thread (state kept by the provider, possibly another "
        "task's)",
        "context_management": "server-side editing of the conversation",
        "service_tier": "a pricier service tier than the task's limits count",
        "betas": "beta features go in the anthropic-beta header, which piwork checks",
    }
    _refuse_key(key, where, reasons)


ANTHROPIC_BODY = Obj(
    {
        "model": STR,
        "messages": Arr(_ANTHROPIC_MESSAGE),
        "max_tokens": INT,
        "stream": BOOL,
        "system": either(STR, Arr(_ANTHROPIC_TEXT)),
        "temperature": NUM,
        "top_p": NUM,
        "top_k": INT,
        "stop_sequences": Arr(STR),
        "tools": _ANTHROPIC_TOOLS,
        "tool_choice": Obj(
            {
                "type": enum("auto", "any", "none", "tool"),
                "name": STR,
                "disable_parallel_tool_use": BOOL,
            }
        ),
        "thinking": Obj(
            {
                "type": enum("enabled", "disabled", "adaptive"),
                "budget_tokens": INT,
                "display": STR,
                "block_binding": ANY,
            }
        ),
        "output_config": _EFFORT,
        "metadata": Obj({"user_id": STR}),
    },
    _anthropic_unknown,
)

ANTHROPIC_BETAS = frozenset(
    {
        # Sent by pi's anthropic-messages (0.73.1 and 1.6) for an API key.
        "fine-grained-tool-streaming-2025-05-14",
        "interleaved-thinking-2025-05-14",
        "mid-conversation-output-config-2026-07-01",
        "thinking-binding-controls-2026-08-01",
        "inline-tools-2026-09-15",
        "message-threads-2026-08-12",  # harmless alone: "thread" itself is refused
    }
)
_STRIPPED_BETAS = frozenset({"server-side-fallback-2026-07-01"})
"""Goes with ``fallbacks``, which the gateway removes: a task has one model."""
_KIND_BETAS: dict[str, frozenset[str]] = {
    "mcp": frozenset({"mcp-client-2025-04-04", "mcp-client-2025-11-20"}),
    "web_fetch": frozenset({"web-fetch-2025-09-10"}),
    "code_execution": frozenset({"code-execution-2025-05-22", "code-execution-2025-08-25"}),
}

# --- openai-completions ---------------------------------------------------------------------

_OA_TEXT = Obj({"type": enum("text"), "text": STR, "cache_control": _CACHE})


def _oa_part(tag: Any, value: dict[str, Any], where: str, walk: Walk) -> None:
    raise Refused(
        f"{where}.type",
        f"content part {tag!r} is not one pi sends (files and audio can name stored files "
        "or URLs the provider fetches)",
    )


_OA_PARTS = Arr(
    Tagged(
        "type",
        {
            "text": _OA_TEXT,
            "image_url": Obj(
                {
                    "type": STR,
                    "image_url": Obj({"url": DATA_URL, "detail": STR}),
                    "cache_control": _CACHE,
                }
            ),
        },
        _oa_part,
    )
)
_OA_FUNCTION_TOOL = Obj(
    {
        "type": enum("function"),
        "function": Obj(
            {"name": STR, "description": STR, "parameters": ANY, "strict": either(BOOL, NULL)}
        ),
        "cache_control": _CACHE,
    }
)
_OA_CUSTOM_TOOL = Obj({"type": enum("custom"), "custom": ANY, "cache_control": _CACHE})


def _oa_tool(tag: Any, value: dict[str, Any], where: str, walk: Walk) -> None:
    raise Refused(f"{where}.type", f"tool type {tag!r} is not a function tool (pi's only kind)")


_OA_TOOLS = Arr(
    Tagged("type", {"function": _OA_FUNCTION_TOOL, "custom": _OA_CUSTOM_TOOL}, _oa_tool)
)
_OA_TOOL_CALL = Tagged(
    "type",
    {
        "function": Obj({"id": STR, "type": STR, "function": Obj({"name": STR, "arguments": STR})}),
        "custom": Obj({"id": STR, "type": STR, "custom": Obj({"name": STR, "input": STR})}),
    },
)
_OA_INSTRUCTION = Obj({"role": STR, "content": either(STR, _OA_PARTS), "name": STR})
_OA_MESSAGE = Tagged(
    "role",
    {
        "system": _OA_INSTRUCTION.extended({"tools": _OA_TOOLS}),  # pi 1.6: Kimi's tool message
        "developer": _OA_INSTRUCTION,
        "user": _OA_INSTRUCTION,
        "assistant": Obj(
            {
                "role": STR,
                "content": either(STR, NULL, _OA_PARTS),
                "name": STR,
                "tool_calls": Arr(_OA_TOOL_CALL),
                "reasoning_details": ANY,
                "reasoning_content": STR,
                "reasoning": STR,
                "reasoning_text": STR,
            }
        ),
        "tool": Obj(
            {"role": STR, "content": either(STR, _OA_PARTS), "tool_call_id": STR, "name": STR}
        ),
    },
)


def _oa_chat_unknown(key: str, value: Any, where: str, walk: Walk) -> None:
    if key == "web_search_options":
        _use("web_search", where, walk)
        return
    if key == "plugins" and isinstance(value, list):
        for i, plugin in enumerate(value):
            if not isinstance(plugin, dict) or plugin.get("id") != "web":
                raise Refused(f"{where}[{i}]", "only OpenRouter's web plugin can be enabled")
            _use("web_search", f"{where}[{i}]", walk)
        return
    reasons = {
        "models": "other models to fall back to (a task has one model)",
        "n": "several answers per call (each billed)",
        "audio": "audio output",
        "modalities": "other output kinds",
        "prediction": "a predicted output",
        "service_tier": "a pricier service tier than the task's limits count",
        "functions": "legacy function calling",
    }
    _refuse_key(key, where, reasons)


OPENAI_CHAT_BODY = Obj(
    {
        "model": STR,
        "messages": Arr(_OA_MESSAGE),
        "stream": BOOL,
        "stream_options": Obj({"include_usage": BOOL}),
        "store": enum(False),
        "max_tokens": INT,
        "max_completion_tokens": INT,
        "temperature": NUM,
        "top_p": NUM,
        "top_k": NUM,
        "min_p": NUM,
        "presence_penalty": NUM,
        "frequency_penalty": NUM,
        "repetition_penalty": NUM,
        "seed": INT,
        "stop": either(STR, Arr(STR)),
        "tools": _OA_TOOLS,
        "tool_choice": either(
            STR, Obj({"type": STR, "function": Obj({"name": STR}), "custom": ANY})
        ),
        "parallel_tool_calls": BOOL,
        "tool_stream": BOOL,
        # Thinking switches of the OpenAI-compatible servers pi knows (compat.thinkingFormat).
        "enable_thinking": BOOL,
        "chat_template_kwargs": ANY,
        "chat_template_args": ANY,
        "thinking": either(STR, Obj({"type": STR, "clear_thinking": BOOL})),
        "reasoning_effort": STR,
        "reasoning": Obj({"effort": STR, "enabled": BOOL, "max_tokens": INT, "exclude": BOOL}),
        "thinking_token_budget": INT,
        "priority": INT,  # vLLM
        # Routing among a gateway's upstreams for the same model (OpenRouter, Vercel).
        "provider": ANY,
        "providerOptions": ANY,
        "prompt_cache_key": STR,
        "prompt_cache_retention": STR,
    },
    _oa_chat_unknown,
)

# --- openai-responses --------------------------------------------------------------------

_OR_TEXT = Obj({"type": STR, "text": STR})
_OR_IMAGE = Obj({"type": STR, "image_url": DATA_URL, "detail": STR})


def _or_part(tag: Any, value: dict[str, Any], where: str, walk: Walk) -> None:
    raise Refused(
        f"{where}.type",
        f"content part {tag!r} is not one pi sends (input_file and file ids name stored "
        "files or URLs the provider fetches)",
    )


_OR_PARTS = Arr(
    Tagged(
        "type",
        {
            "input_text": _OR_TEXT,
            "input_image": _OR_IMAGE,
            "output_text": Obj({"type": STR, "text": STR, "annotations": ANY, "logprobs": ANY}),
            "refusal": Obj({"type": STR, "refusal": STR}),
        },
        _or_part,
    )
)
_OR_FUNCTION_TOOL = Obj(
    {
        "type": STR,
        "name": STR,
        "description": STR,
        "parameters": ANY,
        "strict": either(BOOL, NULL),
        "defer_loading": BOOL,
    }
)
_OR_CUSTOM_TOOL = Obj(
    {"type": STR, "name": STR, "description": STR, "format": ANY, "defer_loading": BOOL}
)
_OR_WEB_SEARCH = frozenset(
    {"web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26"}
)


def _or_tool(tag: Any, value: dict[str, Any], where: str, walk: Walk) -> None:
    if tag in _OR_WEB_SEARCH:
        filters = value.get("filters")
        allowed = filters.get("allowed_domains") if isinstance(filters, dict) else None
        _use("web_search", where, walk, _domains(allowed, f"{where}.filters.allowed_domains"))
    elif tag == "mcp":
        if "connector_id" in value:
            raise _never(
                f"{where}.connector_id",
                "an OpenAI connector",
                "it reaches the accounts linked to the key's organisation",
            )
        _use("mcp", where, walk, (_host_of(value.get("server_url"), f"{where}.server_url"),))
    elif tag == "code_interpreter":
        _use("code_execution", where, walk)
    else:
        raise Refused(
            f"{where}.type",
            f"tool type {tag!r} is a tool OpenAI defines (it runs at the provider or reads "
            "what is stored under the key); pi sends only function tools",
        )


_OR_TOOLS = Arr(
    Tagged("type", {"function": _OR_FUNCTION_TOOL, "custom": _OR_CUSTOM_TOOL}, _or_tool)
)
_OR_MESSAGE = Obj(
    {
        "type": enum("message"),
        "role": enum("user", "assistant", "system", "developer"),
        "content": either(STR, _OR_PARTS),
        "id": STR,
        "status": STR,
        "phase": ANY,
    }
)
_OR_RESULT = either(
    STR, Arr(Tagged("type", {"input_text": _OR_TEXT, "input_image": _OR_IMAGE}, _or_part))
)
_OR_SERVER_ITEMS = {
    "web_search_call": "web_search",
    "mcp_call": "mcp",
    "mcp_list_tools": "mcp",
    "mcp_approval_request": "mcp",
    "mcp_approval_response": "mcp",
    "code_interpreter_call": "code_execution",
}


def _or_item(tag: Any, value: dict[str, Any], where: str, walk: Walk) -> None:
    kind = _OR_SERVER_ITEMS.get(str(tag))
    if kind is not None:
        _use(kind, where, walk)
        return
    if tag == "item_reference":
        raise _never(where, "a stored item", "it reads what is stored under the key")
    raise Refused(f"{where}.type", f"input item {tag!r} is not one pi sends")


_OR_ITEM = Tagged(
    "type",
    {
        None: _OR_MESSAGE,
        "message": _OR_MESSAGE,
        "reasoning": Obj(
            {
                "type": STR,
                "id": STR,
                "summary": ANY,
                "encrypted_content": either(STR, NULL),
                "content": ANY,
                "status": STR,
            }
        ),
        "function_call": Obj(
            {
                "type": STR,
                "id": STR,
                "call_id": STR,
                "name": STR,
                "arguments": STR,
                "status": STR,
                "namespace": STR,
            }
        ),
        "custom_tool_call": Obj(
            {"type": STR, "id": STR, "call_id": STR, "name": STR, "input": STR, "namespace": STR}
        ),
        "function_call_output": Obj(
            {"type": STR, "call_id": STR, "output": _OR_RESULT, "id": STR, "status": STR}
        ),
        "custom_tool_call_output": Obj(
            {"type": STR, "call_id": STR, "output": _OR_RESULT, "id": STR}
        ),
        # pi 1.6: tools declared, loaded and re-configured mid-conversation.
        "additional_tools": Obj({"type": STR, "role": STR, "tools": _OR_TOOLS}),
        "tool_search_call": Obj(
            {
                "type": STR,
                "call_id": STR,
                "execution": enum("client"),
                "status": STR,
                "arguments": ANY,
            }
        ),
        "tool_search_output": Obj(
            {
                "type": STR,
                "call_id": STR,
                "execution": enum("client"),
                "status": STR,
                "tools": _OR_TOOLS,
            }
        ),
        "configuration_update": Obj({"type": STR, "reasoning": _EFFORT}),
    },
    _or_item,
)


def _or_unknown(key: str, value: Any, where: str, walk: Walk) -> None:
    reasons = {
        "previous_response_id": "a stored response to continue (state kept by the provider, "
        "possibly another task's)",
        "conversation": "a stored conversation (state kept by the provider)",
        "prompt": "a stored prompt template",
        "background": "a background response the task could not follow",
    }
    _refuse_key(key, where, reasons)


def _refuse_key(key: str, where: str, reasons: Mapping[str, str]) -> None:
    why = reasons.get(key)
    raise Refused(
        where,
        f"{why}; piwork never forwards it"
        if why
        else "not a field pi sends to this API; piwork forwards only those",
    )


OPENAI_RESPONSES_BODY = Obj(
    {
        "model": STR,
        "input": either(STR, Arr(_OR_ITEM)),
        "instructions": STR,
        "stream": BOOL,
        "stream_options": ANY,
        "store": enum(False),
        "prompt_cache_key": STR,
        "prompt_cache_retention": STR,
        "prompt_cache_options": Obj({"mode": STR, "ttl": STR}),
        "max_output_tokens": INT,
        "temperature": NUM,
        "top_p": NUM,
        # pi sends the person's choice; "priority" costs twice what the limits count.
        "service_tier": enum("auto", "default", "flex"),
        "tools": _OR_TOOLS,
        "tool_choice": either(STR, Obj({"type": STR, "name": STR})),
        "parallel_tool_calls": BOOL,
        "reasoning": Obj({"effort": STR, "summary": STR}),
        "include": Arr(enum("reasoning.encrypted_content")),
        "text": Obj({"verbosity": STR}),
    },
    _or_unknown,
)

# --- google-generative-ai -----------------------------------------------------------------

_INLINE = Obj({"mimeType": STR, "data": STR, "displayName": STR})
_G_SERVER_PARTS = {"executableCode": "code_execution", "codeExecutionResult": "code_execution"}


def _g_part_unknown(key: str, value: Any, where: str, walk: Walk) -> None:
    kind = _G_SERVER_PARTS.get(_camel(key))
    if kind is not None:
        _use(kind, where, walk)
        return
    if _camel(key) == "fileData":
        raise Refused(where, "a file by URI: the provider fetches it (inline data only)")
    raise Refused(where, "not a part pi sends; piwork forwards only those")


_G_PART = Obj(
    {
        "text": STR,
        "thought": BOOL,
        "thoughtSignature": STR,
        "inlineData": _INLINE,
        "functionCall": Obj({"name": STR, "args": ANY, "id": STR}),
        "functionResponse": Obj(
            {
                "name": STR,
                "response": ANY,
                "id": STR,
                "parts": Arr(Obj({"inlineData": _INLINE})),
            }
        ),
    },
    _g_part_unknown,
)
_G_CONTENT = Obj({"role": STR, "parts": Arr(_G_PART)})
_G_DECLARATION = Obj(
    {
        "name": STR,
        "description": STR,
        "parameters": ANY,
        "parametersJsonSchema": ANY,
        "response": ANY,
        "responseJsonSchema": ANY,
    }
)
_G_SERVER_TOOLS = {
    "googleSearch": "google_search",
    "googleSearchRetrieval": "google_search",
    "urlContext": "url_context",
    "codeExecution": "code_execution",
}


def _camel(key: str) -> str:
    """``url_context`` -> ``urlContext``: Google's JSON takes either spelling."""
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _g_tool_unknown(key: str, value: Any, where: str, walk: Walk) -> None:
    kind = _G_SERVER_TOOLS.get(_camel(key))
    if kind is not None:
        _use(kind, where, walk)
        return
    raise Refused(
        where,
        "a tool Google defines (it runs at the provider or reads what is stored under the key); "
        "pi sends only functionDeclarations",
    )


def _g_unknown(key: str, value: Any, where: str, walk: Walk) -> None:
    reasons = {
        "cachedContent": "cached contents stored under the key (possibly another task's)",
        "candidateCount": "several answers per call (each billed)",
    }
    _refuse_key(_camel(key), where, reasons)


GOOGLE_BODY = Obj(
    {
        "contents": Arr(_G_CONTENT),
        "systemInstruction": either(STR, _G_CONTENT),
        "tools": Arr(Obj({"functionDeclarations": Arr(_G_DECLARATION)}, _g_tool_unknown)),
        "toolConfig": Obj(
            {"functionCallingConfig": Obj({"mode": STR, "allowedFunctionNames": Arr(STR)})}
        ),
        "generationConfig": Obj(
            {
                "temperature": NUM,
                "topP": NUM,
                "topK": NUM,
                "maxOutputTokens": INT,
                "stopSequences": Arr(STR),
                "seed": INT,
                "presencePenalty": NUM,
                "frequencyPenalty": NUM,
                "thinkingConfig": Obj(
                    {"includeThoughts": BOOL, "thinkingBudget": INT, "thinkingLevel": STR}
                ),
            }
        ),
    },
    _g_unknown,
)

BODIES: dict[ApiType, Obj] = {
    "anthropic-messages": ANTHROPIC_BODY,
    "openai-completions": OPENAI_CHAT_BODY,
    "openai-responses": OPENAI_RESPONSES_BODY,
    "google-generative-ai": GOOGLE_BODY,
}


def body_spec(api: ApiType, compat: Mapping[str, Any] | None = None) -> Obj:
    """The schema for ``api``, with the fields a provider's ``compat`` makes pi send."""
    spec = BODIES[api]
    field_name = (compat or {}).get("thinkingTokenBudgetField")
    if api == "openai-completions" and isinstance(field_name, str) and field_name:
        spec = spec.extended({field_name: INT})
    return spec


@dataclass(frozen=True)
class CheckedBody:
    body: dict[str, Any]
    """What goes upstream (re-serialised by the caller)."""
    uses: tuple[ServerToolUse, ...]
    stripped: tuple[str, ...]
    """Fields removed rather than refused (``fallbacks``: a task has one model)."""


def check_body(
    api: ApiType,
    body: Any,
    *,
    enabled: frozenset[str] = frozenset(),
    compat: Mapping[str, Any] | None = None,
) -> CheckedBody:
    """Raise :class:`Refused` unless ``body`` is a model call pi could have made."""
    if not isinstance(body, dict):
        raise Refused("", "a model call's body must be a JSON object", status=400)
    stripped: list[str] = []
    if api == "anthropic-messages" and "fallbacks" in body:
        body = {k: v for k, v in body.items() if k != "fallbacks"}
        stripped.append("fallbacks")
    walk = check(body_spec(api, compat), body, enabled)
    return CheckedBody(body, tuple(walk.uses), tuple(stripped))


# --- headers and query ---------------------------------------------------------------------

_COMMON_HEADERS = frozenset({"accept", "user-agent", "accept-language", "sec-fetch-mode"})
"""Content-Type is the gateway's own: the body it sends is the JSON it re-serialised."""
_API_HEADERS: dict[ApiType, frozenset[str]] = {
    "anthropic-messages": frozenset(
        {
            "anthropic-version",
            "anthropic-beta",
            "anthropic-dangerous-direct-browser-access",
            "x-session-affinity",
            "x-session-id",
        }
    ),
    "openai-completions": frozenset(
        {
            "x-client-request-id",
            "x-session-id",
            "x-session-affinity",
            # pi 1.6's attribution for OpenRouter, NVIDIA NIM, OpenCode.
            "http-referer",
            "x-openrouter-title",
            "x-openrouter-categories",
            "x-title",
            "x-billing-invoke-origin",
            "x-opencode-client",
            "x-opencode-session",
        }
    ),
    "openai-responses": frozenset(
        {"session_id", "session-id", "x-client-request-id", "x-session-id"}
    ),
    "google-generative-ai": frozenset({"x-goog-api-client"}),
}
_METHOD_OVERRIDES = frozenset({"x-http-method-override", "x-http-method", "x-method-override"})
ANTHROPIC_VERSIONS = frozenset({"2023-06-01"})


def check_headers(
    api: ApiType, headers: Iterable[tuple[str, str]], *, enabled: frozenset[str] = frozenset()
) -> CIMultiDict[str]:
    """The guest's headers that go upstream; raises :class:`Refused` for one that would
    change the method or switch on a feature pi does not use."""
    names = _COMMON_HEADERS | _API_HEADERS[api]
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers:
        lname = name.lower()
        if lname in _METHOD_OVERRIDES:
            raise Refused(
                name, "method-override headers are refused (the method is part of what "
                "piwork checks)", status=400,
            )  # fmt: skip
        if lname == "content-encoding" and value.strip().lower() not in ("", "identity"):
            raise Refused(name, "compressed request bodies are refused", status=400)
        if lname.startswith("x-stainless-"):
            out.add(name, value)
            continue
        if lname not in names:
            continue  # dropped: nothing the provider acts on is let through unseen
        if lname == "anthropic-beta":
            value = _check_betas(value, enabled)
            if not value:
                continue
        elif lname == "anthropic-version" and value.strip() not in ANTHROPIC_VERSIONS:
            raise Refused(name, f"{value!r} is not the API version pi uses")
        out.add(name, value)
    return out


def _check_betas(value: str, enabled: frozenset[str]) -> str:
    allowed = set(ANTHROPIC_BETAS)
    for kind in enabled:
        allowed |= _KIND_BETAS.get(kind, frozenset())
    kept = []
    for beta in (b.strip() for b in value.split(",")):
        if not beta or beta in _STRIPPED_BETAS:
            continue
        if beta not in allowed:
            owner = next((k for k, bs in _KIND_BETAS.items() if beta in bs), None)
            if owner is not None:
                raise _refuse_kind(owner, "anthropic-beta")
            raise Refused(
                "anthropic-beta",
                f"the beta {beta!r} is not one pi uses; betas switch on provider features "
                "(connectors, file access) that piwork has not checked",
            )
        kept.append(beta)
    return ",".join(kept)


_QUERY: dict[ApiType, dict[str, frozenset[str]]] = {
    "anthropic-messages": {"beta": frozenset({"true"})},  # pi 1.6: client.beta.messages
    "openai-completions": {},
    "openai-responses": {},
    "google-generative-ai": {"alt": frozenset({"sse"})},
}
CREDENTIAL_QUERY_KEYS = frozenset({"key", "api_key", "api-key", "apikey"})
_PAGING = frozenset({"limit", "before_id", "after_id", "pageSize", "pageToken"})
"""A model listing's pages (any value): they name nothing but the listing."""


def check_query(api: ApiType, raw: str, *, listing: bool = False) -> str:
    """The query that goes upstream (credentials dropped); refuses a parameter pi never sends."""
    kept = []
    allowed = _QUERY[api]
    for pair in (p for p in raw.split("&") if p):
        name, _, value = pair.partition("=")
        key = unquote(name)
        if key.lower() in CREDENTIAL_QUERY_KEYS:
            continue
        if not (listing and key in _PAGING) and unquote(value) not in allowed.get(key, frozenset()):
            raise Refused(f"?{key}", "not a query parameter pi sends; piwork forwards only those")
        kept.append(pair)
    return "?" + "&".join(kept) if kept else ""


__all__ = [
    "ANTHROPIC_BETAS",
    "BODIES",
    "CREDENTIAL_QUERY_KEYS",
    "SERVER_TOOL_FEES_USD",
    "SERVER_TOOL_KINDS",
    "CheckedBody",
    "Refused",
    "ServerToolUse",
    "body_spec",
    "check_body",
    "check_headers",
    "check_query",
]
