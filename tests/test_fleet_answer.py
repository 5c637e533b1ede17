"""The fleet's answer (issue 56, item 3), pure: exact Poisson intervals against their closed forms, the rates by
product and heat-aging bucket, no association where incidents are independent of wear, and a card that stands out
by its named test."""

from __future__ import annotations

import math
import random

import pytest

from gpuwear.fleet.answer import YEAR_SECONDS, Card, answer, card_lines, garwood, poisson_at_least, words


def test_the_exact_poisson_intervals_and_tails_match_their_closed_forms() -> None:
    """Garwood's interval at k = 0 and 1 has closed forms (upper at 0: -ln(alpha/2); lower at 1: -ln(1 - alpha/2));
    at 10 the published table's 4.7954 to 18.3904; the tail against the direct sum of the Poisson terms."""
    assert garwood(0) == (0.0, pytest.approx(-math.log(0.025), rel=1e-9))
    assert garwood(1)[0] == pytest.approx(-math.log(0.975), rel=1e-9)
    low, high = garwood(10)
    assert (round(low, 4), round(high, 4)) == (4.7954, 18.3904)
    for k, mean in ((1, 0.3), (3, 1.5), (12, 4.0), (50, 20.0), (40, 60.0)):
        direct = 1 - sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(k))
        assert poisson_at_least(k, mean) == pytest.approx(direct, rel=1e-6, abs=1e-12)
    assert poisson_at_least(0, 5.0) == 1.0 and poisson_at_least(2, 0.0) == 0.0


def _fleet(rate_of: dict[int, float], seed: int, cards: int = 40) -> list[Card]:
    """``cards`` H100s over a year each, heat aging 100 to 4000 h; quartile q's cards draw Poisson(rate_of[q])."""
    r = random.Random(seed)
    out = []
    for i in range(cards):
        aging = 100.0 + 100.0 * i
        q = i * 4 // cards
        k, t = 0, r.expovariate(rate_of[q])
        while t < 1.0:
            k += 1
            t += r.expovariate(rate_of[q])
        out.append(Card(f"GPU-{i:03d}", "NVIDIA H100 80GB HBM3", f"node-{i // 8}:9941 GPU {i % 8}", aging,
                        YEAR_SECONDS, k))
    return out


def test_incidents_independent_of_wear_show_no_association_and_wear_driven_ones_do() -> None:
    """Issue 56's done-when: a fleet whose incidents are scripted independent of wear shows no association beyond its
    intervals (the buckets' intervals overlap, in 20 fleets of 40 cards, but by chance at most one); one of 80 cards
    whose hottest quartile fails ten times as often as its coolest shows it."""
    overlapping = sum(not answer(_fleet({0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}, seed))["products"][0][
        "hottest_above_coolest"] for seed in range(20))
    assert overlapping >= 19
    driven = answer(_fleet({0: 0.2, 1: 0.2, 2: 0.5, 3: 2.0}, 7, cards=80))
    (product,) = driven["products"]
    assert product["hottest_above_coolest"] and [b["bucket"] for b in product["buckets"]] == [1, 2, 3, 4]
    b = product["buckets"][-1]
    assert b["cards"] == 20 and b["gpu_years"] == pytest.approx(20.0)
    assert b["interval"][0] < b["rate_per_gpu_year"] < b["interval"][1]
    text = "\n".join(words(driven))
    assert "an association" in text and "Association, not cause" in text


def test_a_card_with_far_more_incidents_than_its_peers_stands_out_by_the_named_test() -> None:
    cards = [Card(f"GPU-{i}", "NVIDIA A100-SXM4-80GB", f"n:9941 GPU {i}", 500.0 + i, YEAR_SECONDS, 1)
             for i in range(12)]
    cards.append(Card("GPU-bad", "NVIDIA A100-SXM4-80GB", "n:9941 GPU 12", 510.0, YEAR_SECONDS, 9))
    cards.append(Card("GPU-other", "Tesla V100-PCIE-16GB", "m:9941 GPU 0", 50.0, YEAR_SECONDS / 2, 0))
    doc = answer(cards)
    a100 = next(p for p in doc["products"] if p["product"] == "NVIDIA A100-SXM4-80GB")
    assert [o["uuid"] for o in a100["outliers"]] == ["GPU-bad"] and a100["outliers"][0]["p"] < 0.05 / 13
    assert [b["of"] for b in a100["buckets"]] == [4] * 4
    v100 = next(p for p in doc["products"] if p["product"] == "Tesla V100-PCIE-16GB")
    assert [b["of"] for b in v100["buckets"]] == [1] and v100["total"]["rate_per_gpu_year"] == 0.0
    assert v100["total"]["interval"][1] == pytest.approx(-math.log(0.025) / 0.5, rel=1e-9)
    assert "Bonferroni" in doc["test"]
    assert any("stands out: n:9941 GPU 12 (GPU-bad), 9 incident(s)" in line for line in words(doc))


def test_fleet_refuses_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A URL that is not one, a store nobody answers at, half of basic auth, a token file that is not there: one line
    each, naming it, and a non-zero exit."""
    from gpuwear.cli import main
    from helpers import free_port

    cases = ([["--prometheus", "prometheus:9090"], 1, "--prometheus: expected an http:// or https:// URL"],
             [["--prometheus", f"http://127.0.0.1:{free_port()}"], 1, "Connection refused"],
             [["--prometheus", "http://127.0.0.1:9", "--basic-user", "u"], 2,
              "--basic-user and --basic-password-file go"],
             [["--prometheus", "http://127.0.0.1:9", "--bearer-token-file", "/nonexistent/t"], 1,
              "--bearer-token-file /nonexistent/t: No such file or directory"],
             [["--prometheus", "http://127.0.0.1:9", "--span", "forever"], 2, "--span: expected a duration"])
    for args, code, said in cases:
        assert main(["fleet", *args]) == code
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_age_is_held_apart_so_an_age_effect_is_not_read_as_wear() -> None:
    """Issue 56, item 3: per product and age stratum. An older card has carried more heat simply by being older and
    may fail more for its age: 40 cards observed half a year (100 to 2,050 equivalent hours, 0.2 incidents a
    GPU-year) beside 40 observed four years (3,000 to 6,900 hours, 2 a GPU-year), incidents independent of heat
    within each age. Pooled by product alone, the most worn bucket lies above the least worn (all old cards against
    all young ones); held apart by age, neither stratum shows an association."""
    r = random.Random(3)

    def draws(rate: float) -> int:
        k, t = 0, r.expovariate(rate)
        while t < 1.0:
            k, t = k + 1, t + r.expovariate(rate)
        return k

    cards = [Card(f"GPU-y{i:02d}", "NVIDIA A100-SXM4-80GB", f"young-{i}", 100.0 + 50.0 * i, YEAR_SECONDS, draws(0.2),
                  age_seconds=0.5 * YEAR_SECONDS) for i in range(40)]
    cards += [Card(f"GPU-o{i:02d}", "NVIDIA A100-SXM4-80GB", f"old-{i}", 3000.0 + 100.0 * i, YEAR_SECONDS, draws(2.0),
                   age_seconds=4 * YEAR_SECONDS) for i in range(40)]
    (pooled,) = answer(cards, strata=False)["products"]
    assert pooled["stratum"] == "all ages" and pooled["hottest_above_coolest"]
    held = answer(cards)["products"]
    assert [p["stratum"] for p in held] == ["observed under a year", "observed 3 years or more"]
    assert not any(p["hottest_above_coolest"] for p in held)
    assert "NVIDIA A100-SXM4-80GB, observed 3 years or more: 40 card(s)" in "\n".join(words(answer(cards)))
    assert answer([Card("GPU-x", "p", "w", 1.0, YEAR_SECONDS, 0)])["products"][0]["stratum"] == "age unknown"


def test_every_card_is_listed_by_product_with_its_band_incidents_and_reasons() -> None:
    """Issue 56 item 3: "cards by product; wear per card with its band; incidents and reasons per card". The band
    where the store holds it (the parameter extremes are metrics.detail's), said as missing where not."""
    cards = [Card("GPU-b", "NVIDIA H100 80GB HBM3", "n2:9941 GPU 0", 1234.4, 86400.0 * 3, 2, None, None,
                  (800.0, 2100.0), ("xid_N", "retired_pages")),
             Card("GPU-a", "Tesla V100-PCIE-16GB", "n1:9941 GPU 1", 10.0, 86400.0, 0),
             Card("GPU-c", "NVIDIA H100 80GB HBM3", "n1:9941 GPU 3", 99.0, 43200.0, 0)]
    assert card_lines(cards) == [
        "NVIDIA H100 80GB HBM3:",
        "  n1:9941 GPU 3 (GPU-c): heat aging 99 equivalent hours (central; its band needs metrics.detail), 0.5 day(s) "
        "observed, 0 incident(s), no reason",
        "  n2:9941 GPU 0 (GPU-b): heat aging 1,234 equivalent hours (band 800 to 2,100), 3 day(s) observed, 2 "
        "incident(s), reasons xid_N, retired_pages",
        "Tesla V100-PCIE-16GB:",
        "  n1:9941 GPU 1 (GPU-a): heat aging 10 equivalent hours (central; its band needs metrics.detail), 1 day(s) "
        "observed, 0 incident(s), no reason"]
