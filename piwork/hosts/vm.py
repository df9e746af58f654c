"""A task's VM on a remote host: QEMU there, everything that talks to it here.

:class:`RemoteMachine` stands where :class:`piwork.vm.machine.VirtualMachine`
stands for a local VM (the same methods :class:`piwork.agent.AgentVm` calls);
:class:`RemoteAgentVm` is an ``AgentVm`` whose VM, RPC channel and netmux are
the remote ones. QMP, the serial console, the supervisor's RPC port and the
netmux port are QEMU unix sockets in the remote run directory, each reached
through an SSH direct-streamlocal channel (:mod:`piwork.hosts.streams`). The
netmux streams are connected to the model gateway and egress proxy on *this*
machine, so no key, token or policy ever goes to the remote: QEMU's argv holds
only remote paths, and its environment is the SSH session's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import secrets
import shlex
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import asyncssh
from qemu.qmp import QMPClient, Runstate

from piwork.agent import AgentVm, AgentVmConfig, TaskDirs
from piwork.checkpoints.shadow import refused_prefix
from piwork.errors import ProtocolError
from piwork.hosts import envdisk, orphans, store, templates
from piwork.hosts.check import HostReport, run_check
from piwork.hosts.connect import Confirm, connect
from piwork.hosts.listing import MAX_DEPTH, MAX_FILE_BYTES, Budget, name_ok
from piwork.hosts.packs import PackUpload, Progress, ensure_pack
from piwork.hosts.remote import put_files, remote_root, run
from piwork.hosts.store import Host, HostError
from piwork.hosts.streams import RemoteEndpoint, RemoteNetMux, open_retrying
from piwork.hosts.sync import Conflict, FolderSync, SyncResult
from piwork.hosts.watchdog import LEASE_SECONDS, ORPHANS_KEPT, RemoteQemu, sweep
from piwork.vm import gitguard
from piwork.vm.channel import GuestChannel
from piwork.vm.command import ENV_SCSI_BUS, Transport, VmSpec, build_command, console_socket
from piwork.vm.machine import (
    BootStalled,
    ConsoleLog,
    VirtualMachine,
    VmError,
    VmExited,
    record_stages,
    tail_file,
)
from piwork.vm.netmux import TARGET_EGRESS, TARGET_GATEWAY, NetMux
from piwork.vm.template import Template, TemplateUnavailable, boot_and_save, preload_watch

log = logging.getLogger(__name__)


RECONNECT_SECONDS = 60.0
"""How long a dropped SSH connection is retried before the run gives up on the host."""


@dataclass
class RemoteLink:
    """One host's SSH connection, its piwork root and what ``check`` found there.

    A dropped connection is made again in the background (the host key checked
    as strictly as the first time); ``conn`` is then the new one, and everything
    that opens channels asks for ``link.conn`` each time, so RPC, netmux and
    heartbeat carry on through it.
    """

    host: Host
    conn: asyncssh.SSHClientConnection
    root: str
    report: HostReport
    reconnects: int = 0
    lost: str | None = None
    """Why the host is unreachable for good (reconnecting gave up), else None."""

    def __post_init__(self) -> None:
        self._closing = False
        self._watch: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, host: Host, confirm: Confirm | None = None) -> RemoteLink:
        conn = await connect(host, confirm)
        try:
            root = await remote_root(conn, host, create=True)
            # No socket probe here: a refusal shows at the first channel, with the fix.
            report = await run_check(conn, root, probe_sockets=False)
            swept = await sweep(conn, root)
            if swept.removed:
                log.info("removed run dirs left by a killed piwork on %s: %s",
                         host.name, swept.removed)  # fmt: skip
            for task, rundir in swept.kept.items():
                log.info("kept the environment disk of task %s's interrupted run %s on %s "
                         "for its next start there", task, rundir, host.name)  # fmt: skip
            for task in swept.dropped:
                log.warning("dropped the environment disk kept on %s for task %s: more "
                            "than %d kept there (the oldest go)",
                            host.name, task, ORPHANS_KEPT)  # fmt: skip
        except BaseException:
            conn.close()
            raise
        link = cls(host, conn, root, report)
        link._watch = asyncio.create_task(link._keep_up(), name=f"ssh-link {host.name}")
        return link

    async def _keep_up(self) -> None:
        while not self._closing:
            await self.conn.wait_closed()
            if self._closing:
                return
            log.warning("SSH connection to %s dropped; reconnecting", self.host.name)
            deadline = time.monotonic() + RECONNECT_SECONDS
            while not self._closing:
                try:
                    self.conn = await connect(self.host, None)
                    self.reconnects += 1
                    break
                except (HostError, OSError, asyncssh.Error) as exc:
                    if time.monotonic() > deadline:
                        self.lost = (
                            f"{self.host.name} unreachable for {RECONNECT_SECONDS:.0f}s: {exc}"
                        )
                        log.error("%s", self.lost)
                        return
                    await asyncio.sleep(1)

    async def close(self) -> None:
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
        self.conn.close()
        with contextlib.suppress(Exception):
            await self.conn.wait_closed()


def remote_argv(spec: VmSpec) -> list[str]:
    """QEMU's argv for the remote: the console is a listening socket too, and QEMU waits.

    Locally QEMU connects to piwork's console listener; nothing may listen on the
    remote for us, so QEMU listens and piwork connects through SSH. ``-S`` holds
    the CPUs until that console is connected, so no boot output is lost.
    """
    argv = build_command(spec)
    cons = f"socket,id=console,path={console_socket(spec)}"
    i = argv.index(cons)
    argv[i] = cons + ",server=on,wait=off"
    return [argv[0], "-S", *argv[1:]]


class _RemoteProc:
    """The little of ``asyncio.subprocess.Process`` AgentVm uses (``wait``, ``returncode``)."""

    def __init__(self, qemu: RemoteQemu) -> None:
        self._qemu = qemu

    @property
    def pid(self) -> int | None:
        return self._qemu.pid

    @property
    def returncode(self) -> int | None:
        """As asyncio says it: a QEMU killed by signal N is -N (the watchdog's sh says 128+N)."""
        code = self._qemu.returncode
        return -(code - 128) if code is not None and 128 < code < 160 else code

    async def wait(self) -> int:
        await self._qemu.wait()
        code = self.returncode
        return -1 if code is None else code


class RemoteMachine:
    """QEMU on a remote host under the watchdog, controlled through SSH channels."""

    def __init__(
        self,
        link: RemoteLink,
        spec: VmSpec,
        *,
        run_id: str,
        lease: int = LEASE_SECONDS,
        on_stage: Any = None,
    ) -> None:
        self.link = link
        self.spec = spec
        self.argv = remote_argv(spec)
        self.on_stage = on_stage
        self.stages: dict[str, float] = {}
        self.started_at = 0.0
        self.qemu = RemoteQemu(lambda: link.conn, link.root, self.argv, lease=lease, run_id=run_id)
        self.proc = _RemoteProc(self.qemu)
        self.qmp: QMPClient | None = None
        self.git_protection: gitguard.Protection | None = None
        """None: QEMU there never sees this machine's folder, only a copy; the copy's git
        metadata never comes back (:mod:`piwork.hosts.sync` skips it)."""
        self.console = ConsoleLog(spec.console_log)
        self._console_task: asyncio.Task[None] | None = None
        self._console_writer: asyncio.StreamWriter | None = None
        self._stage_seen = asyncio.Event()

    @property
    def running(self) -> bool:
        return self.qemu.running

    @property
    def pid(self) -> int | None:
        return self.qemu.pid

    def console_tail(self) -> str:
        return tail_file(self.spec.console_log)

    def _error(self, message: str, cls: type[VmError] = VmError) -> VmError:
        return cls(f"{message} (on {self.link.host.name})", argv=self.argv,
                   console_tail=self.console_tail())  # fmt: skip

    async def launch(self) -> None:
        log_path = self.spec.console_log
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if log_path.exists():
            os.replace(log_path, log_path.with_suffix(".prev.log"))
        self.console._open()  # the bounded writer; its data comes over SSH, not a listener
        self.started_at = time.monotonic()
        try:
            await self.qemu.start()
        except (asyncssh.Error, OSError, RuntimeError) as exc:
            raise self._error(f"could not start QEMU on the remote: {exc}") from exc
        try:
            console = await open_retrying(
                self.link.conn, str(console_socket(self.spec)), alive=lambda: self.running
            )
            self._console_task = asyncio.create_task(self._read_console(console))
            qmp_sock = await open_retrying(
                self.link.conn, str(self.spec.qmp_socket), alive=lambda: self.running
            )
            self.qmp = QMPClient(self.spec.name)
            await self.qmp.connect(qmp_sock)
            if not self.spec.incoming:
                await self.qmp.execute("cont")
        except BaseException as exc:
            await self.kill()
            if isinstance(exc, ConnectionError | OSError):
                raise self._error(f"cannot reach the remote QEMU's sockets: {exc}") from exc
            raise

    async def _read_console(self, first: socket.socket) -> None:
        """Copy the console into console.log; after a dropped link, connect again."""
        sock: socket.socket | None = first
        while self.running:
            if sock is None:
                try:
                    sock = await open_retrying(
                        self.link.conn, str(console_socket(self.spec)),
                        alive=lambda: self.running, timeout=RECONNECT_SECONDS,
                    )  # fmt: skip
                except (ConnectionError, OSError):
                    return
            # Keep the writer: a collected StreamWriter closes the socket under the reader.
            reader, self._console_writer = await asyncio.open_unix_connection(sock=sock)
            await self._copy_console(reader)
            self._console_writer.close()
            sock = None
            await asyncio.sleep(0.5)

    async def _copy_console(self, reader: asyncio.StreamReader) -> None:
        buf = b""
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                try:
                    self.console.write(data)
                except OSError as exc:
                    log.warning("console.log: %s", exc)
                buf = (buf + data)[-8192:]
                buf = record_stages(
                    buf, self.started_at, self.stages, self._stage_seen, self.on_stage
                )

    async def wait_booted(self, stall_timeout: float = 90.0) -> None:
        last = time.monotonic()
        while "supervisor" not in self.stages:
            if not self.running:
                raise self._error(
                    f"the VM stopped while booting (exit status {self.qemu.returncode})", VmExited
                )
            if self._stage_seen.is_set():
                self._stage_seen.clear()
                last = time.monotonic()
            elif time.monotonic() - last > stall_timeout:
                seen = ", ".join(self.stages) or "none"
                raise self._error(
                    f"no boot progress for {stall_timeout:.0f}s (stages seen: {seen})", BootStalled
                )
            await asyncio.sleep(0.1)

    async def qmp_execute(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        if self.qmp is None:
            raise self._error(f"QMP is not connected (cannot run {cmd})")
        if self.qmp.runstate is not Runstate.RUNNING and self.running:
            await self._reconnect_qmp()  # its SSH channel went with a dropped connection
        return await self.qmp.execute(cmd, args)

    async def _reconnect_qmp(self) -> None:
        if self.qmp is not None:
            with contextlib.suppress(Exception):
                await self.qmp.disconnect()
        sock = await open_retrying(
            self.link.conn, str(self.spec.qmp_socket), alive=lambda: self.running
        )
        self.qmp = QMPClient(self.spec.name)
        await self.qmp.connect(sock)

    async def wait_exit(self, timeout: float) -> bool:
        if self.qemu.pid is None:
            return True
        return await self.qemu.wait(timeout) is not None

    async def kill(self) -> None:
        await self.qemu.kill()

    async def shutdown(self, grace: float = 10.0) -> None:
        try:
            if self.running and not await self.wait_exit(min(grace, 0.5)):
                if self.qmp is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(self.qmp.execute("quit"), 3)
                await self.wait_exit(max(grace - 0.5, 1.0))
        finally:
            await self.qemu.close()  # kills QEMU if it still runs
            if self._console_writer is not None:
                self._console_writer.close()
            if self._console_task is not None:
                self._console_task.cancel()
                with contextlib.suppress(BaseException):
                    await self._console_task
            if self.qmp is not None:
                with contextlib.suppress(Exception):
                    await self.qmp.disconnect()
                self.qmp = None
            await self.console.close()


def remote_dirs(rundir: str, local: TaskDirs) -> TaskDirs:
    share = posixpath.join(rundir, "share")
    return TaskDirs(
        state=Path(share, "state"),
        outputs=Path(share, "outputs"),
        uploads=Path(share, "uploads"),
        work=Path(share, "work") if local.work is not None else None,
    )


class RemoteAgentVm(AgentVm):
    """An :class:`AgentVm` whose QEMU runs on ``link``'s host.

    The hook into AgentVm is the three factories it already has (the VM, the
    channel, the netmux) plus a step before ``start``: the pack is made present
    and verified there, and the task folders are sent into the run directory.
    The saved VM for warm starts is made and kept on the host
    (:mod:`piwork.hosts.templates`): the three hooks AgentVm's warm start has
    (the template, the VM, discarding it) are answered there.
    """

    def __init__(
        self,
        cfg: AgentVmConfig,
        link: RemoteLink,
        *,
        lease: int = LEASE_SECONDS,
        progress: Progress | None = None,
        **kwargs: Any,
    ) -> None:
        self.link = link
        self.run_id = secrets.token_hex(4)
        self.rundir = posixpath.join(link.root, "run", self.run_id)
        self.progress = progress
        self.pack_upload: PackUpload | None = None
        self.folder_sync: FolderSync | None = None
        self.lease = lease
        cfg = replace(cfg, accel=link.report.accel)
        super().__init__(cfg, **kwargs)
        self.remote_dirs = remote_dirs(self.rundir, cfg.dirs)
        self.remote_env: str | None = None
        """The task's environment disk in the run dir there (None: the task has none)."""
        self._env_layers: list[str] = []
        self._env_backing: str | None = None
        self._env_attached = False
        self._env_hold = contextlib.ExitStack()
        """The task's env.lock, from before the upload until the disk is back here."""
        self.spec = replace(
            self.spec,
            pack_dir=Path(link.root, "packs", cfg.manifest.pack_id),
            qmp_socket=Path(self.rundir, "qmp.sock"),
            rpc_socket=Path(self.rundir, "rpc.sock"),
            net_socket=Path(self.rundir, "net.sock"),
            shares=self.remote_dirs.shares(),
        )
        self.vm = self._make_vm(self.spec)

    def _sock(self, name: str) -> str:
        return posixpath.join(self.rundir, name)

    def _make_vm(self, spec: VmSpec) -> VirtualMachine:
        return RemoteMachine(  # type: ignore[return-value]
            self.link, spec, run_id=self.run_id, lease=self.lease, on_stage=self.on_stage
        )

    async def _template_primed(self, tpl: Template) -> tuple[str, ...] | None:
        return None  # built unprimed (see _build_remote_template); its meta.json is there

    async def _discard_template(self, tpl: Template) -> None:
        with contextlib.suppress(asyncssh.Error, OSError):  # the next check finds it anyway
            await templates.discard(self.link.conn, tpl)

    async def _ready_template(self) -> tuple[Template, float | None]:
        """The host's saved VM, checked there; made (or made again) first if need be.

        Unlike this machine's, a broken one is rebuilt in the same start rather
        than booting cold once: making it costs a cold boot plus a save, and the
        next task would pay it anyway. A failure on the way (no flock there, the
        link down) is a cold boot with the reason, as locally.
        """
        try:
            return await self._ready_remote_template()
        except (HostError, asyncssh.Error, OSError) as exc:
            raise TemplateUnavailable(
                f"the saved VM on {self.link.host.name} could not be checked or made ({exc})"
            ) from exc

    async def _ready_remote_template(self) -> tuple[Template, float | None]:
        name = self.link.host.name
        tpl = templates.remote_template(self.spec, self.link.root, self.link.report.qemu_identity)
        built: float | None = None
        try:
            await templates.check(self.link.conn, tpl)
        except TemplateUnavailable as first:
            async with templates.build_lock(self.link.conn, tpl):
                try:
                    await templates.check(self.link.conn, tpl)  # another piwork made it
                except TemplateUnavailable as now:
                    if isinstance(now, templates.TemplateBroken):
                        await templates.discard(self.link.conn, tpl)
                        what = f"the saved VM on {name} is unusable ({now}): making it again"
                    else:
                        what = f"making the saved VM for warm starts on {name} (once per pack)"
                    self._say_boot_mode(
                        what, {"warm": None, "building": True, "reason": str(first)}
                    )
                    t = time.monotonic()
                    await self._build_remote_template(tpl)
                    built = time.monotonic() - t
            await templates.check(self.link.conn, tpl)
        return tpl, built

    async def _build_remote_template(self, tpl: Template) -> None:
        """Boot a VM with no task in it on the host until pi is loaded, and save it there.

        As locally (AgentVm._build_template): empty share folders, nobody on the
        netmux port, the RPC channel closed before the save, so the saved RAM holds
        no connection, no task and no token.
        """
        conn = self.link.conn
        await templates.sweep_unfinished(conn, tpl)  # the build lock is held
        tmp = templates.build_dir(tpl)
        run_id = secrets.token_hex(4)
        rundir = posixpath.join(self.link.root, "run", run_id)
        shares = [replace(s, host_path=Path(tmp, "shares", s.tag)) for s in self.spec.shares]
        mk = " ".join(shlex.quote(str(s.host_path)) for s in shares)
        await run(conn, f"umask 077 && mkdir -p -- {mk}")
        spec = replace(
            self.spec,
            memory_file=Path(tmp, templates.RAM),
            memory_shared=True,
            incoming=False,
            shares=shares,
            qmp_socket=Path(rundir, "qmp.sock"),
            rpc_socket=Path(rundir, "rpc.sock"),
            net_socket=Path(rundir, "net.sock"),
            console_log=self.cfg.log_dir / "template-console.log",
            name="piwork-template",
        )
        vm = RemoteMachine(self.link, spec, run_id=run_id, lease=self.lease)
        watch = preload_watch()
        channel = GuestChannel(
            RemoteEndpoint(lambda: self.link.conn, str(spec.rpc_socket)),
            lambda _l: None, watch.on_event, alive=lambda: vm.running,
        )  # fmt: skip
        try:
            state = Path(tmp, templates.STATE)
            # Not primed: a remote host is meant to have KVM, where pi's main() after a
            # restore costs what it does natively (priming saves TCG's re-translation).
            boot, _ = await boot_and_save(vm, channel, watch, state, self.cfg.boot_stall_timeout)
            await templates.commit(self.link.conn, tmp, tpl, {"boot_seconds": round(boot, 1)})
        except (VmError, OSError, RuntimeError, TimeoutError, asyncssh.Error) as exc:
            short = getattr(exc, "short", None) or str(exc).splitlines()[0]
            raise TemplateUnavailable(
                f"could not make the saved VM on {self.link.host.name} ({short})"
            ) from exc
        finally:
            await channel.close()
            await vm.shutdown(grace=0)
            with contextlib.suppress(asyncssh.Error, OSError):
                q = " ".join(shlex.quote(d) for d in (tmp, rundir))
                await self.link.conn.run(f"rm -rf -- {q}", check=False)

    def _new_netmux(self) -> NetMux:
        targets = {TARGET_GATEWAY: self.cfg.gateway_port}
        if self.cfg.egress_port is not None:
            targets[TARGET_EGRESS] = self.cfg.egress_port
        return RemoteNetMux(
            lambda: self.link.conn, self._sock("net.sock"), targets, alive=lambda: self.vm.running
        )

    def _new_channel(self) -> GuestChannel:
        return GuestChannel(
            RemoteEndpoint(lambda: self.link.conn, self._sock("rpc.sock")),
            self._on_pi_line,
            self._on_supervisor_event,
            alive=lambda: self.vm.running,
            prepare_pi_line=self.rpc.prepare_line,
            on_prepared_pi_line=self._on_prepared_pi_line,
        )

    async def start(self) -> None:
        conn = self.link.conn
        t = time.monotonic()
        self.pack_upload = await ensure_pack(
            conn, self.link.root, self.cfg.pack_dir, self.cfg.manifest, self.progress
        )
        # Seconds each, before AgentVm.start's own (cumulative) marks: piwork bench --host.
        self.timings["remote_pack"] = time.monotonic() - t
        t = time.monotonic()
        if self.progress:
            self.progress(self.pack_upload.describe())
        dirs = [d for _l, d, _w in _pairs(self.cfg.dirs, self.remote_dirs)]
        if self.remote_dirs.work is not None:
            dirs.append(str(self.remote_dirs.work))
        mk = " ".join(shlex.quote(d) for d in [*dirs, str(self.remote_dirs.state / "home")])
        await run(conn, f"umask 077 && mkdir -p -- {mk}")
        await upload_tree(conn, self.cfg.dirs, self.remote_dirs)
        if self.cfg.dirs.work is not None and self.remote_dirs.work is not None:
            self.folder_sync = FolderSync(self.cfg.dirs.work, str(self.remote_dirs.work))
            sent = await self.folder_sync.upload(conn)
            if self.progress:
                self.progress(f"working folder sent to {self.link.host.name}: {sent} files")
        self.timings["remote_folders"] = time.monotonic() - t
        t = time.monotonic()
        await self._send_env()
        self.timings["remote_env"] = time.monotonic() - t
        await super().start()

    async def _send_env(self) -> None:
        """The task's environment disk and the layers under it, there (piwork.hosts.envdisk)."""
        env = self.cfg.env
        if env is None or not self.cfg.manifest.workbench:
            return
        self._env_hold.enter_context(env.lock())  # before the copy: no freeze meanwhile
        conn = self.link.conn
        # An earlier run of this task here whose piwork died: its installs first.
        await orphans.recover(conn, self.link.root, self.link.host.name, env, self.progress)
        layers, self._env_backing = await asyncio.to_thread(envdisk.local_chain, env)
        self._env_layers, sent = await envdisk.ensure_layers(
            conn, self.link.root, layers, self.progress
        )
        self.remote_env = posixpath.join(self.rundir, "env.qcow2")
        await orphans.mark_run(conn, self.link.host.name, self.rundir, env, self._env_backing)
        disk = await envdisk.send_disk(conn, env, self.remote_env)
        if self.progress:
            self.progress(
                f"environment on {self.link.host.name}: {len(layers)} layer(s), "
                f"{sent} bytes of layers sent, the task's disk ({disk} bytes) sent"
            )

    async def _attach_env_disk(self) -> None:
        """As AgentVm's, but the disk and its layers are the copies there, chained by node."""
        if self.remote_env is None:
            return
        for node in envdisk.blockdev_chain(self._env_layers, self.remote_env):
            await self.vm.qmp_execute("blockdev-add", node)
        await self.vm.qmp_execute(
            "device_add",
            {"driver": "scsi-hd", "bus": f"{ENV_SCSI_BUS}.0", "drive": "pwenv", "id": "pwenvdisk"},
        )
        self._env_attached = True

    async def _bring_env_back(self) -> bool:
        """The disk back here; False if it is left there for the next start (see orphans)."""
        env = self.cfg.env
        if env is None or self.remote_env is None:
            self._env_hold.close()
            return True
        left_there = False
        try:
            if self._env_attached:
                size = await envdisk.bring_back(
                    self.link.conn, self.remote_env, env, self._env_backing
                )
                # A log line, not a notice: it comes after the run's "done".
                log.info(
                    "environment disk brought back from %s (%d bytes)", self.link.host.name, size
                )
        except envdisk.EnvDiskError as exc:
            if self.progress:
                self.progress(
                    f"could not bring the environment disk back from {self.link.host.name}: "
                    f"{exc}; the task's disk here is as it was before this run"
                )
        except (asyncssh.Error, OSError) as exc:
            left_there = True
            if self.progress:
                self.progress(
                    f"could not bring the environment disk back from {self.link.host.name}: "
                    f"{exc}; it is kept there, and the task's next start on "
                    f"{self.link.host.name} brings it back"
                )
        finally:
            if not left_there:
                orphans.clear_record(env)
            self._env_hold.close()
        return not left_there

    async def sync_folder(self) -> SyncResult | None:
        """Bring the agent's changes to the working folder here (three-way; see hosts.sync).

        The runner calls it before each model call is forwarded (the guest is waiting
        for the model then, so its side is still) and the agent calls it at stop.
        A failure is reported, not fatal: the next sync tries again.
        """
        if self.folder_sync is None:
            return None

        def conflict(c: Conflict) -> None:
            if self.progress:
                self.progress(c.describe())

        try:
            return await self.folder_sync.sync_back(self.link.conn, conflict)
        except (asyncssh.Error, OSError, HostError) as exc:
            if self.progress:
                self.progress(f"could not bring the folder back from {self.link.host.name}: {exc}")
            return None

    async def stop(self, *, graceful: bool = True) -> None:
        try:
            await super().stop(graceful=graceful)
        finally:
            await self.sync_folder()
            # The remote's listing is untrusted: whatever it holds (a bound passed, a
            # name no path can take), the disk still comes back and the run dir goes.
            with contextlib.suppress(asyncssh.Error, OSError, HostError, ValueError):
                await download_tree(self.link.conn, self.remote_dirs, self.cfg.dirs)
            if await self._bring_env_back():
                await self.link.conn.run(f"rm -rf -- {shlex.quote(self.rundir)}", check=False)
            else:  # QEMU has stopped: the sweep keeps the disk, removes the folder copy
                with contextlib.suppress(asyncssh.Error, OSError):
                    await sweep(self.link.conn, self.link.root)


def _pairs(local: TaskDirs, remote: TaskDirs) -> list[tuple[Path, str, bool]]:
    """(local dir, remote dir, guest-writable) for the task's own folders.

    The working folder is not among them: :class:`FolderSync` carries it, three-way.
    """
    return [
        (local.state, str(remote.state), True),
        (local.outputs, str(remote.outputs), True),
        (local.uploads, str(remote.uploads), False),
    ]


async def upload_tree(
    conn: asyncssh.SSHClientConnection, local: TaskDirs, remote: TaskDirs
) -> None:
    """Send the task folders into the remote run dir (regular files and dirs; links skipped)."""
    files = []
    for src, dst, _w in _pairs(local, remote):
        for path in await asyncio.to_thread(_walk_regular, src):
            files.append((path, posixpath.join(dst, path.relative_to(src).as_posix())))
    await put_files(conn, files)


def _walk_regular(top: Path) -> list[Path]:
    out = []
    for dirpath, dirs, files in os.walk(top):  # os.walk does not follow links to dirs
        dirs[:] = [d for d in dirs if not (Path(dirpath) / d).is_symlink()]
        for f in files:
            p = Path(dirpath) / f
            if p.is_file() and not p.is_symlink():
                out.append(p)
    return out


async def download_tree(
    conn: asyncssh.SSHClientConnection, remote: TaskDirs, local: TaskDirs
) -> list[str]:
    """Bring the guest-writable folders back here; a symlink made there is never followed.

    Remote entries are listed with lstat (no link is followed there); a local
    target is written only through :mod:`piwork.sharefs`-style checks: its parent
    chain must be real directories inside the task folder, never a link. The
    listing is untrusted: names are checked before they become paths, and depth,
    entries and bytes are bounded (:mod:`piwork.hosts.listing`); past a bound the
    download stops with :class:`~piwork.hosts.listing.ListingTooLarge`.
    """
    skipped: list[str] = []
    budget = Budget()
    # Names that are not UTF-8 keep their bytes (as os.fsdecode does) rather than fail.
    async with conn.start_sftp_client(path_errors="surrogateescape") as sftp:
        for dst, src, writable in _pairs(local, remote):
            if not writable:
                continue
            skipped += await _get_dir(sftp, src, dst, budget, 0)
    return skipped


async def _get_dir(
    sftp: asyncssh.SFTPClient, src: str, dst: Path, budget: Budget, depth: int
) -> list[str]:
    skipped: list[str] = []
    async for entry in sftp.scandir(src):
        name = entry.filename
        if not isinstance(name, str) or name in (".", ".."):
            continue
        budget.entry(src)
        if not name_ok(name):  # NUL, '/', too long: never made into a path
            skipped.append(f"{src}/{name!r}")
            continue
        if refused_prefix(name) is not None:  # git metadata: host git would run its config
            skipped.append(posixpath.join(src, name))
            continue
        attrs = entry.attrs
        rsrc = posixpath.join(src, name)
        ldst = dst / name
        if ldst.is_symlink():
            skipped.append(str(ldst))
            continue
        if attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY:
            if depth >= MAX_DEPTH:
                skipped.append(rsrc)
                continue
            try:
                ldst.mkdir(exist_ok=True)
            except OSError:  # a file of the same name here: kept, the remote dir is not
                skipped.append(rsrc)
                continue
            if ldst.is_symlink() or not ldst.is_dir():
                skipped.append(str(ldst))
                continue
            skipped += await _get_dir(sftp, rsrc, ldst, budget, depth + 1)
        elif attrs.type == asyncssh.FILEXFER_TYPE_REGULAR:
            tmp = dst / f".{name}.piwork-sync"
            try:
                await _get_file(sftp, rsrc, tmp, budget)
                os.replace(tmp, ldst)  # replaces a file; never writes through a link
            except (OSError, asyncssh.SFTPError, FileTooBig):
                tmp.unlink(missing_ok=True)
                skipped.append(rsrc)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        else:  # links, sockets, devices: never brought over
            skipped.append(rsrc)
    return skipped


class FileTooBig(ProtocolError):
    """One remote file is over ``MAX_FILE_BYTES`` (it is skipped, the rest comes)."""


async def _get_file(sftp: asyncssh.SFTPClient, src: str, dst: Path, budget: Budget) -> None:
    """Copy one remote file, reading at most ``MAX_FILE_BYTES`` of it (whatever its size
    says: the remote may send more than it announced)."""
    got = 0
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        async with sftp.open(src, "rb") as remote:
            while chunk := cast(bytes, await remote.read(1 << 20, got)):
                got += len(chunk)
                if got > MAX_FILE_BYTES:
                    raise FileTooBig(src)
                budget.take(len(chunk), src)
                os.write(fd, chunk)
    finally:
        os.close(fd)


async def open_remote_agent(
    host_name: str,
    cfg: AgentVmConfig,
    stack: contextlib.AsyncExitStack,
    *,
    notice: Progress,
    **kwargs: Any,
) -> RemoteAgentVm:
    """The runner's door to a remote host: connect (strictly), check, and make the agent.

    The connection closes with ``stack`` (after the agent has stopped). An unknown
    host key is refused here: ``piwork hosts add`` / ``check`` is where a person
    accepts one, never in the middle of a run.
    """
    host = store.get(host_name)
    if cfg.transport is not Transport.VIRTIO:
        raise HostError("a remote host needs the virtio transport (leave out --transport tcp)")
    t = time.monotonic()
    link = await RemoteLink.open(host, None)
    stack.push_async_callback(link.close)
    opened = time.monotonic() - t
    if not link.report.ok:
        raise HostError(f"{host.name} cannot run a VM: " + "; ".join(link.report.problems))
    accel = link.report.accel
    notice(
        f"running on {host.name} ({host.target}): accelerator {accel.accel.value} ({accel.reason})"
    )
    agent = RemoteAgentVm(cfg, link, progress=notice, **kwargs)
    agent.timings["link_open"] = opened
    return agent
