"""The Grafana dashboards (grafana/dashboards/*.json) and provisioning files: structure,
metric names against the golden expositions, and every panel query run against a real
Prometheus that scraped the simulated daemon (demo scenario)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwear.metrics import GPU_METRICS, WEAR_METRICS
from test_rules import daemon_and_prometheus, golden_metric_names, promql_metric_names, unknown_metric_names

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = REPO / "grafana" / "dashboards"
PROVISIONING = REPO / "grafana" / "provisioning"
NAMES = ("does-dl-damage-my-card.json", "gpu-live.json", "fleet.json", "jobs.json")
DATASOURCE_UID = "${datasource}"
NO_QUERY_TYPES = {"text", "row"}  # the only panels without targets

# Queries that cannot return data after ~20 s of the demo scenario; for them, Prometheus need
# only accept the query. Keyed by metric name, each with the reason.
MAY_BE_EMPTY = {
    "gpuwear_retired_pages": "page retirement exists on pre-Ampere cards only; the demo has an RTX 4090 and an H100",
    "gpuwear_retired_pages_pending": "as gpuwear_retired_pages",
    "gpuwear_thermal_resistance_celsius_per_watt": "measured only after 300 s of steady idle and then of steady "
                                                   "load (daily value); the demo starts with 120 s of idle",
}
SCRAPE_SECONDS = 20.0


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / name).read_text())
    return data


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """(panel, expr) of every panel target."""
    for panel in all_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel, target["expr"]


def variable_queries(dashboard: dict[str, Any]) -> list[str]:
    out = []
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query))
    return out


def substituted(expr: str) -> str:
    """The query as Grafana sends it, with the template variables replaced."""
    for variable, value in (("${datasource}", ""), ("$__rate_interval", "5m"), ("$__range", "5m"),
                            ("$instance", ".*"), ("$gpu", ".*")):
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def datasource_refs(node: Any) -> Iterator[Any]:
    """Every value of a "datasource" key anywhere in the JSON."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from datasource_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasource_refs(item)


@pytest.fixture(params=NAMES)
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


# --- structure --------------------------------------------------------------------------------

def test_the_dashboards_exist_with_distinct_uids() -> None:
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(NAMES)
    uids = [load(name)["uid"] for name in NAMES]
    assert len(set(uids)) == len(uids), uids


def test_every_dashboard_links_to_the_others(dashboard: dict[str, Any]) -> None:
    """The links list every dashboard tagged gpuwear (each one is), keeping time and variables."""
    links = [link for link in dashboard["links"] if link["type"] == "dashboards" and "gpuwear" in link["tags"]]
    assert links, f"{dashboard['uid']}: no link to the gpuwear dashboards"
    assert all(link["keepTime"] and link["includeVars"] for link in links), links
    assert all("gpuwear" in load(name)["tags"] for name in NAMES)


def test_dashboard_header(dashboard: dict[str, Any]) -> None:
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 39
    assert dashboard["title"] and dashboard["uid"] and dashboard["panels"]
    assert dashboard.get("id") is None, "an exported id ties the file to one Grafana instance"
    assert "gpuwear" in dashboard["tags"]


def test_template_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance", "gpu"} <= set(variables)
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus", ds
    for name, query in (("instance", "label_values(gpuwear_gpu_info, instance)"),
                        ("gpu", 'label_values(gpuwear_gpu_info{instance=~"$instance"}, gpu)')):
        var = variables[name]
        assert var["type"] == "query", var
        assert var["definition"] == query, var
        assert (var["query"]["query"] if isinstance(var["query"], dict) else var["query"]) == query, var
        assert var["datasource"]["uid"] == DATASOURCE_UID, var


def test_panels(dashboard: dict[str, Any]) -> None:
    ids: list[int] = []
    for panel in all_panels(dashboard["panels"]):
        where = f"{dashboard['uid']}: panel {panel.get('id')} {panel.get('title')!r}"
        ids.append(panel["id"])
        assert panel.get("datasource", {}).get("uid") == DATASOURCE_UID, where
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, where
        if panel["type"] in NO_QUERY_TYPES:
            assert not panel.get("targets"), where
            if panel["type"] == "text":
                assert panel["options"]["content"].strip(), where
            continue
        assert panel.get("targets"), f"{where}: no query"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        # with no data a panel says why (before: 47 panels said a bare "No data", three of them on every GeForce
        # card or every fresh install)
        no_value = panel["fieldConfig"]["defaults"].get("noValue", "")
        assert len(no_value) >= 15 and no_value.lower() != "no data", f"{where}: no explanation when empty"
        for target in panel["targets"]:
            assert target["expr"].strip(), where
            assert target["datasource"]["uid"] == DATASOURCE_UID, where
            assert target["refId"], where
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), where
    assert len(set(ids)) == len(ids), f"{dashboard['uid']}: duplicate panel ids"


def test_datasources_only_through_the_variable(dashboard: dict[str, Any]) -> None:
    for ref in datasource_refs(dashboard):
        uid = ref.get("uid") if isinstance(ref, dict) else ref
        assert uid == DATASOURCE_UID, f"hard-coded datasource {ref!r} in {dashboard['uid']}"


def test_metric_names_exist_in_the_golden_files(dashboard: dict[str, Any]) -> None:
    known = golden_metric_names()
    for panel, expr in queries(dashboard):
        assert not unknown_metric_names(expr, known), (panel["title"], expr)
    for query in variable_queries(dashboard):
        assert not unknown_metric_names(query, known), query


def test_dl_dashboard_layout() -> None:
    dash = load("does-dl-damage-my-card.json")
    panels = dash["panels"]
    rows = [p for p in panels if p["type"] == "row"]
    assert len(rows) == 1 and rows[0]["repeat"] == "gpu", rows
    gpu = {v["name"]: v for v in dash["templating"]["list"]}["gpu"]
    assert gpu["multi"] or gpu["includeAll"], "a repeated row needs a multi-value variable"
    in_row = panels[panels.index(rows[0]) + 1:] + rows[0]["panels"]
    texts = [p["options"]["content"] for p in in_row if p["type"] == "text"]
    zones = [next(i for i, text in enumerate(texts) if zone in text)
             for zone in ("Measured health", "Operating stress", "Estimated wear")]
    assert zones == sorted(zones), "the three zones are out of order"
    assert any("unknown on this card" in text and "never healthy" in text for text in texts)
    assert any("throttling is the card protecting itself" in text.lower() for text in texts)
    exprs = " ".join(t["expr"] for p in in_row for t in p.get("targets", []))
    for metric in ("gpuwear_health_status", "gpuwear_health_reason", "gpuwear_ecc_errors_total",
                   "gpuwear_retired_pages", "gpuwear_remapped_rows", "gpuwear_xid_tier_events_total",
                   "gpuwear_lifetime_temperature_above_seconds_total", "gpuwear_lifetime_threshold_above_seconds_total",
                   "gpuwear_lifetime_thermal_cycles_total", "gpuwear_lifetime_throttle_seconds_total",
                   "gpuwear_power_watts", "gpuwear_power_limit_watts", "gpuwear_fan_speed_ratio",
                   "gpuwear_thermal_resistance_celsius_per_watt", "gpuwear_thermal_aging_equivalent_seconds",
                   "gpuwear_cycle_fatigue_equivalent_cycles", "gpuwear_lifetime_coverage_ratio"):
        assert metric in exprs, f"the DL dashboard does not show {metric}"
    verdict = next(p for p in in_row if p["title"] == "Health verdict")
    texts_mapped = {o["text"] for m in verdict["fieldConfig"]["defaults"]["mappings"] for o in m["options"].values()}
    assert {"ok", "watch", "act"} <= texts_mapped and any("unknown" in t for t in texts_mapped), texts_mapped
    # every wear estimate is shown as a band (low end, central, high end) with the coverage beside it
    for panel in in_row:
        panel_exprs = [t["expr"] for t in panel.get("targets", [])]
        if any("equivalent" in e for e in panel_exprs):
            assert any("gpuwear_lifetime_coverage_ratio" in e for e in panel_exprs), panel["title"]
            if panel["type"] != "stat" or "rate" not in panel["title"]:
                assert any(e.startswith("min") for e in panel_exprs), panel["title"]
                assert any(e.startswith("max") for e in panel_exprs), panel["title"]


def test_live_and_fleet_dashboards_show_what_they_promise() -> None:
    live = " ".join(expr for _, expr in queries(load("gpu-live.json")))
    for metric in ("gpuwear_temperature_celsius", "gpuwear_temperature_threshold_celsius", "gpuwear_power_watts",
                   "gpuwear_power_limit_watts", "gpuwear_clock_hertz", "gpuwear_clock_event_reason_active",
                   "gpuwear_fan_speed_ratio", "gpuwear_utilization_ratio", "gpuwear_memory_used_bytes",
                   "gpuwear_xid_tier_events_total", "gpuwear_sample_errors_total"):
        assert metric in live, metric
    fleet = " ".join(expr for _, expr in queries(load("fleet.json")))
    for needle in ("deriv(gpuwear_thermal_aging_equivalent_seconds", "gpuwear_health_status", "gpuwear_gpu_up",
                   'up{job="gpuwear"} == 0', "gpuwear_ledger_last_persist_timestamp_seconds",
                   "gpuwear_ledger_persist_success"):
        assert needle in fleet, needle


def panel_exprs(dashboard: dict[str, Any], title: str) -> list[str]:
    (panel,) = [p for p in all_panels(dashboard["panels"]) if p["title"] == title and p.get("targets")]
    return [target["expr"] for target in panel["targets"]]


def test_jobs_dashboard_shows_what_it_promises() -> None:
    dash = load("jobs.json")
    assert dash["title"] == "Jobs"
    exprs = " ".join(expr for _, expr in queries(dash))
    for needle in ("gpuwear_job_info", "increase(gpuwear_lifetime_attributed_seconds_total",
                   "increase(gpuwear_lifetime_attributed_energy_joules_total",
                   "gpuwear_attributed_thermal_aging_equivalent_seconds",
                   "rate(gpuwear_lifetime_attributed_seconds_total", 'gpuwear_temperature_celsius{'):
        assert needle in exprs, needle
    (now,) = panel_exprs(dash, "Job running now on each GPU")
    assert all(label in now for label in ("gpu", "job_kind", "job_id", "user")), now
    hottest = " ".join(panel_exprs(dash, "Hottest recent jobs"))
    assert "max_over_time(" in hottest and "gpuwear_job_info" in hottest and "[$__range:]" in hottest, hottest
    assert "gpuwear_temperature_celsius" in hottest and 'sensor="gpu"' in hottest, hottest
    types = {p["type"] for p in all_panels(dash["panels"])}
    assert {"piechart", "table", "timeseries", "text"} <= types, types
    texts = " ".join(p["options"]["content"] for p in all_panels(dash["panels"]) if p["type"] == "text")
    assert "gpuwear jobs --since 1d" in texts and "not in Prometheus" in texts, texts


def test_substitution_leaves_valid_looking_promql() -> None:
    expr = 'deriv(x{instance=~"$instance",gpu=~"$gpu"}[$__range]) + rate(y[$__rate_interval])'
    assert substituted(expr) == 'deriv(x{instance=~".*",gpu=~".*"}[5m]) + rate(y[5m])'
    assert promql_metric_names(substituted(expr)) == {"x", "y"}


# --- provisioning -----------------------------------------------------------------------------

def test_provisioning_files() -> None:
    dashboards = yaml.safe_load((PROVISIONING / "dashboards" / "gpuwear.yml").read_text())
    assert dashboards["apiVersion"] == 1
    (provider,) = dashboards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"], provider
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090", source
    assert source["access"] == "proxy", source
    readme = (REPO / "grafana" / "README.md").read_text()
    assert "provisioning" in readme and "http://prometheus:9090" in readme


# --- every query against a real Prometheus -----------------------------------------------------

# families exported in whole or in part only with metrics.detail
PART_DETAIL = {m.name for m in (*GPU_METRICS, *WEAR_METRICS) if m.detail or m.basic is not None}

@pytest.mark.slow
@pytest.mark.e2e
def test_every_panel_has_data_from_a_default_daemon(tmp_path: Path) -> None:
    """Every panel shows data from the daemon's default metrics (no metrics.detail): a default install has no hole.
    A query of a family exported only with metrics.detail may be empty only beside one of the same panel that has
    data, and only where the panel says so (a line that detail adds: the 5 °C steps beside the card's own
    threshold, NVML's violation counters beside the clock-event reasons). Before, five panels were empty by default:
    time at or above a temperature, time at the power limit, the default power limit, the maximum clocks and the
    time held down by a policy."""
    exprs: dict[str, str] = {}  # substituted query -> where it comes from
    panels: dict[str, list[str]] = {}  # "dashboard: title" -> its substituted queries
    detail_lines: set[str] = set()
    for name in NAMES:
        dash = load(name)
        for panel, expr in queries(dash):
            where = f"{name}: {panel['title']!r}"
            exprs.setdefault(substituted(expr), where)
            panels.setdefault(where, []).append(substituted(expr))
            if "metrics.detail" in panel.get("description", "") and promql_metric_names(expr) & PART_DETAIL:
                detail_lines.add(substituted(expr))
        for query in variable_queries(dash):
            exprs.setdefault(substituted(query), f"{name}: template variable")
    may_be_empty = {expr for expr in exprs if promql_metric_names(expr) & set(MAY_BE_EMPTY)}
    assert len(may_be_empty) <= 4, f"too many exceptions: {sorted(may_be_empty)}"

    # x300: the 20 s of scraping cover 100 simulated minutes, past the demo's first evaluation pause (32 min in),
    # where its first thermal cycle closes
    with daemon_and_prometheus(tmp_path, "demo", gpus=2, speed=300) as rig:
        time.sleep(SCRAPE_SECONDS)
        has_data, rejected = set(), []
        for expr, where in sorted(exprs.items()):
            status, reply = rig.api("query", query=expr)
            if status != 200 or reply.get("status") != "success":
                rejected.append(f"{where}: {expr}: {status} {reply.get('error')}")
            elif reply["data"]["result"]:
                has_data.add(expr)
        assert not rejected, "queries Prometheus rejects:\n" + "\n".join(rejected)
        empty = [f"{where}: {expr}" for where, queries_ in panels.items() for expr in queries_
                 if expr not in has_data | may_be_empty
                 and not (expr in detail_lines and any(q in has_data for q in queries_))]
        assert not empty, "queries without data from a default daemon on the demo:\n" + "\n".join(empty)
        empty_panels = [where for where, queries_ in panels.items()
                        if not any(q in has_data | may_be_empty for q in queries_)]
        assert not empty_panels, "panels without data by default:\n" + "\n".join(empty_panels)

        # the demo's simulated jobs, as the Jobs dashboard shows them
        jobs = load("jobs.json")
        (now,) = panel_exprs(jobs, "Job running now on each GPU")
        assert {row["metric"]["gpu"] for row in rig.query(substituted(now))} == {"0", "1"}, "a row per GPU"
        hottest = panel_exprs(jobs, "Hottest recent jobs")[0]
        ran = {(row["metric"]["job_kind"], row["metric"]["job_id"]) for row in rig.query(substituted(hottest))}
        assert ("simulated", "resnet50-ddp") in ran, ran
