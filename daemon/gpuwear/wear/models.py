"""Wear estimates derived at read time from the accumulators, and the health verdict.

Every estimate is a band computed with three named parameter sets (low / central / high,
from the config), labelled with its model and parameters. Nothing here gives a remaining
life, a "% worn" or a failure probability: the figures are equivalent hours or cycles at a
stated reference, compared with reference usage profiles. See docs/wear-model.md.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.wear.accumulate import STALLS, FanWear, GpuWear, weighted_sum

BOLTZMANN_EV_PER_K = 8.617333262e-5
KELVIN = 273.15

# XIDs by the action NVIDIA's XID catalog asks for (see docs/wear-model.md); others
# (e.g. 13, 31, 43, 45: application faults) say nothing about the card's health or only a little.
XID_ACT = {46: "GPU stopped processing", 48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
           62: "internal micro-controller halt", 64: "ECC page retirement or row remap failed",
           74: "NVLink error", 79: "GPU fell off the bus", 95: "uncontained ECC error", 119: "GSP RPC timeout",
           120: "GSP error", 140: "unrecovered ECC error"}
XID_WATCH = {13: "graphics engine exception", 31: "GPU memory page fault",
             63: "ECC page retirement or row remap recorded", 92: "high single-bit ECC error rate",
             94: "contained ECC error"}
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvmlDeviceGpuRecoveryAction_t)
RECOVERY_ACTIONS = {1: "reset the GPU", 2: "reboot the node", 3: "drain peer-to-peer traffic",
                    4: "drain and reset the GPU"}
STATUS_ORDER = ("ok", "unknown", "watch", "act")
# the rule each verdict reason applies, and whose it is: NVIDIA's where NVIDIA states one, else gpuwear's own
_MEMORY_ERRORS = "NVIDIA, GPU Memory Error Management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt)"
_PAGE_RETIREMENT = "NVIDIA, Dynamic Page Retirement (docs.nvidia.com/deploy/dynamic-page-retirement)"
_XID_CATALOG = "NVIDIA's XID catalog, the resolution it gives for this XID (docs.nvidia.com/deploy/xid-errors)"
RULES = {
    "row_remap_failure": _MEMORY_ERRORS + ": a failed row remap means the GPU needs service",
    "row_remap_pending": _MEMORY_ERRORS + ": a pending remap is applied at the next GPU reset",
    "remapped_rows": _MEMORY_ERRORS,
    "page_retirement_pending": _PAGE_RETIREMENT,
    "retired_pages": _PAGE_RETIREMENT,
    "retired_pages_limit": "NVIDIA DCGM's health check: 60 or more retired pages is a failing GPU",
    "recovery_action": "the driver's own request (NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)",
    "uncorrectable_ecc": _MEMORY_ERRORS + ": results computed after an uncorrectable error may be wrong",
    "uncorrectable_ecc_history": _MEMORY_ERRORS,
    "gpu_lost": _XID_CATALOG.replace("this XID", "XID 79 (fallen off the bus)"),
    "time_above_slowdown": "gpuwear's own rule: wear.health.slowdown_watch_seconds at or above the card's slowdown "
                           "temperature (NVML's threshold)",
    "thermal_throttling": "gpuwear's own rule: wear.health.thermal_throttle_watch_ratio of busy time throttled",
    "cooling_degrading": "gpuwear's own rule: wear.health.resistance_rise_watch_ratio rise of °C per watt",
    "memory_health_unknown": "what NVML reports of this card: no ECC counters, no memory temperature",
    "bleeding_errors": "gpuwear's own rule, not NVIDIA's: an error rate per loaded hour at least "
                       "wear.health.bleeding_peer_ratio times the median of the host's GPUs of the same product (a GPU "
                       "without such peers: its rate over its last two UTC days against its own over the "
                       "wear.health.bleeding_baseline_days before them), and "
                       "above wear.health.bleeding_floor_per_loaded_hour (the field case: a GB200 leaking about 17,700 "
                       "corrected ECC errors a second under load, 0 at idle, that DCGM called healthy: NVIDIA/DCGM "
                       "#313, NVIDIA/NVSentinel #1748)",
    "pcie_aer_uncorrectable": "gpuwear's own rule: any uncorrectable PCIe error (non-fatal or fatal) the Linux "
                              "kernel's AER driver counted at the GPU's PCI function since boot (sysfs "
                              "aer_dev_nonfatal and aer_dev_fatal, "
                              "Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats)",
    "close_to_slowdown": "gpuwear's own rule: wear.health.margin_watch_ratio of busy time within "
                         "wear.health.margin_celsius below the card's slowdown temperature (NVML's threshold)",
    "stalled_calls": "gpuwear's own rule, not NVIDIA's: wear.health.stall_watch_count NVML reads past the sampler's "
                     "deadline (sampling.nvml_deadline_seconds) in the GPU's record (the field case: a GB200 whose "
                     "driver calls hung only under load: NVIDIA/DCGM #313)",
    "nvlink_down": "NVIDIA DCGM's health watch, which isolates a GPU with an NVLink link down (DCGM_FR_NVLINK_DOWN); "
                   "gpuwear applies it as its GpuwearNvlinkDown alert does: fewer links active than the most active "
                   "within the last day, for 5 minutes (links train for a while after a boot)",
    "nvlink_recoveries": "gpuwear's own rule, as its GpuwearNvlinkRecoveries alert: any NVLink recovery (a link that "
                         "failed and retrained) since the driver loaded (nvmlDeviceGetNvLinkErrorCounter, "
                         "NVML_NVLINK_ERROR_DL_RECOVERY)",
    "pcie_link_downgraded": "gpuwear's own rule, as its GpuwearPcieLinkDowngraded alert: for 10 minutes, the PCIe link "
                            "trained below the lanes, or under load the generation, that the card and its slot allow "
                            "(nvmlDeviceGetCurrPcieLinkWidth and Generation against the Max ones)",
    "repeat_incidents": "NVIDIA NVSentinel's MultipleRemediations rule (a node remediated more than once within 7 "
                        "days: the repairs are not resolving the fault), applied by gpuwear per GPU to the incidents "
                        "that call for a reset, a reboot or service (wear.health.repeat_incidents, repeat_window_days)",
}


def rule(code: str) -> str:
    """The rule a verdict reason applies (:data:`RULES`; an XID's: NVIDIA's catalog)."""
    return RULES.get(code) or (_XID_CATALOG if code.startswith("xid_") else "gpuwear's own rule")
# per-day comparisons with the reference profiles need this much observed time: a shorter log (a burst of a few
# minutes) would be extrapolated to a whole day (docs/wear-model.md §7)
MIN_COMPARISON_SECONDS = 6 * 3600
RECENT_SECONDS = 7 * 86400  # a critical event older than this (in the GPU's record) asks for watching, not action


@functools.lru_cache(maxsize=1 << 14)  # whole-degree bins and a few parameter sets: each factor computed once
def arrhenius_factor(celsius: float, reference_celsius: float, ea_ev: float) -> float:
    """Acceleration of thermally activated aging at ``celsius`` relative to the reference."""
    return math.exp(ea_ev / BOLTZMANN_EV_PER_K * (1 / (reference_celsius + KELVIN) - 1 / (celsius + KELVIN)))


def thermal_aging_hours(seconds_by_celsius: dict[str, float], reference_celsius: float, ea_ev: float,
                        owner: GpuWear | None = None) -> float:
    """Σ t·AF(T): hours at the reference temperature that age as much as the histogram
    (bins of whole °C, each taken at its value). ``owner``: the history the histogram belongs to, which keeps the
    sum from one call to the next, adding what the bins gained since (GpuWear.weighted)."""
    key, weight = _aging_weight(reference_celsius, ea_ev)
    if owner is not None:  # a view asks for a few of these per GPU at every scrape: the call kept short
        return owner.weighted(seconds_by_celsius, key, weight, False) / 3600.0
    return weighted_sum(seconds_by_celsius, key, weight) / 3600.0


@functools.lru_cache(maxsize=64)  # a few parameter sets: a view asks for them at every scrape
def _aging_weight(reference_celsius: float, ea_ev: float) -> tuple[object, Callable[[str], float]]:
    """The Arrhenius factor of a whole-°C bin, with the key that names it (weighted_sum)."""
    return (arrhenius_factor, reference_celsius, ea_ev), lambda t: arrhenius_factor(int(t), reference_celsius, ea_ev)


@functools.lru_cache(maxsize=1 << 16)  # (range, peak) bins of whole degrees: each factor computed once
def cycle_factor(range_celsius: float, peak_celsius: float, reference_range: float, reference_peak: float,
                 exponent: float, peak_term_kelvin: float) -> float:
    """Norris–Landzberg damage of one cycle relative to the reference cycle (no frequency term)."""
    return math.pow(range_celsius / reference_range, exponent) * math.exp(
        peak_term_kelvin * (1 / (reference_peak + KELVIN) - 1 / (peak_celsius + KELVIN)))


@functools.lru_cache(maxsize=1 << 16)  # an open residue's bins are weighed at each use: parsed once
def cycle_bin(key: str) -> tuple[int, int]:
    """A 'range:peak' bin's (range, peak) in whole °C."""
    rng, peak = key.split(":")
    return int(rng), int(peak)


def equivalent_cycles(cycles: dict[str, float], reference_range: float, reference_peak: float, exponent: float,
                      peak_term_kelvin: float, owner: GpuWear | None = None) -> float:
    """Miner's sum of cycles ('range:peak' bins -> counts) in reference cycles (a range of 0 counts nothing).
    ``owner``: as for :func:`thermal_aging_hours`."""
    return weighted_sum(cycles, *_cycle_weight(reference_range, reference_peak, exponent, peak_term_kelvin), owner,
                        exact=False)


@functools.lru_cache(maxsize=64)
def _cycle_weight(reference_range: float, reference_peak: float, exponent: float,
                  peak_term_kelvin: float) -> tuple[object, Callable[[str], float]]:
    """The damage of a 'range:peak' bin's cycle in reference cycles, with the key that names it (weighted_sum)."""
    def factor(key: str) -> float:
        rng, peak = cycle_bin(key)
        return cycle_factor(rng, peak, reference_range, reference_peak, exponent, peak_term_kelvin) if rng > 0 else 0.0

    return (cycle_factor, reference_range, reference_peak, exponent, peak_term_kelvin), factor


BANDS = ("low", "central", "high")


def aging_bands(hist: dict[str, float], p: WearConfig, owner: GpuWear | None = None,
                bands: tuple[str, ...] = BANDS) -> dict[str, float]:
    """Thermal aging of a histogram in equivalent hours, per band (low / central / high activation energy)."""
    a = p.arrhenius
    return {b: thermal_aging_hours(hist, a.reference_celsius, getattr(a.activation_energy_ev, b), owner) for b in bands}


def fatigue_bands(w: GpuWear, sensor: str, p: WearConfig, bands: tuple[str, ...] = BANDS) -> dict[str, float]:
    """Thermal-cycle fatigue of a sensor's closed cycles and open residue, in reference cycles, per band."""
    c, closed = p.cycles, w.cycles.get(sensor, {})
    out = {}
    for b in bands:
        key, factor = _cycle_weight(c.reference_range_celsius, c.reference_peak_celsius, getattr(c.exponent, b),
                                    getattr(c.peak_term_kelvin, b))
        out[b] = w.weighted(closed, key, factor, False) + w.residue_sum(sensor, key, factor)
    return out


def fan_revolutions(fan: FanWear, p: WearConfig) -> float:
    """A fan's revolutions: measured (RPM) where it reported RPM, else its speed ratio times wear.fan.rated_rpm."""
    return fan.revolutions + fan.ratio_seconds * p.fan.rated_rpm / 60.0


@dataclass(frozen=True)
class Profile:
    """A reference usage profile, per day: hours at temperatures and cycles (range, peak, n)."""

    key: str
    text: str
    hours_at: tuple[tuple[float, float], ...]  # (°C, hours) summing to 24
    cycles: tuple[tuple[float, float, float], ...]  # (range °C, peak °C, cycles per day)

    def histogram(self) -> dict[str, float]:
        return {str(math.floor(t)): h * 3600 for t, h in self.hours_at}

    def cycle_bins(self) -> dict[str, float]:
        return {f"{round(r)}:{round(p)}": n for r, p, n in self.cycles}


# docs/wear-model.md §7 states these assumptions and the figures they give (tests/test_models.py holds the two equal)
PROFILES = (
    Profile("idle_24_7", "24/7 idle at 35 °C", ((35, 24),), ()),
    # two sessions a day (35 -> 70 °C) and 20 dips of 10 °C (menus, loading screens)
    Profile("gaming_4h_day", "4 h a day of gaming at 70 °C, idle at 35 °C otherwise", ((70, 4), (35, 20)),
            ((35, 70, 2), (10, 70, 20))),
    # two job boundaries (35 -> 75 °C) and 24 checkpoint dips (55 -> 75 °C)
    Profile("training_24_7", "24/7 datacenter training at 75 °C", ((75, 24),), ((40, 75, 2), (20, 75, 24))),
    Profile("stress_24_7", "24/7 stress test or mining at 85 °C", ((85, 24),), ()),
)
# what a card's figures are put against in words: not the training profile, which a deep-learning card would only be
# compared with itself
WORD_PROFILES = ("idle_24_7", "gaming_4h_day", "stress_24_7")


def band_range(values: dict[str, float], labels: dict[str, str]) -> dict[str, Any]:
    """A band from smallest to largest, each end with the parameters that give it (the "low" set is not always
    the smallest figure: below the reference temperature a low activation energy ages more)."""
    small = min(values, key=lambda b: (values[b], b))
    large = max(values, key=lambda b: (values[b], b))
    return {"smallest": values[small], "smallest_with": labels[small], "largest": values[large],
            "largest_with": labels[large]}


def aging_labels(p: WearConfig) -> dict[str, str]:
    return {b: f"Ea {ea:g} eV" for b, ea in p.arrhenius.activation_energy_ev.items()}


def cycle_labels(p: WearConfig) -> dict[str, str]:
    return {b: f"exponent {m:g}" + (f", peak term {q:g} K" if q else "")
            for (b, m), (_, q) in zip(p.cycles.exponent.items(), p.cycles.peak_term_kelvin.items(), strict=True)}


def aging_per_hour(hist: dict[str, float], p: WearConfig) -> float | None:
    """Equivalent hours at the reference temperature per hour of a histogram (central), None when empty."""
    seconds = sum(hist.values())
    if seconds <= 0:
        return None
    a = p.arrhenius
    return thermal_aging_hours(hist, a.reference_celsius, a.activation_energy_ev.central) * 3600.0 / seconds


@functools.lru_cache(maxsize=8)
def profile_rates(p: WearConfig) -> tuple[tuple[float, float], ...]:
    """Per day of each reference profile: thermal-aging hours and reference cycles (central)."""
    a, c = p.arrhenius, p.cycles
    return tuple((thermal_aging_hours(prof.histogram(), a.reference_celsius, a.activation_energy_ev.central),
                  equivalent_cycles(prof.cycle_bins(), c.reference_range_celsius, c.reference_peak_celsius,
                                    c.exponent.central, c.peak_term_kelvin.central)) for prof in PROFILES)


@functools.lru_cache(maxsize=8)
def profile_band_rates(p: WearConfig) -> dict[str, tuple[tuple[float, float], ...]]:
    """Per day of each reference profile, for each parameter set (low, central, high): thermal-aging hours and
    reference cycles. A card's figure against a profile is taken with the same parameters on both sides."""
    a, c = p.arrhenius, p.cycles
    ea, exponent = dict(a.activation_energy_ev.items()), dict(c.exponent.items())
    peak = dict(c.peak_term_kelvin.items())
    return {b: tuple((thermal_aging_hours(prof.histogram(), a.reference_celsius, ea[b]),
                      equivalent_cycles(prof.cycle_bins(), c.reference_range_celsius, c.reference_peak_celsius,
                                        exponent[b], peak[b])) for prof in PROFILES)
            for b in BANDS}


def profile_equivalents(aging: dict[str, float], fatigue: dict[str, float], p: WearConfig) -> dict[str, Any]:
    """The card's aging and fatigue in days of each reference profile, one figure per parameter set (the card's
    and the profile's both taken with it), with the band from smallest to largest: {profile: {"thermal_aging":
    {low, central, high, smallest, largest}, "cycle_fatigue": {...}}}; None where the profile has none per day."""
    rates = profile_band_rates(p)
    out: dict[str, Any] = {}
    for i, prof in enumerate(PROFILES):
        entry: dict[str, Any] = {}
        for key, figure, k in (("thermal_aging", aging, 0), ("cycle_fatigue", fatigue, 1)):
            days = {b: figure[b] / rates[b][i][k] for b in BANDS if rates[b][i][k] > 0}
            entry[key] = None if len(days) < len(BANDS) else {
                **{b: round(v, 6) for b, v in days.items()},
                "smallest": round(min(days.values()), 6), "largest": round(max(days.values()), 6)}
        out[prof.key] = entry
    return out


def estimates(w: GpuWear, p: WearConfig) -> dict[str, Any]:
    """All estimates of one GPU, each a band with its model and parameters."""
    a, c = p.arrhenius, p.cycles
    aging_out: dict[str, Any] = {**aging_bands(w.temperature_seconds.get("gpu", {}), p, w),
                                 "reference_celsius": a.reference_celsius, "model": "arrhenius",
                                 "parameters": {"activation_energy_ev": dict(a.activation_energy_ev.items())}}
    fatigue_out: dict[str, Any] = {**fatigue_bands(w, "gpu", p),
                                   "reference_range_celsius": c.reference_range_celsius,
                                   "reference_peak_celsius": c.reference_peak_celsius,
                                   "model": "coffin-manson/norris-landzberg, miner's rule",
                                   "parameters": {"exponent": dict(c.exponent.items()),
                                                  "peak_term_kelvin": dict(c.peak_term_kelvin.items()),
                                                  "hysteresis_celsius": w.gate_celsius}}
    aging_out["range"] = band_range({b: aging_out[b] for b in ("low", "central", "high")}, aging_labels(p))
    fatigue_out["range"] = band_range({b: fatigue_out[b] for b in ("low", "central", "high")}, cycle_labels(p))
    if "memory" in w.temperature_seconds:
        aging_out["memory"] = aging_bands(w.temperature_seconds["memory"], p, w)
        fatigue_out["memory"] = fatigue_bands(w, "memory", p)
    days = w.observed_seconds / 86400.0 if w.observed_seconds >= MIN_COMPARISON_SECONDS else 0.0
    profiles = []
    bands = profile_band_rates(p)
    for i, (prof, (per_day_aging, per_day_cycles)) in enumerate(zip(PROFILES, profile_rates(p), strict=True)):
        aging_band = [bands[b][i][0] for b in BANDS]
        cycle_band = [bands[b][i][1] for b in BANDS]
        profiles.append({
            "profile": prof.key, "description": prof.text,
            "thermal_aging_hours_per_day": round(per_day_aging, 6),
            "cycle_fatigue_cycles_per_day": round(per_day_cycles, 6),
            # across the parameter sets, smallest to largest
            "thermal_aging_hours_per_day_range": [round(min(aging_band), 6), round(max(aging_band), 6)],
            "cycle_fatigue_cycles_per_day_range": [round(min(cycle_band), 6), round(max(cycle_band), 6)],
            "observed_thermal_aging_ratio": round(aging_out["central"] / (per_day_aging * days), 4)
            if days > 0 and per_day_aging > 0 else None,
            "observed_cycle_fatigue_ratio": round(fatigue_out["central"] / (per_day_cycles * days), 4)
            if days > 0 and per_day_cycles > 0 else None,
        })
    fans = []
    for i, fan in enumerate(w.fans):
        revolutions = fan_revolutions(fan, p)
        fans.append({"fan": i, "on_hours": round(fan.on_seconds / 3600, 6), "revolutions": round(revolutions, 1),
                     "revolutions_estimated_from_speed_ratio": fan.ratio_seconds > 0,
                     "equivalent_hours_at_rated_rpm": round(revolutions / p.fan.rated_rpm / 60.0, 6),
                     "rated_rpm": p.fan.rated_rpm, "l10_hours": dict(p.fan.l10_hours.items())})
    busy = aging_per_hour(w.kinds.get("job", {}).get("temperature_seconds", {}), p)
    idle = aging_per_hour(w.kinds.get("idle", {}).get("temperature_seconds", {}), p)
    own = {"busy_aging_hours_per_hour": None if busy is None else round(busy, 6),
           "idle_aging_hours_per_hour": None if idle is None else round(idle, 6),
           "busy_to_idle_ratio": round(busy / idle, 4) if busy is not None and idle else None}
    equivalents = profile_equivalents({b: aging_out[b] for b in BANDS}, {b: fatigue_out[b] for b in BANDS}, p)
    return {"thermal_aging_equivalent_hours": aging_out, "cycle_fatigue_equivalent_cycles": fatigue_out,
            "fan_wear": fans, "reference_profiles": profiles, "own_history": own,
            "profile_equivalent_days": equivalents,
            "comparison": {"observed_seconds": round(w.observed_seconds, 3),
                           "minimum_seconds": MIN_COMPARISON_SECONDS,
                           "compared": w.observed_seconds >= MIN_COMPARISON_SECONDS}}


def resistance_trend(w: GpuWear) -> dict[str, Any] | None:
    """Die thermal resistance (°C/W) at steady load: first and last three days with data."""
    days, by_day = w.resistance_days(), w.thermal_resistance
    if not days:
        return None

    def mean(rows: list[list[float]]) -> float:
        return sum(v[1] for v in rows) / sum(v[0] for v in rows)

    first, last = [by_day[d] for d in days[:3]], [by_day[d] for d in days[-3:]]
    out: dict[str, Any] = {"days": len(days), "first_celsius_per_watt": round(mean(first), 6),
                           "last_celsius_per_watt": round(mean(last), 6), "rise_ratio": None}
    if len(days) >= 6:
        out["rise_ratio"] = round(mean(last) / mean(first) - 1, 4)
    return out


def _per_hour(rate: float) -> str:
    return f"{rate / 1e6:.1f} M" if rate >= 1e6 else f"{rate / 1e3:.1f} k" if rate >= 1e4 else f"{rate:.0f}"


def slow_reads_text(slow_reads: dict[str, dict[str, int]]) -> str:
    """The GPU's slow NVML reads (GpuWear.slow_reads) in words: "reads of 0.1 s or more: 12 under load (3 of
    1 s or more), 0 idle"; "" when there were none."""
    if not any(slow_reads.values()):
        return ""

    def side(load: str) -> str:
        bins = slow_reads.get(load, {})
        slower = sum(n for key, n in bins.items() if key != "0.1")
        return f"{sum(bins.values())} {'under load' if load == 'loaded' else 'idle'}" + (
            f" ({slower} of 1 s or more)" if slower else "")

    return f"reads of 0.1 s or more: {side('loaded')}, {side('idle')}"


def repeated_incidents(w: GpuWear, count: int, window: float) -> tuple[float, float, list[str]] | None:
    """The most recent run of at least ``count`` incidents within ``window`` seconds among the GPU's kept
    incidents: (first wall, last wall, what each was), or None."""
    kept = w.incident_list()
    times = [t for t, _ in kept]
    best = None
    start = 0
    for end, t in enumerate(times):
        while t - times[start] > window:
            start += 1
        if end - start + 1 >= count:
            best = (start, end)
    if best is None:
        return None
    start, end = best  # every incident within the window that ends at the newest qualifying one
    return times[start], times[end], [what for _, what in kept[start:end + 1]]


def incident_summary(w: GpuWear) -> dict[str, Any]:
    """The GPU's kept incidents: how many, the first and last (wall), and the mean time between them (s; None
    below two)."""
    times = [t for t, _ in w.incident_list()]
    return {"kept": len(times), "first": times[0] if times else None, "last": times[-1] if times else None,
            "mean_seconds_between": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None}


_ERROR_WORDS = {"ecc_corrected": "corrected ECC errors", "pcie_replays": "PCIe replays",
                "nvlink_crc": "NVLink CRC errors", "nvlink_replay": "NVLink replays",
                "remapped_rows_correctable": "memory rows remapped for correctable errors"}


def error_rates(w: GpuWear, p: WearConfig) -> dict[str, tuple[float | None, float | None]]:
    """Each error counter's rate per loaded and per idle hour, None below wear.health.bleeding_min_loaded_hours of
    that side."""
    return w.error_rates(p.health.bleeding_min_loaded_hours * 3600.0)


def peer_rates(wears: Mapping[str, GpuWear], p: WearConfig) -> dict[str, dict[str, list[float]]]:
    """For each GPU (by UUID), the loaded-hour rates of each error counter of the other GPUs of the same product
    (card name) among ``wears``: what the bleeding rule compares it with. Each product's rates are gathered once
    (the views are made on the scrape path: a pass over every pair of GPUs cost 1.7 ms at 64 GPUs)."""
    rates = {uuid: (w.name.strip().lower(), error_rates(w, p)) for uuid, w in wears.items()}
    groups: dict[tuple[str, str], list[float]] = {}
    for name, theirs in rates.values():
        for counter, (loaded, _) in theirs.items():
            if name and loaded is not None:
                groups.setdefault((name, counter), []).append(loaded)
    out: dict[str, dict[str, list[float]]] = {}
    for uuid, (name, mine) in rates.items():
        peers: dict[str, list[float]] = {}
        for counter in mine:
            others = list(groups.get((name, counter), ()))
            own = mine[counter][0]
            if own is not None and others:
                others.remove(own)  # one GPU's own rate, whatever its peers' are
            if others:
                peers[counter] = others
        out[uuid] = peers
    return out


NVLINK_DOWN_HOLD_SECONDS = 300  # links fewer than before for this long are down (they train after a boot)
PCIE_DOWNGRADED_HOLD_SECONDS = 600


def _links(w: GpuWear, reason: Callable[[str, str, str], None]) -> None:
    """The NVLink and PCIe reasons, from the links' state at the GPU's latest reading (GpuWear._links)."""
    h, now = w.health, w.last_seen
    if now is None:
        return
    active, most = h.get("nvlink_links_active"), h.get("nvlink_links_most")
    if active is not None and most is not None and active < most \
            and now - h.get("nvlink_links_most_at", now) >= NVLINK_DOWN_HOLD_SECONDS:
        reason("act", "nvlink_down", f"{most - active} of the {most} NVLink links it had active within the last day "
               f"are down ({active} active): jobs that talk over NVLink fail or fall back to slower paths; a reset or "
               "a reboot may bring them back, links that keep dropping need service")
    if h.get("nvlink_recovery_errors", 0) > 0:
        reason("watch", "nvlink_recoveries", f"{h['nvlink_recovery_errors']} NVLink recovery event(s) since the "
               "driver loaded (a link failed and retrained): watch for links going down")
    since = h.get("pcie_downgraded_since")
    if since is not None and now - since >= PCIE_DOWNGRADED_HOLD_SECONDS:
        link = (f"Gen{h.get('pcie_link_generation', '?')} x{h.get('pcie_link_width', '?')}, below the "
                f"Gen{h.get('pcie_link_generation_max', '?')} x{h.get('pcie_link_width_max', '?')} its card and slot "
                "allow")
        reason("watch", "pcie_link_downgraded", f"its PCIe link runs at {link}, since "
               f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(since))}: transfers to and from it run slower; "
               "reseat the card or its riser (a lane that keeps failing is the card's or the slot's)")


def verdict(w: GpuWear, p: WearConfig, trend: dict[str, Any] | None, busy: float | None = None,
            above_slowdown: float | None = None, peers: Mapping[str, list[float]] | None = None) -> dict[str, Any]:
    """``ok`` / ``watch`` / ``act`` / ``unknown`` with reasons, from measured health first. ``trend``: the card's
    resistance_trend; ``busy`` and ``above_slowdown``: its busy seconds and seconds at or above its slowdown
    temperature, when the caller has them already.

    Reason codes are a fixed set (they label a metric); the text explains each in plain words, and ``rule`` says
    which rule it applies and whose (NVIDIA's, or gpuwear's own). ``peers``: the loaded-hour error rates of the
    host's other GPUs of the same product (:func:`peer_rates`); a counter no peer reads is judged against the GPU's
    own past (GpuWear.own_error_rates).
    """
    reasons: list[dict[str, str]] = []

    def reason(severity: str, code: str, text: str) -> None:
        reasons.append({"severity": severity, "code": code, "text": text, "rule": rule(code)})

    h = w.health
    if h.get("remapped_rows_failure"):
        reason("act", "row_remap_failure", "a memory row remap failed: NVIDIA says the GPU needs service (RMA)")
    if h.get("remapped_rows_pending"):
        reason("watch", "row_remap_pending", "a memory row remap is pending: reset the GPU when convenient to "
               "apply it")
    if h.get("retired_pages_pending"):
        reason("watch", "page_retirement_pending",
               "a memory page retirement is pending: reload the driver or reset the GPU when convenient")
    action = h.get("recovery_action")
    if action:
        reason("act", "recovery_action", f"the driver asks to {RECOVERY_ACTIONS.get(action, f'recover ({action})')}")
    if h.get("ecc_uncorrected_volatile", 0) > 0:
        reason("act", "uncorrectable_ecc", f"{h['ecc_uncorrected_volatile']} uncorrectable ECC error(s) since "
               "the driver loaded: results computed since may be wrong; reset the GPU")
    retired = h.get("retired_pages_single_bit", 0) + h.get("retired_pages_double_bit", 0)
    if retired >= 60:
        reason("act", "retired_pages_limit", f"{retired} retired memory pages: at or above 60, NVIDIA's DCGM health "
               "check reports the GPU as failing; have it checked by its vendor")
    elif retired > 0:
        reason("watch", "retired_pages", f"{retired} retired memory page(s): normal in small numbers; keep watching")
    fatal, nonfatal = h.get("pcie_aer_fatal", 0), h.get("pcie_aer_nonfatal", 0)
    if fatal > 0 or nonfatal > 0:
        reason("watch", "pcie_aer_uncorrectable", f"{fatal + nonfatal} uncorrectable PCIe error(s) since boot "
               f"({fatal} fatal, {nonfatal} non-fatal), as the kernel counts them at the GPU's PCI function: the link, "
               "a riser or the slot; reseat the card or try another slot if they grow")
    _links(w, reason)
    if h.get("remapped_rows_uncorrected", 0) > 0 or h.get("remapped_rows_corrected", 0) > 0:
        n = h.get("remapped_rows_uncorrected", 0) + h.get("remapped_rows_corrected", 0)
        reason("watch", "remapped_rows", f"{n} memory row(s) remapped: the spare rows did their job; keep watching")
    def recent(what: str) -> bool:
        """Seen within the last week of the GPU's record: older events are history (watch)."""
        when = w.last_event.get(what)
        return when is None or w.last_seen is None or w.last_seen - when <= RECENT_SECONDS

    def ago(what: str) -> str:
        when = w.last_event.get(what)
        return "" if when is None else f", last {time.strftime('%Y-%m-%d', time.gmtime(when))}"

    for xid, n in sorted((int(x), n) for x, n in w.xids.items()) if w.xids else ():
        for severity, table in (("act", XID_ACT), ("watch", XID_WATCH)):
            if xid in table:
                if severity == "act" and not recent(f"xid {xid}"):
                    severity = "watch"
                reason(severity, f"xid_{xid}", f"XID {xid} ({table[xid]}) seen {n} time(s){ago(f'xid {xid}')}")
    if w.lost_events:
        reason("act" if recent("gpu lost") else "watch", "gpu_lost",
               f"the GPU fell off the bus {w.lost_events} time(s){ago('gpu lost')}")
    bleeding = []  # one reason for every counter that bleeds: a code labels one series of the health metric
    own: dict[str, tuple[float | None, float | None]] | None = None
    for counter, (loaded, idle) in error_rates(w, p).items():
        theirs = (peers or {}).get(counter, [])
        if counter == STALLS:
            continue
        if not theirs:  # no peer of its product reads this counter: the GPU's last days against its own past
            if own is None:
                own = w.own_error_rates(p.health.bleeding_baseline_days, p.health.bleeding_min_loaded_hours * 3600.0)
            lately, before = own.get(counter, (None, None))
            if (lately is not None and before is not None and lately >= p.health.bleeding_floor_per_loaded_hour
                    and lately >= p.health.bleeding_peer_ratio * before):
                bleeding.append(f"{_per_hour(lately)} {_ERROR_WORDS.get(counter, counter)} per loaded hour over its "
                                f"last two days; no peer of the same product; its own over the "
                                f"{p.health.bleeding_baseline_days} days before: {_per_hour(before)}")
            continue
        if loaded is None or loaded < p.health.bleeding_floor_per_loaded_hour:
            continue
        median = statistics.median(theirs)
        if loaded >= p.health.bleeding_peer_ratio * median:
            at_idle = "" if idle is None else f", {_per_hour(idle)} per idle hour"
            bleeding.append(f"{_per_hour(loaded)} {_ERROR_WORDS.get(counter, counter)} per loaded hour{at_idle}; its "
                            f"{len(theirs)} peer(s) of the same product: {_per_hour(median)} (median)")
    if bleeding:
        reason("watch", "bleeding_errors", "; ".join(bleeding) + ": a fault that shows under load; have it tested")
    stalls = w.error_counts.get(STALLS)
    if stalls and stalls[1] + stalls[3] >= p.health.stall_watch_count:
        under, idle_stalls = int(stalls[1]), int(stalls[3])
        only = " only under load, as the calls of a failing GPU hang in the field" if not idle_stalls else ""
        slow = slow_reads_text(w.slow_reads)
        reason("watch", "stalled_calls", f"its NVML reads missed the sampler's deadline {under + idle_stalls} times "
               f"({under} under load, {idle_stalls} idle){only}" + (f"; {slow}" if slow else "")
               + ": a driver or GPU fault; check the kernel log")
    repeat = repeated_incidents(w, p.health.repeat_incidents, p.health.repeat_window_days * 86400.0)
    if repeat is not None:
        first, last, whats = repeat
        days = f"{p.health.repeat_window_days:g} day(s)"
        first_day, last_day = (time.strftime("%Y-%m-%d", time.gmtime(t)) for t in (first, last))
        span = first_day if first_day == last_day else f"{first_day} to {last_day}"
        recent_repeat = w.last_seen is None or w.last_seen - last <= RECENT_SECONDS
        reason("act" if recent_repeat else "watch", "repeat_incidents",
               f"needed a reset, a reboot or service {len(whats)} times within {days} ({span}: {', '.join(whats)}): "
               + ("the repairs are not holding; have it checked by its vendor" if recent_repeat else
                  "in its history; keep watching"))
    if h.get("ecc_uncorrected_aggregate", 0) > 0 and "uncorrectable_ecc" not in {r["code"] for r in reasons}:
        reason("watch", "uncorrectable_ecc_history", f"{h['ecc_uncorrected_aggregate']} uncorrectable ECC "
               "error(s) in the card's lifetime record")
    slowdown = w.thresholds.get("slowdown")
    if slowdown is not None:
        above = w.seconds_at_or_above("gpu", slowdown) if above_slowdown is None else above_slowdown
        if above >= p.health.slowdown_watch_seconds:
            reason("watch", "time_above_slowdown", f"{above / 3600:.2f} h at or above the card's own slowdown "
                   f"temperature ({slowdown:g} °C)")
    thermal = w.throttle_seconds.get("sw_thermal_slowdown", 0.0) + w.throttle_seconds.get("hw_thermal_slowdown", 0.0)
    if busy is None:
        busy = w.busy_seconds(p.busy_utilization_ratio)
    if slowdown is not None and busy > 0:
        # headroom: the time just below the slowdown temperature (time above it has its own reason)
        near = w.seconds_at_or_above("gpu", slowdown - p.health.margin_celsius) - w.seconds_at_or_above("gpu", slowdown)
        if near >= p.health.margin_watch_ratio * busy:
            reason("watch", "close_to_slowdown", f"{100 * min(near / busy, 1):.0f} % of busy time within "
                   f"{p.health.margin_celsius:g} °C below its slowdown temperature ({slowdown:g} °C): little "
                   "headroom; a warmer room or dust takes it into slowdown")
    if busy > 0 and thermal / busy >= p.health.thermal_throttle_watch_ratio:
        reason("watch", "thermal_throttling", f"thermally throttled {100 * thermal / busy:.1f} % of busy time: "
               "the card protects itself by slowing down; check cooling and airflow")
    if trend and trend["rise_ratio"] is not None and trend["rise_ratio"] >= p.health.resistance_rise_watch_ratio:
        reason("watch", "cooling_degrading", f"the die runs {100 * trend['rise_ratio']:.0f} % hotter per watt than "
               "when first measured: dust or dried thermal paste?")
    if not h.get("ecc_enabled") and not h.get("memory_temperature_reported"):
        reason("unknown", "memory_health_unknown", "this card reports neither ECC counters nor memory temperature: "
               "its memory health cannot be known")
    # the verdict is on what the card reports; what it cannot report is said beside it, not instead of it (a GeForce
    # card with nothing wrong is "ok", its memory health "not known")
    status = max((r["severity"] for r in reasons if r["severity"] != "unknown"), key=STATUS_ORDER.index,
                 default="ok")
    return {"status": status, "reasons": reasons, "not_known": [r["code"] for r in reasons
                                                               if r["severity"] == "unknown"],
            "incidents": incident_summary(w),
            "slow_reads": {load: dict(bins) for load, bins in w.slow_reads.items()}}
