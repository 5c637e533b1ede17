"""What OTLP push costs the daemon, measured from outside: the same daemon with OTLP off and on, side by side.

    python bench/otlp_cost.py [--gpus 8] [--window 120] [--every 10] [--pairs 2]

Two daemons (``gpuwear run --simulate``, bench/gen.py's scenario, both sampling once a second) run at once on the
same scenario: one with OTLP off (the default), one with ``otlp.enabled: true`` pushing every ``--every`` seconds
(the default interval is 60 s: a shorter one shows the cost larger) to an OTLP/HTTP receiver in this process, which
decodes nothing and answers 200. Both are scraped every 15 s, as Prometheus does. Over ``--window`` wall seconds
after a warm-up, for each: its CPU (the process's CPU clock, every thread) per wall second, its RSS at the end, and
the receiver's pushes and bytes. ``--pairs`` windows, the two started fresh each time; the ratio on / off of each.

Issue 57's goal: with OTLP off, RSS and CPU unchanged against the lean daemon (nothing of the SDK is imported then:
tests/test_otlp.py holds it); with it on, what it costs.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
from common import _die_with_parent, free_port, gpuwear
from scrape_outside import cpu_ns, scrape

MiB = 2**20


class Receiver:
    """An OTLP/HTTP endpoint that takes every push (200, an empty answer) and counts them and their bytes."""

    def __init__(self) -> None:
        self.pushes = 0
        self.bytes = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.bytes += len(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.pushes += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def start(scenario: Path, work: Path, name: str, config: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    (work / f"{name}.yaml").write_text(config)
    proc = subprocess.Popen(gpuwear("run", "--simulate", str(scenario), "--listen", f"127.0.0.1:{port}",
                                    "--state-dir", str(work / name), "--config", str(work / f"{name}.yaml")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    deadline = time.monotonic() + 120
    while not scrape(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"gpuwear ({name}) did not answer /metrics")
        time.sleep(0.2)
    return proc, port


def window(gpus: int, seconds: float, every: float) -> dict[str, dict[str, float]]:
    receiver = Receiver()
    with tempfile.TemporaryDirectory(prefix="gpuwear-otlp-") as folder:
        work = Path(folder)
        scenario = gen.scenario(gpus, work)
        procs = {"off": start(scenario, work, "off", "{}\n"),
                 "on": start(scenario, work, "on", f"otlp:\n  enabled: true\n  endpoint: {receiver.url}\n"
                                                    f"  interval_seconds: {every}\n")}
        try:
            time.sleep(20)  # warm-up: imports, the first saves, the first pushes
            pushes0, bytes0 = receiver.pushes, receiver.bytes
            cpu0 = {k: cpu_ns(p.pid) for k, (p, _) in procs.items()}
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                for _, port in procs.values():
                    scrape(port)
                time.sleep(max(0.0, 15.0 - (time.monotonic() - t0) % 15.0))
            wall = time.monotonic() - t0
            out = {k: {"cpu_share": (cpu_ns(p.pid) - cpu0[k]) / 1e9 / wall,
                       "rss_mib": psutil.Process(p.pid).memory_info().rss / MiB} for k, (p, _) in procs.items()}
            out["on"]["pushes"] = receiver.pushes - pushes0
            out["on"]["push_kib"] = (receiver.bytes - bytes0) / 1024 / max(1, receiver.pushes - pushes0)
            return out
        finally:
            for p, _ in procs.values():
                p.terminate()
                p.wait(timeout=30)
            receiver.server.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--window", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    runs = [window(args.gpus, args.window, args.every) for _ in range(args.pairs)]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"`python bench/otlp_cost.py --gpus {args.gpus} --window {args.window:g} --every {args.every:g} "
          f"--pairs {args.pairs}`, {when}\n")
    print("| window | CPU, share of one core: off | on | on / off | RSS MiB: off | on | on - off | pushes | "
          "KiB a push |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(runs, 1):
        off, on = r["off"], r["on"]
        print(f"| {i} | {100 * off['cpu_share']:.2f} % | {100 * on['cpu_share']:.2f} % | "
              f"{on['cpu_share'] / off['cpu_share']:.2f} × | {off['rss_mib']:.1f} | {on['rss_mib']:.1f} | "
              f"{on['rss_mib'] - off['rss_mib']:+.1f} | {on['pushes']:.0f} | {on['push_kib']:.1f} |")
    ratio = statistics.median(r["on"]["cpu_share"] / r["off"]["cpu_share"] for r in runs)
    print(f"\nMedian CPU on / off: {ratio:.2f} ×; one push every {args.every:g} s (the default is 60 s).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
