"""The runner's old address: the names front ends import, now living in ``piwork.run``.

``piwork.run.session`` sequences a run; ``environment``, ``permissions``,
``usage`` and ``digest`` are its collaborators. This face stays while callers
move; new code imports from ``piwork.run`` directly.
"""

from __future__ import annotations

from piwork.agent import Agent, AgentFactory
from piwork.run.digest import EventKind, EventSink, RunEvent
from piwork.run.permissions import AllowAsker, Asker, DenyAsker
from piwork.run.request import (
    DEFAULT_RESUME_PROMPT,
    Outcome,
    RunError,
    RunRequest,
    Transport,
    VmStartFailed,
)
from piwork.run.session import ABORT_CONFIRM_S, TaskSession, run_task

__all__ = [
    "ABORT_CONFIRM_S",
    "DEFAULT_RESUME_PROMPT",
    "Agent",
    "AgentFactory",
    "AllowAsker",
    "Asker",
    "DenyAsker",
    "EventKind",
    "EventSink",
    "Outcome",
    "RunError",
    "RunEvent",
    "RunRequest",
    "TaskSession",
    "Transport",
    "VmStartFailed",
    "run_task",
]
