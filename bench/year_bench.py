"""The ledger over a simulated year, in-process: its size month by month and the bytes its saves write.

    python bench/year_bench.py [GPUS] [--days 365]

The daemon as ``gpuwear run --simulate`` builds it (the benchmark scenario of bench/gen.py: mixed products,
jobs starting and ending every 1.5 h), on a manual clock with 15-minute ticks (``wear.max_gap_seconds`` raised to
match: a year of 1 s ticks would take a day) and a save every simulated hour, default retention (90 days of
job records). Prints one JSON object: the ledger's logical size (page_count x page_size) at the end of each
30 days, job records kept, and bytes written per save (``/proc/self/io`` wchar). The bytes per real day at the
daemon's own cadence (1 s ticks, a save a minute) are bench/persist_bench.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
from persist_bench import logical_size

from gpuwear import service
from gpuwear.backends.nvml import NvmlBackend
from gpuwear.clock import ManualClock
from gpuwear.config import Config
from gpuwear.sim.fakenvml import FakeNvmlLibrary
from gpuwear.sim.simulated import load_scenario

TICK = 900.0
TICKS_PER_SAVE = 4


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("gpus", type=int, nargs="?", default=8)
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuwear-year-"))
    config = Config(state_dir=str(work / "state"))
    config = replace(config, wear=replace(config.wear, max_gap_seconds=2 * TICK),
                     sampling=replace(config.sampling, slow_interval_seconds=TICK))
    simulation = load_scenario(str(gen.scenario(args.gpus, work)))
    simulation.max_step_seconds = 30.0
    clock = ManualClock(start_wall=time.time())
    sampler = service._sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.open()
    daemon = service.Daemon(config, service.Source(sampler, clock, service._info("simulated", "year"), 1.0,
                                                   simulation))
    io = psutil.Process().io_counters
    months: list[dict[str, float]] = []
    writes: list[int] = []
    started = time.monotonic()
    ticks_per_day = int(86400 / TICK)
    for tick in range(1, args.days * ticks_per_day + 1):
        clock.advance(TICK)
        daemon._tick()
        if tick % TICKS_PER_SAVE == 0:
            before = io().write_chars
            assert daemon.persist()
            writes.append(io().write_chars - before)
        if tick % (30 * ticks_per_day) == 0 or tick == args.days * ticks_per_day:
            assert daemon.ledger is not None
            jobs = daemon.ledger._db.execute("SELECT count(*) FROM jobs").fetchone()[0]
            months.append({"day": tick / ticks_per_day, "logical_bytes": logical_size(daemon.ledger_file),
                           "job_records": jobs})
            print(f"day {tick // ticks_per_day}: {months[-1]['logical_bytes'] / 2**20:.2f} MiB, {jobs} job records",
                  file=sys.stderr)
    daemon.stop()
    json.dump({"gpus": args.gpus, "days": args.days, "months": months, "saves": len(writes),
               "write_per_save_mean": sum(writes) / len(writes), "seconds": time.monotonic() - started}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
