"""Wear estimates derived at read time from the accumulators (the health verdict is health.verdict's).

Every estimate is a band computed with three named parameter sets (low / central / high,
from the config), labelled with its model and parameters. Nothing here gives a remaining
life, a "% worn" or a failure probability: the figures are equivalent hours or cycles at a
stated reference, compared with reference usage profiles. See docs/wear-model.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.wear.accumulate import FanWear, GpuWear, weighted_sum

BOLTZMANN_EV_PER_K = 8.617333262e-5
KELVIN = 273.15

# per-day comparisons with the reference profiles need this much observed time: a shorter log (a burst of a few
# minutes) would be extrapolated to a whole day (docs/wear-model.md §7)
MIN_COMPARISON_SECONDS = 6 * 3600


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


def open_fatigue(w: GpuWear, sensor: str, p: WearConfig, band: str = "central") -> float:
    """The part of :func:`fatigue_bands` that is the sensor's open residue: swings not closed yet, which belong to
    no job's line until they close (jobs.attribute gives closed cycles to the lines), in reference cycles."""
    c = p.cycles
    key, factor = _cycle_weight(c.reference_range_celsius, c.reference_peak_celsius, getattr(c.exponent, band),
                                getattr(c.peak_term_kelvin, band))
    return w.residue_sum(sensor, key, factor)


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
