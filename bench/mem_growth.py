"""What grows in gpuwear's heap over simulated days, in-process (a diagnostic, not a metric).

    python bench/mem_growth.py SCENARIO STATE_DIR [--days 7] [--tick 400]

Builds the daemon as ``gpuwear run --simulate SCENARIO --speed S`` does, on a manual clock
that moves ``--tick`` simulated seconds per tick (what a tick covers at ``--speed 20000``:
the daemon ticks every 0.02 wall s), saving the ledger every ``persist_interval_seconds`` of
simulated time. GPUs are read one after the other (no NVML deadline: tracing slows the fake
down a lot). Prints one JSON object: RSS and live objects by type at the end of each
simulated day, and, traced with tracemalloc during the last day only, the allocation sites
whose live memory grew most over that day.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from dataclasses import replace

import psutil

from gpuwear import service
from gpuwear.backends.nvml import NvmlBackend
from gpuwear.clock import ManualClock
from gpuwear.config import Config
from gpuwear.sim.fakenvml import FakeNvmlLibrary
from gpuwear.sim.simulated import load_scenario


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("state_dir")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--tick", type=float, default=400.0, help="simulated seconds per tick")
    args = parser.parse_args()

    config = replace(Config(), state_dir=args.state_dir)
    config = replace(config, sampling=replace(config.sampling, nvml_deadline_seconds=0.0))
    simulation = load_scenario(args.scenario)
    clock = ManualClock(start_wall=time.time())
    sampler = service._sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.open()
    # speed = tick seconds per 0.02 wall s, so the wear gap limit scales as under --speed
    speed = args.tick / service.MIN_WALL_INTERVAL_SECONDS
    daemon = service.Daemon(config, service.Source(sampler, clock, service._info("simulated", simulation.name),
                                                   speed, simulation))
    me = psutil.Process()
    day = 86400.0
    ticks_per_day = int(day / args.tick)
    total = int(args.days * ticks_per_day)
    since_save = 0.0
    per_day = []
    first = None
    for i in range(1, total + 1):
        clock.advance(args.tick)
        daemon._tick()
        since_save += args.tick
        if since_save >= config.wear.persist_interval_seconds:
            daemon.persist()
            since_save = 0.0
        if i % ticks_per_day == 0:
            gc.collect()
            types: dict[str, int] = {}
            for obj in gc.get_objects():
                name = type(obj).__name__
                types[name] = types.get(name, 0) + 1
            per_day.append({"day": i // ticks_per_day, "rss": me.memory_info().rss, "objects": len(gc.get_objects()),
                            "types": types})
            if total - i < ticks_per_day and first is None:  # trace the last day only
                tracemalloc.start(8)
                first = tracemalloc.take_snapshot()
    gc.collect()
    last = tracemalloc.take_snapshot() if first is not None else None
    growth = []
    if first is not None and last is not None:
        for stat in last.compare_to(first, "traceback")[:8]:
            frames = [f"{f.filename.split('site-packages/')[-1].split('daemon/')[-1]}:{f.lineno}"
                      for f in stat.traceback if "tracemalloc" not in f.filename][-4:]
            growth.append({"size_diff": stat.size_diff, "count_diff": stat.count_diff, "where": frames})
    sampler.close()
    if daemon.ledger is not None:
        daemon.ledger.close()
    if len(per_day) >= 2:  # object types that grew from the first day to the last
        a, b = per_day[0]["types"], per_day[-1]["types"]
        grew = sorted(((b.get(k, 0) - a.get(k, 0), k) for k in set(a) | set(b)), reverse=True)[:10]
    else:
        grew = []
    for d in per_day:
        del d["types"]
    json.dump({"gpus": len(simulation.gpus), "tick_seconds": args.tick, "per_day": per_day, "growth": growth,
               "types_grown": [[k, n] for n, k in grew if n > 0]}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
