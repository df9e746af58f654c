"""The package registries the workbench's package managers use, as network rules.

apt, pip and npm in the guest reach these through the egress proxy (their
``http(s)_proxy`` environment; the VM has no resolver and no NIC). Each new
domain is asked about under the person's policy like any other; ``piwork env
allow-registries`` answers for all of them at once by saving exactly these
rules (it prints them), so a task that installs packages asks nothing.

The same one answer is offered in the prompt itself (``registry_offer``): when
all a request still asks about is a registry domain (the egress proxy's
question for ``pypi.org``, or the gate's for ``pip install``), the person can
pick "Allow the package registries" instead of answering once per domain, and
sees the exact rules it saves first.

Package mirrors the person set (``piwork.net.mirrors``: a PyPI index, an npm
registry, a Debian mirror) are registries too: callers pass their hosts as
``mirrors``, and the rules and the offer cover them.
"""

from __future__ import annotations

from collections.abc import Iterable

from piwork.policy.decider import Decider
from piwork.policy.request import Choice, PermissionRequest
from piwork.policy.rules import Action, Rule, Scope, Target, TaskContext, Verdict, winning_rule

REGISTRIES: dict[str, tuple[str, ...]] = {
    # apt: the workbench's sources.list (bookworm, -updates, -security) on one host.
    "Debian": ("deb.debian.org",),
    # pip: the index and the file host the index links to.
    "PyPI": ("pypi.org", "files.pythonhosted.org"),
    # npm: the registry serves metadata and tarballs.
    "npm": ("registry.npmjs.org",),
}


WHAT_IT_ALLOWS = (
    "What this allows, plainly: downloads from these domains, nothing else. piwork reads each "
    "request to them (for HTTPS through a certificate authority made for each run, which only "
    "that run's VM trusts) and refuses anything but a download: no `npm publish`, no uploads, "
    "no other site named inside. These domains sit on shared CDNs (Fastly, Cloudflare); "
    "piwork connects only to the domain itself."
)
"""Said with the rules by ``piwork env allow-registries`` and the terminal's ``[r]`` prompt
(security review 2, finding 8)."""


def registry_domains(mirrors: Iterable[str] = ()) -> tuple[str, ...]:
    built_in = tuple(d for domains in REGISTRIES.values() for d in domains)
    return built_in + tuple(m for m in dict.fromkeys(mirrors) if m not in built_in)


def registry_rules(scope: Scope, mirrors: Iterable[str] = ()) -> list[Rule]:
    """One ``network allow`` rule per registry domain (and mirror host), exact names."""
    rules = [
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
    built_in = {r.pattern for r in rules}
    rules += [
        Rule(Action.NETWORK, Verdict.ALLOW, scope, pattern=host, note="package mirror")
        for host in dict.fromkeys(mirrors)
        if host not in built_in
    ]
    return rules


def registry_offer(
    decider: Decider, request: PermissionRequest, ctx: TaskContext, mirrors: Iterable[str] = ()
) -> tuple[Rule, ...]:
    """The rules "Allow the package registries" saves for ``request``; empty: not offered.

    Offered only when every target the policy still asks about is a connection
    to a registry domain (judged on the host-validated targets, so a guest
    request cannot dress another host up as PyPI), and nothing in it is denied.
    The rules apply where "Always allow in this folder" would (the task's folder,
    else the task: a global network rule needs a second confirmation, and this
    is one answer). A registry domain the policy already allows or denies gets no
    rule: the answer never lifts a deny the person made.
    """
    decision = decider.evaluate(request, ctx)
    asked = [td for td in decision.targets if td.verdict is Verdict.ASK]
    mirrors = tuple(mirrors)
    domains = set(registry_domains(mirrors))
    if decision.verdict is not Verdict.ASK or not asked:
        return ()
    if not all(td.target.action is Action.NETWORK and td.target.domain in domains for td in asked):
        return ()
    policy = decider.store.effective_rules()

    def still_asks(domain: str) -> bool:
        rule = winning_rule(policy, Target(Action.NETWORK, op="network", domain=domain), ctx)
        return rule is None or rule.verdict is Verdict.ASK

    scope = Decider.scope_for(Choice.ALWAYS_FOLDER, ctx)
    return tuple(r for r in registry_rules(scope, mirrors) if r.pattern and still_asks(r.pattern))
