"""Run shell commands the gate calls read-only under the guest's shells, and see what changed.

The gate (runtime-pack/extensions/gate/classify.js) lets a command run with no
question when it classifies it as a read. Whether it *is* one is a fact about
the shells, not about the classifier: this helper runs a command under
busybox ``sh -c`` (the guest's shell since the image began) and ``bash -c``
(the workbench brings bash into the guest) and reports every change in a
scratch folder, so a test can assert that a "read" changed nothing.

Safety: the commands come from the classifier's own test tables or from a
grammar whose words only name files inside the scratch folder, but the point
is to catch the classifier being wrong, so each run is contained anyway:

* a fresh scratch folder (recreated after any run that changed it) is the
  working directory, and the only place the runner may write: when this
  process is root, the shell runs as ``nobody`` through ``setpriv`` (no
  groups, no capabilities), owning only the scratch folder; HOME is a
  root-owned empty folder it cannot write;
* the environment is empty except for a PATH of symlinks to a fixed list of
  tools (busybox applets for ``sh``, the read-only list plus the common file
  tools for bash), LC_ALL=C and git's ceiling/no-system-config variables, so
  no profile, rc file or user configuration is read;
* stdin is empty, the whole process group is killed after ``timeout``
  seconds, and output is capped.

Not contained: writes by ``nobody`` to world-writable places outside the
scratch folder (``/tmp``) would go unnoticed. The classifier calls any path
outside the scope ``outside-scope``, so such a command is never a read here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GATE_DIR = REPO / "runtime-pack" / "extensions" / "gate"
SERVER = REPO / "runtime-pack" / "tests" / "classify-server.mjs"
NOBODY = 65534

# Files every scratch folder starts with. evil.awk/evil.sed stand for programs a
# model could have written with the (auto-allowed) write tool.
FIXTURE: dict[str, str] = {
    "a.txt": "alpha\nbeta\n",
    "b.txt": "2 b\n1 a\n",
    "src/keep.c": "int main(void) { return 0; }\n",
    "src/m.o": "",
    "src/n.o": "",
    "evil.awk": 'BEGIN { system("touch PWNED") }\n',
    "evil.sed": "1e touch PWNED\n",
    "list": "a.txt\nb.txt\n",
    # a program planted in the folder: a command that puts `.` on PATH runs it
    "ls": "#!/bin/sh\n: > PWNED\n",
}
EXECUTABLE = {"ls"}

# Host tools linked into bash's PATH besides the read-only list.
EXTRA_TOOLS = [
    *["sh", "bash", "find", "sed", "awk", "gawk", "mawk", "git", "xargs", "timeout", "env"],
    *["nice", "nohup", "stdbuf", "ionice", "setsid", "rm", "mv", "cp", "ln", "touch", "mkdir"],
    *["rmdir", "tee", "chmod", "dd", "truncate", "tar", "gzip", "sleep", "kill", "split"],
    *["csplit", "install", "zip", "unzip", "patch", "sort", "uniq", "iconv"],
]


def need(tool: str) -> str:
    """The absolute path of a host tool the tests require, or a clear error."""
    found = shutil.which(tool)
    if found is None:
        hint = " (apt-get install busybox-static; pinned in scripts/apt-packages.txt)"
        raise RuntimeError(f"{tool} not found on PATH{hint if tool == 'busybox' else ''}")
    return found


def read_only_names() -> list[str]:
    """The commands on the gate's read-only list (readonly.js SPECS), from node itself."""
    node = need("node")
    script = (
        f"import({json.dumps((GATE_DIR / 'readonly.js').as_uri())})"
        ".then((m) => console.log(JSON.stringify(Object.keys(m.SPECS))))"
    )
    out = subprocess.run(
        [node, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    names = json.loads(out.stdout)
    assert isinstance(names, list)
    return [str(n) for n in names]


@dataclass(frozen=True)
class Outcome:
    shell: str
    changes: list[str]
    exit_code: int | None  # None: killed at the timeout
    output: str


Snapshot = dict[str, tuple[str, ...]]


def snapshot(root: Path) -> Snapshot:
    """Every entry under ``root``: type, mode and content hash (or link target)."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = ("file", oct(st.st_mode), digest)
            else:
                out[rel] = ("other", oct(st.st_mode))
    return out


def diff(before: Snapshot, after: Snapshot) -> list[str]:
    changes = [f"created {k}" for k in sorted(after.keys() - before.keys())]
    changes += [f"deleted {k}" for k in sorted(before.keys() - after.keys())]
    both = sorted(before.keys() & after.keys())
    changes += [f"changed {k}" for k in both if before[k] != after[k]]
    return changes


class Sandbox:
    """A scratch folder, two PATHs of linked tools, and a runner for ``sh -c``/``bash -c``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.busybox = need("busybox")
        self.bash = need("bash")
        self.as_root = os.geteuid() == 0
        self.setpriv = need("setpriv") if self.as_root else None
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o755)
        self.home = base / "home"
        self.home.mkdir(exist_ok=True)
        self.scratch = base / "work"
        # a folder beside the scope the runner may write: a command the gate
        # judged in the scope that lands here shows up in the changes
        self.outside = base / "outside"
        self.bin_busybox = self._link_dir(
            base / "bin-busybox",
            {name: self.busybox for name in self._applets()},
        )
        tools: dict[str, str] = {}
        for name in [*read_only_names(), *EXTRA_TOOLS]:
            found = shutil.which(name)
            if found is not None and name not in ("[", "[["):
                tools[name] = found
        tools["sh"] = self.bash
        self.bin_bash = self._link_dir(base / "bin-bash", tools)
        self.reset()
        self.pristine = self._snapshot()

    def _snapshot(self) -> Snapshot:
        both = {f"work/{k}": v for k, v in snapshot(self.scratch).items()}
        both.update({f"outside/{k}": v for k, v in snapshot(self.outside).items()})
        return both

    def _applets(self) -> list[str]:
        out = subprocess.run(
            [self.busybox, "--list"], capture_output=True, text=True, check=True, timeout=30
        )
        return [a for a in out.stdout.split() if a and "/" not in a]

    @staticmethod
    def _link_dir(path: Path, targets: dict[str, str]) -> Path:
        path.mkdir(exist_ok=True)
        for name, target in targets.items():
            link = path / name
            if not link.is_symlink():
                link.symlink_to(target)
        return path

    def reset(self) -> None:
        """A fresh scratch folder holding FIXTURE, owned by whoever runs the commands."""
        for d in (self.scratch, self.outside):
            if d.exists():
                shutil.rmtree(d)
            d.mkdir()
            if self.as_root:
                os.chown(d, NOBODY, NOBODY)
        for rel, text in FIXTURE.items():
            p = self.scratch / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            if rel in EXECUTABLE:
                p.chmod(0o755)
        # an archive holding a link out of the folder: extracting it and writing
        # through the link on the same line lands outside
        with tarfile.open(self.scratch / "links.tar", "w") as tar:
            member = tarfile.TarInfo("link")
            member.type = tarfile.SYMTYPE
            member.linkname = "../outside"
            tar.addfile(member)
        if self.as_root:
            for dirpath, dirnames, filenames in os.walk(self.scratch):
                os.chown(dirpath, NOBODY, NOBODY)
                for name in [*dirnames, *filenames]:
                    os.chown(Path(dirpath) / name, NOBODY, NOBODY, follow_symlinks=False)

    def run(self, shell: str, command: str, cwd_rel: str = "", timeout: float = 3.0) -> Outcome:
        """Run ``command`` under ``shell`` ("busybox" or "bash") and list what changed."""
        if shell == "busybox":
            argv = [self.busybox, "sh", "-c", command]
            path = str(self.bin_busybox)
        elif shell == "bash":
            argv = [self.bash, "--norc", "--noprofile", "-c", command]
            path = str(self.bin_bash)
        else:
            raise ValueError(f"unknown shell {shell!r}")
        if self.setpriv is not None:
            argv = [
                self.setpriv,
                f"--reuid={NOBODY}",
                f"--regid={NOBODY}",
                "--clear-groups",
                "--inh-caps=-all",
                "--",
                *argv,
            ]
        env = {
            "PATH": path,
            "HOME": str(self.home),
            "LC_ALL": "C",
            "TERM": "dumb",
            "GIT_CEILING_DIRECTORIES": str(self.base),
            "GIT_CONFIG_NOSYSTEM": "1",
        }
        cwd = self.scratch / cwd_rel
        if not cwd.is_dir():
            cwd = self.scratch
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            raw, _ = proc.communicate(timeout=timeout)
            code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raw, _ = proc.communicate()
            code = None
        changes = diff(self.pristine, self._snapshot())
        if changes:
            self.reset()
        return Outcome(shell, changes, code, raw[:2000].decode("utf-8", "replace"))


def changed_paths(sandbox: Sandbox, outcome: Outcome) -> list[Path]:
    """The absolute paths an outcome's changes name (``created work/x`` -> scratch/x)."""
    out = []
    for change in outcome.changes:
        _, rel = change.split(" ", 1)
        top, _, rest = rel.partition("/")
        out.append((sandbox.scratch if top == "work" else sandbox.outside) / rest)
    return out


class Classifier:
    """The gate's classifier in one long-lived node process (classify-server.mjs)."""

    def __init__(self, scope: Path) -> None:
        self.proc = subprocess.Popen(
            [need("node"), str(SERVER), str(scope)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def classify(self, command: str, cwd: Path) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"command": command, "cwd": str(cwd)}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the classifier process exited")
        result = json.loads(line)
        assert isinstance(result, dict)
        if "error" in result:
            raise RuntimeError(f"classifier failed on {command!r}: {result['error']}")
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
