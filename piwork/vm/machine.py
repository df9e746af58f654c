"""One QEMU process's life: launch, watch, control, and guaranteed teardown.

Modelled on QEMU's own ``machine.py``: a single class owns the VM, an async
context manager guarantees shutdown, and every launch failure carries the
command line and the tail of the console. Nothing here knows about pi.

No QEMU outlives piwork: the child gets ``PR_SET_PDEATHSIG(SIGKILL)`` on Linux
(via ``setpriv``, see :func:`tied_argv`), so even a ``kill -9`` of piwork takes
QEMU with it, and ``__aexit__`` kills it on any exception or Ctrl-C.

The person's working folder is a read-only share (piwork.agent.spec): QEMU's 9p
server refuses every write to it, whatever the guest does (docs/change-sets.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from qemu.qmp import QMPClient

from piwork import errors
from piwork.vm.command import VmSpec, build_command, console_socket, host_lpj

log = logging.getLogger(__name__)

STAGE_RE = re.compile(rb"piwork: stage=(\w+) uptime=([\d.]+)")
CONSOLE_MAX_BYTES = 8 << 20
"""console.log is rotated to console.1.log past this: at most twice this per run."""


class ConsoleLog:
    """The serial console, written by the host from QEMU's console socket, bounded.

    A guest can print without end; the file never grows past ``max_bytes``:
    it is then renamed to ``console.1.log`` (replacing the previous one) and a
    new ``console.log`` begins. Only the first connection (QEMU's) is served.
    """

    def __init__(self, path: Path, max_bytes: int = CONSOLE_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.rotations = 0
        self._fd = -1
        self._size = 0
        self._server: asyncio.Server | None = None
        self._served = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, socket_path: Path) -> None:
        self._open()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        self._server = await asyncio.start_unix_server(self._serve, str(socket_path))
        with contextlib.suppress(OSError):
            os.chmod(socket_path, 0o600)

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self._size = 0

    def write(self, data: bytes) -> None:
        while data:
            if self._size >= self.max_bytes:
                os.close(self._fd)
                os.replace(self.path, self.path.with_suffix(".1.log"))
                self.rotations += 1
                self._open()
            part = data[: self.max_bytes - self._size]
            os.write(self._fd, part)
            self._size += len(part)
            data = data[len(part) :]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._served:
            writer.close()  # only QEMU's connection
            return
        self._served = True
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while data := await reader.read(65536):
                try:
                    self.write(data)
                except OSError as exc:  # disk full: the console is lost, the VM is not
                    log.warning("console.log: %s", exc)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class VmError(RuntimeError, errors.VmError):
    """A VM failure, with what a person needs to diagnose it."""

    def __init__(
        self, message: str, *, argv: list[str] | None = None, console_tail: str = ""
    ) -> None:
        self.argv = argv or []
        self.console_tail = console_tail
        detail = message
        if argv:
            detail += "\n\nQEMU command line:\n  " + shlex.join(argv)
        if console_tail:
            detail += "\n\nLast console output:\n" + console_tail
        super().__init__(detail)
        self.short = message


class BootStalled(VmError):
    pass


class VmExited(VmError):
    pass


def tied_argv(argv: list[str]) -> list[str]:
    """``argv`` run so that it dies with this process, even on ``kill -9``.

    On Linux, util-linux's ``setpriv --pdeathsig KILL`` sets the parent-death
    signal and execs the command (same pid). Nothing runs as Python between
    fork and exec: ``preexec_fn`` is unsafe in a process with threads. Pair it
    with ``start_new_session=True`` (Ctrl-C on the terminal goes to piwork,
    which shuts QEMU down in order).
    """
    if sys.platform.startswith("linux"):
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            return [setpriv, "--pdeathsig", "KILL", "--", *argv]
        log.warning("setpriv (util-linux) not found: QEMU will not die with a killed piwork")
    return list(argv)


def tail_file(path: Path, max_bytes: int = 4000) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    # SeaBIOS/kernel output may carry escape sequences; keep it readable.
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    return "\n".join("  | " + line for line in text.splitlines()[-40:])


BootCallback = Callable[[str, float], None]


def record_stages(
    buf: bytes,
    t0: float,
    stages: dict[str, float],
    seen: asyncio.Event,
    on_stage: Callable[[str, float], None] | None,
) -> bytes:
    """Note each ``piwork: stage=NAME`` marker in ``buf`` once (seconds since ``t0``).

    Returns the unfinished last line, to be prefixed to the next chunk. Used for a
    local console log and for a remote one read over SSH alike.
    """
    for m in STAGE_RE.finditer(buf):
        name = m.group(1).decode()
        if name not in stages:
            stages[name] = time.monotonic() - t0
            seen.set()
            if on_stage:
                on_stage(name, stages[name])
    return buf[buf.rfind(b"\n") + 1 :] if b"\n" in buf else buf


class VirtualMachine:
    """A QEMU VM built from a :class:`VmSpec`.

    ``async with VirtualMachine(spec) as vm:`` launches it; leaving the block
    shuts it down (gracefully if asked before, else by force).
    """

    def __init__(self, spec: VmSpec, *, on_stage: BootCallback | None = None) -> None:
        if spec.accel.is_emulated and spec.tcg_lpj is None:
            # QEMU runs here, so this host's TSC is the guest's (piwork.vm.command.host_lpj).
            spec = replace(spec, tcg_lpj=host_lpj())
        self.spec = spec
        self.argv = build_command(spec)
        self.on_stage = on_stage
        self.proc: asyncio.subprocess.Process | None = None
        self.qmp: QMPClient | None = None
        self.started_at = 0.0
        self.stages: dict[str, float] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=256)
        """The latest QMP events (bounded: a chatty guest cannot grow it)."""
        self._stderr_path = spec.console_log.with_suffix(".qemu-stderr.log")
        self._event_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._stage_seen = asyncio.Event()
        self.console = ConsoleLog(spec.console_log)
        self.launch_argv: list[str] = list(self.argv)
        """The argv actually started."""

    # ------------------------------------------------------------ launch
    async def __aenter__(self) -> VirtualMachine:
        await self.launch()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    def _prepare_files(self) -> None:
        for sock in (self.spec.qmp_socket, self.spec.rpc_socket, self.spec.net_socket):
            if sock is not None:
                sock.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    sock.unlink()  # a socket file from an earlier run blocks QEMU's bind
        log_path = self.spec.console_log
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if log_path.exists():
            os.replace(log_path, log_path.with_suffix(".prev.log"))

    async def launch(self) -> None:
        self._prepare_files()
        self.started_at = time.monotonic()
        await self.console.start(console_socket(self.spec))  # QEMU connects to it at start
        stderr = self._stderr_path.open("wb")
        try:
            if shutil.which(self.argv[0]) is None:  # setpriv would exec it: check first
                raise FileNotFoundError(self.argv[0])
            self.proc = await asyncio.create_subprocess_exec(
                *tied_argv(self.launch_argv),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise VmError(
                f"QEMU is not installed ({self.argv[0]} not found). Install it with: "
                "apt-get install qemu-system-x86 (Debian/Ubuntu) or brew install qemu (macOS)",
                argv=self.argv,
            ) from exc
        finally:
            stderr.close()
        self._watch_task = asyncio.create_task(self._watch_console(), name="vm-console-watch")
        try:
            await self._connect_qmp()
        except BaseException:
            await self.kill()
            raise

    async def _connect_qmp(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        qmp = QMPClient(self.spec.name)
        while True:
            self._raise_if_exited("QEMU exited during start-up")
            if self.spec.qmp_socket.exists():
                try:
                    await qmp.connect(str(self.spec.qmp_socket))
                    break
                except Exception as exc:  # qemu.qmp raises its own ConnectError family
                    if time.monotonic() > deadline:
                        raise self._error(f"cannot connect to QMP: {exc}") from exc
            elif time.monotonic() > deadline:
                raise self._error("QEMU did not create its QMP socket in time")
            await asyncio.sleep(0.05)
        self.qmp = qmp
        self._event_task = asyncio.create_task(self._pump_events(qmp), name="vm-qmp-events")

    async def _pump_events(self, qmp: QMPClient) -> None:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            async for event in qmp.events:
                self.events.append(dict(event))
                log.debug("qmp event %s", event.get("event"))

    # ------------------------------------------------------------ watching
    async def _watch_console(self) -> None:
        """Parse boot-stage markers from the console log as they appear."""
        path = self.spec.console_log
        pos = 0
        buf = b""
        while True:
            try:
                with path.open("rb") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
            except FileNotFoundError:
                chunk = b""
            if not chunk and pos and self._console_size() < pos:
                pos = 0  # rotated (a guest printing without end)
            if chunk:
                pos += len(chunk)
                buf = (buf + chunk)[-8192:]
                buf = record_stages(
                    buf, self.started_at, self.stages, self._stage_seen, self.on_stage
                )
            if "supervisor" in self.stages:
                return
            await asyncio.sleep(0.1)

    def _console_size(self) -> int:
        try:
            return self.spec.console_log.stat().st_size
        except FileNotFoundError:
            return 0

    def console_tail(self) -> str:
        tail = tail_file(self.spec.console_log)
        err = tail_file(self._stderr_path, 2000)
        if err.strip():
            tail += "\n  (QEMU stderr)\n" + err
        return tail

    def _error(self, message: str, cls: type[VmError] = VmError) -> VmError:
        return cls(message, argv=self.argv, console_tail=self.console_tail())

    def _raise_if_exited(self, message: str) -> None:
        if self.proc is not None and self.proc.returncode is not None:
            raise self._error(f"{message} (exit status {self.proc.returncode})", VmExited)

    async def wait_booted(self, stall_timeout: float = 90.0) -> None:
        """Wait until /init starts the supervisor, failing if boot makes no progress.

        "Progress" is a new boot stage or new console output; a guest that goes
        silent for ``stall_timeout`` seconds is reported with the console tail
        instead of waiting forever.
        """
        last_size = -1
        last_progress = time.monotonic()
        while "supervisor" not in self.stages:
            self._raise_if_exited("the VM stopped while booting")
            try:
                size = self.spec.console_log.stat().st_size
            except FileNotFoundError:
                size = 0
            if size != last_size or self._stage_seen.is_set():
                self._stage_seen.clear()
                last_size = size
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > stall_timeout:
                seen = ", ".join(self.stages) or "none"
                raise self._error(
                    f"no boot progress for {stall_timeout:.0f}s (stages seen: {seen})", BootStalled
                )
            await asyncio.sleep(0.1)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # ------------------------------------------------------------ control
    async def qmp_execute(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        if self.qmp is None:
            raise self._error(f"QMP is not connected (cannot run {cmd})")
        return await self.qmp.execute(cmd, args)

    async def status(self) -> str:
        res = await self.qmp_execute("query-status")
        return str(res.get("status", "unknown"))

    async def pause(self) -> None:
        await self.qmp_execute("stop")

    async def resume(self) -> None:
        await self.qmp_execute("cont")

    async def wait_exit(self, timeout: float) -> bool:
        if self.proc is None:
            return True
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop QEMU: wait for a guest poweroff already asked for, then QMP quit, then kill."""
        try:
            if self.running and not await self.wait_exit(0 if grace <= 0 else min(grace, 0.5)):
                if self.qmp is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self.qmp.execute("quit"), 3)
                if not await self.wait_exit(max(grace - 0.5, 1.0)):
                    await self.kill()
        finally:
            await self._cleanup()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def _cleanup(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            await self.kill()
        await self.console.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(console_socket(self.spec))
        for task in (self._watch_task, self._event_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self.qmp is not None:
            with contextlib.suppress(Exception):
                await self.qmp.disconnect()
            self.qmp = None
        for sock in (self.spec.qmp_socket, self.spec.rpc_socket, self.spec.net_socket):
            if sock is not None:
                with contextlib.suppress(FileNotFoundError):
                    sock.unlink()
