"""`gpuwear report`: the ledger as a stable JSON document and as words a person can read.

The JSON keys are a contract (docs/commands.md, "report --json"): add keys, never rename or remove them; a
change of meaning bumps SCHEMA_VERSION.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.health import past_cards, peer_rates, slow_reads_text, verdict
from gpuwear.health.judgements import CleanRuns, card_or_code
from gpuwear.health.rules import CARRIED_WORDS
from gpuwear.ledger import Event, Ledger
from gpuwear.ledger.errors import printable
from gpuwear.ledger.records import CHANGED
from gpuwear.wear.accumulate import CARRIED_BY_LOCATION, CARRIED_COUNTS, GpuWear
from gpuwear.wear.models import MIN_COMPARISON_SECONDS, WORD_PROFILES, arrhenius_factor, estimates, resistance_trend
from gpuwear.wear.schema import READING_GROUPS

# the JSON document's version (docs/commands.md): 1 had none; 2 gives every band its ends by value
SCHEMA_VERSION = 2
_BAND = ("low", "central", "high")

THRESHOLD_SENSORS = {"slowdown": "gpu", "gpu_max": "gpu", "memory_max": "memory", "shutdown": "gpu"}


def _cycles(bins: dict[str, float]) -> list[dict[str, float]]:
    rows = []
    for key, count in bins.items():
        rng, peak = (int(v) for v in key.split(":"))
        rows.append({"range_celsius": rng, "max_celsius": peak, "count": round(count, 3)})
    return sorted(rows, key=lambda r: (-r["range_celsius"], -r["max_celsius"]))


def readings(w: GpuWear, live: bool) -> dict[str, str]:
    """Per kind of reading: "measured" (the history holds it, even if it never fired), "not_in_logs" (the history
    is imported logs only, which lacked the columns) or "not_reported" (the card, sampled live, never gave it)."""
    return {group: "measured" if group in w.seen else "not_reported" if live else "not_in_logs"
            for group in READING_GROUPS}


EVENTS_SHOWN = 50  # the newest events of each GPU a report lists


def gpu_document(w: GpuWear, p: WearConfig, events: list[Event], live: bool = True,
                 peers: Mapping[str, list[float]] | None = None, host_last_seen: float | None = None) -> dict[str, Any]:
    """The report of one GPU: measured health first, then stress, then estimate bands. ``live``: the ledger holds
    live history of it (else only imported logs, which say nothing about what the card could report); ``peers``:
    the loaded-hour error rates of the host's other GPUs of its product (health.peer_rates)."""
    est = estimates(w, p)
    health = verdict(w, p, resistance_trend(w), peers=peers, host_last_seen=host_last_seen)
    if not live:
        for r in health["reasons"]:
            if r["code"] == "memory_health_unknown":
                r["text"] = ("the imported logs hold neither ECC counters nor memory temperature: its memory health "
                             "is not known from them")
                r["rule"] = "what the imported logs hold: no ECC counters, no memory temperature"
    return {
        "uuid": w.uuid, "name": w.name, "serial": w.serial,
        "first_seen": w.first_seen, "last_seen": w.last_seen, "sampled_live": live,
        "vgpu_guest": bool(w.health.get("vgpu_guest")),  # NVML's virtualization mode VGPU: a VM's share of a card
        "readings": readings(w, live),
        "health": {**health, "measured": dict(w.health), "xid_events": dict(w.xids),
                   "gpu_lost_events": w.lost_events},
        # what the card carried of its lifetime counts when gpuwear first read each (before gpuwear: inherited)
        "carried": {name: {"count": w.health[f"carried {name}"], "first_read": w.last_event.get(f"first read {name}")}
                    for name in sorted(CARRIED_COUNTS) if f"carried {name}" in w.health},
        # ... and of its aggregate ECC counts, by where they came (nvmlDeviceGetMemoryErrorCounter: DRAM, SRAM)
        "carried_by_location": {name: w.health[f"carried {name}"] for name in CARRIED_BY_LOCATION
                                if f"carried {name}" in w.health},
        # the card's own dates of the retired pages it carried (nvmlDeviceGetRetiredPages_v2): oldest, newest
        "carried_retired_dates": {"oldest": w.health["retired_pages_oldest_wall"],
                                  "newest": w.health["carried retired_pages_newest_wall"]}
        if {"retired_pages_oldest_wall", "carried retired_pages_newest_wall"} <= w.health.keys() else None,
        # its power-smoothing circuitry's rated life left (NVML field 258; Blackwell and newer datacenter boards):
        # now, and at gpuwear's first read of it (when)
        "power_smoothing": {"life_percent": w.health["power_smoothing_life_percent"],
                            "first_read": w.health.get("carried power_smoothing_life_percent"),
                            "first_read_at": w.last_event.get("first read power_smoothing_life_percent")}
        if "power_smoothing_life_percent" in w.health else None,
        # its firmware: at gpuwear's first sight of it ("first", with "at"), now, and the latest change of each
        "firmware": dict(w.firmware),
        "observed_seconds": round(w.observed_seconds, 3),
        "busy_seconds": round(w.busy_seconds(p.busy_utilization_ratio), 3),
        "busy_utilization_ratio": p.busy_utilization_ratio,
        "down_seconds": round(w.down_seconds, 3),
        "unobserved_seconds": round(w.gap_seconds, 3), "gaps": w.gaps,
        "coverage_ratio": None if w.coverage() is None else round(w.coverage() or 0.0, 6),
        "time_at_temperature_seconds": {
            sensor: {t: round(s, 3) for t, s in sorted(hist.items(), key=lambda kv: int(kv[0]))}
            for sensor, hist in w.temperature_seconds.items()},
        "thresholds_celsius": {k: v for k, v in w.thresholds.items() if k in THRESHOLD_SENSORS},
        "time_above_thresholds_seconds": {
            name: round(w.seconds_at_or_above(THRESHOLD_SENSORS[name], value), 3)
            for name, value in w.thresholds.items()
            if name in THRESHOLD_SENSORS and THRESHOLD_SENSORS[name] in w.temperature_seconds},
        "thermal_cycles": {sensor: _cycles(w.all_cycles(sensor)) for sensor in w.cycles},
        "energy_joules": round(w.energy_joules, 3),
        "energy_source_seconds": {"counter": round(w.energy_counter_seconds, 3),
                                  "integrated_power": round(w.energy_integrated_seconds, 3)},
        "power_limit_seconds": round(w.power_limit_seconds, 3),
        "throttle_seconds": {k: round(v, 3) for k, v in sorted(w.throttle_seconds.items())},
        "violation_seconds": {k: round(v, 3) for k, v in sorted(w.violation_seconds.items())},
        "thermal_resistance": resistance_trend(w),
        **est,
        "limits": limits(w),
        "hotter": hotter(w, p),
        "events": [{"wall": e.wall, "kind": e.kind, **e.detail} for e in events[-EVENTS_SHOWN:]],
    } | {"answer": answer(w.observed_seconds, est["profile_equivalent_days"])}


ANSWER_RULE = ("gpuwear's rule, not a maker's: its wear a day against the reference profiles (docs/wear-model.md "
               "§7): at most 4 h of gaming a day's, light; heat aging past a 24/7 stress test's across the models' "
               "parameters, a concern; between, heavy use")


def answer(observed_seconds: float, equivalents: dict[str, Any]) -> dict[str, Any]:
    """Is deep learning wearing this card? One plain sentence, by :data:`ANSWER_RULE`: the larger of its heat aging
    and its thermal cycling in days of gaming 4 h a day (wear.models.profile_equivalents), that a day against the
    days it was observed, and the level ("light", "heavy", "concern"; "unknown" under
    wear.models.MIN_COMPARISON_SECONDS observed)."""
    days = observed_seconds / 86400.0
    gaming = equivalents["gaming_4h_day"]
    stress = equivalents["stress_24_7"]["thermal_aging"]
    figures = [f for f in (gaming["thermal_aging"], gaming["cycle_fatigue"]) if f is not None]
    if observed_seconds < MIN_COMPARISON_SECONDS or not figures:
        return {"level": "unknown", "rule": ANSWER_RULE,
                "sentence": f"Observed for {duration(observed_seconds)} so far: too little to say yet how it is "
                            "being worn."}
    top = max(figures, key=lambda f: f["central"])
    if stress is not None and stress["smallest"] > days:
        level, words = "concern", ("more heat wear a day than a 24/7 stress test at 85 °C, a concern: check its "
                                   "cooling and airflow")
    elif top["central"] <= days:
        level, words = "light", "no more wear a day than 4 h of gaming a day, well within everyday use"
    else:
        level, words = "heavy", ("more wear a day than 4 h of gaming a day but less than a 24/7 stress test, the wear "
                                 "of heavy use a card is built for")
    band = between(top["smallest"], top["largest"])
    return {"level": level, "rule": ANSWER_RULE, "gaming_days": top,
            "sentence": f"Over the {duration(observed_seconds)} observed, it was worn about as much as "
                        f"{roughly(top['central'])} days of gaming 4 h a day would wear it ({band} days): {words}."}


HOTTER_CELSIUS = 10.0  # "what would change the answer": the heat aging rate this much above the card's usual


def limits(w: GpuWear) -> dict[str, float | None]:
    """The die against the card's own limits as NVML reports them (nvmlDeviceGetTemperatureThreshold, or the
    product's where an imported log names it): the share of observed time at or above its slowdown temperature, its
    hottest reading against its maximum operating temperature (°C); None where not known."""
    hist = w.temperature_seconds.get("gpu", {})
    slowdown, gpu_max = w.thresholds.get("slowdown"), w.thresholds.get("gpu_max")
    total = sum(hist.values())
    return {"slowdown_celsius": slowdown, "gpu_max_celsius": gpu_max,
            "at_or_above_slowdown_ratio": (round(w.seconds_at_or_above("gpu", slowdown) / total, 6)
                                           if slowdown is not None and total > 0 else None),
            "hottest_celsius": float(max(int(t) for t in hist)) if hist else None}


def hotter(w: GpuWear, p: WearConfig) -> dict[str, Any] | None:
    """How much faster heat aging would run HOTTER_CELSIUS above the card's usual die temperature (the median of its
    observed time), per band of the activation energy: the Arrhenius factor, model and parameters as the estimate
    above (wear.models.arrhenius_factor); None without a die temperature."""
    usual = _percentile(w.temperature_seconds.get("gpu", {}), 0.5)
    if usual is None:
        return None
    ea = p.arrhenius.activation_energy_ev
    return {"usual_celsius": usual, "by_celsius": HOTTER_CELSIUS,
            "heat_aging_factor": {band: round(arrhenius_factor(usual + HOTTER_CELSIUS, usual, getattr(ea, band)), 3)
                                  for band in ("low", "central", "high")}}


def documents(ledger: Ledger, p: WearConfig, where: str, simulated: bool,
              gpu: str | None = None, with_jobs: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The report document of a ledger (or one GPU of it) and, ``with_jobs``, its jobs document (the shares of
    every retained job, for the page, from the lines the ledger keeps), read in one go."""
    from gpuwear.jobs import lines
    from gpuwear.jobs import report as jobreport

    live = ledger.load(p.cycles.hysteresis_celsius)
    wears = ledger.load_all(p.cycles.hysteresis_celsius, live)
    events = {uuid: ledger.events(uuid, last=EVENTS_SHOWN) for uuid in wears}
    selected = [w for uuid, w in sorted(wears.items()) if gpu is None or uuid == gpu]
    key = lines.key(p)
    doc = document(selected, p, events, where, simulated, set(live),
                   clean_runs=lambda names, since: ledger.clean_runs(names, since, key))
    for g in doc["gpus"]:
        count, newest = ledger.set_aside_of(g["uuid"])
        if newest is not None:
            g["set_aside"] = {"count": count, "newest": {"wall": newest[0], "what": newest[1], "why": newest[2]}}
        if imported := ledger.imports_of(g["uuid"]):
            g["elsewhere"] = elsewhere(imported, live.get(g["uuid"]))
    if not with_jobs:
        return doc, None
    return doc, jobreport.ledger_document(ledger, live, p, None, gpu, shown=0, by_label=False)


def document(wears: list[GpuWear], p: WearConfig, events: dict[str, list[Event]], ledger: str,
             simulated: bool, live: set[str] | None = None, clean_runs: CleanRuns | None = None) -> dict[str, Any]:
    """``live``: the GPUs the ledger holds live history of (None: all of them); they alone are each other's peers
    (an imported history is another host's). ``clean_runs``: the ledger's job history, for card or code."""
    host_live = [w for w in wears if (live is None or w.uuid in live) and w.last_seen is not None]
    by_uuid = {w.uuid: w for w in host_live}
    replaced = {old: by_uuid[new] for old, new in past_cards(
        (w.uuid, w.pci_bus_id, w.first_seen, w.last_seen) for w in host_live).items()}
    peers = peer_rates({w.uuid: w for w in wears if live is None or w.uuid in live}, p)
    # a GPU of this host not seen for three saves while the others were: missing (off the bus, out of the box) or
    # removed (health's gpu_missing rule); the daemon's /healthz and metrics say it live, the ledger only since when.
    # One whose slot holds another card seen after it was replaced: a past card, not a missing one
    host = max((w.last_seen for w in host_live if w.last_seen is not None), default=None)
    gpus = [gpu_document(w, p, events.get(w.uuid, []), live is None or w.uuid in live, peers.get(w.uuid),
                         host if w in host_live and w.uuid not in replaced else None) for w in wears]
    judged = card_or_code({w.uuid: w for w in wears if live is None or w.uuid in live}, p, clean_runs)
    for g in gpus:
        g["card_or_code"] = judged.get(g["uuid"], [])
        if any(r["code"] == "gpu_missing" for r in g["health"]["reasons"]):
            g["not_seen"] = {"last_seen": g["last_seen"], "host_last_seen": host}
        if (by := replaced.get(g["uuid"])) is not None:
            g["replaced_by"] = {"uuid": by.uuid, "first_seen": by.first_seen, "pci_bus_id": by.pci_bus_id}
    for g in gpus:
        _band_ends(g)
    return {"schema_version": SCHEMA_VERSION, "ledger": ledger, "simulated": simulated, "gpus": gpus}


def _band_ends(node: Any, key: str = "") -> None:
    """Give every band of a GPU's document (``low``, ``central``, ``high``: its value with each of the model's
    parameter sets, so ``low`` may be the larger) its ends by value, ``smallest`` and ``largest``; the parameters'
    own values (under ``parameters``) are not a band."""
    if isinstance(node, dict) and key != "parameters":
        if all(isinstance(node.get(b), (int, float)) for b in _BAND) and "smallest" not in node:
            node["smallest"], node["largest"] = min(node[b] for b in _BAND), max(node[b] for b in _BAND)
        for k, v in node.items():
            _band_ends(v, k)
    elif isinstance(node, list):
        for v in node:
            _band_ends(v)


_ABSENT = {"not_in_logs": "not in the imported logs", "not_reported": "not reported by this card"}


# -- words ------------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """A time span in words: days past 48 h, hours past one, minutes past one, else seconds (a one-minute burst of a
    log read "busy 0 min", issue 53)."""
    h = seconds / 3600
    if h >= 48:
        return f"{h / 24:.1f} days"
    if h >= 1:
        return f"{h:.1f} h"
    if seconds >= 59.5:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 1 or seconds == 0 else f"{seconds:.2g} s"


def _percentile(hist: dict[str, float], q: float) -> int | None:
    total = sum(hist.values())
    if total <= 0:
        return None
    acc = 0.0
    for t, s in sorted(hist.items(), key=lambda kv: int(kv[0])):
        acc += s
        if acc >= q * total:
            return int(t)
    return None


def roughly(x: float) -> str:
    """A figure a person reads at a glance: two significant digits, no exponent."""
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _span(hours: float) -> str:
    return duration(hours * 3600)


def between(low: Any, high: Any, show: Callable[[Any], str] | None = None) -> str:
    """'LOW to HIGH' as ``show`` writes them (:func:`roughly` by default); one value where both read the same: a
    band that is one value is not '4 min to 4 min'."""
    a, b = (show or roughly)(low), (show or roughly)(high)
    return a if a == b else f"{a} to {b}"


def range_text(r: dict[str, Any], show: Any) -> str:
    """'smallest (with ...) to largest (with ...)'; one value, with both parameter sets, where they read the same."""
    if show(r["smallest"]) == show(r["largest"]):
        return f"{show(r['smallest'])} with {r['smallest_with']} and with {r['largest_with']}"
    return f"{show(r['smallest'])} with {r['smallest_with']} to {show(r['largest'])} with {r['largest_with']}"


def _profile(d: dict[str, Any], key: str) -> dict[str, Any]:
    return next(p for p in d["reference_profiles"] if p["profile"] == key)


def _incidents_line(incidents: dict[str, Any]) -> str:
    """The GPU's kept incidents (resets, reboots, service) in one line: how many, when, how far apart."""
    first, last = (time.strftime("%Y-%m-%d", time.gmtime(incidents[k])) for k in ("first", "last"))
    text = f"Incidents that called for a reset, a reboot or service: {incidents['kept']}"
    if incidents["mean_seconds_between"] is None:
        return f"{text}, on {first}"
    return f"{text}, {first} to {last}, {incidents['mean_seconds_between'] / 86400:.1f} day(s) apart on average"


def _health_words(d: dict[str, Any]) -> str:
    h = d["health"]
    shown = [r for r in h["reasons"] if r["severity"] != "unknown"]
    if h["status"] in ("act", "watch"):
        first = next(r for r in shown if r["severity"] == h["status"])
        lead = "It needs action now" if h["status"] == "act" else "Keep an eye on it"
        return f"{lead}: {first['text']}."
    if not d["sampled_live"]:  # imported logs only: they, not the card, are what lacks the columns
        text = "Nothing in its logs is wrong"
        if h.get("not_known"):
            text += " (they hold no ECC counters or memory temperature, so its memory health is not known from them)"
        return text + "."
    text = "Nothing it reports is wrong"
    if h.get("not_known"):
        text += " (it reports no ECC counters or memory temperature, so its memory health is not known)"
    return text + "."


def _gaming_days(days: dict[str, float] | None, verb: str) -> str:
    """How many days of 4-h-a-day gaming a figure amounts to, in words, with the band across the model's parameter
    sets (``days``: profile_equivalent_days' entry; ``verb``: "do" or "make")."""
    if days is None:
        return ""
    if days["largest"] < 0.1:
        return f", less than a tenth of what a day of gaming 4 h a day {'does' if verb == 'do' else 'makes'}"
    band = between(days["smallest"], days["largest"])
    return f", about what {roughly(days['central'])} days of gaming 4 h a day {verb} ({band} days)"


def _larger_stress(d: dict[str, Any]) -> str:
    """Which mechanism is the larger stress against gaming, only where the data is long enough to compare (the
    comparison minimum) and every pairing of the two bands agrees on it; "" otherwise."""
    gaming = d["profile_equivalent_days"]["gaming_4h_day"]
    heat, cycles = gaming["thermal_aging"], gaming["cycle_fatigue"]
    if not d["comparison"]["compared"] or heat is None or cycles is None or min(heat["smallest"],
                                                                               cycles["smallest"]) <= 0:
        return ""
    ratios = [cycles[c] / heat[h] for h in ("low", "central", "high") for c in ("low", "central", "high")]
    if min(ratios) >= 1.5:
        larger, low, high = "thermal cycling", min(ratios), max(ratios)
    elif max(ratios) <= 1 / 1.5:
        larger, low, high = "heat aging", 1 / max(ratios), 1 / min(ratios)
    else:
        return ""
    return f" Measured against gaming, {larger} is the larger stress here ({between(low, high)} times the other)."


def plain_words(d: dict[str, Any]) -> str:
    """The answer to "is this card being worn?" in a few sentences: measured health, both wear mechanisms on a
    scale a person grasps, against everyday references, each figure with its band, and what it rests on."""
    health = _health_words(d)
    if d["observed_seconds"] < 60:
        return f"{health} Too little observed yet to say how it is being worn."
    a, c = d["thermal_aging_equivalent_hours"], d["cycle_fatigue_equivalent_cycles"]
    gaming = d["profile_equivalent_days"]["gaming_4h_day"]
    heat_days = _gaming_days(gaming["thermal_aging"], "do")
    text = (f"{health} Heat aged its chip about as much as {_span(a['central'])} at a steady "
            f"{a['reference_celsius']:g} °C would "
            f"({between(a['range']['smallest'], a['range']['largest'], _span)}){heat_days}"
            f"; its temperature swings were worth about {roughly(c['central'])} full swings from "
            f"{c['reference_peak_celsius'] - c['reference_range_celsius']:g} °C up to "
            f"{c['reference_peak_celsius']:g} °C and back ({between(c['range']['smallest'], c['range']['largest'])})"
            f"{_gaming_days(gaming['cycle_fatigue'], 'make')}.")
    text += _larger_stress(d)
    first = d["first_seen"]
    since = f" since {time.strftime('%Y-%m-%d', time.gmtime(first))}" if first is not None else ""
    coverage = d["coverage_ratio"]
    share = f" ({100 * coverage:.0f} % of that time)" if coverage is not None else ""
    return (text + _limits_words(d) + _change_words(d) + _shared_words(d)
            + f" This rests on {duration(d['observed_seconds'])} observed"
            f"{since}{share}; nothing before is known. Wear is an estimate from models (docs/wear-model.md), not a "
            "measured remaining life.")


def _shared_words(d: dict[str, Any]) -> str:
    """What a vGPU's figures are (NVML reads a vGPU guest's temperatures, power and fans from the physical GPU)."""
    if not d.get("vgpu_guest"):
        return ""
    return (" It is a vGPU, this virtual machine's share of a physical GPU: the temperatures, power and fans these "
            "figures rest on are the physical card's, under the work of every virtual machine on it while this one "
            "ran, not this machine's alone.")


def _limits_words(d: dict[str, Any]) -> str:
    """The die against NVIDIA's limits for the card, in a sentence (``limits``)."""
    lim = d.get("limits") or {}
    share, slowdown = lim.get("at_or_above_slowdown_ratio"), lim.get("slowdown_celsius")
    hottest, gpu_max = lim.get("hottest_celsius"), lim.get("gpu_max_celsius")
    if share is None or slowdown is None:
        return " Its own temperature limits are not known here, so its heat is not judged against them."
    time_share = "none" if share == 0 else "under 1 %" if share < 0.01 else f"{100 * share:.0f} %"
    text = (f" Against NVIDIA's limits for this card: {time_share} of its observed time at or above its slowdown "
            f"temperature ({slowdown:g} °C), where it slows itself down to protect itself")
    if hottest is not None and gpu_max is not None:
        text += f"; its hottest reading {hottest:g} °C against its maximum operating temperature of {gpu_max:g} °C"
    elif hottest is not None:
        text += f"; its hottest reading {hottest:g} °C"
    return text + "."


def _change_words(d: dict[str, Any]) -> str:
    """What would change the answer, in a sentence (``hotter``)."""
    h = d.get("hotter")
    if not h:
        return ""
    f = h["heat_aging_factor"]
    lo, hi = min(f["low"], f["high"]), max(f["low"], f["high"])
    return (f" What would change this: {h['by_celsius']:g} °C hotter than its usual {h['usual_celsius']:g} °C, heat "
            f"aging runs about {roughly(f['central'])} times as fast ({between(lo, hi)}), and "
            "larger or hotter swings raise the cycling figure; a health reason would matter more than either.")


# Meta, "The Llama 3 Herd of Models" (2024), table 5: the 419 unexpected interruptions of 54 days of training on
# 16,384 H100 GPUs, by cause (the GPU-side ones)
FIELD_INTERRUPTIONS = 419
FIELD_CAUSES = (("faulty GPUs, NVLink included", 148), ("GPU HBM3 memory", 72), ("GPU SRAM memory", 19),
                ("GPU system processor (GSP firmware)", 17), ("GPU thermal interface and sensor", 6))


def risk_seen(d: dict[str, Any]) -> str:
    """How much of a GPU's real risk the estimates and the verdict see, in one paragraph: what field data puts on
    heat and on the rest (cited), and which of those this card's verdict watches."""
    causes = "; ".join(f"{what} {n} ({100 * n / FIELD_INTERRUPTIONS:.1f} %)" for what, n in FIELD_CAUSES)
    measured = d["health"]["measured"]
    watched = ["XIDs (from NVML's events and the kernel log: GSP firmware faults, the GPU falling off the bus)",
               "the GPU lost or missing"]
    if measured.get("ecc_enabled") or any(k.startswith(("ecc_", "remapped_rows", "retired_pages")) and v
                                          for k, v in measured.items()):
        watched.insert(0, "memory errors (ECC counters, row remapping or page retirement)")
    else:
        watched.append("not its memory errors: the card reports no ECC counters")
    if d.get("sampled_live"):  # what the daemon counts as it samples; imported logs hold none of it
        watched.append("error counters that bleed under load (corrected ECC, PCIe replays, NVLink CRC) and NVML "
                       "calls that stall")
    if any(k.startswith("pcie_aer_") for k in measured):
        watched.append("uncorrectable PCIe errors the kernel counts (AER)")
    if "nvlink_links_active" in measured:
        watched.append("its NVLink links going down or retraining")
    if "pcie_link_width" in measured:
        watched.append("its PCIe link trained below what card and slot allow")
    return (f"What this sees of the risk: of {FIELD_INTERRUPTIONS} unexpected interruptions of Llama 3's training on "
            f"16,384 H100s, GPU causes were {causes} (Meta, The Llama 3 Herd of Models, table 5): heat is a small "
            f"part, which the wear estimates above are about. Its health verdict watches " + ", ".join(watched) + ".")


def _wear_lines(d: dict[str, Any]) -> list[str]:
    """Both mechanisms, each on an absolute scale and against everyday profiles (not against 24/7 training, which a
    deep-learning card would only be compared with itself), and the card's own busy and idle time."""
    a, c = d["thermal_aging_equivalent_hours"], d["cycle_fatigue_equivalent_cycles"]
    comparison = d["comparison"]
    out = ["  How this is estimated (named models, each with its band; not a remaining life):",
           f"    Heat aging (Arrhenius): about {_span(a['central'])} at a steady {a['reference_celsius']:g} °C "
           f"(central estimate; {range_text(a['range'], _span)})",
           f"    Thermal cycling (Coffin-Manson): about {roughly(c['central'])} equivalent full "
           f"{c['reference_range_celsius']:g} °C cycles peaking at {c['reference_peak_celsius']:g} °C (central "
           f"estimate; {range_text(c['range'], roughly)})"]
    if comparison["compared"]:
        for mechanism, key in (("heat aging", "observed_thermal_aging_ratio"),
                               ("cycling", "observed_cycle_fatigue_ratio")):
            parts = [f"{roughly(p[key])} × a day of \"{p['description']}\""
                     for p in d["reference_profiles"] if p["profile"] in WORD_PROFILES and p[key] is not None]
            if parts:
                out.append(f"    Per day observed, {mechanism}: " + "; ".join(parts))
    else:
        out.append(f"    Not compared per day with everyday profiles: {duration(comparison['observed_seconds'])} "
                   f"observed, at least {duration(comparison['minimum_seconds'])} needed")
    own = d["own_history"]
    if own["busy_to_idle_ratio"] is not None:
        out.append(f"    Its own history: while busy it aged {roughly(own['busy_to_idle_ratio'])} times as fast (heat) "
                   "as while idle")
    return out


def _band_text(e: dict[str, Any], unit: str) -> str:
    lo, hi = min(e["low"], e["central"], e["high"]), max(e["low"], e["central"], e["high"])
    return f"{between(lo, hi, lambda v: f'{v:.3g}')} {unit} (central {e['central']:.3g})"


def carried_words(d: dict[str, Any]) -> str | None:
    """What the card carried when gpuwear first read it (``carried``), in a line; None where it carried nothing
    or the record does not know."""
    held = {name: c for name, c in (d.get("carried") or {}).items() if c["count"]}
    if not held:
        return None
    firsts = [c["first_read"] for c in held.values() if c["first_read"] is not None]
    day = f" on {time.strftime('%Y-%m-%d', time.gmtime(min(firsts)))}" if firsts else ""
    dated = d.get("carried_retired_dates")
    pages = (f"; its retired pages dated {_day(dated['oldest'])} to {_day(dated['newest'])} by the card itself"
             if dated else "")
    where = d.get("carried_by_location") or {}
    located = [f"{kind} {where.get(f'ecc_{key}_aggregate_dram', 0):,} in the DRAM and "
               f"{where.get(f'ecc_{key}_aggregate_sram', 0):,} in the on-chip SRAM"
               for kind, key in (("corrected", "corrected"), ("uncorrectable", "uncorrected"))
               if where.get(f"ecc_{key}_aggregate_dram") or where.get(f"ecc_{key}_aggregate_sram")]
    return (f"Carried when gpuwear first read it{day} (from before gpuwear, its history unknown): "
            + ", ".join(f"{c['count']:,} {CARRIED_WORDS.get(name, name)}" for name, c in held.items())
            + ("; its ECC errors by where: " + "; ".join(located) if located else "") + pages)


def power_smoothing_words(d: dict[str, Any]) -> str | None:
    """The power-smoothing circuitry's rated life left (``power_smoothing``), in a line; None where the card does
    not report it."""
    ps = d.get("power_smoothing")
    if not ps:
        return None
    first = ps["first_read"]
    since = (f"; {first} % when gpuwear first read it"
             + (f" on {_day(ps['first_read_at'])}" if ps["first_read_at"] is not None else "")
             if first is not None else "")
    return (f"Power-smoothing circuitry: {ps['life_percent']} % of its rated life left (NVML field 258; "
            f"one circuit, not the card){since}")


def _day(wall: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(wall))


def firmware_words(d: dict[str, Any]) -> str | None:
    """The card's firmware when gpuwear first saw it, and what changed since, in a line; None where not read."""
    first = (d.get("firmware") or {}).get("first")
    if not first:
        return None
    day = f" on {time.strftime('%Y-%m-%d', time.gmtime(first['at']))}" if isinstance(first.get("at"), (int, float)) \
        else ""
    parts = [f"VBIOS {first['vbios']}" if first.get("vbios") else "",
             f"InfoROM {first['inforom_image']}" if first.get("inforom_image") else "",
             f"configuration checksum 0x{first['inforom_checksum']:08x}" if isinstance(first.get("inforom_checksum"),
                                                                                      int) else "",
             "InfoROM failing its validation" if first.get("inforom_valid") is False else "",
             f"under driver {printable(first['driver'])}" if isinstance(first.get("driver"), str) else ""]
    changed = d["firmware"].get("changed") or {}
    since = "; changed since: " + ", ".join(sorted(changed)) if changed else ""
    return f"Firmware when gpuwear first saw it{day}: " + ", ".join(p for p in parts if p) + since


XIDS_SHOWN = 5  # the newest XIDs a card's words list with what ran


def xid_lines(d: dict[str, Any]) -> list[str]:
    """The card's newest XIDs among its listed events, each with who ran on it then (its jobs, or its idle or
    unattributed line, as the XID's event says) and the process its kernel-log line named where one did: "is it my
    code or the card?" starts from here. Text from outside (job and process names) made printable."""
    shown = [e for e in d["events"] if e["kind"] in ("xid", "xid process")][-XIDS_SHOWN:]
    judged = [f"Card or code? {printable(j['text'])}" for j in d.get("card_or_code") or ()]
    if not shown:
        return judged
    out = [*judged, "XIDs lately, with what ran then:"]
    for e in shown:  # an event's detail is any flat mapping the ledger validated: each key read as it may be
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(e["wall"]))
        jobs = printable(str(e.get("jobs") or "not recorded (an older gpuwear)"))
        code = printable(str(e.get("xid", e.get("code", "?"))))
        count = e.get("count")
        if e["kind"] == "xid":
            out.append(f"  {when}  XID {code}" + (f" ×{count:g}" if isinstance(count, (int, float))
                                                  and not isinstance(count, bool) and count > 1 else "")
                       + f"; running: {jobs}")
        else:
            name, pid = e.get("process"), e.get("pid")
            if name in (None, "<unknown>") and pid is None:
                who = "a process the driver did not know (a fault of the GPU's own, or no process)"
            else:
                who = f"process {printable(str(name or '?'))}" + (f" (pid {printable(str(pid))})" if pid is not None
                                                                  else "")
            if e.get("instance"):
                who += f" on MIG instance {printable(str(e['instance']))}"
            if e.get("unit"):
                who += f", at {printable(str(e['unit']))} of the chip"
            out.append(f"  {when}  XID {code}'s line names {who}; running: {jobs}")
    return out


def elsewhere(imported: list[tuple[str, float, float]], here: GpuWear | None) -> list[dict[str, Any]]:
    """The imported parts of a card's history (Ledger.imports_of: source, first, last), each with where it lies
    against the card's own history on this box (``here``, its live record; None: never seen here): "before" it
    came, "after" it left (its later history handed back), "between" two spells here (it left and came back),
    "during" (overlapping: one of the two clocks was off), or "only" (this box never saw it)."""
    first = here.first_seen if here is not None else None
    last = here.last_seen if here is not None else None
    covered = [(float(s), e) for s, e in here.covered.items()] if here is not None else []

    def where(a: float, b: float) -> str:
        if first is None or last is None:
            return "only"
        if b <= first:
            return "before"
        if a >= last:
            return "after"
        return "between" if any(e <= a for _, e in covered) and any(s >= b for s, _ in covered) else "during"

    return [{"source": s, "first": a, "last": b, "relation": where(a, b)} for s, a, b in imported]


ELSEWHERE_WORDS = {"before": "before it came to this box", "after": "after it left this box (its later history "
                   "handed back)", "between": "between two spells on this box: it left and came back",
                   "during": "overlapping its time on this box (one of the two clocks was off)",
                   "only": "this box never saw it itself"}


def elsewhere_words(d: dict[str, Any]) -> list[str]:
    """The card's history imported from elsewhere (report documents' ``elsewhere``), a line each."""
    return [f"seen elsewhere from {_day(e['first'])} to {_day(e['last'])}, {ELSEWHERE_WORDS[e['relation']]}: "
            f"imported from {printable(e['source'])[:300]}" for e in d.get("elsewhere") or ()]


def set_aside_words(d: dict[str, Any]) -> str | None:
    """What a daemon's open set aside of a GPU (report documents' ``set_aside``), in words; None: nothing."""
    aside = d.get("set_aside")
    if not aside:
        return None
    newest = aside["newest"]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(newest["wall"]))
    kept = (": its values were checked one by one and kept, the bytes as found set aside" if newest["why"].endswith(
        CHANGED) and newest["what"] == f"GPU {d['uuid']!r}" else ", not counted")
    return (f"{aside['count']} record(s) or value(s) of this GPU failed their check at a daemon start, the newest on "
            f"{when} ({printable(newest['why'])[:200]}){kept}; kept in the ledger's set_aside table")


def text_report(doc: dict[str, Any]) -> str:
    """The human report: the verdict and its reasons first, then stress, then estimates."""
    out: list[str] = []
    if doc["simulated"]:
        out.append("SIMULATED GPUs (gpuwear --simulate): not real hardware.\n")
    if not doc["gpus"]:
        out.append(f"No GPU in the ledger {doc['ledger']} yet.")
    for d in doc["gpus"]:
        serial = f", serial {d['serial']}" if d["serial"] else ""
        out.append(f"{d['name'] or 'unknown GPU'} ({d['uuid']}{serial})")
        out.append(f"  {d['answer']['sentence']}")
        h = d["health"]
        if (by := d.get("replaced_by")) is not None:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(by["first_seen"]))
            out.append(f"  PAST CARD: {by['uuid']} took its slot (PCI {by['pci_bus_id']}) on {when}; its history is "
                       f"kept (gpuwear forget {d['uuid']} to drop it)")
        if (gone := d.get("not_seen")) is not None:
            since, host = (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(gone[k])) for k in ("last_seen",
                                                                                               "host_last_seen"))
            out.append(f"  NOT SEEN since {since}, while this host's other GPUs were seen until {host}: missing (off "
                       f"the bus? the daemon's /healthz names it while it runs) or taken out (gpuwear forget "
                       f"{d['uuid']})")
        if (aside := set_aside_words(d)) is not None:
            out.append(f"  SET ASIDE: {aside}")
        out += [f"  MOVED: {words}" for words in elsewhere_words(d)]
        shown = [r for r in h["reasons"] if r["severity"] != "unknown"]
        out.append(f"  Health: {h['status'].upper()}" + (": nothing it reports asks for action" if not shown else ""))
        for r in shown:
            out.append(f"    - [{r['severity']}] {r['text']}")
            out.append(f"      rule: {r['rule']}")
        for r in h["reasons"]:
            if r["severity"] == "unknown":
                out.append(f"    Not known: {r['text']}")
        for r in h.get("would_have_said") or ():
            out.append(f"    Would have said (rule {r['code']} on trial, wear.health.rules): [{r['severity']}] "
                       f"{r['text']}")
        if (incidents := h.get("incidents")) and incidents["kept"]:
            out.append(f"    {_incidents_line(incidents)}")
        if slow := slow_reads_text(h.get("slow_reads") or {}):
            out.append(f"    Its NVML {slow} (a tick's read of the GPU)")
        out.extend(f"    {line}" for line in xid_lines(d))
        if carried := carried_words(d):
            out.append(f"    {carried}")
        if firmware := firmware_words(d):
            out.append(f"    {firmware}")
        if smoothing := power_smoothing_words(d):
            out.append(f"    {smoothing}")
        out.append(f"  In plain words: {plain_words(d)}")
        out.extend(_wear_lines(d))
        coverage = d["coverage_ratio"]
        cov = f" ({100 * coverage:.0f} % of the time since first seen)" if coverage is not None else ""
        out.append(f"  Observed: {duration(d['observed_seconds'])}{cov}; busy {duration(d['busy_seconds'])}; "
                   f"energy {d['energy_joules'] / 3.6e6:.2f} kWh; not observed {duration(d['unobserved_seconds'])}")
        out.append("  Stress:")
        for sensor, label in (("gpu", "Die"), ("memory", "Memory")):
            hist = d["time_at_temperature_seconds"].get(sensor)
            if not hist:
                if sensor == "memory" and d["readings"]["temperature_memory"] != "measured":
                    out.append(f"    Memory temperature: {_ABSENT[d['readings']['temperature_memory']]}")
                continue
            line = (f"    {label} temperature: median {_percentile(hist, 0.5)} °C, 95th percentile "
                    f"{_percentile(hist, 0.95)} °C, highest {max(int(t) for t in hist)} °C")
            for name, seconds in d["time_above_thresholds_seconds"].items():
                if THRESHOLD_SENSORS[name] == sensor and name != "shutdown":
                    line += f"; {duration(seconds)} at or above its {name} limit ({d['thresholds_celsius'][name]:g} °C)"
            out.append(line)
        for sensor, cycles in d["thermal_cycles"].items():
            big = sum(c["count"] for c in cycles if c["range_celsius"] >= 10)
            largest = max((c["range_celsius"] for c in cycles), default=0)
            where = "die" if sensor == "gpu" else sensor
            out.append(f"    Thermal cycles counted ({where}, rainflow): {big:g} of 10 °C or more, largest "
                       f"{largest} °C ({sum(c['count'] for c in cycles):g} in all)")
        busy = d["busy_seconds"] or 1.0
        throttle = ", ".join(f"{k.replace('_', ' ')} {100 * v / busy:.1f} %" for k, v in d["throttle_seconds"].items()
                             if k != "gpu_idle")
        held = d["readings"]["clock_event_reasons"]
        if held != "measured":
            out.append(f"    Clocks held down: {_ABSENT[held]}")
        elif throttle:
            out.append(f"    Clocks held down (share of busy time): {throttle}; the card slows itself to stay "
                       "within its limits")
        else:
            out.append("    Clocks held down: never (measured)")
        for fan in d["fan_wear"]:
            basis = (f"from its speed in %, assuming a rated {fan['rated_rpm']:g} RPM (wear.fan.rated_rpm)"
                     if fan["revolutions_estimated_from_speed_ratio"] else "measured RPM")
            out.append(f"    Fan {fan['fan']}: {fan['on_hours']:.1f} h turning, {fan['revolutions'] / 1e6:.2f} M "
                       f"revolutions ({basis}) = {fan['equivalent_hours_at_rated_rpm']:.1f} h at {fan['rated_rpm']:g} "
                       f"RPM (L10 ratings {fan['l10_hours']['low']:g} to {fan['l10_hours']['high']:g} h)")
        trend = d["thermal_resistance"]
        if trend:
            out.append(f"    Cooling: {trend['last_celsius_per_watt']:.3f} °C per W above idle at steady load "
                       f"({trend['days']} day(s) measured)")
        out.append(f"  {risk_seen(d)}")
        a, c = d["thermal_aging_equivalent_hours"], d["cycle_fatigue_equivalent_cycles"]
        out.append("  Model details (bands from three parameter sets; estimates, not a remaining life):")
        out.append(f"    Thermal aging: {_band_text(a, 'hours')} at {a['reference_celsius']:g} °C "
                   f"(Arrhenius, Ea {a['parameters']['activation_energy_ev']['low']:g} / "
                   f"{a['parameters']['activation_energy_ev']['central']:g} / "
                   f"{a['parameters']['activation_energy_ev']['high']:g} eV)")
        out.append(f"    Thermal-cycle fatigue: {_band_text(c, 'reference cycles')} of "
                   f"{c['reference_range_celsius']:g} °C peaking at {c['reference_peak_celsius']:g} °C "
                   "(Coffin-Manson / Norris-Landzberg)")
        comparison = d["comparison"]
        if comparison["compared"]:
            out.append(f"      compared per day, on {duration(comparison['observed_seconds'])} observed:")
        else:
            out.append(f"      not compared with everyday profiles: {duration(comparison['observed_seconds'])} "
                       f"observed, at least {duration(comparison['minimum_seconds'])} needed for a per-day comparison")
        for prof in d["reference_profiles"]:  # all four, training included, for the record
            if prof["observed_thermal_aging_ratio"] is not None:
                out.append(f"      vs \"{prof['description']}\": aging x{prof['observed_thermal_aging_ratio']:.2g}"
                           + (f", cycles x{prof['observed_cycle_fatigue_ratio']:.2g}"
                              if prof["observed_cycle_fatigue_ratio"] is not None else ""))
        out.append("")
    return "\n".join(out).rstrip() + "\n"
