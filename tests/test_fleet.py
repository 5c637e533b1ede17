"""A fleet, simulated end to end, CI-sized: bench/fleet.py's own code path with 5 nodes x 2 GPUs, a Prometheus
scraping them every second with the shipped rules, a second one receiving its remote_write, and the lifetime figures
of the ledgers against both (bench/fleet.py runs the full-sized fleet: 50 x 8).

Needs Debian's ``prometheus`` package; ./test.sh installs it. 25 to 45 s on 2 cores.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import require, slow_fixture

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import fleet  # noqa: E402

NODES, GPUS = 5, 2  # kinds in turn: idle, training, stress, mixed, idle (two idle nodes, to compare)


@pytest.fixture(scope="module")
@slow_fixture
def results(tmp_path_factory: pytest.TempPathFactory) -> fleet.Results:
    require("prometheus")
    opts = fleet.Options(nodes=NODES, gpus=GPUS, duration=6.0, speed=10.0, scrape_interval=1.0, warmup_scrapes=3,
                         query_repeats=2, work=tmp_path_factory.mktemp("fleet"))
    return fleet.run(opts)


@pytest.mark.slow
@pytest.mark.e2e
def test_every_node_is_up_and_exposes_a_bounded_number_of_series(results: fleet.Results) -> None:
    addresses = {n.address for n in results.nodes}
    assert len(addresses) == NODES
    assert results.up == dict.fromkeys(addresses, 1.0), results.up
    assert set(results.series_exposed) == addresses
    # the count itself is being reduced: only that it is there, per GPU in a sane range, and the same on nodes
    # running the same scenario
    for address, count in results.series_exposed.items():
        assert 10 * GPUS <= count <= 500 * GPUS, f"{address}: {count} series"
    by_kind = fleet.series_by_kind(results)
    assert len(by_kind["idle"]) == 2
    for kind, counts in by_kind.items():
        assert len(set(counts)) == 1, f"{kind} nodes (same scenario) expose different series counts: {counts}"
    per_node = fleet.per_node(results)
    assert per_node["head_series"] > 0 and per_node["appended_per_second"] > 0


@pytest.mark.e2e
def test_the_receiver_holds_what_the_scraper_holds(results: fleet.Results) -> None:
    assert results.names_p1, "p1 holds no metric names"
    assert results.names_p2 == results.names_p1
    assert "gpuwear_lifetime_observed_seconds_total" in results.names_p2
    assert "DCGM_FI_DEV_GPU_TEMP" in results.names_p2, "the recording rules' series were not remote-written"
    p1 = results.servers["p1"]
    assert p1.get("prometheus_remote_storage_samples_failed_total", 0) == 0
    assert p1.get("prometheus_remote_storage_samples_dropped_total", 0) == 0
    assert p1.get("prometheus_rule_evaluation_failures_total", 0) == 0
    assert results.servers["p2"]["appended_per_second"] > 0


@pytest.mark.e2e
def test_every_fleet_dashboard_query_answers_on_both_servers(results: fleet.Results) -> None:
    expected = fleet.dashboard_queries()
    assert len(results.queries) == 2 * len(expected)
    problems = [f"{q['server']} {q['panel']} {q['ref']} ({q['mode']}): errors {q['errors']}, {q['series']} series"
                for q in results.queries
                if q["error_count"] or (not q["series"] and not q["may_be_empty"])]
    assert not problems, "\n".join(problems)


@pytest.mark.e2e
def test_lifetime_figures_add_up_across_nodes(results: fleet.Results) -> None:
    assert not results.freeze["moved_after_last_scrape"], "sampling went on after the freeze"
    assert set(results.freeze["exit_codes"].values()) == {0}, results.freeze["exit_codes"]
    rows = {x["metric"]: x for x in results.lifetime}
    failed = [x for x in results.lifetime if not x["ok"]]
    assert not failed, "\n".join(f"{x['figure']}: ledgers {x['ledgers']}, p1 {x['p1']}, p2 {x['p2']}, tolerance "
                                 f"{x['tolerance']}" for x in failed)
    for figure in fleet.LIFETIME:
        if figure.required:
            row = rows[figure.selector]
            assert row["verdict"] == "PASS" and row["nodes_in_p1"] == row["nodes_in_p2"] == NODES, row
    observed = rows["gpuwear_lifetime_observed_seconds_total"]
    assert observed["ledgers"] > NODES * GPUS * 10, observed  # every GPU observed for a while (simulated s)


@pytest.mark.e2e
def test_the_report_says_it_all(results: fleet.Results) -> None:
    text = fleet.report(results)
    assert fleet.command_line(results.options) in text
    assert "## Findings" in text and "none: every check above passed" in text, text[-3000:]


@pytest.mark.e2e
def test_gpuwear_fleet_answers_from_the_long_term_store(results: fleet.Results) -> None:
    """Issue 56, item 3: `gpuwear fleet --json` against p2 (the store remote_write fills, as Thanos, Mimir or
    VictoriaMetrics would be) finds every card of the fleet once, by product, with the time each was observed in the
    span and the incidents the scenarios scripted (a double-bit ECC error, XID 48, on each stress node's first card)
    and no other; the rates and intervals come with them, and what it cannot see."""
    doc = results.answer
    cards = {c["uuid"]: c for c in doc["cards"]}
    assert len(cards) == NODES * GPUS and doc["source"] in ("recording rules", "raw series")
    stress = [n for n in results.nodes if n.kind == "stress"]
    incidents = {c["uuid"]: c["incidents"] for c in cards.values() if c["incidents"]}
    assert len(incidents) == len(stress) and set(incidents.values()) == {1}, incidents
    assert all(c["product"] == "Tesla V100-PCIE-16GB" for u, c in cards.items() if u in incidents)
    assert all(c["exposure_seconds"] > 0 for c in cards.values())
    # each card's reasons while in the span (the XID 48: its verdict's xid_N) and its band: none by default (the
    # parameter extremes are metrics.detail's), said so
    assert all("xid_N" in cards[u]["reasons"] for u in incidents), {u: cards[u]["reasons"] for u in incidents}
    assert all(c["aging_band_hours"] is None for c in cards.values())
    total = sum(p["total"]["incidents"] for p in doc["products"])
    assert total == len(stress) and {p["product"] for p in doc["products"]} >= {"NVIDIA H100 80GB HBM3"}
    v100 = next(p for p in doc["products"] if p["product"] == "Tesla V100-PCIE-16GB")
    low, high = v100["total"]["interval"]
    assert low < v100["total"]["rate_per_gpu_year"] < high
    assert doc["cannot_see"] and doc["cost"]["queries"] >= 6 and doc["retention_short"] is None
    from gpuwear.fleet.html import render  # the same answer as a page: each bucket's figures those of the JSON

    page = render(doc, "90d")
    shown = re.findall(r'<tr data-bucket="(\d+)">.*?data-figure="incidents" data-value="(\d+)".*?data-figure="rate" '
                       r'data-value="([^"]*)"', page)
    assert shown == [(str(b["bucket"]), str(b["incidents"]), str(b["rate_per_gpu_year"]))
                     for p in doc["products"] for b in p["buckets"]], shown


def _history(now: float) -> str:
    """Three hours of three cards' series as OpenMetrics, a sample a minute, ending at ``now``: GPU-A on n1 until
    100 minutes ago (an XID at 105 minutes), then on n2 with its passport imported (its lifetime figures carry n1's),
    one more XID 30 minutes ago; GPU-B on n1 throughout, 3 XIDs before the span, one at 60 minutes, then a crash's
    dip (not yet saved: one less for two minutes); GPU-C new on n2 30 minutes ago, an XID 20 minutes ago."""
    families: dict[str, list[str]] = {"gpuwear_gpu_info": [], "gpuwear_lifetime_observed_seconds_total": [],
                                      "gpuwear_xid_tier_events_total": [],
                                      "gpuwear_thermal_aging_equivalent_seconds": []}

    def card(uuid: str, instance: str, minutes: range, observed: float, xids: Callable[[int], int]) -> None:
        base = f'job="gpuwear",instance="{instance}",gpu="0",uuid="{uuid}"'
        for m in minutes:  # minutes before now, counting down
            t = now - 60 * m
            families["gpuwear_gpu_info"].append(f'gpuwear_gpu_info{{{base},name="NVIDIA H100 80GB HBM3"}} 1 {t}')
            families["gpuwear_lifetime_observed_seconds_total"].append(
                f"gpuwear_lifetime_observed_seconds_total{{{base}}} {observed + 60 * (minutes.start - m)} {t}")
            families["gpuwear_xid_tier_events_total"].append(
                f'gpuwear_xid_tier_events_total{{{base},tier="act"}} {xids(m)} {t}')
            families["gpuwear_thermal_aging_equivalent_seconds"].append(
                f'gpuwear_thermal_aging_equivalent_seconds{{{base},sensor="gpu",band="central"}} 100 {t}')

    card("GPU-A", "n1:9941", range(180, 99, -1), 0.0, lambda m: 1 if m <= 105 else 0)
    card("GPU-A", "n2:9941", range(99, -1, -1), 81 * 60.0, lambda m: 2 if m <= 30 else 1)
    card("GPU-B", "n1:9941", range(180, -1, -1), 0.0, lambda m: 3 if m > 60 or m in (59, 58) else 4)
    card("GPU-C", "n2:9941", range(30, -1, -1), 0.0, lambda m: 1 if m <= 20 else 0)
    kinds = {"gpuwear_gpu_info": "gauge", "gpuwear_thermal_aging_equivalent_seconds": "gauge"}
    out = []
    for name, lines in families.items():
        family = name.removesuffix("_total")
        out.append(f"# TYPE {family} {kinds.get(name, 'counter')}")
        out += lines
    return "\n".join(out) + "\n# EOF\n"


@pytest.mark.slow
@pytest.mark.e2e
def test_a_moved_card_counts_once_a_new_one_from_first_sight_and_a_crash_dip_is_no_incident(tmp_path: Path) -> None:
    """Issue 56: a span's exposure and incidents are each card's lifetime figures (the ledger's) at their largest
    less their value just before the span; a card the store first holds within it counts from its first sight. A
    card moved between nodes with its passport counted once, from the ledger holding the most of its life (added up
    across its instances, its first XID counted twice: 3); a crash that lost an XID not yet saved is no incident
    (increase() reads that dip as a counter reset). Through a real Prometheus whose TSDB promtool built from the
    series."""
    import time

    from gpuwear.fleet.client import FleetError, Store, figures
    from helpers import free_port, started

    now = float(int(time.time()) // 60 * 60)
    source = tmp_path / "series.om"
    source.write_text(_history(now))
    tsdb = tmp_path / "tsdb"
    subprocess.run([require("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
                   check=True, capture_output=True, timeout=120)
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {}\n")
    with started([require("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                  f"--web.listen-address={address}"], tmp_path / "prometheus.log", tmp_path):
        store = Store(f"http://{address}")
        deadline = time.monotonic() + 60
        while True:
            try:
                if store.query("count(gpuwear_gpu_info)", now):
                    break
            except FleetError:  # not listening yet
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
        got = figures(store, 2 * 3600.0, at=now)
    cards = {c.uuid: c for c in got.cards}
    assert got.source == "raw series" and set(cards) == {"GPU-A", "GPU-B", "GPU-C"}, got
    a, b, c = cards["GPU-A"], cards["GPU-B"], cards["GPU-C"]
    # GPU-A: n2's ledger (its whole life, n1's included), first held within the span: from its first sight
    assert (a.where, a.incidents, a.exposure_seconds) == ("n2:9941 GPU 0", 2, 180 * 60.0), a
    assert (b.incidents, b.exposure_seconds) == (1, 120 * 60.0), b  # present before the span: its difference
    assert (c.incidents, c.exposure_seconds) == (1, 30 * 60.0), c
