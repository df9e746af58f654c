"""The remote hosts the app offers (``piwork hosts``): read from the hosts file only.

The app never connects to a host to list it: a host that is down or slow must not
delay the window, and connecting is the run's job (``RunRequest.host``).
"""

from __future__ import annotations

from piwork.gui.text import sanitize
from piwork.hosts import store

ADD_HINT = "Add a host with: piwork hosts add NAME user@box"


def host_names() -> tuple[list[str], str | None]:
    """The stored hosts' names, and what is wrong with the hosts file if it is unreadable."""
    try:
        hosts = store.load()
    except store.HostError as exc:
        return [], sanitize(str(exc), limit=800)
    return sorted(hosts), None


def host_lines() -> tuple[list[str], str | None]:
    """One line per stored host for Settings: name and login target."""
    try:
        hosts = store.load()
    except store.HostError as exc:
        return [], sanitize(str(exc), limit=800)
    return [f"{h.name}  {h.target}" for _, h in sorted(hosts.items())], None
