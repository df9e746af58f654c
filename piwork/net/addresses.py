"""What kind of address a name resolves to, in words a person reads in a question."""

from __future__ import annotations

import ipaddress
import socket

_DOCS = tuple(
    ipaddress.ip_network(n)
    for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(address.strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_public(address: str) -> bool:
    """A global unicast address (what the egress proxy reaches without asking)."""
    ip = _ip(address)
    return ip.is_global and not ip.is_multicast


def describe_address(address: str) -> str:
    """``a private network address``, ``this computer (loopback)``, … for ``address``."""
    try:
        ip = _ip(address)
    except ValueError:
        return "not an address"
    if ip.is_loopback:
        return "this computer (loopback)"
    if ip.is_link_local:
        return "a link-local address (cloud metadata services live here)"
    if ip.is_unspecified:
        return "the unspecified address (this computer)"
    if ip.is_multicast:
        return "a multicast address"
    if any(ip in net for net in _DOCS):
        return "a reserved documentation range, often an inspecting proxy's"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "a shared carrier-grade NAT address"
    if ip.is_private:
        return "a private network address"
    if not ip.is_global:
        return "a reserved address"
    return "a public address"


def resolve(host: str, port: int = 443) -> list[str]:
    """The addresses ``host`` has here (empty if it does not resolve)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


__all__ = ["describe_address", "is_public", "resolve"]
