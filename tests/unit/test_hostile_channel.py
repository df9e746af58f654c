"""Known defects in the channel/RPC seam, each reproduced with a hostile guest end."""

from __future__ import annotations

import asyncio
import time

import pytest

from piwork.rpc.client import RpcConnectionLost, RpcError
from piwork.vm import channel as channel_mod
from tests.helpers.guest_double import guest_and_host


async def test_a_malformed_gap_or_pong_does_not_kill_the_reader() -> None:
    async with guest_and_host() as (guest, host):
        seen: list[object] = []
        host.rpc.add_listener(seen.append)
        await guest.send_raw(b'0 !{"ev":"gap"}\n')
        await guest.send_raw(b'0 !{"ev":"gap","from":"x","to":[1]}\n')
        await guest.send_raw(b'0 !{"ev":"pong","id":"not-a-number"}\n')
        await guest.send_pi({"type": "agent_start"})
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert [type(item).__name__ for item in seen] == ["AgentStart"]
        assert any(ev.get("ev") == "malformed" for ev in host.events)


async def test_an_oversized_reply_fails_its_request_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(channel_mod, "MAX_LINE", 256 * 1024)
    async with guest_and_host(default_timeout=30) as (guest, host):
        asking = asyncio.create_task(host.rpc.get_state())
        cmd = await guest.next_command()
        big = b'{"id":"' + cmd["id"].encode() + b'","type":"response","command":"get_state",'
        big += b'"success":true,"data":{"pad":"' + b"x" * (1024 * 1024) + b'"}}'
        started = time.monotonic()
        await guest.send_pi(big)
        with pytest.raises(RpcError, match="too large"):
            await asyncio.wait_for(asking, 5)
        assert time.monotonic() - started < 2
        # The channel is still in step: the next reply reaches its request.
        asking = asyncio.create_task(host.rpc.get_state())
        cmd = await guest.next_command()
        await guest.send_pi(
            {
                "id": cmd["id"],
                "type": "response",
                "command": "get_state",
                "success": True,
                "data": {"isStreaming": False},
            }
        )
        assert (await asyncio.wait_for(asking, 5)).is_streaming is False
        assert not [ev for ev in host.events if ev.get("ev") == "gap"]


async def test_a_restarted_supervisor_fails_waiters_at_once_not_after_a_timeout() -> None:
    async with guest_and_host(default_timeout=30) as (guest, host):
        asking = asyncio.create_task(host.rpc.get_state())
        await guest.next_command()
        # The supervisor dies and /init starts a new one (new bootId, no pi).
        guest.boot_id = "boot-2"
        guest.seq = 0
        guest.drop()
        started = time.monotonic()
        with pytest.raises(RpcConnectionLost, match="supervisor restarted"):
            await asyncio.wait_for(asking, 10)
        assert time.monotonic() - started < 5
        assert host.agent.pi_exit.done()
        assert "supervisor restarted" in host.agent.pi_exit.result()["message"]


async def test_a_connection_cut_anywhere_loses_and_repeats_no_line() -> None:
    import random

    rng = random.Random(11)
    async with guest_and_host() as (guest, host):
        seen: list[int] = []
        host.rpc.add_listener(lambda item: seen.append(int(getattr(item, "n", -1))))
        total = 2000
        for i in range(total):
            payload = f'{{"type":"custom_event","n":{i}}}'.encode()
            if rng.random() < 0.01:
                # Cut mid-line: half of this line goes out, then the connection drops.
                guest.seq += 1
                data = str(guest.seq).encode() + b" " + payload + b"\n"
                guest.history.append((guest.seq, data))
                await guest.send_raw(data[: len(data) // 2])
                guest.drop()
                await asyncio.wait_for(guest.connected.wait(), 10)
                continue
            await guest.send_pi(payload)
        for _ in range(500):
            if len(seen) >= total:
                break
            await asyncio.sleep(0.02)
        assert seen == list(range(total)), "a line was lost, repeated or reordered"
        assert host.channel.reconnects > 5
