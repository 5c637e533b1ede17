"""bench/common.py: what the benchmarks share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import wait_for

REPO = Path(__file__).resolve().parent.parent

STARTS_A_DAEMON = """
import sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
from common import start_daemon
proc, port, _ = start_daemon(Path({state!r}), Path("demo"), 60.0)
print(proc.pid, port, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


@pytest.mark.slow
def test_a_benchmark_killed_leaves_no_daemon_behind(tmp_path: Path) -> None:
    """A benchmark killed by a timeout (SIGKILL: no finally block runs) left its daemon running at x20000, which
    skewed the next benchmark's figures: the daemon now gets SIGTERM when the benchmark that started it dies."""
    state = tmp_path / "state"
    script = STARTS_A_DAEMON.format(bench=str(REPO / "bench"), state=str(state))
    bench = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout is not None
        pid, port = (int(x) for x in bench.stdout.readline().split())
        wait_for(f"http://127.0.0.1:{port}/healthz", "ok")
        assert _alive(pid)
        bench.send_signal(signal.SIGKILL)
        bench.wait(timeout=10)
        for _ in range(600):  # up to 60 s: the daemon saves and exits on SIGTERM
            if not _alive(pid):
                break
            subprocess.run(["sleep", "0.1"], check=False)
        assert not _alive(pid), "the daemon outlived the benchmark that started it"
    finally:
        bench.kill()
        bench.wait()
