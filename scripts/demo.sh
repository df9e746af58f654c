#!/usr/bin/env bash
# One command for a newcomer: install everything, build the runtime pack, and
# run a real pi agent in a QEMU VM on a small folder with the offline demo
# model. The agent writes PIWORK_DEMO.md into ./demo-folder (its own copy; piwork
# brings the new file into the folder without a question) and renames notes.txt to
# notes.md, a move piwork asks about: at a terminal you answer; with no terminal the
# rename waits and notes.txt stays. `piwork undo` takes it back. The last lines say
# what happened.
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
    echo "The agent's PIWORK_DEMO.md did not reach demo-folder: see the notices above."
fi
if [ -f demo-folder/notes.md ] && [ ! -e demo-folder/notes.txt ]; then
    echo "notes.txt was renamed to notes.md: you allowed the move."
else
    echo "notes.txt was not renamed: the move was not allowed (piwork asks before moving your files)."
fi
