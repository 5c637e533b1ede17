"""The fleet's answer as one self-contained page (`gpuwear fleet --html FILE`): per product, the incident rate of
each heat-aging bucket with its exact interval, drawn on one scale, whether the most worn bucket lies above the least
worn, the cards that stand out with their test, every card, and what it cannot conclude or see. Every figure carries
its value as the JSON answer gives it (``data-figure``/``data-value``); every string from the store is escaped."""

from __future__ import annotations

import html
import time
from typing import Any

from gpuwear.page import STYLE

_EXTRA = """
.scroll{overflow-x:auto}.scroll table{overflow-wrap:normal;white-space:nowrap}
.whisker{stroke:#111827;stroke-width:2}.rate{fill:#2563eb}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _figure(name: str, value: Any, shown: str) -> str:
    return f'<span data-figure="{_e(name)}" data-value="{_e(value)}">{_e(shown)}</span>'


def _chart(buckets: list[dict[str, Any]], width: int = 360) -> str:
    """Each bucket's rate a dot and its interval a whisker, on one linear scale from 0 (an SVG about a phone wide)."""
    top = max((b["interval"][1] or 0.0 for b in buckets), default=0.0) or 1.0
    left, right, row = 116, 16, 26  # the labels' column: "bucket 4 of 4" at the charts' 14 px
    scale = (width - left - right) / top
    parts = [f'<svg viewBox="0 0 {width} {row * len(buckets) + 22}" role="img" aria-label="incidents a GPU-year by '
             'heat-aging bucket, with their intervals">']
    for i, b in enumerate(buckets):
        y = row * i + 16
        parts.append(f'<text x="0" y="{y + 5}">bucket {b["bucket"]} of {b["of"]}</text>')
        low, high = b["interval"]
        if low is not None and high is not None:
            parts.append(f'<line class="whisker" x1="{left + low * scale:.1f}" x2="{left + high * scale:.1f}" '
                         f'y1="{y}" y2="{y}"><title>{_g(low)} to {_g(high)} a GPU-year</title></line>')
        if b["rate_per_gpu_year"] is not None:
            parts.append(f'<circle class="rate" cx="{left + b["rate_per_gpu_year"] * scale:.1f}" cy="{y}" r="5">'
                         f'<title>{_g(b["rate_per_gpu_year"])} a GPU-year</title></circle>')
    y = row * len(buckets) + 18
    parts.append(f'<text x="{left}" y="{y}">0</text><text x="{width - right}" y="{y}" text-anchor="end">'
                 f"{_g(top)} a GPU-year</text></svg>")
    return "".join(parts)


def _band(card: dict[str, Any]) -> str:
    band = card.get("aging_band_hours")
    return "with metrics.detail" if band is None else f"{_g(band[0])} to {_g(band[1])}"


def _product(p: dict[str, Any], confidence: float) -> str:
    t = p["total"]
    out = [f'<section class="gpu" data-product="{_e(p["product"])}"><h2>{_e(p["product"])}, {_e(p["stratum"])}</h2>',
           f'<p>{t["cards"]} card(s), {_g(t["gpu_years"])} GPU-years observed, {t["incidents"]} incident(s): '
           + _figure("rate", t["rate_per_gpu_year"], _g(t["rate_per_gpu_year"]))
           + f' a GPU-year ({_g(t["interval"][0])} to {_g(t["interval"][1])}, {confidence:.0%})</p>']
    if len(p["buckets"]) > 1:
        out.append('<p class="oneline">' + ("The most worn bucket's rate lies above the least worn's interval: an "
                                            "association." if p["hottest_above_coolest"] else
                                            "The buckets' intervals overlap: no association with heat aging this "
                                            "fleet can show.") + "</p>")
    out.append(_chart(p["buckets"]))
    out.append('<div class="scroll"><table><tr><th>bucket</th><th class="n">heat aging, equivalent hours</th>'
               '<th class="n">cards</th><th class="n">GPU-years</th><th class="n">incidents</th>'
               f'<th class="n">a GPU-year ({confidence:.0%} interval)</th></tr>')
    for b in p["buckets"]:
        out.append(f'<tr data-bucket="{b["bucket"]}"><td>{b["bucket"]} of {b["of"]}</td>'
                   f'<td class="n">{_g(b["aging_hours"][0])} to {_g(b["aging_hours"][1])}</td>'
                   f'<td class="n">{b["cards"]}</td><td class="n">{_g(b["gpu_years"])}</td>'
                   f'<td class="n">{_figure("incidents", b["incidents"], str(b["incidents"]))}</td>'
                   f'<td class="n">{_figure("rate", b["rate_per_gpu_year"], _g(b["rate_per_gpu_year"]))} '
                   f'({_g(b["interval"][0])} to {_g(b["interval"][1])})</td></tr>')
    out.append("</table></div>")
    out.extend(f'<p class="banner">Stands out: {_e(o["where"])} ({_e(o["uuid"])}), {o["incidents"]} incident(s) '
               f'where its peers\' rate gives {o["expected"]:.2g} (p = {o["p"]:.2g}).</p>' for o in p["outliers"])
    return "".join(out) + "</section>"


def render(result: dict[str, Any], span: str) -> str:
    """The page of a `gpuwear fleet --json` document (``span``: the span asked, as the user wrote it)."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(result["at"]))
    parts = ['<!doctype html><html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">',
             f"<title>gpuwear fleet: is wear associated with failure?</title><style>{STYLE}{_EXTRA}</style></head>",
             "<body><main><h1>Is wear associated with failure on this fleet?</h1>",
             f'<p class="muted">{len(result["cards"])} card(s) in {_e(result["store"])} over the last {_e(span)} '
             f'to {_e(when)}, from its {_e(result["source"])}.</p>']
    if result.get("retention_short"):
        parts.append(f'<p class="banner">{_e(result["retention_short"])}.</p>')
    if not result["cards"]:
        parts.append("<p>No gpuwear card in the span: is the store scraping gpuwear (job gpuwear), and for this "
                     "long?</p>")
    parts.extend(_product(p, result["confidence"]) for p in result["products"])
    parts.append(f'<p class="oneline">{_e(result["not_cause"])}</p>')
    parts.append(f'<p>Test for a card that stands out: {_e(result["test"])}.</p>')
    if result["cards"]:
        parts.append('<details><summary>Every card</summary><div class="scroll"><table><tr><th>where</th>'
                     '<th>UUID</th><th>product</th><th class="n">heat aging, h</th><th class="n">band, h</th>'
                     '<th class="n">days observed</th><th class="n">incidents</th><th>reasons</th></tr>'
                     + "".join(f'<tr><td>{_e(c["where"])}</td><td>{_e(c["uuid"])}</td><td>{_e(c["product"])}</td>'
                               f'<td class="n">{_g(c["aging_hours"])}</td><td class="n">{_band(c)}</td>'
                               f'<td class="n">{c["exposure_seconds"] / 86400:.1f}</td>'
                               f'<td class="n">{c["incidents"]}</td>'
                               f'<td>{_e(", ".join(c["reasons"]))}</td></tr>' for c in result["cards"])
                     + "</table></div></details>")
    parts.append("<p>It cannot see: " + "; ".join(_e(x) for x in result["cannot_see"]) + ".</p>")
    cost = result["cost"]
    parts.append(f'<p class="muted">{cost["queries"]} queries, {cost["bytes"]} bytes read.</p></main></body></html>\n')
    return "".join(parts)
