#!/usr/bin/env bash
# Remove what deploy/install.sh installed (see docs/deployment.md).
#
#   uninstall.sh           stops and disables the service, removes the unit, $PREFIX (venv, docs)
#                          and an unedited /etc/gpuwear/config.yaml; KEEPS an edited configuration,
#                          drop-ins (/etc/systemd/system/gpuwear.service.d) and the wear ledger
#                          (/var/lib/gpuwear, /var/lib/private/gpuwear)
#   uninstall.sh --purge   also removes the edited configuration, the drop-ins and the wear ledger
#
# Environment: DESTDIR and PREFIX as for install.sh (with DESTDIR, systemctl is not called).
set -euo pipefail

REPO=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/opt/gpuwear}
UNIT_NAME=gpuwear.service
purge=no

say() { printf 'uninstall.sh: %s\n' "$*"; }
die() { printf 'uninstall.sh: %s\n' "$*" >&2; exit 1; }

for arg in "$@"; do
    case "$arg" in
        --purge) purge=yes ;;
        -h|--help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) die "unknown argument '$arg' (usage: uninstall.sh [--purge])" ;;
    esac
done

case "$PREFIX" in
    /?*) PREFIX=${PREFIX%/} ;;
    *) die "PREFIX must be an absolute path other than /, got '$PREFIX'" ;;
esac
[ "$PREFIX" != / ] || die "PREFIX must not be /"
DESTDIR=${DESTDIR%/}
if [ -z "$DESTDIR" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (or set DESTDIR)"
fi

unit_dir=$DESTDIR/etc/systemd/system
unit=$unit_dir/$UNIT_NAME
config_dir=$DESTDIR/etc/gpuwear
config=$config_dir/config.yaml
pristine=$DESTDIR$PREFIX/share/gpuwear/config.yaml
systemd=no
if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; then
    systemd=yes
fi

# 1. the service
if [ "$systemd" = yes ] && [ -e "$unit" ]; then
    systemctl disable --now "$UNIT_NAME" || true
    say "stopped and disabled gpuwear"
fi
rm -f "$unit_dir/multi-user.target.wants/$UNIT_NAME"
if [ -e "$unit" ]; then
    rm -f "$unit"
    say "removed $unit"
fi
if [ -d "$unit.d" ]; then
    if [ "$purge" = yes ]; then
        rm -rf "$unit.d"
        say "removed the drop-ins $unit.d"
    else
        say "kept the drop-ins $unit.d (--purge removes them)"
    fi
fi

# 2. the configuration: removed when it is a default gpuwear installed, else kept
if [ -e "$config" ]; then
    if { [ -e "$pristine" ] && cmp -s "$config" "$pristine"; } || cmp -s "$config" "$REPO/config.yaml" \
            || [ "$purge" = yes ]; then
        rm -f "$config"
        say "removed $config"
    else
        say "kept your edited $config (--purge removes it)"
    fi
fi
rm -f "$config.new"
rmdir "$config_dir" 2>/dev/null || true

# 3. the program
if [ -d "$DESTDIR$PREFIX" ]; then
    rm -rf "$DESTDIR$PREFIX/venv" "$DESTDIR$PREFIX/share/gpuwear" "$DESTDIR$PREFIX/share/doc/gpuwear"
    rmdir "$DESTDIR$PREFIX/share/doc" "$DESTDIR$PREFIX/share" "$DESTDIR$PREFIX" 2>/dev/null || true
    say "removed $DESTDIR$PREFIX/venv"
fi

# 4. the wear ledger (StateDirectory=gpuwear; with DynamicUser=yes it lives under /var/lib/private)
for state in "$DESTDIR/var/lib/gpuwear" "$DESTDIR/var/lib/private/gpuwear"; do
    if [ -e "$state" ] || [ -L "$state" ]; then
        if [ "$purge" = yes ]; then
            rm -rf "$state"
            say "removed the wear ledger $state"
        else
            say "kept the wear ledger $state (--purge removes it)"
        fi
    fi
done

if [ "$systemd" = yes ]; then
    systemctl daemon-reload
    systemctl reset-failed "$UNIT_NAME" 2>/dev/null || true
fi
say "done"
