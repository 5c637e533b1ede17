"""The front door under attack: a scraper's latency while hostile clients (bench/attack.py, from another
loopback address) hold or flood the daemon; bytes per scrape with and without gzip.

    python bench/http_bench.py [--seconds 15] [--gpus 8] [--baseline-rev REV] [--out bench/http_results.md]

The daemon runs with TLS and basic auth (bcrypt cost 10), 8 simulated GPUs (bench/gen.py). The scraper
makes what Prometheus makes: GET /metrics with its Accept and Accept-Encoding headers and basic auth,
4 a second, each on a new TLS connection (the worst case: Prometheus keeps connections alive). With
--baseline-rev, the same phases run against the daemon of that git revision too (a worktree), so the
table compares both in one run.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import os
import platform
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bcrypt
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen
from common import free_port

REPO = Path(__file__).resolve().parent.parent
ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.5,"
          "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
PHASES: list[tuple[str, list[tuple[str, list[str]]]]] = [
    ("no attack", []),
    ("300 silent connections (limit 256)", [("silent", ["--count", "300"])]),
    ("100 trickling a TLS ClientHello, 1 byte/s", [("hello", ["--count", "100"])]),
    ("100 trickling header lines after the handshake, 1 line/s", [("headers", ["--count", "100"])]),
    ("wrong passwords, 50/s", [("passwords", ["--rate", "50"])]),
    ("connect-and-reset flood, 200/s", [("resets", ["--rate", "200"])]),
    ("all of the above at once", [("silent", ["--count", "300"]), ("hello", ["--count", "100"]),
                                  ("headers", ["--count", "100"]), ("passwords", ["--rate", "50"]),
                                  ("resets", ["--rate", "200"])]),
]


def scrape(port: int, context: ssl.SSLContext, auth: str, gzipped: bool, timeout: float = 10.0) -> tuple[int, int]:
    """(status, body bytes) of one scrape on a new connection."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
    try:
        headers = {"Accept": ACCEPT, "Authorization": auth}
        if gzipped:
            headers["Accept-Encoding"] = "gzip"
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        return response.status, len(response.read())
    finally:
        conn.close()


class Daemon:
    def __init__(self, work: Path, label: str, pythonpath: Path, scenario: Path, web: Path) -> None:
        self.port = free_port()
        config = work / f"config-{label}.yaml"
        config.write_text(f"web_config_file: {web}\nstate_dir: {work / ('state-' + label)}\n")
        env = {**os.environ, "PYTHONPATH": str(pythonpath)}
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", str(scenario), "--config",
                                      str(config), "--listen", f"127.0.0.1:{self.port}"], env=env,
                                     stderr=open(work / f"daemon-{label}.log", "w"))
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> float:
        """SIGTERM; seconds until it exited (10 s at most, then killed)."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - start


def phase(daemon: Daemon, context: ssl.SSLContext, cafile: Path, auth: str, attackers: list[tuple[str, list[str]]],
          seconds: float) -> dict[str, Any]:
    procs = [subprocess.Popen([sys.executable, str(REPO / "bench" / "attack.py"), str(daemon.port), kind,
                               "--cafile", str(cafile), *args], stdout=subprocess.DEVNULL)
             for kind, args in attackers]
    time.sleep(2.0 if attackers else 0.0)  # the attack builds up
    latencies: list[float] = []
    failures = 0
    rss_start = daemon.ps.memory_info().rss
    rss_max = rss_start
    cpu, start = daemon.cpu(), time.monotonic()
    while time.monotonic() - start < seconds:
        rss_max = max(rss_max, daemon.ps.memory_info().rss)
        t = time.monotonic()
        try:
            status, _ = scrape(daemon.port, context, auth, True)
            if status != 200:
                failures += 1
        except (OSError, http.client.HTTPException):
            failures += 1
        latencies.append(time.monotonic() - t)
        time.sleep(max(0.0, 0.25 - (time.monotonic() - t)))
    cpu_share = (daemon.cpu() - cpu) / (time.monotonic() - start)
    stop = daemon.stop() if attackers and attackers is PHASES[-1][1] else None
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=10)
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    return {"n": len(latencies), "p50": statistics.median(latencies), "p99": p99,
            "max": latencies[-1], "failures": failures, "cpu": cpu_share, "stop": stop, "rss": rss_start,
            "rss_max": rss_max}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="scraping per phase")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--baseline-rev", help="also measure the daemon of this git revision")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "http_results.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuwear-http-"))
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed for the certificate"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(work / "tls.key"),
                    "-out", str(work / "tls.crt"), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
    web = work / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {work / 'tls.crt'}\n  key_file: {work / 'tls.key'}\n"
                   f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    scenario = gen.scenario(args.gpus, work)
    context = ssl.create_default_context(cafile=str(work / "tls.crt"))
    auth = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()
    trees = [("this tree", REPO / "daemon")]
    if args.baseline_rev:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(work / "baseline"),
                        args.baseline_rev], check=True, capture_output=True)
        trees.append((f"baseline {args.baseline_rev}", work / "baseline" / "daemon"))
    results: dict[str, dict[str, dict[str, Any]]] = {}
    sizes: dict[str, int] = {}
    try:
        for label, path in trees:
            results[label] = {}
            for name, attackers in PHASES:
                daemon = Daemon(work, label.split()[0], path, scenario, web)
                for _ in range(200):
                    try:
                        if scrape(daemon.port, context, auth, False)[0] == 200:
                            break
                    except OSError:
                        time.sleep(0.1)
                time.sleep(3)  # past start-up: the first ticks, the first render
                if label == "this tree" and not sizes:
                    sizes["plain"] = scrape(daemon.port, context, auth, False)[1]
                    sizes["gzip"] = scrape(daemon.port, context, auth, True)[1]
                print(f"{label}: {name} ...", file=sys.stderr, flush=True)
                results[label][name] = phase(daemon, context, work / "tls.crt", auth, attackers, args.seconds)
                if daemon.proc.poll() is None:
                    results[label][name]["stop"] = results[label][name]["stop"] or daemon.stop()
    finally:
        if args.baseline_rev:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "baseline")],
                           capture_output=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    lines = ["# The front door under attack", "",
             f"Command: `python bench/http_bench.py --seconds {args.seconds:g} --gpus {args.gpus}"
             + (f" --baseline-rev {args.baseline_rev}`" if args.baseline_rev else "`")
             + f" · {time.strftime('%Y-%m-%d %H:%M')} · gpuwear commit {commit}", "",
             f"Machine: {os.cpu_count()} logical cores; CPython {platform.python_version()}; {platform.platform()}", "",
             f"Daemon: TLS + basic auth (bcrypt cost 10), {args.gpus} simulated GPUs. Scraper: GET /metrics as "
             "Prometheus asks for it (Accept, Accept-Encoding: gzip, basic auth), 4 a second, each on a new TLS "
             f"connection, {args.seconds:g} s per phase, 10 s timeout. Attackers: bench/attack.py from 127.0.0.2, one "
             "process per kind, started 2 s before the scraper. A fresh daemon per phase.", "",
             "| phase | daemon | scrapes | p50 | p99 | max | failed | daemon CPU (share of a core) | daemon RSS "
             "(start of phase → max) | SIGTERM to exit |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, _ in PHASES:
        for label, _ in trees:
            r = results[label][name]
            lines.append(f"| {name} | {label} | {r['n']} | {r['p50'] * 1e3:.1f} ms | {r['p99'] * 1e3:.1f} ms | "
                         f"{r['max'] * 1e3:.0f} ms | {r['failures']} | {r['cpu'] * 100:.0f} % | "
                         f"{r['rss'] / 2**20:.1f} → {r['rss_max'] / 2**20:.1f} MiB | {r['stop']:.2f} s |")
    lines += ["", f"Bytes per scrape ({args.gpus} GPUs, Prometheus' Accept header, so OpenMetrics): "
              f"{sizes['plain']:,} plain, {sizes['gzip']:,} with gzip ({sizes['plain'] / sizes['gzip']:.1f}× smaller).",
              ""]
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
