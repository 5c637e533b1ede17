"""The daemon: HTTP endpoints, scrapes that never wait on NVML, start and stop."""

from __future__ import annotations

import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwear.config import Config
from gpuwear.service import Daemon, open_source
from helpers import fetch, free_port, poll_until, real_nvml_present, slow_fixture, wait_for


@pytest.fixture
@slow_fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path))
    d = Daemon(config, open_source(config, "demo", 1.0, False))
    d.start()
    yield d
    d.stop()


def test_endpoints(daemon: Daemon) -> None:
    base = f"http://127.0.0.1:{daemon.port}"
    status, body = fetch(base + "/metrics")
    assert status == 200 and 'gpuwear_backend_info{backend="simulated",scenario="demo"} 1.0' in body
    assert fetch(base + "/healthz") == (200, "ok\n")
    assert fetch(base + "/")[0] == 200
    assert fetch(base + "/nope")[0] == 404


@pytest.mark.slow
def test_scrape_is_served_from_the_snapshot_while_nvml_hangs(daemon: Daemon) -> None:
    assert daemon.source.simulation is not None
    daemon.source.simulation.gpus[0].state.hang_seconds = 1.5
    ticking = threading.Thread(target=daemon.source.sampler.tick)
    ticking.start()
    time.sleep(0.1)
    start = time.monotonic()
    status, body = fetch(f"http://127.0.0.1:{daemon.port}/metrics")
    elapsed = time.monotonic() - start
    ticking.join()
    assert status == 200 and "gpuwear_temperature_celsius" in body
    assert elapsed < 0.5, f"scrape waited {elapsed:.2f}s on a hung NVML call"


@pytest.mark.slow
def test_an_idle_http_server_does_not_wake_up(daemon: Daemon) -> None:
    """The listener blocks until a connection (or stop) arrives: no periodic poll costing CPU."""
    http = next(t for t in threading.enumerate() if t.name == "http")
    fetch(f"http://127.0.0.1:{daemon.port}/metrics")  # served, then idle

    def runs() -> int:  # /proc/PID/task/TID/schedstat: CPU ns, wait ns, times scheduled on a CPU
        return int(Path(f"/proc/self/task/{http.native_id}/schedstat").read_text().split()[2])

    # the served connection's end (the client's close, then the loop's own callbacks) comes after fetch returned,
    # later still on a loaded machine: wait until the thread has gone quiet, then count
    before, deadline = runs(), time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = runs()
        if now == before:
            break
        before = now
    time.sleep(2.0)
    assert runs() - before <= 1  # socketserver's serve_forever(poll_interval=0.2) ran 10 times here
    assert fetch(f"http://127.0.0.1:{daemon.port}/healthz") == (200, "ok\n")


def run_daemon(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuwear", "run", *args], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_daemon_within_two_seconds(sig: signal.Signals) -> None:
    port = free_port()
    proc = run_daemon("--simulate", "--listen", f"127.0.0.1:{port}")
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_power_watts")
        start = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - start < 2.0
    finally:
        proc.kill()
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert "SIMULATED GPUs" in log and "Traceback" not in log


@pytest.mark.slow
def test_speed_runs_simulated_time_faster() -> None:
    port = free_port()
    proc = run_daemon("--simulate", "--speed", "100", "--listen", f"127.0.0.1:{port}")
    try:
        metric = 'gpuwear_lifetime_observed_seconds_total{gpu="1"'
        body = wait_for(f"http://127.0.0.1:{port}/metrics", metric)
        first = float(body.split(metric)[1].split()[1])
        time.sleep(1.0)
        _, body = fetch(f"http://127.0.0.1:{port}/metrics")
        second = float(body.split(metric)[1].split()[1])
        assert 70 < second - first < 130  # 100 simulated seconds observed in one wall second
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_usage_errors() -> None:
    result = subprocess.run([sys.executable, "-m", "gpuwear", "run", "--speed", "10"], capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 2 and "--speed applies to simulated GPUs only" in result.stderr
    result = subprocess.run([sys.executable, "-m", "gpuwear", "run", "--simulate", "nope"], capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("gpuwear: scenario 'nope': no such file and not a built-in scenario")
    result = subprocess.run([sys.executable, "-m", "gpuwear", "--version"], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0 and result.stdout.startswith("gpuwear ")


@pytest.mark.skipif(real_nvml_present(), reason="this machine has an NVIDIA driver; NVML is not missing here")
def test_without_a_driver_run_fails_with_one_clear_line() -> None:
    result = subprocess.run([sys.executable, "-m", "gpuwear", "run", "--listen", f"127.0.0.1:{free_port()}"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "install the NVIDIA driver" in lines[0] and "--simulate" in lines[0]


@pytest.mark.slow
@pytest.mark.skipif(real_nvml_present(), reason="this machine has an NVIDIA driver; the fallback is not used")
def test_without_a_driver_the_fallback_simulates_and_says_so() -> None:
    port = free_port()
    proc = run_daemon("--simulate-if-no-gpu", "--listen", f"127.0.0.1:{port}")
    try:
        body = wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_power_watts")
        assert 'gpuwear_backend_info{backend="simulated",scenario="demo"} 1.0' in body
    finally:
        proc.terminate()
        proc.wait(timeout=5)
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert "no usable NVIDIA driver here" in log and "SIMULATED GPUs" in log


@pytest.mark.slow
def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    first = run_daemon("--simulate", "--listen", f"127.0.0.1:{port}")
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_power_watts")
        second = subprocess.run([sys.executable, "-m", "gpuwear", "run", "--simulate", "--listen",
                                 f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "other")],
                                capture_output=True, text=True, timeout=30, check=False)
        assert second.returncode == 1
        assert f"gpuwear: cannot serve on 127.0.0.1:{port}: Address already in use" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=5)


@pytest.mark.slow
def test_systemd_notify_readiness_watchdog_reload_and_stop(tmp_path: Path) -> None:
    """A real datagram socket stands in for systemd's NOTIFY_SOCKET."""
    import os
    import socket

    notify = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(10)
    config = tmp_path / "config.yaml"
    config.write_text("sampling:\n  interval_seconds: 0.2\n")
    port = free_port()
    env = {**os.environ, "NOTIFY_SOCKET": str(notify), "WATCHDOG_USEC": "400000"}
    proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", "--config", str(config),
                             "--listen", f"127.0.0.1:{port}"], stderr=subprocess.PIPE, text=True, env=env)

    def until(prefix: str) -> str:
        while True:
            message = sock.recv(4096).decode()
            if message.startswith(prefix):
                return message

    try:
        assert "STATUS=sampling 2 GPU(s)" in until("READY=1")
        status, body = fetch(f"http://127.0.0.1:{port}/metrics")  # serving once ready
        assert status == 200 and "gpuwear_temperature_celsius" in body
        until("WATCHDOG=1")
        until("WATCHDOG=1")  # fed again by the sampling loop
        assert "gpuwear_performance_state" not in body  # metrics.detail is off by default
        config.write_text("sampling:\n  interval_seconds: 0.5\nwear:\n  busy_utilization_ratio: 0.5\n"
                          "metrics:\n  detail: true\n")
        proc.send_signal(signal.SIGHUP)
        until("RELOADING=1")
        until("READY=1")
        assert "gpuwear_performance_state" in fetch(f"http://127.0.0.1:{port}/metrics")[1]
        config.write_text("sampling:\n  interval_seconds: -3\n")
        proc.send_signal(signal.SIGHUP)
        until("RELOADING=1")
        until("READY=1")
        proc.send_signal(signal.SIGTERM)
        until("STOPPING=1")
        assert proc.wait(timeout=5) == 0
    finally:
        proc.kill()
        sock.close()
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert "SIGHUP: reloaded" in log and "(sampling every 0.5s)" in log
    assert "changed; it takes effect at the next restart" not in log  # --listen is the command line's, kept
    assert "refused, keeping the running config: sampling.interval_seconds" in log


def test_healthz_reports_a_stuck_sampling_loop(daemon: Daemon) -> None:
    base = f"http://127.0.0.1:{daemon.port}"
    assert fetch(base + "/healthz") == (200, "ok\n")
    daemon._tick_done -= 3600  # as if no tick had finished for an hour
    status, body = fetch(base + "/healthz")
    assert status == 503 and body.startswith("no sampling tick finished for")


@pytest.mark.slow
def test_sampling_loop_ticks_at_the_configured_rate_and_follows_a_reload(tmp_path: Path) -> None:
    """The sampling thread ticks every interval (not faster, no burst after a slow tick) and picks up a reloaded
    interval at the next tick."""
    from dataclasses import replace

    file = tmp_path / "config.yaml"
    file.write_text("sampling:\n  interval_seconds: 0.05\n")
    config = replace(Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path)),
                     sampling=replace(Config().sampling, interval_seconds=0.05))
    d = Daemon(config, open_source(config, "demo", 1.0, False), config_path=str(file))
    d.start()
    try:
        def rate(seconds: float) -> float:
            first = d.source.sampler.snapshot.ticks
            time.sleep(seconds)
            return (d.source.sampler.snapshot.ticks - first) / seconds

        assert 12 <= rate(1.0) <= 21  # 20 per second, less what a loaded machine delays
        file.write_text("sampling:\n  interval_seconds: 0.25\n")
        assert d.reload()
        time.sleep(0.3)
        assert 2 <= rate(2.0) <= 4.5
        with d._tick_lock:  # a tick held up for 0.6 s (2.4 intervals): the missed ticks are not made up in a burst
            time.sleep(0.6)
        assert rate(1.0) <= 6  # 4 on time and the held one (+1 for sleep overshoot); a burst adds 2 more
    finally:
        d.stop()


@pytest.mark.slow
def test_a_reloaded_persist_interval_applies_at_once(tmp_path: Path) -> None:
    """A save every hour, reloaded to every second: the next save comes within seconds, not after the hour."""
    file = tmp_path / "config.yaml"
    file.write_text("wear:\n  persist_interval_seconds: 3600\n")
    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path))
    d = Daemon(config, open_source(config, "demo", 1.0, False), config_path=str(file))
    d.reload()
    d.start()
    try:
        time.sleep(1.5)
        assert d._ledger_status.last_success_wall is None  # no save yet: the first is an hour away
        file.write_text("wear:\n  persist_interval_seconds: 1\n")
        assert d.reload()
        poll_until("a save after the reload", 5.0, {}, lambda: d._ledger_status.last_success_wall, 0.1)
    finally:
        d.stop()


_ARENAS_SCRIPT = """
import ctypes, sys, tempfile, threading
from gpuwear.runtime import limit_malloc_arenas
assert limit_malloc_arenas() if sys.argv[1] == "limit" else True
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
keep = []
barrier = threading.Barrier(12)
def work():
    barrier.wait()  # all at once: a thread finding the arenas busy is given a new one
    keep.extend(bytearray(1000) for _ in range(2000))
threads = [threading.Thread(target=work) for _ in range(12)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with tempfile.NamedTemporaryFile() as out:
    fp = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(open(out.name).read().count("<heap nr="))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_malloc_arenas_are_capped() -> None:
    """`gpuwear run` caps glibc's malloc arenas: threads allocating at once share two instead of one each
    (glibc's malloc_info lists one <heap> per arena)."""
    def heaps(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _ARENAS_SCRIPT, mode], capture_output=True, text=True, check=True)
        return int(done.stdout)

    assert heaps("limit") <= 2
    assert heaps("default") > 2  # the check can tell: without the cap the same threads get arenas of their own


_TRIM_SCRIPT = """
from gpuwear.runtime import give_back_freed_memory
def rss():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")) // 1024
freed = [bytearray(1000) for _ in range(40_000)]  # past pymalloc's 512 bytes: malloc's own heap, 40 MB
kept = bytearray(1000)  # above them: the heap's top is not free, so free() alone gives nothing back
del freed
before = rss()
assert give_back_freed_memory()
print(before, rss())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_memory_is_given_back() -> None:
    """Issue 52: the daemon's resident memory held each malloc arena's high-water (what ticks, scrapes and saves
    freed stays with malloc); after each save it hands the free pages back (glibc's malloc_trim). Here 40 MB freed
    below a block still in use: free() keeps them, the call gives them back (MiB, in a fresh interpreter)."""
    done = subprocess.run([sys.executable, "-c", _TRIM_SCRIPT], capture_output=True, text=True, check=True)
    before, after = map(int, done.stdout.split())
    assert before - after >= 30, (before, after)


@pytest.mark.slow
def test_start_settles_the_cyclic_collector() -> None:
    """Daemon.start freezes what start-up made out of the collector's view and collects the youngest generation
    every 10,000 net allocations instead of 700 (bench/README.md: 1.5 collections inside each 64-GPU scrape, none
    after); in a fresh interpreter, as `gpuwear run` starts."""
    script = """
import gc, sys, tempfile
from gpuwear.config import Config
from gpuwear.service import Daemon, open_source
sys.path.insert(0, "tests")
from helpers import free_port
before = (gc.get_threshold()[0], gc.get_freeze_count())
config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=tempfile.mkdtemp())
d = Daemon(config, open_source(config, "demo", 1.0, False))
d.start()
print(*before, gc.get_threshold()[0], gc.get_freeze_count())
d.stop()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent)
    threshold_before, frozen_before, threshold, frozen = map(int, done.stdout.split())
    assert (threshold_before, frozen_before) == (700, 0)
    assert threshold == 10_000 and frozen > 10_000  # modules, the ledger's history
