"""`piwork run` and `piwork resume`: a task, headless, in the terminal.

While a task runs in an interactive terminal, each line typed is sent to the
agent as a steer; `/follow TEXT` queues a follow-up, `/pause` and `/continue`
freeze and thaw the VM, `/stop` (or Ctrl-C) stops the task; a second Ctrl-C
forces. Questions from the agent and permission prompts are asked here too.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from piwork.cli.render import (
    permission_keys_line,
    permission_prompt_text,
    registry_offered,
    renderer_for,
)
from piwork.policy import Choice, describe_rules, needs_confirmation
from piwork.policy.request import PermissionRequest
from piwork.preview import PreviewChoice, PreviewQuestion
from piwork.proxy.egress import AllowNetError, normalize_allowed_domain
from piwork.runner import (
    DEFAULT_RESUME_PROMPT,
    AllowAsker,
    Asker,
    DenyAsker,
    RunRequest,
    TaskSession,
    Transport,
)
from piwork.textsafe import sanitize

PERMISSION_KEYS = {
    "y": Choice.ALLOW_ONCE,
    "a": Choice.ALWAYS_FOLDER,
    "e": Choice.ALWAYS_EVERYWHERE,
    "n": Choice.DENY,
    "r": Choice.ALLOW_REGISTRIES,  # only when the host offered it (registry_offered)
}


PREVIEW_KEYS = {"t": PreviewChoice.TASK, "a": PreviewChoice.FOLDER, "n": PreviewChoice.NEVER}
PREVIEW_KEYS_SHOWN = [(c, k) for k, c in PREVIEW_KEYS.items()]


class TerminalConsole:
    """The one reader of stdin: answers the current question, else controls the task.

    Questions take turns (:meth:`turn`): pi runs tool calls in parallel, so two
    prompts may be open at once; each is shown and answered on its own, in the
    order they came. A line typed while no question has the turn is a control
    (steer, /follow, /pause, /continue, /stop) and always gets a reaction.
    """

    def __init__(self) -> None:
        self.session: TaskSession | None = None
        self._pending: asyncio.Future[str | None] | None = None
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._reader_installed = False
        self._dispatcher: asyncio.Task[None] | None = None
        self._turn = asyncio.Lock()  # FIFO: one question owns the terminal at a time

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(sys.stdin.fileno(), self._on_readable)
        self._reader_installed = True
        self._dispatcher = asyncio.create_task(self._dispatch())

    def close(self) -> None:
        if self._reader_installed:
            asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
            self._reader_installed = False
        if self._dispatcher is not None:
            self._dispatcher.cancel()

    def _on_readable(self) -> None:
        line = sys.stdin.readline()
        if not line:  # EOF on the terminal: stop listening, keep the task going
            asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
            self._reader_installed = False
            self._lines.put_nowait(None)
            return
        self._lines.put_nowait(line.rstrip("\n"))

    async def _dispatch(self) -> None:
        while True:
            line = await self._lines.get()
            if self._pending is not None and not self._pending.done():
                self._pending.set_result(line)
                continue
            if line is None or not line.strip():
                continue
            if self.session is None:
                _say("the task is still starting; type again once it runs")
                continue
            await self._command(line.strip())

    async def _command(self, line: str) -> None:
        session = self.session
        assert session is not None
        try:
            if line == "/stop":
                _say("stopping the task…")
                await session.stop()
            elif line == "/pause":
                if session.paused:
                    _say("already paused; /continue to resume")
                    return
                await session.pause_vm()
                _say("paused (the VM is frozen); /continue to resume")
            elif line == "/continue":
                if not session.paused:
                    _say("not paused; nothing to continue")
                    return
                await session.resume_vm()
                _say("continued")
            elif line == "/follow" or line.startswith("/follow "):
                text = line.removeprefix("/follow").strip()
                if not text:
                    _say("/follow needs a message: /follow TEXT")
                    return
                await session.follow_up(text)
                _say("queued as a follow-up")
            elif line.startswith("/"):
                _say(
                    "commands: /stop /pause /continue /follow TEXT; any other line steers the agent"
                )
            elif session.paused:
                _say("paused: the agent cannot read a steer now; /continue first")
            else:
                await session.steer(line)
        except Exception as exc:
            _say(f"{line.split()[0]} failed: {exc}")

    def turn(self) -> asyncio.Lock:
        """Hold while showing one question and reading its answers (``async with``)."""
        return self._turn

    async def ask(self, prompt: str) -> str | None:
        """Show ``prompt`` and return the next line typed (call while holding :meth:`turn`)."""
        loop = asyncio.get_running_loop()
        self._pending = loop.create_future()
        sys.stderr.write(prompt)
        sys.stderr.flush()
        try:
            return await self._pending
        finally:
            self._pending = None


MAX_SHOWN_OPTIONS = 50


def _clip(text: str, limit: int = 2000) -> str:
    """What the guest sends is shown bounded: an absurd title cannot flood the terminal."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def _say(message: str) -> None:
    print(f"piwork: {message}", file=sys.stderr)


class TerminalAsker:
    def __init__(self, console: TerminalConsole) -> None:
        self.console = console

    async def permission(self, request: PermissionRequest) -> Choice | None:
        async with self.console.turn():
            return await self._permission(request)

    async def question(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> str | bool | None:
        async with self.console.turn():
            return await self._question(method, title, message, options)

    async def preview(self, question: PreviewQuestion) -> PreviewChoice | None:
        """A server in the VM: open it in the browser (this task, this folder) or never."""
        async with self.console.turn():
            print(f"\n\x1b[1m{sanitize(question.question)}\x1b[0m", file=sys.stderr)
            for choice, key in PREVIEW_KEYS_SHOWN:
                rule = question.rules[choice]
                print(f"  [{key}] {choice.value}: {sanitize(rule.human())}", file=sys.stderr)
            while True:
                answer = await self.console.ask("  [t/a/n] > ")
                if answer is None:
                    return None
                picked = PREVIEW_KEYS.get(answer.strip().lower()[:1])
                if picked is not None:
                    return picked

    async def _permission(self, request: PermissionRequest) -> Choice | None:
        print(permission_prompt_text(request), file=sys.stderr)
        while True:
            answer = await self.console.ask(permission_keys_line(request))
            if answer is None:
                return None
            choice = PERMISSION_KEYS.get(answer.strip().lower()[:1])
            if choice is None or (
                choice is Choice.ALLOW_REGISTRIES and not registry_offered(request)
            ):
                continue
            rules = request.proposals.get(choice, ())
            if choice is Choice.ALWAYS_EVERYWHERE and needs_confirmation(rules):
                print(
                    "  This stores a rule for EVERY task, in every folder:\n"
                    f"    {sanitize(describe_rules(rules))}",
                    file=sys.stderr,
                )
                confirm = await self.console.ask(
                    "  Type 'yes' to store it (anything else: back) > "
                )
                if confirm is None:
                    return None
                if confirm.strip().lower() != "yes":
                    continue
            return choice

    async def _question(
        self, method: str, title: str, message: str | None, options: list[str] | None
    ) -> str | bool | None:
        print(f"\n\x1b[1mThe agent asks:\x1b[0m {_clip(sanitize(title))}", file=sys.stderr)
        if message:
            print(f"  {_clip(sanitize(message))}", file=sys.stderr)
        if method == "confirm":
            answer = await self.console.ask("  [y/n] > ")
            return None if answer is None else answer.strip().lower().startswith("y")
        if options:
            for i, opt in enumerate(options[:MAX_SHOWN_OPTIONS], 1):
                print(f"  {i}. {_clip(sanitize(opt, one_line=True), 200)}", file=sys.stderr)
            if len(options) > MAX_SHOWN_OPTIONS:
                print(
                    f"  … {len(options) - MAX_SHOWN_OPTIONS} more (type a number)", file=sys.stderr
                )
            while True:
                answer = await self.console.ask("  number > ")
                if answer is None:
                    return None
                if answer.strip().isdigit() and 1 <= int(answer) <= len(options):
                    return options[int(answer) - 1]
        return await self.console.ask("  answer > ")


def _interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()


def _limit_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The limits the flags change; the runner merges them over the defaults
    (new task) or the task's own limits (resume), so the others are kept."""
    fields: dict[str, Any] = {}
    if args.max_turns is not None:
        fields["max_turns"] = args.max_turns
    if args.max_minutes is not None:
        fields["max_wall_time_seconds"] = args.max_minutes * 60
    if args.max_tokens is not None:
        fields["max_tokens"] = args.max_tokens
    if args.max_cost is not None:
        fields["max_cost_usd"] = args.max_cost
    return fields


def _allowed_domain(text: str) -> str:
    try:
        return normalize_allowed_domain(text)
    except AllowNetError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--allow-net ")) from None


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value

    return parse


async def _run(args: argparse.Namespace, req: RunRequest, prompt: str) -> int:
    sink = renderer_for(args.json)
    console: TerminalConsole | None = None
    asker: Asker
    if _interactive() or sys.stdin.isatty():
        # Whoever sits at a terminal can steer, pause and stop, with --yes or --json too.
        console = TerminalConsole()
    if args.yes:
        asker = AllowAsker()
    elif console is not None and _interactive() and not args.json:
        asker = TerminalAsker(console)
    else:
        asker = DenyAsker()
        if not args.policy:
            print(
                "piwork: no terminal to ask on: permission prompts the policy does not "
                "answer will be denied (use --yes or --policy FILE)",
                file=sys.stderr,
            )

    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    interrupts = 0
    session_box: dict[str, TaskSession] = {}
    background: set[asyncio.Task[None]] = set()

    def on_interrupt() -> None:
        nonlocal interrupts
        interrupts += 1
        session = session_box.get("s")
        if interrupts == 1 and session is not None and session.agent is not None:
            print("\npiwork: stopping the task… (Ctrl-C again to force)", file=sys.stderr)
            stopping = loop.create_task(session.stop())
            background.add(stopping)
            stopping.add_done_callback(background.discard)
        else:
            main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_interrupt)
    try:
        async with TaskSession(req, sink, asker, policy_file=args.policy) as session:
            session_box["s"] = session
            if console is not None:
                console.session = session
                console.start()
                print(
                    "piwork: type to steer the agent; /follow TEXT, /pause, /continue, "
                    "/stop (or Ctrl-C)",
                    file=sys.stderr,
                )
            outcome = await session.run_prompt(prompt)
            return outcome.exit_code
    except asyncio.CancelledError:
        print("piwork: forced stop; the VM was killed", file=sys.stderr)
        return 130
    finally:
        if console is not None:
            console.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _common_request(args: argparse.Namespace) -> RunRequest:
    return RunRequest(
        prompt=None,
        folder=Path(args.folder).expanduser() if getattr(args, "folder", None) else None,
        model=args.model,
        accel=args.accel,
        transport=Transport(args.transport),
        memory_mb=args.memory,
        cpus=args.cpus,
        allow_net=tuple(args.allow_net or ()),
        limit_overrides=_limit_overrides(args),
        assume_yes=args.yes,
        clean_env=bool(getattr(args, "clean_env", False)),
        host=getattr(args, "host", None),
    )


def _handle_errors(coro_factory: Any) -> int:
    """Errors reach ``piwork.cli.main``, which shows every one the same way."""
    return int(asyncio.run(coro_factory()))


def cmd_run(args: argparse.Namespace) -> int:
    req = _common_request(args)
    req.prompt = args.prompt
    req.title = args.title
    if req.model is None:
        from piwork.models.defaults import default_model

        req.model = default_model()  # settings' models.default, else the demo
    return _handle_errors(lambda: _run(args, req, args.prompt))


def cmd_resume(args: argparse.Namespace) -> int:
    req = _common_request(args)
    req.task_id = args.task
    prompt = args.prompt or DEFAULT_RESUME_PROMPT
    req.prompt = prompt
    return _handle_errors(lambda: _run(args, req, prompt))


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="PROVIDER/MODEL, or 'demo' for the offline demo model")
    p.add_argument("--json", action="store_true", help="one JSON event per line on stdout")
    p.add_argument("--accel", choices=["kvm", "hvf", "tcg"], help="override the accelerator probe")
    p.add_argument("--host", metavar="NAME", help="run the VM on this remote host (piwork hosts)")
    p.add_argument(
        "--transport",
        choices=[t.value for t in Transport],
        default="virtio",
        help="host<->guest channel (default: virtio-serial)",
    )
    p.add_argument("--memory", type=int, default=1024, help="guest memory in MiB (default 1024)")
    p.add_argument("--cpus", type=int, default=2, help="guest CPUs (default 2)")
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="allow every action the policy does not deny, without asking",
    )
    p.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="decide permissions from this policy file instead of yours",
    )
    p.add_argument(
        "--allow-net",
        nargs="+",
        type=_allowed_domain,
        metavar="DOMAIN",
        help="let the agent reach these domains (and their subdomains)",
    )
    # On `resume` these raise (or lower) the task's own limits; the others stay.
    p.add_argument("--max-turns", type=_positive(int), help="stop the task after this many turns")
    p.add_argument(
        "--max-minutes", type=_positive(float), help="stop the task after this much running time"
    )
    p.add_argument("--max-tokens", type=_positive(int), help="stop the task after this many tokens")
    p.add_argument(
        "--max-cost", type=_positive(float), metavar="USD", help="stop the task at this cost"
    )


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a task in a fresh VM",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prompt", help="what the agent should do")
    p.add_argument("--folder", "-f", help="the working folder (shared into the VM read-write)")
    p.add_argument("--title", help="task title (default: the prompt's first line)")
    p.add_argument(
        "--clean-env",
        action="store_true",
        help="start from the clean workbench, not the environment the folder's last task left",
    )
    _add_common(p)
    p.set_defaults(func=cmd_run)

    r = sub.add_parser(
        "resume",
        help="resume a task after any interruption",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("task", help="task id (a unique prefix is enough)")
    r.add_argument("prompt", nargs="?", help="a new message (default: continue where it stopped)")
    r.add_argument("--folder", "-f", help="bind a working folder (only if the task has none)")
    _add_common(r)
    r.set_defaults(func=cmd_resume)
