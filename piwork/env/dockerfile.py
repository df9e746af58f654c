"""The Dockerfile subset ``piwork env build`` reads: FROM, RUN, COPY, ENV, WORKDIR.

A project describes its environment in a file people already know how to
write (``piwork.Dockerfile``). Only what piwork can honour inside its own
trust boundary is accepted; every other instruction is refused with its
file:line and what to write instead, so nothing is silently ignored (a
``USER`` or ``ADD`` that quietly did nothing would build an environment other
than the one the file describes).

Parsing is pure: no file system but the Dockerfile itself. What ``COPY``
names is checked against the build folder when the build stages it
(:mod:`piwork.env.build`).

Semantics kept from Docker: comment lines (also inside a continuation), a
trailing backslash continues a line, keywords in any case, ``ENV`` in both
forms, ``$VAR``/``${VAR}``/``${VAR:-x}``/``${VAR:+x}`` expanded in ENV,
WORKDIR and COPY (never in RUN: its shell does that), quotes and
backslashes in ENV values, the JSON (exec) forms of RUN and COPY, a relative
WORKDIR taken from the previous one, ``/`` as the first WORKDIR, and COPY
wildcards (Go's ``filepath.Match``: ``*``, ``?``, ``[a-z]``, ``[^a-z]``) in a
source's last part, into a destination folder (ending in ``/``); a wildcard
elsewhere, an escape, an unusual class or a file destination is refused with
what to write instead.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from piwork.errors import UsageError

DEFAULT_NAMES = ("piwork.Dockerfile", "Dockerfile.piwork")
"""What ``piwork env build FOLDER`` looks for, in this order (``-f`` names another)."""
BASE_PIWORK = "piwork"
"""``FROM piwork``: the pack's Debian workbench, nothing installed over it."""
BASE_ENV: dict[str, str] = {
    "HOME": "/root",
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}
"""What ``$HOME``/``$PATH`` are in the workbench (runtime-pack/workbench/bash sets them)."""

LAYER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")

REFUSED: dict[str, str] = {
    "ADD": "use COPY for files from the build folder, or RUN curl/wget for a URL "
    "(it goes through the egress proxy and your network policy)",
    "ARG": "write the value into an ENV line or into the RUN command itself",
    "CMD": "piwork starts the agent, not a container command: remove it",
    "ENTRYPOINT": "piwork starts the agent, not a container command: remove it",
    "EXPOSE": "a server the agent starts is offered as a preview when it listens: remove it",
    "USER": "the agent runs as root inside the VM (docs/security.md): remove it, or run a "
    "step as another user with RUN runuser -u NAME -- COMMAND",
    "VOLUME": "the task's folders are shared into the VM by piwork: remove it",
    "LABEL": "labels are not kept: remove it (a # comment keeps the note)",
    "MAINTAINER": "remove it (a # comment keeps the note)",
    "HEALTHCHECK": "nothing runs a health check in piwork: remove it",
    "ONBUILD": "there are no child images to trigger: remove it",
    "STOPSIGNAL": "piwork stops the VM, not a container process: remove it",
    "SHELL": "RUN steps run under /bin/sh -c; write RUN bash -c '...' for bash",
}


class DockerfileError(UsageError, ValueError):
    """The file cannot be built as written; the message names file:line and the fix."""


@dataclass(frozen=True)
class Step:
    """One instruction, with the ENV and WORKDIR in force when it runs."""

    line: int
    kind: str
    """RUN, COPY, ENV or WORKDIR (FROM is :attr:`BuildFile.base`)."""
    text: str
    """The instruction as written (continuations joined), for messages and the log."""
    command: str = ""
    """RUN: the shell command (``/bin/sh -c``)."""
    sources: tuple[str, ...] = ()
    """COPY: paths inside the build folder (relative, normalized, never ``..``)."""
    dest: str = ""
    """COPY: the destination in the environment (absolute; ends with ``/`` for a folder)."""
    env: tuple[tuple[str, str], ...] = ()
    """The ENV set so far (the parent layer's first), in order."""
    workdir: str = "/"


@dataclass(frozen=True)
class BuildFile:
    path: Path
    base: str
    """``piwork``, a layer id or an imported image's id (``FROM``)."""
    base_line: int
    steps: tuple[Step, ...]
    env: tuple[tuple[str, str], ...] = ()
    """The ENV at the end (what tasks on the result get)."""
    workdir: str = "/"
    inherited_env: dict[str, str] = field(default_factory=dict)

    @property
    def runs(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "RUN"]

    @property
    def copies(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "COPY"]

    def canonical(self) -> list[object]:
        """What the build's cache key covers: the base and every step's meaning (no line
        numbers or comments: rewording a comment does not rebuild)."""
        return [
            ["FROM", self.base],
            *[
                [s.kind, s.command, list(s.sources), s.dest, s.workdir, list(s.env)]
                for s in self.steps
            ],
            ["END", list(self.env), self.workdir],
        ]


def find_file(folder: Path, name: str | None) -> Path:
    """The Dockerfile to build: ``name`` (relative to ``folder``), else the default names."""
    if name is not None:
        path = Path(name).expanduser()
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            raise DockerfileError(f"{path}: no such file")
        return path
    for candidate in DEFAULT_NAMES:
        if (folder / candidate).is_file():
            return folder / candidate
    raise DockerfileError(
        f"no {' or '.join(DEFAULT_NAMES)} in {folder}: write one (FROM piwork, then RUN, COPY, "
        "ENV, WORKDIR lines), or name it with -f FILE"
    )


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction text) with comments dropped and continuations joined."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue  # a comment, also between continued lines (as Docker does)
        if not current:
            if not stripped:
                continue
            start = number
        body = raw.rstrip()
        if body.endswith("\\"):
            current.append(body[:-1])
            continue
        current.append(raw)
        out.append((start, " ".join(part.strip() for part in current).strip()))
        current = []
    if current:
        joined = " ".join(part.strip() for part in current).strip()
        if joined:
            out.append((start, joined))
    return out


def expand(text: str, env: dict[str, str], where: str) -> str:
    """Docker's variable substitution (``$V``, ``${V}``, ``${V:-x}``, ``${V:+x}``)."""

    def sub(m: re.Match[str]) -> str:
        bare = m.group("bare")
        if bare is not None:
            return env.get(bare, "")
        inner = m.group("braced")
        for op in (":-", ":+"):
            if op in inner:
                name, word = inner.split(op, 1)
                if not ENV_NAME.fullmatch(name):
                    break
                value = env.get(name, "")
                return (value or word) if op == ":-" else (word if value else "")
        if not ENV_NAME.fullmatch(inner):
            raise DockerfileError(
                f"{where}: ${{{inner}}} is not a substitution piwork knows "
                "($V, ${V}, ${V:-default} or ${V:+alternative})"
            )
        return env.get(inner, "")

    return _VAR.sub(sub, text)


def split_words(text: str, env: dict[str, str], where: str) -> list[str]:
    """Words of an ENV/WORKDIR/COPY line: quotes and backslashes as in Docker, ``$V``
    expanded outside single quotes."""
    words: list[str] = []
    word: list[str] = []
    have = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            if have:
                words.append("".join(word))
                word, have = [], False
            i += 1
            continue
        have = True
        if ch == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise DockerfileError(f"{where}: a ' quote is not closed")
            word.append(text[i + 1 : end])
            i = end + 1
        elif ch == '"':
            i += 1
            chunk: list[str] = []
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$':
                    chunk.append("\x00" + text[i + 1] if text[i + 1] == "$" else text[i + 1])
                    i += 2
                    continue
                chunk.append(text[i])
                i += 1
            if i >= n:
                raise DockerfileError(f'{where}: a " quote is not closed')
            word.append(_expand_marked("".join(chunk), env, where))
            i += 1
        elif ch == "\\" and i + 1 < n:
            word.append(text[i + 1])
            i += 2
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "'\"\\":
                j += 1
            word.append(expand(text[i:j], env, where))
            i = j
    if have:
        words.append("".join(word))
    return words


def _expand_marked(text: str, env: dict[str, str], where: str) -> str:
    """Expand, leaving each ``\\$`` (marked with NUL) a literal dollar."""
    parts = text.split("\x00$")
    return "$".join(expand(p, env, where) for p in parts)


def _json_array(args: str) -> list[str] | None:
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except ValueError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _flags(args: str, where: str, kind: str, advice: str) -> None:
    if args.startswith("--"):
        flag = args.split()[0].split("=")[0]
        raise DockerfileError(f"{where}: {kind} {flag} is not supported; {advice}")


def _clean_source(src: str, where: str) -> str:
    if not src:
        raise DockerfileError(f"{where}: COPY has an empty source")
    p = PurePosixPath(src)
    if p.is_absolute():
        raise DockerfileError(
            f"{where}: COPY {src}: sources are paths inside the build folder (write it relative)"
        )
    if ".." in p.parts:
        raise DockerfileError(
            f"{where}: COPY {src}: '..' would leave the build folder; only files in it can be "
            "copied (move the file into the folder, or build from its parent)"
        )
    parts = [part for part in p.parts if part != "."]
    if is_pattern(src):
        if any(is_pattern(part) for part in parts[:-1]):
            raise DockerfileError(
                f"{where}: COPY {src}: a wildcard is supported in the last part of a source "
                "only (e.g. src/*.py); name the folders before it"
            )
        compile_pattern(parts[-1], f"{where}: COPY {src}")
    return "/".join(parts) or "."


WILDCARDS = "*?["


def is_pattern(src: str) -> bool:
    """A COPY source with a wildcard (Docker's Go ``filepath.Match`` syntax)."""
    return any(c in src for c in WILDCARDS)


@dataclass(frozen=True)
class CharClass:
    """``[abc]``, ``[a-z]``, ``[^a-z]``: single characters and inclusive ranges."""

    ranges: tuple[tuple[str, str], ...]
    negate: bool

    def matches(self, ch: str) -> bool:
        return any(lo <= ch <= hi for lo, hi in self.ranges) != self.negate


_ANY_ONE = "?"
_STAR = "*"
Token = str | CharClass
"""A literal character, ``_ANY_ONE``, ``_STAR`` or a :class:`CharClass` (a literal ``*`` or
``?`` cannot be written: escapes are refused, so the two markers never mean themselves)."""


@dataclass(frozen=True)
class Glob:
    """One path component's wildcard, matched without backtracking.

    A regex (``.*`` per ``*``) backtracks: ``*a*a*a*a*b`` against a long name took
    seconds, ~20x more per star (review 2, finding 10), on the host, before any VM.
    Here the name is read once, character by character, against the *set* of
    positions in the pattern it can be at (a Thompson simulation), so the work is at
    most ``len(name) x len(pattern)`` whatever the stars.
    """

    source: str
    tokens: tuple[Token, ...]

    def _closure(self, states: set[int]) -> set[int]:
        out = set(states)
        for i in sorted(states):
            while i < len(self.tokens) and self.tokens[i] == _STAR:
                i += 1
                out.add(i)
        return out

    def fullmatch(self, name: str) -> bool:
        tokens, end = self.tokens, len(self.tokens)
        states = self._closure({0})
        for ch in name:
            step: set[int] = set()
            for i in states:
                if i == end:
                    continue
                t = tokens[i]
                if isinstance(t, CharClass):
                    if t.matches(ch):
                        step.add(i + 1)
                elif t == _STAR:
                    step.add(i)  # the star takes this character and stays
                elif t in (_ANY_ONE, ch):
                    step.add(i + 1)
            if not step:
                return False
            states = self._closure(step)
        return end in states


def compile_pattern(name: str, where: str) -> Glob:
    """One path component's wildcard as Docker matches it: ``*`` any run of characters
    (dot files too), ``?`` one character, ``[abc]``/``[a-z]``/``[^a-z]`` a class. What
    would match differently in Python's fnmatch (``[!...]``) or is rarely meant (backslash
    escapes, empty or unclosed classes) is refused."""
    out: list[Token] = []
    i, n = 0, len(name)
    while i < n:
        c = name[i]
        if c == "\\":
            raise DockerfileError(
                f"{where}: escapes in a wildcard are not supported; name the file itself"
            )
        if c == "*":
            if not out or out[-1] != _STAR:  # a run of stars is one star
                out.append(_STAR)
        elif c == "?":
            out.append(_ANY_ONE)
        elif c == "[":
            end = name.find("]", i + 1)
            body = name[i + 1 : end] if end > 0 else ""
            negate = body.startswith("^")
            body = body[1:] if negate else body
            if end < 0 or not body or any(ch in body for ch in "[\\^!"):
                raise DockerfileError(
                    f"{where}: only simple classes ([abc], [a-z], [^a-z]) are supported in a "
                    "wildcard; name the files"
                )
            ranges: list[tuple[str, str]] = []
            j = 0
            while j < len(body):
                if j + 2 < len(body) and body[j + 1] == "-":
                    if body[j] > body[j + 2]:
                        raise DockerfileError(f"{where}: the range {body[j : j + 3]} is reversed")
                    ranges.append((body[j], body[j + 2]))
                    j += 3
                elif body[j] == "-":
                    raise DockerfileError(
                        f"{where}: a '-' in a wildcard class must join a range (a-z)"
                    )
                else:
                    ranges.append((body[j], body[j]))
                    j += 1
            out.append(CharClass(tuple(ranges), negate))
            i = end
        else:
            out.append(c)
        i += 1
    return Glob(name, tuple(out))


def _workdir(value: str, current: str) -> str:
    path = PurePosixPath(current) / value
    parts: list[str] = []
    for part in path.parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/" + "/".join(parts)


def parse(
    path: Path,
    text: str | None = None,
    inherited_env: dict[str, str] | None = None,
    inherited_workdir: str = "/",
) -> BuildFile:
    """Parse ``path`` (or ``text`` as if it were that file).

    ``inherited_env``/``inherited_workdir``: those of the ``FROM`` layer (a built
    one), for ``$V`` and for what the result keeps; the caller re-parses with them
    once it knows the base.
    """
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DockerfileError(f"{path}: not UTF-8 text ({exc.reason})") from exc
        except OSError as exc:
            raise DockerfileError(f"{path}: cannot read it: {exc.strerror}") from exc
    name = path.name
    head = [ln.strip() for ln in text.splitlines()[:5]]
    for number, line in enumerate(head, 1):
        if re.fullmatch(r"#\s*escape\s*=.*", line, re.IGNORECASE):
            raise DockerfileError(
                f"{name}:{number}: the escape directive is not supported; "
                "remove it and continue lines with a backslash"
            )
    env: dict[str, str] = dict(inherited_env or {})
    workdir = inherited_workdir
    base: str | None = None
    base_line = 0
    steps: list[Step] = []
    for number, line in logical_lines(text):
        where = f"{name}:{number}"
        keyword, _, args = line.partition(" ")
        kind = keyword.upper()
        args = args.strip()
        if kind in REFUSED:
            raise DockerfileError(
                f"{where}: {kind} is not supported by piwork env build; {REFUSED[kind]}"
            )
        if kind not in ("FROM", "RUN", "COPY", "ENV", "WORKDIR"):
            raise DockerfileError(
                f"{where}: {keyword!r} is not an instruction piwork env build knows "
                "(FROM, RUN, COPY, ENV, WORKDIR)"
            )
        if kind == "FROM":
            if base is not None:
                raise DockerfileError(
                    f"{where}: a second FROM (multi-stage builds) is not supported; "
                    "build one environment per file"
                )
            _flags(args, where, "FROM", "remove the flag")
            words = args.split()
            if len(words) != 1:
                raise DockerfileError(
                    f"{where}: write FROM piwork (the pack's Debian workbench), FROM LAYER-ID "
                    "(a layer from piwork env show) or FROM IMAGE-ID (from piwork env import); "
                    "'AS name' and other words are not supported"
                )
            ref = words[0]
            if ref.lower() == BASE_PIWORK or ref.lower().startswith(BASE_PIWORK + ":"):
                base = BASE_PIWORK
            elif LAYER_ID.fullmatch(ref) and ("-" in ref) and ":" not in ref and "/" not in ref:
                base = ref
            else:
                raise DockerfileError(
                    f"{where}: FROM {ref}: piwork builds on its own Debian workbench: write "
                    "FROM piwork, FROM LAYER-ID for a layer piwork built (piwork env show), or "
                    "FROM IMAGE-ID for an archive imported with piwork env import IMAGE.tar; "
                    "images from a registry are not pulled"
                )
            base_line = number
            continue
        if base is None:
            raise DockerfileError(f"{where}: the file must start with FROM piwork")
        if not args:
            raise DockerfileError(f"{where}: {kind} needs arguments")
        if kind == "RUN":
            _flags(args, where, "RUN", "network goes through piwork's egress proxy and policy")
            exec_form = _json_array(args)
            if args.startswith("<<"):
                raise DockerfileError(
                    f"{where}: RUN heredocs are not supported; put the script in a file and "
                    "COPY it, or continue lines with a backslash"
                )
            command = shlex.join(exec_form) if exec_form is not None else args
            if not command.strip():
                raise DockerfileError(f"{where}: RUN has an empty command")
            steps.append(
                Step(number, kind, line, command=command, env=tuple(env.items()), workdir=workdir)
            )
        elif kind == "COPY":
            _flags(
                args,
                where,
                "COPY",
                "files are copied as root with their modes kept; change them with a RUN line "
                "(chown, chmod) after the COPY",
            )
            exec_form = _json_array(args)
            words = exec_form if exec_form is not None else split_words(args, _lookup(env), where)
            if len(words) < 2:
                raise DockerfileError(f"{where}: COPY needs a source and a destination")
            *sources, dest = words
            cleaned = tuple(_clean_source(s, where) for s in sources)
            if any(map(is_pattern, cleaned)) and not (dest.endswith("/") or dest == "."):
                raise DockerfileError(
                    f"{where}: COPY {' '.join(sources)} {dest}: a wildcard copies into a "
                    f"folder: end the destination with / ({dest}/)"
                )
            folder_dest = dest.endswith("/") or len(cleaned) > 1
            target = _workdir(dest, workdir) if dest not in ("", ".") else workdir
            if folder_dest or dest in (".", "./"):
                target = target.rstrip("/") + "/"
            steps.append(
                Step(
                    number,
                    kind,
                    line,
                    sources=cleaned,
                    dest=target,
                    env=tuple(env.items()),
                    workdir=workdir,
                )
            )
        elif kind == "ENV":
            words = split_words(args, _lookup(env), where)
            pairs: list[tuple[str, str]] = []
            if words and "=" not in words[0]:
                # The old form: ENV NAME the rest of the line is the value.
                name_, _, rest = args.partition(" ")
                if not rest.strip():
                    raise DockerfileError(f"{where}: ENV {name_}: write NAME=VALUE")
                words = [name_, " ".join(split_words(rest.strip(), _lookup(env), where))]
                pairs.append((words[0], words[1]))
            else:
                for word in words:
                    key, eq, value = word.partition("=")
                    if not eq:
                        raise DockerfileError(
                            f"{where}: ENV {word}: write NAME=VALUE (quote a value with spaces)"
                        )
                    pairs.append((key, value))
            for key, value in pairs:
                if not ENV_NAME.fullmatch(key):
                    raise DockerfileError(
                        f"{where}: ENV {key!r} is not a variable name (letters, digits, _)"
                    )
                if "\n" in value or "\x00" in value:
                    raise DockerfileError(f"{where}: ENV {key}: a value cannot hold a newline")
                env.pop(key, None)
                env[key] = value
            steps.append(Step(number, kind, line, env=tuple(env.items()), workdir=workdir))
        else:  # WORKDIR
            # As in Docker, the rest of the line is the path (spaces and all).
            workdir = _workdir(" ".join(split_words(args, _lookup(env), where)), workdir)
            steps.append(Step(number, kind, line, env=tuple(env.items()), workdir=workdir))
    if base is None:
        raise DockerfileError(f"{name}: no FROM line; start the file with FROM piwork")
    return BuildFile(
        path, base, base_line, tuple(steps), tuple(env.items()), workdir, dict(inherited_env or {})
    )


def _lookup(env: dict[str, str]) -> dict[str, str]:
    return {**BASE_ENV, **env}


def env_script(
    env: tuple[tuple[str, str], ...] | dict[str, str],
    workdir: str,
    source: str = "the environment's file",
) -> str:
    """The file tasks' bash reads (``BASH_ENV``): the build's ENV, and WORKDIR as the place
    a shell outside the task's folders starts in.

    Sourced once per bash tool call (the marker stops nested shells from resetting
    what a script changed); values are literal (expanded at build time, as Docker does).
    """
    items = env.items() if isinstance(env, dict) else env
    lines = [
        f"# Written by piwork: the ENV and WORKDIR of {source}.",
        '[ -n "${PIWORK_BUILD_ENV-}" ] && return 0',
        "export PIWORK_BUILD_ENV=1",
        f"export PIWORK_WORKDIR={shlex.quote(workdir)}",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in items]
    wd = shlex.quote(workdir)
    lines.append(f'case "$PWD" in /mnt|/mnt/*) ;; *) cd {wd} 2>/dev/null || : ;; esac')
    return "\n".join(lines) + "\n"
