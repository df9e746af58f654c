"""The offline demo model: a scripted "LLM" so a first ``piwork run`` works
with no API key and no network.

It is not a model. It ignores what was asked and always walks through the
same short task in the working folder, so a newcomer sees every moving part
of piwork (tool calls, file changes, the one kind of question piwork asks,
streaming):

1. ``bash``: ``ls -la``
2. ``read``: one text file seen in the listing (skipped if there is none)
3. ``write``: a summary of what was found, ``PIWORK_DEMO.md``, in the folder.
   The agent writes its own copy of the folder; a new file is one piwork
   brings into the person's folder without a question (and can undo).
4. ``bash``: ``wc -l PIWORK_DEMO.md`` to check the file
5. ``bash``: tidy up: ``mv notes.txt notes.md`` (only when the folder has a
   ``notes.txt`` and no ``notes.md``: piwork's demo folders do). A move of the
   person's file is what piwork *asks* about, naming both paths, so a first run
   shows exactly one permission question; Deny keeps ``notes.txt`` where it was.
6. a final text message that says what happened and what piwork asked

Each reply says up front that it comes from the offline demo model. The step
is worked out from the conversation (which of those tool calls were already
made since the last user message), so retries, resumes and follow-up prompts
all behave: a new prompt starts a new demo run.

Run it standalone with ``python -m piwork.models.demo --port 8765``; the
first line printed is the base URL for pi's ``models.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from piwork.models.scripted import (
    ChatRequest,
    ScriptedModelServer,
    Step,
    Text,
    ToolCalls,
    ToolExchange,
    bash,
    pi_provider_config,
    read,
    write,
)

__all__ = [
    "DEMO_API_KEY",
    "DEMO_FILE",
    "DEMO_MODEL_ID",
    "DEMO_MODEL_NAME",
    "DEMO_PROVIDER",
    "demo_models_json",
    "demo_script",
    "demo_server",
    "main",
]

DEMO_PROVIDER = "piwork-demo"
DEMO_MODEL_ID = "demo"
DEMO_MODEL_NAME = "piwork demo model (offline, scripted — not a real LLM)"
# The demo server accepts any key; pi insists on one for custom providers.
DEMO_API_KEY = "piwork-demo-no-key-needed"
DEMO_FILE = "PIWORK_DEMO.md"

LIST_COMMAND = "ls -la"
WRITE_PATH = DEMO_FILE
CHECK_COMMAND = f"wc -l {DEMO_FILE}"
# The tidy-up: a rename of a file that was in the folder before the task, the kind
# of change piwork asks about. Only these names (piwork's demo folders have the
# first), so the demo never moves anything else of the person's.
TIDY_FROM = "notes.txt"
TIDY_TO = "notes.md"
TIDY_COMMAND = f"mv {TIDY_FROM} {TIDY_TO}"
# What pi's gate says back for a call that was denied or cancelled (never ran).
_NOT_RUN = ("permission denied", "was not run", "did not run", "was cancelled", "blocked")
READ_LINES = 20
# Pauses between streamed frames when a person is watching: long enough to
# see the text arrive piece by piece, short enough not to bore.
WATCHABLE_CHUNK_DELAY = 0.02

LABEL = "Offline demo model (scripted, not a real LLM):"

# Extensions the demo will not open: reading them shows nothing useful.
_BINARY_SUFFIX_WORDS = (
    "png jpg jpeg gif webp bmp ico tif tiff pdf zip gz tgz bz2 xz zst 7z rar tar jar "
    "exe dll so dylib o a class pyc whl deb rpm iso img qcow2 bin dat db sqlite mp3 "
    "mp4 m4a wav ogg flac avi mov mkv webm woff woff2 ttf otf"
)
_BINARY_SUFFIXES = frozenset(_BINARY_SUFFIX_WORDS.split())
_MAX_READ_BYTES = 256 * 1024


@dataclass(frozen=True)
class Entry:
    """One line of ``ls -la`` output."""

    name: str
    kind: str  # "file", "dir", "link" or "other"
    size: int | None


def parse_ls_la(output: str) -> list[Entry] | None:
    """Entries of ``ls -la`` output (GNU or busybox), without ``.`` and ``..``.

    None if the text does not look like a listing at all (e.g. the command
    was blocked), so the summary can say so instead of claiming "0 files".
    """
    entries: list[Entry] = []
    looks_like_listing = False
    for line in output.splitlines():
        if line.startswith("total "):
            looks_like_listing = True
            continue
        parts = line.split(None, 8)
        if len(parts) != 9 or len(parts[0]) < 10 or parts[0][0] not in "-dlcbps":
            continue
        looks_like_listing = True
        name = parts[8]
        kind = {"-": "file", "d": "dir", "l": "link"}.get(parts[0][0], "other")
        if kind == "link" and " -> " in name:
            name = name.split(" -> ", 1)[0]
        if name in (".", ".."):
            continue
        size = int(parts[4]) if parts[4].isdigit() else None
        entries.append(Entry(name, kind, size))
    return entries if looks_like_listing else None


def pick_file_to_read(entries: Sequence[Entry]) -> Entry | None:
    """A small file worth showing: a README first, then any non-binary file."""
    candidates = [
        e
        for e in entries
        if e.kind == "file"
        and e.name != DEMO_FILE
        and e.size is not None
        and 0 < e.size <= _MAX_READ_BYTES
        and e.name.rsplit(".", 1)[-1].lower() not in _BINARY_SUFFIXES
    ]
    for entry in candidates:
        if entry.name.lower().startswith("readme"):
            return entry
    return candidates[0] if candidates else None


def _find(exchanges: Sequence[ToolExchange], name: str, prefix: str = "") -> ToolExchange | None:
    """The first call of tool ``name`` whose main argument starts with ``prefix``."""
    for ex in exchanges:
        if ex.name != name:
            continue
        main = str(ex.arguments.get("command", ex.arguments.get("path", "")))
        if main.startswith(prefix):
            return ex
    return None


def _first_line(text: str, limit: int = 120) -> str:
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def _count(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"


def _quote_request(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def can_tidy(entries: Sequence[Entry] | None) -> bool:
    """The folder has a ``notes.txt`` file to rename and no ``notes.md`` in the way."""
    names = {e.name: e.kind for e in entries or []}
    return names.get(TIDY_FROM) == "file" and TIDY_TO not in names


def render_summary(
    entries: list[Entry] | None, listing: str, read_entry: Entry | None, read_result: str | None
) -> str:
    """The Markdown the demo writes to ``PIWORK_DEMO.md``."""
    lines = [
        "# piwork demo",
        "",
        f"Written by the {DEMO_MODEL_NAME}.",
        "It ran `ls -la` in this folder and wrote down what it saw.",
        "",
    ]
    if entries is None:
        lines += ["The folder could not be listed. The command said:", ""]
        lines += ["    " + (_first_line(listing) or "(nothing)"), ""]
    else:
        files = [e for e in entries if e.kind == "file"]
        dirs = [e for e in entries if e.kind == "dir"]
        others = len(entries) - len(files) - len(dirs)
        lines.append(
            f"The folder has {_count(len(entries), 'entry', 'entries')}: "
            f"{_count(len(files), 'file')}, {_count(len(dirs), 'folder')}, {others} other."
        )
        lines.append("")
        for e in entries:
            if e.kind == "dir":
                lines.append(f"- `{e.name}/` (folder)")
            elif e.kind == "file":
                note = " (from an earlier demo run)" if e.name == DEMO_FILE else ""
                lines.append(f"- `{e.name}` ({e.size} bytes){note}")
            else:
                lines.append(f"- `{e.name}` ({e.kind})")
        if not entries:
            lines.append("(The folder is empty.)")
        lines.append("")
    if read_entry is not None:
        first = _first_line(read_result or "")
        lines.append(f"It read `{read_entry.name}`; its first line is:")
        lines += ["", f"> {first}" if first else "> (empty)", ""]
    if can_tidy(entries):
        lines.append(
            f"Next it renames `{TIDY_FROM}` to `{TIDY_TO}`: piwork asks you before it moves "
            "a file of yours."
        )
    else:
        lines.append("Nothing else in this folder was changed.")
    lines.append("Delete this file whenever you like.")
    return "\n".join(lines) + "\n"


def demo_script(request: ChatRequest) -> Step:
    """The demo's next step for this conversation (a step function)."""
    done = request.tool_exchanges()
    listed = _find(done, "bash", LIST_COMMAND)
    wrote = _find(done, "write", WRITE_PATH)
    checked = _find(done, "bash", CHECK_COMMAND)
    tidied = _find(done, "bash", TIDY_COMMAND)

    if listed is None:
        asked = _quote_request(request.last_user_text)
        intro = (
            f"Hello! I am the piwork offline demo model: a script, not a real LLM, so I "
            f"cannot act on your request{f' ({asked!r})' if asked else ''}. Instead I will "
            f"show what piwork does: look at the working folder, read a file, write a "
            f"short summary, {DEMO_FILE}, into it (piwork brings a new file in without a "
            f"question, and you can undo it), and tidy up by renaming {TIDY_FROM} if there "
            "is one (piwork asks you before a move of your files). "
            "First, the folder listing."
        )
        return ToolCalls([bash(LIST_COMMAND)], text=intro)

    listing = listed.result or ""
    entries = parse_ls_la(listing)
    to_read = pick_file_to_read(entries or [])
    if to_read is not None and wrote is None and _find(done, "read") is None:
        count = _count(len(entries), "entry", "entries") if entries is not None else "a listing"
        return ToolCalls(
            [read(to_read.name, limit=READ_LINES)],
            text=f"{LABEL} I see {count}. Let me read `{to_read.name}`.",
        )

    if wrote is None:
        read_ex = _find(done, "read")
        summary = render_summary(
            entries, listing, to_read if read_ex else None, read_ex.result if read_ex else None
        )
        return ToolCalls(
            [write(WRITE_PATH, summary)],
            text=(
                f"{LABEL} I write a short summary, {DEMO_FILE}. I work on my own copy of "
                "your folder; piwork brings a new file into yours without a question, and "
                "can undo it."
            ),
        )

    if checked is None:
        return ToolCalls(
            [bash(CHECK_COMMAND)],
            text=f"{LABEL} Let me check that the file is there.",
        )

    check = _first_line(checked.result or "")
    words = check.split()
    if words and words[0].isdigit():
        verdict = f"it has {_count(int(words[0]), 'line')}"
    else:
        verdict = f"`{CHECK_COMMAND}` said: {check or '(no output)'}"
    looked = _count(len(entries), "entry", "entries") if entries is not None else "the folder"
    wrote_it = f"{LABEL} Done. I looked at {looked}, wrote {DEMO_FILE} and checked it: {verdict}."
    real = "To have pi do real work, connect a real model in piwork."

    if can_tidy(entries) and tidied is None:
        return ToolCalls(
            [bash(TIDY_COMMAND)],
            text=(
                f"{LABEL} Now I tidy up: I rename {TIDY_FROM} to {TIDY_TO}. A move of a "
                "file of yours is something piwork asks you about before it happens in "
                "your folder."
            ),
        )
    if tidied is None:
        return Text(f"{wrote_it} piwork brought it into your folder; Undo takes it back. {real}")

    outcome = (tidied.result or "").strip()
    if any(word in outcome.lower() for word in _NOT_RUN):
        return Text(f"{wrote_it} The rename of {TIDY_FROM} was refused, so it did not run. {real}")
    if outcome and outcome != "(no output)":
        return Text(f"{wrote_it} The rename of {TIDY_FROM} failed: {_first_line(outcome)} {real}")
    return Text(
        f"{wrote_it} Then I renamed {TIDY_FROM} to {TIDY_TO} in my copy. piwork brought "
        f"{DEMO_FILE} into your folder without a question and asked you about the rename: "
        f"if you said yes it is {TIDY_TO} now; if you said no, your {TIDY_FROM} is as it "
        f"was. Each change can be undone (Turns, or `piwork undo`). {real}"
    )


def demo_models_json(base_url: str, *, api_key: str = DEMO_API_KEY) -> dict[str, Any]:
    """A complete pi ``models.json`` with only the demo provider."""
    provider = pi_provider_config(base_url, DEMO_MODEL_ID, DEMO_MODEL_NAME, api_key=api_key)
    return {"providers": {DEMO_PROVIDER: provider}}


def demo_server(
    *, host: str = "127.0.0.1", port: int = 0, chunk_delay: float = 0.0
) -> ScriptedModelServer:
    """A :class:`ScriptedModelServer` playing the demo model (not started)."""
    return ScriptedModelServer(
        demo_script,
        model_id=DEMO_MODEL_ID,
        model_name=DEMO_MODEL_NAME,
        host=host,
        port=port,
        chunk_delay=chunk_delay,
    )


async def _serve_forever(server: ScriptedModelServer) -> None:
    async with server:
        print(server.base_url, flush=True)
        print(
            f"{DEMO_MODEL_NAME} listening; provider {DEMO_PROVIDER!r}, model "
            f"{DEMO_MODEL_ID!r}. Ctrl-C to stop.",
            file=sys.stderr,
            flush=True,
        )
        await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m piwork.models.demo",
        description=f"Serve the {DEMO_MODEL_NAME} on an OpenAI-compatible endpoint.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--chunk-delay",
        type=float,
        default=WATCHABLE_CHUNK_DELAY,
        help="seconds between streamed frames (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    server = demo_server(host=args.host, port=args.port, chunk_delay=args.chunk_delay)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(server))
    return 0


if __name__ == "__main__":
    sys.exit(main())
