#!/bin/busybox sh
# piwork workbench: the host's network settings for the root the agent's bash
# runs in (see piwork/net/guest.py). Run by setup.sh at each start, after the
# root is mounted and before it is "ready":
#
#   network.sh ROOT [NETDIR]     NETDIR defaults to /mnt/state/network
#
# NETDIR/ca.pem         extra certificate authorities (certificates only): put
#                       in the root's system store, taken out when gone
# NETDIR/debian-mirror  one URL: apt's sources use it instead of
#                       http://deb.debian.org/debian, and go back when gone
#
# Idempotent and quick when nothing changed (nothing is written then): the root
# is the task's environment disk, kept for the folder's next tasks.
ROOT=$1
NET=${2:-/mnt/state/network}
[ -n "$ROOT" ] && [ -d "$ROOT" ] || { echo "network.sh: no root" >&2; exit 1; }

BEGIN="# piwork: extra certificate authorities (rewritten by piwork at each start)"
END="# piwork: end of extra certificate authorities"
LOCAL=$ROOT/usr/local/share/ca-certificates/piwork
BUNDLE=$ROOT/etc/ssl/certs/ca-certificates.crt
RECORD=$ROOT/etc/piwork
DEB_DEFAULT=http://deb.debian.org/debian

# --- certificate authorities --------------------------------------------------
want=
[ -s "$NET/ca.pem" ] && want=$NET/ca.pem
marked=0
[ -f "$BUNDLE" ] && grep -qxF "$BEGIN" "$BUNDLE" && marked=1
if [ -n "$want" ] && [ $marked = 1 ] && cmp -s "$want" "$LOCAL/.set"; then
    : # the same CAs as last time: nothing to do
elif [ -n "$want" ] || [ $marked = 1 ] || [ -d "$LOCAL" ]; then
    # One file per certificate where update-ca-certificates looks (so an apt
    # upgrade of ca-certificates keeps them), and a marked block in the bundle
    # that every TLS library here reads (rewritten in place of the old one).
    rm -rf "$LOCAL"
    if [ -n "$want" ]; then
        mkdir -p "$LOCAL" "${BUNDLE%/*}"
        awk -v dir="$LOCAL" '
            /-----BEGIN CERTIFICATE-----/ { n++; f = sprintf("%s/piwork-%d.crt", dir, n); on = 1 }
            on { print > f }
            /-----END CERTIFICATE-----/ { on = 0; close(f) }
        ' "$want"
        cp "$want" "$LOCAL/.set"
    fi
    tmp=$BUNDLE.piwork-tmp
    if [ -f "$BUNDLE" ]; then
        awk -v b="$BEGIN" -v e="$END" '$0 == b { skip = 1; next } $0 == e { skip = 0; next } !skip' \
            "$BUNDLE" > "$tmp"
    else
        : > "$tmp"
    fi
    if [ -n "$want" ]; then
        { echo "$BEGIN"; cat "$want"; echo "$END"; } >> "$tmp"
    fi
    chmod 644 "$tmp"
    mv -f "$tmp" "$BUNDLE"
fi

# --- the Debian mirror ----------------------------------------------------------
mirror=
[ -s "$NET/debian-mirror" ] && read -r mirror < "$NET/debian-mirror"
case "$mirror" in
    http://*|https://*) ;;
    *) mirror= ;;
esac
case "$mirror" in
    *[!A-Za-z0-9:/._~%+@=-]*) mirror= ;;  # a URL piwork wrote has nothing else
esac
had=
[ -s "$RECORD/debian-mirror" ] && read -r had < "$RECORD/debian-mirror"
from=${had:-$DEB_DEFAULT}
to=${mirror:-$DEB_DEFAULT}
if [ "$from" != "$to" ]; then
    for f in "$ROOT/etc/apt/sources.list" "$ROOT"/etc/apt/sources.list.d/*.list \
             "$ROOT"/etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        grep -qF "$from" "$f" || continue
        # $from and $to hold only URL characters (checked above); '|' is not one.
        sed -e "s|$from\([-/ ]\)|$to\1|g" -e "s|$from\$|$to|" "$f" > "$f.piwork-tmp" \
            && chmod 644 "$f.piwork-tmp" && mv -f "$f.piwork-tmp" "$f"
    done
    # The record says what to turn back next time (a changed or removed mirror).
    if [ -n "$mirror" ]; then
        mkdir -p "$RECORD" && echo "$mirror" > "$RECORD/debian-mirror"
    else
        rm -f "$RECORD/debian-mirror"
    fi
fi
exit 0
