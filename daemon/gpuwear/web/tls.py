"""TLS at the front door: the context for new connections, rebuilt when the certificate files change on disk."""

from __future__ import annotations

import logging
import os
import ssl
import time

from gpuwear.webconfig import TlsSettings

log = logging.getLogger(__name__)

TLS_RECHECK_SECONDS = 1.0  # certificate files are looked at no more often than this


class TlsContexts:
    """The TLS context for new connections, rebuilt when the certificate, key or CA files change on disk
    (looked at once a second at most); a broken new file is logged once and the last good context kept."""

    def __init__(self, settings: TlsSettings) -> None:
        self.settings = settings
        self._stamp = self._stat()
        self._context = settings.context()
        self._checked = time.monotonic()
        self._refused: object = None

    def _stat(self) -> tuple[tuple[int, int, int] | None, ...]:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self.settings.files():
            try:
                st = os.stat(path)
                stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < TLS_RECHECK_SECONDS:
            return self._context
        self._checked = now
        stamp = self._stat()
        if stamp != self._stamp and stamp != self._refused:
            try:
                self._context = self.settings.context()
                self._stamp = stamp
                log.info("TLS: certificate files changed on disk; new connections use them")
            except (OSError, ssl.SSLError, ValueError) as exc:
                self._refused = stamp  # said once per change
                log.warning("TLS: certificate files changed on disk but cannot be used (%s); keeping the "
                            "previous certificate", exc)
        return self._context
