"""Hostile clients for gpuwear's front door, one kind per process (as attackers are other processes).

    python bench/attack.py PORT KIND [--count N] [--rate R] [--cafile CA] [--seconds S] [--source ADDR]

The clients connect to 127.0.0.1:PORT from --source (default 127.0.0.2: Linux routes all of 127/8 to
loopback), as an attacker is another host than the scraper.

KIND:
  silent     hold --count connections open that send nothing (those the server closes are reopened,
             at most --rate a second)
  hello      hold --count connections trickling a real TLS ClientHello, one byte a second
  headers    hold --count connections trickling request header lines, one a second (after the TLS
             handshake when --cafile is given)
  passwords  --rate requests a second with a wrong basic-auth password (a new password each time)
  resets     --rate connections a second, closed at once with a reset

Runs until SIGTERM/SIGINT or --seconds, then prints one JSON line: connections opened, closed by
the server, requests answered by status. With --progress S, the same line every S seconds before it
(with "held": connections now open), so that a caller waits for the attack to build up rather than
for a time.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import selectors
import signal
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from typing import Any


def client_hello() -> bytes:
    """The first flight of a real TLS client."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_side=False)
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


class Attack:
    def __init__(self, port: int, context: ssl.SSLContext | None, source: str) -> None:
        self.port = port
        self.source = source
        self.context = context
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.held = 0

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(self.source, 0))
        self.counts["opened"] += 1
        return s

    def hold(self, count: int, first: bytes, step: bytes | None, tls: bool, every: float, rate: float) -> None:
        """Keep ``count`` connections open (opening at most ``rate`` a second); each sends ``first`` then
        ``step`` every ``every`` seconds (a byte of ``first`` at a time when step is None)."""
        held: dict[socket.socket, int] = {}
        tokens, refilled = float(count), time.monotonic()
        selector = selectors.DefaultSelector()
        next_step = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            tokens, refilled = min(float(count), tokens + (now - refilled) * rate), now
            while len(held) < count and tokens >= 1.0 and not self.stop.is_set():
                tokens -= 1.0
                try:
                    s = self.connect()
                    if tls and self.context is not None:
                        s = self.context.wrap_socket(s, server_hostname="127.0.0.1")
                    if step is not None and first:
                        s.sendall(first)
                    s.setblocking(False)
                    held[s] = 0
                    selector.register(s, selectors.EVENT_READ)
                except OSError:
                    self.counts["connect_failed"] += 1
                    self.stop.wait(0.05)
                    break
            self.held = len(held)
            for key, _ in selector.select(timeout=0.1):  # readable: the server answered or closed
                s = key.fileobj  # type: ignore[assignment]
                try:
                    if s.recv(4096):
                        continue  # an answer (or TLS 1.3 session tickets): still open
                except (BlockingIOError, ssl.SSLWantReadError):
                    continue
                except OSError:
                    pass
                selector.unregister(s)
                held.pop(s, None)
                s.close()
                self.counts["closed_by_server"] += 1
            if time.monotonic() >= next_step:
                next_step += every
                for s, sent in list(held.items()):
                    data = step if step is not None else first[sent:sent + 1]
                    if not data:
                        continue
                    try:
                        s.send(data)
                        held[s] = sent + 1
                    except (BlockingIOError, ssl.SSLWantWriteError):
                        pass
                    except OSError:
                        selector.unregister(s)
                        held.pop(s)
                        s.close()
                        self.counts["closed_by_server"] += 1
        for s in held:
            s.close()

    def flood(self, rate: float, action: Any) -> None:
        interval = 1.0 / rate
        due = time.monotonic()
        while not self.stop.is_set():
            due += interval
            try:
                action()
            except OSError:
                self.counts["failed"] += 1
            delay = due - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)
            else:
                due = time.monotonic()

    def wrong_password(self) -> None:
        s = self.connect()
        if self.context is not None:
            s = self.context.wrap_socket(s, server_hostname="127.0.0.1")
        with s:
            secret = base64.b64encode(f"prometheus:guess{self.counts['opened']}".encode()).decode()
            s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {secret}\r\n"
                      "Connection: close\r\n\r\n".encode())
            answer = s.recv(64)
            self.counts[answer[9:12].decode(errors="replace") or "no answer"] += 1

    def reset(self) -> None:
        s = self.connect()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("port", type=int)
    parser.add_argument("kind", choices=["silent", "hello", "headers", "passwords", "resets"])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--cafile")
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--source", default="127.0.0.2", help="the address to connect from (another host)")
    parser.add_argument("--progress", type=float, metavar="S", help="print the counts every S seconds too")
    args = parser.parse_args()
    context = ssl.create_default_context(cafile=args.cafile) if args.cafile else None
    attack = Attack(args.port, context, args.source)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: attack.stop.set())
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
    work = {
        "silent": lambda: attack.hold(args.count, b"", None, False, 1.0, args.rate),
        "hello": lambda: attack.hold(args.count, client_hello(), None, False, 1.0, args.rate),
        "headers": lambda: attack.hold(args.count, request, b"X-Trickle: 1\r\n", context is not None, 1.0,
                                       args.rate),
        "passwords": lambda: attack.flood(args.rate, attack.wrong_password),
        "resets": lambda: attack.flood(args.rate, attack.reset),
    }[args.kind]
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    end = time.monotonic() + args.seconds
    while not attack.stop.wait(min(args.progress or args.seconds, max(0.0, end - time.monotonic()))):
        if time.monotonic() >= end:
            break
        counts = dict.copy(attack.counts)  # one C call: the worker thread may add a key meanwhile
        print(json.dumps({"kind": args.kind, "held": attack.held, **counts}), flush=True)
    attack.stop.set()
    worker.join(timeout=5)
    print(json.dumps({"kind": args.kind, **attack.counts}), flush=True)


if __name__ == "__main__":
    main()
