"""`gpuwear import nvidia-smi` on logs as people keep them: sparse and jittered cadences, glitches, duplicate
timestamps, rows without readings, gaps filled by a later file, a far-future row, DST, logs without identity.
Each case states the figure before this behaviour and after."""

from __future__ import annotations

import datetime
import subprocess
import sys
import zoneinfo
from contextlib import closing
from pathlib import Path

import pytest

from gpuwear.config import Config
from gpuwear.imports import columnar
from gpuwear.imports.backfill import FileResult, gap_threshold, import_rows
from gpuwear.imports.parse import ImportFormatError
from gpuwear.imports.reader import import_file
from gpuwear.ledger import Ledger
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.plausibility import SpikeFilter

HEADER = "timestamp, uuid, temperature.gpu, power.draw [W], utilization.gpu [%]\n"
PARAMS = Config().wear
START = datetime.datetime(2026, 11, 2, 10, 0, tzinfo=datetime.timezone.utc).timestamp()


def stamp(t: float, tz: datetime.tzinfo = datetime.timezone.utc) -> str:
    return datetime.datetime.fromtimestamp(t, tz).strftime("%Y/%m/%d %H:%M:%S.000")


def log(tmp_path: Path, rows: list[tuple[float, float | None]], name: str = "smi.csv", uuid: str = "GPU-abc",
        header: str = HEADER) -> Path:
    """(seconds after START, die °C or None for a row nvidia-smi wrote as [GPU is lost])"""
    lines = [header]
    for t, celsius in rows:
        if celsius is None:
            lines.append(f"{stamp(START + t)}, {uuid}, [GPU is lost], [GPU is lost], [GPU is lost]\n")
        else:
            lines.append(f"{stamp(START + t)}, {uuid}, {celsius:g}, 100.00 W, 90 %\n")
    path = tmp_path / name
    path.write_text("".join(lines))
    return path


def run(tmp_path: Path, path: Path, **kwargs: object) -> tuple[FileResult, GpuWear]:
    with closing(Ledger.open(tmp_path / "state" / "ledger.sqlite")) as ledger:
        result = import_file(path, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None, **kwargs)  # type: ignore[arg-type]
        wear = ledger.load_imported(PARAMS.cycles.hysteresis_celsius)
    uuid = next(iter(result.imported))
    return result, wear[uuid]


def biggest_cycle(w: GpuWear) -> float:
    return max((float(k.split(":")[0]) for k in w.all_cycles("gpu")), default=0.0)


def test_a_60_s_log_is_observed_time() -> None:
    """Before: `nvidia-smi -l 60` imported as 0 s observed, 0 J, 0 cycles (the live 30 s gap limit)."""
    assert gap_threshold(60.0, 30.0) == 300.0 and gap_threshold(1.0, 30.0) == 30.0
    assert gap_threshold(7200.0, 30.0) == 3600.0 and gap_threshold(None, 30.0) == 30.0


def test_60_s_and_jittered_30_s_cadences(tmp_path: Path) -> None:
    result, w = run(tmp_path, log(tmp_path, [(60.0 * i, 40 + (i % 2) * 30) for i in range(61)]))
    assert w.observed_seconds == 3600.0 and w.energy_joules == pytest.approx(100 * 3600)
    assert sum(w.all_cycles("gpu").values()) > 25  # 40 <-> 70 every minute
    assert result.cadence["GPU-abc"] == (60.0, 300.0)
    jitter = [0, 3, -2, 4, -3, 1]
    rows = [(30.0 * i + jitter[i % 6], 50.0) for i in range(121)]
    _, w = run(tmp_path / "b", log(tmp_path, rows, "jitter.csv", uuid="GPU-def"))
    assert w.observed_seconds == pytest.approx(rows[-1][0] - rows[0][0])  # before: 0 s past the first 30 s step


def test_the_gap_threshold_can_be_given(tmp_path: Path) -> None:
    _, w = run(tmp_path, log(tmp_path, [(60.0 * i, 50.0) for i in range(11)]), max_gap=30.0)
    assert w.observed_seconds == 0.0 and w.gap_seconds == 600.0


@pytest.mark.parametrize("glitch", [140.0, 0.0])
def test_a_lone_glitch_is_not_believed(tmp_path: Path, glitch: float) -> None:
    """Before: one 140 °C reading in a 45 °C log added a 95 °C cycle (6.7 reference cycles) and multiplied the
    Arrhenius aging by 5; a 0 °C one added a 45 °C cycle."""
    rows = [(float(i), 45.0 + (i % 3) * 0.5) for i in range(600)]
    rows[300] = (300.0, glitch)
    result, w = run(tmp_path, log(tmp_path, rows))
    reason = "above_shutdown" if glitch > 115 else "spike"  # 140 °C: above any card's shutdown; 0 °C: a spike
    assert result.excluded["GPU-abc"] == {reason: 1}
    assert biggest_cycle(w) < 5
    temps = [int(t) for t in w.temperature_seconds["gpu"]]
    assert max(temps) <= 46 and min(temps) >= 45
    assert w.observed_seconds == 599.0  # the row's other readings still count


@pytest.mark.parametrize("glitch", [0.0, 99.0])
def test_a_lone_memory_glitch_is_not_believed(tmp_path: Path, glitch: float) -> None:
    """HBM readings by the same rule, apart from the die's. Before: a lone 0 °C memory reading in a 55 °C log
    added a 56 °C memory cycle; a 99 °C one a 44 °C cycle."""
    lines = ["timestamp, uuid, temperature.gpu, temperature.memory, power.draw [W]\n"]
    for i in range(600):
        memory = glitch if i == 300 else 55 + (i % 3) * 0.5
        lines.append(f"{stamp(START + i)}, GPU-hbm, 45, {memory:g}, 300.00 W\n")
    path = tmp_path / "hbm.csv"
    path.write_text("".join(lines))
    result, w = run(tmp_path, path)
    assert result.excluded["GPU-hbm"] == {"memory_spike": 1}
    assert max((float(k.split(":")[0]) for k in w.all_cycles("memory")), default=0.0) < 5  # no phantom cycle
    assert min(int(t) for t in w.temperature_seconds["memory"]) >= 55
    assert w.temperature_seconds["gpu"] == {"45": 599.0}  # the die readings of that row are kept


def test_a_real_step_is_believed(tmp_path: Path) -> None:
    """A load starting (45 -> 75 °C and staying) is not a spike."""
    rows = [(float(i), 45.0 if i < 300 else 75.0) for i in range(600)]
    result, w = run(tmp_path, log(tmp_path, rows))
    assert not result.excluded["GPU-abc"] and biggest_cycle(w) == pytest.approx(30.0, abs=1)


def test_above_the_shutdown_threshold_is_not_believed(tmp_path: Path) -> None:
    """The card's own threshold where the ledger knows it (read live), else 110 °C, plus 5 °C of margin."""
    rows = [(float(i), 130.0 if 100 <= i < 110 else 80.0) for i in range(200)]
    result, w = run(tmp_path, log(tmp_path, rows))
    assert result.excluded["GPU-abc"]["above_shutdown"] == 10
    assert max(int(t) for t in w.temperature_seconds["gpu"]) == 80
    known = GpuWear("GPU-known")
    known.thresholds["shutdown"] = 92.0  # what the daemon read from the card
    known.see(START - 86400)
    with closing(Ledger.open(tmp_path / "k" / "ledger.sqlite")) as ledger:
        ledger.save([known.to_json()], [])
        rows = [(float(i), 100.0 if 100 <= i < 110 else 80.0) for i in range(200)]
        result = import_file(log(tmp_path, rows, "k.csv", uuid="GPU-known"), ledger, PARAMS,
                             tz=datetime.timezone.utc, say=lambda _: None)
    assert result.excluded["GPU-known"]["above_shutdown"] == 10


def test_duplicate_timestamps_never_reach_rainflow(tmp_path: Path) -> None:
    """Before: a conflicting duplicate row made a 25 °C phantom cycle."""
    rows = [(float(i), 50.0) for i in range(100)]
    rows.insert(50, (49.0, 75.0))  # the same second again, another value
    result, w = run(tmp_path, log(tmp_path, rows))
    assert result.excluded["GPU-abc"]["duplicate_timestamp"] == 1
    assert biggest_cycle(w) == 0.0 and w.observed_seconds == 99.0


def test_rows_without_readings_are_not_observed_time(tmp_path: Path) -> None:
    """Before: rows of `[GPU is lost]` counted as observed time."""
    rows = [(float(i), 50.0 if not 40 <= i < 60 else None) for i in range(100)]
    result, w = run(tmp_path, log(tmp_path, rows))
    assert result.excluded["GPU-abc"]["no_readings"] == 20
    assert w.observed_seconds == 99.0 - 21.0 and w.gap_seconds == 21.0


def test_a_later_file_fills_a_gap_inside_an_earlier_one(tmp_path: Path) -> None:
    """Before: an import was remembered as [first row, last row]: the later log was skipped as already imported."""
    first = log(tmp_path, [(float(i), 50.0) for i in range(600)] + [(3000.0 + i, 50.0) for i in range(600)], "a.csv")
    second = log(tmp_path, [(1200.0 + i, 60.0) for i in range(600)], "b.csv")
    with closing(Ledger.open(tmp_path / "state" / "ledger.sqlite")) as ledger:
        import_file(first, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None)
        result = import_file(second, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None)
        again = import_file(second, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None)
    assert result.imported["GPU-abc"] == 600 and result.skipped["GPU-abc"] == 0
    assert again.imported["GPU-abc"] == 0 and again.skipped["GPU-abc"] == 600


def test_a_far_future_row_marks_nothing_as_imported(tmp_path: Path) -> None:
    """Before: one row in 2036 marked ten years as imported, and every later log of them was skipped."""
    future = log(tmp_path, [(0.0, 50.0), (1.0, 50.0), (3.2e8, 50.0)], "future.csv")
    later = log(tmp_path, [(1e6 + i, 50.0) for i in range(100)], "later.csv")
    with closing(Ledger.open(tmp_path / "state" / "ledger.sqlite")) as ledger:
        import_file(future, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None)
        result = import_file(later, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None)
    assert result.imported["GPU-abc"] == 100 and result.skipped["GPU-abc"] == 0


def _local_log(tmp_path: Path, zone: zoneinfo.ZoneInfo, start: datetime.datetime, minutes: int) -> Path:
    """A row a minute in local time without a zone, as nvidia-smi writes them, for ``minutes`` real minutes."""
    lines = [HEADER]
    for i in range(minutes + 1):
        t = start.timestamp() + 60 * i
        lines.append(f"{stamp(t, zone)}, GPU-abc, 50, 100.00 W, 90 %\n")
    path = tmp_path / "local.csv"
    path.write_text("".join(lines))
    return path


def test_the_repeated_hour_of_the_autumn_change_is_kept(tmp_path: Path) -> None:
    """Before: 02:00-02:59 after the change read as its first occurrence, 'back in time': an hour lost."""
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    start = datetime.datetime(2026, 10, 25, 1, 30, tzinfo=paris)  # 3 real hours, across 03:00 CEST -> 02:00 CET
    path = _local_log(tmp_path, paris, start, 180)
    problems: list[str] = []
    with closing(Ledger.open(tmp_path / "state" / "ledger.sqlite")) as ledger:
        result = import_file(path, ledger, PARAMS, tz=paris, say=problems.append)
        w = ledger.load_imported(2.0)["GPU-abc"]
    assert not problems and result.imported["GPU-abc"] == 181
    assert w.observed_seconds == 3 * 3600.0


def test_the_spring_change_is_no_gap(tmp_path: Path) -> None:
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    start = datetime.datetime(2026, 3, 29, 1, 30, tzinfo=paris)  # 02:00 CET -> 03:00 CEST
    path = _local_log(tmp_path, paris, start, 120)
    with closing(Ledger.open(tmp_path / "state" / "ledger.sqlite")) as ledger:
        result = import_file(path, ledger, PARAMS, tz=paris, say=lambda _: None)
        w = ledger.load_imported(2.0)["GPU-abc"]
    assert result.imported["GPU-abc"] == 121 and w.observed_seconds == 2 * 3600.0 and w.gap_seconds == 0.0


def test_a_log_without_identity_needs_gpu(tmp_path: Path) -> None:
    """Before: it became `imported:GPU:0`, and logs of two boxes merged silently."""
    header = "timestamp, temperature.gpu, power.draw [W]\n"
    path = tmp_path / "anon.csv"
    path.write_text(header + "".join(f"{stamp(START + i)}, 50, 100.00 W\n" for i in range(10)))
    with closing(Ledger.open(tmp_path / "state" / "ledger.sqlite")) as ledger:
        with pytest.raises(ImportFormatError, match="--gpu"):
            import_file(path, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None)
        result = import_file(path, ledger, PARAMS, gpu="GPU-mine", tz=datetime.timezone.utc, say=lambda _: None)
    assert result.imported == {"GPU-mine": 10}


def test_spike_filter_answers_one_late() -> None:
    f: SpikeFilter[int] = SpikeFilter()
    series = [45, 45, 140, 45, 45, 70, 70]
    verdicts = [out for i, c in enumerate(series) if (out := f.push(i, float(i), float(c))) is not None]
    last = f.flush()
    assert last is not None
    verdicts.append(last)
    assert [i for i, spike in verdicts if spike] == [2] and f.spikes == 1


def test_a_high_reading_that_lasts_is_still_a_spike_only_when_alone(tmp_path: Path) -> None:
    """A 1 s spike to 100 °C on a card whose threshold is unknown (110 °C assumed): a spike."""
    rows = [(float(i), 100.0 if i == 50 else 60.0) for i in range(100)]
    result, _ = run(tmp_path, log(tmp_path, rows))
    assert result.excluded["GPU-abc"] == {"spike": 1}


@pytest.mark.slow
def test_jobs_and_report_reconcile_after_an_import(tmp_path: Path) -> None:
    """Before: `gpuwear jobs` said "No job or idle period recorded" while `report` showed hours for the GPU."""
    import json
    import subprocess
    import sys

    path = log(tmp_path, [(60.0 * i, 50.0 + (i % 5)) for i in range(121)])

    def gpuwear(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "gpuwear", *args, "--state-dir", str(tmp_path / "s")],
                              check=True, capture_output=True, text=True).stdout

    gpuwear("import", "nvidia-smi", str(path), "--timezone", "UTC")
    jobs = json.loads(gpuwear("jobs", "--json"))
    report = json.loads(gpuwear("report", "--json"))
    assert [j["kind"] for j in jobs["jobs"]] == ["imported"] and jobs["jobs"][0]["id"] == "smi.csv"
    observed = report["gpus"][0]["observed_seconds"]
    assert observed == 7200.0 and jobs["totals"]["GPU-abc"]["observed_seconds"] == observed
    text = gpuwear("jobs")
    assert "(imported: smi.csv)" in text and "100 %" in text


@pytest.mark.slow
def test_the_report_says_what_the_log_held(tmp_path: Path) -> None:
    """Before: "Clocks held down: never" for a log without throttle columns, "this card reports neither ECC
    counters nor memory temperature" about a log that lacked the columns, and "never; the card slows itself
    to stay within its limits"."""
    import subprocess
    import sys

    path = log(tmp_path, [(float(i), 50.0) for i in range(100)])

    def gpuwear(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "gpuwear", *args, "--state-dir", str(tmp_path / "s")],
                              check=True, capture_output=True, text=True).stdout

    gpuwear("import", "nvidia-smi", str(path), "--timezone", "UTC")
    text = gpuwear("report")
    assert "Clocks held down: not in the imported logs" in text
    assert "Memory temperature: not in the imported logs" in text
    assert "the imported logs hold neither ECC counters nor memory temperature" in text
    assert "In plain words: Nothing in its logs is wrong (they hold no ECC counters or memory temperature" in text
    assert "less than a tenth of what a day of gaming 4 h a day does" in text  # 99 s of a 50 °C log: no "0.001 days"
    assert "this card reports" not in text and "it reports no" not in text and "never;" not in text
    header = "timestamp, uuid, temperature.gpu, power.draw [W], clocks_event_reasons.active\n"
    with_reasons = tmp_path / "reasons.csv"
    with_reasons.write_text(header + "".join(f"{stamp(START + 1000 + i)}, GPU-xyz, 60, 100.00 W, 0x0000000000000000\n"
                                             for i in range(100)))
    gpuwear("import", "nvidia-smi", str(with_reasons), "--timezone", "UTC")
    text = gpuwear("report", "--gpu", "GPU-xyz")
    assert "Clocks held down: never (measured)" in text


def test_progress_is_reported_on_long_imports(tmp_path: Path) -> None:
    seen: list[int] = []
    path = log(tmp_path, [(float(i), 50.0) for i in range(1000)])
    with closing(Ledger.open(tmp_path / "state" / "ledger.sqlite")) as ledger:
        import_rows(path, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None, progress=seen.append,
                    progress_every=250)
    assert seen == [250, 500, 750, 1000]
    blocks: list[int] = []  # the columnar path: after each block it reads
    with closing(Ledger.open(tmp_path / "state2" / "ledger.sqlite")) as ledger:
        columnar.import_file(path, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None,
                             progress=blocks.append, block_bytes=8192)
    assert len(blocks) > 3 and blocks == sorted(set(blocks)) and blocks[-1] == 1000


def test_progress_on_a_terminal(tmp_path: Path) -> None:
    """What a person sees on a terminal (a pty): rows, rate and the line ended before the summary."""
    import os
    import pty
    import subprocess
    import sys

    path = log(tmp_path, [(float(i), 50.0) for i in range(200)])
    leader, follower = pty.openpty()
    proc = subprocess.run([sys.executable, "-m", "gpuwear", "import", "nvidia-smi", str(path), "--timezone", "UTC",
                           "--state-dir", str(tmp_path / "s")], stderr=follower, stdout=subprocess.PIPE, text=True,
                          timeout=60)
    os.close(follower)
    os.close(leader)
    assert proc.returncode == 0 and "200 row(s) imported" in proc.stdout


@pytest.mark.slow
def test_per_day_comparisons_need_six_hours(tmp_path: Path) -> None:
    """A one-hour burst is not extrapolated to a day of wear against the everyday profiles."""
    import json
    import subprocess
    import sys

    def gpuwear(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "gpuwear", *args, "--state-dir", str(tmp_path / "s")],
                              check=True, capture_output=True, text=True).stdout

    gpuwear("import", "nvidia-smi", str(log(tmp_path, [(60.0 * i, 80.0 - 30 * (i % 2)) for i in range(61)])),
            "--timezone", "UTC")
    g = json.loads(gpuwear("report", "--json"))["gpus"][0]
    assert g["comparison"] == {"observed_seconds": 3600.0, "minimum_seconds": 21600, "compared": False}
    assert all(p["observed_thermal_aging_ratio"] is None for p in g["reference_profiles"])
    assert "not compared with everyday profiles: 1.0 h observed, at least 6.0 h needed" in gpuwear("report")


def test_cycles_survive_the_merge_when_no_time_was_observed(tmp_path: Path) -> None:
    """Before: an import whose every interval was a gap kept its cycles in the ledger, but the merged view
    (report, metrics) walked only the sensors with time at temperature: 29 cycles of 40 °C -> 0."""
    rows = [(60.0 * i, 40.0 + (i % 2) * 40) for i in range(61)]
    _, w = run(tmp_path, log(tmp_path, rows), max_gap=30.0)
    assert w.observed_seconds == 0.0
    assert w.all_cycles("gpu").get("40:80", 0.0) >= 29


def test_a_reader_that_leaves_early_loses_nothing(tmp_path: Path) -> None:
    """`gpuwear import ... | head -1`: the import is saved, and the command ends quietly (before: a
    BrokenPipeError traceback)."""
    import subprocess
    import sys

    paths = [log(tmp_path, [(float(i), 50.0) for i in range(100)], name=f"smi{k}.csv", uuid=f"GPU-{k}")
             for k in range(40)]
    proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "import", "nvidia-smi", *map(str, paths), "--timezone",
                             "UTC", "--state-dir", str(tmp_path / "s")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err
    with closing(Ledger.open(tmp_path / "s" / "ledger.sqlite")) as ledger:
        assert ledger._db.execute("SELECT count(*) FROM imports").fetchone()[0] >= 1


def test_the_import_says_when_it_reads_row_by_row(tmp_path: Path) -> None:
    """A file the columnar reader cannot read exactly (here a blank line) is read row by row, and said so."""
    import subprocess
    import sys

    path = log(tmp_path, [(float(i), 50.0) for i in range(100)])
    path.write_text(path.read_text().replace("\n", "\n\n", 5))
    out = subprocess.run([sys.executable, "-m", "gpuwear", "import", "nvidia-smi", str(path), "--timezone", "UTC",
                          "--state-dir", str(tmp_path / "s")], capture_output=True, text=True, check=True).stdout
    assert "read row by row, more slowly (a blank line" in out and "100 row(s) imported" in out


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwear", *args, "--state-dir", str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120, check=False)


NAMED = "timestamp, name, temperature.gpu, power.draw [W], utilization.gpu [%]\n"


def named_log(tmp_path: Path, name: str, card: str, start: float) -> Path:
    path = tmp_path / name
    path.write_text(NAMED + "".join(f"{stamp(START + start + i)}, {card}, 60, 100.00 W, 90 %\n" for i in range(30)))
    return path


def test_gpu_refuses_logs_that_name_different_cards(tmp_path: Path) -> None:
    """Before: `import --gpu X a.csv b.csv` merged an A100's log and an RTX 4090's into one card without a word,
    although the import promises logs of different cards are never merged. Now nothing is imported and one line
    names both cards; one card named two ways ("NVIDIA " or not, case) is one card; within one file too."""
    a100 = named_log(tmp_path, "a.csv", "NVIDIA A100-SXM4-80GB", 0)
    geforce = named_log(tmp_path, "b.csv", "NVIDIA GeForce RTX 4090", 100)
    result = _cli(tmp_path, "import", "nvidia-smi", str(a100), str(geforce), "--gpu", "GPU-one", "--timezone", "UTC")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "NVIDIA A100-SXM4-80GB in" in line and "NVIDIA GeForce RTX 4090 in" in line and "never merged" in line
    assert not (tmp_path / "s" / "ledger.sqlite").exists() or "GPU-one" not in _cli(tmp_path, "report").stdout
    same = named_log(tmp_path, "c.csv", "a100-sxm4-80gb", 200)
    ok = _cli(tmp_path, "import", "nvidia-smi", str(a100), str(same), "--gpu", "GPU-one", "--timezone", "UTC")
    assert ok.returncode == 0, ok.stderr
    both = tmp_path / "both.csv"
    both.write_text(a100.read_text() + "".join(line for line in geforce.read_text().splitlines(keepends=True)[1:]))
    with closing(Ledger.open(tmp_path / "other" / "ledger.sqlite")) as ledger:
        for reader in (import_rows, columnar.import_file):  # both paths resolve a row's card the same way
            with pytest.raises(ImportFormatError, match="names different cards"):
                reader(both, ledger, PARAMS, gpu="GPU-two", tz=datetime.timezone.utc, say=lambda _: None)


def test_a_clock_set_back_mid_file_is_said_in_a_few_lines_and_the_zone_is_named(tmp_path: Path) -> None:
    """Before: a log whose clock was set back an hour half way printed one "goes back in time" line for each of its
    1,800 later rows, and the import never said in which zone it read timestamps without an offset."""
    rows = [(float(i), 60.0) for i in range(1800)] + [(float(i) - 3600.0 + 1800, 60.0) for i in range(1800)]
    path = log(tmp_path, rows)
    result = _cli(tmp_path, "import", "nvidia-smi", str(path), "--timezone", "UTC")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 6, lines
    assert sum("goes back in time" in line for line in lines) == 6
    assert "1795 more row(s) like those above" in lines[-1] and "clock set back" in lines[-1]
    assert "timestamps without a UTC offset read in UTC (--timezone)" in result.stdout
    local = _cli(tmp_path, "import", "nvidia-smi", str(log(tmp_path, [(5000.0, 60.0)], name="one.csv")))
    assert "read in this machine's zone" in local.stdout and "--timezone names another" in local.stdout


def test_the_cadence_said_is_the_median_interval_of_the_whole_log(tmp_path: Path) -> None:
    """Before: "a row every 0.513 s" for the RTX 4060 trace, whose logger wrote 2 rows a second for its first
    minutes and then one a second (median 1.00 s over the file): the first 200 intervals spoke for the file."""
    trace = Path(__file__).parent / "fixtures" / "traces" / "rtx4060laptop_gpuburn-cycles_1s_llm-gpu-stress.csv"
    result = _cli(tmp_path, "import", "nvidia-smi", str(trace), "--gpu", "GPU-4060", "--timezone", "UTC")
    assert result.returncode == 0, result.stderr
    assert "a row every 1 s (median)" in result.stdout, result.stdout


@pytest.mark.parametrize("where", ["first row", "last row", "first row after a gap", "last row before a gap"])
def test_a_glitch_with_one_neighbour_is_not_believed(where: str, tmp_path: Path) -> None:
    """Before: a 0 °C glitch as the first or last row of a log, or beside a gap, was believed (judging a spike
    needed a neighbour on each side): it added a 60 °C cycle, 0.84-1.69 reference cycles. Now a reading whose one
    neighbour, within 10 s, is 30 °C or more away is a spike there too; both readers agree."""
    rows: list[tuple[float, float | None]] = [(float(i), 60.0 + (i % 3)) for i in range(600)]
    rows += [(float(i), 60.0 + (i % 3)) for i in range(4000, 4600)]  # a gap of an hour between
    glitch = {"first row": 0, "last row": len(rows) - 1, "first row after a gap": 600,
              "last row before a gap": 599}[where]
    rows[glitch] = (rows[glitch][0], 0.0)
    path = log(tmp_path, rows)
    result, wear = run(tmp_path, path)
    assert result.excluded[next(iter(result.imported))]["spike"] == 1
    assert biggest_cycle(wear) < 10, wear.all_cycles("gpu")
    with closing(Ledger.open(tmp_path / "rows" / "ledger.sqlite")) as ledger:  # the row path: the same
        rows_result = import_rows(path, ledger, PARAMS, tz=datetime.timezone.utc, say=lambda _: None)
        rows_wear = next(iter(ledger.load_imported(PARAMS.cycles.hysteresis_celsius).values()))
    assert rows_result.excluded == result.excluded
    assert rows_wear.to_json() == wear.to_json()


def test_an_imported_card_is_judged_against_its_products_shutdown_threshold(tmp_path: Path) -> None:
    """Before: every imported card was judged against 110 + 5 °C, so a log naming an A100 held at 100 °C was
    believed, though an A100 shuts down at 92 °C (nvidia-smi -q: "GPU Shutdown Temp : 92 C"). Now a log whose name
    column names a product of known shutdown threshold is judged against it, by both readers; an unknown name
    keeps the general limit."""
    header = "timestamp, name, temperature.gpu, power.draw [W], utilization.gpu [%]\n"
    for card, believed in (("NVIDIA A100-SXM4-80GB", False), ("Some Other GPU", True)):
        path = tmp_path / f"{card[:4]}.csv"
        path.write_text(header + "".join(f"{stamp(START + i)}, {card}, {100 if 20 <= i < 40 else 60}, 300.00 W, 99 %\n"
                                         for i in range(120)))
        result, wear = run(tmp_path / card[:4], path, gpu=f"GPU-{card[:4]}")
        uuid = next(iter(result.imported))
        assert (result.excluded[uuid].get("above_shutdown", 0) == 0) is believed, result.excluded
        with closing(Ledger.open(tmp_path / card[:4] / "rows" / "ledger.sqlite")) as ledger:
            rows = import_rows(path, ledger, PARAMS, gpu=f"GPU-{card[:4]}", tz=datetime.timezone.utc,
                               say=lambda _: None)
            assert rows.excluded == result.excluded  # the row reader judges it the same
        assert ("100" in wear.temperature_seconds.get("gpu", {})) is believed
