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
    """Simulated time running ``speed`` times faster than the machine's monotonic clock.

    Wall time starts at the real wall time and advances with the scaled monotonic time,
    so a simulated day at ``speed=600`` takes 144 s and is stamped as a day.
    """

    def __init__(self, speed: float) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._mono0 = time.monotonic()
        self._wall0 = time.time()

    def monotonic(self) -> float:
        return self._mono0 + (time.monotonic() - self._mono0) * self.speed

    def wall(self) -> float:
        return self._wall0 + (self.monotonic() - self._mono0)

    def resume_after(self, wall: float) -> None:
        """Move simulated wall time on to just after ``wall`` (where an earlier run's history ends) if it is behind
        it: a run at --speed 600 ends hours ahead of the real clock, and the next one must not go back in time."""
        now = self.wall()
        if wall >= now:
            self._wall0 += wall - now + 1.0


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
