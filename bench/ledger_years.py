"""A busy box's ledger after years against one after a day, measured from outside, in one run.

    python bench/ledger_years.py [--gpus 8] [--years 3] [--jobs-per-day 500] [--run 60] [--out FILE]

For each age (1 day, then ``--years``), a ledger of ``--gpus`` simulated GPUs (bench/gen.py's mixed scenario) is
written through the ledger's own code (``Ledger.save``: validated, checksummed and each job record's lines kept, as
the daemon writes): each GPU's lifetime record, ``--jobs-per-day`` job records (one GPU each, their wear taken from
real job records the daemon wrote over the same scenario), a few events per GPU a day and an import a week, with the
default retention applied as the daemon applies it (90 days of jobs, 365 of events). Then, as a user meets them, on
the same machine:

- ``gpuwear run --simulate SCENARIO --speed 60`` on it: seconds from start to the first /metrics answer, RSS
  after start, after the page at / and after ``--run`` seconds of running (simulated minutes at x60), and the
  bytes the process wrote per GPU per simulated day (/proc/PID/io write_bytes);
- ``gpuwear report``, ``report --html``, ``jobs``, ``jobs --all`` as processes (wall seconds, peak RSS), and the
  page at / fetched from the running daemon (after the first save, when it renders afresh), and from the daemon
  at x1 as users run it (its sampler reading each GPU once a second, not 50 times: median of 3 starts);
- the ledger's size.

Prints a Markdown table, each figure beside the 1-day one and their ratio (the goals: issue 26).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
from common import get, gpuwear, rss_mib, start_daemon, stop, written

from gpuwear.config import WearConfig
from gpuwear.jobs.lines import Summariser
from gpuwear.ledger import Event, Ledger

DAY = 86400.0


def templates(state: Path, scenario: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The scenario's GPU records and real job records: the daemon run on it for a simulated hour and a half."""
    proc, _, _ = start_daemon(state, scenario, 600.0)
    time.sleep(9.0)
    stop(proc)
    ledger = Ledger.open_read_only(next(state.glob("simulated/*/ledger.sqlite")))
    try:
        gpus = {u: w.to_json() for u, w in ledger.load(2.0).items()}
        jobs = [j for j in ledger.jobs() if j["kind"] != "idle" and len(j["gpus"]) == 1]
    finally:
        ledger.close()
    if not jobs:
        raise RuntimeError("the template run recorded no job")
    return gpus, jobs


def synthesise(path: Path, gpus: dict[str, dict[str, Any]], jobs: list[dict[str, Any]], days: float,
               jobs_per_day: int, now: float) -> None:
    """``days`` of a busy box's history, ending now, through Ledger.save, with the daemon's retention."""
    rnd = random.Random(7)
    start = now - days * DAY
    uuids = sorted(gpus)
    ledger = Ledger.open(path)
    lines = Summariser(WearConfig())  # each record's lines kept with it, as the daemon keeps them
    try:
        kept_jobs_from = max(start, now - 90 * DAY)  # jobs.retention_days: what the daemon keeps of them
        kept_events_from = max(start, now - 365 * DAY)  # wear.event_retention_days
        count = int((now - kept_jobs_from) / DAY * jobs_per_day)
        batch: list[dict[str, Any]] = []
        for k in range(count):
            t = kept_jobs_from + k * DAY / jobs_per_day
            template = jobs[k % len(jobs)]
            length = max(60.0, (template["gpus"][0]["end"] or t) - template["gpus"][0]["start"])
            u = uuids[k % len(uuids)]
            g = json.loads(json.dumps(template["gpus"][0]))
            wear = g["wear"]
            shift = t - (wear.get("first_seen") or t)
            wear["uuid"], wear["first_seen"], wear["last_seen"] = u, t, t + length
            wear["covered"] = {repr(float(a) + shift): b + shift for a, b in wear.get("covered", {}).items()
                               if float(a) + shift >= t and b + shift <= t + length} or {repr(t): t + length}
            wear.pop("last_event", None)
            g.update(uuid=u, start=t, end=t + length, wear=wear)
            batch.append({**template, "record": f"slurm:{100000 + k}@{t:.0f}", "kind": "slurm",
                          "id": str(100000 + k), "name": f"array-{k % 37}", "start": t, "last_seen": t + length,
                          "end": t + length, "gpus": [g]})
            if len(batch) == 2000:
                ledger.save([], [], jobs=batch, lines=lines)
                batch = []
        events = [Event(u, kept_events_from + rnd.random() * (now - kept_events_from), rnd.choice(["gap", "xid"]),
                        {"seconds": 30.0} if rnd.random() < 0.5 else {"code": 13})
                  for u in uuids for _ in range(int((now - kept_events_from) / DAY * 6))]
        events.sort(key=lambda e: e.wall)
        records = []
        for u in uuids:
            doc = json.loads(json.dumps(gpus[u]))
            scale = days * DAY / max(1.0, doc.get("observed_seconds", 1.0))
            for key in ("observed_seconds", "energy_joules", "power_seconds", "energy_counter_seconds",
                        "energy_integrated_seconds", "power_limit_seconds"):
                if key in doc:
                    doc[key] = doc[key] * scale
            for sensor, hist in doc.get("temperature_seconds", {}).items():
                doc["temperature_seconds"][sensor] = {t: s * scale for t, s in hist.items()}
            doc["utilization_seconds"] = {t: s * scale for t, s in doc.get("utilization_seconds", {}).items()}
            doc["cycles"] = {s: {b: n * scale for b, n in bins.items()} for s, bins in doc.get("cycles", {}).items()}
            doc["first_seen"], doc["last_seen"] = start, now - 60
            doc["covered"] = {repr(start): now - 60}
            doc["kinds"] = {}
            doc.pop("last_event", None)
            records.append(doc)
        imports = [(u, f"/var/log/smi-{w}.csv", start + w * 7 * DAY, start + w * 7 * DAY + 3600, 3600,
                    {"schema": 1, "uuid": u, "name": gpus[u].get("name", ""), "first_seen": start + w * 7 * DAY,
                     "last_seen": start + w * 7 * DAY + 3600, "observed_seconds": 3600.0,
                     "covered": {repr(start + w * 7 * DAY): start + w * 7 * DAY + 3600}})
                   for u in uuids[:1] for w in range(int(days // 7))]
        ledger.save(records, events, imports=imports, jobs=batch, lines=lines)
    finally:
        ledger.close()


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of a command run to its end (its own rusage, from wait4)."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}")
    return elapsed, usage.ru_maxrss / 1024


def measure(work: Path, name: str, scenario: Path, gpus: dict[str, dict[str, Any]], jobs: list[dict[str, Any]],
            days: float, jobs_per_day: int, run_seconds: float, n: int) -> dict[str, float]:
    state = work / name
    ledger = state / "simulated" / scenario.stem / "ledger.sqlite"
    ledger.parent.mkdir(parents=True, mode=0o700)
    os.chmod(state, 0o700)
    os.chmod(state / "simulated", 0o700)
    synthesise(ledger, gpus, jobs, days, jobs_per_day, time.time())
    out: dict[str, float] = {"ledger_mib": (ledger.stat().st_size + _size(Path(f"{ledger}-wal"))) / 2**20}
    for label, args in (("report_s", ["report"]), ("report_html_s", ["report", "--html", str(work / "p.html")]),
                        ("jobs_s", ["jobs"]), ("jobs_all_s", ["jobs", "--all"])):
        seconds, peak = timed(gpuwear(*args, "--simulated", scenario.stem, "--state-dir", str(state)))
        out[label] = seconds
        out[label.replace("_s", "_peak_mib")] = peak
    proc, port, first = start_daemon(state, scenario, 60.0)
    try:
        out["first_metrics_s"] = first
        time.sleep(2.0)
        out["rss_start_mib"] = rss_mib(proc.pid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the page renders afresh after the first save
            _, body = get(f"http://127.0.0.1:{port}/metrics")
            if b"gpuwear_ledger_persist_success 1.0" in body:
                break
            time.sleep(0.2)
        started = time.perf_counter()
        status, _ = get(f"http://127.0.0.1:{port}/")
        out["page_s"] = time.perf_counter() - started if status == 200 else float("nan")
        out["rss_after_page_mib"] = rss_mib(proc.pid)
        bytes0, t0 = written(proc.pid), time.monotonic()
        time.sleep(run_seconds)
        simulated_days = (time.monotonic() - t0) * 60.0 / DAY
        out["writes_mb_per_gpu_day"] = (written(proc.pid) - bytes0) / 1e6 / n / simulated_days
        out["rss_after_run_mib"] = rss_mib(proc.pid)
        # a scrape issued while the page renders afresh (saves happened during the run, so it is not cached)
        rendered: list[float] = []

        def fetch_page() -> None:
            began = time.perf_counter()
            code, _ = get(f"http://127.0.0.1:{port}/")
            rendered.append(time.perf_counter() - began if code == 200 else float("nan"))

        page = threading.Thread(target=fetch_page)
        page.start()
        time.sleep(min(0.2, out["page_s"] / 4))
        started = time.perf_counter()
        status, _ = get(f"http://127.0.0.1:{port}/metrics")
        out["scrape_during_page_s"] = time.perf_counter() - started if status == 200 else float("nan")
        page.join()
        out["page_later_s"] = rendered[0] if rendered else float("nan")
    finally:
        stop(proc)
    # as a user meets it: the daemon at x1 (one read of each GPU a second, not 50 as at x60), the page fetched
    # once it has started (rendered afresh, as after each save); the median of 3 starts
    pages: list[float] = []
    for _ in range(3):
        proc, port, _ = start_daemon(state, scenario, 1.0)
        try:
            time.sleep(1.0)
            started = time.perf_counter()
            status, _ = get(f"http://127.0.0.1:{port}/")
            pages.append(time.perf_counter() - started if status == 200 else float("nan"))
        finally:
            stop(proc)
    out["page_x1_s"] = statistics.median(pages)
    # the same ledger with 30 bytes flipped in its rows (past its first quarter: the schema and meta stay readable):
    # the daemon recovers it before it serves
    damaged = work / f"{name}-damaged"
    shutil.copytree(state, damaged)
    copy = damaged / "simulated" / scenario.stem / "ledger.sqlite"
    data, rnd = bytearray(copy.read_bytes()), random.Random(1)
    for _ in range(30):
        data[rnd.randrange(len(data) // 4, len(data))] ^= 0xFF
    copy.write_bytes(bytes(data))
    proc, port, first = start_daemon(damaged, scenario, 60.0)
    _, body = get(f"http://127.0.0.1:{port}/metrics")
    stop(proc)
    out["first_metrics_damaged_s"] = first
    out["damaged_recovered"] = float(b"gpuwear_ledger_moved_aside 1.0" in body)
    out.update(upgraded(work, name, state, scenario))
    return out


def upgraded(work: Path, name: str, state: Path, scenario: Path) -> dict[str, float]:
    """The same ledger as an upgrade or a recovery leaves it (every job record without its kept lines, as a
    migration to schema 8 or a recovery makes it), as a user meets it in the minutes after the new version's first
    start: start → first /metrics, `jobs` and `report --html` and the page right after, and start → every record
    indexed (the daemon's pass; `jobs --json` says how many are left), then its RSS after ten pages."""
    copy_state = work / f"{name}-upgraded"
    shutil.copytree(state, copy_state)
    copy = copy_state / "simulated" / scenario.stem / "ledger.sqlite"
    with sqlite3.connect(copy) as db:
        db.execute("DELETE FROM job_lines")
    out: dict[str, float] = {}
    began = time.monotonic()
    proc, port, first = start_daemon(copy_state, scenario, 60.0)
    try:
        out["upgraded_first_metrics_s"] = first
        for label, args in (("upgraded_jobs_s", ["jobs"]),
                            ("upgraded_report_html_s", ["report", "--html", str(work / "u.html")])):
            out[label], _ = timed(gpuwear(*args, "--simulated", scenario.stem, "--state-dir", str(copy_state)))
        started = time.perf_counter()
        status, _ = get(f"http://127.0.0.1:{port}/")
        out["upgraded_page_s"] = time.perf_counter() - started if status == 200 else float("nan")
        out["upgraded_indexed_s"] = float("nan")
        while time.monotonic() - began < 600:
            listing = subprocess.run(gpuwear("jobs", "--json", "--limit", "1", "--simulated", scenario.stem,
                                             "--state-dir", str(copy_state)), capture_output=True, check=True)
            if json.loads(listing.stdout).get("not_indexed", 1) == 0:
                out["upgraded_indexed_s"] = time.monotonic() - began
                break
            time.sleep(0.5)
        for _ in range(10):  # ten pages, each after a save (every wall second at x60): rendered afresh each time
            time.sleep(1.1)
            get(f"http://127.0.0.1:{port}/")
        out["upgraded_rss_after_10_pages_mib"] = rss_mib(proc.pid)
    finally:
        stop(proc)
    return out


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


LABELS = {"ledger_mib": "ledger file (MiB)", "first_metrics_s": "start → first /metrics (s)",
          "rss_start_mib": "daemon RSS after start (MiB)", "rss_after_page_mib": "daemon RSS after the page (MiB)",
          "rss_after_run_mib": "daemon RSS after running (MiB)", "page_s": "page at /, after the first save (s)",
          "page_later_s": "page at /, after running, a scrape beside it (s)",
          "page_x1_s": "page at /, the daemon at x1, median of 3 starts (s)",
          "writes_mb_per_gpu_day": "daemon writes (MB per GPU per day)", "report_s": "`report` (s)",
          "report_peak_mib": "`report` peak RSS (MiB)", "report_html_s": "`report --html` (s)",
          "report_html_peak_mib": "`report --html` peak RSS (MiB)", "jobs_s": "`jobs` (s)",
          "jobs_peak_mib": "`jobs` peak RSS (MiB)", "jobs_all_s": "`jobs --all` (s)",
          "jobs_all_peak_mib": "`jobs --all` peak RSS (MiB)",
          "scrape_during_page_s": "a scrape issued while the page renders (s)",
          "first_metrics_damaged_s": "start → first /metrics, 30 bytes flipped (recovery) (s)",
          "damaged_recovered": "recovered (1: yes)",
          "upgraded_first_metrics_s": "lines removed (an upgrade or a recovery): start → first /metrics (s)",
          "upgraded_jobs_s": "lines removed: `jobs` right after the start (s)",
          "upgraded_report_html_s": "lines removed: `report --html` right after the start (s)",
          "upgraded_page_s": "lines removed: the page right after the start (s)",
          "upgraded_indexed_s": "lines removed: start → every job record indexed (s)",
          "upgraded_rss_after_10_pages_mib": "lines removed: daemon RSS after 10 pages, once indexed (MiB)"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--years", type=float, default=3.0)
    parser.add_argument("--jobs-per-day", type=int, default=500)
    parser.add_argument("--run", type=float, default=60.0, help="seconds the daemon runs on each ledger")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuwear-years-"))
    try:
        scenario = gen.scenario(args.gpus, work)
        gpus, jobs = templates(work / "template", scenario)
        small = measure(work, "day", scenario, gpus, jobs, 1.0, args.jobs_per_day, args.run, args.gpus)
        big = measure(work, "years", scenario, gpus, jobs, args.years * 365, args.jobs_per_day, args.run, args.gpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"# A {args.years:g}-year ledger against a 1-day one ({args.gpus} GPUs, {args.jobs_per_day} jobs a day)",
             "", f"`python bench/ledger_years.py --gpus {args.gpus} --years {args.years:g} --jobs-per-day "
             f"{args.jobs_per_day} --run {args.run:g}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{os.cpu_count()} CPUs.", "", "| figure | 1 day | years | ratio |", "|---|---|---|---|"]
    for key, label in LABELS.items():
        a, b = small.get(key, float("nan")), big.get(key, float("nan"))
        lines.append(f"| {label} | {a:.3g} | {b:.3g} | {b / a if a else float('nan'):.2f} × |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
