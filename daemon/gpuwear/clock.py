"""Clocks, injected wherever time is read, so that tests and ``--speed`` control time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Time source: ``monotonic()`` for intervals, ``wall()`` (Unix seconds) for timestamps."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The machine's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class ScaledClock:
    """Simulated time running ``speed`` times faster than a real clock (``base``: the machine's by default).

    Wall time starts at the real wall time and advances with the scaled monotonic time,
    so a simulated day at ``speed=600`` takes 144 s and is stamped as a day.
    """

    def __init__(self, speed: float, base: Clock | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self.base = base or SystemClock()
        self._mono0 = self.base.monotonic()
        self._wall0 = self.base.wall()

    def monotonic(self) -> float:
        return self._mono0 + (self.base.monotonic() - self._mono0) * self.speed

    def wall(self) -> float:
        return self._wall0 + (self.monotonic() - self._mono0)

    def lead(self) -> float:
        """Seconds simulated time is ahead of the real clock (what a faster-than-real run gained)."""
        return self.wall() - self.base.wall()

    def resume(self, lead: float | None, history_end: float, slack: float = 0.0) -> None:
        """Go on from an earlier run: ``lead`` ahead of the real clock, the lead that run had gained (its history then
        ends before now, and the next run never goes back into it); a history that ends up to ``slack`` seconds
        later (the lead it gained since the lead was last written) is gone on from. A real clock that was ahead
        while that history was written and has been corrected since goes back, as on real GPUs: the daemon takes
        the lead back. Without a recorded lead (a ledger from before it was kept), just after ``history_end``
        where that is ahead."""
        now = self.wall()
        if lead is not None:
            self._wall0 += max(0.0, lead) - (now - self.base.wall())
            now = self.wall()
            if now < history_end <= now + slack:
                self._wall0 += history_end - now + 1.0
        elif history_end >= now:
            self._wall0 += history_end - now + 1.0


class ManualClock:
    """A clock that only moves when told to (tests)."""

    def __init__(self, start_wall: float = 1_800_000_000.0) -> None:
        self._mono = 1000.0
        self._wall = start_wall

    def advance(self, seconds: float) -> None:
        self._mono += seconds
        self._wall += seconds

    def set_wall(self, seconds: float) -> None:
        """The wall clock is set (NTP step, an operator): monotonic time does not move."""
        self._wall = seconds

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall
