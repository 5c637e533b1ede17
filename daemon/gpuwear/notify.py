"""systemd's notify protocol (Type=notify): READY=1, WATCHDOG=1, STATUS= lines and more time for a long start, sent
to $NOTIFY_SOCKET; nothing where systemd did not start the daemon."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def sd_notify(message: str) -> bool:
    """Tell systemd (Type=notify) ``message``, e.g. "READY=1"; False when not run by systemd."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(message.encode())
    except OSError as exc:
        log.warning("sd_notify %r failed: %s", message, exc)
        return False
    return True


# How much longer than systemd's TimeoutStartSec a start that must recover a damaged ledger may take (µs):
# recovery copies every readable row (about 2 s for a 3-year ledger of 8 GPUs on a quiet disk), and a start
# killed for its timeout would begin it again, and again at every restart.
RECOVERY_EXTEND_USEC = 600_000_000


def tell_systemd_recovering() -> None:
    """Before a damaged ledger is recovered: systemd gets more time to wait for READY=1, and a status line."""
    sd_notify(f"EXTEND_TIMEOUT_USEC={RECOVERY_EXTEND_USEC}\nSTATUS=recovering the damaged wear ledger (every row "
              "SQLite can still read is copied into a new one)")
