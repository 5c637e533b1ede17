"""What a real scrape costs the daemon, measured from outside on its own CPU clock, beside nvitop-exporter.

    python bench/scrape_outside.py [--gpus 8,64] [--scrapes 20] [--every 2] [--against REV]

For each GPU count, gpuwear (``gpuwear run --simulate SCENARIO``) and nvitop-exporter (over the fake NVML library:
``python -m gpuwear.sim.fakenvml --scenario SCENARIO nvitop-exporter``) run side by side on the same scenario
(bench/gen.py's), both sampling once a second. Each is scraped ``--scrapes`` times, ``--every`` wall seconds apart,
the two in turn, as Prometheus scrapes: its Accept header and ``Accept-Encoding: gzip``, on one connection kept
alive from scrape to scrape while the server keeps it open (Prometheus 2.0 on: prometheus/prometheus#2498; a
Prometheus 2.42 scraping gpuwear every 15 s held one connection for a minute, bench/scrape_outside.md).
nvitop-exporter's server (prometheus_client's, HTTP/1.0) closes each connection after its answer, so it is met
with a new connection each time, as Prometheus meets it. ``--connection new`` opens a new one for every scrape of
both. At 2 s, as at Prometheus' default 15 s, every scrape follows new samples: none is served from a cache.

- **CPU per scrape**: the process's CPU clock (``clock_gettime`` on its CPUCLOCK_SCHED, in ns, every thread) read
  just before and just after each scrape, less what the process spends unscraped in as much wall time (its rate
  over the quiet gaps between its scrapes). Median, min and max over the scrapes.
- **Whole process**: the same clock over the whole window, per wall second (scrapes included).
- **Resident memory** (/proc/PID/status VmRSS): 5 s after each answered its first scrape, and after its last.

``--against REV``: a third process, gpuwear at a git revision (a temporary worktree first on its ``PYTHONPATH``), on
the same scenario and scraped in turn with the other two: what a change saved, in the same windows, and its ratio.

The in-process figures (bench/scrape_bench.py) are a diagnostic; these are what a user's Prometheus meets.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
from common import PYTHON, _die_with_parent, free_port, gpuwear, revision, rss_mib

ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def cpu_ns(pid: int) -> int:
    """The process's CPU time, all its threads, in ns (its CPUCLOCK_SCHED clock: ((~pid) << 3) | 2)."""
    return time.clock_gettime_ns(((~pid) << 3) | 2)


class Scraper:
    """Scrapes of one target as Prometheus makes them: its headers, and its connection kept for the next scrape
    while the server keeps it open (``keep``; else a new connection each time)."""

    def __init__(self, port: int, keep: bool = True) -> None:
        self.port, self.keep = port, keep
        self.conn: http.client.HTTPConnection | None = None
        self.connections = 0  # connections opened

    def scrape(self) -> int:
        """One scrape; the body's size once decompressed (0: failed)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            self.connections += 1
        try:
            self.conn.request("GET", "/metrics", headers={"Accept": ACCEPT, "Accept-Encoding": "gzip",
                                                          "User-Agent": "Prometheus/2.53.0"})
            response = self.conn.getresponse()
            body = response.read()
            if not self.keep or response.will_close:
                self.close()
            if response.status != 200:
                return 0
            return len(gzip.decompress(body) if response.getheader("Content-Encoding") == "gzip" else body)
        except OSError:
            self.close()
            return 0

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def scrape(port: int) -> int:
    """One scrape on a connection of its own; the body's size once decompressed (0: failed)."""
    one = Scraper(port, keep=False)
    try:
        return one.scrape()
    finally:
        one.close()


def start(tool: str, scenario: Path, work: Path, tree: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``tool`` serving on a free port, once it answers /metrics; ``tree``: gpuwear's code from that worktree."""
    port = free_port()
    env = None
    if tool != "nvitop-exporter":
        argv = gpuwear("run", "--simulate", str(scenario), "--listen", f"127.0.0.1:{port}", "--state-dir",
                       str(work / tool / "state"))
        if tree is not None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tree / "daemon"),
                                                                             os.environ.get("PYTHONPATH"))))}
    else:
        exe = shutil.which("nvitop-exporter", path=str(Path(PYTHON).parent)) or "nvitop-exporter"
        argv = [PYTHON, "-m", "gpuwear.sim.fakenvml", "--scenario", str(scenario), exe, "--bind-address",
                "127.0.0.1", "--port", str(port), "--interval", "1.0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                            env=env)
    deadline = time.monotonic() + 120
    while not scrape(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{tool} did not answer /metrics")
        time.sleep(0.2)
    return proc, port


def measure(gpus: int, scrapes: int, every: float, keep: bool = True,
            against: tuple[str, Path] | None = None) -> dict[str, dict[str, float]]:
    """Each tool's figures (gpuwear, nvitop-exporter; ``against``: (name, worktree) of gpuwear at a revision)."""
    with tempfile.TemporaryDirectory(prefix="gpuwear-outside-") as folder:
        work = Path(folder)
        scenario = gen.scenario(gpus, work)
        procs = {tool: start(tool, scenario, work) for tool in ("gpuwear", "nvitop-exporter")}
        if against is not None:
            procs[against[0]] = start(against[0], scenario, work, against[1])
        try:
            time.sleep(5.0)  # past start-up
            rss_start = {tool: rss_mib(p.pid) for tool, (p, _) in procs.items()}
            scrapers = {tool: Scraper(port, keep) for tool, (_, port) in procs.items()}
            per: dict[str, list[tuple[int, float]]] = {tool: [] for tool in procs}  # (CPU ns, wall s)
            size: dict[str, int] = {}
            last: dict[str, tuple[float, int]] = {}  # tool -> (wall, cpu) after its previous scrape
            idle_rate: dict[str, list[float]] = {tool: [] for tool in procs}
            began = {tool: (time.monotonic(), cpu_ns(p.pid)) for tool, (p, _) in procs.items()}
            for i in range(scrapes):
                for k, (tool, (proc, _)) in enumerate(procs.items()):
                    time.sleep(max(0.0, began[tool][0] + i * every + k * every / len(procs) - time.monotonic()))
                    wall0, cpu0 = time.monotonic(), cpu_ns(proc.pid)
                    if tool in last:  # the quiet gap since its last scrape: what it spends unscraped
                        idle_rate[tool].append((cpu0 - last[tool][1]) / (wall0 - last[tool][0]))
                    size[tool] = scrapers[tool].scrape()
                    wall1, cpu1 = time.monotonic(), cpu_ns(proc.pid)
                    last[tool] = (wall1, cpu1)
                    per[tool].append((cpu1 - cpu0, wall1 - wall0))
            ended = {tool: (time.monotonic(), cpu_ns(p.pid)) for tool, (p, _) in procs.items()}
            rss_end = {tool: rss_mib(p.pid) for tool, (p, _) in procs.items()}
            for scraper in scrapers.values():
                scraper.close()
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(timeout=60)
    out: dict[str, dict[str, float]] = {}
    for tool in procs:
        rate = statistics.median(idle_rate[tool])  # ns of CPU per wall second, unscraped
        costs = [(cpu - rate * wall) / 1e6 for cpu, wall in per[tool]]
        out[tool] = {"median_ms": statistics.median(costs), "min_ms": min(costs), "max_ms": max(costs),
                     "wall_ms": statistics.median(w for _, w in per[tool]) * 1e3,
                     "whole_share": (ended[tool][1] - began[tool][1]) / 1e9 / (ended[tool][0] - began[tool][0]),
                     "idle_share": rate / 1e9, "body_bytes": size[tool],
                     "connections": scrapers[tool].connections, "rss_start": rss_start[tool],
                     "rss_end": rss_end[tool]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="8,64")
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--every", type=float, default=2.0, help="wall seconds between two scrapes of one tool")
    parser.add_argument("--connection", choices=("kept", "new"), default="kept",
                        help="kept: as Prometheus, the connection kept while the server keeps it; new: one a scrape")
    parser.add_argument("--against", metavar="REV", help="also gpuwear at this git revision, in the same windows")
    args = parser.parse_args()
    rows = []
    with revision(args.against) if args.against else contextlib.nullcontext() as tree:
        old = f"gpuwear at {args.against}"
        for n in (int(x) for x in args.gpus.split(",")):
            r = measure(n, args.scrapes, args.every, args.connection == "kept",
                        (old, tree) if tree is not None else None)
            tools = [r["gpuwear"], r["nvitop-exporter"], *((r[old],) if tree is not None else ())]
            for label, key, fmt in (("CPU per scrape, median (ms)", "median_ms", "{:.2f}"),
                                    ("CPU per scrape, min to max (ms)", None, ""),
                                    ("scrape wall time, median (ms)", "wall_ms", "{:.1f}"),
                                    ("whole process, share of one core", "whole_share", "{:.2%}"),
                                    ("unscraped, share of one core", "idle_share", "{:.2%}"),
                                    ("body, uncompressed (bytes)", "body_bytes", "{:.0f}"),
                                    ("resident memory after start (MiB)", "rss_start", "{:.1f}"),
                                    ("resident memory after the last scrape (MiB)", "rss_end", "{:.1f}"),
                                    ("connections opened", "connections", "{:.0f}")):
                if key is None:
                    cells = [f"{t['min_ms']:.2f} to {t['max_ms']:.2f}" for t in tools] + [""] * (len(tools) - 1)
                else:
                    cells = [fmt.format(t[key]) for t in tools]
                    cells += [f"{tools[0][key] / t[key]:.2f} ×" if t[key] else "" for t in tools[1:]]
                rows.append(f"| {n} | {label} | " + " | ".join(cells) + " |")
    against = f" --against {args.against}" if args.against else ""
    columns = ["GPUs", "figure", "gpuwear", "nvitop-exporter", *((old,) if args.against else ()),
               "gpuwear / nvitop-exporter", *((f"gpuwear / {args.against}",) if args.against else ())]
    print(f"# A real scrape, measured from outside (gpuwear against nvitop-exporter)\n\n"
          f"`python bench/scrape_outside.py --gpus {args.gpus} --scrapes {args.scrapes} --every {args.every:g} "
          f"--connection {args.connection}{against}`, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
          "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
