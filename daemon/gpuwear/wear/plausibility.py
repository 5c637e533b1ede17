"""Plausibility before belief: temperature readings a GPU cannot physically give are dropped, and counted
per reason, before they reach the histograms, Arrhenius aging and rainflow (docs/wear-model.md, "Readings
that are not believed").

- ``above_shutdown``: above the card's own shutdown threshold (NVML's, read with the sample or remembered
  for the GPU; where none is known, DEFAULT_SHUTDOWN_CELSIUS, above every NVIDIA GPU's), plus a margin for
  sensor noise: the card powers itself off before its die gets there.
- ``spike``: a lone reading that both of its neighbours contradict: it jumps at least SPIKE_CELSIUS away
  from the reading before it and the reading after it comes back (within SPIKE_CELSIUS / 3 of the one
  before), each neighbour at most SPIKE_SECONDS away. A die cannot heat by 15 °C and cool back within
  seconds: the fast (die) time constant fitted on the real traces is ~19 s. Readings further apart than
  that are not judged this way (a 60 s log may truly swing between 40 and 70 °C). One 140 °C glitch in a
  45 °C log otherwise adds a 95 °C cycle (worth ~7 reference cycles) and multiplies Arrhenius aging by ~5.
  A reading with a neighbour on one side only within SPIKE_SECONDS (the first or last of a series: of a log,
  or beside a gap or a pause over SPIKE_SECONDS) is judged by that one: EDGE_SPIKE_CELSIUS away (:func:`edge_spike`;
  :class:`SpikeFilter`, the importers' filter, applies it).

Die and memory (HBM) readings are judged each on their own, by the same rules (a memory spike is counted as
``memory_spike``); the shutdown threshold is the die's alone.

Deciding a spike needs the next reading: only a :func:`suspect` reading (far from the last believed one,
soon after it) can be one, and :func:`is_spike` decides it with the next. :class:`SpikeFilter` (imports)
answers every reading one late; the live tracker holds back only suspect samples, with the same two
functions. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Generic, TypeVar

SPIKE_CELSIUS = 15.0
SPIKE_SECONDS = 10.0  # neighbours further apart than this do not judge a reading
# a reading with one neighbour only (the first of a log or after a gap, the last before a gap or the end) is a
# spike when that neighbour, within SPIKE_SECONDS, is this much away: twice the two-sided rule's jump, as one
# neighbour cannot say it comes back (a 0 °C first row beside a 60 °C log added a 60 °C cycle)
EDGE_SPIKE_CELSIUS = 2 * SPIKE_CELSIUS
SHUTDOWN_MARGIN_CELSIUS = 5.0
DEFAULT_SHUTDOWN_CELSIUS = 110.0  # NVML shutdown thresholds are about 90-105 °C

T = TypeVar("T")

# shutdown thresholds of products an imported log names (its name column), for a card the ledger has no thresholds
# of: "GPU Shutdown Temp : 92 C" in the `nvidia-smi -q` of A100 80GB PCIe, A100-SXM4, A800 PCIe and H100 80GB HBM3
# cards in public bug reports. A name matching none is judged against DEFAULT_SHUTDOWN_CELSIUS.
PRODUCT_SHUTDOWN_CELSIUS = ((re.compile(r"\bA100\b"), 92.0), (re.compile(r"\bA800\b"), 92.0),
                            (re.compile(r"\bH100\b"), 92.0))


def product_shutdown(name: str | None) -> float | None:
    """The shutdown threshold (°C) of the product a card's name names, where known (PRODUCT_SHUTDOWN_CELSIUS)."""
    for pattern, celsius in PRODUCT_SHUTDOWN_CELSIUS:
        if name and pattern.search(name):
            return celsius
    return None


def shutdown_limit(shutdown: float | None) -> float:
    """The highest die reading believed, given the card's shutdown threshold (None: not known)."""
    return (DEFAULT_SHUTDOWN_CELSIUS if shutdown is None else shutdown) + SHUTDOWN_MARGIN_CELSIUS


def above_shutdown(celsius: float, shutdown: float | None) -> bool:
    """Whether a die reading is above what the card lets its die reach."""
    return celsius > shutdown_limit(shutdown)


def suspect(before: tuple[float, float] | None, time: float, celsius: float | None) -> bool:
    """Whether a reading may be a lone spike, given the last believed reading ``before`` (time, °C)."""
    return (celsius is not None and before is not None and time - before[0] <= SPIKE_SECONDS
            and abs(celsius - before[1]) >= SPIKE_CELSIUS)


def is_spike(before: tuple[float, float] | None, time: float, celsius: float | None, next_time: float | None,
             next_celsius: float | None) -> bool:
    """Whether a reading is a lone spike: suspect, and the next reading (within SPIKE_SECONDS) comes back
    to within SPIKE_CELSIUS / 3 of the one before it, from the other side."""
    if not suspect(before, time, celsius) or next_time is None or next_celsius is None:
        return False
    assert before is not None and celsius is not None
    if next_time - time > SPIKE_SECONDS:
        return False
    up, down = celsius - before[1], celsius - next_celsius
    return abs(down) >= SPIKE_CELSIUS and (up > 0) == (down > 0) and abs(next_celsius - before[1]) <= SPIKE_CELSIUS / 3


def edge_spike(before: tuple[float, float] | None, time: float, celsius: float | None, next_time: float | None,
               next_celsius: float | None) -> bool:
    """Whether a reading with a neighbour on one side only is a lone spike: no believed reading before it (the
    first of a series) and the next one within SPIKE_SECONDS at least EDGE_SPIKE_CELSIUS away; or none after it
    (the series ends) and the one before it so."""
    if celsius is None:
        return False
    if before is None and next_time is not None and next_celsius is not None:
        return next_time - time <= SPIKE_SECONDS and abs(celsius - next_celsius) >= EDGE_SPIKE_CELSIUS
    if before is not None and next_time is None:
        return time - before[0] <= SPIKE_SECONDS and abs(celsius - before[1]) >= EDGE_SPIKE_CELSIUS
    return False


@dataclass
class SpikeFilter(Generic[T]):
    """Readings in time order in, each out one step later with its verdict: (item, True) when it is a lone
    spike. ``push`` returns the previous item's verdict (None at the first); ``flush`` the last one's."""

    _before: tuple[float, float] | None = None  # (time, °C) of the last reading believed
    _held: tuple[T, float, float | None] | None = None  # (item, time, °C or None) awaiting its verdict
    spikes: int = 0

    def push(self, item: T, time: float, celsius: float | None) -> tuple[T, bool] | None:
        if self._held is not None and time - self._held[1] > SPIKE_SECONDS:  # too far to judge each other: the
            out = self.reset()  # held reading ends its series, this one begins the next
        else:
            out = self._decide(time, celsius)
        self._held = (item, time, celsius)
        return out

    def flush(self) -> tuple[T, bool] | None:
        out = self._decide(None, None)
        self._held = None
        return out

    def reset(self) -> tuple[T, bool] | None:
        """A break in the series (a gap): the held reading is decided without a next one, and the next is new."""
        out = self.flush()
        self._before = None
        return out

    def _decide(self, time: float | None, celsius: float | None) -> tuple[T, bool] | None:
        if self._held is None:
            return None
        item, t, c = self._held
        spike = is_spike(self._before, t, c, time, celsius) or edge_spike(self._before, t, c, time, celsius)
        if c is not None and not spike:
            self._before = (t, c)
        self.spikes += spike
        return item, spike
