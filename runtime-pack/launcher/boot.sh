#!/bin/sh
# piwork: start pi's launcher at boot, beside the supervisor, for the
# supervisor to adopt (runtime-pack/supervisor/supervisor.js, adoptBootLauncher).
#
# Why: under TCG the launcher's node start and its load of pi are most of a
# cold start, and the guest has two CPUs. Spawned by the supervisor, the
# launcher could only begin after the supervisor's own node start (the boot's
# first, ~1 s). Started here it begins with it.
#
# How: a shell cannot make anonymous pipes, so pi's stdin, stdout, stderr and
# the launcher's control channel (fd 3 in, fd 4 out) are FIFOs in $DIR. This
# shell holds every FIFO open both ways (so no open blocks, whoever comes
# first) until the supervisor says, on the "adopted" FIFO, that it has opened
# its ends; then it lets go, so an end of file means what it does with pipes
# (pi sees one on stdin when the supervisor is gone, the supervisor on stdout
# when pi is). The launcher's exit status goes to $DIR/status. /init runs this
# in the foreground: it returns once $DIR/pid names the launcher.
#
# Environment: as the supervisor gives a launcher it spawns (childEnv there):
# the supervisor's own settings removed, the extensions to warm added.
DIR=${PIWORK_BOOT_LAUNCHER_DIR:-/run/piwork/launcher}
NODE=${PIWORK_NODE:-/opt/piwork/node/bin/node}
LAUNCHER=${PIWORK_LAUNCHER:-/opt/piwork/launcher/launch.mjs}
# pi already loaded: the pack's V8 startup snapshot (snapshot-shim.cjs), which
# imports $LAUNCHER once restored. Without it node runs $LAUNCHER, which loads pi.
BLOB=${PIWORK_SNAPSHOT_BLOB:-/opt/piwork/launcher/pi.blob}
EXTENSIONS=${PIWORK_EXTENSIONS_DIR:-/opt/piwork/extensions}

[ -f "$LAUNCHER" ] && [ -x "$NODE" ] || exit 0
mkdir -p "$DIR" || exit 1
cd "$DIR" || exit 1
rm -f in out err ctl-in ctl-out adopted ready pid status
mkfifo -m 600 in out err ctl-in ctl-out adopted ready || exit 1
if [ -f "$BLOB" ] && [ -z "$PIWORK_NO_SNAPSHOT" ]; then
    set -- --snapshot-blob "$BLOB"
else
    set -- "$LAUNCHER"
fi
WARM=
for f in "$EXTENSIONS"/*.ts; do
    [ -f "$f" ] && WARM="${WARM:+$WARM:}$f"
done

(
    exec 5<>"$DIR/in" 6<>"$DIR/out" 7<>"$DIR/err" 8<>"$DIR/ctl-in" 9<>"$DIR/ctl-out"
    cd / || exit 1
    # --liftoff-only: NODE_FLAGS in supervisor.js (checked by tests/unit/test_pack_codecache.py).
    env -u PIWORK_TRANSPORT -u PIWORK_PORT -u UV_THREADPOOL_SIZE -u PIWORK_MODULES_MARK \
        PIWORK_WARM_EXTENSIONS="$WARM" PIWORK_LAUNCHER_CTL=fifo PIWORK_LAUNCHER_SCRIPT="$LAUNCHER" \
        setsid "$NODE" --liftoff-only "$@" \
        <"$DIR/in" >"$DIR/out" 2>"$DIR/err" 3<"$DIR/ctl-in" 4>"$DIR/ctl-out" \
        5>&- 6>&- 7>&- 8>&- 9>&- &
    pid=$!
    echo "$pid" > "$DIR/pid.new" && mv "$DIR/pid.new" "$DIR/pid"
    echo > "$DIR/ready"
    read -r _ < "$DIR/adopted"
    exec 5>&- 6>&- 7>&- 8>&- 9>&-
    wait "$pid"
    echo "$?" > "$DIR/status.new" && mv "$DIR/status.new" "$DIR/status"
) </dev/null >/dev/null 2>&1 &
read -r _ < "$DIR/ready"
