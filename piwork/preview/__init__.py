"""Previews: a server the agent starts in the VM, opened in the person's browser.

See :mod:`piwork.preview.manager` for the life of a preview,
:mod:`piwork.preview.gate` for what each connection must show before a byte
reaches the guest, and docs/security.md ("Previews") for the boundary.
"""

from piwork.preview.manager import Previews, parse_ports
from piwork.preview.policy import PreviewAsker, PreviewChoice, PreviewQuestion
from piwork.preview.state import PreviewInfo
from piwork.preview.state import read as read_previews

__all__ = [
    "PreviewAsker",
    "PreviewChoice",
    "PreviewInfo",
    "PreviewQuestion",
    "Previews",
    "parse_ports",
    "read_previews",
]
