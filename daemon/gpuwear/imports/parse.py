"""Read GPU telemetry CSV logs into readings in the daemon's base units (a pure parser).

Two formats, told apart by their header names and read through one column table (``_COLUMNS``):

* nvidia-smi ``--query-gpu=... --format=csv[,noheader][,nounits]``: header names are the query field names,
  optionally followed by a unit in brackets (``power.draw [W]``); values may carry units (``250.12 W``,
  ``1410 MHz``, ``35 %``, ``1024 MiB``) or not (``nounits``). nvidia-smi writes the canonical name in the header
  whatever alias was queried; both are accepted. ``[N/A]``, ``[Not Supported]`` (any bracketed marker), ``N/A`` and
  empty values are "not read": the field is left out, never set to 0.
* the "llm-gpu-stress" NVML logger: ``timestamp_ns,gpu_index,name,temperature_C,...,power_draw_W,ecc_*[,
  total_energy_mJ,...]``. ``timestamp_ns`` holds a wall-clock string, ``-1`` means "not supported" (left out), and
  ``MB`` means MiB.

Each data row becomes an ``ImportedRow`` (or a ``RowProblem`` when it cannot be used; the parser then goes on with
the next row). A file that cannot be used at all raises ``ImportFormatError`` when ``read_telemetry_csv`` is
called, before any row is read. Nothing here checks physical ranges or removes duplicates: the sampler-side
validation and the ledger do that.
"""

from __future__ import annotations

import csv
import datetime
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from gpuwear.sample import GpuIdentity, GpuSample
from gpuwear.wear.schema import EARLIEST_WALL, LATEST_WALL

# a row may be this far ahead of the importing machine's clock (a log written on a box whose clock ran a little
# ahead, zones misread by a day at most); further ahead is a clock that was not set
FUTURE_SLACK_SECONDS = 86400.0

MAX_LINE_BYTES = 1 << 20  # a longer physical line is reported as a problem and skipped, never held in memory


@dataclass(slots=True)
class ImportedRow:
    """One usable row: a reading of one GPU at one time."""

    line: int  # 1-based line number in the file of the row's first physical line
    timestamp: float  # Unix seconds
    gpu: str  # the GPU's identity key: the uuid when the row has one, else the PCI bus id, else "index:N"
    name: str | None  # GPU name if the file has it
    values: dict[str, Any]  # GpuSample field name -> value in base units; only columns present and supported
    # GpuIdentity field name -> value for the identity columns read from the row (index, uuid, pci_bus_id, name,
    # serial, memory_total_bytes): memory.total is not a GpuSample field, so it lives here and not in ``values``.
    identity: dict[str, Any] = field(default_factory=dict)
    # a local time the zone repeats (the autumn DST change): its second occurrence, which the rows' order decides
    later: float | None = None


@dataclass(frozen=True)
class RowProblem:
    """A row that could not be used, and why (one line naming the column and the bad value)."""

    line: int
    message: str


class ImportFormatError(ValueError):
    """The file as a whole cannot be used: empty, too large, not UTF-8 CSV text, or its header lacks a timestamp
    column or any temperature/power column."""


# --- value kinds -------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%°µ]*)")
_INTEGER = re.compile(r"[-+]?\d+")
_DECIMAL = re.compile(r"[-+]?\d+(?:\.\d+)?")
_PSTATE = re.compile(r"[Pp](\d{1,2})")
_BITMASK = re.compile(r"0[xX]([0-9a-fA-F]+)|(\d+)")
_WALL_CLOCK = re.compile(
    r"(\d{4})[-/](\d{1,2})[-/](\d{1,2})[ T](\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d+))?\s*(Z|[-+]\d{2}:?\d{2})?"
)
_HEADER_UNIT = re.compile(r"(.*?)\s*\[\s*([^\]]*?)\s*\]")
_FLAGS = {"yes": True, "no": False, "enabled": True, "disabled": False, "true": True, "false": False,
          "1": True, "0": False}


def _integer(text: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise ValueError("not an integer")
    return int(text)


def _bitmask(text: str) -> int:
    """nvidia-smi prints bitmasks as hex, ``0x0000000000000004``; a decimal integer is accepted too."""
    m = _BITMASK.fullmatch(text)
    if m is None:
        raise ValueError("not a hex bitmask")
    return int(m.group(1), 16) if m.group(1) is not None else int(m.group(2))


def _pstate(text: str) -> int:
    m = _PSTATE.fullmatch(text)
    if m is None:
        raise ValueError("not a performance state like P0")
    return int(m.group(1))


def _flag(text: str) -> bool:
    try:
        return _FLAGS[text.lower()]
    except KeyError:
        raise ValueError("not Yes/No/Enabled/Disabled") from None


def _text(text: str) -> str:
    return text


def _unused(text: str) -> Any:  # quantities are parsed by _NUMBER and their unit, not by this
    raise AssertionError("a quantity has no text parser")


@dataclass(frozen=True)
class _Kind:
    """What a column's values are. A quantity has units (lower case -> (numerator, denominator) that turn the
    number into the base unit); any other kind parses the bare text."""

    name: str
    units: Mapping[str, tuple[int, int]]
    parse: Callable[[str], Any] = _unused


_TIME = _Kind("time", {"s": (1, 1), "ms": (1, 10**3), "us": (1, 10**6), "ns": (1, 10**9)})
_CELSIUS = _Kind("temperature", {"c": (1, 1), "°c": (1, 1), "degc": (1, 1)})
_WATTS = _Kind("power", {"w": (1, 1), "mw": (1, 10**3), "kw": (10**3, 1)})
_JOULES = _Kind("energy", {"j": (1, 1), "mj": (1, 10**3), "kj": (10**3, 1)})
_HERTZ = _Kind("frequency", {"hz": (1, 1), "khz": (10**3, 1), "mhz": (10**6, 1), "ghz": (10**9, 1)})
_RATIO = _Kind("percentage", {"%": (1, 100)})
# NVIDIA tools write MiB; their "MB" (nvidia-smi dmon, the llm-gpu-stress logger) means MiB too.
_BYTES = _Kind("memory size", {"b": (1, 1), "kib": (2**10, 1), "mib": (2**20, 1), "gib": (2**30, 1),
                               "tib": (2**40, 1), "kb": (2**10, 1), "mb": (2**20, 1), "gb": (2**30, 1)})
_COUNT = _Kind("count", {}, _integer)
_BITS = _Kind("bitmask", {}, _bitmask)
_PSTATE_KIND = _Kind("pstate", {}, _pstate)
_FLAG = _Kind("flag", {}, _flag)
_TEXT = _Kind("text", {}, _text)


def _per_fan(ratio: float) -> tuple[float | None, ...]:
    """GpuSample.fan_speed_ratio is per fan; a CSV has one fan.speed column (NVML fan 0)."""
    return (ratio,)


def _whole(value: float) -> int:
    return round(value)


@dataclass(frozen=True)
class _Column:
    """Where one CSV column goes: ``target`` is a GpuSample field, a GpuIdentity field, or "timestamp"."""

    target: str
    kind: _Kind
    unit: str | None = None  # the unit assumed when neither the header nor the value names one
    rank: int = 0  # when several columns feed one target, the present value with the lowest rank wins
    minus_one_na: bool = False  # "-1" means "not supported" (the llm-gpu-stress logger)
    post: Callable[[float], Any] | None = None  # applied to a quantity after the unit conversion


def _table(*entries: tuple[tuple[str, ...], _Column]) -> dict[str, _Column]:
    return {name: column for names, column in entries for name in names}


def _logged(target: str, kind: _Kind, unit: str | None = None,
            post: Callable[[float], Any] | None = None) -> _Column:
    """A column of the llm-gpu-stress logger, which writes -1 for "not supported"."""
    return _Column(target, kind, unit, minus_one_na=True, post=post)


# Lower-case header name (without its bracketed unit) -> column. The nvidia-smi names are --query-gpu fields
# (see ``nvidia-smi --help-query-gpu``), aliases in the same row.
_COLUMNS: dict[str, _Column] = _table(
    # nvidia-smi: "timestamp" is "YYYY/MM/DD HH:MM:SS.msec" in local time, without a zone
    (("timestamp",), _Column("timestamp", _TIME, "s")),
    (("index",), _Column("index", _COUNT)),  # "index": zero-based, may change at each boot
    (("uuid", "gpu_uuid"), _Column("uuid", _TEXT)),  # "uuid": GPU-xxxxxxxx-...
    (("pci.bus_id", "gpu_bus_id"), _Column("pci_bus_id", _TEXT)),  # "pci.bus_id": 00000000:2F:00.0
    (("name", "gpu_name"), _Column("name", _TEXT)),  # "name": product name
    (("serial", "gpu_serial"), _Column("serial", _TEXT)),  # "serial": board serial (none on GeForce)
    (("memory.total",), _Column("memory_total_bytes", _BYTES, "mib", post=_whole)),  # "memory.total" [MiB]
    (("temperature.gpu",), _Column("temperature_gpu_celsius", _CELSIUS, "c")),  # "temperature.gpu", °C, no unit
    (("temperature.memory",), _Column("temperature_memory_celsius", _CELSIUS, "c")),  # "temperature.memory" (HBM)
    # "power.draw" (1 s average on Ampere+), else "power.draw.average", else "power.draw.instant" [W]
    (("power.draw",), _Column("power_watts", _WATTS, "w")),
    (("power.draw.average",), _Column("power_watts", _WATTS, "w", rank=1)),
    (("power.draw.instant",), _Column("power_watts", _WATTS, "w", rank=2)),
    # "enforced.power.limit" (what the GPU obeys), else "power.limit" (the software limit) [W]
    (("enforced.power.limit",), _Column("power_limit_watts", _WATTS, "w")),
    (("power.limit",), _Column("power_limit_watts", _WATTS, "w", rank=1)),
    (("power.default_limit",), _Column("power_default_limit_watts", _WATTS, "w")),  # "power.default_limit" [W]
    (("fan.speed",), _Column("fan_speed_ratio", _RATIO, "%", post=_per_fan)),  # "fan.speed" [%], may exceed 100
    (("utilization.gpu",), _Column("utilization_gpu_ratio", _RATIO, "%")),  # "utilization.gpu" [%]
    (("utilization.memory",), _Column("utilization_memory_ratio", _RATIO, "%")),  # "utilization.memory" [%]
    (("clocks.current.graphics", "clocks.gr"), _Column("clock_graphics_hz", _HERTZ, "mhz")),  # [MHz]
    (("clocks.current.sm", "clocks.sm"), _Column("clock_sm_hz", _HERTZ, "mhz")),  # [MHz]
    (("clocks.current.memory", "clocks.mem"), _Column("clock_memory_hz", _HERTZ, "mhz")),  # [MHz]
    (("clocks.max.graphics", "clocks.max.gr"), _Column("clock_graphics_max_hz", _HERTZ, "mhz")),  # [MHz]
    (("clocks.max.sm",), _Column("clock_sm_max_hz", _HERTZ, "mhz")),  # [MHz]
    (("clocks.max.memory", "clocks.max.mem"), _Column("clock_memory_max_hz", _HERTZ, "mhz")),  # [MHz]
    (("pstate",), _Column("performance_state", _PSTATE_KIND)),  # "pstate": P0 (max) .. P12/P15
    # "clocks_event_reasons.active" (driver 535+), earlier "clocks_throttle_reasons.active": hex bitmask
    (("clocks_event_reasons.active", "clocks_throttle_reasons.active"), _Column("clock_event_reasons", _BITS)),
    (("memory.used",), _Column("memory_used_bytes", _BYTES, "mib")),  # "memory.used" [MiB]
    (("mig.mode.current",), _Column("mig_enabled", _FLAG)),  # "mig.mode.current": Enabled/Disabled
    (("ecc.mode.current",), _Column("ecc_enabled", _FLAG)),  # "ecc.mode.current": Enabled/Disabled
    (("ecc.errors.corrected.volatile.total",), _Column("ecc_corrected_volatile", _COUNT)),
    (("ecc.errors.uncorrected.volatile.total",), _Column("ecc_uncorrected_volatile", _COUNT)),
    (("ecc.errors.corrected.aggregate.total",), _Column("ecc_corrected_aggregate", _COUNT)),
    (("ecc.errors.uncorrected.aggregate.total",), _Column("ecc_uncorrected_aggregate", _COUNT)),
    (("retired_pages.single_bit_ecc.count", "retired_pages.sbe"), _Column("retired_pages_single_bit", _COUNT)),
    (("retired_pages.double_bit.count", "retired_pages.dbe"), _Column("retired_pages_double_bit", _COUNT)),
    (("retired_pages.pending",), _Column("retired_pages_pending", _FLAG)),  # Yes/No
    (("remapped_rows.correctable",), _Column("remapped_rows_corrected", _COUNT)),  # Ampere+
    (("remapped_rows.uncorrectable",), _Column("remapped_rows_uncorrected", _COUNT)),
    (("remapped_rows.pending",), _Column("remapped_rows_pending", _FLAG)),  # Yes/No
    (("remapped_rows.failure",), _Column("remapped_rows_failure", _FLAG)),  # Yes/No
    # llm-gpu-stress NVML logger: "timestamp_ns" is a wall-clock "YYYY-MM-DD HH:MM:SS.mmm" (an integer would be ns);
    # its columns are NVML calls (nvmlDeviceGetTemperature, ...), named here by the nvidia-smi field they equal.
    (("timestamp_ns",), _logged("timestamp", _TIME, "ns")),
    (("gpu_index",), _logged("index", _COUNT)),  # = "index"
    (("temperature_c",), _logged("temperature_gpu_celsius", _CELSIUS, "c")),  # = "temperature.gpu"
    (("util_gpu_percent",), _logged("utilization_gpu_ratio", _RATIO, "%")),  # = "utilization.gpu"
    (("util_mem_percent",), _logged("utilization_memory_ratio", _RATIO, "%")),  # = "utilization.memory"
    (("mem_total_mb",), _logged("memory_total_bytes", _BYTES, "mib", post=_whole)),  # = "memory.total"
    (("mem_used_mb",), _logged("memory_used_bytes", _BYTES, "mib")),  # = "memory.used"
    (("clock_sm_mhz",), _logged("clock_sm_hz", _HERTZ, "mhz")),  # = "clocks.sm"
    (("clock_mem_mhz",), _logged("clock_memory_hz", _HERTZ, "mhz")),  # = "clocks.mem"
    (("clock_graphics_mhz",), _logged("clock_graphics_hz", _HERTZ, "mhz")),  # = "clocks.gr"
    (("fan_speed_percent",), _logged("fan_speed_ratio", _RATIO, "%", post=_per_fan)),  # = "fan.speed"
    (("power_draw_w",), _logged("power_watts", _WATTS, "w")),  # = "power.draw"
    (("ecc_volatile_corrected",), _logged("ecc_corrected_volatile", _COUNT)),
    (("ecc_volatile_uncorrected",), _logged("ecc_uncorrected_volatile", _COUNT)),
    (("ecc_aggregate_corrected",), _logged("ecc_corrected_aggregate", _COUNT)),
    (("ecc_aggregate_uncorrected",), _logged("ecc_uncorrected_aggregate", _COUNT)),
    # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ since driver load); nvidia-smi --query-gpu has no such field
    (("total_energy_mj",), _logged("energy_joules", _JOULES, "mj")),
)

_SAMPLE_FIELDS = frozenset(f.name for f in fields(GpuSample)) - {"timestamp", "monotonic"}
_IDENTITY_FIELDS = frozenset(f.name for f in fields(GpuIdentity))
_READINGS = frozenset({"temperature_gpu_celsius", "temperature_memory_celsius", "power_watts"})
assert all(c.target in _SAMPLE_FIELDS | _IDENTITY_FIELDS | {"timestamp"} for c in _COLUMNS.values())
assert not _SAMPLE_FIELDS & _IDENTITY_FIELDS


def supported_columns() -> dict[str, str]:
    """Every header name this parser reads (lower case, no unit) -> the GpuSample/GpuIdentity field it fills."""
    return {name: column.target for name, column in _COLUMNS.items()}


# --- header ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Bound:
    """A table column found at ``index`` in the file's rows."""

    index: int
    header: str  # as written in the file, for messages
    column: _Column
    unit: str  # the header's unit, else the column's default ("" for kinds without units)
    identity: bool  # fills ImportedRow.identity, not .values
    convert: Callable[[str], Any]  # raises ValueError
    # the common case only (a bare number, or one in the header's unit), without regular expressions; ValueError
    # sends the cell to ``convert``, which also knows the "not read" markers and other units
    fast: Callable[[str], Any]


@dataclass(frozen=True)
class _Layout:
    width: int
    time: _Bound
    # per column, lowest rank first, what the row loop reads: (cell index, target field, fills identity?, fast
    # converter, the column)
    plan: tuple[tuple[int, str, bool, Callable[[str], Any], _Bound], ...]

    def key(self) -> tuple[Any, ...]:
        """What the rows are read as (two headers written differently can mean the same)."""
        return (self.width, *((b.index, b.column, b.unit) for b in (self.time, *(p[4] for p in self.plan))))


def _split_header(name: str) -> tuple[str, str | None]:
    """``" power.draw [W] "`` -> ``("power.draw", "w")``."""
    name = name.strip()
    m = _HEADER_UNIT.fullmatch(name)
    if m is None:
        return name.lower(), None
    return m.group(1).lower(), m.group(2).lower() or None


def _looks_like_header(row: list[str]) -> bool:
    return any(_split_header(cell)[0] in _COLUMNS for cell in row)


def _resolve(header: list[str]) -> _Layout:
    """Map a header to table columns; unknown columns are ignored. Raises ImportFormatError (without a path)."""
    time: _Bound | None = None
    bound: list[_Bound] = []
    for index, cell in enumerate(header):
        name, unit = _split_header(cell)
        column = _COLUMNS.get(name)
        if column is None:
            continue
        if unit is not None and unit not in column.kind.units:
            raise ImportFormatError(f"column {cell.strip()!r}: [{unit}] is not a {column.kind.name} unit")
        unit = unit or column.unit or ""
        b = _Bound(index, cell.strip(), column, unit, column.target in _IDENTITY_FIELDS, _converter(column, unit),
                   _fast_converter(column, unit))
        if column.target == "timestamp":
            time = time or b
        else:
            bound.append(b)
    if time is None:
        raise ImportFormatError("no timestamp column (timestamp or timestamp_ns) in the header")
    if not any(b.column.target in _READINGS for b in bound):
        raise ImportFormatError("no temperature or power column (temperature.gpu, temperature.memory, "
                                "power.draw[.average|.instant], temperature_C, power_draw_W) in the header")
    bound.sort(key=lambda b: b.column.rank)
    return _Layout(len(header), time, tuple((b.index, b.column.target, b.identity, b.fast, b) for b in bound))


# --- rows --------------------------------------------------------------------------------------------------------


_NOT_AVAILABLE = frozenset({"", "n/a", "not supported"})
# the usual "not read" cells, as written: skipped without trying to convert them
_NOT_READ = frozenset({"", "N/A", "[N/A]", "[Not Supported]", "Not Supported"})


def _missing(text: str) -> bool:
    """nvidia-smi's "no value" markers: empty, N/A, Not Supported, or anything in brackets ([N/A], [Unknown Error])."""
    return (text[:1] == "[" and text[-1] == "]") or text.lower() in _NOT_AVAILABLE


def _converter(column: _Column, default_unit: str) -> Callable[[str], Any]:
    """The function that turns one cell of this column into its base-unit value (ValueError if it cannot)."""
    kind, post = column.kind, column.post
    if not kind.units:
        return kind.parse

    def quantity(text: str) -> Any:
        m = _NUMBER.fullmatch(text)
        if m is None:
            raise ValueError("not a number")
        number, unit = m.groups()
        scale = kind.units.get(unit.lower() if unit else default_unit)
        if scale is None:
            raise ValueError(f"{unit or 'no unit'} is not a {kind.name} unit ({', '.join(kind.units)})")
        value = float(number) * scale[0] / scale[1]
        return value if post is None else post(value)

    return quantity


def _no_fast_path(text: str) -> Any:
    raise ValueError(text)


def _fast_int(text: str) -> int:
    if "_" in text:  # int() takes 1_000; the strict parser does not
        raise ValueError(text)
    return int(text)


def _fast_bitmask(text: str) -> int:
    text = text.strip()
    if text[:2] in ("0x", "0X") and "_" not in text and text.isascii():
        return int(text, 16)
    if text.isdigit():
        return int(text)
    raise ValueError(text)


def _fast_converter(column: _Column, unit: str) -> Callable[[str], Any]:
    """The cheap converter for the common cells of this column: a quantity written bare or as ``number unit`` in
    the header's (or default) unit, an integer, a hex bitmask. It raises ValueError for everything else (markers
    such as [N/A], other units, NaN, texts, the logger's -1), which ``_converter`` and ``_missing`` then decide."""
    kind, post = column.kind, column.post
    fast: Callable[[str], Any]
    if kind is _COUNT:
        fast = _fast_int
    elif kind is _BITS:
        fast = _fast_bitmask
    elif not kind.units:  # texts, flags, P-states: their own parser, on the stripped text
        parse = kind.parse

        def bare(text: str) -> Any:
            text = text.strip()
            if _missing(text):
                raise ValueError(text)
            return parse(text)

        fast = bare
    elif unit in kind.units:
        num, den = kind.units[unit]

        def quantity(text: str) -> Any:
            number, _, written = text.strip().partition(" ")
            if written and written.lower() != unit:
                raise ValueError(text)
            value = float(number)
            if not -1e300 < value < 1e300 or "_" in number:  # nan, inf, 1_000: the strict parser refuses them
                raise ValueError(text)
            value = value * num / den
            return value if post is None else post(value)

        fast = quantity
    else:
        return _no_fast_path
    if not column.minus_one_na:
        return fast

    def logged(text: str) -> Any:
        if text.strip() == "-1":
            raise ValueError(text)
        return fast(text)

    return logged


def _timestamp(text: str, bound: _Bound, tz: datetime.tzinfo | None) -> tuple[float, float | None]:
    """Wall clock ``YYYY/MM/DD HH:MM:SS[.fff]`` (or with '-' and 'T', optionally with a zone) read in ``tz``, or a
    number in the column's unit (s, or ns for timestamp_ns). Second: for a local time the zone repeats (the hour
    after the autumn DST change), the Unix time of its second occurrence; else None."""
    if not text:
        raise ValueError("no timestamp")
    m = _WALL_CLOCK.fullmatch(text)
    if m is None:
        if _DECIMAL.fullmatch(text) is None:
            raise ValueError("not a timestamp")
        num, den = bound.column.kind.units[bound.unit]
        return (int(text) if _INTEGER.fullmatch(text) else float(text)) * num / den, None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micro = int((m.group(7) or "0")[:6].ljust(6, "0"))
    zone: datetime.tzinfo | None = tz
    if m.group(8) == "Z":
        zone = datetime.timezone.utc
    elif m.group(8) is not None:
        offset = m.group(8).replace(":", "")
        minutes = int(offset[1:3]) * 60 + int(offset[3:5])
        zone = datetime.timezone(datetime.timedelta(minutes=-minutes if offset[0] == "-" else minutes))
    # a naive datetime's .timestamp() reads it in the machine's local zone; fold=1 is a repeated time's second pass
    first = datetime.datetime(year, month, day, hour, minute, second, micro, tzinfo=zone)
    early, late = first.timestamp(), first.replace(fold=1).timestamp()
    return early, (late if late > early else None)


def time_bounds(latest: float) -> tuple[float, float]:
    """The Unix times a row may hold: from 2000 (earlier: a clock reset before NTP, 1970) to ``latest`` (the importing
    machine's clock plus FUTURE_SLACK_SECONDS), within the ledger validator's [2000, 2100). A row outside is refused,
    never stored: one would set the whole import aside. The columnar reader applies the same bounds."""
    return EARLIEST_WALL, min(latest, LATEST_WALL - 1.0)


def impossible_time(timestamp: float, latest: float) -> bool:
    """Whether a row's Unix time is outside :func:`time_bounds`."""
    low, high = time_bounds(latest)
    return not low <= timestamp <= high


def impossible_message(timestamp: float) -> str:
    when = "before 2000" if timestamp < EARLIEST_WALL else "over a day ahead of this machine's clock"
    return f"a time {when}, which no reading can have (the logging box's clock was not set)"


def _clip(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


ABSENT, VALUE, BAD = 0, 1, 2  # what a cell holds (cell_value)


def cell_value(raw: str, b: _Bound) -> tuple[int, Any]:
    """One cell as ``_row`` reads it (``raw`` as csv.reader with skipinitialspace gives it): (VALUE, value),
    (ABSENT, None) for a "not read" marker, or (BAD, message)."""
    if raw not in _NOT_READ:
        try:
            return VALUE, b.fast(raw)
        except ValueError:
            pass
    raw = raw.strip()
    if _missing(raw) or (raw == "-1" and b.column.minus_one_na):
        return ABSENT, None
    try:
        return VALUE, b.convert(raw)
    except ValueError as exc:
        return BAD, f"column {b.header!r}: {exc}: {_clip(raw)}"


def _row(cells: list[str], line: int, layout: _Layout, tz: datetime.tzinfo | None,
         times: dict[str, tuple[float, float | None]], latest: float) -> ImportedRow | RowProblem:
    """One data row; ``times`` caches timestamps already read (the GPUs of one nvidia-smi tick share one); a
    timestamp outside [2000, ``latest``] (:func:`impossible_time`) makes the row a problem."""
    if len(cells) != layout.width:
        return RowProblem(line, f"expected {layout.width} fields, found {len(cells)}")
    raw = cells[layout.time.index]
    when = times.get(raw)
    if when is None:
        try:
            when = _timestamp(raw.strip(), layout.time, tz)
        except (ValueError, OverflowError) as exc:
            return RowProblem(line, f"column {layout.time.header!r}: {exc}: {_clip(raw.strip())}")
        if len(times) > 64:
            times.clear()
        times[raw] = when
    timestamp, later = when
    if impossible_time(timestamp, latest):
        return RowProblem(line, f"column {layout.time.header!r}: {impossible_message(timestamp)}: "
                                f"{_clip(raw.strip())}")
    values: dict[str, Any] = {}
    identity: dict[str, Any] = {}
    for index, name, is_identity, fast, b in layout.plan:
        target = identity if is_identity else values
        if name in target:  # a higher-ranked column already gave this field
            continue
        raw = cells[index]
        if raw not in _NOT_READ:
            try:
                target[name] = fast(raw)
                continue
            except ValueError:
                pass
        raw = raw.strip()
        if _missing(raw) or (raw == "-1" and b.column.minus_one_na):
            continue
        try:
            target[name] = b.convert(raw)
        except ValueError as exc:
            return RowProblem(line, f"column {b.header!r}: {exc}: {_clip(raw)}")
    return ImportedRow(line, timestamp, gpu_key(identity), identity.get("name"), values, identity, later)


def gpu_key(identity: Mapping[str, Any]) -> str:
    """A row's GPU, as the log names it: its uuid, else its PCI bus id, else "index:N" (ImportedRow.gpu)."""
    if "uuid" in identity:
        return str(identity["uuid"])
    if "pci_bus_id" in identity:
        return str(identity["pci_bus_id"])
    return f"index:{identity.get('index', 0)}"


class _Lines:
    """The decoded physical lines of a binary file, one at a time (csv.reader's input), counted. A line that is
    not UTF-8, holds NUL bytes or is longer than MAX_LINE_BYTES sets ``trouble`` and is replaced, so the reader
    can go on."""

    def __init__(self, fh: IO[bytes], count: int) -> None:
        self._fh = fh
        self.count = count  # physical lines read so far (plus the lines skipped before this reader started)
        self.trouble: str | None = None

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        raw = self._fh.readline(MAX_LINE_BYTES)
        if not raw:
            raise StopIteration
        self.count += 1
        if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):
            rest = raw
            while rest and not rest.endswith(b"\n"):
                rest = self._fh.readline(MAX_LINE_BYTES)
            self.trouble = self.trouble or f"line {self.count} is longer than {MAX_LINE_BYTES} bytes"
            return "\n"
        if b"\0" in raw:  # a binary file, or the NUL-filled tail a crash can leave behind
            self.trouble = self.trouble or f"line {self.count} contains NUL bytes (binary data)"
            return "\n"
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.trouble = self.trouble or f"line {self.count} is not UTF-8 text (byte {exc.start})"
            return raw.decode("utf-8", "replace")


def _blank(cells: list[str]) -> bool:
    return not cells or (len(cells) == 1 and not cells[0].strip())


def _rows(path: Path, layout: _Layout, offset: int, line: int, tz: datetime.tzinfo | None, latest: float,
          ) -> Iterator[ImportedRow | RowProblem]:
    with path.open("rb") as fh:
        fh.seek(offset)
        lines = _Lines(fh, line)
        reader = csv.reader(lines, skipinitialspace=True)
        times: dict[str, tuple[float, float | None]] = {}
        while True:
            first = lines.count + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield RowProblem(first, lines.trouble or f"not readable as CSV: {exc}")
                lines.trouble = None
                continue
            if lines.trouble is not None:
                yield RowProblem(first, lines.trouble)
                lines.trouble = None
            elif not _blank(cells):
                result = _row(cells, first, layout, tz, times, latest)
                # logs appended to by several nvidia-smi runs repeat the header (checked only on failure: fast)
                if isinstance(result, RowProblem) and _looks_like_header(cells):
                    try:
                        layout = _resolve(cells)
                    except ImportFormatError as exc:
                        yield RowProblem(first, f"header row not used: {exc}")
                else:
                    yield result


def read_telemetry_csv(path: Path, *, columns: list[str] | None = None, tz: datetime.tzinfo | None = None,
                       max_bytes: int = 2 * 1024**3, latest: float | None = None,
                       ) -> Iterator[ImportedRow | RowProblem]:
    """Read an nvidia-smi ``--query-gpu`` CSV log or an llm-gpu-stress NVML logger CSV, lazily, row by row.

    The file is checked, and its header read, when this is called: ``ImportFormatError`` if it is larger than
    ``max_bytes``, empty, binary, not UTF-8 (a UTF-8 BOM is fine), or its header has no timestamp column or no
    temperature/power column. The returned iterator then streams the rest (one physical line in memory at a time)
    and yields an ``ImportedRow`` per usable row and a ``RowProblem`` per unusable one (wrong number of fields,
    a value that is not a number, a unit that does not fit the column, a bad timestamp, a line that is not UTF-8),
    in file order. Blank lines are skipped; a header row met again later (logs appended by several runs) replaces
    the layout. Values are not range-checked and rows are not deduplicated.

    Timestamps: nvidia-smi writes local wall-clock time without a zone (``2023/07/30 17:28:02.589``), and so does
    the llm-gpu-stress logger; they are read in ``tz``, by default the zone of the machine running the import
    (so pass the zone of the machine that wrote the log). A timestamp with an explicit offset or ``Z`` keeps it.

    ``columns``: the ``--query-gpu`` field names in order, for ``--format=csv,noheader`` files. When the file's
    first row is a header, the header is used and ``columns`` is ignored.

    Which GPU: ``ImportedRow.gpu`` is the row's uuid, else its PCI bus id, else ``"index:N"`` from the index
    column; a file with none of these (a single-GPU log) is taken to be GPU ``"index:0"``.
    """
    layout, offset, line = open_telemetry_csv(path, columns=columns, max_bytes=max_bytes)
    return _rows(Path(path), layout, offset, line, tz, latest_time(latest))


def latest_time(latest: float | None) -> float:
    """The latest Unix time a row may hold: ``latest``, else this machine's clock plus FUTURE_SLACK_SECONDS."""
    return time.time() + FUTURE_SLACK_SECONDS if latest is None else latest


def open_telemetry_csv(path: Path, *, columns: list[str] | None = None, max_bytes: int = 2 * 1024**3,
                       ) -> tuple[_Layout, int, int]:
    """Check a telemetry CSV file and read its header (see :func:`read_telemetry_csv`): its layout, the byte
    offset of its first data row and the number of lines before it. Raises ImportFormatError."""
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise ImportFormatError(f"{path}: {size} bytes is more than the {max_bytes}-byte limit")
    with path.open("rb") as fh:
        head = fh.read(3)
        if head.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise ImportFormatError(f"{path}: UTF-16 text (a PowerShell redirect?), not UTF-8; convert it first")
        start = 3 if head.startswith(b"\xef\xbb\xbf") else 0
        fh.seek(start)
        lines = _Lines(fh, 0)
        reader = csv.reader(lines, skipinitialspace=True)
        try:
            first = next((cells for cells in reader if not _blank(cells)), None)
        except csv.Error as exc:
            raise ImportFormatError(f"{path}: not CSV text: {lines.trouble or exc}") from None
        if lines.trouble is not None:
            raise ImportFormatError(f"{path}: not CSV text: {lines.trouble}")
        if first is None:
            raise ImportFormatError(f"{path}: empty file")
        try:
            if _looks_like_header(first):
                return _resolve(first), fh.tell(), lines.count
            if columns is not None:
                return _resolve(columns), start, 0
        except ImportFormatError as exc:
            raise ImportFormatError(f"{path}: {exc}") from None
    raise ImportFormatError(f"{path}: the first row is not a known telemetry CSV header; for a noheader "
                            f"nvidia-smi file pass columns= (the --query-gpu field names)")
