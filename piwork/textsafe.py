"""Making guest-sourced text safe to print on a terminal (or show in a widget).

Everything the VM sends is untrusted: a permission question, a command, a file
name, the model's text. Printed raw, an ESC sequence can move the cursor, rewrite
the lines above (fake a different question), set the window title or hide text;
a bidi override can make ``rm -rf ~/safe‮txt.exe`` read differently from what
runs. ``sanitize`` replaces every such character with a visible escape
(``\\x1b``, ``\\u202e``) so the person sees that something was there.
"""

from __future__ import annotations

import re

# C0 controls except \t and \n, DEL, C1 controls, and the Unicode format
# characters that reorder or hide text: bidi marks/embeddings/overrides/isolates
# (U+061C, U+200E-F, U+202A-E, U+2066-9), zero-width characters (U+200B-D,
# U+2060, U+FEFF) and the line/paragraph separators (U+2028-9).
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff]"
)
_UNSAFE_ONE_LINE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff]"
)


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def sanitize(text: object, *, one_line: bool = False) -> str:
    """``text`` with every terminal control and text-reordering character made visible.

    Tabs and newlines are kept unless ``one_line`` (then they are escaped too).
    Non-strings are converted with ``str`` first; ``None`` becomes ``""``.
    """
    if text is None:
        return ""
    s = text if isinstance(text, str) else str(text)
    return (_UNSAFE_ONE_LINE if one_line else _UNSAFE).sub(_escape, s)
