"""One task's state as the person sees it: the single source every view draws from. Qt-free.

The rail, the header, the composer's hint, the Send/Stop button and the crash banner
used to work out "is it running?" each from the task's fields, in their own way, and
so could disagree: "Enter steers" under a finished task, "Queued" beside a header
saying "running" (issue 33 item 2). Now a task's fields become one ``TaskState``
(``TaskController.state``), and each view only turns that into its own words here:
the same phase cannot be shown two ways, and what the hint says Enter does is what
``enter`` makes the window do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

WORKING = ("starting", "running", "waiting_permission", "waiting_input", "paused")


class Phase(enum.Enum):
    NEW = "new"  # made, never run
    QUEUED = "queued"  # waits for a free VM slot
    STARTING = "starting"  # its VM boots; the agent is not ready yet
    RUNNING = "running"
    WAITING = "waiting"  # a question for the person is open
    PAUSED = "paused"  # its VM is frozen
    STOPPING = "stopping"  # the person asked to stop; the agent has not yet
    DONE = "done"
    STOPPED = "stopped"  # stopped by the person (Stop, Esc, quit)
    FAILED = "failed"
    LIMIT = "limit"  # stopped at a turn, time, token or cost limit
    INTERRUPTED = "interrupted"  # its owner died (this app's crash, a killed CLI)
    ELSEWHERE = "elsewhere"  # another piwork process runs it


class Enter(enum.Enum):
    """What Enter in the composer does for the selected task."""

    START = "start"  # a new task
    STEER = "steer"  # into the running turn
    CONTINUE = "continue"  # a new message to a task that is not working
    HOLD = "hold"  # nothing can take a message now: the text stays in the composer


ENDED = (Phase.DONE, Phase.STOPPED, Phase.FAILED, Phase.LIMIT, Phase.INTERRUPTED, Phase.NEW)
BUSY = (Phase.STARTING, Phase.RUNNING, Phase.WAITING, Phase.PAUSED, Phase.STOPPING)

LABELS = {
    Phase.NEW: "new",
    Phase.QUEUED: "queued",
    Phase.STARTING: "starting",
    Phase.RUNNING: "running",
    Phase.WAITING: "waiting for you",
    Phase.PAUSED: "paused",
    Phase.STOPPING: "stopping…",
    Phase.DONE: "done",
    Phase.STOPPED: "stopped by you",
    Phase.FAILED: "failed",
    Phase.LIMIT: "stopped at a limit",
    Phase.INTERRUPTED: "interrupted",
    Phase.ELSEWHERE: "open in another piwork",
}

_ENDED_BY = {
    "completed": Phase.DONE,
    "cancelled": Phase.STOPPED,  # a Stop, Esc, Ctrl-C or quit: always the person
    "error": Phase.FAILED,
    "limit": Phase.LIMIT,
}


def ended_phase(status: str, reason: str | None) -> Phase:
    """The phase of a task that is not working, from its record's status and stop reason."""
    if status == "stopped":
        return _ENDED_BY.get(reason or "", Phase.DONE)
    if status == "interrupted":
        return Phase.INTERRUPTED
    if status == "queued":
        return Phase.QUEUED
    if status in WORKING:
        return Phase.ELSEWHERE  # working, and not by this window (the store's lock says so)
    return Phase.NEW


def status_label(status: str, reason: str | None) -> str:
    """The rail's word for a stored status (a task this window does not run)."""
    return LABELS[ended_phase(status, reason)]


@dataclass(frozen=True)
class TaskState:
    """What every view shows of one task, computed once from its fields."""

    phase: Phase
    warm: bool = False  # finished, its VM kept on for a follow-up
    live: bool = False  # its VM is on (or still powering off)
    asks: int = 0  # open questions for the person (permissions, previews, the agent's)

    @property
    def label(self) -> str:
        return LABELS[self.phase]

    @property
    def busy(self) -> bool:
        """Working on a message (what Stop stops and quitting would cut off)."""
        return self.phase in BUSY

    @property
    def enter(self) -> Enter:
        if self.phase in (Phase.RUNNING, Phase.WAITING):
            return Enter.STEER
        if self.phase in ENDED:
            return Enter.CONTINUE
        return Enter.HOLD

    @property
    def hint(self) -> str:
        """The composer's placeholder: what Enter does now, in this phase."""
        return HINTS[self.phase]

    @property
    def can_pause(self) -> bool:
        return self.phase in (Phase.RUNNING, Phase.WAITING, Phase.PAUSED)

    @property
    def can_stop(self) -> bool:
        return self.phase in BUSY or self.phase is Phase.QUEUED


NEW_TASK_HINT = "Describe a new task… · Enter starts it · Shift+Enter new line"
_STEER = (
    "Enter steers the agent now · Alt+Enter queues a follow-up for after this turn "
    "· Shift+Enter new line"
)
_CONTINUE = "Enter continues this task with a new message · Shift+Enter new line"
HINTS = {
    Phase.NEW: _CONTINUE,
    Phase.QUEUED: "Queued: it starts when a running task ends · Esc takes it off the queue",
    Phase.STARTING: "The agent is starting… type now; Enter sends once it is ready",
    Phase.RUNNING: _STEER,
    Phase.WAITING: _STEER,  # the question above waits too; Enter steers meanwhile
    Phase.PAUSED: "Paused · press Continue, then Enter steers the agent",
    Phase.STOPPING: "Stopping… type now; Enter continues the task once it has stopped",
    Phase.DONE: _CONTINUE,
    Phase.STOPPED: _CONTINUE,
    Phase.FAILED: _CONTINUE,
    Phase.LIMIT: _CONTINUE,
    Phase.INTERRUPTED: "Interrupted · Enter continues this task in a new VM",
    Phase.ELSEWHERE: "This task is open in another piwork window or terminal: continue it there",
}


def hint_for(state: TaskState | None) -> str:
    """The composer's placeholder for the selected task (None: the new-task composer)."""
    return NEW_TASK_HINT if state is None else state.hint
