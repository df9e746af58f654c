"""Certificate authorities beyond the public ones: the host's own and those the person adds.

A company network that inspects TLS re-signs every site with its own CA; the
host trusts it (an admin put it in ``/usr/local/share/ca-certificates`` or the
system keychain), but a fresh VM does not, so pip, npm, apt and git in the
guest fail with certificate errors. piwork gathers:

* the host's extra CAs (``network.cas.useHostCas``, on by default): the
  directories Linux distributions keep locally added anchors in
  (:data:`HOST_CA_DIRS`), the files ``NODE_EXTRA_CA_CERTS``, ``SSL_CERT_FILE``,
  ``REQUESTS_CA_BUNDLE`` and ``PIP_CERT`` name, less the public set the
  distribution ships (:data:`PUBLIC_SET_DIRS`; these variables often name the
  whole system store), and on macOS the CA certificates in the System keychain
  (where MDM and admins add them);
* the ones the person adds (``piwork network ca add FILE``), kept as files in
  ``<config>/network/cas/``.

The model gateway trusts them on top of the system store
(:func:`ssl_context`); the guest gets them at every start
(:mod:`piwork.net.guest`). Only certificate blocks are ever read from a file
and passed on: a private key next to a certificate is left out and said so,
so no private key can reach the guest through this path.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import ssl
import subprocess
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.utils import CryptographyDeprecationWarning
from cryptography.x509.oid import NameOID

from piwork.config import Paths
from piwork.errors import UsageError
from piwork.fsutil import atomic_write_bytes
from piwork.net import config as netconfig

HOST_CA_DIRS: tuple[str, ...] = (
    "/usr/local/share/ca-certificates",  # Debian, Ubuntu
    "/etc/pki/ca-trust/source/anchors",  # Fedora, RHEL
    "/etc/ca-certificates/trust-source/anchors",  # Arch
    "/usr/share/pki/trust/anchors",  # openSUSE
)
PUBLIC_SET_DIRS: tuple[str, ...] = ("/usr/share/ca-certificates/mozilla",)
"""Where the distribution keeps the public CAs (Debian, Ubuntu): not "extra"."""
SYSTEM_BUNDLES: tuple[str, ...] = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
)
"""Whole system stores: a variable naming one (with no public set to subtract) adds nothing."""
ENV_FILES = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT")
MACOS_KEYCHAIN = "/Library/Keychains/System.keychain"
MAX_FILE_BYTES = 4 * 1024 * 1024
_CERT_BLOCK = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL
)
_ANY_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class CaError(ValueError, UsageError):
    """A certificate file piwork cannot use; says why and what to give instead."""


@dataclass(frozen=True)
class CaCert:
    """One trusted certificate (public: safe to show, log and give the guest)."""

    pem: str
    subject: str
    fingerprint: str
    """SHA-256 of the DER certificate, hex."""
    not_after: datetime
    is_ca: bool
    source: str

    @property
    def expired(self) -> bool:
        return self.not_after < datetime.now(UTC)

    def describe(self) -> str:
        kind = "" if self.is_ca else " (not a CA certificate)"
        expiry = " EXPIRED" if self.expired else ""
        return (
            f"{self.subject}{kind}, sha256 {self.fingerprint[:16]}…, valid until "
            f"{self.not_after:%Y-%m-%d}{expiry} ({self.source})"
        )


def _subject(cert: x509.Certificate) -> str:
    for oid in (NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME):
        attrs = cert.subject.get_attributes_for_oid(oid)
        if attrs:
            return str(attrs[0].value)
    return cert.subject.rfc4514_string() or "(no subject)"


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return cert.issuer == cert.subject  # an old-style self-signed root


def _from_der(der: bytes, source: str) -> CaCert:
    with warnings.catch_warnings():  # old public roots with negative serial numbers
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        return _cert_from_der(der, source)


def _cert_from_der(der: bytes, source: str) -> CaCert:
    cert = x509.load_der_x509_certificate(der)
    pem = cert.public_bytes(Encoding.PEM).decode("ascii")
    return CaCert(
        pem=pem,
        subject=_subject(cert),
        fingerprint=hashlib.sha256(der).hexdigest(),
        not_after=cert.not_valid_after_utc,
        is_ca=_is_ca(cert),
        source=source,
    )


def parse_certs(data: bytes, source: str) -> tuple[list[CaCert], list[str]]:
    """The certificates in ``data`` (PEM blocks, or one DER certificate), and what was
    left out (private keys, other blocks, unreadable certificates), each said."""
    certs: list[CaCert] = []
    notes: list[str] = []
    if b"-----BEGIN" not in data:
        try:
            return [_from_der(data, source)], []
        except ValueError:
            return [], [f"{source}: neither PEM nor a DER certificate"]
    for kind in _ANY_BLOCK.findall(data):
        name = kind.decode("ascii", "replace")
        if name != "CERTIFICATE":
            what = "a private key" if "PRIVATE KEY" in name else f"a {name} block"
            notes.append(f"{source}: {what} left out (only certificates are used)")
    for block in _CERT_BLOCK.findall(data):
        try:
            der = ssl.PEM_cert_to_DER_cert(block.decode("ascii"))
            certs.append(_from_der(der, source))
        except (ValueError, UnicodeDecodeError) as exc:
            notes.append(f"{source}: an unreadable certificate left out ({exc})")
    return certs, notes


def _read(path: Path) -> bytes | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return None
        return path.read_bytes()
    except OSError:
        return None


def _certs_in(folder: Path, source: str | None = None) -> list[CaCert]:
    found: list[CaCert] = []
    if folder.is_dir():
        for path in sorted(folder.rglob("*")):
            if path.suffix.lower() in (".crt", ".pem", ".cer"):
                data = _read(path)
                if data is not None:
                    found += parse_certs(data, source or str(path))[0]
    return found


def public_fingerprints(dirs: Iterable[str] = PUBLIC_SET_DIRS) -> set[str] | None:
    """The distribution's public CAs, or None where this host has no such set."""
    found = [c.fingerprint for d in dirs for c in _certs_in(Path(d), "public")]
    return set(found) if found else None


def host_extra_cas(
    *,
    dirs: Iterable[str] = HOST_CA_DIRS,
    env: Mapping[str, str] | None = None,
    platform: str = sys.platform,
    public: set[str] | bool | None = True,
) -> list[CaCert]:
    """The CAs this host trusts beyond the public set (see the module docstring).
    ``public``: the public set's fingerprints (True: read it from this host)."""
    env = os.environ if env is None else env
    known = public_fingerprints() if public is True else (public or None)
    found: list[CaCert] = []
    for d in dirs:
        found += _certs_in(Path(d))
    for name in ENV_FILES:
        value = env.get(name, "").strip()
        data = _read(Path(value)) if value else None
        if data is None:
            continue
        certs = parse_certs(data, f"${name} ({value})")[0]
        if known is not None:
            found += [c for c in certs if c.fingerprint not in known]
        elif name == "NODE_EXTRA_CA_CERTS" and os.path.realpath(value) not in {
            os.path.realpath(b) for b in SYSTEM_BUNDLES
        }:
            found += certs  # extra by definition, unless it names the whole store
    if platform == "darwin" and shutil.which("security"):
        try:
            out = subprocess.run(
                ["security", "find-certificate", "-a", "-p", MACOS_KEYCHAIN],
                capture_output=True,
                timeout=10,
                check=False,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = b""
        found += [c for c in parse_certs(out, "macOS System keychain")[0] if c.is_ca]
    return unique(found)


def unique(certs: Iterable[CaCert]) -> list[CaCert]:
    seen: set[str] = set()
    out = []
    for cert in certs:
        if cert.fingerprint not in seen:
            seen.add(cert.fingerprint)
            out.append(cert)
    return out


# --- the ones the person adds ------------------------------------------------


def added_dir(paths: Paths) -> Path:
    return paths.config / "network" / "cas"


def added_cas(paths: Paths) -> list[CaCert]:
    folder = added_dir(paths)
    if not folder.is_dir():
        return []
    out: list[CaCert] = []
    for path in sorted(folder.glob("*.pem")):
        data = _read(path)
        if data is not None:
            out += parse_certs(data, f"added: {path.stem}")[0]
    return out


def add_ca(
    paths: Paths, file: Path, name: str | None = None
) -> tuple[str, list[CaCert], list[str]]:
    """Keep the certificates of ``file`` as ``name`` (default: the file's stem).

    Returns the name, the certificates kept and what was left out. Raises
    :class:`CaError` when the file holds no certificate.
    """
    data = _read(Path(file))
    if data is None:
        raise CaError(f"{file}: not a readable file of at most {MAX_FILE_BYTES // 2**20} MiB")
    name = name or Path(file).stem
    if not _NAME.match(name):
        raise CaError(f"name {name!r}: use letters, digits, '.', '_' and '-' (--name NAME)")
    certs, notes = parse_certs(data, f"added: {name}")
    if not certs:
        raise CaError(
            f"{file} holds no certificate"
            + (f" ({'; '.join(notes)})" if notes else "")
            + ": give the CA's certificate as PEM (-----BEGIN CERTIFICATE-----) or DER"
        )
    folder = added_dir(paths)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / f"{name}.pem", "".join(c.pem for c in certs).encode("ascii"))
    return name, certs, notes


def remove_ca(paths: Paths, name: str) -> bool:
    if not _NAME.match(name):
        return False
    try:
        (added_dir(paths) / f"{name}.pem").unlink()
    except FileNotFoundError:
        return False
    return True


def added_names(paths: Paths) -> list[str]:
    folder = added_dir(paths)
    return sorted(p.stem for p in folder.glob("*.pem")) if folder.is_dir() else []


# --- what is trusted ---------------------------------------------------------


def extra_cas(paths: Paths, *, host: list[CaCert] | None = None) -> list[CaCert]:
    """Every extra CA piwork trusts: the host's (unless turned off), then the added ones."""
    settings = netconfig.load(paths).cas
    from_host = (host if host is not None else host_extra_cas()) if settings.use_host_cas else []
    return unique([*from_host, *added_cas(paths)])


def bundle(certs: Iterable[CaCert]) -> bytes:
    return "".join(c.pem for c in certs).encode("ascii")


def ssl_context(certs: Iterable[CaCert]) -> ssl.SSLContext:
    """The system store (no certifi) plus ``certs``: what the model gateway verifies with."""
    context = ssl.create_default_context()
    data = bundle(certs)
    if data:
        context.load_verify_locations(cadata=data.decode("ascii"))
    return context


__all__ = [
    "HOST_CA_DIRS",
    "CaCert",
    "CaError",
    "add_ca",
    "added_cas",
    "added_dir",
    "added_names",
    "bundle",
    "extra_cas",
    "host_extra_cas",
    "parse_certs",
    "remove_ca",
    "ssl_context",
    "unique",
]
