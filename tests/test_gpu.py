"""The same checks against a real NVIDIA GPU (``pytest -m gpu``); skipped where there is none."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpuwear.backends.nvml import GpuLostError, NvmlBackend, NvmlUnavailableError
from gpuwear.clock import SystemClock
from gpuwear.collector import GpuwearCollector
from gpuwear.metrics import DaemonInfo, Published
from gpuwear.sample import PHYSICAL_RANGES
from gpuwear.sampler import Sampler

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def sampler() -> Iterator[Sampler]:
    backend = NvmlBackend()
    s = Sampler(backend, SystemClock(), 30.0, (GpuLostError,))
    try:
        s.open()
    except NvmlUnavailableError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    if not s.snapshot.gpus:
        backend.close()
        pytest.skip("NVML loads but lists no GPU")
    yield s
    backend.close()


def test_identity(sampler: Sampler) -> None:
    for status in sampler.snapshot.gpus:
        assert status.identity.uuid.startswith(("GPU-", "MIG-"))
        assert status.identity.name and status.identity.memory_total_bytes


def test_samples_are_physical(sampler: Sampler) -> None:
    snap = sampler.tick()
    for status in snap.gpus:
        assert status.up and status.sample is not None, status
        assert status.sample.temperature_gpu_celsius is not None
        for name, (lo, hi) in PHYSICAL_RANGES.items():
            value = getattr(status.sample, name)
            for v in value if isinstance(value, tuple) else (value,):
                assert v is None or lo <= v <= hi, (name, v)
        assert not status.dropped, status.dropped
        print(status.identity.name, {k: v for k, v in vars(status.sample).items() if v is not None})


def test_energy_counter_advances(sampler: Sampler) -> None:
    first = sampler.tick().gpus[0].energy_joules_total
    time.sleep(1.5)
    second = sampler.tick().gpus[0].energy_joules_total
    if first is None:
        pytest.skip("this GPU has no energy counter")
    assert second is not None and second > first


def test_events_listener_starts(sampler: Sampler) -> None:
    sampler.start_events(wait_ms=100)
    time.sleep(0.5)
    assert all(not s.xids or all(c > 0 for c in s.xids.values()) for s in sampler.snapshot.gpus)


def test_exposition_passes_promtool(sampler: Sampler) -> None:
    sampler.tick()
    registry = CollectorRegistry(auto_describe=False)
    info = DaemonInfo("test", "test", "nvml", "")
    registry.register(GpuwearCollector(lambda: Published(sampler.snapshot, {}, None, info)))
    text = generate_latest(registry).decode()
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed on this machine")
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert result.returncode == 0 and not result.stdout.strip(), result
