"""Streaming rainflow cycle counting (ASTM E1049-85, section 5.4.4), with a hysteresis gate.

Temperatures arrive one at a time. A *reversal* is confirmed when the signal has moved
back from its last extreme by more than the gate, so that swings of at most the gate (sensor
noise: a ±1 °C flicker makes 2 °C swings) never make cycles. Confirmed reversals go through the E1049
three-point rule: closed full cycles and the half cycles that contain the starting point
are final; what is left (the *residue*) is persisted, so that a cycle spanning a daemon
restart is counted once. At read time the residue is counted as half cycles (0.5 each),
as E1049 does at the end of a history.

The result equals ``rainflow.extract_cycles`` (the ``rainflow`` package) on the same series
when the gate is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

# (range, peak, count): range and peak in the signal's unit (°C); count 1.0 or 0.5
Cycle = tuple[float, float, float]


@dataclass
class RainflowCounter:
    """Counts cycles of one signal; ``on_cycle`` receives each final (range, peak, count)."""

    gate: float = 2.0
    stack: list[float] = field(default_factory=list)  # confirmed reversals not yet closed
    extreme: float | None = None  # the extreme reached since the last confirmed reversal
    direction: int = 0  # +1 rising, -1 falling, 0 unknown (only the start seen so far)

    def push(self, x: float, on_cycle: Callable[[Cycle], None]) -> None:
        """Feed one value."""
        if self.extreme is None:
            self._reversal(x, on_cycle)  # the first point starts the history
            self.extreme = x
            return
        if self.direction == 0:
            start = self.stack[-1]
            if abs(x - start) > self.gate:
                self.direction = 1 if x > start else -1
                self.extreme = x
            return
        if (x - self.extreme) * self.direction > 0:
            self.extreme = x  # further in the same direction
            return
        if abs(self.extreme - x) > self.gate:
            self._reversal(self.extreme, on_cycle)
            self.direction = -self.direction
            self.extreme = x

    def _reversal(self, x: float, on_cycle: Callable[[Cycle], None]) -> None:
        s = self.stack
        s.append(x)
        while len(s) >= 3:
            newest = abs(s[-1] - s[-2])
            previous = abs(s[-2] - s[-3])
            if newest < previous:
                return
            if len(s) == 3:  # the range holds the starting point: a final half cycle
                on_cycle((previous, max(s[0], s[1]), 0.5))
                s.pop(0)
            else:
                on_cycle((previous, max(s[-3], s[-2]), 1.0))
                last = s.pop()
                del s[-2:]
                s.append(last)

    def residue(self) -> list[Cycle]:
        """The cycles if the history ended now (E1049's end of history): the last extreme
        taken as a reversal, then every remaining range counted as a half cycle (0.5).
        The counter itself is not changed."""
        ending = RainflowCounter(self.gate, list(self.stack))
        cycles: list[Cycle] = []
        if self.direction != 0 and self.extreme is not None:
            ending._reversal(self.extreme, cycles.append)
        points = ending.stack
        cycles.extend((abs(b - a), max(a, b), 0.5) for a, b in pairwise(points))
        return cycles

    def to_json(self) -> dict[str, Any]:
        return {"gate": self.gate, "stack": self.stack, "extreme": self.extreme, "direction": self.direction}

    @classmethod
    def from_json(cls, data: dict[str, Any], gate: float) -> RainflowCounter:
        """Restore a persisted counter; a changed gate applies from now on."""
        return cls(gate=gate, stack=[float(v) for v in data.get("stack", [])],
                   extreme=None if data.get("extreme") is None else float(data["extreme"]),
                   direction=int(data.get("direction", 0)))
