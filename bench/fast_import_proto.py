"""Research prototype: a columnar `gpuwear import nvidia-smi` (numpy + pyarrow), checked against the row path.

    .venv/bin/python bench/fast_import_proto.py --compare   # prototype vs backfill.import_file, every difference
    .venv/bin/python bench/fast_import_proto.py --speed     # csv floor, import_file, prototype on a 500k-row log
    .venv/bin/python bench/fast_import_proto.py --rss       # RSS of importing numpy / pyarrow in a fresh process
    .venv/bin/python bench/fast_import_proto.py --verify-rainflow  # turning-point reduction == streaming counter

Not part of the package (the daemon must never import numpy/pyarrow). Design, in the order the data flows:

1. read: pyarrow.csv reads every column as strings (one C pass, 2 threads). The header is resolved by the
   importer's own ``_resolve`` (same column table, units, ranks).
2. cells -> values: a quantity column in its header unit goes through a vectorised check (number, optional unit
   equal to the header's) and arrow's string->double cast, then ``* num / den`` as the parser does. Every other
   column (counts, bitmasks, P-states, flags, texts, identity) is dictionary-encoded and each *distinct* cell goes
   through the importer's own per-cell logic (``fast`` -> ``_missing`` -> ``convert``). Cells the vector check
   cannot decide also go through that per-cell logic, one by one. A bad cell makes its row a problem (dropped).
3. per GPU (numpy): coverage skip, duplicate / backwards timestamps, ``validated`` ranges, above-shutdown,
   "no readings" gap rows, cadence -> max_gap, the one-late spike filter (vectorised exactly, see _spikes),
   dt / gap calls, then every additive accumulator as an ordered ``np.bincount``/``np.cumsum`` (both add in row
   order, so sums equal the row path's bit for bit), the thermal-resistance state machine by runs, and rainflow by
   feeding only turning points to the same ``RainflowCounter.push``.
Unsupported inputs (rows of a different width, a quoted cell after ", ", a non-UTC zone with repeated hours...)
raise ``Unsupported``; the real implementation would then use the row path for that file.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "daemon"))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.csv as pacsv  # noqa: E402

from gpuwear import backfill, importer  # noqa: E402
from gpuwear.config import WearConfig  # noqa: E402
from gpuwear.ledger import Ledger  # noqa: E402
from gpuwear.sample import CLOCK_EVENT_REASONS, PHYSICAL_RANGES  # noqa: E402
from gpuwear.wear.accumulate import (  # noqa: E402
    IDLE_UTILIZATION, STEADY_MIN_WATTS_ABOVE_IDLE, STEADY_SECONDS, STEADY_UTILIZATION, FanWear, GpuWear, cycle_key)
from gpuwear.wear.plausibility import (  # noqa: E402
    DEFAULT_SHUTDOWN_CELSIUS, SHUTDOWN_MARGIN_CELSIUS, SPIKE_CELSIUS, SPIKE_SECONDS)
from gpuwear.wear.rainflow import RainflowCounter  # noqa: E402


class Unsupported(Exception):
    """The prototype does not handle this file: the real implementation falls back to the row path."""


ABSENT, VALUE, BAD = 0, 1, 2
_NUM_RE = r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$"
_WALL_RE = (r"^(?P<y>\d{4})[-/](?P<mo>\d{1,2})[-/](?P<d>\d{1,2})[ T](?P<h>\d{1,2}):(?P<mi>\d{2}):(?P<s>\d{2})"
            r"(?:[.,](?P<f>\d+))?$")
HEALTH = ("ecc_enabled", "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
          "ecc_uncorrected_aggregate", "retired_pages_single_bit", "retired_pages_double_bit",
          "retired_pages_pending", "remapped_rows_corrected", "remapped_rows_uncorrected",
          "remapped_rows_pending", "remapped_rows_failure", "pcie_replays", "recovery_action")
_NOT_VECTORISED = ("violation_power_seconds", "violation_thermal_seconds", "fan_speed_rpm",
                   "threshold_shutdown_celsius")


# --- cells -------------------------------------------------------------------------------------------------------


def _cell(raw: str, b: Any) -> tuple[int, Any]:
    """One cell exactly as importer._row treats it (raw: the cell as csv.reader(skipinitialspace) gives it)."""
    if raw not in importer._NOT_READ:
        try:
            return VALUE, b.fast(raw)
        except ValueError:
            pass
    raw = raw.strip()
    if importer._missing(raw) or (raw == "-1" and b.column.minus_one_na):
        return ABSENT, None
    try:
        return VALUE, b.convert(raw)
    except ValueError:
        return BAD, None


class Col:
    """One target's cells: status (ABSENT/VALUE/BAD), a float view (NaN where absent) and, for the unique path,
    the Python values (object array)."""

    def __init__(self, status: np.ndarray, num: np.ndarray, obj: np.ndarray | None) -> None:
        self.status, self.num, self._obj = status, num, obj
        self.codes: np.ndarray | None = None  # unique path: index into distinct, per row
        self.distinct: np.ndarray | None = None
        self.isbool: np.ndarray | None = None  # where the value is a flag (None: none is)

    @property
    def obj(self) -> np.ndarray | None:
        """The Python values per row (unique path only; built when first asked for)."""
        if self._obj is None and self.distinct is not None:
            self._obj = self.distinct[self.codes]
        return self._obj

    @obj.setter
    def obj(self, value: np.ndarray | None) -> None:
        self._obj = value

    def python(self, row: int) -> Any:
        return self.distinct[self.codes[row]] if self._obj is None and self.distinct is not None else self.obj[row]

    @property
    def unique_path(self) -> bool:
        return self._obj is not None or self.distinct is not None


def _as_float(v: Any) -> float:
    if v is None:
        return math.nan
    if isinstance(v, tuple):  # fan_speed_ratio (ratio,)
        v = v[0]
        return math.nan if v is None else float(v)
    if isinstance(v, (bool, str)):
        return math.nan
    return float(v)


def _unique_path(arr: pa.Array, b: Any) -> Col:
    enc = pc.dictionary_encode(arr).combine_chunks() if isinstance(arr, pa.ChunkedArray) else pc.dictionary_encode(arr)
    codes = enc.indices.to_numpy(zero_copy_only=False)
    st, vals = [], []
    for raw in enc.dictionary.to_pylist():
        if raw[:1] == " ":
            raw = raw.lstrip(" ")
        if raw[:1] == '"':
            raise Unsupported("a quoted cell after ', ' (csv skipinitialspace semantics)")
        s, v = _cell(raw, b)
        st.append(s)
        vals.append(v)
    status = np.array(st, dtype=np.int8)[codes]
    obj = np.empty(len(vals), dtype=object)
    obj[:] = vals
    num = np.array([_as_float(v) for v in vals], dtype=np.float64)[codes] if vals else np.zeros(0)
    col = Col(status, num, None)
    col.codes, col.distinct = codes, obj
    col.isbool = np.array([v.__class__ is bool for v in vals], dtype=bool)[codes] if any(
        v.__class__ is bool for v in vals) else None
    return col


_MARKERS = pa.array(["", "N/A", "n/a", "Not Supported", "not supported", "[N/A]", "[Not Supported]"])


def _vector_path(arr: pa.ChunkedArray, b: Any) -> Col:
    """A quantity column in its header unit. First a cheap attempt: the usual "not read" markers out, the unit
    suffix (as the first such cell writes it) cut, arrow's cast; any cell that attempt cannot take sends the
    whole column through the careful path (regexes, then the importer's per-cell logic for what is left)."""
    kind, unit = b.column.kind, b.unit
    num_, den = kind.units[unit]
    s = pc.ascii_trim_whitespace(arr)
    s = s.combine_chunks() if isinstance(s, pa.ChunkedArray) else s
    if unit:
        suffix = None
        for cell in s.slice(0, 64).to_pylist():
            if cell.lower().endswith(" " + unit):
                suffix = cell[-len(unit) - 1:]
                break
        suffix = suffix or " " + unit
        number = pc.if_else(pc.ends_with(s, pattern=suffix), pc.utf8_slice_codeunits(s, 0, -len(suffix)), s)
    else:
        number = s
    missing = pc.is_in(s, value_set=_MARKERS)
    if b.column.minus_one_na:
        missing = pc.or_(missing, pc.equal(s, "-1"))
    try:
        v = pc.cast(pc.if_else(missing, pa.scalar(None, pa.string()), number), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        v = None
    if v is not None:
        vals = v.to_numpy(zero_copy_only=False)
        present = ~_bool_np(missing)
        if np.all(np.abs(vals[present]) < 1e300):  # nan, inf, 1e999: the careful path
            status = present.astype(np.int8)  # VALUE == 1
            out = vals * float(num_) / float(den)
            out[~present] = np.nan
            return Col(status, out, None)
    return _careful_vector_path(arr, b)


def _careful_vector_path(arr: pa.ChunkedArray, b: Any) -> Col:
    kind, unit = b.column.kind, b.unit
    num_, den = kind.units[unit]
    s = pc.utf8_trim_whitespace(arr)
    pattern = " " + unit
    has_unit = pc.ends_with(s, pattern=pattern, ignore_case=True)
    number = pc.if_else(has_unit, pc.utf8_slice_codeunits(s, 0, -len(pattern)), s)
    valid = pc.match_substring_regex(number, _NUM_RE)
    missing = pc.or_(pc.and_(pc.starts_with(s, "["), pc.ends_with(s, "]")),
                     pc.match_substring_regex(s, "^(?:|n/a|not supported)$", ignore_case=True))
    if b.column.minus_one_na:
        minus = pc.equal(s, "-1")
        missing = pc.or_(missing, minus)
        valid = pc.and_(valid, pc.invert(minus))
    v = pc.cast(pc.if_else(valid, number, pa.scalar(None, pa.string())), pa.float64())
    vals = v.to_numpy(zero_copy_only=False) if isinstance(v, pa.Array) else v.combine_chunks().to_numpy(
        zero_copy_only=False)
    vals = np.where(np.isnan(vals), np.nan, vals)
    valid_np = _bool_np(valid)
    missing_np = _bool_np(missing)
    valid_np &= np.abs(vals) < 1e300  # the fast path refuses these; the strict one decides (below)
    status = np.where(valid_np, VALUE, ABSENT).astype(np.int8)
    out = vals * float(num_) / float(den)
    out[~valid_np] = np.nan
    left = np.flatnonzero(~valid_np & ~missing_np)
    if len(left):  # cells the vector check cannot decide: the importer's own logic, one by one
        raw = arr.take(pa.array(left)).to_pylist()
        for i, cell in zip(left.tolist(), raw):
            st, val = _cell(cell.lstrip(" "), b)
            status[i] = st
            out[i] = _as_float(val) if st == VALUE else math.nan
    return Col(status, out, None)


def _bool_np(a: Any) -> np.ndarray:
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    return a.to_numpy(zero_copy_only=False).astype(bool)


def _timestamps(arr: pa.ChunkedArray, bound: Any, tz: datetime.tzinfo | None) -> tuple[np.ndarray, np.ndarray]:
    """Unix seconds and a problem mask. UTC: vectorised (integer microseconds / 1e6: the same correctly rounded
    division as timedelta.total_seconds()); other zones and odd cells: importer._timestamp per distinct cell."""
    n = len(arr)
    ts = np.full(n, np.nan)
    bad = np.zeros(n, dtype=bool)
    s = pc.utf8_trim_whitespace(arr)
    done = np.zeros(n, dtype=bool)
    if tz is datetime.timezone.utc:
        s = s.combine_chunks() if isinstance(s, pa.ChunkedArray) else s
        fixed = _fixed_width_wall_clock(s)
        if fixed is not None:
            ok, y, mo, d, h, mi, sec, micro = fixed
        else:
            parts = pc.extract_regex(s, _WALL_RE)
            ok = _bool_np(pc.is_valid(parts))

            def field(name: str) -> np.ndarray:
                f = pc.struct_field(parts, name)
                f = pc.if_else(pc.equal(pc.utf8_length(f), 0), "0", f)
                f = pc.if_else(pc.is_valid(f), f, "0")
                return _int_np(pc.cast(f, pa.int64()))
            y, mo, d, h, mi, sec = (field(k) for k in ("y", "mo", "d", "h", "mi", "s"))
            frac = pc.struct_field(parts, "f")
            frac = pc.if_else(pc.is_valid(frac), frac, "")
            f6 = pc.utf8_slice_codeunits(frac, 0, 6)
            flen = _int_np(pc.utf8_length(f6))
            fval = _int_np(pc.cast(pc.if_else(pc.equal(pc.utf8_length(f6), 0), "0", f6), pa.int64()))
            micro = fval * (10 ** (6 - flen))
        if ok.any():
            mdays = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])
            leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
            good = ok & (y >= 1) & (mo >= 1) & (mo <= 12) & (h < 24) & (mi < 60) & (sec < 60)
            dim = np.where(good, mdays[np.clip(mo - 1, 0, 11)] + ((mo == 2) & leap), 0)
            good &= (d >= 1) & (d <= dim)
            # days from civil (Howard Hinnant)
            yy = y - (mo <= 2)
            era = np.floor_divide(yy, 400)
            yoe = yy - era * 400
            mp = (mo + 9) % 12
            doy = (153 * mp + 2) // 5 + d - 1
            doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
            days = era * 146097 + doe - 719468
            us = ((days * 86400 + h * 3600 + mi * 60 + sec) * 1_000_000 + micro)
            ts = np.where(good, us.astype(np.float64) / 1e6, np.nan)
            done = good
    rest = np.flatnonzero(~done)
    if len(rest):
        cells = s.take(pa.array(rest)).to_pylist()
        cache: dict[str, Any] = {}
        for i, cell in zip(rest.tolist(), cells):
            r = cache.get(cell)
            if r is None:
                try:
                    r = cache[cell] = importer._timestamp(cell, bound, tz)
                except (ValueError, OverflowError):
                    r = cache[cell] = (None, None)
            if r[0] is None:
                bad[i] = True
            else:
                if r[1] is not None:
                    raise Unsupported("a repeated local hour (DST): the order-dependent 'later' rule")
                ts[i] = r[0]
    return ts, bad


def _fixed_width_wall_clock(s: pa.Array) -> tuple[np.ndarray, ...] | None:
    """nvidia-smi's 'YYYY/MM/DD HH:MM:SS.mmm' when every cell has the same width: digits read straight from
    arrow's buffer as an (n, width) byte matrix. None: not that shape (the regex path decides)."""
    n = len(s)
    if n == 0 or s.null_count:
        return None
    offsets = np.frombuffer(s.buffers()[1], dtype=np.int32)[s.offset:s.offset + n + 1]
    width = int(offsets[1] - offsets[0])
    if width < 19 or width == 20 or width > 40 or int(offsets[-1] - offsets[0]) != n * width:
        return None
    if not np.all(np.diff(offsets) == width):
        return None
    data = np.frombuffer(s.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[0] + n * width].reshape(n, width)
    digit_cols = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18] + list(range(20, width))
    dg = data[:, digit_cols].astype(np.int64) - 48
    ok = np.all((dg >= 0) & (dg <= 9), axis=1)
    sep = data[:, [4, 7, 10, 13, 16]]
    ok &= np.isin(sep[:, 0], (45, 47)) & np.isin(sep[:, 1], (45, 47)) & np.isin(sep[:, 2], (32, 84))
    ok &= (sep[:, 3] == 58) & (sep[:, 4] == 58)
    if width > 19:
        ok &= np.isin(data[:, 19], (44, 46))

    def num(cols: list[int]) -> np.ndarray:
        v = np.zeros(n, dtype=np.int64)
        for c in cols:
            v = v * 10 + (data[:, c].astype(np.int64) - 48)
        return v
    y, mo, d, h, mi, sec = num([0, 1, 2, 3]), num([5, 6]), num([8, 9]), num([11, 12]), num([14, 15]), num([17, 18])
    frac = list(range(20, min(width, 26)))
    micro = num(frac) * 10 ** (6 - len(frac)) if frac else np.zeros(n, dtype=np.int64)
    return ok, y, mo, d, h, mi, sec, micro


def _int_np(a: Any) -> np.ndarray:
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    return a.to_numpy(zero_copy_only=False).astype(np.int64)


def read_columns(path: Path, *, columns: list[str] | None = None, tz: datetime.tzinfo | None = None) -> dict[str, Any]:
    """The file as columns: ts, problem mask, one Col per target (ranks merged), like importer._row per row."""
    with path.open("rb") as fh:
        head = fh.read(3)
        start = 3 if head.startswith(b"\xef\xbb\xbf") else 0
        fh.seek(start)
        first_line = fh.readline().decode("utf-8")
    first = next(csv.reader([first_line], skipinitialspace=True))
    if importer._looks_like_header(first):
        layout, skip = importer._resolve(first), 1
    elif columns is not None:
        layout, skip = importer._resolve(columns), 0
    else:
        raise Unsupported("no header")
    try:
        table = pacsv.read_csv(
            path, read_options=pacsv.ReadOptions(skip_rows=skip, autogenerate_column_names=True),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(column_types={f"f{i}": pa.string() for i in range(layout.width)},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False,
                                                 null_values=[]))
    except pa.ArrowInvalid as exc:
        raise Unsupported(f"not a rectangular CSV for arrow: {exc}") from None
    if table.num_columns != layout.width:
        raise Unsupported("width")
    n = table.num_rows
    ts, bad = _timestamps(table.column(layout.time.index), layout.time, tz)
    cols: dict[str, Col] = {}
    for index, name, _identity, _fast, b in layout.plan:
        arr = table.column(index)
        if b.column.kind.units and b.unit in b.column.kind.units and not b.identity:
            col = _vector_path(arr, b)
        else:
            col = _unique_path(arr, b)
        prev = cols.get(name)
        if prev is None:
            cols[name] = col
            continue
        # a higher-ranked column gave this field (or made the row a problem): this cell is not read
        take = (prev.status == ABSENT) & (col.status != ABSENT)
        prev.status = np.where(take, col.status, prev.status).astype(np.int8)
        prev.num = np.where(take, col.num, prev.num)
        if prev.unique_path or col.unique_path:
            po = prev.obj if prev.unique_path else np.array(prev.num, dtype=object)
            co = col.obj if col.unique_path else np.array(col.num, dtype=object)
            prev.codes = prev.distinct = None
            prev.obj = np.where(take, co, po)
        if prev.isbool is not None or col.isbool is not None:
            prev.isbool = np.where(take, col.isbool if col.isbool is not None else False,
                                   prev.isbool if prev.isbool is not None else False)
    for c in cols.values():
        bad |= c.status == BAD
    # a repeated header row (several nvidia-smi runs appended): the row path switches layout; same layout = skip
    if bad.any():
        for i in np.flatnonzero(bad)[:1000].tolist():
            cells = [table.column(j)[i].as_py().lstrip(" ") for j in range(layout.width)]
            if importer._looks_like_header(cells):
                if importer._resolve(cells) != layout:
                    raise Unsupported("a header row with another layout")
    return {"n": n, "ts": ts, "problem": bad, "cols": cols, "layout": layout}


# --- per-GPU pipeline --------------------------------------------------------------------------------------------


def turning_points(x: np.ndarray) -> np.ndarray:
    """The points a hysteresis rainflow counter can react to: repeats and strictly monotonic interior points are
    dropped (the first and last points kept). See verify_rainflow."""
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


def _spikes(ts: np.ndarray, temp: np.ndarray, is_reading: np.ndarray) -> np.ndarray:
    """SpikeFilter over an entry stream (readings and breaks), exactly: a reading's 'before' is the previous
    reading with a temperature since the last break, unless that one was a spike, in which case this one cannot
    be (the spike's next reading came back within SPIKE_CELSIUS/3 of the spike's own 'before')."""
    n = len(ts)
    has = is_reading & ~np.isnan(temp)
    seg = np.cumsum(~is_reading)  # breaks reset the filter
    idx = np.where(has, np.arange(n), -1)
    prev = np.maximum.accumulate(np.concatenate([[-1], idx[:-1]]))  # previous entry with a temperature
    prev_ok = (prev >= 0)
    prev_c = np.where(prev_ok, seg[np.clip(prev, 0, None)] == seg, False)
    nxt = np.arange(1, n + 1)
    nxt_ok = np.zeros(n, dtype=bool)
    nxt_ok[:-1] = has[1:]  # the next item pushed must be a reading with a temperature (a break flushes: no spike)
    cand = has & prev_c & nxt_ok
    cand_i = np.flatnonzero(cand)
    if not len(cand_i):
        return np.zeros(n, dtype=bool)
    p, k = prev[cand_i], nxt[cand_i]
    t, c = ts[cand_i], temp[cand_i]
    t0, c0, tn, cn = ts[p], temp[p], ts[k], temp[k]
    up, down = c - c0, c - cn
    sp = ((t - t0 <= SPIKE_SECONDS) & (tn - t <= SPIKE_SECONDS) & (np.abs(up) >= SPIKE_CELSIUS)
          & (np.abs(down) >= SPIKE_CELSIUS) & ((up > 0) == (down > 0)) & (np.abs(cn - c0) <= SPIKE_CELSIUS / 3))
    out = np.zeros(n, dtype=bool)
    for i, pi in zip(cand_i[sp].tolist(), p[sp].tolist()):  # in order: a spike's successor is never one
        if not out[pi]:
            out[i] = True
    return out


def _first_of_each(codes: np.ndarray, rows: np.ndarray) -> list[int]:
    """A row for each distinct code."""
    if not len(codes):
        return []
    _, first = np.unique(codes, return_index=True)
    return rows[first].tolist()


def _small_unique(a: np.ndarray) -> list[int]:
    """The distinct values of an array that holds a few (GPUs): without sorting it."""
    out: list[int] = []
    rest = a
    while len(rest):
        v = int(rest[0])
        out.append(v)
        rest = rest[rest != v]
        if len(out) > 64:
            return np.unique(a).tolist()
    return out


def _runs(mask: np.ndarray, breaks: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of maximal runs of True in mask, also cut where breaks is True (a break before that row)."""
    starts = np.flatnonzero(mask & (np.concatenate([[True], ~mask[:-1]]) | breaks))
    out: list[tuple[int, int]] = []
    if not len(starts):
        return out
    # end of a run: next False, or next start
    falses = np.flatnonzero(~mask)
    nxt_false = np.searchsorted(falses, starts, side="right")
    for j, s in enumerate(starts.tolist()):
        e1 = int(falses[nxt_false[j]]) if nxt_false[j] < len(falses) else len(mask)
        e2 = int(starts[j + 1]) if j + 1 < len(starts) else len(mask)
        out.append((s, min(e1, e2)))
    return out


def _ordered_sum(values: np.ndarray) -> float:
    """Python's left-to-right sum from 0.0 (np.sum is pairwise: it differs in the last bits)."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0


def _bins(keys: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """{str(key): sum of weights in row order} (np.bincount adds each row in order, like dict += )."""
    if not len(keys):
        return {}
    lo = int(keys.min())
    sums = np.bincount(keys - lo, weights=weights)
    counts = np.bincount(keys - lo)
    return {str(k + lo): float(sums[k]) for k in np.flatnonzero(counts).tolist()}


def _accumulate(w: GpuWear, ts: np.ndarray, cols: dict[str, Col], rows: np.ndarray, spike: np.ndarray,
                is_reading: np.ndarray, kinds: np.ndarray, max_gap: float, shutdown_masked: np.ndarray,
                names: np.ndarray | None) -> int:
    """Integrate the entry stream (rows: file row per entry; kinds 0 reading, 1 gap, 2 covered) into w."""
    r_pos = np.flatnonzero(is_reading)
    nr = len(r_pos)
    if nr == 0:
        return 0
    rr = rows[r_pos]
    t = ts[rr]
    # breaks before each reading, and the last break's kind
    brk_count = np.cumsum(~is_reading)
    before = brk_count[r_pos]
    brk = np.empty(nr, dtype=bool)
    brk[0] = before[0] > 0
    brk[1:] = before[1:] != before[:-1]
    last_break_kind = np.zeros(nr, dtype=np.int8)
    if (~is_reading).any():
        bidx = np.flatnonzero(~is_reading)
        j = np.searchsorted(bidx, r_pos) - 1
        last_break_kind = np.where(j >= 0, kinds[bidx[np.clip(j, 0, None)]], 0)
    d = np.empty(nr)
    d[0] = 0.0
    d[1:] = t[1:] - t[:-1]
    gapcall = np.zeros(nr, dtype=bool)
    gapsec = np.zeros(nr)
    gb = brk & (last_break_kind == 1)
    gb[0] = False  # no reading before: gap_from is None
    gapcall |= gb
    gapsec[gb] = d[gb]
    cont = ~brk
    cont[0] = False
    big = cont & (d > max_gap)
    gapcall |= big
    gapsec[big] = d[big]
    dt = np.where(cont & ~big, d, 0.0)
    meas = dt > 0
    pos = gapsec > 0
    w.gap_seconds += _ordered_sum(gapsec[pos])
    w.gaps += int(pos.sum())
    w.first_seen, w.last_seen = float(t[0]), float(t[-1])
    if names is not None:  # the first non-empty name of a reading integrated
        has = np.flatnonzero(names.status[rr] == VALUE)
        for i in has[:1000].tolist():
            v = names.python(int(rr[i]))
            if v:
                w.name = w.name or v
                break

    def val(name: str) -> np.ndarray:
        c = cols.get(name)
        return np.full(nr, np.nan) if c is None else c.num[rr]

    def ok(name: str) -> np.ndarray:  # present and believed (validated) -> a value, not None
        c = cols.get(name)
        if c is None:
            return np.zeros(nr, dtype=bool)
        present = c.status[rr] == VALUE
        lohi = PHYSICAL_RANGES.get(name)
        if lohi is not None:
            x = c.num[rr]
            inr = (lohi[0] <= x) & (x <= lohi[1])
            if c.isbool is not None:
                inr |= c.isbool[rr]
            present = present & inr
        return present

    temp_g = np.where(ok("temperature_gpu_celsius") & ~shutdown_masked[rr] & ~spike[r_pos],
                      val("temperature_gpu_celsius"), np.nan)
    temp_m = np.where(ok("temperature_memory_celsius"), val("temperature_memory_celsius"), np.nan)
    power = np.where(ok("power_watts"), val("power_watts"), np.nan)
    limit = np.where(ok("power_limit_watts"), val("power_limit_watts"), np.nan)
    util = np.where(ok("utilization_gpu_ratio"), val("utilization_gpu_ratio"), np.nan)
    energy = np.where(ok("energy_joules"), val("energy_joules"), np.nan)
    fan_present = (cols["fan_speed_ratio"].status[rr] == VALUE) if "fan_speed_ratio" in cols else np.zeros(nr, bool)
    fan = np.where(ok("fan_speed_ratio"), val("fan_speed_ratio"), np.nan)
    reasons_present = ok("clock_event_reasons")
    for name in _NOT_VECTORISED:
        if name in cols and (cols[name].status == VALUE).any():
            raise Unsupported(f"column {name}")
    # seen
    seen_groups = (("clock_event_reasons", reasons_present.any()), ("temperature_memory", (~np.isnan(temp_m)).any()),
                   ("ecc", ok("ecc_enabled").any() or ok("ecc_uncorrected_volatile").any()
                    or ok("ecc_uncorrected_aggregate").any()),
                   ("fans", fan_present.any()), ("power", (~np.isnan(power)).any()),
                   ("utilization", (~np.isnan(util)).any()))
    for g, present in seen_groups:
        if present:
            w.seen[g] = 1
    # thresholds, health: the last value read
    lim_i = np.flatnonzero(~np.isnan(limit))
    if len(lim_i):
        w.thresholds["power_limit_watts"] = float(limit[lim_i[-1]])
    for name in HEALTH:
        if name in cols:
            o = ok(name)
            ii = np.flatnonzero(o)
            if len(ii):
                c = cols[name]
                w.health[name] = c.python(int(rr[ii[-1]])) if c.unique_path else float(c.num[rr[ii[-1]]])
    if (~np.isnan(temp_m)).any():
        w.health["memory_temperature_reported"] = True
    # rainflow: all readings (baselines too), turning points only
    for sensor, temp in (("gpu", temp_g), ("memory", temp_m)):
        series = temp[~np.isnan(temp)]
        if not len(series):
            continue
        counter = w.rainflow.setdefault(sensor, RainflowCounter(w.gate_celsius))
        hist = w.cycles.get(sensor)
        closed: list[tuple[float, float, float]] = []
        for x in turning_points(series).tolist():
            counter.push(x, closed.append)
        for c in closed:
            hist = w.cycles.setdefault(sensor, {})
            k = cycle_key(c)
            hist[k] = hist.get(k, 0.0) + c[2] * 1.0
    # additive accumulators over measured intervals
    m = meas
    dtm = dt[m]
    w.observed_seconds += _ordered_sum(dtm)
    um = util[m]
    sel = ~np.isnan(um)
    if sel.any():
        keys = np.rint(um[sel] * 100).astype(np.int64)
        for k, v in _bins(keys, dtm[sel]).items():
            w.utilization_seconds[k] = w.utilization_seconds.get(k, 0.0) + v
    for sensor, temp in (("gpu", temp_g), ("memory", temp_m)):
        tm = temp[m]
        sel = ~np.isnan(tm)
        if sel.any():
            keys = np.floor(tm[sel] + 0.5).astype(np.int64)
            hist = w.temperature_seconds.setdefault(sensor, {})
            for k, v in _bins(keys, dtm[sel]).items():
                hist[k] = hist.get(k, 0.0) + v
    pm = power[m]
    has_p = ~np.isnan(pm)
    w.power_seconds += _ordered_sum(dtm[has_p])
    lm = limit[m]
    at_limit = has_p & ~np.isnan(lm) & (lm != 0) & (pm >= 0.99 * lm)
    w.power_limit_seconds += _ordered_sum(dtm[at_limit])
    # energy: the counter's delta where this and the previous reading have it, else power * dt
    e_prev = np.empty(nr)
    e_prev[0] = np.nan
    e_prev[1:] = energy[:-1]
    em, epm = energy[m], e_prev[m]
    counter_rows = ~np.isnan(em) & ~np.isnan(epm)
    delta = em - epm
    delta = np.where(delta < 0, em, delta)
    contrib = np.where(counter_rows, delta, np.where(has_p, pm * dtm, 0.0))
    w.energy_joules += _ordered_sum(contrib[counter_rows | has_p])
    w.energy_counter_seconds += _ordered_sum(dtm[counter_rows])
    w.energy_integrated_seconds += _ordered_sum(dtm[~counter_rows & has_p])
    # throttle reasons (bit decode)
    if reasons_present.any():
        c = cols["clock_event_reasons"]
        rm = reasons_present[m]
        masks = np.zeros(nr, dtype=np.int64)
        if c.distinct is not None:
            per = np.array([int(v) if isinstance(v, int) else 0 for v in c.distinct], dtype=np.int64)
            masks[reasons_present] = per[c.codes[rr[reasons_present]]]
        else:
            masks[reasons_present] = np.array([int(v) for v in c.obj[rr[reasons_present]]], dtype=np.int64)
        mm = masks[m]
        for reason, bit in CLOCK_EVENT_REASONS:
            s = rm & ((mm & bit) != 0)
            if s.any():
                w.throttle_seconds[reason] = w.throttle_seconds.get(reason, 0.0) + _ordered_sum(dtm[s])
    # fans: one fan (fan.speed), ratio only
    fp = fan_present[m]
    if fp.any():
        if not w.fans:
            w.fans.append(FanWear())
        fm = fan[m]
        on = np.where(~np.isnan(fm) & (fm > 0), 1.0, 0.0)
        w.fans[0].on_seconds += _ordered_sum((on * dtm)[fp])
        has_r = fp & ~np.isnan(fm)
        w.fans[0].ratio_seconds += _ordered_sum((fm * dtm)[has_r])
    # covered intervals: one run of measured intervals = one interval
    mi = np.flatnonzero(meas)
    if len(mi):
        cut = np.flatnonzero(np.diff(mi) != 1) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [len(mi)]])
        first, last = w.first_seen, w.last_seen
        for a, b in zip(starts.tolist(), ends.tolist()):
            i0, i1 = int(mi[a]), int(mi[b - 1])
            w.cover(max(float(t[i0] - dt[i0]), first), min(float(t[i0]), last))
            if i1 != i0:
                w.cover(float(t[i0]), min(float(t[i1]), last))  # each later interval starts at the last end
    _cooling(w, t, dt, meas, gapcall, temp_g, util, power)
    return nr


def _cooling(w: GpuWear, t: np.ndarray, dt: np.ndarray, meas: np.ndarray, gapcall: np.ndarray, temp: np.ndarray,
             util: np.ndarray, power: np.ndarray) -> None:
    """GpuWear._cooling over the measured intervals: runs of idle / steady-load intervals (cut by invalid rows,
    other kinds of interval and gap() calls); run lengths as per-run cumsums (the row path's own sums)."""
    mi = np.flatnonzero(meas)
    if not len(mi):
        return
    seg = np.cumsum(gapcall)[mi]  # gap() resets the runs and last_celsius
    tt, uu, pp, dd, tm = temp[mi], util[mi], power[mi], dt[mi], t[mi]
    valid = ~np.isnan(tt) & ~np.isnan(uu) & ~np.isnan(pp)
    n = len(mi)
    # last_celsius: t of the previous valid measured interval in the same segment
    vi = np.where(valid, np.arange(n), -1)
    prev = np.maximum.accumulate(np.concatenate([[-1], vi[:-1]]))
    pc_ok = (prev >= 0) & (seg[np.clip(prev, 0, None)] == seg)
    steady = valid & pc_ok & (np.abs(tt - tt[np.clip(prev, 0, None)]) <= 1.0)
    idle = valid & (uu < IDLE_UTILIZATION)
    load = valid & (uu >= STEADY_UTILIZATION)
    seg_start = np.empty(n, dtype=bool)
    seg_start[0] = True
    seg_start[1:] = seg[1:] != seg[:-1]

    def run_sums(mask: np.ndarray) -> np.ndarray:
        out = np.zeros(n)
        for a, b in _runs(mask, seg_start):
            if float(np.add.reduce(dd[a:b])) >= STEADY_SECONDS - 1.0:  # only long runs can reach the threshold
                out[a:b] = np.cumsum(dd[a:b])
        return out

    idle_run = run_sums(idle)
    load_run = run_sums(load)
    upd = idle & (idle_run >= STEADY_SECONDS) & steady
    ui = np.flatnonzero(upd)
    th = w.thermal
    if len(ui):
        th.idle_celsius, th.idle_watts = float(tt[ui[-1]]), float(pp[ui[-1]])
    cand = load & (load_run >= STEADY_SECONDS) & steady
    if not cand.any() or not len(ui):
        return
    last_upd = np.maximum.accumulate(np.where(upd, np.arange(n), -1))
    # the idle state when a load interval is seen: set by the latest update before it (never by itself: idle)
    known = last_upd >= 0
    ic = np.where(known, tt[np.clip(last_upd, 0, None)], np.nan)
    iw = np.where(known, pp[np.clip(last_upd, 0, None)], np.nan)
    cand &= known & (pp - iw >= STEADY_MIN_WATTS_ABOVE_IDLE)
    ci = np.flatnonzero(cand)
    if not len(ci):
        return
    r = (tt[ci] - ic[ci]) / (pp[ci] - iw[ci])
    dci = dd[ci]
    daynum = np.floor(tm[ci] / 86400.0).astype(np.int64)
    # datetime.fromtimestamp rounds to the microsecond: a time a hair before midnight is the next day
    if ((tm[ci] - daynum * 86400.0) > 86400.0 - 1e-5).any():
        raise Unsupported("a resistance interval within 10 us of midnight UTC")
    uniq = np.unique(daynum)
    lo = int(uniq[0])
    s0 = np.bincount(daynum - lo, weights=dci)
    s1 = np.bincount(daynum - lo, weights=r * dci)
    s2 = np.bincount(daynum - lo, weights=r * r * dci)
    for dnum in uniq.tolist():
        day = (datetime.date(1970, 1, 1) + datetime.timedelta(days=dnum)).isoformat()
        acc = w.thermal_resistance.setdefault(day, [0.0, 0.0, 0.0])
        j = dnum - lo
        acc[0] += float(s0[j])
        acc[1] += float(s1[j])
        acc[2] += float(s2[j])


def fast_import(path: Path, ledger: Ledger, params: WearConfig, *, gpu: str | None = None,
                columns: list[str] | None = None, tz: datetime.tzinfo | None = None,
                max_gap: float | None = None, save: bool = True) -> dict[str, GpuWear]:
    """backfill.import_file, columnar. Returns the imported accumulators by UUID (and saves them as imports)."""
    gate = params.cycles.hysteresis_celsius
    known = ledger.load(gate)
    data = read_columns(path, columns=columns, tz=tz)
    n, ts, problem, cols = data["n"], data["ts"], data["problem"], data["cols"]
    ok_rows = np.flatnonzero(~problem)
    # GPU per row: uuid, else PCI bus id, else index; resolved with the name like the row path
    names = cols["name"] if "name" in cols else None
    if gpu is not None and cols.get("uuid") is None:
        groups = {gpu: ok_rows}
        k = set()
        for name in ("pci_bus_id", "index"):
            c = cols.get(name)
            if c is not None:
                pres = ok_rows[c.status[ok_rows] == VALUE]
                k |= {c.python(int(i)) for i in _first_of_each(c.codes[pres], pres)} if c.codes is not None else \
                    {v for v in c.obj[pres].tolist()}
                break
        if len(k) > 1:
            raise importer.ImportFormatError("several GPUs but --gpu names one")
    else:
        # the row's GPU key as a small integer: (uuid, pci, index, name) distinct codes combined
        code = np.zeros(n, dtype=np.int64)
        for name in ("uuid", "pci_bus_id", "index", "name"):
            c = cols.get(name)
            if c is None:
                continue
            if c.codes is None:
                raise Unsupported(f"identity column {name} fed by several columns")
            cc = np.where(c.status == VALUE, c.codes.astype(np.int64), -1) + 1
            code = code * (len(c.distinct) + 1) + cc
        groups = {}
        kc = code[ok_rows]
        firsts = {}
        for k in np.unique(kc).tolist() if len(kc) < 2_000 else _small_unique(kc):
            firsts[k] = ok_rows[kc == k]
        for key_code, rows_j in firsts.items():
            i0 = int(rows_j[0])
            ident = {nm: c.python(i0) for nm, c in cols.items() if c.unique_path and c.status[i0] == VALUE}
            key = (str(ident["uuid"]) if "uuid" in ident else str(ident["pci_bus_id"]) if "pci_bus_id" in ident
                   else f"index:{ident.get('index', 0)}")
            identity = {nm: c.python(i0) for nm, c in cols.items() if c.unique_path and c.status[i0] == VALUE
                        and nm in ("uuid", "pci_bus_id", "index", "name", "serial")}
            item = importer.ImportedRow(i0, 0.0, key, identity.get("name"), {}, identity)
            uuid = gpu if gpu is not None else backfill._resolve(item, known, None)
            groups.setdefault(uuid, [])
            groups[uuid].append(rows_j)
        groups = {u: v[0] if len(v) == 1 else np.sort(np.concatenate(v)) for u, v in groups.items()}
    value_names = [nm for nm in cols if nm not in importer._IDENTITY_FIELDS]
    reading_names = [nm for nm in value_names if not any(p in nm for p in backfill._NOT_READINGS)]
    out: dict[str, GpuWear] = {}
    imports = []
    for uuid, rows in groups.items():
        w = GpuWear(uuid, gate_celsius=gate)
        if uuid in known:
            w.thresholds = dict(known[uuid].thresholds)
        t = ts[rows]
        spans = ledger.covered(uuid)
        covered = np.zeros(len(rows), dtype=bool)
        for a, b in spans:
            covered |= (a <= t) & (t <= b)
        # order: a row at or before the last one taken is dropped (covered rows do not move last_time)
        tn = np.where(covered, -np.inf, t)
        last = np.maximum.accumulate(np.concatenate([[-np.inf], tn[:-1]]))
        accepted = ~covered & (t > last)
        # validated, above shutdown, readings
        shutdown = w.thresholds.get("shutdown")
        limit_c = (DEFAULT_SHUTDOWN_CELSIUS if shutdown is None else shutdown) + SHUTDOWN_MARGIN_CELSIUS
        has_read = np.zeros(len(rows), dtype=bool)
        for nm in reading_names:
            c = cols[nm]
            present = c.status[rows] == VALUE
            lohi = PHYSICAL_RANGES.get(nm)
            if lohi is not None and nm != "fan_speed_ratio":  # a fan tuple (None,) is still a value
                x = c.num[rows]
                inr = (lohi[0] <= x) & (x <= lohi[1])
                if c.isbool is not None:
                    inr |= c.isbool[rows]
                if nm == "temperature_gpu_celsius":
                    inr &= ~(x > limit_c)
                present &= inr
            has_read |= present
        shut = np.zeros(n, dtype=bool)
        if "temperature_gpu_celsius" in cols:
            x = cols["temperature_gpu_celsius"].num
            shut = (x > limit_c) & (x <= PHYSICAL_RANGES["temperature_gpu_celsius"][1])
        entry = covered | accepted
        e_rows = rows[entry]
        kinds = np.where(covered[entry], 2, np.where(has_read[entry], 0, 1)).astype(np.int8)
        is_reading = kinds == 0
        et = ts[e_rows]
        # cadence: the first CADENCE_INTERVALS intervals between consecutive reading entries
        mg = max_gap
        if mg is None:
            both = is_reading[1:] & is_reading[:-1]
            iv = (et[1:] - et[:-1])[both][:backfill.CADENCE_INTERVALS]
            cadence = statistics.median(iv.tolist()) if len(iv) else None
            mg = backfill.gap_threshold(cadence, params.max_gap_seconds)
        temp = np.full(len(e_rows), np.nan)
        if "temperature_gpu_celsius" in cols:
            c = cols["temperature_gpu_celsius"]
            x = c.num[e_rows]
            lo, hi = PHYSICAL_RANGES["temperature_gpu_celsius"]
            good = (c.status[e_rows] == VALUE) & (lo <= x) & (x <= hi) & ~(x > limit_c)
            temp = np.where(good, x, np.nan)
        spike = _spikes(et, temp, is_reading)
        nrows = _accumulate(w, ts, cols, e_rows, spike, is_reading, kinds, mg, shut, names)
        out[uuid] = w
        if w.first_seen is not None:
            imports.append((uuid, str(path), w.first_seen, w.last_seen, nrows, w.to_json()))
    if save:
        ledger.save([], [], imports)
    return out


# --- harnesses ---------------------------------------------------------------------------------------------------


def row_path(path: Path, gpu: str | None, state: Path, **kw: Any) -> dict[str, Any]:
    ledger = Ledger.open(state)
    try:
        backfill.import_file(path, ledger, WearConfig(), gpu=gpu, tz=datetime.timezone.utc, say=lambda s: None, **kw)
        return {u: json.loads(t) for u, t in ledger._db.execute("SELECT uuid, wear FROM imports")}
    finally:
        ledger.close() if hasattr(ledger, "close") else None


def proto_path(path: Path, gpu: str | None, state: Path, **kw: Any) -> dict[str, Any]:
    ledger = Ledger.open(state)
    try:
        fast_import(path, ledger, WearConfig(), gpu=gpu, tz=datetime.timezone.utc, **kw)
        return {u: json.loads(t) for u, t in ledger._db.execute("SELECT uuid, wear FROM imports")}
    finally:
        ledger.close() if hasattr(ledger, "close") else None


def diff(a: Any, b: Any, where: str = "", out: list[str] | None = None, rel: float = 1e-9) -> list[str]:
    out = [] if out is None else out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{where}/{k}: only in {'row path' if k in a else 'prototype'} "
                           f"({a.get(k) if k in a else b.get(k)!r})")
            else:
                diff(a[k], b[k], f"{where}/{k}", out, rel)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{where}[{i}]", out, rel)
    elif isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool) and a != b:
        tag = "ULP-level" if abs(a - b) <= rel * max(abs(a), abs(b)) else "DIFFERENT"
        out.append(f"{where}: {tag} row={a!r} proto={b!r}")
    elif a != b or type(a) is not type(b) and not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        out.append(f"{where}: DIFFERENT row={a!r} proto={b!r}")
    return out


def random_log(path: Path, seed: int, cadence: float, rows: int, gpus: int = 2) -> Path:
    """An nvidia-smi-style log with gaps, spikes, out-of-range and bad cells, [N/A], rows without readings,
    duplicate and backwards timestamps, an energy counter with a reset."""
    rnd = random.Random(seed)
    header = ("timestamp, index, name, uuid, temperature.gpu, temperature.memory, power.draw [W], "
              "power.draw.instant [W], enforced.power.limit [W], fan.speed [%], utilization.gpu [%], "
              "clocks.current.sm [MHz], pstate, clocks_event_reasons.active, ecc.errors.corrected.volatile.total, "
              "memory.used [MiB]")
    t0 = 1_714_550_400.0 + rnd.random() * 1000
    lines = [header]
    state = [{"temp": 40.0 + 5 * g, "util": 0, "t": t0} for g in range(gpus)]
    for i in range(rows):
        g = rnd.randrange(gpus)
        s = state[g]
        r = rnd.random()
        step = cadence * (1 + (rnd.random() - 0.5) * 0.1) if cadence >= 1 else cadence
        if r < 0.005:
            step = cadence * rnd.choice([6, 40, 100, 3000])  # gaps
        elif r < 0.012:
            step = 0.0  # duplicate timestamp
        elif r < 0.015:
            step = -cadence * 2  # backwards
        s["t"] += step
        if rnd.random() < 0.05:
            s["util"] = rnd.choice([0, 2, 50, 85, 97, 100])
        target = 35 + 0.5 * s["util"]
        s["temp"] += (target - s["temp"]) * (0.2 if cadence < 10 else 0.8) + rnd.choice([-1, 0, 0, 1])
        temp = round(s["temp"])
        if rnd.random() < 0.01:
            temp = rnd.choice([140, 5, 200, 90])  # spikes, glitches, out of range
        power = 20 + 4 * s["util"] + rnd.random() * 5
        limit = 400.0
        tm = time.gmtime(s["t"])
        ms = int(round((s["t"] % 1) * 1000)) % 1000
        ts = f"{tm.tm_year:04d}/{tm.tm_mon:02d}/{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}.{ms:03d}"
        na = rnd.random()
        cells = [ts, str(g), "NVIDIA Test GPU", f"GPU-{g:08x}-rand",
                 "[N/A]" if na < 0.01 else str(temp),
                 "N/A" if g == 1 else str(temp + 4),
                 "[N/A]" if na < 0.02 else f"{power:.2f} W",
                 f"{power + 1:.2f} W",
                 f"{limit:.2f} W",
                 "[N/A]" if g == 0 else f"{min(100, 30 + s['util'] // 2)} %",
                 f"{s['util']} %",
                 f"{1410 if s['util'] else 210} MHz",
                 "P0" if s["util"] else "P8",
                 f"0x{(4 if power > 390 else (1 if not s['util'] else 0)):016x}",
                 "0",
                 f"{1000 + s['util'] * 10} MiB"]
        if rnd.random() < 0.004:
            cells[4:] = ["[N/A]"] * 12  # no readings at all
        if rnd.random() < 0.002:
            cells[6] = "hot W"  # a bad row
        if rnd.random() < 0.002:
            cells[6] = "250000 mW"  # another unit: the strict parser's path
        if rnd.random() < 0.002:
            cells[10] = "130 %"  # out of range
        lines.append(", ".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def random_llm_log(path: Path, seed: int, rows: int) -> Path:
    """An llm-gpu-stress NVML logger file (no spaces, -1 = not supported) with an energy counter that resets."""
    rnd = random.Random(seed)
    lines = ["timestamp_ns,gpu_index,name,temperature_C,util_gpu_percent,fan_speed_percent,power_draw_W,"
             "total_energy_mJ"]
    t, temp, util, energy = 1_754_380_800.0, 40.0, 0, 56_490_056_446
    for _ in range(rows):
        t += rnd.choice([0.5, 0.5, 0.51, 0.49]) if rnd.random() > 0.003 else rnd.choice([45.0, 900.0])
        if rnd.random() < 0.03:
            util = rnd.choice([0, 1, 60, 100])
        temp += (35 + 0.45 * util - temp) * 0.05 + rnd.choice([-1, 0, 1]) * 0.5
        power = 15 + 2.5 * util + rnd.random()
        energy += int(power * 500)
        if rnd.random() < 0.001:
            energy = rnd.randrange(1000, 100000)  # driver reload: the counter restarts
        tm = time.gmtime(t)
        ts = (f"{tm.tm_year:04d}-{tm.tm_mon:02d}-{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}."
              f"{int(round((t % 1) * 1000)) % 1000:03d}")
        e = "-1" if rnd.random() < 0.01 else str(energy)
        c = str(round(temp)) if rnd.random() > 0.005 else rnd.choice(["160", "-1", "95"])
        lines.append(f"{ts},0,NVIDIA RTX 6000 Ada Generation,{c},{util},{'-1' if util < 50 else 40},"
                     f"{power:.3f},{e}")
    path.write_text("\n".join(lines) + "\n")
    return path


def compare() -> int:
    traces = sorted((HERE.parent / "tests" / "fixtures" / "traces").glob("*.csv"))
    tmp = Path(tempfile.mkdtemp(prefix="fastproto-"))
    cases = [(f, "GPU-x") for f in traces]
    for seed, cadence, rows in ((1, 1.0, 20000), (2, 60.0, 8000), (3, 1.0, 30000), (4, 60.0, 3000), (5, 0.5, 20000)):
        cases.append((random_log(tmp / f"rand{seed}.csv", seed, cadence, rows), None))
    for seed in (11, 12):
        cases.append((random_llm_log(tmp / f"llm{seed}.csv", seed, 20000), f"GPU-llm{seed}"))
    total = 0
    for f, g in cases:
        a = row_path(f, g, tmp / f"row-{f.stem}")
        t1 = time.perf_counter()
        try:
            b = proto_path(f, g, tmp / f"proto-{f.stem}")
        except Unsupported as exc:
            print(f"{f.name}: UNSUPPORTED {exc}")
            continue
        diffs = diff(a, b)
        exact = sum(1 for d in diffs if "ULP" not in d)
        for u, doc in sorted(a.items()):
            print(f"    {u}: observed {doc['observed_seconds']:.0f}s gaps {doc.get('gaps')} "
                  f"cycles {sum(sum(h.values()) for h in doc.get('cycles', {}).values()):g} "
                  f"R-days {len(doc.get('thermal_resistance', {}))} counter-s {doc.get('energy_counter_seconds', 0):.0f} "
                  f"throttle {len(doc.get('throttle_seconds', {}))} fans {len(doc.get('fans', []))} covered {len(doc.get('covered', {}))}")
        print(f"{f.name}: {len(a)} GPU(s), {len(diffs)} difference(s) ({exact} beyond 1e-9) "
              f"[proto {time.perf_counter() - t1:.2f}s]")
        for d in diffs[:30]:
            print("   ", d)
        total += exact
    # an import over a ledger that already covers part of the time (coverage skip, covered breaks)
    f = tmp / "rand1.csv"
    half = tmp / "half.csv"
    lines = f.read_text().splitlines()
    half.write_text("\n".join(lines[:len(lines) // 2]) + "\n")
    for path, state in ((half, "row-cov"), (half, "proto-cov")):
        row_path(path, None, tmp / state)
    a = row_path(f, None, tmp / "row-cov")
    b = proto_path(f, None, tmp / "proto-cov")
    diffs = diff(a, b)
    print(f"rand1 over a half-covered ledger: {len(diffs)} difference(s)")
    for d in diffs[:30]:
        print("   ", d)
    total += sum(1 for d in diffs if "ULP" not in d)
    print("exact" if total == 0 else f"{total} difference(s) beyond summation order")
    return 0 if total == 0 else 1


def verify_rainflow(n_series: int = 3000) -> int:
    rnd = random.Random(7)
    bad = 0
    for k in range(n_series):
        n = rnd.randrange(1, 300)
        x = [float(round(40 + 10 * math.sin(i / rnd.uniform(2, 30)) + rnd.choice([-2, -1, 0, 0, 1, 2])
                         * rnd.random() * 3, rnd.choice([0, 0, 1]))) for i in range(n)]
        gate = rnd.choice([0.0, 1.0, 2.0, 3.5])
        full, red = RainflowCounter(gate), RainflowCounter(gate)
        c1: list[Any] = []
        c2: list[Any] = []
        for v in x:
            full.push(v, c1.append)
        for v in turning_points(np.array(x)).tolist():
            red.push(v, c2.append)
        if c1 != c2 or full.to_json() != red.to_json():
            bad += 1
    print(f"turning-point reduction: {n_series} random series, {bad} mismatch(es) (cycles and counter state)")
    return 0 if bad == 0 else 1


def csv_floor(path: Path) -> int:
    """bench/import_bench.py floats: csv.reader and float() of the numeric cells (units cut off)."""
    rows = 0
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, skipinitialspace=True)
        next(reader)
        numeric: list[int] | None = None
        for cells in reader:
            rows += 1
            if numeric is None:
                numeric = [i for i, cell in enumerate(cells) if _isnum(cell.partition(" ")[0])]
            for i in numeric:
                try:
                    float(cells[i].partition(" ")[0])
                except ValueError:
                    pass
    return rows


def _isnum(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def speed(rows: int = 500_000) -> int:
    sys.path.insert(0, str(HERE))
    from gen import smi_csv
    tmp = Path(tempfile.mkdtemp(prefix="fastproto-speed-"))
    f = smi_csv(rows, 8, tmp / "big.csv")
    t = time.perf_counter()
    n = csv_floor(f)
    a = time.perf_counter() - t
    t = time.perf_counter()
    fast_import(f, Ledger.open(tmp / "proto0"), WearConfig(), tz=datetime.timezone.utc)
    c0 = time.perf_counter() - t
    t = time.perf_counter()
    ledger = Ledger.open(tmp / "row")
    backfill.import_file(f, ledger, WearConfig(), tz=datetime.timezone.utc, say=lambda s: None)
    b = time.perf_counter() - t
    t = time.perf_counter()
    ledger2 = Ledger.open(tmp / "proto")
    fast_import(f, ledger2, WearConfig(), tz=datetime.timezone.utc)
    c = time.perf_counter() - t
    ra = {u: json.loads(x) for u, x in ledger._db.execute("SELECT uuid, wear FROM imports")}
    rb = {u: json.loads(x) for u, x in ledger2._db.execute("SELECT uuid, wear FROM imports")}
    diffs = diff(ra, rb)
    print(f"rows {n}, {len(ra)} GPUs; same result: {not diffs} ({len(diffs)} diffs, "
          f"{sum(1 for d in diffs if 'ULP' not in d)} beyond 1e-9)")
    for d in diffs[:10]:
        print("   ", d)
    for label, s in (("(a) csv floor", a), ("(b) import_file", b), ("(c) prototype", c),
                     ("(c) first run", c0)):
        print(f"{label:18s} {s:7.2f} s  {n / s:10.0f} rows/s")
    print(f"(c)/(a) speed ratio {a / c:.2f}x (first run {a / c0:.2f}x)   (b)/(a) {a / b:.3f}x   "
          f"(c)/(b) {b / c:.1f}x")
    # where the prototype's time goes
    t = time.perf_counter()
    read_columns(f, tz=datetime.timezone.utc)
    r = time.perf_counter() - t
    print(f"    of which read_columns (arrow read + cell conversion): {r:.2f} s")
    return 0


def rss() -> int:
    code = ("import psutil,sys,json;p=psutil.Process();base=p.memory_info().rss;out={};last=base\n"
            "for m in sys.argv[1:]:\n  __import__(m);r=p.memory_info().rss;out[m]=r-last;last=r\n"
            "print(json.dumps({'base':base,'steps':out,'total':last-base}))")
    py = sys.executable
    for mods in (["numpy"], ["pyarrow"], ["numpy", "pyarrow", "pyarrow.csv", "pyarrow.compute"], ["polars"]):
        r = subprocess.run([py, "-c", code, *mods], capture_output=True, text=True)
        print(mods, r.stdout.strip() or r.stderr.strip()[-200:])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--rss", action="store_true")
    ap.add_argument("--verify-rainflow", action="store_true")
    args = ap.parse_args()
    rc = 0
    if args.verify_rainflow:
        rc |= verify_rainflow()
    if args.compare:
        rc |= compare()
    if args.speed:
        rc |= speed(args.rows)
    if args.rss:
        rc |= rss()
    return rc


if __name__ == "__main__":
    sys.exit(main())
