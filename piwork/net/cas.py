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

import contextlib
import functools
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
from typing import Any

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
    """One trusted certificate (public: safe to show, log and give the guest).

    Only the PEM and its fingerprint are made when it is read (a task's start needs
    no more); the subject and dates are parsed when first shown."""

    pem: str
    fingerprint: str
    """SHA-256 of the DER certificate, hex."""
    source: str

    @functools.cached_property
    def _parsed(self) -> tuple[str, datetime, bool]:
        from cryptography import x509
        from cryptography.utils import CryptographyDeprecationWarning

        with warnings.catch_warnings():  # old public roots with negative serial numbers
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            cert = x509.load_pem_x509_certificate(self.pem.encode("ascii"))
            return _subject(cert), cert.not_valid_after_utc, _is_ca(cert)

    @property
    def subject(self) -> str:
        return self._parsed[0]

    @property
    def not_after(self) -> datetime:
        return self._parsed[1]

    @property
    def is_ca(self) -> bool:
        return self._parsed[2]

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


def _subject(cert: Any) -> str:
    from cryptography.x509.oid import NameOID

    for oid in (NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME):
        attrs = cert.subject.get_attributes_for_oid(oid)
        if attrs:
            return str(attrs[0].value)
    return str(cert.subject.rfc4514_string()) or "(no subject)"


def _is_ca(cert: Any) -> bool:
    from cryptography import x509

    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return bool(cert.issuer == cert.subject)  # an old-style self-signed root


def _from_der(der: bytes, source: str) -> CaCert:
    """A certificate from its DER; raises ValueError if it is not one."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cert = x509.load_der_x509_certificate(der)
        pem = cert.public_bytes(Encoding.PEM).decode("ascii")
    return CaCert(pem=pem, fingerprint=hashlib.sha256(der).hexdigest(), source=source)


def _from_block(block: bytes, source: str) -> CaCert:
    """A PEM block as it is (base64 checked, not parsed: a task's start reads it)."""
    der = ssl.PEM_cert_to_DER_cert(block.decode("ascii"))
    pem = ssl.DER_cert_to_PEM_cert(der)
    return CaCert(pem=pem, fingerprint=hashlib.sha256(der).hexdigest(), source=source)


def _der_blocks(data: bytes) -> list[bytes]:
    """The DER of each PEM certificate block (no parsing: for fingerprints)."""
    out = []
    for block in _CERT_BLOCK.findall(data):
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            out.append(ssl.PEM_cert_to_DER_cert(block.decode("ascii")))
    return out


def _fingerprints(data: bytes) -> set[str]:
    return {hashlib.sha256(der).hexdigest() for der in _der_blocks(data)}


def parse_certs(
    data: bytes, source: str, *, skip: set[str] | None = None
) -> tuple[list[CaCert], list[str]]:
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
            cert = _from_block(block, source)
        except (ValueError, UnicodeDecodeError) as exc:
            notes.append(f"{source}: an unreadable certificate left out ({exc})")
            continue
        if skip is None or cert.fingerprint not in skip:
            certs.append(cert)
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
    """The distribution's public CAs (SHA-256 of each), or None where this host has none."""
    found: set[str] = set()
    for d in dirs:
        root = Path(d)
        for path in sorted(root.rglob("*.crt")) if root.is_dir() else []:
            data = _read(path)
            if data is not None:
                found |= _fingerprints(data)
    return found or None


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
    known_set: list[set[str] | None] = []

    def known() -> set[str] | None:  # read only when a variable's file needs it
        if not known_set:
            known_set.append(public_fingerprints() if public is True else (public or None))
        return known_set[0]

    found: list[CaCert] = []
    for d in dirs:
        found += _certs_in(Path(d))
    stores = {os.path.realpath(b) for b in SYSTEM_BUNDLES}
    seen: set[str] = set()
    for name in ENV_FILES:
        value = env.get(name, "").strip()
        real = os.path.realpath(value) if value else ""
        if not value or real in seen or (real in stores and found):
            # the system store holds the anchors the directories above already gave
            continue
        seen.add(real)
        data = _read(Path(value))
        if data is None:
            continue
        source = f"${name} ({value})"
        public_set = known()
        if public_set is not None:
            found += parse_certs(data, source, skip=public_set)[0]
        elif name == "NODE_EXTRA_CA_CERTS" and real not in stores:
            found += parse_certs(data, source)[0]  # extra by definition, unless the whole store
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
