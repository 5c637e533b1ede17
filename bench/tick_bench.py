"""CPU per sampling tick, in-process, with the fake library's simulation advanced once per tick.

    python bench/tick_bench.py interleaved SCENARIO TICKS STATE_DIR [NVML_DEADLINE_SECONDS]
    python bench/tick_bench.py events SCENARIO SECONDS

``interleaved``: over the fake library driven by a manual clock (1 simulated second per tick),
each tick times with ``time.process_time`` (all threads), one right after the other:

* ``bare``: the pynvml calls of ``bench/bare_nvml.py`` for every GPU (slow set every 30 ticks);
* gpuwear: what ``Daemon._tick`` does, split into its parts: ``Sampler.tick`` (the NVML reads,
  on the reader thread unless the deadline is 0, validation, snapshot), the job watcher,
  ``WearTracker.observe`` (wear accumulators, job attribution).

Then, the first scrape after a tick (what Prometheus pays for each scrape): the wear views derived
(``views``) and the text exposition rendered (``render``); later scrapes until the next tick get
the cached body.

The simulation is advanced before both, outside the timing, so each pays for its own calls only;
timed tick by tick in one process, the two share whatever else the machine does (separate runs
of the same loop differ by up to ±50 % on the 2-core VM this was written on; the ratio of the
interleaved figures varies by a few per cent).

``events`` measures something else: the CPU share of an XID listener looping in
``nvmlEventSetWait(500 ms)`` over the fake, at real time: a cost that gpuwear and the bare
loop pay and nvitop-exporter (no listener) does not. A real driver blocks in the kernel;
the fake advances the whole simulation at each wake-up (it polled every 20 ms before commit
f9a47bc, which made this about 1-4 % of a core).

This leaves out what a running process adds (HTTP server, periodic loops, XID listener) and
the fake's simulation steps, so gpuwear / bare here is gpuwear's processing against the calls
alone. Prints one JSON object (mean CPU seconds per tick, after 40 warm-up ticks).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

WARMUP = 40


def interleaved(scenario: str, ticks: int, state: str, deadline: float | None = None) -> dict[str, float]:
    """Each tick, over one fake library: the bare calls for every GPU, then gpuwear's tick; the fake's
    simulation is advanced before both, outside the timing, so each pays for its calls only and the two
    figures share whatever the machine does meanwhile."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bare_nvml
    import pynvml

    from gpuwear import service
    from gpuwear.backends.nvml import NvmlBackend
    from gpuwear.clock import ManualClock
    from gpuwear.config import Config
    from gpuwear.sim.fakenvml import FakeNvmlLibrary
    from gpuwear.sim.simulated import load_scenario

    config = replace(Config(), state_dir=state)
    if deadline is not None:  # sampling.nvml_deadline_seconds (0: GPUs read one after the other)
        config = replace(config, sampling=replace(config.sampling, nvml_deadline_seconds=deadline))
    simulation = load_scenario(scenario)
    clock = ManualClock(start_wall=time.time())
    library = FakeNvmlLibrary(simulation, clock)
    sampler = service._sampler(NvmlBackend(library), clock, config)
    sampler.open()  # installs the library: the bare calls below go to it too
    d = service.Daemon(config, service.Source(sampler, clock, service._info("simulated", simulation.name), 1.0,
                                              simulation))
    gpus = [bare_nvml.Gpu(i) for i in range(pynvml.nvmlDeviceGetCount())]
    parts = {"bare": 0.0, "sampler": 0.0, "jobs": 0.0, "tracker": 0.0}
    for i in range(WARMUP + ticks):
        clock.advance(1.0)
        library.driver.loaded()  # advances the simulation to the clock
        c0 = time.process_time()
        for g in gpus:
            g.read(i % 30 == 0)
        c1 = time.process_time()
        snapshot = sampler.tick()
        c2 = time.process_time()
        jobs = d.job_watcher.jobs((g.identity.uuid, [pid for pid, _ in g.sample.processes or ()])
                                  for g in snapshot.gpus if g.sample is not None)
        c3 = time.process_time()
        d.tracker.observe(snapshot, clock.monotonic(), clock.wall(), jobs)
        c4 = time.process_time()
        if i >= WARMUP:
            for key, spent in zip(parts, (c1 - c0, c2 - c1, c3 - c2, c4 - c3), strict=True):
                parts[key] += spent
    scrape = {"views": 0.0, "render": 0.0}
    scrapes = max(5, ticks // 10)
    for _ in range(scrapes):  # a scrape after each tick: wear views derived, body rendered (then cached till the next)
        clock.advance(1.0)
        d._tick()
        c0 = time.process_time()
        _views = d.published().wear  # derived on first access
        c1 = time.process_time()
        _body = d.exposition.render(False)
        c2 = time.process_time()
        scrape["views"] += c1 - c0
        scrape["render"] += c2 - c1
    sampler.close()
    out = {k: v / ticks for k, v in parts.items()}
    out["tick"] = out["sampler"] + out["jobs"] + out["tracker"]
    out.update({k: v / scrapes for k, v in scrape.items()})
    return out


def events(scenario: str, seconds: float) -> dict[str, float]:
    import pynvml

    from gpuwear.backends.nvml import install_library
    from gpuwear.clock import SystemClock
    from gpuwear.sim.fakenvml import FakeNvmlLibrary
    from gpuwear.sim.simulated import load_scenario

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
    else:
        result = interleaved(scenario, ticks, sys.argv[4], float(sys.argv[5]) if len(sys.argv) > 5 else None)
    json.dump({"what": what, "ticks": ticks, **result}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
