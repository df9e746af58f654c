"""The VM's network boundary, measured from inside a real guest (TCG here).

Acceptance of the providers/egress issue, VM part:

* a provider key stored on the host (file backend, opt-in) reaches the model
  only through the host gateway, and nothing the guest can read holds it;
* a domain the policy allows goes through the egress proxy; a denied one
  fails with a reason the model can read;
* the guest cannot reach the host's other services: it has no network card
  (only ``lo``; the gateway and egress addresses are the supervisor's netmux
  listeners), so nothing on 127.0.0.1 or 0.0.0.0 of the host, nothing at the
  old slirp addresses 10.0.2.2/10.0.2.3, no other port of the two addresses.
  The probes print what happened (error text and time) so the result is
  measured, not assumed.

Two boots: one task with private addresses allowed through the egress proxy
(the test's "allowed" origin listens on loopback), one with the defaults.
Every prompt runs through :class:`TaskSession` with private ``Paths``.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from piwork.auth import KeyStore
from piwork.config import Paths
from piwork.models.providers import Provider
from piwork.models.scripted import (
    ChatRequest,
    Script,
    ScriptedModelServer,
    Text,
    ToolCalls,
    bash,
)
from piwork.policy import Choice
from piwork.policy.request import PermissionRequest
from piwork.runner import Outcome, RunEvent, RunRequest, TaskSession
from tests.helpers.vm import ScriptedAsker, per_prompt, scripted_provider

pytestmark = pytest.mark.vm

SECRET = "sk-piwork-vmtest-" + secrets.token_hex(20)
CANARY = "canary-piwork-vmtest-" + secrets.token_hex(12)
PROMPT_TIMEOUT = 420.0


# --------------------------------------------------------------------------- host side


@dataclass
class HostService:
    """A tiny HTTP service on the host that records every connection it gets."""

    bind: str
    body: str
    port: int = 0
    connections: list[tuple[str, bytes]] = field(default_factory=list)
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.bind, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = str(writer.get_extra_info("peername"))
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            head = getattr(exc, "partial", b"")
        self.connections.append((peer, head))
        body = self.body.encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        try:
            await writer.drain()
        finally:
            writer.close()


def host_primary_ip() -> str | None:
    """The host's non-loopback address (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            ip = str(s.getsockname()[0])
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def keyed_provider(server: ScriptedModelServer) -> Provider:
    """The scripted server as a provider that needs a key sent as a Bearer token."""
    base = scripted_provider(server)
    assert isinstance(base, Provider)
    return base.model_copy(update={"auth": "bearer", "key_required": True})


def private_paths(root: Path) -> Paths:
    return Paths(data=root / "data", cache=root / "cache", state=root / "state", config=root / "c")


def guest_asker() -> ScriptedAsker:
    """Tool steps the gate asks about run; every egress question is denied."""

    def answer(req: PermissionRequest) -> Choice:
        return Choice.DENY if req.tool == "network" else Choice.ALLOW_ONCE

    return ScriptedAsker(permission=answer)


@dataclass
class Live:
    session: TaskSession
    server: ScriptedModelServer
    asker: ScriptedAsker
    events: list[RunEvent]
    folder: Path

    async def run(self, *commands: str, timeout: float = 300) -> tuple[Outcome, list[str]]:
        """One prompt whose script runs ``commands`` as bash steps; returns the
        outcome and the tool results exactly as the model received them."""
        steps = [ToolCalls([bash(c, timeout=timeout)]) for c in commands]
        self.server.script = cast(Script, per_prompt(*steps, Text("done")))
        before = len(self.server.chat_requests)
        outcome = await asyncio.wait_for(
            self.session.run_prompt(f"run {len(commands)} step(s)"), PROMPT_TIMEOUT
        )
        chats = self.server.chat_requests[before:]
        assert chats, "the model was never called"
        last = ChatRequest(body=chats[-1].body, headers=chats[-1].headers)
        results = [ex.result or "" for ex in last.tool_exchanges()]
        return outcome, results

    def transcript(self) -> list[dict[str, Any]]:
        task = self.session.task
        assert task is not None
        path = self.session.store.get(task.id).dir / "transcript.jsonl"
        return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def net_paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    """Private piwork dirs; the key is stored with the file backend, opted into by settings."""
    paths = private_paths(tmp_path_factory.mktemp("netpaths"))
    paths.config.mkdir(parents=True)
    paths.settings_file.write_bytes(orjson.dumps({"auth": {"fileBackend": True}}))
    return paths


@pytest.fixture(scope="module")
async def keyed_server(net_paths: Paths) -> AsyncIterator[ScriptedModelServer]:
    server = ScriptedModelServer(
        [Text("nothing scripted yet")], model_id="scripted", api_key=SECRET
    )
    async with server:
        stored = KeyStore(paths=net_paths).set("scripted", SECRET)
        assert stored.backend == "file", stored
        assert KeyStore(paths=net_paths).get("scripted") == SECRET
        yield server


@pytest.fixture(scope="module")
async def origin() -> AsyncIterator[HostService]:
    """An 'internet' site for the allowed-domain test; it listens on host loopback."""
    svc = HostService("127.0.0.1", "ORIGIN-OK served by the test's allowed site\n")
    await svc.start()
    yield svc
    await svc.close()


async def open_session(
    tmp: Path,
    paths: Paths,
    server: ScriptedModelServer,
    *,
    allow_net: tuple[str, ...],
    allow_private: bool,
    on_folder: Callable[[Path], None] = lambda folder: None,
) -> AsyncIterator[Live]:
    folder = tmp / "project"
    folder.mkdir()
    on_folder(folder)
    events: list[RunEvent] = []
    asker = guest_asker()
    req = RunRequest(
        prompt=None,
        folder=folder,
        model="scripted/scripted",
        extra_providers=(keyed_provider(server),),
        allow_net=allow_net,
        egress_allow_private_networks=allow_private,
    )
    async with TaskSession(req, events.append, asker, paths=paths) as session:  # type: ignore[arg-type]
        yield Live(session, server, asker, events, folder)
    assert session.agent is None


# --------------------------------------------------------------------------- boot 1


@pytest.fixture(scope="class")
async def keyed(
    tmp_path_factory: pytest.TempPathFactory, net_paths: Paths, keyed_server: ScriptedModelServer
) -> AsyncIterator[Live]:
    def plant(folder: Path) -> None:
        (folder / "canary.txt").write_text(f"the scan must find this: {CANARY}\n")

    async for live in open_session(
        tmp_path_factory.mktemp("keyed"),
        net_paths,
        keyed_server,
        allow_net=("localhost",),
        allow_private=True,
        on_folder=plant,
    ):
        yield live


def split(value: str) -> tuple[str, str]:
    """Two halves, so the whole value is never in a command the guest sees."""
    mid = len(value) // 2
    return value[:mid], value[mid:]


# The scan runs on the guest's Node (busybox grep stops each line at a NUL, so it
# cannot see into /proc/*/environ or binaries). It reads every regular file
# outside /proc, /sys and /dev, the kernel command line, every process's
# environment and argv, the kernel log and its own environment.
SCAN_JS = r"""
const fs = require("fs"), path = require("path");
const pats = process.argv.slice(2).map((f) => [f, fs.readFileSync(f, "utf8").trim()]);
const hits = Object.fromEntries(pats.map(([f]) => [f, []]));
let files = 0, bytes = 0;
function check(p, buf) {
  files++; bytes += buf.length;
  for (const [f, s] of pats) if (buf.indexOf(s) >= 0) hits[f].push(p);
}
function readable(p) { try { check(p, fs.readFileSync(p)); } catch {} }
function walk(d) {
  let ents;
  try { ents = fs.readdirSync(d, { withFileTypes: true }); } catch { return; }
  for (const e of ents) {
    const p = path.join(d, e.name);
    if (e.isDirectory()) { if (!["/proc", "/sys", "/dev"].includes(p)) walk(p); }
    else if (e.isFile() && !p.endsWith(".pat")) readable(p);
  }
}
walk("/");
readable("/proc/cmdline");
for (const pid of fs.readdirSync("/proc").filter((n) => /^[0-9]+$/.test(n))) {
  readable(`/proc/${pid}/environ`);
  readable(`/proc/${pid}/cmdline`);
}
try { check("dmesg", require("child_process").execFileSync("dmesg")); } catch {}
check("env", Buffer.from(JSON.stringify(process.env)));
console.log("SCAN " + JSON.stringify({ files, bytes, hits }));
"""

SCAN = (
    r"""
printf '%s%s\n' '{s1}' '{s2}' > /tmp/secret.pat
printf '%s%s\n' '{c1}' '{c2}' > /tmp/canary.pat
cat > /tmp/scan.js <<'PIWORK_EOF'
"""
    + SCAN_JS.replace("{", "{{").replace("}", "}}")
    + r"""
PIWORK_EOF
c=$(cat /tmp/canary.pat)
env PW_CANARY="$c" sh -c 'sleep 120; :' "$c" </dev/null >/dev/null 2>&1 &
planted=$!
echo "mounts: $(grep -c ' 9p ' /proc/mounts) 9p"
/opt/piwork/node/bin/node /tmp/scan.js /tmp/secret.pat /tmp/canary.pat
echo "planted=$planted"; pkill -P "$planted" 2>/dev/null; kill "$planted"
"""
)


def find_in_file(path: Path, needles: list[bytes], chunk: int = 64 << 20) -> set[bytes]:
    """Which of ``needles`` occur in a (large) file, read in overlapping chunks."""
    found: set[bytes] = set()
    overlap = max(len(n) for n in needles)
    tail = b""
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            window = tail + block
            found.update(n for n in needles if n in window)
            tail = window[-overlap:]
    return found


class TestKeyStaysOnTheHost:
    async def test_the_key_is_nowhere_the_guest_can_read(self, keyed: Live) -> None:
        # 1. A model round trip with the key (added by the gateway on the host), then
        #    all of the guest's RAM, dumped through QMP. This comes first: the scan
        #    below has to put the key into the guest itself, as its search pattern.
        outcome, results = await keyed.run("cat /mnt/work/canary.txt")
        assert outcome.ok, outcome
        assert CANARY in results[0]
        chats = keyed.server.chat_requests
        assert len(chats) >= 2
        assert {c.headers.get("authorization") for c in chats} == {f"Bearer {SECRET}"}
        agent = keyed.session.agent
        assert agent is not None and agent.vm.pid is not None
        dump = keyed.folder.parent / "guest-ram.bin"
        size = keyed.session.req.memory_mb << 20
        await agent.vm.qmp_execute("pmemsave", {"val": 0, "size": size, "filename": str(dump)})
        try:
            assert dump.stat().st_size == size
            in_ram = find_in_file(dump, [SECRET.encode(), CANARY.encode()])
        finally:
            dump.unlink()
        assert in_ram == {CANARY.encode()}  # the canary the guest read is there; the key not

        # 2. Everything the guest can read, searched from inside.
        s1, s2 = split(SECRET)
        c1, c2 = split(CANARY)
        outcome, results = await keyed.run(SCAN.format(s1=s1, s2=s2, c1=c1, c2=c2))
        assert outcome.ok, outcome
        out = results[0]
        print(f"\n--- guest scan ---\n{out}")
        # Every share this run has (the folder as the read-only lower layer of the guest's
        # own, the state, the outputs): a new one must be looked at here.
        assert "mounts: 3 9p" in out
        scan = orjson.loads(out.split("SCAN ", 1)[1].splitlines()[0])
        planted = out.split("planted=", 1)[1].split()[0]
        # The scan works: it sees a planted value in the shared folder, in another
        # process's environment and argv, and it covered the whole root file system ...
        assert {
            "/mnt/work/canary.txt",
            f"/proc/{planted}/environ",
            f"/proc/{planted}/cmdline",
        } <= set(scan["hits"]["/tmp/canary.pat"])
        assert scan["files"] > 3000 and scan["bytes"] > 100 << 20
        # ... and finds the key nowhere.
        assert scan["hits"]["/tmp/secret.pat"] == []
        assert SECRET not in out
        assert {c.headers.get("authorization") for c in keyed.server.chat_requests} == {
            f"Bearer {SECRET}"
        }

        # 3. Host side: the QEMU command line and environment, and every task file.
        proc = Path(f"/proc/{agent.vm.pid}")
        qemu_cmdline = (proc / "cmdline").read_bytes()
        assert b"qemu-system" in qemu_cmdline and b"name=piwork.net" in qemu_cmdline
        # No network card, no slirp, no per-connection command on the host.
        assert b"guestfwd" not in qemu_cmdline and b"-netdev" not in qemu_cmdline
        assert SECRET.encode() not in qemu_cmdline
        assert SECRET.encode() not in (proc / "environ").read_bytes()
        task = keyed.session.task
        assert task is not None
        roots = [keyed.session.store.get(task.id).dir, keyed.folder]
        files = [p for r in roots for p in r.rglob("*") if p.is_file() and not p.is_socket()]
        assert any(p.name == "models.json" for p in files)
        assert any(p.name == "session.jsonl" for p in files)
        leaked = [p for p in files if SECRET.encode() in p.read_bytes()]
        assert leaked == []

    async def test_an_allowed_domain_goes_through_the_egress_proxy(
        self, keyed: Live, origin: HostService
    ) -> None:
        url = f"http://localhost:{origin.port}/hello"
        outcome, results = await keyed.run(
            f"no_proxy= NO_PROXY= timeout 30 wget -O- {url}; echo wget-rc=$?"
        )
        assert outcome.ok, outcome
        print(f"\n--- allowed domain ---\n{results[0]}")
        assert "ORIGIN-OK" in results[0] and "wget-rc=0" in results[0]
        assert len(origin.connections) == 1
        _, head = origin.connections[0]
        # Relayed by the proxy: origin-form request line, Connection: close added.
        assert head.startswith(b"GET /hello HTTP/1.")
        assert b"connection: close" in head.lower()
        egress = [r["data"] for r in keyed.transcript() if r["kind"] == "egress"]
        port = origin.port
        assert {
            "host": "localhost",
            "port": port,
            "decision": "allow",
            "by": "--allow-net",
        } in egress
        assert {"host": "localhost", "port": port, "allowed": True, "reason": "policy"} in egress
        # --allow-net decided it: nobody was asked about the domain.
        assert network_questions(keyed.asker) == []


# --------------------------------------------------------------------------- boot 2


@pytest.fixture(scope="class")
async def default(
    tmp_path_factory: pytest.TempPathFactory, net_paths: Paths, keyed_server: ScriptedModelServer
) -> AsyncIterator[Live]:
    async for live in open_session(
        tmp_path_factory.mktemp("default"),
        net_paths,
        keyed_server,
        allow_net=("localhost",),
        allow_private=False,
    ):
        yield live


PROBES = r"""
probe() {{
  label=$1; shift
  s=$(cut -d' ' -f1 /proc/uptime)
  out=$(timeout 10 "$@" 2>&1 </dev/null); rc=$?
  e=$(cut -d' ' -f1 /proc/uptime)
  echo "PROBE $label rc=$rc secs=$(awk -v a="$s" -v b="$e" 'BEGIN{{printf "%.2f", b-a}}')"
  printf '%s\n' "$out" | head -n 3 | sed 's/^/  | /'
}}
echo "ENV $(env | grep -i '_proxy=' | sort | tr '\n' ' ')"
echo "IFACES $(ls /sys/class/net | tr '\n' ' ')"
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY
W="wget --no-proxy -O-"
probe control-gateway $W http://10.0.2.100/
probe host-127-via-10.0.2.2 $W http://10.0.2.2:{lo}/
probe host-0000-via-10.0.2.2 $W http://10.0.2.2:{any}/
probe nc-host-127-via-10.0.2.2 bash -c 'exec 3<>/dev/tcp/10.0.2.2/{lo} && echo CONNECTED'
probe nc-host-0000-via-10.0.2.2 bash -c 'exec 3<>/dev/tcp/10.0.2.2/{any} && echo CONNECTED'
probe host-0000-via-host-ip {host_ip_probe}
probe gateway-ip-port-{lo} $W http://10.0.2.100:{lo}/
probe nc-gateway-ip-port-22 bash -c 'exec 3<>/dev/tcp/10.0.2.100/22 && echo CONNECTED'
probe egress-ip-port-80 $W http://10.0.2.101/
probe slirp-dns-tcp-53 bash -c 'exec 3<>/dev/tcp/10.0.2.3/53 && echo CONNECTED'
probe slirp-dns-udp getent ahosts example.com
probe guest-own-127 $W http://127.0.0.1:{lo}/
echo PROBES-DONE
"""


class TestDefaultIsolation:
    async def test_a_denied_domain_fails_with_a_clear_reason(self, default: Live) -> None:
        head = "CONNECT blocked.example.com:443 HTTP/1.1\\r\\nHost: blocked.example.com:443\\r\\n"
        # The proxy serves only this run's VM: the token is in the guest's proxy URL.
        cred = 'cred=$(printf %s "${HTTPS_PROXY#http://}" | sed "s/@.*//" | base64); '
        # A raw connection to the proxy (bash's /dev/tcp: the workbench has no nc).
        raw = "exec 3<>/dev/tcp/10.0.2.101/3128; "
        connect = (
            f"{cred}{raw}printf '{head}Proxy-Authorization: Basic %s\\r\\n\\r\\n' \"$cred\""
            " >&3; timeout 10 cat <&3"
        )
        anonymous = f"{raw}printf '{head}\\r\\n' >&3; timeout 10 cat <&3"
        # The host name is hidden from the gate's classifier (a variable), so allowing
        # this bash step once does not allow the domain once: the proxy must decide.
        outcome, results = await default.run(
            "h=blocked.example.com; timeout 30 wget -O- http://$h/x; echo wget-rc=$?",
            f"{connect}; echo nc-rc=$?",
            f"{anonymous}; echo nc-rc=$?",
        )
        assert outcome.ok, outcome
        print(f"\n--- denied domain ---\n{results[0]}\n{results[1]}\n{results[2]}")
        plain, tunnel, without_token = results
        assert "HTTP/1.1 407 Proxy Authentication Required" in without_token
        assert "403 Forbidden by piwork network policy: blocked.example.com" in plain
        assert "wget-rc=0" not in plain
        assert "HTTP/1.1 403 Forbidden by piwork network policy: blocked.example.com" in tunnel
        assert "--allow-net blocked.example.com" in tunnel  # the body says what to do
        egress = [r["data"] for r in default.transcript() if r["kind"] == "egress"]
        for port in (80, 443):
            refused = {"host": "blocked.example.com", "port": port, "allowed": False}
            # Each record also says the method and what the guest was told.
            assert any({**refused, "reason": "policy"}.items() <= e.items() for e in egress)
        asked = network_questions(default.asker)
        assert [(p.targets[0].domain, p.question) for p in asked] == [
            (
                "blocked.example.com",
                f"The agent wants to connect to blocked.example.com (port {n}). Allow?",
            )
            for n in (80, 443)
        ]

    async def test_an_allowed_name_for_a_host_loopback_address_is_refused(
        self, default: Live, origin: HostService
    ) -> None:
        seen = len(origin.connections)
        url = f"http://localhost:{origin.port}/"
        outcome, results = await default.run(
            f"no_proxy= NO_PROXY= timeout 30 wget -O- {url}; echo wget-rc=$?"
        )
        assert outcome.ok, outcome
        print(f"\n--- allowed name, loopback address ---\n{results[0]}")
        # localhost is allowed by name, but it resolves to this computer: refused unless
        # the person allows that domain's private address (a question --yes never answers).
        assert "403 Forbidden by piwork: localhost resolves to a private address" in results[0]
        assert len(origin.connections) == seen

    async def test_the_guest_cannot_reach_host_services(self, default: Live) -> None:
        lo = HostService("127.0.0.1", "HOST-LOOPBACK-SERVICE\n")
        anyaddr = HostService("0.0.0.0", "HOST-ANYADDR-SERVICE\n")
        await lo.start()
        await anyaddr.start()
        host_ip = host_primary_ip()
        try:
            script = PROBES.format(
                lo=lo.port,
                any=anyaddr.port,
                host_ip_probe=(
                    f"wget --no-proxy -O- http://{host_ip}:{anyaddr.port}/"
                    if host_ip
                    else "echo no-host-ip"
                ),
            )
            outcome, results = await default.run(script)
        finally:
            await lo.close()
            await anyaddr.close()
        assert outcome.ok, outcome
        out = results[0]
        print(f"\n--- loopback isolation (host ip {host_ip}) ---\n{out}")
        assert "PROBES-DONE" in out
        # What the agent's tools get: every HTTP(S) client aims at the egress proxy,
        # and both no_proxy spellings exempt the gateway and the guest's own loopback.
        env = set(out.split("ENV ", 1)[1].splitlines()[0].split())
        bypass = "localhost,127.0.0.1,10.0.2.100"
        # The egress proxy URL carries this run's token (its password) and nothing else.
        proxies = {e.split("=", 1)[1] for e in env if e.lower().startswith(("http_", "https_"))}
        assert len(proxies) == 1, env
        [proxy] = proxies
        assert re.fullmatch(r"http://piwork:[A-Za-z0-9_-]{32}@10\.0\.2\.101:3128", proxy), proxy
        for name in ("http_proxy", "https_proxy"):
            assert {f"{name}={proxy}", f"{name.upper()}={proxy}"} <= env, env
        assert {f"no_proxy={bypass}", f"NO_PROXY={bypass}"} <= env, env
        # The VM has no network card: only lo, which holds the two service addresses.
        assert out.split("IFACES ", 1)[1].splitlines()[0].split() == ["lo"], out
        probes = parse_probes(out)
        # The network itself works: the gateway answers (its 404 for a bare path).
        assert "404" in probes["control-gateway"][1]
        for label, (rc, text) in probes.items():
            if label == "control-gateway" or (label == "host-0000-via-host-ip" and not host_ip):
                continue
            assert rc != 0, (label, text)
            assert "SERVICE" not in text, (label, text)
        # Not a single connection reached either host service.
        assert lo.connections == [] and anyaddr.connections == []


def network_questions(asker: ScriptedAsker) -> list[PermissionRequest]:
    """The egress proxy's questions (the gate's own asks name the pi tool instead)."""
    perms = cast(list[PermissionRequest], asker.permissions)
    return [p for p in perms if p.tool == "network"]


def parse_probes(out: str) -> dict[str, tuple[int, str]]:
    probes: dict[str, tuple[int, str]] = {}
    label = None
    for line in out.splitlines():
        if line.startswith("PROBE "):
            _, label, rc, _secs = line.split()
            probes[label] = (int(rc.removeprefix("rc=")), "")
        elif label is not None and line.startswith("  | "):
            rc_, text = probes[label]
            probes[label] = (rc_, text + line[4:] + "\n")
    assert len(probes) == 12, out
    return probes
