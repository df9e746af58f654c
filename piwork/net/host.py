"""Everything one run needs of the network settings, read once before the VM starts."""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass
from pathlib import Path

from piwork.config import Paths
from piwork.net import cas as netcas
from piwork.net import upstream as netup
from piwork.net.guest import GuestNetwork
from piwork.net.mirrors import mirrors_for


@dataclass(frozen=True)
class HostNetwork:
    upstream: netup.Upstream
    """The proxy the gateway and the egress proxy go through (or none)."""
    guest: GuestNetwork
    """The extra CAs and the folder's mirrors, for the guest."""

    @functools.cached_property
    def tls(self) -> ssl.SSLContext:
        """The system store plus the extra CAs: the gateway's TLS, an https:// proxy's
        (made when first used: a run with no TLS, the offline demo's, needs none)."""
        return netcas.ssl_context(self.guest.cas)

    @property
    def proxy_ssl(self) -> ssl.SSLContext | None:
        """For the egress proxy: only an https:// upstream proxy needs a context."""
        kinds = {p.kind for p in (self.upstream.tunnel, self.upstream.plain) if p is not None}
        return self.tls if netup.ProxyKind.HTTPS in kinds else None


def host_network(paths: Paths, folder: Path | None) -> HostNetwork:
    """Read the settings, the host's CAs and the proxy (blocking: run it in a thread)."""
    cas = netcas.extra_cas(paths)
    return HostNetwork(
        upstream=netup.resolve(paths), guest=GuestNetwork(tuple(cas), mirrors_for(paths, folder))
    )


__all__ = ["HostNetwork", "host_network"]
