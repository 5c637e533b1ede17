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
import operator
import struct
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpuwear.metrics import GPU_LABELS, MetricDef, Published, T, catalog


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
        """The families of one published state."""
        defs = catalog(self.detail)
        for d in defs.daemon:
            family = _family(d.name, d.kind, d.unit, d.help, list(d.labels))
            for labels, value in d.values(pub):
                family.add_metric(list(labels), value)
            yield family
        statuses = [(s, [str(s.identity.index), s.identity.uuid]) for s in pub.snapshot.gpus]
        yield from _per_gpu(defs.gpu, statuses)
        yield from _per_gpu(defs.wear, [(pub.wear[s.identity.uuid], base) for s, base in statuses
                                           if s.identity.uuid in pub.wear])


def _per_gpu(defs: tuple[MetricDef[T], ...], sources: list[tuple[T, list[str]]]) -> Iterator[Metric]:
    """Families of per-GPU metrics: each source (a GPU's status or wear view) with its base labels."""
    for m in defs:
        family = _family(m.name, m.kind, m.unit, m.help, [*GPU_LABELS, *m.labels])
        for source, base in sources:
            for labels, value in m.values(source):
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
_PREFIXES = 4096  # line prefixes a family keeps (GPUs x label values; jobs come and go)
_UNSEEN = object()  # a source's inputs before its first render: equal to nothing


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
    # (base label values) -> (the series' own label values) -> 'name{...} '
    prefixes: dict[tuple[str, ...], dict[tuple[str, ...], str]] = field(default_factory=dict, compare=False)
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
        while the objects they come from compare equal (MetricDef.inputs); else a line's ``name{labels} `` is the
        same at every scrape for the same GPU and labels: made once, then looked up (bounded: cleared when full)."""
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
        prefixes = self.prefixes.get(base)
        if prefixes is None:
            if len(self.prefixes) >= _PREFIXES:
                self.prefixes.clear()
            prefixes = self.prefixes[base] = {}
        out = []
        for labels, value in series:
            prefix = prefixes.get(labels)
            if prefix is None:
                if len(prefixes) >= _PREFIXES:
                    prefixes.clear()
                prefix = prefixes[labels] = self._prefix(base, labels)
            out.append(f"{prefix}{_number(value)}\n")
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
def _families(detail: bool) -> tuple[tuple[_Family, ...], tuple[_Family, ...], tuple[_Family, ...]]:
    """The daemon's, per-GPU and wear families of one catalog, each made once."""
    defs = catalog(detail)
    return (tuple(_Family.of(m, ()) for m in defs.daemon), tuple(_Family.of(m, GPU_LABELS) for m in defs.gpu),
            tuple(_Family.of(m, GPU_LABELS) for m in defs.wear))


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
    daemon_families, gpu_families, wear_families = _families(detail)
    statuses = list(pub.snapshot.gpus)
    bases = tuple([_base(s.identity.index, s.identity.uuid) for s in statuses])
    shown = [i for i, s in enumerate(statuses) if s.identity.uuid in pub.wear]
    views = [pub.wear[statuses[i].identity.uuid] for i in shown]
    parts = []
    for families, sources, keys in ((daemon_families, [pub], ((),)), (gpu_families, statuses, bases),
                                    (wear_families, views, tuple(bases[i] for i in shown))):
        asked: dict[object, list[object]] = {}
        parts += [family.chunk(sources, keys, openmetrics, asked) for family in families]
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
    points; pigz and gzjoin join deflate data the same way). Families that did not change since the last scrape
    (identity, limits, memory errors, cycles, the verdict: most of them) then cost a comparison. Runs of 8 kB and a
    16 kB hash table (memLevel 6: a full flush clears it): at 64 GPUs a re-rendering scrape's gzip takes about half
    the instructions of one deflate over the whole body, for a body 3 % smaller; at 8 GPUs, where nearly every run
    holds a family that changed, 1.1 x, for a body 7 % larger (bench/README.md). The CRC-32 is over every part. Not
    thread-safe (Exposition calls it under its lock)."""

    def __init__(self, run_bytes: int = 8192) -> None:
        self._run_bytes = run_bytes
        # level 1: a third of level 6's CPU for a body about a fifth larger (a 680 kB exposition: 2.5 against 8.4 ms,
        # 125 against 102 kB)
        self._deflate = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS, 6)
        self._runs: dict[tuple[int, int], tuple[tuple[bytes, ...], bytes]] = {}  # (first, end) -> (parts, deflated)

    def compress(self, parts: list[bytes]) -> bytes:
        deflate, last, runs = self._deflate, self._runs, {}
        out = [_GZIP_HEADER]
        crc = size = start = run = 0
        for i, part in enumerate(parts, 1):
            crc = zlib.crc32(part, crc)
            run += len(part)
            if run >= self._run_bytes or i == len(parts):
                these = tuple(parts[start:i])
                kept = last.get((start, i))
                if kept is None or kept[0] != these:  # a tuple compares its items by identity first
                    kept = (these, deflate.compress(b"".join(these)) + deflate.flush(zlib.Z_FULL_FLUSH))
                runs[(start, i)] = kept
                out.append(kept[1])
                size += run
                start, run = i, 0
        self._runs = runs
        out.append(_FINAL_BLOCK + struct.pack("<II", crc, size & 0xFFFFFFFF))
        return b"".join(out)



class Exposition:
    """Renders /metrics, once per published state, format and encoding: scrapes between two ticks
    (several Prometheus servers, retries, a dashboard) get the same bytes without re-rendering.

    The body ends with the standard ``process_*`` metrics (CPU, RSS, open fds, start time; from
    /proc by prometheus_client's ProcessCollector, about 0.1 ms), as fresh as the render. ``detail``:
    ``metrics.detail``, which a reload may change."""

    def __init__(self, published: Callable[[], Published], process: bool = True, detail: bool = False) -> None:
        self._published = published
        self.detail = detail
        self._lock = threading.Lock()
        # (openmetrics, gzip) -> (state, body)
        self._cache: dict[tuple[bool, bool], tuple[tuple[object, ...], bytes]] = {}
        self._parts: dict[bool, list[bytes]] = {}  # openmetrics -> the parts of the body cached
        self._gzip = {True: GzipParts(), False: GzipParts()}
        self._process = CollectorRegistry(auto_describe=False)
        if process:
            ProcessCollector(registry=self._process)
        self.renders = 0

    def render(self, openmetrics: bool, gzipped: bool = False) -> bytes:
        """The body for one format (OpenMetrics or Prometheus text), gzip-compressed if asked."""
        pub = self._published()
        key = (id(pub.snapshot), id(pub.wear), pub.ledger, self.detail)
        with self._lock:
            return self._render(pub, key, openmetrics, gzipped)

    def _render(self, pub: Published, key: tuple[object, ...], openmetrics: bool, gzipped: bool) -> bytes:
        cached = self._cache.get((openmetrics, gzipped))
        if cached is not None and cached[0] == key:
            return cached[1]
        if gzipped:
            self._render(pub, key, openmetrics, False)
            body = self._gzip[openmetrics].compress(self._parts[openmetrics])
        else:
            if openmetrics:
                process = openmetrics_latest(self._process).removesuffix(b"# EOF\n")  # type: ignore[no-untyped-call]
            else:
                process = generate_latest(self._process)
            parts = self._parts[openmetrics] = encode_parts(pub, openmetrics, process, self.detail)
            body = b"".join(parts)
            self.renders += 1
        self._cache[(openmetrics, gzipped)] = (key, body)
        return body
