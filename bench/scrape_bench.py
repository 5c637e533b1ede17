"""What a Prometheus scrape costs and carries, the way Prometheus sees it: 15 s of ticks between two scrapes.

    python bench/scrape_bench.py [GPUS ...] [--days 7] [--rounds 100] [--detail] [--ticks 15] [--warm]
                                 [--against REV [--pairs 2]]

For each GPU count: the daemon as ``gpuwear run --simulate`` builds it (the benchmark scenario of bench/gen.py:
mixed products, jobs starting and ending every 1.5 h), on a manual clock. First a history of ``--days``
simulated days in 5-minute ticks (``wear.max_gap_seconds`` raised to match; a week of 1 s ticks would take an
hour), then ``--rounds`` rounds of: ``--ticks`` 1 s ticks (15: Prometheus' interval; 1 in the figures before
2026-12-05), then one scrape. Every scrape therefore re-renders: nothing is served from the per-tick cache, as with
Prometheus at a 15 s interval over a 1 s tick; the wear views take in 15 ticks' worth, as then. The CPU rounds run
first, in this thread, before the daemon's threads start (its XID listener drives the fake library's simulation);
then as many scrapes over HTTP. Before each scrape the CPU's caches are emptied (:class:`Evictor`), as a scrape every
15 s meets them on a host that does other work; ``--warm`` leaves them as the tick left them (bench/README.md: the
figures before 2026-12-05 are warm).

Per scrape it reports the CPU (``time.thread_time``: this thread only) of rendering the body Prometheus asks for
(OpenMetrics, gzip), split into the wear views, the text and the compression (medians over the rounds, and the mean
of the totals); the CPU the daemon's threads spend on a scrape through its front door (``door_cpu_ms``: the
process's CPU clock around each request over one kept-alive connection, less the client thread's; the render plus
HTTP framing, the loop's wake-ups and the socket's system time, which the render alone leaves out); the series per
GPU (sample lines carrying a ``uuid`` label, per GPU; the daemon's own lines apart); the bytes on the wire, gzip'd
and plain; and the latency of a real HTTP scrape (the daemon's front door on loopback, a new connection, Prometheus'
Accept and Accept-Encoding headers), timed by the client right after each tick. ``--detail`` sets ``metrics.detail:
true``. Prints one JSON object per GPU count.

The CPU figures of a 2-core VM move by up to 2.5x between sessions (other tenants) and by ±20 % within one, so
each round also times a fixed calibration workload (float formatting and dict lookups, the scrape's kind of
work) right after its scrape: ``per_calibration`` (the median ratio) compares runs made on different days.
``--against REV`` measures, in the same run, the code of a git revision (a temporary worktree; this script)
alternately with the working tree's, ``--pairs`` times, and gives the ratio of the medians: what a change
saved, free of the machine's speed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
from common import ROOT, revision

from gpuwear import service
from gpuwear.backends.nvml import NvmlBackend
from gpuwear.clock import ManualClock
from gpuwear.config import Config
from gpuwear.sim.fakenvml import FakeNvmlLibrary
from gpuwear.sim.simulated import load_scenario

HISTORY_TICK = 300.0
PARTS = ("views", "text", "gzip")
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def _series(body: bytes, gpus: int) -> dict[str, float]:
    per_gpu = other = 0
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            if 'uuid="' in line:
                per_gpu += 1
            else:
                other += 1
    return {"per_gpu": per_gpu / gpus, "daemon": other, "per_gpu_all": (per_gpu + other) / gpus}


def _calibration() -> float:
    """CPU milliseconds of a fixed workload of the scrape's kind (floats formatted, dicts read and written)."""
    c0 = time.thread_time()
    lines: dict[int, str] = {}
    for i in range(4_000):
        lines[i & 1023] = f"x{{{lines.get(i & 511, '')[:8]}}} {i * 1.37!r}\n"
    return (time.thread_time() - c0) * 1e3


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def daemon_with_history(gpus: int, days: float, detail: bool,
                        start_wall: float | None = None) -> tuple[service.Daemon, ManualClock, float]:
    """The daemon in-process on bench/gen.py's scenario and a manual clock, after ``days`` of history in 5-minute
    ticks, its collector settled as Daemon.start leaves it; and the seconds the history took. ``start_wall``: the wall
    time the history ends at (default: now)."""
    work = Path(tempfile.mkdtemp(prefix="gpuwear-scrape-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = Config(state_dir=str(work / "state"), listen=f"127.0.0.1:{port}")
    config = replace(config, wear=replace(config.wear, max_gap_seconds=2 * HISTORY_TICK,
                                          persist_interval_seconds=86400.0),
                     sampling=replace(config.sampling, interval_seconds=3600.0))  # the loop stays out of the way
    if detail:
        config = replace(config, metrics=replace(config.metrics, detail=True))
    simulation = load_scenario(str(gen.scenario(gpus, work)))
    simulation.max_step_seconds = 30.0
    clock = ManualClock(start_wall=(time.time() if start_wall is None else start_wall) - days * 86400)
    sampler = service._sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.open()
    daemon = service.Daemon(config, service.Source(sampler, clock, service._info("simulated", "scrape"), 1.0,
                                                   simulation))
    t0 = time.monotonic()
    for _ in range(int(days * 86400 / HISTORY_TICK)):
        clock.advance(HISTORY_TICK)
        daemon._tick()
    history_s = time.monotonic() - t0
    try:  # the collector as Daemon.start leaves it
        from gpuwear.runtime import settle_collector
    except ImportError:  # an older revision's (--against): in service.py, or not there
        settle_collector = getattr(service, "settle_collector", None)
    if settle_collector is not None:
        settle_collector()
    else:
        gc.collect()
        gc.freeze()
    return daemon, clock, history_s


class Evictor:
    """Puts the CPU's caches in the state a scrape every 15 s meets: a write to every cache line of a buffer twice
    the size of this machine's largest cache (the other processes of a busy host, and the daemon's own ticks, have
    long replaced what the last scrape left there). Off: nothing."""

    LINE = 64  # bytes

    def __init__(self, on: bool) -> None:
        size = 32 << 20  # where sysfs does not say: more than most servers' last-level cache
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):  # e.g. "32768K"
            with contextlib.suppress(OSError, ValueError):
                text = index.read_text().strip()
                size = max(size, int(text.rstrip("KM")) << {"K": 10, "M": 20}.get(text[-1], 0))
        self.buffer = bytearray(2 * size) if on else None
        self._ones = b"\1" * (len(self.buffer) // self.LINE) if self.buffer is not None else b""

    def __call__(self) -> None:
        if self.buffer is not None:
            self.buffer[::self.LINE] = self._ones


def run(gpus: int, days: float, rounds: int, detail: bool, cold: bool = True, ticks: int = 15) -> dict[str, Any]:
    daemon, clock, history_s = daemon_with_history(gpus, days, detail)
    evict = Evictor(cold)

    def tick() -> None:  # the 1 s ticks between two scrapes
        for _ in range(ticks):
            clock.advance(1.0)
            daemon._tick()
    exposition = daemon.exposition
    rounds_ms: list[tuple[float, float, float]] = []  # (views, text, gzip) per scrape
    calibration: list[float] = []  # the calibration workload's CPU ms after each
    body = plain = b""
    for _ in range(rounds):  # the CPU of rendering, before the daemon's own threads start (none of the scrape's)
        tick()
        evict()
        c0 = time.thread_time()
        daemon.published()  # the wear views, derived at the first scrape after a tick
        c1 = time.thread_time()
        plain = exposition.render(True)
        c2 = time.thread_time()
        body = exposition.render(True, gzipped=True)
        c3 = time.thread_time()
        rounds_ms.append(((c1 - c0) * 1e3, (c2 - c1) * 1e3, (c3 - c2) * 1e3))
        calibration.append(_calibration())
    latencies: list[float] = []
    door_ms: list[float] = []
    daemon.start()
    try:
        for i in range(rounds):  # then real scrapes over HTTP, each after new ticks
            tick()
            conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
            t = time.perf_counter()
            conn.request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
            response = conn.getresponse()
            data = response.read()
            latencies.append(time.perf_counter() - t)
            conn.close()
            if response.status != 200 or gzip.decompress(data)[-6:] != b"# EOF\n":
                raise RuntimeError(f"scrape {i}: HTTP {response.status}")
        # and the CPU a scrape costs the daemon's threads through its front door (the HTTP loop and the render
        # worker): the process's CPU clock (every thread) around each request over one kept-alive connection, as
        # Prometheus keeps it, less this thread's own (the client's); each request after a new tick
        kept = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
        for i in range(rounds):
            tick()
            evict()
            p0, t0 = time.process_time(), time.thread_time()
            kept.request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
            response = kept.getresponse()
            data = response.read()
            door_ms.append(((time.process_time() - p0) - (time.thread_time() - t0)) * 1e3)
            if response.status != 200:
                raise RuntimeError(f"scrape {i}: HTTP {response.status}")
        kept.close()
    finally:
        daemon.stop()
    return {
        "gpus": gpus, "days": days, "rounds": rounds, "detail": detail, "cold": cold, "ticks": ticks,
        "history_seconds": round(history_s, 1),
        # the median scrape (a 2-core VM's neighbours make some rounds take twice as long) and the mean
        "cpu_ms": {"total": statistics.median(sum(r) for r in rounds_ms),
                   **{part: statistics.median(r[i] for r in rounds_ms) for i, part in enumerate(PARTS)},
                   "mean": sum(map(sum, rounds_ms)) / rounds},
        "calibration_ms": statistics.median(calibration),
        "per_calibration": statistics.median(sum(r) / c for r, c in zip(rounds_ms, calibration, strict=True)),
        "series": _series(plain, gpus),
        "bytes": {"gzip": len(body), "plain": len(plain), "gzip_per_gpu": len(body) / gpus},
        # in process, through the front door: what bench/scrape_outside.py measures from outside, less the sampler
        "door_cpu_ms": {"median": statistics.median(door_ms), "min": min(door_ms), "max": max(door_ms)},
        "http_ms": {"p50": statistics.median(latencies) * 1e3, "p99": _percentile(latencies, 0.99) * 1e3,
                    "max": max(latencies) * 1e3},
    }


def against(rev: str, gpus: int, days: float, rounds: int, detail: bool, pairs: int,
            cold: bool = True, ticks: int = 15) -> dict[str, Any]:
    """This script on the working tree's code and on ``rev``'s, alternately, each in a fresh process: the medians
    of both and their ratios (working tree / rev)."""
    args = [sys.executable, __file__, str(gpus), "--days", str(days), "--rounds", str(rounds)]
    args += (["--detail"] if detail else []) + ([] if cold else ["--warm"]) + ["--ticks", str(ticks)]
    runs: dict[str, list[dict[str, Any]]] = {"tree": [], rev: []}
    with revision(rev) as tree:
        for _ in range(pairs):
            for name, path in (("tree", ROOT / "daemon"), (rev, tree / "daemon")):
                env = {**os.environ, "PYTHONPATH": str(path)}
                out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
                runs[name].append(json.loads(out))

    def median(name: str, key: str) -> float:
        return float(statistics.median(r[key] if key != "cpu_ms" else r[key]["total"] for r in runs[name]))

    return {"gpus": gpus, "against": rev, "pairs": pairs,
            **{f"{key}_{name}": median(name, key) for key in ("cpu_ms", "per_calibration") for name in runs},
            "cpu_ms_ratio": median("tree", "cpu_ms") / median(rev, "cpu_ms"),
            "per_calibration_ratio": median("tree", "per_calibration") / median(rev, "per_calibration")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gpus", type=int, nargs="*", default=[8, 64])
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--detail", action="store_true")
    parser.add_argument("--against", metavar="REV", help="also measure this git revision's code, alternately")
    parser.add_argument("--pairs", type=int, default=2, help="with --against: runs of each (default 2)")
    parser.add_argument("--ticks", type=int, default=15,
                        help="1 s ticks before each scrape (default 15: Prometheus' 15 s interval)")
    parser.add_argument("--warm", action="store_true",
                        help="leave the CPU's caches as the tick left them (default: emptied before each scrape)")
    args = parser.parse_args()
    for n in args.gpus:
        if args.against:
            print(json.dumps(against(args.against, n, args.days, args.rounds, args.detail, args.pairs, not args.warm,
                                     args.ticks)), flush=True)
        else:
            print(json.dumps(run(n, args.days, args.rounds, args.detail, not args.warm, args.ticks)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
