"""Making guest-sourced text safe to print on a terminal or show in a widget: the one sanitiser.

Everything the VM sends is untrusted: a permission question, a command, a file
name, a diff, a stop message, the model's text. Printed raw, an ESC sequence can
move the cursor, erase the lines above (hide a ``+curl … | sh`` diff line), fake a
different question, set the window title or write the clipboard (OSC 52); a bidi
override can make ``rm -rf ~/safe‮txt.exe`` read differently from what runs.

One set of unsafe characters, two policies (``mode``):

* ``"escape"`` (the CLI): each unsafe character becomes a visible escape
  (``\\x1b``, ``\\u202e``), so the person sees that something was there;
* ``"strip"`` (the app's widgets, which render text and do not interpret
  escapes): unsafe characters are removed.

Unsafe: C0 controls except tab and newline, DEL, C1 controls (``\\x9b`` is a
one-byte CSI on some terminals), every Unicode format character (category Cf:
bidi marks, embeddings, overrides and isolates, zero-width characters, the soft
hyphen, ...), the line and paragraph separators U+2028/U+2029, and lone
surrogates (``os.fsdecode`` of a name that is not UTF-8: printing them raw
would raise). ``one_line`` makes tab, newline and CR unsafe too, for text
shown inside one line (a file name in a list must not start a fake line).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

Mode = Literal["escape", "strip"]

# Anything that is not printable ASCII is looked at; the callback decides.
_CANDIDATE = re.compile("[^\x20-\x7e\t\n]")
_CANDIDATE_ONE_LINE = re.compile("[^\x20-\x7e]")
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _unsafe(ch: str) -> bool:
    code = ord(ch)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return True
    return unicodedata.category(ch) in _UNSAFE_CATEGORIES


def _escaped(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def has_unsafe(text: str, *, one_line: bool = True) -> bool:
    """Whether ``text`` holds a character :func:`sanitize` would change (with ``one_line``,
    tab, newline and CR too): for values that must be refused rather than shown escaped."""
    pattern = _CANDIDATE_ONE_LINE if one_line else _CANDIDATE
    return any(_unsafe(m.group(0)) for m in pattern.finditer(text))


def sanitize(
    text: object,
    *,
    one_line: bool = False,
    mode: Mode = "escape",
    limit: int | None = None,
) -> str:
    """``text`` with every terminal control and text-reordering character made harmless.

    ``mode="escape"`` shows each as a visible escape, ``mode="strip"`` removes
    it (with ``one_line``, tab, newline and CR become spaces instead). Tabs and
    newlines are kept unless ``one_line``. ``limit`` bounds the result (in
    characters, ending with "…"). Non-strings are converted with ``str`` first;
    ``None`` becomes ``""``.
    """
    if text is None:
        return ""
    s = text if isinstance(text, str) else str(text)
    pattern = _CANDIDATE_ONE_LINE if one_line else _CANDIDATE

    def fix(m: re.Match[str]) -> str:
        ch = m.group(0)
        if not _unsafe(ch):
            return ch
        if mode == "escape":
            return _escaped(ch)
        return " " if ch in "\t\n\r" and one_line else ""

    out = pattern.sub(fix, s)
    if limit is not None and len(out) > limit:
        out = out[: max(0, limit - 1)] + "…"
    return out


def sanitize_block(text: object, *, indent: str = "") -> str:
    """Multi-line guest text (a diff, a stop message) made safe line by line.

    Tabs and newlines stay; everything else unsafe is escaped, CR included (a
    bare CR would let a line overwrite itself on screen). ``indent`` prefixes
    every line after the first, so a continuation line cannot pass for one of
    ours.
    """
    lines = sanitize(text).split("\n")
    return ("\n" + indent).join(lines)
