"""TLS ended on the host for the package registries alone, so the proxy reads their requests.

Security review 2, finding 8: "Allow the package registries" allowed anything
inside TLS to those domains, ``npm publish`` (a PUT with someone's token)
included. For the registry domains only, the egress proxy answers the guest's
TLS itself with a certificate from a CA made for this run, reads each request
(downloads only: GET/HEAD without a body, ``Host`` the tunnel's), and sends it
on over its own TLS to the real registry, verified with the host's trust (the
system store plus the company network's CAs, ``piwork.net.cas``).

The CA is made at the start of a run, in memory; only its certificate leaves
(the guest trusts it through ``piwork.net.guest``, like the network's CAs); its
key and the per-domain keys are written once, 0600, into a private temporary
directory for :mod:`ssl` to load and removed when the run ends. The guest can
do nothing with a CA certificate but trust it; a later run has another CA.
Every other domain's TLS stays end to end (the proxy checks only its name).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import os
import shutil
import ssl
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from piwork.net.cas import CaCert

_VALID = datetime.timedelta(days=2)
SOURCE = "piwork: this run's CA for the package registries"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


class RunCA:
    """One run's CA and the server certificates it issues (one per registry domain)."""

    def __init__(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = _name("piwork run CA (package registries)")
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self._dir = Path(tempfile.mkdtemp(prefix="piwork-registry-tls-"))
        self._contexts: dict[str, ssl.SSLContext] = {}

    @property
    def pem(self) -> str:
        """The CA certificate (public): what the guest trusts."""
        return self._cert.public_bytes(serialization.Encoding.PEM).decode("ascii")

    def cacert(self) -> CaCert:
        """The CA as one more certificate the guest trusts (``piwork.net.guest``)."""
        der = self._cert.public_bytes(serialization.Encoding.DER)
        return CaCert(self.pem, hashlib.sha256(der).hexdigest(), SOURCE)

    def server_context(self, domain: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``domain`` (made once)."""
        ctx = self._contexts.get(domain)
        if ctx is not None:
            return ctx
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(domain))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(domain)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        chain = self._dir / f"{domain}.pem"
        with open(chain, "wb", opener=lambda p, f: os.open(p, f, 0o600)) as fh:
            fh.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
                + cert.public_bytes(serialization.Encoding.PEM)
                + self._cert.public_bytes(serialization.Encoding.PEM)
            )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(chain)
        chain.unlink()  # loaded: the key lives in memory only from here on
        self._contexts[domain] = ctx
        return ctx

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


class TlsServerStream:
    """The guest's side of a tunnel, TLS ended here, over bytes already partly read.

    The ClientHello was read (and its name checked) before the proxy decided to end
    TLS, so the handshake starts from those bytes (``initial``) through memory BIOs
    rather than ``start_tls``. ``write``/``drain`` look like a ``StreamWriter``'s.
    """

    def __init__(
        self,
        ctx: ssl.SSLContext,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        initial: bytes,
        timeout: float,
    ) -> None:
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._in, self._out, server_side=True)
        self._in.write(initial)
        self._reader, self._writer = reader, writer
        self._timeout = timeout

    async def _more(self) -> bool:
        await self.drain()
        data = await asyncio.wait_for(self._reader.read(64 * 1024), self._timeout)
        if not data:
            self._in.write_eof()
            return False
        self._in.write(data)
        return True

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if not await self._more():
                    raise ConnectionError("the guest closed during the TLS handshake") from None
        await self.drain()

    async def read(self, n: int = 64 * 1024) -> bytes:
        while True:
            try:
                return self._tls.read(n)
            except ssl.SSLWantReadError:
                if not await self._more():
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    def write(self, data: bytes) -> None:
        self._tls.write(data)

    async def drain(self) -> None:
        data = self._out.read()
        if data:
            self._writer.write(data)
            await self._writer.drain()

    async def close(self) -> None:
        with contextlib.suppress(ssl.SSLError):
            self._tls.unwrap()
        await self.drain()


__all__ = ["RunCA", "TlsServerStream"]
