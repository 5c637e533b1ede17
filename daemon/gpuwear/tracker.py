"""Feeds sampler snapshots into the per-GPU accumulators and publishes read-only views.

No clock and no I/O of its own: the caller passes the time with each snapshot and takes
the accumulators (as JSON) and the pending events out for the ledger.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple

from gpuwear.config import WearConfig
from gpuwear.health import XID_ACT, verdict
from gpuwear.health.signals import peer_and_own_rates
from gpuwear.health.xids import (
    IGNORE,
    LINE_JUDGED,
    NVLINK_REPEAT_SECONDS,
    SECONDARY,
    SERVICE,
    XID_APP,
    XID_UNIT_APP,
    alert_tier,
    line_step,
    lookup,
)
from gpuwear.jobs.attribute import JobAccounts, JobRecord
from gpuwear.jobs.resolve import Job, Unseen
from gpuwear.sample import FIRMWARE, VGPU_GUEST, GpuIdentity, GpuSample
from gpuwear.sampler import GpuStatus, Snapshot
from gpuwear.wear.accumulate import FIRST_READS, LOADED_UTILIZATION, GpuWear
from gpuwear.wear.events import Event
from gpuwear.wear.models import (
    BANDS,
    aging_bands,
    cycle_bin,
    fan_revolutions,
    fatigue_bands,
    resistance_trend,
    thermal_aging_hours,
)
from gpuwear.wear.plausibility import is_spike, suspect
from gpuwear.wear.schema import EARLIEST_WALL, LATEST_WALL

log = logging.getLogger(__name__)
CLOCK_JUMP_SECONDS = 120.0  # wall minus monotonic moving by more: the wall clock was set, not slewed

ABOVE_CELSIUS = tuple(range(40, 100, 5))  # "time at or above" series exported per sensor
CYCLE_RANGES = ((2, 5), (5, 10), (10, 20), (20, 40), (40, 1000))  # °C, [lo, hi)
THRESHOLDS = (("gpu", "slowdown"), ("gpu", "gpu_max"), ("memory", "memory_max"))
BASIC_THRESHOLDS = frozenset({("gpu", "slowdown"), ("memory", "memory_max")})  # exported without metrics.detail


def _incident(key: str, before: Any, after: Any) -> str | None:
    """The incident a change of a health reading is (one that calls for a reset, a reboot or service), or None."""
    if key == "recovery_action" and after:
        return f"recovery action {after}"
    if key in ("remapped_rows_pending", "remapped_rows_failure") and after and not before:
        return "row remap " + key.rsplit("_", 1)[1]
    if key == "ecc_uncorrected_volatile" and isinstance(after, (int, float)) and after > (before or 0):
        return "uncorrectable ecc"
    return None


_HEALTH_EVENTS = ("ecc_uncorrected_aggregate", "ecc_corrected_aggregate", "ecc_uncorrected_volatile",
                  "retired_pages_single_bit", "retired_pages_double_bit", "retired_pages_pending",
                  "remapped_rows_corrected", "remapped_rows_uncorrected", "remapped_rows_pending",
                  "remapped_rows_failure", "recovery_action")


def cycle_range_label(lo: int, hi: int) -> str:
    return f"{lo}-{hi}" if hi < 1000 else f"{lo}+"


CYCLE_LABELS = tuple(cycle_range_label(lo, hi) for lo, hi in CYCLE_RANGES)
BASIC_CYCLE_RANGES = (3, 4)  # CYCLE_RANGES exported without metrics.detail (the die's, 20-40 and 40+ °C)


def _in_range(index: int) -> Callable[[str], float]:
    """1.0 for a 'range:peak' bin in CYCLE_RANGES[index], else 0.0 (a weight: weighted_sum counts its cycles)."""
    return lambda key: float(_cycle_range(key) == index)


_RANGE_WEIGHTS = tuple((("cycle_range", i), _in_range(i)) for i in range(len(CYCLE_RANGES)))  # (key, weight)


def _cycle_range(key: str) -> int:
    """The index in CYCLE_RANGES of a 'range:peak' bin's range, -1 outside them all."""
    rng = cycle_bin(key)[0]
    return next((i for i, (lo, hi) in enumerate(CYCLE_RANGES) if lo <= rng < hi), -1)


class WearView(NamedTuple):
    """What the collector exports for one GPU; immutable, rebuilt after each tick (a named tuple: made for every GPU
    at every scrape, in a fifth of a frozen dataclass' time)."""

    observed_seconds: float
    busy_seconds: float
    down_seconds: float
    gap_seconds: float
    coverage: float | None
    energy_joules: float
    power_limit_seconds: float
    throttle_seconds: Mapping[str, float]
    above_celsius: Mapping[tuple[str, str], float]  # (sensor, °C) -> s
    above_threshold: Mapping[tuple[str, str], float]  # (sensor, threshold) -> s
    cycles: Mapping[tuple[str, str], float]  # (sensor, range label) -> closed cycles
    fans: tuple[tuple[float, float], ...]  # (on seconds, revolutions) per fan
    estimates: Mapping[str, Any]  # models.estimates' thermal aging and cycle fatigue bands (gpu; "memory"), those shown
    verdict: Mapping[str, Any]
    thermal_resistance: float | None  # °C/W, the latest day's
    attributed: Mapping[str, tuple[float, float, float]]  # job/idle -> (seconds, joules, central aging s)
    jobs: tuple[Job, ...]  # running on the GPU now
    # error counters by load (GpuWear.error_counts): (counter, "loaded" | "idle") -> (events, seconds watched)
    errors: Mapping[tuple[str, str], tuple[float, float]] = MappingProxyType({})
    # XID events over the card's life in the ledger by the alert their code raises (health.xids.alert_tier): both
    # tiers, 0 where none
    xid_tiers: Mapping[str, float] = MappingProxyType({"act": 0.0, "watch": 0.0})
    # what the card carried when gpuwear first read it (GpuWear.health's "carried NAME" of accumulate.FIRST_READS)
    # and when that was (Unix s): with metrics.detail only
    carried: Mapping[str, float] = MappingProxyType({})
    first_seen: float | None = None


def view(w: GpuWear, p: WearConfig, jobs: tuple[Job, ...] = (), detail: bool = True,
         peers: Mapping[str, list[float]] | None = None,
         own: Mapping[str, tuple[float | None, float | None]] | None = None) -> WearView:
    """Build the exported view of one GPU's accumulators (their weighted sums are kept with them from view to view,
    taking what the bins gained: GpuWear.weighted). ``detail`` off (metrics.detail): only what the default metrics
    show, without the time above each temperature, the low and high bands, the memory's cycles and cycle fatigue,
    the die's cycles below 20 °C and its time above gpu_max (BASIC_CYCLE_RANGES, BASIC_THRESHOLDS)."""
    above: dict[tuple[str, str], float] = {}
    for sensor, hist in w.temperature_seconds.items() if detail else ():  # one pass per sensor, hottest bin first
        hottest_first = sorted(((int(t), s) for t, s in hist.items()), reverse=True)
        total, k = 0.0, 0
        for limit in sorted(ABOVE_CELSIUS, reverse=True):
            while k < len(hottest_first) and hottest_first[k][0] >= limit:
                total += hottest_first[k][1]
                k += 1
            above[(sensor, str(limit))] = total
    thresholds = {(sensor, name): w.seconds_at_or_above(sensor, w.thresholds[name])
                  for sensor, name in THRESHOLDS if name in w.thresholds and sensor in w.temperature_seconds
                  and (detail or (sensor, name) in BASIC_THRESHOLDS)}
    cycles: dict[tuple[str, str], float] = {}
    for sensor, bins in w.cycles.items():
        if detail or sensor == "gpu":
            for i in range(len(CYCLE_RANGES)) if detail else BASIC_CYCLE_RANGES:
                cycles[(sensor, CYCLE_LABELS[i])] = w.weighted(bins, *_RANGE_WEIGHTS[i], True)
    bands = BANDS if detail else ("central",)
    est: dict[str, dict[str, Any]] = {
        "thermal_aging_equivalent_hours": aging_bands(w.temperature_seconds.get("gpu", {}), p, w, bands),
        "cycle_fatigue_equivalent_cycles": fatigue_bands(w, "gpu", p, bands)}
    if "memory" in w.temperature_seconds:
        est["thermal_aging_equivalent_hours"]["memory"] = aging_bands(w.temperature_seconds["memory"], p, w, bands)
        if detail:
            est["cycle_fatigue_equivalent_cycles"]["memory"] = fatigue_bands(w, "memory", p)
    trend = resistance_trend(w)
    busy = w.busy_seconds(p.busy_utilization_ratio, exact=detail)  # exported with metrics.detail only
    return WearView(
        observed_seconds=w.observed_seconds, busy_seconds=busy,
        down_seconds=w.down_seconds, gap_seconds=w.gap_seconds, coverage=w.coverage(),
        energy_joules=w.energy_joules, power_limit_seconds=w.power_limit_seconds,
        throttle_seconds=MappingProxyType(dict(w.throttle_seconds)), above_celsius=MappingProxyType(above),
        above_threshold=MappingProxyType(thresholds), cycles=MappingProxyType(cycles),
        fans=tuple((f.on_seconds, round(fan_revolutions(f, p), 1)) for f in w.fans),
        estimates=MappingProxyType(est),
        verdict=MappingProxyType(verdict(w, p, trend, peers, own=own)),
        thermal_resistance=trend["last_celsius_per_watt"] if trend else None,
        attributed=MappingProxyType({
            kind: (k["seconds"], k["energy_joules"],
                   3600 * thermal_aging_hours(k["temperature_seconds"], p.arrhenius.reference_celsius,
                                              p.arrhenius.activation_energy_ev.central, w))
            for kind, k in sorted(w.kinds.items())}),
        jobs=jobs,
        errors=MappingProxyType({(name, load): (c[1 + 2 * i], c[2 * i])
                                 for name, c in sorted(w.error_counts.items())
                                 for i, load in enumerate(("loaded", "idle"))}) if detail else MappingProxyType({}),
        xid_tiers=MappingProxyType(lifetime_xid_tiers(w.xids)),
        carried=MappingProxyType({name: float(w.health[f"carried {name}"]) for name in sorted(FIRST_READS)
                                  if f"carried {name}" in w.health} if detail else {}),
        first_seen=w.first_seen if detail else None,
    )


def lifetime_xid_tiers(xids: Mapping[str, int]) -> dict[str, float]:
    """A ledger's lifetime XID counts (code -> events, GpuWear.xids) by the alert their code raises: "act" and
    "watch", each 0 where none; the codes the catalog says to ignore and those whose line decides in neither."""
    tiers = {"act": 0.0, "watch": 0.0}
    for code, n in xids.items():
        if code.isdigit() and (tier := alert_tier(int(code))) is not None:
            tiers[tier] += n
    return tiers


# NVML told of an XID 74: its kernel-log line, if any, comes within sampler.XID_SAME_SECONDS
XID_LINE_WAIT_SECONDS = 15.0
XID_UNEXPLAINED_KEPT = 1024


@dataclass
class _Seen:
    monotonic: float | None = None  # of the last sample integrated
    up: bool = True
    down_since: float | None = None
    xids: dict[int, int] = field(default_factory=dict)  # the sampler's since-start counts last seen
    xid_lines: Mapping[tuple[int, int, tuple[int, ...]], int] = field(default_factory=dict)  # GpuStatus.xid_lines
    xid_processes: Mapping[tuple[int, int | None, str, str, str], int] = field(default_factory=dict)  # GpuStatus.
    # by LINE_JUDGED code, the monotonic times of its XID events no line has explained yet: judged by their tier
    # once XID_LINE_WAIT_SECONDS pass without one
    unexplained: dict[int, deque[float]] = field(default_factory=dict)
    stalls: int = 0  # the sampler's since-start count of ticks its read was past the deadline, last seen
    stalling: bool = False  # the last tick found it past the deadline (one hang: one stall, however many ticks)
    reset_required: int = 0  # the sampler's since-start count of reads NVML answered RESET_REQUIRED, last seen
    loaded: bool = False  # the GPU's utilization at the last reading was at or above LOADED_UTILIZATION
    interrupted: bool = False  # a tick without a reading since the last integrated sample
    before: tuple[float, float] | None = None  # (wall, °C) of the last die reading believed
    before_memory: tuple[float, float] | None = None  # (wall, °C) of the last memory (HBM) reading believed
    # a suspect sample (sample, dt, jobs): judged by the next
    held: tuple[GpuSample, float, list[Job] | Unseen] | None = None
    identity: GpuIdentity | None = None  # the identity whose firmware was last read into the record


REPEATS_KEPT = 3  # a link's newest repeat-step lines kept: the workflow's largest repeat count (health.xids)
APPLICATIONS_KEPT = 8  # per XID code of the app tier, the newest applications it came under (health rule xid_card)


def note_xid_applications(w: GpuWear, code: int, applications: list[str], wall: float, unit: str = "") -> None:
    """Keep in the record's last_event which applications (job names) ran when an XID of the catalog's app tier
    came, as "xid CODE app NAME" -> its last time, newest APPLICATIONS_KEPT per code: the health rule xid_card reads
    them. ``unit``: where on the chip its kernel-log line said it came ("GPC 1 TPC 3"), kept apart as "xid CODE at
    UNIT app NAME" (health.xids.card_evidence: XID 13's workflow compares repeats there). A job without a name is
    not an application gpuwear can tell apart from another run: not kept."""
    prefix = XID_UNIT_APP.format(code=code, unit=unit) if unit else XID_APP.format(code=code)
    for name in applications:
        w.last_event[prefix + name[:48]] = wall
    kind = f"xid {code} at " if unit else prefix
    kept = sorted((when, k) for k, when in w.last_event.items() if k.startswith(kind))
    for _, key in kept[:-APPLICATIONS_KEPT]:
        del w.last_event[key]


def _repeats(w: GpuWear, code: int, link: int, wall: float, lines: int) -> list[float]:
    """The wall times of ``code``'s repeat-step lines on ``link`` within NVLINK_REPEAT_SECONDS of ``wall``, these
    ``lines`` at ``wall`` included, newest REPEATS_KEPT: kept in the record's ``last_event`` as "xid CODE link LINK
    #N", which older releases read as any other last event."""
    keys = [f"xid {code} link {link} #{i}" for i in range(REPEATS_KEPT)]
    times = sorted([w.last_event[k] for k in keys if k in w.last_event] + [wall] * min(lines, REPEATS_KEPT))
    times = [t for t in times if wall - t <= NVLINK_REPEAT_SECONDS][-REPEATS_KEPT:]
    for i, key in enumerate(keys):
        if i < len(times):
            w.last_event[key] = times[i]
        else:
            w.last_event.pop(key, None)
    return times


class WearTracker:
    """Integrates each new sample of each GPU; thread-safe."""

    def __init__(self, wears: dict[str, GpuWear], params: WearConfig,
                 imported: dict[str, GpuWear] | None = None, running_jobs: list[JobRecord] | None = None,
                 job_grace_seconds: float = 60.0, user_in_metrics: bool = False) -> None:
        self._user_in_metrics = user_in_metrics
        self._detail = True  # views for metrics.detail (every series), else only what the default metrics read
        self._wears = wears
        self.jobs = JobAccounts(job_grace_seconds, running_jobs)
        self._imported = imported or {}  # history backfilled from logs: shown, never saved from here
        self._params = params
        self._lock = threading.Lock()
        self._seen: dict[str, _Seen] = {}
        self._events: list[Event] = []
        self._last_event_wall = 0.0
        self._views: Mapping[str, WearView] | None = MappingProxyType({})
        self._present: tuple[str, ...] = ()  # the GPUs of the last snapshot
        self._wall_offset: float | None = None  # wall minus monotonic at the last observation
        self.clock_jumped = False  # the wall clock was set (or found behind the ledger) in this process
        self.largest_start_gap = 0.0  # the longest time since a GPU's last sight, counted at this start
        self._clock_unset = False  # the wall clock is outside [2000, 2100): nothing is accounted until it is set
        self._kernel_position: dict[str, Any] | None = None  # the kernel log's, as far as the records cover it
        self._sxids: dict[str, int] = {}  # the host's NVSwitch SXids by severity, as the last snapshot counted them
        self.taken_kernel_position: dict[str, Any] | None = None  # as of the last take()
        self._trials_said: set[tuple[str, str]] = set()  # (GPU, code) a rule on trial says now, said in the log

    @property
    def views(self) -> Mapping[str, WearView]:
        """Views by UUID of the GPUs present now. Derived at most once per observed snapshot,
        when first asked (a scrape), not at every tick: estimates cost more than sampling."""
        views = self._views
        if views is None:
            with self._lock:
                views = self._views
                if views is None:
                    running = self.jobs.running()
                    shown = {uuid: self._shown(uuid) for uuid in self._present}
                    peers, own = peer_and_own_rates(
                        {uuid: self._wears[uuid] for uuid in self._present if uuid in self._wears},
                        self._params)  # the host's own GPUs, not imported histories
                    views = self._views = MappingProxyType({
                        uuid: view(w, self._params, self._jobs_shown(uuid, running.get(uuid, ())), self._detail,
                                   peers.get(uuid), own.get(uuid) if w is self._wears.get(uuid) else None)
                        for uuid, w in shown.items()})
                    self._say_trials(views)
        return views

    def _say_trials(self, views: Mapping[str, WearView]) -> None:
        """What a rule on trial (wear.health.rules: log) would have said, recorded in the daemon's log when it begins
        to say it (again after it stopped), as NVSentinel's store-only rules record theirs: never in the verdict."""
        now = {(uuid, r["code"]): r for uuid, v in views.items() for r in v.verdict.get("would_have_said", ())}
        for (uuid, code), r in now.items():
            if (uuid, code) not in self._trials_said:
                log.info("GPU %s: the rule %s, on trial (wear.health.rules), would have said: [%s] %s", uuid, code,
                         r["severity"], r["text"])
        self._trials_said = set(now)

    def _jobs_shown(self, uuid: str, running: Iterable[JobRecord]) -> tuple[Job, ...]:
        return tuple(Job(r.kind, r.id, r.user if self._user_in_metrics else None, r.name, r.namespace, r.pod,
                         r.gpus[uuid].container) for r in running)

    def known(self) -> dict[str, tuple[str, float | None, str | None, float | None]]:
        """Every GPU this host's history holds (the ledger's and those seen since the start, not the imported
        ones): UUID -> (name, last seen, Unix s, PCI bus id, first seen, Unix s)."""
        with self._lock:
            return {uuid: (w.name, w.last_seen, w.pci_bus_id, w.first_seen) for uuid, w in self._wears.items()}

    def adopt(self, stored: dict[str, GpuWear], imported: dict[str, GpuWear]) -> None:
        """Merge a ledger opened late into the history kept in memory since the start: the
        stored history is added to each GPU's (whose live rainflow state is kept)."""
        with self._lock:
            for uuid, old in stored.items():
                mine = self._wears.get(uuid)
                self._wears[uuid] = old if mine is None else mine.merged(old)
            self._imported = imported
            self._views = None

    def set_params(self, params: WearConfig) -> None:
        with self._lock:
            self._params = params
            self._views = None

    def set_detail(self, detail: bool) -> None:
        """metrics.detail: the views hold every exported figure, or only those of the default metrics."""
        with self._lock:
            self._detail = detail
            self._views = None

    def observe(self, snap: Snapshot, monotonic: float, wall: float,
                jobs: Mapping[str, list[Job] | Unseen] | None = None) -> None:
        """Account the GPUs of a snapshot taken at ``monotonic`` / ``wall``; ``jobs``: the jobs
        whose processes run on each GPU (by UUID) in that snapshot."""
        jobs = jobs or {}
        with self._lock:
            if not self._sane_clock(monotonic, wall):
                return
            driver = snap.system.driver_version if snap.system is not None else None
            for status in snap.gpus:
                self._observe(status, monotonic, wall, jobs.get(status.identity.uuid, []), driver)
            self._sxids_seen(snap, wall)
            if snap.kernel_position is not None:  # the XIDs it covers are in the records now
                self._kernel_position = dict(snap.kernel_position)
            self.jobs.expire(wall)
            self._present = tuple(s.identity.uuid for s in snap.gpus)
            self._views = None  # derived when next asked

    def _sxids_seen(self, snap: Snapshot, wall: float) -> None:
        """The host's NVSwitch SXids (the kernel log's, by severity) name no GPU: when more come, each GPU's record
        keeps the time as "sxid SEVERITY" in ``last_event``, for NVIDIA's XID 74 workflow ("if seen with other
        Xid/SXid, please follow the resolution for those"; health.rules)."""
        for severity, n in snap.sxids.items():
            if n > self._sxids.get(severity, 0):
                for status in snap.gpus:
                    if (w := self._wears.get(status.identity.uuid)) is not None:
                        w.last_event[f"sxid {severity}"] = wall
            self._sxids[severity] = n

    def _sane_clock(self, monotonic: float, wall: float) -> bool:
        """Hold accounting while the wall clock is unset (a board without a battery-backed clock boots in 1970), and
        detect the wall clock being set while sampling: intervals are measured on the monotonic clock anyway,
        but a jump back takes back what the clock's lead had added (``last_seen``, the gap counted at start) and
        a jump forward is recorded as skipped, never as unobserved time."""
        if not EARLIEST_WALL <= wall < LATEST_WALL:
            if not self._clock_unset:
                log.warning("the wall clock reads %.0f, not a time between 2000 and 2100: nothing is accounted "
                            "(ledger, jobs) until it is set; metrics are still served", wall)
            self._clock_unset = True
            return False
        if self._clock_unset:
            log.warning("the wall clock is set: accounting resumes")
            self._clock_unset = False
        offset = wall - monotonic
        jump = 0.0 if self._wall_offset is None else offset - self._wall_offset
        self._wall_offset = offset
        if abs(jump) > CLOCK_JUMP_SECONDS:
            self.clock_jumped = True
            log.warning("the wall clock was set %+.0f s while sampling; observed time follows the monotonic clock, "
                        "the jump is counted as neither observed nor unobserved", jump)
            for uuid, seen in self._seen.items():
                w = self._wears[uuid]
                seen.before = seen.before_memory = None  # spike judgement compares wall times: not across a jump
                self._event(w, wall, "clock_jump", {"seconds": jump})
                if jump > 0:
                    w.skipped_seconds += jump
                else:
                    self._clock_behind(w, wall)
            if jump < 0:
                self.jobs.clock_set_back(wall)
        return True

    @staticmethod
    def _clock_behind(w: GpuWear, wall: float) -> None:
        """The wall clock reads earlier than the GPU's last sight: its times were ahead. ``last_seen`` comes back
        to now, and the gap counted at the latest start, as far as the lead made it, is taken back."""
        if w.last_seen is None or w.last_seen <= wall:
            return
        lead = w.last_seen - wall
        back = min(w.start_gap, lead)
        w.gap_seconds -= back
        w.start_gap -= back
        w.skipped_seconds = max(0.0, w.skipped_seconds - (lead - back))
        w.last_seen = wall
        if w.first_seen is not None and w.first_seen > wall:
            w.first_seen = wall
        w.covered = {k: min(end, wall) for k, end in w.covered.items() if float(k) <= wall}  # none in the future

    def _shown(self, uuid: str) -> GpuWear:
        w = self._wears[uuid]
        imported = self._imported.get(uuid)
        return w.merged(imported) if imported is not None else w

    def _observe(self, status: GpuStatus, monotonic: float, wall: float, jobs: list[Job] | Unseen,
                 driver: str | None = None) -> None:
        ident = status.identity
        w = self._wears.get(ident.uuid)
        if w is None:
            w = self._wears[ident.uuid] = GpuWear(ident.uuid, gate_celsius=self._params.cycles.hysteresis_celsius)
        w.name, w.serial, w.pci_bus_id = ident.name, ident.serial or w.serial, ident.pci_bus_id or w.pci_bus_id
        w.index = ident.index
        if ident.virtualization_mode == VGPU_GUEST:  # a vGPU's UUID is its own: once one, always one
            w.health["vgpu_guest"] = True
        seen = self._seen.get(ident.uuid)
        if seen is None:  # first sight in this process: the time since the ledger last saw it is a gap
            seen = self._seen[ident.uuid] = _Seen(xids=dict(status.xids), xid_lines=status.xid_lines,
                                                 xid_processes=status.xid_processes)
            if w.last_seen is not None and wall > w.last_seen:
                w.gap(wall - w.last_seen)
                w.start_gap += wall - w.last_seen  # gaps counted at starts: what a clock found ahead can take back
                self.largest_start_gap = max(self.largest_start_gap, wall - w.last_seen)
                self._event(w, wall, "gap", {"seconds": wall - w.last_seen, "reason": "not observed (daemon stopped?)"})
            elif w.last_seen is not None and wall < w.last_seen - CLOCK_JUMP_SECONDS:
                log.warning("GPU %s: the wall clock reads %.0f s before the ledger's last sight of it: the clock was "
                            "ahead when that was recorded; that lead is taken back", ident.uuid, w.last_seen - wall)
                self._event(w, wall, "clock_jump", {"seconds": wall - w.last_seen})
                self._clock_behind(w, wall)
                self.clock_jumped = True
        if seen.identity is not ident:  # read at the GPU's open (a restart, a reopen after a driver reload)
            self._firmware(w, ident, wall, driver)
            seen.identity = ident
        self._xids(w, seen, status, wall, monotonic)
        self._reset_required(w, seen, status, wall)
        stalls = status.errors.get("stalled", 0)
        if stalls > seen.stalls and not seen.stalling:  # a read past the deadline: booked to the load it was under
            w.add_stalls(1, seen.loaded, wall)
            self._event(w, wall, "stall", {"loaded": seen.loaded})
        seen.stalling, seen.stalls = stalls > seen.stalls, stalls
        if status.sample is not None and status.sample.utilization_gpu_ratio is not None:
            seen.loaded = status.sample.utilization_gpu_ratio >= LOADED_UTILIZATION
        if not status.up:
            self._release(w, seen, None)
            if seen.up:
                w.add_lost(wall)
                w.add_incident(wall, "gpu lost")
                self._event(w, wall, "gpu_lost", {})
                self.jobs.event(ident.uuid, "gpu lost")
                self.jobs.stop_gpu(ident.uuid, wall)
                seen.up, seen.down_since, seen.monotonic = False, monotonic, None
            elif seen.down_since is not None:
                w.down(monotonic - seen.down_since)
                seen.down_since = monotonic
            w.see(wall)
            return
        if not seen.up:
            if seen.down_since is not None:
                w.down(monotonic - seen.down_since)
            self._event(w, wall, "gpu_back", {})
            seen.up, seen.down_since = True, None
        sample = status.sample
        if sample is None:  # up, but no reading (driver gone, read stalled): the time is not observed
            self._release(w, seen, None)
            seen.interrupted = True
            return
        if sample.monotonic == seen.monotonic:
            return
        w.add_read(status.last_duration_seconds, seen.loaded)
        dt = 0.0 if seen.monotonic is None else sample.monotonic - seen.monotonic
        if dt > self._params.max_gap_seconds or (seen.interrupted and dt > 0):
            self._release(w, seen, None)
            reason = "no reading (driver gone or read stalled)" if seen.interrupted else "samples too far apart"
            w.gap(dt)
            self._event(w, sample.timestamp, "gap", {"seconds": dt, "reason": reason})
            self.jobs.stop_gpu(ident.uuid, sample.timestamp - dt)
            dt = 0.0
            seen.before = seen.before_memory = None
        else:
            self._release(w, seen, sample)
        seen.interrupted = False
        seen.monotonic = sample.monotonic
        if (suspect(seen.before, sample.timestamp, sample.temperature_gpu_celsius)
                or suspect(seen.before_memory, sample.timestamp, sample.temperature_memory_celsius)):
            seen.held = (sample, dt, jobs)  # a lone spike or a real jump: the next sample tells
            return
        self._integrate(w, seen, sample, dt, jobs, (False, False))

    def _release(self, w: GpuWear, seen: _Seen, following: GpuSample | None) -> None:
        """Integrate the held suspect sample, its die or memory reading dropped if ``following`` shows it a lone
        spike (believed when nothing follows: a gap, a lost GPU, a stop)."""
        if seen.held is None:
            return
        sample, dt, jobs = seen.held
        seen.held = None
        spikes = (False, False)
        if following is not None:
            spikes = (is_spike(seen.before, sample.timestamp, sample.temperature_gpu_celsius, following.timestamp,
                               following.temperature_gpu_celsius),
                      is_spike(seen.before_memory, sample.timestamp, sample.temperature_memory_celsius,
                               following.timestamp, following.temperature_memory_celsius))
        self._integrate(w, seen, sample, dt, jobs, spikes)

    def _integrate(self, w: GpuWear, seen: _Seen, sample: GpuSample, dt: float, jobs: list[Job] | Unseen,
                   spikes: tuple[bool, bool]) -> None:
        for spike, name in zip(spikes, ("temperature_gpu_celsius", "temperature_memory_celsius"), strict=True):
            if spike:
                self._event(w, sample.timestamp, "reading_dropped", {"field": name, "reason": "spike",
                                                                     "value": getattr(sample, name)})
        if spikes[0]:
            sample = replace(sample, temperature_gpu_celsius=None)
        if spikes[1]:
            sample = replace(sample, temperature_memory_celsius=None)
        if sample.temperature_gpu_celsius is not None:
            seen.before = (sample.timestamp, sample.temperature_gpu_celsius)
        if sample.temperature_memory_celsius is not None:
            seen.before_memory = (sample.timestamp, sample.temperature_memory_celsius)
        uuid = w.uuid
        before = {k: w.health.get(k) for k in _HEALTH_EVENTS}
        interval = w.add(sample, dt)
        temps = {k: v for k, v in (("gpu", sample.temperature_gpu_celsius),
                                   ("memory", sample.temperature_memory_celsius)) if v is not None}
        if interval.dt > 0 or interval.cycles:
            self.jobs.account(uuid, sample.timestamp, interval, temps, jobs, w)
        for k in _HEALTH_EVENTS:
            if w.health.get(k) != before[k] and before[k] is not None:
                self._event(w, sample.timestamp, "health", {"field": k, "from": before[k], "to": w.health.get(k)})
                self.jobs.event(uuid, f"health {k}")
                if (what := _incident(k, before[k], w.health.get(k))) is not None:
                    w.add_incident(sample.timestamp, what)

    def end_jobs(self) -> None:
        """End every running job and idle line (a simulation stopping)."""
        with self._lock:
            self.jobs.end_all()

    def flush(self) -> None:
        """Integrate every held suspect sample as believed (at stop, before the last save)."""
        with self._lock:
            for uuid, seen in self._seen.items():
                w = self._wears.get(uuid)
                if w is not None:
                    self._release(w, seen, None)
            self._views = None

    def _reset_required(self, w: GpuWear, seen: _Seen, status: GpuStatus, wall: float) -> None:
        """NVML answering the GPU's reads NVML_ERROR_RESET_REQUIRED: in its record (health "reset_required") until a
        read of it answers without, an incident the first time."""
        answered = status.errors.get("reset_required", 0)
        if answered > seen.reset_required:
            if not w.health.get("reset_required"):
                w.health["reset_required"] = True
                w.add_incident(wall, "reset required")
                self._event(w, wall, "health", {"field": "reset_required", "from": False, "to": True})
        elif w.health.get("reset_required") and status.sample is not None and status.up:
            w.health["reset_required"] = False
            self._event(w, wall, "health", {"field": "reset_required", "from": True, "to": False})
        seen.reset_required = answered

    def _firmware(self, w: GpuWear, ident: GpuIdentity, wall: float, driver: str | None = None) -> None:
        """The card's firmware (sample.FIRMWARE) into its record: the first read kept as its first sight, with the
        host's driver then (nvmlSystemGetDriverVersion: a driver upgrade is no change of the card's, so only there),
        each change from the last read kept (from, to, when) with an event "firmware" (rule firmware_changed)."""
        now = {k: v for k in FIRMWARE if (v := getattr(ident, k)) is not None}
        if not now:
            return
        fw = w.firmware
        if "first" not in fw:
            fw["first"] = {**now, "at": wall, **({"driver": driver[:64]} if driver else {})}
        before = fw.get("now", {})
        for k, v in now.items():
            if k in before and before[k] != v:
                fw.setdefault("changed", {})[k] = [before[k], v, wall]
                self._event(w, wall, "firmware", {"field": k, "from": before[k], "to": v})
        if before != now:
            fw["now"] = {**before, **now}

    def _xids(self, w: GpuWear, seen: _Seen, status: GpuStatus, wall: float, monotonic: float) -> None:
        new = {code: n - seen.xids.get(code, 0) for code, n in status.xids.items() if n > seen.xids.get(code, 0)}
        if new:
            w.add_xids(new, wall, untimed=LINE_JUDGED)
            for code, n in new.items():
                if code in LINE_JUDGED:  # judged with its line (_xid_lines)
                    waiting = seen.unexplained.setdefault(code, deque(maxlen=XID_UNEXPLAINED_KEPT))
                    waiting.extend([monotonic] * min(n, XID_UNEXPLAINED_KEPT))
                elif code in XID_ACT:  # the catalog asks for a reset, a reboot or service
                    w.add_incident(wall, f"xid {code}")
                self._event(w, wall, "xid", {"xid": code, "count": n, "jobs": self.jobs.who(w.uuid)})
                if lookup(code).tier == "app":
                    note_xid_applications(w, code, self.jobs.applications(w.uuid), wall)
                for _ in range(n):
                    self.jobs.event(w.uuid, f"xid {code}")
            seen.xids = dict(status.xids)
        if status.xid_processes is not seen.xid_processes:
            self._xid_processes(w, seen, status, wall)

        if status.xid_lines is not seen.xid_lines or any(seen.unexplained.values()):
            self._xid_lines(w, seen, status, wall, monotonic)

    def _xid_processes(self, w: GpuWear, seen: _Seen, status: GpuStatus, wall: float) -> None:
        """The processes the kernel log's XID lines named (GpuStatus.xid_processes), each new one an event "xid
        process" with who ran on the GPU then: which run raised the XID, where the line says (the XID's own event
        may come a tick before, from NVML)."""
        for key, n in status.xid_processes.items():
            if (new := n - seen.xid_processes.get(key, 0)) > 0:
                code, pid, name, instance, unit = key
                self._event(w, wall, "xid process", {"xid": code, "pid": pid, "process": name or None, "count": new,
                                                     "instance": instance or None, "unit": unit or None,
                                                     "jobs": self.jobs.who(w.uuid)})
                if unit and lookup(code).tier == "app":
                    note_xid_applications(w, code, self.jobs.applications(w.uuid), wall, unit)
        seen.xid_processes = status.xid_processes

    def _xid_lines(self, w: GpuWear, seen: _Seen, status: GpuStatus, wall: float, monotonic: float) -> None:
        """NVLink XID events (74, 144-150) judged by NVIDIA's workflow for them (health.xids.line_step) where their
        kernel-log line gave its values; by the code's tier where none came within XID_LINE_WAIT_SECONDS."""
        architecture = status.identity.architecture
        for key, n in status.xid_lines.items():
            lines = n - seen.xid_lines.get(key, 0)
            if lines <= 0:
                continue
            code, link, registers = key
            waiting = seen.unexplained.get(code, deque())
            for _ in range(min(lines, len(waiting))):
                waiting.popleft()
            self._xid_step(w, code, link, line_step(code, registers, architecture), lines, wall)
        seen.xid_lines = status.xid_lines
        for code, waiting in seen.unexplained.items():
            while waiting and monotonic - waiting[0] > XID_LINE_WAIT_SECONDS:
                waiting.popleft()
                self._xid_step(w, code, -1, SERVICE, 1, wall)

    @staticmethod
    def _xid_step(w: GpuWear, code: int, link: int, step: str | int, lines: int, wall: float) -> None:
        """``lines`` XID lines of ``code`` on ``link`` at ``wall`` given ``step``: act (an incident), watched (a
        repeat step not yet repeated enough on its link within NVLINK_REPEAT_SECONDS) or ignored. A link's recent
        repeat-step lines are kept in the record (:func:`_repeats`), so a restart does not count them again from 0."""
        if isinstance(step, int):
            times = _repeats(w, code, link if 0 <= link < 64 else -1, wall, lines)
            step = SERVICE if len(times) >= step else "watch"
        if step == SERVICE:
            w.last_event[f"xid {code}"] = wall
            w.add_incident(wall, f"xid {code}")
        elif step == SECONDARY:  # judged beside the GPU's other XIDs by the rule (health.rules: _line_judged)
            w.last_event[f"xid {code} secondary"] = wall
        elif step != IGNORE:
            w.last_event[f"xid {code} watch"] = wall

    def _event(self, w: GpuWear, wall: float, kind: str, detail: dict[str, Any]) -> None:
        # the wall clock can be set back: events stay in order (the ledger's reader relies on it)
        self._last_event_wall = max(self._last_event_wall, wall)
        self._events.append(Event(w.uuid, self._last_event_wall, kind, detail))

    def take(self, running_jobs_every: float = 0.0) -> tuple[list[dict[str, Any]], list[Event], list[dict[str, Any]]]:
        """Accumulators (as JSON) of every GPU, the events since the last take and the job
        records changed since (a running one at most every ``running_jobs_every`` seconds), for a save, and in
        :attr:`taken_kernel_position` where the kernel log was read to, as far as these records count its XIDs. Hand
        events and jobs back with :meth:`give_back` when the save fails."""
        with self._lock:
            self.taken_kernel_position = self._kernel_position  # saved with these records, in their transaction
            events, self._events = self._events, []
            # copies, made under the lock: to_json() hands out the live maps, which the next tick goes on changing
            # while the save serializes them (a histogram or an interval newer than the scalars beside it)
            return (json.loads(json.dumps([w.to_json() for w in self._wears.values()])), events,
                    json.loads(json.dumps(self.jobs.take(running_jobs_every))))

    def give_back(self, events: list[Event], jobs: list[dict[str, Any]]) -> None:
        with self._lock:
            self._events[:0] = events
            self.jobs.give_back(jobs)

    def wear(self, uuid: str) -> GpuWear | None:
        return self._wears.get(uuid)
