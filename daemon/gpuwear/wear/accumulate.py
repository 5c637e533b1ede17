"""Per-GPU wear accumulators: parameter-free sufficient statistics, updated sample by sample.

Nothing here reads a clock or does I/O: the caller passes each sample and the seconds it
covers. Model estimates (``wear/models.py``) are derived from these at read time, so a
changed model parameter recomputes the whole history. Two settings act at accumulation
time and are recorded with the data: the rainflow hysteresis gate and the steady-load rule
of the thermal-resistance tracker.

Integration rule: a sample's values are held over the interval that ends at it (``dt``
seconds since the previous sample of the same GPU). An interval longer than the caller's
gap limit is recorded as a gap and never integrated.
"""

from __future__ import annotations

import datetime
import functools
import math
import operator
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwear.sample import CLOCK_EVENT_REASONS, GpuSample, pcie_downgraded
from gpuwear.wear.rainflow import Cycle, RainflowCounter
from gpuwear.wear.schema import (
    ERROR_DAYS_KEPT,
    INCIDENT_EPISODE_SECONDS,
    INCIDENTS_KEPT,
    READING_GROUPS,
    STICKY_EPISODE_SECONDS,
    STICKY_XIDS,
)

SCHEMA = 1
SENSORS = ("gpu", "memory")
IDLE_UTILIZATION = 0.05  # below: idle, for the cooling baseline
STEADY_UTILIZATION = 0.8  # at or above, for long enough: steady load
STEADY_SECONDS = 300.0  # about ten die time constants
STEADY_MIN_WATTS_ABOVE_IDLE = 20.0
POWER_LIMIT_SHARE = 0.99  # power at or above this share of the enforced limit: the card is at its power limit


def _add(d: dict[str, float], key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + value


def weighted_sum(hist: dict[str, float], key: object, weight: Callable[[str], float],
                 owner: GpuWear | None = None, exact: bool = True) -> float:
    """Σ value x weight(bin) over a histogram's bins. ``owner``: the history the histogram belongs to, which keeps the
    sum from one call to the next and adds what the bins gained since (GpuWear.weighted); ``key`` names the weight
    there (the function and its parameters). ``exact``: the sum over the bins in their order, bit for bit (an exported
    counter's: a rounding must not take it down across a restart); else the kept sum plus the gains' weighted shares
    (an estimate's)."""
    if owner is None:
        return float(sum(map(operator.mul, hist.values(), map(weight, hist))))
    return owner.weighted(hist, key, weight, exact)


@dataclass(slots=True)
class _Sum:
    """One weighted sum kept with a history (GpuWear.weighted): its weight, each bin's (in the bins' order, and by
    bin), and the sum."""

    weight: Callable[[str], float]
    exact: bool
    weights: list[float]
    by_bin: dict[str, float]
    total: float


@dataclass(slots=True)
class _Weighed:
    """One of a history's histograms, the sums kept of it, and what its bins gained since they were brought up to
    date (GpuWear.tally)."""

    hist: dict[str, float]
    sums: dict[tuple[object, bool], _Sum] = field(default_factory=dict)  # by (weight's key, exact)
    gained: dict[str, float] = field(default_factory=dict)

    def catch_up(self) -> None:
        """Each sum brought up to date with the gains: an estimate's gets their weighted shares; a counter's is summed
        again, unless every bin that gained weighs 0 (a die below its thresholds: the same sum, bit for bit)."""
        hist, gained = self.hist, self.gained
        for s in self.sums.values():
            by_bin, share = s.by_bin, 0.0
            for b, gain in gained.items():
                w = by_bin.get(b)
                if w is None:  # a new bin, at the end of the histogram
                    w = by_bin[b] = s.weight(b)
                    s.weights.append(w)
                share += w * gain
            if not s.exact:
                s.total += share
            elif share:
                s.total = float(sum(map(operator.mul, hist.values(), s.weights)))
        gained.clear()


@functools.lru_cache(maxsize=256)  # a few settings and thresholds: a view asks for them at every scrape
def _busy_weight(threshold_ratio: float) -> tuple[object, Callable[[str], float]]:
    """1 for a utilization bin (whole %) at or above ``threshold_ratio``, with the key that names it (weighted_sum)."""
    return ("busy", threshold_ratio), lambda pct: 1.0 if int(pct) >= threshold_ratio * 100 else 0.0


@functools.lru_cache(maxsize=256)
def _above_weight(celsius: float) -> tuple[object, Callable[[str], float]]:
    """1 for a temperature bin (whole °C) at or above ``celsius``, with the key that names it (weighted_sum)."""
    return ("above", celsius), lambda t: 1.0 if int(t) >= celsius else 0.0


COVERED_KEPT = 10_000  # observed intervals a history keeps (the ledger's validator refuses over 100,000)


def _interval_key(start: float) -> str:
    """An observed interval's key: its start to the millisecond, never later than the start itself."""
    return f"{math.floor(start * 1000) / 1000:.3f}"


def _merged_intervals(intervals: list[tuple[float, float]]) -> list[tuple[str, float]]:
    """Sorted, overlapping (or within a second) intervals joined, as {"start": end} items (start to the ms). Over
    COVERED_KEPT of them (a card whose readings stop and start all day long), intervals are joined across ever
    larger gaps until half that many are left (so that this happens seldom): the history then covers short gaps it
    did not observe, so an import of those is refused as already counted, never counted twice, and the record never
    grows toward the validator's cap."""
    within, limit = 1.0, COVERED_KEPT
    ordered = sorted(intervals)
    while True:
        out: list[list[float]] = []
        for a, b in ordered:
            if out and a <= out[-1][1] + within:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        if len(out) <= limit:
            return [(_interval_key(a), b) for a, b in out]
        within, limit = within * 4, COVERED_KEPT // 2
        ordered = [(a, b) for a, b in out]


@functools.lru_cache(maxsize=256)
def _reasons(mask: int) -> tuple[str, ...]:
    """The clock-event reasons set in an NVML bitmask (a GPU shows a handful of masks: cached)."""
    return tuple(reason for reason, bit in CLOCK_EVENT_REASONS if mask & bit)


def celsius_bin(celsius: float) -> str:
    """The 1 °C time-at-temperature bin of a reading: the nearest whole degree (NVML reports
    whole degrees, so its readings fall exactly on bins)."""
    return str(math.floor(celsius + 0.5))


def cycle_key(cycle: Cycle) -> str:
    """The (range, peak) bin of a cycle, 1 °C each: 'range:peak'."""
    rng, peak, _ = cycle
    return f"{math.floor(rng + 0.5)}:{math.floor(peak + 0.5)}"


@dataclass
class Interval:
    """What one sample interval adds to a GPU's accumulators (before any job weighting)."""

    dt: float
    cycles: list[tuple[str, str, float]]  # (sensor, 'range:peak', count) closed during the interval
    utilization_bin: str | None = None
    temperature_bins: dict[str, str] = field(default_factory=dict)
    power: bool = False
    power_limit: bool = False
    energy_joules: float = 0.0
    energy_from_counter: bool = False
    violation: dict[str, float] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    fans: list[tuple[float, float | None, float | None]] = field(default_factory=list)  # (on, rpm, ratio)


@dataclass
class FanWear:
    """One fan: seconds turning, revolutions measured (from RPM), and speed-ratio seconds
    (∫ ratio dt, turned into revolutions at read time with a rated RPM where RPM is not
    reported)."""

    on_seconds: float = 0.0
    revolutions: float = 0.0
    rpm_seconds: float = 0.0  # seconds covered by RPM readings
    ratio_seconds: float = 0.0  # ∫ speed ratio dt over seconds without an RPM reading


@dataclass
class ThermalState:
    """Trackers for the cooling-health proxy (die °C above idle per W at steady load)."""

    idle_celsius: float | None = None
    idle_watts: float | None = None
    idle_run: float = 0.0
    load_run: float = 0.0
    last_celsius: float | None = None


# the GpuSample fields that show a history held each kind of reading (READING_GROUPS), and the health fields it keeps
# (the last value read): GpuWear.add and the columnar import read both from here
SEEN_FIELDS: dict[str, tuple[str, ...]] = {
    "clock_event_reasons": ("clock_event_reasons",), "temperature_memory": ("temperature_memory_celsius",),
    "ecc": ("ecc_enabled", "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate"),
    "fans": ("fan_speed_ratio", "fan_speed_rpm"), "power": ("power_watts",), "utilization": ("utilization_gpu_ratio",)}
assert tuple(SEEN_FIELDS) == READING_GROUPS
# the error counters whose rates per loaded and idle hour a history keeps (GpuWear.error_counts): corrected ECC
# errors since the driver loaded (NVML_FI_DEV_ECC_SBE_VOL_TOTAL), PCIe replays (NVML_FI_DEV_PCIE_REPLAY_COUNTER),
# NVLink CRC errors, flit and data, and NVLink replays, each summed over the links (nvmlDeviceGetNvLinkErrorCounter),
# and memory rows remapped for correctable errors (nvmlDeviceGetRemappedRows' corrRows)
ERROR_COUNTERS = ("ecc_corrected", "pcie_replays", "nvlink_crc", "nvlink_replay", "remapped_rows_correctable")
LOADED_UTILIZATION = 0.1  # utilization at or above which an error counter's time counts as loaded
STALLS = "nvml_stalls"  # error_counts' entry for NVML reads past the deadline (the sampler's), by load
SLOW_READ_SECONDS = (10.0, 1.0, 0.1)  # the bins of slow_reads, slowest first: a read at or above each is counted
RECENT_ERROR_DAYS = 2  # the UTC days (the last one and the one before) judged against a GPU's own baseline
HOT_BELOW_CELSIUS = 20  # health_days' "hot" keeps the die's time from this far under its slowdown temperature up
THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")


@functools.lru_cache(maxsize=128)
def utc_day(day_number: int) -> str:
    """The ISO date of a UTC day, by its number since 1970 (``int(wall // 86400)``)."""
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day_number)).isoformat()


@functools.lru_cache(maxsize=16)  # a view asks at every scrape; the last day changes once a day
def _error_windows(last: int, baseline_days: int) -> dict[str, int]:
    """The ISO dates of the RECENT_ERROR_DAYS UTC days to day number ``last`` (-> 0) and of the ``baseline_days``
    days before them (-> 2): GpuWear.own_error_rates' two windows. Read only (shared by every call)."""
    recent = {utc_day(last - i): 0 for i in range(RECENT_ERROR_DAYS)}
    return {**{utc_day(last - RECENT_ERROR_DAYS - i): 2 for i in range(baseline_days)}, **recent}


def _rates(t: list[float], min_seconds: float) -> tuple[float | None, float | None]:
    """Events per hour of ``t`` ([loaded s, loaded events, idle s, idle events]), loaded and idle; None for a side
    read for ``min_seconds`` or less."""
    return (t[1] * 3600 / t[0] if t[0] > min_seconds and t[0] > 0 else None,
            t[3] * 3600 / t[2] if t[2] > min_seconds and t[2] > 0 else None)


def _keep_newest(error_days: dict[str, Any]) -> None:
    """Drop all but the newest ERROR_DAYS_KEPT days of an error_days map (ISO dates sort as days)."""
    for old in sorted(error_days)[:-ERROR_DAYS_KEPT]:
        del error_days[old]


def _counters(s: GpuSample) -> list[tuple[str, float]]:
    out = []
    if s.ecc_corrected_volatile is not None:
        out.append(("ecc_corrected", float(s.ecc_corrected_volatile)))
    if s.pcie_replays is not None:
        out.append(("pcie_replays", float(s.pcie_replays)))
    if s.nvlink_crc_flit_errors is not None and s.nvlink_crc_data_errors is not None:
        out.append(("nvlink_crc", float(s.nvlink_crc_flit_errors + s.nvlink_crc_data_errors)))
    if s.nvlink_replay_errors is not None:
        out.append(("nvlink_replay", float(s.nvlink_replay_errors)))
    if s.remapped_rows_corrected is not None:
        out.append(("remapped_rows_correctable", float(s.remapped_rows_corrected)))
    return out


HEALTH_FIELDS = ("ecc_enabled", "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
                 "ecc_uncorrected_aggregate", "retired_pages_single_bit", "retired_pages_double_bit",
                 "retired_pages_pending", "remapped_rows_corrected", "remapped_rows_uncorrected",
                 "remapped_rows_pending", "remapped_rows_failure", "pcie_replays", "recovery_action",
                 "pcie_aer_nonfatal", "pcie_aer_fatal", "nvlink_recovery_errors", "remap_banks_low",
                 "remap_banks_none", "retired_pages_oldest_wall", "retired_pages_newest_wall",
                 "power_smoothing_life_percent", "ecc_corrected_aggregate_dram", "ecc_uncorrected_aggregate_dram",
                 "ecc_corrected_aggregate_sram", "ecc_uncorrected_aggregate_sram")

FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED

# the card's lifetime counts whose growth the verdict judges within a window (health.rules): the time each last grew
GROWING_COUNTS = frozenset({"retired_pages_single_bit", "retired_pages_double_bit", "remapped_rows_corrected",
                            "remapped_rows_uncorrected", "ecc_uncorrected_aggregate", "remap_banks_low",
                            "remap_banks_none"})


# the card's lifetime counts it keeps from before gpuwear met it (nvml.h: the aggregate ECC counts persist "for the
# lifetime of the device"; retired pages and remapped rows in its InfoROM): what each held at gpuwear's first read
# of it is kept as "carried NAME" in ``health``, its time as "first read NAME" in ``last_event`` (issue 55)
# (banks at "low" are not one: they fall to "none" as their last spare rows go)
CARRIED_COUNTS = GROWING_COUNTS - {"remap_banks_low"} | {"ecc_corrected_aggregate"}
# readings that are not counts, kept as "carried NAME" at gpuwear's first read of each: a lower read later is no
# reading gone wrong (the power-smoothing circuit's life left falls as it ages; a recovery action ends once done)
CARRIED_LEVELS = frozenset({"power_smoothing_life_percent", "recovery_action"})
# ... and the aggregate ECC counts by where they came (their totals are CARRIED_COUNTS' and judged as such)
CARRIED_BY_LOCATION = ("ecc_corrected_aggregate_dram", "ecc_corrected_aggregate_sram", "ecc_uncorrected_aggregate_dram",
                       "ecc_uncorrected_aggregate_sram")
FIRST_READS = CARRIED_COUNTS | CARRIED_LEVELS | frozenset(CARRIED_BY_LOCATION)


def _sticky(what: str) -> bool:
    """An incident that is a sticky XID ("xid 79")."""
    code = what.removeprefix("xid ")
    return code != what and code.isdigit() and int(code) in STICKY_XIDS


def _seen_in(w: GpuWear) -> dict[str, int]:
    """For a record written before ``seen`` was kept: what its tallies show it held."""
    held = {"clock_event_reasons": bool(w.throttle_seconds), "temperature_memory": "memory" in w.temperature_seconds,
            "ecc": "ecc_enabled" in w.health, "fans": bool(w.fans), "power": w.power_seconds > 0,
            "utilization": bool(w.utilization_seconds)}
    return {k: 1 for k, v in held.items() if v}


@dataclass
class GpuWear:
    """Lifetime accumulators of one GPU (keyed by UUID in the ledger)."""

    uuid: str
    name: str = ""
    serial: str | None = None
    pci_bus_id: str | None = None  # where it was last seen (imports without a UUID match on it)
    index: int | None = None  # NVML's index (nvidia-smi's GPU number) when last seen live: `--gpu 0`
    first_seen: float | None = None  # wall clock, Unix s
    last_seen: float | None = None
    observed_seconds: float = 0.0  # integrated sample time
    down_seconds: float = 0.0  # the daemon ran but the GPU was lost
    gap_seconds: float = 0.0  # not observed: daemon stopped, GPU missing, samples too far apart
    gaps: int = 0
    start_gap: float = 0.0  # the part of gap_seconds counted at the latest start (taken back if its clock was ahead)
    # the wall-clock intervals this history observed, {"start": end} (a map, so that a save writes the one interval
    # that grew): what an import must not count again
    covered: dict[str, float] = field(default_factory=dict)
    skipped_seconds: float = 0.0  # wall-clock jumps forward while observed: neither observed nor unobserved
    utilization_seconds: dict[str, float] = field(default_factory=dict)  # GPU util % (0..100) -> s
    temperature_seconds: dict[str, dict[str, float]] = field(default_factory=dict)  # sensor -> whole °C -> s
    cycles: dict[str, dict[str, float]] = field(default_factory=dict)  # sensor -> 'range:peak' -> count
    rainflow: dict[str, RainflowCounter] = field(default_factory=dict)
    energy_joules: float = 0.0
    energy_counter_seconds: float = 0.0  # seconds whose energy came from NVML's counter
    energy_integrated_seconds: float = 0.0  # seconds whose energy is ∫ power dt
    power_limit_seconds: float = 0.0  # at or above POWER_LIMIT_SHARE of the enforced limit
    power_seconds: float = 0.0  # seconds with a power reading
    throttle_seconds: dict[str, float] = field(default_factory=dict)  # clock-event reason -> s
    violation_seconds: dict[str, float] = field(default_factory=dict)  # NVML violation counters, deltas
    fans: list[FanWear] = field(default_factory=list)
    thermal_resistance: dict[str, list[float]] = field(default_factory=dict)  # UTC day -> [n, Σr, Σr²]
    thermal: ThermalState = field(default_factory=ThermalState)
    thresholds: dict[str, float] = field(default_factory=dict)  # the device's own, last read
    health: dict[str, Any] = field(default_factory=dict)  # last measured memory/device health
    # the card's firmware (sample.FIRMWARE: VBIOS, InfoROM image, its configuration checksum and validity): "first",
    # what gpuwear read at its first sight of the card (and "at", when); "now", the latest; "changed", per field the
    # latest change seen (from, to, wall time): a reflash, a cleared InfoROM, or not the card it was (issue 55)
    firmware: dict[str, Any] = field(default_factory=dict)
    xids: dict[str, int] = field(default_factory=dict)  # XID code -> events, lifetime
    # which kinds of reading this history ever held (READING_GROUPS -> 1): "none measured" vs "never reported"
    seen: dict[str, int] = field(default_factory=dict)
    lost_events: int = 0
    last_event: dict[str, float] = field(default_factory=dict)  # "xid 79", "gpu lost" -> wall time, last seen
    # the incidents that call for a GPU reset, a reboot or service (the tracker says which), newest INCIDENTS_KEPT:
    # wall time ("%.3f") -> what ("xid 79", "gpu lost", "recovery action 1", "row remap pending", ...)
    incidents: dict[str, str] = field(default_factory=dict)
    # per kind ("job" / "idle"): {"seconds", "energy_joules", "temperature_seconds": {°C: s}} (die)
    kinds: dict[str, dict[str, Any]] = field(default_factory=dict)
    gate_celsius: float = 2.0
    # previous readings of cumulative NVML counters (valid only while samples are contiguous)
    last_energy: float | None = None
    last_violation: dict[str, float] = field(default_factory=dict)
    # error counters by load (ERROR_COUNTERS -> [loaded s, loaded events, idle s, idle events]): where their rates
    # per loaded and per idle hour come from (error_rates)
    error_counts: dict[str, list[float]] = field(default_factory=dict)
    # the same counters' loaded seconds and the events booked to them by UTC day (day -> counter -> [loaded s,
    # loaded events]), the newest ERROR_DAYS_KEPT days: a GPU without peers is judged against its own past
    # (own_error_rates)
    error_days: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    # the health rules' windows (health.rules), by UTC day, the newest ERROR_DAYS_KEPT: "busy" (s at or above
    # LOADED_UTILIZATION), "throttled" (s with a thermal clock-event reason), "stalls" ([under load, idle] reads past
    # the sampler's deadline), "hot" (the die's s by whole °C from HOT_BELOW_CELSIUS under its slowdown temperature up)
    health_days: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the GPU's slow NVML reads (a tick's read of the GPU, the sampler's timer), by load ("loaded" / "idle") and
    # by how slow (SLOW_READ_SECONDS: "0.1" for 0.1 s or more, "1", "10"): what precedes calls that hang
    slow_reads: dict[str, dict[str, int]] = field(default_factory=dict)
    # the counters' last readings and the loaded / idle seconds since each last changed; never saved (a restart
    # takes a new baseline: what a counter gained meanwhile is not known, never a rate)
    last_counts: dict[str, float] = field(default_factory=dict, repr=False, compare=False)
    count_errors: bool = field(default=True, repr=False, compare=False)  # off for imported logs (both readers)
    pending_load: dict[str, list[float]] = field(default_factory=dict, repr=False, compare=False)
    # the weighted sums kept of this history's histograms (weighted), by id(histogram), while it lives; never saved
    weighed: dict[int, _Weighed] = field(default_factory=dict, repr=False, compare=False)
    # the days of thermal_resistance with data, sorted (resistance_days), with the map and its size they came from
    days: tuple[dict[str, list[float]], int, list[str]] | None = field(default=None, repr=False, compare=False)
    # the open residue per sensor (residue_cycles) for the rainflow state it was counted from, and its weighted sums
    # (residue_sum); never saved
    residues: dict[str, tuple[tuple[float | int | None, ...], dict[str, float], dict[object, float]]] = field(
        default_factory=dict, repr=False, compare=False)

    # -- updating ----------------------------------------------------------------------

    def see(self, wall: float) -> None:
        """Note that the GPU was seen at ``wall``; timestamps never go backwards."""
        if self.first_seen is None:
            self.first_seen = wall
        self.last_seen = wall if self.last_seen is None else max(self.last_seen, wall)

    def gap(self, seconds: float) -> None:
        """Record an unobserved interval; cumulative counters restart their baselines."""
        if seconds > 0:
            self.gap_seconds += seconds
            self.gaps += 1
        self.last_energy = None
        self.last_violation = {}
        self.last_counts, self.pending_load = {}, {}
        self.thermal.idle_run = self.thermal.load_run = 0.0
        self.thermal.last_celsius = None

    def cover(self, start: float, end: float) -> None:
        """Note ``[start, end]`` (wall seconds) as observed: it extends the latest interval when it follows on
        (within a second), else the intervals are joined again."""
        if self.covered:
            key = next(reversed(self.covered))
            first, last = float(key), self.covered[key]
            if first <= start <= last + 1.0:
                if end > last:
                    self.covered[key] = end
                return
            if start > last + 1.0 and len(self.covered) < COVERED_KEPT:  # after a gap, in order: a new one
                self.covered[_interval_key(start)] = end
                return
        self.covered = dict(_merged_intervals([*self.intervals(), (start, end)]))

    def intervals(self) -> list[tuple[float, float]]:
        """The observed wall-clock intervals, sorted."""
        return sorted((float(k), v) for k, v in self.covered.items())

    def overlaps(self, start: float, end: float) -> bool:
        return any(a <= end and start <= b for a, b in self.intervals())

    def down(self, seconds: float) -> None:
        """The GPU was lost for ``seconds`` while the daemon ran."""
        self.down_seconds += max(0.0, seconds)
        self.gap(0.0)

    def add(self, s: GpuSample, dt: float) -> Interval:
        """Integrate one sample held over the ``dt`` seconds that end at it; returns what the
        interval added, so job slices can take their share. ``dt`` <= 0 (the first sample
        after a start or a gap) is a baseline: only the cycles it closes count."""
        self.see(s.timestamp)
        if len(self.seen) < len(READING_GROUPS):
            self._seen(s)
        self._thresholds(s)
        self._health(s)
        cycles = self._feed_cycles(s)
        if dt <= 0:
            baseline = Interval(dt=0.0, cycles=cycles)
            self.apply(baseline)
            self._baselines(s)
            return baseline
        interval = self._measure(s, dt, cycles)
        self.apply(interval)
        self._errors(s, dt)
        self._health_day(s, interval)
        # within the record's span: wall and monotonic clocks part by a little (a read's duration, a slewing clock)
        first, last = self.first_seen or s.timestamp, self.last_seen or s.timestamp
        self.cover(max(s.timestamp - dt, first), min(s.timestamp, last))
        self._cooling(s, dt)
        self._baselines(s)
        return interval

    def _seen(self, s: GpuSample) -> None:
        for group, names in SEEN_FIELDS.items():
            if any(getattr(s, name) not in (None, ()) for name in names):  # () : a card without fans
                self.seen[group] = 1

    def _feed_cycles(self, s: GpuSample) -> list[tuple[str, str, float]]:
        closed: list[tuple[str, str, float]] = []
        for sensor, temp in (("gpu", s.temperature_gpu_celsius), ("memory", s.temperature_memory_celsius)):
            if temp is None:
                continue
            counter = self.rainflow.get(sensor)
            if counter is None:
                counter = self.rainflow[sensor] = RainflowCounter(self.gate_celsius)
            counter.push(temp, lambda c, sensor=sensor: closed.append((sensor, cycle_key(c), c[2])))  # type: ignore[misc]
        return closed

    def _measure(self, s: GpuSample, dt: float, cycles: list[tuple[str, str, float]]) -> Interval:
        iv = Interval(dt=dt, cycles=cycles)
        if s.utilization_gpu_ratio is not None:
            iv.utilization_bin = str(round(s.utilization_gpu_ratio * 100))
        for sensor, temp in (("gpu", s.temperature_gpu_celsius), ("memory", s.temperature_memory_celsius)):
            if temp is not None:
                iv.temperature_bins[sensor] = celsius_bin(temp)
        if s.power_watts is not None:
            iv.power = True
            iv.power_limit = bool(s.power_limit_watts and s.power_watts >= POWER_LIMIT_SHARE * s.power_limit_watts)
        if s.energy_joules is not None and self.last_energy is not None:
            delta = s.energy_joules - self.last_energy
            if delta < 0:  # the counter restarted (driver reload): it holds the energy since
                delta = s.energy_joules
            iv.energy_joules, iv.energy_from_counter = delta, True
        elif s.power_watts is not None:
            iv.energy_joules = s.power_watts * dt
        for policy, value in (("power", s.violation_power_seconds), ("thermal", s.violation_thermal_seconds)):
            last = self.last_violation.get(policy)
            if value is not None and last is not None and value >= last:
                iv.violation[policy] = value - last
        if s.clock_event_reasons is not None:
            iv.reasons = _reasons(s.clock_event_reasons)
        ratios, rpms = s.fan_speed_ratio or (), s.fan_speed_rpm or ()
        for i in range(max(len(ratios), len(rpms))):
            ratio = ratios[i] if i < len(ratios) else None
            rpm = rpms[i] if i < len(rpms) else None
            iv.fans.append((float((rpm or 0) > 0 or (ratio or 0) > 0), rpm, ratio))
        return iv

    def apply(self, iv: Interval, weight: float = 1.0) -> None:
        """Add an interval's contributions, scaled by ``weight`` (a job's share of the GPU)."""
        dt = iv.dt * weight
        self.observed_seconds += dt
        if iv.utilization_bin is not None:
            self.tally(self.utilization_seconds, iv.utilization_bin, dt)
        for sensor, b in iv.temperature_bins.items():
            self.tally(self.temperature_seconds.setdefault(sensor, {}), b, dt)
        for sensor, key, count in iv.cycles:
            self.tally(self.cycles.setdefault(sensor, {}), key, count * weight)
        if iv.power:
            self.power_seconds += dt
            self.power_limit_seconds += dt if iv.power_limit else 0.0
        self.energy_joules += iv.energy_joules * weight
        if iv.energy_from_counter:
            self.energy_counter_seconds += dt
        elif iv.power:
            self.energy_integrated_seconds += dt
        for policy, seconds in iv.violation.items():
            _add(self.violation_seconds, policy, seconds * weight)
        for reason in iv.reasons:
            _add(self.throttle_seconds, reason, dt)
        for i, (on, rpm, ratio) in enumerate(iv.fans):
            while len(self.fans) <= i:
                self.fans.append(FanWear())
            fan = self.fans[i]
            fan.on_seconds += on * dt
            if rpm is not None:
                fan.revolutions += rpm / 60.0 * dt
                fan.rpm_seconds += dt
            elif ratio is not None:
                fan.ratio_seconds += ratio * dt

    def tally(self, hist: dict[str, float], key: str, value: float) -> None:
        """Add ``value`` to a bin of one of this history's histograms. A histogram that is weighed (:meth:`weighted`:
        the time at temperature or utilization, the cycles, a kind's time at temperature) changes only through here
        once it is: its sums take what the bins gained at the next view."""
        _add(hist, key, value)
        weighed = self.weighed.get(id(hist))
        if weighed is not None:
            _add(weighed.gained, key, value)

    def _errors(self, s: GpuSample, dt: float) -> None:
        """Each error counter's events, booked to loaded or idle time: the seconds since the counter last changed
        go to loaded or idle by the GPU's utilization (LOADED_UTILIZATION), and what it gained when it changes to
        the side that held most of them (counters the slow interval reads change every 30 s at most). A counter
        that goes down (a driver reload restarts it) is a new baseline, never negative events."""
        util = s.utilization_gpu_ratio
        if util is None or not self.count_errors:
            return
        loaded = util >= LOADED_UTILIZATION
        day_key = utc_day(int(s.timestamp // 86400))
        day = self.error_days.get(day_key)
        if day is None:
            day = self.error_days[day_key] = {}
            _keep_newest(self.error_days)
        for name, value in _counters(s):
            totals = self.error_counts.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            totals[0 if loaded else 2] += dt
            if loaded:
                day.setdefault(name, [0.0, 0.0])[0] += dt
            pending = self.pending_load.setdefault(name, [0.0, 0.0])
            pending[0 if loaded else 1] += dt
            last = self.last_counts.get(name)
            if last is not None and value > last:
                booked_loaded = pending[0] >= pending[1]
                totals[1 if booked_loaded else 3] += value - last
                if booked_loaded:
                    day.setdefault(name, [0.0, 0.0])[1] += value - last
            if last is None or value != last:
                self.pending_load[name] = [0.0, 0.0]
        self.error_counts.setdefault(STALLS, [0.0, 0.0, 0.0, 0.0])[0 if loaded else 2] += dt

    def add_stalls(self, reads: int, loaded: bool, wall: float | None = None) -> None:
        """NVML reads of this GPU that ran past the sampler's deadline, under load or idle (error_counts[STALLS]),
        and on the UTC day of ``wall`` (health_days)."""
        if reads > 0:
            self.error_counts.setdefault(STALLS, [0.0, 0.0, 0.0, 0.0])[1 if loaded else 3] += reads
            if wall is not None:
                stalls = self._day(wall).setdefault("stalls", [0, 0])
                stalls[0 if loaded else 1] += reads

    def _day(self, wall: float) -> dict[str, Any]:
        """health_days' entry of the UTC day of ``wall`` (made, and the oldest dropped, on a new day)."""
        key = utc_day(int(wall // 86400))
        day = self.health_days.get(key)
        if day is None:
            day = self.health_days[key] = {}
            _keep_newest(self.health_days)
        return day

    def _health_day(self, s: GpuSample, iv: Interval) -> None:
        """What the interval ending at ``s`` adds to its UTC day of health_days (not for imported logs, as _errors:
        their readers build histories without it, and the live verdict judges the live record)."""
        if not self.count_errors:
            return
        util, temp, slowdown = s.utilization_gpu_ratio, s.temperature_gpu_celsius, self.thresholds.get("slowdown")
        busy = util is not None and util >= LOADED_UTILIZATION
        throttled = any(r in THERMAL_REASONS for r in iv.reasons)
        hot = temp is not None and slowdown is not None and temp >= slowdown - HOT_BELOW_CELSIUS
        if not (busy or throttled or hot):
            return
        day = self._day(s.timestamp)
        if busy:
            day["busy"] = day.get("busy", 0.0) + iv.dt
        if throttled:
            day["throttled"] = day.get("throttled", 0.0) + iv.dt
        if hot:
            _add(day.setdefault("hot", {}), iv.temperature_bins["gpu"], iv.dt)

    def add_read(self, seconds: float, loaded: bool) -> None:
        """One read of this GPU that took ``seconds``: counted in slow_reads when it took 0.1 s or more."""
        for floor in SLOW_READ_SECONDS:
            if seconds >= floor:
                side = self.slow_reads.setdefault("loaded" if loaded else "idle", {})
                key = f"{floor:g}"
                side[key] = side.get(key, 0) + 1
                return

    def error_rates(self, min_seconds: float = 0.0) -> dict[str, tuple[float | None, float | None]]:
        """Events per loaded and per idle hour of each error counter (None where it was read for under
        ``min_seconds`` of that side)."""
        return {name: _rates(t, min_seconds) for name, t in self.error_counts.items()}

    def own_error_rates(self, baseline_days: int, min_seconds: float = 0.0) -> dict[str, tuple[float | None,
                                                                                               float | None]]:
        """Each error counter's events per loaded hour over the last RECENT_ERROR_DAYS UTC days of the record (to
        the day of ``last_seen``) and over the ``baseline_days`` days before them (error_days); None where it was
        read under load for ``min_seconds`` or less in that window."""
        if self.last_seen is None or not self.error_days:
            return {}
        windows = _error_windows(int(self.last_seen // 86400), baseline_days)
        sums: dict[str, list[float]] = {}
        for day, counters in self.error_days.items():
            side = windows.get(day)
            if side is None:
                continue
            for name, (seconds, events) in counters.items():
                acc = sums.setdefault(name, [0.0, 0.0, 0.0, 0.0])
                acc[side] += seconds
                acc[side + 1] += events
        return {name: _rates(t, min_seconds) for name, t in sums.items()}

    def _baselines(self, s: GpuSample) -> None:
        self.last_counts = dict(_counters(s))
        self.last_energy = s.energy_joules
        self.last_violation = {k: v for k, v in (("power", s.violation_power_seconds),
                                                 ("thermal", s.violation_thermal_seconds)) if v is not None}

    def _cooling(self, s: GpuSample, dt: float) -> None:
        """Thermal resistance at steady high load against the idle baseline, per UTC day."""
        t, util, power, th = s.temperature_gpu_celsius, s.utilization_gpu_ratio, s.power_watts, self.thermal
        if t is None or util is None or power is None:
            th.idle_run = th.load_run = 0.0
            return
        steady = th.last_celsius is not None and abs(t - th.last_celsius) <= 1.0
        th.last_celsius = t
        if util < IDLE_UTILIZATION:
            th.load_run = 0.0
            th.idle_run += dt
            if th.idle_run >= STEADY_SECONDS and steady:
                th.idle_celsius, th.idle_watts = t, power
            return
        th.idle_run = 0.0
        th.load_run = th.load_run + dt if util >= STEADY_UTILIZATION else 0.0
        if (th.load_run >= STEADY_SECONDS and steady and th.idle_celsius is not None and th.idle_watts is not None
                and power - th.idle_watts >= STEADY_MIN_WATTS_ABOVE_IDLE):
            r = (t - th.idle_celsius) / (power - th.idle_watts)
            day = datetime.datetime.fromtimestamp(s.timestamp, datetime.timezone.utc).date().isoformat()
            acc = self.thermal_resistance.setdefault(day, [0.0, 0.0, 0.0])
            acc[0] += dt
            acc[1] += r * dt
            acc[2] += r * r * dt

    def _thresholds(self, s: GpuSample) -> None:
        for name, value in (("shutdown", s.threshold_shutdown_celsius), ("slowdown", s.threshold_slowdown_celsius),
                            ("gpu_max", s.threshold_gpu_max_celsius),
                            ("memory_max", s.threshold_memory_max_celsius),
                            ("power_limit_watts", s.power_limit_watts)):
            if value is not None:
                self.thresholds[name] = value

    def _health(self, s: GpuSample) -> None:
        """The latest health readings, and in ``last_event`` ("grew NAME") when each count of GROWING_COUNTS last
        grew (a count first read is not growth: what it held before gpuwear met it has no time; it is kept as what
        the card carried, CARRIED_COUNTS)."""
        for name in HEALTH_FIELDS:
            value = getattr(s, name)
            if value is not None:
                before = self.health.get(name)
                if name in GROWING_COUNTS and isinstance(before, (int, float)) and value > before:
                    self.last_event[f"grew {name}"] = s.timestamp
                if name == "retired_pages_newest_wall" and before is None:  # the newest page it carried: its date
                    self.health[f"carried {name}"] = value
                if name in FIRST_READS and before is None:  # gpuwear's first read: carried
                    self.health[f"carried {name}"] = value
                    self.last_event[f"first read {name}"] = s.timestamp
                elif name in CARRIED_COUNTS and isinstance(before, int) and value < before:  # never should (issue 55)
                    self.health[f"went down {name}"] = before
                    self.last_event[f"went down {name}"] = s.timestamp
                self.health[name] = value
        if s.temperature_memory_celsius is not None:
            self.health["memory_temperature_reported"] = True
        self._links(s)
        self._fabric(s)

    def _fabric(self, s: GpuSample) -> None:
        """The GPU's registration with its NVSwitch fabric at its latest reading (sample.fabric_*), in ``health``:
        ``fabric_state``; ``fabric_status`` while completed; ``fabric_health_mask`` and ``fabric_health_summary``
        while NVML gives them; ``fabric_pending_since``, the start of the current run of readings not yet completed
        (s). ``fabric_degraded_bandwidth``, which releases before the mask was kept wrote, goes at the first reading."""
        if s.fabric_state is None:
            return
        h = self.health
        h["fabric_state"] = s.fabric_state
        h.pop("fabric_degraded_bandwidth", None)
        for name in ("fabric_status", "fabric_health_mask", "fabric_health_summary"):
            if (value := getattr(s, name)) is not None:
                h[name] = value
            else:
                h.pop(name, None)
        if s.fabric_state == FABRIC_COMPLETED:
            h.pop("fabric_pending_since", None)
        else:
            h.setdefault("fabric_pending_since", int(s.timestamp))

    def _links(self, s: GpuSample) -> None:
        """The links' state at the GPU's latest reading of them (the slow interval), in ``health``:
        ``nvlink_links_active`` beside ``nvlink_links_most``, the most ever seen active (a link down stays down until
        it is back), and ``nvlink_links_most_at``, when they were last seen so (s); ``pcie_downgraded_since``, the
        start of the current run of readings with the PCIe link below what card and slot allow
        (sample.pcie_downgraded), with the link's lanes and generation, current and maximum."""
        h = self.health
        now = int(s.timestamp)
        active = s.nvlink_links_active
        if active is not None:
            h["nvlink_links_active"] = active
            if active >= h.get("nvlink_links_most", 0):
                h["nvlink_links_most"], h["nvlink_links_most_at"] = active, now
        down = pcie_downgraded(s)
        if down is None:
            return
        for name in ("pcie_link_width", "pcie_link_width_max", "pcie_link_generation", "pcie_link_generation_max"):
            if (value := getattr(s, name)) is not None:
                h[name] = value
        if down:
            h.setdefault("pcie_downgraded_since", now)
        else:
            h.pop("pcie_downgraded_since", None)

    def add_xids(self, counts: dict[int, int], wall: float, untimed: Collection[int] = ()) -> None:
        """Add XID events (code -> new events) seen at ``wall``; the last time of each, but of ``untimed`` codes
        (whose time is kept by the step their line is given: the tracker's)."""
        for code, n in counts.items():
            if n > 0:
                self.xids[str(code)] = self.xids.get(str(code), 0) + n
                if code not in untimed:
                    self.last_event[f"xid {code}"] = wall

    def add_incident(self, wall: float, what: str) -> None:
        """An incident that calls for a reset, a reboot or service at ``wall``. One within INCIDENT_EPISODE_SECONDS
        after the newest kept is the same episode, added to it (one fault seen several ways: XID 79 and the GPU
        lost, XID 48 and the uncorrectable count read on the slow interval), as is a sticky XID (STICKY_XIDS) within
        STICKY_EPISODE_SECONDS after an episode that holds one (NVSentinel's bursts: a fault that keeps reporting
        until the GPU is reset). The INCIDENTS_KEPT newest are kept."""
        newest = max(self.incidents, key=float, default=None)
        if newest is not None and (0 <= wall - float(newest) <= INCIDENT_EPISODE_SECONDS or (
                0 <= wall - float(newest) <= STICKY_EPISODE_SECONDS and _sticky(what)
                and any(_sticky(w) for w in self.incidents[newest].split(", ")))):
            if what not in self.incidents[newest].split(", "):
                self.incidents[newest] = f"{self.incidents[newest]}, {what}"[:64]
            return
        self.incidents[f"{wall:.3f}"] = what[:64]
        if len(self.incidents) > INCIDENTS_KEPT:
            for old in sorted(self.incidents, key=float)[:len(self.incidents) - INCIDENTS_KEPT]:
                del self.incidents[old]

    def incident_list(self) -> list[tuple[float, str]]:
        """The kept incidents, (wall time, what) oldest first."""
        return sorted((float(k), v) for k, v in self.incidents.items())

    def add_lost(self, wall: float) -> None:
        """The GPU fell off the bus at ``wall``."""
        self.lost_events += 1
        self.last_event["gpu lost"] = wall

    # -- reading -----------------------------------------------------------------------

    def all_cycles(self, sensor: str) -> dict[str, float]:
        """Closed cycles plus the open residue (as half cycles), in 'range:peak' bins."""
        out = dict(self.cycles.get(sensor, {}))
        for k, v in self.residue_cycles(sensor).items():
            _add(out, k, v)  # out is a copy: the cached residue is not changed
        return {k: v for k, v in out.items() if not k.startswith("0:")}

    def residue_cycles(self, sensor: str) -> dict[str, float]:
        """The open residue of the rainflow counter as half cycles, in 'range:peak' bins (ranges of 0 left out).
        Counted again only when the counter's state changed since (a swing within the gate changes nothing). Not for
        weighted: a new state is a new dict (its sums are kept with it: :meth:`residue_sum`)."""
        counter = self.rainflow.get(sensor)
        if counter is None:
            return {}
        return self._residue(sensor, counter)[1]

    def residue_sum(self, sensor: str, key: object, weight: Callable[[str], float]) -> float:
        """Σ half cycles x weight(bin) over the open residue (:meth:`residue_cycles`), in its order, kept with it
        until the counter's state changes; ``key`` names the weight (the function and its parameters)."""
        counter = self.rainflow.get(sensor)
        if counter is None:
            return 0.0
        _, residue, sums = self._residue(sensor, counter)
        total = sums.get(key)
        if total is None:
            total = sums[key] = weighted_sum(residue, key, weight)
        return total

    def _residue(self, sensor: str, counter: RainflowCounter) -> tuple[tuple[float | int | None, ...],
                                                                        dict[str, float], dict[object, float]]:
        state = (counter.gate, counter.extreme, counter.direction, *counter.stack)
        cached = self.residues.get(sensor)
        if cached is not None and cached[0] == state:
            return cached
        out: dict[str, float] = {}
        for c in counter.residue():
            _add(out, cycle_key(c), c[2])
        cached = self.residues[sensor] = (state, {k: v for k, v in out.items() if not k.startswith("0:")}, {})
        return cached

    def resistance_days(self) -> list[str]:
        """The UTC days of ``thermal_resistance`` with data (seconds > 0), in order. Sorted again only when a day was
        added or the map replaced: a day's seconds only grow, so the days with data change only with the map's size
        (a day held without data, as a loaded record may hold, is looked at each time)."""
        days, cached = self.thermal_resistance, self.days
        if cached is not None and cached[0] is days and cached[1] == len(days):
            return cached[2]
        with_data = sorted(d for d, v in days.items() if v[0] > 0)
        self.days = (days, len(days), with_data) if len(with_data) == len(days) else None
        return with_data

    def weighted(self, hist: dict[str, float], key: object, weight: Callable[[str], float], exact: bool) -> float:
        """Σ value x weight(bin) over one of this history's histograms (:func:`weighted_sum`), kept with it: a view
        after a tick takes what the bins gained since the last (:meth:`tally`, _Weighed.catch_up) instead of going
        over every bin again, and a bin is weighed once (bins only grow: a new one comes at the end, nothing removes
        one). ``key`` names the weight (the function and its parameters); an exact sum and an estimate of the same
        weight are kept apart."""
        if not hist:  # none yet (often a fresh {} standing for a histogram not started): nothing to keep
            return 0.0
        weighed = self.weighed.get(id(hist))
        if weighed is None or weighed.hist is not hist:
            if len(self.weighed) >= 64:
                self.weighed.clear()
            weighed = self.weighed[id(hist)] = _Weighed(hist)
        elif weighed.gained:
            weighed.catch_up()
        s = weighed.sums.get((key, exact))
        if s is None or len(s.weights) != len(hist):  # a new sum (or bins added without tally: all weighed again)
            by_bin = {b: weight(b) for b in hist}
            weights = list(by_bin.values())
            s = weighed.sums[(key, exact)] = _Sum(weight, exact, weights, by_bin,
                                                  float(sum(map(operator.mul, hist.values(), weights))))
        return s.total

    def busy_seconds(self, threshold_ratio: float, exact: bool = True) -> float:
        """Seconds with GPU utilization at or above ``threshold_ratio``; ``exact``: as weighted_sum's (off where the
        figure is not exported, a busy card's is not summed again at each view)."""
        return self.weighted(self.utilization_seconds, *_busy_weight(threshold_ratio), exact)

    def seconds_at_or_above(self, sensor: str, celsius: float) -> float:
        return self.weighted(self.temperature_seconds.get(sensor, {}), *_above_weight(celsius), True)

    def coverage(self) -> float | None:
        """Observed share of the wall time since the GPU was first seen (None before 1 s)."""
        span = (self.last_seen or 0.0) - (self.first_seen or 0.0) - self.skipped_seconds
        if self.first_seen is None or self.last_seen is None or span < 1:
            return None
        return min(1.0, self.observed_seconds / span)

    def merged(self, other: GpuWear) -> GpuWear:
        """A new accumulator holding this one's history plus ``other``'s (an imported log).

        ``other``'s open rainflow residue is closed as half cycles; this one's stays open, so
        live counting goes on. Health and thresholds: this one's (the newer) win."""
        return GpuWear.merged_all(self, [other])

    @staticmethod
    def merged_all(first: GpuWear, others: Iterable[GpuWear]) -> GpuWear:
        """``first.merged(a).merged(b)...`` for each of ``others`` in order, copying ``first`` once and joining the
        observed intervals once (a GPU's imports, years of them, merged in one pass rather than one copy each)."""
        out = GpuWear.from_json(first.to_json(), first.gate_celsius)
        out.rainflow = first.rainflow
        intervals = list(first.intervals())
        for other in others:
            out._absorb(other)
            intervals += other.intervals()
        out.covered = dict(_merged_intervals(intervals))
        return out

    def _absorb(self, other: GpuWear) -> None:
        """Add ``other``'s history to this one (:meth:`merged`'s work, but the observed intervals)."""
        out = self
        seen = [t for t in (self.first_seen, other.first_seen) if t is not None]
        out.first_seen = min(seen) if seen else None
        last = [t for t in (self.last_seen, other.last_seen) if t is not None]
        out.last_seen = max(last) if last else None
        for key in ("observed_seconds", "down_seconds", "gap_seconds", "gaps", "energy_joules",
                    "energy_counter_seconds", "energy_integrated_seconds", "power_limit_seconds", "power_seconds",
                    "lost_events", "skipped_seconds"):
            setattr(out, key, getattr(out, key) + getattr(other, key))
        for key in ("utilization_seconds", "throttle_seconds", "violation_seconds"):
            for k, v in getattr(other, key).items():
                _add(getattr(out, key), k, v)
        for sensor, hist in other.temperature_seconds.items():
            for k, v in hist.items():
                _add(out.temperature_seconds.setdefault(sensor, {}), k, v)
        for sensor in sorted({*other.temperature_seconds, *other.cycles, *other.rainflow}):  # cycles without time too
            for k, v in other.all_cycles(sensor).items():
                _add(out.cycles.setdefault(sensor, {}), k, v)
        for i, fan in enumerate(other.fans):
            while len(out.fans) <= i:
                out.fans.append(FanWear())
            for key in ("on_seconds", "revolutions", "rpm_seconds", "ratio_seconds"):
                setattr(out.fans[i], key, getattr(out.fans[i], key) + getattr(fan, key))
        for day, acc in other.thermal_resistance.items():
            mine = out.thermal_resistance.setdefault(day, [0.0, 0.0, 0.0])
            out.thermal_resistance[day] = [a + b for a, b in zip(mine, acc, strict=True)]
        out.thresholds = {**other.thresholds, **self.thresholds}
        out.health = {**other.health, **self.health}
        for code, n in other.xids.items():
            out.xids[code] = out.xids.get(code, 0) + n
        out.seen = {**self.seen, **other.seen}
        for what, wall in other.last_event.items():
            out.last_event[what] = max(wall, out.last_event.get(what, wall))
        for name, counts in other.error_counts.items():
            mine = out.error_counts.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            out.error_counts[name] = [x + y for x, y in zip(mine, counts, strict=True)]
        for day, counters in other.error_days.items():
            mine_day = out.error_days.setdefault(day, {})
            for name, counts in counters.items():
                before = mine_day.get(name, [0.0, 0.0])
                mine_day[name] = [x + y for x, y in zip(before, counts, strict=True)]
        _keep_newest(out.error_days)
        for day, tallies in other.health_days.items():
            into_day = out.health_days.setdefault(day, {})
            for key in ("busy", "throttled"):
                if key in tallies:
                    into_day[key] = into_day.get(key, 0.0) + tallies[key]
            if "stalls" in tallies:
                into_day["stalls"] = [a + b for a, b in zip(into_day.get("stalls", [0, 0]), tallies["stalls"],
                                                            strict=True)]
            for t, sec in tallies.get("hot", {}).items():
                _add(into_day.setdefault("hot", {}), t, sec)
        _keep_newest(out.health_days)
        for load, bins in other.slow_reads.items():
            mine_bins = out.slow_reads.setdefault(load, {})
            for key, n in bins.items():
                mine_bins[key] = mine_bins.get(key, 0) + n
        for key, what in sorted(other.incidents.items(), key=lambda kv: float(kv[0])):
            if key not in out.incidents:
                out.add_incident(float(key), what)
        for kind, k in other.kinds.items():
            into = out.kinds.setdefault(kind, {"seconds": 0.0, "energy_joules": 0.0, "temperature_seconds": {}})
            into["seconds"] += k["seconds"]
            into["energy_joules"] += k["energy_joules"]
            for t, sec in k["temperature_seconds"].items():
                _add(into["temperature_seconds"], t, sec)
        out.name = self.name or other.name
        out.serial = self.serial or other.serial

    # -- persistence -------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "uuid": self.uuid, "name": self.name, "serial": self.serial,
            "pci_bus_id": self.pci_bus_id, "index": self.index,
            "first_seen": self.first_seen, "last_seen": self.last_seen,
            "observed_seconds": self.observed_seconds, "down_seconds": self.down_seconds,
            "gap_seconds": self.gap_seconds, "gaps": self.gaps, "start_gap": self.start_gap,
            "covered": self.covered,
            "skipped_seconds": self.skipped_seconds,
            "utilization_seconds": self.utilization_seconds, "temperature_seconds": self.temperature_seconds,
            "cycles": self.cycles, "rainflow": {k: v.to_json() for k, v in self.rainflow.items()},
            "energy_joules": self.energy_joules, "energy_counter_seconds": self.energy_counter_seconds,
            "energy_integrated_seconds": self.energy_integrated_seconds,
            "power_limit_seconds": self.power_limit_seconds, "power_seconds": self.power_seconds,
            "throttle_seconds": self.throttle_seconds, "violation_seconds": self.violation_seconds,
            "fans": [vars(f) for f in self.fans], "thermal_resistance": self.thermal_resistance,
            "thermal": {"idle_celsius": self.thermal.idle_celsius, "idle_watts": self.thermal.idle_watts},
            "thresholds": self.thresholds, "health": self.health, "firmware": self.firmware,
            "xids": self.xids, "lost_events": self.lost_events, "last_event": self.last_event,
            "incidents": self.incidents, "error_counts": self.error_counts,
            "error_days": self.error_days, "health_days": self.health_days, "slow_reads": self.slow_reads,
            "kinds": self.kinds,
            "gate_celsius": self.gate_celsius, "seen": self.seen,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], gate_celsius: float) -> GpuWear:
        """Restore from :meth:`to_json`; the counter baselines start afresh (a restart is a gap)."""
        if d.get("schema") != SCHEMA:
            raise ValueError(f"unknown wear schema {d.get('schema')!r}")
        w = cls(uuid=d["uuid"], name=d.get("name", ""), serial=d.get("serial"), pci_bus_id=d.get("pci_bus_id"),
                index=d.get("index"), gate_celsius=gate_celsius)
        for key in ("first_seen", "last_seen"):
            setattr(w, key, d.get(key))
        for key in ("observed_seconds", "down_seconds", "gap_seconds", "energy_joules", "energy_counter_seconds",
                    "energy_integrated_seconds", "power_limit_seconds", "power_seconds", "start_gap",
                    "skipped_seconds"):
            setattr(w, key, float(d.get(key, 0.0)))
        w.gaps, w.lost_events = int(d.get("gaps", 0)), int(d.get("lost_events", 0))
        for key in ("utilization_seconds", "temperature_seconds", "cycles", "throttle_seconds", "violation_seconds",
                    "thermal_resistance", "thresholds", "health", "xids", "kinds", "last_event", "incidents",
                    "firmware"):
            setattr(w, key, d.get(key, {}))
        w.covered = {k: float(v) for k, v in d.get("covered", {}).items()}
        w.error_counts = {k: [float(x) for x in v] for k, v in d.get("error_counts", {}).items()}
        w.slow_reads = {load: {k: int(n) for k, n in bins.items()} for load, bins in d.get("slow_reads", {}).items()}
        w.error_days = {day: {k: [float(x) for x in v] for k, v in counters.items()}
                        for day, counters in d.get("error_days", {}).items()}
        w.health_days = {day: {k: (dict(v) if k == "hot" else [int(x) for x in v] if k == "stalls" else float(v))
                               for k, v in tallies.items()} for day, tallies in d.get("health_days", {}).items()}
        w.seen = dict(d["seen"]) if "seen" in d else _seen_in(w)
        w.rainflow = {k: RainflowCounter.from_json(v, gate_celsius) for k, v in d.get("rainflow", {}).items()}
        w.fans = [FanWear(**f) for f in d.get("fans", [])]
        thermal = d.get("thermal", {})
        w.thermal = ThermalState(idle_celsius=thermal.get("idle_celsius"), idle_watts=thermal.get("idle_watts"))
        return w
