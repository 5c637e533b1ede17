"""`gpuwear import nvidia-smi`: backfill the ledger from telemetry CSV logs.

Each file's rows are accumulated per GPU in an accumulator of their own and stored as an
import (a separate table): the live history is never rewritten, and reports merge both.
A GPU is the UUID in the log; else the ledger GPU last seen at the log's PCI bus id; else
(index only) an "imported:" key made of the GPU name and index, or the UUID given with
``--gpu``. Rows inside a time interval the ledger already observed for that GPU, live or
imported (``Ledger.covered``), are skipped, so importing a file twice, an overlapping longer
log, or a log of time the daemon itself sampled never counts twice; a log of a gap is taken.
"""

from __future__ import annotations

import datetime
import statistics
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.imports.parse import ImportedRow, ImportFormatError, RowProblem, read_telemetry_csv
from gpuwear.ledger import Ledger
from gpuwear.sample import GpuSample, validated
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.cadence import STRETCH_INTERVALS, gap_threshold, stretch_threshold
from gpuwear.wear.plausibility import SpikeFilter, above_shutdown, product_shutdown

CADENCE_INTERVALS = 200  # a GPU's first intervals in a file, whose median is the log's cadence
NOT_READINGS = ("threshold_", "power_limit_watts", "power_default_limit_watts", "_max_hz")


@dataclass
class _Reading:
    """A row on its way into the accumulator, or a break in the series (``kind``)."""

    timestamp: float
    values: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    kind: str = "reading"  # or "gap" (time not observed before the next reading) or "covered" (counted elsewhere)


@dataclass
class _Gpu:
    uuid: str
    wear: GpuWear
    spans: list[tuple[float, float]]
    max_gap: float | None  # the gap threshold: given, or found from the cadence
    live_max_gap: float  # the live daemon's, the least a threshold found from the cadence can be
    # a threshold found from the cadence is also judged stretch by stretch (wear.cadence), a given one is not
    by_stretch: bool = True
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=STRETCH_INTERVALS))  # the last intervals
    buffered: list[_Reading] = field(default_factory=list)  # held until the cadence is known
    intervals: list[float] = field(default_factory=list)
    cadence: float | None = None
    spike: SpikeFilter[_Reading] = field(default_factory=SpikeFilter)  # die readings
    memory_spike: SpikeFilter[_Reading] = field(default_factory=SpikeFilter)  # memory (HBM) readings
    last_time: float | None = None  # the last row taken (duplicates, order)
    previous: float | None = None  # the last reading integrated
    gap_from: float | None = None  # a break: the time from here to the next reading is not observed
    first: float | None = None
    last: float | None = None
    rows: int = 0
    skipped: int = 0
    dropped: int = 0
    excluded: Counter[str] = field(default_factory=Counter)
    intervals_ms: Counter[int] = field(default_factory=Counter)  # every interval between two readings (ms)
    entry: tuple[float, str] | None = None  # the last entry fed: (time, kind)


def _entry(g: _Gpu, r: _Reading) -> None:
    """An entry in the file's order: its interval from the reading before it counted (readings only), then fed."""
    if r.kind == "reading" and g.entry is not None and g.entry[1] == "reading":
        g.intervals_ms[round((r.timestamp - g.entry[0]) * 1000)] += 1
    g.entry = (r.timestamp, r.kind)
    _feed(g, r)


@dataclass
class FileResult:
    """What one file gave, per GPU UUID: rows imported, rows skipped as already imported, rows and readings
    not believed (by reason), and the cadence found with the gap threshold used."""

    path: Path
    imported: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, Counter[str]] = field(default_factory=dict)
    cadence: dict[str, tuple[float | None, float]] = field(default_factory=dict)
    # the median interval between two readings over the whole file (ms resolution), per GPU: the cadence said
    median_interval: dict[str, float | None] = field(default_factory=dict)
    problems: int = 0
    dropped: int = 0
    reader: str = "rows"  # "columns" (the fast path) or "rows: <why the fast path could not read it>"


@dataclass
class GpuImport:
    """What one file gave for one GPU (either path): its accumulator and the counts FileResult reports."""

    uuid: str
    wear: GpuWear
    first: float | None  # the first and last readings integrated
    last: float | None
    rows: int
    skipped: int
    excluded: Counter[str]
    cadence: float | None
    max_gap: float | None
    dropped: int
    intervals_ms: Counter[int] = field(default_factory=Counter)  # every interval between two readings, in ms


def median_ms(counts: Counter[int]) -> float | None:
    """The (lower) median of intervals counted by whole milliseconds, in seconds; None without any."""
    total = sum(counts.values())
    if not total:
        return None
    seen = 0
    for ms in sorted(counts):
        seen += counts[ms]
        if 2 * seen >= total:
            return ms / 1000.0
    return None  # not reached


def finish(path: Path, ledger: Ledger, params: WearConfig, gpus: list[GpuImport], problems: int,
           reader: str) -> FileResult:
    """Store each GPU's import (one transaction) and say what the file gave."""
    ledger.save([], [], [(g.uuid, str(path), g.first, g.last, g.rows, g.wear.to_json()) for g in gpus
                         if g.first is not None and g.last is not None])
    result = FileResult(path, problems=problems, reader=reader)
    for g in gpus:
        result.imported[g.uuid] = g.rows
        result.skipped[g.uuid] = g.skipped
        result.excluded[g.uuid] = g.excluded
        result.cadence[g.uuid] = (g.cadence, g.max_gap or params.max_gap_seconds)
        result.median_interval[g.uuid] = median_ms(g.intervals_ms)
        result.dropped += g.dropped
    return result


def resolve_gpu(row: ImportedRow, known: dict[str, GpuWear], gpu: str | None) -> str:
    """The ledger UUID of a row's GPU: ``gpu`` (--gpu), the row's uuid, the GPU last seen at its PCI bus id."""
    if gpu is not None:
        return gpu
    uuid = row.identity.get("uuid")
    if uuid:
        return str(uuid)
    bus = row.identity.get("pci_bus_id")
    if bus:
        for w in known.values():
            if w.pci_bus_id and w.pci_bus_id.lower() == str(bus).lower():
                return w.uuid
        return f"imported:{bus}"
    raise ImportFormatError("the log does not say which GPU it is of (no uuid or pci.bus_id column): pass --gpu "
                            "with the GPU's UUID (`nvidia-smi -L` on the box that wrote it; `gpuwear report` lists "
                            "the known ones), so that logs of different cards are never merged")


def card_name(name: str | None) -> str:
    """A card's name as two logs of the same card agree on it: "NVIDIA A100-SXM4-80GB" and "a100-sxm4-80gb" match."""
    text = " ".join((name or "").split()).lower()
    return text.removeprefix("nvidia ").strip()


def different_cards(names: Iterable[str | None]) -> list[str]:
    """The distinct cards ``names`` name (empty names left out), sorted, when there are several; else []."""
    cards: dict[str, str] = {}
    for name in names:
        if name and card_name(name):
            cards.setdefault(card_name(name), name)
    return sorted(cards.values()) if len(cards) > 1 else []


def ledger_uuid(row: ImportedRow, resolved: dict[tuple[str, str | None], str], known: dict[str, GpuWear],
                gpu: str | None) -> str:
    """The ledger UUID of a row's GPU (:func:`resolve_gpu`), remembered in ``resolved`` by the row's GPU key and
    name (the same few on every row). ImportFormatError when ``gpu`` (--gpu) names one GPU but the log, without a
    uuid column, holds several, or names different cards (logs of different cards are never merged)."""
    uuid = resolved.get((row.gpu, row.name))
    if uuid is None:
        uuid = resolved[row.gpu, row.name] = resolve_gpu(row, known, gpu)
        if gpu is not None and len({k for k, _ in resolved}) > 1 and not row.identity.get("uuid"):
            raise ImportFormatError(f"the log holds several GPUs ({', '.join(sorted({k for k, _ in resolved}))})"
                                    " but --gpu names one; import a log with a uuid column")
        if gpu is not None and (cards := different_cards(name for _, name in resolved)):
            raise ImportFormatError(f"the log names different cards ({', '.join(cards)}) but --gpu names one: logs "
                                    "of different cards are never merged; import each card's rows with its own --gpu")
    return uuid


def new_wear(uuid: str, known: dict[str, GpuWear], gate: float, name: str | None = None) -> GpuWear:
    """A fresh accumulator for an import, with the thresholds the ledger read from that card (its shutdown
    threshold judges the log's die readings), else the shutdown threshold of the product the log's first row names
    (plausibility.product_shutdown)."""
    w = GpuWear(uuid, gate_celsius=gate)
    w.count_errors = False  # error rates are the live daemon's: the columnar reader does not count them either
    if uuid in known:
        w.thresholds = dict(known[uuid].thresholds)
    elif (shutdown := product_shutdown(name)) is not None:
        w.thresholds["shutdown"] = shutdown
    return w


def _has_readings(values: dict[str, Any]) -> bool:
    return any(v is not None and not any(part in k for part in NOT_READINGS) for k, v in values.items())


def _integrate(g: _Gpu, r: _Reading, spike: bool = False, memory_spike: bool = False) -> None:
    if r.kind != "reading":
        g.previous = None
        g.gap_from = g.last if r.kind == "gap" else None
        return
    values = r.values
    if spike or memory_spike:
        values = dict(values)
        for sensor, field_name, reason in ((spike, "temperature_gpu_celsius", "spike"),
                                           (memory_spike, "temperature_memory_celsius", "memory_spike")):
            if sensor:
                values[field_name] = None
                g.excluded[reason] += 1
    assert g.max_gap is not None
    if g.previous is None:
        if g.gap_from is not None:
            g.wear.gap(r.timestamp - g.gap_from)
        dt = 0.0
    else:
        dt = r.timestamp - g.previous
        limit = stretch_threshold(g.max_gap, g.recent, g.live_max_gap) if g.by_stretch else g.max_gap
        g.recent.append(dt)
        if dt > limit:
            g.wear.gap(dt)
            dt = 0.0
    g.gap_from = None
    g.wear.add(GpuSample.of(r.timestamp, r.timestamp, values), dt)
    g.wear.name = g.wear.name or r.name
    g.previous = r.timestamp
    g.first = r.timestamp if g.first is None else g.first
    g.last = r.timestamp
    g.rows += 1


def _feed(g: _Gpu, r: _Reading) -> None:
    """The cadence stage (rows held until the gap threshold is known), then the spike stage (one late)."""
    if g.max_gap is None:
        if r.kind == "reading" and g.buffered and g.buffered[-1].kind == "reading":
            g.intervals.append(r.timestamp - g.buffered[-1].timestamp)
        g.buffered.append(r)
        if len(g.intervals) >= CADENCE_INTERVALS:
            _settle(g)
        return
    if r.kind != "reading":
        _judged(g, g.spike.reset(), g.memory_spike.reset())
        _integrate(g, r)
        return
    _judged(g, g.spike.push(r, r.timestamp, r.values.get("temperature_gpu_celsius")),
            g.memory_spike.push(r, r.timestamp, r.values.get("temperature_memory_celsius")))


def _judged(g: _Gpu, die: tuple[_Reading, bool] | None, memory: tuple[_Reading, bool] | None) -> None:
    """The reading both spike filters have just decided (they see the same readings: one late, together)."""
    if die is not None and memory is not None:
        _integrate(g, die[0], die[1], memory[1])


def _settle(g: _Gpu) -> None:
    if g.max_gap is None:
        g.cadence = statistics.median(g.intervals) if g.intervals else None
        g.max_gap = gap_threshold(g.cadence, g.live_max_gap)
    held, g.buffered = g.buffered, []
    for r in held:
        _feed(g, r)


def import_rows(path: Path, ledger: Ledger, params: WearConfig, *, gpu: str | None = None,
                columns: list[str] | None = None, tz: datetime.tzinfo | None = None, max_gap: float | None = None,
                say: Callable[[str], None] = print, progress: Callable[[int], None] | None = None,
                progress_every: int = 65536, latest: float | None = None) -> FileResult:
    """:func:`gpuwear.imports.reader.import_file`, row by row: the reference the columnar path is held to.

    Rows whose time no reading can have (before 2000, or past ``latest``: by default a day after this machine's
    clock) are refused as problems. Rows go through, per GPU: the ledger's coverage (time already observed is
    skipped); order (a repeated local hour is its second pass when the log goes on from it; a row earlier than the
    last is refused; a row at the same time as the last is dropped); physical ranges and the shutdown threshold;
    whether the row holds any reading (one that does not is a break: unobserved time); the cadence (``max_gap``,
    else :func:`gap_threshold` of the median of the first CADENCE_INTERVALS intervals); lone spikes
    (:mod:`gpuwear.wear.plausibility`); then the same accumulator as live samples. ``progress`` is called with the
    number of rows read so far every ``progress_every`` rows."""
    gate = params.cycles.hysteresis_celsius
    known = ledger.load(gate)
    gpus: dict[str, _Gpu] = {}
    result = FileResult(path)
    resolved: dict[tuple[str, str | None], str] = {}  # (row's GPU key, name) -> ledger UUID: the same few each row
    for count, item in enumerate(read_telemetry_csv(path, columns=columns, tz=tz, latest=latest), 1):
        if progress is not None and count % progress_every == 0:
            progress(count)
        if isinstance(item, RowProblem):
            result.problems += 1
            say(f"{path}:{item.line}: {item.message}; row skipped")
            continue
        uuid = ledger_uuid(item, resolved, known, gpu)
        g = gpus.get(uuid)
        if g is None:
            g = gpus[uuid] = _Gpu(uuid, new_wear(uuid, known, gate, item.name), ledger.covered(uuid), max_gap,
                                  params.max_gap_seconds, by_stretch=max_gap is None)
        timestamp = item.timestamp
        if g.last_time is not None and timestamp < g.last_time and item.later is not None \
                and item.later >= g.last_time:
            timestamp = item.later  # the hour the clock repeats at the end of summer time, its second pass
        if g.spans and any(a <= timestamp <= b for a, b in g.spans):
            g.skipped += 1
            _entry(g, _Reading(timestamp, kind="covered"))  # no interval across time counted elsewhere
            continue
        if g.last_time is not None and timestamp <= g.last_time:
            if timestamp == g.last_time:
                g.excluded["duplicate_timestamp"] += 1
                continue
            result.problems += 1
            say(f"{path}:{item.line}: timestamp goes back in time for GPU {uuid}; row skipped")
            continue
        g.last_time = timestamp
        values, dropped = validated(item.values)
        g.dropped += len(dropped)
        shutdown = values.get("threshold_shutdown_celsius") or g.wear.thresholds.get("shutdown")
        die = values.get("temperature_gpu_celsius")
        if die is not None and above_shutdown(die, shutdown):
            values["temperature_gpu_celsius"] = None
            g.excluded["above_shutdown"] += 1
        if not _has_readings(values):
            g.excluded["no_readings"] += 1
            _entry(g, _Reading(timestamp, kind="gap"))
            continue
        if shutdown is not None and "threshold_shutdown_celsius" in values:
            g.wear.thresholds["shutdown"] = shutdown
        _entry(g, _Reading(timestamp, values, item.name or ""))
    for g in gpus.values():
        _settle(g)
        _judged(g, g.spike.flush(), g.memory_spike.flush())
    return finish(path, ledger, params, [GpuImport(g.uuid, g.wear, g.first, g.last, g.rows, g.skipped, g.excluded,
                                                   g.cadence, g.max_gap, g.dropped, g.intervals_ms)
                                         for g in gpus.values()],
                  result.problems, "rows")
