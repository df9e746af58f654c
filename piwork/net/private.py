"""Rules that let the sandbox reach a domain at a private or reserved address.

``piwork network allow-private DOMAIN… [--folder DIR]`` (or ``--registries``:
every package registry and mirror) stores one ``allow private-network DOMAIN``
rule per domain in the person's policy, as "Always allow" on the egress
proxy's question would; ``piwork policy list`` shows them and ``piwork policy
rm ID`` removes one. A rule names an exact domain: no wildcard, no address.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from piwork.config import Paths
from piwork.env.registries import registry_domains
from piwork.errors import UsageError
from piwork.net.mirrors import all_mirror_hosts, mirror_hosts, mirrors_for
from piwork.policy.rules import Action, Rule, Scope, Verdict
from piwork.policy.store import PolicyStore
from piwork.proxy.egress import normalize_host


class PrivateRuleError(ValueError, UsageError):
    """A domain piwork cannot make a private-address rule for; says why."""


def checked_domain(text: str) -> str:
    """``text`` as the egress proxy names it; a name, not an address or a wildcard."""
    raw = text.strip()
    if not raw or any(c in raw for c in "*/:@ "):
        raise PrivateRuleError(
            f"{text!r}: give a domain name such as pypi.org or artifactory (no scheme, port, "
            "path or wildcard)"
        )
    try:
        ipaddress.ip_address(raw.strip("[]"))
    except ValueError:
        pass
    else:
        raise PrivateRuleError(f"{text!r}: give the domain name the agent uses, not an address")
    try:
        return normalize_host(raw)
    except ValueError as exc:
        raise PrivateRuleError(f"{text!r}: not a valid domain name") from exc


def registry_hosts(paths: Paths, folder: Path | None) -> list[str]:
    """The package registries and the mirrors (the folder's, or every configured one)."""
    mirrors = mirror_hosts(mirrors_for(paths, folder)) if folder else all_mirror_hosts(paths)
    return list(registry_domains(mirrors))


def allow_private(paths: Paths, domains: list[str], folder: Path | None = None) -> list[Rule]:
    """Store one allow rule per domain (everywhere, or for ``folder``); returns them."""
    scope = Scope.folder(folder) if folder is not None else Scope.global_()
    rules = [
        Rule(
            Action.PRIVATE_NETWORK,
            Verdict.ALLOW,
            scope,
            pattern=checked_domain(d),
            note="piwork network allow-private",
        )
        for d in dict.fromkeys(domains)
    ]
    if not rules:
        raise PrivateRuleError("name at least one domain (or --registries)")
    PolicyStore(paths.policy_file).add_many(rules)
    return rules


def forget_private(paths: Paths, domain: str, folder: Path | None = None) -> int:
    """Remove the allow rules for ``domain`` (everywhere, or for ``folder``); how many."""
    pattern = checked_domain(domain)
    store = PolicyStore(paths.policy_file)
    scope = Scope.folder(folder) if folder is not None else Scope.global_()
    gone = [
        r
        for r in store.load()
        if r.action is Action.PRIVATE_NETWORK and r.pattern == pattern and r.scope == scope
    ]
    for rule in gone:
        store.remove(rule.id)
    return len(gone)


__all__ = [
    "PrivateRuleError",
    "allow_private",
    "checked_domain",
    "forget_private",
    "registry_hosts",
]
