"""How long another request waits while /metrics is being built, measured from outside.

    python bench/loop_free.py [--gpus 8,64] [--rounds 20] [--against REV]

For each GPU count, gpuwear (``gpuwear run --simulate SCENARIO``, bench/gen.py's scenario, a tick a second) and,
with ``--against``, gpuwear at a git revision on the same scenario. Each round, 1.5 s after the last (a tick in
between: the next scrape builds its body, the wear views and verdict included), two connections already open: a
scrape (Prometheus' Accept header, gzip) is sent on one and, right after it, ``GET /healthz`` on the other (a
liveness probe, a second Prometheus, a TLS handshake would wait alike). Wall times from each request sent to its
whole answer read; medians and maxima over the rounds. A front door that builds the body on its event loop answers
the probe after the build; one that builds it on a thread of its own answers it meanwhile (the GIL shared: within
a switch interval, 5 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen
from common import revision
from scrape_outside import ACCEPT, start


def _read_answer(sock: socket.socket) -> None:
    """Read one HTTP/1.1 answer with a Content-Length, whole."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed")
        body += chunk


def rounds(port: int, n: int) -> dict[str, float]:
    scrape_request = (f"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {ACCEPT}\r\nAccept-Encoding: gzip\r\n\r\n"
                      .encode())
    probe_request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    scrapes: list[float] = []
    probes: list[float] = []
    with socket.create_connection(("127.0.0.1", port)) as a, socket.create_connection(("127.0.0.1", port)) as b:
        for sock in (a, b):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            time.sleep(1.5)
            t0 = time.perf_counter()
            a.sendall(scrape_request)
            t1 = time.perf_counter()
            b.sendall(probe_request)
            _read_answer(b)
            t2 = time.perf_counter()
            _read_answer(a)
            t3 = time.perf_counter()
            probes.append(t2 - t1)
            scrapes.append(t3 - t0)
    return {"probe_median_ms": statistics.median(probes) * 1e3, "probe_max_ms": max(probes) * 1e3,
            "scrape_median_ms": statistics.median(scrapes) * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="8,64")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--against", metavar="REV")
    args = parser.parse_args()
    with revision(args.against) if args.against else contextlib.nullcontext() as tree:
        tools: list[tuple[str, Path | None]] = [("gpuwear", None)]
        if tree is not None:
            tools.append((f"gpuwear at {args.against}", tree))
        print(f"`python bench/loop_free.py --gpus {args.gpus} --rounds {args.rounds}"
              f"{' --against ' + args.against if args.against else ''}`, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
        print("| GPUs | tool | /healthz sent during a scrape, median (ms) | its max (ms) | the scrape, median (ms) |")
        print("|---|---|---|---|---|")
        for gpus in (int(x) for x in args.gpus.split(",")):
            with tempfile.TemporaryDirectory(prefix="gpuwear-loop-") as folder:
                work = Path(folder)
                scenario = gen.scenario(gpus, work)
                for name, where in tools:
                    proc: subprocess.Popen[bytes] | None = None
                    try:
                        proc, port = start(name.replace(" ", "-"), scenario, work, where)
                        time.sleep(5.0)
                        r = rounds(port, args.rounds)
                    finally:
                        if proc is not None:
                            proc.terminate()
                            proc.wait(timeout=60)
                    print(f"| {gpus} | {name} | {r['probe_median_ms']:.2f} | {r['probe_max_ms']:.2f} | "
                          f"{r['scrape_median_ms']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
