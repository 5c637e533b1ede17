"""The exposition: the published state as Prometheus text or OpenMetrics.

No NVML call and no lock wait happens here: the sampler snapshot and the wear views are
immutable objects, each read with one reference load.

``Encoder`` writes the text of the families :class:`gpuwear.families.GpuwearCollector` gives
prometheus_client, byte for byte what prometheus_client's encoders write for them (tested), at a
fraction of the cost and without loading prometheus_client: it is what /metrics serves, through
``Exposition`` (one body per published state and format). Across
scrapes the encoder keeps only each series' ``name{labels} `` prefix: every line is written
from the state it serves.
"""

from __future__ import annotations

import math
import os
import resource
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwear.metrics import GPU_LABELS, PROCESS_METRICS, MetricDef, One, ProcessReading, Published, catalog

try:
    from isal import isal_zlib
except ImportError:  # pyproject installs it on x86_64 and aarch64 only (ISA-L's platforms): zlib does it elsewhere
    isal_zlib = None  # type: ignore[assignment]


def _go(value: float) -> str:
    """The number as Go (and so Prometheus) writes it, as prometheus_client's floatToGoString does (tested): for what
    :func:`_number` hands on (ints, inf, nan)."""
    d = float(value)
    if d != d:
        return "NaN"
    if d in (math.inf, -math.inf):
        return "+Inf" if d > 0 else "-Inf"
    return _number(d)


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
_PREFIXES = 4096  # series prefixes a family keeps per GPU (label values: jobs come and go)


@dataclass(frozen=True)
class _Family:
    """What a metric definition writes, computed once: its headers in both formats, the name of its samples, its
    label names in the order the encoders write them (sorted), and each series' ``name{labels} `` as first made."""

    metric: MetricDef[Any]
    text_head: str
    openmetrics_head: str
    sample: str
    keys: tuple[str, ...]  # 'name="' per label, in definition order (the GPU labels first)
    order: tuple[int, ...]  # positions in ``keys``, sorted by label name
    # (base label values) -> (the series' own label values) -> its prefix (bounded: cleared when full)
    prefixes: dict[tuple[str, ...], dict[tuple[str, ...], str]] = field(default_factory=dict, compare=False)
    # a family without labels of its own (metrics.One): what gives a source's value, called without a list or
    # tuple per series, and each source's prefix by its base label values
    one: Callable[[Any], float | None] | None = None
    alone: dict[tuple[str, ...], str] = field(default_factory=dict, compare=False)

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
                   tuple(f'{label}="' for label in labels), tuple(sorted(range(len(labels)), key=labels.__getitem__)),
                   one=m.values.value if isinstance(m.values, One) else None)

    def write(self, out: list[str], sources: Sequence[tuple[Any, tuple[str, ...]]]) -> int:
        """Append the sample lines of each source (what the definition reads its series from, and its escaped GPU
        label values); the number of lines written."""
        if self.one is not None:
            return self._write_one(out, sources, self.one)
        values, by_base, lines = self.metric.values, self.prefixes, 0
        for item, base in sources:
            series = values(item)
            if not series:
                continue
            prefixes = by_base.get(base)
            if prefixes is None:
                if len(by_base) >= _PREFIXES:
                    by_base.clear()
                prefixes = by_base[base] = {}
            for labels, value in series:
                prefix = prefixes.get(labels)
                if prefix is None:
                    if len(prefixes) >= _PREFIXES:
                        prefixes.clear()
                    prefix = prefixes[labels] = self._prefix(base, labels)
                # _number's first case, inline: most lines are such floats, and a call per line costs more than it
                if value.__class__ is float and -1e6 < value < 1e6:
                    out.append(f"{prefix}{value!r}\n")
                else:
                    out.append(f"{prefix}{_number(value)}\n")
            lines += len(series)
        return lines

    def _write_one(self, out: list[str], sources: Sequence[tuple[Any, tuple[str, ...]]],
                   one: Callable[[Any], float | None]) -> int:
        """:meth:`write` for a family without labels of its own: the same lines."""
        alone, lines = self.alone, 0
        for item, base in sources:
            value = one(item)
            if value is None:
                continue
            prefix = alone.get(base)
            if prefix is None:
                if len(alone) >= _PREFIXES:
                    alone.clear()
                prefix = alone[base] = self._prefix(base, ())
            value = float(value)
            if -1e6 < value < 1e6:
                out.append(f"{prefix}{value!r}\n")
            else:
                out.append(f"{prefix}{_number(value)}\n")
            lines += 1
        return lines

    def _prefix(self, base: tuple[str, ...], labels: tuple[str, ...]) -> str:
        """``name{label="value",...} `` of a series, its labels sorted by name (as the encoders write them)."""
        values = [*base, *(v.translate(_ESCAPED) for v in labels)]
        if not values:
            return f"{self.sample} "
        keys = self.keys
        pairs = ",".join([f'{keys[i]}{values[i]}"' for i in self.order])
        return f"{self.sample}{{{pairs}}} "


class Encoder:
    """Writes published states as Prometheus text 0.0.4 or OpenMetrics 1.0.0, byte for byte what prometheus_client
    writes for :class:`gpuwear.families.GpuwearCollector`'s families (tested). Its only state: each family's
    headers and series prefixes, made once (per catalog: with and without ``metrics.detail``). Not thread-safe: one per
    :class:`Exposition`, which calls it under its lock."""

    def __init__(self) -> None:
        self._catalogs: dict[bool, tuple[tuple[str, _Family], ...]] = {}

    def encode(self, pub: Published, openmetrics: bool, extra: bytes = b"", detail: bool = False) -> bytes:
        """The exposition of one published state, then ``extra`` (families encoded elsewhere, the process metrics,
        in the same format), then OpenMetrics' EOF. ``detail``: ``metrics.detail`` (every family, every label
        value)."""
        families = self._catalogs.get(detail)
        if families is None:
            families = self._catalogs[detail] = tuple(
                (source, _Family.of(m, () if source == "daemon" else GPU_LABELS))
                for source, m in catalog(detail).in_order())
        statuses = list(pub.snapshot.gpus)
        bases = [(str(s.identity.index).translate(_ESCAPED), s.identity.uuid.translate(_ESCAPED)) for s in statuses]
        sources: dict[str, list[tuple[Any, tuple[str, ...]]]] = {
            "daemon": [(pub, ())], "gpu": list(zip(statuses, bases, strict=True)),
            "wear": [(pub.wear[s.identity.uuid], base) for s, base in zip(statuses, bases, strict=True)
                     if s.identity.uuid in pub.wear]}
        out: list[str] = []
        for source, family in families:
            out.append(family.openmetrics_head if openmetrics else family.text_head)
            family.write(out, sources[source])
        out.append(extra.decode())  # ASCII: one join and one encode of the body, no copy of it per part added
        if openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode()


def encode(pub: Published, openmetrics: bool, extra: bytes = b"", detail: bool = False) -> bytes:
    """:meth:`Encoder.encode` by a new encoder (its prefixes made afresh)."""
    return Encoder().encode(pub, openmetrics, extra, detail)


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
        out: list[str] = []
        for family in self._families:
            out.append(family.openmetrics_head if openmetrics else family.text_head)
            if not family.write(out, [(reading, ())]):  # a family without series has no head either
                out.pop()
        return "".join(out).encode()


def zlib_gzip(body: bytes) -> bytes:
    """``body`` as one gzip member by zlib, level 1 (a third of level 6's CPU for a body about a fifth larger), no
    name and no time in its header."""
    return zlib.compress(body, 1, wbits=31)


def isal_gzip(body: bytes) -> bytes:
    """The same by ISA-L's deflate (the ``isal`` package), level 1: about a fifth of zlib's CPU at level 1 for a body
    a few % smaller (bench/scrape_outside.md). Raises ImportError where ``isal`` is not installed."""
    if isal_zlib is None:
        raise ImportError("the isal package is not installed")
    return isal_zlib.compress(body, 1, wbits=31)


def default_gzip() -> Callable[[bytes], bytes]:
    """ISA-L's where the ``isal`` package is installed (pyproject installs it on x86_64 and aarch64), else zlib's."""
    return zlib_gzip if isal_zlib is None else isal_gzip


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Two render keys name the same state: the same snapshot and wear objects (identity: an equal-looking copy is
    another state), an equal ledger status, missing GPUs, kernel log state, OTLP counts and detail setting."""
    return a[0] is b[0] and a[1] is b[1] and a[2:] == b[2:]


class Exposition:
    """Renders /metrics, once per published state, format and encoding: scrapes between two ticks
    (several Prometheus servers, retries, a dashboard) get the same bytes without re-rendering.

    The body ends with the standard ``process_*`` metrics (:class:`ProcessMetrics`), as fresh as the render.
    ``detail``: ``metrics.detail``, which a reload may change. ``gzip``: what compresses a body for a client that
    accepts gzip (default: :func:`default_gzip`)."""

    def __init__(self, published: Callable[[], Published], process: bool = True, detail: bool = False,
                 gzip: Callable[[bytes], bytes] | None = None) -> None:
        self._published = published
        self.detail = detail
        self._gzip = gzip or default_gzip()
        self._lock = threading.Lock()
        self._encoder = Encoder()
        # (openmetrics, gzip) -> (state, body)
        self._cache: dict[tuple[bool, bool], tuple[tuple[object, ...], bytes]] = {}
        self._process = ProcessMetrics() if process else None
        self.renders = 0
        # CPU seconds of its thread the last call that built a body took (the wear views derived, the text, gzip):
        # about what the next will take (the front door builds a heavy one off its event loop). Not wall time: a
        # build that waited for the GIL or a tick's lock held no CPU the loop could have had
        self.last_render_seconds = 0.0

    def render(self, openmetrics: bool, gzipped: bool = False) -> bytes:
        """The body for one format (OpenMetrics or Prometheus text), gzip-compressed if asked."""
        began, renders = time.thread_time(), self.renders
        pub = self._published()
        # the state itself, not its id(): the cache holds what it is keyed on, so a freed state's address can never
        # be handed to a new state that would then be served the old body
        key = (pub.snapshot, pub.wear, pub.ledger, pub.missing, pub.kernel_log_following, pub.otlp_pushes, self.detail)
        with self._lock:
            body = self._render(pub, key, openmetrics, gzipped)
            if self.renders != renders:
                self.last_render_seconds = time.thread_time() - began
        return body

    def _render(self, pub: Published, key: tuple[object, ...], openmetrics: bool, gzipped: bool) -> bytes:
        cached = self._cache.get((openmetrics, gzipped))
        if cached is not None and _same(cached[0], key):
            return cached[1]
        if gzipped:
            body = self._gzip(self._render(pub, key, openmetrics, False))
        else:
            process = self._process.encode(openmetrics) if self._process is not None else b""
            body = self._encoder.encode(pub, openmetrics, process, self.detail)
            self.renders += 1
        self._cache[(openmetrics, gzipped)] = (key, body)
        return body
