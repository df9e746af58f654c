#!/bin/busybox sh
# piwork: format a new disk as ext4, only if it is blank (its first MiB reads as
# zeros: a new qcow2), never over anything else, whatever made its mount fail.
# Used by setup.sh (the environment disk) and supervisor/folder.sh (the working
# folder's layer disk).
#
#   blank-ext4.sh IMAGE DEV LABEL LOG
#
# IMAGE: the mounted workbench image (its mke2fs, run with its own loader and
# libraries). Exit 2: the disk is not blank; 1: mke2fs failed (LOG says why).
WB=$1
DEV=$2
LABEL=$3
LOG=$4
nonzero=$(dd if="$DEV" bs=65536 count=16 2>/dev/null | tr -d '\000' | wc -c)
[ $((nonzero)) -eq 0 ] || exit 2
# lazy_itable_init: a new qcow2 reads as zeros, its inode tables need no zeroing
# (the kernel's background pass would write, and allocate on the host, ~256 MiB).
# The image's own loader and libraries (the busybox root has no mke2fs).
case $(uname -m) in
    aarch64) ld=lib/ld-linux-aarch64.so.1 triplet=aarch64-linux-gnu ;;
    *) ld=lib64/ld-linux-x86-64.so.2 triplet=x86_64-linux-gnu ;;
esac
MKE2FS_CONFIG=$WB/etc/mke2fs.conf "$WB/$ld" \
    --library-path "$WB/lib/$triplet:$WB/usr/lib/$triplet" \
    "$WB/sbin/mke2fs" -q -F -t ext4 -m 0 -L "$LABEL" \
    -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 "$DEV" > "$LOG" 2>&1 || exit 1
