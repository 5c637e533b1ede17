"""Shared test rigs: simulated GPUs behind the fake NVML library, read by the real NVML
backend through the real pynvml binding, on a manual clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuwear.backends.nvml import (
    GpuLostError,
    NvmlBackend,
    NvmlDriverError,
    NvmlUnavailableError,
    NvmlVersionMismatchError,
)
from gpuwear.clock import ManualClock
from gpuwear.sampler import Sampler, Snapshot
from gpuwear.sim.fakenvml import FakeNvmlLibrary
from gpuwear.sim.simulated import Simulation, load_scenario, parse_scenario

REPO = Path(__file__).resolve().parent.parent


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`pytest -m gpu` (the device machine's check) collects test_gpu.py alone: the other modules import test-only
    packages (hypothesis, rainflow, the pynvml clients) that machine may lack, and their tests are not GPU tests."""
    if config.getoption("markexpr", "") == "gpu" and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_") and collection_path.name != "test_gpu.py":
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses a fixture put under helpers.slow_fixture (directly or through another fixture) is ``slow``,
    and so are the e2e tests."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        fixtures = [] if info is None else [d for defs in info.name2fixturedefs.values() for d in defs]
        if item.get_closest_marker("e2e") or any(getattr(d.func, "gpuwear_slow", False) for d in fixtures):
            item.add_marker(pytest.mark.slow)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/*.prom from the current output instead of comparing")


class StepTimer:
    """A deterministic duration timer: each call moves 1/1024 s (exact in binary)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1 / 1024
        return self.now


@dataclass
class Rig:
    simulation: Simulation
    clock: ManualClock
    library: FakeNvmlLibrary
    backend: NvmlBackend
    sampler: Sampler

    def run(self, seconds: float, interval: float = 1.0) -> Snapshot:
        """Advance the clock and tick every ``interval`` for ``seconds``."""
        snap = self.sampler.snapshot
        for _ in range(round(seconds / interval)):
            self.clock.advance(interval)
            snap = self.sampler.tick()
        return snap


def make_rig(scenario: str | dict[str, object], slow_interval: float = 30.0) -> Rig:
    """A rig on a built-in scenario name, a scenario file path, or a scenario document."""
    sim = parse_scenario(scenario, "test") if isinstance(scenario, dict) else load_scenario(scenario)
    clock = ManualClock()
    library = FakeNvmlLibrary(sim, clock)
    backend = NvmlBackend(library)
    sampler = Sampler(backend, clock, slow_interval, (GpuLostError,), timer=StepTimer(),
                      driver_errors=(NvmlDriverError,), unavailable_errors=(NvmlUnavailableError,),
                      fatal_errors=(NvmlVersionMismatchError,))
    sampler.open()
    return Rig(sim, clock, library, backend, sampler)


def follow_kernel_log(rig: Rig, tracker: Any, ready: Callable[[Snapshot], bool], first: int = 0, after: int = 1,
                      held: bool = False, events: bool = False) -> None:
    """The rig's GPUs read with the fake driver's kernel log followed as the daemon follows it (the reader's XID,
    NVLink and process callbacks; NVML's event set too where ``events``), each tick observed by ``tracker``: ``first``
    ticks of a simulated second, then ticks until ``ready(snapshot)`` (the reader's thread in real time, 30 s at most;
    with the clock ``held``, ticks that do not advance it), then ``after`` more; the reader stopped and the backend
    closed."""
    from gpuwear.kernlog import KernelLogXids

    def tick(advance: bool = True) -> None:
        if advance:
            rig.run(1)
        else:
            rig.sampler.tick()
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())

    if events:
        rig.sampler.start_events(wait_ms=20)
    kernel = KernelLogXids("simulation", rig.sampler.record_kernel_xid, rig.simulation.kernel_log,
                           rig.simulation.wake_kernel_log, on_nvlink=rig.sampler.record_kernel_nvlink,
                           on_process=rig.sampler.record_kernel_process)
    kernel.start()
    try:
        for _ in range(first):
            tick()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not ready(rig.sampler.snapshot):
            tick(not held)
            time.sleep(0.01)
        for _ in range(after):
            tick()
    finally:
        kernel.stop()
        rig.backend.close()


@pytest.fixture(autouse=True)
def state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Daemons started by a test (and their children) keep state in the test's own folder,
    through systemd's $STATE_DIRECTORY convention, never in the user's home."""
    folder = tmp_path / "state"
    monkeypatch.setenv("STATE_DIRECTORY", str(folder))
    return folder


@pytest.fixture
def demo() -> Iterator[Rig]:
    rig = make_rig("demo")
    yield rig
    rig.backend.close()
