"""The columnar import (gpuwear.imports.columnar, gpuwear.wear.batch) against the row path (backfill.import_rows), the
reference: the same ledger bit for bit (every float of every accumulator), the same counts and the same messages,
on real traces, generated logs with every kind of trouble, logs split into blocks anywhere, and random logs
(hypothesis). And the daemon never loads numpy or pyarrow."""

from __future__ import annotations

import datetime
import json
import os
import random
import sys
import tempfile
import time
import zoneinfo
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwear.config import Config
from gpuwear.imports import columnar
from gpuwear.imports.backfill import FileResult, import_rows
from gpuwear.imports.reader import import_file
from gpuwear.ledger import Ledger
from gpuwear.wear.batch import turning_points
from gpuwear.wear.rainflow import RainflowCounter
from helpers import examples, free_port, started, wait_for
from logs import random_llm_log, random_log

PARAMS = Config().wear
TRACES = sorted((Path(__file__).parent / "fixtures" / "traces").glob("*.csv"))
UTC = datetime.timezone.utc


def _run(path: Path, state: Path, rows: bool, block_bytes: int | None = None, ledger_from: Path | None = None,
         **kw: Any) -> tuple[dict[str, Any], FileResult, list[str]]:
    """Import with one path; the imports table (uuid -> [wear, first, last, rows]), the result and the messages."""
    if ledger_from is not None:
        state.write_bytes(ledger_from.read_bytes())
    said: list[str] = []
    kw.setdefault("tz", UTC)
    with closing(Ledger.open(state)) as ledger:
        if rows:
            result = import_rows(path, ledger, PARAMS, say=said.append, **kw)
        else:
            result = columnar.import_file(path, ledger, PARAMS, say=said.append,
                                          **({} if block_bytes is None else {"block_bytes": block_bytes}), **kw)
        docs = {uuid: [json.loads(wear), first, last, n] for uuid, wear, first, last, n in ledger._db.execute(
            "SELECT uuid, wear, first, last, rows FROM imports WHERE source = ?", (str(path),))}
    return docs, result, said


def same(path: Path, tmp: Path, block_bytes: int | None = None, ledger_from: Path | None = None,
         **kw: Any) -> tuple[dict[str, Any], FileResult]:
    """Both paths on one file: identical ledgers, counts and messages (the columnar path must take the file)."""
    tag = f"{path.stem}-{block_bytes}-{len(list(tmp.iterdir()))}"
    a, ra, said_a = _run(path, tmp / f"rows-{tag}.db", True, ledger_from=ledger_from, **kw)
    b, rb, said_b = _run(path, tmp / f"cols-{tag}.db", False, block_bytes, ledger_from=ledger_from, **kw)
    assert rb.reader == "columns"
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # every float, exactly
    counts = ("imported", "skipped", "excluded", "cadence", "median_interval", "problems", "dropped")
    assert {k: getattr(ra, k) for k in counts} == {k: getattr(rb, k) for k in counts}
    assert said_a == said_b
    return a, ra


@pytest.mark.slow
@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
@pytest.mark.parametrize("block_bytes", [None, 4096])
def test_real_traces(trace: Path, block_bytes: int | None, tmp_path: Path) -> None:
    docs, result = same(trace, tmp_path, block_bytes, gpu="GPU-trace")
    assert docs["GPU-trace"][0]["observed_seconds"] > 0 and sum(result.imported.values()) > 1000


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "cadence", "rows"), [(1, 1.0, 20000), (2, 60.0, 8000), (3, 1.0, 30000),
                                                        (5, 0.5, 20000)])
def test_generated_logs(seed: int, cadence: float, rows: int, tmp_path: Path) -> None:
    """Gaps, spikes, out-of-range, bad and [N/A] cells, rows without readings, duplicate and backwards times,
    cells in another unit, two GPUs: each kind of trouble is present, and both paths agree."""
    path = random_log(tmp_path / "log.csv", seed, cadence, rows)
    _, result = same(path, tmp_path)
    excluded = sum(result.excluded.values(), start=type(next(iter(result.excluded.values())))())
    assert result.problems > 0 and result.dropped > 0
    assert {"duplicate_timestamp", "no_readings", "above_shutdown"} <= set(excluded)
    if cadence <= 1:
        assert excluded["spike"] > 0 and excluded["memory_spike"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("block_bytes", [1024, 4096, 65536])
def test_blocks_carry_every_state(block_bytes: int, tmp_path: Path) -> None:
    """A log read in small blocks: the cadence, spike, interval, energy-counter, cooling and rainflow states
    cross each block boundary as the row path carries them from row to row."""
    same(random_log(tmp_path / "log.csv", 1, 1.0, 6000), tmp_path, block_bytes)
    same(random_llm_log(tmp_path / "llm.csv", 11, 8000), tmp_path, block_bytes, gpu="GPU-llm")


def test_energy_counter_and_fans(tmp_path: Path) -> None:
    """The llm-gpu-stress logger: an energy counter that restarts, -1 for "not supported", a fan reported only
    under load."""
    docs, _ = same(random_llm_log(tmp_path / "llm.csv", 12, 20000), tmp_path, gpu="GPU-llm")
    wear = docs["GPU-llm"][0]
    assert wear["energy_counter_seconds"] > 0 and wear["energy_integrated_seconds"] > 0 and wear["fans"]


def test_over_a_ledger_that_covers_part(tmp_path: Path) -> None:
    """Rows inside time the ledger already holds are skipped; the intervals around them are breaks."""
    path = random_log(tmp_path / "log.csv", 3, 1.0, 12000)
    half = tmp_path / "half.csv"
    lines = path.read_text().splitlines()
    half.write_text("\n".join(lines[:len(lines) // 2]) + "\n")
    base = tmp_path / "base.db"
    with closing(Ledger.open(base)) as ledger:
        import_rows(half, ledger, PARAMS, tz=UTC, say=lambda _: None)
    _, result = same(path, tmp_path, ledger_from=base)
    assert sum(result.skipped.values()) > 5000


def test_cooling_tracker_runs(tmp_path: Path) -> None:
    """Long idle and steady-load stretches (the thermal-resistance proxy), cut by a gap and a missing reading."""
    lines = ["timestamp, uuid, temperature.gpu, power.draw [W], utilization.gpu [%]"]
    t = datetime.datetime(2026, 3, 1, 23, 0, tzinfo=UTC).timestamp()
    rnd = random.Random(4)
    for phase, seconds in (("idle", 900), ("load", 1500), ("gap", 0), ("idle", 700), ("load", 1200), ("na", 0),
                           ("load", 900)):
        if phase == "gap":
            t += 600
            continue
        for _ in range(seconds):
            t += 1
            load = phase == "load"
            celsius = (70 if load else 35) + rnd.choice([0, 0, 1])
            stamp = datetime.datetime.fromtimestamp(t, UTC).strftime("%Y/%m/%d %H:%M:%S.000")
            power = "[N/A]" if phase == "na" else f"{(300 if load else 30) + rnd.random():.2f} W"
            lines.append(f"{stamp}, GPU-cool, {celsius}, {power}, {95 if load else 0} %")
        if phase == "na":
            lines.append(f"{stamp}, GPU-cool, 70, [N/A], 95 %")
    path = tmp_path / "cool.csv"
    path.write_text("\n".join(lines) + "\n")
    for block_bytes in (None, 2048):
        docs, _ = same(path, tmp_path, block_bytes)
        assert len(docs["GPU-cool"][0]["thermal_resistance"]) == 2  # across midnight UTC


def test_problem_rows(tmp_path: Path) -> None:
    """Rows of the wrong width (the first one too), a truncated last line and a NUL-filled tail (a crash), a bad
    cell, a repeated header (appended runs), a header with a unit that does not fit: said with their line
    numbers, skipped."""
    path = random_log(tmp_path / "log.csv", 7, 1.0, 3000)
    lines = path.read_text().splitlines()
    lines.insert(1, "2024/05/01 10:00:00.000, 0, short first row")  # arrow must not take its width for the file's
    lines.insert(100, "2024/05/01 10:00:00.000, 0, short row")
    lines.insert(200, lines[0])  # the same header again
    lines.insert(300, lines[0].replace("power.draw [W]", "power.draw [kelvin]"))
    lines.insert(400, lines[401].replace(" W,", " kW,", 1).replace(", 0, ", ", zero, ", 1))
    lines.append(lines[-1][:40])
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\0" * 300 + b"\n")
    for block_bytes in (None, 4096):
        _, result = same(path, tmp_path, block_bytes)
        assert result.problems >= 5


@pytest.mark.slow
@pytest.mark.parametrize(("zone", "day"), [("Europe/Berlin", datetime.datetime(2026, 10, 25)),
                                           ("Europe/Berlin", datetime.datetime(2026, 3, 29)),
                                           ("America/New_York", datetime.datetime(2026, 11, 1))])
def test_dst_changes(zone: str, day: datetime.datetime, tmp_path: Path) -> None:
    """A log in local time across a DST change: the repeated hour is its second pass (the rows' order), the
    skipped hour is simply absent; both paths agree, given the zone or taking the machine's (naive times)."""
    tz = zoneinfo.ZoneInfo(zone)
    start = day.replace(hour=0, tzinfo=tz).timestamp()
    lines = ["timestamp, uuid, temperature.gpu, power.draw [W]"]
    for i in range(0, 6 * 3600, 5):
        local = datetime.datetime.fromtimestamp(start + i, tz)
        lines.append(f"{local.strftime('%Y/%m/%d %H:%M:%S')}.{i % 1000:03d}, GPU-dst, {40 + (i // 600) % 30}, 100 W")
    path = tmp_path / "dst.csv"
    path.write_text("\n".join(lines) + "\n")
    docs, result = same(path, tmp_path, tz=tz)
    assert result.problems == 0 and docs["GPU-dst"][0].get("gap_seconds", 0) == 0
    same(path, tmp_path, 4096, tz=tz)
    old = os.environ.get("TZ")
    os.environ["TZ"] = zone  # no --timezone: the machine's zone, through naive datetimes
    time.tzset()
    try:
        docs_naive, _ = same(path, tmp_path, tz=None)
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()
    assert docs_naive == docs


@pytest.mark.parametrize(("what", "change"), [
    ("a blank line", lambda lines: lines.insert(50, "")),
    ("a quoted cell after ', '", lambda lines: lines.__setitem__(60, lines[60].replace(", NVIDIA Test GPU,",
                                                                                      ', "NVIDIA, Test GPU",'))),
    ("a header of another layout", lambda lines: lines.insert(70, "timestamp, uuid, temperature.gpu")),
    ("NUL bytes in a column the import does not read", lambda lines: [
        lines.__setitem__(i, lines[i] + (", note" if i == 0 else ", a\0b" if i == 80 else ", ok"))
        for i in range(len(lines))]),
])
def test_the_row_path_takes_what_columns_cannot(what: str, change: Any, tmp_path: Path) -> None:
    """Inputs the columnar reader cannot read as the row path does: it says so and writes nothing; import_file
    then reads the file row by row (FileResult.reader says why), with the row path's ledger."""
    path = random_log(tmp_path / "log.csv", 9, 1.0, 500)
    lines = path.read_text().splitlines()
    change(lines)
    path.write_text("\n".join(lines) + "\n")
    with closing(Ledger.open(tmp_path / "x.db")) as ledger:
        with pytest.raises(columnar.ColumnarError):
            columnar.import_file(path, ledger, PARAMS, tz=UTC, say=lambda _: None)
        assert ledger._db.execute("SELECT count(*) FROM imports").fetchone() == (0,)
    said: list[str] = []
    with closing(Ledger.open(tmp_path / "y.db")) as ledger:
        result = import_file(path, ledger, PARAMS, tz=UTC, say=said.append)
    assert result.reader.startswith("rows: ")
    expected, _, said_rows = _run(path, tmp_path / "z.db", True)
    with closing(Ledger.open(tmp_path / "y.db")) as ledger:
        got = {u: json.loads(w) for u, w in ledger._db.execute("SELECT uuid, wear FROM imports")}
    assert got == {u: v[0] for u, v in expected.items()} and said == said_rows


CELLS = {  # what a cell of each column can hold, the awkward included
    "temperature.gpu": ["45", "46", "47", "60", "61", "75", "140", "0", "200", "-41", "[N/A]", "N/A", "",
                        "[GPU is lost]", "1e999", "nan", "+45", "45.", ".5", "4_5", "hot", "-1"],
    "temperature.memory": ["50", "51", "52", "70", "71", "90", "0", "140", "[N/A]", "-50"],
    "power.draw [W]": ["100.00 W", "250.5 W", "300 W", "299.9 w", "250000 mW", "1.5 kW", "[N/A]", "[Not Supported]",
                       "6000 W", "-5 W", "W", "1e3 W", "inf W", "12", "12  W", "0x10 W", "Infinity"],
    "enforced.power.limit [W]": ["300.00 W", "250.00 W", "0 W", "[N/A]"],
    "utilization.gpu [%]": ["0 %", "5 %", "85 %", "100 %", "130 %", "[N/A]", "50"],
    "fan.speed [%]": ["30 %", "0 %", "250 %", "[N/A]"],
    "clocks_event_reasons.active": ["0x0000000000000000", "0x0000000000000004", "0x0000000000000041",
                                    "0xffffffffffffffffffff", "4", "[N/A]", "0xZZ"],
    "pstate": ["P0", "P8", "P16", "[N/A]", "X"],
    "ecc.errors.corrected.volatile.total": ["0", "3", "99999999999999", "[N/A]", "-2"],
    "ecc.mode.current": ["Enabled", "Disabled", "[N/A]", "maybe"],
}
STEPS = [1.0, 1.0, 1.0, 0.5, 2.0, 0.0, -3.0, 45.0, 700.0, 4000.0]


@st.composite
def logs(draw: st.DrawFn) -> tuple[str, int]:
    """A small nvidia-smi log of 1-3 GPUs with random cells and steps (dups, back in time, gaps), now and then a
    row cut short or one too long, the header again, a line of spaces; and a block size (512 bytes and up: block
    boundaries anywhere)."""
    header = ["timestamp", "uuid", *CELLS]
    times = [1_761_000_000.0 + draw(st.integers(0, 86400))] * 3
    lines = [", ".join(header)]
    for _ in range(draw(st.integers(1, 300))):
        gpu = draw(st.integers(0, draw(st.integers(0, 2))))
        times[gpu] += draw(st.sampled_from(STEPS))
        t = times[gpu]
        stamp = datetime.datetime.fromtimestamp(t, UTC).strftime("%Y/%m/%d %H:%M:%S") + f".{int(t * 1000) % 1000:03d}"
        cells = [draw(st.sampled_from(values[:6])) if draw(st.booleans()) else draw(st.sampled_from(values))
                 for values in CELLS.values()]
        line = ", ".join([stamp, f"GPU-{gpu}", *cells])
        lines.append(draw(st.sampled_from([line] * 30 + [line[:25], line + ", 1", lines[0], "  "])))
    return "\n".join(lines) + "\n", draw(st.sampled_from([512, 1000, 4096, 1 << 22]))


@pytest.mark.parametrize("block_bytes", [512, 4096, 1 << 22])
def test_a_log_whose_cadence_changes_is_judged_stretch_by_stretch(tmp_path: Path, block_bytes: int) -> None:
    """Issue 30: 300 rows at 1 s, then two hours at 60 s (``nvidia-smi -l 1``, then ``-l 60``). The log's
    threshold comes from its first 200 intervals (1 s: 30 s), so every 60 s interval was a gap: 7,200 s
    unobserved, no energy, no heat. Each interval is now also judged by the five before it: the 60 s stretch is
    observed time once it has shown its cadence (its first three intervals are gaps), in both readers alike. A
    threshold given by the user is used alone."""
    start = 1_761_000_000.0
    times = [start + i for i in range(300)] + [start + 299 + 60 * i for i in range(1, 121)]
    lines = ["timestamp, uuid, temperature.gpu, power.draw [W]"]
    utc = datetime.timezone.utc
    lines += [datetime.datetime.fromtimestamp(t, utc).strftime("%Y/%m/%d %H:%M:%S.000") + ", GPU-x, 60, 200"
              for t in times]
    path = tmp_path / "mixed.csv"
    path.write_text("\n".join(lines) + "\n")
    docs, result = same(path, tmp_path, block_bytes)
    doc = docs["GPU-x"][0]
    assert doc["observed_seconds"] == 299 + 117 * 60 and doc["gap_seconds"] == 3 * 60, doc["gap_seconds"]
    assert doc["gaps"] == 3 and result.cadence["GPU-x"] == (1.0, 30.0)
    given, _ = same(path, tmp_path, block_bytes, max_gap=30.0)
    assert given["GPU-x"][0]["observed_seconds"] == 299 and given["GPU-x"][0]["gap_seconds"] == 120 * 60


@pytest.mark.parametrize("rows", [
    ["2025/10/20 22:40:01.000, "],  # found by test_random_logs: the columnar path said nothing of it
    ["2025/10/20 22:40:01.000, GPU-x, 40", "2025/10/20 22:40:02.000, GPU-x"],
    ["2025/10/20 22:40:01.000", "2025/10/20 22:40:02.000, GPU-x, 40, 1", "2025/10/20 22:40:03.000"],
], ids=["the only row", "the last row", "first and last"])
@pytest.mark.parametrize("block_bytes", [64, 512, 1 << 22])
def test_rows_of_another_width_are_said_wherever_they_are(rows: list[str], block_bytes: int, tmp_path: Path) -> None:
    """A row of the wrong width is a problem said by both paths, also when no block of rows follows it."""
    path = tmp_path / "log.csv"
    path.write_text("timestamp, uuid, temperature.gpu\n" + "\n".join(rows) + "\n")
    _, result = same(path, tmp_path, block_bytes)
    assert result.problems == sum(len(row.split(",")) != 3 for row in rows)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logs())
def test_random_logs(tmp_path: Path, log: tuple[str, int]) -> None:
    text, block_bytes = log
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    path = folder / "log.csv"
    path.write_text(text)
    same(path, folder, block_bytes)


@pytest.mark.slow
def test_turning_points_from_any_state() -> None:
    """Feeding only the turning points of each piece of a series leaves a rainflow counter, whatever state it
    started from, with the same cycles and state as feeding every point (the reduction wear/batch.py uses)."""
    rnd = random.Random(7)
    for _ in range(3000):
        n = rnd.randrange(1, 300)
        x = [float(round(40 + 10 * np.sin(i / rnd.uniform(2, 30)) + rnd.choice([-2, -1, 0, 0, 1, 2]) * rnd.random() * 3,
                         rnd.choice([0, 0, 1]))) for i in range(n)]
        gate = rnd.choice([0.0, 1.0, 2.0, 3.5])
        full, reduced = RainflowCounter(gate), RainflowCounter(gate)
        c1: list[Any] = []
        c2: list[Any] = []
        for v in x:
            full.push(v, c1.append)
        cuts = sorted(rnd.sample(range(1, n), min(n - 1, rnd.randrange(0, 6)))) if n > 1 else []
        for a, b in zip([0, *cuts], [*cuts, n], strict=True):
            for v in turning_points(np.array(x[a:b])).tolist():
                reduced.push(v, c2.append)
        assert c1 == c2 and full.to_json() == reduced.to_json()


@pytest.mark.slow
def test_the_daemon_never_loads_numpy_or_pyarrow(tmp_path: Path) -> None:
    """The columnar reader is the import command's: a running daemon (sampling, saving, serving a scrape) has
    neither numpy nor pyarrow mapped in its memory."""
    port = free_port()
    with started([sys.executable, "-m", "gpuwear", "run", "--simulate", "--listen", f"127.0.0.1:{port}",
                  "--state-dir", str(tmp_path / "state")], tmp_path / "daemon.log", tmp_path) as daemon:
        wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_temperature_celsius", 30.0)
        maps = Path(f"/proc/{daemon.pid}/maps").read_text()
    assert "numpy" not in maps and "arrow" not in maps
    assert "numpy" in sys.modules  # this test process did load it: the check looks in the right place
