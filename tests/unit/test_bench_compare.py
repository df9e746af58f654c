"""`piwork bench --compare DIR`: both trees' figures side by side, each start-up as a
multiple of its own native pi start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.bench import COLD, NATIVE, PROMPT, WARM, Round
from piwork.cli.bench_compare import CompareError, Other, pi_version, prepare, table


def tree(root: Path, pin: dict[str, str]) -> Path:
    (root / "runtime-pack" / "pi").mkdir(parents=True)
    (root / "runtime-pack" / "pi" / "package.json").write_text(json.dumps({"dependencies": pin}))
    return root


def test_each_tree_says_the_pi_it_pins(tmp_path: Path) -> None:
    old = tree(tmp_path / "old", {"@mariozechner/pi-coding-agent": "0.73.1", "npm": "1"})
    assert pi_version(old) == "pi 0.73.1"
    with pytest.raises(CompareError, match="pins no pi"):
        pi_version(tmp_path)
    with pytest.raises(CompareError, match="not a piwork source tree"):
        prepare(old)


def test_the_table_puts_both_side_by_side_with_their_own_ratios(tmp_path: Path) -> None:
    ours = [Round({NATIVE: 2.0, COLD: 10.0, WARM: 1.8, PROMPT: 4.0}),
            Round({NATIVE: 2.2, COLD: 12.0, WARM: 2.0, PROMPT: 5.0})]  # fmt: skip
    other = Other(tree(tmp_path / "old", {"@mariozechner/pi-coding-agent": "0.73.1"}))
    other.rounds = [Round({NATIVE: 1.75, COLD: 9.42, WARM: 1.84})]
    lines = table(ours, "pi 1.6.0", other)
    assert lines[0].split()[-4:] == ["pi", "1.6.0", "pi", "0.73.1"]
    rows = {line[:40].strip(): line[40:].split() for line in lines[1:]}
    assert rows[NATIVE] == ["2.10", "1.75"]
    assert rows[COLD] == ["11.00", "9.42"]
    assert rows[PROMPT] == ["4.50", "-"]
    ratios = {line.split("(x)")[0].strip(): line.split("(x)")[1].split() for line in lines
              if "(x)" in line}  # fmt: skip
    assert ratios["cold start / native pi start"] == ["5.24", "5.38"]
    assert ratios["warm start / native pi start"] == ["0.90", "1.05"]
