"""Benchmark inputs: scenario files with N simulated GPUs, and a large nvidia-smi CSV log."""

from __future__ import annotations

import math
from pathlib import Path

import yaml

PRODUCTS = ("rtx4090", "h100-sxm", "v100")


def scenario(n: int, folder: Path) -> Path:
    """N GPUs cycling through the three products, each training with evaluation pauses, then a
    stress phase and idle time, staggered so they are not all in the same phase at once."""
    gpus = []
    for i in range(n):
        gpus.append({
            "product": PRODUCTS[i % len(PRODUCTS)],
            "offset_seconds": (i * 397) % 5400,
            "schedule": [
                {"kind": "idle", "seconds": 300},
                {"kind": "train", "seconds": 3600, "utilization": 0.95, "eval_every": 600, "eval_seconds": 60,
                 "eval_utilization": 0.3, "job": f"train-{i % 4}"},
                {"kind": "idle", "seconds": 60},
                {"kind": "stress", "seconds": 900, "job": f"stress-{i % 2}"},
                {"kind": "idle", "seconds": 540},
            ],
        })
    doc = {"description": f"benchmark: {n} GPUs, mixed products", "ambient_celsius": 27, "gpus": gpus, "faults": []}
    path = folder / f"bench-{n}gpu.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# nvidia-smi --query-gpu=<these> --format=csv -l 1 (units in the header and in the values)
SMI_HEADER = ("timestamp, index, name, uuid, pci.bus_id, temperature.gpu, temperature.memory, power.draw [W], "
              "enforced.power.limit [W], fan.speed [%], utilization.gpu [%], utilization.memory [%], "
              "clocks.current.graphics [MHz], clocks.current.sm [MHz], clocks.current.memory [MHz], pstate, "
              "clocks_event_reasons.active, memory.used [MiB], memory.total [MiB], "
              "ecc.errors.corrected.volatile.total, ecc.errors.uncorrected.volatile.total")

_CARDS = (  # name, memory MiB, power limit W, idle W, full W, max SM MHz, mem MHz, fan?, HBM temperature?, ECC?
    ("NVIDIA H100 80GB HBM3", 81559, 700.0, 72.0, 690.0, 1980, 2619, False, True, True),
    ("NVIDIA GeForce RTX 4090", 24564, 450.0, 22.0, 450.0, 2520, 10501, True, False, False),
    ("Tesla V100-PCIE-16GB", 16384, 250.0, 26.0, 250.0, 1380, 877, False, True, True),
)


def smi_csv(rows: int, gpus: int, path: Path, start: float = 1_714_550_400.0) -> Path:
    """``rows`` data rows (``gpus`` GPUs interleaved, one row per GPU per second) as nvidia-smi
    writes them with ``--format=csv``: values with units, ``[N/A]`` where a card has no such
    reading, local time ``YYYY/MM/DD HH:MM:SS.mmm``. Load follows a 20-minute duty cycle so
    temperatures move (thermal cycles, time above thresholds)."""
    import time as _time

    ticks = (rows + gpus - 1) // gpus
    with path.open("w", encoding="utf-8", newline="") as fh:
        fh.write(SMI_HEADER + "\n")
        written = 0
        for t in range(ticks):
            stamp = start + t
            tm = _time.gmtime(stamp)
            ts = (f"{tm.tm_year:04d}/{tm.tm_mon:02d}/{tm.tm_mday:02d} "
                  f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}.{(t * 37) % 1000:03d}")
            lines = []
            for g in range(gpus):
                if written >= rows:
                    break
                name, mem, limit, idle, full, sm, memclk, fan, hbm, ecc = _CARDS[g % len(_CARDS)]
                phase = ((t + g * 150) % 1200) / 1200.0
                util = 0 if phase < 0.25 else (97 if phase < 0.9 else 35)
                power = min(limit, idle + (full - idle) * util / 100.0 + 3.0 * math.sin(t / 7.0 + g))
                temp = 30 + round(power * 0.075 + 2 * math.sin(t / 13.0))
                clock = sm if util else 210
                lines.append(
                    f"{ts}, {g}, {name}, GPU-{g:08x}-5111-4a7e-9c3d-0000benchmark, "
                    f"00000000:{0x17 + 0x20 * g:02X}:00.0, "
                    f"{temp}, {temp + 6 if hbm else 'N/A'}, {power:.2f} W, {limit:.2f} W, "
                    f"{str(min(100, 30 + util // 2)) + ' %' if fan else '[N/A]'}, {util} %, {util * 6 // 10} %, "
                    f"{clock} MHz, {clock} MHz, {memclk if util else memclk // 10} MHz, {'P0' if util else 'P8'}, "
                    f"0x{(0x1 if not util else (0x4 if power >= limit - 1 else 0)):016x}, "
                    f"{int(mem * (0.02 + 0.78 * util / 100))} MiB, {mem} MiB, "
                    f"{'0' if ecc else '[N/A]'}, {'0' if ecc else '[N/A]'}\n")
                written += 1
            fh.write("".join(lines))
    return path
