"""Every exported metric, declared once: name, type, unit, help, labels, and where its
values come from. Per-GPU metrics carry the labels ``gpu`` (index) and ``uuid`` first,
then their own. A value that is ``None`` (unsupported, failed, dropped) yields no series.

The default set is what a fleet needs (the dashboards, the alert rules, the DCGM names):
49 series per GPU on average (bench/scrape_bench.py). ``metrics.detail: true`` adds the families and label values marked
``detail`` here (every temperature step, every clock-event reason, parameter bands, static
limits): 108 per GPU. docs/metrics.md lists what each family costs.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from gpuwear.health import STATUS_ORDER
from gpuwear.sample import CLOCK_EVENT_REASONS, pcie_downgraded
from gpuwear.sampler import GpuStatus, Snapshot
from gpuwear.tracker import BASIC_CYCLE_RANGES, BASIC_THRESHOLDS, CYCLE_LABELS, WearView

Series = list[tuple[tuple[str, ...], float]]
T = TypeVar("T")
GPU_LABELS = ("gpu", "uuid")


@dataclass(frozen=True)
class One(Generic[T]):
    """The series of a family without labels of its own: one from a source, none when ``value`` gives None. The
    encoder calls ``value`` itself (no list or tuple per series)."""

    value: Callable[[T], float | None]

    def __call__(self, source: T) -> Series:
        v = self.value(source)
        return [((), float(v))] if v is not None else []


@dataclass(frozen=True)
class MetricDef(Generic[T]):
    """One metric family. ``kind``: gauge, counter or info (a gauge of value 1). ``values``
    reads the series from a source: the daemon's published state, a GPU's status, or a
    GPU's wear view; per-GPU series get the ``gpu`` and ``uuid`` labels first. ``detail``:
    exported only with ``metrics.detail``; ``basic``: without it, only these label values."""

    name: str
    kind: str
    unit: str
    help: str
    labels: tuple[str, ...]
    values: Callable[[T], Series]
    detail: bool = False
    basic: frozenset[tuple[str, ...]] | None = None

    def selected(self, detail: bool) -> MetricDef[T] | None:
        """This family as exported with or without ``metrics.detail`` (None: not exported)."""
        if detail:
            return self
        if self.detail:
            return None
        if self.basic is None:
            return self
        values, allowed = self.values, self.basic
        return replace(self, values=lambda source: [kv for kv in values(source) if kv[0] in allowed])


@dataclass(frozen=True)
class DaemonInfo:
    """Facts about this daemon process, for the daemon-level metrics."""

    version: str
    python_version: str
    backend: str  # "nvml" or "simulated"
    scenario: str  # the simulated scenario, "" on real GPUs


@dataclass(frozen=True)
class LedgerStatus:
    """The wear ledger's persistence, for the self-metrics."""

    last_success: bool | None  # None before the first save
    last_success_wall: float | None  # Unix time of the last successful save
    failures: int  # failed saves since start
    moved_aside: bool  # the ledger found at start was damaged: recovered, the damaged file kept beside it
    set_aside: int = 0  # records (or values of records) that failed validation at start, set aside


@dataclass(frozen=True)
class MissingGpu:
    """A GPU this host's ledger holds that NVML does not list now."""

    uuid: str
    name: str
    last_seen: float | None  # Unix s
    pci_bus_id: str | None = None  # as NVML gave it when the GPU was last seen


@dataclass(frozen=True)
class Published:
    """Everything a scrape reads: each part an immutable object published by its owner."""

    snapshot: Snapshot
    wear: Mapping[str, WearView]  # by GPU UUID
    ledger: LedgerStatus | None
    info: DaemonInfo
    missing: tuple[MissingGpu, ...] = ()  # by UUID
    # the NVIDIA GPUs on the PCI bus, bound to the nvidia driver, that NVML does not list (sysfs addresses); None
    # when the bus is not read (health.host_root off, simulated GPUs) or cannot be
    unlisted: tuple[str, ...] | None = None
    # whether the kernel log (health.kernel_log) is being followed now (False: it cannot be read, and is tried
    # again); None when it is off
    kernel_log_following: bool | None = None
    # OTLP pushes (otlp: gpuwear.otlp.push) the collector took and that failed since start; None when OTLP is off
    otlp_pushes: tuple[int, int, int] | None = None  # ok, failed, partial




def _only(*values: str) -> frozenset[tuple[str, ...]]:
    return frozenset((v,) for v in values)


# the clock-event reasons exported by default: the card protecting itself from heat or a power limit (the others,
# gpu_idle, applications_clocks_setting, sync_boost, display_clock_setting and the catch-all hw_slowdown, are detail)
PROTECTING = _only("sw_power_cap", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def _sample_field(attr: str) -> Callable[[GpuStatus], Series]:
    def value(status: GpuStatus) -> float | None:
        return getattr(status.sample, attr, None) if status.sample else None

    return One(value)


def _labelled(pairs: tuple[tuple[str, str], ...]) -> Callable[[GpuStatus], Series]:
    """One series per (label value, sample field) pair."""
    def values(status: GpuStatus) -> Series:
        sample = status.sample
        if sample is None:
            return []
        return [((label,), float(value)) for label, attr in pairs if (value := getattr(sample, attr)) is not None]

    return values


def _per_fan(attr: str) -> Callable[[GpuStatus], Series]:
    def values(status: GpuStatus) -> Series:
        speeds = getattr(status.sample, attr, None) if status.sample else None
        return [((str(fan),), value) for fan, value in enumerate(speeds or ()) if value is not None]

    return values


def _reasons(status: GpuStatus) -> Series:
    bits = status.sample.clock_event_reasons if status.sample else None
    if bits is None:
        return []
    return [((name,), 1.0 if bits & bit else 0.0) for name, bit in CLOCK_EVENT_REASONS]


def _unavailable(status: GpuStatus) -> Series:
    counts: dict[str, int] = {}
    for reason in status.unavailable.values():
        counts[reason] = counts.get(reason, 0) + 1
    return [((reason,), float(counts[reason])) for reason in sorted(counts)]


_NVLINK_KINDS = {"nvlink_crc_flit_errors": "crc_flit", "nvlink_crc_data_errors": "crc_data",
                 "nvlink_replay_errors": "replay", "nvlink_recovery_errors": "recovery"}


def _nvlink_states(status: GpuStatus) -> Series:
    states = status.sample.nvlink_link_states if status.sample else None
    return [((str(link),), float(up)) for link, up in enumerate(states or ())]


def _nvlink_links(status: GpuStatus) -> Series:
    counts = status.sample.nvlink_link_errors if status.sample else None
    return [((str(link), _NVLINK_KINDS.get(field, field)), float(n)) for link, field, n in counts or ()]


def _pcie_downgraded(status: GpuStatus) -> float | None:
    down = pcie_downgraded(status.sample) if status.sample is not None else None
    return None if down is None else float(down)


def _info(status: GpuStatus) -> Series:
    i = status.identity
    return [((i.name, i.serial or "", i.pci_bus_id or "", i.architecture or "", i.cuda_capability or ""), 1.0)]


def _value(value: Callable[[T], float | None]) -> Callable[[T], Series]:
    """One unlabelled series from a source, none when the value is None."""
    return One(value)


def _counts(attr: str) -> Callable[[GpuStatus], Series]:
    def values(status: GpuStatus) -> Series:
        return [((str(key),), float(count)) for key, count in sorted(getattr(status, attr).items())]

    return values


GPU_METRICS: tuple[MetricDef[GpuStatus], ...] = (
    MetricDef("gpuwear_gpu_info", "info", "", "GPU identity (nvmlDeviceGetName, GetSerial, GetPciInfo, "
       "GetArchitecture, GetCudaComputeCapability); value 1.",
       ("name", "serial", "pci_bus_id", "architecture", "cuda_capability"), _info),
    MetricDef("gpuwear_gpu_up", "gauge", "", "1 when the GPU answered the last read, 0 once it is lost "
       "(NVML_ERROR_GPU_IS_LOST).", (), _value(lambda s: 1.0 if s.up else 0.0)),
    MetricDef("gpuwear_memory_total_bytes", "gauge", "bytes", "Total framebuffer memory "
       "(nvmlDeviceGetMemoryInfo total).", (), _value(lambda s: s.identity.memory_total_bytes)),
    MetricDef("gpuwear_fans", "gauge", "", "Number of fans (nvmlDeviceGetNumFans); 0 on passive cards.", (),
       _value(lambda s: s.identity.fan_count), detail=True),
    MetricDef("gpuwear_temperature_celsius", "gauge", "celsius", "Temperature by sensor: gpu "
       "(nvmlDeviceGetTemperature) and memory/HBM (field NVML_FI_DEV_MEMORY_TEMP).", ("sensor",),
       _labelled((("gpu", "temperature_gpu_celsius"), ("memory", "temperature_memory_celsius")))),
    MetricDef("gpuwear_temperature_threshold_celsius", "gauge", "celsius", "The device's own temperature "
       "thresholds (nvmlDeviceGetTemperatureThreshold; where it does not give them, from the margin temperature "
       "and NVML's T.Limit fields).", ("threshold",),
       _labelled((("shutdown", "threshold_shutdown_celsius"), ("slowdown", "threshold_slowdown_celsius"),
                  ("gpu_max", "threshold_gpu_max_celsius"), ("memory_max", "threshold_memory_max_celsius"))),
       basic=_only("slowdown", "gpu_max", "memory_max")),
    MetricDef("gpuwear_temperature_margin_celsius", "gauge", "celsius", "The die's distance to its nearest "
       "slowdown threshold, negative past it (nvmlDeviceGetMarginTemperature: R570+, Hopper and newer).", (),
       _sample_field("temperature_margin_celsius"), detail=True),
    MetricDef("gpuwear_power_watts", "gauge", "watts", "Power draw (nvmlDeviceGetPowerUsage).", (),
       _sample_field("power_watts")),
    MetricDef("gpuwear_power_limit_watts", "gauge", "watts", "Enforced power limit "
       "(nvmlDeviceGetEnforcedPowerLimit).", (), _sample_field("power_limit_watts")),
    MetricDef("gpuwear_power_default_limit_watts", "gauge", "watts", "Default power limit "
       "(nvmlDeviceGetPowerManagementDefaultLimit).", (), _sample_field("power_default_limit_watts")),
    MetricDef("gpuwear_energy_joules_total", "counter", "joules", "Energy consumed (field "
       "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION), continued across driver-reload resets (by default, "
       "gpuwear_lifetime_energy_joules_total counts the same energy).", (),
       _value(lambda s: s.energy_joules_total if s.sample else None), detail=True),
    MetricDef("gpuwear_fan_speed_ratio", "gauge", "ratio", "Fan speed as a share of its maximum "
       "(nvmlDeviceGetFanSpeed_v2 / 100); may exceed 1 on some boards.", ("fan",),
       _per_fan("fan_speed_ratio")),
    MetricDef("gpuwear_fan_speed_rpm", "gauge", "rpm", "Fan speed in revolutions per minute "
       "(nvmlDeviceGetFanSpeedRPM).", ("fan",), _per_fan("fan_speed_rpm")),
    MetricDef("gpuwear_clock_hertz", "gauge", "hertz", "Current clock (nvmlDeviceGetClockInfo).", ("clock",),
       _labelled((("graphics", "clock_graphics_hz"), ("sm", "clock_sm_hz"), ("memory", "clock_memory_hz"))),
       basic=_only("sm", "memory")),
    MetricDef("gpuwear_clock_max_hertz", "gauge", "hertz", "Maximum clock (nvmlDeviceGetMaxClockInfo; sm and "
       "memory by default, graphics with metrics.detail).",
       ("clock",), _labelled((("graphics", "clock_graphics_max_hz"), ("sm", "clock_sm_max_hz"),
                             ("memory", "clock_memory_max_hz"))), basic=_only("sm", "memory")),
    MetricDef("gpuwear_performance_state", "gauge", "", "Performance state, 0 (P0, maximum) to 15 "
       "(nvmlDeviceGetPerformanceState).", (), _sample_field("performance_state"), detail=True),
    MetricDef("gpuwear_clock_event_reason_active", "gauge", "", "1 while the reason holds the clocks down "
       "(nvmlDeviceGetCurrentClocksEventReasons); thermal and power reasons are the card "
       "protecting itself.", ("reason",), _reasons, basic=PROTECTING),
    MetricDef("gpuwear_violation_seconds_total", "counter", "seconds", "Time the clocks were held below "
       "the requested ones by a policy (nvmlDeviceGetViolationStatus).", ("policy",),
       _labelled((("power", "violation_power_seconds"), ("thermal", "violation_thermal_seconds"))), detail=True),
    MetricDef("gpuwear_utilization_ratio", "gauge", "ratio", "Share of the last sample period the GPU "
       "(kernels) or memory (reads/writes) was busy (nvmlDeviceGetUtilizationRates).", ("resource",),
       _labelled((("gpu", "utilization_gpu_ratio"), ("memory", "utilization_memory_ratio")))),
    MetricDef("gpuwear_memory_used_bytes", "gauge", "bytes", "Framebuffer memory used "
       "(nvmlDeviceGetMemoryInfo used).", (), _sample_field("memory_used_bytes")),
    MetricDef("gpuwear_mig_enabled", "gauge", "", "1 when MIG mode is enabled (nvmlDeviceGetMigMode).", (),
       _sample_field("mig_enabled"), detail=True),
    MetricDef("gpuwear_ecc_enabled", "gauge", "", "1 when ECC is enabled (nvmlDeviceGetEccMode).", (),
       _sample_field("ecc_enabled"), detail=True),
    MetricDef("gpuwear_ecc_errors_total", "counter", "", "ECC errors (fields NVML_FI_DEV_ECC_{SBE,DBE}_"
       "{VOL,AGG}_TOTAL); volatile counts reset on driver reload, aggregate ones persist.",
       ("error", "counter"),
       lambda s: [((e, c), float(v)) for e, c, v in (
           ("corrected", "volatile", s.sample.ecc_corrected_volatile if s.sample else None),
           ("uncorrected", "volatile", s.sample.ecc_uncorrected_volatile if s.sample else None),
           ("corrected", "aggregate", s.sample.ecc_corrected_aggregate if s.sample else None),
           ("uncorrected", "aggregate", s.sample.ecc_uncorrected_aggregate if s.sample else None))
           if v is not None],
       basic=frozenset({("uncorrected", "volatile"), ("corrected", "aggregate"), ("uncorrected", "aggregate")})),
    MetricDef("gpuwear_retired_pages", "gauge", "", "Retired framebuffer pages by cause "
       "(nvmlDeviceGetRetiredPages; pre-Ampere).", ("cause",),
       _labelled((("single_bit_ecc", "retired_pages_single_bit"),
                  ("double_bit_ecc", "retired_pages_double_bit")))),
    MetricDef("gpuwear_retired_pages_pending", "gauge", "", "1 when a page retirement waits for the next "
       "driver reload (nvmlDeviceGetRetiredPagesPendingStatus).", (), _sample_field("retired_pages_pending")),
    MetricDef("gpuwear_remapped_rows", "gauge", "", "Remapped memory rows by error type "
       "(nvmlDeviceGetRemappedRows; Ampere+).", ("error",),
       _labelled((("corrected", "remapped_rows_corrected"), ("uncorrected", "remapped_rows_uncorrected")))),
    MetricDef("gpuwear_remapped_rows_pending", "gauge", "", "1 when a row remap waits for a GPU reset "
       "(nvmlDeviceGetRemappedRows isPending).", (), _sample_field("remapped_rows_pending")),
    MetricDef("gpuwear_remapped_rows_failure", "gauge", "", "1 when a row remap failed: the GPU needs "
       "service (nvmlDeviceGetRemappedRows failureOccurred).", (), _sample_field("remapped_rows_failure")),
    MetricDef("gpuwear_pcie_replays_total", "counter", "", "PCIe replays (field "
       "NVML_FI_DEV_PCIE_REPLAY_COUNTER).", (), _sample_field("pcie_replays")),
    MetricDef("gpuwear_pcie_aer_errors_total", "counter", "", "PCIe errors the kernel's AER driver counted at the "
       "GPU's PCI function since boot, by severity (Linux sysfs aer_dev_correctable, aer_dev_nonfatal and "
       "aer_dev_fatal totals; health.host_root); absent where the kernel does not expose them.", ("severity",),
       _labelled((("correctable", "pcie_aer_correctable"), ("nonfatal", "pcie_aer_nonfatal"),
                  ("fatal", "pcie_aer_fatal"))), detail=True),
    MetricDef("gpuwear_pcie_link_downgraded", "gauge", "", "1 when the GPU's PCIe link trained below what the "
       "device and its slot allow: fewer lanes, or a lower generation while the GPU is busy (at idle the link "
       "slows down to save power by design); 0 otherwise (nvmlDeviceGet{Curr,Max}PcieLink{Width,Generation}).", (),
       _value(_pcie_downgraded)),
    MetricDef("gpuwear_pcie_link_width", "gauge", "", "PCIe lanes the link runs at (current) and the most the "
       "device and its slot allow (max) (nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkWidth).",
       ("link",), _labelled((("current", "pcie_link_width"), ("max", "pcie_link_width_max"))), detail=True),
    MetricDef("gpuwear_pcie_link_generation", "gauge", "", "PCIe generation the link runs at (current) and the "
       "highest the device and its slot allow (max) (nvmlDeviceGet{Curr,Max}PcieLinkGeneration).", ("link",),
       _labelled((("current", "pcie_link_generation"), ("max", "pcie_link_generation_max"))), detail=True),
    MetricDef("gpuwear_nvlink_links_active", "gauge", "", "NVLink links active now (nvmlDeviceGetNvLinkState, "
       "link after link); absent on a GPU without NVLink. A link that went down shows as a drop from its usual "
       "count (the alert compares with the last day's most).", (), _sample_field("nvlink_links_active")),
    MetricDef("gpuwear_nvlink_errors_total", "counter", "", "NVLink errors summed over the GPU's links, by kind "
       "(nvmlDeviceGetNvLinkErrorCounter: DL_CRC_FLIT, DL_CRC_DATA, DL_REPLAY, DL_RECOVERY; recovery by default, the "
       "others with metrics.detail: the verdict's bleeding_errors judges the CRC errors and replays); restart at a "
       "driver reload; absent on a GPU without NVLink.", ("error",),
       _labelled((("crc_flit", "nvlink_crc_flit_errors"), ("crc_data", "nvlink_crc_data_errors"),
                  ("replay", "nvlink_replay_errors"), ("recovery", "nvlink_recovery_errors"))),
       basic=_only("recovery")),
    MetricDef("gpuwear_nvlink_link_up", "gauge", "", "1 when the NVLink link is active, 0 when not, link by link "
       "(nvmlDeviceGetNvLinkState); absent on a GPU without NVLink.", ("link",), _nvlink_states, detail=True),
    MetricDef("gpuwear_nvlink_link_errors_total", "counter", "", "NVLink errors of each link, by kind "
       "(nvmlDeviceGetNvLinkErrorCounter), where the driver answers them: which link, cable or NVSwitch port "
       "gpuwear_nvlink_errors_total comes from.", ("link", "error"), _nvlink_links, detail=True),
    MetricDef("gpuwear_recovery_action", "gauge", "", "Recovery the driver asks for (field "
       "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.",
       (), _sample_field("recovery_action")),
    MetricDef("gpuwear_power_smoothing_life_ratio", "gauge", "ratio", "The share of its rated life the GPU's "
       "power-smoothing circuitry has left (field NVML_FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING, "
       "R570+; Blackwell and newer datacenter boards): one circuit, not the card's life.", (),
       _value(lambda s: s.sample.power_smoothing_life_percent / 100
              if s.sample and s.sample.power_smoothing_life_percent is not None else None), detail=True),
    MetricDef("gpuwear_xid_events_total", "counter", "", "XID (critical error) events by code, from the "
       "NVML event set and the driver's lines in the kernel log (health.kernel_log; XID 79, 119 and 120 only there), "
       "one told by both counted once, since the daemon started; the kernel log is read on from where the last run "
       "stopped, so an XID logged while the daemon was stopped (one that made it restart, one at boot) counts in the "
       "run that reads it. Per code: metrics.detail (by default gpuwear_xid_tier_events_total counts them by "
       "alert over the GPU's life).", ("xid",), _counts("xids"), detail=True),
    MetricDef("gpuwear_xid_last", "gauge", "", "The code of the last XID event since the daemon started (what "
       "dcgm-exporter's DCGM_FI_DEV_XID_ERRORS gives); absent before the first.", (),
       _value(lambda s: s.last_xid)),
    MetricDef("gpuwear_sample_success", "gauge", "", "1 when the last read of the GPU had no error and gave "
       "at least one reading; 0 when it failed or the GPU yields nothing.", (),
       _value(lambda s: 1.0 if s.last_success else 0.0)),
    MetricDef("gpuwear_readings_unavailable", "gauge", "", "Readings the GPU cannot give, by reason: "
       "not_supported, no_permission (an unprivileged daemon), function_not_found (an older driver), "
       "unknown_field (a field id the driver does not know), binding_error (nvidia-ml-py does not fit this "
       "driver), module_scope (a Grace superchip's module energy counter: power is integrated instead). Not a "
       "sampling failure. not_supported, what every board has, with metrics.detail.", ("reason",), _unavailable,
       basic=_only("no_permission", "function_not_found", "unknown_field", "binding_error", "module_scope")),
    MetricDef("gpuwear_sample_duration_seconds", "gauge", "seconds", "Wall time the last read of the GPU "
       "took.", (), _value(lambda s: s.last_duration_seconds)),
    MetricDef("gpuwear_sample_timestamp_seconds", "gauge", "seconds", "Unix time of the last successful "
       "sample of the GPU.", (), _value(lambda s: s.sample.timestamp if s.sample else None), detail=True),
    MetricDef("gpuwear_sample_errors_total", "counter", "", "Failed NVML reads by error kind.", ("kind",),
       _counts("errors")),
    MetricDef("gpuwear_readings_dropped_total", "counter", "", "Readings dropped as outside the physical "
       "range, by sample field.", ("field",), _counts("dropped")),
)


def _ledger(value: Callable[[LedgerStatus], float | None]) -> Callable[[Published], Series]:
    def of(pub: Published) -> float | None:
        return value(pub.ledger) if pub.ledger is not None else None

    return One(of)


DAEMON_METRICS: tuple[MetricDef[Published], ...] = (
    MetricDef("gpuwear_build_info", "info", "", "gpuwear build; value 1.",
                    ("version", "python_version"),
                    lambda pub: [((pub.info.version, pub.info.python_version), 1.0)]),
    MetricDef("gpuwear_backend_info", "info", "", "Where the samples come from: backend "
                    "\"nvml\" (real GPUs) or \"simulated\" (simulated GPUs, not real hardware); value 1.",
                    ("backend", "scenario"), lambda pub: [((pub.info.backend, pub.info.scenario), 1.0)]),
    MetricDef("gpuwear_driver_info", "info", "", "NVIDIA driver, NVML and CUDA driver versions "
                    "(nvmlSystemGetDriverVersion, GetNVMLVersion, GetCudaDriverVersion); value 1.",
                    ("driver_version", "nvml_version", "cuda_driver_version"),
                    lambda pub: [((pub.snapshot.system.driver_version, pub.snapshot.system.nvml_version,
                                   pub.snapshot.system.cuda_driver_version), 1.0)] if pub.snapshot.system else []),
    MetricDef("gpuwear_gpus", "gauge", "", "GPUs the daemon knows.", (),
                    lambda pub: [((), float(len(pub.snapshot.gpus)))]),
    MetricDef("gpuwear_gpus_missing", "gauge", "", "GPUs this host's ledger holds that NVML does not list now "
                    "(fallen off the bus before a start, kept away by a cgroup, taken out): each stays missing until "
                    "it comes back or `gpuwear forget UUID` retires it.", (),
                    lambda pub: [((), float(len(pub.missing)))]),
    MetricDef("gpuwear_gpu_missing_last_seen_timestamp_seconds", "gauge", "seconds", "Unix time a missing GPU "
                    "was last seen (gpuwear_gpus_missing), by UUID; absent when none is missing.", ("uuid",),
                    lambda pub: [((m.uuid,), m.last_seen) for m in pub.missing if m.last_seen is not None]),
    MetricDef("gpuwear_gpu_not_enumerated", "gauge", "", "1 for each NVIDIA GPU on the PCI bus, bound to the "
                    "nvidia driver and visible to this process, that NVML does not list (the driver could not bring "
                    "it up: the kernel log says why), by PCI address (Linux sysfs, health.host_root); absent when "
                    "there is none or the bus is not read.", ("pci_address",),
                    lambda pub: [((address,), 1.0) for address in pub.unlisted or ()]),
    MetricDef("gpuwear_nvswitch_sxid_events_total", "counter", "", "SXid lines of this host's NVSwitches in the "
                    "kernel log since start (health.kernel_log), by the driver's severity (fatal, non_fatal): errors "
                    "of the NVLink fabric, which name no GPU; absent until one is seen.", ("severity",),
                    lambda pub: [((severity,), float(n)) for severity, n in sorted(pub.snapshot.sxids.items())]),
    MetricDef("gpuwear_xid_unlisted_events_total", "counter", "", "XID lines of the kernel log since start for a "
                    "PCI address NVML does not list here (before NVML opened, or a GPU the driver could not bring "
                    "up: gpuwear_gpu_not_enumerated): the host's, counted for no GPU; absent until one.", (),
                    lambda pub: [((), float(pub.snapshot.unlisted_xids))] if pub.snapshot.unlisted_xids else []),
    MetricDef("gpuwear_kernel_log_following", "gauge", "", "1 while the kernel log (health.kernel_log) is being "
                    "followed for XID and SXid lines, 0 while it cannot be read (tried again with back-off; XIDs then "
                    "come from NVML's events alone, which do not report 79, 119 or 120; /healthz says why); absent "
                    "when it is off.", (),
                    lambda pub: [] if pub.kernel_log_following is None else [((), float(pub.kernel_log_following))]),
    MetricDef("gpuwear_otlp_pushes_total", "counter", "", "OTLP pushes since start (otlp in config), by result: ok "
                    "(the collector took it), partial (it took it but rejected some data points: OTLP's partial "
                    "success, over HTTP) or failed (refused, unreachable, past otlp.timeout_seconds: dropped, the "
                    "next push sends the state then); absent when OTLP is off.", ("result",),
                    lambda pub: [] if pub.otlp_pushes is None else [
                        (("ok",), float(pub.otlp_pushes[0])), (("failed",), float(pub.otlp_pushes[1])),
                        (("partial",), float(pub.otlp_pushes[2]))]),
    MetricDef("gpuwear_sampler_ticks_total", "counter", "", "Sampling ticks completed.", (),
                    lambda pub: [((), float(pub.snapshot.ticks))]),
    MetricDef("gpuwear_ledger_persist_success", "gauge", "", "1 when the last save of the wear ledger "
                    "succeeded, 0 when it failed (disk full, read-only state directory); absent before the first.",
                    (), _ledger(lambda st: None if st.last_success is None else float(st.last_success))),
    MetricDef("gpuwear_ledger_last_persist_timestamp_seconds", "gauge", "seconds", "Unix time of the last "
                    "successful save of the wear ledger.", (), _ledger(lambda st: st.last_success_wall)),
    MetricDef("gpuwear_ledger_persist_failures_total", "counter", "", "Failed saves of the wear ledger "
                    "since start.", (), _ledger(lambda st: st.failures)),
    MetricDef("gpuwear_ledger_moved_aside", "gauge", "", "1 when the ledger found at start was damaged: what "
                    "SQLite could still read was recovered into a new ledger, the damaged file moved aside beside it "
                    "(ledger.sqlite.damaged-TIME).", (),
                    _ledger(lambda st: float(st.moved_aside))),
    MetricDef("gpuwear_ledger_set_aside_records", "gauge", "", "Records of the ledger (or values of a GPU's "
                    "record) that failed validation at start and were set aside (its set_aside table), the rest of "
                    "the history kept.", (), _ledger(lambda st: float(st.set_aside))),
)


def _wear_map(attr: str) -> Callable[[WearView], Series]:
    def values(v: WearView) -> Series:
        return [((key if isinstance(key, tuple) else (key,)), float(x)) for key, x in sorted(getattr(v, attr).items())]

    return values


def _bands(estimate: str, scale: float = 1.0) -> Callable[[WearView], Series]:
    def values(v: WearView) -> Series:
        e = v.estimates[estimate]
        memory = e.get("memory", {})
        out: Series = []
        for band in ("low", "central", "high"):
            if band in e:
                out.append((("gpu", band), e[band] * scale))
            if band in memory:
                out.append((("memory", band), memory[band] * scale))
        return out

    return values


def _fans(index: int) -> Callable[[WearView], Series]:
    def values(v: WearView) -> Series:
        return [((str(fan),), pair[index]) for fan, pair in enumerate(v.fans)]

    return values


def _status(v: WearView) -> Series:
    now = v.verdict["status"]
    return [((status,), 1.0 if now == status else 0.0) for status in STATUS_ORDER]


_XID_REASON = re.compile(r"xid_\d+")


def _reasons_active(v: WearView) -> Series:
    worst: dict[str, str] = {}
    for r in v.verdict["reasons"]:
        code = "xid_N" if _XID_REASON.fullmatch(r["code"]) else r["code"]
        if code not in worst or STATUS_ORDER.index(r["severity"]) > STATUS_ORDER.index(worst[code]):
            worst[code] = r["severity"]
    return [((code, severity), 1.0) for code, severity in worst.items()]


WEAR_METRICS: tuple[MetricDef[WearView], ...] = (
    MetricDef("gpuwear_lifetime_observed_seconds_total", "counter", "seconds", "Time the GPU was observed "
                  "(integrated samples), over its whole life in the ledger.", (),
                  _value(lambda v: v.observed_seconds)),
    MetricDef("gpuwear_lifetime_busy_seconds_total", "counter", "seconds", "Observed time with GPU utilization "
                  "at or above wear.busy_utilization_ratio.", (), _value(lambda v: v.busy_seconds), detail=True),
    MetricDef("gpuwear_lifetime_down_seconds_total", "counter", "seconds", "Time the GPU was lost (off the bus) "
                  "while the daemon ran.", (), _value(lambda v: v.down_seconds), detail=True),
    MetricDef("gpuwear_lifetime_unobserved_seconds_total", "counter", "seconds", "Time since first seen that "
                  "was not observed (daemon stopped, sample gaps); never extrapolated.", (),
                  _value(lambda v: v.gap_seconds), detail=True),
    MetricDef("gpuwear_lifetime_coverage_ratio", "gauge", "ratio", "Observed share of the time since the GPU "
                  "was first seen.", (), _value(lambda v: v.coverage)),
    MetricDef("gpuwear_lifetime_energy_joules_total", "counter", "joules", "Energy used over the observed life "
                  "(NVML energy counter deltas, else integrated power).", (), _value(lambda v: v.energy_joules)),
    MetricDef("gpuwear_lifetime_error_events_total", "counter", "", "Corrected ECC errors, PCIe replays, NVLink CRC "
                  "errors and replays, rows remapped for correctable errors and NVML reads past the deadline "
                  "(nvml_stalls), by the load the GPU was under (utilization at or above 10 %: loaded), over its life; "
                  "divided by the seconds of the next family, the rates the verdict's bleeding_errors and "
                  "stalled_calls judge.", ("counter", "load"),
                  lambda v: [(key, e) for key, (e, _) in sorted(v.errors.items())], detail=True),
    MetricDef("gpuwear_lifetime_error_watched_seconds_total", "counter", "seconds", "Observed time each error "
                  "counter was read, by load.", ("counter", "load"),
                  lambda v: [(key, s) for key, (_, s) in sorted(v.errors.items())], detail=True),
    MetricDef("gpuwear_lifetime_power_limit_seconds_total", "counter", "seconds", "Observed time at or above "
                  "99 % of the enforced power limit.", (), _value(lambda v: v.power_limit_seconds)),
    MetricDef("gpuwear_lifetime_throttle_seconds_total", "counter", "seconds", "Observed time with each "
                  "clock-event (throttle) reason active.", ("reason",), _wear_map("throttle_seconds"),
                  basic=PROTECTING),
    MetricDef("gpuwear_lifetime_temperature_above_seconds_total", "counter", "seconds", "Observed time at or "
                  "above a temperature, by sensor (from the time-at-temperature histogram, 1 degree Celsius bins).",
                  ("sensor", "celsius"), _wear_map("above_celsius"), detail=True),
    MetricDef("gpuwear_lifetime_threshold_above_seconds_total", "counter", "seconds", "Observed time at or "
                  "above the device's own thresholds (slowdown, gpu_max on the die; memory_max on memory).",
                  ("sensor", "threshold"), _wear_map("above_threshold"),
                  basic=BASIC_THRESHOLDS),
    MetricDef("gpuwear_lifetime_thermal_cycles_total", "counter", "", "Closed rainflow thermal cycles (ASTM "
                  "E1049, half cycles 0.5) by temperature range in degrees Celsius.", ("sensor", "range"),
                  _wear_map("cycles"),
                  basic=frozenset(("gpu", CYCLE_LABELS[i]) for i in BASIC_CYCLE_RANGES)),
    MetricDef("gpuwear_lifetime_fan_on_seconds_total", "counter", "seconds", "Time each fan turned.", ("fan",),
                  _fans(0)),
    MetricDef("gpuwear_lifetime_fan_revolutions_total", "counter", "", "Fan revolutions (measured RPM, else "
                  "speed ratio x wear.fan.rated_rpm).", ("fan",), _fans(1), detail=True),
    MetricDef("gpuwear_thermal_aging_equivalent_seconds", "gauge", "seconds", "Estimated thermal aging as time "
                  "at wear.arrhenius.reference_celsius (Arrhenius, JEDEC JEP122), per parameter band; an estimate, "
                  "not a measured remaining life.", ("sensor", "band"),
                  _bands("thermal_aging_equivalent_hours", 3600.0),
                  basic=frozenset({("gpu", "central"), ("memory", "central")})),
    MetricDef("gpuwear_cycle_fatigue_equivalent_cycles", "gauge", "", "Estimated thermal-cycle fatigue as "
                  "reference cycles (Coffin-Manson / Norris-Landzberg, Miner's rule), per parameter band; an "
                  "estimate.", ("sensor", "band"), _bands("cycle_fatigue_equivalent_cycles"),
                  basic=frozenset({("gpu", "central")})),
    MetricDef("gpuwear_thermal_resistance_celsius_per_watt", "gauge", "celsius_per_watt", "Die temperature "
                  "above idle per watt at steady high load, latest day (cooling-health proxy).", (),
                  _value(lambda v: v.thermal_resistance)),
    MetricDef("gpuwear_job_info", "info", "", "The job running on the GPU now (kind: slurm, kubernetes, "
                  "docker, container, systemd, session, process, simulated, unknown); user only when "
                  "jobs.user_in_metrics is on; a pod's namespace, name and container when the kubelet's "
                  "pod-resources API names them (as dcgm-exporter's labels); value 1. Job history is in "
                  "`gpuwear jobs`, not here.", ("job_kind", "job_id", "user", "namespace", "pod", "container"),
                  lambda v: [((j.kind, j.id, j.user or "", j.namespace or "", j.pod or "", j.container or ""), 1.0)
                             for j in v.jobs]),
    MetricDef("gpuwear_lifetime_attributed_seconds_total", "counter", "seconds", "Observed time split by "
                  "kind: while a job's processes ran on the GPU (job), while none did (idle), or while its processes "
                  "could not be read (unattributed: MIG without root, a vGPU guest; `gpuwear jobs` says why).",
                  ("kind",),
                  lambda v: [((k,), a[0]) for k, a in v.attributed.items()]),
    MetricDef("gpuwear_lifetime_attributed_energy_joules_total", "counter", "joules", "Energy split by kind "
                  "(job / idle / unattributed).", ("kind",),
                  lambda v: [((k,), a[1]) for k, a in v.attributed.items()]),
    MetricDef("gpuwear_attributed_thermal_aging_equivalent_seconds", "gauge", "seconds", "Estimated thermal "
                  "aging (central band) split by kind (job / idle / unattributed), as time at "
                  "wear.arrhenius.reference_celsius.",
                  ("kind",), lambda v: [((k,), a[2]) for k, a in v.attributed.items()]),
    MetricDef("gpuwear_xid_tier_events_total", "counter", "", "XID (critical error) events over the GPU's life in "
                  "the ledger (they outlive restarts; 0 until the first), by the alert NVIDIA's catalog gives their "
                  "code (health.xids): act (a GPU reset, a reboot or service: GpuwearXidCritical) and watch (restart "
                  "the application, contact support, or a code newer than the catalog: GpuwearXidWatch); the codes "
                  "the catalog says to ignore and those whose line decides (XID 74, 144-150: the verdict names them) "
                  "in neither. After a crash it can read less for a while than last scraped (events not yet saved, "
                  "taken again from the kernel log): read it as a level, as the shipped rules do, not with "
                  "increase(). Which code: gpuwear_xid_last, the verdict's reasons; since the daemon started, per "
                  "code: gpuwear_xid_events_total (metrics.detail).", ("tier",),
                  lambda v: [((tier,), n) for tier, n in sorted(v.xid_tiers.items())]),
    MetricDef("gpuwear_first_sight_timestamp_seconds", "gauge", "seconds", "Unix time gpuwear first read the GPU "
                  "(the ledger's first sight of it; its history before is the card's own).", (),
                  _value(lambda v: v.first_seen), detail=True),
    MetricDef("gpuwear_first_sight_reading", "gauge", "", "What the card carried when gpuwear first read it, by "
                  "reading: its lifetime counts (aggregate ECC errors, by location where it answers; retired pages; "
                  "remapped rows; memory banks with no spare rows left) and levels (the recovery action the driver "
                  "asked for; the power-smoothing circuit's life left, percent): the passport's \"before gpuwear\" "
                  "part (gpuwear passport), absent for a reading the card did not give then.", ("reading",),
                  _wear_map("carried"), detail=True),
    MetricDef("gpuwear_health_status", "gauge", "", "Health verdict on what the card reports: 1 for the current "
                  "status (ok, watch, act), 0 for the others (unknown, always 0, only with metrics.detail: what a "
                  "card cannot report is a reason of severity unknown).", ("status",), _status,
                  basic=_only("ok", "watch", "act")),
    MetricDef("gpuwear_health_reason", "gauge", "", "1 for each reason behind the verdict, by its rule's code (a "
                  "fixed set: the runbook's table; every XID's reason is xid_N, whatever its code), with the most "
                  "severe of its reasons; gpuwear report gives each reason and its words.", ("code", "severity"),
                  _reasons_active),
)


@dataclass(frozen=True)
class ProcessReading:
    """The daemon process's own figures, as prometheus_client's ProcessCollector reads them (from /proc/self/stat,
    the RLIMIT_NOFILE soft limit and /proc/self/fd)."""

    virtual_memory_bytes: float
    resident_memory_bytes: float
    start_time_seconds: float  # Unix time
    cpu_seconds: float  # user + system
    open_fds: float
    max_fds: float | None  # None: unlimited


# the standard process_* families, as ProcessCollector names, describes and orders them
PROCESS_METRICS: tuple[MetricDef[ProcessReading], ...] = tuple(
    MetricDef(name, kind, "", help, (), _value(operator.attrgetter(attr))) for name, kind, help, attr in (
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", "virtual_memory_bytes"),
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", "resident_memory_bytes"),
        ("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
         "start_time_seconds"),
        ("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", "cpu_seconds"),
        ("process_open_fds", "gauge", "Number of open file descriptors.", "open_fds"),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors.", "max_fds")))


@dataclass(frozen=True)
class Catalog:
    """The families one configuration exports (``metrics.detail`` on or off)."""

    daemon: tuple[MetricDef[Published], ...]
    gpu: tuple[MetricDef[GpuStatus], ...]
    wear: tuple[MetricDef[WearView], ...]

    def in_order(self) -> tuple[tuple[str, MetricDef[Any]], ...]:
        """Every family with its source ("daemon", "gpu" or "wear"), in the order of the exposition."""
        return (*(("daemon", m) for m in self.daemon), *(("gpu", m) for m in self.gpu),
                *(("wear", m) for m in self.wear))


@functools.cache
def catalog(detail: bool) -> Catalog:
    def pick(defs: tuple[MetricDef[T], ...]) -> tuple[MetricDef[T], ...]:
        return tuple(m for m in (d.selected(detail) for d in defs) if m is not None)

    return Catalog(pick(DAEMON_METRICS), pick(GPU_METRICS), pick(WEAR_METRICS))
