"""``AgentVm``: a booted VM with pi running in it, reachable over RPC.

It composes the VM (``piwork.vm``), the supervisor channel and the pi RPC client
(``piwork.rpc``) for one set of task directories: cold or warm start (the saved VM),
the environment disk, the git guard, pause/resume, stop. It knows nothing about tasks,
policy or front ends: ``piwork.run`` adds those.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from piwork import sharefs
from piwork.agent.door import PiDoor, PiGone, VmExit, guest_timings
from piwork.agent.spec import (
    GUEST_AGENT_DIR,
    GUEST_OUTPUTS,
    GUEST_SESSION,
    GUEST_STATE,
    GUEST_UPLOADS,
    TASK_EXTENSIONS,
    AgentVmConfig,
    BootModeCallback,
    LineCallback,
    StageCallback,
    free_tcp_port,
    pi_flags,
    prime_op,
    socket_dir,
    vm_spec,
)
from piwork.aio import discard
from piwork.env.store import BUILD_ENV_FILE
from piwork.pisettings import TRUST_ENV
from piwork.rpc.client import RpcClient, RpcError
from piwork.rpc.framing import OversizedLine
from piwork.rpc.models import SessionState
from piwork.rpc.version import check_pi
from piwork.vm import gitguard
from piwork.vm.channel import Endpoint, GuestChannel
from piwork.vm.command import ENV_SCSI_BUS, Transport, VmSpec
from piwork.vm.machine import VirtualMachine, VmError
from piwork.vm.netmux import TARGET_EGRESS, TARGET_GATEWAY, NetMux
from piwork.vm.template import (
    RAM,
    STATE,
    Template,
    TemplateUnavailable,
    boot_and_save,
    build_lock,
    commit,
    default_root,
    discard_template,
    preload_watch,
    restore_vm,
    sweep_unfinished,
    template_for,
    usable,
)

log = logging.getLogger(__name__)


class AgentVm(PiDoor):
    """``async with AgentVm(cfg) as agent:`` boots the VM and starts pi in it."""

    def __init__(
        self,
        cfg: AgentVmConfig,
        *,
        on_stage: StageCallback | None = None,
        on_supervisor_event: LineCallback | None = None,
        on_pi_line: Callable[[bytes], None] | None = None,
        on_boot_mode: BootModeCallback | None = None,
    ) -> None:
        self.cfg = cfg
        self.on_boot_mode = on_boot_mode
        self.boot_mode: dict[str, Any] = {}
        self.on_pi_line = on_pi_line
        self.on_stage = on_stage
        self.on_supervisor_event = on_supervisor_event
        sock_dir = socket_dir(cfg.log_dir.parent / "run")
        self._own_sock_dir = sock_dir if sock_dir != cfg.log_dir.parent / "run" else None
        """A temp dir made for the sockets (long paths): removed by :meth:`stop`."""
        self.rpc = RpcClient(send_line=self._send_line)
        host_port = free_tcp_port() if cfg.transport is Transport.TCP else None
        tag = f"{os.getpid()}-{id(self):x}"
        self._tcp_secret: bytes | None = None
        secret_file: Path | None = None
        if cfg.transport is Transport.TCP:
            # Any local user can connect to the hostfwd port: the supervisor wants
            # this secret first. QEMU reads the 0600 file at start (fw_cfg); it is
            # deleted once QEMU runs, and is never on a command line.
            self._tcp_secret = secrets.token_hex(32).encode()
            secret_file = sock_dir / f"secret-{tag}"
        self._secret_file = secret_file
        self.spec = vm_spec(
            cfg, sock_dir, tag, host_tcp_port=host_port, tcp_secret_file=secret_file
        )
        self.vm = VirtualMachine(self.spec, on_stage=on_stage)
        self.netmux = self._new_netmux()
        self.channel = self._new_channel()
        self.pi_exit: asyncio.Future[dict[str, Any]] | None = None
        self._pi_started: asyncio.Future[int] | None = None
        self._primed_with: tuple[str, ...] | None = None
        """The restored saved VM's primed extensions (None: cold boot or not primed)."""
        self._bound_primed = False
        """pi's start bound the primed pi to this task (the supervisor said so)."""
        self.timings: dict[str, float] = {}
        self.stderr_tail: list[str] = []
        self._vm_watch: asyncio.Task[None] | None = None
        self.git_moved_aside: list[gitguard.MovedAside] = []
        """Git metadata the guest created, moved out of the shares (:meth:`move_aside_new_git`)."""
        self.git_guard_error: str | None = None
        """Why such metadata could not be moved (it is then still in the folder)."""
        self._git_reported = 0
        self._env_lock = contextlib.ExitStack()

    # ------------------------------------------------------------ the run's door
    async def pause(self) -> None:
        """Freeze the whole guest (QMP stop); pi's replies may not time out meanwhile."""
        self.rpc.freeze()  # a frozen pi cannot answer: no reply may time out meanwhile
        try:
            await self.vm.pause()
        except BaseException:
            self.rpc.thaw()
            raise

    async def resume(self) -> None:
        await self.vm.resume()
        self.rpc.thaw()

    async def exit_diagnosis(self, wait: float = 1.0) -> VmExit | None:
        """``None`` while the VM still runs; else how QEMU exited and its last console lines."""
        vm = self.vm
        if vm.proc is None or not await vm.wait_exit(wait):
            return None
        code = vm.proc.returncode or 0
        try:
            status = f"killed by {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        except ValueError:
            status = f"status {code}"
        return VmExit(code, status, vm.spec.console_log, vm.console_tail())

    @property
    def qemu_pid(self) -> int | None:
        return self.vm.pid

    def _new_netmux(self) -> NetMux:
        targets = {TARGET_GATEWAY: self.cfg.gateway_port}
        if self.cfg.egress_port is not None:
            targets[TARGET_EGRESS] = self.cfg.egress_port
        assert self.spec.net_socket is not None
        return NetMux(self.spec.net_socket, targets, alive=lambda: self.vm.running)

    def _write_secret(self) -> None:
        if self._secret_file is not None and self._tcp_secret is not None:
            fd = os.open(self._secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, self._tcp_secret)
            finally:
                os.close(fd)

    def _remove_secret(self) -> None:
        if self._secret_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self._secret_file.unlink()

    def _new_channel(self) -> GuestChannel:
        endpoint = Endpoint(
            unix_path=self.spec.rpc_socket,
            tcp_port=self.spec.host_tcp_port,
            tcp_secret=self._tcp_secret,
        )
        return GuestChannel(
            endpoint,
            self._on_pi_line,
            self._on_supervisor_event,
            alive=lambda: self.vm.running,
            prepare_pi_line=self.rpc.prepare_line,  # big lines: parsed off the loop
            on_prepared_pi_line=self._on_prepared_pi_line,
        )

    # ------------------------------------------------------------ plumbing
    async def _send_line(self, line: bytes) -> None:
        await self.channel.send_pi_line(line)

    def _on_pi_line(self, line: bytes) -> None:
        if self.on_pi_line is not None:
            self.on_pi_line(line)  # the transcript first: it must not miss what pi said
        self.rpc.feed_line(line)

    def _on_prepared_pi_line(self, line: bytes, prepared: object) -> None:
        if self.on_pi_line is not None:
            self.on_pi_line(line)
        self.rpc.feed_prepared(prepared)  # type: ignore[arg-type]

    def _on_supervisor_event(self, msg: dict[str, Any]) -> None:
        ev = msg.get("ev")
        if ev in ("ready", "preloaded", "started", "first-output"):
            self._note_guest_timing(msg)  # figures for `piwork bench`
        if ev == "started" and self._pi_started is not None and not self._pi_started.done():
            # A guest that says "primed" when it is not gets a session switch it did not
            # need; one that hides it keeps pi on the prime's session: both only its own loss.
            self._bound_primed = msg.get("primed") is True
            self._pi_started.set_result(int(msg.get("pid") or 0))
        elif ev == "exit":
            if self.pi_exit is not None and not self.pi_exit.done():
                self.pi_exit.set_result(msg)
            self.rpc.connection_lost(PiGone(f"pi exited: {msg}"))
        elif ev == "restarted":
            # /init restarted a supervisor that died, and pi died with it: say so now
            # instead of letting every request wait for its timeout.
            gone = {
                **msg,
                "message": "the guest supervisor restarted (it crashed or was killed); "
                "pi was stopped with it",
            }
            if self._pi_started is not None and not self._pi_started.done():
                self._pi_started.set_exception(PiGone(gone["message"]))
            if self.pi_exit is not None and not self.pi_exit.done():
                self.pi_exit.set_result(gone)
            self.rpc.connection_lost(PiGone(gone["message"]))
        elif ev == "oversized":
            # A line too long to keep: if it was a reply, its request fails now.
            head = msg.get("head")
            size = int(msg.get("bytes") or 0)
            self.rpc.feed_report(OversizedLine(size, head if isinstance(head, bytes) else b""))
        elif ev == "error" and self._pi_started is not None and not self._pi_started.done():
            self._pi_started.set_exception(PiGone(str(msg.get("message"))))
        elif ev == "stderr":
            self.stderr_tail = [*self.stderr_tail[-49:], str(msg.get("text", ""))]
        if self.on_supervisor_event is not None:
            self.on_supervisor_event(msg)

    def _note_guest_timing(self, msg: dict[str, Any]) -> None:
        self.timings.update(guest_timings(msg))

    def pi_argv(self) -> list[str]:
        return [
            *pi_flags(self.cfg.extensions),
            "--session", GUEST_SESSION,
            "--provider", self.cfg.provider,
            "--model", self.cfg.model,
        ]  # fmt: skip

    def pi_env(self) -> dict[str, str]:
        """pi's environment; the run adds the proxy variables (``cfg.extra_env``,
        built by ``piwork.run.environment``, the one home of the guest's addresses)."""
        scope = [self.cfg.dirs.guest_cwd, GUEST_OUTPUTS]
        env = {
            "PI_CODING_AGENT_DIR": GUEST_AGENT_DIR,
            "PI_OFFLINE": "1",
            "PI_TELEMETRY": "0",
            TRUST_ENV: "1" if self.cfg.trust_project else "0",
            "HOME": f"{GUEST_STATE}/home",
            "PIWORK_TASK_ID": self.cfg.task_id,
            "PIWORK_SCOPE_DIRS": ":".join(dict.fromkeys(scope)),
            "PIWORK_READONLY_DIRS": GUEST_UPLOADS,
            "TERM": "dumb",
        }
        if self.cfg.manifest.workbench:
            # bash reads the ENV/WORKDIR a built environment left (piwork env build); a
            # missing file is ignored by bash.
            env["BASH_ENV"] = BUILD_ENV_FILE
        env.update(self.cfg.extra_env)
        return env

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> AgentVm:
        try:
            await self.start()
        except BaseException:
            await self.stop(graceful=False)
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop(graceful=et is None)

    async def start(self) -> None:
        t0 = time.monotonic()
        # Before anything boots: a pack whose pi this host does not speak is refused.
        check_pi(self.cfg.manifest.versions.get("pi"), f"runtime pack {self.cfg.manifest.pack_id}")
        sharefs.mkdir_beneath(self.cfg.dirs.state, "home")  # never through a guest link
        reason = usable(self.spec) if self.cfg.warm_start else "warm start is off"
        if reason is None:
            try:
                await self._start_warm(t0)
            except TemplateUnavailable as exc:
                reason = str(exc)
        if reason is not None:
            self._say_boot_mode(f"cold boot: {reason}", {"warm": False, "cold_reason": reason})
            await self._start_cold(t0)
        self._vm_watch = asyncio.create_task(self._watch_vm(), name="agent-vm-watch")
        self.timings["supervisor_ready"] = time.monotonic() - t0
        await self._attach_env_disk()
        self.timings["env_attached"] = time.monotonic() - t0
        await self.start_pi()
        self.timings["pi_started"] = time.monotonic() - t0
        if not await self.netmux.wait_ready(30):
            raise self.vm._error(
                "the guest's network port did not answer within 30s "
                f"({self.netmux.stats.closed_reason or 'no reply to HELLO'})"
            )

    def _say_boot_mode(self, message: str, data: dict[str, Any]) -> None:
        self.boot_mode = {"message": message, **data}
        if self.on_boot_mode is not None:
            self.on_boot_mode(message, data)

    async def _start_cold(self, t0: float) -> None:
        self._write_secret()
        try:
            await self.vm.launch()
        finally:
            self._remove_secret()  # QEMU has read it (or failed)
        self.netmux.start()
        self.timings["qemu_started"] = time.monotonic() - t0
        boot = asyncio.create_task(self.vm.wait_booted(self.cfg.boot_stall_timeout))
        chan = asyncio.create_task(self.channel.start(timeout=600))
        try:
            done, _ = await asyncio.wait({boot, chan}, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:
            discard(boot, chan)
            raise
        for task in done:
            if task.exception() is not None:
                for t in (boot, chan):
                    t.cancel()
                exc = task.exception()
                assert exc is not None
                if not isinstance(exc, VmError):
                    raise self.vm._error(f"the guest did not come up: {exc}") from exc
                raise exc
        await asyncio.gather(boot, chan)

    # ------------------------------------------------------------ warm start
    async def _start_warm(self, t0: float) -> None:
        """Restore the saved VM (making it first if there is none); TemplateUnavailable: boot."""
        tpl, built = await self._ready_template()
        cold_spec = self.spec
        self.spec = replace(cold_spec, memory_file=tpl.ram, memory_shared=False, incoming=True)
        self.vm = self._make_vm(self.spec)
        t = time.monotonic()
        chan: asyncio.Task[None] | None = None
        try:
            await self.vm.launch()
            self.timings["qemu_started"] = time.monotonic() - t0
            # The host ends connect first; QEMU tells the guest on load.
            self.netmux.start()
            chan = asyncio.create_task(self.channel.start(timeout=60))
            await restore_vm(self.vm.qmp_execute, tpl.state)
            await chan
        except (TemplateUnavailable, VmError, OSError, RuntimeError, TimeoutError) as exc:
            if chan is not None:
                discard(chan)
            # SIGKILL comes from outside (a person, the OOM killer): the saved VM is
            # not at fault and stays for the next start. Anything else discards it.
            proc = self.vm.proc
            killed = (
                proc is not None
                and await self.vm.wait_exit(0.5)
                and proc.returncode == -signal.SIGKILL
            )
            await self.channel.close()
            await self.netmux.close()
            await self.vm.shutdown(grace=0)
            self.spec = cold_spec
            self.vm = self._make_vm(self.spec)
            self.channel = self._new_channel()
            self.netmux = self._new_netmux()
            short = getattr(exc, "short", None) or str(exc).splitlines()[0]
            if not killed:
                await self._discard_template(tpl)
            raise TemplateUnavailable(f"restoring the saved VM failed ({short})") from exc
        restored = time.monotonic() - t
        self._primed_with = await self._template_primed(tpl)
        self.timings["restored"] = restored
        data: dict[str, Any] = {"warm": True, "restored": round(restored, 3)}
        if built is not None:
            data["template_built"] = round(built, 1)
        self._say_boot_mode(f"restored in {restored:.1f} s", data)
        if self.on_stage is not None:
            self.on_stage("restored", restored)

    def _make_vm(self, spec: VmSpec) -> VirtualMachine:
        """The VM for ``spec`` (a remote host makes its own: piwork.hosts.vm)."""
        return VirtualMachine(spec, on_stage=self.on_stage)

    async def _template_primed(self, tpl: Template) -> tuple[str, ...] | None:
        """The extensions the restored VM's pi was primed with (None: not primed)."""
        return await asyncio.to_thread(tpl.primed_with)

    async def _discard_template(self, tpl: Template) -> None:
        await asyncio.to_thread(discard_template, tpl)

    async def _ready_template(self) -> tuple[Template, float | None]:
        """The saved VM to restore, checked (made first if there is none), and how long
        making it took (None: it was there). TemplateUnavailable: boot cold.

        A remote host keeps its own (piwork.hosts.templates), checked the same way."""
        root = self.cfg.template_root or default_root(self.cfg.pack_dir)
        tpl = await asyncio.to_thread(template_for, self.spec, root)  # runs qemu --version
        built: float | None = None
        try:
            await asyncio.to_thread(tpl.check)
        except TemplateUnavailable as first:
            if tpl.dir.exists():
                # Present but unusable (truncated, corrupt, foreign): this task boots
                # cold; the broken one goes, so the next task makes a new one.
                await asyncio.to_thread(discard_template, tpl)
                raise
            async with build_lock(root, tpl.dir.name):
                try:
                    await asyncio.to_thread(tpl.check)  # another process may have made it
                except TemplateUnavailable:
                    self._say_boot_mode(
                        f"making the saved VM for warm starts (once per pack): {first}",
                        {"warm": None, "building": True, "reason": str(first)},
                    )
                    t = time.monotonic()
                    await self._build_template(tpl)
                    built = time.monotonic() - t
            await asyncio.to_thread(tpl.check)
        return tpl, built

    async def _build_template(self, tpl: Template) -> None:
        """Boot a VM with no task in it until pi is loaded, and save it."""
        await asyncio.to_thread(sweep_unfinished, tpl)  # the build lock is held
        tmp = tpl.dir.parent / f"{tpl.dir.name}.tmp-{os.getpid()}"
        tmp.mkdir(parents=True)
        shares = []
        for share in self.spec.shares:
            (tmp / "shares" / share.tag).mkdir(parents=True)
            shares.append(replace(share, host_path=tmp / "shares" / share.tag))
        sock_dir = socket_dir(tmp / "run")
        spec = replace(
            self.spec,
            memory_file=tmp / RAM,
            memory_shared=True,
            incoming=False,
            shares=shares,
            qmp_socket=sock_dir / "qmp.sock",
            rpc_socket=sock_dir / "rpc.sock",
            # The netmux port exists (same devices as a clone) but nobody connects:
            # the template holds no stream and its guest refuses connections.
            net_socket=sock_dir / "net.sock",
            console_log=tmp / "console.log",
            name="piwork-template",
        )
        vm = VirtualMachine(spec)
        watch = preload_watch()
        channel = GuestChannel(
            Endpoint(unix_path=spec.rpc_socket),
            lambda _l: None,
            watch.on_event,
            alive=lambda: vm.running,
        )
        try:
            stall = self.cfg.boot_stall_timeout
            boot, unprimed = await boot_and_save(
                vm, channel, watch, tmp / STATE, stall, prime=prime_op()
            )
            meta: dict[str, Any] = {"boot_seconds": round(boot, 1)}
            if unprimed is None:
                meta["primed"] = list(TASK_EXTENSIONS)
            else:
                # Still a saved VM with pi loaded: tasks run pi's main() after the restore.
                log.warning("the saved VM's pi could not be primed: %s", unprimed)
                meta["prime_error"] = unprimed
            await asyncio.to_thread(commit, tmp, tpl, meta)
        except (VmError, OSError, RuntimeError, TimeoutError) as exc:
            short = getattr(exc, "short", None) or str(exc).splitlines()[0]
            raise TemplateUnavailable(f"could not make the saved VM ({short})") from exc
        finally:
            await channel.close()
            await vm.shutdown(grace=0)
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            if sock_dir != tmp / "run":
                shutil.rmtree(sock_dir, ignore_errors=True)

    async def _attach_env_disk(self) -> None:
        """Hot-plug the task's environment disk on the VM's SCSI bus (cold or restored alike).

        Why after start, even for a cold boot: a saved template must hold no
        writable disk (its page cache would not match a clone's disk), and one
        path for both starts means every test exercises the one a warm start uses.
        The disk stays locked (``env.lock``) until the VM stops, so the folder's
        next task does not freeze it while this VM writes it.
        """
        env = self.cfg.env
        if env is None or not self.cfg.manifest.workbench:
            return
        self._env_lock.enter_context(env.lock())
        if env.image is not None:
            # An imported image (piwork env import): read-only, the overlay's lower layer
            # instead of the pack's Debian image; the guest knows it by its model name.
            await self.vm.qmp_execute(
                "blockdev-add",
                {
                    "driver": "raw",
                    "node-name": "pwimage",
                    "read-only": True,
                    "file": {"driver": "file", "filename": str(env.image), "read-only": True},
                },
            )
            await self.vm.qmp_execute(
                "device_add",
                {
                    "driver": "scsi-hd",
                    "bus": f"{ENV_SCSI_BUS}.0",
                    "drive": "pwimage",
                    "id": "pwimagedisk",
                    "product": "pwimage",
                },
            )
        await self.vm.qmp_execute(
            "blockdev-add",
            {
                "driver": "qcow2",
                "node-name": "pwenv",
                "discard": "unmap",
                "file": {"driver": "file", "filename": str(env.disk)},
            },
        )
        await self.vm.qmp_execute(
            "device_add",
            {"driver": "scsi-hd", "bus": f"{ENV_SCSI_BUS}.0", "drive": "pwenv", "id": "pwenvdisk"},
        )

    async def _watch_vm(self) -> None:
        """A VM that dies (kill -9, crash) takes pi with it: say so to every waiter.

        Without this, nothing tells ``pi_exit`` or the RPC client, and a run
        waits forever for a guest that no longer exists.
        """
        proc = self.vm.proc
        assert proc is not None
        code = await proc.wait()
        msg: dict[str, Any] = {
            "ev": "vm_exit",
            "code": code,
            "message": f"the VM stopped unexpectedly (QEMU exit status {code})",
        }
        if self._pi_started is not None and not self._pi_started.done():
            self._pi_started.set_exception(PiGone(msg["message"]))
        if self.pi_exit is not None and not self.pi_exit.done():
            self.pi_exit.set_result(msg)
        self.rpc.connection_lost(PiGone(msg["message"]))

    async def start_pi(self) -> None:
        loop = asyncio.get_running_loop()
        self._pi_started = loop.create_future()
        self.pi_exit = loop.create_future()
        self._bound_primed = False
        self.rpc.reset()
        # A restored VM whose pi was primed with (at least) this task's extensions can
        # have it bound to the task instead of running pi's main() again.
        bind = self._primed_with is not None and set(self.cfg.extensions) <= set(self._primed_with)
        # mount: the task's 9p folders (the supervisor mounts them now, not /init);
        # clock: wall time is stale after a restore.
        await self.channel.send_op(
            "start",
            argv=self.pi_argv(),
            env=self.pi_env(),
            cwd=self.cfg.dirs.guest_cwd,
            mount=True,
            clock=time.time(),
            bind=bind,
            # The guest builds the workbench root while pi starts (supervisor.js).
            **self._workbench_op(),
        )
        # Sent at once: the supervisor holds it until pi is bound (one round trip saved).
        # Had it started a fresh pi instead, that pi already has this session: a no-op.
        switch = (
            asyncio.ensure_future(self.rpc.switch_session(GUEST_SESSION, timeout=60))
            if bind
            else None
        )
        try:
            await asyncio.wait_for(self._pi_started, 30)
        except TimeoutError:
            if switch is not None:
                discard(switch)
            raise self.vm._error("the supervisor did not start pi within 30s") from None
        except BaseException:
            if switch is not None:
                discard(switch)
            raise
        if switch is not None:
            await self._bind_session(switch)

    async def _bind_session(self, switch: asyncio.Future[bool]) -> None:
        """A primed pi (bound to this task's env and cwd) takes the task's session and model.

        What ``--session`` and ``--model`` do at a normal start: ``switch_session``
        makes pi build its session, settings, models, resources and extensions again
        from the task's agent dir and cwd, which picks the model the session last
        used or, for a new one, the agent dir's default; only if that is not the
        task's model is it set (``set_model``; pi records it in ``settings.json``).
        """
        doing = "while taking the task's session"
        try:
            t = time.monotonic()
            if not await self._unless_pi_exits(switch, doing):
                raise PiGone("an extension refused pi's switch to the task's session")
            self.timings["pi_switch"] = time.monotonic() - t
            t = time.monotonic()
            state = await self._unless_pi_exits(self.rpc.get_state(timeout=60), doing)
            model = state.model or {}
            if (model.get("provider"), model.get("id")) != (self.cfg.provider, self.cfg.model):
                await self._unless_pi_exits(
                    self.rpc.set_model(self.cfg.provider, self.cfg.model, timeout=60), doing
                )
            self.timings["pi_model"] = time.monotonic() - t
        except RpcError as exc:
            raise PiGone(
                f"pi could not take the task's session and model: {exc}\n{self._stderr_text()}"
            ) from exc

    def _stderr_text(self) -> str:
        """pi's last stderr lines, indented, for an error that says why pi is gone."""
        return "\n".join("  | " + line for line in self.stderr_tail[-20:])

    async def _unless_pi_exits(self, aw: Any, doing: str) -> Any:
        """``await aw``, unless pi exits first: then PiGone, saying how, with its stderr."""
        assert self.pi_exit is not None
        exited: asyncio.Future[Any] = self.pi_exit
        fut = asyncio.ensure_future(aw)
        try:
            done, _ = await asyncio.wait({fut, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not fut.done():
                discard(fut)
        if fut not in done:
            raise PiGone(f"pi exited {doing}: {exited.result()}\n{self._stderr_text()}")
        return fut.result()

    async def sync_folder(self) -> object:
        """The working folder is shared with this machine's VM: nothing to bring back.

        A VM on another host (``piwork.hosts.vm.RemoteAgentVm``) copies its changes
        here, three-way, before each model call.
        """
        return None

    def preview_mux(self) -> NetMux | None:
        """The netmux a preview opens host-side streams on (None before start)."""
        return self.netmux

    def git_readonly_notice(self) -> str | None:
        """What the person is told at start when the folder's git metadata is read-only."""
        protection = self.vm.git_protection
        if protection is None or not protection.readonly:
            return None
        return gitguard.readonly_notice(protection)

    @property
    def git_scan_seconds(self) -> float | None:
        protection = self.vm.git_protection
        return None if protection is None else protection.scan_seconds

    def take_git_reports(self) -> tuple[list[gitguard.MovedAside], str | None]:
        """What moved aside since the last call, and a failure to show: each reported once."""
        moved = self.git_moved_aside[self._git_reported :]
        self._git_reported = len(self.git_moved_aside)
        error, self.git_guard_error = self.git_guard_error, None
        return moved, error

    async def move_aside_new_git(self) -> list[gitguard.MovedAside]:
        """A ``.git`` the guest made (a new repo with a hostile config) leaves the folder.

        :meth:`stop` calls it once QEMU is gone; the runner also calls it at each
        checkpoint, which shortens the time such a ``.git`` sits in the folder to
        one turn (it is race-safe while the guest runs). Only the VM that ran the
        task counts: its launch recorded the person's own entries (a VM that
        never launched has no baseline, and nothing moves). Returns what moved
        this time; everything moved so far is in :attr:`git_moved_aside`.
        """
        protection = self.vm.git_protection
        if protection is None:
            return []
        dest = self.cfg.moved_aside_dir or self.cfg.log_dir.parent / "moved-aside"
        moved, failed = await asyncio.to_thread(gitguard.move_aside_new, protection, dest)
        self.git_moved_aside += moved
        for item in moved:
            log.warning("%s", item.note())
        if failed:
            self.git_guard_error = (
                "could not move aside git metadata the agent created: "
                + "; ".join(failed)
                + " - do not run git there before looking at its config"
            )
            log.error("%s", self.git_guard_error)
        return moved

    def _workbench_op(self) -> dict[str, str]:
        if not self.cfg.manifest.workbench:
            return {}
        env = self.cfg.env
        if env is None:
            return {"workbench": "tmpfs"}
        return {"workbench": "image" if env.image is not None else "disk"}

    async def wait_pi_ready(self, timeout: float = 180.0) -> SessionState:
        """The first ``get_state`` reply: pi has loaded and speaks RPC."""
        state: SessionState = await self._unless_pi_exits(
            self.rpc.get_state(timeout=timeout), "before answering"
        )
        return state

    async def stop(self, *, graceful: bool = True) -> None:
        """Power the guest off (flushing pi's session), or kill it if that fails."""
        if self._vm_watch is not None:
            discard(self._vm_watch)  # from here on, the VM's exit is expected
        try:
            if graceful and self.vm.running and self.channel.boot_id is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.channel.send_op("poweroff"), 3)
                    await self.vm.wait_exit(15)
        finally:
            try:
                await self.channel.close()
                await self.netmux.close()
                await self.vm.shutdown(grace=0 if not graceful else 2)
                await self.move_aside_new_git()
            finally:
                self._env_lock.close()  # QEMU has exited: the disk is free
                self._remove_secret()
                if self._own_sock_dir is not None:
                    shutil.rmtree(self._own_sock_dir, ignore_errors=True)
