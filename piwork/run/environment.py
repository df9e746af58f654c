"""Everything a task's VM needs before it boots: model access, the egress proxy, the pack.

Built in this order, each piece entered on the session's exit stack so a
failed start releases what was made: the provider catalog (and the offline
demo server when the task uses it), the model gateway (keys stay on the host;
the guest sees one per-run token and one model), the egress proxy (the guest's
only way out, with its own per-run token), the guest's ``models.json``, the
runtime pack and the accelerator. This module is the one place above
``piwork.vm`` that knows the guest's addresses for the gateway and the proxy
and builds the guest's proxy environment from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from piwork import sharefs
from piwork.agent import (
    TASK_EXTENSIONS,
    Agent,
    AgentFactory,
    AgentVmConfig,
    TaskDirs,
)
from piwork.auth import KeyStore
from piwork.config import Paths
from piwork.env import TaskEnv, store_for
from piwork.errors import UsageError
from piwork.models.demo import DEMO_MODEL_ID, DEMO_PROVIDER, demo_server
from piwork.models.providers import (
    PROVIDERS_FILE_NAME,
    Provider,
    demo_provider,
    load_providers,
    parse_model_ref,
    render_guest_models_json,
)
from piwork.models.scripted import ScriptedModelServer
from piwork.net.guest import GUEST_DIR, GuestNetwork
from piwork.net.host import host_network
from piwork.net.upstream import gateway_connector
from piwork.pack import ensure_pack, load_manifest, picatalog
from piwork.pack.manifest import Manifest
from piwork.pisettings import PiSettings, load_pi_settings, write_agent_dir
from piwork.proxy.egress import (
    DomainPolicy,
    EgressDecision,
    EgressProxy,
    PrivatePolicy,
    guest_proxy_env,
    proxy_url_with_token,
)
from piwork.proxy.gateway import ModelGateway, ServerToolAsker, UsageRecord
from piwork.proxy.registry_tls import RunCA
from piwork.proxy.settings import load_gateway_settings
from piwork.run.digest import EventKind
from piwork.run.request import RunError
from piwork.tasks import Task
from piwork.vm.accel import AccelChoice, probe
from piwork.vm.command import EGRESS_GUEST_ADDR, GATEWAY_GUEST_ADDR, Transport

GUEST_GATEWAY_HOST = GATEWAY_GUEST_ADDR[0]
"""Where the guest reaches the model gateway (the netmux carries it to the host)."""
GUEST_PROXY_URL = f"http://{EGRESS_GUEST_ADDR[0]}:{EGRESS_GUEST_ADDR[1]}"
"""Where the guest reaches the egress proxy (without this run's token). The addresses
themselves are defined once, in piwork.vm.command (QEMU and the netmux need them)."""


def guest_network_env(egress_token: str) -> dict[str, str]:
    """The guest's proxy variables: this run's egress token only inside the proxy URL."""
    return guest_proxy_env(
        proxy_url_with_token(GUEST_PROXY_URL, egress_token), (GUEST_GATEWAY_HOST,)
    )


class ModelNotFound(ValueError, UsageError):
    """The task's model is not in the catalog."""


def only_model(provider: Provider, model_id: str) -> Provider:
    """``provider`` with just ``model_id`` in its rendered model list (if it lists models)."""
    picked = tuple(spec for spec in provider.models if spec.id == model_id)
    return provider.model_copy(update={"models": picked}) if picked else provider


def resolve_model(ref: str, catalog: dict[str, Provider]) -> tuple[Provider, str]:
    if ref in ("demo", DEMO_PROVIDER, f"{DEMO_PROVIDER}/{DEMO_MODEL_ID}"):
        return catalog[DEMO_PROVIDER], DEMO_MODEL_ID
    return parse_model_ref(ref, catalog)


def is_demo(model_ref: str) -> bool:
    return model_ref in ("demo", DEMO_PROVIDER) or model_ref.startswith(f"{DEMO_PROVIDER}/")


def write_state_file(
    task: Task, rel: str, data: bytes, emit: Callable[..., None] | None = None
) -> None:
    """Write a host-made file into the task's state share (the guest can write it).

    Never follows a link the guest planted: the file is replaced atomically
    beneath the share root, and a link standing where a directory of ours
    belongs is removed (not followed) before the write is tried again.
    """
    if sharefs.replace_beneath(task.state_dir, rel, data) and emit is not None:
        emit(EventKind.NOTICE, message=f"replaced a link the guest made at {Path(rel).parent}/")


@dataclass
class EnvironmentHooks:
    """The session's answers to what the environment's servers ask during the run."""

    emit: Callable[..., None]
    on_usage: Callable[[UsageRecord], None]
    before_model_call: Callable[[], Awaitable[None]]
    admit: Callable[[], str | None]
    domain_policy: DomainPolicy
    on_egress_decision: Callable[[EgressDecision], None]
    on_gateway: Callable[[ModelGateway], None] | None = None
    """Told of the gateway as soon as it serves (before the pack is found)."""
    private_policy: PrivatePolicy | None = None
    """Asked when an allowed domain resolves to a private address (None: refused)."""
    ask_server_tool: ServerToolAsker | None = None
    """Asked before a provider-side tool the person enabled is used (none: refused)."""


@dataclass
class Environment:
    """What :func:`prepare` built for one run."""

    provider: Provider
    model_id: str
    gateway: ModelGateway
    egress: EgressProxy
    egress_token: str
    pack_dir: Path
    manifest: Manifest
    accel: AccelChoice
    timings: dict[str, float]
    pi_settings: PiSettings
    network: GuestNetwork = field(default_factory=GuestNetwork)
    """What the guest gets of the network settings (CAs, mirrors: piwork.net.guest)."""

    @property
    def gateway_prices(self) -> bool:
        """The gateway knows this model's prices (so it, not pi, counts the cost)."""
        return any(spec.cost is not None for spec in self.provider.models)

    def agent_config(
        self,
        task: Task,
        folder: Path | None,
        *,
        transport: Transport,
        memory_mb: int,
        cpus: int,
        boot_stall_timeout: float,
        warm_start: bool,
        env: TaskEnv | None = None,
    ) -> AgentVmConfig:
        return AgentVmConfig(
            pack_dir=self.pack_dir,
            manifest=self.manifest,
            accel=self.accel,
            dirs=TaskDirs(task.state_dir, task.outputs_dir, task.uploads_dir, folder),
            log_dir=task.dir / "logs",
            gateway_port=self.gateway.port,
            egress_port=self.egress.port,
            transport=transport,
            memory_mb=memory_mb,
            cpus=cpus,
            boot_stall_timeout=boot_stall_timeout,
            task_id=task.id,
            provider=self.provider.name,
            model=self.model_id,
            extensions=list(TASK_EXTENSIONS),
            trust_project=self.pi_settings.trust_project,
            extra_env={
                "PIWORK_READONLY_DIRS": "/mnt/uploads:/opt/piwork",
                **self.network.env(),
                **guest_network_env(self.egress_token),
            },
            warm_start=warm_start,
            env=env,
        )

    async def task_env(
        self,
        paths: Paths,
        task: Task,
        folder: Path | None,
        emit: Callable[..., None],
        *,
        clean: bool,
        host: str | None = None,
    ) -> TaskEnv | None:
        """The task's writable workbench disk (piwork.env), or None for a pack without one.

        A new task on a folder starts from the environment the folder's last task
        left, unless ``clean``. Raises :class:`piwork.env.EnvError` (people-fixable).
        """
        if not self.manifest.workbench:
            return None
        t = time.monotonic()  # in the timings as "env_disk" (piwork bench's stages)
        env = await asyncio.to_thread(store_for(paths).prepare, task.dir, folder, clean=clean)
        self.timings["env_disk"] = time.monotonic() - t
        if env.note:
            emit(EventKind.NOTICE, message=f"environment: {env.note}")
        waiting = remote_installs_waiting(env) if host is None else None
        if waiting is not None:
            emit(EventKind.NOTICE, message=(
                f"environment: the installs of this task's interrupted run on {waiting} are "
                f"kept there; this run starts from the disk as it was before that run. "
                f"`piwork resume {task.id} --host {waiting}` brings them back (after a run "
                "here, piwork keeps them there and says where instead of overwriting)."
            ))  # fmt: skip
        return env


def remote_installs_waiting(env: TaskEnv) -> str | None:
    """The host a killed ``--host`` run of this task left its installs on, if any
    (piwork.hosts.orphans brings them back at the task's next start there)."""
    from piwork.hosts.orphans import RECORD, read_record

    if not env.disk.with_name(RECORD).exists():
        return None
    record = read_record(env)
    return record.host if record is not None else None


async def prepare(
    stack: contextlib.AsyncExitStack,
    task: Task,
    paths: Paths,
    hooks: EnvironmentHooks,
    *,
    extra_providers: tuple[Provider, ...] = (),
    egress_allow_private_networks: bool = False,
    accel: str | None = None,
) -> Environment:
    """Start the servers a run needs (on ``stack``) and find the pack and the accelerator.

    Raises :class:`ModelNotFound` (its message says what to do) for an unknown model.
    """
    timings: dict[str, float] = {}
    # Model access: the guest only ever sees the gateway and a per-run token.
    catalog = load_providers(paths.config / PROVIDERS_FILE_NAME, extra=extra_providers)
    model_ref = task.record.model or "demo"
    if is_demo(model_ref):
        server: ScriptedModelServer = demo_server()
        await stack.enter_async_context(server)
        catalog[DEMO_PROVIDER] = demo_provider(server.base_url)
        hooks.emit(
            EventKind.NOTICE,
            message="using the offline demo model (scripted, not a real LLM); "
            "choose a real one with --model PROVIDER/MODEL",
        )
    try:
        provider, model_id = resolve_model(model_ref, catalog)
    except Exception as exc:
        raise ModelNotFound(f"unknown model {model_ref!r}: {exc}. See `piwork models`.") from exc
    token = secrets.token_urlsafe(24)
    # Only this task's provider and model are reachable: the guest can never
    # spend another of the person's keys, nor pick a pricier model.
    provider = only_model(provider, model_id)
    routed, model_entry = await _model_route(provider, model_id, hooks)
    # The person's network: the upstream proxy and the extra CAs, for the gateway
    # and the egress proxy; the CAs and mirrors for the guest (piwork.net).
    folder = Path(task.record.working_folder) if task.record.working_folder else None
    net = await asyncio.to_thread(host_network, paths, folder)
    gateway = ModelGateway(
        {p.name: p for p in (provider, routed)},
        KeyStore(paths=paths),
        task_id=task.id,
        on_usage=hooks.on_usage,
        guest_token=token,
        before_forward=hooks.before_model_call,
        allowed_models=(model_id,),
        admit=hooks.admit,
        connector=lambda: gateway_connector(
            net.upstream, provider.upstream_origin, lambda: net.tls
        ),
        server_tools=load_gateway_settings(paths.settings_file).server_tools,
        ask_server_tool=hooks.ask_server_tool,
    )
    await stack.enter_async_context(gateway)
    if hooks.on_gateway is not None:
        hooks.on_gateway(gateway)
    # Only the VM may use the egress proxy: it gets this run's token in its
    # proxy URL when pi starts (never on disk, the command line or a template).
    egress_token = secrets.token_urlsafe(24)
    # TLS to the package registries ends at the proxy, so it can refuse uploads there
    # (review 2, finding 8): a CA made for this run, which only this run's guest trusts.
    registry_ca = RunCA()
    stack.callback(registry_ca.close)
    guest_net = dataclasses.replace(net.guest, cas=(*net.guest.cas, registry_ca.cacert()))
    egress = EgressProxy(
        hooks.domain_policy,
        on_decision=hooks.on_egress_decision,
        allow_private_networks=egress_allow_private_networks,
        token=egress_token,
        private_policy=hooks.private_policy,
        upstream=net.upstream,
        proxy_ssl=net.proxy_ssl,
        registry_ca=registry_ca,
        registry_trust=net.tls,
    )
    await stack.enter_async_context(egress)
    if guest_net.write(task.state_dir):
        hooks.emit(EventKind.NOTICE, message=f"replaced a link the guest made at {GUEST_DIR}/")
    models_json: Any = render_guest_models_json([provider], placeholder=token)
    if model_entry is not None:
        # The model speaks another of the provider's APIs: pi gets it whole, with the
        # gateway's route for that API as its own baseUrl.
        models_json["providers"][provider.name]["models"] = [model_entry]
    write_state_file(
        task, "agent/models.json", orjson.dumps(models_json, option=orjson.OPT_INDENT_2), hooks.emit
    )
    # pi's settings.json and mcp.json: project trust and the person's MCP servers.
    pi_settings = load_pi_settings(paths.settings_file)
    moved = write_agent_dir(task.state_dir, pi_settings)
    if moved:
        hooks.emit(
            EventKind.NOTICE,
            message="moved aside what an earlier run left for pi to load from its agent dir: "
            + ", ".join(moved),
        )
    # The pack and the accelerator.
    t = time.monotonic()
    pack_dir = await asyncio.to_thread(
        ensure_pack, log=lambda msg: hooks.emit(EventKind.NOTICE, message=msg)
    )
    manifest = load_manifest(pack_dir)
    timings["pack"] = time.monotonic() - t
    chosen = probe(accel, manifest.arch)
    hooks.emit(
        EventKind.NOTICE,
        message=f"accelerator: {chosen.accel.value} ({chosen.reason})",
        accel=chosen.accel.value,
    )
    return Environment(
        provider, model_id, gateway, egress, egress_token, pack_dir, manifest, chosen, timings,
        pi_settings, guest_net,
    )  # fmt: skip


async def _model_route(
    provider: Provider, model_id: str, hooks: EnvironmentHooks
) -> tuple[Provider, dict[str, Any] | None]:
    """The gateway's provider for the task's model, and pi's models.json entry for it when
    it speaks another API than its provider's (pi 1.x: OpenRouter's Claude models are
    anthropic-messages); the pack's copy of pi's catalog says which API a model speaks."""
    if not provider.alt_apis:
        return provider, None
    pack_dir = await asyncio.to_thread(
        ensure_pack, log=lambda msg: hooks.emit(EventKind.NOTICE, message=msg)
    )
    catalog = picatalog.load(pack_dir)
    entry = catalog.find(provider.name, model_id) if catalog is not None else None
    if entry is None or entry.api == provider.api:
        return provider, None
    routed = provider.route(entry.api)
    if routed is None:
        raise ModelNotFound(
            f"{provider.name}/{model_id} speaks pi's {entry.api} API, which piwork's gateway "
            f"does not carry for {provider.name}; choose another model (`piwork models`)"
        )
    return routed, {**entry.pi_entry(), "baseUrl": routed.gateway_base_url()}


__all__ = [
    "GUEST_GATEWAY_HOST",
    "GUEST_PROXY_URL",
    "Environment",
    "EnvironmentHooks",
    "ModelNotFound",
    "guest_network_env",
    "only_model",
    "prepare",
    "probe",
    "resolve_model",
    "write_state_file",
]


async def open_agent(
    cfg: AgentVmConfig,
    factory: AgentFactory,
    stack: contextlib.AsyncExitStack,
    emit: Callable[..., None],
    on_supervisor_event: Callable[[dict[str, Any]], None],
    *,
    host: str | None = None,
) -> Agent:
    """The agent door: this machine's VM, or (``host``) one on a remote over SSH.

    On a remote host only QEMU moves: the gateway, the egress proxy and the keys
    stay on this machine (piwork.hosts).
    """
    callbacks: dict[str, Any] = dict(
        on_stage=lambda name, secs: emit(EventKind.BOOT, stage=name, seconds=secs),
        on_supervisor_event=on_supervisor_event,
        # "restored in 1.2 s" / "cold boot: <reason>" (data: warm, restored, cold_reason)
        on_boot_mode=lambda msg, data: emit(EventKind.NOTICE, message=msg, **data),
    )
    if host is None:
        return factory(cfg, **callbacks)
    from piwork.hosts.store import HostError
    from piwork.hosts.vm import open_remote_agent

    try:
        return await open_remote_agent(
            host, cfg, stack, notice=lambda msg: emit(EventKind.NOTICE, message=msg), **callbacks
        )
    except HostError as exc:
        raise RunError(str(exc)) from exc
