"""The wear accumulators of :class:`~gpuwear.wear.accumulate.GpuWear`, fed a whole series of readings at once
(numpy), for imports of long logs. Pure: no I/O, no clock.

The result is the one :meth:`GpuWear.add` gives reading by reading, bit for bit (tests/test_columnar.py holds
the two to identical ledgers on random and real logs): where the model is a sum (time, histograms, energy,
throttle and fan seconds) it is a left-to-right ``np.cumsum`` or ``np.bincount`` starting from the accumulator's
value, which add in the same order as ``+=``; the temperature series is reduced to its turning points before the
same streaming :class:`~gpuwear.wear.rainflow.RainflowCounter`; the cooling-health tracker runs over runs of
intervals. A series can be fed in pieces: the state the next piece starts from is the one ``GpuWear`` keeps
(counter baselines, cooling runs, the rainflow stack), plus :class:`Carry`.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from gpuwear.sample import CLOCK_EVENT_REASONS
from gpuwear.wear.accumulate import (
    IDLE_UTILIZATION,
    POWER_LIMIT_SHARE,
    STEADY_MIN_WATTS_ABOVE_IDLE,
    STEADY_SECONDS,
    STEADY_UTILIZATION,
    FanWear,
    GpuWear,
    cycle_key,
)
from gpuwear.wear.cadence import GAP_CADENCE_MULTIPLE, MAX_IMPORT_GAP_SECONDS, STRETCH_INTERVALS
from gpuwear.wear.plausibility import EDGE_SPIKE_CELSIUS, SPIKE_CELSIUS, SPIKE_SECONDS
from gpuwear.wear.rainflow import RainflowCounter

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]

# Series.kind: a reading; a break (the time to the next reading is not observed); a row of time counted elsewhere
READING, GAP, COVERED = 0, 1, 2


class ColumnarError(Exception):
    """The columnar path cannot reproduce the row path exactly for this input: the caller imports it row by
    row (nothing was written)."""


@dataclass
class Series:
    """Entries in time order: readings (base units, NaN = no reading) and breaks (``kind``)."""

    time: Floats  # Unix s
    kind: npt.NDArray[np.int8]
    die: Floats  # °C, nvmlDeviceGetTemperature (nvidia-smi temperature.gpu)
    memory: Floats  # °C, HBM (temperature.memory)
    power: Floats  # W (power.draw)
    limit: Floats  # W, enforced limit (enforced.power.limit)
    util: Floats  # 0..1 (utilization.gpu)
    energy: Floats  # J since driver load (NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
    fan: Floats  # 0..2, fan 0 (fan.speed); NaN with fan_present: a fan value outside its range
    fan_present: Bools
    reasons: Ints  # clock-event reason bitmask (clocks_event_reasons.active); -1: none read

    def __len__(self) -> int:
        return len(self.time)

    def take(self, index: slice | Ints | Bools) -> Series:
        return Series(*(getattr(self, f.name)[index] for f in fields(self)))

    @staticmethod
    def concat(parts: list[Series]) -> Series:
        return Series(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Series)))


@dataclass
class Carry:
    """Where a series fed in pieces stands between two pieces (the row path's ``previous``/``gap_from``)."""

    last: float | None = None  # the last reading integrated
    continuous: bool = False  # no break since it: the next reading's interval starts there
    gap_pending: bool = False  # the last break was a gap: the time from ``last`` to the next reading is a gap
    rows: int = 0
    first: float | None = None
    recent: tuple[float, ...] = ()  # the last STRETCH_INTERVALS intervals between readings with no break


def stretch_limits(d: Floats, recent: tuple[float, ...], max_gap: float, live_max_gap: float) -> Floats:
    """:func:`wear.cadence.stretch_threshold` for each of the intervals ``d`` in turn, ``recent`` the intervals
    before the first (the row reader's, held equal by tests/test_columnar.py)."""
    ext = np.concatenate([np.asarray(recent, dtype=float), d])
    k = len(recent)
    limits = np.full(len(d), max_gap)
    i = k + np.arange(len(d)) - STRETCH_INTERVALS  # the first of the STRETCH_INTERVALS before each
    ok = i >= 0
    if ok.any():
        medians = np.median(sliding_window_view(ext[:-1], STRETCH_INTERVALS), axis=1)[i[ok]]
        stretch = np.minimum(np.maximum(live_max_gap, GAP_CADENCE_MULTIPLE * medians),
                             max(live_max_gap, MAX_IMPORT_GAP_SECONDS))
        limits[ok] = np.maximum(max_gap, stretch)
    return limits


def turning_points(x: Floats) -> Floats:
    """The points a hysteresis rainflow counter reacts to: repeats and strictly monotonic interior points are
    dropped, the first and last points kept. Feeding these instead of ``x`` leaves the counter in the same state
    with the same cycles, from any state (tests/test_columnar.py checks it on random series split anywhere)."""
    if len(x) < 3:
        return x
    keep = np.empty(len(x), dtype=bool)
    keep[0] = True
    keep[1:] = x[1:] != x[:-1]
    y = x[keep]
    if len(y) < 3:
        return y
    d = np.sign(np.diff(y))
    tp = np.ones(len(y), dtype=bool)
    tp[1:-1] = d[:-1] != d[1:]
    return y[tp]


def series_breaks(time: Floats, reading: Bools, last_time: float | None) -> Bools:
    """Where the spike filter's series break: at a break entry, and at a reading more than SPIKE_SECONDS after the
    reading before it (``last_time``: the entry before the first, when it was a reading)."""
    breaks = ~reading
    if len(time):
        previous = np.concatenate([[np.nan if last_time is None else last_time], time[:-1]])
        was_reading = np.concatenate([[last_time is not None], reading[:-1]])
        breaks = breaks | (reading & was_reading & (time - previous > SPIKE_SECONDS))
    return breaks


def spikes(time: Floats, celsius: Floats, reading: Bools, before: tuple[float, float] | None,
           last_time: float | None = None) -> Bools:
    """:class:`~gpuwear.wear.plausibility.SpikeFilter` over entries (readings and breaks) of which the last is
    decided with no next, given ``before``, the last believed reading. A reading's 'before' is the previous
    reading with a temperature since the last break, unless that one was a spike, in which case this one cannot
    be one (the spike's next reading came back within SPIKE_CELSIUS / 3 of the spike's own 'before'). A series also
    breaks between two readings more than SPIKE_SECONDS apart (:func:`series_breaks`; ``last_time``: the time of the
    entry before these, when it was a reading). A reading with a neighbour on one side only, within SPIKE_SECONDS,
    is judged by that one (plausibility.edge_spike)."""
    breaks = series_breaks(time, reading, last_time)
    if before is not None:
        time = np.concatenate([[before[0]], time])
        celsius = np.concatenate([[before[1]], celsius])
        reading = np.concatenate([[True], reading])
        breaks = np.concatenate([[False], breaks])
    n = len(time)
    has = reading & ~np.isnan(celsius)
    segment = np.cumsum(breaks)  # a break resets the filter
    index = np.where(has, np.arange(n), -1)
    prev = np.maximum.accumulate(np.concatenate([[-1], index[:-1]]))
    same = (prev >= 0) & (segment[np.clip(prev, 0, None)] == segment)
    following = np.zeros(n, dtype=bool)
    following[:-1] = has[1:] & ~breaks[1:]  # the next entry is a reading with a temperature in the same series
    out = np.zeros(n, dtype=bool)
    first = 1 if before is not None else 0  # the entry carried in is not judged again
    # a series' first reading, judged by its next one (EDGE_SPIKE_CELSIUS); when it is a spike, the one after it is
    # the series' first in turn (nothing before it is believed), and so on
    for i in np.flatnonzero(has & ~same & following).tolist():
        j = i
        while j >= first and following[j] and time[j + 1] - time[j] <= SPIKE_SECONDS \
                and abs(celsius[j] - celsius[j + 1]) >= EDGE_SPIKE_CELSIUS:
            out[j] = True
            j += 1
    candidates = np.flatnonzero(has & same & following)
    if len(candidates):
        p, k = prev[candidates], candidates + 1
        t, c = time[candidates], celsius[candidates]
        up, down = c - celsius[p], c - celsius[k]
        found = ((t - time[p] <= SPIKE_SECONDS) & (time[k] - t <= SPIKE_SECONDS) & (np.abs(up) >= SPIKE_CELSIUS)
                 & (np.abs(down) >= SPIKE_CELSIUS) & ((up > 0) == (down > 0))
                 & (np.abs(celsius[k] - celsius[p]) <= SPIKE_CELSIUS / 3))
        for i, pi in zip(candidates[found].tolist(), p[found].tolist(), strict=True):
            if not out[pi]:  # in order: a spike's successor is never one
                out[i] = True
    # a series' last reading (a break or the end after it), judged by the believed one before it
    last = np.ones(n, dtype=bool)
    last[:-1] = breaks[1:]
    for i in np.flatnonzero(has & same & last).tolist():
        pi = int(prev[i])
        if i >= first and not out[pi] and time[i] - time[pi] <= SPIKE_SECONDS \
                and abs(celsius[i] - celsius[pi]) >= EDGE_SPIKE_CELSIUS:
            out[i] = True
    return out[1:] if before is not None else out


def believed_after(time: Floats, celsius: Floats, reading: Bools, spike: Bools,
                   before: tuple[float, float] | None, last_time: float | None = None) -> tuple[float, float] | None:
    """The spike filter's 'before' after these entries: the last believed reading since the last break (a break
    entry, or two readings more than SPIKE_SECONDS apart: :func:`series_breaks`)."""
    breaks = np.flatnonzero(series_breaks(time, reading, last_time))
    believed = np.flatnonzero(reading & ~np.isnan(celsius) & ~spike)
    if len(believed) and (not len(breaks) or believed[-1] >= breaks[-1]):  # a series may start at a reading
        return float(time[believed[-1]]), float(celsius[believed[-1]])
    return None if len(breaks) else before


def _running(start: float, values: Floats) -> float:
    """``start`` plus the values added one by one, left to right (np.sum is pairwise: it rounds differently)."""
    return float(np.cumsum(np.concatenate([[start], values]))[-1]) if len(values) else start


def _bins(into: dict[str, float], keys: Ints, weights: Floats) -> None:
    """``into[str(key)] += weight`` row by row (np.bincount adds in order; present bins go first)."""
    if not len(keys):
        return
    old = [(int(k), v) for k, v in into.items() if k.lstrip("-").isdigit()]
    lo = min(int(keys.min()), min((k for k, _ in old), default=0))
    hi = max(int(keys.max()), max((k for k, _ in old), default=0))
    if hi - lo > 1_000_000:
        raise ColumnarError("bins too far apart")
    head = np.array([k for k, _ in old], dtype=np.int64)
    all_keys = np.concatenate([head, keys]) - lo
    sums = np.bincount(all_keys, weights=np.concatenate([np.array([v for _, v in old]), weights]))
    counts = np.bincount(keys - lo)
    for k in np.flatnonzero(counts).tolist():
        into[str(k + lo)] = float(sums[k])


def integrate(w: GpuWear, s: Series, max_gap: float, carry: Carry, live_max_gap: float | None = None) -> None:
    """Integrate decided entries into ``w`` as ``GpuWear.add``/``gap`` would, reading by reading, with the
    import's rules (backfill._integrate): an interval longer than ``max_gap`` is a gap (with ``live_max_gap``, the
    threshold found from the cadence, also judged stretch by stretch: :mod:`gpuwear.wear.cadence`); after a gap
    break, the time since the last reading is a gap; after a covered break, the next reading is a baseline."""
    reading = s.kind == READING
    positions = np.flatnonzero(reading)
    n = len(positions)
    if n == 0:
        _breaks_reset(s.kind, carry)
        return
    t = s.time[positions]
    # the breaks before each reading (since the reading before it), and the kind of the last one
    breaks_before = np.cumsum(~reading)[positions]
    broken = np.empty(n, dtype=bool)
    broken[0] = breaks_before[0] > 0 or not carry.continuous
    broken[1:] = breaks_before[1:] != breaks_before[:-1]
    last_kind = np.full(n, GAP if carry.gap_pending else COVERED, dtype=np.int8)
    break_at = np.flatnonzero(~reading)
    if len(break_at):
        j = np.searchsorted(break_at, positions) - 1
        last_kind = np.where(j >= 0, s.kind[break_at[np.clip(j, 0, None)]], last_kind).astype(np.int8)
    previous = np.empty(n)
    previous[0] = np.nan if carry.last is None else carry.last
    previous[1:] = t[:-1]
    d = t - previous
    gap_seconds = np.zeros(n)
    after_gap = broken & (last_kind == GAP) & ~np.isnan(previous)
    if live_max_gap is None:
        long = ~broken & (d > max_gap)
    else:
        unbroken = ~broken
        limits = np.full(n, max_gap)
        limits[unbroken] = stretch_limits(d[unbroken], carry.recent, max_gap, live_max_gap)
        long = unbroken & (d > limits)
        carry.recent = tuple(np.concatenate([np.asarray(carry.recent, dtype=float), d[unbroken]])[
            -STRETCH_INTERVALS:].tolist())
    gap = after_gap | long
    gap_seconds[gap] = d[gap]
    dt = np.where(~broken & ~long, d, 0.0)
    measured = dt > 0
    # GpuWear.gap: unobserved time (gap > 0 always: rows are strictly later), counters restart
    counted = gap_seconds > 0
    w.gap_seconds = _running(w.gap_seconds, gap_seconds[counted])
    w.gaps += int(counted.sum())
    if w.first_seen is None:
        w.first_seen = float(t[0])
    w.last_seen = float(t[-1]) if w.last_seen is None else max(w.last_seen, float(t[-1]))
    die = s.die[positions]
    memory = s.memory[positions]
    _rainflow(w, "gpu", die)
    _rainflow(w, "memory", memory)
    dtm = dt[measured]
    w.observed_seconds = _running(w.observed_seconds, dtm)
    util = s.util[positions]
    um = util[measured]
    has = ~np.isnan(um)
    if has.any():
        _bins(w.utilization_seconds, np.rint(um[has] * 100).astype(np.int64), dtm[has])
    for sensor, temp in (("gpu", die), ("memory", memory)):
        tm = temp[measured]
        has = ~np.isnan(tm)
        if has.any():
            _bins(w.temperature_seconds.setdefault(sensor, {}), np.floor(tm[has] + 0.5).astype(np.int64), dtm[has])
    power = s.power[positions]
    pm, lm = power[measured], s.limit[positions][measured]
    has_power = ~np.isnan(pm)
    w.power_seconds = _running(w.power_seconds, dtm[has_power])
    at_limit = has_power & ~np.isnan(lm) & (lm != 0) & (pm >= POWER_LIMIT_SHARE * lm)
    w.power_limit_seconds = _running(w.power_limit_seconds, dtm[at_limit])
    # energy: the counter's delta where this and the previous reading have it (a drop: the counter restarted,
    # it holds the energy since), else power x dt
    energy = s.energy[positions]
    energy_before = np.empty(n)
    energy_before[0] = np.nan if w.last_energy is None else w.last_energy
    energy_before[1:] = energy[:-1]
    em, ebm = energy[measured], energy_before[measured]
    from_counter = ~np.isnan(em) & ~np.isnan(ebm)
    delta = np.where(em - ebm < 0, em, em - ebm)
    joules = np.where(from_counter, delta, np.where(has_power, pm * dtm, 0.0))
    w.energy_joules = _running(w.energy_joules, joules[from_counter | has_power])
    w.energy_counter_seconds = _running(w.energy_counter_seconds, dtm[from_counter])
    w.energy_integrated_seconds = _running(w.energy_integrated_seconds, dtm[~from_counter & has_power])
    w.last_energy = None if np.isnan(energy[-1]) else float(energy[-1])
    masks = s.reasons[positions][measured]
    read = masks >= 0
    if read.any():
        for reason, bit in CLOCK_EVENT_REASONS:
            on = read & ((masks & bit) != 0)
            if on.any():
                w.throttle_seconds[reason] = _running(w.throttle_seconds.get(reason, 0.0), dtm[on])
    fan_present = s.fan_present[positions][measured]
    if fan_present.any():
        if not w.fans:
            w.fans.append(FanWear())
        fm = s.fan[positions][measured]
        spinning = np.where(~np.isnan(fm) & (fm > 0), 1.0, 0.0)
        w.fans[0].on_seconds = _running(w.fans[0].on_seconds, (spinning * dtm)[fan_present])
        ratio = fan_present & ~np.isnan(fm)
        w.fans[0].ratio_seconds = _running(w.fans[0].ratio_seconds, (fm * dtm)[ratio])
    _cover(w, t, dt, measured)
    _cooling(w, t, dt, measured, gap, die, util, power)
    carry.rows += n
    carry.first = float(t[0]) if carry.first is None else carry.first
    carry.last = float(t[-1])
    carry.continuous, carry.gap_pending = True, False
    _breaks_reset(s.kind[positions[-1] + 1:], carry)


def _breaks_reset(after: npt.NDArray[np.int8], carry: Carry) -> None:
    """The kinds of the entries after the last reading: breaks there leave the next reading to decide (a gap break
    calls GpuWear.gap then)."""
    if len(after):
        carry.continuous = False
        carry.gap_pending = bool(after[-1] == GAP) and carry.last is not None


def _rainflow(w: GpuWear, sensor: str, temp: Floats) -> None:
    series = temp[~np.isnan(temp)]
    if not len(series):
        return
    counter = w.rainflow.get(sensor)
    if counter is None:
        counter = w.rainflow[sensor] = RainflowCounter(w.gate_celsius)
    closed: list[tuple[float, float, float]] = []
    for x in turning_points(series).tolist():
        counter.push(x, closed.append)
    if closed:
        hist = w.cycles.setdefault(sensor, {})
        for c in closed:
            key = cycle_key(c)
            hist[key] = hist.get(key, 0.0) + c[2] * 1.0


def _cover(w: GpuWear, t: Floats, dt: Floats, measured: Bools) -> None:
    """GpuWear.cover for each measured interval: a run of consecutive ones extends one interval."""
    at = np.flatnonzero(measured)
    if not len(at):
        return
    cut = np.flatnonzero(np.diff(at) != 1) + 1
    first, last = w.first_seen, w.last_seen
    assert first is not None and last is not None
    for a, b in zip(np.concatenate([[0], cut]).tolist(), np.concatenate([cut, [len(at)]]).tolist(), strict=True):
        i0, i1 = int(at[a]), int(at[b - 1])
        w.cover(max(float(t[i0] - dt[i0]), first), min(float(t[i0]), last))
        if i1 != i0:
            w.cover(float(t[i0]), min(float(t[i1]), last))  # each later interval starts where the last ended


def _runs(mask: Bools, cuts: Bools) -> tuple[Ints, Ints]:
    """Starts and ends (exclusive) of the runs of True in ``mask``, also cut before each index where ``cuts``."""
    n = len(mask)
    starts = np.flatnonzero(mask & (np.concatenate([[True], ~mask[:-1]]) | cuts))
    falses = np.flatnonzero(~mask)
    if len(falses):
        after = np.searchsorted(falses, starts, side="right")  # the first False after each start
        ends = np.where(after < len(falses), falses[np.minimum(after, len(falses) - 1)], n)
    else:
        ends = np.full(len(starts), n)
    ends = np.minimum(ends, np.concatenate([starts[1:], [n]]))
    return starts, ends


def _cooling(w: GpuWear, t: Floats, dt: Floats, measured: Bools, gap: Bools, temp: Floats, util: Floats,
             power: Floats) -> None:
    """GpuWear._cooling over the measured intervals, starting from w.thermal: runs of idle and of steady-load
    intervals (cut by an interval without all three readings, by one of the other kind, and by gaps), their
    lengths as per-run cumulative sums from the run's carried length."""
    th = w.thermal
    at = np.flatnonzero(measured)
    segment_all = np.cumsum(gap)
    if not len(at):
        if gap.any():
            th.idle_run = th.load_run = 0.0
            th.last_celsius = None
        return
    segment = segment_all[at]  # GpuWear.gap (at a reading, before its own interval) resets runs and last °C
    tt, uu, pp, dd, tm = temp[at], util[at], power[at], dt[at], t[at]
    n = len(at)
    valid = ~np.isnan(tt) & ~np.isnan(uu) & ~np.isnan(pp)
    index = np.where(valid, np.arange(n), -1)
    prev = np.maximum.accumulate(np.concatenate([[-1], index[:-1]]))
    known = (prev >= 0) & (segment[np.clip(prev, 0, None)] == segment)
    last_celsius = np.where(known, tt[np.clip(prev, 0, None)], np.nan)
    if th.last_celsius is not None:  # carried into the first segment when no gap came before it
        last_celsius = np.where(~known & (segment == 0), th.last_celsius, last_celsius)
    steady = valid & ~np.isnan(last_celsius) & (np.abs(tt - last_celsius) <= 1.0)
    idle = valid & (uu < IDLE_UTILIZATION)
    load = valid & (uu >= STEADY_UTILIZATION)
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    starts[1:] = segment[1:] != segment[:-1]

    total = np.concatenate([[0.0], np.cumsum(dd)])

    def run_lengths(mask: Bools, carried: float) -> Floats:
        """The run length at each interval, added up as the row path does (only for runs that can reach
        STEADY_SECONDS, and the last one, whose length is carried on)."""
        out = np.zeros(n)
        run_starts, run_ends = _runs(mask, starts)
        heads = np.where((run_starts == 0) & (segment[0] == 0), carried, 0.0)
        rough = heads + total[run_ends] - total[run_starts]
        for j in np.flatnonzero((rough >= STEADY_SECONDS - 1.0) | (run_ends == n)).tolist():
            a, b = int(run_starts[j]), int(run_ends[j])
            out[a:b] = np.cumsum(np.concatenate([[heads[j]], dd[a:b]]))[1:]
        return out

    idle_run = run_lengths(idle, th.idle_run)
    load_run = run_lengths(load, th.load_run)
    update = idle & (idle_run >= STEADY_SECONDS) & steady
    updates = np.flatnonzero(update)
    candidates = load & (load_run >= STEADY_SECONDS) & steady
    if candidates.any():
        latest = np.maximum.accumulate(np.where(update, np.arange(n), -1))
        ic = np.where(latest >= 0, tt[np.clip(latest, 0, None)], np.nan if th.idle_celsius is None
                      else th.idle_celsius)
        iw = np.where(latest >= 0, pp[np.clip(latest, 0, None)], np.nan if th.idle_watts is None else th.idle_watts)
        candidates &= ~np.isnan(ic) & (pp - iw >= STEADY_MIN_WATTS_ABOVE_IDLE)
        _resistance(w, tm[candidates], dd[candidates], (tt[candidates] - ic[candidates])
                    / (pp[candidates] - iw[candidates]))
    if len(updates):
        th.idle_celsius, th.idle_watts = float(tt[updates[-1]]), float(pp[updates[-1]])
    # the state the next piece starts from
    if segment_all[-1] != segment[-1]:  # a gap after the last measured interval
        th.idle_run = th.load_run = 0.0
        th.last_celsius = None
        return
    th.idle_run, th.load_run = float(idle_run[-1]), float(load_run[-1])
    in_last = np.flatnonzero(valid & (segment == segment[-1]))
    if len(in_last):
        th.last_celsius = float(tt[in_last[-1]])
    elif segment[-1] != 0:
        th.last_celsius = None


def _resistance(w: GpuWear, t: Floats, dt: Floats, r: Floats) -> None:
    """thermal_resistance[UTC day] += [dt, r dt, r² dt], in row order."""
    if not len(t):
        return
    day = np.floor(t / 86400.0).astype(np.int64)
    # datetime.fromtimestamp rounds to the microsecond: a time a hair before midnight is the next day
    if ((t - day * 86400.0) > 86400.0 - 1e-5).any():
        raise ColumnarError("a steady-load interval within 10 µs of midnight UTC")
    names = {int(d): (datetime.date(1970, 1, 1) + datetime.timedelta(days=int(d))).isoformat() for d in np.unique(day)}
    for d, name in names.items():
        on = day == d
        acc = w.thermal_resistance.setdefault(name, [0.0, 0.0, 0.0])
        acc[0] = _running(acc[0], dt[on])
        acc[1] = _running(acc[1], (r * dt)[on])
        acc[2] = _running(acc[2], (r * r * dt)[on])
