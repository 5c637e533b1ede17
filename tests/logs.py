"""Generated telemetry logs for the import tests: nvidia-smi and llm-gpu-stress logger files with the trouble real
logs have (gaps, spikes, out-of-range and bad cells, [N/A], rows without readings, duplicate and backwards
timestamps, an energy counter that restarts)."""

from __future__ import annotations

import random
import time
from pathlib import Path


def random_log(path: Path, seed: int, cadence: float, rows: int, gpus: int = 2) -> Path:
    """An nvidia-smi-style log with gaps, spikes, out-of-range and bad cells, [N/A], rows without readings,
    duplicate and backwards timestamps, an energy counter with a reset."""
    rnd = random.Random(seed)
    header = ("timestamp, index, name, uuid, temperature.gpu, temperature.memory, power.draw [W], "
              "power.draw.instant [W], enforced.power.limit [W], fan.speed [%], utilization.gpu [%], "
              "clocks.current.sm [MHz], pstate, clocks_event_reasons.active, ecc.errors.corrected.volatile.total, "
              "memory.used [MiB]")
    t0 = 1_714_550_400.0 + rnd.random() * 1000
    lines = [header]
    state = [{"temp": 40.0 + 5 * g, "util": 0, "t": t0} for g in range(gpus)]
    for _ in range(rows):
        g = rnd.randrange(gpus)
        s = state[g]
        r = rnd.random()
        step = cadence * (1 + (rnd.random() - 0.5) * 0.1) if cadence >= 1 else cadence
        if r < 0.005:
            step = cadence * rnd.choice([6, 40, 100, 3000])  # gaps
        elif r < 0.012:
            step = 0.0  # duplicate timestamp
        elif r < 0.015:
            step = -cadence * 2  # backwards
        s["t"] += step
        if rnd.random() < 0.05:
            s["util"] = rnd.choice([0, 2, 50, 85, 97, 100])
        target = 35 + 0.5 * s["util"]
        s["temp"] += (target - s["temp"]) * (0.2 if cadence < 10 else 0.8) + rnd.choice([-1, 0, 0, 1])
        temp = round(s["temp"])
        if rnd.random() < 0.01:
            temp = rnd.choice([140, 5, 200, 90])  # spikes, glitches, out of range
        power = 20 + 4 * s["util"] + rnd.random() * 5
        limit = 400.0
        tm = time.gmtime(s["t"])
        ms = round((s["t"] % 1) * 1000) % 1000
        ts = (f"{tm.tm_year:04d}/{tm.tm_mon:02d}/{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}"
              f".{ms:03d}")
        na = rnd.random()
        cells = [ts, str(g), "NVIDIA Test GPU", f"GPU-{g:08x}-rand",
                 "[N/A]" if na < 0.01 else str(temp),
                 "N/A" if g == 1 else str(temp + 4),
                 "[N/A]" if na < 0.02 else f"{power:.2f} W",
                 f"{power + 1:.2f} W",
                 f"{limit:.2f} W",
                 "[N/A]" if g == 0 else f"{min(100, 30 + s['util'] // 2)} %",
                 f"{s['util']} %",
                 f"{1410 if s['util'] else 210} MHz",
                 "P0" if s["util"] else "P8",
                 f"0x{(4 if power > 390 else (1 if not s['util'] else 0)):016x}",
                 "0",
                 f"{1000 + s['util'] * 10} MiB"]
        if rnd.random() < 0.004:
            cells[4:] = ["[N/A]"] * 12  # no readings at all
        if rnd.random() < 0.002:
            cells[6] = "hot W"  # a bad row
        if rnd.random() < 0.002:
            cells[6] = "250000 mW"  # another unit: the strict parser's path
        if rnd.random() < 0.002:
            cells[10] = "130 %"  # out of range
        lines.append(", ".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def random_llm_log(path: Path, seed: int, rows: int) -> Path:
    """An llm-gpu-stress NVML logger file (no spaces, -1 = not supported) with an energy counter that resets."""
    rnd = random.Random(seed)
    lines = ["timestamp_ns,gpu_index,name,temperature_C,util_gpu_percent,fan_speed_percent,power_draw_W,"
             "total_energy_mJ"]
    t, temp, util, energy = 1_754_380_800.0, 40.0, 0, 56_490_056_446
    for _ in range(rows):
        t += rnd.choice([0.5, 0.5, 0.51, 0.49]) if rnd.random() > 0.003 else rnd.choice([45.0, 900.0])
        if rnd.random() < 0.03:
            util = rnd.choice([0, 1, 60, 100])
        temp += (35 + 0.45 * util - temp) * 0.05 + rnd.choice([-1, 0, 1]) * 0.5
        power = 15 + 2.5 * util + rnd.random()
        energy += int(power * 500)
        if rnd.random() < 0.001:
            energy = rnd.randrange(1000, 100000)  # driver reload: the counter restarts
        tm = time.gmtime(t)
        ts = (f"{tm.tm_year:04d}-{tm.tm_mon:02d}-{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}."
              f"{round((t % 1) * 1000) % 1000:03d}")
        e = "-1" if rnd.random() < 0.01 else str(energy)
        c = str(round(temp)) if rnd.random() > 0.005 else rnd.choice(["160", "-1", "95"])
        lines.append(f"{ts},0,NVIDIA RTX 6000 Ada Generation,{c},{util},{'-1' if util < 50 else 40},"
                     f"{power:.3f},{e}")
    path.write_text("\n".join(lines) + "\n")
    return path
