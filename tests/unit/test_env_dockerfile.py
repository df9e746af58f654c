"""The Dockerfile subset of ``piwork env build``: what it accepts, what it refuses and why,
and how COPY sources are staged (never through a symlink out of the build folder)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from piwork.env.build import (
    ContextError,
    cache_key,
    copy_script,
    finish_script,
    run_script,
    stage_context,
)
from piwork.env.dockerfile import REFUSED, DockerfileError, env_script, find_file, parse

F = Path("/proj/piwork.Dockerfile")


def p(text: str, **kw: object) -> object:
    return parse(F, text, **kw)  # type: ignore[arg-type]


def test_the_supported_instructions_with_continuations_and_comments() -> None:
    bf = parse(
        F,
        "# syntax=docker/dockerfile:1\n"
        "from piwork\n"
        "ENV A=1 B='two words' C=\"x $A\"\n"
        "RUN echo one && \\\n"
        "# a comment inside the continuation\n"
        "    echo two\n"
        "\n"
        "WORKDIR /app\n"
        "COPY src/ tool.sh ./\n"
        "WORKDIR sub\n"
        'RUN ["printf", "%s\\n", "a b"]\n'
        "ENV PATH=/opt/x/bin:$PATH HOME_COPY=${HOME} D=${UNSET:-dflt} E=${A:+set}\n"
        "ENV OLD form with spaces\n",
    )
    assert bf.base == "piwork" and bf.base_line == 2
    kinds = [(s.line, s.kind) for s in bf.steps]
    assert kinds == [
        (3, "ENV"), (4, "RUN"), (8, "WORKDIR"), (9, "COPY"), (10, "WORKDIR"), (11, "RUN"),
        (12, "ENV"), (13, "ENV"),
    ]  # fmt: skip
    run = bf.steps[1]
    assert run.command.split() == ["echo", "one", "&&", "echo", "two"]
    # As in Docker, $A is the value from before this ENV line (none yet).
    assert dict(run.env) == {"A": "1", "B": "two words", "C": "x "}
    copy = bf.steps[3]
    assert copy.sources == ("src", "tool.sh") and copy.dest == "/app/"
    assert bf.steps[5].workdir == "/app/sub"
    assert bf.steps[5].command == "printf '%s\n' 'a b'"  # JSON's \\n is a newline
    env = dict(bf.env)
    assert env["PATH"] == "/opt/x/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["HOME_COPY"] == "/root" and env["D"] == "dflt" and env["E"] == "set"
    assert env["OLD"] == "form with spaces"
    assert bf.workdir == "/app/sub"


def test_quotes_and_escapes_in_env() -> None:
    bf = parse(F, "FROM piwork\nENV A=x B='$A' C=\"\\$A\" D=\\$A E=a\\ b\n")
    assert dict(bf.env) == {"A": "x", "B": "$A", "C": "$A", "D": "$A", "E": "a b"}


@pytest.mark.parametrize("keyword", sorted(REFUSED))
def test_every_other_docker_instruction_is_refused_with_its_line_and_what_to_do(
    keyword: str,
) -> None:
    with pytest.raises(DockerfileError) as exc:
        parse(F, f"FROM piwork\nRUN true\n{keyword.lower()} something here\n")
    message = str(exc.value)
    assert message.startswith(f"piwork.Dockerfile:3: {keyword} is not supported")
    assert REFUSED[keyword] in message


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("FROM piwork\nFROBNICATE x\n", "piwork.Dockerfile:2: 'FROBNICATE' is not an instruction"),
        ("RUN true\n", "piwork.Dockerfile:1: the file must start with FROM piwork"),
        ("# only a comment\n", "no FROM line"),
        ("FROM debian:bookworm\n", "FROM debian:bookworm: piwork builds on its own"),
        ("FROM ubuntu\n", "FROM ubuntu: piwork builds on its own"),
        ("FROM piwork AS base\n", "'AS name' and other words are not supported"),
        ("FROM --platform=linux/arm64 piwork\n", "FROM --platform is not supported"),
        ("FROM piwork\nFROM piwork\n", "piwork.Dockerfile:2: a second FROM"),
        ("FROM piwork\nRUN --network=none true\n", "RUN --network is not supported"),
        ("FROM piwork\nRUN --mount=type=cache,target=/x true\n", "RUN --mount is not supported"),
        ("FROM piwork\nRUN <<EOF\n", "RUN heredocs are not supported"),
        ("FROM piwork\nCOPY --chown=1:1 a /b\n", "COPY --chown is not supported"),
        ("FROM piwork\nCOPY --from=x a /b\n", "COPY --from is not supported"),
        ("FROM piwork\nCOPY a\n", "COPY needs a source and a destination"),
        ("FROM piwork\nCOPY /etc/passwd /x\n", "sources are paths inside the build folder"),
        ("FROM piwork\nCOPY ../secret /x\n", "'..' would leave the build folder"),
        ("FROM piwork\nCOPY a/../../b /x\n", "'..' would leave the build folder"),
        ("FROM piwork\nCOPY */x.py /x/\n", "a wildcard is supported in the last part"),
        ("FROM piwork\nCOPY *.py /x\n", "a wildcard copies into a folder: end the destination"),
        ("FROM piwork\nCOPY a.txt *.py /x\n", "end the destination with / (/x/)"),
        ("FROM piwork\nCOPY [!a].py /x/\n", "only simple classes"),
        ("FROM piwork\nCOPY [a-].py /x/\n", "must join a range"),
        ("FROM piwork\nCOPY [z-a].py /x/\n", "the range z-a is reversed"),
        ("FROM piwork\nCOPY [ab.py /x/\n", "only simple classes"),
        ("FROM piwork\nCOPY []a].py /x/\n", "only simple classes"),
        ('FROM piwork\nCOPY ["a\\\\*.py", "/x/"]\n', "escapes in a wildcard are not supported"),
        ("FROM piwork\nENV 1BAD=x\n", "is not a variable name"),
        ("FROM piwork\nENV NOVALUE\n", "ENV NOVALUE"),
        ("FROM piwork\nENV A='open\n", "quote is not closed"),
        ("FROM piwork\nENV A=${B/x/y}\n", "is not a substitution piwork knows"),
        ("FROM piwork\nRUN\n", "RUN needs arguments"),
        ("# escape=`\nFROM piwork\n", "piwork.Dockerfile:1: the escape directive"),
    ],
)
def test_malformed_files_are_refused_with_file_and_line(text: str, said: str) -> None:
    with pytest.raises(DockerfileError) as exc:
        parse(F, text)
    assert said in str(exc.value)


def test_from_a_layer_id_and_what_it_inherits() -> None:
    bf = parse(
        F,
        "FROM b-0123456789abcdef\nENV B=$A-2\nRUN pwd\n",
        inherited_env={"A": "1"},
        inherited_workdir="/srv",
    )
    assert bf.base == "b-0123456789abcdef"
    assert parse(F, "FROM i-80c8515ec690b6244aa3678b\n").base == "i-80c8515ec690b6244aa3678b"
    assert dict(bf.env) == {"A": "1", "B": "1-2"}
    assert bf.steps[1].workdir == "/srv"


def test_find_file(tmp_path: Path) -> None:
    with pytest.raises(DockerfileError, match=r"no piwork\.Dockerfile or Dockerfile\.piwork"):
        find_file(tmp_path, None)
    (tmp_path / "Dockerfile.piwork").write_text("FROM piwork\n")
    assert find_file(tmp_path, None).name == "Dockerfile.piwork"
    (tmp_path / "piwork.Dockerfile").write_text("FROM piwork\n")
    assert find_file(tmp_path, None).name == "piwork.Dockerfile"
    with pytest.raises(DockerfileError, match="no such file"):
        find_file(tmp_path, "other")


def _ctx(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "tree" / "sub").mkdir(parents=True)
    (ctx / "tree" / "sub" / "f.txt").write_text("in a folder\n")
    (ctx / "tree" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(ctx / "tree" / "run.sh", 0o755)
    os.symlink("sub/f.txt", ctx / "tree" / "link")
    (ctx / "one.txt").write_text("one\n")
    return ctx


def test_staging_copies_files_and_folders_keeps_inner_links_and_hashes_the_bytes(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path)
    bf = parse(ctx / "piwork.Dockerfile", "FROM piwork\nCOPY one.txt tree /opt/app/\n")
    staged = stage_context(bf, ctx, tmp_path / "s1")
    assert (tmp_path / "s1" / "0-0" / "one.txt").read_text() == "one\n"
    assert (tmp_path / "s1" / "0-1" / "sub" / "f.txt").read_text() == "in a folder\n"
    assert os.stat(tmp_path / "s1" / "0-1" / "run.sh").st_mode & 0o111
    assert not (tmp_path / "s1" / "0-1" / "link").exists()  # made by ln -s in the VM
    assert staged.links[(0, 1)] == [("link", "sub/f.txt")]
    script = copy_script(bf.steps[0], 0, staged)
    assert "ln -sfn sub/f.txt /opt/app/link" in script
    # The same bytes give the same key; one changed byte gives another.
    again = stage_context(bf, ctx, tmp_path / "s2")
    assert again.digest == staged.digest
    (ctx / "tree" / "sub" / "f.txt").write_text("in a folder!\n")
    changed = stage_context(bf, ctx, tmp_path / "s3")
    assert changed.digest != staged.digest
    k1 = cache_key(bf, "pack", None, staged.digest)
    assert k1 != cache_key(bf, "pack", None, changed.digest)
    assert k1 != cache_key(bf, "pack2", None, staged.digest)
    assert k1 != cache_key(bf, "pack", "b-parent", staged.digest)
    # A comment does not change the key; a step does.
    bf2 = parse(ctx / "piwork.Dockerfile", "# note\nFROM piwork\nCOPY one.txt tree /opt/app/\n")
    assert cache_key(bf2, "pack", None, staged.digest) == k1
    bf3 = parse(ctx / "piwork.Dockerfile", "FROM piwork\nCOPY one.txt tree /opt/app2/\n")
    assert cache_key(bf3, "pack", None, staged.digest) != k1


def test_copy_never_follows_a_symlink_out_of_the_build_folder(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    os.symlink(secret, ctx / "escape")
    os.symlink("../../../secret.txt", ctx / "tree" / "sub" / "rel-escape")
    os.symlink(tmp_path, ctx / "dirlink")
    cases = {
        "COPY escape /x": "symlink that leads out of the build folder",
        "COPY dirlink/secret.txt /x": "symlink that leads out of the build folder",
        "COPY tree /x/": "is a symlink to ../../../secret.txt, outside the copied folder",
        "COPY missing /x": "COPY missing: no such file",
    }
    for line, said in cases.items():
        bf = parse(ctx / "piwork.Dockerfile", f"FROM piwork\n{line}\n")
        dest = tmp_path / f"stage-{abs(hash(line))}"
        with pytest.raises(ContextError, match=said) as exc:
            stage_context(bf, ctx, dest)
        assert str(exc.value).startswith("piwork.Dockerfile:2:")
        staged_bytes = (
            [f.read_bytes() for f in dest.rglob("*") if f.is_file()] if dest.exists() else []
        )
        assert b"host secret\n" not in staged_bytes


def test_copy_refuses_fifos_and_absolute_inner_links(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    os.mkfifo(ctx / "tree" / "pipe")
    bf = parse(ctx / "piwork.Dockerfile", "FROM piwork\nCOPY tree /x/\n")
    with pytest.raises(ContextError, match="not a regular file, folder or symlink"):
        stage_context(bf, ctx, tmp_path / "s")
    os.unlink(ctx / "tree" / "pipe")
    os.symlink(str(ctx / "one.txt"), ctx / "tree" / "abs")
    with pytest.raises(ContextError, match="outside the copied folder"):
        stage_context(bf, ctx, tmp_path / "s2")


@pytest.mark.parametrize("swap", ["a folder not walked yet", "a folder being walked"])
def test_a_link_swapped_in_mid_walk_is_refused_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    """The build folder changes while it is staged: a folder already checked is replaced
    by a link out of it. Staging walks by descriptor and opens every file beneath the
    folder without following a link, so the build is refused and nothing outside is read
    (a path-based walk would descend through the new link and copy the host's file)."""
    import piwork.env.build as build_mod

    ctx = _ctx(tmp_path)
    (ctx / "tree" / "zz.txt").write_text("staged after sub/\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text("host secret\n")
    (outside / "more.txt").write_text("host secret\n")
    trigger = "zz.txt" if swap == "a folder not walked yet" else "run.sh"
    real_stage_file = build_mod._stage_file
    swapped: list[str] = []

    def stage_file_then_swap(*args: object) -> None:
        real_stage_file(*args)  # type: ignore[arg-type]
        if args[-1] == trigger and not swapped:
            os.rename(ctx / "tree" / "sub", ctx / "moved-sub")
            os.symlink(outside, ctx / "tree" / "sub")
            swapped.append(trigger)

    monkeypatch.setattr(build_mod, "_stage_file", stage_file_then_swap)
    bf = parse(ctx / "piwork.Dockerfile", "FROM piwork\nCOPY tree /x/\n")
    dest = tmp_path / "stage"
    with pytest.raises(ContextError) as exc:
        stage_context(bf, ctx, dest)
    assert swapped
    said = str(exc.value)
    assert said.startswith("piwork.Dockerfile:2: COPY tree")
    assert "changed while it was being copied" in said or "outside the copied folder" in said
    staged = [f.read_bytes() for f in dest.rglob("*") if f.is_file() and not f.is_symlink()]
    assert b"host secret\n" not in staged


def test_an_inner_link_through_another_link_out_of_the_copied_folder_is_refused(
    tmp_path: Path,
) -> None:
    ctx = _ctx(tmp_path)
    os.symlink(".", ctx / "tree" / "here")  # stays inside...
    os.symlink("here/../one.txt", ctx / "tree" / "sneaky")  # ...but this one leaves it
    bf = parse(ctx / "piwork.Dockerfile", "FROM piwork\nCOPY tree /x/\n")
    with pytest.raises(ContextError, match=r"tree/sneaky is a symlink to here/\.\./one\.txt"):
        stage_context(bf, ctx, tmp_path / "s")
    os.unlink(ctx / "tree" / "sneaky")
    os.symlink("here/sub/../run.sh", ctx / "tree" / "fine")
    staged = stage_context(bf, ctx, tmp_path / "s2")
    assert staged.links[(0, 0)] == [("fine", "here/sub/../run.sh"), ("here", "."),
                                    ("link", "sub/f.txt")]  # fmt: skip
    # The build folder itself, and a source reached through a link that stays inside.
    os.symlink("tree", ctx / "alias")
    whole = parse(ctx / "piwork.Dockerfile", "FROM piwork\nCOPY . /src/\nCOPY alias/run.sh /r\n")
    staged = stage_context(whole, ctx, tmp_path / "s3")
    assert (tmp_path / "s3" / "0-0" / "tree" / "sub" / "f.txt").read_text() == "in a folder\n"
    assert staged.items[(1, 0)] == ("file", "run.sh")
    assert (tmp_path / "s3" / "1-0" / "run.sh").read_text() == "#!/bin/sh\n"


def _wild(tmp_path: Path) -> Path:
    ctx = _ctx(tmp_path)
    for name in ("two.txt", ".hidden.txt", "notes.md", "a1.txt", "b2.txt"):
        (ctx / name).write_text(f"{name}\n")
    (ctx / "tools").mkdir()
    (ctx / "tools" / "x.sh").write_text("x\n")
    return ctx


def _staged_names(slot: Path) -> list[str]:
    return sorted(p.relative_to(slot).as_posix() for p in slot.rglob("*"))


@pytest.mark.parametrize(
    ("line", "names"),
    [
        # As Docker's Go filepath.Match: * matches dot files too, never a '/'.
        ("COPY *.txt /d/", [".hidden.txt", "a1.txt", "b2.txt", "one.txt", "two.txt"]),
        ("COPY ?ne.txt /d/", ["one.txt"]),
        ("COPY [ab][0-9].txt /d/", ["a1.txt", "b2.txt"]),
        ("COPY [^ab.]*.txt /d/", ["one.txt", "two.txt"]),
        ("COPY tree/*.sh /d/", ["run.sh"]),
        # A matching folder's contents are merged into the destination (Docker does so).
        (
            "COPY t* /d/",
            ["link-is-made-in-the-vm", "run.sh", "sub", "sub/f.txt", "two.txt", "x.sh"],
        ),
        ("COPY to* tr* /d/", ["link-is-made-in-the-vm", "run.sh", "sub", "sub/f.txt", "x.sh"]),
    ],
)
def test_copy_wildcards_match_as_docker_does(tmp_path: Path, line: str, names: list[str]) -> None:
    ctx = _wild(tmp_path)
    bf = parse(ctx / "piwork.Dockerfile", f"FROM piwork\n{line}\n")
    staged = stage_context(bf, ctx, tmp_path / "s")
    got: list[str] = []
    for ki in range(len(bf.steps[0].sources)):
        assert staged.items[(0, ki)] == ("dir", "")
        got += _staged_names(tmp_path / "s" / f"0-{ki}")
        got += ["link-is-made-in-the-vm" for _ in staged.links[(0, ki)]]
    assert sorted(got) == names
    script = copy_script(bf.steps[0], 0, staged)
    subprocess.run(["bash", "-n", "-c", script], check=True)
    assert "/0-0/. /d/" in script  # the slot's contents into the folder
    # The key follows the bytes of what matched.
    for changed in ("one.txt", "a1.txt", "tree/run.sh", "tools/x.sh"):
        with (ctx / changed).open("a") as f:
            f.write("!")
    assert stage_context(bf, ctx, tmp_path / "s2").digest != staged.digest


def test_copy_wildcards_refuse_what_would_leave_the_folder_or_clash(tmp_path: Path) -> None:
    ctx = _wild(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    outside = tmp_path / "outdir"
    outside.mkdir()
    (outside / "s.txt").write_text("host secret\n")
    os.symlink(secret, ctx / "leak.txt")
    os.symlink(outside, ctx / "outlink")
    (ctx / "one").mkdir()
    (ctx / "one" / "run.sh").write_text("clash\n")
    cases = {
        "COPY *.txt /d/": "leak.txt is a symlink that leads out of the build folder",
        "COPY outlink/*.txt /d/": "outlink is a symlink that leads out of the build folder",
        "COPY *.none /d/": "no file in",
        "COPY nofolder/*.txt /d/": "no folder nofolder",
        "COPY one tree /d/": "",  # two sources, no wildcard: separate slots, no clash
        "COPY [ot][nr]e* /d/": "two matches give the same name (run.sh)",
    }
    for line, said in cases.items():
        bf = parse(ctx / "piwork.Dockerfile", f"FROM piwork\n{line}\n")
        dest = tmp_path / f"stage-{abs(hash(line))}"
        if not said:
            stage_context(bf, ctx, dest)
            continue
        with pytest.raises(ContextError, match=re.escape(said)):
            stage_context(bf, ctx, dest)
        staged = [f.read_bytes() for f in dest.rglob("*") if f.is_file()] if dest.exists() else []
        assert b"host secret\n" not in staged


def test_the_guest_scripts_run_in_bash(tmp_path: Path) -> None:
    """The scripts are bash (syntax-checked here); RUN's command reaches /bin/sh intact."""
    bf = parse(
        F,
        'FROM piwork\nENV Q="it\'s"\nWORKDIR /w d\nRUN echo "$Q" \'x\' | tr x y; exit 3\n',
    )
    run = run_script(bf.steps[2], 60)
    for script in (run, finish_script(bf)):
        subprocess.run(["bash", "-n", "-c", script], check=True)
    assert "export Q='it'\"'\"'s'" in run
    assert "timeout -k 10 60 /bin/sh -c" in run


def test_env_script_is_literal_and_sourced_once(tmp_path: Path) -> None:
    script = env_script(
        {"A": "$(touch /tmp/pwned) `x` 'q'", "PATH": "/opt/bin:/usr/bin:/bin"}, "/no-such-wd"
    )
    f = tmp_path / "env.sh"
    f.write_text(script)
    out = subprocess.run(
        [
            "bash",
            "-c",
            'cd / && . "$0" && printf "%s|%s|%s\\n" "$A" "$PWD" "$PIWORK_WORKDIR"',
            str(f),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.stdout == "$(touch /tmp/pwned) `x` 'q'|/|/no-such-wd\n"
    # With BASH_ENV (as tasks' bash has it): applied, and the cwd moves to WORKDIR only
    # when the shell is not in a task folder (/mnt/...).
    srv = tmp_path / "srv"
    srv.mkdir()
    f.write_text(env_script({"A": "1"}, str(srv)))
    env = {"PATH": "/usr/bin:/bin", "BASH_ENV": str(f)}
    out = subprocess.run(
        ["bash", "-c", 'echo "$A $PWD"; bash -c "echo nested \\$PWD"'],
        capture_output=True, text=True, check=True, env=env, cwd="/",
    )  # fmt: skip
    assert out.stdout == f"1 {srv}\nnested {srv}\n"


def test_streamed_step_output_is_guest_text_made_safe(tmp_path: Path) -> None:
    """What a step prints reaches the terminal escaped; a link in its place is not followed."""
    import asyncio

    from piwork.env.build import STEP_LOG, _stream

    async def collect(content: bytes | None, link_to: Path | None = None) -> list[str]:
        out: list[str] = []
        stop = asyncio.Event()
        if link_to is not None:
            os.symlink(link_to, tmp_path / STEP_LOG)
        elif content is not None:
            (tmp_path / STEP_LOG).write_bytes(content)
        task = asyncio.create_task(_stream(tmp_path, STEP_LOG, out.append, stop))
        await asyncio.sleep(0.3)
        stop.set()
        await task
        return out

    lines = asyncio.run(collect(b"ok\r\n\x1b]0;owned\x07title\nprogress 1\rprogress 2\nlast"))
    assert lines == ["ok", "\\x1b]0;owned\\x07title", "progress 1", "progress 2", "last"]
    (tmp_path / STEP_LOG).unlink()
    secret = tmp_path / "secret"
    secret.write_text("host secret\n")
    assert asyncio.run(collect(None, link_to=secret)) == []


def _as_regex(pattern: str) -> re.Pattern[str]:
    """The reference: the wildcard as a (backtracking) regex, what piwork used to run."""
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out += ".*"
        elif c == "?":
            out += "."
        elif c == "[":
            end = pattern.index("]", i)
            body = pattern[i + 1 : end]
            out += "[^" + re.escape(body[1:]) + "]" if body.startswith("^") else f"[{body}]"
            i = end
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out, re.DOTALL)


@given(
    pattern=st.lists(
        st.sampled_from(["a", "b", ".", "*", "?", "[ab]", "[^a]", "[a-c]"]), max_size=8
    ).map("".join),
    name=st.text(alphabet="abc.\n", max_size=12),
)
@settings(max_examples=600, deadline=None)
def test_the_wildcard_matcher_agrees_with_the_regex_it_replaced(pattern: str, name: str) -> None:
    from piwork.env.dockerfile import compile_pattern

    if not pattern:
        return
    glob = compile_pattern(pattern, "x")
    assert glob.fullmatch(name) == bool(_as_regex(pattern).fullmatch(name)), (pattern, name)


@pytest.mark.timeout(30)
def test_many_stars_against_a_long_name_never_backtrack(tmp_path: Path) -> None:
    """Review 2, finding 10: ``*a*a*a*a*b`` took 6.6 s on a 200-character name, ~20x more
    per star; the regex would not end here at all. On the host, before any VM."""
    from piwork.env.dockerfile import compile_pattern

    name = "a" * 255  # the longest file name Linux allows
    for stars in (4, 8, 40, 120):
        pattern = "*a" * stars + "*b"
        assert not compile_pattern(pattern, "x").fullmatch(name)
        assert compile_pattern(pattern, "x").fullmatch(name[:-1] + "b") == (stars <= 254)
    # The same, through staging a build's COPY, as `piwork env build` runs it.
    ctx = _ctx(tmp_path)
    (ctx / name).write_text("x\n")
    bf = parse(ctx / "piwork.Dockerfile", "FROM piwork\nCOPY " + "*a" * 60 + "*b /x/\n")
    with pytest.raises(ContextError, match="no file in"):
        stage_context(bf, ctx, tmp_path / "s")
