"""TLS handshakes aborted by the thousand, measured from outside: the daemon's RSS before, after, and a while later.

    python bench/tls_churn.py [--connections 50000] [--settle 60]

Runs ``gpuwear run --simulate`` with TLS (a throwaway certificate made with openssl), then opens ``--connections``
connections from 200 loopback addresses (127.0.0.2 to 127.0.0.201), each sending its ClientHello and leaving once
the daemon's first flight has begun (a scanner, a load balancer's TCP probes). Prints the RSS before, right after,
and ``--settle`` seconds later (the goal, issue 27: at most 64 MiB after 50,000, and back within 5 MiB of the start
a minute later).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import _die_with_parent, free_port, gpuwear, rss_mib


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=50000)
    parser.add_argument("--settle", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwear-tls-") as folder:
        work = Path(folder)
        openssl = shutil.which("openssl")
        if openssl is None:
            print("openssl is needed to make the certificate", file=sys.stderr)
            return 2
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(work / "key.pem"),
                        "-out", str(work / "cert.pem"), "-days", "1", "-subj", "/CN=localhost"],
                       check=True, capture_output=True)
        (work / "web.yml").write_text(f"tls_server_config:\n  cert_file: {work / 'cert.pem'}\n"
                                      f"  key_file: {work / 'key.pem'}\n")
        (work / "config.yaml").write_text(f"web_config_file: {work / 'web.yml'}\n")
        port = free_port()
        proc = subprocess.Popen(gpuwear("run", "--simulate", "--config", str(work / "config.yaml"), "--listen",
                                        f"127.0.0.1:{port}", "--state-dir", str(work / "state")),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=2) as s, context.wrap_socket(s):
                        break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("the daemon did not answer over TLS within 60 s") from None
                    time.sleep(0.1)
            time.sleep(2.0)
            before = rss_mib(proc.pid)
            started = time.monotonic()
            for i in range(args.connections):
                with socket.socket() as s, contextlib.suppress(OSError):
                    s.settimeout(10)
                    s.bind((f"127.0.0.{2 + i % 200}", 0))
                    s.connect(("127.0.0.1", port))
                    client = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO())
                    with contextlib.suppress(ssl.SSLWantReadError):
                        client.do_handshake()
                    s.sendall(outgoing.read())
                    s.recv(1)
            took = time.monotonic() - started
            after = rss_mib(proc.pid)
            time.sleep(args.settle)
            later = rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"`python bench/tls_churn.py --connections {args.connections} --settle {args.settle:g}`, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.connections} handshakes aborted in "
          f"{took:.0f} s; daemon RSS {before:.1f} MiB before, {after:.1f} MiB after, {later:.1f} MiB "
          f"{args.settle:g} s later")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
