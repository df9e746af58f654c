"""Property test: what the gate lets run without a question does only what it says, under
busybox sh and bash: a read changes nothing, a write in scope changes only the paths named.

The review's holes (issue 17) were found by hand; others like them are
likely. Hypothesis builds shell command lines from a grammar of the
constructs where the classifier and a shell can disagree: read-only commands
with options (the ones that take arguments included), quotes, unquoted
expansions of variables holding hostile values (`1 -o a.txt`,
`a[$(touch PWNED)]`, `-k`), prefix assignments, pipes, `;`/`&&`/`||`,
subshells, loops, redirections (to /dev/fd/N too), `$( )`, backquotes,
heredocs, CR, comments and wrappers (timeout, env, nice, xargs), and writes
after ways of moving the shell (or seeming to: subshells, pipelines, eval,
wrappers, pushd). Each line the classifier calls an auto-allowed read, or a
write in scope (which the host's default rules allow), is run under busybox
``sh -c`` and ``bash -c`` in a scratch folder beside a second folder: a read
must change nothing, a write only the paths the gate named.

Safety (this executes generated commands on the host): the grammar's words
only name files inside the scratch folder (relative names, no `..`, no
absolute paths) and its hostile payloads only `touch`, `rm` or overwrite
those files; every run is contained as tests/helpers/shell_sandbox.py
describes: as ``nobody`` through setpriv (when root), an empty environment,
a PATH of symlinks to a fixed list of tools, HOME not writable, stdin empty,
and the process group killed after a short timeout. Bounded: 300 examples.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.helpers.shell_sandbox import Classifier, Sandbox, changed_paths

FILES = ["a.txt", "b.txt", "src", "src/keep.c", "list", "'a.txt'", '"b.txt"', "*.txt", "src/*"]

# What a hostile model puts in a variable before expanding it unquoted.
PAYLOADS = [
    "1 -o a.txt",
    "0 a.txt",
    "-o a.txt",
    "a.txt -exec rm {} ;",
    "x -f evil.awk",
    ", -f evil.awk",
    "1 touch PWNED",
    "X touch PWNED",
    "a[$(touch PWNED)]",
    "$(touch PWNED)",
    "-k",
    "--output=a.txt",
    "-f evil.sed",
    "; touch PWNED",
    "-delete",
    "*",
]

VAR_USES = [
    "$x",
    '"$x"',
    "${x}",
    "a$x",
    "$((x))",
    "$(($x))",
    "${y[x]}",
    "${x@P}",
    "${!x}",
    "${x:-b.txt}",
    "${z:x}",
    "$[x]",
]

# Read-only commands (and a few that are not) with the option words they take.
COMMANDS: dict[str, list[str]] = {
    "ls": ["-l", "-a", "-1", "-R", "-I"],
    "cat": ["-n", "-A"],
    "head": ["-n", "1", "-c", "3"],
    "tail": ["-n", "1", "-c", "2"],
    "wc": ["-l", "-c", "-w"],
    "sort": ["-r", "-n", "-u", "-k", "1", "-t", ",", "-o"],
    "uniq": ["-c", "-f", "-w", "1", "-d"],
    "grep": ["-n", "-i", "-r", "-e", "a", "-v", "-f"],
    "find": [".", "-name", "'*.c'", "-type", "f", "-print", "-maxdepth", "1", "-exec", "-delete"],
    "sed": ["-n", "p", "1d", "s/a/b/", "-e", "-i", "'1e touch PWNED'", "'w out'", "-f"],
    "awk": ["-F", ",", "-v", "a=1", "'{print}'", "-f", "evil.awk"],
    "cut": ["-d", ",", "-f", "1"],
    "tr": ["a-z", "A-Z", "-d", "a"],
    "echo": ["hello", "-n", "-e"],
    "printf": ["'%s\\n'", "-v", "x"],
    "test": ["-f", "-v", "-n", "=", "!"],
    "[": ["-f", "-v", "-n", "=", "!", "]"],
    "[[": ["-n", "-eq", "0", "-v", "]]"],
    "true": [],
    ":": [],
    "set": ["-e", "-k", "-o", "keyword", "pipefail", "--", "-x", "-u"],
    "declare": ["-i", "-a", "y=x", "y=1"],
    "export": ["y=1", "y=$x"],
    "unset": ["y", "PATH", "-v", "'a[$(touch PWNED)]'"],
    "let": ["y=x", "y=1"],
    "xargs": ["-n", "1", "echo", "cat", "rm"],
    "tar": ["-cf", "o.tar", "-xf", "--to-command=touch\\ PWNED", "."],
    "git": ["status", "log", "-c", "core.pager=touch\\ PWNED", "config", "diff"],
    "date": ["+%s", "-u"],
    "stat": ["-c", "%s"],
    "basename": ["a/b"],
}
COMMENTS = ["touch PWNED", ")", ")\ntouch PWNED"]
HEREDOC_LINES = ["$x", "$(touch PWNED)", "${y[x]}", "a.txt"]
CR_TAILS = ["", "\r#; touch PWNED", "\r\ntouch PWNED"]
REDIRECTS = ["", "", "", " < a.txt", " 2>/dev/null", " > /dev/fd/0", " > /dev/fd/3", " >&2"]
REDIRECTS += [" > /dev/stdout", " <<< $x", " < a.txt > /dev/stderr"]
WRAPPERS = ["", "", "", "timeout 1 ", "env ", "nice ", "nohup ", "env a=1 ", "timeout -s TERM 1 "]


@st.composite
def word(draw: st.DrawFn, opts: list[str]) -> str:
    kind = draw(st.sampled_from(["opt", "opt", "file", "file", "var", "sub", "payload"]))
    if kind == "opt" and opts:
        return draw(st.sampled_from(opts))
    if kind == "var":
        return draw(st.sampled_from(VAR_USES))
    if kind == "sub":
        inner = draw(st.sampled_from(["echo a.txt", "touch PWNED", "echo a #)", "cat a.txt"]))
        return draw(st.sampled_from([f"$({inner})", f"`{inner}`", f'"$({inner})"']))
    if kind == "payload":
        return "'" + draw(st.sampled_from(PAYLOADS)) + "'"
    return draw(st.sampled_from(FILES))


# Commands the gate labels `write`: auto-allowed by the host when in scope.
WRITES = [
    "echo x > out.txt",
    "cat a.txt >> b.txt",
    "cp a.txt c.txt",
    "touch new.txt",
    "mkdir -p d/e",
    "sort -o s.txt a.txt",
    "tee t.txt < a.txt",
    "ln -s a.txt l",
    "tar -cf o.tar src",
    "sed -i s/a/b/ a.txt",
    "cp * d",
    "tar -xf links.tar && echo x > link/f",
    "tar xf links.tar; touch link/g",
    "tar --file=../outside/o.tar -c src",
    "tar -xf links.tar --directory=../outside",
    "cp --target-directory=../outside a.txt",
    "cp -t../outside a.txt",
    "cp --target-directory=src a.txt",
]
# Ways to move the shell, or to seem to: the gate must know where a write lands.
CDS = [
    "cd ../outside; ",
    "(cd ../outside); ",
    "cd ../outside | true; ",
    "cd ../outside & ",
    "cd src; ",
    "(cd src && ls); ",
    "cd ../outside; (cd ../work); ",
    "cd ../outside; nice cd ../work; ",
    "cd ../outside; eval cd ../work; ",
    "pushd ../outside; pushd ../work; pushd +1; ",
    "cd ../outside; { cd ../work; } | cat; ",
    "cd ../outside; false && cd ../work; ",
    "cd ../outside; cd ../work/missing; ",
    "cd ../outside; true || cd ../work && ",
    ": || cd src; ",
]


@st.composite
def simple_command(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from(CDS)) + draw(st.sampled_from(WRITES))
    name = draw(st.sampled_from(sorted(COMMANDS)))
    words = draw(st.lists(word(COMMANDS[name]), max_size=4))
    prefix = draw(st.sampled_from(["", "", "", "a=1 ", "LC_ALL=C ", "y=$x ", "exec 3<a.txt; "]))
    redirect = draw(st.sampled_from(REDIRECTS))
    return prefix + draw(st.sampled_from(WRAPPERS)) + " ".join([name, *words]) + redirect


@st.composite
def loop(draw: st.DrawFn) -> str:
    var = draw(st.sampled_from(["f", "x", "PATH", "IFS"]))
    items = " ".join(draw(st.lists(word([]), min_size=1, max_size=2)))
    kw = draw(st.sampled_from(["for", "for", "select"]))
    return f"{kw} {var} in {items}; do {draw(simple_command())}; done"


@st.composite
def command_list(draw: st.DrawFn, depth: int = 0) -> str:
    parts = [draw(st.one_of(simple_command(), simple_command(), loop()))]
    for _ in range(draw(st.integers(0, 2))):
        sep = draw(st.sampled_from([" | ", "; ", " && ", " || ", "\n"]))
        if depth < 1 and draw(st.booleans()):
            inner = draw(command_list(depth + 1))
            form = draw(st.sampled_from(["( {} )", "{{ {}; }}", "echo $({})", 'echo "$({})"']))
            parts.append(sep + form.format(inner))
        else:
            parts.append(sep + draw(simple_command()))
    return "".join(parts)


@st.composite
def command_line(draw: st.DrawFn) -> str:
    body = draw(command_list())
    if draw(st.booleans()):
        body = f"x='{draw(st.sampled_from(PAYLOADS))}'; {body}"
    shape = draw(st.sampled_from(["plain", "plain", "heredoc", "qheredoc", "comment", "cr"]))
    if shape == "heredoc":
        line = draw(st.sampled_from(HEREDOC_LINES))
        body = f"cat <<E\n{line}\nE\n{body}"
    elif shape == "qheredoc":
        body = f"cat <<'E'\n$(touch PWNED)\nE\n{body}"
    elif shape == "comment":
        tail = draw(st.sampled_from(COMMENTS))
        body = f"{body} # {tail}"
    elif shape == "cr":
        # a CR somewhere a blank was: the shells keep it in the word
        blanks = [i for i, c in enumerate(body) if c == " "]
        if blanks:
            i = draw(st.sampled_from(blanks))
            body = body[:i] + "\r" + body[i + 1 :]
        body = body + draw(st.sampled_from(CR_TAILS))
    return body


def covered(changed: Path, named: list[Path], scope: Path) -> bool:
    """Is a change one of the writes the gate named: the path, something under it,
    or a folder on the way to it inside the scope (``mkdir -p d/e`` makes ``d``)?"""
    return any(
        changed == w or w in changed.parents or (changed in w.parents and scope in changed.parents)
        for w in named
    )


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    base = Path(tempfile.mkdtemp(prefix="piwork-gate-fuzz-"))
    try:
        yield Sandbox(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def classifier(sandbox: Sandbox) -> Iterator[Classifier]:
    c = Classifier(sandbox.scratch)
    try:
        yield c
    finally:
        c.close()


def test_generated_reads_change_nothing_and_writes_only_what_they_name_in_both_shells(
    sandbox: Sandbox, classifier: Classifier
) -> None:
    reads: list[str] = []
    writes: list[str] = []

    # Lines a run of this test once found classified as reads that changed
    # files are pinned here as explicit examples.
    @settings(
        max_examples=300,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(command_line())
    @example("x='1 -o a.txt'; sort -k $x b.txt")
    @example("ls\r#; touch PWNED")
    @example("x='a[$(touch PWNED)]'; echo $((x))")
    @example("set -k; env a=1 ls y=1")
    @example("for PATH in .; do ls; done")
    @example("unset PATH; ls")
    @example("echo x < a.txt > /dev/fd/0")
    @example("tar -xf links.tar && echo x > link/f")
    @example("cd ../outside; (cd ../work); echo x > out.txt")
    @example(": || cd src; echo x > out.txt")
    @example("x='1\r-o a.txt'; : | : >&2\r#; touch PWNED")
    @example("ls >&2\r#")
    @example(
        "for f in a.txt; do cd src; echo x > out.txt; done; cd ../outside; (cd ../work); "
        "cat a.txt >> b.txt"
    )
    @example("for f in $x; do cd src; done; echo x > out.txt")
    @example("uniq *.txt")
    @example("if false; then cd src; fi; echo x > ../outside/out.txt")
    def prop(command: str) -> None:
        verdict = classifier.classify(command, sandbox.scratch)
        if verdict["needsDecision"] and not verdict["autoAllowed"]:
            return  # the person is asked
        # reads change nothing; writes in scope (allowed by the host's default
        # rules) change only the paths the gate named
        listed = verdict["writes"]
        assert isinstance(listed, list)
        named = [Path(str(p)) for p in listed if p] if verdict["needsDecision"] else []
        if not verdict["needsDecision"]:
            reads.append(command)
        else:
            writes.append(command)
        for shell in ("busybox", "bash"):
            out = sandbox.run(shell, command, timeout=1.5)
            stray = [
                p for p in changed_paths(sandbox, out) if not covered(p, named, sandbox.scratch)
            ]
            assert not stray, (
                f"{shell} changed {stray} running {command!r}, which the gate judged "
                f"{'a read' if not named else 'a write of ' + str(named)} ({out.output[:300]!r})"
            )

    prop()
    print(
        f"{len(reads)} generated lines were classified as reads and {len(writes)} as writes "
        "in scope; all ran under both shells"
    )
    # a grammar that never yields a read (or an auto-allowed write) would test nothing
    assert len(reads) >= 10, reads
    assert len(writes) >= 2, writes
