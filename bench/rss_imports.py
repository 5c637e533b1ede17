"""Where resident memory comes from: RSS after each import, in a fresh interpreter.

    python bench/rss_imports.py gpuwear|nvitop-exporter

Imports the modules the program loads, in a fixed order (the parts shared by every process
over the fake library first: pynvml, yaml, the simulation, the fake), and prints one JSON
object: [module, RSS increase in bytes, modules newly loaded] per step, plus the total.
"""

from __future__ import annotations

import importlib
import json
import sys

SHARED = ["ctypes", "yaml", "pynvml", "gpuwear.sim.simulated", "gpuwear.sim.fakenvml",
          "gpuwear.backends.nvml"]
PROGRAMS = {
    "gpuwear": ["sqlite3", "gpuwear.tracker",
                "gpuwear.jobs.resolve", "gpuwear.collector", "gpuwear.webconfig", "gpuwear.service", "gpuwear.cli"],
    "nvitop-exporter": ["prometheus_client", "psutil", "nvitop", "nvitop_exporter", "nvitop_exporter.cli"],
}


def rss() -> int:
    """This process's resident memory in bytes (/proc/self/status VmRSS): read without psutil, which the daemon
    no longer loads and nvitop-exporter does (a step of its own below)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def main() -> int:
    steps = []
    last = base = rss()
    for name in SHARED + PROGRAMS[sys.argv[1]]:
        before = len(sys.modules)
        importlib.import_module(name)
        now = rss()
        steps.append([name, now - last, len(sys.modules) - before])
        last = now
    json.dump({"program": sys.argv[1], "interpreter": base, "steps": steps, "total": last,
               "shared": SHARED, "columnar_loaded": sorted({"numpy", "pyarrow"} & set(sys.modules))}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
