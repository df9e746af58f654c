#!/usr/bin/env bash
# Installs everything piwork needs on a Debian/Ubuntu host, idempotently:
# pinned Debian packages (QEMU, kmod, binutils, cpio), a Python venv with
# piwork and its pinned dependencies, and pi's npm lock check.
# Usage: scripts/setup.sh            (run as root, or with sudo available)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[2msetup: %s\033[0m\n' "$*" >&2; }
need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# --- Debian packages -------------------------------------------------------
missing=()
while read -r spec; do
    case "$spec" in ''|'#'*) continue ;; esac
    pkg="${spec%%=*}"; ver="${spec#*=}"
    have=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
    [ "$have" = "$ver" ] || missing+=("$spec")
done < scripts/apt-packages.txt

if [ "${#missing[@]}" -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    need_root apt-get update -qq
    if ! need_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        say "WARNING: a pinned version is no longer in the archive; installing the current"
        say "         versions instead. Update scripts/apt-packages.txt after checking them."
        need_root apt-get install -y -qq --no-install-recommends "${missing[@]%%=*}" >/dev/null
    fi
fi

# --- arm64 binaries on another host (building an arm64 pack) --------------
# qemu-user-static's handler, with the F flag (Debian's binfmt.d file) so arm64
# binaries also run in the build's namespaces and chroots. Debian registers it
# only through systemd or binfmt-support; a container or CI box has neither.
binfmt=/proc/sys/fs/binfmt_misc
if [ "$(uname -m)" != aarch64 ] && [ -f /usr/lib/binfmt.d/qemu-aarch64.conf ] \
    && [ ! -e "$binfmt/qemu-aarch64" ]; then
    [ -e "$binfmt/register" ] || need_root mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
    if [ -e "$binfmt/register" ] \
        && need_root sh -c "cat /usr/lib/binfmt.d/qemu-aarch64.conf > $binfmt/register"; then
        say "registered qemu-aarch64 with binfmt_misc (arm64 pack builds)"
    else
        say "WARNING: cannot register qemu-aarch64 with binfmt_misc: no arm64 pack can be"
        say "         built here (its workbench runs arm64 maintainer scripts); amd64 is fine"
    fi
fi

# --- Node (pack builds run npm; pi needs node >= 20.6) ---------------------
if ! command -v npm >/dev/null || ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'; then
    say "Node.js >= 20 with npm is required: apt-get install nodejs npm (or nodesource)"
    exit 1
fi

# --- Python ----------------------------------------------------------------
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    say "Python >= 3.11 is required (found $("$PY" --version 2>&1))"
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.piwork-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    say "installing piwork and its pinned dependencies into .venv"
    .venv/bin/pip install -q --disable-pip-version-check -e '.[gui,dev]'
    touch "$stamp"
fi

# pi's dependency tree for host-side tests that run the real pi natively.
# (A changed lock, e.g. a new pi, is newer than the installed tree's copy of it.)
if [ ! -f runtime-pack/pi/node_modules/.package-lock.json ] \
    || [ runtime-pack/pi/package-lock.json -nt runtime-pack/pi/node_modules/.package-lock.json ]; then
    say "npm ci in runtime-pack/pi (pinned pi + node for host-side tests)"
    (cd runtime-pack/pi && npm ci --omit=optional --ignore-scripts --no-audit --no-fund --loglevel=error)
fi
say "ready: .venv/bin/piwork"
