"""The fast path of `gpuwear import nvidia-smi`: the log read as columns (pyarrow's CSV reader, numpy), in blocks of
a few MB, each GPU's rows carried through the same stages as the row path (``backfill.import_rows``), with the
state one block leaves for the next. Only the import command loads this module (numpy and pyarrow add ~60 MB
to a process; the daemon never imports them: tests/test_columnar.py checks).

Every rule is the row path's, and the result is its ledger bit for bit (tests/test_columnar.py, on random and
real logs, split into blocks anywhere). Cells go through the importer's own converters: a quantity column in its
header's unit is converted in one vectorised pass (arrow's string to double cast, then the same ``* num / den``);
every other column is dictionary-encoded and each distinct cell goes through :func:`importer.cell_value`. Anything
this path does not reproduce exactly raises :class:`ColumnarError` before the ledger is written, and the caller
imports the file row by row instead: a quoted cell after ", ", a blank line, a header of another layout, a line
longer than the row path reads, text that is not UTF-8, NUL bytes.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import datetime
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from gpuwear.config import WearConfig
from gpuwear.imports import parse as importer
from gpuwear.imports.backfill import (
    CADENCE_INTERVALS,
    NOT_READINGS,
    FileResult,
    GpuImport,
    finish,
    ledger_uuid,
    new_wear,
)
from gpuwear.imports.parse import ABSENT, BAD, VALUE, ImportFormatError, RowProblem
from gpuwear.ledger import Ledger
from gpuwear.sample import PHYSICAL_RANGES
from gpuwear.wear.accumulate import HEALTH_FIELDS, SEEN_FIELDS, GpuWear
from gpuwear.wear.batch import (
    COVERED,
    GAP,
    READING,
    Bools,
    Carry,
    ColumnarError,
    Floats,
    Ints,
    Series,
    believed_after,
    integrate,
    spikes,
)
from gpuwear.wear.cadence import gap_threshold
from gpuwear.wear.plausibility import shutdown_limit

BLOCK_BYTES = 4 << 20  # arrow reads this much of the file at a time (~20k nvidia-smi rows)
_IDENTITY = ("uuid", "pci_bus_id", "index", "name")
# GpuSample fields that no CSV column fills (GpuWear.add reads them from live samples only)
_LIVE_ONLY = ("violation_power_seconds", "violation_thermal_seconds", "fan_speed_rpm", "threshold_shutdown_celsius")
assert not set(_LIVE_ONLY) & set(importer.supported_columns().values())
_MARKERS = pa.array(["", "N/A", "n/a", "Not Supported", "not supported", "[N/A]", "[Not Supported]"])
_NUMBER = r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$"
_REASON_BITS = (1 << 62) - 1  # the reasons NVML defines are the low bits; a mask is kept in an int64


__all__ = ["ColumnarError", "import_file"]


# --- cells -------------------------------------------------------------------------------------------------------


@dataclass
class _Col:
    """One target field over a block's rows: status (importer.ABSENT/VALUE/BAD), the value as a float (NaN where
    none; flags and texts NaN too) and, for dictionary-encoded columns, the Python value of each distinct cell."""

    status: npt.NDArray[np.int8]
    num: Floats
    codes: Ints | None = None
    distinct: list[Any] | None = None
    objects: list[Any] | None = None  # per row, for a column merged from several (rare)
    flag: Bools | None = None  # where the value is a flag (True/False: inside every range)

    def python(self, row: int) -> Any:
        if self.objects is not None:
            return self.objects[row]
        if self.distinct is not None and self.codes is not None:
            return self.distinct[int(self.codes[row])]
        return float(self.num[row])


def _float(value: Any) -> float:
    if value is None or value.__class__ in (bool, str):
        return math.nan
    if value.__class__ is tuple:  # fan_speed_ratio: (ratio,)
        return math.nan if value[0] is None else float(value[0])
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float: outside every range, as the row path finds
        return math.inf if value > 0 else -math.inf


def _strip_initial(cell: str) -> str:
    """The cell as csv.reader(skipinitialspace=True) gives it; a quote after the spaces is a quoted cell there
    and not for arrow."""
    cell = cell.lstrip(" ")
    if cell[:1] == '"' or "\0" in cell:
        raise ColumnarError("a quoted cell after ', ' or NUL bytes")
    return cell


def _dictionary(array: pa.Array, b: Any) -> _Col:
    encoded = pc.dictionary_encode(array)
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    statuses, values = [], []
    for raw in encoded.dictionary.to_pylist():
        status, value = importer.cell_value(_strip_initial(raw), b)
        statuses.append(status)
        values.append(value if status == VALUE else None)
    status = np.array(statuses, dtype=np.int8)[codes]
    num = np.array([_float(v) for v in values], dtype=np.float64)[codes]
    flags = [v.__class__ is bool for v in values]
    return _Col(status, num, codes, values, flag=np.array(flags, dtype=bool)[codes] if any(flags) else None)


def _quantity(array: pa.Array, b: Any) -> _Col:
    """A quantity column in its header's unit: cast in one pass; cells that are not a plain number in that unit
    go through importer.cell_value one by one."""
    num_, den = b.column.kind.units[b.unit]
    s = pc.ascii_trim_whitespace(array)
    number = s
    if b.unit:  # the unit as this file writes it (" W"): other spellings are cells for cell_value
        suffix = next((cell[-len(b.unit) - 1:] for cell in s.slice(0, 64).to_pylist()
                       if cell.lower().endswith(" " + b.unit)), " " + b.unit)
        number = pc.if_else(pc.ends_with(s, pattern=suffix), pc.utf8_slice_codeunits(s, 0, -len(suffix)), s)
    missing = pc.is_in(s, value_set=_MARKERS)
    if b.column.minus_one_na:
        missing = pc.or_(missing, pc.equal(s, "-1"))
    num, ok = _cast(number, missing, careful=False)
    if num is None:  # a cell arrow does not read as a number: only the cells that look like one are cast
        num, ok = _cast(number, pc.or_(missing, pc.invert(pc.match_substring_regex(number, _NUMBER))), careful=True)
    assert num is not None
    status = np.where(ok, VALUE, ABSENT).astype(np.int8)
    out = num * float(num_) / float(den)
    out[~ok] = np.nan
    rest = np.flatnonzero(~ok & ~_np_bool(missing))
    if len(rest):
        for i, cell in zip(rest.tolist(), array.take(pa.array(rest)).to_pylist(), strict=True):
            st, value = importer.cell_value(_strip_initial(cell), b)
            status[i] = st
            out[i] = _float(value) if st == VALUE else np.nan
    return _Col(status, out)


def _cast(number: pa.Array, skip: pa.Array, careful: bool) -> tuple[Floats | None, Bools]:
    """The cells not skipped as doubles, and where that gave a finite value (inf, 1e999: cell by cell). None when
    arrow cannot cast one of them (not careful: the caller tries again, careful: every cell by itself)."""
    try:
        values = pc.cast(pc.if_else(skip, pa.scalar(None, pa.string()), number), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if not careful:
            return None, np.zeros(0, dtype=bool)
        return np.full(len(number), np.nan), np.zeros(len(number), dtype=bool)
    num = values.to_numpy(zero_copy_only=False).astype(np.float64)
    return num, ~_np_bool(skip) & (np.abs(np.nan_to_num(num, nan=np.inf)) < 1e300)


def _np_bool(a: Any) -> Bools:
    return np.asarray(a.to_numpy(zero_copy_only=False), dtype=bool)


def _convert(array: pa.Array, b: Any) -> _Col:
    if b.column.kind.units and b.unit in b.column.kind.units and not b.identity and b.column.post is None:
        return _quantity(array, b)
    return _dictionary(array, b)


def _merge(high: _Col, low: _Col) -> _Col:
    """A field fed by several columns: the highest-ranked present cell wins (a lower one is read only when the
    higher is absent, as importer._row does)."""
    take = (high.status == ABSENT) & (low.status != ABSENT)
    objects = None
    if high.distinct is not None or low.distinct is not None or high.objects is not None:
        n = len(high.status)
        objects = [low.python(i) if take[i] else high.python(i) for i in range(n)]
    flag = None
    if high.flag is not None or low.flag is not None:
        flag = np.where(take, low.flag if low.flag is not None else False,
                        high.flag if high.flag is not None else False)
    return _Col(np.where(take, low.status, high.status).astype(np.int8), np.where(take, low.num, high.num),
                objects=objects, flag=flag)


# --- time --------------------------------------------------------------------------------------------------------


@dataclass
class _Clock:
    """Turns wall-clock cells into Unix seconds exactly as importer._timestamp does, an hour at a time."""

    tz: datetime.tzinfo | None
    bound: Any
    latest: float  # the latest Unix time a row may hold (parse.impossible_time)
    hours: dict[tuple[int, int, int, int], int | None] = field(default_factory=dict)
    cells: dict[str, tuple[float, float | None] | None] = field(default_factory=dict)

    def hour(self, y: int, mo: int, d: int, h: int) -> int | None:
        """Unix seconds at the start of a local hour the zone maps as one piece (no DST change inside, not
        repeated), else None."""
        key = (y, mo, d, h)
        if key not in self.hours:
            base: int | None = None
            try:
                start = datetime.datetime(y, mo, d, h, tzinfo=self.tz)
                end = start.replace(minute=59, second=59)
                a, a1, b, b1 = (x.timestamp() for x in (start, start.replace(fold=1), end, end.replace(fold=1)))
                if a == a1 and b == b1 and b - a == 3599.0 and a == int(a):
                    base = int(a)
            except (ValueError, OverflowError, OSError):
                pass
            self.hours[key] = base
        return self.hours[key]

    def cell(self, text: str) -> tuple[float, float | None] | None:
        if text not in self.cells:
            if len(self.cells) > 100_000:
                self.cells.clear()
            try:
                self.cells[text] = importer._timestamp(text.strip(), self.bound, self.tz)
            except (ValueError, OverflowError):
                self.cells[text] = None
        return self.cells[text]

    def read(self, array: pa.Array) -> tuple[Floats, Floats, Bools]:
        """Unix seconds, the later reading of a repeated local time (NaN: none), and a bad-cell mask."""
        n = len(array)
        ts, later, bad = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool)
        done = np.zeros(n, dtype=bool)
        trimmed = pc.ascii_trim_whitespace(array)
        fixed = _fixed_width(trimmed)
        if fixed is not None:
            ok, y, mo, d, h, mi, sec, micro = fixed
            hour_key = ((y * 13 + mo) * 32 + d) * 24 + h
            keys, first = np.unique(np.where(ok, hour_key, -1), return_index=True)
            base = np.zeros(n, dtype=np.int64)
            for key, i in zip(keys.tolist(), first.tolist(), strict=True):
                if key < 0:
                    continue
                start = self.hour(int(y[i]), int(mo[i]), int(d[i]), int(h[i]))
                rows = hour_key == key
                if start is None:
                    ok &= ~rows
                else:
                    base[rows] = start
            seconds = base + mi * 60 + sec
            if self.tz is None:  # datetime.timestamp() of a naive time: local seconds + microseconds / 1e6
                ts = np.where(ok, seconds.astype(np.float64) + micro / 1e6, np.nan)
            else:  # of an aware time: timedelta.total_seconds(), whole microseconds / 10**6
                ts = np.where(ok, (seconds * 1_000_000 + micro).astype(np.float64) / 1e6, np.nan)
            done = ok
        rest = np.flatnonzero(~done)
        if len(rest):
            for i, cell in zip(rest.tolist(), array.take(pa.array(rest)).to_pylist(), strict=True):
                got = self.cell(_strip_initial(cell))
                if got is None:
                    bad[i] = True
                else:
                    ts[i] = got[0]
                    if got[1] is not None:
                        later[i] = got[1]
        low, high = importer.time_bounds(self.latest)
        bad |= ~np.isnan(ts) & ((ts < low) | (ts > high))
        return ts, later, bad


def _fixed_width(s: pa.Array) -> tuple[Any, ...] | None:
    """'YYYY/MM/DD HH:MM:SS[.fff]' (or '-', 'T') when every cell has the same width: the digits read from arrow's
    buffer as an (n, width) byte matrix. Dates are checked as datetime() would; a cell that fails is not ok."""
    n = len(s)
    if n == 0 or s.null_count:
        return None
    offsets = np.frombuffer(s.buffers()[1], dtype=np.int32)[s.offset:s.offset + n + 1]
    width = int(offsets[1] - offsets[0])
    if width < 19 or width == 20 or width > 29 or int(offsets[-1] - offsets[0]) != n * width:
        return None
    if not np.all(np.diff(offsets) == width):
        return None
    data = np.frombuffer(s.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[0] + n * width].reshape(n, width)
    digits = data[:, [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, *range(20, width)]].astype(np.int64) - 48
    ok = np.all((digits >= 0) & (digits <= 9), axis=1)
    sep = data[:, [4, 7, 10, 13, 16]]
    ok &= (sep[:, 0] == sep[:, 1]) & np.isin(sep[:, 0], (45, 47)) & np.isin(sep[:, 2], (32, 84))
    ok &= (sep[:, 3] == 58) & (sep[:, 4] == 58)
    if width > 19:
        ok &= np.isin(data[:, 19], (44, 46))

    def number(columns: list[int]) -> Ints:
        v = np.zeros(n, dtype=np.int64)
        for c in columns:
            v = v * 10 + (data[:, c].astype(np.int64) - 48)
        return v

    y, mo, d = number([0, 1, 2, 3]), number([5, 6]), number([8, 9])
    h, mi, sec = number([11, 12]), number([14, 15]), number([17, 18])
    fraction = list(range(20, min(width, 26)))
    micro = number(fraction) * 10 ** (6 - len(fraction)) if fraction else np.zeros(n, dtype=np.int64)
    days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    ok &= (y >= 1) & (mo >= 1) & (mo <= 12) & (h < 24) & (mi < 60) & (sec < 60) & (d >= 1)
    ok &= d <= days[np.clip(mo - 1, 0, 11)] + ((mo == 2) & leap)
    return ok, y, mo, d, h, mi, sec, micro


# --- blocks ------------------------------------------------------------------------------------------------------


@dataclass
class _Block:
    """A block of rows: their file line numbers, times (and the later pass of a repeated local time), which
    rows are problems, the fields, and the cells as read (for what the row path says of a problem row)."""

    lines: Ints
    ts: Floats
    later: Floats
    problem: Bools
    cols: dict[str, _Col]
    table: pa.RecordBatch


class _RenumberError(Exception):
    """A row of the wrong width read with threads, which do not number lines: read the file again serially."""


def _blocks(path: Path, layout: Any, offset: int, line0: int, tz: datetime.tzinfo | None, block_bytes: int,
            problems: list[tuple[int, str]], threads: bool, latest: float) -> Iterator[_Block]:
    """The file's data rows, a block at a time. Rows of the wrong width become problems here; the lines of
    every row are counted (arrow's serial reader numbers the rows it refuses; with ``threads``, a refused row
    raises _RenumberError)."""
    refused: list[tuple[int, str]] = []
    skipped: set[int] = set()

    def refuse(row: Any) -> str:
        refused.append((row.number, row.text))
        return "skip"

    def take_refused() -> None:
        for number, text in refused:  # arrow may have read ahead: these can be lines of later blocks
            if number is None:
                raise _RenumberError()
            skipped.add(number)
            problems.extend(_refused(line0 + number, text, layout.width))
        refused.clear()

    clock = _Clock(tz, layout.time, latest)
    with path.open("rb") as fh:
        fh.seek(offset)
        reader = pacsv.open_csv(
            fh, read_options=pacsv.ReadOptions(column_names=[f"f{i}" for i in range(layout.width)],
                                               block_size=block_bytes, use_threads=threads),
            parse_options=pacsv.ParseOptions(newlines_in_values=False, ignore_empty_lines=False,
                                             invalid_row_handler=refuse),
            convert_options=pacsv.ConvertOptions(
                column_types={f"f{i}": pa.string() for i in range(layout.width)}, strings_can_be_null=False,
                quoted_strings_can_be_null=False, null_values=[]))
        next_line = 1  # the stream's line numbers (1: the first line after the header)
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                take_refused()  # rows refused after the last batch: a file whose every row is of the wrong width
                break
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ColumnarError(f"arrow cannot read it as CSV ({exc})") from None
            if batch.num_columns != layout.width:
                raise ColumnarError("rows of another width than the header")
            take_refused()
            n = batch.num_rows
            candidates = np.arange(next_line, next_line + n + len(skipped))
            lines = candidates[~np.isin(candidates, list(skipped))][:n]
            if n:
                next_line = int(lines[-1]) + 1
                skipped = {x for x in skipped if x >= next_line}
                yield _block(batch, lines + line0, layout, clock)


def _refused(line: int, text: str, width: int) -> list[tuple[int, str]]:
    """A row arrow found of the wrong width: what the row path says of it."""
    if "\0" in text:
        return [(line, f"line {line} contains NUL bytes (binary data)")]
    if '"' in text:
        raise ColumnarError("a quoted cell in a row of another width")
    cells = next(csv.reader([text], skipinitialspace=True), [])
    if importer._blank(cells):
        return []
    if importer._looks_like_header(cells):
        raise ColumnarError("a header row of another width")
    return [(line, f"expected {width} fields, found {len(cells)}")]


def _block(batch: pa.RecordBatch, lines: Ints, layout: Any, clock: _Clock) -> _Block:
    widest = sum(pc.max(pc.binary_length(batch.column(i))).as_py() or 0 for i in range(layout.width))
    if widest + layout.width + 1 >= importer.MAX_LINE_BYTES:
        raise ColumnarError("a line may be longer than the row path reads")
    if any(_has_nul(batch.column(i)) for i in range(layout.width)):  # in any column: the row path skips the line
        raise ColumnarError("NUL bytes in a row")
    ts, later, bad = clock.read(batch.column(layout.time.index))
    cols: dict[str, _Col] = {}
    for index, name, _identity, _fast, b in layout.plan:
        col = _convert(batch.column(index), b)
        if name in cols:
            if name in _IDENTITY:
                raise ColumnarError(f"identity field {name} from several columns")
            col = _merge(cols[name], col)
        cols[name] = col
    problem = bad.copy()
    for col in cols.values():
        problem |= col.status == BAD
    return _Block(lines, ts, later, problem, cols, batch)


def _has_nul(array: pa.Array) -> bool:
    """Whether any cell holds a NUL byte (a scan of the cells' bytes, not of the buffer's padding)."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32)[array.offset:array.offset + len(array) + 1]
    data = array.buffers()[2]
    if data is None or not len(offsets) or offsets[-1] == offsets[0]:
        return False
    return int(np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]].min()) == 0


def _problem(block: _Block, row: int, layout: Any, tz: datetime.tzinfo | None, latest: float) -> str | None:
    """What the row path says of a row the block could not use (None: a header row of the same layout, which
    the row path takes silently)."""
    cells = [_strip_initial(block.table.column(i)[row].as_py()) for i in range(layout.width)]
    if all(cell == "" for cell in cells):
        raise ColumnarError("a blank line (arrow cannot tell it from a row of empty cells)")
    line = int(block.lines[row])
    result = importer._row(cells, line, layout, tz, {}, latest)
    if not isinstance(result, RowProblem):
        raise ColumnarError(f"line {line}: the row path reads it")
    if importer._looks_like_header(cells):
        try:
            other = importer._resolve(cells)
        except ImportFormatError as exc:
            return f"header row not used: {exc}"
        if other.key() != layout.key():
            raise ColumnarError("a header row of another layout")
        return None
    return result.message


# --- per GPU -----------------------------------------------------------------------------------------------------


@dataclass
class _Gpu:
    """One GPU's import in progress: the row path's _Gpu, with pieces of series instead of rows."""

    uuid: str
    wear: GpuWear
    starts: list[float]  # the ledger's observed intervals for this GPU, by start, with the running latest end
    ends: list[float]
    max_gap: float | None
    live_max_gap: float
    limit_celsius: float  # a die reading above it is above the card's shutdown threshold
    by_stretch: bool = True  # as the row path's: a threshold found from the cadence is judged stretch by stretch
    last_time: float | None = None
    buffered: list[Series] = field(default_factory=list)  # until the cadence is known
    intervals: int = 0
    cadence: float | None = None
    held: Series | None = None  # the last reading, awaiting its next to be judged
    spike_last: float | None = None  # the time of the last entry judged, when a reading (None: a break)
    before: tuple[float, float] | None = None  # the spike filter's last believed die reading (s, °C)
    before_memory: tuple[float, float] | None = None  # and memory reading
    carry: Carry = field(default_factory=Carry)
    skipped: int = 0
    dropped: int = 0
    excluded: Counter[str] = field(default_factory=Counter)
    intervals_ms: Counter[int] = field(default_factory=Counter)  # as the row path's: every interval between readings
    entry: tuple[float, int] | None = None  # the last entry fed: (time, kind)

    def covered(self, t: Floats) -> Bools:
        if not self.starts:
            return np.zeros(len(t), dtype=bool)
        i = np.searchsorted(np.array(self.starts), t, side="right") - 1
        return (i >= 0) & (np.array(self.ends)[np.clip(i, 0, None)] >= t)

    def covers(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and self.ends[i] >= t


def _count(counter: Counter[str], key: str, n: int) -> None:
    if n:
        counter[key] += n


def _new_gpu(uuid: str, ledger: Ledger, known: dict[str, GpuWear], params: WearConfig,
             max_gap: float | None, name: str | None) -> _Gpu:
    w = new_wear(uuid, known, params.cycles.hysteresis_celsius, name)
    spans = sorted(ledger.covered(uuid))
    ends = list(np.maximum.accumulate([b for _, b in spans])) if spans else []
    return _Gpu(uuid, w, [a for a, _ in spans], [float(e) for e in ends], max_gap, params.max_gap_seconds,
                shutdown_limit(w.thresholds.get("shutdown")), by_stretch=max_gap is None)


def _order(g: _Gpu, t: Floats, later: Floats) -> tuple[Floats, Bools, Bools, Bools, Bools]:
    """The row path's order stage: (times, covered, accepted, duplicate, back in time). A repeated local hour
    is its second pass when the log goes on from the last row taken."""
    if np.isnan(later).all():
        covered = g.covered(t)
        taken = np.where(covered, -np.inf, t)
        start = -np.inf if g.last_time is None else g.last_time
        last = np.maximum.accumulate(np.concatenate([[start], taken[:-1]]))
        fresh = ~covered
        accepted, duplicate, back = fresh & (t > last), fresh & (t == last), fresh & (t < last)
        if accepted.any():
            g.last_time = float(np.max(t[accepted]))
        return t, covered, accepted, duplicate, back
    t = t.copy()
    n = len(t)
    covered, accepted, duplicate, back = (np.zeros(n, dtype=bool) for _ in range(4))
    for i in range(n):
        ti = float(t[i])
        if g.last_time is not None and ti < g.last_time and not np.isnan(later[i]) and later[i] >= g.last_time:
            ti = t[i] = float(later[i])
        if g.covers(ti):
            covered[i] = True
        elif g.last_time is not None and ti <= g.last_time:
            (duplicate if ti == g.last_time else back)[i] = True
        else:
            accepted[i] = True
            g.last_time = ti
    return t, covered, accepted, duplicate, back


def _readings(g: _Gpu, block: _Block, rows: Ints, t: Floats, covered: Bools, accepted: Bools) -> Series:
    """The accepted rows' values (validated ranges, the shutdown threshold), the GPU's non-temporal state
    (what was seen, health, thresholds, name), and the entries in order: readings, rows without any reading
    (a gap) and covered rows (a break)."""
    cols = block.cols
    r = rows[accepted]

    def valid(name: str) -> tuple[Bools, Floats]:
        c = cols.get(name)
        if c is None:
            return np.zeros(len(r), dtype=bool), np.full(len(r), np.nan)
        present = c.status[r] == VALUE
        x = c.num[r]
        bounds = PHYSICAL_RANGES.get(name)
        if bounds is not None:
            inside = (bounds[0] <= x) & (x <= bounds[1])
            if c.flag is not None:
                inside |= c.flag[r]
            g.dropped += int((present & ~inside).sum())
            present &= inside
        return present, np.where(present, x, np.nan)

    values = {name: valid(name) for name in cols if name not in importer._IDENTITY_FIELDS}
    if "temperature_gpu_celsius" in values:  # above the card's shutdown threshold: not a reading
        die_ok, die = values["temperature_gpu_celsius"]
        above = die_ok & (die > g.limit_celsius)
        _count(g.excluded, "above_shutdown", int(above.sum()))
        values["temperature_gpu_celsius"] = die_ok & ~above, np.where(above, np.nan, die)
    fan_present = np.zeros(len(r), dtype=bool)
    if "fan_speed_ratio" in cols:  # a fan outside its range is (None,): still a reading, and a fan
        fan_present = cols["fan_speed_ratio"].status[r] == VALUE
    reading = fan_present.copy()
    for name, (present, _) in values.items():
        if not any(part in name for part in NOT_READINGS):
            reading |= present
    _count(g.excluded, "no_readings", int((~reading).sum()))
    _note(g, cols, r[reading], {k: (v[0][reading], v[1][reading]) for k, v in values.items()}, fan_present[reading])

    # entries in row order: covered rows and accepted rows
    entry = covered | accepted
    n = int(entry.sum())
    kind = np.full(n, COVERED, dtype=np.int8)
    at = np.flatnonzero(accepted[entry])
    kind[at] = np.where(reading, READING, GAP)

    def spread(x: Floats, fill: float = np.nan) -> Floats:
        out = np.full(n, fill)
        out[at] = x
        return out

    def field_(name: str) -> Floats:
        return spread(values[name][1]) if name in values else np.full(n, np.nan)

    reasons = np.full(n, -1, dtype=np.int64)
    if "clock_event_reasons" in cols:
        c = cols["clock_event_reasons"]
        ok = values["clock_event_reasons"][0]
        masks = np.array([int(c.python(int(i))) & _REASON_BITS for i in r[ok]], dtype=np.int64) \
            if c.distinct is None else _masks(c, r, ok)
        reasons[at[ok]] = masks
    fans = np.zeros(n, dtype=bool)
    fans[at] = fan_present
    return Series(t[entry], kind, field_("temperature_gpu_celsius"), field_("temperature_memory_celsius"),
                  field_("power_watts"), field_("power_limit_watts"), field_("utilization_gpu_ratio"),
                  field_("energy_joules"), field_("fan_speed_ratio"), fans, reasons)


def _masks(c: _Col, r: Ints, ok: Bools) -> Ints:
    assert c.distinct is not None and c.codes is not None
    per = np.array([int(v) & _REASON_BITS if isinstance(v, int) else 0 for v in c.distinct] or [0], dtype=np.int64)
    return per[c.codes[r[ok]]]


def _note(g: _Gpu, cols: dict[str, _Col], r: Ints, values: dict[str, tuple[Bools, Floats]], fan_present: Bools,
          ) -> None:
    """GpuWear.add's non-temporal part over the readings (what was seen, thresholds, health, the name)."""
    if not len(r):
        return
    w = g.wear

    def any_(name: str) -> bool:
        return name in values and bool(values[name][0].any())

    for group, names in SEEN_FIELDS.items():  # a fan outside its range is still a fan: fan_present, not its value
        if any(bool(fan_present.any()) if name == "fan_speed_ratio" else any_(name) for name in names):
            w.seen[group] = 1
    if any_("power_limit_watts"):
        w.thresholds["power_limit_watts"] = float(values["power_limit_watts"][1][values["power_limit_watts"][0]][-1])
    for name in HEALTH_FIELDS:
        if any_(name):
            last = int(r[np.flatnonzero(values[name][0])[-1]])
            w.health[name] = cols[name].python(last)
    if any_("temperature_memory_celsius"):
        w.health["memory_temperature_reported"] = True
    label = cols.get("name")
    if not w.name and label is not None and label.distinct is not None and label.codes is not None:
        named = np.array([bool(v) for v in label.distinct] or [False])[label.codes[r]] & (label.status[r] == VALUE)
        hit = np.flatnonzero(named)
        if len(hit):
            w.name = str(label.python(int(r[hit[0]])))


def _feed(g: _Gpu, s: Series) -> None:
    """The cadence stage (entries held until the gap threshold is known), then the spike stage."""
    if not len(s):
        return
    time, kind = s.time, s.kind
    if g.entry is not None:  # the interval from the last entry of the block before
        time, kind = np.concatenate([[g.entry[0]], time]), np.concatenate([[g.entry[1]], kind])
    both = (kind[1:] == READING) & (kind[:-1] == READING)
    ms, counts = np.unique(np.round((time[1:] - time[:-1])[both] * 1000).astype(np.int64), return_counts=True)
    g.intervals_ms.update(dict(zip(ms.tolist(), counts.tolist(), strict=True)))
    g.entry = (float(s.time[-1]), int(s.kind[-1]))
    if g.max_gap is None:
        g.buffered.append(s)
        reading = s.kind == READING
        pairs = int((reading[1:] & reading[:-1]).sum())
        if len(g.buffered) > 1:
            previous = g.buffered[-2]
            pairs += int(bool(len(previous)) and bool(len(s)) and previous.kind[-1] == READING
                         and s.kind[0] == READING)
        g.intervals += pairs
        if g.intervals >= CADENCE_INTERVALS:
            _settle(g)
        return
    _judge(g, s, final=False)


def _settle(g: _Gpu) -> None:
    if g.max_gap is None:
        held = Series.concat(g.buffered) if g.buffered else None
        if held is not None and len(held):
            reading = held.kind == READING
            both = reading[1:] & reading[:-1]
            intervals = (held.time[1:] - held.time[:-1])[both][:CADENCE_INTERVALS]
            g.cadence = statistics.median(intervals.tolist()) if len(intervals) else None
        g.max_gap = gap_threshold(g.cadence, g.live_max_gap)
        g.buffered = []
        if held is not None:
            _judge(g, held, final=False)


def _judge(g: _Gpu, s: Series, final: bool) -> None:
    """The spike stage: every entry but a last reading is decided (that one waits for its next), then
    integrated."""
    if g.held is not None:
        s = Series.concat([g.held, s])
        g.held = None
    if not len(s):
        return
    reading = s.kind == READING
    spike = spikes(s.time, s.die, reading, g.before, g.spike_last)
    memory_spike = spikes(s.time, s.memory, reading, g.before_memory, g.spike_last)
    if not final and s.kind[-1] == READING:  # its verdict needs the next entry: it waits for the next piece
        g.held = s.take(slice(len(s) - 1, None))
        s, reading = s.take(slice(0, len(s) - 1)), reading[:-1]
        spike, memory_spike = spike[:-1], memory_spike[:-1]
        if not len(s):
            return
    g.before = believed_after(s.time, s.die, reading, spike, g.before, g.spike_last)
    g.before_memory = believed_after(s.time, s.memory, reading, memory_spike, g.before_memory, g.spike_last)
    g.spike_last = float(s.time[-1]) if reading[-1] else None
    _count(g.excluded, "spike", int(spike.sum()))
    _count(g.excluded, "memory_spike", int(memory_spike.sum()))
    s = dataclasses.replace(s, die=np.where(spike, np.nan, s.die), memory=np.where(memory_spike, np.nan, s.memory))
    assert g.max_gap is not None
    integrate(g.wear, s, g.max_gap, g.carry, g.live_max_gap if g.by_stretch else None)


# --- the import --------------------------------------------------------------------------------------------------


def import_file(path: Path, ledger: Ledger, params: WearConfig, *, gpu: str | None = None,
                columns: list[str] | None = None, tz: datetime.tzinfo | None = None, max_gap: float | None = None,
                say: Callable[[str], None] = print, progress: Callable[[int], None] | None = None,
                block_bytes: int = BLOCK_BYTES, latest: float | None = None) -> FileResult:
    """backfill.import_file, by columns. Raises ColumnarError (nothing written, nothing said) when the file needs
    the row path, ImportFormatError when it cannot be used at all."""
    last = importer.latest_time(latest)
    try:
        return _import(path, ledger, params, gpu, columns, tz, max_gap, say, progress, block_bytes, last, threads=True)
    except _RenumberError:
        return _import(path, ledger, params, gpu, columns, tz, max_gap, say, progress, block_bytes, last,
                       threads=False)


def _import(path: Path, ledger: Ledger, params: WearConfig, gpu: str | None, columns: list[str] | None,
            tz: datetime.tzinfo | None, max_gap: float | None, say: Callable[[str], None],
            progress: Callable[[int], None] | None, block_bytes: int, latest: float, threads: bool) -> FileResult:
    layout, offset, line0 = importer.open_telemetry_csv(path, columns=columns)
    known = ledger.load(params.cycles.hysteresis_celsius)
    gpus: dict[str, _Gpu] = {}
    resolved: dict[tuple[str, Any], str] = {}
    problems: list[tuple[int, str]] = []
    said: list[tuple[int, str]] = []
    rows_read = 0
    for block in _blocks(path, layout, offset, line0, tz, block_bytes, problems, threads, latest):
        rows_read += len(block.lines)
        ok = ~block.problem
        for i in np.flatnonzero(block.problem).tolist():
            message = _problem(block, i, layout, tz, latest)
            if message is not None:
                problems.append((int(block.lines[i]), message))
        rows = np.flatnonzero(ok)
        for uuid, mine, name in _identities(block, rows, resolved, known, gpu):
            g = gpus.get(uuid)
            if g is None:
                g = gpus[uuid] = _new_gpu(uuid, ledger, known, params, max_gap, name)
            t, covered, accepted, duplicate, back = _order(g, block.ts[mine], block.later[mine])
            g.skipped += int(covered.sum())
            _count(g.excluded, "duplicate_timestamp", int(duplicate.sum()))
            for line in block.lines[mine[back]].tolist():
                said.append((int(line), f"timestamp goes back in time for GPU {uuid}"))
            _feed(g, _readings(g, block, mine, t, covered, accepted))
        if progress is not None:
            progress(rows_read)
    for g in gpus.values():
        _settle(g)
        _judge(g, _empty(), final=True)
    messages = sorted([*problems, *said])
    for line, message in messages:
        say(f"{path}:{line}: {message}; row skipped")
    results = [GpuImport(g.uuid, g.wear, g.carry.first, g.carry.last, g.carry.rows, g.skipped, g.excluded,
                         g.cadence, g.max_gap, g.dropped, g.intervals_ms) for g in gpus.values()]
    return finish(path, ledger, params, results, len(messages), reader="columns")


def _empty() -> Series:
    f = np.zeros(0)
    return Series(f, np.zeros(0, dtype=np.int8), f, f, f, f, f, f, f, np.zeros(0, dtype=bool),
                  np.zeros(0, dtype=np.int64))


def _identities(block: _Block, rows: Ints, resolved: dict[tuple[str, Any], str], known: dict[str, GpuWear],
                gpu: str | None) -> Iterator[tuple[str, Ints, str | None]]:
    """The rows of each GPU (by ledger UUID, in order of first appearance), resolved as the row path does, with the
    name its first row gives."""
    if not len(rows):
        return
    code = np.zeros(len(rows), dtype=np.int64)
    for name in _IDENTITY:
        c = block.cols.get(name)
        if c is None:
            continue
        assert c.codes is not None and c.distinct is not None
        code = code * (len(c.distinct) + 1) + np.where(c.status[rows] == VALUE, c.codes[rows] + 1, 0)
    keys, first = np.unique(code, return_index=True)
    groups: dict[str, list[Ints]] = {}
    names: dict[str, str | None] = {}
    for key, i in sorted(zip(keys.tolist(), first.tolist(), strict=True), key=lambda p: p[1]):
        row = int(rows[i])
        identity = {name: c.python(row) for name in (*_IDENTITY, "serial") if (c := block.cols.get(name)) is not None
                    and c.status[row] == VALUE}
        item = importer.ImportedRow(int(block.lines[row]), 0.0, importer.gpu_key(identity), identity.get("name"),
                                    {}, identity)
        uuid = ledger_uuid(item, resolved, known, gpu)
        groups.setdefault(uuid, []).append(rows[code == key])
        names.setdefault(uuid, item.name)
    for uuid, parts in groups.items():
        yield uuid, parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts)), names[uuid]

