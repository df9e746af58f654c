"""The change sets' and checkpoints' errors (under ``piwork.errors``' tree)."""

from __future__ import annotations

from piwork.errors import PersonError, StoreError


class CheckpointError(RuntimeError, StoreError):
    """Recording, reviewing or restoring the folder's history failed; ``str()`` says what to do."""


class UndoConflict(CheckpointError, PersonError):
    """Files the undo would overwrite were changed after the agent's last checkpoint."""

    def __init__(self, conflicts: list[str], reasons: dict[str, str]) -> None:
        self.conflicts = conflicts
        self.reasons = reasons
        lines = "\n".join(f"  {p}: {reasons.get(p, 'changed')}" for p in conflicts)
        super().__init__(
            f"undo would overwrite {len(conflicts)} file(s) changed since the agent's "
            f"changes:\n{lines}\nLook at them, then repeat with --force to overwrite them "
            "(what they hold now is checkpointed first, so that can be undone too)."
        )


class TaskRunning(CheckpointError, PersonError):
    """The task's VM is running (or another piwork process owns the task)."""
