"""piwork's exceptions: one root, five kinds, and one way to show them to a person.

Every package's exception classes keep their names and import locations and
hang from this tree, so a front end can catch ``PiworkError`` and know the
message is meant for people, and tell by the kind what the person can do::

    PiworkError                  str() says what happened and what to do
     +-- PersonError             the person can fix it: a bad argument, an unknown
     |    |                      task/model, a missing folder, a used-up limit,
     |    |                      a malformed settings/providers/policy file
     |    +-- run.RunError, tasks.TaskNotFound, tasks.AmbiguousTaskId,
     |        tasks.FolderAlreadyBound, tasks.FolderError, tasks.SettingsError,
     |        models.ProviderConfigError, proxy.AllowNetError, tasks.TaskBusy,
     |        policy.PolicyError, auth.KeyStoreError, checkpoints.UndoConflict ...
     +-- StoreError              a file piwork keeps could not be read or written
     |    +-- tasks.TaskStoreError (CorruptTask, TaskWriteError, NotOwner),
     |        tasks.TranscriptError, checkpoints.CheckpointError
     +-- VmError                 QEMU, the accelerator or the guest failed
     |    +-- vm.VmError (BootStalled, VmExited), run.VmStartFailed,
     |        vm.ChannelError, vm.TemplateUnavailable, resources.ResourceError
     +-- ProtocolError           the guest broke a protocol (it is untrusted)
     |    +-- rpc.RpcError (RpcTimeout, RpcConnectionLost), vm.netmux.ProtocolError,
     |        policy.PermissionPayloadError
     +-- PackError               building or verifying the runtime pack
          +-- pack.PackError (PinUnavailableError, ManifestError)

Exit codes (``piwork`` on the command line, documented in the README):

    0    done
    1    the run failed (StoreError, VmError, ProtocolError, PackError; a task
         that ended with an error)
    2    usage error: the command cannot be done as typed (argparse, PersonError)
    3    the task stopped at one of its limits
    70   a bug in piwork (any other exception; the traceback goes to the log)
    130  stopped by the person (Ctrl-C)

Causes are kept (``raise ... from exc``): the log has the whole chain.
"""

from __future__ import annotations

import logging

log = logging.getLogger("piwork")

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_LIMIT = 3
EXIT_BUG = 70
EXIT_INTERRUPTED = 130


class PiworkError(Exception):
    """The root: ``str()`` is meant for people."""

    exit_code = EXIT_RUN_FAILED


class PersonError(PiworkError):
    """The person can fix it by changing what they asked for."""

    exit_code = EXIT_USAGE


class StoreError(PiworkError):
    """A file piwork keeps (task, transcript, checkpoints) could not be read or written."""


class VmError(PiworkError):
    """QEMU, the accelerator or the guest failed."""


class ProtocolError(PiworkError):
    """The guest (untrusted) broke the RPC, channel or permission protocol."""


class PackError(PiworkError):
    """The runtime pack could not be built or verified."""


def describe(exc: BaseException) -> tuple[str, int]:
    """One line (or block) for a person, and the exit code, for any exception.

    piwork's own errors say what to do, so they are shown as they are. Anything
    else is a bug: it is logged with its traceback, and the person is told
    where to look instead of being shown the traceback.
    """
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(exc, PiworkError):
        return str(exc) or type(exc).__name__, exc.exit_code
    log.error("unexpected error", exc_info=exc)
    return (
        f"internal error ({type(exc).__name__}: {exc}); this is a bug in piwork, "
        "the traceback is in the log",
        EXIT_BUG,
    )


__all__ = [
    "EXIT_BUG",
    "EXIT_INTERRUPTED",
    "EXIT_LIMIT",
    "EXIT_OK",
    "EXIT_RUN_FAILED",
    "EXIT_USAGE",
    "PackError",
    "PersonError",
    "PiworkError",
    "ProtocolError",
    "StoreError",
    "VmError",
    "describe",
]
