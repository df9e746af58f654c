"""Today's live share and the change-set design side by side (issue 34): figures, not asserts.

    python -m benchmarks.changesets [--old REV] [--big] [--json OUT]

Runs the same scenarios against two trees, each in a subprocess with its own
``piwork`` on ``sys.path`` (and so its own runtime pack and saved VM):

- *old*: a temporary ``git worktree`` of ``REV`` (default ``fe60f9f``, the tree
  issue 34 started from: the guest writes the folder live, a shadow git
  repository checkpoints it before every model call);
- *new*: this tree (change sets).

Scenarios (real QEMU, real pi, the scripted model server, ``--yes``):

1. **per model call**: the agent writes 1, then 100, then 10,000 files in three
   turns; the time the gateway holds the next model call (the old design's
   checkpoint, the new one's scan + fetch + checkpoint + apply);
2. **big folder** (``--big``): a 150,000-file folder (300 packages x 500 files
   under ``node_modules`` and ``src/``): the first model call's hold, the task
   directory's size after the run, and ``find . -type f`` and ``git status`` in the
   guest against the same on the host;
3. **venv**: ``python3 -m venv`` in the folder against the same on the guest's own
   disk (``/root``).

Self-contained on purpose (a later refactor moves bench modules into one
package): it imports only what both trees have (``piwork.runner``,
``piwork.models.scripted``, ``piwork.config``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OLD = "fe60f9f"
W = "/mnt/work"


# --------------------------------------------------------------------------- in the subprocess


def _du(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=False)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout else 0


def _host_seconds(cmd: str, cwd: Path) -> float:
    best = None
    for _ in range(2):  # the second run, as in the guest: caches warm
        t = time.monotonic()
        subprocess.run(["sh", "-c", cmd], cwd=cwd, capture_output=True, check=False)
        best = time.monotonic() - t
    return round(best or 0.0, 3)


def make_big(root: Path, packages: int = 300) -> Path:
    folder = root / "big"
    for p in range(packages):
        for sub in range(5):
            d = folder / "node_modules" / f"pkg{p:03d}" / f"lib{sub}"
            d.mkdir(parents=True)
            for f in range(100):
                (d / f"f{f:03d}.js").write_text(f"module.exports = {p * 1000 + sub * 100 + f};\n")
    for s in range(10):
        d = folder / "src" / f"mod{s}"
        d.mkdir(parents=True)
        for f in range(100):
            (d / f"m{f:03d}.js").write_text(f"export const v{f} = {f};\n")
    (folder / ".gitignore").write_text("node_modules/\n")
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1"}
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=b", "-c", "user.email=b@x",
                                                 "commit", "-qm", "init"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=folder, env=env, check=True, capture_output=True)
    return folder


async def _run_task(
    folder: Path, home: Path, commands: list[str], holds: list[float]
) -> tuple[str, dict[str, Any]]:
    """One task whose agent runs ``commands`` (one per turn); ``holds``: each model call's
    hold (seconds the gateway waited for the folder's checkpoint / change set)."""
    from piwork.config import Paths, get_paths
    from piwork.models.scripted import ChatRequest, ScriptedModelServer, Text, ToolCalls, bash
    from piwork.runner import RunRequest, TaskSession

    server = ScriptedModelServer([Text("x")], model_id="scripted")

    def choose(req: ChatRequest) -> object:
        i = req.assistant_turns_since_user
        return ToolCalls([bash(commands[i], timeout=3600)]) if i < len(commands) else Text("done")

    server.script = choose  # type: ignore[assignment]
    paths = Paths(data=home / "data", cache=get_paths().cache, state=home / "state",
                  config=home / "config")  # fmt: skip
    async with server:
        provider = server.as_provider("scripted", name="scripted", contextWindow=128_000,
                                      maxTokens=4096, reasoning=False, input=("text",))  # fmt: skip
        req = RunRequest(prompt=None, folder=folder, model="scripted/scripted",
                         extra_providers=(provider,), assume_yes=True,  # type: ignore[arg-type]
                         boot_stall_timeout=600.0)  # fmt: skip
        async with TaskSession(req, lambda ev: None, paths=paths) as session:
            original = session._before_model_call

            async def timed() -> None:
                t = time.monotonic()
                await original()
                holds.append(time.monotonic() - t)

            session._before_model_call = timed  # type: ignore[method-assign]
            outcome = await session.run_prompt("go")
            assert session.task is not None
            task_dir = session.task.dir
            outputs = session.task.outputs_dir
    results: dict[str, Any] = {"status": outcome.status, "task_dir_bytes": _du(task_dir)}
    results["outputs"] = {p.name: p.read_text() for p in outputs.glob("*.txt")}
    return str(task_dir), results


def _guest_time(label: str, cmd: str, cwd: str = W) -> str:
    """A command whose wall time (the second of two runs) the guest writes to the outputs."""
    return (
        f"cd {cwd} && for i in 1 2; do s=$(date +%s%N); {cmd} >/dev/null 2>&1; e=$(date +%s%N); "
        f"done; echo $(( (e - s) / 1000000 )) > /mnt/outputs/{label}.txt"
    )


def _small(folder: Path) -> Path:
    folder.mkdir()
    (folder / "README").write_text("x\n")
    return folder


def scenario(kind: str, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if kind == "per-call":
        folder = _small(work / "small")
        cmds = [
            f"mkdir -p {W}/gen{n} && cd {W}/gen{n} && for f in $(seq 1 {n}); do echo $f > $f; done"
            for n in (1, 100, 10_000)
        ]
        holds: list[float] = []
        t = time.monotonic()
        _, res = asyncio.run(_run_task(folder, work / "home-a", cmds, holds))
        out["wall_seconds"] = round(time.monotonic() - t, 1)
        # holds[0]: the first model call; holds[k]: after the turn that wrote the k-th batch
        out["hold_seconds"] = {str(n): round(holds[i + 1], 3) for i, n in
                               enumerate((1, 100, 10_000)) if i + 1 < len(holds)}  # fmt: skip
        out["task_dir_bytes"] = res["task_dir_bytes"]
    elif kind == "big":
        folder = make_big(work)
        host = {"find": _host_seconds("find . -type f | wc -l", folder),
                "git_status": _host_seconds("git status --short", folder)}  # fmt: skip
        cmds = [
            _guest_time("find", "find . -type f | wc -l"),
            _guest_time("git_status", "git -c safe.directory='*' status --short"),
            "echo '// edited' >> src/mod0/m000.js",
        ]
        holds = []
        _, res = asyncio.run(_run_task(folder, work / "home-b", cmds, holds))
        guest = {k: int(res["outputs"].get(f"{k}.txt", "0").strip() or 0) / 1000 for k in host}
        out["first_model_call_hold_seconds"] = round(holds[0], 3) if holds else None
        out["task_dir_bytes"] = res["task_dir_bytes"]
        out["host_seconds"] = host
        out["guest_seconds"] = guest
        out["guest_over_host"] = {
            k: round(guest[k] / host[k], 1) if host[k] else None for k in host
        }
    elif kind == "venv":
        folder = _small(work / "proj")
        cmds = [
            f"s=$(date +%s%N); python3 -m venv {W}/.venv; e=$(date +%s%N); "
            "echo $(( (e - s) / 1000000 )) > /mnt/outputs/venv_folder.txt",
            "s=$(date +%s%N); python3 -m venv /root/venv-bench; e=$(date +%s%N); "
            "echo $(( (e - s) / 1000000 )) > /mnt/outputs/venv_disk.txt",
        ]
        holds = []
        _, res = asyncio.run(_run_task(folder, work / "home-c", cmds, holds))
        f_s = int(res["outputs"].get("venv_folder.txt", "0").strip() or 0) / 1000
        d_s = int(res["outputs"].get("venv_disk.txt", "0").strip() or 0) / 1000
        out.update(venv_folder_seconds=f_s, venv_own_disk_seconds=d_s,
                   folder_over_disk=round(f_s / d_s, 2) if d_s else None)  # fmt: skip
    return out


# --------------------------------------------------------------------------- the driver


def _tree(old: str, tmp: Path) -> Path:
    path = tmp / "old-tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path), old],
                   check=True)  # fmt: skip
    # the old tree needs pi's node_modules for its pack: share the installed ones
    pi = REPO / "runtime-pack" / "pi" / "node_modules"
    if pi.is_dir() and not (path / "runtime-pack" / "pi" / "node_modules").exists():
        (path / "runtime-pack" / "pi" / "node_modules").symlink_to(pi)
    return path


def _in_tree(tree: Path, kind: str, work: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # This file is loaded by path under another name: the tree's own ``benchmarks``
    # package (and its ``piwork``, first on the path) must be the ones imported.
    code = (
        "import importlib.util, json, pathlib\n"
        f"spec = importlib.util.spec_from_file_location('cs_bench', {str(Path(__file__))!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        f"res = mod.scenario({kind!r}, pathlib.Path({str(work)!r}))\n"
        "print('RESULT ' + json.dumps(res))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    return {"error": (proc.stderr or proc.stdout)[-2000:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default=DEFAULT_OLD, help="the live-share tree (a git revision)")
    ap.add_argument("--big", action="store_true", help="also the 150,000-file folder (long)")
    ap.add_argument("--only", choices=("old", "new"), help="run one design only")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    kinds = ["per-call", "venv"] + (["big"] if args.big else [])
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="piwork-changesets-bench-") as tmp:
        trees = {"new": REPO}
        if args.only != "new":
            trees["old"] = _tree(args.old, Path(tmp))
        try:
            for name, tree in trees.items():
                if args.only and name != args.only:
                    continue
                for kind in kinds:
                    work = Path(tmp, f"{name}-{kind}")
                    work.mkdir()
                    t = time.monotonic()
                    results.setdefault(kind, {})[name] = _in_tree(tree, kind, work)
                    print(f"{name} {kind}: {time.monotonic() - t:.0f} s "
                          f"{json.dumps(results[kind][name])}", flush=True)  # fmt: skip
                    shutil.rmtree(work, ignore_errors=True)
        finally:
            if "old" in trees:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(trees["old"])], check=False)  # fmt: skip
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
