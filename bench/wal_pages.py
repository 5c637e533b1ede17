"""Where a daemon's ledger writes go: the WAL frames its saves write, by b-tree (table or index), in process.

    python bench/wal_pages.py LEDGER SCENARIO [--ticks 7200] [--every 60]

Copies LEDGER (a ledger of SCENARIO's GPUs, e.g. bench/ledger_years.py's 1-day one) to a temporary state directory,
builds the daemon as ``gpuwear run --simulate SCENARIO`` does on a manual clock, checkpoints the WAL and turns
automatic checkpoints off, then runs ``--ticks`` ticks of 1 s with a save every ``--every``. Each WAL frame names
the page it writes; SQLite's dbstat table names the b-tree each page belongs to (pages freed since, free-list and
pointer-map pages fall under "other"). Prints the frames per save by b-tree, the WAL bytes per GPU and simulated
day, and what a checkpoint then writes to the database file: the distinct 4 KiB file-system pages the frames land
on, for checkpoints every 250 to 4000 frames (the daemon's wal_autocheckpoint is 1000), and the file-system pages
each save's commit dirties in the WAL itself (one fsync each, synchronous=FULL). In-process figures, a
diagnostic: ledger_years.py measures the daemon's writes from outside (/proc/PID/io).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sqlite3
import struct
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from gpuwear import service
from gpuwear.backends.nvml import NvmlBackend
from gpuwear.clock import ManualClock
from gpuwear.config import Config
from gpuwear.sim.fakenvml import FakeNvmlLibrary
from gpuwear.sim.simulated import load_scenario

FS_PAGE = 4096
HEADER, FRAME_HEADER = 32, 24


def frames(wal: bytes) -> tuple[int, list[tuple[int, bool]]]:
    """The WAL's page size and its frames: (page number, whether the frame commits a transaction)."""
    page = struct.unpack(">I", wal[8:12])[0]
    out, off = [], HEADER
    while off + FRAME_HEADER + page <= len(wal):
        number, commit = struct.unpack(">II", wal[off:off + 8])
        out.append((number, commit != 0))
        off += FRAME_HEADER + page
    return page, out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("ledger", type=Path)
    parser.add_argument("scenario")
    parser.add_argument("--ticks", type=int, default=7200)
    parser.add_argument("--every", type=int, default=60, help="ticks between two saves (wear.persist_interval)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwear-wal-") as folder:
        state = Path(folder) / "state"
        target = state / "simulated" / Path(args.scenario).stem / "ledger.sqlite"
        target.parent.mkdir(parents=True)
        for p in (state, state / "simulated", target.parent):
            p.chmod(0o700)
        shutil.copy(args.ledger, target)
        config = replace(Config(), state_dir=str(state))
        simulation = load_scenario(args.scenario)
        clock = ManualClock(start_wall=time.time())
        sampler = service._sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
        sampler.open()
        daemon = service.Daemon(config, service.Source(sampler, clock, service._info("simulated", simulation.name),
                                                       1.0, simulation))
        daemon._tick()
        daemon.persist()
        assert daemon.ledger is not None
        db = daemon.ledger._db
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA wal_autocheckpoint=0")
        saves = 0
        for i in range(args.ticks):
            clock.advance(1.0)
            daemon._tick()
            if (i + 1) % args.every == 0:
                daemon.persist()
                saves += 1
        wal = Path(f"{daemon.ledger_file}-wal").read_bytes()
        page, written = frames(wal)
        with sqlite3.connect(daemon.ledger_file) as reader:
            owner = {number: name for name, number in reader.execute("SELECT name, pageno FROM dbstat")}
        sampler.close()
        daemon.ledger.close()
    gpus, days = len(simulation.gpus), args.ticks / 86400
    per_gpu_day = 1e6 * gpus * days
    by = collections.Counter(owner.get(number, "other (freed, free-list, pointer map)") for number, _ in written)
    print(f"# WAL frames by b-tree: {saves} saves, {len(written)} frames of {page} bytes, {gpus} GPUs, "
          f"{args.ticks} s simulated\n")
    print("| b-tree | frames | per save |\n|---|---|---|")
    for name, n in by.most_common():
        print(f"| {name} | {n} | {n / saves:.1f} |")
    # each commit's frames are contiguous in the WAL; the fsync after it cleans them, so the next commit dirties
    # its first file-system page again
    wal_pages, start = 0, 0
    for i, (_, commit) in enumerate(written):
        if commit:
            a, b = HEADER + start * (FRAME_HEADER + page), HEADER + (i + 1) * (FRAME_HEADER + page)
            wal_pages += (b - 1) // FS_PAGE - a // FS_PAGE + 1
            start = i + 1
    print(f"\nWAL: {len(wal) / per_gpu_day:.2f} MB per GPU per day in frames; {wal_pages * FS_PAGE / per_gpu_day:.2f} "
          f"MB in the {FS_PAGE} B file-system pages the commits dirty\n")
    print("| checkpoint every (frames) | database file pages written | MB per GPU per day | WAL and database |")
    print("|---|---|---|---|")
    for every in (250, 500, 1000, 2000, 4000):
        pages = sum(len({(number - 1) * page // FS_PAGE for number, _ in written[s:s + every]})
                    for s in range(0, len(written), every))
        db_mb = pages * FS_PAGE / per_gpu_day
        print(f"| {every} | {pages} | {db_mb:.2f} | {db_mb + wal_pages * FS_PAGE / per_gpu_day:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
