"""The upstream proxy: where it comes from, NO_PROXY, and the egress proxy through it.

The proxies are the test's own, on 127.0.0.1 (tests/helpers/net.py):
an HTTP CONNECT proxy and a SOCKS5 proxy that record what they are asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from piwork.auth import KeyStore
from piwork.config import Paths
from piwork.net import upstream as up
from piwork.net.upstream import ProxyKind, Upstream, UpstreamProxy
from piwork.proxy.egress import EgressDecision, EgressProxy
from tests.helpers.net import HttpConnectProxy, Socks5Proxy


def paths_at(root: Path, settings: dict[str, object] | None = None) -> Paths:
    paths = Paths(data=root / "d", cache=root / "c", state=root / "s", config=root / "cfg")
    paths.config.mkdir(parents=True, exist_ok=True)
    doc = {"auth": {"fileBackend": True}, **(settings or {})}
    paths.settings_file.write_bytes(orjson.dumps(doc))
    return paths


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "kind", "host", "port", "user", "password"),
    [
        ("http://proxy.corp:3128", ProxyKind.HTTP, "proxy.corp", 3128, None, None),
        ("proxy.corp:8080", ProxyKind.HTTP, "proxy.corp", 8080, None, None),
        ("https://proxy.corp", ProxyKind.HTTPS, "proxy.corp", 443, None, None),
        ("socks5://127.0.0.1:1080", ProxyKind.SOCKS5, "127.0.0.1", 1080, None, None),
        ("socks://h:9", ProxyKind.SOCKS5, "h", 9, None, None),
        ("socks5h://u%40x:p%3Aw@h:1", ProxyKind.SOCKS5H, "h", 1, "u@x", "p:w"),
        ("http://[::1]:3128/", ProxyKind.HTTP, "::1", 3128, None, None),
    ],
)
def test_proxy_urls(
    text: str, kind: ProxyKind, host: str, port: int, user: str | None, password: str | None
) -> None:
    p = up.parse_proxy_url(text)
    assert (p.kind, p.host, p.port, p.username, p.password) == (kind, host, port, user, password)
    assert (p.password or "NOPE") not in p.url or password is None
    assert "p:w" not in repr(p)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ftp://h:21", "speaks http://"),
        ("socks4://h:1", "speaks http://"),
        ("http://h:99999", "bad port"),
        ("http://h:3128/path", "nothing after the port"),
        ("", "empty"),
    ],
)
def test_bad_proxy_urls_say_what_to_give(text: str, says: str) -> None:
    with pytest.raises(up.ProxyUrlError, match=says):
        up.parse_proxy_url(text)


def test_no_proxy_follows_curl() -> None:
    entries = up.split_no_proxy("intranet.corp, .svc.local  10.0.0.0/8,[::1],192.168.1.5:8080")
    assert up.bypassed("intranet.corp", entries)
    assert up.bypassed("git.intranet.corp", entries)
    assert not up.bypassed("notintranet.corp", entries)
    assert up.bypassed("a.svc.local", entries) and up.bypassed("svc.local", entries)
    assert up.bypassed("10.1.2.3", entries) and not up.bypassed("11.1.2.3", entries)
    assert up.bypassed("::1", entries)
    assert not up.bypassed("pypi.org", entries)
    assert up.bypassed("anything", ("*",))
    proxy = UpstreamProxy(ProxyKind.HTTP, "p", 1, no_proxy=entries)
    assert proxy.routes("pypi.org")
    for loopback in ("localhost", "127.0.0.1", "::1", "x.localhost", "127.9.9.9"):
        assert not proxy.routes(loopback), loopback


def test_environment_lowercase_first_and_per_role() -> None:
    found = up.from_environment(
        {
            "HTTPS_PROXY": "http://upper:1",
            "https_proxy": "http://lower:2",
            "HTTP_PROXY": "socks5h://plain:3",
            "NO_PROXY": "corp",
        }
    )
    assert found.tunnel is not None and found.tunnel.host == "lower"
    assert found.tunnel.source == "$HTTPS_PROXY" and found.tunnel.no_proxy == ("corp",)
    assert found.plain is not None and found.plain.kind is ProxyKind.SOCKS5H
    only_all = up.from_environment({"ALL_PROXY": "socks5://s:1080"})
    assert only_all.tunnel == only_all.plain and only_all.tunnel is not None
    assert up.from_environment({}).any is None


SCUTIL = """<dictionary> {
  ExceptionsList : <array> {
    0 : *.local
    1 : 169.254/16
  }
  FTPPassive : 1
  HTTPEnable : 1
  HTTPPort : 8080
  HTTPProxy : proxy.corp
  HTTPSEnable : 1
  HTTPSPort : 8443
  HTTPSProxy : sproxy.corp
  SOCKSEnable : 0
}
"""


def test_macos_settings() -> None:
    found = up.from_scutil(SCUTIL)
    assert found.tunnel is not None and (found.tunnel.host, found.tunnel.port) == (
        "sproxy.corp",
        8443,
    )
    assert found.plain is not None and (found.plain.host, found.plain.port) == ("proxy.corp", 8080)
    assert found.tunnel.no_proxy == ("*.local", "169.254/16")
    assert not found.tunnel.routes("printer.local")
    assert up.from_scutil("<dictionary> {\n  HTTPEnable : 0\n}\n").any is None


def test_gnome_settings() -> None:
    values = {
        ("org.gnome.system.proxy", "mode"): "'manual'",
        ("org.gnome.system.proxy", "ignore-hosts"): "['localhost', '*.corp']",
        ("org.gnome.system.proxy.https", "host"): "'gw.corp'",
        ("org.gnome.system.proxy.https", "port"): "3128",
        ("org.gnome.system.proxy.http", "host"): "''",
        ("org.gnome.system.proxy.http", "port"): "0",
        ("org.gnome.system.proxy.socks", "host"): "'socks.corp'",
        ("org.gnome.system.proxy.socks", "port"): "1080",
    }
    found = up.from_gsettings(lambda s, k: values.get((s, k)))
    assert found.tunnel is not None and found.tunnel.url == "http://gw.corp:3128"
    assert found.plain is not None and found.plain.url == "socks5h://socks.corp:1080"
    assert not found.tunnel.routes("git.corp")
    values[("org.gnome.system.proxy", "mode")] = "'none'"
    assert up.from_gsettings(lambda s, k: values.get((s, k))).any is None


def test_settings_win_and_the_password_comes_from_the_keyring(tmp_path: Path) -> None:
    paths = paths_at(
        tmp_path,
        {"network": {"proxy": {"url": "http://alice@proxy.corp:3128", "noProxy": "corp"}}},
    )
    KeyStore(paths=paths).set(up.key_name("proxy.corp", 3128), "s3cret")
    found = up.resolve(paths, env={"HTTPS_PROXY": "http://other:1"}, system=lambda: up.NONE)
    assert found.tunnel is not None and found.tunnel.source == "piwork settings"
    assert (found.tunnel.username, found.tunnel.password) == ("alice", "s3cret")
    assert found.tunnel.authorization() == "Basic YWxpY2U6czNjcmV0"
    assert "s3cret" not in found.tunnel.url and "s3cret" not in repr(found.tunnel)
    assert not found.tunnel.routes("git.corp")


def test_environment_then_system_unless_turned_off(tmp_path: Path) -> None:
    paths = paths_at(tmp_path)
    system = Upstream(UpstreamProxy(ProxyKind.HTTP, "sys", 1, source="system"))
    assert up.resolve(paths, env={}, system=lambda: system).tunnel == system.tunnel
    env_found = up.resolve(paths, env={"https_proxy": "http://envp:2"}, system=lambda: system)
    assert env_found.tunnel is not None and env_found.tunnel.host == "envp"
    off = paths_at(tmp_path / "off", {"network": {"proxy": {"useSystem": False}}})
    assert up.resolve(off, env={"https_proxy": "http://envp:2"}, system=lambda: system).any is None


def test_a_password_in_settings_is_refused(tmp_path: Path) -> None:
    paths = paths_at(tmp_path, {"network": {"proxy": {"url": "http://u:pw@p:1"}}})
    with pytest.raises(up.PersonError, match="keyring"):
        up.resolve(paths, env={}, system=lambda: up.NONE)


# --------------------------------------------------------------------------- the egress proxy


class Origin:
    """A plain HTTP origin on loopback that says who it is."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.port = 0

    async def __aenter__(self) -> Origin:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        body = b"ORIGIN-OK"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    async with Origin() as o:
        yield o


async def allow_all(host: str, port: int) -> bool:
    return True


async def via_connect(proxy: EgressProxy, target: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    if not head.startswith(b"HTTP/1.1 200"):
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return head + rest
    host = target.rpartition(":")[0]  # HTTP in a tunnel names the tunnel's host
    writer.write(f"GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    body = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return head + body


async def via_get(proxy: EgressProxy, url: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


async def test_tunnels_go_through_an_http_connect_proxy_by_name(origin: Origin) -> None:
    """The host cannot resolve origin.test; the upstream proxy can, and is handed the name."""
    decisions: list[EgressDecision] = []
    async with HttpConnectProxy(hosts={"origin.test": "127.0.0.1"}) as upstream:
        proxy = up.parse_proxy_url(upstream.url, source="test")
        async with EgressProxy(
            allow_all, upstream=Upstream(proxy, proxy), on_decision=decisions.append
        ) as egress:
            out = await via_connect(egress, f"origin.test:{origin.port}")
    assert b"ORIGIN-OK" in out, out
    assert upstream.log.heads == [f"CONNECT origin.test:{origin.port} HTTP/1.1"]
    assert decisions[-1].allowed and decisions[-1].detail == f"via {proxy.url}"


async def test_plain_http_is_forwarded_in_absolute_form_with_the_proxys_credentials(
    origin: Origin,
) -> None:
    async with HttpConnectProxy(
        hosts={"origin.test": "127.0.0.1"}, credentials=("alice", "s3cret")
    ) as upstream:
        proxy = UpstreamProxy(ProxyKind.HTTP, "127.0.0.1", upstream.port, "alice", "s3cret")
        async with EgressProxy(allow_all, upstream=Upstream(proxy, proxy)) as egress:
            out = await via_get(egress, f"http://origin.test:{origin.port}/deb/x.deb")
    assert b"ORIGIN-OK" in out, out
    assert upstream.log.heads == [f"GET http://origin.test:{origin.port}/deb/x.deb HTTP/1.1"]
    assert origin.requests[0].startswith(b"GET /deb/x.deb HTTP/1.1")
    assert b"Proxy-Authorization" not in origin.requests[0]


async def test_the_upstream_proxys_refusal_is_the_reason_given(origin: Origin) -> None:
    decisions: list[EgressDecision] = []
    async with HttpConnectProxy(credentials=("alice", "right")) as upstream:
        proxy = UpstreamProxy(ProxyKind.HTTP, "127.0.0.1", upstream.port, "alice", "wrong")
        async with EgressProxy(
            allow_all, upstream=Upstream(proxy, proxy), on_decision=decisions.append
        ) as egress:
            out = await via_connect(egress, f"origin.test:{origin.port}")
    assert out.startswith(b"HTTP/1.1 407 Refused by the upstream proxy"), out
    assert b"407 Proxy Authentication Required" in out
    assert b"piwork network proxy set http://USER@127.0.0.1" in out
    assert decisions[-1].reason == "upstream proxy" and not decisions[-1].allowed
    assert origin.requests == []


async def test_an_unreachable_upstream_proxy_is_said(origin: Origin) -> None:
    proxy = UpstreamProxy(ProxyKind.SOCKS5H, "127.0.0.1", 1, source="$HTTPS_PROXY")
    async with EgressProxy(allow_all, upstream=Upstream(proxy, proxy)) as egress:
        out = await via_connect(egress, f"origin.test:{origin.port}")
    assert out.startswith(b"HTTP/1.1 502"), out
    assert b"cannot reach the upstream proxy socks5h://127.0.0.1:1 ($HTTPS_PROXY)" in out


async def test_socks5h_hands_over_the_name_and_socks5_the_vetted_address(origin: Origin) -> None:
    """192.0.2.10 is a documentation address (private to the guard): allowed for this
    test's domain; socks5:// hands the proxy the address the guard vetted."""
    asked: list[tuple[str, int, str]] = []

    async def private(host: str, port: int, address: str) -> bool:
        asked.append((host, port, address))
        return True

    async with Socks5Proxy(
        hosts={"origin.test": "127.0.0.1", "192.0.2.10": "127.0.0.1"}, credentials=("bob", "pw")
    ) as upstream:
        by_name = UpstreamProxy(ProxyKind.SOCKS5H, "127.0.0.1", upstream.port, "bob", "pw")
        async with EgressProxy(allow_all, upstream=Upstream(by_name, by_name)) as egress:
            assert b"ORIGIN-OK" in await via_connect(egress, f"origin.test:{origin.port}")
        by_addr = UpstreamProxy(ProxyKind.SOCKS5, "127.0.0.1", upstream.port, "bob", "pw")
        async with EgressProxy(
            allow_all, upstream=Upstream(by_addr, by_addr), private_policy=private
        ) as egress:
            assert b"ORIGIN-OK" in await via_connect(egress, f"192.0.2.10:{origin.port}")
            # plain HTTP through a SOCKS proxy is a tunnel too
            assert b"ORIGIN-OK" in await via_get(egress, f"http://192.0.2.10:{origin.port}/")
    assert upstream.log.targets[:2] == [("origin.test", origin.port), ("192.0.2.10", origin.port)]
    assert upstream.address_types[:2] == [3, 1]
    assert upstream.log.auth[:2] == ["bob", "bob"]
    assert asked == [("192.0.2.10", origin.port, "192.0.2.10")]


async def test_loopback_and_no_proxy_go_direct(origin: Origin) -> None:
    async with HttpConnectProxy() as upstream:
        proxy = UpstreamProxy(ProxyKind.HTTP, "127.0.0.1", upstream.port, no_proxy=("direct.test",))
        async with EgressProxy(
            allow_all, upstream=Upstream(proxy, proxy), allow_private_networks=True
        ) as egress:
            assert b"ORIGIN-OK" in await via_connect(egress, f"localhost:{origin.port}")
    assert upstream.log.heads == []


async def test_a_private_destination_is_refused_until_allowed(origin: Origin) -> None:
    """The guard asks its own question naming the address; no answer means refused,
    and the refusal says so and how to allow it."""
    decisions: list[EgressDecision] = []
    answers = [False, True]
    asked: list[tuple[str, int, str]] = []

    async def private(host: str, port: int, address: str) -> bool:
        asked.append((host, port, address))
        return answers.pop(0)

    async with EgressProxy(
        allow_all, private_policy=private, on_decision=decisions.append, cache_decisions=False
    ) as egress:
        refused = await via_connect(egress, f"localhost:{origin.port}")
        allowed = await via_connect(egress, f"localhost:{origin.port}")
    assert refused.startswith(b"HTTP/1.1 403 Forbidden by piwork: localhost resolves to a private")
    assert b"piwork network allow-private localhost" in refused
    assert decisions[0].reason == "private address" and not decisions[0].allowed
    assert "127.0.0.1" in decisions[0].detail or "::1" in decisions[0].detail
    assert b"ORIGIN-OK" in allowed
    assert [a[0] for a in asked] == ["localhost", "localhost"]
    assert len(origin.requests) == 1
