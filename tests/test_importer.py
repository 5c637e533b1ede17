"""The telemetry CSV parser: real nvidia-smi and NVML-logger traces, hand-written edge cases, whole-file errors,
properties (arbitrary lines never raise; generated rows round-trip) and lazy streaming."""

from __future__ import annotations

import csv
import datetime
import itertools
import random
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO
from gpuwear.imports import parse as importer
from gpuwear.imports.parse import ImportedRow, ImportFormatError, RowProblem, read_telemetry_csv, supported_columns
from gpuwear.sample import GpuIdentity, GpuSample
from helpers import examples

TRACES = REPO / "tests" / "fixtures" / "traces"
A100 = TRACES / "a100_load-pulses_12ms_gpu-power-benchmark.csv"
RTX4060 = TRACES / "rtx4060laptop_gpuburn-cycles_1s_llm-gpu-stress.csv"
RTX6000 = TRACES / "rtx6000ada_burst-then-idle_1s_llm-gpu-stress.csv"
UTC = datetime.timezone.utc
MIB = 1 << 20


def utc(*args: int) -> float:
    return datetime.datetime(*args, tzinfo=UTC).timestamp()


def parse(path: Path, **kwargs: Any) -> list[ImportedRow | RowProblem]:
    kwargs.setdefault("tz", UTC)
    return list(read_telemetry_csv(path, **kwargs))


def write(tmp_path: Path, text: str | bytes, name: str = "log.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def rows_of(results: list[ImportedRow | RowProblem]) -> list[ImportedRow]:
    return [r for r in results if isinstance(r, ImportedRow)]


def problems_of(results: list[ImportedRow | RowProblem]) -> list[RowProblem]:
    return [r for r in results if isinstance(r, RowProblem)]


def only_row(path: Path, **kwargs: Any) -> ImportedRow:
    (result,) = parse(path, **kwargs)
    assert isinstance(result, ImportedRow), result
    return result


def only_problem(path: Path, **kwargs: Any) -> RowProblem:
    results = parse(path, **kwargs)
    problems = problems_of(results)
    assert len(problems) == 1, results
    assert "\n" not in problems[0].message
    return problems[0]


# --- real traces -------------------------------------------------------------------------------------------------

TRACE_FACTS = [
    # file, data rows, GPU key, name, temperature min/max (°C), has energy
    (A100, 16002, "index:0", None, (49, 55), False),
    (RTX4060, 22637, "index:0", "NVIDIA GeForce RTX 4060 Laptop GPU", (43, 74), False),
    (RTX6000, 4333, "index:0", "NVIDIA RTX 6000 Ada Generation", (31, 54), True),
]


@pytest.fixture(scope="module")
def traces() -> dict[Path, list[ImportedRow | RowProblem]]:
    return {path: parse(path) for path, *_ in TRACE_FACTS}


@pytest.mark.slow
@pytest.mark.parametrize(("path", "count", "gpu", "name", "temperatures", "energy"), TRACE_FACTS,
                         ids=["a100", "rtx4060laptop", "rtx6000ada"])
def test_real_trace_parses_cleanly(traces: dict[Path, list[ImportedRow | RowProblem]], path: Path, count: int,
                                   gpu: str, name: str | None, temperatures: tuple[int, int], energy: bool) -> None:
    results = traces[path]
    assert problems_of(results) == []
    rows = rows_of(results)
    assert len(rows) == count
    assert [r.line for r in rows] == list(range(2, count + 2))
    assert {r.gpu for r in rows} == {gpu}
    assert {r.name for r in rows} == {name}
    stamps = [r.timestamp for r in rows]
    assert all(a < b for a, b in itertools.pairwise(stamps))
    temps = [r.values["temperature_gpu_celsius"] for r in rows]
    assert (min(temps), max(temps)) == temperatures
    assert all(("energy_joules" in r.values) is energy for r in rows)
    for r in rows:  # every value is a GpuSample field of the right shape
        GpuSample(timestamp=r.timestamp, monotonic=0.0, **r.values)
        assert set(r.identity) <= {f for f in GpuIdentity.__dataclass_fields__}


def test_a100_first_row_in_base_units(traces: dict[Path, list[ImportedRow | RowProblem]]) -> None:
    first = traces[A100][0]
    assert first == ImportedRow(2, utc(2023, 7, 30, 17, 28, 2, 589000), "index:0", None, {
        "utilization_gpu_ratio": 0.0, "performance_state": 0, "temperature_gpu_celsius": 53.0,
        "clock_sm_hz": 1410e6, "power_watts": 78.66})
    last = rows_of(traces[A100])[-1]
    assert last.timestamp == pytest.approx(utc(2023, 7, 30, 17, 31, 25, 469000))
    assert last.values["utilization_gpu_ratio"] == 0.01


def test_a100_prefers_power_draw_over_power_draw_instant(traces: dict[Path, list[ImportedRow | RowProblem]]) -> None:
    with A100.open(newline="") as fh:
        raw = list(csv.reader(fh, skipinitialspace=True))[1:]
    assert sum(r[5] != r[6] for r in raw) > 100  # the two columns differ on some rows
    assert [r.values["power_watts"] for r in rows_of(traces[A100])] == [float(r[5]) for r in raw]


def test_rtx4060_first_row_in_base_units(traces: dict[Path, list[ImportedRow | RowProblem]]) -> None:
    name = "NVIDIA GeForce RTX 4060 Laptop GPU"
    assert traces[RTX4060][0] == ImportedRow(2, utc(2025, 4, 30, 12, 29, 47, 571000), "index:0", name, {
        "temperature_gpu_celsius": 59.0, "utilization_gpu_ratio": 1.0, "utilization_memory_ratio": 0.0,
        "memory_used_bytes": 353 * MIB, "clock_sm_hz": 2025e6, "clock_memory_hz": 7000e6,
        "clock_graphics_hz": 2025e6, "power_watts": 14.513,
    }, {"index": 0, "name": name, "memory_total_bytes": 8188 * MIB})  # fan and the four ECC counters are -1


def test_rtx6000ada_first_row_in_base_units(traces: dict[Path, list[ImportedRow | RowProblem]]) -> None:
    name = "NVIDIA RTX 6000 Ada Generation"
    assert traces[RTX6000][0] == ImportedRow(2, utc(2025, 8, 5, 8, 10, 25, 677000), "index:0", name, {
        "temperature_gpu_celsius": 32.0, "utilization_gpu_ratio": 0.0, "utilization_memory_ratio": 0.0,
        "memory_used_bytes": 1189 * MIB, "clock_sm_hz": 210e6, "clock_memory_hz": 405e6,
        "clock_graphics_hz": 210e6, "fan_speed_ratio": (0.3,), "power_watts": 14.203,
        "energy_joules": 56490056.446,
    }, {"index": 0, "name": name, "memory_total_bytes": 49140 * MIB})


def test_rtx6000ada_energy_counter_is_monotonic(traces: dict[Path, list[ImportedRow | RowProblem]]) -> None:
    energy = [r.values["energy_joules"] for r in rows_of(traces[RTX6000])]
    assert all(a <= b for a, b in itertools.pairwise(energy))
    assert energy[-1] - energy[0] == pytest.approx(61068.606)
    assert max(r.values["power_watts"] for r in rows_of(traces[RTX6000])) == 153.205


def test_real_traces_have_crlf_and_a_quoted_field_with_commas() -> None:
    head = RTX6000.read_bytes()[:2000]
    assert b'\r\n' in head and b'"nvclock=210, nvclockmin=210' in head
    assert b"\r\n" not in A100.read_bytes()[:2000]


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="needs time.tzset (POSIX)")
def test_timestamps_are_local_time_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi writes local time without a zone; by default it is read in this machine's zone."""
    monkeypatch.setenv("TZ", "XST+5")  # POSIX: five hours behind UTC, no tz database needed
    time.tzset()
    try:
        first = next(read_telemetry_csv(A100))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert isinstance(first, ImportedRow)
    assert first.timestamp == pytest.approx(utc(2023, 7, 30, 22, 28, 2, 589000))


def test_timestamps_are_read_in_the_given_zone() -> None:
    plus2 = datetime.timezone(datetime.timedelta(hours=2))
    first = next(read_telemetry_csv(A100, tz=plus2))
    assert isinstance(first, ImportedRow)
    assert first.timestamp == pytest.approx(utc(2023, 7, 30, 15, 28, 2, 589000))


# --- hand-written nvidia-smi files --------------------------------------------------------------------------------

WITH_UNITS = """\
timestamp, index, uuid, pci.bus_id, name, temperature.gpu, temperature.memory, power.draw [W], \
enforced.power.limit [W], fan.speed [%], utilization.gpu [%], utilization.memory [%], clocks.current.sm [MHz], \
clocks.current.memory [MHz], clocks.current.graphics [MHz], clocks.max.sm [MHz], pstate, memory.used [MiB], \
memory.total [MiB], clocks_event_reasons.active, ecc.errors.corrected.volatile.total, \
ecc.errors.uncorrected.aggregate.total, retired_pages.pending, remapped_rows.correctable, remapped_rows.pending
2023/07/30 17:28:02.589, 0, GPU-aaaa, 00000000:2F:00.0, NVIDIA A100-SXM4-40GB, 53, 61, 250.12 W, 400.00 W, \
35 %, 97 %, 41 %, 1410 MHz, 1215 MHz, 1410 MHz, 1410 MHz, P0, 1024 MiB, 40960 MiB, 0x0000000000000004, 3, 0, No, \
2, Yes
"""

WITH_UNITS_VALUES = {
    "temperature_gpu_celsius": 53.0, "temperature_memory_celsius": 61.0, "power_watts": 250.12,
    "power_limit_watts": 400.0, "fan_speed_ratio": (0.35,), "utilization_gpu_ratio": 0.97,
    "utilization_memory_ratio": 0.41, "clock_sm_hz": 1410e6, "clock_memory_hz": 1215e6, "clock_graphics_hz": 1410e6,
    "clock_sm_max_hz": 1410e6, "performance_state": 0, "memory_used_bytes": 1024 * MIB, "clock_event_reasons": 4,
    "ecc_corrected_volatile": 3, "ecc_uncorrected_aggregate": 0, "retired_pages_pending": False,
    "remapped_rows_corrected": 2, "remapped_rows_pending": True,
}


def test_nvidia_smi_with_units(tmp_path: Path) -> None:
    row = only_row(write(tmp_path, WITH_UNITS))
    assert row.line == 2
    assert row.timestamp == pytest.approx(utc(2023, 7, 30, 17, 28, 2, 589000))
    assert (row.gpu, row.name) == ("GPU-aaaa", "NVIDIA A100-SXM4-40GB")
    assert row.values == WITH_UNITS_VALUES
    assert row.identity == {"index": 0, "uuid": "GPU-aaaa", "pci_bus_id": "00000000:2F:00.0",
                            "name": "NVIDIA A100-SXM4-40GB", "memory_total_bytes": 40960 * MIB}


def test_nvidia_smi_nounits(tmp_path: Path) -> None:
    header, data = WITH_UNITS.splitlines()
    for unit in (" W", " %", " MHz", " MiB"):
        data = data.replace(unit, "")
    assert only_row(write(tmp_path, f"{header}\n{data}\n")).values == WITH_UNITS_VALUES


def test_nvidia_smi_bare_header_and_bare_values_assume_default_units(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp,power.draw,fan.speed,clocks.sm,memory.used,temperature.gpu\n"
                           "2023/07/30 17:28:02.589,250.5,35,1410,1024,53\n")
    assert only_row(path).values == {"power_watts": 250.5, "fan_speed_ratio": (0.35,), "clock_sm_hz": 1410e6,
                                     "memory_used_bytes": 1024 * MIB, "temperature_gpu_celsius": 53.0}


def test_noheader_with_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "2023/07/30 17:28:02.589, GPU-aaaa, 53, 250.12 W\n"
                           "2023/07/30 17:28:03.589, GPU-aaaa, 54, 251.00 W\n")
    columns = ["timestamp", "uuid", "temperature.gpu", "power.draw"]
    rows = parse(path, columns=columns)
    assert [(r.line, r.gpu, r.values) for r in rows_of(rows)] == [
        (1, "GPU-aaaa", {"temperature_gpu_celsius": 53.0, "power_watts": 250.12}),
        (2, "GPU-aaaa", {"temperature_gpu_celsius": 54.0, "power_watts": 251.0})]
    with pytest.raises(ImportFormatError, match="columns="):
        read_telemetry_csv(path)
    with pytest.raises(ImportFormatError, match="timestamp"):
        read_telemetry_csv(path, columns=["uuid", "temperature.gpu"])


def test_columns_are_ignored_when_the_file_has_a_header(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, temperature.gpu\n2023/07/30 17:28:02.589, 53\n")
    row = only_row(path, columns=["timestamp", "power.draw"])
    assert row.values == {"temperature_gpu_celsius": 53.0}


@pytest.mark.parametrize("marker", ["[N/A]", "[Not Supported]", "N/A", "", "[Unknown Error]", "[n/a]"])
def test_not_available_values_are_left_out_never_zero(tmp_path: Path, marker: str) -> None:
    path = write(tmp_path, "timestamp, uuid, temperature.gpu, power.draw [W], fan.speed [%], pstate\n"
                           f"2023/07/30 17:28:02.589, {marker}, 53, {marker}, {marker}, {marker}\n")
    row = only_row(path)
    assert row.values == {"temperature_gpu_celsius": 53.0}
    assert row.gpu == "index:0"


def test_mixed_units_across_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, power.draw [W], clocks.sm [MHz], memory.used [MiB]\n"
                           "2023/07/30 17:28:02.000, 250.12 W, 1410 MHz, 1024 MiB\n"
                           "2023/07/30 17:28:03.000, 250120 mW, 1.41 GHz, 1 GiB\n"
                           "2023/07/30 17:28:04.000, 0.25 kW, 1410000 kHz, 1048576 KiB\n"
                           "2023/07/30 17:28:05.000, 250, 1410000000 Hz, 1073741824 B\n")
    values = [r.values for r in rows_of(parse(path))]
    assert [v["power_watts"] for v in values] == pytest.approx([250.12, 250.12, 250.0, 250.0])
    assert [v["clock_sm_hz"] for v in values] == pytest.approx([1410e6] * 4)
    assert [v["memory_used_bytes"] for v in values] == [1024 * MIB] * 4


def test_a_unit_that_does_not_fit_the_column_is_a_row_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, power.draw [W], temperature.gpu\n"
                           "2023/07/30 17:28:02.000, 250 W, 50\n"
                           "2023/07/30 17:28:03.000, 1410 MHz, 50\n"
                           "2023/07/30 17:28:04.000, 251 W, 50\n")
    results = parse(path)
    assert [type(r) for r in results] == [ImportedRow, RowProblem, ImportedRow]
    problem = results[1]
    assert isinstance(problem, RowProblem) and problem.line == 3
    assert "power.draw [W]" in problem.message and "1410 MHz" in problem.message


def test_a_non_numeric_value_is_a_row_problem_and_parsing_goes_on(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, temperature.gpu, power.draw [W]\n"
                           "2023/07/30 17:28:02.000, 50, 100 W\n"
                           "2023/07/30 17:28:03.000, hot, 100 W\n"
                           "2023/07/30 17:28:04.000, 50, nan W\n"
                           "2023/07/30 17:28:05.000, 51, 100 W\n")
    results = parse(path)
    assert [(type(r).__name__, r.line) for r in results] == [
        ("ImportedRow", 2), ("RowProblem", 3), ("RowProblem", 4), ("ImportedRow", 5)]
    assert isinstance(results[1], RowProblem) and "temperature.gpu" in results[1].message
    assert "'hot'" in results[1].message
    assert isinstance(results[2], RowProblem) and "'nan W'" in results[2].message


@pytest.mark.parametrize(("text", "why"), [
    ("2023/07/30 17:28:04.000, 50, 100 W, 7", "expected 3 fields, found 4"),
    ("2023/07/30 17:28:04.000, 50", "expected 3 fields, found 2"),
    ("2023/13/30 17:28:04.000, 50, 100 W", "month"),
    ("yesterday, 50, 100 W", "not a timestamp"),
    (", 50, 100 W", "no timestamp"),
])
def test_bad_rows(tmp_path: Path, text: str, why: str) -> None:
    path = write(tmp_path, f"timestamp, temperature.gpu, power.draw [W]\n{text}\n2023/07/30 17:28:05.000, 1, 1\n")
    problem = only_problem(path)
    assert problem.line == 2
    assert why in problem.message


def test_truncated_last_line(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, temperature.gpu, power.draw [W]\n"
                           "2023/07/30 17:28:02.000, 50, 100.00 W\n"
                           "2023/07/30 17:28:03.000, 5")  # the logger was killed mid-line
    results = parse(path)
    assert isinstance(results[0], ImportedRow)
    assert results[1] == RowProblem(3, "expected 3 fields, found 2")


def test_truncated_timestamp_on_the_last_line(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, power.draw [W]\n2023/07/30 17:28:02.000, 100 W\n2023/07/30 17:2")
    assert [type(r) for r in parse(path)] == [ImportedRow, RowProblem]


def test_gpu_key_uuid_else_bus_id_else_index(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, index, pci.bus_id, uuid, temperature.gpu\n"
                           "2023/07/30 17:28:02.000, 0, 00000000:2F:00.0, GPU-aaaa, 50\n"
                           "2023/07/30 17:28:02.000, 1, 00000000:35:00.0, [N/A], 50\n"
                           "2023/07/30 17:28:02.000, 2, [N/A], [N/A], 50\n")
    assert [r.gpu for r in rows_of(parse(path))] == ["GPU-aaaa", "00000000:35:00.0", "index:2"]
    by_bus = write(tmp_path, "timestamp, gpu_bus_id, temperature.gpu\n2023/07/30 17:28:02, 00000000:2F:00.0, 5\n",
                   "bus.csv")
    assert only_row(by_bus).gpu == "00000000:2F:00.0"
    by_alias = write(tmp_path, "timestamp, gpu_uuid, gpu_name, temperature.gpu\n2023/07/30 17:28:02, GPU-b, X, 5\n",
                     "alias.csv")
    assert (only_row(by_alias).gpu, only_row(by_alias).name) == ("GPU-b", "X")


def test_several_gpus_interleaved(tmp_path: Path) -> None:
    lines = ["timestamp, index, uuid, temperature.gpu, power.draw [W]"]
    for second in range(3):
        for gpu in range(4):
            lines.append(f"2023/07/30 17:28:0{second}.000, {gpu}, GPU-{gpu}, {40 + gpu + second}, {100 * gpu} W")
    series: dict[str, list[float]] = {}
    for row in rows_of(parse(write(tmp_path, "\n".join(lines) + "\n"))):
        series.setdefault(row.gpu, []).append(row.values["temperature_gpu_celsius"])
    assert series == {f"GPU-{g}": [40.0 + g, 41.0 + g, 42.0 + g] for g in range(4)}


def test_power_draw_preference_per_row(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, power.draw.instant [W], power.draw.average [W], power.draw [W]\n"
                           "2023/07/30 17:28:02, 3 W, 2 W, 1 W\n"
                           "2023/07/30 17:28:03, 3 W, 2 W, [N/A]\n"
                           "2023/07/30 17:28:04, 3 W, [N/A], [N/A]\n"
                           "2023/07/30 17:28:05, [N/A], [N/A], [N/A]\n")
    assert [r.values.get("power_watts") for r in rows_of(parse(path))] == [1.0, 2.0, 3.0, None]


def test_enforced_power_limit_is_preferred_over_power_limit(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, power.limit [W], enforced.power.limit [W], power.draw [W]\n"
                           "2023/07/30 17:28:02, 450.00 W, 300.00 W, 1 W\n2023/07/30 17:28:03, 450.00 W, [N/A], 1 W\n")
    assert [r.values["power_limit_watts"] for r in rows_of(parse(path))] == [300.0, 450.0]


def test_aliases_and_old_names(tmp_path: Path) -> None:
    path = write(tmp_path, "Timestamp ,  CLOCKS.SM [MHz], clocks.mem [MHz], clocks.gr [MHz], clocks.max.mem [MHz], "
                           "clocks_throttle_reasons.active, retired_pages.sbe, retired_pages.dbe, "
                           "remapped_rows.uncorrectable, remapped_rows.failure, power.draw.average [W], "
                           "mig.mode.current, ecc.mode.current, serial\n"
                           "2023/07/30 17:28:02, 1980 MHz, 10501 MHz, 1965 MHz, 10501 MHz, 0x00000000000000A1, 1, "
                           "0, 0, No, 300.5 W, Disabled, Enabled, 1323121035405\n")
    row = only_row(path)
    assert row.values == {"clock_sm_hz": 1980e6, "clock_memory_hz": 10501e6, "clock_graphics_hz": 1965e6,
                          "clock_memory_max_hz": 10501e6, "clock_event_reasons": 0xA1,
                          "retired_pages_single_bit": 1, "retired_pages_double_bit": 0,
                          "remapped_rows_uncorrected": 0, "remapped_rows_failure": False, "power_watts": 300.5,
                          "mig_enabled": False, "ecc_enabled": True}
    assert row.identity == {"serial": "1323121035405"}


def test_unknown_columns_are_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, driver_version, pcie.link.gen.current, temperature.gpu, memory.free [MiB]\n"
                           "2023/07/30 17:28:02, 535.129.03, 4, 50, whatever\n")
    assert only_row(path).values == {"temperature_gpu_celsius": 50.0}


def test_crlf_bom_and_quoted_fields(tmp_path: Path) -> None:
    text = ('\ufefftimestamp,name,temperature.gpu,power.draw [W]\r\n'
            '2023/07/30 17:28:02.000,"ACME, Inc. ""GPU"" 9000",50,100 W\r\n'
            '2023/07/30 17:28:03.000,"multi\r\nline",51,101 W\r\n'
            '2023/07/30 17:28:04.000,plain,52,102 W\r\n')
    rows = rows_of(parse(write(tmp_path, text)))
    assert [(r.line, r.name) for r in rows] == [(2, 'ACME, Inc. "GPU" 9000'), (3, "multi\r\nline"), (5, "plain")]


def test_repeated_header_from_appended_runs(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, temperature.gpu, power.draw [W]\n"
                           "2023/07/30 17:28:02, 50, 100 W\n"
                           "\n"
                           "timestamp, power.draw [W], temperature.gpu\n"
                           "2023/07/30 18:00:00, 200 W, 60\n")
    assert [(r.line, r.values) for r in rows_of(parse(path))] == [
        (2, {"temperature_gpu_celsius": 50.0, "power_watts": 100.0}),
        (5, {"power_watts": 200.0, "temperature_gpu_celsius": 60.0})]


def test_timestamp_with_an_explicit_zone_keeps_it(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, temperature.gpu\n2023-07-30T17:28:02.5+02:00, 50\n2023-07-30 17:28:02Z, 50\n")
    assert [r.timestamp for r in rows_of(parse(path))] == [utc(2023, 7, 30, 15, 28, 2, 500000),
                                                          utc(2023, 7, 30, 17, 28, 2)]


def test_a_line_that_is_not_utf8_is_a_row_problem(tmp_path: Path) -> None:
    path = write(tmp_path, b"timestamp, temperature.gpu\n2023/07/30 17:28:02, 50\n"
                           b"2023/07/30 17:28:03, 5\xff0\n2023/07/30 17:28:04, 52\n")
    results = parse(path)
    assert [type(r) for r in results] == [ImportedRow, RowProblem, ImportedRow]
    assert isinstance(results[1], RowProblem) and results[1].line == 3 and "UTF-8" in results[1].message


def test_a_nul_filled_tail_after_a_crash_is_a_row_problem(tmp_path: Path) -> None:
    path = write(tmp_path, b"timestamp, temperature.gpu\n2023/07/30 17:28:02, 50\n" + b"\0" * 3000)
    results = parse(path)
    assert [type(r) for r in results] == [ImportedRow, RowProblem]
    assert isinstance(results[1], RowProblem) and results[1].line == 3 and "NUL" in results[1].message


def test_an_overlong_line_is_skipped_without_reading_it_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              ) -> None:
    monkeypatch.setattr(importer, "MAX_LINE_BYTES", 64)
    path = write(tmp_path, "timestamp, temperature.gpu\n2023/07/30 17:28:02, 50\n"
                           f"2023/07/30 17:28:03, {'9' * 500}\n2023/07/30 17:28:04, 52\n")
    results = parse(path)
    assert [(type(r).__name__, r.line) for r in results] == [
        ("ImportedRow", 2), ("RowProblem", 3), ("ImportedRow", 4)]


def test_an_unterminated_quote_costs_rows_but_not_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'timestamp, name, temperature.gpu\n2023/07/30 17:28:02, "oops, 50\n'
                           '2023/07/30 17:28:03, ok, 51\n')
    results = parse(path)
    assert results and all(isinstance(r, RowProblem) for r in results)


# --- the llm-gpu-stress logger format -----------------------------------------------------------------------------

LOGGER_HEADER = ("timestamp_ns,gpu_index,name,temperature_C,util_gpu_percent,util_mem_percent,mem_total_MB,"
                 "mem_used_MB,mem_free_MB,clock_sm_MHz,clock_mem_MHz,clock_graphics_MHz,fan_speed_percent,"
                 "power_draw_W,ecc_volatile_corrected,ecc_volatile_uncorrected,ecc_aggregate_corrected,"
                 "ecc_aggregate_uncorrected")


def test_logger_minus_one_means_not_supported(tmp_path: Path) -> None:
    path = write(tmp_path, f"{LOGGER_HEADER}\r\n"
                           "2025-04-30 12:29:47.571,1,GPU X,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,0,-1,7,-1\r\n")
    row = only_row(path)
    assert row.gpu == "index:1"
    assert row.values == {"ecc_corrected_volatile": 0, "ecc_corrected_aggregate": 7}


def test_logger_integer_timestamp_is_nanoseconds(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp_ns,power_draw_W\n1690738082589000000,14.5\n")
    assert only_row(path).timestamp == pytest.approx(1690738082.589)


def test_the_table_covers_the_documented_names() -> None:
    table = supported_columns()
    sample_fields = set(GpuSample.__dataclass_fields__) | set(GpuIdentity.__dataclass_fields__)
    assert set(table.values()) <= sample_fields
    for name in ["timestamp", "index", "uuid", "gpu_uuid", "pci.bus_id", "gpu_bus_id", "name", "gpu_name", "serial",
                 "temperature.gpu", "temperature.memory", "power.draw", "power.draw.average", "power.draw.instant",
                 "enforced.power.limit", "power.limit", "fan.speed", "utilization.gpu", "utilization.memory",
                 "clocks.sm", "clocks.current.sm", "clocks.mem", "clocks.current.memory", "clocks.gr",
                 "clocks.current.graphics", "clocks.max.sm", "clocks.max.mem", "clocks.max.gr", "pstate",
                 "memory.used", "memory.total", "clocks_event_reasons.active", "clocks_throttle_reasons.active",
                 "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
                 "ecc.errors.corrected.aggregate.total", "ecc.errors.uncorrected.aggregate.total",
                 "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count", "retired_pages.pending",
                 "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
                 "remapped_rows.failure", *LOGGER_HEADER.lower().replace("mem_free_mb,", "").split(","),
                 "total_energy_mj"]:
        assert name in table, name


# --- whole-file errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "why"), [
    (b"", "empty"),
    (b"\xef\xbb\xbf\r\n\n  \n", "empty"),
    (random.Random(7).randbytes(4096), "binary|UTF-8"),
    (b"\0" * 4096, "NUL"),
    ("température, puissance\n".encode("latin-1"), "UTF-8"),
    ("timestamp, temperature.gpu\n".encode("utf-16"), "UTF-16"),
    (b"index, uuid, temperature.gpu [C], power.draw [W]\n0, GPU-a, 50, 100 W\n", "no timestamp column"),
    (b"timestamp, index, uuid, utilization.gpu [%]\n2023/07/30 17:28:02, 0, GPU-a, 5 %\n", "no temperature or power"),
    (b"timestamp, power.draw [MHz]\n", "not a power unit"),
    (b'{"timestamp": 1, "power": 2}\n', "not a known telemetry CSV header"),
    (b"hello world\n", "not a known telemetry CSV header"),
])
def test_whole_file_errors(tmp_path: Path, content: bytes, why: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(ImportFormatError, match=why):
        read_telemetry_csv(path)  # raised at the call, before iterating


def test_a_file_larger_than_max_bytes_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "timestamp, temperature.gpu\n2023/07/30 17:28:02, 50\n")
    with pytest.raises(ImportFormatError, match="limit"):
        read_telemetry_csv(path, max_bytes=10)
    assert len(parse(path, max_bytes=1000)) == 1


# --- properties ---------------------------------------------------------------------------------------------------

VALID = "timestamp, index, uuid, temperature.gpu, power.draw [W], fan.speed [%], pstate, memory.used [MiB]\n"
LINES = st.lists(st.one_of(st.text(max_size=80), st.binary(max_size=80),
                           st.lists(st.sampled_from(["2023/07/30 17:28:02", "1", "GPU-a", "50 W", "[N/A]", "P2",
                                                     '"', "", " ", "-1", "0x1", "12 MiB", "1e3"]),
                                    max_size=10).map(", ".join)), max_size=20)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES, ending=st.sampled_from([b"\n", b"\r\n"]))
def test_arbitrary_lines_after_a_valid_header_never_raise(tmp_path: Path, lines: list[str | bytes],
                                                          ending: bytes) -> None:
    body = ending.join(line if isinstance(line, bytes) else line.encode() for line in lines)
    path = write(tmp_path, VALID.encode().replace(b"\n", ending) + body)
    total_lines = path.read_bytes().count(b"\n") + 1
    last = 1
    for result in read_telemetry_csv(path, tz=UTC):
        assert isinstance(result, (ImportedRow, RowProblem))
        assert last < result.line <= total_lines
        last = result.line
        if isinstance(result, RowProblem):
            assert result.message and "\n" not in result.message


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                         st.lists(st.sampled_from(["timestamp", "temperature.gpu", "power.draw [W]", "[W]", "x",
                                                   '"', "\r", "\n", ", ", "2023/07/30 17:28:02", "-1"]),
                                  max_size=30).map(lambda parts: "".join(parts).encode())))
def test_any_file_is_refused_whole_or_read_without_raising(tmp_path: Path, content: bytes) -> None:
    path = write(tmp_path, content)
    try:
        results = read_telemetry_csv(path, tz=UTC)
    except ImportFormatError as exc:
        assert str(exc).startswith(str(path))
        return
    assert all(isinstance(r, (ImportedRow, RowProblem)) for r in results)


GPU_ROWS = st.lists(st.fixed_dictionaries({
    "time": st.datetimes(min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2099, 12, 31)),
    "index": st.integers(0, 15),
    "uuid": st.one_of(st.none(), st.from_regex(r"GPU-[0-9a-f]{8}", fullmatch=True)),
    "temperature": st.one_of(st.none(), st.integers(-40, 150)),
    "power_cw": st.one_of(st.none(), st.integers(0, 1_000_000)),  # centiwatts: nvidia-smi prints 2 decimals
    "fan": st.one_of(st.none(), st.integers(0, 200)),
    "util": st.one_of(st.none(), st.integers(0, 100)),
    "clock": st.one_of(st.none(), st.integers(0, 5000)),
    "pstate": st.one_of(st.none(), st.integers(0, 15)),
    "memory": st.one_of(st.none(), st.integers(0, 200_000)),
    "reasons": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "ecc": st.one_of(st.none(), st.integers(0, 10**9)),
    "pending": st.one_of(st.none(), st.booleans()),
}), min_size=1, max_size=8)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=GPU_ROWS, units=st.booleans(), header=st.booleans(), na=st.sampled_from(["[N/A]", "[Not Supported]"]))
def test_round_trip_of_generated_nvidia_smi_rows(tmp_path: Path, rows: list[dict[str, Any]], units: bool,
                                                 header: bool, na: str) -> None:
    names = ["timestamp", "index", "uuid", "temperature.gpu", "power.draw [W]", "fan.speed [%]",
             "utilization.gpu [%]", "clocks.current.sm [MHz]", "pstate", "memory.used [MiB]",
             "clocks_event_reasons.active", "ecc.errors.corrected.volatile.total", "retired_pages.pending"]

    def cell(value: Any, fmt: str, unit: str = "") -> str:
        return na if value is None else fmt.format(value) + (unit if units else "")

    lines = [", ".join(names)] if header else []
    for r in rows:
        lines.append(", ".join([
            r["time"].strftime("%Y/%m/%d %H:%M:%S.%f")[:-3], str(r["index"]), cell(r["uuid"], "{}"),
            cell(r["temperature"], "{}"), cell(r["power_cw"] and r["power_cw"] / 100, "{:.2f}", " W"),
            cell(r["fan"], "{}", " %"), cell(r["util"], "{}", " %"), cell(r["clock"], "{}", " MHz"),
            cell(r["pstate"], "P{}"), cell(r["memory"], "{}", " MiB"), cell(r["reasons"], "0x{:016x}"),
            cell(r["ecc"], "{}"), cell(r["pending"] if r["pending"] is None else ("Yes" if r["pending"] else "No"),
                                       "{}")]))
    path = write(tmp_path, "\n".join(lines) + "\n")
    parsed = list(read_telemetry_csv(path, columns=None if header else [n.split(" ")[0] for n in names], tz=UTC,
                                     latest=4_102_444_799.0))  # any time up to 2100, whatever this machine's clock
    assert all(isinstance(p, ImportedRow) for p in parsed), parsed
    assert len(parsed) == len(rows)
    for r, p in zip(rows, parsed, strict=True):
        assert isinstance(p, ImportedRow)
        assert p.timestamp == pytest.approx(r["time"].replace(microsecond=r["time"].microsecond // 1000 * 1000,
                                                              tzinfo=UTC).timestamp(), abs=1e-6)
        assert p.gpu == (r["uuid"] or f"index:{r['index']}")
        expected = {
            "temperature_gpu_celsius": r["temperature"], "power_watts": r["power_cw"] and r["power_cw"] / 100,
            "fan_speed_ratio": None if r["fan"] is None else (r["fan"] / 100,),
            "utilization_gpu_ratio": None if r["util"] is None else r["util"] / 100,
            "clock_sm_hz": None if r["clock"] is None else r["clock"] * 1e6, "performance_state": r["pstate"],
            "memory_used_bytes": None if r["memory"] is None else r["memory"] * MIB,
            "clock_event_reasons": r["reasons"], "ecc_corrected_volatile": r["ecc"],
            "retired_pages_pending": r["pending"],
        }
        assert p.values == {k: v for k, v in expected.items() if v is not None}


# --- laziness -----------------------------------------------------------------------------------------------------


def test_a_large_file_streams_lazily(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    with path.open("w") as fh:
        fh.write("timestamp, index, uuid, name, temperature.gpu, power.draw [W], utilization.gpu [%], "
                 "clocks.current.sm [MHz], memory.used [MiB]\n")
        row = ", 0, GPU-12345678-abcd-ef01-2345-6789abcdef01, NVIDIA H100 80GB HBM3, 55, 312.45 W, 97 %, 1980 MHz, "
        for i in range(200_000):
            fh.write(f"2024/01/01 {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000{row}{i} MiB\n")
    size = path.stat().st_size
    assert size > 20 * MIB
    tracemalloc.start()
    try:
        rows = read_telemetry_csv(path, tz=UTC)
        first = next(rows)
        for _ in range(999):
            next(rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(first, ImportedRow) and first.values["memory_used_bytes"] == 0
    assert peak < 2 * MIB < size  # far below the 20 MB budget: one line at a time
    rows.close()  # type: ignore[attr-defined]


_CELLS = st.one_of(
    st.text(alphabet="0123456789.-+eE_xX WwMmHhZz%iBbCc[]NA/٣５²", max_size=12),
    st.builds(lambda n, u: f"{n} {u}", st.floats(allow_nan=True, allow_infinity=True, width=32),
              st.sampled_from(["W", "mW", "MHz", "GHz", "%", "MiB", "GiB", "C", "J", "mJ"])),
    st.builds(str, st.integers(-10**6, 10**6)),
    st.builds(lambda n: f"0x{n:016x}", st.integers(0, 2**64 - 1)),
    st.builds(lambda digits: "0x" + digits, st.text(alphabet="0123456789abcdefABCDEF٣５_", min_size=1, max_size=4)),
)


@settings(max_examples=examples(600), deadline=None)
@given(cells=st.lists(_CELLS, min_size=1, max_size=8))
def test_the_fast_cell_path_agrees_with_the_strict_parser(cells: list[str]) -> None:
    """Wherever the regex-free converter of a column answers, it answers what the strict converter answers; and
    where it refuses, the strict one decides (so a cell is never read two ways)."""
    for name, column in importer._COLUMNS.items():
        units = list(column.kind.units) or [""]
        for unit in units if name in ("power.draw", "fan.speed", "clocks.sm", "memory.used", "timestamp_ns") \
                else [column.unit or ""]:
            fast, strict = importer._fast_converter(column, unit), importer._converter(column, unit)
            for cell in cells:
                try:
                    got = fast(cell)
                except ValueError:
                    continue
                text = cell.strip()
                assert not importer._missing(text), (name, cell)
                assert not (column.minus_one_na and text == "-1"), (name, cell)
                assert got == strict(text), (name, unit, cell)


WITHOUT_FAST_IMPORT = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):  # numpy and pyarrow not installed: the fast-import extra left out
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("numpy", "pyarrow"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.partition(".")[0])
        return None
sys.meta_path.insert(0, Absent())
from gpuwear.cli import main
code = main(sys.argv[1:])
assert "numpy" not in sys.modules and "pyarrow" not in sys.modules
sys.exit(code)
"""


def test_without_the_fast_import_extra_logs_are_read_row_by_row_to_the_same_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """numpy and pyarrow (~60 MB) were required by every install, though only `import nvidia-smi`'s columnar reader
    uses them; they are now the `fast-import` extra, and an install without them imports the same log row by row,
    says so, and gets the same ledger."""
    import json
    import sqlite3
    import subprocess
    import sys
    from contextlib import closing

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from gpuwear.cli import main
    from logs import random_log

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith(("numpy", "pyarrow"))]
    assert sorted(d.partition(">")[0] for d in project["optional-dependencies"]["fast-import"]) == ["numpy", "pyarrow"]
    log = random_log(tmp_path / "smi.csv", 4, 1.0, 3000)
    states = {"with": tmp_path / "with", "without": tmp_path / "without"}
    assert main(["import", "nvidia-smi", str(log), "--timezone", "UTC", "--state-dir", str(states["with"])]) == 0
    assert "row by row" not in capsys.readouterr().out  # by columns, where numpy and pyarrow are installed
    run = subprocess.run([sys.executable, "-c", WITHOUT_FAST_IMPORT, "import", "nvidia-smi", str(log), "--timezone",
                          "UTC", "--state-dir", str(states["without"])], capture_output=True, text=True, timeout=300,
                         cwd=REPO, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "read row by row, more slowly (numpy is not installed: pip install 'gpuwear[fast-import]'" in run.stdout

    def imported(state: Path) -> list[tuple[object, ...]]:
        with closing(sqlite3.connect(state / "ledger.sqlite")) as db:
            return [(uuid, json.loads(wear), first, last, rows) for uuid, wear, first, last, rows in
                    db.execute("SELECT uuid, wear, first, last, rows FROM imports ORDER BY uuid")]
    assert imported(states["without"]) == imported(states["with"]) != []
