"""The health rules as a table (gpuwear.health): each rule's row against what its judge gives, the runbook's table
(docs/alerts.md) made from it, each rule's alert and hold against deploy/prometheus/gpuwear-rules.yml, and NVIDIA's
Xid catalog as data."""

from __future__ import annotations

import functools
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from gpuwear.config import WearConfig
from gpuwear.health import RULES, TABLE, XID_ACT, XID_WATCH, rule, verdict
from gpuwear.health.rules import Facts
from gpuwear.health.runbook import markdown, replaced, xid_markdown
from gpuwear.health.xid_catalog import ROWS
from gpuwear.health.xids import BUCKET_TIERS, BY_CODE, CATALOG, LINE_JUDGED, OVERRIDES, XID_NONE, alert_tier, lookup
from gpuwear.wear.accumulate import GpuWear, utc_day
from gpuwear.wear.models import resistance_trend
from helpers import card_by_day

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
              "memory_temperature_reported", "reset_required"):
        if r.random() < 0.2:
            h[k] = r.choice([True, False])
    for k in ("recovery_action", "ecc_uncorrected_volatile", "retired_pages_single_bit", "retired_pages_double_bit",
              "pcie_aer_fatal", "pcie_aer_nonfatal", "remapped_rows_uncorrected", "remapped_rows_corrected",
              "ecc_uncorrected_aggregate", "nvlink_recovery_errors", "remap_banks_low", "remap_banks_none"):
        if r.random() < 0.15:
            h[k] = r.choice([0, 1, 3, 40, 61])
    if r.random() < 0.2:
        h.update(nvlink_links_active=r.randint(0, 18), nvlink_links_most=18,
                 nvlink_links_most_at=int(w.last_seen - r.choice([0, 100, 400, 90000])))
    if r.random() < 0.2:
        h.update(fabric_state=r.choice([1, 2, 3]), fabric_status=r.choice([0, 10]),
                 fabric_health_mask=r.choice([0, 0x1AA, 0x2A9, 0x5AA, 0x2A6, 0x29A]),
                 fabric_health_summary=r.choice([1, 2, 3]),
                 fabric_pending_since=int(w.last_seen - r.choice([0, 700])))
    if r.random() < 0.2:
        h.update(pcie_downgraded_since=int(w.last_seen - r.choice([0, 100, 700])), pcie_link_width=8,
                 pcie_link_width_max=16)
    for _ in range(r.randint(0, 3)):
        x = r.choice([*sorted(BY_CODE), 999])
        w.xids[str(x)] = r.randint(1, 5)
        w.last_event[f"xid {x}"] = w.last_seen - r.uniform(0, 20 * DAY)
    if r.random() < 0.15:  # firmware: a change (firmware_changed), an InfoROM failing its validation
        w.firmware = {"now": {"inforom_valid": r.choice([True, False])},
                      "changed": {"vbios": ["96.00.30.00.01", "96.00.30.00.02", w.last_seen - r.uniform(0, 10 * DAY)]}}
    if r.random() < 0.15:  # a lifetime count read lower than before (counts_went_down)
        w.health["went down ecc_corrected_aggregate"] = 5
        w.last_event["went down ecc_corrected_aggregate"] = w.last_seen - r.uniform(0, 10 * DAY)
    if r.random() < 0.2:  # an application's XID under one to three applications (xid_card)
        w.xids["31"] = w.xids.get("31", 0) + 1
        for app in r.sample(["train", "eval", "infer"], r.randint(1, 3)):
            w.last_event[f"xid 31 app {app}"] = w.last_seen - r.uniform(0, 20 * DAY)
    if r.random() < 0.2:
        w.lost_events, w.last_event["gpu lost"] = 2, w.last_seen - r.uniform(0, 20 * DAY)
    for _ in range(r.choice([0, 2, 8])):
        w.add_incident(w.last_seen - r.uniform(0, 30 * DAY), r.choice(["xid 79", "gpu lost", "xid 48"]))
    if r.random() < 0.5:
        w.error_counts = {"ecc_corrected": [r.choice([100.0, 7200.0]), r.choice([0.0, 5000.0, 1e6]), 100.0, 3.0]}
        w.error_days = {utc_day(int(w.last_seen // 86400)): {"ecc_corrected": [7200.0, r.choice([0.0, 5000.0, 1e6])]}}
    if r.random() < 0.6:
        w.thresholds["slowdown"] = 87.0
        w.health_days[utc_day(int(w.last_seen // 86400) - r.randint(0, 9))] = {
            "busy": r.uniform(0, 5000), "throttled": r.uniform(0, 500), "stalls": [r.randint(0, 3), r.randint(0, 1)],
            "hot": {str(r.randint(67, 95)): r.uniform(0, 5000)}}
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
        assert w.last_seen is not None
        host = (None, w.last_seen, w.last_seen + 1000.0)[seed % 3]
        facts = Facts(w, WearConfig(), resistance_trend(w), peers, host)
        given = []
        for r in TABLE:
            for severity, code, _ in r.judge(facts):
                if r.code == "xid_N":
                    xid = lookup(int(code.removeprefix("xid_")))
                    assert xid.tier in ("act", "watch", "app") and severity in ("watch", xid.tier), code
                else:
                    assert code == r.code, (r.code, code)
                assert severity in severities[r.severity], (r.code, severity)
                fired.add(r.code)
                given.append(code)
        v = verdict(w, WearConfig(), resistance_trend(w), peers=peers, host_last_seen=host)
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
    assert xid_markdown() in text, "docs/alerts.md's XID table differs from gpuwear.health.xids.CATALOG: pytest " \
        "tests/test_health.py --update-golden"
    assert all(f"\n| {code} | " in text for code in range(1, 173))
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
    assert all(x.tier in ("act", "watch", "app", "none") and x.meaning and x.resolution and x.source and x.why
               for x in CATALOG)
    assert set(XID_ACT) | set(XID_WATCH) == {x.code for x in CATALOG if x.tier != "none"}
    assert not set(XID_ACT) & set(XID_WATCH)
    w = GpuWear("GPU-x", name="card")
    w.first_seen = w.last_seen = T0
    w.xids = {"13": 1, "43": 1, "79": 2, "999": 1}
    w.last_event = {"xid 79": T0, "xid 999": T0 - 8 * DAY}
    codes = {r["code"]: r["severity"] for r in verdict(w, WearConfig(), None)["reasons"]}
    assert codes.get("xid_13") == "watch" and codes.get("xid_79") == "act"
    assert "xid_43" not in codes and "xid_999" not in codes  # 43: the catalog says ignore; 999: 8 days ago, ended
    w.last_event["xid 999"] = T0 - 6 * DAY
    reasons = {r["code"]: r for r in verdict(w, WearConfig(), None)["reasons"]}
    assert reasons["xid_999"]["severity"] == "watch" and "not in NVIDIA's catalog" in reasons["xid_999"]["text"]


def test_every_code_of_nvidias_catalog_is_mapped_by_its_resolution() -> None:
    """Issue 51: "NVIDIA's Xid catalog kept as data (code, bucket, source, date), every code mapped". Every code the
    catalog lists (1-172 as of its 2025-10-29 sheet) has a tier, and the tier is the one its immediate resolution
    bucket gives (a reset, a reboot or hands on the card: act; restarting the application: app; contact support:
    watch; ignore: none), but for the overrides, each with why; a code newer than the catalog is watched."""
    assert [row[0] for row in ROWS] == list(range(1, 173))
    assert {x.code for x in CATALOG} == set(range(1, 173))
    for code, _, _, immediate, _ in ROWS:
        xid = BY_CODE[code]
        if code in OVERRIDES:
            assert xid.tier == OVERRIDES[code][0] and xid.why == OVERRIDES[code][2]
        else:
            assert xid.tier == BUCKET_TIERS[immediate], code
            assert immediate in xid.resolution and immediate in xid.why
    assert all(code in OVERRIDES for code, _, _, immediate, _ in ROWS if not immediate)  # no bucket: judged by us
    # what the catalog says of codes a reader would look up first
    assert (BY_CODE[79].tier, BY_CODE[48].tier, BY_CODE[13].tier, BY_CODE[43].tier, BY_CODE[8].tier) == \
        ("act", "act", "app", "none", "app")
    assert BY_CODE[158].tier == "act" and "RESET_GPU" in BY_CODE[158].resolution  # GPU fatal timeout
    assert lookup(173).tier == "watch" and lookup(173).code == 173 and 173 not in BY_CODE


# -- bleeding_errors: one recent window for every GPU ---------------------------------------------------------------

def _bleeding(w: GpuWear, peers: list[GpuWear] = (), p: WearConfig | None = None) -> str | None:  # type: ignore[assignment]
    """The bleeding_errors reason's text for ``w`` among ``peers`` (the host's GPUs), None without one."""
    from gpuwear.health import peer_rates

    p = p or WearConfig()
    rates = peer_rates({x.uuid: x for x in (w, *peers)}, p)
    found = [r["text"] for r in verdict(w, p, None, peers=rates[w.uuid])["reasons"] if r["code"] == "bleeding_errors"]
    return found[0] if found else None


def test_bleeding_against_peers_both_sides_of_the_ratio_and_the_floor() -> None:
    """10 x the peers' median over the same two days: 11 x is watched, 9 x is not (nothing held the ratio: 1 x
    passed every test); under the floor of 1,000 an hour, not even at 100 x its peers."""
    peers = [card_by_day([100.0] * 3, f"GPU-p{i}") for i in range(3)]
    assert _bleeding(card_by_day([1_100.0] * 3, "GPU-x"), peers) is not None
    assert _bleeding(card_by_day([900.0] * 3, "GPU-x"), peers) is None
    assert _bleeding(card_by_day([1_100.0] * 3, "GPU-x"), [card_by_day([0.0] * 3, "GPU-p")]) is not None
    assert _bleeding(card_by_day([950.0] * 3, "GPU-x"), [card_by_day([9.0] * 3, "GPU-p")]) is None  # floor


def test_a_card_clean_for_months_that_starts_bleeding_beside_a_clean_peer_is_named_within_two_days() -> None:
    """Issue 51: with peers it was judged on its lifetime rate, so a card clean for 60 days that starts bleeding
    20,000 corrected errors per loaded hour beside one clean peer was named only after weeks; now on its last two
    days against its peer's, on the second day. And the watch ends two days after the bleed stops."""
    peer = card_by_day([0.0] * 62, "GPU-peer")
    text = _bleeding(card_by_day([0.0] * 60 + [20_000.0] * 2, "GPU-x"), [peer])
    assert text is not None and "k corrected ECC errors per loaded hour over its last two days; its 1 peer(s) of " \
        "the same product over theirs: 0 (median)" in text, text
    stopped = card_by_day([0.0] * 58 + [20_000.0] * 2 + [0.0] * 2, "GPU-x")
    assert _bleeding(stopped, [peer]) is None


def test_a_rate_every_card_shares_names_none_of_them_not_even_the_one_just_swapped_in() -> None:
    """Issue 51: a new workload raises every card's corrected errors alike; judged on lifetime rates, only the card
    just swapped into a slot (its young record all new workload) stood out. On the same two days, none does."""
    old = [card_by_day([20.0] * 30 + [5_000.0] * 2, f"GPU-o{i}") for i in range(3)]
    young = card_by_day([5_000.0] * 2, "GPU-new")
    for w in (*old, young):
        assert _bleeding(w, [x for x in (*old, young) if x is not w]) is None, w.uuid


def test_a_lone_card_is_judged_from_its_first_day_and_however_long_it_bleeds() -> None:
    """Issue 51: a lone GPU bleeding ~17,000 per loaded hour from its first day stayed ok (no past to compare with),
    and a lone GPU's bleed became its own baseline after ~10 days. An absolute floor for a card without peers
    (wear.health.bleeding_alone_per_loaded_hour, 10,000): 11,000 is watched from its first day and after 40 days,
    9,000 is not; 10 x its own past is still watched beneath it."""
    assert _bleeding(card_by_day([17_000.0] * 2)) is not None
    long = _bleeding(card_by_day([17_000.0] * 40))
    assert long is not None and re.search(r"no peer of the same product; its own over the 30 days before: 1[67]\.\d k",
                                          long), long
    assert _bleeding(card_by_day([11_000.0])) is not None
    young = _bleeding(card_by_day([11_000.0] * 2))
    assert young is not None and "no past of its own to compare with" in young, young
    assert _bleeding(card_by_day([9_000.0] * 2)) is None and _bleeding(card_by_day([9_000.0] * 40)) is None
    assert _bleeding(card_by_day([100.0] * 30 + [1_100.0] * 2)) is not None  # 11 x its past
    assert _bleeding(card_by_day([100.0] * 30 + [900.0] * 2)) is None  # 9 x, and under the floor
    assert _bleeding(card_by_day([200.0] * 30 + [1_800.0] * 2)) is None  # 9 x its past
    assert _bleeding(card_by_day([17_000.0] * 2), p=_config(bleeding_alone_per_loaded_hour=20_000.0)) is None


def _config(**health: float) -> WearConfig:
    from dataclasses import replace

    p = WearConfig()
    return replace(p, health=replace(p.health, **health))


# -- ends: every incident and count is judged from its last occurrence ----------------------------------------------

def _xid_after(code: int, days: float) -> dict[str, str]:
    """The verdict's reasons (code -> severity) of a GPU whose record ends ``days`` after XID ``code``."""
    w = GpuWear("GPU-x", name="card")
    w.first_seen = T0
    w.add_xids({code: 1}, T0)
    w.last_seen = T0 + days * DAY
    return {r["code"]: r["severity"] for r in verdict(w, WearConfig(), None)["reasons"] if r["code"] != "memory_" +
            "health_unknown"}


def test_an_xid_ends_by_its_tier_after_its_last_occurrence() -> None:
    """Issue 51: XID 13/31/94 (resolved by restarting the application) put a GPU at watch for life, and act XIDs
    decayed to watch after 7 days and stayed, so GpuwearHealthWatch never cleared on a busy box. Now an act XID is
    act for 7 days, watch until 30, then ended; a watch XID is watched for 7 days; an application's for a day."""
    assert _xid_after(79, 6.9) == {"xid_79": "act"} and _xid_after(79, 7.1) == {"xid_79": "watch"}
    assert _xid_after(79, 29.9) == {"xid_79": "watch"} and _xid_after(79, 30.1) == {}
    assert _xid_after(63, 6.9) == {"xid_63": "watch"} and _xid_after(63, 7.1) == {}
    for code in (13, 31, 94):
        assert _xid_after(code, 0.9) == {f"xid_{code}": "watch"} and _xid_after(code, 1.1) == {}, code
    w = GpuWear("GPU-x", name="card")
    w.first_seen = T0
    w.add_lost(T0)
    for days, severity in ((6.9, "act"), (7.1, "watch"), (29.9, "watch"), (30.1, None)):
        w.last_seen = T0 + days * DAY
        found = [r["severity"] for r in verdict(w, WearConfig(), None)["reasons"] if r["code"] == "gpu_lost"]
        assert found == ([severity] if severity else []), days
    w.last_seen = T0 + 9 * DAY
    longer = _config(incident_act_days=10.0)
    assert [r["severity"] for r in verdict(w, longer, None)["reasons"] if r["code"] == "gpu_lost"] == ["act"]


def _sampled(counts: list[tuple[float, int]]) -> GpuWear:
    """A GPU read at each (day, retired single-bit pages, remapped rows, uncorrectable aggregate = count) through
    GpuWear.add, through the ledger's JSON."""
    import json

    from gpuwear.sample import GpuSample

    w = GpuWear("GPU-x", name="card")
    for i, (day, n) in enumerate(counts):
        w.add(GpuSample(timestamp=T0 + day * DAY, monotonic=day * DAY, temperature_gpu_celsius=50.0,
                        retired_pages_single_bit=n, retired_pages_double_bit=0, remapped_rows_corrected=n,
                        remapped_rows_uncorrected=0, ecc_uncorrected_aggregate=n, ecc_enabled=True),
              0.0 if i == 0 else 60.0)
    return GpuWear.from_json(json.loads(json.dumps(w.to_json())), 2.0)


def test_lifetime_counts_are_watched_while_they_grow() -> None:
    """Issue 51: retired pages, remapped rows and the device's aggregate of uncorrectable errors (from before
    gpuwear too) were watched for life once above 0. Now each is watched for wear.health.growth_watch_days (7)
    after it last grew, or after gpuwear first read the GPU; the day of the last new one is said."""
    codes = ("retired_pages", "remapped_rows", "uncorrectable_ecc_history")

    def said(w: GpuWear) -> dict[str, str]:
        return {r["code"]: r["text"] for r in verdict(w, WearConfig(), None)["reasons"] if r["code"] in codes}

    found_at_first_sight = _sampled([(0, 3), (6.9, 3)])
    assert set(said(found_at_first_sight)) == set(codes)
    assert "3 retired memory page(s) (all carried when gpuwear first read the card on 2026-09-21: from before " \
        "gpuwear" in said(found_at_first_sight)["retired_pages"]  # issue 55: said as inherited
    assert said(_sampled([(0, 3), (7.1, 3)])) == {}
    grew = _sampled([(0, 3), (20, 4), (26.9, 4)])
    assert grew.last_event["grew retired_pages_single_bit"] == T0 + 20 * DAY
    texts = said(grew)
    assert set(texts) == set(codes) and "4 retired memory page(s) (3 carried when gpuwear first read the card on " \
        "2026-09-21, 1 retired since), the last new one on 2026-10-11" in texts["retired_pages"], texts  # T0 + 20 days
    assert said(_sampled([(0, 3), (20, 4), (27.1, 4)])) == {}
    assert said(_sampled([(0, 0), (27.1, 0)])) == {}


# -- windows: time and counts judged over the last wear.health.window_days UTC days --------------------------------
# (whole UTC days: T0 is 14:13 UTC, so 6.3 days on is the 7th day of the window and 7.1 days on the 8th)

def _reading(w: GpuWear, day: float, seconds: float, celsius: float, busy: bool = True, throttled: bool = False,
             step: float = 10.0) -> None:
    """``seconds`` of readings every ``step`` s from ``day`` (days after T0) of a card whose slowdown is 87 °C,
    through GpuWear.add (the first a baseline when the record is new)."""
    from gpuwear.sample import GpuSample

    start = T0 + day * DAY
    for k in range(int(seconds / step) + 1):
        t = start + k * step
        w.add(GpuSample(timestamp=t, monotonic=t - T0, temperature_gpu_celsius=celsius, threshold_slowdown_celsius=87.0,
                        utilization_gpu_ratio=1.0 if busy else 0.0, clock_event_reasons=0x20 if throttled else 0),
              0.0 if w.last_seen is None or k == 0 else step)


def _codes_on(w: GpuWear, day: float) -> set[str]:
    """The reasons of ``w``'s record (through the ledger's JSON) seen last on ``day``."""
    import json

    back = GpuWear.from_json(json.loads(json.dumps(w.to_json())), 2.0)
    back.last_seen = T0 + day * DAY
    return {r["code"] for r in verdict(back, WearConfig(), None)["reasons"]} - {"memory_health_unknown"}


def test_time_above_slowdown_is_judged_over_the_window_and_ends_when_it_leaves() -> None:
    """Issue 51: time at or above the slowdown temperature was a lifetime total (600 s once, watched for life). Now
    600 s within the last 7 UTC days: 700 s is watched, 500 s is not, and 700 s ends when its day leaves."""
    hot = GpuWear("GPU-x", name="card")
    _reading(hot, 0, 700, 90.0)
    assert "time_above_slowdown" in _codes_on(hot, 0) and "time_above_slowdown" in _codes_on(hot, 6.3)
    assert "time_above_slowdown" not in _codes_on(hot, 7.1)
    warm = GpuWear("GPU-x", name="card")
    _reading(warm, 0, 500, 90.0)
    assert "time_above_slowdown" not in _codes_on(warm, 0)


def test_thermal_throttling_and_headroom_are_shares_of_the_windows_busy_time() -> None:
    """Issue 51: thermal throttling and the time close to slowdown were shares of lifetime busy time, which a year
    of cool running hid and a hot week at the start never left. Now shares of the window's busy time: 6 % throttled
    is watched, 4 % is not; 30 % of busy time within 5 °C under the slowdown is watched, 20 % is not; each ends
    when its days leave the window, and a later cool busy week outweighs nothing before it."""
    for share, watched in ((0.06, True), (0.04, False)):
        w = GpuWear("GPU-x", name="card")
        _reading(w, 0, 1000 * share, 60.0, throttled=True)
        _reading(w, 0.5, 1000 * (1 - share), 60.0)
        assert ("thermal_throttling" in _codes_on(w, 0.6)) is watched, share
        assert "thermal_throttling" not in _codes_on(w, 7.1)
    for share, watched in ((0.3, True), (0.2, False)):
        w = GpuWear("GPU-x", name="card")
        _reading(w, 0, 1000 * share, 84.0)
        _reading(w, 0.5, 1000 * (1 - share), 60.0)
        assert ("close_to_slowdown" in _codes_on(w, 0.6)) is watched, share
        assert "close_to_slowdown" not in _codes_on(w, 7.1)
    # a year-old record's cool lifetime does not hide this week's throttling
    w = GpuWear("GPU-x", name="card")
    _reading(w, 0, 30 * 86400 / 100, 50.0, step=100.0)
    _reading(w, 60, 100, 60.0, throttled=True)
    _reading(w, 60.5, 900, 60.0)
    assert "thermal_throttling" in _codes_on(w, 60.6)


def test_stalled_calls_are_counted_over_the_window() -> None:
    """Issue 51: stalled NVML reads were a lifetime count: three stalls once, watched for life. Now three within
    the last 7 UTC days; two are not; three end when their day leaves the window."""
    w = GpuWear("GPU-x", name="card")
    w.last_seen = T0
    w.add_stalls(3, True, T0)
    assert "stalled_calls" in _codes_on(w, 0) and "stalled_calls" in _codes_on(w, 6.3)
    assert "stalled_calls" not in _codes_on(w, 7.1)
    w2 = GpuWear("GPU-x", name="card")
    w2.add_stalls(2, True, T0)
    assert "stalled_calls" not in _codes_on(w2, 0)


def test_health_days_are_kept_checked_and_merged() -> None:
    """The record's health_days: through the ledger's JSON and its validator (a bad value refused at its own
    path), merged day by day, the newest 62 days kept."""
    import json

    from gpuwear.wear.accumulate import SCHEMA
    from gpuwear.wear.schema import SchemaError, check_wear

    w = GpuWear("GPU-x", name="card")
    _reading(w, 0, 100, 90.0, throttled=True)
    w.add_stalls(1, False, T0 + 50)
    doc = json.loads(json.dumps(w.to_json()))
    check_wear(doc, schema=SCHEMA)
    (day,) = doc["health_days"].values()
    assert day["busy"] == day["throttled"] == 100.0 and day["stalls"] == [0, 1] and day["hot"] == {"90": 100.0}
    twice = GpuWear.from_json(doc, 2.0).merged(w)
    (merged,) = twice.health_days.values()
    assert merged["busy"] == 200.0 and merged["stalls"] == [0, 2] and merged["hot"] == {"90": 200.0}
    bad = json.loads(json.dumps(doc))
    next(iter(bad["health_days"].values()))["stalls"] = [1]
    with pytest.raises(SchemaError, match="health_days"):
        check_wear(bad, schema=SCHEMA)
    for d in range(70):
        w.add_stalls(1, True, T0 + d * DAY)
    assert len(w.health_days) == 62


# -- a rule on trial, a rule off ------------------------------------------------------------------------------------

def test_a_rule_on_trial_would_have_said_without_changing_the_verdict() -> None:
    """Issue 51, slice 5 (NVSentinel's store-only practice): a rule set to log in wear.health.rules is judged and
    shown as "would have said" (report, its JSON, the page), never in the reasons, the status or the metric; a rule
    set to off is not judged; the other rules go on."""
    from gpuwear import page
    from gpuwear.report import document, text_report

    w = GpuWear("GPU-x", name="card")
    w.first_seen = T0
    w.add_xids({79: 1}, T0)
    w.add_lost(T0)
    w.last_seen = T0 + 3600
    trial = _modes(xid_N="log", gpu_lost="off")
    v = verdict(w, trial, None)
    assert {r["code"] for r in v["reasons"]} == {"memory_health_unknown"} and v["status"] == "ok", v
    assert [(r["code"], r["severity"]) for r in v["would_have_said"]] == [("xid_79", "act")]
    assert verdict(w, WearConfig(), None)["status"] == "act"
    doc = document([w], trial, {}, "test", False)
    text = text_report(doc)
    assert ("Would have said (rule xid_79 on trial, wear.health.rules): [act] XID 79 (GPU has fallen off the bus)"
            in text)
    assert "fell off the bus 1 time" not in text  # gpu_lost: off
    assert "Would have said (rule xid_79 on trial): [act] XID 79" in page.render(doc)
    assert doc["gpus"][0]["health"]["would_have_said"][0]["code"] == "xid_79"


def test_wear_health_rules_refuses_what_is_not_a_rule_or_a_mode(tmp_path: Path) -> None:
    """A typo in a rule's code must not leave the operator believing it off: refused in one line naming it, as a
    mode other than on, log or off, and an unquoted off (YAML's false)."""
    import subprocess
    import sys

    for body, words in (("{stalld_calls: log}", "wear.health.rules.stalld_calls: no rule has this code"),
                        ("{stalled_calls: never}", "stalled_calls: expected on, log or off, got 'never'"),
                        ("{stalled_calls: off}", 'got false (write "on" or "off" in quotes)')):
        path = tmp_path / "config.yaml"
        path.write_text(f"wear:\n  health:\n    rules: {body}\n")
        result = subprocess.run([sys.executable, "-m", "gpuwear", "check-config", str(path)], capture_output=True,
                                text=True, timeout=60, check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and words in lines[0], (body, result.stderr)
    path.write_text('wear:\n  health:\n    rules: {stalled_calls: log, xid_N: "off"}\n')
    ok = subprocess.run([sys.executable, "-m", "gpuwear", "check-config", str(path)], capture_output=True, text=True,
                        timeout=60, check=False)
    assert ok.returncode == 0, ok.stderr


def _modes(**modes: str) -> WearConfig:
    from dataclasses import replace

    p = WearConfig()
    return replace(p, health=replace(p.health, rules=tuple(sorted(modes.items()))))


# -- nvlink_down: against what the card has had and what its peers have, held until back ---------------------------

def _links(active_by_hour: list[int], uuid: str = "GPU-x") -> GpuWear:
    """An H100 read every 10 minutes for an hour per entry, with ``active_by_hour[h]`` NVLink links active."""
    from gpuwear.sample import GpuSample

    w = GpuWear(uuid, name="NVIDIA H100 80GB HBM3")
    for h, active in enumerate(active_by_hour):
        for k in range(6):
            t = T0 + h * 3600 + k * 600
            w.add(GpuSample(timestamp=t, monotonic=t - T0, temperature_gpu_celsius=50.0, nvlink_links_active=active),
                  0.0 if w.last_seen is None else 600.0)
    return w


def _link_reasons(w: GpuWear, *peers: GpuWear) -> list[str]:
    from gpuwear.health import peer_rates

    rates = peer_rates({x.uuid: x for x in (w, *peers)}, WearConfig())
    return [r["text"] for r in verdict(w, WearConfig(), None, peers=rates[w.uuid])["reasons"] if r["code"] ==
            "nvlink_down"]


def test_a_link_down_is_held_until_it_is_back_and_judged_against_peers_from_the_start() -> None:
    """Issue 51: nvlink_down compared with the most links active within the last day, so a link that stayed down
    was forgotten after 24 h, and a GPU that started with a link down was never named. Now the most it has had,
    held until the links are back, and the most its peers of the same product have; a card whose links no peer
    has (a PCIe card without its bridge) is not named."""
    down = _links([18, 18] + [17] * 30)  # a day and more after the link went down
    (text,) = _link_reasons(down)
    assert "1 of the 18 NVLink links it has had active are down (17 active)" in text, text
    assert _link_reasons(_links([18, 18] + [17] * 30 + [18])) == []  # back: ended
    peers = [_links([18] * 3, f"GPU-p{i}") for i in range(7)]
    (text,) = _link_reasons(_links([17] * 3), *peers)
    assert "17 NVLink links active where the host's other GPUs of its product have 18" in text, text
    assert _link_reasons(_links([18] * 3), *peers) == []
    assert _link_reasons(_links([0] * 3)) == []  # no bridge, no peer with more
    assert _link_reasons(_links([0] * 3), _links([0] * 3, "GPU-p")) == []


def test_the_xid_alerts_name_the_catalogs_tiers() -> None:
    """Issue 51: XIDs the catalog resolves by a reset (109, 136, 143, 155, 156, the NVLink5 family 144-150) gave no
    reason and no alert. GpuwearXidCritical reads the tier act (the catalog's act tier, but the codes judged by their
    line, which GpuwearHealthAct names) and GpuwearXidWatch the tier watch (its watch and application tiers, and codes
    newer than it), code for code; the codes it says to ignore raise neither. The alerts read the daemon's tier, not
    code lists of their own: per code is detail (the series budget)."""
    rules = {rule["alert"]: rule for group in yaml.safe_load(ALERT_RULES.read_text())["groups"]
             for rule in group["rules"] if "alert" in rule}
    for alert, tier in (("GpuwearXidCritical", "act"), ("GpuwearXidWatch", "watch")):
        assert set(re.findall(r'gpuwear_xid_\w+\{([^}]*)\}', rules[alert]["expr"])) == {f'tier="{tier}"'}
    tiers = {code: alert_tier(code) for code in range(1, 400)}
    assert {c for c, t in tiers.items() if t == "act"} == set(XID_ACT) - LINE_JUDGED  # 74: by its line
    assert {c for c, t in tiers.items() if t is None} == XID_NONE | LINE_JUDGED
    assert {c for c, t in tiers.items() if t == "watch"} == set(XID_WATCH) | (set(range(1, 400)) - set(BY_CODE))
    assert {109, 136, 143, 155, 156, *range(144, 151)} <= set(XID_ACT)


@pytest.mark.slow
def test_a_week_on_an_eight_gpu_box_names_each_fault_on_its_gpu_alone_until_its_rule_ends_it() -> None:
    """Issue 51's done-when: eight H100s train for a simulated week through the fake NVML and the tracker (a tick
    every 20 minutes); the three healthy ones are never named, and each scripted fault is named on its own GPU alone
    and ends as its rule says: a bleed two days after it stops, an uncorrectable error at the driver reload (its
    lifetime count then watched while it grows), a downgraded PCIe link when it is back; a link down, held."""
    from dataclasses import replace

    from conftest import make_rig
    from gpuwear.tracker import WearTracker

    train = [{"kind": "train", "seconds": 7 * DAY, "utilization": 0.9}]
    rig = make_rig({"gpus": [{"product": "h100-sxm", "schedule": train}] * 8, "faults": [
        {"at": 1 * DAY, "gpu": 3, "kind": "ecc_bleed", "corrected_per_second": 20},
        {"at": 2 * DAY, "gpu": 3, "kind": "ecc_bleed", "corrected_per_second": 0},
        {"at": 2 * DAY, "gpu": 2, "kind": "ecc", "uncorrected": 1},
        {"at": 3 * DAY, "gpu": 2, "kind": "driver_reload"},
        {"at": 2 * DAY, "gpu": 5, "kind": "remap_rows", "corrected": 2},
        {"at": 3 * DAY, "gpu": 6, "kind": "pcie_downgrade", "width": 8},
        {"at": 5 * DAY, "gpu": 6, "kind": "pcie_downgrade", "width": 16},
        {"at": 4 * DAY, "gpu": 1, "kind": "nvlink_errors", "link": 3, "down": True}]}, slow_interval=1200)
    tracker = WearTracker({}, replace(WearConfig(), max_gap_seconds=1800.0))
    expected = {
        0.5: {},
        1.5: {3: ["bleeding_errors"]},
        2.5: {2: ["uncorrectable_ecc"], 3: ["bleeding_errors"], 5: ["remapped_rows"]},
        4.5: {1: ["nvlink_down"], 2: ["uncorrectable_ecc_history"], 5: ["remapped_rows"], 6: ["pcie_link_downgraded"]},
        5.5: {1: ["nvlink_down"], 2: ["uncorrectable_ecc_history"], 5: ["remapped_rows"]},
        6.5: {1: ["nvlink_down"], 2: ["uncorrectable_ecc_history"], 5: ["remapped_rows"]},
    }
    seen: dict[float, dict[int, list[str]]] = {}
    for step in range(1, int(6.5 * DAY) // 1200 + 1):
        rig.run(1200, interval=1200)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        day = round(step * 1200 / DAY, 2)
        if day in expected:
            views = tracker.views
            named = {i: sorted(r["code"] for r in views[g.identity.uuid].verdict["reasons"])
                     for i, g in enumerate(rig.sampler.snapshot.gpus)}
            seen[day] = {i: codes for i, codes in named.items() if codes}
    assert seen == expected


def test_a_gpu_the_host_no_longer_sees_is_missing_in_the_ledgers_readers_within_minutes() -> None:
    """Issue 51: a missing GPU made /healthz answer 503 at once while `report --json` marked it not seen only an
    hour behind its peers, its health "ok". Now the rule gpu_missing (act) names it once it is three saves and a
    minute (240 s by default) behind the host's others; 200 s is not; an imported history is never missing."""
    from gpuwear.report import document
    from gpuwear.sample import GpuSample

    def cards(behind: float) -> list[GpuWear]:
        out = []
        for uuid, end in (("GPU-here", T0 + 600), ("GPU-gone", T0 + 600 - behind)):
            w = GpuWear(uuid, name="card")
            for i in range(60):
                w.add(GpuSample(timestamp=end - 60 + i, monotonic=float(i), temperature_gpu_celsius=50.0),
                      0.0 if i == 0 else 1.0)
            out.append(w)
        return out

    doc = document(cards(250), WearConfig(), {}, "ledger", False)
    gone = doc["gpus"][1]
    assert gone["health"]["status"] == "act" and gone["not_seen"]["host_last_seen"] == T0 + 599
    (reason,) = [r for r in gone["health"]["reasons"] if r["code"] == "gpu_missing"]
    assert "gpuwear forget GPU-gone" in reason["text"] and reason["rule"] == RULES["gpu_missing"]
    assert doc["gpus"][0]["health"]["status"] == "ok" and "not_seen" not in doc["gpus"][0]
    near = document(cards(200), WearConfig(), {}, "ledger", False)["gpus"][1]
    assert near["health"]["status"] == "ok" and "not_seen" not in near
    imported = document(cards(250), WearConfig(), {}, "ledger", False, live={"GPU-here"})["gpus"][1]
    assert "not_seen" not in imported and "gpu_missing" not in {r["code"] for r in imported["health"]["reasons"]}


def test_a_gpu_nvml_says_needs_a_reset_is_act_until_it_answers_again() -> None:
    """Issue 51: an NVML answer that the GPU needs a reset (NVML_ERROR_RESET_REQUIRED, which the fake now gives for
    every read of a GPU after the fault reset_required, as nvml.h describes it) gave no reason. Now reset_required
    (act) from the first such answer, an incident, until a read answers without it (the GPU reset: "recover")."""
    from conftest import make_rig
    from gpuwear.tracker import WearTracker

    faults = [{"at": 20, "gpu": 1, "kind": "reset_required"}, {"at": 200, "gpu": 1, "kind": "recover"}]
    rig = make_rig({"gpus": [{"product": "h100-sxm", "schedule": [{"kind": "train", "seconds": 3600}]}] * 2,
                    "faults": faults}, slow_interval=5)
    tracker = WearTracker({}, WearConfig())

    def codes_after(seconds: int) -> list[dict[str, str]]:
        for _ in range(seconds // 5):
            rig.run(5, interval=5)
            tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        views = tracker.views
        return [{r["code"]: r["severity"] for r in views[g.identity.uuid].verdict["reasons"]}
                for g in rig.sampler.snapshot.gpus]

    assert codes_after(15) == [{}, {}]
    healthy, failing = codes_after(60)
    assert healthy == {} and failing == {"reset_required": "act"}, (healthy, failing)
    assert codes_after(180) == [{}, {}]
    w = tracker.wear(rig.sampler.snapshot.gpus[1].identity.uuid)
    assert w is not None and list(w.incidents.values()) == ["reset required"]


def test_a_rule_on_trial_is_recorded_in_the_daemons_log_when_it_begins_to_say_something(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 51, slice 5: a rule set to log is recorded: the daemon's log says once what it would have said, when it
    begins to say it, while the verdict (and so the metric and the alerts) stays as without it."""
    import logging

    from conftest import make_rig
    from gpuwear.tracker import WearTracker

    faults = [{"at": 20, "gpu": 1, "kind": "reset_required"}]
    rig = make_rig({"gpus": [{"product": "h100-sxm", "schedule": [{"kind": "train", "seconds": 3600}]}] * 2,
                    "faults": faults}, slow_interval=5)
    tracker = WearTracker({}, _modes(reset_required="log"))
    with caplog.at_level(logging.INFO, logger="gpuwear.tracker"):
        for _ in range(20):
            rig.run(5, interval=5)
            tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
            views = tracker.views
    said = [r.getMessage() for r in caplog.records if "on trial" in r.getMessage()]
    uuid = rig.sampler.snapshot.gpus[1].identity.uuid
    assert said == [f"GPU {uuid}: the rule reset_required, on trial (wear.health.rules), would have said: [act] NVML "
                    "answers that the GPU requires a reset before it can be used again: reset it (nvidia-smi -r, or a "
                    "reboot); one that needs it again needs service"], said
    assert views[uuid].verdict["status"] == "ok" and [r["code"] for r in views[uuid].verdict["would_have_said"]] == [
        "reset_required"]


NVLINK_LINE = "NVLink: fatal error detected on link {}({})"


def test_xid_74_is_judged_by_its_lines_registers_as_nvidias_nvlink_workflow_says() -> None:
    """Issue 51: XID 74 was act whatever its line said, where NVIDIA's workflow for Hopper reads its registers: some
    bits can be ignored, some call for service at once, some only when they repeat on the same link. Through the
    fake's NVML events and its driver's kernel log (NVML tells of each XID 74 too, before or after its line): bits to
    ignore give nothing; a bit that calls for service, act; a repeat bit once, watch; twice on its link, act; the
    same ignorable bits on an Ampere GPU, and a line without registers, act as the code's tier."""
    def regs(*r: int) -> str:
        return ", ".join(hex(v) for v in r)

    lines = {0: [NVLINK_LINE.format(3, regs(0x1, 0, 0, 0, 0x100000, 0, 0))],  # bits the workflow ignores
             1: [NVLINK_LINE.format(14, regs(0x10000, 0, 0, 0, 0, 0, 0))],  # re-seat, diagnostics: service
             2: [NVLINK_LINE.format(14, regs(0, 0, 0x10000, 0, 0, 0, 0))],  # "if seen repeatedly": once
             3: [NVLINK_LINE.format(14, regs(0, 0, 0x10000, 0, 0, 0, 0))] * 2,  # twice on its link
             4: [NVLINK_LINE.format(3, regs(0x1, 0, 0, 0, 0, 0, 0))],  # on Ampere: the workflow is Hopper's
             5: ["NVLink: fatal error detected on link 2"]}  # no registers
    faults = [{"at": 2 + k, "gpu": gpu, "kind": "xid", "xid": 74, "text": text}
              for gpu, texts in lines.items() for k, text in enumerate(texts)]
    tracker, snapshot = _judged_with_lines(["h100-sxm"] * 4 + ["a100-sxm", "h100-sxm"], faults, [1, 1, 1, 2, 1, 0])
    found = [{r["code"]: r["severity"] for r in tracker.views[g.identity.uuid].verdict["reasons"]}
             for g in snapshot.gpus]
    assert [g.xids for g in snapshot.gpus] == [{74: len(t)} for t in lines.values()]
    assert found == [{}, {"xid_74": "act"}, {"xid_74": "watch"}, {"xid_74": "act"}, {"xid_74": "act"},
                     {"xid_74": "act"}], found
    watched = next(r for r in tracker.views[snapshot.gpus[2].identity.uuid].verdict["reasons"])
    assert "repeat on the same link" in watched["text"], watched


def test_an_xid_74_with_only_secondary_bits_follows_the_xids_beside_it() -> None:
    """Issue 51: NVIDIA's XID 74 workflow says of the secondary bits (the first register's 1 and 20, the marginal
    channel's 21 and 22) "if seen with other bits set or other Xid/SXid, please follow the resolution for those; if
    seen solo, please report a bug"; gpuwear judged them within their own line only, so a line beside another XID
    was act on its own. Through the fake's NVML events and kernel log: solo, act ("reported to NVIDIA"); beside an
    XID 48 two seconds later, watched (XID 48 acts on its own); beside an XID 45 (no reason of its own: "preemptive
    cleanup, due to previous errors"), still solo; secondary bits beside a bit that calls for service, act."""
    def line(r0: int) -> str:
        return NVLINK_LINE.format(5, ", ".join(hex(v) for v in (r0, 0, 0, 0, 0, 0, 0)))

    faults = [{"at": 2, "gpu": gpu, "kind": "xid", "xid": 74, "text": line(r0)}
              for gpu, r0 in enumerate([1 << 21, 1 << 21 | 1 << 1, 1 << 20, 1 << 21 | 1 << 8])]
    faults += [{"at": 4, "gpu": 1, "kind": "xid", "xid": 48}, {"at": 3, "gpu": 2, "kind": "xid", "xid": 45}]
    tracker, snapshot = _judged_with_lines(["h100-sxm"] * 4, faults, [1, 1, 1, 1])
    reasons = [{r["code"]: r for r in tracker.views[g.identity.uuid].verdict["reasons"]} for g in snapshot.gpus]
    found = [{code: r["severity"] for code, r in by_code.items()} for by_code in reasons]
    assert found == [{"xid_74": "act"}, {"xid_74": "watch", "xid_48": "act"}, {"xid_74": "act"}, {"xid_74": "act"}], \
        found
    assert "seen solo: the workflow asks that it be reported to NVIDIA" in reasons[0]["xid_74"]["text"]
    assert "with XID 48: the workflow follows the resolution of XID 48" in reasons[1]["xid_74"]["text"]
    assert "secondary" not in reasons[3]["xid_74"]["text"]


def test_an_xid_74_with_only_secondary_bits_beside_the_hosts_nvswitch_sxids_follows_them() -> None:
    """Issue 51: the same workflow's "or other Xid/SXid": the host's NVSwitch SXids (counted for the host, naming no
    GPU) were not taken as beside an XID 74, so a line of secondary bits on an NVSwitch box with SXids around it
    acted as if solo. Now each GPU's record keeps when the host's SXids last grew, and the line is watched beside
    them, what to do being GpuwearNvswitchFatalSxid's (a fatal one) or the SXid's own."""
    def line(r0: int) -> str:
        return NVLINK_LINE.format(5, ", ".join(hex(v) for v in (r0, 0, 0, 0, 0, 0, 0)))

    faults: list[dict[str, object]] = [{"at": 2, "gpu": 0, "kind": "xid", "xid": 74, "text": line(1 << 21)}]
    tracker, snapshot = _judged_with_lines(["h100-sxm"], faults, [1], before=lambda rig: rig.sampler.record_sxid(
        "00000000:05:00.0", 12028, False))  # as the kernel-log reader tells a non-fatal SXid line
    (reason,) = [r for r in tracker.views[snapshot.gpus[0].identity.uuid].verdict["reasons"] if r["code"] == "xid_74"]
    assert reason["severity"] == "watch", reason
    assert "with the host's non-fatal NVSwitch SXids: the workflow follows the resolution of" in reason["text"]


def _judged_with_lines(products: list[str], faults: list[dict[str, object]], lines: list[int],
                       before: Callable[[Any], None] | None = None) -> tuple[Any, Any]:
    """The tracker and the last snapshot after the fake's GPUs of ``products`` trained through ``faults`` (XIDs with
    their kernel-log lines, each told by NVML's events and the fake driver's kernel log, read by the reader as the
    daemon runs it), once each GPU's kept lines number ``lines``; ``before``: done to the rig first."""
    from conftest import follow_kernel_log, make_rig
    from gpuwear.tracker import WearTracker

    schedule = [{"kind": "train", "seconds": 3600}]
    rig = make_rig({"gpus": [{"product": p, "schedule": schedule} for p in products], "faults": faults})
    if before is not None:
        before(rig)
    tracker = WearTracker({}, WearConfig())
    follow_kernel_log(rig, tracker, lambda snap: [sum(g.xid_lines.values()) for g in snap.gpus] == lines, first=8,
                      after=30, held=True, events=True)  # the event and kernel-log threads, with the clock held
    return tracker, rig.sampler.snapshot


def test_the_nvlink5_xids_are_judged_by_nvidias_decode_of_their_line() -> None:
    """Issue 51: the NVLink5 XIDs 144-150 were act whatever their line said, where NVIDIA's catalog decodes each by
    its unit (the line's first value) and error status (its second): some call for a GPU reset, some can be
    ignored, some defer to the Xid 154 that follows (judged as the recovery action). Through the fake's NVML events
    and kernel log (the fake has no Blackwell product: its H100s carry the lines; the judgement reads the line, not
    the architecture): a link down for a peer device, act; one NVIDIA says to ignore, nothing; a non-fatal SAW
    error in the older form, nothing; a remap error that defers to Xid 154, nothing; a line without values, act."""
    line = "{} Link {:02d} ({})"
    lines = {0: (149, line.format("NETIR_LINK_EVT  Fatal   XC0 i0", 9, "0x025525c6 0x00000000 0x00000000 0x00000000")),
             1: (149, line.format("NETIR_LINK_EVT  Fatal   XC0 i0", 1, "0x026615c6 0x00000000 0x00000000 0x00000000")),
             2: (144, line.format("SAW_MVB Nonfatal XC0 i0", 0, "0x00000001 0x00000001 0x00000000 0x00000000")),
             3: (145, line.format("RLW_REMAP Nonfatal XC0 i0", 0, "0x00000004 0x00000001 0x00000000 0x00000000")),
             4: (149, "NETIR_LINK_EVT Fatal")}
    faults = [{"at": 2, "gpu": gpu, "kind": "xid", "xid": code, "text": text} for gpu, (code, text) in lines.items()]
    tracker, snapshot = _judged_with_lines(["h100-sxm"] * 5, faults, [1, 1, 1, 1, 0])
    found = [{r["code"]: r["severity"] for r in tracker.views[g.identity.uuid].verdict["reasons"]}
             for g in snapshot.gpus]
    assert [g.xids for g in snapshot.gpus] == [{code: 1} for code, _ in lines.values()]
    assert found == [{"xid_149": "act"}, {}, {}, {}, {"xid_149": "act"}], found
    assert [code for code, _, _ in snapshot.gpus[0].xid_lines] == [149]


def test_the_nvlink5_decode_by_unit_and_error_status() -> None:
    """NVIDIA's NVLink5 decode (health.xids.nvlink5_step): the unit by the newer pattern or else the older, the
    status by its row or else its bits; a reset anywhere is SERVICE, ignore or Xid 154's evaluation alone IGNORE,
    no unit or no row SERVICE."""
    from gpuwear.health.xids import IGNORE, SERVICE, nvlink5_step

    assert nvlink5_step(149, (0x021425C6, 0)) == SERVICE  # NETIR_LINK_DOWN, peer device (0x21)
    assert nvlink5_step(149, (0x026615C6, 0)) == IGNORE  # NETIR_LINK_DOWN 0x26: the catalog says ignore
    assert nvlink5_step(149, (0x00000013, 1)) == IGNORE  # NETIR_BER_EVENT in the older form
    assert nvlink5_step(149, (0x00000014, 3)) == IGNORE and nvlink5_step(149, (0x00000014, 1)) == SERVICE  # MFDE
    assert nvlink5_step(144, (1, 1)) == IGNORE and nvlink5_step(144, (1, 2)) == SERVICE
    assert nvlink5_step(144, (1, 1 | 4)) == IGNORE and nvlink5_step(144, (1, 1 | 2)) == SERVICE  # by its bits
    assert nvlink5_step(144, (1, 0x40)) == SERVICE  # a bit with no row
    assert nvlink5_step(145, (4, 1)) == IGNORE  # RLW_REMAP: Xid 154's evaluation
    assert nvlink5_step(144, (0x999, 1)) == SERVICE and nvlink5_step(149, (0x025525C6,)) == SERVICE
    assert nvlink5_step(150, (0, 0)) == SERVICE  # MSE watchdog


def test_an_xid_74_repeat_is_counted_across_a_restart() -> None:
    """Issue 51: the XID 74 lines whose bits call for service only on a repeat were counted in the daemon's memory,
    so a restart between the first and the second on a link started the count again and the second was watched
    too. The repeats are kept in the GPU's record (last_event, "xid 74 link N #i"): the record goes through the
    ledger's JSON and a new tracker, and the second line on that link within 24 h calls for service; one on another
    link, or after 24 h, is watched."""
    from gpuwear.health.xids import NVLINK_STEPS
    from gpuwear.tracker import REPEATS_KEPT, WearTracker

    assert max(s for bits in NVLINK_STEPS.values() for s in bits.values() if isinstance(s, int)) <= REPEATS_KEPT

    def restarted(w: GpuWear) -> GpuWear:
        return GpuWear.from_json(json.loads(json.dumps(w.to_json())), w.gate_celsius)

    w = GpuWear("GPU-x", name="card")
    w.first_seen = w.last_seen = T0
    WearTracker._xid_step(w, 74, 14, 2, 1, T0)
    assert "xid 74 watch" in w.last_event and "xid 74" not in w.last_event
    again = restarted(w)
    WearTracker._xid_step(again, 74, 3, 2, 1, T0 + 600)  # another link: its first
    assert "xid 74" not in again.last_event
    WearTracker._xid_step(again, 74, 14, 2, 1, T0 + 3600)  # the same link, an hour on, after a restart
    assert again.last_event["xid 74"] == T0 + 3600 and len(again.incidents) == 1
    late = restarted(w)
    WearTracker._xid_step(late, 74, 14, 2, 1, T0 + DAY + 1)  # the same link, past 24 h
    assert "xid 74" not in late.last_event
    assert sum(k.startswith("xid 74 link 14 #") for k in late.last_event) == 1  # the old one dropped


def test_the_nvlink_workflow_step_of_each_register_bit() -> None:
    """NVIDIA's XID 74 workflow, bit by bit (health.xids.NVLINK_STEPS): the ignorable bits alone give IGNORE; a bit
    it does not list, SERVICE; secondary bits alone SECONDARY (judged beside the GPU's other XIDs); with a repeat
    bit, the smallest repeat count."""
    from gpuwear.health.xids import IGNORE, SECONDARY, SERVICE, nvlink_step

    def step(**bits: int) -> str | int:
        r = [0] * 7
        for name, value in bits.items():
            r[int(name[1:])] = value
        return nvlink_step(tuple(r))

    assert step(r0=1 | 1 << 23 | 1 << 30, r4=1 << 20 | 1 << 29) == IGNORE
    assert step(r1=0xFFFF, r5=1, r6=1) == SERVICE  # registers the workflow does not read: nothing to go on
    assert step(r0=1 << 8) == SERVICE and step(r2=1 << 13) == SERVICE and step(r0=1 << 3) == SERVICE  # unlisted
    assert step(r0=1 << 1) == SECONDARY and step(r3=1 << 18) == SECONDARY  # secondary only: the rule's to judge
    assert step(r0=1 << 21 | 1 << 22 | 1 << 0) == SECONDARY and step(r0=1 << 21 | 1 << 8) == SERVICE
    assert step(r0=1 << 1 | 1 << 4) == 3 and step(r3=1 << 16, r2=1 << 17) == 2  # secondary beside a repeat
    assert step(r0=1 << 4, r2=1 << 16) == 2 and step(r4=1 << 28) == 3
    assert step(r0=1 << 4, r4=1 << 23) == 3  # beside bits to ignore


def _reasons_until(rig: Any, tracker: Any, until: float, what: str) -> list[dict[str, str]]:
    """Run the rig in 10 s ticks, the tracker observing each, until its clock reads ``until``; then each GPU's
    reasons, code -> its ``what`` (severity or text)."""
    while rig.clock.monotonic() < until:
        rig.run(10, interval=10)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    return [{r["code"]: r[what] for r in tracker.views[g.identity.uuid].verdict["reasons"]}
            for g in rig.sampler.snapshot.gpus]


@pytest.mark.parametrize("driver", ["r525", "r570"])
def test_the_nvswitch_fabric_registration_as_nvml_reports_it(driver: str) -> None:
    """Issue 51: the fabric state of NVSwitch systems (nvmlDeviceGetGpuFabricInfo, GPUd and DCGM check it) gave no
    reason. Through the fake on a branch with only the R525 call and one with the R550 V call (its health mask):
    a registration completed in error is act; one not completed after 10 minutes, or (V call) degraded bandwidth,
    watch; each on its GPU alone, ending once NVML reports it completed and well; an A100 reads none."""
    from conftest import make_rig
    from gpuwear.tracker import WearTracker

    faults = [{"at": 20, "gpu": 1, "kind": "fabric", "state": 3, "status": 10},
              {"at": 20, "gpu": 2, "kind": "fabric", "state": 2},
              {"at": 20, "gpu": 3, "kind": "fabric", "degraded": True},
              *({"at": 1000, "gpu": g, "kind": "fabric"} for g in (1, 2, 3))]
    train = [{"kind": "train", "seconds": 7200}]
    rig = make_rig({"driver": driver, "faults": faults,
                    "gpus": [{"product": p, "schedule": train} for p in ["h100-sxm"] * 4 + ["a100-sxm"]]},
                   slow_interval=10)
    tracker = WearTracker({}, WearConfig())
    start = rig.clock.monotonic()

    def codes_at(until: int) -> list[dict[str, str]]:
        return _reasons_until(rig, tracker, start + until, "severity")

    assert codes_at(300) == [{}, {"fabric_failed": "act"}, {}, {"fabric_degraded": "watch"} if driver == "r570"
                             else {}, {}]
    assert codes_at(700)[2] == {"fabric_degraded": "watch"}
    assert codes_at(1100) == [{}] * 5
    states = [g.sample.fabric_state if g.sample else None for g in rig.sampler.snapshot.gpus]
    assert states == [3, 3, 3, 3, None], states
    rig.backend.close()


@pytest.mark.parametrize("driver", ["r550", "r570", "r580"])
def test_the_fabric_health_mask_and_summary_as_each_branch_gives_them(driver: str) -> None:
    """Issue 51: NVML's fabric health said only degraded bandwidth to gpuwear; R570's mask adds route recovery,
    route unhealthy and access-timeout recovery, R580's its configuration and the v3 struct's health summary (the
    Blackwell NVL systems' fabric). Through the fake on each branch: what the branch gives is judged on its GPU alone
    (route unhealthy, an incorrect configuration, an unhealthy summary act; a recovery or limited capacity watch), what
    it does not give is not invented, and each ends once NVML reports the fabric well; R580 reads the v3 struct (no
    summary on an H100, as a real one), the branches before it the v2 one, refusing v3 once."""
    from conftest import make_rig
    from gpuwear.tracker import WearTracker

    faults = [{"at": 20, "gpu": 1, "kind": "fabric", "route_unhealthy": True},
              {"at": 20, "gpu": 2, "kind": "fabric", "route_recovery": True, "access_timeout_recovery": True},
              {"at": 20, "gpu": 3, "kind": "fabric", "incorrect_configuration": 5},
              {"at": 20, "gpu": 4, "kind": "fabric", "summary": 2},
              {"at": 20, "gpu": 5, "kind": "fabric", "summary": 3},
              *({"at": 600, "gpu": g, "kind": "fabric"} for g in range(1, 6))]
    rig = make_rig({"driver": driver, "faults": faults,
                    "gpus": [{"product": "h100-sxm", "schedule": [{"kind": "train", "seconds": 7200}]}] * 6},
                   slow_interval=10)
    tracker = WearTracker({}, WearConfig())
    start = rig.clock.monotonic()

    def reasons_at(until: int) -> list[dict[str, str]]:
        return _reasons_until(rig, tracker, start + until, "text")

    said = reasons_at(300)
    r570, r580 = driver != "r550", driver == "r580"
    expected: list[dict[str, str]] = [{}, {"fabric_failed": "route through the fabric is unhealthy"} if r570 else {},
                                      {"fabric_degraded": "recovering a route"} if r570 else {},
                                      {"fabric_failed": "configuration is incorrect: too few NVLinks"} if r580 else {},
                                      {"fabric_failed": "summary says unhealthy"} if r580 else {},
                                      {"fabric_degraded": "summary says limited capacity"} if r580 else {}]
    assert [set(s) for s in said] == [set(e) for e in expected], said
    for got, want in zip(said, expected, strict=True):
        assert all(words in got[code] for code, words in want.items()), (got, want)
    assert not r570 or "access timeout" in said[2]["fabric_degraded"]
    summaries = [g.sample.fabric_health_summary for g in rig.sampler.snapshot.gpus if g.sample]
    # an H100 answers no summary unless a fault scripts one (a real H100 on R590: "N/A", tests/fixtures/captures)
    assert summaries == ([None] * 4 + [2, 3] if r580 else [None] * 6), summaries
    assert rig.backend.api is not None and ("fabric_v3" in rig.backend.api.refused) == (not r580)
    if hasattr(pynvml, "c_nvmlGpuFabricInfo_v3_t"):  # the binding's own struct and call (nvidia-ml-py 13.580+)
        info = pynvml.c_nvmlGpuFabricInfo_v3_t()
        call = functools.partial(pynvml.nvmlDeviceGetGpuFabricInfoV, pynvml.nvmlDeviceGetHandleByIndex(4), info)
        if r580:
            call()
            assert (info.state, info.healthMask >> 4 & 3, info.healthSummary) == (3, 2, 2)
        else:
            with pytest.raises(pynvml.NVMLError) as refused:
                call()
            assert refused.value.value == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert reasons_at(700) == [{}] * 6
    rig.backend.close()


def test_an_applications_xid_under_two_applications_on_one_gpu_is_the_card() -> None:
    """Issue 54, item 2: NVIDIA's Xid 13 and 31 workflows say the same XID repeating on one GPU points to hardware;
    nothing judged it. The tracker keeps, per XID of the catalog's app tier, the applications (job names) running
    when it came (newest 8), and the rule xid_card watches a GPU where one came under wear.health.xid_card_applications
    (2) different applications within xid_card_days (14): both sides of the count and of the window, a job without a
    name not counted, and through the tracker's own keeping."""
    from dataclasses import replace

    from gpuwear.tracker import APPLICATIONS_KEPT, note_xid_applications

    def reasons(w: GpuWear) -> dict[str, str]:
        return {r["code"]: r["text"] for r in verdict(w, WearConfig(), None)["reasons"]}

    w = GpuWear("GPU-x", name="card")
    w.first_seen, w.last_seen = T0 - 30 * DAY, T0
    w.xids = {"31": 2}
    note_xid_applications(w, 31, ["train-llama"], T0 - 3 * DAY)
    note_xid_applications(w, 31, ["train-llama"], T0 - 2 * DAY)  # the same application again: the code, maybe
    assert "xid_card" not in reasons(w)
    note_xid_applications(w, 31, ["eval-bert"], T0 - DAY)
    text = reasons(w)["xid_card"]
    assert "XID 31" in text and "2 different applications within 14 days (eval-bert, train-llama)" in text, text
    assert rule("xid_card").startswith("NVIDIA's Xid catalog, WORKFLOW_XID_13 and WORKFLOW_XID_31")
    w.last_seen = T0 + 12.5 * DAY  # train-llama's last (T0 - 2 days) leaves the 14 days: one application left
    assert "xid_card" not in reasons(w)
    w.last_seen = T0
    three = WearConfig(health=replace(WearConfig().health, xid_card_applications=3))
    assert "xid_card" not in {r["code"] for r in verdict(w, three, None)["reasons"]}
    w.xids = {"79": 1}  # an act XID's applications are not this rule's (it has its own reason)
    note_xid_applications(w, 79, ["a", "b"], T0)
    assert "xid_card" not in reasons(w)
    for i in range(APPLICATIONS_KEPT + 4):  # hostile names: bounded
        note_xid_applications(w, 13, [f"app-{i}" + "x" * 100], T0 + i)
    kept = [k for k in w.last_event if k.startswith("xid 13 app ")]
    assert len(kept) == APPLICATIONS_KEPT and all(len(k) <= 64 for k in kept)


def test_card_or_code_across_the_hosts_gpus() -> None:
    """Issue 54, item 2: one application's XID 31 on three GPUs is likely the code (each GPU names the others, and
    none is marked); XID 13 under three applications on one GPU is likely the card (and its reason xid_card); a
    lone XID under one application on one GPU: check the application first; an XID older than xid_card_days, or
    of another tier, is not judged. In report --json (card_or_code), the words and the page."""
    from gpuwear import page
    from gpuwear.health.judgements import CARD, CODE, SOLO, card_or_code
    from gpuwear.report import document, text_report
    from gpuwear.tracker import note_xid_applications

    def gpu(i: int) -> GpuWear:
        w = GpuWear(f"GPU-{i}", name="NVIDIA H100 80GB HBM3", index=i)
        w.first_seen, w.last_seen = T0 - 20 * DAY, T0
        return w

    wears = [gpu(i) for i in range(6)]
    for w in wears[:3]:
        w.xids["31"] = 1
        note_xid_applications(w, 31, ["train-llama"], T0 - DAY)
    wears[3].xids["13"] = 3
    for k, app in enumerate(["a", "b", "c"]):
        note_xid_applications(wears[3], 13, [app], T0 - k * DAY)
    wears[4].xids["31"] = 1
    note_xid_applications(wears[4], 31, ["solo-app"], T0 - DAY)
    wears[5].xids.update({"31": 1, "79": 1})
    note_xid_applications(wears[5], 31, ["train-llama"], T0 - 15 * DAY)  # past the 14 days
    note_xid_applications(wears[5], 79, ["train-llama"], T0)  # not the application tier
    judged = card_or_code({w.uuid: w for w in wears}, WearConfig())
    assert [[j["judgement"] for j in judged.get(w.uuid, [])] for w in wears] == [
        [CODE], [CODE], [CODE], [CARD], [SOLO], []]
    code = judged["GPU-0"][0]
    assert code["other_gpus"] == ["GPU 1", "GPU 2"] and code["text"] == (
        "likely the code: train-llama raised XID 31 (GPU memory page fault) on this GPU and on GPU 1, GPU 2 within "
        "14 days; no other application did on this GPU"), code
    assert judged["GPU-3"][0]["applications"] == ["a", "b", "c"]
    doc = document(wears, WearConfig(), {}, "test", False)
    statuses = {g["uuid"]: {r["code"] for r in g["health"]["reasons"]} for g in doc["gpus"]}
    assert "xid_card" in statuses["GPU-3"] and not any("xid_card" in statuses[f"GPU-{i}"] for i in (0, 1, 2, 4))
    assert [j["judgement"] for j in doc["gpus"][0]["card_or_code"]] == [CODE]
    text = text_report(doc)
    assert "Card or code? likely the code: train-llama raised XID 31" in text
    assert "Card or code? check the application first: XID 31 (GPU memory page fault) under solo-app" in text
    html = page.render(doc)
    assert "Card or code? likely the card: XID 13" in html and "WORKFLOW_XID_13" in html


def test_a_known_good_applications_fault_on_one_gpu_is_reported_to_nvidia(tmp_path: Path,
                                                                          capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 54, item 2: NVIDIA's Xid workflows say a fault of a known-good application is reported to NVIDIA (the
    driver or the card); nothing judged it, the judgement knowing no job history. From a real ledger's job records
    and events: an application that ran wear.health.xid_known_good_runs (3) times on the host's other GPUs without
    an XID there, and raised XID 31 on one GPU alone, is "report to NVIDIA", naming its clean runs; one whose third
    run elsewhere raised an XID stays "check the application first", as does the first with the count set to 5; the
    card is not marked. In report --json, the words and `jobs --json`."""
    from dataclasses import replace

    from gpuwear.cli import main
    from gpuwear.health.judgements import REPORT, SOLO
    from gpuwear.jobs.lines import Summariser
    from gpuwear.ledger import Ledger
    from gpuwear.report import documents, text_report
    from gpuwear.tracker import note_xid_applications
    from gpuwear.wear.events import Event

    def gpu(i: int) -> GpuWear:
        w = GpuWear(f"GPU-{i}", name="NVIDIA H100 80GB HBM3", index=i)
        w.first_seen, w.last_seen, w.observed_seconds = T0 - 20 * DAY, T0, 20 * DAY
        return w

    def run(k: int, name: str, uuid: str) -> dict[str, Any]:
        start = T0 - 10 * DAY + k * 3600
        return {"record": f"slurm:{k}@{start}", "kind": "slurm", "id": str(k), "user": None, "name": name,
                "start": start, "end": start + 3000, "last_seen": start + 3000,
                "gpus": [{"uuid": uuid, "start": start, "end": start + 3000, "wear": GpuWear(uuid).to_json(),
                          "max_celsius": {}, "events": {}}]}

    wears = [gpu(i) for i in range(4)]
    jobs = [run(0, "train-resnet", "GPU-0"), run(1, "train-resnet", "GPU-0"), run(2, "train-resnet", "GPU-1"),
            run(3, "train-flaky", "GPU-0"), run(4, "train-flaky", "GPU-1"), run(5, "train-flaky", "GPU-2"),
            run(6, "train-resnet", "GPU-3"), run(7, "train-flaky", "GPU-2")]
    events = [Event("GPU-2", jobs[5]["start"] + 60, "xid", {"xid": 43, "count": 1}),  # flaky's run on GPU 2
              Event("GPU-1", jobs[2]["start"] + 60, "gap", {"seconds": 30.0})]  # not an XID: the run stays clean
    for k, uuid in ((6, "GPU-3"), (7, "GPU-2")):
        wall = jobs[k]["start"] + 600
        wears[int(uuid[-1])].xids["31"] = 1
        note_xid_applications(wears[int(uuid[-1])], 31, [jobs[k]["name"]], wall)
        events.append(Event(uuid, wall, "xid", {"xid": 31, "count": 1}))
    p = WearConfig()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    ledger = Ledger.open(state / "ledger.sqlite")
    ledger.save([w.to_json() for w in wears], events, jobs=jobs, lines=Summariser(p))
    try:
        doc, _ = documents(ledger, p, "test", False, with_jobs=False)
        five, _ = documents(ledger, replace(p, health=replace(p.health, xid_known_good_runs=5)), "test", False,
                            with_jobs=False)
    finally:
        ledger.close()
    judged = {g["uuid"]: g["card_or_code"] for g in doc["gpus"]}
    assert [j["judgement"] for j in judged["GPU-3"]] == [REPORT], judged
    assert judged["GPU-3"][0]["clean_elsewhere"] == {"runs": 3, "gpus": ["GPU 0", "GPU 1"]}
    assert judged["GPU-3"][0]["text"].startswith(
        "report to NVIDIA: train-resnet ran 3 times without an XID on GPU 0, GPU 1 within 14 days and raised XID 31 "
        "(GPU memory page fault) on this GPU alone"), judged["GPU-3"][0]["text"]
    assert [j["judgement"] for j in judged["GPU-2"]] == [SOLO]  # 2 clean runs elsewhere: its third raised XID 43
    assert [j["judgement"] for g in five["gpus"] for j in g["card_or_code"]] == [SOLO, SOLO]
    assert not any(r["code"] == "xid_card" for g in doc["gpus"] for r in g["health"]["reasons"])
    assert "Card or code? report to NVIDIA: train-resnet ran 3 times" in text_report(doc)
    from gpuwear import page

    assert "Card or code? report to NVIDIA: train-resnet ran 3 times" in page.render(doc)
    assert main(["jobs", "--json", "--state-dir", str(state)]) == 0
    listed = json.loads(capfd.readouterr().out)["card_or_code"]
    assert [j["judgement"] for j in listed["GPU-3"]] == [REPORT], listed


def test_what_a_card_carried_when_first_read_is_said_as_inherited() -> None:
    """Issue 55, items 1-2 (first slice): the verdict judged what a card carried before gpuwear met it as if it had
    happened here, and nothing kept what that was. The first read of each lifetime count (aggregate ECC, retired
    pages, remapped rows) is kept as what the card carried, with its time; the reasons say "all carried ... from
    before gpuwear" while nothing grew, and "N carried ..., M since" once it did; report --json (carried) and the
    words give it. A record read first by an older gpuwear (no carried kept) reads as before."""
    from gpuwear.report import document, text_report
    from gpuwear.sample import GpuSample

    w = GpuWear("GPU-used", name="Tesla V100-PCIE-16GB")
    used = {"retired_pages_single_bit": 2, "retired_pages_double_bit": 1, "ecc_corrected_aggregate": 1_000_000,
            "ecc_uncorrected_aggregate": 1}
    for i in range(3):
        w.add(GpuSample(timestamp=T0 + i, monotonic=float(i), temperature_gpu_celsius=40.0, utilization_gpu_ratio=0.5,
                        **used), 1.0 if i else 0.0)
    texts = {r["code"]: r["text"] for r in verdict(w, WearConfig(), None)["reasons"]}
    assert texts["retired_pages"].startswith("3 retired memory page(s) (all carried when gpuwear first read the card "
                                             "on "), texts
    assert "from before gpuwear" in texts["uncorrectable_ecc_history"]
    assert "bleeding_errors" not in texts  # a million corrected errors carried are no rate
    w.add(GpuSample(timestamp=T0 + 3600, monotonic=3600.0, temperature_gpu_celsius=40.0, utilization_gpu_ratio=0.5,
                    **{**used, "retired_pages_double_bit": 3}), 1.0)
    texts = {r["code"]: r["text"] for r in verdict(w, WearConfig(), None)["reasons"]}
    assert "5 retired memory page(s) (3 carried when gpuwear first read the card on " in texts["retired_pages"]
    assert "2 retired since), the last new one on " in texts["retired_pages"], texts["retired_pages"]
    doc = document([w], WearConfig(), {}, "test", False)
    carried = doc["gpus"][0]["carried"]
    assert {k: c["count"] for k, c in carried.items()} == used and carried["retired_pages_double_bit"]["first_read"] \
        == T0
    day = time.strftime("%Y-%m-%d", time.gmtime(T0))
    assert (f"Carried when gpuwear first read it on {day} (from before gpuwear, its history unknown): 1,000,000 "
            "corrected ECC errors") in text_report(doc), text_report(doc)
    older = GpuWear.from_json(w.to_json(), w.gate_celsius)  # as a gpuwear that kept none of it left the record
    older.health = {k: v for k, v in older.health.items() if not k.startswith("carried ")}
    texts = {r["code"]: r["text"] for r in verdict(older, WearConfig(), None)["reasons"]}
    assert texts["retired_pages"].startswith("5 retired memory page(s), the last new one on ")


def test_a_lifetime_count_that_goes_down_is_said() -> None:
    """Issue 55, item 3: a card's lifetime counts (aggregate ECC, retired pages, remapped rows) never go down; one that
    does means its InfoROM was cleared or reflashed, or it is not the card it was, and nothing said so. The rule
    counts_went_down watches it for wear.health.growth_watch_days (7) with the count's before and after; the tracker's
    health event keeps it in the card's history as before."""
    from gpuwear.sample import GpuSample

    w = GpuWear("GPU-v100", name="Tesla V100-PCIE-16GB")
    for i, corrected in enumerate((1_000_000, 1_000_000, 1_000_002)):
        w.add(GpuSample(timestamp=T0 + i, monotonic=float(i), temperature_gpu_celsius=40.0,
                        ecc_corrected_aggregate=corrected, retired_pages_double_bit=1), 1.0 if i else 0.0)
    assert "counts_went_down" not in {r["code"] for r in verdict(w, WearConfig(), None)["reasons"]}
    w.add(GpuSample(timestamp=T0 + 3600, monotonic=3600.0, temperature_gpu_celsius=40.0, ecc_corrected_aggregate=0,
                    retired_pages_double_bit=1), 1.0)
    reasons = {r["code"]: r for r in verdict(w, WearConfig(), None)["reasons"]}
    text = reasons["counts_went_down"]["text"]
    assert reasons["counts_went_down"]["severity"] == "watch" and "corrected ECC errors from 1,000,002 to 0 on " in text
    assert "InfoROM was cleared or reflashed, or this is not the card it was" in text
    w.last_seen = T0 + 3600 + 7.1 * DAY  # its window past: ended
    assert "counts_went_down" not in {r["code"] for r in verdict(w, WearConfig(), None)["reasons"]}


def test_an_xid_13_line_gives_its_process_instance_and_place_on_the_chip() -> None:
    """Issue 54, items 1 and 5: an XID 13 line names the process, on a MIG GPU the instance, and where on the chip the
    exception came ("(GPC 1, TPC 3, SM 0)": NVIDIA's Xid 13 workflow compares repeats at the same GPC and TPC). Through
    the fake's kernel log and the reader as the daemon runs it, the tracker's "xid process" event keeps all three
    with who ran; `report`'s words say them."""
    from conftest import follow_kernel_log, make_rig
    from gpuwear.report import xid_lines
    from gpuwear.sim.simulated import synthetic_pid
    from gpuwear.tracker import WearTracker

    text = "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"
    rig = make_rig({"gpus": [{"product": "h100-sxm", "schedule": [{"kind": "train", "seconds": 3600,
                                                                     "job": "train-x"}]}],
                    "faults": [{"at": 2, "gpu": 0, "kind": "xid", "xid": 13, "process": True, "text": text}]})
    tracker = WearTracker({}, WearConfig())
    follow_kernel_log(rig, tracker, lambda snap: any(g.xid_processes for g in snap.gpus))
    _, events, _ = tracker.take()
    (process,) = [e.detail for e in events if e.kind == "xid process"]
    # (the rig's tracker is given no jobs: who ran is its idle line, or "not known yet" before its first interval)
    assert {k: v for k, v in process.items() if k != "jobs"} == {
        "xid": 13, "pid": synthetic_pid("train-x"), "process": "train-x", "count": 1, "instance": None,
        "unit": "GPC 1 TPC 3"}, process
    words = xid_lines({"events": [{"wall": e.wall, "kind": e.kind, **e.detail} for e in events]})
    assert any(f"XID 13's line names process train-x (pid {synthetic_pid('train-x')}), at GPC 1 TPC 3 of the chip; "
               "running: " in w for w in words), words


def test_an_a100_whose_failing_bank_runs_out_of_spare_rows_over_months_is_watched_each_time_it_gets_worse() -> None:
    """Issue 55, item 4: the row remapper's bank histogram (nvmlDeviceGetRowRemapperHistogram) was not read. The fake
    now keeps each bank's spare rows (one remap moves a bank of a never-remapped A100 from max to high: 639 and 1, as
    a real A100's nvidia-smi -q shows after its first remap); the rule remap_headroom watches while the banks with few
    (low) or no (none) spare rows left grow, for wear.health.growth_watch_days (7) after each time. Over four months
    a failing bank takes 2 remaps every 30 days: partial (not named), low (named), then none (named, in words), and
    each watch ends 7 days after."""
    from dataclasses import replace

    from conftest import make_rig
    from gpuwear.tracker import WearTracker

    step = 6 * 3600
    remaps = [{"at": d * DAY, "gpu": 0, "kind": "remap_rows", "corrected": 2, "bank": 5} for d in (10, 40, 70, 100)]
    rig = make_rig({"gpus": [{"product": "a100-sxm", "schedule": [{"kind": "train", "seconds": 130 * DAY}]}],
                    "faults": remaps}, slow_interval=step)
    rig.simulation.max_step_seconds = 3600.0  # months of physics in coarse steps: the histogram is what matters
    tracker = WearTracker({}, replace(WearConfig(), max_gap_seconds=2.0 * step))
    seen: dict[int, list[str]] = {}
    histograms: dict[int, tuple[int, int]] = {}
    for k in range(1, int(125 * DAY) // step + 1):
        rig.run(step, interval=step)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        day = int(k * step // DAY)
        if k * step % DAY == 0 and day in (5, 12, 45, 71, 76, 78, 101, 106, 108, 124):
            sample = rig.sampler.snapshot.gpus[0].sample
            assert sample is not None and sample.remap_banks_low is not None and sample.remap_banks_none is not None
            histograms[day] = (sample.remap_banks_low, sample.remap_banks_none)
            reasons = tracker.views[rig.sampler.snapshot.gpus[0].identity.uuid].verdict["reasons"]
            seen[day] = [r["text"] for r in reasons if r["code"] == "remap_headroom"]
    assert rig.simulation.gpus[0].remap_histogram() == (639, 0, 0, 0, 1)
    assert histograms == {5: (0, 0), 12: (0, 0), 45: (0, 0), 71: (1, 0), 76: (1, 0), 78: (1, 0), 101: (0, 1),
                          106: (0, 1), 108: (0, 1), 124: (0, 1)}
    assert [d for d, texts in seen.items() if texts] == [71, 76, 101, 106]
    assert seen[71][0].startswith("1 bank(s) with few left, the last new one on ")
    assert "cannot be remapped" in seen[71][0]
    assert seen[101][0].startswith("1 memory bank(s) have no spare rows left; none carried when gpuwear first read")


def test_an_xid_45_burst_after_another_xid_is_counted_with_its_cause() -> None:
    """Issue 54, item 2: XID 45 (preemptive cleanup, due to previous errors) comes on every GPU of a run when one GPU's
    fault stops it; NVIDIA's catalog (WORKFLOW_XID_45) says to ignore it then and follow the other XID, and to
    restart the fabric manager when it comes alone. Judged so: each GPU's 45s within 300 s after another XID on the
    host are that XID's collateral, named with it; a 45 with none before it is alone; in report's JSON and words."""
    from gpuwear.health.judgements import COLLATERAL, SOLO_45, card_or_code
    from gpuwear.report import document, text_report

    wears = []
    for i in range(5):
        w = GpuWear(f"GPU-{i}", name="NVIDIA H100 80GB HBM3", index=i)
        w.first_seen, w.last_seen = T0 - 2 * DAY, T0
        wears.append(w)
    wears[3].add_xids({79: 1}, T0 - 100)  # GPU 3 fell off the bus; the run's other GPUs clean up after it
    for w in wears[:3]:
        w.add_xids({45: 4}, T0 - 95)
    wears[3].add_xids({45: 1}, T0 - 99)
    wears[4].add_xids({45: 2}, T0 - DAY)  # alone: nothing on the host within 300 s before it
    judged = card_or_code({w.uuid: w for w in wears}, WearConfig())
    kinds = [[(j["xid"], j["judgement"]) for j in judged.get(w.uuid, [])] for w in wears]
    assert kinds == [[(45, COLLATERAL)]] * 4 + [[(45, SOLO_45)]], kinds
    assert judged["GPU-0"][0]["text"].startswith("collateral: XID 45 (Preemptive cleanup, due to previous errors) ×4 "
                                                 "on this GPU, the last 5 s after XID 79 (")
    assert "on GPU 3: the driver cleaning up the work that error stopped" in judged["GPU-0"][0]["text"]
    assert "after XID 79" in judged["GPU-3"][0]["text"] and "on this GPU:" in judged["GPU-3"][0]["text"]
    assert judged["GPU-4"][0]["text"].startswith("restart the fabric manager: XID 45")
    wears[4].add_xids({31: 1}, T0 - DAY - 200)  # now another XID came 200 s before it: not alone
    assert card_or_code({w.uuid: w for w in wears}, WearConfig())["GPU-4"][0]["judgement"] == COLLATERAL
    doc = document(wears, WearConfig(), {}, "test", False)
    assert doc["gpus"][1]["card_or_code"][0]["cause"] == {"xid": 79, "gpu": "GPU 3"}
    assert "Card or code? collateral: XID 45" in text_report(doc)
    assert all("xid_45" not in {r["code"] for r in g["health"]["reasons"]} for g in doc["gpus"])  # no reason of its own


def test_a_used_card_met_with_its_counts_and_met_again_with_them_reset() -> None:
    """Issue 55's done-when, through the fake: a V100 first seen carrying 10^6 aggregate corrected errors and 3
    retired pages (a scenario's used card) has them said as carried in its reasons and in its passport, and no
    error-rate reason fires for them; the same card met at the next start with its counts reset (an InfoROM
    cleared) is said (counts_went_down), the first sight kept."""
    from conftest import make_rig
    from gpuwear import passport
    from gpuwear.tracker import WearTracker
    from gpuwear.wear.schema import check_wear, checksum

    def sight(tracker: WearTracker, **card: Any) -> dict[str, str]:
        rig = make_rig({"gpus": [{"product": "v100", "schedule": [{"kind": "train", "seconds": 7200}], **card}]},
                       slow_interval=10)
        for _ in range(40):
            rig.run(10, interval=10)
            tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        rig.backend.close()
        uuid = rig.sampler.snapshot.gpus[0].identity.uuid
        return {r["code"]: r["text"] for r in tracker.views[uuid].verdict["reasons"]}

    tracker = WearTracker({}, WearConfig())
    said = sight(tracker, carried={"ecc_corrected": 10**6, "retired_single_bit": 2, "retired_double_bit": 1})
    assert "carried" in said.get("retired_pages", ""), said
    assert not {"bleeding_errors", "uncorrectable_ecc_history", "counts_went_down"} & set(said), said
    (w,) = tracker._wears.values()
    assert w.health["carried ecc_corrected_aggregate"] == 10**6, w.health
    record = json.loads(json.dumps(check_wear(w.to_json())))
    export = {"format": "gpuwear-ledger-export", "version": 2, "uuid": w.uuid, "exported_at": T0,
              "parts": [record], "events": []}
    text = passport.text(passport.document({**export, "checksum": checksum(export)}, WearConfig(), "test"))
    assert "Carried when gpuwear first read it on " in text and "1,000,000 corrected ECC errors, 1 pages retired " \
        "for double-bit errors, 2 pages retired for single-bit errors" in text, text
    # item 1, "by location where the card answers": the aggregate counts by where they came (all the fake's in DRAM)
    assert w.health["carried ecc_corrected_aggregate_dram"] == 10**6
    assert w.health["carried ecc_corrected_aggregate_sram"] == 0
    assert "; its ECC errors by where: corrected 1,000,000 in the DRAM and 0 in the on-chip SRAM; its retired" in text
    dated = time.strftime("%Y-%m-%d", time.gmtime((w.first_seen or 0) - 400 * DAY))  # the scenario's default
    assert f"its retired pages dated {dated} to {dated} by the card itself" in text, text
    tracker = WearTracker({w.uuid: GpuWear.from_json(record, 2.0)}, WearConfig())  # the next start
    said = sight(tracker)
    assert "went down" in said.get("counts_went_down", ""), said
    (w,) = tracker._wears.values()
    assert w.health["carried ecc_corrected_aggregate"] == 10**6  # the first sight stays what it was
    from gpuwear.sim.simulated import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.carried\.retired_single_bit: NVIDIA A100.* keeps no such"):
        parse_scenario({"gpus": [{"product": "a100-sxm", "carried": {"retired_single_bit": 1}}]}, "used")

def test_a_card_without_a_serial_is_kept_by_its_uuid_and_its_passport_says_so() -> None:
    """Issue 55 item 1, "the no-serial path tested": a GeForce board gives no serial (nvidia_gpu_exporter's captures:
    "[N/A]"); its first sight is kept by UUID all the same, and its passport says it has none, where a datacenter
    card's gives its serial."""
    from conftest import make_rig
    from gpuwear import passport
    from gpuwear.tracker import WearTracker
    from gpuwear.wear.schema import check_wear, checksum

    rig = make_rig({"gpus": [{"product": "rtx4090"}, {"product": "h100-sxm"}]}, slow_interval=10)
    tracker = WearTracker({}, WearConfig())
    for _ in range(4):
        rig.run(10, interval=10)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    rig.backend.close()
    texts = []
    for g in rig.sampler.snapshot.gpus:
        w = tracker._wears[g.identity.uuid]
        assert w.firmware["first"]["vbios"]  # its first sight, kept by UUID
        record = json.loads(json.dumps(check_wear(w.to_json())))
        export = {"format": "gpuwear-ledger-export", "version": 2, "uuid": w.uuid, "exported_at": T0,
                  "parts": [record], "events": []}
        doc = passport.document({**export, "checksum": checksum(export)}, WearConfig(), "test")
        texts.append(passport.text(doc).splitlines()[0])
    geforce, h100 = rig.sampler.snapshot.gpus
    assert geforce.identity.serial is None and h100.identity.serial
    assert texts == [f"PASSPORT of NVIDIA GeForce RTX 4090 ({geforce.identity.uuid}, no serial number (the card gives "
                     "none))",
                     f"PASSPORT of NVIDIA H100 80GB HBM3 ({h100.identity.uuid}, serial {h100.identity.serial})"]


def test_a_recovery_action_the_card_arrived_with_is_said_as_such() -> None:
    """Issue 55, items 1 and 2: the recovery action (field 230) at gpuwear's first read of the card is kept, and a
    reason on it says the card asked so when first read; one that came later says nothing of the kind."""
    from conftest import make_rig
    from gpuwear.tracker import WearTracker

    rig = make_rig({"gpus": [{"product": "h100-sxm", "carried": {"recovery_action": 1}}, {"product": "h100-sxm"}]},
                   slow_interval=10)
    tracker = WearTracker({}, WearConfig())
    for step in range(12):
        rig.run(10, interval=10)
        if step == 3:
            rig.simulation.gpus[1].state.recovery_action = 2  # asked while gpuwear watched
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    said = [{r["code"]: r["text"] for r in tracker.views[g.identity.uuid].verdict["reasons"]}
            for g in rig.sampler.snapshot.gpus]
    rig.backend.close()
    day = time.strftime("%Y-%m-%d", time.gmtime(tracker._wears[rig.sampler.snapshot.gpus[0].identity.uuid].first_seen
                                                or 0))
    assert said[0]["recovery_action"] == f"the driver asks to reset the GPU (as it did when gpuwear first read the " \
        f"card on {day})", said[0]
    assert said[1]["recovery_action"] == "the driver asks to reboot the node", said[1]


def test_a_blackwell_cards_power_smoothing_life_left_is_read_kept_at_first_sight_and_said() -> None:
    """Issue 55, item 1: field 258 (NVML_FI_PWR_SMOOTHING_HW_CIRCUITRY_PERCENT_LIFETIME_REMAINING, R570+) was not
    read. A B200 that arrives with 83 % of its power-smoothing circuitry's rated life left has it in its sample, its
    record keeps the first read as carried (a later, lower read is ageing, not counts gone down), and the report and
    passport say it as one circuit, not the card; an H100 beside it answers NOT_SUPPORTED and says nothing; a
    used card's percentage is refused on a card without the circuitry."""
    from conftest import make_rig
    from gpuwear import passport
    from gpuwear.report import document, power_smoothing_words
    from gpuwear.sim.simulated import ScenarioError, parse_scenario
    from gpuwear.tracker import WearTracker
    from gpuwear.wear.schema import check_wear, checksum

    rig = make_rig({"driver": "r580", "gpus": [{"product": "b200", "carried": {"power_smoothing_life_percent": 83}},
                                               {"product": "h100-sxm"}]}, slow_interval=10)
    tracker = WearTracker({}, WearConfig())
    for _ in range(20):
        rig.run(10, interval=10)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    b200, h100 = rig.sampler.snapshot.gpus
    assert b200.sample is not None and b200.sample.power_smoothing_life_percent == 83
    assert h100.unavailable["power_smoothing_life_percent"] == "not_supported"
    rig.simulation.gpus[0].state.power_smoothing_life_percent = 82  # the circuit ages
    rig.run(20, interval=10)
    tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    w = tracker._wears[b200.identity.uuid]
    assert w.health["carried power_smoothing_life_percent"] == 83
    assert w.health["power_smoothing_life_percent"] == 82
    assert "counts_went_down" not in {r["code"] for r in tracker.views[b200.identity.uuid].verdict["reasons"]}
    day = time.strftime("%Y-%m-%d", time.gmtime(w.first_seen or 0))
    said = f"Power-smoothing circuitry: 82 % of its rated life left (NVML field 258; one circuit, not the card); " \
        f"83 % when gpuwear first read it on {day}"
    b200_doc, h100_doc = document([w, tracker._wears[h100.identity.uuid]], WearConfig(), {}, "test", False)["gpus"]
    assert power_smoothing_words(b200_doc) == said and b200_doc["power_smoothing"]["first_read"] == 83
    assert power_smoothing_words(h100_doc) is None and h100_doc["power_smoothing"] is None
    record = json.loads(json.dumps(check_wear(w.to_json())))
    export = {"format": "gpuwear-ledger-export", "version": 2, "uuid": w.uuid, "exported_at": T0,
              "parts": [record], "events": []}
    assert said in passport.text(passport.document({**export, "checksum": checksum(export)}, WearConfig(), "test"))
    rig.backend.close()
    with pytest.raises(ScenarioError, match=r"carried\.power_smoothing_life_percent: NVIDIA H100.* keeps no such"):
        parse_scenario({"gpus": [{"product": "h100-sxm", "carried": {"power_smoothing_life_percent": 90}}]}, "used")


def test_a_cards_firmware_at_first_sight_and_a_reflash_later_are_said() -> None:
    """Issue 55, items 1, 3 and 6: nothing read the card's VBIOS or InfoROM. The backend now reads them at each open
    (nvmlDeviceGetVbiosVersion, nvmlDeviceGetInforomImageVersion, ...ConfigurationChecksum, nvmlDeviceValidateInforom)
    and the record keeps what it had at gpuwear's first sight and each change since. The same card (UUID) met again
    with another VBIOS and InfoROM checksum (a scenario's reflashed card) is watched (firmware_changed) with both
    values, for 7 days; a corrupted InfoROM (CORRUPTED_INFOROM) is watched while it stays so; report says the first
    sight; the record goes through the ledger's validator."""
    from conftest import make_rig
    from gpuwear.report import document, firmware_words
    from gpuwear.tracker import WearTracker
    from gpuwear.wear.schema import SchemaError, check_wear

    def sight(driver: str = "r610", **card: Any) -> tuple[WearTracker, dict[str, str]]:
        rig = make_rig({"driver": driver,
                        "gpus": [{"product": "a100-sxm", "schedule": [{"kind": "train", "seconds": 3600}], **card}]})
        for _ in range(3):
            rig.run(1)
            tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        uuid = rig.sampler.snapshot.gpus[0].identity.uuid
        return tracker, {r["code"]: r["text"] for r in tracker.views[uuid].verdict["reasons"]}

    tracker = WearTracker({}, WearConfig())
    _, said = sight()
    (w,) = tracker._wears.values()
    first = dict(w.firmware["first"])
    assert first["vbios"] == "97.00.30.00.01" and first["inforom_image"] == "G500.0200.00.01"
    assert isinstance(first["inforom_checksum"], int) and first["inforom_valid"] is True
    assert first["driver"] == "610.43.02"  # the host's driver at first sight (issue 55 item 1)
    bad = json.loads(json.dumps(w.to_json()))
    bad["firmware"]["first"]["driver"] = 610
    with pytest.raises(SchemaError, match=r"firmware\.first\.driver: expected text"):
        check_wear(bad)
    assert "firmware_changed" not in said and "inforom_invalid" not in said
    tracker = WearTracker({w.uuid: GpuWear.from_json(json.loads(json.dumps(check_wear(w.to_json()))), 2.0)},
                          WearConfig())  # the next start, from the ledger
    _, said = sight("r580", vbios="97.00.30.00.07", inforom_checksum=3,  # another driver too
                    inforom_corrupt=True)
    assert said["firmware_changed"].startswith("its InfoROM configuration checksum changed from 0x")
    assert "to 0x00000003 on " in said["firmware_changed"] and "VBIOS changed from 97.00.30.00.01 to 97.00.30.00.07" \
        in said["firmware_changed"], said
    assert "InfoROM is corrupted" in said["inforom_invalid"]
    (w,) = tracker._wears.values()
    assert w.firmware["first"] == first  # the first sight stays what it was
    check_wear(w.to_json())
    w.last_seen = (w.last_seen or 0) + 7.1 * DAY
    codes = {r["code"] for r in verdict(w, WearConfig(), None)["reasons"]}
    assert "firmware_changed" not in codes and "inforom_invalid" in codes  # the change ages out; corruption stays
    words = firmware_words(document([w], WearConfig(), {}, "test", False)["gpus"][0])
    assert words is not None and words.startswith("Firmware when gpuwear first saw it on ")
    assert "VBIOS 97.00.30.00.01, InfoROM G500.0200.00.01, configuration checksum 0x" in words
    assert ", under driver 610.43.02; changed since" in words  # the driver is no change of the card's
    assert words.endswith("changed since: inforom_checksum, inforom_valid, vbios"), words
