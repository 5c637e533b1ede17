"""The page: `gpuwear report` for people who would rather look than read, served at `/` by the daemon (the same
auth as /metrics) and written by `gpuwear report --html FILE`.

One self-contained HTML document (inline CSS and SVG, no script, nothing fetched): per GPU, the verdict and the
answer in plain words first, then the two wear mechanisms against everyday references, time at temperature
against the card's own thresholds, cycles by size, the jobs' shares of its wear and what the answer rests on.
Every figure comes from the report document (``report.document``): the elements that show one carry it in
``data-figure`` / ``data-value``, so a test can hold the page to ``report --json``.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from typing import Any

from gpuwear.report import (
    between,
    duration,
    elsewhere_words,
    plain_words,
    range_text,
    risk_seen,
    roughly,
    set_aside_words,
)
from gpuwear.wear.models import WORD_PROFILES

_STATUS = {"ok": ("OK", "#1b7f3b"), "watch": ("WATCH", "#b45309"), "act": ("ACT", "#b91c1c"),
           "unknown": ("UNKNOWN", "#4b5563")}
_SHORT = {"idle_24_7": "idle, 35 °C", "gaming_4h_day": "gaming 4 h a day", "stress_24_7": "mining, 85 °C",
          "training_24_7": "training, 75 °C"}
_CYCLE_BUCKETS = ((2, 5), (5, 10), (10, 20), (20, 30), (30, 40), (40, 60), (60, 999))
STYLE = """
body{font:16px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f6f7f9;color:#111827;
overflow-wrap:anywhere}
main{max-width:60rem;margin:0 auto;padding:1rem}
h1{font-size:1.5rem;margin:.5rem 0}h2{font-size:1.25rem;margin:0 0 .25rem}h3{font-size:1rem;margin:1rem 0 .25rem}
.gpu{background:#fff;border:1px solid #e5e7eb;border-radius:.5rem;padding:1rem;margin:1rem 0}
.verdict{display:inline-block;color:#fff;border-radius:.25rem;padding:.1rem .5rem;font-weight:700}
.muted{color:#4b5563;font-size:.9rem}.answer{font-size:1.05rem}
.cards{display:flex;flex-wrap:wrap;gap:1rem}.card{flex:1 1 16rem;border:1px solid #e5e7eb;border-radius:.5rem;
padding:.75rem}.big{font-size:1.6rem;font-weight:700}
svg{width:100%;max-width:34rem;height:auto;display:block}svg text{font:14px system-ui,sans-serif;fill:#374151}
table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.2rem .4rem;border-bottom:1px solid #eee}
.banner{background:#fef3c7;border:1px solid #f59e0b;padding:.5rem;border-radius:.25rem}
.oneline{font-size:1.15rem;font-weight:600;margin:.4rem 0}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _figure(name: str, value: Any, shown: str) -> str:
    return f'<span data-figure="{_e(name)}" data-value="{_e(value)}">{_e(shown)}</span>'


Bar = tuple[str, float, bool, "tuple[float, float] | None"]  # label, value, highlighted, band (smallest, largest)


def _bars(rows: Sequence[Bar], unit: str, width: int = 360) -> str:
    """Horizontal bars (label, value, highlighted, band) on one linear scale, as an SVG (readable on a phone: the
    view box is about a phone's width, the page caps it on a desktop). An estimate's band is a whisker across its
    bar, from the smallest to the largest figure of the model's parameter sets, and its value's title says both."""
    top = max((max(v, band[1] if band else 0.0) for _, v, _, band in rows), default=0.0) or 1.0
    # the labels' column as wide as the longest label at the charts' 14 px (9 units a character, wider than most)
    height, label_w = 26 * len(rows) + 8, max(118, 9 * max((len(r[0]) for r in rows), default=0) + 6)
    room = width - label_w - 48

    def x(v: float) -> float:
        return label_w + room * v / top

    out = [f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{_e(unit)}">']
    for i, (label, value, mine, band) in enumerate(rows):
        y = 4 + 26 * i
        w = max(1.0, room * value / top) if value > 0 else 0.0
        shown = roughly(value) if band is None else f"{roughly(value)} ({between(band[0], band[1])})"
        out.append(f'<text x="0" y="{y + 16}">{_e(label)}</text>'
                   f'<rect x="{label_w}" y="{y + 4}" width="{w:.1f}" height="16" '
                   f'fill="{"#2563eb" if mine else "#9ca3af"}"><title>{_e(shown)}</title></rect>')
        end = label_w + w
        if band is not None:
            lo, hi = x(band[0]), x(band[1])
            out.append(f'<path class="band" d="M{lo:.1f} {y + 12}H{hi:.1f}M{lo:.1f} {y + 7}V{y + 17}'
                       f'M{hi:.1f} {y + 7}V{y + 17}" stroke="#111827" stroke-width="1.5" fill="none"/>')
            end = max(end, hi)
        out.append(f'<text x="{end + 5:.1f}" y="{y + 16}">{_e(roughly(value))}</text>')
    out.append("</svg>")
    if any(band is not None for *_, band in rows):  # the whiskers named (issue 53: they were not)
        out.append('<p class="muted legend">The line across a bar: from the smallest to the largest figure the '
                   "estimate gives under its model's settings; the bar, the middle one.</p>")
    return "".join(out)


def _histogram(hist: dict[str, float], thresholds: dict[str, float], sensor: str, width: int = 360) -> str:
    """Hours at each whole °C as columns, the card's own thresholds as dashed lines."""
    temps = sorted(int(t) for t in hist)
    marks = {name: v for name, v in thresholds.items()
             if (sensor == "gpu" and name in ("slowdown", "gpu_max")) or (sensor == "memory" and name == "memory_max")}
    lo = min([temps[0], *(int(v) for v in marks.values())]) - 2
    hi = max([temps[-1], *(int(v) for v in marks.values())]) + 2
    top = max(hist.values()) / 3600 or 1.0
    # the limits' labels sit in a band of their own above the columns: a column never covers them
    ceiling = 8 + 17 * max(len(marks), 1)
    h, base, left = 180 + ceiling, 150 + ceiling, 34
    span = max(hi - lo, 1)

    def x(t: float) -> float:
        return left + (width - left - 10) * (t - lo) / span

    out = [f'<svg viewBox="0 0 {width} {h}" role="img" aria-label="hours at each temperature">',
           f'<line x1="{left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#9ca3af"/>']
    bar = max(1.0, (width - left - 10) / span - 1)
    for t in temps:
        hours = hist[str(t)] / 3600
        bh = (base - ceiling) * hours / top
        out.append(f'<rect x="{x(t):.1f}" y="{base - bh:.1f}" width="{bar:.1f}" height="{bh:.1f}" fill="#2563eb">'
                   f'<title>{t} °C: {_e(duration(hist[str(t)]))}</title></rect>')
    # staggered, the highest limit's label on top, each to the left of its line: a label then never meets another
    # limit's line (a higher one lies to its right, a lower one starts below its row); to the right only where the
    # left has no room for it (9 units a character)
    for i, (name, value) in enumerate(sorted(marks.items(), key=lambda kv: -kv[1])):
        label = {"gpu_max": "max", "memory_max": "max"}.get(name, name)
        anchor = "end" if x(value) > 9 * len(f"{label} {value:g} °C") + 3 else "start"
        dx = -3 if anchor == "end" else 3
        out.append(f'<line x1="{x(value):.1f}" y1="{4 + 17 * i}" x2="{x(value):.1f}" y2="{base}" stroke="#b91c1c" '
                   f'stroke-dasharray="4 3"/><text class="limit" x="{x(value) + dx:.1f}" y="{16 + 17 * i}" '
                   f'fill="#b91c1c" text-anchor="{anchor}">{_e(label)} {value:g} °C</text>')
    for t in range(math.ceil(lo / 10) * 10, hi + 1, 10):
        out.append(f'<text x="{x(t) - 8:.1f}" y="{base + 16}">{t}°</text>')
    out.append(f'<text x="0" y="{ceiling + 4}">{_e(roughly(top))} h</text></svg>')
    return "".join(out)


def _cycles(cycles: list[dict[str, float]]) -> str:
    rows: list[Bar] = []
    for lo, hi in _CYCLE_BUCKETS:
        n = sum(c["count"] for c in cycles if lo <= c["range_celsius"] < hi)
        rows.append((f"{lo}–{hi} °C" if hi < 999 else f"{lo} °C and more", n, False, None))  # counted: no band
    return _bars(rows, "cycles by size")


def _references(d: dict[str, Any], key: str, per_day: str, label: str) -> str:
    """This card's figure per observed day against the everyday profiles' (not 24/7 training: circular)."""
    if not d["comparison"]["compared"]:
        return (f'<p class="muted">Not compared per day: {_e(duration(d["comparison"]["observed_seconds"]))} '
                f'observed, {_e(duration(d["comparison"]["minimum_seconds"]))} needed.</p>')
    days = d["observed_seconds"] / 86400
    mine = d[key]["central"] / days
    band = (d[key]["range"]["smallest"] / days, d[key]["range"]["largest"] / days)
    rows: list[Bar] = [(_SHORT[p["profile"]], p[per_day], False, (p[f"{per_day}_range"][0], p[f"{per_day}_range"][1]))
                       for p in d["reference_profiles"] if p["profile"] in WORD_PROFILES]
    rows.insert(1, ("this card", mine, True, band))
    return (f'<p class="muted">{_e(label)} per day: this card (per day observed) and everyday use</p>'
            + _bars(rows, label))


def _jobs(uuid: str, jobs: dict[str, Any] | None) -> str:
    if jobs is None:
        return ""
    if jobs.get("not_indexed"):
        return (f'<h3>Jobs</h3><p class="muted">{int(jobs["not_indexed"])} job record(s) are still being indexed '
                "(after an upgrade or a recovery, the daemon keeps their lines right after it starts): who caused "
                "its heat aging shows once they are in.</p>")
    merged = {name: 100 * share for name, share in jobs["thermal_aging_share_by_name"].get(uuid, {}).items()
              if share}
    if not merged:
        return '<h3>Jobs</h3><p class="muted">No job recorded for this GPU.</p>'
    top = sorted(merged.items(), key=lambda kv: -kv[1])[:8]
    return ("<h3>Who caused its heat aging (% of it, by recorded job)</h3>"
            + _bars([(name, share, False, None) for name, share in top], "% of its thermal aging"))


def _gpu(d: dict[str, Any], jobs: dict[str, Any] | None) -> str:
    h = d["health"]
    status, colour = _STATUS[h["status"]]
    a, c = d["thermal_aging_equivalent_hours"], d["cycle_fatigue_equivalent_cycles"]
    out = [f'<section class="gpu" id="{_e(d["uuid"])}"><h2>{_e(d["name"] or "unknown GPU")}</h2>',
           f'<p class="muted">{_e(d["uuid"])}' + (f', serial {_e(d["serial"])}' if d["serial"] else "") + "</p>",
           f'<p class="oneline" data-figure="answer" data-value="{_e(d["answer"]["level"])}">'
           f'{_e(d["answer"]["sentence"])}</p>',
           f'<p><span class="verdict" style="background:{colour}" data-figure="status" data-value="{h["status"]}">'
           f'{status}</span> ']
    if (by := d.get("replaced_by")) is not None:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(by["first_seen"]))
        out.insert(2, f'<p class="banner">A past card: <code>{_e(by["uuid"])}</code> took its slot (PCI '
                      f'{_e(by["pci_bus_id"] or "")}) on {_e(when)}; its history is kept.</p>')
    if (aside := set_aside_words(d)) is not None:
        out.insert(2, f'<p class="banner"><strong>Set aside.</strong> {_e(aside)}.</p>')
    for words in reversed(elsewhere_words(d)):  # each inserted above the last: oldest first, as the report
        out.insert(2, f'<p class="banner"><strong>Moved.</strong> {_e(words[0].upper() + words[1:])}.</p>')
    if (gone := d.get("not_seen")) is not None:
        since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(gone["last_seen"]))
        out.insert(2, f'<p class="banner missing"><strong>Not seen since {_e(since)}</strong>, while this host&#x27;s '
                      "other GPUs were seen later: missing (off the bus?) or taken out "
                      f'(<code>gpuwear forget {_e(d["uuid"])}</code>).</p>')
    shown = [r for r in h["reasons"] if r["severity"] != "unknown"]
    worst = max(shown, key=lambda r: r["severity"] == "act", default=None)  # the first act reason, else the first
    out.append("nothing it reports asks for action" if worst is None else
               _e(worst["text"]) + (f" (and {len(shown) - 1} more reason(s), below)" if len(shown) > 1 else ""))
    out.append("</p>")
    # the answer on the first screen of a phone, the reasons' rules after it (two reasons with their rules filled it)
    out.append(f'<p class="answer">{_e(plain_words(d))}</p>')
    if len(shown) > 1 or any(r["rule"] for r in shown):
        out.append("<ul>" + "".join(f'<li>{_e(r["text"])} <span class="muted">(rule: {_e(r["rule"])})</span></li>'
                                    for r in shown) + "</ul>")
    for r in h["reasons"]:
        if r["severity"] == "unknown":
            out.append(f'<p class="muted">Not known: {_e(r["text"])}</p>')
    for j in d.get("card_or_code") or ():
        out.append(f'<p class="muted">Card or code? {_e(j["text"])} (rule: {_e(j["rule"])})</p>')
    for r in h.get("would_have_said") or ():
        out.append(f'<p class="muted">Would have said (rule {_e(r["code"])} on trial): [{_e(r["severity"])}] '
                   f'{_e(r["text"])}</p>')
    out.append('<div class="cards"><div class="card"><h3>Heat aging (Arrhenius)</h3>'
               f'<div class="big">{_figure("thermal_aging_central_hours", a["central"], duration(a["central"] * 3600))}'
               f'</div><p class="muted">at a steady {a["reference_celsius"]:g} °C; '
               f'{_e(range_text(a["range"], lambda hours: duration(hours * 3600)))}</p>'
               + _references(d, "thermal_aging_equivalent_hours", "thermal_aging_hours_per_day",
                             "equivalent hours at 60 °C") + "</div>")
    out.append('<div class="card"><h3>Thermal cycling (Coffin-Manson)</h3>'
               f'<div class="big">{_figure("cycle_fatigue_central", c["central"], roughly(c["central"]))} cycles</div>'
               f'<p class="muted">full {c["reference_range_celsius"]:g} °C cycles peaking at '
               f'{c["reference_peak_celsius"]:g} °C; {_e(range_text(c["range"], roughly))}</p>'
               + _references(d, "cycle_fatigue_equivalent_cycles", "cycle_fatigue_cycles_per_day",
                             "equivalent cycles") + "</div></div>")
    for sensor, label in (("gpu", "Die"), ("memory", "Memory")):
        hist = d["time_at_temperature_seconds"].get(sensor)
        if hist:
            out.append(f"<h3>{label}: time at each temperature, against the card's own limits</h3>"
                       + _histogram(hist, d["thresholds_celsius"], sensor))
    cycles = d["thermal_cycles"].get("gpu")
    if cycles:
        out.append("<h3>Thermal cycles of the die, by size</h3>" + _cycles(cycles))
    out.append(_jobs(d["uuid"], jobs))
    coverage = d["coverage_ratio"]
    first = d["first_seen"]
    out.append("<h3>What this rests on</h3><p>"
               + _figure("observed_seconds", d["observed_seconds"], duration(d["observed_seconds"])) + " observed"
               + (f" since {_e(time.strftime('%Y-%m-%d', time.gmtime(first)))}" if first else "")
               + (" (" + _figure("coverage_ratio", coverage, f"{100 * coverage:.0f} %") + " of that time)"
                  if coverage is not None else "")
               + "; energy " + _figure("energy_joules", d["energy_joules"], f"{d['energy_joules'] / 3.6e6:.2f} kWh")
               + ". Nothing before is known. Estimates from named models (docs/wear-model.md), "
                 "not a measured remaining life.</p>"
               + f'<p class="muted">{_e(risk_seen(d))}</p></section>')
    return "".join(out)


def render(doc: dict[str, Any], jobs: dict[str, Any] | None = None, generated: float | None = None,
           note: str | None = None, missing: tuple[str, ...] = (), fabric: tuple[str, ...] = (),
           passport: tuple[str, ...] = ()) -> str:
    """The page of a report document (and the jobs document of the same ledger, for the shares); ``missing``: one
    sentence per GPU of this host that NVML does not list now (the daemon's /healthz words), shown first;
    ``fabric``: the host's NVSwitch errors in words (Daemon.fabric_problems), after them; ``passport``: a card's
    passport (gpuwear.passport.heading_and_lines): its heading, whether the file is whole, then what follows the
    card."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() if generated is None else generated))
    parts = ["<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             '<link rel="icon" href="data:,">',  # no /favicon.ico request (a 404 in the console)
             f"<title>gpuwear: does deep learning wear this card?</title><style>{STYLE}</style></head><body><main>"]
    if passport:  # a card's passport: its heading and whether the file is whole first, the rest after the card
        parts += [f"<h1>{_e(passport[0])}</h1>",
                  f'<p class="muted">{_e(passport[1].strip())}</p>']
    else:
        parts += ["<h1>Is deep learning wearing these cards?</h1>",
                  f'<p class="muted">gpuwear, {_e(when)}; ledger {_e(doc["ledger"])}'
                  + (f"; {_e(note)}" if note else "") + ' · <a href="/metrics">metrics</a></p>']
    if doc["simulated"]:
        parts.append('<p class="banner"><strong>Simulated GPUs</strong> (gpuwear --simulate): not real '
                     "hardware.</p>")
    parts.extend(f'<p class="banner missing"><strong>Missing GPU.</strong> {_e(line)}.</p>' for line in missing)
    parts.extend(f'<p class="banner missing"><strong>NVSwitch fabric.</strong> {_e(line)}.</p>' for line in fabric)
    if not doc["gpus"]:
        parts.append("<p>No GPU in the ledger yet: the first save comes a minute after the daemon starts.</p>")
    parts.extend(_gpu(d, jobs) for d in doc["gpus"])
    if passport:
        parts.append(f'<section class="passport"><h2>{_e(passport[0])}</h2>'
                     + "".join(f"<p>{_e(line.strip())}</p>" for line in passport[2:]) + "</section>")
    parts.append("</main></body></html>\n")
    return "".join(parts)
