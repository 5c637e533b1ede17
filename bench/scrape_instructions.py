"""Machine instructions of a re-rendering scrape, counted by valgrind: a figure the VM's speed does not move.

    python bench/scrape_instructions.py [GPUS ...] [--rounds 40] [--days 0.25] [--detail] [--against REV]

bench/scrape_bench.py times scrapes in CPU milliseconds, which move by 2x on a shared VM within minutes (its
calibration workload does not follow them closely either). This script counts the instructions instead
(``valgrind --tool=cachegrind --cache-sim=no``: every instruction the process executes, the same from run to run
within 0.1 %), so two revisions compare exactly. Instructions are not time: memory gone cold since the last scrape
costs time and no instructions, and zlib's loops run more instructions per cycle than the interpreter's.

For each GPU count it runs four processes under cachegrind (as many at a time as there are cores): the daemon of
bench/scrape_bench.py (bench/gen.py's scenario, ``--days`` of history, a fixed wall clock and PYTHONHASHSEED so that
every run is the same), three warm-up scrapes, then ``--rounds`` rounds of a 1 s tick followed by: nothing; the wear
views; the views and the OpenMetrics text; the views, the text and gzip (what Prometheus asks for). The differences,
per round, are the instructions of each part of a scrape. ``--against REV``: the same for a git revision's code (a
temporary worktree, this script driving it), and the ratios. Needs Debian's ``valgrind``; about a minute per count
and revision at 64 GPUs on 2 cores. Prints one JSON object per GPU count.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, revision
from scrape_bench import daemon_with_history

STEPS = ("none", "views", "text", "all")
START_WALL = 1_796_000_000.0  # 2026-11-29: every run the same


def child(gpus: int, days: float, rounds: int, detail: bool, step: str) -> None:
    """Under cachegrind: the daemon, three scrapes, then ``rounds`` ticks each followed by ``step``."""
    daemon, clock, _ = daemon_with_history(gpus, days, detail, START_WALL)
    exposition = daemon.exposition
    for i in range(rounds + 3):
        clock.advance(1.0)
        daemon._tick()
        if i < 3 or step != "none":
            daemon.published()
        if i < 3 or step in ("text", "all"):
            exposition.render(True)
        if i < 3 or step == "all":
            exposition.render(True, gzipped=True)


def count(daemon_dir: Path, gpus: int, days: float, rounds: int, detail: bool) -> dict[str, float]:
    """Instructions per scrape of each part, for the package in ``daemon_dir``."""
    env = {**os.environ, "PYTHONPATH": str(daemon_dir), "PYTHONHASHSEED": "0"}

    def one(step: str) -> int:
        args = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                sys.executable, __file__, str(gpus), "--days", str(days), "--rounds", str(rounds), "--child", step]
        out = subprocess.run(args + (["--detail"] if detail else []), env=env, capture_output=True, text=True)
        found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
        if out.returncode != 0 or not found:
            raise RuntimeError(f"valgrind ({step}) failed: {out.stderr[-2000:]}")
        return int(found.group(1).replace(",", ""))

    with concurrent.futures.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        total = dict(zip(STEPS, pool.map(one, STEPS), strict=True))
    per = {step: total[step] / rounds for step in STEPS}
    return {"views": per["views"] - per["none"], "text": per["text"] - per["views"], "gzip": per["all"] - per["text"],
            "total": per["all"] - per["none"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gpus", type=int, nargs="*", default=[8, 64])
    parser.add_argument("--days", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--detail", action="store_true")
    parser.add_argument("--against", metavar="REV", help="also count this git revision's code")
    parser.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.gpus[0], args.days, args.rounds, args.detail, args.child)
        return 0
    if shutil.which("valgrind") is None:
        print("scrape_instructions: valgrind not found: apt-get install valgrind", file=sys.stderr)
        return 1
    with contextlib.ExitStack() as stack:
        tree = stack.enter_context(revision(args.against)) if args.against else None
        for n in args.gpus:
            out: dict[str, Any] = {"gpus": n, "days": args.days, "rounds": args.rounds, "detail": args.detail,
                                   "instructions": count(ROOT / "daemon", n, args.days, args.rounds, args.detail)}
            if tree is not None:
                theirs = count(tree / "daemon", n, args.days, args.rounds, args.detail)
                out[f"instructions_{args.against}"] = theirs
                out["ratio"] = {part: out["instructions"][part] / theirs[part] for part in theirs if theirs[part]}
            print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
