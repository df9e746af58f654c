"""An HTTP MCP server the person configures, with the real pi 1.x run natively as
piwork starts it and piwork's real egress proxy between them (pi's environment names
it, as in the VM): the proxy asks the network policy about the server's domain before
a byte reaches it; allowed, the server's tool is used; denied, it never sees a
request. No VM (in the VM: tests/vm/test_vm_mcp.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.models import ScriptedModelServer, Step, Text, ToolCall, ToolCalls
from piwork.pisettings import McpServer, PiSettings
from piwork.proxy.egress import EgressProxy, guest_proxy_env, proxy_url_with_token
from tests.helpers.mcp_http_server import McpHttpServer, host_name

from .pi_native import run_piwork_pi


@pytest.mark.parametrize("allow", [True, False], ids=["allowed", "denied"])
async def test_an_http_mcp_servers_domain_is_asked_by_the_proxy(
    tmp_path: Path, allow: bool
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    asked: list[tuple[str, int]] = []

    async def policy(host: str, port: int) -> bool:
        asked.append((host, port))
        return allow

    script: list[Step] = [
        ToolCalls([ToolCall("mcp__remote__shout", {"text": "over http"}, "call_h")]),
        Text("done"),
    ]
    name, addr = host_name()
    async with (
        McpHttpServer(addr) as mcp,
        EgressProxy(policy, allow_private_networks=True, token="tok") as proxy,
        ScriptedModelServer(script, model_id="scripted") as model,
    ):
        url = f"http://{name}:{mcp.port}/mcp"
        settings = PiSettings(mcp_servers={"remote": McpServer(url=url, exposure="direct")})
        proxy_env = guest_proxy_env(
            proxy_url_with_token(f"http://127.0.0.1:{proxy.port}", "tok"), ("127.0.0.1",)
        )
        pi = await run_piwork_pi(
            tmp_path, work, model, "shout", settings=settings, env=proxy_env,
            answer=lambda req: {"value": "Allow once"},
        )  # fmt: skip

    assert (name, mcp.port) in asked, asked
    (end,) = [e for e in pi.of_type("tool_execution_end") if e["toolCallId"] == "call_h"]
    text = "".join(c.get("text", "") for c in end["result"]["content"])
    if allow:
        assert text == "SHOUTED: OVER HTTP", json.dumps(end)[:2000]
        assert "tools/call" in mcp.methods
    else:
        assert end["isError"], end
        assert mcp.requests == []
