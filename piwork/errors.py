"""piwork's exceptions: one root, five kinds, and one way to show them to a person.

Every package's exception classes keep their names and import locations and
hang from this tree, so a front end can catch ``PiworkError`` and know the
message is meant for people, and tell by the kind what the person can do::

    PiworkError                  str() says what happened and what to do
     +-- PersonError             the person can fix it: an unknown or busy task, a
     |    |                      malformed settings/providers/policy file, no keyring
     |    |                      (tasks.TaskNotFound, tasks.AmbiguousTaskId, tasks.TaskBusy,
     |    |                      tasks.FolderAlreadyBound, tasks.SettingsError,
     |    |                      models.ProviderConfigError, policy.PolicyError,
     |    |                      auth.KeyStoreError, checkpoints.UndoConflict/TaskRunning,
     |    |                      gui AlreadyRunning/LeakingQtError, preview.PreviewUnavailable)
     |    +-- UsageError         a value given to the command is wrong: a bad --model,
     |                           a missing --folder, --allow-net, --policy, a used-up
     |                           limit, too much --memory (run.RunError,
     |                           tasks.FolderError, proxy.AllowNetError,
     |                           resources.ResourceError, run.environment.ModelNotFound,
     |                           cli.bench_compare.CompareError)
     +-- StoreError              a file piwork keeps could not be read or written
     |    +-- tasks.TaskStoreError (CorruptTask, TaskWriteError, NotOwner),
     |        tasks.TranscriptError, tasks.InvalidTransition,
     |        checkpoints.CheckpointError
     +-- VmError                 QEMU, the accelerator, the guest or pi failed
     |    +-- vm.VmError (BootStalled, VmExited), run.VmStartFailed, agent.PiGone,
     |        vm.ChannelError, vm.TemplateUnavailable, vm.gitguard.GitGuardError,
     |        vm.confine.ConfineError, hosts.check.CheckError, hosts.streams.StreamUnavailable
     +-- ProtocolError           the guest broke a protocol (it is untrusted)
     |    +-- rpc.RpcError (RpcTimeout, RpcConnectionLost), vm.netmux.ProtocolError,
     |        policy.PermissionPayloadError, sharefs.UnsafePathError, hosts.vm.FileTooBig,
     |        the egress proxy's refusals
     +-- PackError               building or verifying the runtime pack
          +-- pack.PackError (PinUnavailableError, ManifestError)

Exit codes (``piwork`` on the command line, documented in the README):

    0    done
    1    the command failed: a PersonError (no such task, ...), StoreError,
         VmError, ProtocolError, PackError, an OSError; or the task ended
         with an error
    2    usage error: the command's arguments are wrong (argparse, UsageError)
    3    the task stopped at one of its limits
    70   a bug in piwork (any other exception; the traceback goes to the log)
    130  stopped by the person (Ctrl-C)

Causes are kept (``raise ... from exc``): the log has the whole chain.
"""

from __future__ import annotations

import datetime
import logging
import traceback
from pathlib import Path

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
    """The person can fix it (the message says how)."""


class UsageError(PersonError):
    """A value given to the command is wrong; the same command with another value works."""

    exit_code = EXIT_USAGE


class StoreError(PiworkError):
    """A file piwork keeps (task, transcript, checkpoints) could not be read or written."""


class VmError(PiworkError):
    """QEMU, the accelerator or the guest failed."""


class ProtocolError(PiworkError):
    """The guest (untrusted) broke the RPC, channel or permission protocol."""


class PackError(PiworkError):
    """The runtime pack could not be built or verified."""


def describe(exc: BaseException, log_file: Path | None = None) -> tuple[str, int]:
    """One message for a person, and the exit code, for any exception.

    piwork's own errors say what to do, so they are shown as they are (their
    causes stay on the exception for the log). Anything else is a bug: its
    traceback goes to ``log_file`` (and the logger), and the person is told
    where it is instead of being shown it.
    """
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(exc, PiworkError):
        return str(exc) or type(exc).__name__, exc.exit_code
    if isinstance(exc, OSError):  # the disk, a permission, a socket: not a bug in piwork
        return str(exc), EXIT_RUN_FAILED
    log.debug("unexpected error", exc_info=exc)
    where = "run with a debugger to see where"
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            with log_file.open("a", encoding="utf-8") as out:
                stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
                out.write(f"--- {stamp}\n")
                out.write("".join(traceback.format_exception(exc)))
            where = f"the traceback is in {log_file}"
        except OSError:
            pass
    return f"internal error ({type(exc).__name__}: {exc}); this is a bug in piwork, {where}", (
        EXIT_BUG
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
    "UsageError",
    "VmError",
    "describe",
]
