"""The exposition: the published state as Prometheus text or OpenMetrics.

No NVML call and no lock wait happens here: the sampler snapshot and the wear views are
immutable objects, each read with one reference load.

``GpuwearCollector`` is the prometheus_client custom collector (metric families for any
registry); ``encode`` writes the same families' text directly, byte for byte what
prometheus_client's encoders write for them (tested), at a fraction of the cost: it is what
/metrics serves.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import os
import resource
import struct
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpuwear.metrics import GPU_LABELS, PROCESS_METRICS, MetricDef, ProcessReading, Published, catalog


def _family(name: str, kind: str, unit: str, help: str,
            labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, help, labels=labels, unit=unit)
    return GaugeMetricFamily(name, help, labels=labels, unit=unit)


class GpuwearCollector(Collector):
    """Exposes what ``published()`` returns at each scrape; ``detail``: ``metrics.detail``."""

    def __init__(self, published: Callable[[], Published], detail: bool = False) -> None:
        self._published = published
        self.detail = detail

    def collect(self) -> Iterator[Metric]:
        return self.collect_from(self._published())

    def collect_from(self, pub: Published) -> Iterator[Metric]:
        """The families of one published state, in the exposition's order (Catalog.in_order)."""
        statuses = [(s, [str(s.identity.index), s.identity.uuid]) for s in pub.snapshot.gpus]
        sources: dict[str, list[tuple[Any, list[str]]]] = {
            "daemon": [(pub, [])], "gpu": statuses,
            "wear": [(pub.wear[s.identity.uuid], base) for s, base in statuses if s.identity.uuid in pub.wear]}
        for source, m in catalog(self.detail).in_order():
            family = _family(m.name, m.kind, m.unit, m.help, [*(GPU_LABELS if source != "daemon" else ()), *m.labels])
            for item, base in sources[source]:
                for labels, value in m.values(item):
                    family.add_metric([*base, *labels], value)
            yield family


# the number as Go (and so Prometheus) writes it (untyped upstream), for what repr does not give (inf, nan, ints)
_go: Callable[[float], str] = floatToGoString
_EXPONENTS = tuple(f"e+{i:02d}" for i in range(17))


def _number(value: float) -> str:
    """``floatToGoString(value)``, byte for byte, without its calls for the floats gpuwear writes: repr, and from
    10^6 up (every lifetime counter after 12 days) the same digits with an exponent, as Go writes them."""
    if value.__class__ is not float:
        return _go(value)
    if -1e6 < value < 1e6:
        return repr(value)
    s = repr(value)
    dot = s.find(".")
    if dot > 6 and value > 0:  # inf, nan and the exponent forms from 10^16 up have no dot there
        return (s[0] + "." + s[1:dot] + s[dot + 1:]).rstrip("0.") + _EXPONENTS[dot - 1]
    return s if value - value == 0.0 else _go(value)  # finite; else inf or nan (+Inf, -Inf, NaN)


_TEXT_HELP = str.maketrans({"\\": r"\\", "\n": r"\n"})
_ESCAPED = str.maketrans({"\\": r"\\", "\n": r"\n", '"': r'\"'})  # label values; OpenMetrics help too
_PREFIXES = 4096  # series lines a family keeps (GPUs x label values; jobs come and go)
_UNSEEN = object()  # a source's inputs before its first render: equal to nothing


@dataclass(slots=True)
class _Line:
    """One series' ``name{labels} ``, made once, and its line as last written: a series whose value is the same
    (attributed idle time while a job runs, a steady clock) gets the same line without formatting its number."""

    prefix: str
    value: float = math.nan  # equal to nothing
    text: str = ""


@dataclass
class _Rendered:
    """What a family wrote at its last render, per source in order: the base label values, the series, their lines,
    and the objects the series came from (MetricDef.inputs)."""

    bases: tuple[tuple[str, ...], ...] = ()
    series: list[list[tuple[tuple[str, ...], float]]] = field(default_factory=list)  # [] before the first: no lines
    lines: list[str] = field(default_factory=list)
    stamps: list[object] = field(default_factory=list)  # _UNSEEN before the first render
    chunks: dict[bool, bytes] = field(default_factory=dict)  # openmetrics -> the family's header and lines, encoded


@dataclass(frozen=True)
class _Family:
    """What a metric definition writes, computed once: its headers in both formats, the name of its samples,
    and its label names in the order the encoders write them (sorted)."""

    metric: MetricDef[Any]
    text_head: str
    openmetrics_head: str
    sample: str
    keys: tuple[str, ...]  # 'name="' per label, in definition order (the GPU labels first)
    order: tuple[int, ...]  # positions in ``keys``, sorted by label name
    # (base label values) -> (the series' own label values) -> its line as last written (bounded: cleared when full)
    written: dict[tuple[str, ...], dict[tuple[str, ...], _Line]] = field(default_factory=dict, compare=False)
    # the last render's sources, position by position: a GPU whose series did not change since (identity, limits,
    # counts, most of a slow-changing state) gets its lines again as they were; a family with inputs, without asking
    # its series while those are the same
    last: _Rendered = field(default_factory=_Rendered, compare=False)

    @classmethod
    def of(cls, m: MetricDef[Any], base: Sequence[str]) -> _Family:
        # prometheus_client's naming: a counter family loses "_total" (its samples get it back), a unit is a suffix
        name = m.name[:-6] if m.kind == "counter" and m.name.endswith("_total") else m.name
        if m.unit and not name.endswith("_" + m.unit):
            name += "_" + m.unit
        kind = "counter" if m.kind == "counter" else "gauge"
        sample = name + "_total" if kind == "counter" else name
        labels = (*base, *m.labels)
        unit = f"# UNIT {name} {m.unit}\n" if m.unit else ""
        return cls(m, f"# HELP {sample} {m.help.translate(_TEXT_HELP)}\n# TYPE {sample} {kind}\n",
                   f"# HELP {name} {m.help.translate(_ESCAPED)}\n# TYPE {name} {kind}\n{unit}", sample,
                   tuple(f'{label}="' for label in labels), tuple(sorted(range(len(labels)), key=labels.__getitem__)))

    def chunk(self, sources: list[Any], bases: tuple[tuple[str, ...], ...], openmetrics: bool,
              asked: dict[object, list[object]]) -> bytes:
        """The family's header and sample lines, encoded: the same bytes object as at the last render in this format
        while no line changed since (the gzip encoder then reuses its compressed form). ``asked``: the inputs of
        ``sources`` already asked at this render, by MetricDef.inputs (families of slow reads share one)."""
        last = self.last
        if self.write(sources, bases, asked):
            last.chunks.clear()
        chunk = last.chunks.get(openmetrics)
        if chunk is None:
            head = self.openmetrics_head if openmetrics else self.text_head
            chunk = last.chunks[openmetrics] = (head + "".join(last.lines)).encode()
        return chunk

    def write(self, sources: list[Any], bases: tuple[tuple[str, ...], ...], asked: dict[object, list[object]]) -> bool:
        """Bring ``last.lines`` up to date with every source (with its escaped base label values, in the same order);
        whether a line changed. Compared with the last render's source at the same place (the same GPUs in the same
        order: else all are written afresh): one whose series are the same keeps its lines, without asking for them
        while the objects they come from compare equal (MetricDef.inputs); else each series' line is looked up (_Line)
        and its number formatted again only when its value changed."""
        last, values, inputs = self.last, self.metric.values, self.metric.inputs
        changed = last.bases != bases
        if changed:
            last.bases, last.lines = bases, [""] * len(bases)
            last.series, last.stamps = [[] for _ in bases], [_UNSEEN] * len(bases)
        series, lines = last.series, last.lines
        if inputs is not None:
            stamps = asked.get(inputs)
            if stamps is None:
                stamps = asked[inputs] = list(map(inputs, sources))
            if not changed and stamps == last.stamps:  # most families at most scrapes: one comparison in C
                return False
            for i in itertools.compress(range(len(stamps)), map(operator.ne, stamps, last.stamps)):
                new = values(sources[i])
                if new != series[i]:
                    series[i], lines[i] = new, self._lines(new, bases[i])
                    changed = True
            last.stamps = stamps
        else:
            fresh = list(map(values, sources))
            for i in itertools.compress(range(len(fresh)), map(operator.ne, fresh, series)):
                lines[i] = self._lines(fresh[i], bases[i])
                changed = True
            last.series = fresh
        return changed

    def _lines(self, series: list[tuple[tuple[str, ...], float]], base: tuple[str, ...]) -> str:
        written = self.written.get(base)
        if written is None:
            if len(self.written) >= _PREFIXES:
                self.written.clear()
            written = self.written[base] = {}
        out = []
        for labels, value in series:
            line = written.get(labels)
            if line is None:
                if len(written) >= _PREFIXES:
                    written.clear()
                line = written[labels] = _Line(self._prefix(base, labels))
            elif line.value == value and value:  # a series that did not change (0.0 and -0.0 are equal, not alike)
                out.append(line.text)
                continue
            line.value, line.text = value, f"{line.prefix}{_number(value)}\n"
            out.append(line.text)
        return "".join(out)

    def _prefix(self, base: tuple[str, ...], labels: tuple[str, ...]) -> str:
        """``name{label="value",...} `` of a series, its labels sorted by name (as the encoders write them)."""
        values = [*base, *(v.translate(_ESCAPED) for v in labels)]
        if not values:
            return f"{self.sample} "
        keys = self.keys
        pairs = ",".join([f'{keys[i]}{values[i]}"' for i in self.order])
        return f"{self.sample}{{{pairs}}} "


@functools.cache
def _families(detail: bool) -> tuple[tuple[str, _Family], ...]:
    """The families of one catalog with their sources ("daemon", "gpu", "wear"), in order, each made once."""
    return tuple((source, _Family.of(m, () if source == "daemon" else GPU_LABELS))
                 for source, m in catalog(detail).in_order())


def encode(pub: Published, openmetrics: bool, extra: bytes = b"", detail: bool = False) -> bytes:
    """The exposition of one published state: Prometheus text 0.0.4, or OpenMetrics 1.0.0 (:func:`encode_parts`)."""
    return b"".join(encode_parts(pub, openmetrics, extra, detail))


def encode_parts(pub: Published, openmetrics: bool, extra: bytes = b"", detail: bool = False) -> list[bytes]:
    """The exposition of one published state in parts: each family's header and lines (the same bytes object as at
    its last render in this format while none of its lines changed), then ``extra`` (families encoded elsewhere, the
    process metrics, in the same format), then OpenMetrics' EOF. Encoded family by family: the lines of the whole
    body at once (about 6,000 at 64 GPUs) took four times its size at the peak. ``detail``: ``metrics.detail``
    (every family, every label value)."""
    with _ENCODING:  # the families keep their last render: one encoder at a time in a process
        return _encode(pub, openmetrics, extra, detail)


_ENCODING = threading.Lock()


@functools.lru_cache(maxsize=1024)
def _base(index: int, uuid: str) -> tuple[str, str]:
    """A GPU's escaped ``gpu`` and ``uuid`` label values: the same tuple at every scrape (each family compares its
    sources' with the last render's: the same objects compare at once)."""
    return str(index).translate(_ESCAPED), uuid.translate(_ESCAPED)


def _encode(pub: Published, openmetrics: bool, extra: bytes, detail: bool) -> list[bytes]:
    statuses = list(pub.snapshot.gpus)
    bases = tuple([_base(s.identity.index, s.identity.uuid) for s in statuses])
    shown = [i for i, s in enumerate(statuses) if s.identity.uuid in pub.wear]
    views = [pub.wear[statuses[i].identity.uuid] for i in shown]
    sources: dict[str, tuple[list[Any], tuple[tuple[str, ...], ...]]] = {
        "daemon": ([pub], ((),)), "gpu": (statuses, bases), "wear": (views, tuple(bases[i] for i in shown))}
    asked: dict[str, dict[object, list[object]]] = {source: {} for source in sources}
    parts = [family.chunk(*sources[source], openmetrics, asked[source]) for source, family in _families(detail)]
    parts.append(extra)
    if openmetrics:
        parts.append(b"# EOF\n")
    return parts


# gzip's header as gzip.compress(data, compresslevel=1, mtime=0) writes it: no name, no time, XFL 4 (fastest), OS
# unknown
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
_FINAL_BLOCK = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS).flush()  # an empty last block: the deflate end


class GzipParts:
    """gzip (level 1) of a body made of parts, deflating again only the runs of parts that changed since the last call.

    Consecutive parts are deflated together in runs of at least ``run_bytes``, each run ended by a full flush: its
    compressed bytes start on a byte boundary and refer to nothing before them, so those of a run whose parts are
    the same objects (or equal bytes) as at the last call are put in the stream again as they were (zlib's restart
    points; pigz and gzjoin join deflate data the same way). The exposition writes the steady families first
    (identity, limits, memory errors, cycles, the verdict), then those that change at some ticks, then those that
    change at each (Catalog.in_order): a scrape then deflates again the end of the body, about 30 % of it at 8 GPUs
    (16 of 56 kB) and 45 % at 64 (with more GPUs, more of the families of some ticks change at each), and the runs
    before it cost a comparison. Each run keeps the CRC-32 before and after it: an unchanged run after unchanged
    ones adds its CRC without reading its bytes. Runs of 8 kB and a 16 kB hash table (memLevel 6: a full flush
    clears it): bench/README.md has the figures. Not thread-safe (Exposition calls it under its lock)."""

    def __init__(self, run_bytes: int = 8192) -> None:
        self._run_bytes = run_bytes
        # level 1: a third of level 6's CPU for a body about a fifth larger (a 680 kB exposition: 2.5 against 8.4 ms,
        # 125 against 102 kB)
        self._deflate = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS, 6)
        # (first, end) -> (parts, deflated, the CRC-32 before the run, after it)
        self._runs: dict[tuple[int, int], tuple[tuple[bytes, ...], bytes, int, int]] = {}

    def compress(self, parts: list[bytes]) -> bytes:
        deflate, last, runs = self._deflate, self._runs, {}
        out = [_GZIP_HEADER]
        crc = size = start = run = 0
        for i, part in enumerate(parts, 1):
            run += len(part)
            if run >= self._run_bytes or i == len(parts):
                these = tuple(parts[start:i])
                kept = last.get((start, i))
                if kept is None or kept[0] != these:  # a tuple compares its items by identity first
                    data = b"".join(these)
                    deflated = deflate.compress(data) + deflate.flush(zlib.Z_FULL_FLUSH)
                    kept = (these, deflated, crc, zlib.crc32(data, crc))
                elif kept[2] != crc:  # the same run after a changed one: its deflate data holds, not its CRC
                    kept = (these, kept[1], crc, zlib.crc32(b"".join(these), crc))
                runs[(start, i)] = kept
                out.append(kept[1])
                crc = kept[3]
                size += run
                start, run = i, 0
        self._runs = runs
        out.append(_FINAL_BLOCK + struct.pack("<II", crc, size & 0xFFFFFFFF))
        return b"".join(out)


class ProcessMetrics:
    """The standard ``process_*`` metrics of the daemon (CPU, RSS, open fds, start time): the names, help and values
    of prometheus_client's ProcessCollector, byte for byte (tested), in a fifth of its time (a read of
    /proc/self/stat and a listing of /proc/self/fd, no metric objects): 0.2-0.35 ms a scrape through the registry,
    about 15 % of an 8-GPU scrape. Nothing (no series) where /proc cannot be read."""

    def __init__(self, proc: str = "/proc") -> None:
        self._stat, self._fds = f"{proc}/self/stat", f"{proc}/self/fd"
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._pagesize = resource.getpagesize()
        self._btime: float | None = None
        try:
            with open(f"{proc}/stat", "rb") as stat:
                self._btime = next(float(line.split()[1]) for line in stat if line.startswith(b"btime "))
        except (OSError, StopIteration, ValueError, IndexError):
            pass
        self._families = [_Family.of(m, ()) for m in PROCESS_METRICS]

    def read(self) -> ProcessReading | None:
        """The figures now; None where /proc cannot be read."""
        if self._btime is None:
            return None
        try:
            # os.read, not open(): Python's file objects add an fstat, an ioctl and a seek to the three calls (half the
            # time of a read of this line of about 300 bytes, which never reaches 4 kB)
            stat = os.open(self._stat, os.O_RDONLY)
            try:
                parts = os.read(stat, 4096).rsplit(b")", 1)[-1].split()  # after the command name: may hold anything
            finally:
                os.close(stat)
            open_fds = float(len(os.listdir(self._fds)))
            ticks, pages = self._ticks, float(parts[21]) * self._pagesize
            start, cpu = float(parts[19]) / ticks + self._btime, float(parts[11]) / ticks + float(parts[12]) / ticks
            virtual = float(parts[20])
        except (OSError, IndexError, ValueError):
            return None
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return ProcessReading(virtual, pages, start, cpu, open_fds,
                              None if limit == resource.RLIM_INFINITY else float(limit))

    def encode(self, openmetrics: bool) -> bytes:
        """The families now, in Prometheus text or OpenMetrics (without its EOF)."""
        reading = self.read()
        if reading is None:
            return b""
        out = []
        for family in self._families:
            series = family.metric.values(reading)
            if series:
                out.append(family.openmetrics_head if openmetrics else family.text_head)
                out.append(family._lines(series, ()))
        return "".join(out).encode()


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Two render keys name the same state: the same snapshot and wear objects (identity: an equal-looking copy is
    another state), an equal ledger status and detail setting."""
    return a[0] is b[0] and a[1] is b[1] and a[2:] == b[2:]


class Exposition:
    """Renders /metrics, once per published state, format and encoding: scrapes between two ticks
    (several Prometheus servers, retries, a dashboard) get the same bytes without re-rendering.

    The body ends with the standard ``process_*`` metrics (:class:`ProcessMetrics`), as fresh as the render.
    ``detail``: ``metrics.detail``, which a reload may change."""

    def __init__(self, published: Callable[[], Published], process: bool = True, detail: bool = False) -> None:
        self._published = published
        self.detail = detail
        self._lock = threading.Lock()
        # (openmetrics, gzip) -> (state, body)
        self._cache: dict[tuple[bool, bool], tuple[tuple[object, ...], bytes]] = {}
        self._parts: dict[bool, list[bytes]] = {}  # openmetrics -> the parts of the body cached
        self._gzip = {True: GzipParts(), False: GzipParts()}
        self._process = ProcessMetrics() if process else None
        self.renders = 0

    def render(self, openmetrics: bool, gzipped: bool = False) -> bytes:
        """The body for one format (OpenMetrics or Prometheus text), gzip-compressed if asked."""
        pub = self._published()
        # the state itself, not its id(): the cache holds what it is keyed on, so a freed state's address can never
        # be handed to a new state that would then be served the old body
        key = (pub.snapshot, pub.wear, pub.ledger, self.detail)
        with self._lock:
            return self._render(pub, key, openmetrics, gzipped)

    def _render(self, pub: Published, key: tuple[object, ...], openmetrics: bool, gzipped: bool) -> bytes:
        cached = self._cache.get((openmetrics, gzipped))
        if cached is not None and _same(cached[0], key):
            return cached[1]
        if gzipped:
            self._render(pub, key, openmetrics, False)
            body = self._gzip[openmetrics].compress(self._parts[openmetrics])
        else:
            process = self._process.encode(openmetrics) if self._process is not None else b""
            parts = self._parts[openmetrics] = encode_parts(pub, openmetrics, process, self.detail)
            body = b"".join(parts)
            self.renders += 1
        self._cache[(openmetrics, gzipped)] = (key, body)
        return body
