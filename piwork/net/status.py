"""One look at the network settings and what they mean here, for every front end.

``piwork network show``, ``piwork doctor`` and the app's Settings → Network all
read :func:`network_status`: the upstream proxy and where it came from, the
extra CAs, the mirrors, the private-address allowances, and how each package
registry (and mirror) resolves from this host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from piwork.config import Paths
from piwork.env.registries import registry_domains
from piwork.net import cas as netcas
from piwork.net import upstream as netup
from piwork.net.addresses import describe_address, is_public, resolve
from piwork.net.config import MirrorSettings
from piwork.net.mirrors import all_mirror_hosts, mirror_hosts, mirrors_for
from piwork.policy.rules import Action, Rule, Target, TaskContext, Verdict, winning_rule
from piwork.policy.store import PolicyStore
from piwork.textsafe import sanitize

ALLOW_PRIVATE_REGISTRIES = "piwork network allow-private --registries"


@dataclass(frozen=True)
class RegistryLookup:
    """How one registry or mirror host resolves from this host."""

    host: str
    addresses: tuple[str, ...]
    allowed_private: bool
    """A rule lets the sandbox reach it at a private address (everywhere, or in the folder)."""

    @property
    def resolves(self) -> bool:
        return bool(self.addresses)

    @property
    def private(self) -> str | None:
        """The first private or reserved address it resolves to, if any."""
        return next((a for a in self.addresses if not is_public(a)), None)

    def describe(self) -> str:
        if not self.addresses:
            return f"{self.host}: does not resolve here"
        first = self.private or self.addresses[0]
        said = f"{self.host} -> {first} ({describe_address(first)})"
        if self.private is None:
            return said
        return said + (
            ": allowed for the sandbox" if self.allowed_private else ": refused until allowed"
        )


@dataclass(frozen=True)
class NetworkStatus:
    upstream: netup.Upstream
    cas: tuple[netcas.CaCert, ...]
    host_cas_used: bool
    added_cas: tuple[str, ...]
    mirrors: MirrorSettings
    folder: Path | None
    private_rules: tuple[Rule, ...]
    registries: tuple[RegistryLookup, ...] = field(default=())
    problems: tuple[str, ...] = ()
    """Settings that could not be read (said, not raised: a status must always show)."""

    @property
    def refused_registries(self) -> list[RegistryLookup]:
        return [r for r in self.registries if r.private is not None and not r.allowed_private]

    def lines(self) -> list[str]:
        """The status as a person reads it (`piwork network show`, the app's Network tab)."""
        status = self
        out: list[str] = []
        up = status.upstream
        if up.any is None:
            out.append("upstream proxy: none (piwork connects directly; "
                       "`piwork network proxy set URL` to use one)")  # fmt: skip
        else:
            for role, proxy in (("tunnels (https)", up.tunnel), ("plain http", up.plain)):
                if proxy is None:
                    out.append(f"upstream proxy for {role}: none (direct)")
                    continue
                auth = ", password from the keyring or its URL" if proxy.password else ""
                out.append(f"upstream proxy for {role}: {proxy.url} (from {proxy.source}{auth})")
            bypass = (up.tunnel or up.plain).no_proxy  # type: ignore[union-attr]
            out.append(
                "  direct (no proxy): loopback" + (f", {', '.join(bypass)}" if bypass else "")
            )
        host = "the host's extra CAs and " if status.host_cas_used else ""
        out.append(f"certificate authorities ({host}the ones you added; trusted by the gateway, "
                   f"installed in the VM): {len(status.cas) or 'none'}")  # fmt: skip
        out += [f"  {sanitize(c.describe(), one_line=True)}" for c in status.cas]
        if not status.host_cas_used:
            out.append("  (the host's own extra CAs are left out: `piwork network ca host on`)")
        mirrors = status.mirrors.items()
        where = f" for {status.folder}" if status.folder else " (everyone's)"
        out.append(
            f"package mirrors{where}: "
            + (
                ", ".join(f"{k} {v}" for k, v in mirrors)
                if mirrors
                else "none (the public registries)"
            )
        )
        allowed = [f"{r.pattern} ({r.scope.describe()})" for r in status.private_rules]
        out.append("private addresses allowed for: " + (", ".join(allowed) if allowed else "none"))
        if status.registries:
            out.append("package registries from this host:")
            out += [f"  {r.describe()}" for r in status.registries]
            if status.refused_registries:
                out.append(
                    "  the sandbox refuses these until you allow them (your network's proxy or "
                    f"mirror answers there): `{ALLOW_PRIVATE_REGISTRIES}`"
                )
        out += [f"problem: {p}" for p in status.problems]
        return out

    def to_json(self) -> dict[str, Any]:
        def proxy(p: netup.UpstreamProxy | None) -> dict[str, Any] | None:
            if p is None:
                return None
            return {"url": p.url, "source": p.source, "noProxy": list(p.no_proxy),
                    "password": p.password is not None}  # fmt: skip

        return {
            "proxy": {"tunnel": proxy(self.upstream.tunnel), "plain": proxy(self.upstream.plain)},
            "cas": [
                {
                    "subject": c.subject,
                    "sha256": c.fingerprint,
                    "source": c.source,
                    "notAfter": c.not_after.isoformat(),
                    "expired": c.expired,
                    "ca": c.is_ca,
                }
                for c in self.cas
            ],
            "useHostCas": self.host_cas_used,
            "addedCas": list(self.added_cas),
            "mirrors": dict(self.mirrors.items()),
            "folder": str(self.folder) if self.folder else None,
            "privateAllowed": [
                {"domain": r.pattern, "scope": r.scope.describe(), "id": r.id}
                for r in self.private_rules
            ],
            "registries": [
                {
                    "host": r.host,
                    "addresses": list(r.addresses),
                    "private": r.private,
                    "allowedPrivate": r.allowed_private,
                }
                for r in self.registries
            ],
            "problems": list(self.problems),
        }


def private_rules(paths: Paths) -> tuple[Rule, ...]:
    return tuple(
        r
        for r in PolicyStore(paths.policy_file).effective_rules()
        if r.action is Action.PRIVATE_NETWORK and r.pattern is not None
    )


def private_allowed(rules: tuple[Rule, ...], host: str, folder: Path | None) -> bool:
    target = Target(Action.PRIVATE_NETWORK, op="private-network", domain=host)
    rule = winning_rule(rules, target, TaskContext(working_folder=folder))
    return rule is not None and rule.verdict is Verdict.ALLOW


def network_status(
    paths: Paths,
    folder: Path | None = None,
    *,
    lookup: bool = True,
    resolver: Callable[[str], list[str]] = resolve,
) -> NetworkStatus:
    """The settings, read safely (a problem is listed, not raised); with ``lookup``,
    how the registries and mirrors resolve here (blocking DNS: run it in a thread)."""
    problems: list[str] = []

    def attempt(what: str, fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except Exception as exc:
            problems.append(f"{what}: {exc}")
            return default

    from piwork.net import config as netconfig

    settings = attempt("settings", lambda: netconfig.load(paths), netconfig.NetworkSettings())
    upstream = attempt("upstream proxy", lambda: netup.resolve(paths), netup.NONE)
    cas = attempt("certificate authorities", lambda: netcas.extra_cas(paths), [])
    mirrors = attempt("mirrors", lambda: mirrors_for(paths, folder), MirrorSettings())
    rules = attempt("policy", lambda: private_rules(paths), ())
    lookups: list[RegistryLookup] = []
    if lookup:
        hosts = registry_domains(
            mirror_hosts(mirrors)
            if folder
            else attempt("mirrors", lambda: all_mirror_hosts(paths), [])
        )
        for host in hosts:
            lookups.append(
                RegistryLookup(host, tuple(resolver(host)), private_allowed(rules, host, folder))
            )
    return NetworkStatus(
        upstream=upstream,
        cas=tuple(cas),
        host_cas_used=settings.cas.use_host_cas,
        added_cas=tuple(attempt("added CAs", lambda: netcas.added_names(paths), [])),
        mirrors=mirrors,
        folder=folder,
        private_rules=tuple(rules),
        registries=tuple(lookups),
        problems=tuple(problems),
    )


__all__ = [
    "ALLOW_PRIVATE_REGISTRIES",
    "NetworkStatus",
    "RegistryLookup",
    "network_status",
    "private_allowed",
    "private_rules",
]
