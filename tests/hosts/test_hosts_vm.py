"""The real pack VM on a "remote" host (this machine through a real sshd): QEMU is started
over SSH under the watchdog; QMP, the console, RPC and the netmux are reached through SSH
direct-streamlocal channels; pi answers and writes a file that lands in the LOCAL folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from piwork.hosts.connect import fingerprint_matcher
from piwork.hosts.packs import ensure_pack
from piwork.hosts.vm import RemoteAgentVm, RemoteLink
from piwork.models.scripted import Delay, ScriptedModelServer, Text, ToolCalls, bash, write
from piwork.pack.manifest import Manifest
from piwork.rpc import models as m
from tests.helpers.hosts import Sshd
from tests.helpers.procs import alive, cmdline, descendants, parents, wait_gone
from tests.helpers.vm import agent_config, apply_changes, make_task_dirs, write_models_json

pytestmark = pytest.mark.vm


@pytest.fixture
async def link(sshd: Sshd, short_root: Path) -> AsyncIterator[RemoteLink]:
    host = sshd.host(root=str(short_root))
    link = await RemoteLink.open(host, fingerprint_matcher(sshd.fingerprint, None))
    yield link
    await link.close()


def sockets_under(top: Path) -> list[Path]:
    return [p for p in top.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]


async def test_pi_answers_through_ssh_and_writes_into_the_local_folder(
    link: RemoteLink, pack: tuple[Path, Manifest], tmp_path: Path, short_root: Path
) -> None:
    local = tmp_path / "local"
    dirs = make_task_dirs(local / "task")
    write_models_json(dirs)
    said: list[str] = []
    script: list[Text | ToolCalls] = [
        ToolCalls([write("from-remote.txt", "written on the remote VM\n")]),
        Text("done"),
    ]
    async with ScriptedModelServer(script, model_id="scripted") as server:
        cfg = agent_config(pack, dirs, server, local / "logs", warm_start=False)
        agent = RemoteAgentVm(cfg, link, lease=10, progress=said.append)
        async with agent:
            state = await agent.wait_pi_ready()
            assert state.session_file == "/mnt/state/session.jsonl"
            pid = agent.vm.pid
            assert pid is not None and alive(pid)
            argv = cmdline(pid)
            paths = [a for a in argv if a.startswith("/")]
            paths += [o.split("=", 1)[1] for a in argv for o in a.split(",")
                      if o.startswith(("path=", "file=", "mem-path="))]  # fmt: skip
            assert paths and all(p.startswith(f"{short_root}/") for p in paths), paths
            assert "sshd" in parents(pid)
            assert sockets_under(local) == []  # QMP, console, RPC, netmux: none here
            await agent.rpc.prompt("write the file")
            await agent.rpc.wait_idle(timeout=300)
            assert len(server.chat_requests) >= 2  # the model calls arrived on this machine
            await apply_changes(agent, local / "task-dir")  # as a run does, before the end
        assert await asyncio.to_thread(wait_gone, pid, 30) < 30
    assert dirs.work is not None
    assert (dirs.work / "from-remote.txt").read_text() == "written on the remote VM\n"
    assert (dirs.state / "session.jsonl").stat().st_size > 0
    assert not (short_root / "run" / agent.run_id).exists()
    assert any("pack uploaded" in s for s in said), said
    again = await ensure_pack(link.conn, link.root, pack[0], pack[1])
    assert again.bytes_sent == 0
    print("\n" + "\n".join(said) + "\nsecond time: " + again.describe())


def sshd_processes_of_sessions(sshd: Sshd) -> list[int]:
    """The per-connection sshd processes (monitor and session), not what they run."""
    out = []
    for pid in descendants(sshd.proc.pid):
        with contextlib.suppress(FileNotFoundError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                out.append(pid)
    return out


async def test_a_dropped_ssh_connection_mid_turn_loses_and_duplicates_nothing(
    link: RemoteLink, sshd: Sshd, pack: tuple[Path, Manifest], tmp_path: Path
) -> None:
    local = tmp_path / "local"
    dirs = make_task_dirs(local / "task")
    write_models_json(dirs)
    script: list[Text | ToolCalls] = [
        ToolCalls([bash("sleep 8; echo slept > slept.txt")]),
        ToolCalls([write("after.txt", "after the drop\n")]),
        Text("done"),
    ]
    async with ScriptedModelServer(script, model_id="scripted") as server:
        cfg = agent_config(pack, dirs, server, local / "logs", warm_start=False)
        agent = RemoteAgentVm(cfg, link)
        async with agent:
            await agent.wait_pi_ready()
            events: list[object] = []
            started = asyncio.Event()

            def listen(ev: object) -> None:
                events.append(ev)
                if isinstance(ev, m.ToolExecutionStart) and ev.tool_name == "bash":
                    started.set()

            agent.rpc.add_listener(listen)
            await agent.rpc.prompt("sleep, then write")
            await asyncio.wait_for(started.wait(), 300)
            victims = sshd_processes_of_sessions(sshd)
            assert victims
            for pid in victims:  # the connection dies mid-turn, as with a network cut
                os.kill(pid, signal.SIGKILL)
            await agent.rpc.wait_idle(timeout=300)
            assert link.reconnects >= 1 and agent.channel.reconnects >= 1
            assert agent.channel.gaps == []
            ends = [e for e in events if isinstance(e, m.ToolExecutionEnd)]
            assert [e.tool_name for e in ends] == ["bash", "write"]
            assert all(not e.is_error for e in ends)
            starts = [e.tool_call_id for e in events if isinstance(e, m.ToolExecutionStart)]
            assert len(starts) == len(set(starts)) == 2  # nothing replayed twice
            assert sum(isinstance(e, m.AgentEnd) for e in events) == 1
            await apply_changes(agent, local / "task-dir")
        assert len(server.chat_requests) == 3
    assert dirs.work is not None
    assert (dirs.work / "slept.txt").read_text() == "slept\n"
    assert (dirs.work / "after.txt").read_text() == "after the drop\n"
    print(f"\nSSH reconnects: {link.reconnects}, channel reconnects: {agent.channel.reconnects}")


async def test_a_model_stream_cut_by_an_ssh_drop_is_retried_once_by_pi(
    link: RemoteLink, sshd: Sshd, pack: tuple[Path, Manifest], tmp_path: Path
) -> None:
    """The answer is streaming back (guest -> netmux -> SSH -> gateway here) when the SSH
    connection dies. The netmux reconnects and its HELLO resets the guest's streams, so
    pi sees its request cut ("terminated", retryable) and sends it again: one retry, the
    cut attempt ends as an error message (what it had streamed stays in the transcript,
    marked so), the answer arrives once, no RPC event is lost or repeated."""
    local = tmp_path / "local"
    dirs = make_task_dirs(local / "task")
    write_models_json(dirs)
    answer = "the answer, after the drop"
    script: list[object] = [Delay(120, then=Text("never sent"), times=1), Text(answer)]
    async with ScriptedModelServer(script, model_id="scripted") as server:  # type: ignore[arg-type]
        cfg = agent_config(pack, dirs, server, local / "logs", warm_start=False)
        agent = RemoteAgentVm(cfg, link)
        async with agent:
            await agent.wait_pi_ready()
            events: list[object] = []
            streaming = asyncio.Event()

            def listen(ev: object) -> None:
                events.append(ev)
                if isinstance(ev, m.MessageStart) and ev.message.get("role") == "assistant":
                    streaming.set()

            agent.rpc.add_listener(listen)
            await agent.rpc.prompt("answer me")
            await asyncio.wait_for(streaming.wait(), 300)
            for pid in sshd_processes_of_sessions(sshd):  # cut mid-stream
                os.kill(pid, signal.SIGKILL)
            await agent.rpc.wait_idle(timeout=300)
            assert link.reconnects >= 1 and agent.channel.gaps == []
            retries = [e for e in events if isinstance(e, m.AutoRetryStart)]
            assert len(retries) == 1, retries
            ended = [e.message for e in events if isinstance(e, m.MessageEnd)
                     and e.message.get("role") == "assistant"]  # fmt: skip
            assert [msg.get("stopReason") for msg in ended] == ["error", "stop"], ended
            texts = [c.get("text") for c in ended[-1].get("content", []) if c.get("type") == "text"]
            assert texts == [answer]
            # pi's retry protocol: each attempt is an agent run of its own (agent_end,
            # then auto_retry_start), and the retry ends successfully.
            assert sum(isinstance(e, m.AgentEnd) for e in events) == 2
            done = [e for e in events if isinstance(e, m.AutoRetryEnd)]
            assert [e.success for e in done] == [True], done
        assert len(server.chat_requests) == 2
    print(f"\nretried after: {retries[0].error_message!r}")
