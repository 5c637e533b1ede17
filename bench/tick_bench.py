"""CPU per sampling tick, in-process, with the fake library's simulation advanced once per tick.

    python bench/tick_bench.py bare|gpuwear SCENARIO TICKS [STATE_DIR [NVML_DEADLINE_SECONDS]]
    python bench/tick_bench.py events SCENARIO SECONDS

Over the fake library driven by a manual clock (1 simulated second per tick, so the fake
integrates each GPU once per tick instead of on every call), this times, with
``time.process_time`` (all threads):

* ``bare``: the pynvml calls of ``bench/bare_nvml.py`` for every GPU (slow set every 30 ticks);
* ``gpuwear``: what ``Daemon._tick`` does, split into its parts: ``Sampler.tick`` (the NVML
  reads on the worker threads, validation, snapshot), the job watcher, ``WearTracker.observe``
  (wear accumulators and the per-GPU views).

``events`` measures something else: the CPU share of an XID listener looping in
``nvmlEventSetWait(500 ms)`` over the fake, at real time: a cost that gpuwear and the bare
loop pay and nvitop-exporter (no listener) does not. A real driver blocks in the kernel;
the fake advances the whole simulation at each wake-up (it polled every 20 ms before commit
f9a47bc, which made this about 1-4 % of a core).

This leaves out what a running process adds (HTTP server, scheduler, XID listener) and most
of the fake's cost, so gpuwear / bare here is the cost of gpuwear's processing against the
calls alone. Prints one JSON object (mean CPU seconds per tick, after 40 warm-up ticks).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

WARMUP = 40


def bare(scenario: str, ticks: int) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bare_nvml
    import pynvml

    from gpuwear.backends.fakenvml import FakeNvmlLibrary
    from gpuwear.backends.nvml import install_library
    from gpuwear.backends.simulated import load_scenario
    from gpuwear.clock import ManualClock

    clock = ManualClock()
    install_library(FakeNvmlLibrary(load_scenario(scenario), clock))
    pynvml.nvmlInit()
    gpus = [bare_nvml.Gpu(i) for i in range(pynvml.nvmlDeviceGetCount())]
    total = 0.0
    for i in range(WARMUP + ticks):
        clock.advance(1.0)
        c = time.process_time()
        for g in gpus:
            g.read(i % 30 == 0)
        if i >= WARMUP:
            total += time.process_time() - c
    return {"tick": total / ticks}


def gpuwear(scenario: str, ticks: int, state: str, deadline: float | None = None) -> dict[str, float]:
    from gpuwear import service
    from gpuwear.backends.fakenvml import FakeNvmlLibrary
    from gpuwear.backends.nvml import NvmlBackend
    from gpuwear.backends.simulated import load_scenario
    from gpuwear.clock import ManualClock
    from gpuwear.config import Config

    config = replace(Config(), state_dir=state)
    if deadline is not None:  # sampling.nvml_deadline_seconds (0: GPUs read one after the other)
        config = replace(config, sampling=replace(config.sampling, nvml_deadline_seconds=deadline))
    simulation = load_scenario(scenario)
    clock = ManualClock(start_wall=time.time())
    sampler = service._sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.open()
    d = service.Daemon(config, service.Source(sampler, clock, service._info("simulated", simulation.name), 1.0,
                                              simulation))
    parts = {"sampler": 0.0, "jobs": 0.0, "tracker": 0.0}
    for i in range(WARMUP + ticks):
        clock.advance(1.0)
        c0 = time.process_time()
        snapshot = sampler.tick()
        c1 = time.process_time()
        jobs = d.job_watcher.jobs((g.identity.uuid, [pid for pid, _ in g.sample.processes or ()])
                                  for g in snapshot.gpus if g.sample is not None)
        c2 = time.process_time()
        d.tracker.observe(snapshot, clock.monotonic(), clock.wall(), jobs)
        c3 = time.process_time()
        if i >= WARMUP:
            parts["sampler"] += c1 - c0
            parts["jobs"] += c2 - c1
            parts["tracker"] += c3 - c2
    sampler.close()
    out = {k: v / ticks for k, v in parts.items()}
    out["tick"] = sum(out.values())
    return out


def events(scenario: str, seconds: float) -> dict[str, float]:
    import pynvml

    from gpuwear.backends.fakenvml import FakeNvmlLibrary
    from gpuwear.backends.nvml import install_library
    from gpuwear.backends.simulated import load_scenario
    from gpuwear.clock import SystemClock

    install_library(FakeNvmlLibrary(load_scenario(scenario), SystemClock()))
    pynvml.nvmlInit()
    event_set = pynvml.nvmlEventSetCreate()
    for i in range(pynvml.nvmlDeviceGetCount()):
        pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError,
                                        event_set)
    c0, t0 = time.process_time(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            pynvml.nvmlEventSetWait(event_set, 500)
        except pynvml.NVMLError:
            pass
    return {"cpu_per_s": (time.process_time() - c0) / (time.monotonic() - t0)}


def main() -> int:
    what, scenario, ticks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if what == "events":
        result = events(scenario, float(ticks))
    elif what == "bare":
        result = bare(scenario, ticks)
    else:
        result = gpuwear(scenario, ticks, sys.argv[4], float(sys.argv[5]) if len(sys.argv) > 5 else None)
    json.dump({"what": what, "ticks": ticks, **result}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
