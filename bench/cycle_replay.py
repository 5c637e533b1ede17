"""The simulator's small thermal cycles against real ones (issue 30 item 5): each trace's own power schedule
replayed through the simulator's thermal model and sensor, counted by the same rainflow counter as the recording.

    python bench/cycle_replay.py [--seeds 5]

For each trace of tests/fixtures/traces/ sampled at 1 s, its card's product in the simulator (sim/simulated.py:
rtx6000ada, rtx4060-laptop, whose constants come from these traces' fits, bench/thermal_fit.py) is driven by the
trace's recorded power, sample by sample (the power held over each step, from the trace's fitted ambient and
settled at its first power), at the thermal resistance the card had there (the blower's fixed 30 %: r_th_worst;
the laptop: its one resistance), with the card's wander (the laptop's, fitted here; none for the other), and read
as the simulated NVML reads it (uniform noise of ±0.6 °C, rounded to whole °C): ``replay_die``. The recorded and
the replayed die temperatures go through ``RainflowCounter`` with the daemon's gate
(wear.cycles.hysteresis_celsius). Printed per trace: counted cycles (half cycles count a half) per hour and cycles
of 10 °C or more per hour, recorded and replayed (the median over ``--seeds`` noise seeds, with their range), and
the ratio (the goal: within 1.5x each way). The A100's trace (nvidia-smi -lms, 12 ms, 3.4 min) has no fit of its own:
it goes through the a100-sxm product at its r_th_worst, settled at the trace's first reading.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from thermal_fit import TRACES, fit, load

from gpuwear.config import WearConfig
from gpuwear.sim.simulated import PRODUCTS, replay_die
from gpuwear.wear.rainflow import Cycle, RainflowCounter

CARDS = {"rtx6000ada": ("rtx6000ada", "r_th_worst"), "rtx4060laptop": ("rtx4060-laptop", "r_th_best"),
         "a100": ("a100-sxm", "r_th_worst")}
LARGE_CELSIUS = 10.0


def counted(temps: list[float], gate: float) -> tuple[float, float]:
    """(cycles, cycles of LARGE_CELSIUS or more) the daemon's rainflow counter finds in ``temps`` (residue
    included as half cycles, as the wear figures take it)."""
    found: list[Cycle] = []
    counter = RainflowCounter(gate)
    for x in temps:
        counter.push(x, found.append)
    cycles = found + counter.residue()
    return sum(n for _, _, n in cycles), sum(n for r, _, n in cycles if r >= LARGE_CELSIUS)


def replay(t: np.ndarray, p: np.ndarray, card: str, ambient: float, seed: int) -> list[float]:
    """The die temperatures the simulator's card reads with the trace's power schedule (``replay_die``)."""
    product_key, resistance_field = CARDS[card]
    product = PRODUCTS[product_key]
    return [float(x) for x in replay_die(product, getattr(product, resistance_field), ambient, t.tolist(),
                                         p.tolist(), seed)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    gate = WearConfig().cycles.hysteresis_celsius
    print(f"| trace | hours | cycles per hour: recorded / replayed (range) / ratio | cycles of {LARGE_CELSIUS:g} °C "
          "or more per hour: recorded / replayed (range) / ratio |")
    print("|---|---|---|---|")
    for path in sorted(TRACES.glob("*.csv")):
        card = path.name.split("_")[0]
        if card == "a100":  # no fit of its own (12 ms, 3.4 min): the a100-sxm product, settled at the first reading
            t, p, c = load_nvidia_smi(path)
            ambient = float(c[0] - p[0] * PRODUCTS[CARDS[card][0]].r_th_worst)
        elif card in CARDS:
            t, p, c = load(path)
            ambient = fit(t, p, c, 2)[1]["ambient_celsius"]
        else:
            continue
        hours = float(t[-1] - t[0]) / 3600.0
        recorded = counted([float(x) for x in c], gate)
        runs = [counted(replay(t, p, card, ambient, seed), gate) for seed in range(args.seeds)]
        cells = []
        for i in range(2):
            mine = [r[i] / hours for r in runs]
            median = statistics.median(mine)
            theirs = recorded[i] / hours
            ratio = f"{median / theirs:.2f} x" if theirs else "none in either" if median == 0 else "none recorded"
            cells.append(f"{theirs:.1f} / {median:.1f} ({min(mine):.1f}-{max(mine):.1f}) / {ratio}")
        print(f"| {path.name} | {hours:.2f} | {cells[0]} | {cells[1]} |")
    return 0


def load_nvidia_smi(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seconds from the start, watts, °C of an ``nvidia-smi --query-gpu ... -lms`` CSV (the A100 trace)."""
    t, p, c = [], [], []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh, skipinitialspace=True):
            t.append(datetime.datetime.strptime(row["timestamp"], "%Y/%m/%d %H:%M:%S.%f").timestamp())
            p.append(float(row["power.draw [W]"]))
            c.append(float(row["temperature.gpu"]))
    ta = np.array(t)
    return ta - ta[0], np.array(p), np.array(c)


if __name__ == "__main__":
    sys.exit(main())
