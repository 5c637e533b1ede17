"""The health rules as a table (gpuwear.health): each rule's row against what its judge gives, the runbook's table
(docs/alerts.md) made from it, each rule's alert and hold against deploy/prometheus/gpuwear-rules.yml, and NVIDIA's
Xid catalog as data."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import yaml

from gpuwear.config import WearConfig
from gpuwear.health import RULES, TABLE, XID_ACT, XID_WATCH, rule, verdict
from gpuwear.health.rules import Facts
from gpuwear.health.runbook import markdown, replaced
from gpuwear.health.xids import BY_CODE, CATALOG
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.models import resistance_trend

REPO = Path(__file__).resolve().parent.parent
RUNBOOK = REPO / "docs" / "alerts.md"
ALERT_RULES = REPO / "deploy" / "prometheus" / "gpuwear-rules.yml"
T0 = 1.79e9
DAY = 86400.0


def random_gpu(seed: int) -> tuple[GpuWear, dict[str, list[float]]]:
    """A GPU's record in a random state that reaches every rule of the table across seeds, and peers' rates."""
    r = random.Random(seed)
    w = GpuWear(f"GPU-{seed}", name="card")
    w.first_seen, w.last_seen = T0, T0 + r.uniform(0, 40 * DAY)
    h = w.health
    for k in ("remapped_rows_failure", "remapped_rows_pending", "retired_pages_pending", "ecc_enabled",
              "memory_temperature_reported"):
        if r.random() < 0.2:
            h[k] = r.choice([True, False])
    for k in ("recovery_action", "ecc_uncorrected_volatile", "retired_pages_single_bit", "retired_pages_double_bit",
              "pcie_aer_fatal", "pcie_aer_nonfatal", "remapped_rows_uncorrected", "remapped_rows_corrected",
              "ecc_uncorrected_aggregate", "nvlink_recovery_errors"):
        if r.random() < 0.15:
            h[k] = r.choice([0, 1, 3, 40, 61])
    if r.random() < 0.2:
        h.update(nvlink_links_active=r.randint(0, 18), nvlink_links_most=18,
                 nvlink_links_most_at=int(w.last_seen - r.choice([0, 100, 400, 90000])))
    if r.random() < 0.2:
        h.update(pcie_downgraded_since=int(w.last_seen - r.choice([0, 100, 700])), pcie_link_width=8,
                 pcie_link_width_max=16)
    for _ in range(r.randint(0, 3)):
        x = r.choice([*sorted(BY_CODE), 999])
        w.xids[str(x)] = r.randint(1, 5)
        w.last_event[f"xid {x}"] = w.last_seen - r.uniform(0, 20 * DAY)
    if r.random() < 0.2:
        w.lost_events, w.last_event["gpu lost"] = 2, w.last_seen - r.uniform(0, 20 * DAY)
    for _ in range(r.randint(0, 4)):
        w.add_incident(w.last_seen - r.uniform(0, 30 * DAY), r.choice(["xid 79", "gpu lost", "xid 48"]))
    if r.random() < 0.5:
        w.error_counts = {"ecc_corrected": [r.choice([100.0, 7200.0]), r.choice([0.0, 5000.0, 1e6]), 100.0, 3.0],
                          "nvml_stalls": [7200.0, float(r.randint(0, 5)), 10.0, float(r.randint(0, 2))]}
    if r.random() < 0.6:
        w.thresholds["slowdown"] = 87.0
        w.temperature_seconds = {"gpu": {str(r.randint(40, 95)): r.uniform(0, 5000), "50": 1000.0}}
        w.utilization_seconds = {"100": r.uniform(0, 5000), "0": 100.0}
        w.throttle_seconds = {"sw_thermal_slowdown": r.uniform(0, 500)}
    if r.random() < 0.3:
        for d in range(8):
            w.thermal_resistance[f"2026-01-{d + 1:02d}"] = [100.0, 100.0 * (0.1 + d * r.uniform(0, 0.01)), 1.0]
    return w, r.choice([{}, {"ecc_corrected": [10.0, 200.0]}])


def test_each_rule_gives_only_its_own_code_and_every_rule_fires_somewhere() -> None:
    """A rule is read, tested and switched off alone by its row: its judge gives the code its row declares (xid_N:
    a code of the catalog's act or watch tier) with a severity its row allows, and across varied records each rule
    of the table fires; the verdict is their combination in the table's order, each reason with its row's rule."""
    fired: set[str] = set()
    severities = {"act": {"act", "watch"}, "watch": {"watch"}, "unknown": {"unknown"},
                  "the code's tier": {"act", "watch"}}
    for seed in range(600):
        w, peers = random_gpu(seed)
        facts = Facts(w, WearConfig(), resistance_trend(w), None, None, peers)
        given = []
        for r in TABLE:
            for severity, code, _ in r.judge(facts):
                if r.code == "xid_N":
                    xid = BY_CODE[int(code.removeprefix("xid_"))]
                    assert xid.tier in ("act", "watch") and (severity == xid.tier or severity == "watch"), code
                else:
                    assert code == r.code, (r.code, code)
                assert severity in severities[r.severity], (r.code, severity)
                fired.add(r.code)
                given.append(code)
        v = verdict(w, WearConfig(), resistance_trend(w), peers=peers)
        assert [x["code"] for x in v["reasons"]] == given
        assert all(x["rule"] == rule(x["code"]) for x in v["reasons"])
    assert fired == {r.code for r in TABLE}, {r.code for r in TABLE} - fired


def test_every_row_says_its_window_its_end_and_its_source() -> None:
    codes = [r.code for r in TABLE]
    assert len(codes) == len(set(codes))
    for r in TABLE:
        assert all((r.signal, r.window, r.threshold, r.ends, r.source)), r.code
        assert r.severity in ("act", "watch", "unknown", "the code's tier"), r.code
    assert set(RULES) == set(codes) - {"xid_N"}


def test_the_runbook_table_is_made_from_the_rule_table(request: pytest.FixtureRequest) -> None:
    """docs/alerts.md's table of reason codes, which the health alerts point at, is the table's own text: each
    code with what it reads, its window, threshold, end and rule word for word. ``--update-golden`` writes it."""
    text = RUNBOOK.read_text()
    if request.config.getoption("--update-golden"):
        RUNBOOK.write_text(replaced(text))
        text = RUNBOOK.read_text()
    assert markdown() in text, "docs/alerts.md's rule table differs from gpuwear.health.rules.TABLE: pytest " \
        "tests/test_health.py --update-golden"
    for code, source in RULES.items():
        assert f"| `{code}` |" in text and source.replace("|", "\\|") in text, code


def test_each_rules_alert_exists_with_the_rules_hold() -> None:
    """A rule that an alert applies too names it; where the rule holds a reading before it says it (links train
    after a boot), the alert's ``for:`` is the same hold."""
    alerts = {rule["alert"]: rule for group in yaml.safe_load(ALERT_RULES.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    units = {"s": 1, "m": 60, "h": 3600}
    named = [r for r in TABLE if r.alert]
    assert len(named) >= 10
    for r in named:
        assert r.alert in alerts, r.alert
        if r.hold_seconds is not None:
            m = re.fullmatch(r"(\d+)([smh])", str(alerts[r.alert].get("for", "0s")))
            assert m is not None and int(m.group(1)) * units[m.group(2)] == r.hold_seconds, (r.code, r.alert)


def test_the_xid_catalog_is_data_with_one_tier_a_code() -> None:
    assert len({x.code for x in CATALOG}) == len(CATALOG)
    assert all(x.tier in ("act", "watch", "none") and x.meaning and x.resolution and x.source for x in CATALOG)
    assert set(XID_ACT) | set(XID_WATCH) == {x.code for x in CATALOG if x.tier != "none"}
    assert not set(XID_ACT) & set(XID_WATCH)
    w = GpuWear("GPU-x", name="card")
    w.first_seen = w.last_seen = T0
    w.xids = {"13": 1, "43": 1, "79": 2, "999": 1}
    w.last_event = {"xid 79": T0}
    codes = {r["code"]: r["severity"] for r in verdict(w, WearConfig(), None)["reasons"]}
    assert codes.get("xid_13") == "watch" and codes.get("xid_79") == "act"
    assert "xid_43" not in codes and "xid_999" not in codes
