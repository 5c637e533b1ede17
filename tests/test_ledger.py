"""The ledger keeps wear safe across restarts, crashes and corrupt files."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from conftest import make_rig
from gpuwear.config import WearConfig
from gpuwear.ledger import Event, Ledger, LedgerError
from gpuwear.tracker import WearTracker
from gpuwear.wear.accumulate import GpuWear
from helpers import fetch, free_port, wait_for

if TYPE_CHECKING:
    from gpuwear.service import Daemon


def run_tracker(rig_seconds: int, wears: dict[str, GpuWear], rig_start: int = 0) -> WearTracker:
    rig = make_rig("demo")
    rig.clock.advance(rig_start)  # the wall clock moves on between runs, as it would
    tracker = WearTracker(wears, WearConfig())
    for _ in range(rig_seconds):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    return tracker


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    tracker = run_tracker(300, {})
    ledger = Ledger.open(tmp_path / "ledger.sqlite")
    wears, events, _ = tracker.take()
    ledger.save(wears, [*events, Event(wears[0]["uuid"], 1_800_000_000.0, "test", {"a": 1})])
    loaded = ledger.load(2.0)
    assert sorted(loaded) == sorted(w["uuid"] for w in wears)
    for w in wears:
        again = loaded[w["uuid"]].to_json()
        assert again == json.loads(json.dumps(w))
    assert [e.kind for e in ledger.events(wears[0]["uuid"])][-1] == "test"
    ledger.close()


def test_restart_continues_the_history(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    first = run_tracker(600, {})
    ledger = Ledger.open(path)
    wears, events, jobs = first.take()
    ledger.save(wears, events, jobs=jobs)
    ledger.close()
    before = {u: w.to_json() for u, w in Ledger.open(path).load(2.0).items()}
    # the daemon comes back 100 s later and runs on
    second = run_tracker(600, Ledger.open(path).load(2.0), rig_start=700)
    for uuid, old in before.items():
        w = second.wear(uuid)
        assert w is not None
        assert w.observed_seconds >= old["observed_seconds"] + 598
        assert w.energy_joules > old["energy_joules"]
        assert w.gap_seconds == pytest.approx(old["gap_seconds"] + 101, abs=1)
        for sensor, bins in old["cycles"].items():
            for key, n in bins.items():
                assert w.cycles[sensor].get(key, 0) >= n  # counters never go backwards
        assert w.first_seen == old["first_seen"] and w.last_seen is not None and w.last_seen > old["last_seen"]


@pytest.mark.slow
def test_an_unreadable_file_is_kept_beside_a_new_ledger_never_replaced(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "ledger.sqlite"
    garbage = b"this is not SQLite" * 100
    path.write_bytes(garbage)
    ledger = Ledger.open(path)
    assert ledger.recovered is not None and ledger.recovered.read_bytes() == garbage
    assert ledger.load(2.0) == {}
    assert "is damaged" in caplog.text and str(ledger.recovered) in caplog.text and "nothing readable" in caplog.text
    ledger.close()
    with pytest.raises(LedgerError, match="not a readable gpuwear ledger"):
        Ledger.open_read_only(ledger.recovered)


@pytest.mark.slow
def test_a_truncated_ledger_is_recovered_as_far_as_it_reads(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger.open(path)
    wears, events, _ = run_tracker(60, {}).take()
    ledger.save(wears, events)
    ledger.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    reopened = Ledger.open(path)
    assert reopened.recovered is not None and reopened.recovered.read_bytes() == data[: len(data) // 2]
    reopened.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger.open(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="schema"):
        Ledger.open_read_only(path)


WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {daemon!r})
from gpuwear.ledger import Ledger
from gpuwear.wear.accumulate import GpuWear
ledger = Ledger.open(Path({path!r}))
w = ledger.load(2.0).get("GPU-k", GpuWear("GPU-k"))
print("ready", flush=True)
while True:
    w.observed_seconds += 1
    w.temperature_seconds.setdefault("gpu", {{}})[str(int(w.observed_seconds) % 90)] = w.observed_seconds
    ledger.save([w.to_json()], [])
"""


@pytest.mark.slow
def test_kill_9_during_writes_never_corrupts(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    script = WRITER.format(daemon=str(Path(__file__).parent.parent / "daemon"), path=str(path))
    rng = random.Random(11)
    last = 0.0
    for _ in range(25):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.01, 0.25))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        ledger = Ledger.open(path)
        assert ledger.recovered is None and ledger.set_aside == 0
        observed = ledger.load(2.0)["GPU-k"].observed_seconds
        ledger.close()
        assert observed >= last  # never backwards
        last = observed
    assert last > 25


def lifetime_observed(body: str, gpu: str) -> float:
    for line in body.splitlines():
        if line.startswith(f'gpuwear_lifetime_observed_seconds_total{{gpu="{gpu}"'):
            return float(line.split()[-1])
    raise AssertionError("no gpuwear_lifetime_observed_seconds_total")


def report_json(state: Path) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-m", "gpuwear", "report", "--state-dir", str(state), "--simulated",
                             "--json"], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_daemon_killed_at_random_instants_loses_at_most_one_persist_interval(tmp_path: Path) -> None:
    state = tmp_path / "state"
    speed = 600
    rng = random.Random(5)
    last_saved = 0.0
    for _ in range(6):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", "--speed", str(speed),
                                 "--state-dir", str(state), "--listen", f"127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_lifetime_observed_seconds_total")
            time.sleep(rng.uniform(1.2, 3.0))
            _, body = fetch(f"http://127.0.0.1:{port}/metrics")
            scraped = lifetime_observed(body, "0")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        doc = report_json(state)
        saved = doc["gpus"][0]["observed_seconds"]  # type: ignore[index]
        assert saved >= last_saved
        # one persist interval is 1 s of wall time at this speed (600 simulated s), plus a tick
        assert saved >= scraped - (1.0 + 0.1) * speed
        last_saved = saved
    assert last_saved > 3600  # six runs of 1.2-3 s at x600, each losing at most one save interval


@contextmanager
def demo_daemon(state_dir: Path) -> Iterator[Daemon]:
    """The daemon in-process on the demo scenario at x60, with its ledger in ``state_dir``; stopped after."""
    from gpuwear.config import Config
    from gpuwear.service import Daemon, open_source

    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(state_dir))
    daemon = Daemon(config, open_source(config, "demo", 60.0, False))
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.mark.slow
def test_an_unwritable_state_directory_keeps_sampling_and_saves_when_it_can(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")  # mkdir fails, even for root
    with demo_daemon(blocker) as daemon:
        time.sleep(1.5)
        assert daemon.persist() is False
        _, body = fetch(f"http://127.0.0.1:{daemon.port}/metrics")
        assert "gpuwear_ledger_persist_success 0.0" in body and "gpuwear_temperature_celsius" in body
        observed = lifetime_observed(body, "0")
        assert observed > 30
        blocker.unlink()  # the operator fixes the directory
        assert daemon.persist() is True
        _, body = fetch(f"http://127.0.0.1:{daemon.port}/metrics")
        assert "gpuwear_ledger_persist_success 1.0" in body
    doc = report_json(blocker)
    # nothing sampled while it could not save was lost (the report rounds to the millisecond)
    assert doc["gpus"][0]["observed_seconds"] >= observed - 0.001  # type: ignore[index]


@pytest.mark.slow
def test_a_full_disk_keeps_the_old_state_and_saves_again_later(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with demo_daemon(tmp_path) as daemon:
        time.sleep(1.0)
        assert daemon.persist() is True
        assert daemon.ledger is not None
        db = daemon.ledger._db  # SQLite's own page limit stands in for a full disk
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")
        for _ in range(20):
            time.sleep(0.2)
            if daemon.persist() is False:
                break
        else:
            pytest.fail("the ledger never filled up")
        assert daemon.persist() is True, caplog.text[-3000:]  # the failed connection closed, a fresh one opened
        assert daemon.ledger is not None and daemon.ledger._db is not db  # (without the full one's page limit)
    ledger = Ledger.open_read_only(tmp_path / "simulated" / "demo" / "ledger.sqlite")
    assert ledger.load(2.0)  # never a broken ledger
    ledger.close()


def test_the_ledger_page_cache_is_bounded_to_256_kib(tmp_path: Path) -> None:
    """SQLite's default 2 MiB page cache made the daemon's RSS grow by 2 MiB over its first simulated week
    (bench/results.md, week run): the ledger's connection keeps 256 KiB."""
    ledger = Ledger.open(tmp_path / "ledger.sqlite")
    try:
        assert ledger._db.execute("PRAGMA cache_size").fetchone()[0] == -256
    finally:
        ledger.close()


@pytest.mark.slow
def test_a_daemon_loads_recovery_export_imports_report_and_page_only_when_asked(tmp_path: Path) -> None:
    """Issue 52, item 3: a running daemon loaded the ledger's recovery (400 lines, for a damaged file) and export at
    start though it rarely uses them. Now a daemon made, saving and serving /metrics loads neither, nor the
    imports, the report or the page; a damaged ledger's open loads recovery."""
    import subprocess
    import sys

    code = f"""
import sys, sqlite3
from pathlib import Path
from gpuwear.config import Config
from gpuwear.service import Daemon, open_source
config = Config(listen="127.0.0.1:0", state_dir={str(tmp_path)!r})
daemon = Daemon(config, open_source(config, "demo", 1.0, False))
daemon._tick(); assert daemon.persist(); daemon.exposition.render(False)
mods = sorted(m for m in sys.modules if m.startswith(("gpuwear.ledger.recovery", "gpuwear.ledger.export",
                                                      "gpuwear.imports", "gpuwear.report", "gpuwear.page")))
print(mods)
daemon.stop()
path = Path(daemon.ledger_file)
data = bytearray(path.read_bytes())
data[len(data) // 2:len(data) // 2 + 4096] = bytes(4096)
path.write_bytes(bytes(data))
from gpuwear.ledger import Ledger
try:
    Ledger.open(path).close()
except Exception:
    pass
print("gpuwear.ledger.recovery" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded, recovery = out.stdout.splitlines()[-2:]
    assert loaded == "[]" and recovery == "True", out.stdout
