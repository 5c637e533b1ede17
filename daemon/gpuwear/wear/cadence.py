"""When a pause between two readings of an imported log is a gap (time not observed) rather than observed time.

A log's gap threshold is GAP_CADENCE_MULTIPLE times its cadence (the median of its first intervals), at least the
live daemon's ``max_gap_seconds`` and at most MAX_IMPORT_GAP_SECONDS (:func:`gap_threshold`). A log whose cadence
changes part way (a minute of ``nvidia-smi -l 1``, then hours of ``-l 60``) is judged stretch by stretch as well:
an interval is observed time also when it is within the threshold of the STRETCH_INTERVALS intervals just before
it (their median, :func:`stretch_threshold`), so the sparser stretch is integrated once it has shown its cadence,
its first few intervals being gaps. A threshold given by the user is used alone. Both importers (the row reader,
imports/backfill.py, and the columnar one, wear/batch.py) apply these, and are held equal by tests. Pure: no I/O,
no clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

GAP_CADENCE_MULTIPLE = 5.0  # a pause longer than this many sampling intervals is a gap, not observed time
MAX_IMPORT_GAP_SECONDS = 3600.0  # ... but never more than an hour, however sparse the log
STRETCH_INTERVALS = 5  # the intervals just before one, between readings with no break, that judge it too


def gap_threshold(cadence: float | None, live_max_gap: float) -> float:
    """The longest pause between two rows that still counts as observed time: GAP_CADENCE_MULTIPLE times the
    log's median interval, at least the live daemon's ``max_gap_seconds`` and at most MAX_IMPORT_GAP_SECONDS.
    A log kept with ``nvidia-smi -l 60`` integrates its 60 s intervals; a 1 s log keeps the live 30 s."""
    if cadence is None:
        return live_max_gap
    return min(max(live_max_gap, GAP_CADENCE_MULTIPLE * cadence), max(live_max_gap, MAX_IMPORT_GAP_SECONDS))


def stretch_threshold(max_gap: float, recent: Sequence[float], live_max_gap: float) -> float:
    """The threshold for the next interval: the log's (``max_gap``), or that of the stretch it is in when higher,
    once ``recent`` holds STRETCH_INTERVALS intervals (the newest last)."""
    if len(recent) < STRETCH_INTERVALS:
        return max_gap
    return max(max_gap, gap_threshold(statistics.median(list(recent)[-STRETCH_INTERVALS:]), live_max_gap))
