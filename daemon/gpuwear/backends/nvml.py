"""The NVML backend: the only module that imports ``pynvml`` (package nvidia-ml-py).

Reads are table-driven: each *reader* fills one or more :class:`GpuSample` fields from one
NVML call (or one batched ``nvmlDeviceGetFieldValues`` call). NOT_SUPPORTED and
FUNCTION_NOT_FOUND make the reader's fields ``None`` for good: logged once per GPU and
reader, then never polled again. GPU_IS_LOST aborts that GPU's read with
:class:`GpuLostError`; any other error is reported by kind and leaves the fields ``None`` for
that tick only.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuwear.sample import GpuIdentity, SystemInfo

log = logging.getLogger(__name__)

DEFAULT_LIBRARY = "libnvidia-ml.so.1"

ARCHITECTURES = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
    9: "hopper", 10: "blackwell",
}

ERROR_KINDS = {
    pynvml.NVML_ERROR_UNINITIALIZED: "uninitialized",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "invalid_argument",
    pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
    pynvml.NVML_ERROR_TIMEOUT: "timeout",
    pynvml.NVML_ERROR_IRQ_ISSUE: "irq_issue",
    pynvml.NVML_ERROR_CORRUPTED_INFOROM: "corrupted_inforom",
    pynvml.NVML_ERROR_RESET_REQUIRED: "reset_required",
    pynvml.NVML_ERROR_MEMORY: "memory",
    pynvml.NVML_ERROR_NO_DATA: "no_data",
    pynvml.NVML_ERROR_UNKNOWN: "unknown",
}
_UNSUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

Values = dict[str, Any]


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used on this machine; the message tells the user what to do."""


class GpuLostError(Exception):
    """The GPU answered NVML_ERROR_GPU_IS_LOST (fallen off the bus)."""


class NvmlDriverError(Exception):
    """NVML lost its driver (unloaded or reloaded): every handle must be acquired again."""


_DRIVER_GONE = (pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)


@dataclass
class Reading:
    """What one read of one GPU produced: field values and the kinds of errors met."""

    values: Values = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


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


# -- readers: handle -> {sample field: value in base units} ------------------------------


def _temperature(h: Any) -> Values:
    return {"temperature_gpu_celsius": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))}


def _threshold(kind: int, name: str) -> Callable[[Any], Values]:
    def read(h: Any) -> Values:
        return {name: float(pynvml.nvmlDeviceGetTemperatureThreshold(h, kind))}

    return read


def _power(h: Any) -> Values:
    return {"power_watts": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0}


def _power_limit(h: Any) -> Values:
    return {"power_limit_watts": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}


def _power_default_limit(h: Any) -> Values:
    return {"power_default_limit_watts": pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0}


def _clocks(maximum: bool) -> Callable[[Any], Values]:
    read = pynvml.nvmlDeviceGetMaxClockInfo if maximum else pynvml.nvmlDeviceGetClockInfo
    suffix = "_max_hz" if maximum else "_hz"

    def clocks(h: Any) -> Values:
        return {f"clock_{name}{suffix}": read(h, kind) * 1e6 for name, kind in
                (("graphics", pynvml.NVML_CLOCK_GRAPHICS), ("sm", pynvml.NVML_CLOCK_SM),
                 ("memory", pynvml.NVML_CLOCK_MEM))}

    return clocks


def _pstate(h: Any) -> Values:
    return {"performance_state": int(pynvml.nvmlDeviceGetPerformanceState(h))}


def _reasons(h: Any) -> Values:
    return {"clock_event_reasons": int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))}


def _violation(policy: int, name: str) -> Callable[[Any], Values]:
    def read(h: Any) -> Values:
        return {name: pynvml.nvmlDeviceGetViolationStatus(h, policy).violationTime / 1e9}

    return read


def _utilization(h: Any) -> Values:
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    return {"utilization_gpu_ratio": util.gpu / 100.0, "utilization_memory_ratio": util.memory / 100.0}


def _memory_used(h: Any) -> Values:
    return {"memory_used_bytes": float(pynvml.nvmlDeviceGetMemoryInfo(h).used)}


def _mig(h: Any) -> Values:
    return {"mig_enabled": pynvml.nvmlDeviceGetMigMode(h)[0] == pynvml.NVML_DEVICE_MIG_ENABLE}


def _ecc_mode(h: Any) -> Values:
    return {"ecc_enabled": pynvml.nvmlDeviceGetEccMode(h)[0] == pynvml.NVML_FEATURE_ENABLED}


def _retired_pages(h: Any) -> Values:
    return {
        "retired_pages_single_bit": len(pynvml.nvmlDeviceGetRetiredPages(
            h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
        "retired_pages_double_bit": len(pynvml.nvmlDeviceGetRetiredPages(
            h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
        "retired_pages_pending": bool(pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)),
    }


def _remapped_rows(h: Any) -> Values:
    corrected, uncorrected, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
    return {"remapped_rows_corrected": corrected, "remapped_rows_uncorrected": uncorrected,
            "remapped_rows_pending": bool(pending), "remapped_rows_failure": bool(failure)}


def _processes(h: Any) -> Values:
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    return {"processes": tuple((int(p.pid), None if p.usedGpuMemory is None else float(p.usedGpuMemory))
                               for p in procs)}


def _fan_rpm(h: Any, fan: int) -> int:
    """nvmlDeviceGetFanSpeedRPM for one fan (pynvml's wrapper only asks fan 0)."""
    info = pynvml.c_nvmlFanSpeedInfo_t()
    info.version = pynvml.nvmlFanSpeedInfo_v1
    info.fan = fan
    ret = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFanSpeedRPM")(h, ctypes.byref(info))
    pynvml._nvmlCheckReturn(ret)
    return int(info.speed)


@dataclass(frozen=True)
class Reader:
    key: str  # logged, and a per-GPU "unsupported" entry
    slow: bool
    read: Callable[[Any], Values]
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
    Reader("processes", False, _processes, ("processes",)),
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
    Reader("power_limit", True, _power_limit, ("power_limit_watts",)),
    Reader("power_default_limit", True, _power_default_limit, ("power_default_limit_watts",)),
    Reader("max_clocks", True, _clocks(True),
           ("clock_graphics_max_hz", "clock_sm_max_hz", "clock_memory_max_hz")),
    Reader("mig_mode", True, _mig, ("mig_enabled",)),
    Reader("ecc_mode", True, _ecc_mode, ("ecc_enabled",)),
    Reader("retired_pages", True, _retired_pages,
           ("retired_pages_single_bit", "retired_pages_double_bit", "retired_pages_pending")),
    Reader("remapped_rows", True, _remapped_rows,
           ("remapped_rows_corrected", "remapped_rows_uncorrected", "remapped_rows_pending",
            "remapped_rows_failure")),
)

# Batched reads through nvmlDeviceGetFieldValues: (field id, sample field, scale, slow).
FIELD_VALUES: tuple[tuple[int, str, float, bool], ...] = (
    (pynvml.NVML_FI_DEV_MEMORY_TEMP, "temperature_memory_celsius", 1.0, False),
    (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, "energy_joules", 1e-3, False),
    (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, "ecc_corrected_volatile", 1.0, True),
    (pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, "ecc_uncorrected_volatile", 1.0, True),
    (pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, "ecc_corrected_aggregate", 1.0, True),
    (pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, "ecc_uncorrected_aggregate", 1.0, True),
    (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, "pcie_replays", 1.0, True),
    (getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230), "recovery_action", 1.0, True),
)
_INTEGER_FIELDS = {"ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
                   "ecc_uncorrected_aggregate", "pcie_replays", "recovery_action"}
_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

# All sample fields a backend read can fill, for callers that need the full set.
ALL_FIELDS: tuple[str, ...] = (
    tuple(f for r in READERS for f in r.fields) + tuple(f[1] for f in FIELD_VALUES)
    + ("fan_speed_ratio", "fan_speed_rpm")
)


_Plan = tuple[tuple[Reader, ...], list[tuple[int, str, float, bool]], dict[str, None]]


class _Device:
    """Per-GPU state of the backend: the handle and what the GPU does not support."""

    def __init__(self, handle: Any, identity: GpuIdentity) -> None:
        self.handle = handle
        self.identity = identity
        self.unsupported: set[str] = set()
        self._plans: dict[bool, _Plan] = {}

    def plan(self, slow: bool) -> _Plan:
        """What a fast (or slow) read asks for: the supported readers and field values, and None for the
        fields of the unsupported ones; worked out again only after something turned out unsupported."""
        plan = self._plans.get(slow)
        if plan is None:
            readers = [r for r in READERS if slow or not r.slow]
            fields = [f for f in FIELD_VALUES if slow or not f[3]]
            plan = self._plans[slow] = (
                tuple(r for r in readers if r.key not in self.unsupported),
                [f for f in fields if f[1] not in self.unsupported],
                {**{name: None for r in readers if r.key in self.unsupported for name in r.fields},
                 **{f[1]: None for f in fields if f[1] in self.unsupported}})
        return plan

    def mark_unsupported(self, key: str) -> None:
        self.unsupported.add(key)
        self._plans.clear()


class NvmlBackend:
    """Reads GPUs through pynvml. ``library``: a path to libnvidia-ml, or a stand-in object
    with the same C functions (the fake library used by tests and ``--simulate``)."""

    def __init__(self, library: object | str = DEFAULT_LIBRARY) -> None:
        self._library = library
        self._devices: list[_Device] = []
        self._events_stop = threading.Event()
        self._events_thread: threading.Thread | None = None
        self._on_xid: Callable[[int, int], None] | None = None
        self._wait_ms = 500

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> list[GpuIdentity]:
        """Initialise NVML and enumerate the GPUs; raises :class:`NvmlUnavailableError`."""
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
            raise NvmlUnavailableError(f"NVML initialisation failed: {exc}; check that the NVIDIA "
                                  "driver is loaded (`nvidia-smi` should list the GPUs)") from None
        self._devices = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                self._devices.append(_Device(handle, self._identity(index, handle)))
            except pynvml.NVMLError as exc:
                log.error("GPU %d cannot be opened (%s); it is left out until the next start", index, exc)
        return [d.identity for d in self._devices]

    def reopen(self) -> list[GpuIdentity]:
        """After the driver came back (reload): initialise NVML again, acquire new handles and
        restart the event listener. Raises :class:`NvmlUnavailableError` while it is still gone."""
        self._stop_events()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
        identities = self.open()
        if self._on_xid is not None:
            self.start_events(self._on_xid, self._wait_ms)
        return identities

    def _stop_events(self) -> None:
        self._events_stop.set()
        if self._events_thread is not None:
            self._events_thread.join(timeout=2.0)
            self._events_thread = None

    def close(self) -> None:
        """Stop the event listener and shut NVML down."""
        self._stop_events()
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
        return GpuIdentity(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
            name=_text(pynvml.nvmlDeviceGetName(h)),
            serial=_text(serial) if serial else None,
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            architecture=ARCHITECTURES.get(arch, "unknown") if arch is not None else None,
            cuda_capability=f"{capability[0]}.{capability[1]}" if capability else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            fan_count=optional(lambda: pynvml.nvmlDeviceGetNumFans(h)) or 0,
        )

    # -- reading ------------------------------------------------------------------------

    def _unsupported(self, dev: _Device, key: str, exc: pynvml.NVMLError) -> None:
        dev.mark_unsupported(key)
        log.info("GPU %d (%s): %s not supported (%s); not polled again",
                 dev.identity.index, dev.identity.uuid, key, exc)

    def read(self, index: int, slow: bool) -> Reading:
        """Read the fast fields of GPU ``index`` (and the slow ones when ``slow``).

        Raises :class:`GpuLostError` when the GPU has fallen off the bus.
        """
        dev = self._devices[index]
        out = Reading()
        values, handle = out.values, dev.handle
        readers, wanted, unsupported = dev.plan(slow)
        values.update(unsupported)  # None, and never a slow read's old value
        for reader in readers:
            try:
                values.update(reader.read(handle))
            except pynvml.NVMLError as exc:
                self._failed(dev, reader.key, exc, out)
                values.update(dict.fromkeys(reader.fields))
        self._read_fields(dev, wanted, out)
        self._read_fans(dev, out)
        return out

    def _failed(self, dev: _Device, key: str, exc: pynvml.NVMLError, out: Reading) -> None:
        if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLostError(str(exc)) from None
        if exc.value in _DRIVER_GONE:
            raise NvmlDriverError(str(exc)) from None
        if exc.value in _UNSUPPORTED:
            self._unsupported(dev, key, exc)
        else:
            out.errors.append(error_kind(exc))

    def _read_fields(self, dev: _Device, wanted: list[tuple[int, str, float, bool]], out: Reading) -> None:
        if not wanted:
            return
        try:
            results = pynvml.nvmlDeviceGetFieldValues(dev.handle, [f[0] for f in wanted])
        except pynvml.NVMLError as exc:
            for _, name, _, _ in wanted:
                out.values[name] = None
            if exc.value in _UNSUPPORTED:  # no field values at all: record each field
                for _, name, _, _ in wanted:
                    self._unsupported(dev, name, exc)
            else:
                self._failed(dev, "field_values", exc, out)
            return
        for (_, name, scale, _), fv in zip(wanted, results, strict=False):
            out.values[name] = None
            if fv.nvmlReturn != pynvml.NVML_SUCCESS:
                self._failed(dev, name, pynvml.NVMLError(fv.nvmlReturn), out)
                continue
            raw = getattr(fv.value, _VALUE_MEMBERS.get(fv.valueType, "ullVal"))
            out.values[name] = int(raw) if name in _INTEGER_FIELDS else raw * scale

    def _read_fans(self, dev: _Device, out: Reading) -> None:
        fans = dev.identity.fan_count
        if fans == 0:
            return
        for key, read in (("fan_speed_ratio", lambda i: pynvml.nvmlDeviceGetFanSpeed_v2(dev.handle, i) / 100.0),
                          ("fan_speed_rpm", lambda i: float(_fan_rpm(dev.handle, i)))):
            if key in dev.unsupported:
                out.values[key] = None
                continue
            speeds: list[float | None] = []
            for i in range(fans):
                try:
                    speeds.append(read(i))
                except pynvml.NVMLError as exc:
                    self._failed(dev, key, exc, out)
                    speeds.append(None)
                    if key in dev.unsupported:
                        break
            out.values[key] = None if key in dev.unsupported else tuple(speeds)

    def persistence_mode(self, index: int) -> bool | None:
        """nvmlDeviceGetPersistenceMode; None when the GPU does not say (Windows, lost)."""
        try:
            return bool(pynvml.nvmlDeviceGetPersistenceMode(self._devices[index].handle) == pynvml.NVML_FEATURE_ENABLED)
        except pynvml.NVMLError:
            return None

    def unsupported(self, index: int) -> set[str]:
        """What this GPU answered NOT_SUPPORTED (or lacks) so far: reader keys and field names."""
        return set(self._devices[index].unsupported)

    # -- events -------------------------------------------------------------------------

    def start_events(self, on_xid: Callable[[int, int], None], wait_ms: int = 500) -> None:
        """Listen for XID (critical error) events on a thread of its own; ``on_xid(gpu, xid)``."""
        self._on_xid, self._wait_ms = on_xid, wait_ms
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("NVML events unavailable (%s); XIDs will not be counted", exc)
            return
        by_address: dict[int, int] = {}
        for i, dev in enumerate(self._devices):
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(dev.handle)
                if not supported & pynvml.nvmlEventTypeXidCriticalError:
                    log.info("GPU %d: XID events not supported", dev.identity.index)
                    continue
                pynvml.nvmlDeviceRegisterEvents(dev.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                by_address[ctypes.cast(dev.handle, ctypes.c_void_p).value or 0] = i
            except pynvml.NVMLError as exc:
                log.warning("GPU %d: cannot register for XID events (%s)", dev.identity.index, exc)

        def listen() -> None:
            failing = False
            while not self._events_stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait(event_set, wait_ms)
                except pynvml.NVMLError as exc:
                    if exc.value != pynvml.NVML_ERROR_TIMEOUT:
                        if not failing:
                            log.warning("NVML event wait failed: %s (retrying quietly)", exc)
                        failing = True
                        self._events_stop.wait(1.0)
                    continue
                failing = False
                if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    i = by_address.get(ctypes.cast(data.device, ctypes.c_void_p).value or 0)
                    if i is not None:
                        on_xid(i, int(data.eventData))
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError:
                pass

        self._events_stop.clear()
        self._events_thread = threading.Thread(target=listen, name="nvml-events", daemon=True)
        self._events_thread.start()
