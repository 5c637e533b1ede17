"""docs/wear-model.md §7 and the code are one source of truth: the reference profiles' figures printed in the
docs are those wear/models.py computes from PROFILES with the default parameters. And the bands are given as
ranges that name the parameters behind each end."""

from __future__ import annotations

import re
from pathlib import Path

from gpuwear.config import Config
from gpuwear.wear.models import (
    PROFILES,
    arrhenius_factor,
    band_range,
    cycle_factor,
    equivalent_cycles,
    thermal_aging_hours,
)

DOC = (Path(__file__).parent.parent / "docs" / "wear-model.md").read_text()
SECTION = DOC[DOC.index("## 7. Reference profiles"):DOC.index("## 8.")]
P = Config().wear


def _table(after: str) -> list[list[str]]:
    """The rows (cells) of the first markdown table after the line starting with ``after``."""
    lines = SECTION[SECTION.index(after):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _number(cell: str) -> float:
    return float(re.match(r"[\d.]+", cell).group())  # type: ignore[union-attr]


def printed(cell: str, value: float) -> bool:
    """Whether the docs print ``value`` as ``cell`` does (its number, rounded to as many decimals)."""
    text = re.match(r"[\d.]+", cell).group()  # type: ignore[union-attr]
    decimals = len(text.split(".")[1]) if "." in text else 0
    return text == f"{value:.{decimals}f}"


def test_acceleration_factors_in_the_docs() -> None:
    rows = _table("Acceleration per hour")
    assert [r[0] for r in rows] == ["35 °C", "70 °C", "75 °C", "85 °C"]
    for row in rows:
        t = _number(row[0])
        for cell, ea in zip(row[1:], (0.3, 0.7, 1.0), strict=True):
            assert printed(cell, arrhenius_factor(t, 60.0, ea)), (row, ea)


def test_thermal_aging_per_day_of_each_profile_in_the_docs() -> None:
    rows = _table("Thermal aging per day")
    assert len(rows) == len(PROFILES)
    for row, prof in zip(rows, PROFILES, strict=True):
        for cell, (_, ea) in zip(row[2:], P.arrhenius.activation_energy_ev.items(), strict=True):
            assert printed(cell, thermal_aging_hours(prof.histogram(), 60.0, ea)), (prof.key, ea)


def test_cycles_per_day_of_each_profile_in_the_docs() -> None:
    """Before: the code's profiles assumed other cycles than the docs (gaming 1.46 vs 2.23 a day, training 1.92
    vs 6.71, stress 1.69 vs 0)."""
    rows = _table("Thermal cycles per day")
    assert len(rows) == len(PROFILES)
    c = P.cycles
    for row, prof in zip(rows, PROFILES, strict=True):
        for cell, (_, m), (_, q) in zip(row[2:], c.exponent.items(), c.peak_term_kelvin.items(), strict=True):
            expected = equivalent_cycles(prof.cycle_bins(), c.reference_range_celsius, c.reference_peak_celsius, m, q)
            assert printed(cell, expected), (prof.key, m)


def test_single_cycle_factors_in_the_docs() -> None:
    c = P.cycles
    found = 0
    for low, high, figures in re.findall(r"(\d+) → (\d+) °C = (\d+\.\d+ / \d+\.\d+ / \d+\.\d+)", SECTION):
        rng, peak = float(high) - float(low), float(high)
        for cell, (_, m), (_, q) in zip(figures.split(" / "), c.exponent.items(), c.peak_term_kelvin.items(),
                                        strict=True):
            assert printed(cell, cycle_factor(rng, peak, 40.0, 80.0, m, q)), (low, high, m)
            found += 1
    for rng, peak, figures in re.findall(r"(\d+) °C peaking at (\d+) °C = (\d+\.\d+ / \d+\.\d+ / \d+\.\d+)", SECTION):
        for cell, (_, m), (_, q) in zip(figures.split(" / "), c.exponent.items(), c.peak_term_kelvin.items(),
                                        strict=True):
            assert printed(cell, cycle_factor(float(rng), float(peak), 40.0, 80.0, m, q)), (rng, peak, m)
            found += 1
    assert found == 18  # six cycles, three parameter sets each


def test_a_band_is_a_range_that_names_its_ends() -> None:
    """Below the reference temperature the low activation energy gives the largest figure (before: band "low"
    was the largest, 19.9 h against central 5.1 and high 1.87)."""
    cool = {"40": 86400.0}
    values = {b: thermal_aging_hours(cool, 60.0, ea) for b, ea in P.arrhenius.activation_energy_ev.items()}
    assert values["low"] > values["central"] > values["high"]
    r = band_range(values, {b: f"Ea {ea:g} eV" for b, ea in P.arrhenius.activation_energy_ev.items()})
    assert (r["smallest"], r["smallest_with"]) == (values["high"], "Ea 1 eV")
    assert (r["largest"], r["largest_with"]) == (values["low"], "Ea 0.3 eV")
