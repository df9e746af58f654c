"""Checkpoints: every change piwork makes to the working folder can be seen and undone.

The guest never writes the person's folder; piwork applies the agent's change
sets (:mod:`piwork.changes`), and a checkpoint records the previous version of
each path a change set touches, so its cost follows the change, not the folder,
and no folder is too big for undo. This package is the history's public face
for ``piwork changes`` / ``undo`` and the app's Turns view
(:mod:`piwork.changes.history` holds the code).
"""

from piwork.changes.engine import CHANGES_DIR
from piwork.changes.errors import CheckpointError, TaskRunning, UndoConflict
from piwork.changes.history import (
    MAX_FILES,
    Checkpoint,
    FileChange,
    GcResult,
    UndoResult,
    checkpoints_size,
    gc_task,
    list_checkpoints,
    task_changes,
    tree_size,
    undo,
)

CHECKPOINTS_DIR = CHANGES_DIR

__all__ = [
    "CHECKPOINTS_DIR",
    "MAX_FILES",
    "Checkpoint",
    "CheckpointError",
    "FileChange",
    "GcResult",
    "TaskRunning",
    "UndoConflict",
    "UndoResult",
    "checkpoints_size",
    "gc_task",
    "list_checkpoints",
    "task_changes",
    "tree_size",
    "undo",
]
