"""The gate's "read" is checked against the real shells: busybox sh and bash.

The classifier (runtime-pack/extensions/gate/classify.js) lets a command it
calls read-only run with no question. The security review (issue 17, item 4)
found commands it called reads that deleted files or ran code, because the
classifier and the shell disagreed about the words. These tests take every
command the classifier's own suite sees classified as an auto-allowed read
and run it under busybox ``sh -c`` and ``bash -c`` in a scratch folder
(tests/helpers/shell_sandbox.py says how that is contained): nothing may change.
A second test runs the review's attacks to show the harness sees their
effects on these shells, and that the classifier now asks for each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.shell_sandbox import REPO, Classifier, Sandbox, need

SHELLS = ("busybox", "bash")


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    # not pytest's tmp_path: its parents are 0700, and the commands run as nobody
    base = Path(tempfile.mkdtemp(prefix="piwork-gate-shells-"))
    try:
        yield Sandbox(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def reads_of_the_node_suite(dump: Path) -> list[dict[str, str]]:
    """Run classify.test.mjs and collect every command it saw classified as a read."""
    proc = subprocess.run(
        [need("node"), "--test", str(REPO / "runtime-pack" / "tests" / "classify.test.mjs")],
        env={**os.environ, "PIWORK_GATE_DUMP_READS": str(dump)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"the classifier's node suite failed:\n{proc.stdout[-3000:]}"
    cases = json.loads(dump.read_text())
    assert isinstance(cases, list)
    unique = {(c["command"], c["cwd"]): c for c in cases}
    return list(unique.values())


def test_every_read_of_the_classifier_suite_changes_nothing_under_busybox_sh_and_bash(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    cases = reads_of_the_node_suite(tmp_path / "reads.json")
    # the suite has a few thousand (every allowed option of every command):
    # a handful would mean the dump is broken, not that all is well
    assert len(cases) > 1000, len(cases)
    failures = []
    for case in cases:
        command = case["command"].replace("@WORK@", str(sandbox.scratch))
        for shell in SHELLS:
            out = sandbox.run(shell, command, case["cwd"], timeout=1.5)
            if out.changes:
                failures.append(f"{shell}: {command!r} -> {out.changes} ({out.output[:200]!r})")
    print(f"{len(cases)} read commands x {len(SHELLS)} shells: {len(failures)} changed something")
    assert not failures, "\n".join(failures)


# The review's attacks, with `touch PWNED` or an overwrite for `rm -rf`. Each
# one changes the scratch folder under the shells listed (bash-only ones do
# nothing under busybox ash), and the classifier must not call it a read.
ATTACKS: list[tuple[str, tuple[str, ...]]] = [
    ("ls\r#; touch PWNED", SHELLS),
    ("cat <<E\rOF\nE\rOF\ntouch PWNED\nE", SHELLS),
    ("echo $(echo a #)'\ntouch PWNED\n)\"'\"", SHELLS),
    ("x='1 -o a.txt'; sort -k $x b.txt", SHELLS),
    ("x='1 -o a.txt'; sort -t $x b.txt", SHELLS),
    ("x='0 a.txt'; uniq -f $x b.txt", SHELLS),
    ("x='0 a.txt'; uniq -w $x b.txt", SHELLS),
    ("x='a.txt -exec rm {} ;'; find . -name $x", SHELLS),
    ("x=' -f evil.awk'; awk -v a=$x '{print}' a.txt", SHELLS),
    ("x=', -f evil.awk'; awk -F $x '{print}' a.txt", SHELLS),
    ("x='1 touch PWNED'; timeout $x ls", SHELLS),
    ("x='1 touch PWNED'; timeout -s TERM $x ls", SHELLS),
    ("x='X touch PWNED'; env -u $x ls", SHELLS),
    ("x='1 rm'; echo a.txt | xargs -n $x echo", SHELLS),
    ("echo $((touch PWNED) )", ("bash",)),
    ("x='a[$(touch PWNED)]'; echo $((x))", ("bash",)),
    ("x='a[$(touch PWNED)]'; [[ $x -eq 0 ]]", ("bash",)),
    ("x='a[$(touch PWNED)]'; echo ${y[x]}", ("bash",)),
    ("x='$(touch PWNED)'; echo ${x@P}", ("bash",)),
    ("x='a[$(touch PWNED)]'; declare -i y=x", ("bash",)),
    ("x='a[$(touch PWNED)]'; test -v \"$x\"", ("bash",)),
    ("a=(1); x='a[$(touch PWNED)]'; unset \"$x\"", ("bash",)),
    ("sort -k {1,-o,a.txt} b.txt", ("bash",)),
    # busybox runs its own applet for `ls` whatever PATH says
    ("for PATH in .; do ls; done", ("bash",)),
    ("unset PATH; ls", ("bash",)),
    ("echo x < a.txt > /dev/fd/0", SHELLS),
    ("exec 63<a.txt; echo pwned > /dev/fd/63", SHELLS),
    ("exec 1<a.txt; echo x > /dev/stdout", SHELLS),
    # `>&WORD` with a WORD that is not a whole number is a file: `\r` is part
    # of the word (found by test_gate_fuzz under busybox sh)
    ("ls >&2\r#", SHELLS),
    ("ls >&2x", ("bash",)),
    ("uniq *.txt", SHELLS),
]


@pytest.mark.parametrize(("command", "shells"), ATTACKS, ids=[repr(a[0])[:60] for a in ATTACKS])
def test_the_reviews_attacks_change_files_on_real_shells_and_the_classifier_asks(
    sandbox: Sandbox, command: str, shells: tuple[str, ...]
) -> None:
    for shell in shells:
        out = sandbox.run(shell, command)
        assert out.changes, f"{shell} did not run the attack {command!r}: {out.output!r}"
    classifier = Classifier(sandbox.scratch)
    try:
        verdict = classifier.classify(command, sandbox.scratch)
    finally:
        classifier.close()
    assert verdict["needsDecision"] is True, verdict
    assert verdict["action"] != "read", verdict


# Lines where a hand-written lexer and the shells can disagree about where a
# quote, a substitution, a heredoc or a comment ends. Whatever the classifier
# calls a read among them must change nothing; most of them do run
# `touch PWNED` under the shells, and those must be asked about.
LEXER_CORPUS = [
    'echo "$(echo ")")"\ntouch PWNED',
    "echo $(echo ')')\ntouch PWNED",
    "cat <<E; echo $(echo\nE\ntouch PWNED\n)",
    "echo `echo \\`touch PWNED\\``",
    "echo ${x:-`touch PWNED`}",
    'echo "${x:-"$(touch PWNED)"}"',
    'cat <<"E"\n$(touch PWNED)\nE',
    "cat <<\\E\n$(touch PWNED)\nE",
    "cat <<E\n\\$(touch PWNED)\nE",
    "cat <<E\n$(echo\nE\ntouch PWNED\n)\nE",
    "echo $(( $(touch PWNED) ))",
    "echo $((1)) $((2\n))",
    "echo \\\ntouch PWNED",
    "echo a\\\r\ntouch PWNED",
    "echo ${x#*}}",
    'echo "${x#"}"}"',
    "x=$(\n#)\ntouch PWNED\n)",
    "echo $(echo a; #)\ntouch PWNED\n)",
    "echo $(# )\ntouch PWNED\n)",
    "echo $'\\'' ; touch PWNED ; '\\''",
    "echo a#b; echo a #; touch PWNED",
    "echo 'a\r'#; touch PWNED",
    "cat <<-E\n\tE\ntouch PWNED\nE",
    "cat <<E\nE \ntouch PWNED\nE",
]


def test_lines_where_lexers_disagree_are_reads_only_if_the_shells_change_nothing(
    sandbox: Sandbox,
) -> None:
    classifier = Classifier(sandbox.scratch)
    ran_code = 0
    try:
        for command in LEXER_CORPUS:
            verdict = classifier.classify(command, sandbox.scratch)
            changed = {shell: sandbox.run(shell, command).changes for shell in SHELLS}
            if any(changed.values()):
                ran_code += 1
                assert verdict["needsDecision"], (command, changed, verdict)
    finally:
        classifier.close()
    assert ran_code >= 10, "the corpus should hold lines that do run code"
