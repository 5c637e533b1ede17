"""A busy box's daemon over a simulated month, measured from outside: its RSS after each simulated day.

    python bench/month_rss.py [--gpus 8] [--days 30] [--speed 20000] [--page-every 5] [--interval 1]

Runs ``gpuwear run --simulate SCENARIO --speed S`` (bench/gen.py's mixed scenario: each GPU trains, is stressed and
idles in 90-minute cycles, two jobs and their idle lines a cycle) on a fresh state directory, fetches the page at /
every ``--page-every`` wall seconds (it renders afresh after each save) and /metrics every ``--scrape-every``, and
reads the process's RSS (/proc/PID/status) at the end of each simulated day. Prints the RSS after day 1 and after
the last day, their difference (the goal: under 2 MiB over a month) and the job records the ledger then holds.

``--interval``: the daemon's sampling interval in simulated seconds (sampling.interval_seconds, 1 by default). At
x20000 a tick then covers 400 simulated seconds and comes every 0.02 wall s, and 8 GPUs' ticks take a whole core:
the daemon runs saturated and behind its schedule, which no user's daemon does (a tick a second takes about 0.3 %
of a core). The daemon's CPU share over the run is printed beside the RSS, to say which of the two was measured.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
from common import cpu_seconds, get, rss_mib, start_daemon, stop

DAY = 86400.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--speed", type=float, default=20000.0)
    parser.add_argument("--page-every", type=float, default=5.0)
    parser.add_argument("--scrape-every", type=float, default=1.0, help="wall seconds between scrapes of /metrics")
    parser.add_argument("--interval", type=float, default=1.0, help="sampling interval, simulated seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwear-month-") as folder:
        work = Path(folder)
        scenario = gen.scenario(args.gpus, work)
        state = work / "state"
        config = work / "config.yaml"
        config.write_text(f"sampling:\n  interval_seconds: {args.interval!r}\n")
        proc, port, _ = start_daemon(state, scenario, args.speed, config)
        started = time.monotonic()
        cpu_started = cpu_seconds(proc.pid)
        per_day: list[float] = []
        next_page = next_scrape = started
        try:
            while len(per_day) < args.days:
                now = time.monotonic()
                if now >= next_page:
                    get(f"http://127.0.0.1:{port}/")
                    next_page = now + args.page_every
                elif now >= next_scrape:
                    get(f"http://127.0.0.1:{port}/metrics")
                    next_scrape = now + args.scrape_every
                if (now - started) * args.speed >= (len(per_day) + 1) * DAY:
                    per_day.append(rss_mib(proc.pid))
                time.sleep(0.01)
            cpu_share = (cpu_seconds(proc.pid) - cpu_started) / (time.monotonic() - started)
        finally:
            stop(proc)
        ledger = next(state.glob("simulated/*/ledger.sqlite"))
        with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
            jobs = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
    print(f"# A busy box's daemon over {args.days:g} simulated days ({args.gpus} GPUs, x{args.speed:g}, the page "
          f"every {args.page_every:g} s)\n")
    print(f"`python bench/month_rss.py --gpus {args.gpus} --days {args.days:g} --speed {args.speed:g} "
          f"--page-every {args.page_every:g} --scrape-every {args.scrape_every:g} --interval {args.interval:g}`, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("| figure | value |\n|---|---|")
    print(f"| RSS after simulated day 1 (MiB) | {per_day[0]:.1f} |")
    print(f"| RSS after simulated day {len(per_day)} (MiB) | {per_day[-1]:.1f} |")
    print(f"| growth after day 1 (MiB) | {per_day[-1] - per_day[0]:.2f} |")
    print(f"| largest RSS, days 1 to {len(per_day)} (MiB) | {max(per_day):.1f} |")
    print(f"| job records in the ledger at the end | {jobs} |")
    print(f"| the daemon's CPU over the run (share of one core) | {cpu_share:.2f} |")
    print("\nRSS by simulated day (MiB): " + ", ".join(f"{r:.1f}" for r in per_day))
    return 0


if __name__ == "__main__":
    sys.exit(main())
