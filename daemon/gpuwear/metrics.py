"""Every exported metric, declared once: name, type, unit, help, labels, and where its
values come from. Per-GPU metrics carry the labels ``gpu`` (index) and ``uuid`` first,
then their own. A value that is ``None`` (unsupported, failed, dropped) yields no series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuwear.sampler import GpuStatus, Snapshot

Series = Iterable[tuple[tuple[str, ...], float]]
GPU_LABELS = ("gpu", "uuid")


@dataclass(frozen=True)
class MetricDef:
    """One metric family. ``kind``: gauge, counter or info (a gauge of value 1)."""

    name: str
    kind: str
    unit: str
    help: str
    labels: tuple[str, ...]
    values: Callable[[GpuStatus], Series]


@dataclass(frozen=True)
class DaemonInfo:
    """Facts about this daemon process, for the daemon-level metrics."""

    version: str
    python_version: str
    backend: str  # "nvml" or "simulated"
    scenario: str  # the simulated scenario, "" on real GPUs


@dataclass(frozen=True)
class DaemonMetricDef:
    name: str
    kind: str
    unit: str
    help: str
    labels: tuple[str, ...]
    values: Callable[[Snapshot, DaemonInfo], Series]


def _sample_field(attr: str) -> Callable[[GpuStatus], Series]:
    def values(status: GpuStatus) -> Series:
        value = getattr(status.sample, attr, None) if status.sample else None
        if value is not None:
            yield (), float(value)

    return values


def _labelled(pairs: tuple[tuple[str, str], ...]) -> Callable[[GpuStatus], Series]:
    """One series per (label value, sample field) pair."""
    def values(status: GpuStatus) -> Series:
        if status.sample is None:
            return
        for label, attr in pairs:
            value = getattr(status.sample, attr)
            if value is not None:
                yield (label,), float(value)

    return values


def _per_fan(attr: str) -> Callable[[GpuStatus], Series]:
    def values(status: GpuStatus) -> Series:
        speeds = getattr(status.sample, attr, None) if status.sample else None
        for fan, value in enumerate(speeds or ()):
            if value is not None:
                yield (str(fan),), value

    return values


# nvmlClocksEventReason* bits (nvml.h), by the label value used for them.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8), ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40), ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)


def _reasons(status: GpuStatus) -> Series:
    bits = status.sample.clock_event_reasons if status.sample else None
    if bits is not None:
        for name, bit in CLOCK_EVENT_REASONS:
            yield (name,), 1.0 if bits & bit else 0.0


def _info(status: GpuStatus) -> Series:
    i = status.identity
    yield (i.name, i.serial or "", i.pci_bus_id or "", i.architecture or "", i.cuda_capability or ""), 1.0


def _identity_value(value: Callable[[GpuStatus], float | None]) -> Callable[[GpuStatus], Series]:
    def values(status: GpuStatus) -> Series:
        v = value(status)
        if v is not None:
            yield (), float(v)

    return values


def _counts(attr: str) -> Callable[[GpuStatus], Series]:
    def values(status: GpuStatus) -> Series:
        for key, count in sorted(getattr(status, attr).items()):
            yield (str(key),), float(count)

    return values


def _m(name: str, kind: str, unit: str, help: str, labels: tuple[str, ...],
       values: Callable[[GpuStatus], Series]) -> MetricDef:
    return MetricDef(name, kind, unit, help, labels, values)


GPU_METRICS: tuple[MetricDef, ...] = (
    _m("gpuwear_gpu_info", "info", "", "GPU identity (nvmlDeviceGetName, GetSerial, GetPciInfo, "
       "GetArchitecture, GetCudaComputeCapability); value 1.",
       ("name", "serial", "pci_bus_id", "architecture", "cuda_capability"), _info),
    _m("gpuwear_gpu_up", "gauge", "", "1 when the GPU answered the last read, 0 once it is lost "
       "(NVML_ERROR_GPU_IS_LOST).", (), _identity_value(lambda s: 1.0 if s.up else 0.0)),
    _m("gpuwear_memory_total_bytes", "gauge", "bytes", "Total framebuffer memory "
       "(nvmlDeviceGetMemoryInfo total).", (), _identity_value(lambda s: s.identity.memory_total_bytes)),
    _m("gpuwear_fans", "gauge", "", "Number of fans (nvmlDeviceGetNumFans); 0 on passive cards.", (),
       _identity_value(lambda s: s.identity.fan_count)),
    _m("gpuwear_temperature_celsius", "gauge", "celsius", "Temperature by sensor: gpu "
       "(nvmlDeviceGetTemperature) and memory/HBM (field NVML_FI_DEV_MEMORY_TEMP).", ("sensor",),
       _labelled((("gpu", "temperature_gpu_celsius"), ("memory", "temperature_memory_celsius")))),
    _m("gpuwear_temperature_threshold_celsius", "gauge", "celsius", "The device's own temperature "
       "thresholds (nvmlDeviceGetTemperatureThreshold).", ("threshold",),
       _labelled((("shutdown", "threshold_shutdown_celsius"), ("slowdown", "threshold_slowdown_celsius"),
                  ("gpu_max", "threshold_gpu_max_celsius"), ("memory_max", "threshold_memory_max_celsius")))),
    _m("gpuwear_power_watts", "gauge", "watts", "Power draw (nvmlDeviceGetPowerUsage).", (),
       _sample_field("power_watts")),
    _m("gpuwear_power_limit_watts", "gauge", "watts", "Enforced power limit "
       "(nvmlDeviceGetEnforcedPowerLimit).", (), _sample_field("power_limit_watts")),
    _m("gpuwear_power_default_limit_watts", "gauge", "watts", "Default power limit "
       "(nvmlDeviceGetPowerManagementDefaultLimit).", (), _sample_field("power_default_limit_watts")),
    _m("gpuwear_energy_joules_total", "counter", "joules", "Energy consumed (field "
       "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION), continued across driver-reload resets.", (),
       _identity_value(lambda s: s.energy_joules_total if s.sample else None)),
    _m("gpuwear_fan_speed_ratio", "gauge", "ratio", "Fan speed as a share of its maximum "
       "(nvmlDeviceGetFanSpeed_v2 / 100); may exceed 1 on some boards.", ("fan",),
       _per_fan("fan_speed_ratio")),
    _m("gpuwear_fan_speed_rpm", "gauge", "rpm", "Fan speed in revolutions per minute "
       "(nvmlDeviceGetFanSpeedRPM).", ("fan",), _per_fan("fan_speed_rpm")),
    _m("gpuwear_clock_hertz", "gauge", "hertz", "Current clock (nvmlDeviceGetClockInfo).", ("clock",),
       _labelled((("graphics", "clock_graphics_hz"), ("sm", "clock_sm_hz"), ("memory", "clock_memory_hz")))),
    _m("gpuwear_clock_max_hertz", "gauge", "hertz", "Maximum clock (nvmlDeviceGetMaxClockInfo).",
       ("clock",), _labelled((("graphics", "clock_graphics_max_hz"), ("sm", "clock_sm_max_hz"),
                             ("memory", "clock_memory_max_hz")))),
    _m("gpuwear_performance_state", "gauge", "", "Performance state, 0 (P0, maximum) to 15 "
       "(nvmlDeviceGetPerformanceState).", (), _sample_field("performance_state")),
    _m("gpuwear_clock_event_reason_active", "gauge", "", "1 while the reason holds the clocks down "
       "(nvmlDeviceGetCurrentClocksEventReasons); thermal and power reasons are the card "
       "protecting itself.", ("reason",), _reasons),
    _m("gpuwear_violation_seconds_total", "counter", "seconds", "Time the clocks were held below "
       "the requested ones by a policy (nvmlDeviceGetViolationStatus).", ("policy",),
       _labelled((("power", "violation_power_seconds"), ("thermal", "violation_thermal_seconds")))),
    _m("gpuwear_utilization_ratio", "gauge", "ratio", "Share of the last sample period the GPU "
       "(kernels) or memory (reads/writes) was busy (nvmlDeviceGetUtilizationRates).", ("resource",),
       _labelled((("gpu", "utilization_gpu_ratio"), ("memory", "utilization_memory_ratio")))),
    _m("gpuwear_memory_used_bytes", "gauge", "bytes", "Framebuffer memory used "
       "(nvmlDeviceGetMemoryInfo used).", (), _sample_field("memory_used_bytes")),
    _m("gpuwear_mig_enabled", "gauge", "", "1 when MIG mode is enabled (nvmlDeviceGetMigMode).", (),
       _sample_field("mig_enabled")),
    _m("gpuwear_ecc_enabled", "gauge", "", "1 when ECC is enabled (nvmlDeviceGetEccMode).", (),
       _sample_field("ecc_enabled")),
    _m("gpuwear_ecc_errors_total", "counter", "", "ECC errors (fields NVML_FI_DEV_ECC_{SBE,DBE}_"
       "{VOL,AGG}_TOTAL); volatile counts reset on driver reload, aggregate ones persist.",
       ("error", "counter"),
       lambda s: (((e, c), float(v)) for e, c, v in (
           ("corrected", "volatile", s.sample.ecc_corrected_volatile if s.sample else None),
           ("uncorrected", "volatile", s.sample.ecc_uncorrected_volatile if s.sample else None),
           ("corrected", "aggregate", s.sample.ecc_corrected_aggregate if s.sample else None),
           ("uncorrected", "aggregate", s.sample.ecc_uncorrected_aggregate if s.sample else None))
           if v is not None)),
    _m("gpuwear_retired_pages", "gauge", "", "Retired framebuffer pages by cause "
       "(nvmlDeviceGetRetiredPages; pre-Ampere).", ("cause",),
       _labelled((("single_bit_ecc", "retired_pages_single_bit"),
                  ("double_bit_ecc", "retired_pages_double_bit")))),
    _m("gpuwear_retired_pages_pending", "gauge", "", "1 when a page retirement waits for the next "
       "driver reload (nvmlDeviceGetRetiredPagesPendingStatus).", (), _sample_field("retired_pages_pending")),
    _m("gpuwear_remapped_rows", "gauge", "", "Remapped memory rows by error type "
       "(nvmlDeviceGetRemappedRows; Ampere+).", ("error",),
       _labelled((("corrected", "remapped_rows_corrected"), ("uncorrected", "remapped_rows_uncorrected")))),
    _m("gpuwear_remapped_rows_pending", "gauge", "", "1 when a row remap waits for a GPU reset "
       "(nvmlDeviceGetRemappedRows isPending).", (), _sample_field("remapped_rows_pending")),
    _m("gpuwear_remapped_rows_failure", "gauge", "", "1 when a row remap failed: the GPU needs "
       "service (nvmlDeviceGetRemappedRows failureOccurred).", (), _sample_field("remapped_rows_failure")),
    _m("gpuwear_pcie_replays_total", "counter", "", "PCIe replays (field "
       "NVML_FI_DEV_PCIE_REPLAY_COUNTER).", (), _sample_field("pcie_replays")),
    _m("gpuwear_xid_events_total", "counter", "", "XID (critical error) events by code, from the "
       "NVML event set, since the daemon started.", ("xid",), _counts("xids")),
    _m("gpuwear_sample_success", "gauge", "", "1 when the last read of the GPU had no error.", (),
       _identity_value(lambda s: 1.0 if s.last_success else 0.0)),
    _m("gpuwear_sample_duration_seconds", "gauge", "seconds", "Wall time the last read of the GPU "
       "took.", (), _identity_value(lambda s: s.last_duration_seconds)),
    _m("gpuwear_sample_timestamp_seconds", "gauge", "seconds", "Unix time of the last successful "
       "sample of the GPU.", (), _identity_value(lambda s: s.sample.timestamp if s.sample else None)),
    _m("gpuwear_sample_errors_total", "counter", "", "Failed NVML reads by error kind.", ("kind",),
       _counts("errors")),
    _m("gpuwear_readings_dropped_total", "counter", "", "Readings dropped as outside the physical "
       "range, by sample field.", ("field",), _counts("dropped")),
)


DAEMON_METRICS: tuple[DaemonMetricDef, ...] = (
    DaemonMetricDef("gpuwear_build_info", "info", "", "gpuwear build; value 1.",
                    ("version", "python_version"),
                    lambda snap, info: [((info.version, info.python_version), 1.0)]),
    DaemonMetricDef("gpuwear_backend_info", "info", "", "Where the samples come from: backend "
                    "\"nvml\" (real GPUs) or \"simulated\" (simulated GPUs, not real hardware); value 1.",
                    ("backend", "scenario"), lambda snap, info: [((info.backend, info.scenario), 1.0)]),
    DaemonMetricDef("gpuwear_driver_info", "info", "", "NVIDIA driver, NVML and CUDA driver versions "
                    "(nvmlSystemGetDriverVersion, GetNVMLVersion, GetCudaDriverVersion); value 1.",
                    ("driver_version", "nvml_version", "cuda_driver_version"),
                    lambda snap, info: [((snap.system.driver_version, snap.system.nvml_version,
                                          snap.system.cuda_driver_version), 1.0)] if snap.system else []),
    DaemonMetricDef("gpuwear_gpus", "gauge", "", "GPUs the daemon knows.", (),
                    lambda snap, info: [((), float(len(snap.gpus)))]),
    DaemonMetricDef("gpuwear_sampler_ticks_total", "counter", "", "Sampling ticks completed.", (),
                    lambda snap, info: [((), float(snap.ticks))]),
)
