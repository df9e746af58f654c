"""The one door to a task's VM and the pi in it (``piwork.agent``).

- ``spec``: what a task's VM is made of (guest paths, task directories, the
  configuration, ``vm_spec`` and ``saved_vm_for``);
- ``door``: what a run may ask of pi (:class:`PiDoor`), the :class:`Agent`
  protocol a run is given (``AgentVm``, a remote VM, or a test double);
- ``vm``: :class:`AgentVm`, a booted VM with pi running in it.

The names are re-exported here: callers import ``from piwork.agent import ...``.
"""

from __future__ import annotations

from piwork.agent.door import (
    Agent,
    AgentFactory,
    PiDoor,
    PiGone,
    VmExit,
    guest_timings,
)
from piwork.agent.spec import (
    GATE_EXTENSION,
    GUEST_AGENT_DIR,
    GUEST_EXTENSIONS,
    GUEST_OUTPUTS,
    GUEST_SESSION,
    GUEST_STATE,
    GUEST_UPLOADS,
    GUEST_WORK,
    PROJECT_EXTENSION,
    TASK_EXTENSIONS,
    AgentVmConfig,
    BootModeCallback,
    LineCallback,
    StageCallback,
    TaskDirs,
    saved_vm_for,
    vm_spec,
)
from piwork.agent.vm import (
    AgentVm,
)

__all__ = [
    "GATE_EXTENSION",
    "GUEST_AGENT_DIR",
    "GUEST_EXTENSIONS",
    "GUEST_OUTPUTS",
    "GUEST_SESSION",
    "GUEST_STATE",
    "GUEST_UPLOADS",
    "GUEST_WORK",
    "PROJECT_EXTENSION",
    "TASK_EXTENSIONS",
    "Agent",
    "AgentFactory",
    "AgentVm",
    "AgentVmConfig",
    "BootModeCallback",
    "LineCallback",
    "PiDoor",
    "PiGone",
    "StageCallback",
    "TaskDirs",
    "VmExit",
    "guest_timings",
    "saved_vm_for",
    "vm_spec",
]
