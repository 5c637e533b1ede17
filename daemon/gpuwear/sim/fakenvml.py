"""A fake NVML *library*: the C entry points of libnvidia-ml, answered from simulated GPUs.

The real ``pynvml`` binding looks every C function up by name on its loaded library object
(``getattr(nvmlLib, name)``) and calls it with ctypes arguments. :class:`FakeNvmlLibrary`
stands in for that object, so everything above the library boundary, pynvml's own
argument marshalling and error mapping included, runs unmodified. Values come from
:mod:`gpuwear.sim.simulated`, in NVML's units (mW, mJ, MHz, %, ns).

The library answers as one driver release (:mod:`gpuwear.sim.drivers`, the scenario's
``driver``): a function that release does not export raises ``AttributeError`` on lookup, which
pynvml turns into ``NVML_ERROR_FUNCTION_NOT_FOUND`` exactly as for that real driver; the
process list is filled in the layout that release fills; a field id newer than the release
answers the per-field ``NVML_ERROR_INVALID_ARGUMENT``. Device kinds behave as real ones
(simulated ``Product``): GeForce cards report no ECC, memory temperature, violation counters or
serial; passive cards no fans; with MIG enabled whole-device utilization is NOT_SUPPORTED and,
for an unprivileged client, the whole device's process and memory queries answer NO_PERMISSION (a
MIG device's own answer); a vGPU guest's GPU (a scenario's vgpu) answers as the physical one but
for what nvml.h says a guest does not; a Tegra (Jetson) device answers NOT_SUPPORTED to
everything but its name, UUID and index; a GH200's energy
counter is the module's, the Grace CPU's draw included, while its power reading is the GPU's.

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

from gpuwear.backends.nvml import FanSpeedInfo, ProcessInfoCc, ProcessInfoV1, ProcessInfoV2
from gpuwear.clock import Clock
from gpuwear.sim.drivers import PROFILES, DriverProfile
from gpuwear.sim.simulated import (
    FABRIC_INCORRECT_CONFIGURATION,
    FABRIC_MASK_FIELDS,
    MigDevice,
    Product,
    SimGpu,
    Simulation,
)

log = logging.getLogger(__name__)

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_CORRUPTED_INFOROM = 14
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

# nvmlBrandType_t of a vGPU type by its series letter: A (Virtual Applications) 7, B (Virtual PC) 8, C ("vGPU for
# Compute") 9, Q (RTX Virtual Workstation) 10, G (Cloud Gaming) 11
_VGPU_BRANDS = {"A": 7, "B": 8, "C": 9, "Q": 10, "G": 11}

_ERROR_STRINGS = {
    SUCCESS: b"Success", ERROR_UNINITIALIZED: b"Uninitialized",
    ERROR_INVALID_ARGUMENT: b"Invalid Argument", ERROR_NOT_SUPPORTED: b"Not Supported",
    ERROR_NOT_FOUND: b"Not Found", ERROR_INSUFFICIENT_SIZE: b"Insufficient Size",
    ERROR_NO_PERMISSION: b"Insufficient Permissions",
    ERROR_LIB_RM_VERSION_MISMATCH: b"RM has detected an NVML/RM version mismatch.",
    ERROR_ARGUMENT_VERSION_MISMATCH: b"Version mismatch between passed in structure and the NVML library",
    ERROR_TIMEOUT: b"Timeout", ERROR_GPU_IS_LOST: b"GPU is lost", ERROR_UNKNOWN: b"Unknown Error",
    ERROR_RESET_REQUIRED: b"GPU requires restart",
}

# nvmlFieldValue_t field ids and value types
FI_ECC_SBE_VOL_TOTAL = 3
FI_ECC_DBE_VOL_TOTAL = 4
FI_ECC_SBE_AGG_TOTAL = 5
FI_ECC_DBE_AGG_TOTAL = 6
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY_CONSUMPTION = 83
ARCH_VOLTA = 5  # nvmlDeviceArchitecture_t NVML_DEVICE_ARCH_VOLTA
FI_PERF_POLICY_POWER = 74  # ns, the counters of nvmlDeviceGetViolationStatus as field values
FI_PERF_POLICY_THERMAL = 75
FI_NVLINK_LINK_COUNT = 91
FI_PCIE_REPLAY_COUNTER = 94
FI_NVLINK_THROUGHPUT_DATA_TX = 138
FI_NVLINK_THROUGHPUT_DATA_RX = 139
FI_GET_GPU_RECOVERY_ACTION = 230
FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING = 258
VALUE_TYPE_UNSIGNED_INT = 1
VALUE_TYPE_UNSIGNED_LONG_LONG = 3
VALUE_TYPE_SIGNED_INT = 5
# the die's limits on the T.Limit scale (nvml.h: the preferred source of these thresholds on Ada and later), °C
FI_TEMPERATURE_SHUTDOWN_TLIMIT = 193
FI_TEMPERATURE_SLOWDOWN_TLIMIT = 194
FI_TEMPERATURE_GPU_MAX_TLIMIT = 196
ARCH_HOPPER = 9
ARCH_BLACKWELL = 10  # NVML_DEVICE_ARCH_BLACKWELL

EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_PSTATE = 0x4
EVENT_XID = 0x8
EVENT_CLOCK = 0x10

MIN_ADVANCE_SECONDS = 0.05  # simulated time below which the state is left as it is
_HANDLE_BASE = 0x6770_0000
_MIG_HANDLE_BASE = 0x6790_0000  # MIG device k of GPU i: _MIG_HANDLE_BASE + 16 * (8 * i + k)
_NO_INSTANCE = 0xFFFFFFFF  # a process's gpuInstanceId / computeInstanceId outside MIG
_EVENT_SET_BASE = 0x6e00_0000
_CARG_TYPE = type(ctypes.byref(ctypes.c_int()))

NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong
RESERVED_MEMORY_RATIO = 0.011  # memory the driver keeps for itself: ~0.9 GB of an 80 GB A100 (v1 "used" includes it)


def struct_version(struct: type[ctypes.Structure], version: int) -> int:
    """NVML_STRUCT_VERSION(name, version): the size of the struct in the low 24 bits, the version above."""
    return ctypes.sizeof(struct) | version << 24


class MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t (R510+): used excludes the memory the driver reserves."""

    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class GpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t (R525+, nvmlDeviceGetGpuFabricInfo)."""

    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_uint)]


class GpuFabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t (R550+, nvmlDeviceGetGpuFabricInfoV): a version first, the health mask last."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_int),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint)]


class GpuFabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t (R580+, nvmlDeviceGetGpuFabricInfoV): v2 and the health summary after it."""

    _fields_ = [*GpuFabricInfoV2._fields_, ("healthSummary", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 3)]


MASK_TRUE, MASK_FALSE = 1, 2  # NVML_GPU_FABRIC_HEALTH_MASK_<field>_TRUE / _FALSE (0: NOT_SUPPORTED)
SUMMARY_HEALTHY = 1  # NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY (2 UNHEALTHY, 3 LIMITED_CAPACITY, 0 NOT_SUPPORTED)


class TemperatureV1(ctypes.Structure):
    """nvmlTemperature_v1_t (nvmlDeviceGetTemperatureV, 565.57.01+)."""

    _fields_ = [("version", ctypes.c_uint), ("sensorType", ctypes.c_uint), ("temperature", ctypes.c_int)]


class MarginTemperatureV1(ctypes.Structure):
    """nvmlMarginTemperature_v1_t (nvmlDeviceGetMarginTemperature, R570+)."""

    _fields_ = [("version", ctypes.c_uint), ("marginTemperature", ctypes.c_int)]


class ProcessDetailList(ctypes.Structure):
    """nvmlProcessDetailList_v1_t: its entries are nvmlProcessDetail_v1_t, the same 32 bytes as ProcessInfoCc."""

    _fields_ = [("version", ctypes.c_uint), ("mode", ctypes.c_uint), ("numProcArrayEntries", ctypes.c_uint),
                ("procArray", ctypes.POINTER(ProcessInfoCc))]


class _UnsupportedError(Exception):
    """Raised inside a fake function to answer NVML_ERROR_NOT_SUPPORTED."""


class _LostError(Exception):
    """Raised inside a fake function to answer NVML_ERROR_GPU_IS_LOST."""


class _ResetRequiredError(Exception):
    """Raised inside a fake function to answer NVML_ERROR_RESET_REQUIRED ("The GPU requires a reset before it can be
    used again", nvml.h)."""


class _InvalidError(Exception):
    """Raised inside a fake function to answer NVML_ERROR_INVALID_ARGUMENT."""


class _NoPermissionError(Exception):
    """Raised inside a fake function to answer NVML_ERROR_NO_PERMISSION."""


def _in(x: Any) -> Any:
    """The Python value of a scalar argument (a ctypes scalar or a plain int)."""
    return x.value if isinstance(x, ctypes._SimpleCData) else x


def _pci_device_id(product: Product) -> int:
    """nvmlPciInfo_t.pciDeviceId: "The combined 16-bit device id and 16-bit vendor id" (nvml.h), the device ID in the
    upper half (nvidia-smi's pci.device_id 0x233010DE for an H100 SXM5)."""
    return (product.pci_device << 16) | 0x10DE if product.pci_device else 0


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
        self.profile = PROFILES[simulation.driver]
        self.driver = SimulatedDriver(simulation, clock, self.profile)
        self.calls: Counter[str] = Counter()
        self.missing: Counter[str] = Counter()  # names looked up that this release does not export, or the fake lacks
        self._functions = {name: self._guard(name, getattr(self.driver, name))
                           for name in dir(self.driver) if name.startswith("nvml") and self.profile.exports(name)}

    def implements(self, name: str) -> bool:
        """Whether the fake answers ``name`` at all (under some driver profile)."""
        return name.startswith("nvml") and callable(getattr(self.driver, name, None))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        functions = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]  # type: ignore[no-any-return]
        if name.startswith("nvml") and "missing" in self.__dict__:
            self.missing[name] += 1
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
            except _ResetRequiredError:
                return ERROR_RESET_REQUIRED
            except _InvalidError:
                return ERROR_INVALID_ARGUMENT
            except _NoPermissionError:
                return ERROR_NO_PERMISSION
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

    def __init__(self, simulation: Simulation, clock: Clock, profile: DriverProfile) -> None:
        self.simulation = simulation
        self.clock = clock
        self.profile = profile
        self._start = clock.monotonic()
        self._lock = threading.RLock()
        self._events = threading.Condition(self._lock)
        self.init_count = 0
        self._generation = simulation.driver_generation
        self._event_sets: dict[int, dict[int, int]] = {}  # set id -> {gpu index: event mask}
        self._next_event_set = _EVENT_SET_BASE
        self._last_celsius: dict[int, int] = {}  # each GPU's last die reading (nvmlDeviceGetTemperature), °C

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

    def _gpu(self, handle: Any, feature: str | None = None, identity: bool = False) -> SimGpu:
        """Resolve a device handle, advance time, apply lost / hang / unsupported faults. A Tegra device answers
        only ``identity`` queries (name, UUID, index)."""
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
        if gpu.state.reset_required and not identity:  # it answers what it is, nothing it measures
            raise _ResetRequiredError()
        if (feature is not None and feature in gpu.state.unsupported) or (gpu.product.tegra and not identity):
            raise _UnsupportedError()
        return gpu

    def _mig(self, handle: Any) -> tuple[SimGpu, MigDevice] | None:
        """The GPU and MIG device a MIG device handle names (None for another handle); INVALID_ARGUMENT for one
        whose MIG device is gone (MIG turned off: handles "remain invalid and must be requested again", nvml.h)."""
        slot = (_address(handle) - _MIG_HANDLE_BASE) // 16
        if not 0 <= slot < 8 * len(self.simulation.gpus) or (_address(handle) - _MIG_HANDLE_BASE) % 16:
            return None
        gpu = self._gpu(_HANDLE_BASE + 16 * (slot // 8), identity=True)
        if not gpu.state.mig_enabled or slot % 8 >= len(gpu.mig_devices):
            raise _InvalidError()
        return gpu, gpu.mig_devices[slot % 8]

    def _restricted(self, gpu: SimGpu) -> None:
        """With MIG enabled, whole-device process and memory queries need root (nvml.h: "if device handle is
        provided, the API returns aggregate information, only if the caller has appropriate privileges. Per-instance
        information can be queried by using specific MIG device handles")."""
        if gpu.state.mig_enabled and not self.simulation.privileged:
            raise _NoPermissionError()

    @staticmethod
    def _garbage(gpu: SimGpu, feature: str, value: float) -> float:
        """A scripted out-of-range reading replaces the true value once."""
        return gpu.state.garbage.pop(feature, value)

    # -- functions ----------------------------------------------------------------------
    # Each returns an nvmlReturn_t. Exceptions _LostError/_InvalidError/_UnsupportedError map to codes.

    def nvmlInitWithFlags(self, flags: Any) -> int:
        if self.simulation.driver_upgraded:  # the kernel module is another release than this library
            return ERROR_LIB_RM_VERSION_MISMATCH
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
        # under WSL2 the Windows driver's version (536.25 beside a library built as 535.54.03: nvidia-smi there
        # shows "NVIDIA-SMI 535.54.03  Driver Version: 536.25"), not the library's own
        buf.value = (self.simulation.windows_driver or self.profile.driver_version).encode()
        return SUCCESS

    def nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.profile.nvml_version.encode()
        return SUCCESS

    def nvmlSystemGetCudaDriverVersion(self, version: Any) -> int:
        _out(version).value = self.profile.cuda_driver_version
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
        _out(index).value = self._gpu(handle, identity=True).index
        return SUCCESS

    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        if (mig := self._mig(handle)) is not None:  # as nvidia-smi -L names it: "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
            buf.value = f"{mig[0].product.name} MIG {mig[1].profile}".encode()
            return SUCCESS
        gpu = self._gpu(handle, identity=True)
        buf.value = (gpu.vgpu[0] if gpu.vgpu else gpu.product.name).encode()  # a vGPU guest: its type's name
        return SUCCESS

    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        if (mig := self._mig(handle)) is not None:
            buf.value = mig[1].uuid.encode()
            return SUCCESS
        buf.value = self._gpu(handle, identity=True).uuid.encode()
        return SUCCESS

    def nvmlDeviceGetSerial(self, handle: Any, buf: Any, size: Any) -> int:
        gpu = self._gpu(handle, "serial")
        if gpu.product.geforce:  # GeForce boards report none (nvidia-smi: "serial [N/A]")
            raise _UnsupportedError()
        buf.value = gpu.serial.encode()
        return SUCCESS

    def nvmlDeviceGetPciInfo_v3(self, handle: Any, info: Any) -> int:
        gpu = self._gpu(handle)
        pci = _out(info)
        pci.busId = gpu.pci_bus_id.encode()
        pci.busIdLegacy = gpu.pci_bus_id[4:].encode()
        pci.domain, pci.bus, pci.device = 0, int(gpu.pci_bus_id[9:11], 16), 0
        pci.pciDeviceId = _pci_device_id(gpu.product)
        return SUCCESS

    def nvmlDeviceGetPciInfo_v2(self, handle: Any, info: Any) -> int:
        """The layout before _v3 (kept exported for old binaries, nvml.h's NVML_NO_UNVERSIONED_FUNC_DEFS block):
        busId[16] in the legacy format (NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, a 4-digit domain), then domain, bus,
        device, pciDeviceId, pciSubSystemId and four reserved words; no busIdLegacy."""
        gpu = self._gpu(handle)
        pci = _out(info)
        pci.busId = gpu.pci_bus_id[4:].encode()
        pci.domain, pci.bus, pci.device = 0, int(gpu.pci_bus_id[9:11], 16), 0
        pci.pciDeviceId = _pci_device_id(gpu.product)
        return SUCCESS

    nvmlDeviceGetPciInfo = nvmlDeviceGetPciInfo_v2  # the unversioned export: the same legacy layout

    def nvmlDeviceGetArchitecture(self, handle: Any, arch: Any) -> int:
        _out(arch).value = self._gpu(handle).product.architecture
        return SUCCESS

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        gpu = self._gpu(handle)
        _out(major).value, _out(minor).value = gpu.product.cuda_capability
        return SUCCESS

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:
        gpu = self._gpu(handle, "mig_mode")
        if not gpu.product.mig_capable:  # MIG: A100/H100 class only
            raise _UnsupportedError()
        _out(current).value = _out(pending).value = int(gpu.state.mig_enabled)
        return SUCCESS

    def nvmlDeviceGetPersistenceMode(self, handle: Any, mode: Any) -> int:
        gpu = self._gpu(handle, "persistence_mode")
        _out(mode).value = 0 if gpu.product.fans else 1  # datacenter boxes usually run nvidia-persistenced
        return SUCCESS

    def _memory(self, handle: Any) -> tuple[int, int, int]:
        """(total, reserved by the driver, allocated), bytes: of the GPU, or of one MIG device (its share of the
        GPU's processes' memory)."""
        if (mig := self._mig(handle)) is not None:  # per-instance: no privilege asked (nvml.h), unlike the GPU's
            gpu, device = mig
            mine = len(self._instance_processes(gpu, device))
            return device.memory_bytes, 0, int(device.memory_bytes * 0.7) if mine else 0
        gpu = self._gpu(handle, "memory_info")
        self._restricted(gpu)
        total = gpu.vgpu[1] if gpu.vgpu else gpu.product.memory_total_bytes  # a vGPU: its type's frame buffer
        reserved = int(total * RESERVED_MEMORY_RATIO)
        allocated = int(total * 0.78 * min(1.0, gpu.state.utilization * 1.5)) + (8 << 20 if gpu.state.processes else 0)
        return total, reserved, allocated

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:
        """v1 (nvmlMemory_t): used is "reserved + allocated" (nvml.h), what nvidia-smi does not show."""
        total, reserved, allocated = self._memory(handle)
        mem = _out(memory)
        mem.total, mem.used, mem.free = total, reserved + allocated, total - reserved - allocated
        return SUCCESS

    def nvmlDeviceGetMemoryInfo_v2(self, handle: Any, memory: Any) -> int:
        """v2 (nvmlMemory_v2_t, R510+): reserved apart, used is what processes allocated (nvidia-smi's)."""
        mem = _as(memory, MemoryV2)
        if mem.version != struct_version(MemoryV2, self.simulation.struct_versions["memory"]):
            return ERROR_ARGUMENT_VERSION_MISMATCH
        total, reserved, allocated = self._memory(handle)
        mem.total, mem.reserved, mem.used = total, reserved, allocated
        mem.free = total - reserved - allocated
        return SUCCESS

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, temp: Any) -> int:
        if _in(sensor) != 0:  # NVML_TEMPERATURE_GPU is the only sensor
            return ERROR_INVALID_ARGUMENT
        gpu = self._gpu(handle, "temperature")
        with self._lock:
            value = gpu.read_temperature(gpu.state.die_celsius)
            self._last_celsius[gpu.index] = value  # the sensor's reading, which the margin is measured from
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

    def _tlimit(self, gpu: SimGpu) -> None:
        """The T.Limit scale (nvmlDeviceGetMarginTemperature and the *_TLIMIT fields) where real boards show it:
        Hopper and newer on drivers that export it (an H100 at 33 °C: "GPU T.Limit Temp: 54 C", with its slowdown
        and shutdown as T.Limit offsets, in public nvidia-smi -q outputs; an A100 shows no T.Limit rows); else
        NOT_SUPPORTED."""
        if gpu.product.architecture < ARCH_HOPPER or "nvmlDeviceGetMarginTemperature" not in self.profile.symbols:
            raise _UnsupportedError()

    def nvmlDeviceGetMarginTemperature(self, handle: Any, info: Any) -> int:
        """"The thermal margin temperature (distance to nearest slowdown threshold)": the die below its maximum
        operating temperature (NVML_TEMPERATURE_THRESHOLD_GPU_MAX, T.Limit 0 on nvidia-smi's scale), °C, negative
        past it."""
        out = _as(info, MarginTemperatureV1)
        if out.version != struct_version(MarginTemperatureV1, 1):
            return ERROR_ARGUMENT_VERSION_MISMATCH
        gpu = self._gpu(handle, "margin")
        self._tlimit(gpu)
        with self._lock:
            celsius = self._last_celsius.get(gpu.index)
            if celsius is None:
                celsius = gpu.read_temperature(gpu.state.die_celsius)
        out.marginTemperature = gpu.product.gpu_max_celsius - celsius
        return SUCCESS

    def nvmlDeviceGetTemperatureV(self, handle: Any, temperature: Any) -> int:
        """The successor of nvmlDeviceGetTemperature (565.57.01+): a versioned nvmlTemperature_v1_t."""
        out = _as(temperature, TemperatureV1)
        if out.version != struct_version(TemperatureV1, self.simulation.struct_versions["temperature"]):
            return ERROR_ARGUMENT_VERSION_MISMATCH
        value = ctypes.c_uint()
        ret = self.nvmlDeviceGetTemperature(handle, out.sensorType, ctypes.byref(value))
        if ret == SUCCESS:
            out.temperature = value.value
        return ret

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

    @staticmethod
    def _energy(gpu: SimGpu) -> int:
        """The energy counter, mJ since the driver loaded (once the scripted glitch, if one is due)."""
        glitch, gpu.state.energy_glitch_mj = gpu.state.energy_glitch_mj, None
        return int(gpu.state.energy_mj if glitch is None else glitch)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, energy: Any) -> int:
        """mJ since the driver loaded; nvml.h: "For Volta or newer fully supported devices" (NOT_SUPPORTED before)."""
        gpu = self._gpu(handle, "energy")
        if gpu.product.architecture < ARCH_VOLTA:
            raise _UnsupportedError()
        _out(energy).value = self._energy(gpu)
        return SUCCESS

    def nvmlDeviceGetNumFans(self, handle: Any, count: Any) -> int:
        _out(count).value = self._gpu(handle).product.fans
        return SUCCESS

    def nvmlDeviceGetFanSpeed(self, handle: Any, speed: Any) -> int:
        """v1: the speed of fan 0 (drivers before R510 report no other), %."""
        return self.nvmlDeviceGetFanSpeed_v2(handle, 0, speed)

    def nvmlDeviceGetFanSpeed_v2(self, handle: Any, fan: Any, speed: Any) -> int:
        gpu = self._gpu(handle, "fan_speed")
        if _in(fan) >= gpu.product.fans:
            raise _UnsupportedError() if gpu.product.fans == 0 else _InvalidError()
        value = self._garbage(gpu, "fan_speed", round(gpu.state.fan_ratio * 100))
        _out(speed).value = int(value)
        return SUCCESS

    def nvmlDeviceGetFanSpeedRPM(self, handle: Any, info: Any) -> int:
        gpu = self._gpu(handle, "fan_rpm")
        fan_info = _as(info, FanSpeedInfo)
        if fan_info.version != struct_version(FanSpeedInfo, self.simulation.struct_versions["fan_speed_info"]):
            return ERROR_ARGUMENT_VERSION_MISMATCH
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
        elif clock_type == 3:  # video: about 0.8 of the SM clock on these boards
            hz = 0.8 * (p.sm_max_hz if maximum or s.utilization >= 0.05 else p.idle_sm_hz)
        else:
            raise _InvalidError()
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
        if gpu.state.mig_enabled:  # per GPU instance only, through GPM
            raise _UnsupportedError()
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
        return self.nvmlDeviceGetRetiredPages_v2(handle, cause, count, addresses)

    def nvmlDeviceGetRetiredPages_v2(self, handle: Any, cause: Any, count: Any, addresses: Any,
                                     timestamps: Any = None) -> int:
        """The retired pages of one cause, and (_v2) each one's timestamp, Unix seconds: "timestamps: buffer to
        write the timestamps of page retirement" (nvml.h). nvidia-ml-py's size query passes no timestamps buffer."""
        gpu = self._gpu(handle, "retired_pages")
        if not gpu.product.retired_pages:
            raise _UnsupportedError()
        # nvmlPageRetirementCause_t: MULTIPLE_SINGLE_BIT_ECC_ERRORS=0, DOUBLE_BIT_ECC_ERROR=1
        which = 0 if _in(cause) == 0 else 1
        n = gpu.state.retired_single_bit if which == 0 else gpu.state.retired_double_bit
        c = _out(count)
        if addresses is None or c.value < n:
            c.value = n
            return SUCCESS if n == 0 else ERROR_INSUFFICIENT_SIZE
        at = gpu.state.retired_at.get(which, [])
        wall, now = self.clock.wall(), self.clock.monotonic() - self._start
        for i in range(n):
            addresses[i] = 0x1000 * (i + 1)
            if timestamps is not None:
                timestamps[i] = int(wall - (now - at[i])) if i < len(at) else 0
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
        # a real H100 in MIG mode answers N/A, its histogram still answering (nvidia_gpu_exporter's capture)
        if not gpu.product.remapped_rows or gpu.state.mig_enabled:
            raise _UnsupportedError()
        s = gpu.state
        _out(corr).value, _out(unc).value = s.remapped_corrected, s.remapped_uncorrected
        _out(pending).value, _out(failure).value = int(s.remap_pending), int(s.remap_failure)
        return SUCCESS

    def nvmlDeviceGetRowRemapperHistogram(self, handle: Any, values: Any) -> int:
        """The banks by spare rows left (nvmlRowRemapperHistogramValues_t), on cards that remap rows (Ampere and newer
        datacenter and workstation cards); NOT_SUPPORTED elsewhere, as nvidia-smi's "N/A" on them."""
        gpu = self._gpu(handle, "remapped_rows")
        if not gpu.product.remapped_rows or not gpu.product.remap_banks:
            raise _UnsupportedError()
        out = _out(values)
        with self._lock:
            out.max, out.high, out.partial, out.low, out.none = gpu.remap_histogram()
        return SUCCESS

    def _fabric(self, handle: Any) -> tuple[int, int]:
        """(state, status) of the GPU's registration with the NVLink fabric. Hopper and newer only ("For Hopper or
        newer fully supported devices", nvml.h); a board without NVSwitch links answers STATE_NOT_SUPPORTED."""
        gpu = self._gpu(handle, "fabric")
        if gpu.product.architecture < 9:
            raise _UnsupportedError()
        if gpu.product.nvlinks < 18:  # no NVSwitch fabric to register with
            return 0, SUCCESS
        return gpu.state.fabric_state, gpu.state.fabric_status if gpu.state.fabric_state == 3 else SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        state, status = self._fabric(handle)
        out = _as(info, GpuFabricInfo)
        out.state, out.status = state, status
        return SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        """v2 (R550+) or v3 (R580+, the health summary): another version is ARGUMENT_VERSION_MISMATCH. The health
        mask holds, once completed, each field this branch's nvml.h defines (FABRIC_MASK_FIELDS), TRUE or FALSE."""
        version = _as(info, GpuFabricInfoV2).version
        v3 = self.profile.since("r580") and version == struct_version(GpuFabricInfoV3, 3)
        if version != struct_version(GpuFabricInfoV2, 2) and not v3:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        state, status = self._fabric(handle)
        out = _as(info, GpuFabricInfoV3 if v3 else GpuFabricInfoV2)
        out.state, out.status = state, status
        gpu = self._gpu(handle, "fabric")
        out.healthMask = self._fabric_mask(gpu.state.fabric_mask) if state == 3 else 0
        if isinstance(out, GpuFabricInfoV3):  # the summary is the Blackwell NVL fabric's: a registered H100 answers
            # NOT_SUPPORTED (nvidia-smi "N/A" on R590: nvidia_gpu_exporter's capture), unless a fault scripts one
            default = SUMMARY_HEALTHY if gpu.product.architecture >= ARCH_BLACKWELL else 0
            out.healthSummary = (gpu.state.fabric_summary or default) if state == 3 else 0
        return SUCCESS

    def _fabric_mask(self, true: dict[str, int]) -> int:
        mask = 0
        for name, (shift, branch) in FABRIC_MASK_FIELDS.items():
            if self.profile.since(branch):
                mask |= (MASK_TRUE if name in true else MASK_FALSE) << shift
        shift, branch = FABRIC_INCORRECT_CONFIGURATION
        if self.profile.since(branch):
            mask |= true.get("incorrect_configuration", 1) << shift  # 1: NONE, a correct configuration
        return mask

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any, value: Any) -> int:
        _out(value).value = self._gpu(handle, "pcie_replays").state.pcie_replays
        return SUCCESS

    def _processes(self, handle: Any, count: Any, infos: Any, layout: type[ctypes.Structure],
                   graphics: bool = False) -> int:
        """Fill a process list as the driver does: in ``layout`` (the driver's own struct, whatever the caller
        allocated), never past the caller's buffer; INSUFFICIENT_SIZE with the count needed when it is short."""
        mig = self._mig(handle)
        gpu = mig[0] if mig is not None else self._gpu(handle, "processes")
        if mig is None:  # nvml.h: the GPU's aggregate list needs privileges, a MIG device's own list does not
            self._restricted(gpu)
        with self._lock:
            procs = [] if graphics else list(gpu.state.processes)
        places = self._places(gpu, procs)
        if mig is not None:  # a MIG device's own processes
            procs = [pid for pid in procs if places.get(pid) is mig[1]]
        c = _out(count)
        if not infos or c.value < len(procs):
            c.value = len(procs)
            return SUCCESS if not procs else ERROR_INSUFFICIENT_SIZE
        filled = (layout * len(procs))()
        for record, pid in zip(filled, procs, strict=True):
            record.pid = pid
            record.usedGpuMemory = int(gpu.product.memory_total_bytes * 0.7 / len(procs))
            if hasattr(record, "gpuInstanceId"):  # the MIG device it runs on (nvmlProcessInfo_v2_t)
                place = places.get(pid)
                record.gpuInstanceId = _NO_INSTANCE if place is None else place.gpu_instance
                record.computeInstanceId = _NO_INSTANCE if place is None else place.compute_instance
        room = ctypes.sizeof(_out(infos)) if isinstance(_out(infos), ctypes.Array) else ctypes.sizeof(filled)
        ctypes.memmove(infos, filled, min(room, ctypes.sizeof(filled)))
        c.value = len(procs)
        return SUCCESS

    @staticmethod
    def _places(gpu: SimGpu, procs: list[int]) -> dict[int, MigDevice]:
        """The MIG device each process runs on: with MIG on, processes are placed on the GPU's MIG devices in turn
        (the first on the first); none without MIG devices."""
        devices = gpu.mig_devices if gpu.state.mig_enabled else ()
        return {pid: devices[k % len(devices)] for k, pid in enumerate(procs)} if devices else {}

    def _instance_processes(self, gpu: SimGpu, device: MigDevice) -> list[int]:
        with self._lock:
            procs = list(gpu.state.processes)
        return [pid for pid, place in self._places(gpu, procs).items() if place is device]

    def _v3_layout(self) -> type[ctypes.Structure]:
        return ProcessInfoCc if self.profile.process_info_bytes == 32 else ProcessInfoV2

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, count, infos, ProcessInfoV1)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, count, infos, ProcessInfoV2)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, count, infos, self._v3_layout())

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, count, infos, ProcessInfoV1, graphics=True)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, count, infos, ProcessInfoV2, graphics=True)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, count, infos, self._v3_layout(), graphics=True)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes(handle, count, infos, self._v3_layout(), graphics=True)

    def nvmlDeviceGetRunningProcessDetailList(self, handle: Any, plist: Any) -> int:
        """nvmlProcessDetailList_v1_t (535.104.05+): a mode (COMPUTE=0, GRAPHICS=1, MPS=2) and a caller's array of
        32-byte nvmlProcessDetail_v1_t; INSUFFICIENT_SIZE with numProcArrayEntries when it is short."""
        out = _as(plist, ProcessDetailList)
        if out.version != struct_version(ProcessDetailList, 1):
            return ERROR_ARGUMENT_VERSION_MISMATCH
        if out.mode not in (0, 1, 2):
            raise _InvalidError()
        count = ctypes.c_uint(out.numProcArrayEntries)
        infos = ctypes.cast(out.procArray, ctypes.POINTER(ProcessInfoCc * max(1, count.value))).contents \
            if out.procArray else None
        ret = self._processes(handle, ctypes.byref(count), infos, ProcessInfoCc, graphics=out.mode != 0)
        out.numProcArrayEntries = count.value
        return ret

    # -- what common clients (nvitop, gpustat, nvitop-exporter) ask beyond gpuwear -----------------

    def nvmlDeviceGetHandleByUUID(self, uuid: Any, device: Any) -> int:
        wanted = _in(uuid)
        wanted = wanted.decode() if isinstance(wanted, bytes) else str(wanted)
        for gpu in self.simulation.gpus:
            if gpu.uuid == wanted:
                if gpu.state.lost:
                    return ERROR_GPU_IS_LOST
                _set_pointer(_out(device), _HANDLE_BASE + 16 * gpu.index)
                return SUCCESS
        return ERROR_NOT_FOUND

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any, limit: Any) -> int:
        """The power limit set now, mW (no one changes it here: the default)."""
        return self.nvmlDeviceGetEnforcedPowerLimit(handle, limit)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any, low: Any, high: Any) -> int:
        tdp = self._gpu(handle, "power_limit").product.tdp_watts
        _out(low).value, _out(high).value = int(tdp * 500), int(tdp * 1000)
        return SUCCESS

    def _codec(self, handle: Any, util: Any, period: Any) -> int:
        self._gpu(handle, "codec")
        _out(util).value, _out(period).value = 0, 167_000  # no video work in these simulations; µs
        return SUCCESS

    def nvmlDeviceGetEncoderUtilization(self, handle: Any, util: Any, period: Any) -> int:
        return self._codec(handle, util, period)

    def nvmlDeviceGetDecoderUtilization(self, handle: Any, util: Any, period: Any) -> int:
        return self._codec(handle, util, period)

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, value: Any) -> int:
        """KB/s over the last 20 ms; nvmlPcieUtilCounter_t TX=0, RX=1."""
        if _in(counter) not in (0, 1):
            raise _InvalidError()
        gpu = self._gpu(handle, "pcie_throughput")
        self._not_in_vgpu_guest(gpu)
        _out(value).value = int((200 + 1_500_000 * gpu.state.utilization) * (0.4 if _in(counter) == 0 else 1.0))
        return SUCCESS

    def nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count: Any, last_seen: Any) -> int:
        """Per-process SM/memory utilization samples newer than ``last_seen`` (µs); NOT_FOUND when none."""
        gpu = self._gpu(handle, "processes")
        self._restricted(gpu)
        procs = list(gpu.state.processes)
        c = _out(count)
        if not procs:
            c.value = 0
            return ERROR_NOT_FOUND
        if not samples or c.value < len(procs):
            c.value = len(procs)
            return ERROR_INSUFFICIENT_SIZE
        now_us = int(time.time() * 1e6)
        for i, pid in enumerate(procs):
            sample = samples[i]
            sample.pid, sample.timeStamp = pid, now_us
            sample.smUtil = round(gpu.state.utilization * 100 / len(procs))
            sample.memUtil = round(gpu.state.utilization * 60 / len(procs))
            sample.encUtil = sample.decUtil = 0
        c.value = len(procs)
        return SUCCESS

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any, is_mig: Any) -> int:
        if self._mig(handle) is None:
            self._gpu(handle, identity=True)
            _out(is_mig).value = 0
        else:
            _out(is_mig).value = 1
        return SUCCESS

    def nvmlDeviceGetAttributes_v2(self, handle: Any, attributes: Any) -> int:
        """A MIG device's share of its GPU (nvmlDeviceAttributes_t): its GPU instance's and compute instance's slices
        of the 7 (the profile's "3g": 3; one compute instance spans its GPU instance, as ``-C`` makes it), its
        frame buffer in MiB, and SMs and engines in proportion (14 SMs a slice on an A100, 16 on an H100 class,
        NVIDIA's MIG user guide). nvml.h: "This API currently only supports MIG device handles": NOT_SUPPORTED for
        a whole GPU's."""
        mig = self._mig(handle)
        if mig is None:
            self._gpu(handle, identity=True)
            return ERROR_NOT_SUPPORTED
        gpu, device = mig
        slices = int(device.profile[0])
        out = _out(attributes)
        out.multiprocessorCount = slices * (14 if "A100" in gpu.product.name else 16)
        out.sharedCopyEngineCount = slices
        out.sharedDecoderCount = slices * 5 // 7
        out.sharedEncoderCount = 0
        out.sharedJpegCount = slices // 7
        out.sharedOfaCount = slices // 7
        out.gpuInstanceSliceCount = out.computeInstanceSliceCount = slices
        out.memorySizeMB = device.memory_bytes >> 20
        return SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> int:
        """7 on a MIG-capable GPU with MIG on; "zero if MIG is not supported or enabled" (nvml.h)."""
        gpu = self._gpu(handle, "mig_mode")
        _out(count).value = 7 if gpu.product.mig_capable and gpu.state.mig_enabled else 0
        return SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, device: Any) -> int:
        """The MIG device at ``index`` (below the maximum count; NOT_FOUND where none was made)."""
        gpu = self._gpu(handle, "mig_mode")
        if not gpu.product.mig_capable:
            raise _UnsupportedError()
        k = _in(index)
        if not gpu.state.mig_enabled or not 0 <= k < 7:
            return ERROR_INVALID_ARGUMENT
        if k >= len(gpu.mig_devices):
            return ERROR_NOT_FOUND
        _set_pointer(_out(device), _MIG_HANDLE_BASE + 16 * (8 * gpu.index + k))
        return SUCCESS

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig_handle: Any, device: Any) -> int:
        mig = self._mig(mig_handle)
        if mig is None:
            return ERROR_INVALID_ARGUMENT
        _set_pointer(_out(device), _HANDLE_BASE + 16 * mig[0].index)
        return SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, gi: Any) -> int:
        mig = self._mig(handle)
        if mig is None:  # a whole GPU's handle: not a MIG device
            self._gpu(handle, identity=True)
            return ERROR_INVALID_ARGUMENT
        _out(gi).value = mig[1].gpu_instance
        return SUCCESS

    def nvmlDeviceGetComputeInstanceId(self, handle: Any, ci: Any) -> int:
        mig = self._mig(handle)
        if mig is None:
            self._gpu(handle, identity=True)
            return ERROR_INVALID_ARGUMENT
        _out(ci).value = mig[1].compute_instance
        return SUCCESS

    def nvmlDeviceGetBAR1MemoryInfo(self, handle: Any, bar1: Any) -> int:
        gpu = self._gpu(handle, "bar1")
        out = _out(bar1)
        total = 256 << 20 if gpu.product.fans else 128 << 30  # GeForce without resizable BAR; datacenter
        used = (2 << 20) + (32 << 20 if gpu.state.processes else 0)
        out.bar1Total, out.bar1Used, out.bar1Free = total, used, total - used
        return SUCCESS

    def nvmlDeviceGetComputeMode(self, handle: Any, mode: Any) -> int:
        self._gpu(handle, "compute_mode")
        _out(mode).value = 0  # NVML_COMPUTEMODE_DEFAULT
        return SUCCESS

    def nvmlDeviceGetDisplayMode(self, handle: Any, mode: Any) -> int:
        self._gpu(handle, "display")
        _out(mode).value = 0  # headless training boxes
        return SUCCESS

    nvmlDeviceGetDisplayActive = nvmlDeviceGetDisplayMode

    def nvmlDeviceGetDriverModel(self, handle: Any, current: Any, pending: Any) -> int:
        self._gpu(handle)
        raise _UnsupportedError()  # Windows only (WDDM / TCC)

    def nvmlDeviceGetDriverModel_v2(self, handle: Any, current: Any, pending: Any) -> int:
        return self.nvmlDeviceGetDriverModel(handle, current, pending)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: Any, counter_type: Any, count: Any) -> int:
        """nvmlMemoryErrorType_t CORRECTED=0 / UNCORRECTED=1, nvmlEccCounterType_t VOLATILE=0 / AGGREGATE=1."""
        _out(count).value = self._ecc_count(self._gpu(handle, "ecc_errors"), error_type, counter_type)
        return SUCCESS

    @staticmethod
    def _ecc_count(gpu: SimGpu, error_type: Any, counter_type: Any) -> int:
        """A board's ECC errors of one type and counter (NOT_SUPPORTED without ECC, INVALID_ARGUMENT past the
        enums)."""
        if not gpu.product.ecc:
            raise _UnsupportedError()
        s = gpu.state
        table = {(0, 0): s.ecc_corrected_volatile, (1, 0): s.ecc_uncorrected_volatile,
                 (0, 1): s.ecc_corrected_aggregate, (1, 1): s.ecc_uncorrected_aggregate}
        value = table.get((_in(error_type), _in(counter_type)))
        if value is None:
            raise _InvalidError()
        return value

    def nvmlDeviceGetConfComputeMemSizeInfo(self, handle: Any, info: Any) -> int:
        self._gpu(handle)
        raise _UnsupportedError()  # confidential computing is off on every simulated GPU

    @staticmethod
    def _pcie_generation_max(gpu: SimGpu) -> int:
        return 5 if gpu.product.architecture >= 9 else 4 if gpu.product.architecture >= 7 else 3

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, value: Any) -> int:
        """The generation the link trained at: the maximum, or less after a pcie_downgrade fault."""
        gpu = self._gpu(handle, "pcie")
        _out(value).value = gpu.state.pcie_generation or self._pcie_generation_max(gpu)
        return SUCCESS

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, value: Any) -> int:
        _out(value).value = self._pcie_generation_max(self._gpu(handle, "pcie"))
        return SUCCESS

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, value: Any) -> int:
        """The lanes the link trained at: 16, or fewer after a pcie_downgrade fault."""
        _out(value).value = self._gpu(handle, "pcie").state.pcie_width or 16
        return SUCCESS

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, value: Any) -> int:
        self._gpu(handle, "pcie")
        _out(value).value = 16
        return SUCCESS

    def _nvlink(self, handle: Any, link: Any) -> tuple[SimGpu, int]:
        """A GPU and one of its NVLink links: NOT_SUPPORTED on a GPU without NVLink, INVALID_ARGUMENT past its
        last link (as nvidia-smi nvlink and DCGM find the count: asking link after link)."""
        gpu = self._gpu(handle, "nvlink")
        if gpu.product.nvlinks == 0:
            raise _UnsupportedError()
        index = _in(link)
        if not 0 <= index < gpu.product.nvlinks:
            raise _InvalidError()
        return gpu, index

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: Any, active: Any) -> int:
        gpu, index = self._nvlink(handle, link)
        _out(active).value = 0 if index in gpu.state.nvlink_down else 1
        return SUCCESS

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: Any, counter: Any, value: Any) -> int:
        gpu, index = self._nvlink(handle, link)
        kind = _in(counter)
        if kind not in (0, 1, 2, 3):  # DL_ECC_DATA (4) and later: not modelled, answered as not supported
            raise _UnsupportedError()
        _out(value).value = gpu.state.nvlink_errors.get((index, kind), 0)
        return SUCCESS

    def nvmlDeviceGetVirtualizationMode(self, handle: Any, mode: Any) -> int:
        """nvmlGpuVirtualizationMode_t (Kepler or newer): NVML_GPU_VIRTUALIZATION_MODE_NONE (0, "Represents Bare
        Metal GPU" in nvml.h), or NVML_GPU_VIRTUALIZATION_MODE_VGPU (2, "Device is associated with vGPU inside
        virtual machine") for a scenario's vgpu, as NVIDIA's vGPU Management SDK guide says a guest tells the two
        ("call the NVML function nvmlDeviceGetVirtualizationMode()")."""
        _out(mode).value = 2 if self._gpu(handle).vgpu else 0
        return SUCCESS

    @staticmethod
    def _not_in_vgpu_guest(gpu: SimGpu) -> None:
        """nvml.h, of nvmlDeviceGetPcieThroughput and nvmlDeviceGetSupportedClocksEventReasons: "This method is not
        supported in virtual machines running virtual GPU (vGPU)". The rest a guest reads as of a physical GPU
        (NVIDIA's vGPU Management SDK guide: "Properties and metrics other than GPU engine usage are reported for a
        vGPU in a similar way to how the same properties and metrics are reported for a physical GPU"; engine usage
        is the vGPU's share)."""
        if gpu.vgpu:
            raise _UnsupportedError()

    def nvmlDeviceGetGridLicensableFeatures_v4(self, handle: Any, features: Any) -> int:
        """nvml.h: "Identifies whether the system supports vGPU Software Licensing. If it does, return the list of
        licensable feature(s)" (Maxwell or newer): a bare-metal GPU answers that it does not
        (``isGridLicenseSupported`` 0, no feature). Every version of the struct starts with those two fields."""
        self._gpu(handle)
        out = _out(features)
        out.isGridLicenseSupported = 0
        out.licensableFeaturesCount = 0
        return SUCCESS

    nvmlDeviceGetGridLicensableFeatures_v3 = nvmlDeviceGetGridLicensableFeatures_v4
    nvmlDeviceGetGridLicensableFeatures_v2 = nvmlDeviceGetGridLicensableFeatures_v4
    nvmlDeviceGetGridLicensableFeatures = nvmlDeviceGetGridLicensableFeatures_v4

    def nvmlDeviceGetMinorNumber(self, handle: Any, minor: Any) -> int:
        """The /dev/nvidiaN number; NOT_SUPPORTED under WSL2 (a scenario's ``windows_driver``), which has no such
        node: "nvml.DeviceGetMinorNumber failing with Not Supported" (kubernetes-sigs/dra-driver-nvidia-gpu
        #1201)."""
        gpu = self._gpu(handle)
        if self.simulation.windows_driver is not None:
            raise _UnsupportedError()
        _out(minor).value = gpu.index
        return SUCCESS

    # -- what nvidia-smi -q style queries ask besides (py3nvml's XmlDeviceQuery, NVIDIA's example.py): each answers
    # as nvml.h's "For ..." line and return codes say for the simulated product; opaque version strings are
    # placeholders in NVIDIA's format, never read by gpuwear

    def nvmlDeviceGetAccountingMode(self, handle: Any, mode: Any) -> int:
        """Per-process accounting (Kepler or newer): off until an administrator turns it on (nvmlEnableState_t
        DISABLED, 0); nothing here turns it on."""
        self._gpu(handle, "accounting")
        _out(mode).value = 0
        return SUCCESS

    def nvmlDeviceGetAccountingBufferSize(self, handle: Any, size: Any) -> int:
        """The processes the accounting buffer holds: 4000, also with accounting off, as nvidia-smi -q shows real
        boards ("Accounting Mode: Disabled", "Accounting Mode Buffer Size: 4000" on a GTX 960M, netdata/netdata
        #4892), whatever nvml.h's return codes say of a disabled mode."""
        self._gpu(handle, "accounting")
        _out(size).value = 4000
        return SUCCESS

    def nvmlDeviceGetAccountingPids(self, handle: Any, count: Any, pids: Any) -> int:
        """nvml.h: NOT_SUPPORTED "if device doesn't support this feature or accounting mode is disabled" (it is)."""
        self._gpu(handle, "accounting")
        raise _UnsupportedError()

    def nvmlDeviceGetAccountingStats(self, handle: Any, pid: Any, stats: Any) -> int:
        """As nvmlDeviceGetAccountingPids: accounting mode is disabled."""
        self._gpu(handle, "accounting")
        raise _UnsupportedError()

    def nvmlDeviceGetAutoBoostedClocksEnabled(self, handle: Any, enabled: Any, default: Any) -> int:
        """nvml.h: "On Pascal and newer hardware, Auto Boosted clocks are controlled through application clocks":
        NOT_SUPPORTED ("if the device does not support Auto Boosted clocks") on every simulated card (Pascal on)."""
        self._gpu(handle)
        raise _UnsupportedError()

    def _applications_clock(self, handle: Any, clock_type: Any) -> int:
        """Applications clocks (Fermi or newer *fully supported* devices, deprecated in 13.0): NOT_SUPPORTED on a
        GeForce; a datacenter or workstation board answers its maximum clock for the type, standing in for the
        default NVIDIA sets per board (a V100 PCIe's is lower than its maximum; not modelled)."""
        gpu = self._gpu(handle, "clocks")
        if gpu.product.geforce:
            raise _UnsupportedError()
        return self._clock(gpu, _in(clock_type), True)

    def nvmlDeviceGetApplicationsClock(self, handle: Any, clock_type: Any, mhz: Any) -> int:
        _out(mhz).value = self._applications_clock(handle, clock_type)
        return SUCCESS

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: Any, clock_type: Any, mhz: Any) -> int:
        _out(mhz).value = self._applications_clock(handle, clock_type)
        return SUCCESS

    def nvmlDeviceGetBoardId(self, handle: Any, board: Any) -> int:
        """"Retrieves the device boardId from 0-N": the fake numbers boards by their PCI bus (bus << 8), as
        nvidia-smi's "Board ID" reads on single-GPU boards (0x100 for bus 01)."""
        gpu = self._gpu(handle)
        _out(board).value = int(gpu.pci_bus_id[9:11], 16) << 8
        return SUCCESS

    def nvmlDeviceGetMultiGpuBoard(self, handle: Any, multi: Any) -> int:
        """0: every simulated board carries one GPU."""
        self._gpu(handle)
        _out(multi).value = 0
        return SUCCESS

    def nvmlDeviceGetBridgeChipInfo(self, handle: Any, info: Any) -> int:
        """"Only applicable to multi-GPU products": NOT_SUPPORTED ("if bridge chip not supported on the device")
        on the single-GPU boards simulated."""
        self._gpu(handle)
        raise _UnsupportedError()

    def nvmlDeviceGetGpuOperationMode(self, handle: Any, current: Any, pending: Any) -> int:
        """GOM: "For GK110 M-class and X-class Tesla products from the Kepler family" (and Kepler-era GeForce
        Titans): NOT_SUPPORTED on every simulated card."""
        self._gpu(handle)
        raise _UnsupportedError()

    def nvmlDeviceGetPowerManagementMode(self, handle: Any, mode: Any) -> int:
        """Deprecated; "For from the Kepler or newer families": power management is always on (ENABLED, 1)."""
        self._gpu(handle, "power")
        _out(mode).value = 1
        return SUCCESS

    def nvmlDeviceGetPowerState(self, handle: Any, pstate: Any) -> int:
        """Deprecated name of nvmlDeviceGetPerformanceState ("This function exposes an incorrect
        generalization")."""
        return self.nvmlDeviceGetPerformanceState(handle, pstate)

    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any, reasons: Any) -> int:
        """The clock-event reasons the board reports (nvmlClocksEventReason*: idle 0x1 through display clock
        setting 0x100, "For all fully supported products"); every simulated board reports each of them."""
        self._not_in_vgpu_guest(self._gpu(handle, "clock_reasons"))
        _out(reasons).value = 0x1FF
        return SUCCESS

    nvmlDeviceGetSupportedClocksThrottleReasons = nvmlDeviceGetSupportedClocksEventReasons

    def _lockable(self, handle: Any) -> SimGpu:
        """A board whose clocks can be locked (Kepler or newer *fully supported* devices): NOT_SUPPORTED on a GeForce
        (an RTX 3090: NVIDIA/TensorRT #2669; a GTX 1070's clock functions: KernelTuner/kernel_tuner #86)."""
        gpu = self._gpu(handle, "max_clocks")
        if gpu.product.geforce:
            raise _UnsupportedError()
        return gpu

    @staticmethod
    def _memory_clocks(gpu: SimGpu) -> list[int]:
        """The memory clocks a board can be locked to, MHz: its maximum and its idle clock."""
        return [int(gpu.product.memory_max_hz / 1e6), int(gpu.product.memory_max_hz * 0.1 / 1e6)]

    @staticmethod
    def _fill(count: Any, array: Any, values: list[int]) -> int:
        """NVML's sized-array answer: ``count`` in: the array's size; out: the values written, or the number needed
        with INSUFFICIENT_SIZE."""
        n = _out(count)
        if array is None or n.value < len(values):
            n.value = len(values)
            return ERROR_INSUFFICIENT_SIZE
        for i, value in enumerate(values):
            array[i] = value
        n.value = len(values)
        return SUCCESS

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any, count: Any, clocks: Any) -> int:
        return self._fill(count, clocks, self._memory_clocks(self._lockable(handle)))

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memory_mhz: Any, count: Any, clocks: Any) -> int:
        """The graphics clocks at one of its memory clocks: its maximum down to its idle clock in 15 MHz steps, the
        spacing real boards list; NOT_FOUND for a memory clock that nvmlDeviceGetSupportedMemoryClocks does not
        list."""
        gpu = self._lockable(handle)
        if _in(memory_mhz) not in self._memory_clocks(gpu):
            return ERROR_NOT_FOUND
        p = gpu.product
        return self._fill(count, clocks, list(range(int(p.sm_max_hz / 1e6), int(p.idle_sm_hz / 1e6) - 1, -15)))

    def nvmlDeviceGetMemoryErrorCounter(self, handle: Any, error_type: Any, counter_type: Any, location: Any,
                                        count: Any) -> int:
        """ECC errors by location (deprecated in 13.0; devices with ECC, ECC mode on). From Turing on, the counts
        are kept for DRAM (2) and SRAM (7) only, as nvidia-smi -q shows them; the other locations answer
        NOT_SUPPORTED there. Every simulated error is a DRAM error: SRAM and the older locations read 0."""
        gpu = self._gpu(handle, "ecc_errors")
        value = self._ecc_count(gpu, error_type, counter_type)
        where = _in(location)
        if not 0 <= where <= 7:
            raise _InvalidError()
        if gpu.product.architecture >= 6 and where not in (2, 7):  # nvmlDeviceArchitecture_t TURING = 6
            raise _UnsupportedError()
        _out(count).value = value if where == 2 else 0
        return SUCCESS

    def nvmlDeviceGetVbiosVersion(self, handle: Any, buf: Any, size: Any) -> int:
        """"For all products": a placeholder in the form nvidia-smi shows ("96.00.30.00.01")."""
        gpu = self._gpu(handle)
        text = gpu.vbios
        if _in(size) <= len(text):
            return ERROR_INSUFFICIENT_SIZE
        buf.value = text.encode()
        return SUCCESS

    def nvmlDeviceGetInforomImageVersion(self, handle: Any, buf: Any, size: Any) -> int:
        """"For all products with an inforom" (every board simulated): a placeholder in NVIDIA's form
        ("G520.0200.00.05"; at most 15 characters)."""
        self._gpu(handle)
        text = "G500.0200.00.01"
        if _in(size) <= len(text):
            return ERROR_INSUFFICIENT_SIZE
        buf.value = text.encode()
        return SUCCESS

    def nvmlDeviceGetInforomConfigurationChecksum(self, handle: Any, checksum: Any) -> int:
        """"For all products with an inforom": the checksum of its configuration (the card's own; a reflashed or
        cleared InfoROM, a scenario's inforom_checksum, another)."""
        gpu = self._gpu(handle)
        _out(checksum).value = gpu.inforom_checksum
        return SUCCESS

    def nvmlDeviceValidateInforom(self, handle: Any) -> int:
        """"Reads the infoROM from the flash and verifies the checksums": CORRUPTED_INFOROM for a scenario's
        inforom_corrupt card, else SUCCESS."""
        gpu = self._gpu(handle)
        return ERROR_CORRUPTED_INFOROM if gpu.inforom_corrupt else SUCCESS

    def nvmlDeviceGetInforomVersion(self, handle: Any, kind: Any, buf: Any, size: Any) -> int:
        """An infoROM object's version (nvmlInforomObject_t OEM 0, ECC 1, POWER 2): the ECC object only on boards
        with ECC; the power object NOT_SUPPORTED (nvidia-smi -q reads it N/A on current boards)."""
        gpu = self._gpu(handle)
        obj = _in(kind)
        if obj not in (0, 1, 2):
            raise _InvalidError()
        if obj == 2 or (obj == 1 and not gpu.product.ecc):
            raise _UnsupportedError()
        text = "2.1" if obj == 0 else "7.0"
        if _in(size) <= len(text):
            return ERROR_INSUFFICIENT_SIZE
        buf.value = text.encode()
        return SUCCESS

    def nvmlSystemGetProcessName(self, pid: Any, buf: Any, length: Any) -> int:
        """The name of a process on this host, "cropped to provided length": its argv[0]
        (/proc/PID/cmdline); NOT_FOUND for a PID no process here has (the simulation's synthetic PIDs)."""
        try:
            with open(f"/proc/{int(_in(pid))}/cmdline", "rb") as f:
                name = f.read().split(b"\0", 1)[0]
        except (OSError, ValueError):
            return ERROR_NOT_FOUND
        buf.value = name[: max(0, _in(length) - 1)]
        return SUCCESS

    def nvmlDeviceGetBrand(self, handle: Any, brand: Any) -> int:
        """nvmlBrandType_t from the product line its name says, as real boards report it: GEFORCE (5) for a GeForce
        (an RTX 4090: "GeForce", 1Panel-dev/1Panel #11910), TESLA (2) for a Tesla V100 (NVIDIA/nvidia-docker #738,
        #914), NVIDIA_RTX (13) for a workstation RTX, NVIDIA (14) for the datacenter parts (a GH200: "NVIDIA",
        hashicorp/nomad-device-nvidia #87). Before, the fan count chose: a fan-cooled RTX 6000 Ada was a GeForce and
        a GeForce laptop GPU (no fan NVML reads) was not."""
        gpu = self._gpu(handle)
        if gpu.vgpu:  # a vGPU: its type's series, the letter after its frame buffer (nvml.h's nvmlBrandType_t)
            _out(brand).value = _VGPU_BRANDS.get(gpu.vgpu[0][-1], 14)
            return SUCCESS
        name = gpu.product.name
        _out(brand).value = 5 if gpu.product.geforce else 2 if name.startswith("Tesla") else 13 if "RTX" in name else 14
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
            if "energy" in s.unsupported or p.architecture < ARCH_VOLTA:  # as nvmlDeviceGetTotalEnergyConsumption
                raise _UnsupportedError()
            return VALUE_TYPE_UNSIGNED_LONG_LONG, self._energy(gpu)
        if field_id == FI_GET_GPU_RECOVERY_ACTION:
            # every board answers it on a branch that knows the field (0, NONE, on idle GeForce Turing and Ada
            # boards and an L40S as on an H100: nvidia_gpu_exporter's captures, tests/fixtures/captures)
            if "recovery_action" in s.unsupported:
                raise _UnsupportedError()
            return VALUE_TYPE_UNSIGNED_INT, s.recovery_action
        if field_id == FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING:
            if not p.power_smoothing or "power_smoothing" in s.unsupported:
                raise _UnsupportedError()
            return VALUE_TYPE_UNSIGNED_INT, s.power_smoothing_life_percent
        if field_id in (FI_PERF_POLICY_POWER, FI_PERF_POLICY_THERMAL):
            if p.fans or "violation" in s.unsupported:  # GeForce boards report no violation counters
                raise _UnsupportedError()
            ns = s.violation_power_ns if field_id == FI_PERF_POLICY_POWER else s.violation_thermal_ns
            return VALUE_TYPE_UNSIGNED_LONG_LONG, int(ns)
        if field_id in (FI_TEMPERATURE_SHUTDOWN_TLIMIT, FI_TEMPERATURE_SLOWDOWN_TLIMIT, FI_TEMPERATURE_GPU_MAX_TLIMIT):
            self._tlimit(gpu)  # each limit on the T.Limit scale: how far below T.Limit 0 (the maximum operating
            limit = {FI_TEMPERATURE_SHUTDOWN_TLIMIT: p.shutdown_celsius,  # temperature) it lies: shutdown -5 and
                     FI_TEMPERATURE_SLOWDOWN_TLIMIT: p.slowdown_celsius,  # slowdown -2 on an H100
                     FI_TEMPERATURE_GPU_MAX_TLIMIT: p.gpu_max_celsius}[field_id]
            return VALUE_TYPE_SIGNED_INT, p.gpu_max_celsius - limit
        if field_id == FI_NVLINK_LINK_COUNT:
            if not p.nvlinks:
                raise _UnsupportedError()
            return VALUE_TYPE_UNSIGNED_INT, p.nvlinks
        if field_id in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX):
            if not p.nvlinks:
                raise _UnsupportedError()
            return VALUE_TYPE_UNSIGNED_LONG_LONG, int(s.energy_mj // 1000)  # KiB: a monotonic stand-in
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
                if fv.fieldId >= self.profile.field_id_max:  # newer than this driver (DCGM's reading of it)
                    fv.nvmlReturn = ERROR_INVALID_ARGUMENT
                    continue
                try:
                    fv.valueType, value = self._field(gpu, fv.fieldId)
                except _UnsupportedError:
                    fv.nvmlReturn = ERROR_NOT_SUPPORTED
                    continue
                fv.nvmlReturn = SUCCESS
                if fv.valueType == VALUE_TYPE_UNSIGNED_INT:
                    fv.value.uiVal = value % 2**32
                elif fv.valueType == VALUE_TYPE_SIGNED_INT:  # into the union's bytes: older bindings lack siVal
                    ctypes.c_int.from_buffer(fv.value).value = value
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
                if any(self.simulation.gpus[index].state.lost for index in registered):
                    return ERROR_GPU_IS_LOST  # a GPU of the set fell off the bus: the set delivers nothing else
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

    nvmlEventSetWait = nvmlEventSetWait_v2  # v1 (bindings before 11.450): the same call, a shorter nvmlEventData_t

    def nvmlEventSetFree(self, event_set: Any) -> int:
        with self._lock:
            self._event_sets.pop(_address(event_set), None)
        return SUCCESS


def _as(x: Any, struct: type[ctypes.Structure]) -> Any:
    """An output argument seen as the driver's own struct, whatever ctypes type the caller passed."""
    obj = _out(x)
    if isinstance(obj, struct):
        return obj
    return struct.from_address(ctypes.addressof(obj))


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuwear.sim.fakenvml [--scenario S] [--speed N] PROGRAM [ARGS...]``:
    run a pynvml-based Python program (a script or a console command on PATH) over the
    simulated GPUs, without changing its code."""
    import argparse
    import runpy
    import shutil
    import sys

    from gpuwear.backends.nvml import install_library
    from gpuwear.clock import ScaledClock
    from gpuwear.sim.simulated import ScenarioError, load_scenario

    parser = argparse.ArgumentParser(prog="python -m gpuwear.sim.fakenvml",
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
