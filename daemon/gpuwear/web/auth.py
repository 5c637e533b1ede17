"""Basic auth at the front door: users' bcrypt hashes checked at most a few a second (a token bucket), verified
credentials remembered as keyed digests, unknown users costing the same check as wrong passwords."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Callable

REMEMBERED = 100  # verified credentials kept (as keyed digests)


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class BasicAuth:
    """The users of one web config. A credential that passed bcrypt once is remembered (a keyed digest,
    never the password) so that scrapes stay fast, as exporter-toolkit's cache does."""

    def __init__(self, users: dict[str, bytes] | None) -> None:
        self.users = dict(users or {})
        self._key = os.urandom(32)
        self._remembered: OrderedDict[bytes, None] = OrderedDict()
        costs = [h[4:6] for h in self.users.values()]
        # unknown users are checked against a real hash of the most common cost: the same work as a wrong password
        self._dummy = max(self.users.values(), key=lambda h: (costs.count(h[4:6]), h[4:6]), default=b"")

    def _digest(self, user: str, password: bytes) -> bytes:
        return hmac.new(self._key, user.encode() + b"\0" + password, hashlib.sha256).digest()

    def remembered(self, user: str, password: bytes) -> bool:
        """Whether this credential passed before (cheap)."""
        digest = self._digest(user, password)
        if digest in self._remembered:
            self._remembered.move_to_end(digest)
            return True
        return False

    def verify(self, user: str, password: bytes) -> bool:
        """bcrypt, on a worker thread (tens of milliseconds at cost 10). bcrypt reads 72 bytes at most:
        a longer password is refused, after the same work."""
        import bcrypt  # only where basic auth is configured

        hashed = self.users.get(user)
        ok = bcrypt.checkpw(password[:72], hashed if hashed is not None else self._dummy)
        if not (ok and hashed is not None and len(password) <= 72):
            return False
        self._remembered[self._digest(user, password)] = None
        while len(self._remembered) > REMEMBERED:
            self._remembered.popitem(last=False)
        return True


def credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from an ``Authorization: Basic`` header; None when absent or malformed."""
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).partition(b":")
        return (user.decode(), password) if sep else None
    except (binascii.Error, UnicodeDecodeError):
        return None
