"""Checkpoints: every change the agent makes to the working folder can be seen and undone.

Ignored files included; what the caps or git's own limits keep out of a
checkpoint is noted and listed by ``piwork changes``, and undo never deletes it
(see :mod:`piwork.checkpoints.shadow`).

A per-task shadow git repository (``<task dir>/checkpoints``, outside every
share the guest mounts) records the folder at task start, before each agent
turn and at task end. Start here: :func:`list_checkpoints`,
:func:`task_changes`, :func:`undo`; the runner uses :class:`RunRecorder`.
"""

from piwork.checkpoints.api import (
    CHECKPOINTS_DIR,
    Checkpoint,
    FileChange,
    GcResult,
    RunRecorder,
    TaskRunning,
    UndoConflict,
    UndoResult,
    checkpoints_size,
    gc_task,
    list_checkpoints,
    repo_for,
    summarise,
    task_changes,
    undo,
)
from piwork.checkpoints.shadow import MAX_FILES, CheckpointError, ShadowRepo

__all__ = [
    "CHECKPOINTS_DIR",
    "MAX_FILES",
    "Checkpoint",
    "CheckpointError",
    "FileChange",
    "GcResult",
    "RunRecorder",
    "ShadowRepo",
    "TaskRunning",
    "UndoConflict",
    "UndoResult",
    "checkpoints_size",
    "gc_task",
    "list_checkpoints",
    "repo_for",
    "summarise",
    "task_changes",
    "undo",
]
