"""`gpuwear jobs`: which job wore which GPU, and by how much.

The JSON document is a stable contract like ``report --json``: keys are added, never
renamed or removed. Shares are of each GPU's listed lines (jobs and idle periods), so the
lines of a GPU add up to 100 % of what was observed in the window.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.models import BANDS, aging_bands, fatigue_bands

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
    observed, energy, aging, fatigue = _counted(w, p, BANDS)
    hist = w.temperature_seconds.get("gpu", {})
    total = sum(hist.values())
    mean = {sensor: round(sum(int(t) * s for t, s in h.items()) / sum(h.values()), 2)
            for sensor, h in w.temperature_seconds.items() if sum(h.values()) > 0}
    slowdown = gpu.thresholds.get("slowdown") if gpu else None
    return {
        "uuid": g["uuid"], "gpu_name": gpu.name if gpu else w.name,
        "start": g["start"], "end": g["end"],
        "observed_seconds": observed,
        "busy_seconds": round(w.busy_seconds(p.busy_utilization_ratio), 3),
        "energy_joules": energy,
        "max_celsius": g["max_celsius"], "mean_celsius": mean,
        "time_above_slowdown_seconds": round(w.seconds_at_or_above("gpu", slowdown), 3)
        if slowdown is not None and total else None,
        "throttle_seconds": {k: round(v, 3) for k, v in sorted(w.throttle_seconds.items()) if k != "gpu_idle"},
        "thermal_cycles": round(sum(n for bins in w.cycles.values() for n in bins.values()), 3),
        "thermal_aging_equivalent_hours": aging,
        "cycle_fatigue_equivalent_cycles": fatigue,
        "events": g["events"],
    }


def _light(g: dict[str, Any], p: WearConfig) -> dict[str, Any]:
    """What a job's GPU adds to the listing's totals and shares, as :func:`_slice` computes it, for a line that is
    not shown (its other figures are not computed)."""
    observed, energy, aging, fatigue = _counted(GpuWear.from_json(g["wear"], 0.0), p, ("central",))
    return {"uuid": g["uuid"], "observed_seconds": observed, "energy_joules": energy, "max_celsius": g["max_celsius"],
            "thermal_aging_equivalent_hours": aging, "cycle_fatigue_equivalent_cycles": fatigue}


def _counted(w: GpuWear, p: WearConfig, bands: tuple[str, ...],
             ) -> tuple[float, float, dict[str, float], dict[str, float]]:
    """What a line adds to the listing's totals: observed seconds, joules, and the aging and fatigue bands (as
    models.estimates computes them; the rest of estimates is not shown in a listing)."""
    return (round(w.observed_seconds, 3), round(w.energy_joules, 3),
            aging_bands(w.temperature_seconds.get("gpu", {}), p, w, bands), fatigue_bands(w, "gpu", p, bands))


def line_name(job: dict[str, Any]) -> str:
    """A line's name in the page's "who caused its heat aging" (jobs of one name add up)."""
    return str({"idle": "idle time", "imported": f"imported: {job['id']}"}.get(job["kind"])
               or (job["name"] or job["id"]))[:18]


def document(records: Iterable[dict[str, Any]], gpus: dict[str, GpuWear], p: WearConfig, since: float | None,
             gpu: str | None = None, shown: int | None = None) -> dict[str, Any]:
    """Jobs (``records`` newest first, read once: an iterator keeps the memory to what is shown) with per-GPU
    figures and shares, and per-GPU totals of the listing. ``shown``: the newest that many lines are kept whole
    (None: all); every line counts in the totals, the shares by name, the hottest and ``jobs_in_window``."""
    jobs = []
    totals: dict[str, dict[str, float]] = {}
    by_line: dict[str, float] = {}  # the text's "share of all GPUs' thermal aging", by line label
    by_name: dict[str, dict[str, float]] = {}  # per GPU, by line_name: the page's shares
    hottest: tuple[float, dict[str, Any], str] | None = None
    count = 0
    for rec in records:
        whole = shown is None or count < shown
        slices = [(_slice(g, p, gpus.get(g["uuid"])) if whole else _light(g, p)) for g in rec["gpus"]
                  if gpu is None or g["uuid"] == gpu]
        if not slices:
            continue
        count += 1
        end = rec["end"] if rec["end"] is not None else rec["last_seen"]
        job = {"record": rec["record"], "kind": rec["kind"], "id": rec["id"], "user": rec["user"],
               "name": rec["name"], "start": rec["start"], "end": rec["end"], "running": rec["end"] is None,
               "duration_seconds": round(end - rec["start"], 3), "gpus": slices}
        label = "idle" if job["kind"] == "idle" else "imported" if job["kind"] == "imported" else _label(job)
        name = line_name(job)
        for s in slices:
            t = totals.setdefault(s["uuid"], {"observed_seconds": 0.0, "energy_joules": 0.0,
                                              "thermal_aging_equivalent_hours": 0.0,
                                              "cycle_fatigue_equivalent_cycles": 0.0})
            aging = s["thermal_aging_equivalent_hours"]["central"]
            t["observed_seconds"] += s["observed_seconds"]
            t["energy_joules"] += s["energy_joules"]
            t["thermal_aging_equivalent_hours"] += aging
            t["cycle_fatigue_equivalent_cycles"] += s["cycle_fatigue_equivalent_cycles"]["central"]
            by_line[label] = by_line.get(label, 0.0) + aging
            names = by_name.setdefault(s["uuid"], {})
            names[name] = names.get(name, 0.0) + aging
            peak = s["max_celsius"].get("gpu")
            if job["kind"] != "idle" and peak and (hottest is None or peak > hottest[0]):
                hottest = (peak, {"record": job["record"], "uuid": s["uuid"], "max_celsius": peak}, _label(job))
        if whole:
            jobs.append(job)
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
    aging_shares = {uuid: {name: _ratio(v, totals[uuid]["thermal_aging_equivalent_hours"]) for name, v in names.items()}
                    for uuid, names in by_name.items()}
    return {"since": since, "jobs": jobs, "jobs_in_window": count, "totals": totals,
            "hottest": None if hottest is None else hottest[1],
            "hottest_label": None if hottest is None else hottest[2],
            "thermal_aging_by_line": by_line, "thermal_aging_share_by_name": aging_shares}


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
        return doc
    return {**doc, "jobs": doc["jobs"][:limit]}


def text(doc: dict[str, Any], index_of: dict[str, int], limit: int | None = None) -> str:
    """The jobs as a table a person reads, with who caused what share of each GPU's wear: the newest ``limit``
    (all: None), and how many more there are."""
    if not doc["jobs_in_window"]:
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
    more = doc["jobs_in_window"] - len(shown["jobs"])
    if more:
        lines.append(f"... and {more} older line(s) in this window: `gpuwear jobs --all`, `--limit N` or `--since`")
    lines.append("")
    hottest = doc["hottest"]
    if hottest:
        lines.append(f"Hottest: {doc['hottest_label']} ran GPU {index_of.get(hottest['uuid'], hottest['uuid'])} up "
                     f"to {hottest['max_celsius']:.0f} °C.")
    by_job = doc["thermal_aging_by_line"]
    total = sum(t["thermal_aging_equivalent_hours"] for t in doc["totals"].values())
    if total > 0:
        lines.append("Share of all GPUs' thermal aging in this window: " + "; ".join(
            f"{name} {100 * v / total:.0f} %" for name, v in sorted(by_job.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines) + "\n"
