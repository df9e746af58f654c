"""The provider catalog and the guest's models.json."""

from __future__ import annotations

import json
from pathlib import Path

import keyring
import pytest
from keyring.backends import fail
from pydantic import ValidationError

from piwork.cli.main import main
from piwork.models.providers import (
    BUILTIN_PROVIDERS,
    GUEST_PLACEHOLDER_KEY,
    ModelSpec,
    Provider,
    ProviderConfigError,
    demo_provider,
    load_custom_providers,
    load_providers,
    parse_model_ref,
    render_guest_models_json,
)


def write_providers(path: Path, providers: dict[str, object]) -> Path:
    path.write_text(json.dumps({"providers": providers}))
    return path


def test_builtins_are_rendered_as_overrides_pointing_at_the_gateway() -> None:
    rendered = render_guest_models_json(BUILTIN_PROVIDERS)["providers"]
    assert rendered["anthropic"] == {
        "baseUrl": "http://10.0.2.100/p/anthropic",
        "api": "anthropic-messages",
        "apiKey": GUEST_PLACEHOLDER_KEY,
    }
    assert rendered["openai"]["baseUrl"] == "http://10.0.2.100/p/openai/v1"
    assert rendered["openai"]["api"] == "openai-responses"
    assert rendered["openrouter"]["baseUrl"] == "http://10.0.2.100/p/openrouter/api/v1"
    assert rendered["google"]["baseUrl"] == "http://10.0.2.100/p/google/v1beta"
    # pi keeps its own catalog for built-ins: no model list is sent
    for name in ("anthropic", "openai", "openrouter", "google"):
        assert "models" not in rendered[name]
    # a piwork-defined provider pi does not know carries its models
    assert [m["id"] for m in rendered["openai-chat"]["models"]] == ["gpt-4.1", "gpt-4.1-mini"]
    assert {e["apiKey"] for e in rendered.values()} == {GUEST_PLACEHOLDER_KEY}


def test_custom_headers_and_keys_never_reach_the_guest(tmp_path: Path) -> None:
    path = write_providers(
        tmp_path / "providers.json",
        {
            "vllm": {
                "baseUrl": "http://gpu-box:8000/v1/",
                "headers": {"X-Secret-Gateway-Token": "very-secret"},
                "keyRequired": True,
                "compat": {"supportsDeveloperRole": False},
                "models": [{"id": "qwen", "contextWindow": 32768, "maxTokens": 4096}],
            }
        },
    )
    [vllm] = load_custom_providers(path)
    assert vllm.base_url == "http://gpu-box:8000/v1"
    assert vllm.default_model == "qwen"
    rendered = render_guest_models_json([vllm], gateway_base="http://10.0.2.100/")
    assert rendered == {
        "providers": {
            "vllm": {
                "baseUrl": "http://10.0.2.100/p/vllm/v1",
                "api": "openai-completions",
                "apiKey": GUEST_PLACEHOLDER_KEY,
                "compat": {"supportsDeveloperRole": False},
                "models": [{"id": "qwen", "contextWindow": 32768, "maxTokens": 4096}],
            }
        }
    }
    assert "very-secret" not in json.dumps(rendered)


def test_demo_provider_needs_no_key_and_uses_runtime_url() -> None:
    demo = demo_provider("http://127.0.0.1:8765/v1")
    assert (demo.auth, demo.key_required, demo.default_model) == ("none", False, "demo")
    entry = render_guest_models_json([demo])["providers"]["piwork-demo"]
    assert entry["baseUrl"] == "http://10.0.2.100/p/piwork-demo/v1"
    assert entry["models"][0]["id"] == "demo"
    assert entry["apiKey"] == GUEST_PLACEHOLDER_KEY  # pi insists on some key


def test_custom_provider_without_models_is_not_rendered() -> None:
    bare = Provider(name="bare", api="openai-completions", base_url="http://h/v1", auth="none")
    assert render_guest_models_json([bare]) == {"providers": {}}


@pytest.mark.parametrize(
    ("providers", "expected"),
    [
        ({"x": {"baseUrl": "ftp://h", "models": [{"id": "m"}]}}, "http"),
        ({"x": {"baseUrl": "http://h/v1?key=abc", "models": [{"id": "m"}]}}, "query"),
        ({"x": {"baseUrl": "http://user:pw@h/v1", "models": [{"id": "m"}]}}, "credentials"),
        ({"x": {"baseUrl": "http://h/v1", "models": []}}, "models"),
        ({"openai": {"baseUrl": "http://h/v1", "models": [{"id": "m"}]}}, "reserved"),
        ({"Bad Name": {"baseUrl": "http://h/v1", "models": [{"id": "m"}]}}, "provider name"),
        ({"x": {"baseUrl": "http://h/v1", "api": "bedrock", "models": [{"id": "m"}]}}, "api"),
    ],
)
def test_invalid_providers_json_is_a_clear_error(
    tmp_path: Path, providers: dict[str, object], expected: str
) -> None:
    path = write_providers(tmp_path / "providers.json", providers)
    with pytest.raises(ProviderConfigError) as err:
        load_custom_providers(path)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_broken_json_and_missing_file(tmp_path: Path) -> None:
    assert load_custom_providers(tmp_path / "absent.json") == []
    broken = tmp_path / "providers.json"
    broken.write_text("{not json")
    with pytest.raises(ProviderConfigError, match="not valid JSON"):
        load_custom_providers(broken)


def test_load_providers_merges_builtins_custom_and_extra(tmp_path: Path) -> None:
    path = write_providers(
        tmp_path / "providers.json",
        {
            "ollama": {
                "baseUrl": "http://127.0.0.1:11434/v1",
                "auth": "none",
                "models": [{"id": "llama3.1:8b"}],
            }
        },
    )
    catalog = load_providers(path, extra=[demo_provider("http://127.0.0.1:1/v1")])
    assert {"anthropic", "openai", "openrouter", "google", "ollama", "piwork-demo"} <= set(catalog)


def test_parse_model_ref() -> None:
    catalog = {p.name: p for p in BUILTIN_PROVIDERS}
    provider, model = parse_model_ref("openrouter/anthropic/claude-sonnet-4.5", catalog)
    assert (provider.name, model) == ("openrouter", "anthropic/claude-sonnet-4.5")
    provider, model = parse_model_ref("anthropic", catalog)
    assert (provider.name, model) == ("anthropic", "claude-opus-5-5")  # pi 1.6's default
    with pytest.raises(ValueError, match=r"unknown provider 'nope'.*piwork models"):
        parse_model_ref("nope/x", catalog)


def test_model_spec_rejects_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        ModelSpec.model_validate({"id": "m", "apiKey": "sneaky"})


def test_models_cli_lists_providers_and_key_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    monkeypatch.setattr(keyring, "get_keyring", fail.Keyring)  # a headless box
    config = tmp_path / "config"
    config.mkdir()
    write_providers(
        config / "providers.json",
        {
            "ollama": {
                "baseUrl": "http://127.0.0.1:11434/v1",
                "auth": "none",
                "models": [{"id": "llama3.1:8b"}],
            }
        },
    )
    (config / "keys.json").write_text(json.dumps({"keys": {"anthropic": "sk-ant-SECRET"}}))
    (config / "keys.json").chmod(0o600)
    assert main(["models", "--json"]) == 0
    out = capsys.readouterr().out
    assert "sk-ant-SECRET" not in out
    rows = {r["provider"]: r for r in json.loads(out)}
    assert rows["anthropic"]["hasKey"] is True and rows["anthropic"]["key"] == "stored (file)"
    assert rows["openai"]["key"] == "missing: piwork auth set openai"
    assert rows["ollama"]["key"] == "not needed" and rows["ollama"]["models"] == ["llama3.1:8b"]


def test_with_pis_catalog_the_builtins_list_all_its_models_piworks_picks_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import piwork.models.providers as providers

    listed = {"anthropic": ["a-old", "claude-opus-5-5", "claude-sonnet-5-5", "z-new"]}
    monkeypatch.setattr(providers, "pi_catalog_models", lambda: listed)
    catalog = load_providers(tmp_path / "none.json", pi_models=True)
    assert catalog["anthropic"].model_ids() == (
        "claude-opus-5-5",
        "claude-sonnet-5-5",
        "a-old",
        "z-new",
    )
    # A provider pi's catalog does not list keeps piwork's own picks.
    assert catalog["google"].model_ids() == BUILTIN_BY_NAME["google"].known_models
    monkeypatch.setattr(providers, "pi_catalog_models", lambda: None)
    plain = load_providers(tmp_path / "none.json", pi_models=True)
    assert plain["anthropic"].model_ids() == BUILTIN_BY_NAME["anthropic"].known_models


BUILTIN_BY_NAME = {p.name: p for p in BUILTIN_PROVIDERS}
