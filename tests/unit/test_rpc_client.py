"""RpcClient against a fake pi that behaves like pi's rpc mode (1.x, docs/rpc.md):
concurrent command handling (so replies out of order), id-less replies for parse
errors and unknown commands, dialogs that block until answered, auto-retry that
ends each failed attempt with agent_end, and agent_settled once pi is done."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from piwork.rpc.client import (
    ClientItem,
    RpcClient,
    RpcConnectionLost,
    RpcError,
    RpcTimeout,
    UnmatchedResponse,
)
from piwork.rpc.framing import MalformedLine, OversizedLine
from piwork.rpc.models import (
    AgentEnd,
    AgentStart,
    GetStateCommand,
    NotifyRequest,
    SelectRequest,
    UiRequest,
    UiResponse,
    UnknownEvent,
    ui_confirmed,
    ui_value,
)

Json = dict[str, Any]


class FakePi:
    """pi's end of the wire. Reads the lines the client sends; the test decides the answers.

    With ``state`` set, ``get_state`` is answered by itself from it (asynchronously,
    like pi), which is what ``wait_idle`` needs.
    """

    def __init__(self, **client_kwargs: Any) -> None:
        self.commands: asyncio.Queue[Json] = asyncio.Queue()
        self.ui_responses: asyncio.Queue[Json] = asyncio.Queue()
        self.sent: list[Json] = []
        self.state: Json | None = None
        self.on_get_state: list[Json] = []
        """Events to emit just before the next get_state reply (one-shot)."""
        self.client = RpcClient(self._receive, **client_kwargs)

    async def _receive(self, line: bytes) -> None:
        assert line.endswith(b"\n") and line.count(b"\n") == 1, line
        obj = orjson.loads(line)
        self.sent.append(obj)
        if obj["type"] == "extension_ui_response":
            self.ui_responses.put_nowait(obj)
        elif obj["type"] == "get_state" and self.state is not None:
            asyncio.get_running_loop().call_soon(self._answer_state, obj)
        else:
            self.commands.put_nowait(obj)

    def _answer_state(self, cmd: Json) -> None:
        for ev in self.on_get_state:
            self.emit(ev)
        self.on_get_state = []
        assert self.state is not None
        self.reply(cmd, dict(self.state))

    async def next_command(self) -> Json:
        return await asyncio.wait_for(self.commands.get(), 2)

    async def next_ui_response(self) -> Json:
        return await asyncio.wait_for(self.ui_responses.get(), 2)

    def emit(self, obj: Json) -> None:
        self.client.feed_line(orjson.dumps(obj))

    def reply(
        self,
        cmd: Json,
        data: Any = None,
        *,
        success: bool = True,
        error: str | None = None,
        with_id: bool = True,
    ) -> None:
        out: Json = {"type": "response", "command": cmd["type"], "success": success}
        if with_id:
            out = {"id": cmd["id"], **out}
        if data is not None:
            out["data"] = data
        if error is not None:
            out["error"] = error
        self.emit(out)

    def dialog(self, method: str = "select", req_id: str = "ui-1", **fields: Any) -> None:
        if method == "select":
            fields.setdefault("title", "Allow bash: rm -rf build?")
            fields.setdefault("options", ["Allow once", "Always allow", "Deny"])
        self.emit({"type": "extension_ui_request", "id": req_id, "method": method, **fields})


def state(streaming: bool = False, **extra: Any) -> Json:
    return {"isStreaming": streaming, "isCompacting": False, "sessionId": "s1", **extra}


def collect(client: RpcClient) -> list[ClientItem]:
    items: list[ClientItem] = []
    client.add_listener(items.append)
    return items


# --- correlation ------------------------------------------------------------


async def test_each_request_carries_a_unique_id() -> None:
    pi = FakePi()
    tasks = [asyncio.create_task(pi.client.request(GetStateCommand())) for _ in range(3)]
    cmds = [await pi.next_command() for _ in range(3)]
    for cmd in cmds:
        pi.reply(cmd, {})
    await asyncio.gather(*tasks)

    ids = [c["id"] for c in cmds]
    assert all(isinstance(i, str) and i for i in ids)
    assert len(set(ids)) == 3


async def test_replies_out_of_order_reach_the_right_callers() -> None:
    pi = FakePi()
    stats = asyncio.create_task(pi.client.get_session_stats())
    messages = asyncio.create_task(pi.client.get_messages())
    text = asyncio.create_task(pi.client.get_last_assistant_text())
    c_stats, c_messages, c_text = [await pi.next_command() for _ in range(3)]

    pi.reply(c_text, {"text": "last words"})
    pi.reply(c_messages, {"messages": [{"role": "user", "content": "hi"}]})
    pi.reply(c_stats, {"tokens": {"total": 42}, "cost": 0.5})

    assert (await stats).tokens.total == 42
    assert await messages == [{"role": "user", "content": "hi"}]
    assert await text == "last words"


async def test_failure_raises_rpc_error_with_command_and_pis_text() -> None:
    pi = FakePi()
    call = asyncio.create_task(pi.client.set_model("gw", "nope"))
    cmd = await pi.next_command()
    assert cmd == {"type": "set_model", "provider": "gw", "modelId": "nope", "id": cmd["id"]}
    pi.reply(cmd, success=False, error="Model not found: gw/nope")

    with pytest.raises(RpcError) as info:
        await call
    assert info.value.command == "set_model"
    assert info.value.error == "Model not found: gw/nope"


async def test_check_false_returns_the_failed_response() -> None:
    pi = FakePi()
    call = asyncio.create_task(pi.client.request({"type": "prompt", "message": "x"}, check=False))
    pi.reply(await pi.next_command(), success=False, error="No model selected")

    response = await call
    assert response.success is False
    assert response.error == "No model selected"


async def test_unknown_command_reply_without_id_goes_to_the_oldest_request_of_that_type() -> None:
    pi = FakePi()
    state_call = asyncio.create_task(pi.client.get_state())
    first = asyncio.create_task(pi.client.request({"type": "frobnicate"}))
    second = asyncio.create_task(pi.client.request({"type": "frobnicate"}))
    c_state, c_first, c_second = [await pi.next_command() for _ in range(3)]

    # pi: error(undefined, unknownCommand.type, `Unknown command: ...`)
    pi.reply(c_second, success=False, error="Unknown command: frobnicate", with_id=False)

    with pytest.raises(RpcError, match="Unknown command: frobnicate"):
        await first
    assert not second.done()
    assert not state_call.done()

    pi.reply(c_first, success=False, error="Unknown command: frobnicate", with_id=False)
    with pytest.raises(RpcError):
        await second
    pi.reply(c_state, state())
    assert (await state_call).session_id == "s1"


async def test_parse_error_without_id_is_surfaced_and_blames_no_request() -> None:
    pi = FakePi()
    items = collect(pi.client)
    pending = asyncio.create_task(pi.client.get_state())
    cmd = await pi.next_command()

    pi.emit(
        {
            "type": "response",
            "command": "parse",
            "success": False,
            "error": "Failed to parse command: Unexpected token",
        }
    )
    await asyncio.sleep(0)

    assert not pending.done()
    assert len(items) == 1
    unmatched = items[0]
    assert isinstance(unmatched, UnmatchedResponse)
    assert unmatched.response.command == "parse"
    assert unmatched.response.error == "Failed to parse command: Unexpected token"

    pi.reply(cmd, state())
    assert (await pending).is_streaming is False


async def test_a_late_reply_after_a_timeout_is_surfaced_not_lost() -> None:
    pi = FakePi()
    items = collect(pi.client)
    call = asyncio.create_task(pi.client.request(GetStateCommand(), timeout=0.05))
    cmd = await pi.next_command()

    with pytest.raises(RpcTimeout) as info:
        await call
    assert info.value.command == "get_state"

    pi.reply(cmd, state())
    assert [type(i) for i in items] == [UnmatchedResponse]


async def test_a_reply_too_large_to_keep_fails_its_request_instead_of_hanging() -> None:
    pi = FakePi(max_line_bytes=256)
    call = asyncio.create_task(pi.client.get_messages())
    cmd = await pi.next_command()
    huge = orjson.dumps(
        {
            "id": cmd["id"],
            "type": "response",
            "command": "get_messages",
            "success": True,
            "data": {"messages": ["m" * 1000]},
        }
    )

    pi.client.feed_bytes(huge[:100])
    pi.client.feed_bytes(huge[100:] + b"\n")

    with pytest.raises(RpcError, match="too large"):
        await asyncio.wait_for(call, 1)


# --- event stream -----------------------------------------------------------


async def test_every_non_response_line_reaches_every_subscriber_in_order() -> None:
    pi = FakePi(max_line_bytes=512)
    first = pi.client.events()
    second = pi.client.events()
    heard = collect(pi.client)

    pi.emit({"type": "agent_start"})
    pi.emit({"type": "response", "id": "not-ours", "command": "x", "success": True})
    pi.client.feed_line(b"{broken")
    pi.dialog("notify", req_id="n1", message="hello")
    pi.client.feed_bytes(b'{"type":"message_update","x":"' + b"y" * 600 + b'"}\n')
    pi.emit({"type": "brand_new_event", "n": 1})
    pi.emit({"type": "agent_end", "messages": []})
    await pi.client.aclose()

    kinds = [
        AgentStart,
        UnmatchedResponse,
        MalformedLine,
        NotifyRequest,
        OversizedLine,
        UnknownEvent,
        AgentEnd,
    ]
    assert [type(i) for i in [x async for x in first]] == kinds
    assert [type(i) for i in [x async for x in second]] == kinds
    assert [type(i) for i in heard] == kinds


async def test_a_subscription_sees_items_from_its_creation_even_before_iterating() -> None:
    pi = FakePi()
    sub = pi.client.events()
    pi.emit({"type": "agent_start"})
    sub.close()

    assert [type(i) async for i in sub] == [AgentStart]


async def test_a_failing_listener_does_not_stop_delivery() -> None:
    pi = FakePi()

    def bad(_item: ClientItem) -> None:
        raise RuntimeError("listener bug")

    pi.client.add_listener(bad)
    good = collect(pi.client)
    pi.emit({"type": "agent_start"})

    assert [type(i) for i in good] == [AgentStart]


# --- extension UI -----------------------------------------------------------


async def test_a_dialog_is_answered_while_a_request_is_pending() -> None:
    """The deadlock case: pi's abort replies only after the run stopped, and the
    run is stuck in a permission dialog. The client must answer the dialog while
    it awaits the abort reply."""
    seen: list[UiRequest] = []

    async def gate(request: UiRequest) -> UiResponse | None:
        seen.append(request)
        await asyncio.sleep(0.01)  # the person thinks
        return ui_value(request.id, "Deny")

    pi = FakePi(ui_handler=gate)
    pi.dialog("select", req_id="gate-7")
    abort = asyncio.create_task(pi.client.abort(timeout=2))
    cmd = await pi.next_command()
    assert cmd["type"] == "abort"

    answer = await pi.next_ui_response()  # pi waits for this before it can reply
    pi.reply(cmd)

    assert answer == {"type": "extension_ui_response", "id": "gate-7", "value": "Deny"}
    assert (await abort).success
    assert isinstance(seen[0], SelectRequest)
    assert pi.client.open_dialogs == {}


async def test_a_dialog_raised_during_a_request_is_answered_before_the_reply() -> None:
    async def yes(request: UiRequest) -> UiResponse | None:
        return ui_confirmed(request.id, True)

    pi = FakePi(ui_handler=yes)
    call = asyncio.create_task(pi.client.request({"type": "bash", "command": "make"}, timeout=2))
    cmd = await pi.next_command()
    pi.dialog("confirm", req_id="c1", title="Run make?", message="in /mnt/work")

    assert (await pi.next_ui_response())["confirmed"] is True
    pi.reply(cmd, {"output": "", "exitCode": 0, "cancelled": False, "truncated": False})
    await call


async def test_a_handler_returning_none_leaves_the_dialog_for_answer_ui() -> None:
    async def later(_request: UiRequest) -> UiResponse | None:
        return None

    pi = FakePi(ui_handler=later)
    pi.dialog("input", req_id="i1", title="Name?")
    await asyncio.sleep(0.01)
    assert list(pi.client.open_dialogs) == ["i1"]

    assert await pi.client.answer_ui("i1", value="piwork") is True
    assert (await pi.next_ui_response())["value"] == "piwork"
    assert await pi.client.answer_ui("i1", value="again") is False
    assert pi.ui_responses.empty()


async def test_a_crashing_ui_handler_cancels_its_dialog_so_pi_does_not_hang() -> None:
    async def broken(_request: UiRequest) -> UiResponse | None:
        raise RuntimeError("front end bug")

    pi = FakePi(ui_handler=broken)
    pi.dialog("editor", req_id="e1", title="Edit", prefill="x")

    assert await pi.next_ui_response() == {
        "type": "extension_ui_response",
        "id": "e1",
        "cancelled": True,
    }


async def test_fire_and_forget_requests_are_not_dialogs_and_need_no_answer() -> None:
    called: list[UiRequest] = []

    async def handler(request: UiRequest) -> UiResponse | None:
        called.append(request)
        return None

    pi = FakePi(ui_handler=handler)
    pi.dialog("notify", req_id="n1", message="hi", notifyType="warning")
    pi.dialog("setStatus", req_id="s1", statusKey="gate", statusText="2 allowed")
    await asyncio.sleep(0.01)

    assert called == []
    assert pi.client.open_dialogs == {}


async def test_cancel_open_dialogs_answers_each_open_dialog_with_cancelled() -> None:
    handler_cancelled = asyncio.Event()

    async def person_never_answers(request: UiRequest) -> UiResponse | None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            handler_cancelled.set()
            raise
        return None

    pi = FakePi(ui_handler=person_never_answers)
    pi.dialog("select", req_id="d1")
    pi.dialog("confirm", req_id="d2", title="Sure?", message="really")
    pi.dialog("notify", req_id="n1", message="not a dialog")
    await asyncio.sleep(0.01)

    cancelled = await pi.client.cancel_open_dialogs()

    assert sorted(cancelled) == ["d1", "d2"]
    answers = [await pi.next_ui_response(), await pi.next_ui_response()]
    assert sorted(a["id"] for a in answers) == ["d1", "d2"]
    assert all(a["cancelled"] is True and len(a) == 3 for a in answers)
    assert pi.client.open_dialogs == {}
    await asyncio.wait_for(handler_cancelled.wait(), 1)
    assert await pi.client.cancel_open_dialogs() == []


async def test_a_dialog_whose_own_timeout_passed_is_no_longer_open() -> None:
    pi = FakePi()
    pi.dialog("select", req_id="t1", timeout=20)
    pi.dialog("select", req_id="t2")
    assert set(pi.client.open_dialogs) == {"t1", "t2"}

    await asyncio.sleep(0.05)

    assert set(pi.client.open_dialogs) == {"t2"}


# --- connection loss --------------------------------------------------------


async def test_connection_lost_fails_pending_requests_and_ends_streams() -> None:
    pi = FakePi()
    sub = pi.client.events()
    first = asyncio.create_task(pi.client.get_state())
    second = asyncio.create_task(pi.client.prompt("hello"))
    await pi.next_command()
    await pi.next_command()

    pi.client.connection_lost(EOFError("guest channel closed"))

    for call, command in ((first, "get_state"), (second, "prompt")):
        with pytest.raises(RpcConnectionLost) as info:
            await call
        assert info.value.command == command
        assert "guest channel closed" in info.value.error
    assert [i async for i in sub] == []
    with pytest.raises(RpcConnectionLost):
        await pi.client.get_state()
    assert pi.client.closed


async def test_connection_lost_wakes_wait_idle() -> None:
    pi = FakePi()
    pi.emit({"type": "agent_start"})
    waiting = asyncio.create_task(pi.client.wait_idle())
    await asyncio.sleep(0.01)

    pi.client.connection_lost(None)

    with pytest.raises(RpcConnectionLost):
        await asyncio.wait_for(waiting, 1)


# --- completion -------------------------------------------------------------


ERROR_500 = {
    "role": "assistant",
    "content": [],
    "stopReason": "error",
    "errorMessage": "500 Internal Server Error",
}
DONE = {"role": "assistant", "content": [{"type": "text", "text": "ok"}], "stopReason": "stop"}


async def start_run(pi: FakePi) -> None:
    prompt = asyncio.create_task(pi.client.prompt("do it"))
    pi.reply(await pi.next_command())
    await prompt
    pi.state = state(streaming=True)
    pi.emit({"type": "agent_start"})


async def test_wait_idle_sees_through_auto_retry() -> None:
    pi = FakePi()
    await start_run(pi)
    waiting = asyncio.create_task(pi.client.wait_idle(timeout=5))

    # Attempt 1 fails; pi ends it with agent_end, then announces a retry. During
    # the back-off pi's agent is not streaming.
    pi.emit({"type": "message_end", "message": ERROR_500})
    pi.state = state(streaming=False)
    pi.emit({"type": "agent_end", "messages": [ERROR_500]})
    pi.emit(
        {
            "type": "auto_retry_start",
            "attempt": 1,
            "maxAttempts": 3,
            "delayMs": 100,
            "errorMessage": "500",
        }
    )
    await asyncio.sleep(0.2)
    assert not waiting.done(), "resolved during the retry back-off"

    # Attempt 2 succeeds.
    pi.state = state(streaming=True)
    pi.emit({"type": "agent_start"})
    pi.emit({"type": "message_end", "message": DONE})
    pi.emit({"type": "auto_retry_end", "success": True, "attempt": 1})
    await asyncio.sleep(0.05)
    assert not waiting.done()
    pi.state = state(streaming=False, messageCount=2)
    pi.emit({"type": "agent_end", "messages": [DONE]})

    final = await waiting
    assert final.is_streaming is False
    assert final.message_count == 2


async def test_wait_idle_rechecks_when_a_retry_is_announced_while_it_asks() -> None:
    pi = FakePi()
    await start_run(pi)
    pi.state = state(streaming=False)
    pi.emit({"type": "agent_end", "messages": [ERROR_500]})
    # pi writes auto_retry_start before it reads our get_state.
    pi.on_get_state = [{"type": "auto_retry_start", "attempt": 1, "maxAttempts": 3, "delayMs": 100}]

    waiting = asyncio.create_task(pi.client.wait_idle(timeout=5))
    await asyncio.sleep(0.05)
    assert not waiting.done()

    pi.state = state(streaming=True)
    pi.emit({"type": "agent_start"})
    pi.state = state(streaming=False)
    pi.emit({"type": "agent_end", "messages": [DONE]})
    await waiting


async def test_wait_idle_does_not_trust_agent_end_while_pi_still_streams() -> None:
    pi = FakePi()
    await start_run(pi)
    pi.emit({"type": "agent_end", "messages": [DONE]})  # state still says streaming

    waiting = asyncio.create_task(pi.client.wait_idle(timeout=5, poll_interval=0.05))
    await asyncio.sleep(0.15)
    assert not waiting.done()

    pi.state = state(streaming=False)
    assert (await waiting).is_streaming is False


async def test_wait_idle_waits_for_the_run_after_a_prompt_reply() -> None:
    """pi replies to prompt before agent_start; an immediate get_state may
    already say not streaming (pi's events lag its state)."""
    pi = FakePi()
    prompt = asyncio.create_task(pi.client.prompt("do it"))
    pi.reply(await pi.next_command())
    await prompt
    pi.state = state(streaming=False)

    waiting = asyncio.create_task(pi.client.wait_idle(timeout=5, settle=0.2))
    await asyncio.sleep(0.05)
    pi.emit({"type": "agent_start"})
    await asyncio.sleep(0.3)
    assert not waiting.done()

    pi.emit({"type": "agent_end", "messages": [DONE]})
    await waiting


async def test_wait_idle_returns_for_a_prompt_that_started_no_run() -> None:
    """An extension command (/name) is handled without agent_start/agent_end."""
    pi = FakePi()
    prompt = asyncio.create_task(pi.client.prompt("/session-name x"))
    pi.reply(await pi.next_command())
    await prompt
    pi.state = state(streaming=False)

    final = await pi.client.wait_idle(timeout=2, settle=0.05)

    assert final.is_streaming is False


async def test_wait_idle_sees_a_retry_agent_end_announces_and_ends_at_agent_settled() -> None:
    """pi 1.x: agent_end says willRetry before auto_retry_start is written; agent_settled
    says nothing more will start by itself."""
    pi = FakePi(restart_grace=5)
    await start_run(pi)
    waiting = asyncio.create_task(pi.client.wait_idle(timeout=5))
    pi.state = state(streaming=False)
    pi.emit({"type": "agent_end", "messages": [ERROR_500], "willRetry": True})
    await asyncio.sleep(0.2)
    assert not waiting.done(), "resolved although pi said it will retry"

    pi.emit({"type": "agent_settled", "aborted": False})
    assert (await asyncio.wait_for(waiting, 2)).is_streaming is False


async def test_a_prompt_pi_handled_without_a_run_needs_no_settle_wait() -> None:
    """disposition "handled" (an extension command consumed it): no run events follow."""
    pi = FakePi()
    prompt = asyncio.create_task(pi.client.prompt("/name x"))
    pi.reply(await pi.next_command(), {"disposition": "handled"})
    await prompt
    pi.state = state(streaming=False)

    final = await pi.client.wait_idle(timeout=2, settle=1.5)

    assert final.is_streaming is False
    assert [c["type"] for c in pi.sent] == ["prompt", "get_state"]  # no second look


async def test_wait_idle_treats_an_announced_but_never_started_retry_as_dropped() -> None:
    pi = FakePi(restart_grace=0.05)
    await start_run(pi)
    pi.state = state(streaming=False)
    pi.emit({"type": "agent_end", "messages": [ERROR_500]})
    pi.emit({"type": "auto_retry_start", "attempt": 1, "maxAttempts": 3, "delayMs": 50})

    started = asyncio.get_running_loop().time()
    await pi.client.wait_idle(timeout=2)

    assert asyncio.get_running_loop().time() - started >= 0.09


async def test_wait_idle_when_nothing_ever_ran_just_asks_pi() -> None:
    pi = FakePi()
    pi.state = state(streaming=False, messageCount=0)

    assert (await pi.client.wait_idle(timeout=1)).message_count == 0
    assert [c["type"] for c in pi.sent] == ["get_state"]


async def test_wait_idle_waits_out_a_compaction() -> None:
    pi = FakePi()
    pi.state = state(streaming=False)
    pi.emit({"type": "compaction_start", "reason": "threshold"})

    waiting = asyncio.create_task(pi.client.wait_idle(timeout=2))
    await asyncio.sleep(0.05)
    assert not waiting.done()

    pi.emit({"type": "compaction_end", "reason": "threshold", "aborted": False, "willRetry": False})
    await waiting


async def test_reset_after_pi_exit_makes_the_client_usable_for_the_next_pi() -> None:
    pi = FakePi()
    pi.emit({"type": "agent_start"})
    pi.dialog("select", req_id="old")
    stale = asyncio.create_task(pi.client.get_state())
    await pi.next_command()

    pi.client.connection_lost(RuntimeError("pi exited: code 1"))
    pi.client.reset()

    with pytest.raises(RpcConnectionLost):
        await stale
    assert pi.client.open_dialogs == {}
    assert not pi.client.closed
    pi.state = state(streaming=False)
    assert (await pi.client.wait_idle(timeout=1)).is_streaming is False


async def test_reset_of_a_live_client_fails_what_the_old_pi_owed() -> None:
    pi = FakePi()
    owed = asyncio.create_task(pi.client.abort())
    await pi.next_command()

    pi.client.reset("pi restarted by the supervisor")

    with pytest.raises(RpcConnectionLost, match="restarted"):
        await owed
    call = asyncio.create_task(pi.client.get_state(timeout=1))
    pi.reply(await pi.next_command(), state())
    assert (await call).session_id == "s1"


# --- a paused guest ---------------------------------------------------------
# The clocks are shortened (a 0.05 s reply timeout, a 3 s pause): a pause 60
# times the timeout, the ratio of an hour to pi's default 60 s.

PAUSE_TIMEOUT = 0.05
PAUSE = 3.0


async def test_a_run_paused_for_sixty_reply_timeouts_still_finishes() -> None:
    pi = FakePi(default_timeout=PAUSE_TIMEOUT)
    await start_run(pi)
    waiting = asyncio.create_task(
        pi.client.wait_idle(poll_interval=PAUSE_TIMEOUT, settle=PAUSE_TIMEOUT)
    )
    await asyncio.sleep(PAUSE_TIMEOUT)
    # The VM is frozen: pi can neither emit events nor answer get_state.
    pi.client.freeze()
    frozen_state, pi.state = pi.state, None
    await asyncio.sleep(PAUSE)
    assert not waiting.done(), waiting
    # Thaw: pi answers what reached it while frozen, and finishes the run.
    assert frozen_state is not None
    pi.client.thaw()
    pi.state = state(streaming=False)
    while not pi.commands.empty():
        cmd = pi.commands.get_nowait()
        assert cmd["type"] == "get_state", cmd
        pi.reply(cmd, frozen_state)
    pi.emit({"type": "agent_end", "messages": []})
    result = await asyncio.wait_for(waiting, 5)
    assert result.is_streaming is False


async def test_a_request_in_flight_when_the_vm_freezes_waits_for_the_thaw() -> None:
    pi = FakePi(default_timeout=PAUSE_TIMEOUT)
    asking = asyncio.create_task(pi.client.get_state())
    cmd = await pi.next_command()
    pi.client.freeze()
    await asyncio.sleep(PAUSE)
    assert not asking.done()
    pi.client.thaw()
    pi.reply(cmd, state())
    assert (await asyncio.wait_for(asking, 1)).is_streaming is False


async def test_after_the_thaw_the_reply_clock_runs_again() -> None:
    pi = FakePi(default_timeout=PAUSE_TIMEOUT)
    pi.client.freeze()
    asking = asyncio.create_task(pi.client.get_state())
    await pi.next_command()
    await asyncio.sleep(0.5)
    assert not asking.done()
    pi.client.thaw()
    try:
        await asyncio.wait_for(asking, 1)
    except Exception as exc:
        assert "no reply within" in str(exc)
    else:
        raise AssertionError("an unanswered request after the thaw must still time out")


async def test_losing_the_connection_while_frozen_still_fails_the_waiters() -> None:
    pi = FakePi(default_timeout=PAUSE_TIMEOUT)
    await start_run(pi)
    waiting = asyncio.create_task(pi.client.wait_idle(poll_interval=PAUSE_TIMEOUT))
    pi.client.freeze()
    await asyncio.sleep(0.1)
    pi.client.connection_lost(RuntimeError("the VM was killed"))
    try:
        await asyncio.wait_for(waiting, 1)
    except Exception as exc:
        assert "the VM was killed" in str(exc)
    else:
        raise AssertionError("wait_idle returned after the connection was lost")


async def test_the_line_tap_sees_every_line_parsed_once_before_anyone_acts_on_it() -> None:
    pi = FakePi()
    seen: list[tuple[bytes, object]] = []
    order: list[str] = []
    pi.client.set_line_tap(lambda raw, parsed: (seen.append((raw, parsed)), order.append("tap")))
    pi.client.add_listener(lambda item: order.append("listener"))
    asking = asyncio.create_task(pi.client.get_state())
    cmd = await pi.next_command()
    pi.emit({"type": "agent_start"})
    pi.client.feed_line(b"{not json")
    pi.reply(cmd, state())
    await asking
    assert [type(p).__name__ for _, p in seen] == ["dict", "MalformedLine", "dict"]
    assert seen[2][1]["type"] == "response"  # type: ignore[index]
    assert order[:2] == ["tap", "listener"]


async def test_a_flood_of_dialogs_is_bounded_and_the_excess_cancelled_at_once() -> None:
    from piwork.rpc.client import MAX_OPEN_DIALOGS

    async def never(_request: UiRequest) -> UiResponse | None:
        await asyncio.sleep(3600)
        return None

    pi = FakePi(ui_handler=never)
    for i in range(MAX_OPEN_DIALOGS + 500):
        pi.dialog("input", req_id=f"ui-{i}", title="?")
    assert len(pi.client.open_dialogs) == MAX_OPEN_DIALOGS
    assert len(pi.client._ui_tasks) == MAX_OPEN_DIALOGS
    refused = [await pi.next_ui_response() for _ in range(500)]
    assert all(r.get("cancelled") is True for r in refused)
    assert {r["id"] for r in refused} == {
        f"ui-{i}" for i in range(MAX_OPEN_DIALOGS, MAX_OPEN_DIALOGS + 500)
    }
    await pi.client.aclose()
