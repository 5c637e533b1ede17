"""Small helpers shared by the tests that start the daemon."""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

QUICK = os.environ.get("GPUWEAR_QUICK") == "1"  # set by ./test.sh --quick


def examples(full: int) -> int:
    """How many examples a property test draws: ``full`` in the whole suite, a tenth (at least 10) in the quick
    check, which runs the same properties between commits and leaves the long search to the whole suite."""
    return max(10, full // 10) if QUICK else full


def free_ports(count: int) -> list[int]:
    """Distinct ports the kernel reports free on 127.0.0.1 (the sockets are held together)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_port() -> int:
    return free_ports(1)[0]


_PACKAGES = {"prometheus": "prometheus", "promtool": "prometheus", "chromium": "chromium",
             "chromedriver": "chromium-driver"}


def require(tool: str) -> str:
    """The path of a tool the test needs; a failure (never a skip) saying how to install it."""
    path = shutil.which(tool)
    if path is None:
        package = _PACKAGES.get(tool, tool)
        pytest.fail(f"`{tool}` is not on PATH: install Debian's {package} package "
                    f"(sudo apt-get install {package}), or run ./test.sh, which does", pytrace=False)
    return path


# urllib would send even loopback requests through $http_proxy: never use a proxy here.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with _HTTP.open(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(url: str, needle: str, seconds: float = 60.0) -> str:
    """Poll ``url`` until its body contains ``needle``; returns the body. ``seconds`` is a deadline far above the
    normal time (a daemon on a loaded machine starts slowly), and a failure says how long it waited."""
    began = time.monotonic()
    last = ""
    while time.monotonic() - began < seconds:
        try:
            _, last = fetch(url)
            if needle in last:
                return last
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} did not show {needle!r} in {time.monotonic() - began:.1f} s of waiting; "
                         f"last body: {last[:500]!r}")


def real_nvml_present() -> bool:
    """True on a machine with an NVIDIA driver (libnvidia-ml loads)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    return f"--- last lines of {log.name} ---\n" + "\n".join(text.splitlines()[-lines:])


@contextmanager
def logs_on_failure(*logs: Path) -> Iterator[None]:
    """Append the tails of ``logs`` to the message of an assertion failing inside the block."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError("\n".join([str(exc), *(tail(log) for log in logs)])) from None


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate, then kill after 5 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def started(args: list[str], log: Path, cwd: Path, *, stdout_to_log: bool = True) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` (stderr, and stdout unless told not to, to ``log``); stop it on leaving, whatever happened."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out if stdout_to_log else subprocess.DEVNULL,
                                stderr=out, cwd=cwd)
    try:
        yield proc
    finally:
        stop(proc)


T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])


def slow_fixture(fixture: F) -> F:
    """Put under ``@pytest.fixture`` of a fixture that starts a daemon, a browser, Prometheus, an install or a
    simulation of hours: every test that uses it (directly or through another fixture) is marked ``slow``
    (conftest.py), and ``./test.sh --quick`` leaves it out."""
    fixture.gpuwear_slow = True  # type: ignore[attr-defined]
    return fixture


def poll_until(what: str, seconds: float, procs: Mapping[str, subprocess.Popen[bytes]],
               attempt: Callable[[], T | None], interval: float) -> T:
    """Call ``attempt`` every ``interval`` seconds until it returns something other than None; fail early when
    one of ``procs`` (name -> process) died, and after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        for name, proc in procs.items():
            assert proc.poll() is None, f"{name} exited with code {proc.returncode} while waiting for {what}"
        result = attempt()
        if result is not None:
            return result
        assert time.monotonic() < deadline, f"gave up after {seconds:g} s of waiting for {what}"
        time.sleep(interval)


def run_simulated(state: Path, scenario: str, speed: float, seconds: float) -> None:
    """The daemon (in process) on simulated GPUs at ``speed`` until it has done what ``seconds`` of wall time give
    it on a quiet machine (its ticks at their wall interval, MIN_WALL_INTERVAL_SECONDS at these speeds), then
    stopped: a ledger with at least that much simulated history in ``state``. Not a fixed wall time: on a loaded
    machine a daemon ticks less often, and a test counting the jobs of those seconds found fewer (issue 53)."""
    from gpuwear.config import Config
    from gpuwear.service import MIN_WALL_INTERVAL_SECONDS, Daemon, open_source

    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(state))
    daemon = Daemon(config, open_source(config, scenario, speed, False))
    ticks = seconds / max(config.sampling.interval_seconds / speed, MIN_WALL_INTERVAL_SECONDS)
    began = time.monotonic()
    daemon.start()
    try:
        while time.monotonic() - began < seconds or daemon.source.sampler.snapshot.ticks < ticks:
            assert time.monotonic() - began < seconds + 120, "the simulated daemon did not tick as often as asked"
            time.sleep(0.05)
    finally:
        daemon.stop()



def card_by_day(rates_by_day: list[float], uuid: str = "GPU-lone", hours_a_day: float = 8.0,
                name: str = "NVIDIA H100 80GB HBM3") -> Any:
    """A GPU's record (GpuWear) loaded ``hours_a_day`` a day (a sample every 10 minutes, idle the rest of the day), its
    corrected ECC errors rising at ``rates_by_day[d]`` per loaded hour on UTC day d (from 2027-01-16), through
    GpuWear.add."""
    from gpuwear.sample import GpuSample
    from gpuwear.wear.accumulate import GpuWear

    w = GpuWear(uuid, name=name)
    count, t, midnight = 0.0, 0.0, 20834 * 86400.0
    for rate in rates_by_day:
        for minute in range(0, 24 * 60, 10):
            loaded = minute < hours_a_day * 60
            count += rate / 6.0 if loaded else 0.0
            w.add(GpuSample(timestamp=midnight + t, monotonic=t, temperature_gpu_celsius=50.0,
                            utilization_gpu_ratio=1.0 if loaded else 0.0, ecc_corrected_volatile=int(count)),
                  0.0 if t == 0 else 600.0)
            t += 600.0
    return w
