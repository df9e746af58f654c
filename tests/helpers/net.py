"""Upstream proxies for tests: an HTTP CONNECT proxy and a SOCKS5 proxy on 127.0.0.1.

Both record what they see (request heads, CONNECT targets, SOCKS targets and
every byte clients sent them), so a test can show that the upstream proxy saw
destinations and encrypted bytes only, never a key. ``hosts`` maps names the
proxy resolves itself (``model.test`` -> ``127.0.0.1``), as a company proxy
resolves names the host cannot. Only loopback is ever listened on; a name not
in ``hosts`` is resolved and connected to as a real proxy would (the test
decides which names it sends).

Also :class:`TlsFront`: TLS in front of a plain loopback server (a scripted
model server), with a certificate from a test CA.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import ssl
import struct
from dataclasses import dataclass, field

MAX_SEEN = 16 * 1024 * 1024


@dataclass
class ProxyLog:
    heads: list[str] = field(default_factory=list)
    """First line of every request (``CONNECT host:port HTTP/1.1``, ``GET http://…``)."""
    targets: list[tuple[str, int]] = field(default_factory=list)
    """Every destination asked for (CONNECT, absolute-form, SOCKS)."""
    auth: list[str | None] = field(default_factory=list)
    seen: bytearray = field(default_factory=bytearray)
    """Every byte clients sent through this proxy (bounded)."""

    def saw(self, data: bytes) -> None:
        if len(self.seen) < MAX_SEEN:
            self.seen += data[: MAX_SEEN - len(self.seen)]


class _Base:
    def __init__(self, *, hosts: dict[str, str] | None = None) -> None:
        self.hosts = dict(hosts or {})
        self.log = ProxyLog()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def __aenter__(self) -> _Base:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._guarded(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def _dial(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(asyncio.open_connection(self.hosts.get(host, host), port), 15)

    async def _pipe(
        self,
        c_reader: asyncio.StreamReader,
        c_writer: asyncio.StreamWriter,
        u_reader: asyncio.StreamReader,
        u_writer: asyncio.StreamWriter,
    ) -> None:
        async def up() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await c_reader.read(65536):
                    self.log.saw(chunk)
                    u_writer.write(chunk)
                    await u_writer.drain()
                if u_writer.can_write_eof():
                    u_writer.write_eof()

        async def down() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await u_reader.read(65536):
                    c_writer.write(chunk)
                    await c_writer.drain()

        sending = asyncio.create_task(up())
        try:
            await down()
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
            u_writer.close()


class HttpConnectProxy(_Base):
    """``CONNECT host:port`` tunnels and absolute-form ``GET http://…`` forwarding.

    ``credentials``: a ``(user, password)`` every request must carry as
    ``Proxy-Authorization: Basic`` (407 otherwise). ``refuse``: hosts answered 403.
    """

    def __init__(
        self,
        *,
        hosts: dict[str, str] | None = None,
        credentials: tuple[str, str] | None = None,
        refuse: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(hosts=hosts)
        self.credentials = credentials
        self.refuse = refuse

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        self.log.saw(head)
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
        self.log.heads.append(lines[0])
        headers = [ln for ln in lines[1:] if ln]
        auth = next(
            (ln.split(":", 1)[1].strip() for ln in headers
             if ln.lower().startswith("proxy-authorization:")),
            None,
        )  # fmt: skip
        self.log.auth.append(auth)
        if self.credentials is not None:
            want = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
            if auth != want:
                writer.write(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                    b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n\r\n'
                )
                await writer.drain()
                return
        if method == "CONNECT":
            host, _, port_s = target.rpartition(":")
            host = host.strip("[]")
            self.log.targets.append((host, int(port_s)))
            if host in self.refuse:
                writer.write(
                    b"HTTP/1.1 403 Forbidden by the test proxy\r\nContent-Length: 0\r\n\r\n"
                )
                await writer.drain()
                return
            u_reader, u_writer = await self._dial(host, int(port_s))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await self._pipe(reader, writer, u_reader, u_writer)
            return
        assert target.startswith("http://"), target
        rest = target[7:]
        authority, _, path = rest.partition("/")
        host, _, port_s = authority.partition(":")
        port = int(port_s or 80)
        self.log.targets.append((host, port))
        u_reader, u_writer = await self._dial(host, port)
        kept = [h for h in headers if not h.lower().startswith(("proxy-", "connection:"))]
        request = [f"{method} /{path} {version}", *kept, "Connection: close", "", ""]
        u_writer.write("\r\n".join(request).encode("latin-1"))
        await u_writer.drain()
        await self._pipe(reader, writer, u_reader, u_writer)


class Socks5Proxy(_Base):
    """RFC 1928 CONNECT, with no authentication or (``credentials``) RFC 1929."""

    def __init__(
        self, *, hosts: dict[str, str] | None = None, credentials: tuple[str, str] | None = None
    ) -> None:
        super().__init__(hosts=hosts)
        self.credentials = credentials
        self.address_types: list[int] = []
        """ATYP of each CONNECT: 1 IPv4, 3 a name, 4 IPv6."""

    @property
    def url(self) -> str:
        return f"socks5h://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ver, n = await reader.readexactly(2)
        methods = await reader.readexactly(n)
        self.log.saw(bytes([ver, n]) + methods)
        if self.credentials is None:
            writer.write(b"\x05\x00")
        else:
            if 2 not in methods:
                writer.write(b"\x05\xff")
                return
            writer.write(b"\x05\x02")
            await writer.drain()
            _v, ulen = await reader.readexactly(2)
            user = await reader.readexactly(ulen)
            (plen,) = await reader.readexactly(1)
            password = await reader.readexactly(plen)
            ok = (user.decode(), password.decode()) == self.credentials
            self.log.auth.append(user.decode())
            writer.write(b"\x01\x00" if ok else b"\x01\x01")
            if not ok:
                return
        await writer.drain()
        _ver, cmd, _rsv, atyp = await reader.readexactly(4)
        if atyp == 1:
            host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
        elif atyp == 4:
            host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
        else:
            (length,) = await reader.readexactly(1)
            host = (await reader.readexactly(length)).decode()
        (port,) = struct.unpack("!H", await reader.readexactly(2))
        self.address_types.append(atyp)
        self.log.targets.append((host, port))
        self.log.heads.append(f"SOCKS5 CONNECT {host}:{port}")
        if cmd != 1:
            writer.write(b"\x05\x07\x00\x01\x00\x00\x00\x00\x00\x00")
            return
        try:
            u_reader, u_writer = await self._dial(host, port)
        except (OSError, TimeoutError):
            writer.write(b"\x05\x05\x00\x01\x00\x00\x00\x00\x00\x00")
            return
        writer.write(b"\x05\x00\x00\x01\x7f\x00\x00\x01" + struct.pack("!H", self.port))
        await writer.drain()
        await self._pipe(reader, writer, u_reader, u_writer)


class TlsFront:
    """TLS on 127.0.0.1 in front of a plain server at ``127.0.0.1:backend_port``."""

    def __init__(self, backend_port: int, context: ssl.SSLContext) -> None:
        self.backend_port = backend_port
        self.context = context
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> TlsFront:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0, ssl=self.context)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            b_reader, b_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(copy(reader, b_writer), copy(b_reader, writer), return_exceptions=True)


PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)


def private_network_home(monkeypatch: object, paths: object) -> None:
    """No proxy variables of the machine's; a settings file with the file key backend
    (no keyring on a headless machine), in ``paths``' config dir."""
    import orjson

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)  # type: ignore[attr-defined]
    config = paths.config  # type: ignore[attr-defined]
    config.mkdir(parents=True, exist_ok=True)
    paths.settings_file.write_bytes(orjson.dumps({"auth": {"fileBackend": True}}))  # type: ignore[attr-defined]
