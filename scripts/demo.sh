#!/usr/bin/env bash
# One command for a newcomer: install everything, build the runtime pack, and
# run a real pi agent in a QEMU VM on a small folder with the offline demo
# model. The agent drafts PIWORK_DEMO.md and moves it into ./demo-folder (its own
# copy; piwork brings the new file into the folder, `piwork undo` takes it back).
# The last lines say what happened.
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
if [ -f demo-folder/PIWORK_DEMO.md ]; then
    echo "The agent wrote: $(pwd)/demo-folder/PIWORK_DEMO.md (undo it: piwork undo)"
else
    echo "demo-folder is unchanged: the move into it was not allowed, so the agent did not write PIWORK_DEMO.md."
fi
