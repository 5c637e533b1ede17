"""Fit the simulator's two-pole thermal model to real traces: die temperature = ambient + two first-order responses
to the power, a fast one (the die and its spreader) and a slow one (the heatsink).

    .venv/bin/python bench/thermal_fit.py            # every 1 s trace in tests/fixtures/traces/

    T(t) = T_amb + x_die(t) + x_sink(t),   dx_i/dt = (R_i P(t) - x_i) / tau_i

Each step holds the power of the sample that starts it (the update the simulator uses). For fixed time constants the
model is linear in (T_amb, R_die, R_sink): a least-squares solve per (tau_die, tau_sink) on a log grid, the best pair
kept; then the same with one pole, for comparison. Prints the constants and the RMS error (°C) of each fit; the
constants the simulator uses (sim/simulated.py, THERMAL_*) come from the rtx6000ada trace, whose blower fan
runs at a constant 30 % (one thermal resistance: a fixed fan), and tests/test_simulated.py holds the simulator to it.
"""

from __future__ import annotations

import csv
import datetime
import math
import sys
from pathlib import Path

import numpy as np

TRACES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "traces"


def load(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds from the start, watts, °C of a llm-gpu-stress logger trace."""
    t, p, c = [], [], []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            when = datetime.datetime.strptime(row["timestamp_ns"], "%Y-%m-%d %H:%M:%S.%f").timestamp()
            t.append(when)
            p.append(float(row["power_draw_W"]))
            c.append(float(row["temperature_C"]))
    ta = np.array(t)
    return ta - ta[0], np.array(p), np.array(c)


def response(t: np.ndarray, p: np.ndarray, tau: float) -> np.ndarray:
    """x with dx/dt = (P - x)/tau, P held over each step, starting settled at P[0] (unit resistance)."""
    x = np.empty(len(p))
    x[0] = p[0]
    for k in range(1, len(p)):
        a = 1.0 - math.exp(-(t[k] - t[k - 1]) / tau)
        x[k] = x[k - 1] + (p[k - 1] - x[k - 1]) * a
    return x


def fit(t: np.ndarray, p: np.ndarray, c: np.ndarray, poles: int) -> tuple[float, dict[str, float]]:
    """(RMS °C, constants) of the best fit with one or two poles."""
    taus = np.geomspace(1.0, 2000.0, 48)  # below the 1 s sampling interval a pole is a step
    cache = {float(tau): response(t, p, float(tau)) for tau in taus}
    best: tuple[float, dict[str, float]] = (math.inf, {})
    pairs = [(a, None) for a in taus] if poles == 1 else [(a, b) for a in taus for b in taus if b > 2 * a]
    for fast, slow in pairs:
        columns = [np.ones(len(t)), cache[float(fast)]] + ([cache[float(slow)]] if slow is not None else [])
        a = np.column_stack(columns)
        coef, *_ = np.linalg.lstsq(a, c, rcond=None)
        if (coef[1:] < 0).any():
            continue
        rms = float(np.sqrt(np.mean((a @ coef - c) ** 2)))
        if rms < best[0]:
            named = {"ambient_celsius": coef[0], "r_die": coef[1], "tau_die_seconds": float(fast)}
            if slow is not None:
                named |= {"r_sink": coef[2], "tau_sink_seconds": float(slow)}
            best = (rms, named)
    return best


def main() -> int:
    for path in sorted(TRACES.glob("*_1s_*.csv")):
        t, p, c = load(path)
        print(f"{path.name}: {len(t)} samples, {t[-1] / 60:.0f} min, {p.min():.0f}-{p.max():.0f} W, "
              f"{c.min():.0f}-{c.max():.0f} °C")
        for poles in (1, 2):
            rms, k = fit(t, p, c, poles)
            share = k["r_die"] / (k["r_die"] + k.get("r_sink", 0.0))
            print(f"  {poles} pole(s): RMS {rms:.2f} °C; " + ", ".join(f"{n} {v:.4g}" for n, v in k.items())
                  + (f"; die share of the resistance {share:.3f}" if poles == 2 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
