"""`gpuwear jobs`: which job wore which GPU, and by how much.

The JSON document is a stable contract like ``report --json``: keys are added, never
renamed or removed. Shares are of each GPU's listed lines (jobs and idle periods), so the
lines of a GPU add up to 100 % of what was observed in the window.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.models import estimates

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """'90s', '30m', '12h', '1d', '2w' to seconds; ValueError names the problem."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"expected a duration like 30m, 12h, 1d or 2w, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _slice(g: dict[str, Any], p: WearConfig, gpu: GpuWear | None) -> dict[str, Any]:
    w = GpuWear.from_json(g["wear"], 0.0)
    est = estimates(w, p)
    hist = w.temperature_seconds.get("gpu", {})
    total = sum(hist.values())
    mean = {sensor: round(sum(int(t) * s for t, s in h.items()) / sum(h.values()), 2)
            for sensor, h in w.temperature_seconds.items() if sum(h.values()) > 0}
    slowdown = gpu.thresholds.get("slowdown") if gpu else None
    return {
        "uuid": g["uuid"], "gpu_name": gpu.name if gpu else w.name,
        "start": g["start"], "end": g["end"],
        "observed_seconds": round(w.observed_seconds, 3),
        "busy_seconds": round(w.busy_seconds(p.busy_utilization_ratio), 3),
        "energy_joules": round(w.energy_joules, 3),
        "max_celsius": g["max_celsius"], "mean_celsius": mean,
        "time_above_slowdown_seconds": round(w.seconds_at_or_above("gpu", slowdown), 3)
        if slowdown is not None and total else None,
        "throttle_seconds": {k: round(v, 3) for k, v in sorted(w.throttle_seconds.items()) if k != "gpu_idle"},
        "thermal_cycles": round(sum(n for bins in w.cycles.values() for n in bins.values()), 3),
        "thermal_aging_equivalent_hours": {b: est["thermal_aging_equivalent_hours"][b]
                                           for b in ("low", "central", "high")},
        "cycle_fatigue_equivalent_cycles": {b: est["cycle_fatigue_equivalent_cycles"][b]
                                            for b in ("low", "central", "high")},
        "events": g["events"],
    }


def document(records: list[dict[str, Any]], gpus: dict[str, GpuWear], p: WearConfig, since: float | None,
             gpu: str | None = None) -> dict[str, Any]:
    """Jobs (newest first) with per-GPU figures and shares, and per-GPU totals of the listing."""
    jobs = []
    for rec in records:
        slices = [_slice(g, p, gpus.get(g["uuid"])) for g in rec["gpus"] if gpu is None or g["uuid"] == gpu]
        if not slices:
            continue
        end = rec["end"] if rec["end"] is not None else rec["last_seen"]
        jobs.append({"record": rec["record"], "kind": rec["kind"], "id": rec["id"], "user": rec["user"],
                     "name": rec["name"], "start": rec["start"], "end": rec["end"], "running": rec["end"] is None,
                     "duration_seconds": round(end - rec["start"], 3), "gpus": slices})
    totals: dict[str, dict[str, float]] = {}
    for job in jobs:
        for s in job["gpus"]:
            t = totals.setdefault(s["uuid"], {"observed_seconds": 0.0, "energy_joules": 0.0,
                                              "thermal_aging_equivalent_hours": 0.0,
                                              "cycle_fatigue_equivalent_cycles": 0.0})
            t["observed_seconds"] += s["observed_seconds"]
            t["energy_joules"] += s["energy_joules"]
            t["thermal_aging_equivalent_hours"] += s["thermal_aging_equivalent_hours"]["central"]
            t["cycle_fatigue_equivalent_cycles"] += s["cycle_fatigue_equivalent_cycles"]["central"]
    for job in jobs:
        for s in job["gpus"]:
            t = totals[s["uuid"]]
            s["share"] = {
                "observed_time": _ratio(s["observed_seconds"], t["observed_seconds"]),
                "energy": _ratio(s["energy_joules"], t["energy_joules"]),
                "thermal_aging": _ratio(s["thermal_aging_equivalent_hours"]["central"],
                                        t["thermal_aging_equivalent_hours"]),
                "cycle_fatigue": _ratio(s["cycle_fatigue_equivalent_cycles"]["central"],
                                        t["cycle_fatigue_equivalent_cycles"]),
            }
    hottest = max(((j, s) for j in jobs if j["kind"] != "idle" for s in j["gpus"] if s["max_celsius"].get("gpu")),
                  key=lambda js: js[1]["max_celsius"]["gpu"], default=None)
    return {"since": since, "jobs": jobs, "totals": totals,
            "hottest": None if hottest is None else {"record": hottest[0]["record"], "uuid": hottest[1]["uuid"],
                                                     "max_celsius": hottest[1]["max_celsius"]["gpu"]}}


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 6) if whole > 0 else None


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def _label(job: dict[str, Any]) -> str:
    if job["kind"] == "idle":
        return "(idle)"
    if job["kind"] == "imported":
        return f"(imported: {job['id']})"
    return f"{job['name'] or job['id']} [{job['kind']} {job['id']}]" if job["name"] != job["id"] else \
        f"{job['id']} [{job['kind']}]"


def limited(doc: dict[str, Any], limit: int | None) -> dict[str, Any]:
    """The document with its newest ``limit`` jobs (all: None); totals and shares stay the whole window's."""
    if limit is None or len(doc["jobs"]) <= limit:
        return {**doc, "jobs_in_window": len(doc["jobs"])}
    return {**doc, "jobs": doc["jobs"][:limit], "jobs_in_window": len(doc["jobs"])}


def text(doc: dict[str, Any], index_of: dict[str, int], limit: int | None = None) -> str:
    """The jobs as a table a person reads, with who caused what share of each GPU's wear: the newest ``limit``
    (all: None), and how many more there are."""
    if not doc["jobs"]:
        return "No job, idle period or import recorded in this window.\n"
    shown = limited(doc, limit)
    lines = ["Jobs, newest first. Shares are of each GPU's wear in this listing (central estimates);",
             "idle lines are the time between jobs and imported lines the history read from logs, so each",
             "GPU's lines add up to 100 % and to what `gpuwear report` shows for it.", ""]
    header = f"{'JOB':<44} {'USER':<10} {'START':<16} {'DURATION':>9} {'GPU':>3} {'MAX °C':>6} {'ENERGY':>9} " \
             f"{'AGING':>6} {'CYCLES':>6}"
    lines.append(header)
    for job in shown["jobs"]:
        first = True
        for s in job["gpus"]:
            label = (_label(job) + (" (running)" if job["running"] else ""))[:44] if first else ""
            user = (job["user"] or "")[:10] if first else ""
            start = _when(job["start"]) if first else ""
            duration = f"{job['duration_seconds'] / 3600:.2f} h" if first else ""
            gpu = str(index_of.get(s["uuid"], "-"))
            lines.append(f"{label:<44} {user:<10} {start:<16} {duration:>9} {gpu:>3} "
                         f"{s['max_celsius'].get('gpu', float('nan')):>6.0f} {s['energy_joules'] / 3.6e6:>6.2f} kWh "
                         f"{_pct(s['share']['thermal_aging']):>6} {_pct(s['share']['cycle_fatigue']):>6}")
            first = False
    more = len(doc["jobs"]) - len(shown["jobs"])
    if more:
        lines.append(f"... and {more} older line(s) in this window: `gpuwear jobs --all`, `--limit N` or `--since`")
    lines.append("")
    hottest = doc["hottest"]
    if hottest:
        job = next(j for j in doc["jobs"] if j["record"] == hottest["record"])
        lines.append(f"Hottest: {_label(job)} ran GPU {index_of.get(hottest['uuid'], hottest['uuid'])} up to "
                     f"{hottest['max_celsius']:.0f} °C.")
    by_job: dict[str, float] = {}
    total = sum(t["thermal_aging_equivalent_hours"] for t in doc["totals"].values())
    for job in doc["jobs"]:
        name = "idle" if job["kind"] == "idle" else "imported" if job["kind"] == "imported" else _label(job)
        by_job[name] = by_job.get(name, 0.0) + sum(s["thermal_aging_equivalent_hours"]["central"] for s in job["gpus"])
    if total > 0:
        lines.append("Share of all GPUs' thermal aging in this window: " + "; ".join(
            f"{name} {100 * v / total:.0f} %" for name, v in sorted(by_job.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines) + "\n"
