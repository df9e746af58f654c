"""A small allowlist schema for JSON request bodies the gateway forwards.

The gateway parses a model call's body, checks it against what pi's SDKs send
(``piwork.proxy.allowlist``), and forwards the parsed value re-serialised: the
upstream never sees bytes the check did not see. This module is the checking
half: strict JSON loading (one value per key, no NaN, UTF-8 only, bounded
depth) and a handful of node types. Anything a schema does not name is
refused, with the JSON path and a reason a person (and the model) can read.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from piwork.errors import ProtocolError

MAX_DEPTH = 96
"""Deeper JSON is refused before it is walked (pi's deepest is a tool's schema)."""


class Refused(ProtocolError):
    """A request the gateway will not forward. ``str()`` says where and why."""

    def __init__(self, where: str, why: str, *, status: int = 403) -> None:
        super().__init__(f"{where}: {why}" if where else why)
        self.where = where
        self.why = why
        self.status = status


# --- strict JSON -------------------------------------------------------------------


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        counts = Counter(k for k, _ in pairs)
        dup = next(k for k, n in counts.items() if n > 1)
        raise Refused(
            "", f"the key {dup!r} appears twice in one object; providers and piwork could read "
            "different values, so the request is refused", status=400,
        )  # fmt: skip
    return out


def _no_constant(name: str) -> Any:
    raise Refused("", f"{name} is not JSON", status=400)


def loads_strict(raw: bytes) -> Any:
    """``raw`` as JSON, refusing what providers might read differently from piwork:
    a key twice in one object, NaN/Infinity, text that is not UTF-8, absurd depth."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        why = f"the body is not UTF-8 ({exc.reason} at byte {exc.start})"
        raise Refused("", why, status=400) from None
    try:
        value = json.loads(text, object_pairs_hook=_one_value_per_key, parse_constant=_no_constant)
    except RecursionError:
        raise Refused("", "the body is nested too deeply", status=400) from None
    except ValueError as exc:  # json.JSONDecodeError is one
        if isinstance(exc, Refused):
            raise
        raise Refused("", f"the body is not valid JSON: {exc}", status=400) from None
    if _depth_over(value, MAX_DEPTH):
        raise Refused("", f"the body is nested deeper than {MAX_DEPTH} levels", status=400)
    return value


def _depth_over(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


# --- schema nodes ------------------------------------------------------------------


@dataclass
class Walk:
    """What a check found besides yes/no: the server-side tools a request asks for."""

    enabled: frozenset[str]
    """Server-tool kinds the person enabled (``gateway.serverTools``)."""
    uses: list[ServerToolUse] = field(default_factory=list)


@dataclass(frozen=True)
class ServerToolUse:
    """One provider-side tool in a request (only ever seen when its kind is enabled)."""

    kind: str
    where: str
    destinations: tuple[str, ...] = ()
    """Hosts the provider is told to reach; empty: any site it chooses."""


class Spec:
    def check(self, value: Any, where: str, walk: Walk) -> None:
        raise NotImplementedError


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false"}.get(
        type(value), "null" if value is None else "a number"
    )


class _Any(Spec):
    """Free JSON that no provider acts on by itself (a tool's arguments, a JSON Schema)."""

    def check(self, value: Any, where: str, walk: Walk) -> None:
        return None


ANY: Spec = _Any()


@dataclass(frozen=True)
class Scalar(Spec):
    kinds: tuple[type, ...]
    values: frozenset[Any] | None = None

    def check(self, value: Any, where: str, walk: Walk) -> None:
        ok = isinstance(value, self.kinds) and not (
            isinstance(value, bool) and bool not in self.kinds
        )
        if isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            want = "/".join(_type_name(k()) for k in self.kinds)
            raise Refused(where, f"expected {want}, got {_type_name(value)}", status=400)
        if self.values is not None and value not in self.values:
            allowed = ", ".join(sorted(repr(v) for v in self.values))
            raise Refused(where, f"{value!r} is not a value pi sends (only {allowed})")


STR = Scalar((str,))
NUM = Scalar((int, float))
INT = Scalar((int,))
BOOL = Scalar((bool,))
NULL = Scalar((type(None),))


def enum(*values: Any) -> Scalar:
    kinds = tuple(dict.fromkeys(type(v) for v in values))
    return Scalar(kinds, frozenset(values))


@dataclass(frozen=True)
class Either(Spec):
    """The first option whose JSON type fits (a string or a list of blocks, ...)."""

    options: tuple[Spec, ...]

    def check(self, value: Any, where: str, walk: Walk) -> None:
        for option in self.options:
            if _fits_type(option, value):
                option.check(value, where, walk)
                return
        raise Refused(where, f"unexpected {_type_name(value)}", status=400)


def either(*options: Spec) -> Either:
    return Either(options)


def _fits_type(spec: Spec, value: Any) -> bool:
    if isinstance(spec, Obj | Tagged):
        return isinstance(value, dict)
    if isinstance(spec, Arr):
        return isinstance(value, list)
    if isinstance(spec, Scalar):
        return isinstance(value, spec.kinds) and not (
            isinstance(value, bool) and bool not in spec.kinds
        )
    return True


@dataclass(frozen=True)
class Arr(Spec):
    item: Spec

    def check(self, value: Any, where: str, walk: Walk) -> None:
        if not isinstance(value, list):
            raise Refused(where, f"expected a list, got {_type_name(value)}", status=400)
        for i, item in enumerate(value):
            self.item.check(item, f"{where}[{i}]", walk)


UnknownKey = Callable[[str, Any, str, Walk], None]
"""Called for a key an object does not name: refuse (raise) or accept it (return)."""


@dataclass(frozen=True)
class Obj(Spec):
    """An object whose keys are all named here; any other key is refused."""

    fields: Mapping[str, Spec]
    unknown: UnknownKey | None = None
    """Gives the reason for (or accepts) a key not in ``fields``: server tools
    and URL fetchers have reasons of their own."""

    def check(self, value: Any, where: str, walk: Walk) -> None:
        if not isinstance(value, dict):
            raise Refused(where, f"expected an object, got {_type_name(value)}", status=400)
        for key, item in value.items():
            here = f"{where}.{key}" if where else key
            spec = self.fields.get(key)
            if spec is not None:
                spec.check(item, here, walk)
            elif self.unknown is not None:
                self.unknown(key, item, here, walk)
            else:
                raise Refused(here, "not a field pi sends to this API; piwork forwards only those")

    def extended(self, more: Mapping[str, Spec]) -> Obj:
        return Obj({**self.fields, **more}, self.unknown)


UnknownTag = Callable[[Any, dict[str, Any], str, Walk], None]
"""Called for an object whose tag no variant names: refuse (raise) or accept it."""


@dataclass(frozen=True)
class Tagged(Spec):
    """Objects told apart by one key (``type``, ``role``); the tag picks the schema."""

    tag: str
    variants: Mapping[Any, Spec]
    """``None`` is the variant for an object without the tag."""
    unknown: UnknownTag | None = None

    def check(self, value: Any, where: str, walk: Walk) -> None:
        if not isinstance(value, dict):
            raise Refused(where, f"expected an object, got {_type_name(value)}", status=400)
        tag = value.get(self.tag)
        try:
            spec = self.variants.get(tag)
        except TypeError:  # an unhashable tag (a list, an object)
            spec = None
        if spec is not None:
            spec.check(value, where, walk)
        elif self.unknown is not None:
            self.unknown(tag, value, where, walk)
        else:
            raise Refused(f"{where}.{self.tag}", f"{tag!r} is not one pi sends")


def check(spec: Spec, value: Any, enabled: frozenset[str] = frozenset()) -> Walk:
    """Raise :class:`Refused` unless ``value`` fits ``spec``; the server tools it uses."""
    walk = Walk(enabled)
    spec.check(value, "", walk)
    return walk


__all__ = [
    "ANY",
    "BOOL",
    "INT",
    "NULL",
    "NUM",
    "STR",
    "Arr",
    "Either",
    "Obj",
    "Refused",
    "Scalar",
    "ServerToolUse",
    "Spec",
    "Tagged",
    "Walk",
    "check",
    "either",
    "enum",
    "loads_strict",
]
