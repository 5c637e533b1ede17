"""Simulated GPUs: a small physical model behind the fake NVML library.

Each simulated GPU has a product (its capabilities and limits), a workload schedule from a
scenario file, and a state advanced in simulated time: power follows the workload, the die heats
towards ``ambient + power x thermal resistance`` through two poles fitted on real traces
(:func:`thermal_step`: the die and its spreader in about a second, the heatsink in about three
minutes), the memory through one, a fan curve lowers the resistance of fan-cooled cards, and
the clocks are cut (thermal slowdown) near the device's own thresholds. Scripted faults
(GPU lost, ECC errors, XIDs, NOT_SUPPORTED fields, hung calls, garbage readings) fire at
given simulated times. Nothing here knows about NVML's C interface; ``fakenvml`` does.
"""

from __future__ import annotations

import math
import random
import re
import threading
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwear.sim.errors import ScenarioError as ScenarioError  # its home before; importers keep it
from gpuwear.yamlsafe import MAX_BYTES, YamlError, load_yaml, short_repr

KERNEL_LOG_WAIT_SECONDS = 60.0  # the simulated kernel log's reader looks at its stop request at least this often

# NVML clock-event (throttle) reason bits, from nvml.h (nvmlClocksEventReason*).
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80


# The two-pole die model, fitted by bench/thermal_fit.py on the real traces of tests/fixtures/traces/: the RTX 6000 Ada
# (a blower fixed at 30 %, 72 min, 13-153 W) gives RMS 0.26 °C with a die pole of <= 1 s holding 13 % of the thermal
# resistance and a heatsink pole of 177 s (one pole: 0.93 °C, tau 109 s); the RTX 4060 Laptop (6 h of gpu-burn
# bursts) RMS 1.43 °C with 11 s / 37 % and 177 s (one pole: 1.72 °C). Cards without a trace take the desktop fit.
TAU_DIE_SECONDS = 1.0
TAU_SINK_SECONDS = 177.0
DIE_SHARE = 0.132
# The die's wander that its power does not explain (fan and clock management NVML does not show): an
# Ornstein-Uhlenbeck process (wander). The RTX 4060 Laptop trace has three times the 3-5 °C cycles its power
# explains; a wander of 0.9 °C (standard deviation) with a 60 s time constant, replayed with its power, gives its
# counted cycles and its cycles of 10 °C or more within 1.5 x (bench/cycle_replay.py). The RTX 6000 Ada trace has
# none: the other cards take none.
WANDER_SECONDS = 60.0


@dataclass(frozen=True)
class Product:
    """What a simulated card is and can report. Temperatures in °C, power in W."""

    key: str
    name: str
    architecture: int  # nvmlDeviceArchitecture_t
    cuda_capability: tuple[int, int]
    memory_total_bytes: int
    tdp_watts: float  # default (and enforced) power limit
    idle_watts: float
    full_load_watts: float  # what the workload would draw at utilization 1 with no limit
    shutdown_celsius: int
    slowdown_celsius: int
    gpu_max_celsius: int
    memory_max_celsius: int | None  # None: the card reports no memory temperature
    fans: int  # 0 for passive (datacenter) cards
    fan_max_rpm: int | None  # None: RPM not reported
    ecc: bool
    retired_pages: bool  # pre-Ampere page retirement
    remapped_rows: bool  # Ampere+ row remapping
    r_th_best: float  # °C/W die above ambient at full fan (or fixed for passive cards)
    r_th_worst: float  # °C/W at minimum fan speed
    r_th_memory: float  # °C/W memory above ambient
    tau_memory_seconds: float
    sm_max_hz: float
    memory_max_hz: float
    idle_sm_hz: float = 210e6
    min_fan_ratio: float = 0.3
    mig_capable: bool = False  # A100 / H100 class: MIG mode can be enabled
    tegra: bool = False  # a Jetson-like integrated GPU: NVML initialises and lists it, and answers nothing else
    module_extra_watts: float = 0.0  # GH200: the energy counter is the module's, Grace CPU included
    min_branch: str = "r470"  # the oldest driver branch that supports the card
    tau_die_seconds: float = TAU_DIE_SECONDS  # the die's pole (thermal_step)
    tau_sink_seconds: float = TAU_SINK_SECONDS  # the heatsink's
    die_share: float = DIE_SHARE  # the die pole's share of the thermal resistance
    wander_celsius: float = 0.0  # the standard deviation of the die's wander (wander); 0: none
    nvlinks: int = 0  # NVLink links (an SXM board's, wired to NVSwitches: all active); 0: none
    pci_device: int = 0  # the PCI device ID under NVIDIA's vendor ID 0x10DE (the pci.ids database); 0: not on PCI
    # memory banks the row remapper keeps spare rows for (nvidia-smi -q "Bank Remap Availability Histogram" of a card
    # never remapped: 640 banks on an A100, 2560 on an H100 80GB, 3072 on a 96 GB Hopper, 192 on an Ada workstation
    # card, as real captures show); 0 where the card does not remap rows
    remap_banks: int = 0

    @property
    def power_smoothing(self) -> bool:
        """Whether the board has the power-smoothing circuitry NVML reports (its nvml.h: "For Blackwell or newer
        fully supported devices"): a Blackwell or newer datacenter board."""
        return self.architecture >= 10 and not self.geforce

    @property
    def geforce(self) -> bool:
        """A GeForce board, by the product line its name says (nvmlDeviceGetName): NVML's "limited support" brand,
        which answers no serial, no applications or locked clocks, and nvmlBrandType_t GEFORCE."""
        return "GeForce" in self.name


PRODUCTS: dict[str, Product] = {
    p.key: p
    for p in (
        Product(
            key="rtx4090", name="NVIDIA GeForce RTX 4090", architecture=8,
            cuda_capability=(8, 9), memory_total_bytes=24 * 2**30, tdp_watts=450.0,
            idle_watts=22.0, full_load_watts=470.0, shutdown_celsius=98, slowdown_celsius=95,
            gpu_max_celsius=90, memory_max_celsius=None, fans=2, fan_max_rpm=3000, ecc=False,
            retired_pages=False, remapped_rows=False, r_th_best=0.095, r_th_worst=0.2,
            r_th_memory=0.0, tau_memory_seconds=40.0,
            sm_max_hz=2.52e9, memory_max_hz=10.5e9, min_branch="r525",
            pci_device=0x2684,
        ),
        Product(  # the card of the rtx6000ada trace, with that trace's fit (blower at 30 %: r_th_worst)
            key="rtx6000ada", name="NVIDIA RTX 6000 Ada Generation", architecture=8,
            cuda_capability=(8, 9), memory_total_bytes=48 * 2**30, tdp_watts=300.0,
            idle_watts=14.0, full_load_watts=300.0, shutdown_celsius=98, slowdown_celsius=93,
            gpu_max_celsius=90, memory_max_celsius=None, fans=1, fan_max_rpm=None, ecc=True,
            retired_pages=False, remapped_rows=True, r_th_best=0.18, r_th_worst=0.4469,
            r_th_memory=0.0, tau_memory_seconds=60.0,
            sm_max_hz=3.105e9, memory_max_hz=10.001e9, min_branch="r525",
            pci_device=0x26B1,
            remap_banks=192,
        ),
        Product(  # the card of the rtx4060laptop trace, with that trace's fit (a laptop: no fan NVML can read)
            key="rtx4060-laptop", name="NVIDIA GeForce RTX 4060 Laptop GPU", architecture=8,
            cuda_capability=(8, 9), memory_total_bytes=8 * 2**30, tdp_watts=40.0,
            idle_watts=4.0, full_load_watts=40.0, shutdown_celsius=105, slowdown_celsius=102,
            gpu_max_celsius=87, memory_max_celsius=None, fans=0, fan_max_rpm=None, ecc=False,
            retired_pages=False, remapped_rows=False, r_th_best=0.8588, r_th_worst=0.8588,
            r_th_memory=0.0, tau_memory_seconds=60.0,
            sm_max_hz=2.37e9, memory_max_hz=8.001e9, min_branch="r525",
            tau_die_seconds=11.31, die_share=0.3714, wander_celsius=0.9,
            pci_device=0x28E0,
        ),
        Product(
            key="gtx1080ti", name="NVIDIA GeForce GTX 1080 Ti", architecture=4,
            cuda_capability=(6, 1), memory_total_bytes=11 * 2**30, tdp_watts=250.0,
            idle_watts=12.0, full_load_watts=250.0, shutdown_celsius=96, slowdown_celsius=93,
            gpu_max_celsius=91, memory_max_celsius=None, fans=1, fan_max_rpm=4800, ecc=False,
            retired_pages=False, remapped_rows=False, r_th_best=0.22, r_th_worst=0.36,
            r_th_memory=0.0, tau_memory_seconds=40.0,
            sm_max_hz=1.911e9, memory_max_hz=5.505e9, idle_sm_hz=139e6,
            pci_device=0x1B06,
        ),
        Product(
            key="h100-sxm", name="NVIDIA H100 80GB HBM3", architecture=9,
            cuda_capability=(9, 0), memory_total_bytes=80 * 2**30, tdp_watts=700.0,
            idle_watts=72.0, full_load_watts=690.0, shutdown_celsius=92, slowdown_celsius=89,
            gpu_max_celsius=87, memory_max_celsius=95, fans=0, fan_max_rpm=None, ecc=True,
            retired_pages=False, remapped_rows=True, r_th_best=0.075, r_th_worst=0.075,
            r_th_memory=0.082, tau_memory_seconds=60.0,
            sm_max_hz=1.98e9, memory_max_hz=2.619e9, mig_capable=True, min_branch="r525", nvlinks=18,
            pci_device=0x2330,
            remap_banks=2560,
        ),
        Product(  # nvidia_gpu_exporter's H200 capture (590.48.01: tests/fixtures/captures): "NVIDIA H200",
            # 143771 MiB, 700 W, the T.Limit scale at 28 C (59 below max operating; slowdown -2, shutdown -8: 87, 89,
            # 95 C), 77.7 W and 28/32 C idle, 630 W and 53/42 C under gpu_burn (r_th), 1980 / 3201 MHz, 3072 banks,
            # 18 NVLinks, 10de:2335, MIG-capable, compute 9.0. Not in the capture, the H100's: the memory's limit;
            # the oldest branch assumed R550 (the H200 shipped in 2024)
            key="h200", name="NVIDIA H200", architecture=9,
            cuda_capability=(9, 0), memory_total_bytes=143771 * 2**20, tdp_watts=700.0,
            idle_watts=78.0, full_load_watts=690.0, shutdown_celsius=95, slowdown_celsius=89,
            gpu_max_celsius=87, memory_max_celsius=95, fans=0, fan_max_rpm=None, ecc=True,
            retired_pages=False, remapped_rows=True, r_th_best=0.045, r_th_worst=0.045,
            r_th_memory=0.03, tau_memory_seconds=60.0,
            sm_max_hz=1.98e9, memory_max_hz=3.201e9, mig_capable=True, min_branch="r550", nvlinks=18,
            pci_device=0x2335,
            remap_banks=3072,
        ),
        Product(  # nvidia-smi on 8-GPU B200 boxes (570.133.20, 575.57.08, 580.95.05; public logs): "NVIDIA B200",
            # 183359MiB, 1000 W cap, 136-145 W and 25-32 °C idle, no fan, MIG "Disabled" (capable); compute 10.0,
            # 148 SMs at 1965 MHz (a hashcat run's device header); PCI 10de:2901 (pci.ids "GB100 [B200]"); 18 NVLink5
            # links (NVIDIA's health-validation nvlink checks). Not from a B200 capture, the H100's: the temperature
            # limits, the memory clock and the banks the row remapper keeps
            key="b200", name="NVIDIA B200", architecture=10,
            cuda_capability=(10, 0), memory_total_bytes=183359 * 2**20, tdp_watts=1000.0,
            idle_watts=140.0, full_load_watts=990.0, shutdown_celsius=92, slowdown_celsius=89,
            gpu_max_celsius=87, memory_max_celsius=95, fans=0, fan_max_rpm=None, ecc=True,
            retired_pages=False, remapped_rows=True, r_th_best=0.045, r_th_worst=0.045,
            r_th_memory=0.05, tau_memory_seconds=60.0,
            sm_max_hz=1.965e9, memory_max_hz=2.619e9, mig_capable=True, min_branch="r570", nvlinks=18,
            pci_device=0x2901,
            remap_banks=2560,
        ),
        Product(
            key="a100-sxm", name="NVIDIA A100-SXM4-80GB", architecture=7,
            cuda_capability=(8, 0), memory_total_bytes=80 * 2**30, tdp_watts=400.0,
            idle_watts=60.0, full_load_watts=400.0, shutdown_celsius=92, slowdown_celsius=89,
            gpu_max_celsius=87, memory_max_celsius=95, fans=0, fan_max_rpm=None, ecc=True,
            retired_pages=False, remapped_rows=True, r_th_best=0.11, r_th_worst=0.11,
            r_th_memory=0.12, tau_memory_seconds=60.0,
            sm_max_hz=1.41e9, memory_max_hz=1.593e9, mig_capable=True, nvlinks=12,
            pci_device=0x20B2,
            remap_banks=640,
        ),
        Product(
            key="gh200", name="NVIDIA GH200 480GB", architecture=9,
            cuda_capability=(9, 0), memory_total_bytes=96 * 2**30, tdp_watts=900.0,
            idle_watts=90.0, full_load_watts=700.0, shutdown_celsius=92, slowdown_celsius=89,
            gpu_max_celsius=87, memory_max_celsius=95, fans=0, fan_max_rpm=None, ecc=True,
            retired_pages=False, remapped_rows=True, r_th_best=0.07, r_th_worst=0.07,
            r_th_memory=0.08, tau_memory_seconds=60.0,
            sm_max_hz=1.98e9, memory_max_hz=2.619e9, mig_capable=True, module_extra_watts=150.0,
            min_branch="r535", nvlinks=18,
            pci_device=0x2342,
            remap_banks=3072,
        ),
        Product(
            key="jetson-orin", name="Orin (nvgpu)", architecture=7,
            cuda_capability=(8, 7), memory_total_bytes=64 * 2**30, tdp_watts=60.0,
            idle_watts=5.0, full_load_watts=50.0, shutdown_celsius=105, slowdown_celsius=99,
            gpu_max_celsius=95, memory_max_celsius=None, fans=0, fan_max_rpm=None, ecc=False,
            retired_pages=False, remapped_rows=False, r_th_best=0.6, r_th_worst=0.6,
            r_th_memory=0.0, tau_memory_seconds=60.0,
            sm_max_hz=1.3e9, memory_max_hz=3.2e9, tegra=True,
        ),
        Product(
            key="v100", name="Tesla V100-PCIE-16GB", architecture=5,
            cuda_capability=(7, 0), memory_total_bytes=16 * 2**30, tdp_watts=250.0,
            idle_watts=26.0, full_load_watts=250.0, shutdown_celsius=90, slowdown_celsius=87,
            gpu_max_celsius=83, memory_max_celsius=85, fans=0, fan_max_rpm=None, ecc=True,
            retired_pages=True, remapped_rows=False, r_th_best=0.19, r_th_worst=0.19,
            r_th_memory=0.2, tau_memory_seconds=60.0,
            sm_max_hz=1.38e9, memory_max_hz=0.877e9,
            pci_device=0x1DB4,
        ),
    )
}

PHASE_KINDS = ("idle", "train", "stress")
# spare rows a bank has for the row remapper: NVIDIA's RMA policy sets the failure flag on a remap for a bank that
# already has eight uncorrectable remaps (GPU Memory Error Management, "RMA Policy Thresholds"); the classes' bounds
# below it are the fake's (NVIDIA names them, not their bounds)
BANK_SPARE_ROWS = 8
# nvmlNvLinkErrorCounter_t: NVML_NVLINK_ERROR_DL_REPLAY 0, _RECOVERY 1, _CRC_FLIT 2, _CRC_DATA 3 -> the fault's key
NVLINK_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data"}
# the true-or-false fields of nvmlGpuFabricInfo_v2/v3's health mask (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*): a
# scenario's name -> (the field's shift, the first branch whose nvml.h has it: DEGRADED_BW R550; ROUTE_RECOVERY,
# ROUTE_UNHEALTHY and ACCESS_TIMEOUT_RECOVERY in nvidia-ml-py 12.570.86, not 12.560.30). INCORRECT_CONFIGURATION
# (shift 8, 4 bits, values 1 none .. 8) is in nvidia-ml-py 13.580.65, not 12.575.51: R580.
FABRIC_MASK_FIELDS = {"degraded": (0, "r550"), "route_recovery": (2, "r570"), "route_unhealthy": (4, "r570"),
                      "access_timeout_recovery": (6, "r570")}
FABRIC_INCORRECT_CONFIGURATION = (8, "r580")
NVML_SILENT_XIDS = frozenset({79, 119, 120})  # in the kernel log only: NVML's events do not carry them (DCGM #162)
# what the driver's line says after the code, for a few (NVIDIA's XID catalog); others get a generic text
XID_WORDS = {13: "Graphics SM Warp Exception", 31: "MMU Fault", 48: "An uncorrectable double bit error",
             63: "Row remapping event", 64: "Row remapper failure", 79: "GPU has fallen off the bus",
             94: "Contained ECC error", 95: "Uncontained ECC error",
             119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!", 120: "GSP task exception"}
FAULT_KINDS = ("lost", "recover", "xid", "ecc", "not_supported", "hang", "garbage",
               "retire_pages", "remap_rows", "pcie_replays", "driver_reload", "recovery_action", "fabric",
               "driver_unload", "driver_load", "mig", "energy_glitch", "driver_upgrade", "gpu_missing",
               "pcie_downgrade", "nvlink_errors", "ecc_bleed", "reset_required")


@dataclass(frozen=True)
class Phase:
    """One step of a workload schedule; ``utilization`` is 0..1."""

    kind: str
    seconds: float
    utilization: float
    eval_every: float = 0.0  # training: an evaluation pause every N s (0: none)
    eval_seconds: float = 0.0
    eval_utilization: float = 0.3
    job: str | None = None  # a simulated job (a synthetic PID, resolved by the simulation)
    also: tuple[str, ...] = ()  # more simulated jobs on the GPU at once (``job: [a, b]``: one process each)
    pids: tuple[int, ...] = ()  # real processes (started by tests) running on the GPU

    @property
    def job_names(self) -> tuple[str, ...]:
        """The simulated jobs whose processes share the GPU in this phase, in order."""
        return ((self.job,) if self.job else ()) + self.also

    def utilization_at(self, t: float) -> float:
        """Utilization ``t`` seconds into the phase."""
        if self.eval_every > 0 and (t % self.eval_every) >= self.eval_every - self.eval_seconds:
            return self.eval_utilization
        return self.utilization


@dataclass(frozen=True)
class MigDevice:
    """A MIG device of a simulated GPU: one GPU instance of ``profile`` ("3g.40gb": 3 of the 7 compute slices,
    40 GB) holding one compute instance (0) that spans it, as ``nvidia-smi mig -cgi PROFILE -C`` makes it."""

    profile: str
    gpu_instance: int
    compute_instance: int
    uuid: str  # MIG-<uuid> (the R470+ form; before R470 it was MIG-GPU-<uuid>/<gi>/<ci>)
    memory_bytes: int


MIG_PROFILE = re.compile(r"([1-7])g\.([1-9][0-9]{0,2})gb")
# the GPU instance ids the driver gives each profile's instances on an A100 / H100, first free first (NVIDIA's MIG
# user guide, "A100 MIG profiles" placements; go-nvml #60 shows 3g, 2g and 1g instances given ids 2, 3 and 9)
_GI_IDS = {7: (0,), 4: (1,), 3: (2, 1), 2: (3, 4, 5), 1: (7, 8, 9, 10, 11, 12, 13)}


def mig_devices(parent_uuid: str, profiles: list[Any], where: str) -> tuple[MigDevice, ...]:
    """The MIG devices a scenario's ``mig_devices`` list of profiles makes, in the order given (NVML's MIG device
    index); ScenarioError for a profile that is not one or a set that does not fit in 7 slices."""
    out: list[MigDevice] = []
    used: set[int] = set()
    for k, profile in enumerate(profiles):
        m = MIG_PROFILE.fullmatch(profile) if isinstance(profile, str) else None
        if m is None:
            raise ScenarioError(f"{where}[{k}]: expected a MIG profile such as 1g.10gb, got {short_repr(profile)}")
        slices = int(m.group(1))
        free = [gi for gi in _GI_IDS.get(slices, ()) if gi not in used]
        if not free or sum(int(d.profile[0]) for d in out) + slices > 7:
            raise ScenarioError(f"{where}[{k}]: {profile} does not fit beside {', '.join(d.profile for d in out)} "
                                "in a GPU's 7 compute slices")
        used.add(free[0])
        digest = f"{zlib.crc32(f'{parent_uuid}/{free[0]}/0'.encode()):08x}"
        uuid = f"MIG-{digest}-{free[0]:04x}-5a1c-8e2f-{parent_uuid[-12:]}"
        out.append(MigDevice(profile, free[0], 0, uuid, int(m.group(2)) << 30))
    return tuple(out)


@dataclass
class Fault:
    """A scripted event at simulated time ``at`` (s since the scenario started)."""

    at: float
    gpu: int
    kind: str
    params: dict[str, Any]


@dataclass
class GpuState:
    """Mutable physical and health state of one simulated GPU."""

    die_celsius: float
    memory_celsius: float
    die_rise: float = 0.0  # the die pole's rise above ambient (°C)
    sink_rise: float = 0.0  # the heatsink pole's
    wander: float = 0.0  # the die's wander (°C, wander)
    power_watts: float = 0.0
    fan_ratio: float = 0.3
    clock_factor: float = 1.0
    utilization: float = 0.0
    reasons: int = REASON_GPU_IDLE
    energy_mj: float = 0.0
    violation_power_ns: float = 0.0
    violation_thermal_ns: float = 0.0
    ecc_corrected_volatile: int = 0
    ecc_uncorrected_volatile: int = 0
    ecc_corrected_aggregate: int = 0
    ecc_uncorrected_aggregate: int = 0
    # corrected errors a second at full load from a failing memory (scaled by utilization: 0 at idle), and the
    # fraction of one carried from step to step (the fault "ecc_bleed": NVIDIA/DCGM #313's GB200)
    ecc_bleed_per_second: float = 0.0
    ecc_bleed_carry: float = 0.0
    retired_single_bit: int = 0
    retired_double_bit: int = 0
    retired_pending: bool = False
    # when each retired page was retired, by cause (0 single-bit, 1 double-bit): simulated seconds from the start,
    # negative for a used card's (nvmlDeviceGetRetiredPages_v2 gives each page's timestamp)
    retired_at: dict[int, list[float]] = field(default_factory=dict)
    remapped_corrected: int = 0
    remapped_uncorrected: int = 0
    # spare rows left in each bank a remap used (the others have all BANK_SPARE_ROWS): the row remapper's histogram
    bank_spares: dict[int, int] = field(default_factory=dict)
    remap_pending: bool = False
    remap_failure: bool = False
    pcie_replays: int = 0
    recovery_action: int = 0
    # field 258 (NVML_FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING): the power-smoothing circuitry's
    # rated life left, %, on Blackwell and newer datacenter boards (a used card's: its scenario's carried)
    power_smoothing_life_percent: int = 100
    # nvmlDeviceGetGpuFabricInfo(V) on an NVSwitch system: NVML_GPU_FABRIC_STATE_* (3: completed), the status of a
    # completed registration (an nvmlReturn_t), the fields of the health mask that are true (FABRIC_MASK_FIELDS'
    # names; "incorrect_configuration" holds its value, 2-8), and the v3 health summary (None: healthy once
    # completed; NVIDIA does not say how the mask maps onto it, so a scenario gives it)
    fabric_state: int = 3
    fabric_status: int = 0
    fabric_mask: dict[str, int] = field(default_factory=dict)
    fabric_summary: int | None = None
    lost: bool = False
    reset_required: bool = False  # the fault "reset_required": NVML answers RESET_REQUIRED until a "recover"
    hang_seconds: float = 0.0  # the next call blocks this long (wall seconds), once
    unsupported: set[str] = field(default_factory=set)
    garbage: dict[str, float] = field(default_factory=dict)  # field -> value, returned once
    pending_xids: list[int] = field(default_factory=list)
    pcie_generation: int | None = None  # the link trained below its maximum (pcie_downgrade); None: at it
    nvlink_down: set[int] = field(default_factory=set)  # NVLink links gone inactive (nvlink_errors down: true)
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, nvmlNvLinkErrorCounter_t) -> n
    pcie_width: int | None = None
    processes: tuple[int, ...] = ()  # PIDs of the compute processes on the GPU now
    process_name: str = ""  # the comm (at most 15 characters) of the first of them, as the driver's XID lines name it
    mig_enabled: bool = False  # MIG mode (A100/H100 class): whole-device utilization is not supported then
    energy_glitch_mj: float | None = None  # the energy counter answers this once (a backwards glitch)


def thermal_step(die_rise: float, sink_rise: float, watts: float, resistance: float, product: Product,
                 dt: float) -> tuple[float, float]:
    """The two poles' rises above ambient (°C) after ``dt`` seconds at ``watts`` through ``resistance`` (°C/W): each
    moves towards its share of ``watts x resistance`` with its own time constant (exactly, for a constant power)."""
    target = watts * resistance
    die = die_rise + (target * product.die_share - die_rise) * (1.0 - math.exp(-dt / product.tau_die_seconds))
    sink = sink_rise + (target * (1.0 - product.die_share) - sink_rise) * (
        1.0 - math.exp(-dt / product.tau_sink_seconds))
    return die, sink


def wander(value: float, dt: float, product: Product, rng: random.Random) -> float:
    """The die's wander (°C) ``dt`` seconds on: an Ornstein-Uhlenbeck step of standard deviation
    ``product.wander_celsius`` and time constant WANDER_SECONDS (exact for any ``dt``); unchanged, and ``rng``
    untouched, for a product without one."""
    if product.wander_celsius <= 0.0 or dt <= 0.0:
        return value
    a = math.exp(-dt / WANDER_SECONDS)
    return value * a + product.wander_celsius * math.sqrt(1.0 - a * a) * rng.gauss(0.0, 1.0)


def read_celsius(value: float, rng: random.Random) -> int:
    """A temperature as the simulated sensor reads it: with a little noise, as NVML's integer °C."""
    return round(value + rng.uniform(-0.6, 0.6))


def replay_die(product: Product, resistance: float, ambient_celsius: float, times: Sequence[float],
               watts: Sequence[float], seed: int = 0) -> list[int]:
    """The die readings a simulated ``product`` gives when it draws ``watts`` at ``times`` (seconds; each power held
    until the next time) through ``resistance`` (°C/W), settled at the first power: the step, the wander and the
    sensor of :meth:`SimGpu.step` and :meth:`SimGpu.read_temperature` (bench/cycle_replay.py, tests/test_simulated.py
    replay the real traces' power with it)."""
    rng = random.Random(seed)
    rise = watts[0] * resistance
    die, sink, drift = rise * product.die_share, rise * (1.0 - product.die_share), 0.0
    out = [read_celsius(ambient_celsius + die + sink, rng)]
    for k in range(1, len(times)):
        dt = times[k] - times[k - 1]
        die, sink = thermal_step(die, sink, watts[k - 1], resistance, product, dt)
        drift = wander(drift, dt, product, rng)
        out.append(read_celsius(ambient_celsius + die + sink + drift, rng))
    return out


class SimGpu:
    """One simulated GPU: product, schedule and state, advanced by :meth:`step`."""

    def __init__(self, index: int, product: Product, schedule: list[Phase], offset: float,
                 ambient_celsius: float, seed: int, cooling_factor: float = 1.0) -> None:
        self.index = index
        self.cooling_factor = cooling_factor  # > 1: a dusty heatsink, dried paste, a failed fan
        self.product = product
        self.schedule = schedule
        self.offset = offset
        self.ambient_celsius = ambient_celsius
        self.uuid = f"GPU-{seed:08x}-5111-4a7e-9c3d-{index:012x}"
        self.serial = f"13{seed % 10**6:06d}{index:04d}"
        self.pci_bus_id = f"00000000:{0x17 + index * 0x20:02X}:00.0"
        # its firmware, as nvmlDeviceGetVbiosVersion and the InfoROM calls give it: the VBIOS in nvidia-smi's form
        # ("96.00.30.00.01"), the InfoROM's configuration checksum, and whether it fails its validation (a scenario's
        # vbios, inforom_checksum and inforom_corrupt: a reflashed card, one whose InfoROM was cleared)
        self.vbios = f"{0x90 + product.architecture:02X}.00.30.00.01"
        self.inforom_checksum = zlib.crc32(self.uuid.encode())
        self.inforom_corrupt = False
        # the kernel log's lines the driver writes of this GPU (its XIDs), taken by Simulation.kernel_log; a deque
        # is appended to under the fake library's lock and emptied by the follower's thread without it
        self.kernel_lines: deque[str] = deque()
        self.kernel_written: threading.Event | None = None  # the simulation's, to wake its kernel-log reader
        self.rng = random.Random(seed * 1000 + index)
        idle_rise = product.idle_watts * product.r_th_best  # settled at idle, fans at their lowest useful speed
        self.state = GpuState(die_celsius=ambient_celsius + idle_rise,
                              memory_celsius=ambient_celsius + product.idle_watts * product.r_th_memory,
                              die_rise=idle_rise * product.die_share, sink_rise=idle_rise * (1 - product.die_share))
        self.cycle_seconds = sum(p.seconds for p in schedule)
        # the MIG devices made on it (a scenario's mig_devices), there while MIG mode is on; its processes are
        # placed on them in turn, the first on the first
        self.mig_devices: tuple[MigDevice, ...] = ()
        # seen from a VM given a share of it (a scenario's vgpu): the vGPU type's name and frame buffer (bytes)
        self.vgpu: tuple[str, int] | None = None

    def phase_at(self, t: float) -> tuple[Phase, float]:
        """The schedule's phase at simulated time ``t`` and the seconds into it."""
        t = (t + self.offset) % self.cycle_seconds if self.cycle_seconds > 0 else 0.0
        for phase in self.schedule:
            if t < phase.seconds:
                return phase, t
            t -= phase.seconds
        return self.schedule[-1], 0.0

    def utilization_at(self, t: float) -> float:
        """Workload utilization demanded at simulated time ``t``."""
        phase, into = self.phase_at(t)
        return phase.utilization_at(into)

    def _thermal_resistance(self) -> float:
        p = self.product
        if p.fans == 0:
            return p.r_th_best * self.cooling_factor
        span = 1.0 - p.min_fan_ratio
        r = p.r_th_best + (p.r_th_worst - p.r_th_best) * (1.0 - self.state.fan_ratio) / span
        return r * self.cooling_factor

    def step(self, t: float, dt: float) -> None:
        """Advance the state by ``dt`` simulated seconds ending at time ``t``."""
        s, p = self.state, self.product
        if s.lost or dt < 0:  # dt 0: derive power, reasons and processes without integrating
            return
        phase, into = self.phase_at(t)
        s.utilization = phase.utilization_at(into)
        if s.ecc_bleed_per_second:
            bled = s.ecc_bleed_per_second * s.utilization * dt + s.ecc_bleed_carry
            s.ecc_bleed_carry = bled - int(bled)
            s.ecc_corrected_volatile += int(bled)
            s.ecc_corrected_aggregate += int(bled)
        s.processes = phase.pids or tuple(synthetic_pid(j) for j in phase.job_names)
        s.process_name = (phase.job or "python3")[:15] if s.processes else ""
        reasons = 0
        # Thermal slowdown: software steps the clocks down above gpu_max, hardware halves them
        # at the slowdown threshold; both recover once the die has cooled a little.
        if s.die_celsius >= p.slowdown_celsius:
            s.clock_factor = min(s.clock_factor, 0.5)
            reasons |= REASON_HW_THERMAL
        elif s.die_celsius >= p.gpu_max_celsius:
            s.clock_factor = max(0.3, s.clock_factor - 0.04 * dt)
            reasons |= REASON_SW_THERMAL
        elif s.die_celsius < p.gpu_max_celsius - 3:
            s.clock_factor = min(1.0, s.clock_factor + 0.02 * dt)
        elif s.clock_factor < 1.0:
            reasons |= REASON_SW_THERMAL
        demand = p.idle_watts + s.utilization * (p.full_load_watts - p.idle_watts) * s.clock_factor
        if demand > p.tdp_watts:
            demand = p.tdp_watts
            reasons |= REASON_SW_POWER_CAP
        if s.utilization < 0.05:
            reasons |= REASON_GPU_IDLE
        s.reasons = reasons
        s.power_watts = demand
        s.energy_mj += (demand + p.module_extra_watts) * dt * 1000.0
        if reasons & REASON_SW_POWER_CAP:
            s.violation_power_ns += dt * 1e9
        if reasons & (REASON_SW_THERMAL | REASON_HW_THERMAL):
            s.violation_thermal_ns += dt * 1e9
        if p.fans:
            target = min(1.0, max(p.min_fan_ratio, (s.die_celsius - 35.0) / 45.0))
            move = 0.05 * dt
            s.fan_ratio += max(-move, min(move, target - s.fan_ratio))
        s.die_rise, s.sink_rise = thermal_step(s.die_rise, s.sink_rise, demand, self._thermal_resistance(), p, dt)
        s.wander = wander(s.wander, dt, p, self.rng)
        s.die_celsius = self.ambient_celsius + s.die_rise + s.sink_rise + s.wander
        mem_target = self.ambient_celsius + demand * p.r_th_memory
        s.memory_celsius += (mem_target - s.memory_celsius) * (1.0 - math.exp(-dt / p.tau_memory_seconds))
        if s.die_celsius >= p.shutdown_celsius:  # its thermal protection powers the card off: off the bus, as a
            s.lost = True  # Titan V at 95 C did with an XID 79 (illinois-scicomp/machine-shop-maintenance#80);
            self.xid(79)  # overheating is "the most common reason" NVIDIA names (open-gpu-kernel-modules#507)

    def xid(self, code: int, text: str | None = None, process: bool = False, unit: tuple[int, int] = (0, 0)) -> None:
        """An XID as the driver reports it: a line in the kernel log, always; an NVML event too, except for the
        codes NVML cannot report (79, 119, 120: an NVIDIA maintainer, NVIDIA/DCGM #162). ``text``: what the line
        says after its process (by default, the code's words). ``process``: the line names the process running on
        the GPU (krcReportXid's "pid=%s, name=%s" of the faulting context: an application's fault), else it says
        the process is unknown (a fault of the GPU's own, or none running). ``unit``: the GPC and TPC an XID 13's
        default line names ("Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address", as the
        driver writes it; the fault's gpc and tpc)."""
        domain, bus, device = self.pci_bus_id.split(".")[0].split(":")
        if text is None and code == 13:
            text = f"Graphics SM Warp Exception on (GPC {unit[0]}, TPC {unit[1]}, SM 0): Out Of Range Address"
        s = self.state
        who = (f"pid={s.processes[0]}, name={s.process_name}" if process and s.processes
               else "pid='<unknown>', name=<unknown>")
        self.kernel_lines.append(f"NVRM: Xid (PCI:{int(domain, 16):04x}:{bus.lower()}:{device.lower()}): {code}, "
                                 f"{who}, {text if text is not None else XID_WORDS.get(code, 'simulated XID') + '.'}")
        if self.kernel_written is not None:
            self.kernel_written.set()
        if code not in NVML_SILENT_XIDS:
            self.state.pending_xids.append(code)

    def _use_spares(self, rows: int, bank: Any) -> None:
        """Each remapped row takes a spare row of a bank: of ``bank`` (a scenario's failing bank: its spares run out),
        else of the next bank in turn (remaps spread over the memory); a bank with none left takes no more."""
        banks, spares = self.product.remap_banks, self.state.bank_spares
        for _ in range(rows if banks else 0):
            k = int(bank) % banks if bank is not None else (sum(BANK_SPARE_ROWS - v for v in spares.values())) % banks
            if spares.get(k, BANK_SPARE_ROWS) > 0:
                spares[k] = spares.get(k, BANK_SPARE_ROWS) - 1

    def remap_histogram(self) -> tuple[int, int, int, int, int]:
        """The banks by spare rows left (nvmlRowRemapperHistogramValues_t: max, high, partial, low, none). NVIDIA names
        the classes, not their bounds (max: "all reserved rows are available"; none: "no reserved rows available");
        the fake's bounds, with BANK_SPARE_ROWS a bank: max all, high at least 6, partial at least 3, low 1 or 2."""
        counts = [0, 0, 0, 0, 0]
        for left in self.state.bank_spares.values():
            counts[0 if left >= BANK_SPARE_ROWS else 1 if left >= 6 else 2 if left >= 3 else 3 if left >= 1 else 4] += 1
        counts[0] += self.product.remap_banks - len(self.state.bank_spares)
        return (counts[0], counts[1], counts[2], counts[3], counts[4])

    def apply(self, fault: Fault) -> None:
        """Make a scripted fault happen now."""
        s, k, prm = self.state, fault.kind, fault.params
        if k == "lost":
            s.lost = True
            self.xid(79)  # "GPU has fallen off the bus"
        elif k == "recover":  # back on the bus, or reset
            s.lost = s.reset_required = False
        elif k == "reset_required":
            s.reset_required = True
        elif k == "xid":
            self.xid(int(prm.get("xid", 79)), prm.get("text"), bool(prm.get("process", False)),
                     (int(prm.get("gpc", 0)), int(prm.get("tpc", 0))))
        elif k == "nvlink_errors":  # errors counted on one link (nvmlNvLinkErrorCounter_t), which may go down
            link = int(prm.get("link", 0))
            for counter, key in NVLINK_COUNTERS.items():
                s.nvlink_errors[(link, counter)] = s.nvlink_errors.get((link, counter), 0) + int(prm.get(key, 0))
            if prm.get("down"):
                s.nvlink_down.add(link)
        elif k == "pcie_downgrade":  # the link retrained narrower or slower (a reseat, a riser, a failing lane)
            s.pcie_width = int(prm["width"]) if "width" in prm else s.pcie_width
            s.pcie_generation = int(prm["generation"]) if "generation" in prm else s.pcie_generation
        elif k == "ecc":
            corrected, uncorrected = int(prm.get("corrected", 0)), int(prm.get("uncorrected", 0))
            s.ecc_corrected_volatile += corrected
            s.ecc_corrected_aggregate += corrected
            s.ecc_uncorrected_volatile += uncorrected
            s.ecc_uncorrected_aggregate += uncorrected
        elif k == "ecc_bleed":  # from now on, corrected errors a second at full load
            s.ecc_bleed_per_second = float(prm.get("corrected_per_second", 1000.0))
        elif k == "not_supported":
            s.unsupported.add(str(prm["field"]))
        elif k == "hang":
            s.hang_seconds = float(prm.get("seconds", 5.0))
        elif k == "garbage":
            s.garbage[str(prm["field"])] = float(prm["value"])
        elif k == "retire_pages":
            s.retired_single_bit += int(prm.get("single_bit", 0))
            s.retired_double_bit += int(prm.get("double_bit", 0))
            s.retired_at.setdefault(0, []).extend([fault.at] * int(prm.get("single_bit", 0)))
            s.retired_at.setdefault(1, []).extend([fault.at] * int(prm.get("double_bit", 0)))
            s.retired_pending = bool(prm.get("pending", False))
        elif k == "remap_rows":
            rows = int(prm.get("corrected", 0)) + int(prm.get("uncorrected", 0))
            s.remapped_corrected += int(prm.get("corrected", 0))
            s.remapped_uncorrected += int(prm.get("uncorrected", 0))
            self._use_spares(rows, prm.get("bank"))
            s.remap_pending = bool(prm.get("pending", False))
            s.remap_failure = bool(prm.get("failure", False))
        elif k == "pcie_replays":
            s.pcie_replays += int(prm.get("count", 1))
        elif k == "recovery_action":
            s.recovery_action = int(prm.get("action", 1))
        elif k == "fabric":  # the GPU's registration with the NVLink fabric (fabric manager) as NVML reports it
            s.fabric_state = int(prm.get("state", 3))
            s.fabric_status = int(prm.get("status", 0))
            s.fabric_mask = dict(prm.get("mask", {}))
            s.fabric_summary = prm.get("summary")
        elif k == "mig":  # MIG mode toggled (nvidia-smi -mig 1 / 0 with the GPU idle)
            s.mig_enabled = bool(prm.get("enabled", True)) and self.product.mig_capable
        elif k == "energy_glitch":  # one reading of the counter this many joules back
            s.energy_glitch_mj = max(0.0, s.energy_mj - float(prm.get("back_joules", 1e6)) * 1000.0)
        elif k == "driver_reload":  # counters kept by the driver since it loaded restart at 0
            s.energy_mj = 0.0
            s.ecc_corrected_volatile = s.ecc_uncorrected_volatile = 0

    def read_temperature(self, value: float) -> int:
        """A sensor reading: the true value with a little noise, as NVML's integer °C (read_celsius)."""
        return read_celsius(value, self.rng)


def synthetic_pid(job: str) -> int:
    """The PID a simulated job's process reports: above Linux's largest pid_max, so it can
    never be a real process."""
    return 5_000_000 + zlib.crc32(job.encode()) % 1_000_000


class Simulation:
    """All simulated GPUs of a scenario, advanced lazily to a requested simulated time."""

    MAX_STEP_SECONDS = 1.0

    def __init__(self, gpus: list[SimGpu], faults: list[Fault], name: str) -> None:
        self.gpus = gpus
        self.faults = sorted(faults, key=lambda f: f.at)
        self.name = name
        self.time = 0.0  # simulated seconds since the scenario started
        self.max_step_seconds = self.MAX_STEP_SECONDS  # coarser steps make long simulations cheaper
        self._next_fault = 0
        self.jobs = {synthetic_pid(j): j for g in gpus for p in g.schedule for j in p.job_names}
        self.kernel_written = threading.Event()  # set when a GPU writes a kernel-log line
        for gpu in gpus:  # power, reasons and processes of the first phase, before any time passes
            gpu.step(0.0, 0.0)
            gpu.kernel_written = self.kernel_written
        self.driver_loaded = True  # False between driver_unload and driver_load faults
        self.driver_generation = 0  # bumped at each unload: NVML must be initialised again
        self.driver_upgraded = False  # the kernel module was replaced by another version (driver_upgrade fault)
        self.driver = "r610"  # the driver profile (sim.drivers.PROFILES) the fake library answers as
        self.privileged = True  # the NVML client runs as root (False: an unprivileged daemon, DynamicUser=)
        # the version of each versioned struct the library takes (a library built against another nvml.h than the
        # binding's answers NVML_ERROR_ARGUMENT_VERSION_MISMATCH: go-nvml #138)
        self.struct_versions: dict[str, int] = dict(STRUCTS)
        # WSL2: nvmlSystemGetDriverVersion answers the Windows driver's version, not the library's (None: Linux)
        self.windows_driver: str | None = None

    def kernel_log(self, stop: threading.Event) -> Iterator[str]:
        """The kernel log the simulated driver writes (its XID lines, gpuwear.kernlog's format), as it comes, until
        ``stop``: woken only when a GPU writes a line or the reader stops (:meth:`wake_kernel_log`). Polling five
        times a second cost a 1-GPU daemon 0.07 % of a core, half again its idle cost; once a second, 4.8 ms of CPU a
        minute, 6 % of it."""
        while not stop.is_set():
            self.kernel_written.clear()
            for gpu in self.gpus:
                while gpu.kernel_lines:
                    yield gpu.kernel_lines.popleft()
            if not stop.is_set():
                self.kernel_written.wait(KERNEL_LOG_WAIT_SECONDS)

    def wake_kernel_log(self) -> None:
        """Wake :meth:`kernel_log`'s wait (its reader is stopping)."""
        self.kernel_written.set()

    def next_fault_at(self) -> float:
        """Simulated time of the next scripted fault (infinity when none is left)."""
        return self.faults[self._next_fault].at if self._next_fault < len(self.faults) else math.inf

    def advance_to(self, t: float) -> bool:
        """Integrate every GPU up to simulated time ``t`` (never backwards); True when a
        scripted fault fired on the way."""
        fired = False
        while self.time < t:
            step_end = min(t, self.time + self.max_step_seconds)
            while self._next_fault < len(self.faults) and self.faults[self._next_fault].at <= step_end:
                fault = self.faults[self._next_fault]
                self._next_fault += 1
                fired = True
                if fault.kind == "driver_unload":  # every GPU's driver-kept counters restart
                    self.driver_loaded = False
                    self.driver_generation += 1
                    for gpu in self.gpus:
                        gpu.apply(Fault(fault.at, gpu.index, "driver_reload", {}))
                elif fault.kind == "driver_load":  # counters kept by the driver start again from 0
                    self.driver_loaded = True
                    for gpu in self.gpus:
                        gpu.apply(Fault(fault.at, gpu.index, "driver_reload", {}))
                elif fault.kind == "driver_upgrade":  # the module swapped for another release's: sessions end,
                    self.driver_upgraded = True  # and nvmlInit of the library loaded before answers a mismatch
                    self.driver_generation += 1
                    for gpu in self.gpus:
                        gpu.apply(Fault(fault.at, gpu.index, "driver_reload", {}))
                elif 0 <= fault.gpu < len(self.gpus):
                    self.gpus[fault.gpu].apply(fault)
            for gpu in self.gpus:
                gpu.step(step_end, step_end - self.time)
            self.time = step_end
        return fired


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped with the package."""
    folder = resources.files("gpuwear.sim") / "scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _without_missing(gpus: list[SimGpu], faults: list[Fault], name: str) -> tuple[list[SimGpu], list[Fault]]:
    """The GPUs NVML enumerates, and their faults: a ``gpu_missing`` GPU (at 0: absent from the bus as the run
    starts, as after the reboot that followed its fall; one that falls off while NVML runs is ``lost``, still
    listed) is not enumerated, and the GPUs after it move down one index each, as NVML numbers the GPUs it finds
    in PCI order; each keeps its UUID, serial and bus id."""
    absent = {f.gpu for f in faults if f.kind == "gpu_missing"}
    if any(f.at != 0 for f in faults if f.kind == "gpu_missing"):
        raise ScenarioError(f"scenario {name}: gpu_missing: expected at 0 (a GPU absent as the run starts; one that "
                            "falls off the bus while the daemon runs is the fault lost)")
    if not absent:
        return gpus, faults
    kept = [g for g in gpus if g.index not in absent]
    moved = {g.index: i for i, g in enumerate(kept)}
    for g in kept:
        g.index = moved[g.index]
    return kept, [Fault(f.at, moved[f.gpu], f.kind, f.params) for f in faults if f.gpu in moved]


def load_scenario(name_or_path: str, seed: int = 1) -> Simulation:
    """Build a :class:`Simulation` from a built-in scenario name or a YAML file path."""
    if name_or_path in builtin_scenarios():
        text: str | bytes = (resources.files("gpuwear.sim") / "scenarios" / f"{name_or_path}.yaml").read_bytes()
        name = name_or_path
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ScenarioError(f"scenario {name_or_path!r}: no such file and not a built-in "
                                f"scenario (built-in: {', '.join(builtin_scenarios())})")
        try:
            with path.open("rb") as f:
                text = f.read(MAX_BYTES + 1)  # no more than one byte past the limit
        except OSError as exc:
            raise ScenarioError(f"scenario {name_or_path}: cannot read: {exc}") from exc
        name = path.stem
    try:
        doc = load_yaml(text, f"scenario {name}")
    except YamlError as exc:
        raise ScenarioError(str(exc)) from None
    return parse_scenario(doc, name, seed)


def _number(value: Any, where: str, minimum: float = 0.0, maximum: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ScenarioError(f"{where}: expected a number, got {short_repr(value)}")
    if not minimum <= value <= maximum:
        raise ScenarioError(f"{where}: {value} is outside [{minimum}, {maximum}]")
    return float(value)


def _phase(spec: Any, where: str) -> Phase:
    if not isinstance(spec, dict):
        raise ScenarioError(f"{where}: expected a mapping like {{kind: train, seconds: 600}}")
    kind = spec.get("kind")
    if kind not in PHASE_KINDS:
        raise ScenarioError(f"{where}.kind: expected one of {', '.join(PHASE_KINDS)}, got {short_repr(kind)}")
    default_util = {"idle": 0.0, "train": 0.95, "stress": 1.0}[kind]
    known = {"kind", "seconds", "utilization", "eval_every", "eval_seconds", "eval_utilization", "job", "pids"}
    for key in spec:
        if key not in known:
            raise ScenarioError(f"{where}.{key}: unknown key")
    names = _job_names(spec.get("job"), f"{where}.job")
    return Phase(
        kind=kind,
        seconds=_number(spec.get("seconds"), f"{where}.seconds", 0.001),
        utilization=_number(spec.get("utilization", default_util), f"{where}.utilization", 0, 1),
        eval_every=_number(spec.get("eval_every", 0), f"{where}.eval_every"),
        eval_seconds=_number(spec.get("eval_seconds", 0), f"{where}.eval_seconds"),
        eval_utilization=_number(spec.get("eval_utilization", 0.3), f"{where}.eval_utilization", 0, 1),
        job=names[0] if names else None,
        also=names[1:],
        pids=tuple(int(_number(p, f"{where}.pids", 1, 2**22)) for p in spec.get("pids", []) or []),
    )


def _job_names(value: Any, where: str) -> tuple[str, ...]:
    """A phase's job: a name, or a list of 1 to 8 different names (jobs sharing the GPU at once)."""
    if not isinstance(value, list):
        name = _job_name(value, where)
        return (name,) if name else ()
    names = tuple(_job_name(v, where) or "" for v in value)
    if not 1 <= len(names) <= 8 or not all(names) or len(set(names)) != len(names):
        raise ScenarioError(f"{where}: expected a job name or a list of 1 to 8 different names, got "
                            f"{short_repr(value)}")
    return names


def _job_name(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 64:
        raise ScenarioError(f"{where}: expected a job name (1 to 64 characters), got {short_repr(value)}")
    return value


# The versioned structs the fake library takes, and the version nvml.h gives each (nvmlMemory_v2_t,
# nvmlTemperature_v1_t, nvmlFanSpeedInfo_t); a scenario's struct_versions makes the library take another.
STRUCTS = {"memory": 2, "temperature": 1, "fan_speed_info": 1}


# a used card's lifetime counts, as its InfoROM holds them when gpuwear first meets it: a scenario's name -> the
# card state's field (NVML's aggregate ECC counts persist "for the lifetime of the device"; retired pages before
# Ampere, remapped rows from Ampere on, each only on a product that keeps them)
CARRIED = {"ecc_corrected": "ecc_corrected_aggregate", "ecc_uncorrected": "ecc_uncorrected_aggregate",
           "retired_single_bit": "retired_single_bit", "retired_double_bit": "retired_double_bit",
           "remapped_corrected": "remapped_corrected", "remapped_uncorrected": "remapped_uncorrected",
           "power_smoothing_life_percent": "power_smoothing_life_percent", "recovery_action": "recovery_action"}
CARRIED_DAYS_AGO = 400.0  # when a used card's pages were retired, before the simulation began, unless it says


def _carried(gpu: SimGpu, spec: Any, where: str) -> None:
    """A scenario GPU's ``carried``: the lifetime counts it arrives with (a used card), and ``retired_days_ago``,
    how long before the simulation began its carried pages were retired."""
    if not isinstance(spec, dict) or set(spec) - {*CARRIED, "retired_days_ago"}:
        raise ScenarioError(f"{where}: expected a mapping of {', '.join(CARRIED)} to counts (and retired_days_ago), "
                            f"got {short_repr(spec)}")
    kept = {"retired_single_bit": gpu.product.retired_pages, "retired_double_bit": gpu.product.retired_pages,
            "remapped_corrected": gpu.product.remapped_rows, "remapped_uncorrected": gpu.product.remapped_rows,
            "power_smoothing_life_percent": gpu.product.power_smoothing}
    ago = -86400.0 * _number(spec.get("retired_days_ago", CARRIED_DAYS_AGO), f"{where}.retired_days_ago", 0, 3650)
    for key, value in spec.items():
        if key == "retired_days_ago":
            continue
        if not kept.get(key, True):
            raise ScenarioError(f"{where}.{key}: {gpu.product.name} keeps no such count")
        top = {"power_smoothing_life_percent": 100, "recovery_action": 4}.get(key, 1e15)
        setattr(gpu.state, CARRIED[key], n := int(_number(value, f"{where}.{key}", 0, top)))
        if key.startswith("retired_"):
            gpu.state.retired_at[key == "retired_double_bit"] = [ago] * min(n, 4096)


def parse_scenario(doc: Any, name: str, seed: int = 1) -> Simulation:
    """Validate a scenario document (see ``scenarios/demo.yaml``) and build the simulation."""
    if not isinstance(doc, dict):
        raise ScenarioError(f"scenario {name}: expected a mapping at the top level")
    for key in doc:
        if key not in {"description", "ambient_celsius", "gpus", "faults", "driver", "privileged", "struct_versions",
                       "windows_driver", "seed"}:
            raise ScenarioError(f"scenario {name}: {key}: unknown key")
    if "seed" in doc:  # the box's own cards: their UUIDs and serials (simulated boxes of a fleet hold different cards)
        seed = int(_number(doc["seed"], f"scenario {name}: seed", 1, 2**31 - 1))
    from gpuwear.sim.drivers import NEWEST, PROFILES
    from gpuwear.sim.nvml_symbols import BRANCHES

    driver = doc.get("driver", NEWEST)
    if not isinstance(driver, str) or driver not in PROFILES:
        raise ScenarioError(f"scenario {name}: driver: expected one of {', '.join(PROFILES)}, "
                            f"got {short_repr(driver)}")
    privileged = doc.get("privileged", True)
    if not isinstance(privileged, bool):
        raise ScenarioError(f"scenario {name}: privileged: expected true or false, got {short_repr(privileged)}")
    struct_versions = doc.get("struct_versions", {}) or {}
    if not isinstance(struct_versions, dict) or any(k not in STRUCTS for k in struct_versions):
        raise ScenarioError(f"scenario {name}: struct_versions: expected a mapping of {', '.join(STRUCTS)} to "
                            f"versions, got {short_repr(struct_versions)}")
    accepts = {k: int(_number(v, f"scenario {name}: struct_versions.{k}", 1, 255)) for k, v in struct_versions.items()}
    windows = doc.get("windows_driver")
    if windows is not None and not (isinstance(windows, str) and re.fullmatch(r"\d{3}\.\d{2}", windows)):
        raise ScenarioError(f"scenario {name}: windows_driver: expected a Windows driver version such as 536.25, "
                            f"got {short_repr(windows)}")
    ambient = _number(doc.get("ambient_celsius", 25), f"scenario {name}: ambient_celsius", -20, 60)
    gpu_specs = doc.get("gpus")
    if not isinstance(gpu_specs, list) or not gpu_specs:
        raise ScenarioError(f"scenario {name}: gpus: expected a non-empty list")
    gpus = []
    for i, spec in enumerate(gpu_specs):
        where = f"scenario {name}: gpus[{i}]"
        if not isinstance(spec, dict):
            raise ScenarioError(f"{where}: expected a mapping")
        product = PRODUCTS.get(spec["product"]) if isinstance(spec.get("product"), str) else None
        if product is None:
            raise ScenarioError(f"{where}.product: expected one of {', '.join(PRODUCTS)}, "
                                f"got {short_repr(spec.get('product'))}")
        schedule_spec = spec.get("schedule", [{"kind": "idle", "seconds": 3600}])
        if not isinstance(schedule_spec, list) or not schedule_spec:
            raise ScenarioError(f"{where}.schedule: expected a non-empty list of phases")
        schedule = [_phase(p, f"{where}.schedule[{j}]") for j, p in enumerate(schedule_spec)]
        offset = _number(spec.get("offset_seconds", 0), f"{where}.offset_seconds")
        # > 1: a dusty heatsink or dried paste; up to 5, a failed fan or a heatsink off its die
        cooling = _number(spec.get("cooling_factor", 1.0), f"{where}.cooling_factor", 0.5, 5.0)
        unknown = set(spec) - {"product", "schedule", "offset_seconds", "cooling_factor", "unsupported", "mig",
                               "mig_devices", "vgpu", "vbios", "inforom_checksum", "inforom_corrupt", "carried"}
        if unknown:
            raise ScenarioError(f"{where}.{sorted(map(str, unknown))[0][:60]}: unknown key")
        if BRANCHES.index(PROFILES[driver].branch) < BRANCHES.index(product.min_branch):
            raise ScenarioError(f"{where}.product: {product.name} needs a driver of branch {product.min_branch} "
                                f"or newer, the scenario's driver is {driver}")
        mig = spec.get("mig", False)
        if not isinstance(mig, bool) or (mig and not product.mig_capable):
            raise ScenarioError(f"{where}.mig: expected true or false, and true only for a MIG-capable product, "
                                f"got {short_repr(mig)}")
        gpu = SimGpu(i, product, schedule, offset, ambient, seed, cooling)
        gpu.state.mig_enabled = mig
        profiles = spec.get("mig_devices", [])
        if not isinstance(profiles, list) or (profiles and not mig) or len(profiles) > 7:
            raise ScenarioError(f"{where}.mig_devices: expected a list of at most 7 MIG profiles, on a GPU with "
                                f"mig: true, got {short_repr(profiles)}")
        gpu.mig_devices = mig_devices(gpu.uuid, profiles, f"{where}.mig_devices")
        vgpu = spec.get("vgpu")
        if vgpu is not None:
            size = re.fullmatch(r"(?:NVIDIA|GRID) [A-Za-z0-9]+-(\d{1,3})[A-Z]", vgpu) if isinstance(vgpu, str) else None
            if size is None or mig or int(size.group(1)) << 30 > product.memory_total_bytes:
                raise ScenarioError(f"{where}.vgpu: expected a vGPU type's name such as \"NVIDIA A100-40C\" (its "
                                    "frame buffer in GB, at most the product's; not with mig), got "
                                    f"{short_repr(vgpu)}")
            gpu.vgpu = (vgpu, int(size.group(1)) << 30)
        for fld in spec.get("unsupported", []) or []:
            gpu.state.unsupported.add(str(fld))
        if "vbios" in spec:  # a reflashed card's
            if not isinstance(spec["vbios"], str) or not re.fullmatch(r"[0-9A-F]{2}(\.[0-9A-F]{2}){4}", spec["vbios"]):
                raise ScenarioError(f"{where}.vbios: expected a VBIOS version such as 96.00.30.00.01, got "
                                    f"{short_repr(spec['vbios'])}")
            gpu.vbios = spec["vbios"]
        if "inforom_checksum" in spec:
            gpu.inforom_checksum = int(_number(spec["inforom_checksum"], f"{where}.inforom_checksum", 0, 2**32 - 1))
        if spec.get("inforom_corrupt") is True:
            gpu.inforom_corrupt = True
        _carried(gpu, spec.get("carried", {}), f"{where}.carried")
        gpus.append(gpu)
    faults = []
    for i, spec in enumerate(doc.get("faults", []) or []):
        where = f"scenario {name}: faults[{i}]"
        if not isinstance(spec, dict) or spec.get("kind") not in FAULT_KINDS:
            raise ScenarioError(f"{where}: expected a mapping with kind one of {', '.join(FAULT_KINDS)}")
        params = {k: v for k, v in spec.items() if k not in {"at", "gpu", "kind"}}
        gpu_index = int(_number(spec.get("gpu", 0), f"{where}.gpu", 0, len(gpus) - 1))
        if spec["kind"] == "nvlink_errors":
            link = int(_number(params.get("link", 0), f"{where}.link", 0, max(0, gpus[gpu_index].product.nvlinks - 1)))
            counts = {key: int(_number(params[key], f"{where}.{key}", 0, 1e15)) for key in NVLINK_COUNTERS.values()
                      if key in params}
            params = {"link": link, **counts, "down": params.get("down") is True}
        if spec["kind"] == "fabric":
            mask = {name: 1 for name in FABRIC_MASK_FIELDS if params.get(name) is True}
            if "incorrect_configuration" in params:
                mask["incorrect_configuration"] = int(_number(params["incorrect_configuration"],
                                                              f"{where}.incorrect_configuration", 2, 8))
            params = {"state": int(_number(params.get("state", 3), f"{where}.state", 0, 3)),
                      "status": int(_number(params.get("status", 0), f"{where}.status", 0, 999)), "mask": mask,
                      "summary": int(_number(params["summary"], f"{where}.summary", 1, 3))
                      if "summary" in params else None}
        if spec["kind"] == "xid":
            params = {"xid": int(_number(params.get("xid", 79), f"{where}.xid", 1, 999))}
            if spec.get("process") is True:  # the line names the process running on the GPU (an app's fault)
                params["process"] = True
            if isinstance(spec.get("text"), str):  # the line's text after its process, as the driver writes it
                params["text"] = "".join(c for c in spec["text"] if c.isprintable())[:200]
            for key in ("gpc", "tpc"):  # where on the chip an XID 13's default line says it came
                if key in spec:
                    params[key] = int(_number(spec[key], f"{where}.{key}", 0, 63))
        if spec["kind"] == "pcie_downgrade":  # the lanes and generation a link can train at
            params = {key: int(_number(params[key], f"{where}.{key}", 1, top))
                      for key, top in (("width", 16), ("generation", 5)) if key in params}
        faults.append(Fault(_number(spec.get("at"), f"{where}.at"), gpu_index, spec["kind"], params))
    gpus, faults = _without_missing(gpus, faults, name)
    simulation = Simulation(gpus, faults, name)
    simulation.driver, simulation.privileged = driver, privileged
    simulation.struct_versions.update(accepts)
    simulation.windows_driver = windows
    return simulation
