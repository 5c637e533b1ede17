"""The kernel log's cost as the daemon meets an XID storm, measured from outside on the daemon's own CPU clock.

    python bench/kernlog_storm.py [--lines 20000] [--gpus 8] [--against REV]

Issue 51's goal: 20,000 XID lines, of a GPU NVML lists or of a PCI address it does not, write at most one log line a
minute and cost at most 10 us each. For each kind, a daemon on ``--gpus`` simulated H100s follows a kernel-log file
(health.kernel_log: its path); after a quiet window that gives its idle CPU rate, ``--lines`` lines are appended at
once, then one XID of code 999 on a listed GPU, whose count in /metrics says they were all read. The cost a line is
the daemon's CPU (/proc/PID/stat) over that time, less its idle rate over the same time, over the lines; the log lines
are those its stderr gained meanwhile. ``--against REV``: the same for a git revision's code (a temporary worktree
first on its ``PYTHONPATH``). Prints one JSON object per kind and revision.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PYTHON, _die_with_parent, cpu_seconds, free_port, get, revision

QUIET_SECONDS = 10.0
XID_LINE = "NVRM: Xid (PCI:{bus}): {code}, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)"


def bus_of(index: int) -> str:
    """The simulated GPU ``index``'s PCI address as the driver writes it in an Xid line (sim.simulated's)."""
    return f"0000:{0x17 + index * 0x20:02x}:00"


def run(kind: str, lines: int, gpus: int, tree: Path | None, work: Path) -> dict[str, object]:
    scenario = work / "storm.yaml"
    scenario.write_text("gpus:\n" + "".join("  - product: h100-sxm\n" for _ in range(gpus)))
    name = f"{kind}-{'head' if tree is None else 'against'}"
    kern = work / f"kern-{name}.log"
    kern.write_text("")
    config = work / "config.yaml"
    config.write_text(f"health:\n  kernel_log: {kern}\n")
    log = work / f"daemon-{kind}.log"
    port = free_port()
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = f"{tree / 'daemon'}:{env.get('PYTHONPATH', '')}"
    with open(log, "wb") as err:
        proc = subprocess.Popen([PYTHON, "-m", "gpuwear", "run", "--config", str(config), "--simulate",
                                 str(scenario), "--listen", f"127.0.0.1:{port}", "--state-dir", str(work / name)],
                                stdout=subprocess.DEVNULL, stderr=err, env=env, preexec_fn=_die_with_parent)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 120
        while get(url, timeout=5)[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not answer /metrics within 120 s")
            time.sleep(0.05)
        time.sleep(2.0)  # past its start
        quiet_cpu, quiet_at = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(QUIET_SECONDS)
        idle_rate = (cpu_seconds(proc.pid) - quiet_cpu) / (time.monotonic() - quiet_at)
        said_before = log.read_text(errors="replace").count("\n")
        bus = bus_of(0) if kind == "listed" else "000f:01:00"
        storm = "".join(XID_LINE.format(bus=bus, code=13) + "\n" for _ in range(lines))
        start_cpu, start = cpu_seconds(proc.pid), time.monotonic()
        with kern.open("a") as f:
            f.write(storm + XID_LINE.format(bus=bus_of(0), code=999) + "\n")
        while b'xid="999"' not in get(url, timeout=5)[1]:
            if time.monotonic() - start > 300:
                raise RuntimeError("the storm was not read within 300 s")
            time.sleep(0.05)
        elapsed = time.monotonic() - start
        cpu = cpu_seconds(proc.pid) - start_cpu
        said = log.read_text(errors="replace").count("\n") - said_before
        return {"kind": kind, "lines": lines, "gpus": gpus, "revision": "HEAD" if tree is None else tree.name,
                "seconds": round(elapsed, 2), "cpu_seconds": round(cpu, 3),
                "us_per_line": round(1e6 * max(cpu - idle_rate * elapsed, 0.0) / lines, 2),
                "log_lines": said, "log_lines_per_minute": round(said / max(elapsed / 60, 1.0), 2)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--against", help="a git revision to measure beside this checkout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwear-kernlog-") as tmp:
        for kind in ("listed", "unlisted"):
            print(json.dumps(run(kind, args.lines, args.gpus, None, Path(tmp))), flush=True)
            if args.against:
                with revision(args.against) as tree:
                    result = run(kind, args.lines, args.gpus, tree, Path(tmp))
                    result["revision"] = args.against
                    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
