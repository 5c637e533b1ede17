"""A fake NVML *library*: the C entry points of libnvidia-ml, answered from simulated GPUs.

The real ``pynvml`` binding looks every C function up by name on its loaded library object
(``getattr(nvmlLib, name)``) and calls it with ctypes arguments. :class:`FakeNvmlLibrary`
stands in for that object, so everything above the library boundary, pynvml's own
argument marshalling and error mapping included, runs unmodified. A function the fake
does not implement raises ``AttributeError`` on lookup, which pynvml turns into
``NVML_ERROR_FUNCTION_NOT_FOUND`` exactly as for an old driver. Values come from
:mod:`gpuwear.backends.simulated`, in NVML's units (mW, mJ, MHz, %, ns).

Constants are NVML's C ABI values from ``nvml.h``; this module does not import pynvml
(``backends/nvml.py`` installs the fake into it).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpuwear.backends.simulated import SimGpu, Simulation
from gpuwear.clock import Clock

log = logging.getLogger(__name__)

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_GPU_IS_LOST = 15
ERROR_UNKNOWN = 999

_ERROR_STRINGS = {
    SUCCESS: b"Success", ERROR_UNINITIALIZED: b"Uninitialized",
    ERROR_INVALID_ARGUMENT: b"Invalid Argument", ERROR_NOT_SUPPORTED: b"Not Supported",
    ERROR_NOT_FOUND: b"Not Found", ERROR_INSUFFICIENT_SIZE: b"Insufficient Size",
    ERROR_TIMEOUT: b"Timeout", ERROR_GPU_IS_LOST: b"GPU is lost", ERROR_UNKNOWN: b"Unknown Error",
}

# nvmlFieldValue_t field ids and value types
FI_ECC_SBE_VOL_TOTAL = 3
FI_ECC_DBE_VOL_TOTAL = 4
FI_ECC_SBE_AGG_TOTAL = 5
FI_ECC_DBE_AGG_TOTAL = 6
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY_CONSUMPTION = 83
FI_PCIE_REPLAY_COUNTER = 94
FI_GET_GPU_RECOVERY_ACTION = 230
VALUE_TYPE_UNSIGNED_INT = 1
VALUE_TYPE_UNSIGNED_LONG_LONG = 3

EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10

MIN_ADVANCE_SECONDS = 0.05  # simulated time below which the state is left as it is
_HANDLE_BASE = 0x6770_0000
_EVENT_SET_BASE = 0x6e00_0000
_CARG_TYPE = type(ctypes.byref(ctypes.c_int()))

DRIVER_VERSION = b"560.35.03"
NVML_VERSION = b"12.560.35.03"
CUDA_DRIVER_VERSION = 12060


class _UnsupportedError(Exception):
    """Raised inside a fake function to answer NVML_ERROR_NOT_SUPPORTED."""


class _LostError(Exception):
    """Raised inside a fake function to answer NVML_ERROR_GPU_IS_LOST."""


class _InvalidError(Exception):
    """Raised inside a fake function to answer NVML_ERROR_INVALID_ARGUMENT."""


def _in(x: Any) -> Any:
    """The Python value of a scalar argument (a ctypes scalar or a plain int)."""
    return x.value if isinstance(x, ctypes._SimpleCData) else x


def _out(x: Any) -> Any:
    """The ctypes object an output argument (``byref(obj)`` or ``pointer(obj)``) points at."""
    if isinstance(x, _CARG_TYPE):
        return x._obj  # type: ignore[attr-defined]
    if isinstance(x, ctypes._Pointer):
        return x.contents
    return x


def _address(x: Any) -> int:
    """The integer value of an opaque handle argument (nvmlDevice_t, nvmlEventSet_t)."""
    if isinstance(x, int):
        return x
    return ctypes.cast(x, ctypes.c_void_p).value or 0


def _set_pointer(target: Any, value: int) -> None:
    """Write an opaque handle value into a pointer-typed ctypes object."""
    ctypes.c_void_p.from_buffer(target).value = value


class FakeNvmlLibrary:
    """Stands in for ``CDLL("libnvidia-ml.so.1")``: C functions looked up by name.

    Every function returns an nvmlReturn_t and never raises, as a real driver would; an
    unknown name raises ``AttributeError``, which pynvml reports as FUNCTION_NOT_FOUND.
    ``calls`` counts the calls made, by function name (tests and the benchmark read it).
    """

    def __init__(self, simulation: Simulation, clock: Clock) -> None:
        self.driver = SimulatedDriver(simulation, clock)
        self.calls: Counter[str] = Counter()
        self._functions = {name: self._guard(name, getattr(self.driver, name))
                           for name in dir(self.driver) if name.startswith("nvml")}

    def __getattr__(self, name: str) -> Callable[..., Any]:
        functions = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]  # type: ignore[no-any-return]
        raise AttributeError(name)

    def _guard(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        needs_init = name not in ("nvmlErrorString", "nvmlInitWithFlags", "nvmlInit_v2")
        driver = self.driver

        def call(*args: Any) -> Any:
            self.calls[name] += 1
            if name != "nvmlErrorString" and not driver.loaded():
                return ERROR_DRIVER_NOT_LOADED
            if needs_init and driver.init_count == 0:
                return ERROR_UNINITIALIZED
            try:
                return fn(*args)
            except _UnsupportedError:
                return ERROR_NOT_SUPPORTED
            except _LostError:
                return ERROR_GPU_IS_LOST
            except _InvalidError:
                return ERROR_INVALID_ARGUMENT
            except Exception:  # a real driver never raises into its caller
                log.exception("fake NVML: %s failed", name)
                return ERROR_UNKNOWN

        call.__name__ = name
        return call


class SimulatedDriver:
    """The NVML functions, answered from the simulation at call time.

    ``clock.monotonic()`` gives the simulated time: the simulation is advanced to
    ``clock.monotonic() - start`` before every call, so the fake follows ``--speed`` and a
    manual test clock alike.
    """

    def __init__(self, simulation: Simulation, clock: Clock) -> None:
        self.simulation = simulation
        self.clock = clock
        self._start = clock.monotonic()
        self._lock = threading.RLock()
        self._events = threading.Condition(self._lock)
        self.init_count = 0
        self._generation = simulation.driver_generation
        self._event_sets: dict[int, dict[int, int]] = {}  # set id -> {gpu index: event mask}
        self._next_event_set = _EVENT_SET_BASE

    def _now(self) -> None:
        """Advance the simulation to the clock, at most every MIN_ADVANCE simulated seconds:
        the calls of one sampling tick all see the same state, and each call does not step
        every GPU again (which made a tick cost O(GPUs²))."""
        t = self.clock.monotonic() - self._start
        if t - self.simulation.time < MIN_ADVANCE_SECONDS and t < self.simulation.next_fault_at():
            return
        with self._lock:
            if self.simulation.advance_to(t):
                self._events.notify_all()  # a fault fired: maybe an XID for an event set to deliver

    def loaded(self) -> bool:
        """Whether the simulated kernel driver is loaded; an unload ends every NVML session."""
        self._now()
        with self._lock:
            if self.simulation.driver_generation != self._generation:
                self._generation = self.simulation.driver_generation
                self.init_count = 0
            return self.simulation.driver_loaded

    def _gpu(self, handle: Any, feature: str | None = None) -> SimGpu:
        """Resolve a device handle, advance time, apply lost / hang / unsupported faults."""
        index = (_address(handle) - _HANDLE_BASE) // 16
        gpus = self.simulation.gpus
        if not 0 <= index < len(gpus):
            raise _InvalidError()
        gpu = gpus[index]
        self._now()
        hang = 0.0
        with self._lock:
            if gpu.state.hang_seconds > 0:
                hang, gpu.state.hang_seconds = gpu.state.hang_seconds, 0.0
        if hang:
            time.sleep(hang)
        if gpu.state.lost:
            raise _LostError()
        if feature is not None and feature in gpu.state.unsupported:
            raise _UnsupportedError()
        return gpu

    @staticmethod
    def _garbage(gpu: SimGpu, feature: str, value: float) -> float:
        """A scripted out-of-range reading replaces the true value once."""
        return gpu.state.garbage.pop(feature, value)

    # -- functions ----------------------------------------------------------------------
    # Each returns an nvmlReturn_t. Exceptions _LostError/_InvalidError/_UnsupportedError map to codes.

    def nvmlInitWithFlags(self, flags: Any) -> int:
        with self._lock:
            self.init_count += 1
        return SUCCESS

    def nvmlInit_v2(self) -> int:
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        with self._lock:
            self.init_count = max(0, self.init_count - 1)
        return SUCCESS

    def nvmlErrorString(self, result: Any) -> bytes:
        return _ERROR_STRINGS.get(_in(result), b"Unknown Error")

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = DRIVER_VERSION
        return SUCCESS

    def nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:
        buf.value = NVML_VERSION
        return SUCCESS

    def nvmlSystemGetCudaDriverVersion(self, version: Any) -> int:
        _out(version).value = CUDA_DRIVER_VERSION
        return SUCCESS

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        _out(count).value = len(self.simulation.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        i = _in(index)
        if not 0 <= i < len(self.simulation.gpus):
            return ERROR_INVALID_ARGUMENT
        if self.simulation.gpus[i].state.lost:
            return ERROR_GPU_IS_LOST
        _set_pointer(_out(device), _HANDLE_BASE + 16 * i)
        return SUCCESS

    def nvmlDeviceGetIndex(self, handle: Any, index: Any) -> int:
        _out(index).value = self._gpu(handle).index
        return SUCCESS

    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = self._gpu(handle).product.name.encode()
        return SUCCESS

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = self._gpu(handle).uuid.encode()
        return SUCCESS

    def nvmlDeviceGetSerial(self, handle: Any, buf: Any, size: Any) -> int:
        gpu = self._gpu(handle, "serial")
        if gpu.product.key == "rtx4090":  # GeForce boards report no serial
            raise _UnsupportedError()
        buf.value = gpu.serial.encode()
        return SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, info: Any) -> int:
        gpu = self._gpu(handle)
        pci = _out(info)
        pci.busId = gpu.pci_bus_id.encode()
        pci.busIdLegacy = gpu.pci_bus_id[4:].encode()
        pci.domain, pci.bus, pci.device = 0, int(gpu.pci_bus_id[9:11], 16), 0
        return SUCCESS

    def nvmlDeviceGetArchitecture(self, handle: Any, arch: Any) -> int:
        _out(arch).value = self._gpu(handle).product.architecture
        return SUCCESS

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        gpu = self._gpu(handle)
        _out(major).value, _out(minor).value = gpu.product.cuda_capability
        return SUCCESS

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._gpu(handle, "mig_mode")
        if gpu.product.architecture < 7 or gpu.product.fans:  # MIG: A100/H100 class only
            raise _UnsupportedError()
        _out(current).value = _out(pending).value = 0
        return SUCCESS

    def nvmlDeviceGetPersistenceMode(self, handle: Any, mode: Any) -> int:
        gpu = self._gpu(handle, "persistence_mode")
        _out(mode).value = 0 if gpu.product.fans else 1  # datacenter boxes usually run nvidia-persistenced
        return SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        gpu = self._gpu(handle, "memory_info")
        mem = _out(memory)
        total = gpu.product.memory_total_bytes
        used = int(total * (0.02 + 0.78 * min(1.0, gpu.state.utilization * 1.5)))
        mem.total, mem.used, mem.free = total, used, total - used
        return SUCCESS

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, memory: Any) -> int:
        return self.nvmlDeviceGetMemoryInfo(handle, memory)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temp: Any) -> int:
        if _in(sensor) != 0:  # NVML_TEMPERATURE_GPU is the only sensor
            return ERROR_INVALID_ARGUMENT
        gpu = self._gpu(handle, "temperature")
        with self._lock:
            value = gpu.read_temperature(gpu.state.die_celsius)
        _out(temp).value = int(self._garbage(gpu, "temperature", value))
        return SUCCESS

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: Any, temp: Any) -> int:
        gpu = self._gpu(handle, "thresholds")
        p = gpu.product
        # nvmlTemperatureThresholds_t: SHUTDOWN=0, SLOWDOWN=1, MEM_MAX=2, GPU_MAX=3
        values = {0: p.shutdown_celsius, 1: p.slowdown_celsius, 2: p.memory_max_celsius,
                  3: p.gpu_max_celsius}
        value = values.get(_in(threshold))
        if value is None:
            raise _UnsupportedError()
        _out(temp).value = value
        return SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle: Any, power: Any) -> int:
        gpu = self._gpu(handle, "power")
        value = self._garbage(gpu, "power", gpu.state.power_watts)
        _out(power).value = int(value * 1000) % 2**32
        return SUCCESS

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, limit: Any) -> int:
        _out(limit).value = int(self._gpu(handle, "power_limit").product.tdp_watts * 1000)
        return SUCCESS

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, limit: Any) -> int:
        _out(limit).value = int(self._gpu(handle, "power_limit").product.tdp_watts * 1000)
        return SUCCESS

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, energy: Any) -> int:
        _out(energy).value = int(self._gpu(handle, "energy").state.energy_mj)
        return SUCCESS

    def nvmlDeviceGetNumFans(self, handle: Any, count: Any) -> int:
        _out(count).value = self._gpu(handle).product.fans
        return SUCCESS

    def nvmlDeviceGetFanSpeed_v2(self, handle: Any, fan: Any, speed: Any) -> int:
        gpu = self._gpu(handle, "fan_speed")
        if _in(fan) >= gpu.product.fans:
            raise _UnsupportedError() if gpu.product.fans == 0 else _InvalidError()
        value = self._garbage(gpu, "fan_speed", round(gpu.state.fan_ratio * 100))
        _out(speed).value = int(value)
        return SUCCESS

    def nvmlDeviceGetFanSpeedRPM(self, handle: Any, info: Any) -> int:
        gpu = self._gpu(handle, "fan_rpm")
        fan_info = _out(info)
        if gpu.product.fan_max_rpm is None:
            raise _UnsupportedError()
        if fan_info.fan >= gpu.product.fans:
            raise _InvalidError()
        fan_info.speed = int(gpu.state.fan_ratio * gpu.product.fan_max_rpm) + 7 * fan_info.fan
        return SUCCESS

    def _clock(self, gpu: SimGpu, clock_type: int, maximum: bool) -> int:
        p, s = gpu.product, gpu.state
        # nvmlClockType_t: GRAPHICS=0, SM=1, MEM=2, VIDEO=3
        if clock_type in (0, 1):
            hz = p.sm_max_hz if maximum or s.utilization >= 0.05 else p.idle_sm_hz
            hz *= 1.0 if maximum else s.clock_factor
        elif clock_type == 2:
            hz = p.memory_max_hz if maximum or s.utilization >= 0.05 else p.memory_max_hz * 0.1
        else:
            raise _UnsupportedError()
        return int(hz / 1e6)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: Any, mhz: Any) -> int:
        _out(mhz).value = self._clock(self._gpu(handle, "clocks"), _in(clock_type), False)
        return SUCCESS

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: Any, mhz: Any) -> int:
        _out(mhz).value = self._clock(self._gpu(handle, "max_clocks"), _in(clock_type), True)
        return SUCCESS

    def nvmlDeviceGetPerformanceState(self, handle: Any, pstate: Any) -> int:
        gpu = self._gpu(handle, "pstate")
        _out(pstate).value = 0 if gpu.state.utilization >= 0.05 else 8
        return SUCCESS

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, reasons: Any) -> int:
        _out(reasons).value = self._gpu(handle, "clock_reasons").state.reasons
        return SUCCESS

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: Any, violation: Any) -> int:
        gpu = self._gpu(handle, "violation")
        if gpu.product.fans:  # GeForce boards do not report violation counters
            raise _UnsupportedError()
        out = _out(violation)
        # nvmlPerfPolicyType_t: POWER=0, THERMAL=1
        ns = {0: gpu.state.violation_power_ns, 1: gpu.state.violation_thermal_ns}.get(_in(policy))
        if ns is None:
            raise _UnsupportedError()
        out.referenceTime = int(time.time() * 1e6)
        out.violationTime = int(ns)
        return SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle: Any, util: Any) -> int:
        gpu = self._gpu(handle, "utilization")
        out = _out(util)
        out.gpu = round(gpu.state.utilization * 100)
        out.memory = round(gpu.state.utilization * 60)
        return SUCCESS

    def nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._gpu(handle, "ecc_mode")
        if not gpu.product.ecc:
            raise _UnsupportedError()
        _out(current).value = _out(pending).value = 1
        return SUCCESS

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count: Any, addresses: Any) -> int:
        gpu = self._gpu(handle, "retired_pages")
        if not gpu.product.retired_pages:
            raise _UnsupportedError()
        # nvmlPageRetirementCause_t: MULTIPLE_SINGLE_BIT_ECC_ERRORS=0, DOUBLE_BIT_ECC_ERROR=1
        n = gpu.state.retired_single_bit if _in(cause) == 0 else gpu.state.retired_double_bit
        c = _out(count)
        if addresses is None or c.value < n:
            c.value = n
            return SUCCESS if n == 0 else ERROR_INSUFFICIENT_SIZE
        for i in range(n):
            addresses[i] = 0x1000 * (i + 1)
        c.value = n
        return SUCCESS

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, pending: Any) -> int:
        gpu = self._gpu(handle, "retired_pages")
        if not gpu.product.retired_pages:
            raise _UnsupportedError()
        _out(pending).value = int(gpu.state.retired_pending)
        return SUCCESS

    def nvmlDeviceGetRemappedRows(self, handle: Any, corr: Any, unc: Any, pending: Any,
                                  failure: Any) -> int:
        gpu = self._gpu(handle, "remapped_rows")
        if not gpu.product.remapped_rows:
            raise _UnsupportedError()
        s = gpu.state
        _out(corr).value, _out(unc).value = s.remapped_corrected, s.remapped_uncorrected
        _out(pending).value, _out(failure).value = int(s.remap_pending), int(s.remap_failure)
        return SUCCESS

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any, value: Any) -> int:
        _out(value).value = self._gpu(handle, "pcie_replays").state.pcie_replays
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        gpu = self._gpu(handle, "processes")
        with self._lock:
            procs = list(gpu.state.processes)
        c = _out(count)
        if infos is None or c.value < len(procs):
            c.value = len(procs)
            return SUCCESS if not procs else ERROR_INSUFFICIENT_SIZE
        for i, pid in enumerate(procs):
            infos[i].pid = pid
            infos[i].usedGpuMemory = int(gpu.product.memory_total_bytes * 0.7 / len(procs))
            infos[i].gpuInstanceId = infos[i].computeInstanceId = 0xFFFFFFFF
        c.value = len(procs)
        return SUCCESS

    def _field(self, gpu: SimGpu, field_id: int) -> tuple[int, int]:
        """(value type, value) of one field, or raise _UnsupportedError."""
        s, p = gpu.state, gpu.product
        if field_id == FI_MEMORY_TEMP:
            if p.memory_max_celsius is None or "memory_temperature" in s.unsupported:
                raise _UnsupportedError()
            value = self._garbage(gpu, "memory_temperature", gpu.read_temperature(s.memory_celsius))
            return VALUE_TYPE_UNSIGNED_INT, int(value)
        if field_id == FI_TOTAL_ENERGY_CONSUMPTION:
            if "energy" in s.unsupported:
                raise _UnsupportedError()
            return VALUE_TYPE_UNSIGNED_LONG_LONG, int(s.energy_mj)
        if field_id == FI_GET_GPU_RECOVERY_ACTION:
            if p.architecture < 9 or "recovery_action" in s.unsupported:  # Hopper and newer drivers only
                raise _UnsupportedError()
            return VALUE_TYPE_UNSIGNED_INT, s.recovery_action
        if field_id == FI_PCIE_REPLAY_COUNTER:
            if "pcie_replays" in s.unsupported:
                raise _UnsupportedError()
            return VALUE_TYPE_UNSIGNED_INT, s.pcie_replays
        ecc = {FI_ECC_SBE_VOL_TOTAL: s.ecc_corrected_volatile, FI_ECC_DBE_VOL_TOTAL: s.ecc_uncorrected_volatile,
               FI_ECC_SBE_AGG_TOTAL: s.ecc_corrected_aggregate, FI_ECC_DBE_AGG_TOTAL: s.ecc_uncorrected_aggregate}
        if field_id in ecc and p.ecc and "ecc_errors" not in s.unsupported:
            return VALUE_TYPE_UNSIGNED_LONG_LONG, ecc[field_id]
        raise _UnsupportedError()

    def nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        gpu = self._gpu(handle)
        array = _out(values)
        now_us = int(time.time() * 1e6)
        with self._lock:
            for i in range(_in(count)):
                fv = array[i]
                fv.timestamp, fv.latencyUsec = now_us, 0
                try:
                    fv.valueType, value = self._field(gpu, fv.fieldId)
                except _UnsupportedError:
                    fv.nvmlReturn = ERROR_NOT_SUPPORTED
                    continue
                fv.nvmlReturn = SUCCESS
                if fv.valueType == VALUE_TYPE_UNSIGNED_INT:
                    fv.value.uiVal = value % 2**32
                else:
                    fv.value.ullVal = value
        return SUCCESS

    # -- events -------------------------------------------------------------------------

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, types: Any) -> int:
        gpu = self._gpu(handle, "events")
        mask = EVENT_XID | EVENT_PSTATE | EVENT_CLOCK
        if gpu.product.ecc:
            mask |= EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC
        _out(types).value = mask
        return SUCCESS

    def nvmlEventSetCreate(self, event_set: Any) -> int:
        with self._lock:
            self._next_event_set += 16
            self._event_sets[self._next_event_set] = {}
            _set_pointer(_out(event_set), self._next_event_set)
        return SUCCESS

    def nvmlDeviceRegisterEvents(self, handle: Any, types: Any, event_set: Any) -> int:
        gpu = self._gpu(handle, "events")
        registered = self._event_sets.get(_address(event_set))
        if registered is None:
            return ERROR_INVALID_ARGUMENT
        with self._lock:
            registered[gpu.index] = registered.get(gpu.index, 0) | _in(types)
        return SUCCESS

    def nvmlEventSetWait_v2(self, event_set: Any, data: Any, timeout_ms: Any) -> int:
        registered = self._event_sets.get(_address(event_set))
        if registered is None:
            return ERROR_INVALID_ARGUMENT
        deadline = time.monotonic() + _in(timeout_ms) / 1000.0
        with self._lock:  # sleeps on a condition woken when faults fire: no polling
            while True:
                self._now()
                for index, mask in registered.items():
                    pending = self.simulation.gpus[index].state.pending_xids
                    if mask & EVENT_XID and pending:
                        out = _out(data)
                        _set_pointer(out, _HANDLE_BASE + 16 * index)  # 'device' is the first field
                        out.eventType = EVENT_XID
                        out.eventData = pending.pop(0)
                        out.gpuInstanceId = out.computeInstanceId = 0xFFFFFFFF
                        return SUCCESS
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ERROR_TIMEOUT
                self._events.wait(remaining)

    def nvmlEventSetFree(self, event_set: Any) -> int:
        with self._lock:
            self._event_sets.pop(_address(event_set), None)
        return SUCCESS


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuwear.backends.fakenvml [--scenario S] [--speed N] PROGRAM [ARGS...]``:
    run a pynvml-based Python program (a script or a console command on PATH) over the
    simulated GPUs, without changing its code."""
    import argparse
    import runpy
    import shutil
    import sys

    from gpuwear.backends.nvml import install_library
    from gpuwear.backends.simulated import ScenarioError, load_scenario
    from gpuwear.clock import ScaledClock

    parser = argparse.ArgumentParser(prog="python -m gpuwear.backends.fakenvml",
                                     description="Run a pynvml program over simulated GPUs.")
    parser.add_argument("--scenario", default="demo", help="built-in scenario or YAML file (default demo)")
    parser.add_argument("--speed", type=float, default=1.0, help="simulated time per wall second")
    parser.add_argument("program", help="a Python script, or a console command on PATH")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    try:
        simulation = load_scenario(ns.scenario)
    except ScenarioError as exc:
        print(f"fakenvml: {exc}", file=sys.stderr)
        return 2
    path = ns.program if "/" in ns.program else shutil.which(ns.program) or ns.program
    install_library(FakeNvmlLibrary(simulation, ScaledClock(ns.speed)))
    sys.argv = [path, *ns.args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
