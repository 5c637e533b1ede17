"""What the benchmarks share: a free port, the daemon started as a user starts it (and never left behind), reads of a
process's RSS and written bytes from /proc, and an HTTP GET that answers (0, b"") rather than raising."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

PYTHON = sys.executable
ROOT = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal a process gets when its parent dies


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel reports free on ``host`` (a loopback address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def gpuwear(*args: str) -> list[str]:
    """The command line of ``gpuwear ARGS`` in this Python."""
    return [PYTHON, "-m", "gpuwear", *args]


def rss_mib(pid: int) -> float:
    """A process's resident set (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time so far (/proc/PID/stat utime + stime), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def written(pid: int) -> int:
    """The bytes a process caused to be written to storage (/proc/PID/io write_bytes)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def get(url: str, timeout: float = 60.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body), or (0, b"") when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except OSError:
        return 0, b""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the benchmark that started it dies, however it dies (a timeout's
    SIGKILL included), so a killed benchmark leaves no daemon running to skew the next one."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the benchmark's own stop() is all there is
        pass


def start_daemon(state: Path, scenario: Path, speed: float,
                 config: Path | None = None) -> tuple[subprocess.Popen[bytes], int, float]:
    """``gpuwear run --simulate SCENARIO --speed S [--config FILE]`` on ``state``: (process, port, seconds to its
    first /metrics)."""
    port = free_port()
    started = time.monotonic()
    proc = subprocess.Popen(gpuwear("run", *(("--config", str(config)) if config is not None else ()), "--simulate",
                                    str(scenario), "--speed", str(speed), "--listen", f"127.0.0.1:{port}",
                                    "--state-dir", str(state)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    while time.monotonic() - started < 120:
        status, _ = get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        if status == 200:
            return proc, port, time.monotonic() - started
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError("the daemon did not answer /metrics within 120 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and wait for the daemon's final save."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


@contextlib.contextmanager
def revision(rev: str) -> Iterator[Path]:
    """A temporary git worktree of ``rev`` (its package is ``/daemon`` below it), removed on the way out."""
    tree = Path(tempfile.mkdtemp(prefix="gpuwear-against-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev], check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
