"""The upstream proxy: how the model gateway and the egress proxy reach the outside.

Many offices allow no direct connection out: every program goes through an
HTTP proxy (``CONNECT host:443``) or a SOCKS5 proxy. piwork finds the one the
person uses, first found wins:

1. ``settings.json`` ``network.proxy.url`` (``piwork network proxy set URL``, the
   app's Settings → Network), with ``network.proxy.noProxy``;
2. unless ``network.proxy.useSystem`` is false: the environment piwork was
   started with (``https_proxy``/``HTTPS_PROXY`` for tunnels, ``http_proxy``/
   ``HTTP_PROXY`` for plain HTTP, ``all_proxy``/``ALL_PROXY`` for both,
   ``no_proxy``/``NO_PROXY``);
3. the system settings where the platform has them: macOS (``scutil --proxy``)
   and GNOME (``gsettings``, mode "manual").

A password comes from the proxy URL in the environment or from the keyring
(name ``proxy:HOST:PORT``; ``piwork network proxy set URL --password-stdin``
stores it there, never in settings.json). It is used only by the host: the
guest's proxy is always piwork's own egress proxy.

What goes through it: every TLS connection as a tunnel (HTTP ``CONNECT`` or
SOCKS5), so the proxy sees the destination name and port and then encrypted
bytes, never a model key; a plain-HTTP request from the guest (apt's) is
forwarded to an HTTP proxy in absolute form (``GET http://host/path``), as
apt itself would, because proxies commonly refuse ``CONNECT`` to port 80.
The gateway tunnels even a plain-HTTP provider, so its key never crosses the
proxy in clear. Loopback names and addresses are always reached directly.

``socks5://`` resolves names here and hands the proxy the address (curl's
meaning); ``socks5h://`` and the HTTP kinds hand it the name.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import os
import re
import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from piwork.config import Paths
from piwork.errors import PersonError, UsageError
from piwork.net import config as netconfig

if TYPE_CHECKING:
    import aiohttp

    from piwork.auth import KeyStore


class ProxyKind(StrEnum):
    HTTP = "http"
    HTTPS = "https"  # HTTP CONNECT to a proxy spoken to over TLS
    SOCKS5 = "socks5"  # names resolved here
    SOCKS5H = "socks5h"  # names resolved by the proxy


DEFAULT_PORTS = {
    ProxyKind.HTTP: 80,
    ProxyKind.HTTPS: 443,
    ProxyKind.SOCKS5: 1080,
    ProxyKind.SOCKS5H: 1080,
}


class ProxyUrlError(ValueError, UsageError):
    """A proxy URL piwork cannot use; says what a good one looks like."""


class UpstreamError(PersonError):
    """The upstream proxy could not be reached or refused; names it and its answer."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def key_name(host: str, port: int) -> str:
    """The keyring entry holding the password for the proxy at ``host:port``."""
    return f"proxy:{host}:{port}"


@dataclass(frozen=True)
class UpstreamProxy:
    """One proxy server and how to talk to it."""

    kind: ProxyKind
    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    source: str = "settings"
    """Where it was found, for `piwork network show` and doctor."""
    no_proxy: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        """The URL to show: never the password."""
        user = f"{self.username}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.kind.value}://{user}{host}:{self.port}"

    @property
    def remote_dns(self) -> bool:
        """The proxy is handed names (not addresses resolved here)."""
        return self.kind is not ProxyKind.SOCKS5

    @property
    def http(self) -> bool:
        return self.kind in (ProxyKind.HTTP, ProxyKind.HTTPS)

    def routes(self, host: str) -> bool:
        """Connections to ``host`` go through this proxy (not loopback, not ``NO_PROXY``)."""
        return not is_loopback(host) and not bypassed(host, self.no_proxy)

    def authorization(self) -> str | None:
        """``Proxy-Authorization`` for an HTTP proxy with credentials."""
        if not self.http or not self.username:
            return None
        raw = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")

    def _python_socks(self, proxy_ssl: ssl.SSLContext | None) -> object:
        from python_socks import ProxyType
        from python_socks.async_.asyncio.v2 import Proxy

        kind = ProxyType.HTTP if self.http else ProxyType.SOCKS5
        return Proxy(
            proxy_type=kind,
            host=self.host,
            port=self.port,
            username=self.username,
            password=self.password if self.username else None,
            rdns=self.remote_dns,
            proxy_ssl=proxy_ssl if self.kind is ProxyKind.HTTPS else None,
        )

    async def tunnel(
        self, host: str, port: int, *, timeout: float, proxy_ssl: ssl.SSLContext | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A byte stream to ``host:port`` through the proxy (HTTP CONNECT or SOCKS5).

        Raises :class:`UpstreamError` saying which proxy and what it answered.
        """
        proxy = self._python_socks(proxy_ssl)
        try:
            stream = await proxy.connect(dest_host=host, dest_port=port, timeout=timeout)  # type: ignore[attr-defined]
        except Exception as exc:
            raise self.explain(exc, host, port) from exc
        return stream.reader, stream.writer

    async def open_forward(
        self, *, timeout: float, proxy_ssl: ssl.SSLContext | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the HTTP proxy itself, for one absolute-form request."""
        assert self.http
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=proxy_ssl if self.kind is ProxyKind.HTTPS else None,
                    limit=64 * 1024,
                ),
                timeout,
            )
        except Exception as exc:
            raise self.explain(exc, "", 0) from exc

    def explain(self, exc: BaseException, host: str, port: int) -> UpstreamError:
        """What went wrong with this proxy, for a person (re-raises what is not a
        connection failure: a bug stays a bug)."""
        import python_socks

        if isinstance(exc, python_socks.ProxyError):
            return self._refused(host, port, str(exc), exc.error_code)
        if isinstance(exc, ssl.SSLCertVerificationError):
            return UpstreamError(
                f"the certificate of {host or self.host} is not trusted here "
                f"({exc.verify_message}); {CA_HINT}"
            )
        if isinstance(exc, TimeoutError | python_socks.ProxyTimeoutError):
            return UpstreamError(f"the upstream proxy {self.url} did not answer in time")
        if isinstance(exc, python_socks.ProxyConnectionError | OSError):
            return UpstreamError(
                f"cannot reach the upstream proxy {self.url} ({self.source}): {exc}"
            )
        raise exc

    def _refused(self, host: str, port: int, said: str, code: object) -> UpstreamError:
        hint = ""
        if code == 407 or "authentication" in said.lower():
            hint = (
                " - it wants a user name and password: `piwork network proxy set "
                f"{self.kind.value}://USER@{self.host}:{self.port} --password-stdin`"
            )
        status = code if isinstance(code, int) and 100 <= code < 600 else None
        return UpstreamError(
            f"the upstream proxy {self.url} refused {host}:{port}: {said}{hint}", status=status
        )

    def connector(self, ssl_context: ssl.SSLContext) -> aiohttp.BaseConnector:
        """An aiohttp connector whose every connection is a tunnel through this proxy;
        its failures are ``aiohttp.ClientConnectionError``s naming the proxy."""
        from python_socks import ProxyType

        return _proxy_connector_class()(
            self,
            proxy_type=ProxyType.HTTP if self.http else ProxyType.SOCKS5,
            host=self.host,
            port=self.port,
            username=self.username,
            password=self.password if self.username else None,
            rdns=self.remote_dns,
            proxy_ssl=ssl_context if self.kind is ProxyKind.HTTPS else None,
            ssl=ssl_context,
        )


@functools.cache
def _proxy_connector_class() -> Callable[..., aiohttp.BaseConnector]:
    """aiohttp-socks' connector, its errors made aiohttp's (imported when first used)."""
    import aiohttp
    import python_socks
    from aiohttp_socks import ProxyConnector

    class UpstreamConnectError(aiohttp.ClientConnectionError):
        """The upstream proxy could not be reached, refused, or the site's certificate
        did not verify (the text says which, and names the proxy)."""

    class Connector(ProxyConnector):
        def __init__(self, proxy: UpstreamProxy, **kwargs: object) -> None:
            super().__init__(**kwargs)  # type: ignore[arg-type]
            self._piwork_proxy = proxy

        async def _connect_via_proxy(self, host: str, port: int, *args: object, **kw: object):  # type: ignore[no-untyped-def]
            try:
                return await super()._connect_via_proxy(host, port, *args, **kw)  # type: ignore[arg-type]
            except (python_socks.ProxyError, python_socks.ProxyTimeoutError, OSError) as exc:
                raise UpstreamConnectError(
                    str(self._piwork_proxy.explain(exc, host, port))
                ) from exc

    return Connector


CA_HINT = (
    "if your network inspects TLS, add its certificate authority: "
    "`piwork network ca add FILE` (or Settings → Network)"
)


@dataclass(frozen=True)
class Upstream:
    """The proxies to use: one for tunnels (TLS and anything else), one for plain HTTP."""

    tunnel: UpstreamProxy | None = None
    plain: UpstreamProxy | None = None

    def for_tunnel(self, host: str) -> UpstreamProxy | None:
        return self.tunnel if self.tunnel is not None and self.tunnel.routes(host) else None

    def for_plain_http(self, host: str) -> UpstreamProxy | None:
        """The proxy for an absolute-form request to ``host``; a SOCKS proxy tunnels it."""
        return self.plain if self.plain is not None and self.plain.routes(host) else None

    @property
    def any(self) -> UpstreamProxy | None:
        return self.tunnel or self.plain


NONE = Upstream()


def gateway_connector(
    upstream: Upstream, origin: str, ssl_context: Callable[[], ssl.SSLContext]
) -> aiohttp.BaseConnector:
    """The model gateway's connector for a provider at ``origin`` (``https://host``): a
    tunnel through the upstream proxy unless ``NO_PROXY`` or loopback says direct;
    TLS verified with ``ssl_context()`` (the system store and the extra CAs; not made
    for a plain-HTTP provider reached directly)."""
    import aiohttp

    parts = urlsplit(origin)
    host = parts.hostname or ""
    proxy = upstream.for_tunnel(host) if parts.scheme == "https" else None
    if parts.scheme != "https" and upstream.plain is not None and upstream.plain.routes(host):
        proxy = upstream.plain  # tunnelled too: a key never crosses a proxy in clear text
    if proxy is None:
        return aiohttp.TCPConnector(ssl=ssl_context() if parts.scheme == "https" else True)
    return proxy.connector(ssl_context())


# --- parsing ------------------------------------------------------------------


def parse_proxy_url(text: str, *, source: str = "settings") -> UpstreamProxy:
    """``http://[user[:password]@]host[:port]`` (also https, socks5, socks5h; a bare
    ``host:port`` is HTTP, as curl takes it). Raises :class:`ProxyUrlError`."""
    raw = text.strip()
    if not raw:
        raise ProxyUrlError("empty proxy URL")
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    scheme = parts.scheme.lower()
    if scheme == "socks":
        scheme = "socks5"
    try:
        kind = ProxyKind(scheme)
    except ValueError:
        raise ProxyUrlError(
            f"proxy {text!r}: piwork speaks http://, https://, socks5:// and socks5h:// "
            "proxies (HTTP CONNECT and SOCKS5)"
        ) from None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ProxyUrlError(f"proxy {text!r}: give scheme://host:port, nothing after the port")
    try:
        host = parts.hostname
        port = parts.port or DEFAULT_PORTS[kind]
    except ValueError as exc:
        raise ProxyUrlError(f"proxy {text!r}: bad port ({exc})") from None
    if not host or any(c.isspace() for c in host):
        raise ProxyUrlError(f"proxy {text!r}: no host name")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    return UpstreamProxy(kind, host, port, user or None, password, source)


def split_no_proxy(text: str) -> tuple[str, ...]:
    return tuple(e.strip().lower() for e in re.split(r"[,\s]+", text) if e.strip())


def is_loopback(host: str) -> bool:
    h = host.strip("[]").lower().rstrip(".")
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def bypassed(host: str, entries: tuple[str, ...]) -> bool:
    """``host`` matches ``NO_PROXY`` (curl's rules: ``*`` is every host; ``example.com``
    and ``.example.com`` match it and its subdomains; an IP or CIDR matches addresses)."""
    h = host.strip("[]").lower().rstrip(".")
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(h)
    except ValueError:
        addr = None
    for entry in entries:
        e = entry.strip().lower()
        if e == "*":
            return True
        if addr is not None:
            try:
                if addr in ipaddress.ip_network(e.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
            continue
        if e.startswith("["):
            continue
        e = re.sub(r":\d+$", "", e).lstrip("*").lstrip(".").rstrip(".")
        if e and (h == e or h.endswith("." + e)):
            return True
    return False


def _env(env: Mapping[str, str], name: str) -> str | None:
    for key in (name.lower(), name.upper()):
        value = env.get(key, "").strip()
        if value:
            return value
    return None


def from_environment(env: Mapping[str, str]) -> Upstream:
    """``https_proxy``/``http_proxy``/``all_proxy`` and ``no_proxy`` (lowercase first)."""
    no_proxy = split_no_proxy(_env(env, "no_proxy") or "")
    found: dict[str, UpstreamProxy | None] = {}
    roles = (("tunnel", ("https_proxy", "all_proxy")), ("plain", ("http_proxy", "all_proxy")))
    for role, names in roles:
        found[role] = None
        for name in names:
            value = _env(env, name)
            if value:
                source = f"${name.upper()}"
                found[role] = replace(parse_proxy_url(value, source=source), no_proxy=no_proxy)
                break
    return Upstream(found["tunnel"], found["plain"])


_SCUTIL_LINE = re.compile(r"^\s*(\w+)\s*:\s*(.*?)\s*$")
_SCUTIL_ITEM = re.compile(r"^\s*\d+\s*:\s*(.*?)\s*$")


def from_scutil(text: str) -> Upstream:
    """macOS ``scutil --proxy`` output: the HTTPS (else SOCKS) proxy for tunnels, the
    HTTP (else SOCKS) one for plain HTTP, ``ExceptionsList`` as ``NO_PROXY``."""
    values: dict[str, str] = {}
    exceptions: list[str] = []
    in_list = False
    for line in text.splitlines():
        if "ExceptionsList" in line and "<array>" in line:
            in_list = True
            continue
        if in_list:
            if line.strip() == "}":
                in_list = False
                continue
            item = _SCUTIL_ITEM.match(line)
            if item:
                exceptions.append(item.group(1))
            continue
        m = _SCUTIL_LINE.match(line)
        if m:
            values[m.group(1)] = m.group(2)
    no_proxy = tuple(e.lower() for e in exceptions)

    def pick(prefix: str, kind: ProxyKind) -> UpstreamProxy | None:
        if values.get(f"{prefix}Enable") != "1" or not values.get(f"{prefix}Proxy"):
            return None
        port = values.get(f"{prefix}Port", "")
        return UpstreamProxy(
            kind,
            values[f"{prefix}Proxy"],
            int(port) if port.isdigit() else DEFAULT_PORTS[kind],
            source="macOS network settings",
            no_proxy=no_proxy,
        )

    socks = pick("SOCKS", ProxyKind.SOCKS5H)
    return Upstream(pick("HTTPS", ProxyKind.HTTP) or socks, pick("HTTP", ProxyKind.HTTP) or socks)


def from_gsettings(get: Callable[[str, str], str | None]) -> Upstream:
    """GNOME's proxy settings (mode "manual"); ``get(schema, key)`` is gsettings' value."""

    def text(schema: str, key: str) -> str:
        return (get(schema, key) or "").strip().strip("'\"")

    if text("org.gnome.system.proxy", "mode") != "manual":
        return NONE
    ignore = get("org.gnome.system.proxy", "ignore-hosts") or ""
    no_proxy = tuple(h.lower() for h in re.findall(r"'([^']*)'", ignore))

    def pick(sub: str, kind: ProxyKind) -> UpstreamProxy | None:
        schema = f"org.gnome.system.proxy.{sub}"
        host, port = text(schema, "host"), text(schema, "port")
        if not host or not port.isdigit() or port == "0":
            return None
        return UpstreamProxy(
            kind, host, int(port), source="GNOME proxy settings", no_proxy=no_proxy
        )

    socks = pick("socks", ProxyKind.SOCKS5H)
    return Upstream(pick("https", ProxyKind.HTTP) or socks, pick("http", ProxyKind.HTTP) or socks)


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def from_system() -> Upstream:
    """The platform's own proxy settings, where piwork can read them."""
    if sys.platform == "darwin" and shutil.which("scutil"):
        return from_scutil(_run(["scutil", "--proxy"]) or "")
    if sys.platform.startswith("linux") and shutil.which("gsettings"):
        return from_gsettings(lambda schema, key: _run(["gsettings", "get", schema, key]))
    return NONE


def _with_password(proxy: UpstreamProxy | None, keys: KeyStore | None) -> UpstreamProxy | None:
    if proxy is None or proxy.password is not None or not proxy.username or keys is None:
        return proxy
    try:
        password = keys.get(key_name(proxy.host, proxy.port))
    except Exception:  # a keyring that cannot be read: go on without, the proxy says 407
        password = None
    if password is None:
        return proxy
    return replace(proxy, password=password)


def resolve(
    paths: Paths,
    *,
    env: Mapping[str, str] | None = None,
    system: Callable[[], Upstream] = from_system,
    keys: KeyStore | None = None,
) -> Upstream:
    """The upstream proxy for this host (see the module docstring for the order)."""
    settings = netconfig.load(paths).proxy
    if settings.url:
        proxy = replace(
            parse_proxy_url(settings.url, source="piwork settings"),
            no_proxy=split_no_proxy(settings.no_proxy),
        )
        found = Upstream(proxy, proxy)
    elif not settings.use_system:
        return NONE
    else:
        found = from_environment(os.environ if env is None else env)
        if found.any is None:
            found = system()
        if settings.no_proxy and found.any is not None:
            extra = split_no_proxy(settings.no_proxy)
            found = Upstream(
                *(replace(p, no_proxy=p.no_proxy + extra) if p else None
                  for p in (found.tunnel, found.plain))
            )  # fmt: skip
    if keys is None and found.any is not None:
        from piwork.auth import KeyStore

        keys = KeyStore(paths=paths)
    return Upstream(_with_password(found.tunnel, keys), _with_password(found.plain, keys))


__all__ = [
    "NONE",
    "ProxyKind",
    "ProxyUrlError",
    "Upstream",
    "UpstreamError",
    "UpstreamProxy",
    "bypassed",
    "from_environment",
    "from_gsettings",
    "from_scutil",
    "gateway_connector",
    "is_loopback",
    "key_name",
    "parse_proxy_url",
    "resolve",
    "split_no_proxy",
]
