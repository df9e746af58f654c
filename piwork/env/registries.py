"""The package registries the workbench's package managers use, as network rules.

apt, pip and npm in the guest reach these through the egress proxy (their
``http(s)_proxy`` environment; the VM has no resolver and no NIC). Each new
domain is asked about under the person's policy like any other; ``piwork env
allow-registries`` answers for all of them at once by saving exactly these
rules (it prints them), so a task that installs packages asks nothing.
"""

from __future__ import annotations

from piwork.policy.rules import Action, Rule, Scope, Verdict

REGISTRIES: dict[str, tuple[str, ...]] = {
    # apt: the workbench's sources.list (bookworm, -updates, -security) on one host.
    "Debian": ("deb.debian.org",),
    # pip: the index and the file host the index links to.
    "PyPI": ("pypi.org", "files.pythonhosted.org"),
    # npm: the registry serves metadata and tarballs.
    "npm": ("registry.npmjs.org",),
}


def registry_domains() -> tuple[str, ...]:
    return tuple(d for domains in REGISTRIES.values() for d in domains)


def registry_rules(scope: Scope) -> list[Rule]:
    """One ``network allow`` rule per registry domain, exact names (no wildcards)."""
    return [
        Rule(
            action=Action.NETWORK,
            verdict=Verdict.ALLOW,
            scope=scope,
            pattern=domain,
            note=f"package registry ({name})",
        )
        for name, domains in REGISTRIES.items()
        for domain in domains
    ]
