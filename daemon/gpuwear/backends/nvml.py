"""The NVML backend: the only module that imports ``pynvml`` (package nvidia-ml-py).

Reads are table-driven: each *reader* fills one or more :class:`GpuSample` fields from one
NVML call (or one batched ``nvmlDeviceGetFieldValues`` call). What the library offers is
resolved once per :meth:`NvmlBackend.open` (:class:`Api`): the newest variant of each renamed or
versioned function that this driver exports, and the process-info layout it fills.

A reading the GPU cannot give is *unavailable, with a reason* (:data:`UNAVAILABLE_REASONS`):
``not_supported``, ``no_permission`` (an unprivileged daemon, e.g. MIG process queries),
``function_not_found`` (an older driver), ``unknown_field`` (a field id the driver does not
know) or ``binding_error`` (the pynvml binding raised something other than an NVMLError).
None of these is a sampling failure: each is logged once per GPU and reading, counted by reason
in the metrics, left out of the fast reads and asked again on the slow interval (a MIG toggle
changes what is supported) -- except what the loaded library can never answer
(``function_not_found``, ``unknown_field``). GPU_IS_LOST aborts that GPU's read with
:class:`GpuLostError`; a driver that went away raises :class:`NvmlDriverError`; a kernel module
that no longer matches the loaded library (a driver upgrade) raises
:class:`NvmlVersionMismatchError`; any other error is reported by kind and leaves the fields
``None`` for that tick only.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from gpuwear.sample import GpuIdentity, SystemInfo

log = logging.getLogger(__name__)
T = TypeVar("T")
S = TypeVar("S", bound=ctypes.Structure)

DEFAULT_LIBRARY = "libnvidia-ml.so.1"

ARCHITECTURES = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
    9: "hopper", 10: "blackwell",
}

ERROR_KINDS = {
    pynvml.NVML_ERROR_UNINITIALIZED: "uninitialized",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "invalid_argument",
    pynvml.NVML_ERROR_TIMEOUT: "timeout",
    pynvml.NVML_ERROR_IRQ_ISSUE: "irq_issue",
    pynvml.NVML_ERROR_CORRUPTED_INFOROM: "corrupted_inforom",
    pynvml.NVML_ERROR_RESET_REQUIRED: "reset_required",
    pynvml.NVML_ERROR_MEMORY: "memory",
    pynvml.NVML_ERROR_NO_DATA: "no_data",
    pynvml.NVML_ERROR_INSUFFICIENT_SIZE: "insufficient_size",
    pynvml.NVML_ERROR_UNKNOWN: "unknown",
}
# NVML_ERROR_ARGUMENT_VERSION_MISMATCH (nvml.h; older bindings lack the constant): the library takes another version
# of the struct passed, one built against another nvml.h than the binding (go-nvml #138; GPUd treats it as not
# supported). The call it succeeds is asked instead where there is one (nvmlDeviceGetTemperature,
# nvmlDeviceGetMemoryInfo); otherwise the reading is unavailable for good.
ARGUMENT_VERSION_MISMATCH = getattr(pynvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25)
VERSION_MISMATCH = "version_mismatch"
# NVML return codes that make a reading unavailable (not an error), by reason label.
UNAVAILABLE_REASONS = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: "not_supported",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "function_not_found",
    pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
    ARGUMENT_VERSION_MISMATCH: VERSION_MISMATCH,
}
UNKNOWN_FIELD = "unknown_field"  # nvmlFieldValue_t.nvmlReturn INVALID_ARGUMENT: a field id newer than the driver
BINDING_ERROR = "binding_error"  # the binding raised something other than NVMLError (a bug, or a mismatch)
MODULE_SCOPE = "module_scope"  # a Grace superchip's energy counter counts the module (CPU included), not the GPU
# what the loaded library can never change
PERMANENT_REASONS = frozenset({"function_not_found", MODULE_SCOPE, VERSION_MISMATCH})
REASONS = ("not_supported", "no_permission", "function_not_found", UNKNOWN_FIELD, BINDING_ERROR, MODULE_SCOPE,
           VERSION_MISMATCH)
# Grace superchips (GH200, GB200): NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION is the module's, the Grace CPU's draw
# included, while nvmlDeviceGetPowerUsage is the GPU's; their GPU energy is integrated from power instead.
_MODULE_ENERGY = re.compile(r"\bG[BH]\d{3}\b")

Values = dict[str, Any]


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used on this machine; the message tells the user what to do."""


class GpuLostError(Exception):
    """The GPU answered NVML_ERROR_GPU_IS_LOST (fallen off the bus)."""


class NvmlDriverError(Exception):
    """NVML lost its driver (unloaded or reloaded): every handle must be acquired again."""


class NvmlVersionMismatchError(NvmlUnavailableError):
    """NVML_ERROR_LIB_RM_VERSION_MISMATCH: the kernel module is another driver release than the loaded
    libnvidia-ml (a driver upgrade: the new library is installed, the module loaded is another). A process that
    had the old library working must restart to load the new one; one that starts with the new library waits
    for the new module (a reboot, or a driver reload)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"the NVIDIA kernel module and the NVML library are different driver releases ({detail}): "
                         "a driver upgrade is not finished (reboot, or reload the driver)")


_DRIVER_GONE = (pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


@dataclass
class Reading:
    """What one read of one GPU produced: field values, the kinds of errors met, and what is unavailable
    (reader key or field name -> reason, for everything the GPU cannot give now)."""

    values: Values = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    newly: list[tuple[str, str]] = field(default_factory=list)  # (key, reason) that became unavailable in this read


def error_kind(exc: pynvml.NVMLError) -> str:
    """A short, bounded name for an NVML error code (a metric label value)."""
    return ERROR_KINDS.get(exc.value, "other")


def install_library(library: object | None) -> None:
    """Make pynvml use ``library`` as libnvidia-ml (``None``: load the real one on init)."""
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def exports(name: str) -> bool:
    """Whether the loaded libnvidia-ml exports the C function ``name`` (pynvml's own symbol lookup)."""
    try:
        pynvml._nvmlGetFunctionPointer(name)
    except pynvml.NVMLError:
        return False
    return True


# -- process info layouts ------------------------------------------------------------------


class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t (16 bytes): what the unversioned nvmlDeviceGetComputeRunningProcesses fills."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t (24 bytes): what the _v2 and _v3 functions fill on every driver but the one below."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class ProcessInfoCc(ctypes.Structure):
    """The 32-byte nvmlProcessInfo_t of drivers 535.43 to 535.86 (CUDA 12.2's first nvml.h, with
    usedGpuCcProtectedMemory; nvidia-ml-py 12.535.77 read it, 12.535.108 went back to 24 bytes)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint),
                ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


def process_layout(function: str, exported: Callable[[str], bool]) -> type[ctypes.Structure]:
    """The struct a library fills for a process-list function, told by what it exports, never by a version string
    (under WSL2 nvmlSystemGetDriverVersion answers the Windows driver's: 536.25 beside a 535.54 library). The 32-byte
    layout is 535.43 to 535.86's: a library with the R535 names (nvmlDeviceGetCurrentClocksEventReasons, from
    535.43.02) and the _v3 functions (535.98 alone dropped them) but not nvmlDeviceGetRunningProcessDetailList
    (from 535.104.05 on, with every later branch); R510 to R530 have _v3 without the R535 names (nvml_symbols)."""
    if not function.endswith(("_v2", "_v3")):
        return ProcessInfoV1
    if (function.endswith("_v3") and exported("nvmlDeviceGetCurrentClocksEventReasons")
            and not exported("nvmlDeviceGetRunningProcessDetailList")):
        return ProcessInfoCc
    return ProcessInfoV2


class FanSpeedInfo(ctypes.Structure):
    """nvmlFanSpeedInfo_t (version 1): declared here, not taken from the binding (nvidia-ml-py 12.560 lacks it)."""

    _fields_ = [("version", ctypes.c_uint), ("fan", ctypes.c_uint), ("speed", ctypes.c_uint)]


FAN_SPEED_INFO_V1 = ctypes.sizeof(FanSpeedInfo) | 1 << 24  # NVML_STRUCT_VERSION(FanSpeedInfo, 1)


class MarginTemperature(ctypes.Structure):
    """nvmlMarginTemperature_v1_t: declared here (bindings before nvidia-ml-py 12.570 lack it)."""

    _fields_ = [("version", ctypes.c_uint), ("marginTemperature", ctypes.c_int)]


MARGIN_TEMPERATURE_V1 = ctypes.sizeof(MarginTemperature) | 1 << 24


class GpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t (R525+): declared here (bindings before nvidia-ml-py 12.535 lack it)."""

    _fields_ = [("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint),
                ("state", ctypes.c_uint)]


class GpuFabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t (R550+, nvmlDeviceGetGpuFabricInfoV): a version first, the health mask last."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint)]


class GpuFabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t (R580+, nvmlDeviceGetGpuFabricInfoV): v2 and the health summary after it."""

    _fields_ = [*GpuFabricInfoV2._fields_, ("healthSummary", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 3)]


GPU_FABRIC_INFO_V2 = ctypes.sizeof(GpuFabricInfoV2) | 2 << 24
GPU_FABRIC_INFO_V3 = ctypes.sizeof(GpuFabricInfoV3) | 3 << 24  # nvml.h's nvmlGpuFabricInfo_v3, 0x3000028
FABRIC_STATE_NOT_SUPPORTED, FABRIC_STATE_COMPLETED = 0, 3  # NVML_GPU_FABRIC_STATE_*


@dataclass(frozen=True)
class Api:
    """What the loaded libnvidia-ml offers, resolved once at open: the newest variant of each function that has
    several, and the process-info layout its driver fills."""

    temperature_v: bool  # nvmlDeviceGetTemperatureV (the successor of the deprecated nvmlDeviceGetTemperature)
    event_reasons: bool  # nvmlDeviceGetCurrentClocksEventReasons (R535+), else ...ClocksThrottleReasons
    violation: bool  # nvmlDeviceGetViolationStatus; without it, fields NVML_FI_DEV_PERF_POLICY_POWER/THERMAL
    fan_v2: bool  # nvmlDeviceGetFanSpeed_v2 (per fan), else nvmlDeviceGetFanSpeed (fan 0)
    memory_v2: bool  # nvmlDeviceGetMemoryInfo_v2 ("used" without the driver's reserved memory, as nvidia-smi)
    margin: bool  # nvmlDeviceGetMarginTemperature (R570+)
    retired_v2: bool  # nvmlDeviceGetRetiredPages_v2: each retired page's timestamp (and the binding's wrapper)
    fabric: str | None  # nvmlDeviceGetGpuFabricInfoV (R550+: health mask; R580+: v3, summary), else ...Info (R525+)
    processes: str  # the newest nvmlDeviceGetComputeRunningProcesses variant exported
    process_layout: type[ctypes.Structure]
    # the versioned calls the library answered ARGUMENT_VERSION_MISMATCH ("temperature_v", "memory_v2"): their
    # older call is asked from then on
    refused: set[str] = field(default_factory=set, compare=False)

    @classmethod
    def resolve(cls) -> Api:
        processes = next((name for name in ("nvmlDeviceGetComputeRunningProcesses_v3",
                                            "nvmlDeviceGetComputeRunningProcesses_v2")
                          if exports(name)), "nvmlDeviceGetComputeRunningProcesses")
        return cls(
            temperature_v=exports("nvmlDeviceGetTemperatureV") and hasattr(pynvml, "nvmlDeviceGetTemperatureV"),
            event_reasons=exports("nvmlDeviceGetCurrentClocksEventReasons")
            and hasattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons"),
            violation=exports("nvmlDeviceGetViolationStatus"),
            fan_v2=exports("nvmlDeviceGetFanSpeed_v2"),
            memory_v2=exports("nvmlDeviceGetMemoryInfo_v2") and hasattr(pynvml, "nvmlMemory_v2"),
            margin=exports("nvmlDeviceGetMarginTemperature"),
            retired_v2=exports("nvmlDeviceGetRetiredPages_v2") and hasattr(pynvml, "nvmlDeviceGetRetiredPages_v2"),
            fabric=next((name for name in ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo")
                         if exports(name)), None),
            processes=processes,
            process_layout=process_layout(processes, exports),
        )


# -- readers: (handle, api) -> {sample field: value in base units} -------------------------


def _versioned(api: Api, name: str, new: Callable[[], T], old: Callable[[], T], expected: bool = False) -> T:
    """``new()``, a call with a versioned struct, unless the library refused its version (then, and from then on,
    ``old()``, the call it succeeds). ``expected``: a refusal every older branch gives, said at info level."""
    if name not in api.refused:
        try:
            return new()
        except pynvml.NVMLError as exc:
            if exc.value != ARGUMENT_VERSION_MISMATCH:
                raise
            api.refused.add(name)
            log.log(logging.INFO if expected else logging.WARNING, "NVML refused the struct version of the %s "
                    "call (argument version mismatch): asking its predecessor instead", name)
    return old()


def _temperature(h: Any, api: Api) -> Values:
    sensor = pynvml.NVML_TEMPERATURE_GPU
    if api.temperature_v:
        value = _versioned(api, "temperature_v", lambda: pynvml.nvmlDeviceGetTemperatureV(h, sensor),
                           lambda: pynvml.nvmlDeviceGetTemperature(h, sensor))
    else:
        value = pynvml.nvmlDeviceGetTemperature(h, sensor)
    return {"temperature_gpu_celsius": float(value)}


def _margin(h: Any, api: Api) -> Values:
    """nvmlDeviceGetMarginTemperature: the die's distance to its nearest slowdown threshold, °C. A library before
    R570 has no such function: no margin, and nothing said unavailable (it would be on every GPU of most boxes)."""
    if not api.margin:
        return {"temperature_margin_celsius": None}
    info = MarginTemperature(version=MARGIN_TEMPERATURE_V1)
    pynvml._nvmlCheckReturn(pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMarginTemperature")(h, ctypes.byref(info)))
    return {"temperature_margin_celsius": float(info.marginTemperature)}


# The die's limits on the T.Limit scale (nvml.h: nvmlDeviceGetTemperatureThreshold is "no longer the preferred
# interface" for them on Ada and later, and is to lose them): field id -> the absolute threshold it gives, where
# the margin says where T.Limit 0 lies (the die's reading plus its margin)
TLIMIT_FIELDS = ((193, "threshold_shutdown_celsius"),  # NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT
                 (194, "threshold_slowdown_celsius"),  # NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT
                 (196, "threshold_gpu_max_celsius"))  # NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT


def _threshold(kind: int, name: str) -> Callable[[Any, Api], Values]:
    def read(h: Any, api: Api) -> Values:
        return {name: float(pynvml.nvmlDeviceGetTemperatureThreshold(h, kind))}

    return read


def _power(h: Any, api: Api) -> Values:
    return {"power_watts": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0}


def _power_limit(h: Any, api: Api) -> Values:
    return {"power_limit_watts": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}


def _power_default_limit(h: Any, api: Api) -> Values:
    return {"power_default_limit_watts": pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0}


def _clocks(maximum: bool) -> Callable[[Any, Api], Values]:
    suffix = "_max_hz" if maximum else "_hz"

    def clocks(h: Any, api: Api) -> Values:
        read = pynvml.nvmlDeviceGetMaxClockInfo if maximum else pynvml.nvmlDeviceGetClockInfo
        return {f"clock_{name}{suffix}": read(h, kind) * 1e6 for name, kind in
                (("graphics", pynvml.NVML_CLOCK_GRAPHICS), ("sm", pynvml.NVML_CLOCK_SM),
                 ("memory", pynvml.NVML_CLOCK_MEM))}

    return clocks


def _pstate(h: Any, api: Api) -> Values:
    return {"performance_state": int(pynvml.nvmlDeviceGetPerformanceState(h))}


def _reasons(h: Any, api: Api) -> Values:
    read = (pynvml.nvmlDeviceGetCurrentClocksEventReasons if api.event_reasons
            else pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)  # the same bits under their pre-R535 name
    return {"clock_event_reasons": int(read(h))}


def _violation(policy: int, name: str) -> Callable[[Any, Api], Values]:
    def read(h: Any, api: Api) -> Values:
        return {name: pynvml.nvmlDeviceGetViolationStatus(h, policy).violationTime / 1e9}

    return read


def _utilization(h: Any, api: Api) -> Values:
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    return {"utilization_gpu_ratio": util.gpu / 100.0, "utilization_memory_ratio": util.memory / 100.0}


def _memory_used(h: Any, api: Api) -> Values:
    """The GPU's used memory; where its own answer is refused, its MIG devices' summed (:func:`_per_mig_device`)."""
    try:
        return {"memory_used_bytes": _used(h, api)}
    except pynvml.NVMLError as exc:
        return {"memory_used_bytes": float(sum(_per_mig_device(h, exc, lambda mig: _used(mig, api))))}


def _used(h: Any, api: Api) -> float:
    """One handle's (a GPU's or a MIG device's) used memory, bytes."""
    if api.memory_v2:  # nvidia-smi's "memory.used": without the memory the driver reserves for itself
        return float(_versioned(
            api, "memory_v2", lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used,
            lambda: pynvml.nvmlDeviceGetMemoryInfo(h).used))
    return float(pynvml.nvmlDeviceGetMemoryInfo(h).used)


def _mig(h: Any, api: Api) -> Values:
    return {"mig_enabled": pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE}


def _ecc_mode(h: Any, api: Api) -> Values:
    return {"ecc_enabled": pynvml.nvmlDeviceGetEccMode(h)[0] == pynvml.NVML_FEATURE_ENABLED}


PLAUSIBLE_WALL = (946684800.0, 4102444800.0)  # 2000-01-01 .. 2100-01-01: a page's timestamp outside is not a date


def _retired_pages(h: Any, api: Api) -> Values:
    """The pages retired for each cause (before Ampere) and, where the library has nvmlDeviceGetRetiredPages_v2, the
    oldest and newest of their timestamps ("the timestamps of page retirement", Unix seconds): the card's own dates,
    kept in its InfoROM, which reach back before gpuwear met it. A timestamp that is no plausible date is left out."""
    causes = (pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
              pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    if api.retired_v2:
        pages = [pynvml.nvmlDeviceGetRetiredPages_v2(h, cause) for cause in causes]
        counts = [len(p) for p in pages]
        walls = [float(page["timestamp"]) for p in pages for page in p
                 if PLAUSIBLE_WALL[0] <= page["timestamp"] < PLAUSIBLE_WALL[1]]
    else:
        counts, walls = [len(pynvml.nvmlDeviceGetRetiredPages(h, cause)) for cause in causes], []
    return {"retired_pages_single_bit": counts[0], "retired_pages_double_bit": counts[1],
            "retired_pages_pending": bool(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)),
            "retired_pages_oldest_wall": min(walls, default=None),
            "retired_pages_newest_wall": max(walls, default=None)}


def _remapped_rows(h: Any, api: Api) -> Values:
    corrected, uncorrected, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
    return {"remapped_rows_corrected": corrected, "remapped_rows_uncorrected": uncorrected,
            "remapped_rows_pending": bool(pending), "remapped_rows_failure": bool(failure)}


def _remap_histogram(h: Any, api: Api) -> Values:
    """The row remapper's banks with few and with no spare rows left: nvmlDeviceGetRowRemapperHistogram's low and
    none (nvmlRowRemapperHistogramValues_t; "none means that there are no reserved rows available")."""
    values = pynvml.nvmlDeviceGetRowRemapperHistogram(h)
    return {"remap_banks_low": int(values.low), "remap_banks_none": int(values.none)}


ECC_LOCATIONS = (("dram", 2), ("sram", 7))  # nvmlMemoryLocation_t: DRAM (DEVICE_MEMORY before Turing), SRAM


def _ecc_locations(h: Any, api: Api) -> Values:
    """The aggregate ECC counts by where they came (nvmlDeviceGetMemoryErrorCounter, NVML_AGGREGATE_ECC): the DRAM
    and the on-chip SRAM, corrected and uncorrected; a location the card does not count is None (from Turing on, only
    the DRAM and the SRAM are kept), and a card that counts none raises its NOT_SUPPORTED."""
    out: Values = {}
    refused: pynvml.NVMLError | None = None
    for where, location in ECC_LOCATIONS:
        for kind, error_type in (("corrected", 0), ("uncorrected", 1)):  # nvmlMemoryErrorType_t
            try:
                out[f"ecc_{kind}_aggregate_{where}"] = int(pynvml.nvmlDeviceGetMemoryErrorCounter(
                    h, error_type, 1, location))  # nvmlEccCounterType_t 1: NVML_AGGREGATE_ECC
            except pynvml.NVMLError_NotSupported as exc:
                out[f"ecc_{kind}_aggregate_{where}"], refused = None, exc
    if refused is not None and all(v is None for v in out.values()):
        raise refused
    return out


_FABRIC_NONE: Values = {"fabric_state": None, "fabric_status": None, "fabric_health_mask": None,
                        "fabric_health_summary": None}


def _fabric_info(h: Any, api: Api) -> GpuFabricInfo | GpuFabricInfoV2 | GpuFabricInfoV3:
    """The newest fabric struct the library fills: v3 through the V call (R580+), else v2 (a library before R580
    answers v3 ARGUMENT_VERSION_MISMATCH, once; PyTorch's c10/cuda reads it the same way), else the R525 call's."""
    def call(info: S) -> S:
        pynvml._nvmlCheckReturn(pynvml._nvmlGetFunctionPointer(str(api.fabric))(h, ctypes.byref(info)))
        return info

    if api.fabric == "nvmlDeviceGetGpuFabricInfo":
        return call(GpuFabricInfo())

    def v3() -> GpuFabricInfoV2 | GpuFabricInfoV3:
        return call(GpuFabricInfoV3(version=GPU_FABRIC_INFO_V3))

    return _versioned(api, "fabric_v3", v3, lambda: call(GpuFabricInfoV2(version=GPU_FABRIC_INFO_V2)), expected=True)


def _fabric(h: Any, api: Api) -> Values:
    """The GPU's registration with the NVLink fabric of an NVSwitch system (nvmlDeviceGetGpuFabricInfoV, else
    nvmlDeviceGetGpuFabricInfo): its state (NVML_GPU_FABRIC_STATE_*), the status of a completed one (an
    nvmlReturn_t, "must be checked only if state returns complete"), the V call's health mask as NVML gives it, and
    v3's health summary (None where NOT_SUPPORTED). A library without either call, or a GPU without a fabric
    (STATE_NOT_SUPPORTED, or NOT_SUPPORTED before Hopper): none of them, and nothing said unavailable."""
    if api.fabric is None:
        return _FABRIC_NONE
    try:
        info = _fabric_info(h, api)
    except pynvml.NVMLError_NotSupported:  # before Hopper: no fabric, not a reading the GPU fails to give
        return _FABRIC_NONE
    if info.state == FABRIC_STATE_NOT_SUPPORTED:
        return _FABRIC_NONE
    completed = info.state == FABRIC_STATE_COMPLETED
    return {"fabric_state": int(info.state), "fabric_status": int(info.status) if completed else None,
            "fabric_health_mask": int(info.healthMask) if not isinstance(info, GpuFabricInfo) else None,
            "fabric_health_summary": int(info.healthSummary) or None if isinstance(info, GpuFabricInfoV3) else None}


def _pcie_link(h: Any, api: Api) -> Values:
    return {"pcie_link_generation": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
            "pcie_link_generation_max": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
            "pcie_link_width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
            "pcie_link_width_max": pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)}


NVLINK_LINKS_ASKED = 18  # links asked at most (Hopper's and Blackwell's per GPU; the count is found by asking)
_NVLINK_COUNTERS = (("nvlink_replay_errors", 0), ("nvlink_recovery_errors", 1), ("nvlink_crc_flit_errors", 2),
                    ("nvlink_crc_data_errors", 3))  # nvmlNvLinkErrorCounter_t


def _nvlink(h: Any, api: Api) -> Values:
    """The GPU's NVLink links, asked one after another until the driver says there is no such link: how many are
    active, each error counter summed over them, and (for metrics.detail) each link's state and counts. A GPU
    without NVLink answers NOT_SUPPORTED for link 0."""
    active = 0
    totals = dict.fromkeys((key for key, _ in _NVLINK_COUNTERS), 0)
    states: list[int] = []
    per_link: list[tuple[int, str, int]] = []
    for link in range(NVLINK_LINKS_ASKED):
        try:
            up = pynvml.nvmlDeviceGetNvLinkState(h, link)
        except pynvml.NVMLError as exc:
            if link == 0 or exc.value not in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_SUPPORTED):
                raise
            break
        active += bool(up)
        states.append(int(bool(up)))
        for key, counter in _NVLINK_COUNTERS:  # a link gone down keeps its counts where the driver still has them
            try:
                count = pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
            except pynvml.NVMLError as exc:
                if up and not isinstance(exc, pynvml.NVMLError_NotSupported):
                    raise
                continue
            totals[key] += count
            per_link.append((link, key, int(count)))
    return {"nvlink_links_active": active, **totals, "nvlink_link_states": tuple(states),
            "nvlink_link_errors": tuple(per_link)}


_NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE: usedGpuMemory under Windows WDDM
_NOT_AVAILABLE = frozenset({_NOT_AVAILABLE_ULL, 2**32 - 1})  # ...as an unsigned long long, or an unsigned int


def _processes(h: Any, api: Api) -> Values:
    """The compute processes, through the newest nvmlDeviceGetComputeRunningProcesses the driver exports, into
    the layout that driver fills (pynvml's own wrapper reads a 32-byte layout as 24 bytes on 535.43-535.86).

    Where the GPU's own list is refused (MIG on, an unprivileged daemon: :func:`_per_mig_device`), each MIG device's
    list, its processes placed on its GPU and compute instance."""
    try:
        return _process_list(h, api)
    except pynvml.NVMLError as exc:
        per_device = _per_mig_device(h, exc, lambda mig: (*_instance_ids(mig), _process_list(mig, api)["processes"]))
    return {"processes": tuple(p for _, _, listed in per_device for p in listed),
            "process_instances": tuple((pid, gpu_instance, compute_instance)
                                       for gpu_instance, compute_instance, listed in per_device for pid, _ in listed)}


def _per_mig_device(h: Any, refused: pynvml.NVMLError, each: Callable[[Any], T]) -> list[T]:
    """Where a GPU's own answer was refused NO_PERMISSION, ``each`` of its MIG devices' handles. nvml.h: with MIG on,
    "if device handle is provided, the API returns aggregate information, only if the caller has appropriate
    privileges. Per-instance information can be queried by using specific MIG device handles". The refusal stands
    (raised again) for any other error, on a GPU without MIG devices, or where a MIG device refuses too."""
    if refused.value != pynvml.NVML_ERROR_NO_PERMISSION:
        raise refused
    try:
        answers = [each(mig) for mig in _mig_handles(h)]
    except pynvml.NVMLError:
        raise refused from None
    if not answers:
        raise refused
    return answers


def _process_list(h: Any, api: Api) -> Values:
    """One handle's (a GPU's or a MIG device's) processes and the instances they run on (:func:`_processes`)."""
    fn = pynvml._nvmlGetFunctionPointer(api.processes)
    count = ctypes.c_uint(0)
    ret = fn(h, ctypes.byref(count), None)
    for _ in range(3):  # processes may start between the two calls: ask again with room to spare
        if ret == pynvml.NVML_SUCCESS and count.value == 0:
            return {"processes": (), "process_instances": ()}
        if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            break
        count.value = count.value * 2 + 5
        infos = (api.process_layout * count.value)()
        ret = fn(h, ctypes.byref(count), infos)
        if ret == pynvml.NVML_SUCCESS:
            listed = infos[:count.value]
            return {"processes": tuple(
                (int(p.pid), None if p.usedGpuMemory == _NOT_AVAILABLE_ULL else float(p.usedGpuMemory))
                for p in listed),
                "process_instances": tuple((int(p.pid), int(p.gpuInstanceId), int(p.computeInstanceId))
                                           for p in listed if getattr(p, "gpuInstanceId", _NO_INSTANCE)
                                           != _NO_INSTANCE)}
    raise pynvml.NVMLError(ret)


_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG (nvmlProcessInfo_v2_t)
MAX_MIG_DEVICES = 7  # MIG devices read of one GPU, whatever nvmlDeviceGetMaxMigDeviceCount answers


def _mig_devices(h: Any, api: Api) -> Values:
    """The GPU's MIG devices, (GPU instance id, compute instance id, MIG UUID) each: nvmlDeviceGetMaxMigDeviceCount
    (0 with MIG off), then nvmlDeviceGetMigDeviceHandleByIndex for each index (NOT_FOUND where none was made: the
    indexes can have holes) and the device's nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId and
    nvmlDeviceGetUUID ("MIG-<uuid>", what the kubelet names the device a pod holds)."""
    return {"mig_devices": tuple((*_instance_ids(mig), _text(pynvml.nvmlDeviceGetUUID(mig)))
                                 for mig in _mig_handles(h))}


def _mig_slices(h: Any, api: Api) -> Values:
    """Each MIG device's compute slices, (MIG UUID, slices) each (nvmlDeviceGetAttributes_v2's
    computeInstanceSliceCount: "3g.40gb" holds 3), and the GPU's slices in all, its largest MIG device count
    (nvmlDeviceGetMaxMigDeviceCount: 7 on an A100 or H100, 4 on an A30, one 1-slice device each); none and 0 with
    MIG off.
    A count outside 1 to that total is not kept (the device left out: its jobs are then shared equally)."""
    total = min(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)), MAX_MIG_DEVICES)
    slices = []
    for mig in _mig_handles(h):
        count = int(pynvml.nvmlDeviceGetAttributes_v2(mig).computeInstanceSliceCount)
        if 1 <= count <= total:
            slices.append((_text(pynvml.nvmlDeviceGetUUID(mig)), count))
    return {"mig_slices": tuple(slices), "mig_slice_count": total}


def _instance_ids(mig: Any) -> tuple[int, int]:
    """A MIG device's GPU instance and compute instance (nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId)."""
    return int(pynvml.nvmlDeviceGetGpuInstanceId(mig)), int(pynvml.nvmlDeviceGetComputeInstanceId(mig))


def _mig_handles(h: Any) -> Iterator[Any]:
    """The handles of the GPU's MIG devices (none with MIG off): nvmlDeviceGetMaxMigDeviceCount, then
    nvmlDeviceGetMigDeviceHandleByIndex for each index, skipping NOT_FOUND (the indexes can have holes)."""
    for index in range(min(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)), MAX_MIG_DEVICES)):
        try:
            yield pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, index)
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_NOT_FOUND:
                raise


def _fan_speed(fan: int, h: Any, api: Api) -> float:
    """nvmlDeviceGetFanSpeed_v2 for one fan, or nvmlDeviceGetFanSpeed (fan 0 only) on drivers without it; ratio."""
    if api.fan_v2:
        return float(pynvml.nvmlDeviceGetFanSpeed_v2(h, fan)) / 100.0
    if fan > 0:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    return float(pynvml.nvmlDeviceGetFanSpeed(h)) / 100.0


def _fan_rpm(fan: int, h: Any, api: Api) -> float:
    """nvmlDeviceGetFanSpeedRPM for one fan (pynvml's wrapper only asks fan 0)."""
    info = FanSpeedInfo(version=FAN_SPEED_INFO_V1, fan=fan)
    ret = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFanSpeedRPM")(h, ctypes.byref(info))
    pynvml._nvmlCheckReturn(ret)
    return float(info.speed)


@dataclass(frozen=True)
class Reader:
    key: str  # logged, and a per-GPU "unavailable" entry
    slow: bool
    read: Callable[[Any, Api], Values]
    fields: tuple[str, ...]  # the sample fields it fills (set to None when its read fails)


READERS: tuple[Reader, ...] = (
    Reader("temperature", False, _temperature, ("temperature_gpu_celsius",)),
    Reader("power", False, _power, ("power_watts",)),
    Reader("clocks", False, _clocks(False), ("clock_graphics_hz", "clock_sm_hz", "clock_memory_hz")),
    Reader("performance_state", False, _pstate, ("performance_state",)),
    Reader("clock_event_reasons", False, _reasons, ("clock_event_reasons",)),
    Reader("violation_power", False, _violation(pynvml.NVML_PERF_POLICY_POWER, "violation_power_seconds"),
           ("violation_power_seconds",)),
    Reader("violation_thermal", False,
           _violation(pynvml.NVML_PERF_POLICY_THERMAL, "violation_thermal_seconds"),
           ("violation_thermal_seconds",)),
    Reader("utilization", False, _utilization, ("utilization_gpu_ratio", "utilization_memory_ratio")),
    Reader("memory_used", False, _memory_used, ("memory_used_bytes",)),
    Reader("processes", False, _processes, ("processes", "process_instances")),
    Reader("threshold_shutdown", True,
           _threshold(pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, "threshold_shutdown_celsius"),
           ("threshold_shutdown_celsius",)),
    Reader("threshold_slowdown", True,
           _threshold(pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, "threshold_slowdown_celsius"),
           ("threshold_slowdown_celsius",)),
    Reader("threshold_gpu_max", True,
           _threshold(pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX, "threshold_gpu_max_celsius"),
           ("threshold_gpu_max_celsius",)),
    Reader("threshold_memory_max", True,
           _threshold(pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, "threshold_memory_max_celsius"),
           ("threshold_memory_max_celsius",)),
    Reader("temperature_margin", True, _margin, ("temperature_margin_celsius",)),
    Reader("power_limit", True, _power_limit, ("power_limit_watts",)),
    Reader("power_default_limit", True, _power_default_limit, ("power_default_limit_watts",)),
    Reader("max_clocks", True, _clocks(True),
           ("clock_graphics_max_hz", "clock_sm_max_hz", "clock_memory_max_hz")),
    Reader("mig_mode", True, _mig, ("mig_enabled",)),
    Reader("mig_devices", True, _mig_devices, ("mig_devices",)),
    Reader("mig_slices", True, _mig_slices, ("mig_slices", "mig_slice_count")),
    Reader("ecc_mode", True, _ecc_mode, ("ecc_enabled",)),
    Reader("retired_pages", True, _retired_pages,
           ("retired_pages_single_bit", "retired_pages_double_bit", "retired_pages_pending",
            "retired_pages_oldest_wall", "retired_pages_newest_wall")),
    Reader("remapped_rows", True, _remapped_rows,
           ("remapped_rows_corrected", "remapped_rows_uncorrected", "remapped_rows_pending",
            "remapped_rows_failure")),
    Reader("remap_histogram", True, _remap_histogram, ("remap_banks_low", "remap_banks_none")),
    Reader("ecc_locations", True, _ecc_locations,
           ("ecc_corrected_aggregate_dram", "ecc_uncorrected_aggregate_dram", "ecc_corrected_aggregate_sram",
            "ecc_uncorrected_aggregate_sram")),
    Reader("pcie_link", True, _pcie_link,
           ("pcie_link_generation", "pcie_link_generation_max", "pcie_link_width", "pcie_link_width_max")),
    Reader("fabric", True, _fabric, ("fabric_state", "fabric_status", "fabric_health_mask", "fabric_health_summary")),
    Reader("nvlink", True, _nvlink,
           ("nvlink_links_active", "nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors",
            "nvlink_recovery_errors", "nvlink_link_states", "nvlink_link_errors")),
)
_VIOLATION_READERS = ("violation_power", "violation_thermal")

FieldValue = tuple[int, str, float, bool]  # (field id, sample field, scale, slow)

# Batched reads through nvmlDeviceGetFieldValues.
FIELD_VALUES: tuple[FieldValue, ...] = (
    (82, "temperature_memory_celsius", 1.0, False),  # NVML_FI_DEV_MEMORY_TEMP, °C
    (83, "energy_joules", 1e-3, False),  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ
    (3, "ecc_corrected_volatile", 1.0, True),  # NVML_FI_DEV_ECC_SBE_VOL_TOTAL
    (4, "ecc_uncorrected_volatile", 1.0, True),  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL
    (5, "ecc_corrected_aggregate", 1.0, True),  # NVML_FI_DEV_ECC_SBE_AGG_TOTAL
    (6, "ecc_uncorrected_aggregate", 1.0, True),  # NVML_FI_DEV_ECC_DBE_AGG_TOTAL
    (94, "pcie_replays", 1.0, True),  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
    (230, "recovery_action", 1.0, True),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (unknown to drivers before R565)
    # NVML_FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING, % (R570+; Blackwell and newer datacenter boards)
    (258, "power_smoothing_life_percent", 1.0, True),
)
# Where nvmlDeviceGetViolationStatus is gone (deprecated in NVML 13): its counters as field values, ns.
VIOLATION_FIELDS: tuple[FieldValue, ...] = (
    (74, "violation_power_seconds", 1e-9, False),  # NVML_FI_DEV_PERF_POLICY_POWER
    (75, "violation_thermal_seconds", 1e-9, False),  # NVML_FI_DEV_PERF_POLICY_THERMAL
)
_INTEGER_FIELDS = {"ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
                   "ecc_uncorrected_aggregate", "pcie_replays", "recovery_action", "power_smoothing_life_percent"}
# nvmlValueType_t -> nvmlValue_t member (numbers from nvml.h: older bindings lack some constants)
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# ... and its C type, for a binding whose union lacks the member (nvidia-ml-py 11.515 has no siVal or usVal)
_VALUE_TYPES: dict[int, type[Any]] = {0: ctypes.c_double, 1: ctypes.c_uint, 2: ctypes.c_ulong,
                                      3: ctypes.c_ulonglong, 4: ctypes.c_longlong, 5: ctypes.c_int, 6: ctypes.c_ushort}


def field_value(fv: Any) -> Any:
    """The value of an nvmlFieldValue_t as its valueType says (an unsigned long long when it names no type)."""
    member = _VALUE_MEMBERS.get(fv.valueType, "ullVal")
    if hasattr(fv.value, member):
        return getattr(fv.value, member)
    kind = _VALUE_TYPES[fv.valueType]  # the union's first bytes, as that C type
    return kind.from_buffer_copy(bytes(fv.value)[:ctypes.sizeof(kind)]).value

FANS = (("fan_speed_ratio", _fan_speed), ("fan_speed_rpm", _fan_rpm))

# All sample fields a backend read can fill, for callers that need the full set.
ALL_FIELDS: tuple[str, ...] = (
    tuple(f for r in READERS for f in r.fields) + tuple(f[1] for f in FIELD_VALUES)
    + tuple(key for key, _ in FANS)
)


_Plan = tuple[tuple[Reader, ...], list[FieldValue], tuple[str, ...], dict[str, None]]


class _Device:
    """Per-GPU state of the backend: the handle and what the GPU cannot give (key -> reason)."""

    def __init__(self, handle: Any, identity: GpuIdentity, readers: tuple[Reader, ...],
                 fields: tuple[FieldValue, ...]) -> None:
        self.handle = handle
        self.identity = identity
        self.readers = readers
        self.fields = fields
        self.unavailable: dict[str, str] = {}
        self._plans: dict[bool, _Plan] = {}

    def plan(self, slow: bool) -> _Plan:
        """What a fast (or slow) read asks for: readers, field values and fan readings, and None for the fields
        of those left out. A fast read leaves out everything unavailable; a slow read asks again what may come
        back (a MIG toggle, a permission) and leaves out only what the loaded library can never answer."""
        plan = self._plans.get(slow)
        if plan is None:
            def skipped(key: str) -> bool:
                reason = self.unavailable.get(key)
                return reason is not None and (not slow or reason in PERMANENT_REASONS)

            readers = [r for r in self.readers if slow or not r.slow]
            fields = [f for f in self.fields if slow or not f[3]]
            fans = tuple(key for key, _ in FANS) if self.identity.fan_count else ()
            plan = self._plans[slow] = (
                tuple(r for r in readers if not skipped(r.key)),
                [f for f in fields if not skipped(f[1])],
                tuple(key for key in fans if not skipped(key)),
                {**{name: None for r in readers if skipped(r.key) for name in r.fields},
                 **{f[1]: None for f in fields if skipped(f[1])},
                 **{key: None for key in fans if skipped(key)}})
        return plan

    def mark(self, key: str, reason: str | None) -> bool:
        """Record that ``key`` is unavailable for ``reason`` (None: available); True when that changed."""
        if self.unavailable.get(key) == reason:
            return False
        if reason is None:
            del self.unavailable[key]
        else:
            self.unavailable[key] = reason
        self._plans.clear()
        return True


class NvmlBackend:
    """Reads GPUs through pynvml. ``library``: a path to libnvidia-ml, or a stand-in object
    with the same C functions (the fake library used by tests and ``--simulate``)."""

    EVENT_REBUILD_SECONDS = 30.0  # a GPU left out of the event set (lost) is tried again this often

    def __init__(self, library: object | str = DEFAULT_LIBRARY) -> None:
        self._library = library
        self._devices: list[_Device] = []
        self.api: Api | None = None
        self._events_stop = threading.Event()
        self._events_rebuild = threading.Event()  # join() asks the listener to build its set again, with new GPUs
        self._events_thread: threading.Thread | None = None
        self._on_xid: Callable[[int, int], None] | None = None
        self._wait_ms = 500
        self._logged_bugs: set[tuple[int, str]] = set()
        self._margin_logged: set[str] = set()  # GPUs whose thresholds came from the margin
        self._refused: dict[int, int] = {}  # NVML index -> the error its handle answered (logged once per change)

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> list[GpuIdentity]:
        """Initialise NVML, resolve what the library offers and enumerate the GPUs; raises
        :class:`NvmlUnavailableError` (:class:`NvmlVersionMismatchError` after a driver upgrade)."""
        if isinstance(self._library, str):
            try:
                install_library(ctypes.CDLL(self._library))
            except OSError as exc:
                raise NvmlUnavailableError(
                    f"NVML library {self._library} not found ({exc}); install the NVIDIA driver "
                    "(it ships NVML), or run `gpuwear run --simulate` to try gpuwear on simulated GPUs"
                ) from None
        else:
            install_library(self._library)
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
                raise NvmlVersionMismatchError(str(exc)) from None
            raise NvmlUnavailableError(f"NVML initialisation failed: {exc}; check that the NVIDIA "
                                       "driver is loaded (`nvidia-smi` should list the GPUs)") from None
        self.api = Api.resolve()
        self._devices = []
        self._refused = {}
        for index in range(count):
            self._open_device(index)
        self._events_rebuild.set()  # a listener started before this open returned (past its deadline) takes them
        return [d.identity for d in self._devices]

    def _open_device(self, index: int) -> _Device | None:
        """Open the GPU at NVML index ``index`` and read it from now on; None (logged once per answer) when NVML
        refuses its handle: lost (GPU_IS_LOST), kept from this process by a cgroup (NO_PERMISSION)..."""
        api = self.api
        assert api is not None
        readers = READERS if api.violation else tuple(r for r in READERS if r.key not in _VIOLATION_READERS)
        fields = FIELD_VALUES if api.violation else FIELD_VALUES + VIOLATION_FIELDS
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            device = _Device(handle, self._identity(index, handle), readers, fields)
        except pynvml.NVMLError as exc:
            if self._refused.get(index) != exc.value:
                log.error("GPU %d cannot be opened (%s); it is asked again every slow interval", index, exc)
            self._refused[index] = exc.value
            return None
        self._refused.pop(index, None)
        if _MODULE_ENERGY.search(device.identity.name):
            device.mark("energy_joules", MODULE_SCOPE)
            log.info("GPU %d (%s): %s counts the module's energy (Grace CPU included); the GPU's energy "
                     "is integrated from its power instead", index, device.identity.uuid, device.identity.name)
        self._devices.append(device)
        return device

    def join(self) -> list[GpuIdentity]:
        """The GPUs NVML lists now that are not read yet (one that could not be opened at start, one that came
        later), opened and read from now on after the others: their identities, in that order (the reader's
        positions go on from the GPUs it had). The XID listener is started again to take them in."""
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            log.debug("nvmlDeviceGetCount: %s", exc)
            return []
        opened = {d.identity.index for d in self._devices}
        joined = [d.identity for index in range(count) if index not in opened
                  if (d := self._open_device(index)) is not None]
        if joined:
            log.warning("GPU(s) joined: %s", ", ".join(f"{g.index} ({g.uuid})" for g in joined))
            # the listener takes them in when its wait ends: stopping it here held the tick up to its wait (5 s)
            self._events_rebuild.set()
        return joined

    def reopen(self) -> list[GpuIdentity]:
        """After the driver came back (reload): initialise NVML again, acquire new handles and
        restart the event listener. Raises :class:`NvmlUnavailableError` while it is still gone."""
        if self._stop_events():
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
        else:  # NVML is reference counted: the new init is one more, the listener's NVML stays whole until it leaves
            log.warning("the NVML event listener did not leave its wait: NVML is not shut down under it")
        identities = self.open()
        if self._on_xid is not None:
            self.start_events(self._on_xid, self._wait_ms)
        return identities

    def _stop_events(self) -> bool:
        """Stop the listener; whether it left NVML (a wait in progress ends first)."""
        self._events_stop.set()
        thread, self._events_thread = self._events_thread, None
        if thread is None:
            return True
        thread.join(timeout=self._wait_ms / 1000.0 + 2.0)
        return not thread.is_alive()

    CLOSE_WAIT_SECONDS = 0.2  # how long close() waits for the event listener to leave NVML

    def close(self) -> None:
        """Stop the event listener and shut NVML down. A listener still inside nvmlEventSetWait (it waits up to
        sampling.event_wait_milliseconds) is not waited for past CLOSE_WAIT_SECONDS: NVML is then left
        initialised, as shutting it down under a thread inside it is not safe; the process is ending (a stop
        returns within about a second) and the wait ends on its own."""
        self._events_stop.set()
        thread, self._events_thread = self._events_thread, None
        if thread is not None:
            thread.join(timeout=self.CLOSE_WAIT_SECONDS)
            if thread.is_alive():
                log.debug("NVML left initialised: the event listener is still inside nvmlEventSetWait")
                return
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)

    def system_info(self) -> SystemInfo:
        """Driver, NVML and CUDA driver versions ("unknown" where NVML does not say)."""
        def ask(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except pynvml.NVMLError:
                return None

        cuda = ask(pynvml.nvmlSystemGetCudaDriverVersion)
        return SystemInfo(
            driver_version=_text(ask(pynvml.nvmlSystemGetDriverVersion) or "unknown"),
            nvml_version=_text(ask(pynvml.nvmlSystemGetNVMLVersion) or "unknown"),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "unknown",
        )

    def _identity(self, index: int, h: Any) -> GpuIdentity:
        def optional(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise
                return None

        arch = optional(lambda: pynvml.nvmlDeviceGetArchitecture(h))
        capability = optional(lambda: pynvml.nvmlDeviceGetCudaComputeCapability(h))
        memory = optional(lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
        pci = optional(lambda: pynvml.nvmlDeviceGetPciInfo(h))
        serial = optional(lambda: pynvml.nvmlDeviceGetSerial(h))
        virtualization = optional(lambda: pynvml.nvmlDeviceGetVirtualizationMode(h))
        vbios = optional(lambda: pynvml.nvmlDeviceGetVbiosVersion(h))
        inforom = optional(lambda: pynvml.nvmlDeviceGetInforomImageVersion(h))
        checksum = optional(lambda: pynvml.nvmlDeviceGetInforomConfigurationChecksum(h))
        return GpuIdentity(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            name=_text(pynvml.nvmlDeviceGetName(h)),
            serial=_text(serial) if serial else None,
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            architecture=ARCHITECTURES.get(arch, "unknown") if arch is not None else None,
            cuda_capability=f"{capability[0]}.{capability[1]}" if capability else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            fan_count=self._fan_count(h),
            virtualization_mode=int(virtualization) if virtualization is not None else None,
            vbios=_text(vbios) if vbios else None,
            inforom_image=_text(inforom) if inforom else None,
            inforom_checksum=int(checksum) if checksum is not None else None,
            inforom_valid=self._inforom_valid(h),
        )

    @staticmethod
    def _inforom_valid(h: Any) -> bool | None:
        """nvmlDeviceValidateInforom: True where the InfoROM's checksums verify, False where NVML answers
        CORRUPTED_INFOROM ("the infoROM is corrupted": the counts it keeps, ECC and retirements, cannot be trusted),
        None where it cannot say."""
        try:
            pynvml.nvmlDeviceValidateInforom(h)
            return True
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            return False if exc.value == pynvml.NVML_ERROR_CORRUPTED_INFOROM else None

    MAX_FANS = 8

    def _fan_count(self, h: Any) -> int:
        """nvmlDeviceGetNumFans (R510+); before it, the fans that answer a speed query, counted from fan 0."""
        try:
            return int(pynvml.nvmlDeviceGetNumFans(h))
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            if exc.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                return 0
        assert self.api is not None
        count = 0
        while count < self.MAX_FANS:
            try:
                _fan_speed(count, h, self.api)
            except pynvml.NVMLError:
                break
            count += 1
        return count

    # -- reading ------------------------------------------------------------------------

    def read(self, index: int, slow: bool) -> Reading:
        """Read the fast fields of GPU ``index`` (and the slow ones when ``slow``).

        Raises :class:`GpuLostError` when the GPU has fallen off the bus, :class:`NvmlDriverError` when the
        driver went away and :class:`NvmlVersionMismatchError` when it was replaced by another version.
        """
        dev = self._devices[index]
        api = self.api
        assert api is not None
        out = Reading()
        values, handle = out.values, dev.handle
        readers, wanted, fans, skipped = dev.plan(slow)
        values.update(skipped)  # None, and never a slow read's old value
        for reader in readers:
            try:
                values.update(reader.read(handle, api))
            except Exception as exc:  # an NVMLError, or a binding that does not fit this library: this reader only
                self._failed(dev, reader.key, exc, out)
                values.update(dict.fromkeys(reader.fields))
            else:
                self._available(dev, reader.key)
        self._read_fields(dev, wanted, out)
        for key in fans:
            self._read_fans(dev, key, api, out)
        if slow:
            self._thresholds_from_margin(dev, values)
        out.unavailable.update(dev.unavailable)
        if out.newly:  # one line per GPU and read, not one per reading
            log.info("GPU %d (%s): unavailable: %s (asked again on the slow interval, but what the library lacks)",
                     dev.identity.index, dev.identity.uuid, ", ".join(f"{k} ({r})" for k, r in out.newly))
        return out

    def _thresholds_from_margin(self, dev: _Device, values: dict[str, Any]) -> None:
        """The die's thresholds that nvmlDeviceGetTemperatureThreshold did not give, from the T.Limit scale: T.Limit
        0 lies at the die's reading plus its margin, each threshold at its *_TLIMIT field below that (on an H100:
        slowdown -2, shutdown -5). Nothing when the margin or a field is not given."""
        margin, celsius = values.get("temperature_margin_celsius"), values.get("temperature_gpu_celsius")
        missing = [(field_id, name) for field_id, name in TLIMIT_FIELDS if values.get(name) is None]
        if margin is None or celsius is None or not missing:
            return
        try:
            results = pynvml.nvmlDeviceGetFieldValues(dev.handle, [field_id for field_id, _ in missing])
        except pynvml.NVMLError:
            return
        derived = []
        for (_, name), fv in zip(missing, results, strict=False):
            if fv.nvmlReturn != pynvml.NVML_SUCCESS:
                continue
            raw = field_value(fv)
            if isinstance(raw, (int, float)):
                values[name] = float(round(celsius + margin - raw))
                derived.append(name)
        if derived and dev.identity.uuid not in self._margin_logged:  # said once a GPU
            self._margin_logged.add(dev.identity.uuid)
            log.info("GPU %d (%s): %s from its margin temperature and NVML's T.Limit fields (the threshold calls "
                     "do not give them)", dev.identity.index, dev.identity.uuid, ", ".join(derived))

    def _available(self, dev: _Device, key: str) -> None:
        if key in dev.unavailable and dev.mark(key, None):
            log.info("GPU %d (%s): %s is available again", dev.identity.index, dev.identity.uuid, key)

    def _failed(self, dev: _Device, key: str, exc: BaseException, out: Reading) -> None:
        """Classify what one reader (or field) met: lost GPU, driver gone or replaced (raised), unavailable for
        a reason (recorded, logged on change), or an error of this tick (counted)."""
        if not isinstance(exc, pynvml.NVMLError):
            reason = BINDING_ERROR
            if (dev.identity.index, key) not in self._logged_bugs:  # logged and counted once, not at each re-ask
                self._logged_bugs.add((dev.identity.index, key))
                log.error("GPU %d (%s): reading %s raised %s: %s (nvidia-ml-py %s does not fit this driver?); "
                          "the reading is left out and counted, the others go on (logged once)",
                          dev.identity.index, dev.identity.uuid, key, type(exc).__name__, exc,
                          getattr(pynvml, "__version__", "?"), exc_info=exc)
                out.errors.append(BINDING_ERROR)
        elif exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLostError(str(exc)) from None
        elif exc.value == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
            raise NvmlVersionMismatchError(str(exc)) from None
        elif exc.value in _DRIVER_GONE:
            raise NvmlDriverError(str(exc)) from None
        elif exc.value in UNAVAILABLE_REASONS:
            reason = UNAVAILABLE_REASONS[exc.value]
        else:
            out.errors.append(error_kind(exc))
            return
        if dev.mark(key, reason):
            out.newly.append((key, reason))

    def _read_fields(self, dev: _Device, wanted: list[FieldValue], out: Reading) -> None:
        if not wanted:
            return
        try:
            results = pynvml.nvmlDeviceGetFieldValues(dev.handle, [f[0] for f in wanted])
        except Exception as exc:
            for _, name, _, _ in wanted:
                out.values[name] = None
                self._failed(dev, name, exc, out)  # no field values at all: each field records why
            return
        for (_, name, scale, _), fv in zip(wanted, results, strict=False):
            out.values[name] = None
            ret = fv.nvmlReturn
            if ret == pynvml.NVML_ERROR_INVALID_ARGUMENT:  # a field id this driver does not know
                if dev.mark(name, UNKNOWN_FIELD):
                    out.newly.append((name, UNKNOWN_FIELD))
                continue
            if ret != pynvml.NVML_SUCCESS:
                self._failed(dev, name, pynvml.NVMLError(ret), out)
                continue
            self._available(dev, name)
            raw = field_value(fv)
            if raw in _NOT_AVAILABLE:  # NVML_VALUE_NOT_AVAILABLE: no value this time
                continue
            out.values[name] = int(raw) if name in _INTEGER_FIELDS else raw * scale

    def _read_fans(self, dev: _Device, key: str, api: Api, out: Reading) -> None:
        read = dict(FANS)[key]
        speeds: list[float | None] = []
        for i in range(dev.identity.fan_count):
            try:
                speeds.append(read(i, dev.handle, api))
            except Exception as exc:
                if i > 0 and isinstance(exc, pynvml.NVMLError) and exc.value in UNAVAILABLE_REASONS:
                    speeds.append(None)  # this fan only (pre-R5xx drivers report fan 0 alone)
                    continue
                self._failed(dev, key, exc, out)
                if key in dev.unavailable:
                    out.values[key] = None
                    return
                speeds.append(None)
        self._available(dev, key)
        out.values[key] = tuple(speeds)

    def persistence_mode(self, index: int) -> bool | None:
        """nvmlDeviceGetPersistenceMode; None when the GPU does not say (Windows, lost)."""
        try:
            return bool(pynvml.nvmlDeviceGetPersistenceMode(self._devices[index].handle) == pynvml.NVML_FEATURE_ENABLED)
        except pynvml.NVMLError:
            return None

    def unavailable(self, index: int) -> dict[str, str]:
        """What this GPU cannot give so far, reader key or field name -> reason."""
        return dict(self._devices[index].unavailable)

    # -- events -------------------------------------------------------------------------

    def start_events(self, on_xid: Callable[[int, int], None], wait_ms: int = 500) -> None:
        """Listen for XID (critical error) events on a thread of its own; ``on_xid(gpu, xid)``.

        The event set holds the GPUs that answer; when the wait answers GPU_IS_LOST, a new set is built at once
        without the GPUs that are lost (or, when none says so, without those whose registration fails), so that
        the other GPUs' XIDs of that very incident are still counted; the left-out GPUs are tried again every
        EVENT_REBUILD_SECONDS. With no GPU to listen to, the thread sleeps instead of waiting on an empty set.
        Each listener has a stop event of its own: one still leaving never shares a flag with its successor."""
        self._on_xid, self._wait_ms = on_xid, wait_ms
        self._events_stop = stop = threading.Event()
        self._events_thread = threading.Thread(target=self._listen, args=(on_xid, wait_ms, stop),
                                               name="nvml-events", daemon=True)
        self._events_thread.start()

    def _event_set(self, skip: set[int], logged: set[int]) -> tuple[Any, dict[int, int]] | None:
        """A new event set with every GPU not in ``skip`` that supports XID events; (set, handle address -> GPU).
        A GPU whose registration answers GPU_IS_LOST is added to ``skip``. None when no set can be created."""
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            if -1 not in logged:
                log.warning("NVML events unavailable (%s); XIDs are not counted until a set can be made", exc)
            logged.add(-1)
            return None
        by_address: dict[int, int] = {}
        for i, dev in enumerate(self._devices):
            if i in skip:
                continue
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(dev.handle)
                if not supported & pynvml.nvmlEventTypeXidCriticalError:
                    if i not in logged:
                        log.info("GPU %d: XID events not supported", dev.identity.index)
                    logged.add(i)
                    continue
                pynvml.nvmlDeviceRegisterEvents(dev.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                by_address[ctypes.cast(dev.handle, ctypes.c_void_p).value or 0] = i
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    skip.add(i)
                if i not in logged:
                    log.warning("GPU %d: cannot register for XID events (%s)", dev.identity.index, exc)
                logged.add(i)
        return event_set, by_address

    def _lost_handles(self) -> set[int]:
        """The GPUs whose handle answers GPU_IS_LOST now (a cheap query per GPU)."""
        lost = set()
        for i, dev in enumerate(self._devices):
            try:
                pynvml.nvmlDeviceGetIndex(dev.handle)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    lost.add(i)
        return lost

    def _listen(self, on_xid: Callable[[int, int], None], wait_ms: int, stop: threading.Event) -> None:
        logged: set[int] = set()
        skip: set[int] = set()  # GPUs left out of the set: lost when it was built
        event_set: Any = None
        by_address: dict[int, int] = {}
        rebuild_at = 0.0  # when to build the set (again): at once at first
        backoff = 1.0
        failing = False
        while not stop.is_set():
            if self._events_rebuild.is_set():  # GPUs joined: into the set now
                self._events_rebuild.clear()
                rebuild_at = 0.0
            if event_set is None or time.monotonic() >= rebuild_at:
                if event_set is not None:
                    self._free(event_set)
                    event_set = None
                skip = self._lost_handles()
                built = self._event_set(skip, logged)
                if built is None:  # retried with a growing pause, never given up
                    stop.wait(backoff)
                    backoff = min(backoff * 2, self.EVENT_REBUILD_SECONDS)
                    rebuild_at = 0.0
                    continue
                event_set, by_address = built
                backoff = 1.0
                rebuild_at = time.monotonic() + self.EVENT_REBUILD_SECONDS if skip else float("inf")
            if not by_address:  # nothing to wait on: sleep (until a left-out GPU may be back), never spin
                stop.wait(max(0.0, rebuild_at - time.monotonic()) if skip else None)
                continue
            try:
                data = pynvml.nvmlEventSetWait(event_set, wait_ms)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:  # a new set without the lost GPU(s), at once
                    lost = self._lost_handles()
                    log.warning("NVML event wait: %s (%s); listening to the other GPUs, and to it again once it "
                                "answers", "GPU " + ", ".join(str(self._devices[i].identity.index)
                                                              for i in sorted(lost)) + " lost" if lost else
                                "a GPU is lost", exc)
                    if not lost:  # none says which: rebuilt without those whose registration fails, at most 1/s
                        stop.wait(1.0)
                    rebuild_at = 0.0
                    continue
                if not failing:
                    log.warning("NVML event wait failed: %s (retrying quietly)", exc)
                failing = True
                stop.wait(1.0)
                continue
            failing = False
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                i = by_address.get(ctypes.cast(data.device, ctypes.c_void_p).value or 0)
                if i is not None:
                    on_xid(i, int(data.eventData))
        if event_set is not None:
            self._free(event_set)

    @staticmethod
    def _free(event_set: Any) -> None:
        try:
            pynvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError:
            pass
