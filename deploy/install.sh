#!/usr/bin/env bash
# Install gpuwear on this machine as a systemd service (see docs/deployment.md):
#
#   $PREFIX/venv                          a virtual environment holding gpuwear (pip install of this repo)
#   $PREFIX/share/gpuwear/config.yaml     the default configuration as installed (to tell an edited one)
#   $PREFIX/share/doc/gpuwear/            docs/deployment.md, docs/alerts.md (the alerts' runbook)
#   $PREFIX/share/gpuwear/gpuwear-rules.yml  the Prometheus alert rules, their runbook_url set to RUNBOOK_URL
#   $PREFIX/share/gpuwear/dcgm-compat-rules.yml  recording rules giving dcgm-exporter's names (optional)
#   $PREFIX/share/gpuwear/gpuwear-fleet-rules.yml  recording rules for a fleet's year-long questions (optional)
#   /etc/systemd/system/gpuwear.service   the unit, its ExecStart pointing into $PREFIX
#   /etc/gpuwear/config.yaml              the configuration, never overwritten once edited
#
# Environment:
#   PREFIX=/opt/gpuwear   where the venv goes
#   DESTDIR=              staging root prepended to every path (packaging, tests); with it no user is
#                         created and systemctl is not called. A venv records its own path: one built
#                         under DESTDIR runs from there, so build the real one without DESTDIR.
#   PYTHON=python3        the interpreter the venv is made from (3.10 or newer)
#   PIP_ARGS=             extra arguments for pip install, split on spaces (e.g. "--no-index
#                         --find-links /srv/wheels" for a machine without an index)
#   WSL2=auto             yes: install the WSL2 drop-in (deploy/systemd/wsl2.conf: the GPU is /dev/dxg there);
#                         auto: when this kernel is WSL2's; no: never
#   RUNBOOK_URL=file://$PREFIX/share/doc/gpuwear/alerts.md
#                         where the alerts' runbook_url links point (absolute): set it to where your
#                         team reads docs/alerts.md (a wiki, a git host) for links that open anywhere
#
# Safe to run again: it upgrades gpuwear in place and keeps an edited configuration.
set -euo pipefail

REPO=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/opt/gpuwear}
PYTHON=${PYTHON:-python3}
PIP_ARGS=${PIP_ARGS:-}
RUNBOOK_URL=${RUNBOOK_URL:-file://$PREFIX/share/doc/gpuwear/alerts.md}
WSL2=${WSL2:-auto}
UNIT_NAME=gpuwear.service
SERVICE_USER=gpuwear

say() { printf 'install.sh: %s\n' "$*"; }
die() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }

case "$PREFIX" in
    /?*) PREFIX=${PREFIX%/} ;;
    *) die "PREFIX must be an absolute path other than /, got '$PREFIX'" ;;
esac
[ "$PREFIX" != / ] || die "PREFIX must not be /"
case "$RUNBOOK_URL" in
    *://*) ;;
    *) die "RUNBOOK_URL must be an absolute URL (https://..., file:///...), got '$RUNBOOK_URL'" ;;
esac
case "$RUNBOOK_URL" in *'|'*|*'#'*) die "RUNBOOK_URL must not contain '|' or '#', got '$RUNBOOK_URL'" ;; esac
case "$WSL2" in
    yes|no) ;;
    auto) if grep -qi microsoft /proc/sys/kernel/osrelease 2>/dev/null; then WSL2=yes; else WSL2=no; fi ;;
    *) die "WSL2 must be yes, no or auto, got '$WSL2'" ;;
esac
DESTDIR=${DESTDIR%/}
if [ -z "$DESTDIR" ] && [ "$(id -u)" -ne 0 ]; then
    die "run as root (or set DESTDIR to stage the files somewhere else)"
fi

venv=$DESTDIR$PREFIX/venv
share=$DESTDIR$PREFIX/share/gpuwear
unit_dir=$DESTDIR/etc/systemd/system
config_dir=$DESTDIR/etc/gpuwear
config=$config_dir/config.yaml
pristine=$share/config.yaml

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$PYTHON is older than 3.10; set PYTHON to a newer interpreter"
# The venv links to its interpreter: one under a home directory (pyenv, conda, ~/.local) is
# hidden from the service by ProtectHome=yes, which then fails with status 203/EXEC.
interpreter=$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable))')
case "$interpreter" in
    /root/*|/home/*|/run/user/*)
        message="$PYTHON is $interpreter, inside a home directory that the service cannot see (ProtectHome=yes): set PYTHON to a system interpreter, e.g. PYTHON=/usr/bin/python3"
        if [ -n "$DESTDIR" ]; then say "WARNING: $message"; else die "$message"; fi ;;
esac

# 1. the virtual environment and the package
if [ -x "$venv/bin/python" ]; then
    say "reusing the virtual environment $venv"
else
    say "creating the virtual environment $venv"
    mkdir -p "$(dirname "$venv")"
    "$PYTHON" -m venv "$venv"
fi
say "installing gpuwear from $REPO"
# pip builds inside the source tree, where a build/ left by an earlier build would smuggle
# deleted modules into the wheel: build from a clean copy instead (which also leaves the
# checkout untouched), of what the build reads alone (as the Dockerfile copies): a checkout
# after ./test.sh holds its test environments, hundreds of MB.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$REPO" --exclude=__pycache__ --exclude='*.egg-info' -cf - pyproject.toml README.md config.yaml daemon \
    | tar -C "$work" -xf -
say "building from a copy of what the build reads ($(du -sk "$work" | cut -f1) KiB)"
# shellcheck disable=SC2086  # PIP_ARGS is a list of words on purpose
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check $PIP_ARGS "$work"
# ISA-L's gzip (the isal extra) where it installs: a fifth of zlib's CPU a gzip'd scrape; never a failed install
# shellcheck disable=SC2086
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $PIP_ARGS "isal>=1.6.1" >/dev/null 2>&1
then
    say "isal could not be installed here: gzip'd scrapes use zlib (the same body, more CPU)"
fi
version=$("$venv/bin/gpuwear" --version)
say "installed $version"

install -d -m 0755 "$share" "$DESTDIR$PREFIX/share/doc/gpuwear"
install -m 0644 "$REPO/docs/deployment.md" "$DESTDIR$PREFIX/share/doc/gpuwear/deployment.md"
install -m 0644 "$REPO/docs/alerts.md" "$DESTDIR$PREFIX/share/doc/gpuwear/alerts.md"
sed -e "s|runbook_url: file:///opt/gpuwear/share/doc/gpuwear/alerts.md#|runbook_url: $RUNBOOK_URL#|" \
    "$REPO/deploy/prometheus/gpuwear-rules.yml" >"$work/gpuwear-rules.yml"
install -m 0644 "$work/gpuwear-rules.yml" "$share/gpuwear-rules.yml"
install -m 0644 "$REPO/deploy/prometheus/dcgm-compat-rules.yml" "$share/dcgm-compat-rules.yml"
install -m 0644 "$REPO/deploy/prometheus/gpuwear-fleet-rules.yml" "$share/gpuwear-fleet-rules.yml"
say "installed the alert rules $share/gpuwear-rules.yml (runbook: $RUNBOOK_URL); load them in Prometheus (docs/alerts.md)"

# 2. the unit, pointing at PREFIX (the path on the target, without DESTDIR)
install -d -m 0755 "$unit_dir"
unit_tmp=$work/gpuwear.service
sed -e "s|/opt/gpuwear/|$PREFIX/|g" "$REPO/deploy/systemd/$UNIT_NAME" >"$unit_tmp"
if cmp -s "$unit_tmp" "$unit_dir/$UNIT_NAME"; then
    say "$unit_dir/$UNIT_NAME is up to date"
else
    install -m 0644 "$unit_tmp" "$unit_dir/$UNIT_NAME"
    say "installed $unit_dir/$UNIT_NAME"
fi

dropin=$unit_dir/$UNIT_NAME.d/wsl2.conf
if [ "$WSL2" = yes ]; then
    install -d -m 0755 "$unit_dir/$UNIT_NAME.d"
    install -m 0644 "$REPO/deploy/systemd/wsl2.conf" "$dropin"
    say "WSL2: installed $dropin (the GPU is /dev/dxg here)"
fi

# 3. the configuration: a new one, an unedited one refreshed, an edited one kept
install -d -m 0755 "$config_dir"
if [ ! -e "$config" ]; then
    install -m 0644 "$REPO/config.yaml" "$config"
    say "installed the default configuration $config"
elif cmp -s "$config" "$REPO/config.yaml"; then
    say "$config is the default configuration"
elif [ -e "$pristine" ] && cmp -s "$config" "$pristine"; then
    install -m 0644 "$REPO/config.yaml" "$config"
    say "updated the unedited configuration $config to this version's default"
else
    install -m 0644 "$REPO/config.yaml" "$config.new"
    say "kept your edited $config; this version's default is beside it as $config.new (compare them)"
fi
if [ -e "$config.new" ] && cmp -s "$config" "$REPO/config.yaml"; then
    rm -f "$config.new"
fi
install -m 0644 "$REPO/config.yaml" "$pristine"
"$venv/bin/gpuwear" check-config "$config" >/dev/null \
    || say "WARNING: $config has problems (listed above); the service will refuse to start until they are fixed"

# 4. the service user: none to create while the unit allocates one (DynamicUser=yes)
if grep -q '^DynamicUser=yes' "$unit_dir/$UNIT_NAME"; then
    say "no user to create: the unit runs as a transient user (DynamicUser=yes)"
elif [ -n "$DESTDIR" ]; then
    say "DESTDIR is set: not creating the system user '$SERVICE_USER' (create it on the target)"
elif id -u "$SERVICE_USER" >/dev/null 2>&1; then
    say "system user '$SERVICE_USER' exists"
else
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$SERVICE_USER"
    say "created the system user '$SERVICE_USER'"
fi

# 5. systemd
if [ -n "$DESTDIR" ]; then
    say "DESTDIR is set: not calling systemctl"
elif [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    if systemctl is-active --quiet "$UNIT_NAME"; then
        say "gpuwear is running the previous version: systemctl restart gpuwear"
    elif ! systemctl is-enabled --quiet "$UNIT_NAME" 2>/dev/null; then
        say "start it now and at every boot: systemctl enable --now gpuwear"
    fi
    say "then: curl -s http://127.0.0.1:9941/metrics | head; journalctl -u gpuwear"
else
    say "systemd is not running here: start the daemon by hand with $PREFIX/venv/bin/gpuwear run --config /etc/gpuwear/config.yaml"
fi
