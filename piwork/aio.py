"""Small asyncio helpers shared by the agent and the runner."""

from __future__ import annotations

import asyncio
from typing import Any


def _swallow(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: asyncio will not log it as lost


def discard(*futures: asyncio.Future[Any]) -> None:
    """Cancel what is still pending and consume its outcome.

    A wait that is itself cancelled (Ctrl-C) leaves its helper tasks behind;
    when the VM then goes away they fail, and asyncio would print "exception
    was never retrieved" tracebacks at the person.
    """
    for fut in futures:
        if not fut.done():
            fut.cancel()
        fut.add_done_callback(_swallow)
