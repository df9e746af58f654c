#!/bin/busybox sh
# piwork workbench: build the root the agent's bash runs in (see
# piwork/pack/workbench.py and docs/guest-protocol.md).
#
# Run by the supervisor on "start", after the 9p shares are mounted, while pi
# starts (pi does not need this root until its first bash call; the bash
# wrapper beside this file waits for "ready"). Never run in a saved template:
# a restored VM gets its task's disk hot-plugged first, then this runs.
#
#   setup.sh disk    the task's writable disk (virtio-scsi, /dev/sd*) is the upper layer
#   setup.sh image   the same, over an imported image (piwork env import: a read-only
#                    erofs SCSI disk whose model is "pwimage") instead of the Debian image
#   setup.sh tmpfs   no disk from the host: an upper layer in RAM, gone at power-off
#
# root = overlay(lower: the pack's read-only Debian image, upper: the disk)
# with /proc /sys /dev /tmp /mnt (the task's shares) and /opt/piwork bound in.
B=/run/workbench
LOWER=$B/lower
IMAGE=$B/image
DISK=$B/disk
ROOT=$B/root
MODE=${1:-tmpfs}

fail() {
    echo "$*" > "$B/error"
    echo "piwork: workbench: $*" > /dev/console
    exit 1
}
mkdir -p "$LOWER" "$IMAGE" "$DISK" "$ROOT"
rm -f "$B/ready" "$B/error"

mounted() { grep -q " $1 " /proc/mounts; }

# The pack's workbench image: the virtio-blk disk whose serial is "pwworkbench".
dev=
for d in /sys/block/vd*; do
    [ "$(cat "$d/serial" 2>/dev/null)" = pwworkbench ] && dev=/dev/${d##*/}
done
[ -n "$dev" ] || fail "the pack's workbench image is not attached"
mounted "$LOWER" || mount -t erofs -o ro "$dev" "$LOWER" || fail "cannot mount the workbench image ($dev)"

# An imported image's SCSI disk says "pwimage" as its model; the environment disk does not.
is_image() { read -r model < "$1/device/model" 2>/dev/null; [ "$model" = pwimage ]; }
BASE=$LOWER
if [ "$MODE" = image ]; then
    i=0
    image=
    while [ -z "$image" ] && [ $i -lt 300 ]; do
        for d in /sys/block/sd*; do [ -e "$d" ] && is_image "$d" && image=/dev/${d##*/}; done
        [ -n "$image" ] || { sleep 0.05; i=$((i + 1)); }
    done
    [ -n "$image" ] || fail "the imported image's disk did not appear within 15 s"
    mounted "$IMAGE" || mount -t erofs -o ro "$image" "$IMAGE" || fail "cannot mount the imported image ($image)"
    BASE=$IMAGE
fi
if [ "$MODE" = disk ] || [ "$MODE" = image ]; then
    # Hot-plugged by the host just before "start" (piwork.agent): wait for it.
    i=0
    disk=
    while [ -z "$disk" ] && [ $i -lt 300 ]; do
        for d in /sys/block/sd*; do [ -e "$d" ] && ! is_image "$d" && disk=/dev/${d##*/}; done
        [ -n "$disk" ] || { sleep 0.05; i=$((i + 1)); }
    done
    [ -n "$disk" ] || fail "the task's environment disk did not appear within 15 s"
    if ! mounted "$DISK" && ! mount -t ext4 -o noatime,noinit_itable "$disk" "$DISK" 2>/dev/null; then
        # Format only a blank disk (a new environment: its first MiB reads as
        # zeros); never over anything else, whatever made the mount fail.
        nonzero=$(dd if="$disk" bs=65536 count=16 2>/dev/null | tr -d '\000' | wc -c)
        if [ $((nonzero)) -ne 0 ]; then
            fail "the environment disk holds data that does not mount as ext4; start clean (piwork run --clean-env, or piwork env reset)"
        fi
        # The image's own loader and libraries (this busybox root has no mke2fs).
        case $(uname -m) in
            aarch64) ld=lib/ld-linux-aarch64.so.1 triplet=aarch64-linux-gnu ;;
            *) ld=lib64/ld-linux-x86-64.so.2 triplet=x86_64-linux-gnu ;;
        esac
        MKE2FS_CONFIG=$LOWER/etc/mke2fs.conf "$LOWER/$ld" \
            --library-path "$LOWER/lib/$triplet:$LOWER/usr/lib/$triplet" \
            "$LOWER/sbin/mke2fs" -q -F -t ext4 -m 0 -L pwenv \
            -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 "$disk" > "$B/mkfs.log" 2>&1 \
            || fail "formatting the new environment disk failed: $(tail -n 3 "$B/mkfs.log")"
        # A new qcow2 reads as zeros: its inode tables need no zeroing, and the
        # kernel's background pass would write (and allocate on the host) ~256 MiB.
        mount -t ext4 -o noatime,noinit_itable "$disk" "$DISK" || fail "cannot mount the new environment disk"
    fi
else
    mounted "$DISK" || mount -t tmpfs -o mode=0755 tmpfs "$DISK" || fail "cannot make a tmpfs upper layer"
fi
# Long commands: their writes reach the disk within seconds, not 30 s (the
# bash wrapper syncs when each command ends).
echo 300 > /proc/sys/vm/dirty_expire_centisecs
echo 100 > /proc/sys/vm/dirty_writeback_centisecs
mkdir -p "$DISK/upper" "$DISK/work"
if ! mounted "$ROOT"; then
    mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$DISK/upper,workdir=$DISK/work" "$ROOT" \
        || fail "cannot mount the overlay root"
fi
for d in proc sys dev tmp run mnt opt/piwork; do mkdir -p "$ROOT/$d"; done
mounted "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
mounted "$ROOT/sys" || mount -o rbind /sys "$ROOT/sys"
mounted "$ROOT/dev" || mount -o rbind /dev "$ROOT/dev"
mounted "$ROOT/tmp" || mount -o bind /tmp "$ROOT/tmp"
mounted "$ROOT/run" || mount -t tmpfs -o mode=0755 tmpfs "$ROOT/run"
mounted "$ROOT/mnt" || mount -o rbind /mnt "$ROOT/mnt"
mounted "$ROOT/opt/piwork" || mount -o bind /opt/piwork "$ROOT/opt/piwork"
# The host's network settings: its extra certificate authorities in the root's
# system store, the Debian mirror in apt's sources (network.sh beside this file).
# A failure is said, not fatal: the agent's commands then say what they miss.
if ! /bin/busybox sh "${0%/*}/network.sh" "$ROOT" > "$B/network.log" 2>&1; then
    echo "piwork: workbench: the network settings were not applied: $(tail -n 3 "$B/network.log")" > /dev/console
fi
touch "$B/ready"
