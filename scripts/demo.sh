#!/usr/bin/env bash
# One command for a newcomer: install everything, build the runtime pack, and
# run a real pi agent in a QEMU VM on a small folder with the offline demo
# model. The agent writes PIWORK_DEMO.md into ./demo-folder on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p demo-folder
[ -f demo-folder/README.md ] || printf '# Demo project\n\nA folder for piwork to look at.\n' > demo-folder/README.md
[ -f demo-folder/notes.txt ] || printf 'buy milk\nship piwork\n' > demo-folder/notes.txt
.venv/bin/piwork doctor || true
.venv/bin/piwork pack build
.venv/bin/piwork run "Look at this folder and write a short summary of it." \
    --folder demo-folder --model demo "$@"
echo
echo "The agent wrote: $(pwd)/demo-folder/PIWORK_DEMO.md"
