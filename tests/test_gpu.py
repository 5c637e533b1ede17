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
from gpuwear.families import GpuwearCollector
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


# -- what the fake's driver profiles claim, checked against the real driver --------------------------------


def _branch(driver_version: str) -> str:
    """The newest profiled branch not newer than this driver (535.104.05 -> "r535")."""
    from gpuwear.sim import nvml_symbols

    major = int(driver_version.split(".")[0])
    older = [b for b in nvml_symbols.BRANCHES if int(b[1:]) <= major]
    if not older:
        pytest.skip(f"driver {driver_version} is older than every profiled branch")
    return older[-1]


def test_the_library_exports_what_the_profile_of_its_branch_claims(sampler: Sampler) -> None:
    import ctypes

    from gpuwear.sim import nvml_symbols

    system = sampler.snapshot.system
    assert system is not None
    branch = _branch(system.driver_version)
    library = ctypes.CDLL("libnvidia-ml.so.1")
    release = tuple(int(p) for p in system.driver_version.split("."))
    claimed = {name for name in nvml_symbols.exported(branch)
               if tuple(int(p) for p in nvml_symbols.ADDED_MID_BRANCH.get(name, "0").split(".")) <= release}
    missing = sorted(name for name in claimed if not hasattr(library, name))
    print(f"driver {system.driver_version}: branch {branch}, {len(claimed)} symbols claimed")
    assert not missing, f"the {branch} profile claims symbols driver {system.driver_version} lacks: {missing}"


def test_field_return_codes_are_what_the_fake_answers(sampler: Sampler) -> None:
    """Known fields answer SUCCESS or NOT_SUPPORTED per field; the first id past the branch's NVML_FI_MAX answers
    the per-field INVALID_ARGUMENT (the fake's reading of DCGM's DcgmTopology.cpp)."""
    import pynvml

    from gpuwear.backends.nvml import FIELD_VALUES
    from gpuwear.sim import nvml_symbols

    system = sampler.snapshot.system
    assert system is not None
    unknown = nvml_symbols.FIELD_ID_MAX_LATEST[_branch(system.driver_version)] + 5
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids = [f[0] for f in FIELD_VALUES] + [unknown]
    codes = {fid: fv.nvmlReturn for fid, fv in zip(ids, pynvml.nvmlDeviceGetFieldValues(handle, ids), strict=True)}
    print("field return codes:", codes)
    assert all(codes[f[0]] in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED) for f in FIELD_VALUES), codes
    assert codes[unknown] == pynvml.NVML_ERROR_INVALID_ARGUMENT, codes


def test_event_wait_honours_its_timeout(sampler: Sampler) -> None:
    import pynvml

    event_set = pynvml.nvmlEventSetCreate()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        waits = []
        for _ in range(3):
            start = time.perf_counter()
            with pytest.raises(pynvml.NVMLError_Timeout):
                pynvml.nvmlEventSetWait(event_set, 200)
            waits.append(time.perf_counter() - start)
        print("event waits (s):", waits)
        assert all(0.15 <= w <= 0.5 for w in waits), waits
    finally:
        pynvml.nvmlEventSetFree(event_set)


def test_energy_counter_matches_integrated_power(sampler: Sampler) -> None:
    """Over a few seconds the energy counter's increase is the power integrated at 20 Hz, within 15 %
    (a GH200's module counter would not be: the README's caveat)."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        start_energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError_NotSupported:
        pytest.skip("this GPU has no energy counter")
    integrated, last = 0.0, time.perf_counter()
    start = last
    while last - start < 4.0:
        time.sleep(0.05)
        now = time.perf_counter()
        integrated += pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0 * (now - last)
        last = now
    counted = (pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) - start_energy) / 1000.0
    print(f"energy counter {counted:.1f} J, integrated power {integrated:.1f} J")
    assert counted == pytest.approx(integrated, rel=0.15)


def test_memory_used_v2_leaves_out_the_reserved_memory(sampler: Sampler) -> None:
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    print(f"v1 used {v1.used}, v2 used {v2.used}, reserved {v2.reserved}")
    assert v2.used <= v1.used and v2.total == v1.total


def test_two_cuda_contexts_are_both_found(sampler: Sampler) -> None:
    """Two processes holding a CUDA context each (torch, where installed): gpuwear's process list, read through the
    layout it chose for this driver, has both PIDs."""
    import sys

    pytest.importorskip("torch")
    script = ("import torch, sys, time; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); "
              "print('ready', flush=True); sys.stdin.read()")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        sample = sampler.tick().gpus[0].sample
        assert sample is not None and sample.processes is not None, sampler.snapshot.gpus[0].unavailable
        pids = {pid for pid, _ in sample.processes}
        print("processes:", sample.processes)
        assert {p.pid for p in procs} <= pids
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
