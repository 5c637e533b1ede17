"""The fleet's answer from each card's figures: is wear associated with incidents, within a product? Pure.

Each card: its product, its lifetime heat aging (the central estimate, equivalent hours at the reference
temperature: gpuwear_thermal_aging_equivalent_seconds), the time gpuwear observed it within the span asked (its
exposure, in GPU-years) and its incidents in that span (critical XIDs: NVIDIA's catalog's act tier); for a card the
store first holds within the span, both from its first sight (the ledger's lifetime figures). The cards
are held apart by product and by age stratum (the time gpuwear has observed the card: under a year, 1 to 3 years, 3
years or more; an older card has carried more heat simply by being older, and may fail more for that alone). Within a
product and stratum, the cards are split by heat aging into buckets (quartiles from 8 cards, halves from 2); each
bucket's rate
is its incidents over its GPU-years, with Garwood's exact 95 % Poisson interval. A card stands out when, against its
product's other cards' rate, its count is improbable: the one-sided exact Poisson test, P(X >= k) below 0.05 over
the number of cards of the product (Bonferroni). Association is not cause: hotter cards may be the busier ones,
on the older racks, under other jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

YEAR_SECONDS = 365.25 * 86400.0
CONFIDENCE = 0.95
OUTLIER_ALPHA = 0.05
TEST = ("one-sided exact Poisson test of the card's incidents against the rate of its product's other cards of its age "
        "stratum over its GPU-years, P(X >= k) < 0.05 / cards of the product and stratum (Bonferroni)")
NOT_CAUSE = ("Association, not cause: a bucket's cards differ in more than wear (jobs, racks, age, batches); a rate "
             "whose interval overlaps another's is no evidence of a difference at this fleet's size.")


def _lower_gamma_regularized(a: float, x: float) -> float:
    """P(a, x), the regularized lower incomplete gamma function (a > 0, x >= 0): its series below a + 1, else one
    minus the continued fraction of Q (Numerical Recipes, 6.2)."""
    if x <= 0:
        return 0.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return min(1.0, total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        step = d * c
        h *= step
        if abs(step - 1) < 1e-15:
            break
    return max(0.0, 1.0 - math.exp(log_front) * h)


def poisson_at_least(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean): 1 for k <= 0, else P(k, mean) (the gamma function's identity)."""
    return 1.0 if k <= 0 else _lower_gamma_regularized(k, mean) if mean > 0 else 0.0


def _gamma_quantile(a: float, p: float) -> float:
    """x with P(a, x) = p, by bisection."""
    lo, hi = 0.0, max(1.0, a)
    while _lower_gamma_regularized(a, hi) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _lower_gamma_regularized(a, mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def garwood(k: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Garwood's exact interval for a Poisson mean after ``k`` events: (chi2(alpha/2, 2k) / 2, chi2(1 - alpha/2,
    2k + 2) / 2), the chi-square quantiles as gamma ones (k = 0: the lower end is 0)."""
    alpha = 1 - confidence
    lower = 0.0 if k == 0 else _gamma_quantile(k, alpha / 2)
    return lower, _gamma_quantile(k + 1, 1 - alpha / 2)


@dataclass(frozen=True)
class Card:
    """One card's figures over the span: ``aging_hours`` its lifetime heat aging (central estimate, equivalent hours);
    ``exposure_seconds`` the time gpuwear observed it within the span; ``incidents`` its critical XIDs then;
    ``act_hours`` the hours its verdict was act (None where not known)."""

    uuid: str
    product: str
    where: str  # instance and GPU index, as last seen
    aging_hours: float
    exposure_seconds: float
    incidents: int
    act_hours: float | None = None
    age_seconds: float | None = None  # the time gpuwear has observed it in all (its age as gpuwear knows it)
    # the heat aging's band (low and high parameter sets, equivalent hours) where the store holds it (metrics.detail)
    aging_band_hours: tuple[float, float] | None = None
    reasons: tuple[str, ...] = ()  # the verdict's reasons while in the span, by their rule's code


# the age strata, by the time gpuwear has observed the card: (up to, in seconds, name)
AGE_STRATA = ((YEAR_SECONDS, "observed under a year"), (3 * YEAR_SECONDS, "observed 1 to 3 years"),
              (math.inf, "observed 3 years or more"))


def stratum(card: Card) -> str:
    """The card's age stratum (:data:`AGE_STRATA`), "age unknown" where the store does not say."""
    if card.age_seconds is None:
        return "age unknown"
    return next(name for limit, name in AGE_STRATA if card.age_seconds < limit)


def _rate(cards: list[Card]) -> dict[str, Any]:
    k = sum(c.incidents for c in cards)
    years = sum(c.exposure_seconds for c in cards) / YEAR_SECONDS
    low, high = garwood(k)
    per = (lambda v: v / years) if years > 0 else (lambda v: None)
    return {"cards": len(cards), "incidents": k, "gpu_years": years, "rate_per_gpu_year": per(k),
            "interval": [per(low), per(high)]}


def _buckets(cards: list[Card]) -> list[list[Card]]:
    """The cards by heat aging: quartiles from 8 cards, halves from 2, else one bucket."""
    ranked = sorted(cards, key=lambda c: (c.aging_hours, c.uuid))
    n = 4 if len(ranked) >= 8 else 2 if len(ranked) >= 2 else 1
    return [ranked[len(ranked) * i // n:len(ranked) * (i + 1) // n] for i in range(n)]


def answer(cards: list[Card], strata: bool = True) -> dict[str, Any]:
    """The answer: per product and age stratum (``strata``: else per product alone), its buckets by heat aging with
    their rates and intervals, whether the hottest bucket's interval lies above the coolest's, and the cards that
    stand out against their peers of that product and stratum (:data:`TEST`)."""
    order = {name: i for i, (_, name) in enumerate(AGE_STRATA)}
    products: dict[tuple[str, str], list[Card]] = {}
    for c in cards:
        products.setdefault((c.product, stratum(c) if strata else "all ages"), []).append(c)
    out: list[dict[str, Any]] = []
    for (product, age), mine in sorted(products.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 9))):
        split = _buckets(mine)
        buckets = []
        for i, bucket in enumerate(split):
            entry = _rate(bucket)
            entry.update(bucket=i + 1, of=len(split), aging_hours=[bucket[0].aging_hours, bucket[-1].aging_hours])
            buckets.append(entry)
        coolest, hottest = buckets[0], buckets[-1]
        apart = (len(buckets) > 1 and None not in (*hottest["interval"], *coolest["interval"])
                 and hottest["interval"][0] > coolest["interval"][1])
        incidents, seconds = sum(c.incidents for c in mine), sum(c.exposure_seconds for c in mine)
        outliers = []
        for c in mine:  # against the product's other cards: its totals less this card's
            years = (seconds - c.exposure_seconds) / YEAR_SECONDS
            if len(mine) < 2 or years <= 0 or c.incidents == 0:
                continue
            expected = (incidents - c.incidents) / years * c.exposure_seconds / YEAR_SECONDS
            p = poisson_at_least(c.incidents, expected) if expected > 0 else 0.0
            if p < OUTLIER_ALPHA / len(mine):
                outliers.append({"uuid": c.uuid, "where": c.where, "incidents": c.incidents,
                                 "expected": expected, "p": p})
        out.append({"product": product, "stratum": age, "total": _rate(mine), "buckets": buckets,
                    "hottest_above_coolest": apart, "outliers": outliers})
    return {"products": out, "test": TEST, "confidence": CONFIDENCE, "not_cause": NOT_CAUSE}


def _per(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def _hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"


def band(card: Card) -> str:
    """A card's heat aging in words: its central estimate with its band where known."""
    central = f"{_hours(card.aging_hours)} equivalent hours"
    if card.aging_band_hours is None:
        return f"{central} (central; its band needs metrics.detail)"
    low, high = card.aging_band_hours
    return f"{central} (band {_hours(low)} to {_hours(high)})"


def card_lines(cards: list[Card]) -> list[str]:
    """Every card, by product, a line each: where, heat aging with its band, observed days, incidents, reasons."""
    lines = []
    for product in sorted({c.product for c in cards}):
        lines.append(f"{product}:")
        for c in sorted((c for c in cards if c.product == product), key=lambda c: (c.where, c.uuid)):
            lines.append(f"  {c.where} ({c.uuid}): heat aging {band(c)}, {c.exposure_seconds / 86400:.3g} day(s) "
                         f"observed, {c.incidents} incident(s)"
                         + (f", reasons {', '.join(c.reasons)}" if c.reasons else ", no reason"))
    return lines


def words(doc: dict[str, Any]) -> list[str]:
    """The answer in words, a line each."""
    lines = []
    for p in doc["products"]:
        t = p["total"]
        lines.append(f"{p['product']}, {p['stratum']}: {t['cards']} card(s), {t['gpu_years']:.3g} GPU-years observed, "
                     f"{t['incidents']} incident(s): {_per(t['rate_per_gpu_year'])} a GPU-year "
                     f"({_per(t['interval'][0])} to {_per(t['interval'][1])})")
        for b in p["buckets"]:
            lines.append(f"  heat aging bucket {b['bucket']} of {b['of']} ({b['aging_hours'][0]:.3g} to "
                         f"{b['aging_hours'][1]:.3g} equivalent hours): {b['cards']} card(s), {b['incidents']} "
                         f"incident(s) in {b['gpu_years']:.3g} GPU-years: {_per(b['rate_per_gpu_year'])} a GPU-year "
                         f"({_per(b['interval'][0])} to {_per(b['interval'][1])}, {doc['confidence']:.0%})")
        if len(p["buckets"]) > 1:
            lines.append("  the most worn bucket's rate lies above the least worn's interval: an association"
                         if p["hottest_above_coolest"] else
                         "  the buckets' intervals overlap: no association with heat aging this fleet can show")
        for o in p["outliers"]:
            lines.append(f"  stands out: {o['where']} ({o['uuid']}), {o['incidents']} incident(s) where its peers' "
                         f"rate gives {o['expected']:.2g} (p = {o['p']:.2g})")
    lines.append(f"Test for a card that stands out: {doc['test']}.")
    lines.append(doc["not_cause"])
    return lines
