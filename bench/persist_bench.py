"""Ledger persist time and bytes written, in-process, at the daemon's real cadence.

    python bench/persist_bench.py SCENARIO STATE_DIR TICKS [--persist-every 60]

Builds the daemon as ``gpuwear run --simulate SCENARIO`` does, but on a manual clock: each
tick advances simulated time by 1 s (the sampling interval) and calls ``Daemon._tick()``;
every ``--persist-every`` ticks (the default ``wear.persist_interval_seconds``, 60) it calls
``Daemon.persist()`` and records its wall time and the bytes the process passed to write()
during it (``/proc/self/io`` wchar: SQLite's database and WAL writes), and after each save
the number of live Python objects and the RSS (something kept per tick would show here: the
simulated week under --speed has 400x fewer ticks than a real one). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import sqlite3
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil

from gpuwear import service
from gpuwear.backends.nvml import NvmlBackend
from gpuwear.clock import ManualClock
from gpuwear.config import Config
from gpuwear.sim.fakenvml import FakeNvmlLibrary
from gpuwear.sim.simulated import load_scenario


def _sizes(ledger: Path) -> dict[str, int]:
    """File sizes (db, -wal, -shm) and the logical size: page_count x page_size as a reader sees the
    latest commit (the WAL included), i.e. the size the database has once checkpointed."""
    out = {}
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(ledger) + suffix)
        out[suffix or "db"] = p.stat().st_size if p.exists() else 0
    out["logical"] = logical_size(ledger)
    return out


def logical_size(path: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return int(db.execute("PRAGMA page_count").fetchone()[0]) * int(
                db.execute("PRAGMA page_size").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("state_dir")
    parser.add_argument("ticks", type=int)
    parser.add_argument("--persist-every", type=int, default=60)
    args = parser.parse_args()

    config = replace(Config(), state_dir=args.state_dir)
    simulation = load_scenario(args.scenario)
    clock = ManualClock(start_wall=time.time())
    backend = NvmlBackend(FakeNvmlLibrary(simulation, clock))
    sampler = service._sampler(backend, clock, config)
    sampler.open()
    source = service.Source(sampler, clock, service._info("simulated", simulation.name), 1.0, simulation)
    daemon = service.Daemon(config, source)
    io = psutil.Process().io_counters
    persists: list[dict[str, float]] = []
    tick_cpu: list[float] = []
    daemon._tick()
    daemon.persist()  # the first save creates the rows; measured ones follow
    sizes0 = _sizes(daemon.ledger_file)
    live: list[tuple[int, int, int]] = []  # (tick, live objects, RSS) after each save: a leak per tick shows here
    for i in range(args.ticks):
        clock.advance(1.0)
        c = time.process_time()
        daemon._tick()
        tick_cpu.append(time.process_time() - c)
        if (i + 1) % args.persist_every == 0:
            w0 = io().write_chars
            t0, c0 = time.perf_counter(), time.process_time()
            ok = daemon.persist()
            persists.append({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                             "write_bytes": io().write_chars - w0, "ok": ok})
            gc.collect()
            live.append((i + 1, len(gc.get_objects()), psutil.Process().memory_info().rss))
    sizes1 = _sizes(daemon.ledger_file)
    sampler.close()
    if daemon.ledger is not None:
        daemon.ledger.close()
    tick_cpu.sort()
    json.dump({
        "gpus": len(simulation.gpus), "ticks": args.ticks, "simulated_seconds": float(args.ticks),
        "persists": persists, "sizes_start": sizes0, "sizes_end": sizes1, "live": live,
        "tick_cpu_median": tick_cpu[len(tick_cpu) // 2] if tick_cpu else None,
        "tick_cpu_mean": sum(tick_cpu) / len(tick_cpu) if tick_cpu else None,
    }, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
