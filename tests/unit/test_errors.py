"""One error root, one way to show an error, one exit code rule (piwork.errors)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import piwork
from piwork import errors
from piwork.agent import PiGone
from piwork.auth.keys import KeyStoreError
from piwork.checkpoints.shadow import CheckpointError
from piwork.cli.main import main
from piwork.models.providers import ProviderConfigError
from piwork.pack.errors import ManifestError
from piwork.policy.request import PermissionPayloadError
from piwork.proxy.egress import AllowNetError
from piwork.rpc.client import RpcTimeout
from piwork.runner import RunError, VmStartFailed
from piwork.sharefs import UnsafePathError
from piwork.tasks.folders import FolderError
from piwork.tasks.store import CorruptTask, TaskNotFound
from piwork.tasks.transcript import TranscriptFull
from piwork.vm.machine import BootStalled
from piwork.vm.netmux import ProtocolError as NetmuxProtocolError
from piwork.vm.template import TemplateUnavailable


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (TaskNotFound, errors.PersonError),
        (KeyStoreError, errors.PersonError),
        (ProviderConfigError, errors.PersonError),
        (RunError, errors.UsageError),
        (FolderError, errors.UsageError),
        (AllowNetError, errors.UsageError),
        (CorruptTask, errors.StoreError),
        (TranscriptFull, errors.StoreError),
        (CheckpointError, errors.StoreError),
        (BootStalled, errors.VmError),
        (VmStartFailed, errors.VmError),
        (TemplateUnavailable, errors.VmError),
        (PiGone, errors.VmError),
        (RpcTimeout, errors.ProtocolError),
        (NetmuxProtocolError, errors.ProtocolError),
        (PermissionPayloadError, errors.ProtocolError),
        (UnsafePathError, errors.ProtocolError),
        (ManifestError, errors.PackError),
    ],
)
def test_every_package_error_hangs_from_the_root_under_its_kind(
    cls: type[BaseException], kind: type[errors.PiworkError]
) -> None:
    assert issubclass(cls, kind) and issubclass(cls, errors.PiworkError)


def every_exception_class() -> list[type[BaseException]]:
    """Every exception class a piwork module defines (each module imported, the GUI's too)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(piwork.__path__, "piwork."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def test_every_exception_piwork_defines_hangs_from_the_root() -> None:
    classes = every_exception_class()
    assert len(classes) > 50, "the walk found too few: it is broken, not the tree"
    outside = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in classes
        if not issubclass(cls, errors.PiworkError)
    )
    assert outside == [], "hang these from a kind in piwork/errors.py"


def test_old_bases_are_kept_so_existing_handlers_still_catch() -> None:
    assert issubclass(FolderError, ValueError)
    assert issubclass(UnsafePathError, OSError)
    assert issubclass(RpcTimeout, TimeoutError)
    assert issubclass(PiGone, RuntimeError)


def test_exit_codes_per_kind() -> None:
    assert errors.describe(RunError("bad --model"))[1] == errors.EXIT_USAGE == 2
    assert errors.describe(TaskNotFound("no task"))[1] == errors.EXIT_RUN_FAILED == 1
    assert errors.describe(BootStalled("stalled"))[1] == 1
    assert errors.describe(OSError(28, "No space left on device"))[1] == 1
    assert errors.describe(KeyboardInterrupt()) == ("interrupted", 130)


def test_a_bug_is_one_line_for_the_person_and_a_traceback_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "piwork.log"
    try:
        {}["missing"]
    except KeyError as exc:
        message, code = errors.describe(exc, log)
    assert code == errors.EXIT_BUG
    assert "bug in piwork" in message and str(log) in message
    assert "\n" not in message
    assert "Traceback" in log.read_text() and "KeyError" in log.read_text()


def test_the_cli_shows_a_missing_task_as_one_line_the_same_for_resume_and_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PIWORK_HOME", str(tmp_path))
    assert main(["tasks", "show", "nosuch"]) == 1
    shown = capsys.readouterr().err.strip().splitlines()
    assert main(["resume", "nosuch", "--yes"]) == 1
    resumed = capsys.readouterr().err.strip().splitlines()
    assert shown[-1] == resumed[-1]
    assert shown[-1].startswith("piwork: no task with id 'nosuch'")
    assert "TaskNotFound" not in shown[-1]
