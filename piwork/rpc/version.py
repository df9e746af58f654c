"""Which pi this host speaks, and the refusal of any other.

The RPC models (:mod:`piwork.rpc.models`), the client's idea of when a run has
ended, the launcher's use of pi's ``main()`` and the snapshot of pi's bundle
follow pi 1.x as of :data:`OLDEST`; a pack's pi (its manifest's
``versions["pi"]``, from ``runtime-pack/pi/package.json``) must be in
``[OLDEST, BELOW)``. A pack with another pi is refused when a run starts, with
a line that says which pi it has and which this piwork needs.

Moving to a later pi 1.x is one line, the version in
``runtime-pack/pi/package.json`` (then ``npm install --package-lock-only`` in
that folder, which rewrites the lock), plus the whole suite green on the new
pack (``scripts/test.sh``). A pi 2.x also moves :data:`BELOW`, after its
``docs/rpc*.md`` and ``CHANGELOG.md`` have been read against the models here.
The steps, and what rides on pi's internals: ``docs/pi.md``.
"""

from __future__ import annotations

import re

from piwork.errors import PackError

OLDEST = (1, 6, 0)
"""The first pi whose RPC, extension API and bundle layout this host was checked against."""
BELOW = (2, 0, 0)
"""The first pi this host does not speak: a new major version may change all of it."""

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


class UnsupportedPi(PackError):
    """The pack's pi is one this piwork does not speak."""


def spoken() -> str:
    """The range, as people read it."""
    low, high = ".".join(map(str, OLDEST)), ".".join(map(str, BELOW))
    return f">={low} <{high}"


def speaks(version: str | None) -> bool:
    """Whether ``version`` (``X.Y.Z``; a pre-release or anything else is not) is spoken."""
    m = _VERSION.fullmatch(version or "")
    if m is None:
        return False
    parsed = (int(m[1]), int(m[2]), int(m[3]))
    return OLDEST <= parsed < BELOW


def check_pi(version: str | None, where: str) -> None:
    """Refuse a pi this host does not speak; ``where`` names the pack (for the message)."""
    if speaks(version):
        return
    raise UnsupportedPi(
        f"{where} runs pi {version or '(unknown version)'}, but this piwork speaks pi "
        f"{spoken()} (@earendil-works/pi-coding-agent): build the pack from this "
        "piwork's source (`piwork pack build`), which pins the pi it speaks"
    )
