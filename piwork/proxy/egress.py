"""The egress proxy: the VM's only way to the internet, one domain at a time.

The VM has no network card: nothing leaves it except the two addresses the
netmux carries (``piwork.vm.netmux``). One of them (``10.0.2.101:3128`` in
the guest) leads here, and the guest's ``HTTP_PROXY``/``HTTPS_PROXY`` point at it. The
proxy speaks just enough HTTP/1.1 for that job:

* ``CONNECT host:port``: a byte tunnel for TLS whose ClientHello names that
  host (SNI; no encrypted ClientHello), or for plain HTTP whose one request
  has that ``Host`` (undici tunnels ``http://`` too); TLS stays end to end;
* absolute-form requests (``GET http://host/path``): relayed to the origin
  with ``Host`` set to the vetted authority and ``Connection: close``.

Either way one request goes per connection, its body exactly as framed
(``Content-Length`` or chunked, re-framed); what the guest pipelines after it
is never sent. Every byte read is parsed by ``piwork.proxy.http1`` (strict,
fuzzed): what some HTTP implementation could read two ways is refused.

Before connecting anywhere it asks ``domain_policy(host, port)`` (the
runner's bridge to the policy store, which may ask the person). A denial is
a ``403`` with a plain-text reason the model can read (curl prints it for
plain HTTP; for CONNECT the reason phrase carries it). Destinations that
resolve to loopback, private, reserved or link-local addresses are refused
unless ``private_policy(host, port, address)`` allows that domain (a question
of its own, naming the address: ``piwork.net``) or ``allow_private_networks``:
otherwise an allowed name could reach the host's own services (the model
gateway, a database) through DNS.

Connections leave through the person's upstream proxy when there is one
(``upstream``: :mod:`piwork.net.upstream`): HTTP CONNECT or SOCKS5 tunnels, and
plain HTTP forwarded to an HTTP proxy in absolute form. Every refusal says its
real reason (:data:`REASONS`): the person's policy, the private-address
guard, a name that does not resolve, the upstream proxy's answer, a failed
connection.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import ipaddress
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache

from publicsuffixlist import PublicSuffixList

from piwork.env.registries import registry_domains
from piwork.errors import ProtocolError, UsageError
from piwork.net.addresses import is_public
from piwork.net.upstream import NONE as NO_UPSTREAM
from piwork.net.upstream import Upstream, UpstreamError, UpstreamProxy
from piwork.proxy.http1 import (
    BadRequest,
    ChunkedBody,
    Framing,
    RequestHead,
    body_framing,
    client_hello_sni,
    parse_head,
)
from piwork.proxy.registry_tls import RunCA, TlsServerStream
from piwork.vm.command import EGRESS_GUEST_ADDR, GATEWAY_GUEST_ADDR

log = logging.getLogger(__name__)

DomainPolicy = Callable[[str, int], Awaitable[bool]]
"""``(host, port) -> allowed?``; may take as long as the person takes to answer."""
PrivatePolicy = Callable[[str, int, str], Awaitable[bool]]
"""``(host, port, private address) -> allowed?``: may the guest reach ``host`` although
it resolves to a private or reserved address (named in the question)?"""

REASONS = {
    "policy": "your network policy",
    "private address": "the private-address guard",
    "dns": "the name does not resolve",
    "upstream proxy": "the upstream proxy",
    "connect failed": "the connection failed",
    "sni": "the tunnel's TLS name check",
    "host": "the tunnel's Host check",
}
"""``EgressDecision.reason`` values, and how a front end names each."""

# Derived from the one definition of the guest's addresses (piwork.vm.command).
GUEST_PROXY_URL = f"http://{EGRESS_GUEST_ADDR[0]}:{EGRESS_GUEST_ADDR[1]}"
GUEST_GATEWAY_HOST = GATEWAY_GUEST_ADDR[0]

_HEADER_LIMIT = 64 * 1024
MAX_CONNECTIONS = 64
"""Concurrent client connections (the guest's netmux caps its streams at 64 too);
past it a connection is closed at once, before anything is read or decided."""
_BUF = 64 * 1024
_HOST_RE = re.compile(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
_REQUEST_DROP = frozenset(
    {
        "proxy-connection",
        "proxy-authorization",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
    }
)


DOWNLOAD_ONLY = frozenset(registry_domains())
_FRAMING_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})
"""Set by the proxy from what it parsed, never copied from the guest."""


PROXY_USER = "piwork"
"""User name in the guest's proxy URL; only the password (the run's token) is checked."""


def proxy_url_with_token(proxy_url: str, token: str) -> str:
    """``http://piwork:<token>@host:port``: curl and undici (pi) send it as
    ``Proxy-Authorization: Basic`` on every request and CONNECT."""
    scheme, sep, rest = proxy_url.partition("://")
    if not sep or "@" in rest:
        raise ValueError(f"expected http://host:port, got {proxy_url!r}")
    return f"{scheme}://{PROXY_USER}:{token}@{rest}"


def guest_proxy_env(
    proxy_url: str = GUEST_PROXY_URL, no_proxy: tuple[str, ...] = (GUEST_GATEWAY_HOST,)
) -> dict[str, str]:
    """Environment for pi (and its tools) in the guest.

    The model gateway must stay in ``NO_PROXY``: pi honours ``HTTPS_PROXY``
    and would otherwise send its model traffic to the egress proxy.
    """
    bypass = ",".join(("localhost", "127.0.0.1", *no_proxy))
    return {
        "HTTP_PROXY": proxy_url,
        "HTTPS_PROXY": proxy_url,
        "http_proxy": proxy_url,
        "https_proxy": proxy_url,
        "NO_PROXY": bypass,
        "no_proxy": bypass,
    }


@dataclass(frozen=True)
class EgressDecision:
    """One destination check, for the runner's transcript/audit."""

    host: str
    port: int
    method: str
    allowed: bool
    reason: str
    """One of :data:`REASONS`."""
    detail: str = ""
    """For a refusal: what happened and what to do, one line (the guest reads it too)."""


class _Refusal(ProtocolError):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def normalize_host(host: str) -> str:
    """Lowercase, no trailing dot, IDNA-encoded; IP literals unbracketed.

    Raises ValueError for anything that is not a plausible host name, so the
    policy is never asked about junk like ``evil.com@good.com``.
    """
    h = host.strip()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(h))
    h = h.rstrip(".").lower()
    try:
        h = h.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ValueError(f"invalid host name {host!r}") from exc
    if not h or len(h) > 253 or not _HOST_RE.match(h):
        raise ValueError(f"invalid host name {host!r}")
    return h


class AllowNetError(ValueError, UsageError):
    """An ``--allow-net`` entry that is not a domain piwork can allow; says why."""


@cache
def _psl() -> PublicSuffixList:
    return PublicSuffixList()  # the list bundled with the pinned package; no network


def normalize_allowed_domain(entry: str) -> str:
    """One ``--allow-net`` entry as the proxy will compare it: lowercase, no
    trailing dot, IDNA (``Bücher.DE.`` -> ``xn--bcher-kva.de``).

    Refuses what would open far more than the person meant: a single label
    (``com``, ``localhost``) or any public suffix (``co.uk``, ``github.io``),
    since an entry allows the name *and all its subdomains*. IP addresses and
    wildcards are refused too (the proxy matches names).
    """
    text = entry.strip()
    if text.startswith("*."):
        text = text[2:]  # "*.example.com" means what "example.com" already does
    if not text or any(c in text for c in "*/:@ "):
        raise AllowNetError(
            f"--allow-net {entry!r}: give a domain name such as example.com "
            "(no scheme, port, path or wildcard; subdomains are included)"
        )
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        pass
    else:
        raise AllowNetError(f"--allow-net {entry!r}: give a domain name, not an IP address")
    try:
        host = normalize_host(text)
    except ValueError as exc:
        raise AllowNetError(f"--allow-net {entry!r}: not a valid domain name") from exc
    if host == "localhost":
        # RFC 6761's loopback name: allowing it opens nothing public, and the
        # proxy still refuses loopback addresses unless private networks are on.
        return host
    if "." not in host:
        raise AllowNetError(
            f"--allow-net {entry!r}: a single label would allow every name under it; "
            "name a registered domain such as example.com"
        )
    if _psl().is_public(host):
        raise AllowNetError(
            f"--allow-net {entry!r}: {host} is a public suffix (anyone can register names "
            "under it), so it would allow sites of many owners; name the domain itself, "
            f"e.g. example.{host}"
        )
    return host


def domain_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """``host`` (normalised by the proxy) is an allowed domain or one of its subdomains."""
    return any(host == d or host.endswith("." + d) for d in allowed)


def _split_host_port(authority: str, default_port: int) -> tuple[str, int]:
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise ValueError(f"bad address {authority!r}")
        host, rest = authority[: end + 1], authority[end + 1 :]
        port_s = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad address {authority!r}")
    elif authority.count(":") == 1:
        host, port_s = authority.split(":")
    else:
        host, port_s = authority, ""
    port = int(port_s) if port_s else default_port
    if not 0 < port < 65536:
        raise ValueError(f"bad port in {authority!r}")
    return normalize_host(host), port


def absolute_url(host: str, port: int, path: str) -> str:
    """``http://host[:port]/path`` from the vetted host and port (IPv6 bracketed)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}{'' if port == 80 else f':{port}'}{path}"


@dataclass(frozen=True)
class _Hello:
    sni: str | None
    ech: bool
    raw: bytes
    """Every byte read from the tunnel so far (the ClientHello and what followed)."""


def _sni_mismatch(host: str, hello: _Hello) -> str | None:
    """Why the ClientHello may not go to ``host`` (the vetted CONNECT host), if it may not."""
    if hello.ech:
        return "an encrypted ClientHello hides the name it asks for"
    if _is_ip(host):
        return None if hello.sni is None else f"a server name ({hello.sni}) for an address"
    if hello.sni != host:
        return f"the TLS server name {hello.sni or '(none)'} is not the tunnel's host {host}"
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def head_method(data: bytes) -> str:
    """The method word of a request head, for the record (printable, bounded)."""
    word = data.split(b" ", 1)[0][:20]
    return word.decode("ascii", "replace") if word.isalpha() else "?"


class EgressProxy:
    """HTTP forward proxy on loopback that applies a per-domain policy.

    ``cache_decisions`` remembers each (host, port) answer for this proxy's
    life (one task run), so the person is asked once per destination; while
    a question is pending, further connections to the same place wait for
    that same answer instead of asking again.
    """

    def __init__(
        self,
        domain_policy: DomainPolicy,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        cache_decisions: bool = True,
        allow_private_networks: bool = False,
        connect_timeout: float = 15.0,
        header_timeout: float = 30.0,
        on_decision: Callable[[EgressDecision], None] | None = None,
        token: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
        download_only: frozenset[str] = DOWNLOAD_ONLY,
        registry_ca: RunCA | None = None,
        registry_trust: ssl.SSLContext | None = None,
        private_policy: PrivatePolicy | None = None,
        upstream: Upstream = NO_UPSTREAM,
        proxy_ssl: ssl.SSLContext | None = None,
    ) -> None:
        self._private_policy = private_policy
        self._private_decisions: dict[tuple[str, int], asyncio.Future[bool]] = {}
        self._upstream = upstream
        self._proxy_ssl = proxy_ssl
        self._max_connections = max_connections
        self._download_only = download_only
        self._registry_ca = registry_ca
        """With a run CA, TLS to ``download_only`` hosts ends here so their requests
        can be read (``piwork.proxy.registry_tls``); ``registry_trust`` verifies the
        real registry on the way on (the system store when None)."""
        self._registry_trust = registry_trust
        """Hosts (the package registries) that take only GET and HEAD, where the proxy
        can read the method: plain HTTP (apt's Debian). Inside TLS it cannot."""
        self.refused_connections = 0
        self._policy = domain_policy
        self._token = token
        self._host = host
        self._want_port = port
        self._port: int | None = None
        self._cache = cache_decisions
        self._allow_private = allow_private_networks
        self._connect_timeout = connect_timeout
        self._header_timeout = header_timeout
        self._on_decision = on_decision
        self._decisions: dict[tuple[str, int], asyncio.Future[bool]] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # --- lifecycle --------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("EgressProxy is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._on_client, self._host, self._want_port, limit=_HEADER_LIMIT
        )
        self._port = int(self._server.sockets[0].getsockname()[1])
        log.info("egress proxy listening on %s:%s", self._host, self._port)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)

    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- policy -----------------------------------------------------------------

    async def _decided(
        self,
        decisions: dict[tuple[str, int], asyncio.Future[bool]],
        key: tuple[str, int],
        ask: Callable[[], Awaitable[bool]],
    ) -> bool:
        """One answer per destination for the proxy's life (unless not caching); a
        question pending for it is shared; a failed check is refused, not remembered."""
        fut = decisions.get(key)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        decisions[key] = fut
        try:
            allowed = bool(await ask())
        except Exception as exc:
            log.warning("network policy check for %s:%s failed: %s", *key, exc)
            fut.set_result(False)
            del decisions[key]  # don't remember a failure
            return False
        except BaseException:
            fut.cancel()
            del decisions[key]
            raise
        fut.set_result(allowed)
        if not self._cache:
            del decisions[key]
        return allowed

    async def _allowed(self, host: str, port: int) -> bool:
        return await self._decided(self._decisions, (host, port), lambda: self._policy(host, port))

    async def _private_allowed(self, host: str, port: int, address: str) -> bool:
        policy = self._private_policy
        if policy is None:
            return False
        return await self._decided(
            self._private_decisions, (host, port), lambda: policy(host, port, address)
        )

    def _record(
        self, host: str, port: int, method: str, allowed: bool, reason: str, detail: str = ""
    ) -> None:
        log.info(
            "egress %s %s:%s -> %s (%s)%s",
            method,
            host,
            port,
            "allow" if allowed else "deny",
            reason,
            f": {detail}" if detail else "",
        )
        if self._on_decision is not None:
            try:
                self._on_decision(EgressDecision(host, port, method, allowed, reason, detail))
            except Exception:
                log.exception("egress decision callback failed")

    def _refuse_with(
        self, host: str, port: int, method: str, reason: str, refusal: _Refusal
    ) -> _Refusal:
        self._record(host, port, method, False, reason, refusal.message.strip())
        return refusal

    async def _open(
        self, host: str, port: int, method: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, UpstreamProxy | None]:
        """A connection for the request: to the destination, or (third item) to the
        HTTP upstream proxy that takes the request in absolute form."""
        if not await self._allowed(host, port):
            raise self._refuse_with(host, port, method, "policy", _Refusal(
                403,
                f"Forbidden by piwork network policy: {host}",
                f"piwork: network access to {host}:{port} is not allowed by the network "
                "policy for this task. Ask the person to allow this domain (or run piwork "
                f"with --allow-net {host}).\n",
            ))  # fmt: skip
        plain = method != "CONNECT"
        proxy = self._upstream.for_plain_http(host) if plain else self._upstream.for_tunnel(host)
        addrs = await self._resolve(host, port, method, proxy)
        if not self._allow_private:
            private = [a for a in addrs if not is_public(a)]
            if private and not await self._private_allowed(host, port, private[0]):
                raise self._refuse_with(host, port, method, "private address", _Refusal(
                    403,
                    f"Forbidden by piwork: {host} resolves to a private address",
                    f"piwork: {host} resolves to {private[0]}, a private or reserved address, "
                    "and the sandbox reaches those only for domains the person allows (they "
                    "could be services on their own network or computer). If this is your "
                    "network's proxy or mirror, allow it: `piwork network allow-private "
                    f"{host}` (or answer piwork's question).\n",
                ))  # fmt: skip
        if proxy is not None:
            return await self._through(proxy, host, port, method, addrs, forward=plain)
        last: Exception | None = None
        for addr in dict.fromkeys(addrs):  # connect to what was vetted, not a re-resolve
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(addr, port, limit=_BUF), self._connect_timeout
                )
            except (OSError, TimeoutError) as exc:
                last = exc
                continue
            self._record(host, port, method, True, "policy")
            return reader, writer, None
        raise self._refuse_with(host, port, method, "connect failed", _Refusal(
            504 if isinstance(last, TimeoutError) else 502,
            "Bad Gateway",
            f"piwork egress proxy: cannot connect to {host}:{port}: {last or 'no address'}\n",
        ))  # fmt: skip

    async def _resolve(
        self, host: str, port: int, method: str, proxy: UpstreamProxy | None
    ) -> list[str]:
        """The addresses ``host`` has here. Empty when only the upstream proxy can
        resolve it (common behind one): the proxy is then handed the name."""
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), self._connect_timeout
            )
        except (OSError, TimeoutError) as exc:
            if proxy is not None and proxy.remote_dns:
                return []
            raise self._refuse_with(host, port, method, "dns", _Refusal(
                502, "Bad Gateway", f"piwork egress proxy: cannot resolve {host}: {exc}\n"
            )) from exc  # fmt: skip
        return [str(info[4][0]) for info in infos]

    async def _through(
        self,
        proxy: UpstreamProxy,
        host: str,
        port: int,
        method: str,
        addrs: list[str],
        *,
        forward: bool,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, UpstreamProxy | None]:
        """Through the upstream proxy: plain HTTP to an HTTP proxy is forwarded as a
        request; anything else is a tunnel (to the vetted address for ``socks5://``)."""
        try:
            if forward and proxy.http:
                reader, writer = await proxy.open_forward(
                    timeout=self._connect_timeout, proxy_ssl=self._proxy_ssl
                )
                self._record(host, port, method, True, "policy", f"via {proxy.url}")
                return reader, writer, proxy
            target = host if proxy.remote_dns or not addrs else addrs[0]
            reader, writer = await proxy.tunnel(
                target, port, timeout=self._connect_timeout, proxy_ssl=self._proxy_ssl
            )
        except UpstreamError as exc:
            raise self._refuse_with(host, port, method, "upstream proxy", _Refusal(
                exc.status if exc.status in (403, 407) else 502,
                "Refused by the upstream proxy" if exc.status else "Bad Gateway",
                f"piwork egress proxy: {exc}\n",
            )) from exc  # fmt: skip
        self._record(host, port, method, True, "policy", f"via {proxy.url}")
        return reader, writer, None

    # --- connections ----------------------------------------------------------

    def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tasks) >= self._max_connections:
            self.refused_connections += 1
            writer.transport.abort()
            return
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._header_timeout)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            try:
                await self._dispatch(head, reader, writer)
            except _Refusal as refusal:
                await self._refuse(writer, refusal)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("egress proxy connection failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _dispatch(
        self, raw_head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            head = parse_head(raw_head)
        except BadRequest as exc:
            raise _Refusal(400, "Bad Request", f"piwork egress proxy: {exc}\n") from exc
        if self._token is not None and not self._authorized(head.headers):
            raise _Refusal(
                407,
                "Proxy Authentication Required",
                "piwork egress proxy: this proxy serves only the task's VM; "
                "use the proxy URL from its HTTP(S)_PROXY environment\n",
            )
        method, target = head.method, head.target

        if method == "CONNECT":
            try:
                host, port = _split_host_port(target, 443)
            except ValueError as exc:
                raise _Refusal(400, "Bad Request", f"piwork egress proxy: {exc}\n") from exc
            up_reader, up_writer, _ = await self._open(host, port, "CONNECT")
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await self._tunnel(host, port, target, reader, writer, up_reader, up_writer)
            return

        if not target.lower().startswith("http://"):
            hint = (
                "use CONNECT for https"
                if target.lower().startswith("https://")
                else ("this is a proxy; send absolute URLs (http://host/path)")
            )
            raise _Refusal(400, "Bad Request", f"piwork egress proxy: {hint}\n")
        rest = target[7:]
        slash = rest.find("/")
        authority, path = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
        if "@" in authority:
            raise _Refusal(400, "Bad Request", "piwork egress proxy: credentials in URL refused\n")
        try:
            host, port = _split_host_port(authority, 80)
            framing = body_framing(head)
        except (ValueError, BadRequest) as exc:
            raise _Refusal(400, "Bad Request", f"piwork egress proxy: {exc}\n") from exc
        self._downloads_only(host, port, method, framing)
        up_reader, up_writer, via = await self._open(host, port, method)
        await self._forward_one(
            head, authority, path, framing, b"", reader, writer, up_reader, up_writer,
            via=(host, port, via) if via is not None else None,
        )  # fmt: skip

    def _downloads_only(self, host: str, port: int, method: str, framing: Framing) -> None:
        """A package registry takes downloads only: no ``npm publish``/upload (review 2,
        finding 8), refused before anything is connected."""
        if host in self._download_only and (method not in ("GET", "HEAD") or framing[0] != "none"):
            self._record(host, port, method, False, "policy", "downloads only")
            raise _Refusal(
                403,
                f"Forbidden by piwork: {host} allows downloads only",
                f"piwork: {host} is a package registry; the sandbox may download from it "
                f"(GET), not {method} to it (publishing and uploads are refused).\n",
            )

    async def _forward_one(
        self,
        head: RequestHead,
        authority: str,
        path: str,
        framing: Framing,
        pending: bytes,
        c_reader: asyncio.StreamReader,
        c_writer: asyncio.StreamWriter,
        u_reader: asyncio.StreamReader,
        u_writer: asyncio.StreamWriter,
        *,
        via: tuple[str, int, UpstreamProxy] | None = None,
    ) -> None:
        """One request, its body exactly as framed, and its response; then the
        connection closes. Bytes the guest pipelined after the body are never sent
        (review 1's residual of finding 17: they went to the origin raw). ``via``:
        the vetted host and port, sent in absolute form to this HTTP upstream proxy."""
        # Host is always the vetted authority: a guest Host naming another site on
        # the same server (a shared CDN edge) would reach a domain nobody allowed
        # (domain fronting; security review finding 17).
        out = [f"{head.method} {path} {head.version}", f"Host: {authority}"]
        if via is not None:  # an HTTP upstream proxy takes the request in absolute form
            out[0] = f"{head.method} {absolute_url(via[0], via[1], path)} {head.version}"
            if (auth := via[2].authorization()) is not None:
                out.append(f"Proxy-Authorization: {auth}")
        for name, value in head.headers:
            lname = name.lower()
            if lname in _REQUEST_DROP or lname in _FRAMING_HEADERS:
                continue
            out.append(f"{name}: {value}")
        kind, length = framing
        if kind == "length":
            out.append(f"Content-Length: {length}")
        elif kind == "chunked":
            out.append("Transfer-Encoding: chunked")
        out.append("Connection: close")
        try:
            u_writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
            await u_writer.drain()
            up = asyncio.create_task(self._send_body(framing, pending, c_reader, u_writer))
            try:
                await self._pipe_response_closing(u_reader, c_writer)
            finally:
                up.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, BadRequest):
                    await up
        finally:
            u_writer.close()
            with contextlib.suppress(Exception):
                await u_writer.wait_closed()

    @staticmethod
    async def _send_body(
        framing: Framing, pending: bytes, src: asyncio.StreamReader, dst: asyncio.StreamWriter
    ) -> None:
        """Exactly the request's body, re-framed; nothing the guest sent after it."""
        kind, left = framing
        if kind == "none":
            return
        chunked = ChunkedBody() if kind == "chunked" else None
        data = pending
        while True:
            if chunked is not None:
                dst.write(chunked.feed(data))
                if chunked.done:
                    break
            else:
                dst.write(data[:left])
                left -= len(data[:left])
                if left == 0:
                    break
            await dst.drain()
            data = await src.read(_BUF if chunked is not None else min(_BUF, left))
            if not data:
                return  # the guest stopped mid-body; the origin sees a short body
        await dst.drain()

    async def _tunnel(
        self,
        host: str,
        port: int,
        authority: str,
        c_reader: asyncio.StreamReader,
        c_writer: asyncio.StreamWriter,
        u_reader: asyncio.StreamReader,
        u_writer: asyncio.StreamWriter,
    ) -> None:
        """A CONNECT tunnel carries TLS naming the vetted host in its ClientHello, or
        plain HTTP whose ``Host`` is that host (undici tunnels ``http://`` too); the
        name inside cannot front another tenant of a shared server."""
        try:
            first = await asyncio.wait_for(c_reader.read(_BUF), self._header_timeout)
            if not first:
                return
            if first[0] == 0x16:  # a TLS handshake record
                hello = await self._client_hello(first, c_reader)
                wrong = _sni_mismatch(host, hello)
                if wrong:
                    self._record(host, port, "CONNECT", False, "sni")
                    log.warning("egress tunnel to %s:%s closed: %s", host, port, wrong)
                    return
                if self._registry_ca is not None and host in self._download_only:
                    await self._registry_request(host, port, hello.raw, c_reader, c_writer,
                                                 u_reader, u_writer)  # fmt: skip
                    return
                u_writer.write(hello.raw)
                await self._pipe_both(c_reader, c_writer, u_reader, u_writer)
                return
            await self._http_in_tunnel(
                (host, port), authority, first, c_reader, c_writer, u_reader, u_writer
            )
        except (BadRequest, TimeoutError, asyncio.LimitOverrunError) as exc:
            log.warning("egress tunnel to %s:%s closed: %s", host, port, exc)
        finally:
            u_writer.close()
            with contextlib.suppress(Exception):
                await u_writer.wait_closed()

    async def _registry_request(
        self,
        host: str,
        port: int,
        hello: bytes,
        c_reader: asyncio.StreamReader,
        c_writer: asyncio.StreamWriter,
        u_reader: asyncio.StreamReader,
        u_writer: asyncio.StreamWriter,
    ) -> None:
        """TLS to a package registry ends here: one request, a download only, its
        ``Host`` the tunnel's, sent on over the proxy's own TLS to the real registry."""
        assert self._registry_ca is not None
        guest = TlsServerStream(
            self._registry_ca.server_context(host), c_reader, c_writer, hello,
            self._header_timeout,
        )  # fmt: skip
        await guest.handshake()
        data = b""
        while b"\r\n\r\n" not in data:
            if len(data) > _HEADER_LIMIT:
                raise BadRequest("the request head is too large")
            more = await asyncio.wait_for(guest.read(), self._header_timeout)
            if not more:
                return
            data += more
        end = data.index(b"\r\n\r\n") + 4
        try:
            head = parse_head(data[:end])
            framing = body_framing(head)
            hosts = head.get_all("host")
            if not head.target.startswith("/"):
                raise BadRequest("a request in a tunnel is origin-form (/path)")
            if len(hosts) != 1 or _split_host_port(hosts[0], 443)[0] != host:
                raise BadRequest(f"the request's Host must be {host}, the tunnel's host")
            self._downloads_only(host, port, head.method, framing)
        except (BadRequest, ValueError, _Refusal) as exc:
            refusal = exc if isinstance(exc, _Refusal) else _Refusal(
                400, "Bad Request", f"piwork: {exc}\n"
            )  # fmt: skip
            await self._refuse(guest, refusal)  # type: ignore[arg-type]
            await guest.close()
            return
        trust = self._registry_trust or ssl.create_default_context()
        await u_writer.start_tls(trust, server_hostname=host)
        shown = host if port == 443 else f"{host}:{port}"
        out = [f"{head.method} {head.target} {head.version}", f"Host: {shown}"]
        dropped = _REQUEST_DROP | _FRAMING_HEADERS
        out += [f"{n}: {v}" for n, v in head.headers if n.lower() not in dropped]
        out.append("Connection: close")
        u_writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        await u_writer.drain()
        await self._pipe_response_closing(u_reader, guest)  # type: ignore[arg-type]
        await guest.close()

    async def _client_hello(self, data: bytes, src: asyncio.StreamReader) -> _Hello:
        while (hello := client_hello_sni(data)) is None:
            more = await asyncio.wait_for(src.read(_BUF), self._header_timeout)
            if not more:
                raise BadRequest("the tunnel closed inside its ClientHello")
            data += more
        return _Hello(hello.sni, hello.ech, data)

    async def _http_in_tunnel(
        self,
        dest: tuple[str, int],
        authority: str,
        data: bytes,
        c_reader: asyncio.StreamReader,
        c_writer: asyncio.StreamWriter,
        u_reader: asyncio.StreamReader,
        u_writer: asyncio.StreamWriter,
    ) -> None:
        while b"\r\n\r\n" not in data:
            if len(data) > _HEADER_LIMIT:
                raise BadRequest("the request head in the tunnel is too large")
            more = await asyncio.wait_for(c_reader.read(_BUF), self._header_timeout)
            if not more:
                return
            data += more
        end = data.index(b"\r\n\r\n") + 4
        host, port = dest
        try:
            head = parse_head(data[:end])
            framing = body_framing(head)
            if not head.target.startswith("/"):
                raise BadRequest("a request in a tunnel is origin-form (/path)")
            hosts = head.get_all("host")
            if len(hosts) != 1 or _split_host_port(hosts[0], 80)[0] != host:
                raise BadRequest(f"the request's Host must be {host}, the tunnel's host")
        except (BadRequest, ValueError) as exc:
            self._record(host, port, head_method(data), False, "host")
            await self._refuse(c_writer, _Refusal(400, "Bad Request", f"piwork: {exc}\n"))
            return
        try:
            self._downloads_only(host, port, head.method, framing)
        except _Refusal as refusal:
            await self._refuse(c_writer, refusal)
            return
        await self._forward_one(
            head, authority, head.target, framing, data[end:], c_reader, c_writer, u_reader,
            u_writer,
        )  # fmt: skip

    def _authorized(self, headers: tuple[tuple[str, str], ...]) -> bool:
        """``Proxy-Authorization: Basic`` carrying the run's token as its password."""
        assert self._token is not None
        for name, value in headers:
            if name.lower() != "proxy-authorization":
                continue
            scheme, _, cred = value.partition(" ")
            if scheme.lower() != "basic":
                return False
            try:
                decoded = base64.b64decode(cred.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            _, _, password = decoded.partition(b":")
            return hmac.compare_digest(password, self._token.encode())
        return False

    async def _refuse(self, writer: asyncio.StreamWriter, refusal: _Refusal) -> None:
        body = refusal.message.encode("utf-8")
        reason = refusal.reason.encode("ascii", "replace").decode("ascii")
        head = (
            f"HTTP/1.1 {refusal.status} {reason}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "X-Piwork-Egress: refused\r\n"
            + ('Proxy-Authenticate: Basic realm="piwork"\r\n' if refusal.status == 407 else "")
            + "Connection: close\r\n\r\n"
        ).encode("ascii")
        with contextlib.suppress(ConnectionError):
            writer.write(head + body)
            await writer.drain()

    async def _pipe_both(
        self,
        c_reader: asyncio.StreamReader,
        c_writer: asyncio.StreamWriter,
        u_reader: asyncio.StreamReader,
        u_writer: asyncio.StreamWriter,
        *,
        close_response: bool = False,
    ) -> None:
        """Copy both ways until both sides are done, honouring half-closes."""
        try:
            down = (
                self._pipe_response_closing(u_reader, c_writer)
                if close_response
                else self._pipe(u_reader, c_writer)
            )
            up = asyncio.create_task(self._pipe(c_reader, u_writer))
            try:
                await down
            finally:
                # The origin finished (or failed): nothing more to send it.
                up.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await up
        finally:
            u_writer.close()
            with contextlib.suppress(Exception):
                await u_writer.wait_closed()

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await src.read(_BUF):
                dst.write(chunk)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()

    @staticmethod
    async def _pipe_response_closing(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Relay an origin's response, forcing ``Connection: close`` in its head."""
        with contextlib.suppress(ConnectionError):
            try:
                head = await src.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                dst.write(exc.partial)
                await dst.drain()
                return
            except asyncio.LimitOverrunError:
                head = b""
            if head:
                lines = head.decode("latin-1").split("\r\n")
                kept = [
                    ln
                    for ln in lines[1:]
                    if ln
                    and ln.split(":", 1)[0].strip().lower()
                    not in ("connection", "keep-alive", "proxy-connection")
                ]
                dst.write(
                    ("\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n").encode(
                        "latin-1"
                    )
                )
            while chunk := await src.read(_BUF):
                dst.write(chunk)
                await dst.drain()


__all__ = [
    "REASONS",
    "DomainPolicy",
    "EgressDecision",
    "EgressProxy",
    "PrivatePolicy",
    "guest_proxy_env",
    "normalize_host",
]
