"""One reading of one GPU, in base units. ``None`` means "not supported / not read"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class GpuIdentity:
    """What a GPU is; read once when the GPU is opened."""

    index: int  # nvmlDeviceGetHandleByIndex index (nvidia-smi "index")
    uuid: str  # nvmlDeviceGetUUID ("uuid"); the key of everything per GPU
    name: str  # nvmlDeviceGetName ("name")
    serial: str | None  # nvmlDeviceGetSerial ("serial"); GeForce boards have none
    pci_bus_id: str | None  # nvmlDeviceGetPciInfo_v3().busId ("pci.bus_id")
    architecture: str | None  # nvmlDeviceGetArchitecture, as a name ("hopper")
    cuda_capability: str | None  # nvmlDeviceGetCudaComputeCapability, "9.0"
    memory_total_bytes: int | None  # nvmlDeviceGetMemoryInfo().total ("memory.total")
    fan_count: int  # nvmlDeviceGetNumFans; 0 on passive cards
    virtualization_mode: int | None = None  # nvmlDeviceGetVirtualizationMode; None where the GPU does not say
    # its firmware (None where the card does not answer): nvmlDeviceGetVbiosVersion, nvmlDeviceGetInforomImageVersion,
    # nvmlDeviceGetInforomConfigurationChecksum, and nvmlDeviceValidateInforom (False: CORRUPTED_INFOROM)
    vbios: str | None = None
    inforom_image: str | None = None
    inforom_checksum: int | None = None
    inforom_valid: bool | None = None


FIRMWARE = ("vbios", "inforom_image", "inforom_checksum", "inforom_valid")  # GpuIdentity's, kept per card

# NVML_GPU_VIRTUALIZATION_MODE_VGPU: "Device is associated with vGPU inside virtual machine" (0: bare metal,
# 1: pass-through, 3 and 4: a hypervisor's view)
VGPU_GUEST = 2


@dataclass(frozen=True)
class SystemInfo:
    """Driver-wide facts: nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion,
    nvmlSystemGetCudaDriverVersion (as "12.6")."""

    driver_version: str
    nvml_version: str
    cuda_driver_version: str


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. Fields are grouped fast (every tick) and slow (polled less)."""

    timestamp: float  # wall clock, Unix seconds
    monotonic: float  # monotonic clock, seconds
    # temperatures, °C
    # nvmlDeviceGetTemperatureV (565.57+) or nvmlDeviceGetTemperature, sensor GPU ("temperature.gpu")
    temperature_gpu_celsius: float | None = None
    temperature_memory_celsius: float | None = None  # field NVML_FI_DEV_MEMORY_TEMP ("temperature.memory")
    # nvmlDeviceGetTemperatureThreshold: SHUTDOWN, SLOWDOWN, GPU_MAX, MEM_MAX (slow)
    threshold_shutdown_celsius: float | None = None
    threshold_slowdown_celsius: float | None = None
    threshold_gpu_max_celsius: float | None = None
    threshold_memory_max_celsius: float | None = None
    # nvmlDeviceGetMarginTemperature (R570+, Hopper and newer): the die below the nearest slowdown threshold, negative
    # past it (slow)
    temperature_margin_celsius: float | None = None
    # power, W and J
    power_watts: float | None = None  # nvmlDeviceGetPowerUsage ("power.draw")
    power_limit_watts: float | None = None  # nvmlDeviceGetEnforcedPowerLimit ("enforced.power.limit"), slow
    power_default_limit_watts: float | None = None  # nvmlDeviceGetPowerManagementDefaultLimit, slow
    # field NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, since driver load (not on Grace superchips: the module's)
    energy_joules: float | None = None
    # fans, per fan index
    # nvmlDeviceGetFanSpeed_v2 / 100 ("fan.speed"); before R510's GetNumFans, the fans that answer
    fan_speed_ratio: tuple[float | None, ...] | None = None
    fan_speed_rpm: tuple[float | None, ...] | None = None  # nvmlDeviceGetFanSpeedRPM
    # clocks, Hz (nvmlDeviceGetClockInfo / nvmlDeviceGetMaxClockInfo, MHz x 1e6)
    clock_graphics_hz: float | None = None  # "clocks.gr"
    clock_sm_hz: float | None = None  # "clocks.sm"
    clock_memory_hz: float | None = None  # "clocks.mem"
    clock_graphics_max_hz: float | None = None  # "clocks.max.gr", slow
    clock_sm_max_hz: float | None = None  # "clocks.max.sm", slow
    clock_memory_max_hz: float | None = None  # "clocks.max.mem", slow
    performance_state: int | None = None  # nvmlDeviceGetPerformanceState, 0 (P0) .. 15
    clock_event_reasons: int | None = None  # nvmlDeviceGetCurrentClocksEventReasons (ThrottleReasons pre-R535)
    # nvmlDeviceGetViolationStatus(POWER / THERMAL).violationTime, ns -> s, cumulative (without the function:
    # fields NVML_FI_DEV_PERF_POLICY_POWER / _THERMAL)
    violation_power_seconds: float | None = None
    violation_thermal_seconds: float | None = None
    # utilization and memory
    utilization_gpu_ratio: float | None = None  # nvmlDeviceGetUtilizationRates().gpu / 100
    utilization_memory_ratio: float | None = None  # nvmlDeviceGetUtilizationRates().memory / 100
    # nvmlDeviceGetMemoryInfo_v2().used ("memory.used": without the driver's reserved memory); v1 before R510
    memory_used_bytes: float | None = None
    # modes and memory health (slow)
    mig_enabled: bool | None = None  # nvmlDeviceGetMigMode current
    ecc_enabled: bool | None = None  # nvmlDeviceGetEccMode current
    # fields NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    # the aggregate counts by where on the card they came (slow: nvmlDeviceGetMemoryErrorCounter, NVML_AGGREGATE_ECC):
    # the DRAM (NVML_MEMORY_LOCATION_DRAM, the device memory before Turing) and the on-chip SRAM; None where the card
    # does not count that location
    ecc_corrected_aggregate_dram: int | None = None
    ecc_uncorrected_aggregate_dram: int | None = None
    ecc_corrected_aggregate_sram: int | None = None
    ecc_uncorrected_aggregate_sram: int | None = None
    # nvmlDeviceGetRetiredPages(cause) and nvmlDeviceGetRetiredPagesPendingStatus (pre-Ampere)
    retired_pages_single_bit: int | None = None
    retired_pages_double_bit: int | None = None
    retired_pages_pending: bool | None = None
    # the oldest and newest timestamp of the retired pages, Unix seconds (nvmlDeviceGetRetiredPages_v2): the card's
    # own dates, kept in its InfoROM; None without retired pages or where the library has no _v2
    retired_pages_oldest_wall: float | None = None
    retired_pages_newest_wall: float | None = None
    # nvmlDeviceGetRemappedRows (Ampere+)
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # nvmlDeviceGetRowRemapperHistogram (Ampere+): memory banks with low / with no spare rows left for the remapper
    remap_banks_low: int | None = None
    remap_banks_none: int | None = None
    pcie_replays: int | None = None  # field NVML_FI_DEV_PCIE_REPLAY_COUNTER
    # nvmlDeviceGetCurrPcieLinkGeneration / Width, and the Max ones: "possible with this device and system" (a
    # card in a slot of 8 lanes has a maximum of 8), so a current value below its maximum is a link trained down
    pcie_link_generation: int | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    # nvmlDeviceGetGpuFabricInfo(V): the GPU's registration with an NVSwitch system's NVLink fabric,
    # NVML_GPU_FABRIC_STATE_* (1 not started, 2 in progress, 3 completed); the status of a completed one (an
    # nvmlReturn_t, 0: success); the V call's health mask as NVML gives it (NVML_GPU_FABRIC_HEALTH_MASK_*, 2 bits a
    # field, R550+) and the v3 call's health summary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*: 1 healthy, 2 unhealthy,
    # 3 limited capacity; R580+). None: no fabric, no such call, or (summary) NOT_SUPPORTED
    fabric_state: int | None = None
    fabric_status: int | None = None
    fabric_health_mask: int | None = None
    fabric_health_summary: int | None = None
    # PCIe errors the kernel's AER driver counted at the GPU's PCI function since boot (slow; Linux sysfs
    # aer_dev_correctable / aer_dev_nonfatal / aer_dev_fatal totals, backends/aer.py): not NVML's
    pcie_aer_correctable: int | None = None
    pcie_aer_nonfatal: int | None = None
    pcie_aer_fatal: int | None = None
    # NVLink, over the GPU's links (nvmlDeviceGetNvLinkState link after link until INVALID_ARGUMENT): how many are
    # active, and nvmlDeviceGetNvLinkErrorCounter summed over every link (DL_CRC_FLIT, DL_CRC_DATA, DL_REPLAY,
    # DL_RECOVERY; they restart at a driver reload); None on a GPU without NVLink
    nvlink_links_active: int | None = None
    nvlink_crc_flit_errors: int | None = None
    nvlink_crc_data_errors: int | None = None
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    # the same per link (metrics.detail): each link's state (1 active, 0 not), by link number, and its counters as
    # (link, sample field of the sum above, count) where the driver answers them
    nvlink_link_states: tuple[int, ...] | None = None
    nvlink_link_errors: tuple[tuple[int, str, int], ...] | None = None
    # field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset, 2 node reboot,
    # 3 drain P2P, 4 drain and reset (nvmlDeviceGpuRecoveryAction_t)
    recovery_action: int | None = None
    # field NVML_FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING (258, R570+): the share of its rated life
    # the power-smoothing circuitry has left (Blackwell and newer datacenter boards), %; one circuit, not the card
    power_smoothing_life_percent: int | None = None
    # nvmlDeviceGetComputeRunningProcesses_v3 (_v2 before R510), in the layout the driver fills:
    # (PID, used GPU memory in bytes or None) per process
    processes: tuple[tuple[int, float | None], ...] | None = None
    # the same call's gpuInstanceId and computeInstanceId: (PID, GPU instance, compute instance) of each process
    # that runs on a MIG device (none outside MIG, or in the 16-byte layout of drivers before R450)
    process_instances: tuple[tuple[int, int, int], ...] | None = None
    # the GPU's MIG devices (slow): (GPU instance, compute instance, MIG UUID) each, none with MIG off
    # (nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId,
    # nvmlDeviceGetUUID)
    mig_devices: tuple[tuple[int, int, str], ...] | None = None
    # their compute slices (slow): (MIG UUID, slices) each, and the GPU's slices in all (7 on an A100 or H100)
    # (nvmlDeviceGetAttributes_v2's computeInstanceSliceCount, nvmlDeviceGetMaxMigDeviceCount); none and 0 with MIG off
    mig_slices: tuple[tuple[str, int], ...] | None = None
    mig_slice_count: int | None = None

    @classmethod
    def of(cls, timestamp: float, monotonic: float, values: Mapping[str, Any]) -> GpuSample:
        """The sample with these readings (other fields None): equal to ``GpuSample(timestamp=..., monotonic=...,
        **values)``, at a fraction of the cost (the frozen ``__init__`` sets every field one
        ``object.__setattr__`` at a time; the sampler builds one per GPU per tick, the importer millions). Only
        the given fields are stored: the others read the class's default, None. An unknown name raises TypeError,
        as ``__init__`` does."""
        if not _FIELD_NAMES.issuperset(values):
            raise TypeError(f"GpuSample has no field {sorted(set(values) - _FIELD_NAMES)[0]!r}")
        state = dict(values)
        state["timestamp"], state["monotonic"] = timestamp, monotonic
        sample = object.__new__(cls)
        object.__setattr__(sample, "__dict__", state)
        return sample


_FIELD_NAMES = frozenset(f.name for f in fields(GpuSample))
assert all(f.default is None for f in fields(GpuSample) if f.name not in ("timestamp", "monotonic"))


PCIE_BUSY_RATIO = 0.5  # utilization from which a link below its top generation is a downgrade, not power saving


def pcie_downgraded(s: GpuSample) -> bool | None:
    """Whether the GPU's PCIe link trained below what the card and its slot allow: fewer lanes than its maximum
    width, or a lower generation than its maximum while the GPU is at least PCIE_BUSY_RATIO busy (an idle link
    drops its generation to save power); None without the width (nvmlDeviceGetCurrPcieLinkWidth /
    nvmlDeviceGetMaxPcieLinkWidth, ...LinkGeneration)."""
    if s.pcie_link_width is None or s.pcie_link_width_max is None:
        return None
    slower = (s.pcie_link_generation is not None and s.pcie_link_generation_max is not None
              and s.pcie_link_generation < s.pcie_link_generation_max
              and (s.utilization_gpu_ratio or 0.0) >= PCIE_BUSY_RATIO)
    return s.pcie_link_width < s.pcie_link_width_max or slower


# nvmlClocksEventReason* bits (nvml.h) of ``GpuSample.clock_event_reasons``, by name.
CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8), ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40), ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

# Physical ranges: a reading outside is dropped (and counted), never exported or accumulated.
PHYSICAL_RANGES: dict[str, tuple[float, float]] = {
    "temperature_gpu_celsius": (-40.0, 150.0),
    "temperature_memory_celsius": (-40.0, 150.0),
    "threshold_shutdown_celsius": (0.0, 150.0),
    "threshold_slowdown_celsius": (0.0, 150.0),
    "threshold_gpu_max_celsius": (0.0, 150.0),
    "threshold_memory_max_celsius": (0.0, 150.0),
    "temperature_margin_celsius": (-150.0, 150.0),
    "power_watts": (0.0, 5000.0),
    "power_limit_watts": (0.0, 5000.0),
    "power_default_limit_watts": (0.0, 5000.0),
    "energy_joules": (0.0, 1e15),
    "fan_speed_ratio": (0.0, 2.0),  # NVML allows more than 100 % on some boards
    "fan_speed_rpm": (0.0, 30000.0),
    "clock_graphics_hz": (0.0, 1e10),
    "clock_sm_hz": (0.0, 1e10),
    "clock_memory_hz": (0.0, 1e11),
    "clock_graphics_max_hz": (0.0, 1e10),
    "clock_sm_max_hz": (0.0, 1e10),
    "clock_memory_max_hz": (0.0, 1e11),
    "performance_state": (0, 15),
    "utilization_gpu_ratio": (0.0, 1.0),
    "utilization_memory_ratio": (0.0, 1.0),
    "memory_used_bytes": (0.0, 1e14),
    # counters: NVML_VALUE_NOT_AVAILABLE (2**64 - 1) or garbage must never reach the ledger's records
    "ecc_corrected_volatile": (0, 1e12),
    "ecc_uncorrected_volatile": (0, 1e12),
    "ecc_corrected_aggregate": (0, 1e12),
    "ecc_uncorrected_aggregate": (0, 1e12),
    "ecc_corrected_aggregate_dram": (0, 1e15),
    "ecc_uncorrected_aggregate_dram": (0, 1e12),
    "ecc_corrected_aggregate_sram": (0, 1e15),
    "ecc_uncorrected_aggregate_sram": (0, 1e12),
    "retired_pages_single_bit": (0, 1e6),
    "retired_pages_double_bit": (0, 1e6),
    "remapped_rows_corrected": (0, 1e6),
    "remapped_rows_uncorrected": (0, 1e6),
    "pcie_replays": (0, 1e12),
    "pcie_aer_correctable": (0, 1e15),
    "pcie_aer_nonfatal": (0, 1e15),
    "pcie_aer_fatal": (0, 1e15),
    "pcie_link_generation": (1, 8),
    "pcie_link_generation_max": (1, 8),
    "pcie_link_width": (1, 64),
    "pcie_link_width_max": (1, 64),
    "nvlink_links_active": (0, 64),
    "nvlink_crc_flit_errors": (0, 1e15),
    "nvlink_crc_data_errors": (0, 1e15),
    "nvlink_replay_errors": (0, 1e15),
    "nvlink_recovery_errors": (0, 1e15),
    "recovery_action": (0, 100),
    "power_smoothing_life_percent": (0, 100),
    "fabric_state": (1, 3),
    "fabric_status": (0, 999),
    "retired_pages_oldest_wall": (946684800.0, 4102444800.0),
    "retired_pages_newest_wall": (946684800.0, 4102444800.0),
    "fabric_health_mask": (0, 2**32 - 1),
    "fabric_health_summary": (1, 3),
}


def _within(bounds: tuple[float, float], value: Any) -> bool:
    """Whether a reading is usable: missing (None), a flag, or a number inside ``bounds`` (NaN is not)."""
    return value is None or value.__class__ is bool or bool(bounds[0] <= value <= bounds[1])


def validated(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Readings with those outside :data:`PHYSICAL_RANGES` set to None, and the names dropped.
    Per-fan tuples drop single fans."""
    out = dict(values)
    dropped: list[str] = []
    for name, bounds in PHYSICAL_RANGES.items():
        value = out.get(name)
        if value is None:
            continue
        if value.__class__ is tuple:
            kept = tuple(v if _within(bounds, v) else None for v in value)
            if kept != value:
                dropped.append(name)
                out[name] = kept
        elif not _within(bounds, value):
            dropped.append(name)
            out[name] = None
    return out, dropped

