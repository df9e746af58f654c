#!/bin/busybox sh
# piwork: the working folder as the agent sees it (docs/change-sets.md).
#
#   folder.sh CACHE      CACHE: the 9p cache mode of the read-only lower layer
#
# The person's folder (9p tag "pwwork", exported read-only by QEMU) is the
# lower layer of an overlay at /mnt/work; the upper layer, where every write
# of the agent lands, is the task's own layer disk (a SCSI disk whose model is
# "pwlayer", hot-plugged by the host before "start") or, without one, RAM.
# The host takes what the upper holds as change sets (supervisor/layer.js).
# Run by the supervisor's "start", before pi enters /mnt/work; never in a
# saved template (a restored VM mounts its own task's folder).
F=/run/piwork/folder
LOWER=$F/lower
DISK=$F/layer
MERGED=/mnt/work
CACHE=${1:-loose}
WB=/run/workbench/lower

fail() {
    echo "piwork: folder: $*" > /dev/console
    echo "$*" > "$F/error"
    exit 1
}
mounted() { grep -q " $1 " /proc/mounts; }
mkdir -p "$LOWER" "$DISK" "$MERGED"
rm -f "$F/error"

mounted "$LOWER" || mount -t 9p -o "trans=virtio,version=9p2000.L,msize=512000,cache=$CACHE,ro" pwwork "$LOWER" \
    || fail "cannot mount the working folder (9p pwwork)"

is_layer() { read -r model < "$1/device/model" 2>/dev/null; [ "$model" = pwlayer ]; }
# The layer disk joins the SCSI bus just before "start" when the host has one
# for the task; it is there within a moment (the bus scan is asynchronous).
dev=
if [ -e /sys/bus/scsi ] && [ "$(cat "$F/want-disk" 2>/dev/null)" = 1 ]; then
    i=0
    while [ -z "$dev" ] && [ $i -lt 300 ]; do
        for d in /sys/block/sd*; do [ -e "$d" ] && is_layer "$d" && dev=/dev/${d##*/}; done
        [ -n "$dev" ] || { sleep 0.05; i=$((i + 1)); }
    done
    [ -n "$dev" ] || fail "the task's layer disk did not appear within 15 s"
fi
if mounted "$DISK"; then
    :
elif [ -n "$dev" ]; then
    if ! mount -t ext4 -o noatime,noinit_itable "$dev" "$DISK" 2>/dev/null; then
        if ! mounted "$WB"; then
            wb=
            for d in /sys/block/vd*; do
                [ "$(cat "$d/serial" 2>/dev/null)" = pwworkbench ] && wb=/dev/${d##*/}
            done
            [ -n "$wb" ] || fail "no mke2fs: the pack's workbench image is not attached"
            mkdir -p "$WB"
            mount -t erofs -o ro "$wb" "$WB" || fail "cannot mount the workbench image ($wb)"
        fi
        # A new layer disk reads as zeros: format it (never anything else).
        /bin/busybox sh /opt/piwork/workbench/blank-ext4.sh "$WB" "$dev" pwlayer "$F/mkfs.log"
        case $? in
            0) ;;
            2) fail "the task's layer disk holds data that does not mount as ext4" ;;
            *) fail "formatting the task's layer disk failed: $(tail -n 3 "$F/mkfs.log")" ;;
        esac
        mount -t ext4 -o noatime,noinit_itable "$dev" "$DISK" || fail "cannot mount the new layer disk"
    fi
else
    mount -t tmpfs -o mode=0755 tmpfs "$DISK" || fail "cannot make a layer in RAM"
fi
mkdir -p "$DISK/upper" "$DISK/work"
# Paths the person undid since the last run (piwork undo): the agent sees the
# folder's version again. One path per line, relative, checked by the host.
if [ -s "$F/forget" ]; then
    while IFS= read -r rel; do
        case "$rel" in "" | /* | *..*) continue ;; esac
        rm -rf "$DISK/upper/$rel"
    done < "$F/forget"
fi
if ! mounted "$MERGED"; then
    # redirect_dir=off: a folder of the lower renamed is copied (the change set
    # then says plainly what went where); index/metacopy off: whole files only.
    mount -t overlay overlay \
        -o "lowerdir=$LOWER,upperdir=$DISK/upper,workdir=$DISK/work,redirect_dir=off,index=off,metacopy=off,xino=off" \
        "$MERGED" || fail "cannot mount the agent's layer over the working folder"
fi
touch "$F/ready"
