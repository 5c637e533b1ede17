"""Wear accumulators and models, against independent oracles."""

from __future__ import annotations

import bisect
import csv
import itertools
import json
import math
import random
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import rainflow
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, follow_kernel_log, make_rig
from gpuwear.config import WearConfig
from gpuwear.health import verdict
from gpuwear.ledger import Event
from gpuwear.sample import GpuSample
from gpuwear.tracker import WearTracker, WearView
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.models import BOLTZMANN_EV_PER_K, estimates, resistance_trend, thermal_aging_hours
from gpuwear.wear.rainflow import Cycle, RainflowCounter
from helpers import card_by_day, examples

TRACES = REPO / "tests" / "fixtures" / "traces"
RTX4060 = TRACES / "rtx4060laptop_gpuburn-cycles_1s_llm-gpu-stress.csv"


def trace_temperatures(path: Path) -> list[float]:
    """The die temperature column of a logger trace, read with the csv module only."""
    with path.open(newline="", encoding="utf-8") as f:
        return [float(row["temperature_C"]) for row in csv.DictReader(f)]


def streamed(series: list[float], gate: float = 0.0, split: int | None = None) -> Counter[tuple[float, float, float]]:
    """Our counter's cycles (closed + residue), optionally persisted to JSON and restored at ``split``."""
    counter = RainflowCounter(gate)
    out: list[Cycle] = []
    for i, x in enumerate(series):
        if i == split:
            counter = RainflowCounter.from_json(json.loads(json.dumps(counter.to_json())), gate)
        counter.push(x, out.append)
    out += counter.residue()
    return Counter((round(r, 9), round(p, 9), n) for r, p, n in out if r > 0)


def oracle(series: list[float]) -> Counter[tuple[float, float, float]]:
    """The ``rainflow`` package (ASTM E1049) on the same series: (range, peak, count)."""
    return Counter((round(rng, 9), round(max(series[i], series[j]), 9), n)
                   for rng, _mean, n, i, j in rainflow.extract_cycles(series) if rng > 0)


# The rainflow package yields no cycle at all for a two-point series (its reversal
# iterator drops the last point then); from three points on it follows E1049.
series_strategy = st.lists(st.one_of(st.integers(20, 100).map(float), st.floats(20, 100, allow_nan=False)),
                           min_size=3, max_size=300)


@settings(max_examples=examples(300), deadline=None)
@given(series_strategy)
def test_rainflow_equals_the_rainflow_package(series: list[float]) -> None:
    assert streamed(series) == oracle(series)


@settings(max_examples=examples(200), deadline=None)
@given(series_strategy, st.data())
def test_a_cycle_spanning_a_restart_is_counted_once(series: list[float], data: st.DataObject) -> None:
    split = data.draw(st.integers(0, len(series) - 1))
    assert streamed(series, split=split) == oracle(series)


def test_rainflow_on_a_real_trace_equals_the_package() -> None:
    series = trace_temperatures(RTX4060)
    assert len(series) == 22637
    ours, theirs = streamed(series), oracle(series)
    assert ours == theirs
    # SOURCES.md: 22 load episodes, 43-74 °C; the 2 °C gate leaves the large cycles alone
    # and removes most of the 1 °C sensor flicker.
    gated = streamed(series, gate=2)
    assert sum(n * k[2] for k, n in gated.items() if k[0] >= 5) == sum(n * k[2] for k, n in ours.items() if k[0] >= 5)
    assert max(k[0] for k in gated) == 31
    assert sum(n * k[2] for k, n in gated.items()) < 0.3 * sum(n * k[2] for k, n in ours.items())


def test_hysteresis_gate_ignores_sensor_noise() -> None:
    rng = random.Random(7)
    noise = [60 + rng.choice((-1, 0, 1)) for _ in range(5000)]
    assert sum(streamed(noise, gate=0).values()) > 1000
    assert streamed(noise, gate=2) == Counter()
    square = [(80 if (i // 100) % 2 else 40) + rng.choice((-1, 0, 1)) for i in range(2000)]  # 19 swings
    cycles = streamed(square, gate=2)
    assert all(r >= 38 for r, _, _ in cycles)  # only the square wave's own swings are left
    assert sum(n * k for (_, _, k), n in cycles.items()) == 9.5  # constant amplitude: 19 half cycles


def sample(t: float, temp: float | None, **kw: Any) -> GpuSample:
    return GpuSample(timestamp=1.8e9 + t, monotonic=t, temperature_gpu_celsius=temp, **kw)


def feed(w: GpuWear, temps: list[float], dt: float = 1.0, **kw: Any) -> None:
    for i, temp in enumerate(temps):
        w.add(sample(i * dt, temp, **kw), 0.0 if i == 0 else dt)


def test_arrhenius_equals_a_direct_numerical_computation() -> None:
    temps = trace_temperatures(RTX4060)
    w = GpuWear("GPU-x")
    feed(w, temps)
    p = WearConfig()
    for band, ea in p.arrhenius.activation_energy_ev.items():
        direct = sum(math.exp(ea / BOLTZMANN_EV_PER_K * (1 / (60 + 273.15) - 1 / (t + 273.15)))
                     for t in temps[1:]) / 3600  # each 1 s interval ends at a sample, held at its value
        assert estimates(w, p)["thermal_aging_equivalent_hours"][band] == pytest.approx(direct, rel=1e-9)


def test_arrhenius_on_fractional_readings_is_within_half_a_degree() -> None:
    rng = random.Random(3)
    temps = [55 + 20 * math.sin(i / 300) + rng.uniform(-0.5, 0.5) for i in range(20000)]
    w = GpuWear("GPU-x")
    feed(w, temps)
    hist = w.temperature_seconds["gpu"]
    exact = sum(math.exp(0.7 / BOLTZMANN_EV_PER_K * (1 / 333.15 - 1 / (t + 273.15))) for t in temps[1:]) / 3600
    # binning moves a reading by at most 0.5 °C: about 3.5 % of acceleration at 0.7 eV
    assert thermal_aging_hours(hist, 60, 0.7) == pytest.approx(exact, rel=0.01)


def test_histograms_sum_to_observed_time() -> None:
    rig = make_rig("demo")
    tracker = WearTracker({}, WearConfig())
    for _ in range(900):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    for status in rig.sampler.snapshot.gpus:
        w = tracker.wear(status.identity.uuid)
        assert w is not None
        assert w.observed_seconds == pytest.approx(899)
        for sensor, hist in w.temperature_seconds.items():
            assert sum(hist.values()) == pytest.approx(w.observed_seconds), sensor
        assert sum(w.utilization_seconds.values()) == pytest.approx(w.observed_seconds)
        assert w.power_seconds == pytest.approx(w.observed_seconds)


def test_energy_from_counter_deltas_survives_a_counter_reset() -> None:
    w = GpuWear("GPU-x")
    energies = [1000.0, 1300.0, 1600.0, 100.0, 400.0]  # the driver reloaded before the fourth sample
    for i, e in enumerate(energies):
        w.add(sample(i, 50, energy_joules=e, power_watts=300.0), 0.0 if i == 0 else 1.0)
    assert w.energy_joules == 300 + 300 + 100 + 300
    assert w.energy_counter_seconds == 4


def test_energy_integrated_from_power_without_a_counter() -> None:
    w = GpuWear("GPU-x")
    feed(w, [50.0] * 11, power_watts=250.0, power_limit_watts=250.0)
    assert w.energy_joules == 2500 and w.energy_integrated_seconds == 10 and w.power_limit_seconds == 10


def test_gaps_are_recorded_never_integrated() -> None:
    rig = make_rig("demo")
    tracker = WearTracker({}, WearConfig(max_gap_seconds=30))
    for step in (1.0,) * 10 + (120.0,) + (1.0,) * 10:
        rig.run(step, interval=step)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    w = tracker.wear(rig.sampler.snapshot.gpus[0].identity.uuid)
    assert w is not None
    assert w.observed_seconds == pytest.approx(19) and w.gap_seconds == pytest.approx(120) and w.gaps == 1
    assert w.coverage() == pytest.approx(19 / 139)


def test_fan_revolutions_from_rpm_else_from_ratio() -> None:
    w = GpuWear("GPU-x")
    feed(w, [50.0] * 61, fan_speed_rpm=(1200.0,), fan_speed_ratio=(0.4,))
    assert w.fans[0].revolutions == pytest.approx(1200) and w.fans[0].on_seconds == 60
    w2 = GpuWear("GPU-y")
    feed(w2, [50.0] * 61, fan_speed_ratio=(0.5,))
    fan = estimates(w2, WearConfig())["fan_wear"][0]
    assert fan["revolutions"] == pytest.approx(0.5 * 3000) and fan["revolutions_estimated_from_speed_ratio"]


def test_model_parameters_recompute_the_history() -> None:
    w = GpuWear("GPU-x")
    feed(w, [40, 80] * 50 + [40])
    base = estimates(w, WearConfig())["cycle_fatigue_equivalent_cycles"]["central"]
    assert base == pytest.approx(50, rel=0.02)  # 50 cycles of 40 °C peaking at 80 °C: the reference cycle
    steeper = WearConfig(cycles=WearConfig().cycles.__class__(reference_range_celsius=20))
    assert estimates(w, steeper)["cycle_fatigue_equivalent_cycles"]["central"] == pytest.approx(
        50 * 2 ** 2.35, rel=0.02)


def test_thermal_resistance_is_tracked_at_steady_load() -> None:
    w = GpuWear("GPU-x")
    t = 0
    for _ in range(400):  # idle: 35 °C at 30 W
        w.add(sample(t, 35.0, utilization_gpu_ratio=0.0, power_watts=30.0), 1.0 if t else 0.0)
        t += 1
    for _ in range(600):  # steady load: 75 °C at 430 W -> (75-35)/(430-30) = 0.1 °C/W
        w.add(sample(t, 75.0, utilization_gpu_ratio=0.98, power_watts=430.0), 1.0)
        t += 1
    day = next(iter(w.thermal_resistance.values()))
    assert day[1] / day[0] == pytest.approx(0.1)
    assert day[0] == pytest.approx(600 - 299)  # counted once the load has been steady for 300 s


def fault_scenario(product: str, *faults: dict[str, Any]) -> dict[str, Any]:
    return {"gpus": [{"product": product, "schedule": [{"kind": "train", "seconds": 3600}]}], "faults": list(faults)}


@pytest.mark.parametrize(("product", "fault", "status", "code"), [
    ("h100-sxm", None, "ok", None),
    ("rtx4090", None, "ok", "memory_health_unknown"),  # a verdict on what it reports; the unknown part a reason
    ("h100-sxm", {"kind": "remap_rows", "uncorrected": 1, "failure": True}, "act", "row_remap_failure"),
    ("h100-sxm", {"kind": "remap_rows", "uncorrected": 1, "pending": True}, "watch", "row_remap_pending"),
    ("h100-sxm", {"kind": "remap_rows", "corrected": 2}, "watch", "remapped_rows"),
    ("h100-sxm", {"kind": "ecc", "uncorrected": 1}, "act", "uncorrectable_ecc"),
    ("h100-sxm", {"kind": "recovery_action", "action": 1}, "act", "recovery_action"),
    ("h100-sxm", {"kind": "lost"}, "act", "gpu_lost"),
    ("v100", {"kind": "retire_pages", "double_bit": 1, "pending": True}, "watch", "page_retirement_pending"),
    ("v100", {"kind": "retire_pages", "single_bit": 40, "double_bit": 20}, "act", "retired_pages_limit"),
    ("v100", {"kind": "retire_pages", "single_bit": 3}, "watch", "retired_pages"),
])
def test_verdict_for_each_health_criterion_through_fake_nvml(product: str, fault: dict[str, Any] | None,
                                                             status: str, code: str | None) -> None:
    rig = make_rig(fault_scenario(product, *([{"at": 20, "gpu": 0, **fault}] if fault else [])), slow_interval=5)
    tracker = WearTracker({}, WearConfig())
    for _ in range(60):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    w = tracker.wear(rig.sampler.snapshot.gpus[0].identity.uuid)
    assert w is not None
    v = verdict(w, WearConfig(), resistance_trend(w))
    assert v["status"] == status, v
    assert (code is None and not v["reasons"]) or code in {r["code"] for r in v["reasons"]}, v


def test_xids_through_the_nvml_event_set_and_the_kernel_log_reach_the_verdict() -> None:
    """XID 13 comes through NVML's event set (and the kernel log: counted once); 79, which NVML cannot report,
    through the kernel log alone."""
    rig = make_rig(fault_scenario("h100-sxm", {"at": 5, "gpu": 0, "kind": "xid", "xid": 79},
                                  {"at": 6, "gpu": 0, "kind": "xid", "xid": 13}))
    tracker = WearTracker({}, WearConfig())
    follow_kernel_log(rig, tracker, lambda snap: len(snap.gpus[0].xids) >= 2, events=True)
    w = tracker.wear(rig.sampler.snapshot.gpus[0].identity.uuid)
    assert w is not None and w.xids == {"79": 1, "13": 1}
    codes = {r["code"]: r["severity"] for r in verdict(w, WearConfig(), resistance_trend(w))["reasons"]}
    assert codes["xid_79"] == "act" and codes["xid_13"] == "watch"


def test_stress_in_a_hot_room_makes_the_verdict_watch() -> None:
    rig = make_rig("stress")
    tracker = WearTracker({}, WearConfig())
    for _ in range(1200):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    w = tracker.wear(rig.sampler.snapshot.gpus[0].identity.uuid)
    assert w is not None
    v = verdict(w, WearConfig(), resistance_trend(w))
    assert v["status"] == "watch" and "thermal_throttling" in {r["code"] for r in v["reasons"]}


def test_an_old_critical_event_asks_for_watching_not_action() -> None:
    w = GpuWear("GPU-x")
    w.health["ecc_enabled"] = True
    w.add_xids({79: 1}, wall=1.8e9)
    w.add_lost(1.8e9)
    w.see(1.8e9 + 3600)
    assert verdict(w, WearConfig(), resistance_trend(w))["status"] == "act"
    w.see(1.8e9 + 8 * 86400)  # a week later the card is still running fine
    v = verdict(w, WearConfig(), resistance_trend(w))
    assert v["status"] == "watch"
    assert {r["code"]: r["severity"] for r in v["reasons"]} == {"xid_79": "watch", "gpu_lost": "watch"}
    assert "last 2027-01-15" in v["reasons"][0]["text"]


def test_sample_of_equals_the_dataclass_constructor() -> None:
    """GpuSample.of (the sampler's and the importer's cheap constructor) builds the same sample as __init__, leaves
    the other fields None, stays frozen, and refuses an unknown field."""
    values = {"temperature_gpu_celsius": 61.0, "fan_speed_ratio": (0.4, None), "ecc_enabled": True, "processes": ()}
    fast = GpuSample.of(10.0, 2.5, values)
    assert fast == GpuSample(timestamp=10.0, monotonic=2.5, **values)
    assert hash(fast) == hash(GpuSample(timestamp=10.0, monotonic=2.5, **values))
    assert fast.power_watts is None and fast.timestamp == 10.0
    with pytest.raises(AttributeError):
        fast.power_watts = 3.0  # type: ignore[misc]
    with pytest.raises(TypeError, match="power_wats"):
        GpuSample.of(0.0, 0.0, {"power_wats": 1.0})
    assert GpuSample.of(0.0, 0.0, {}) == GpuSample(timestamp=0.0, monotonic=0.0)


def _live(faults: list[dict[str, Any]], seconds: int = 120, gpu: int = 0) -> tuple[GpuWear, list[Event]]:
    from test_nvml_backend import scenario

    rig = make_rig(scenario(*faults))
    tracker = WearTracker({}, WearConfig())
    for _ in range(seconds):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    tracker.flush()
    w = tracker.wear(rig.sampler.snapshot.gpus[gpu].identity.uuid)
    assert w is not None
    return w, tracker.take()[1]


def test_a_live_spike_is_judged_by_the_next_sample_like_an_import() -> None:
    """The same rule as imports (wear/plausibility.py): a lone die reading 15 °C off, contradicted by the next,
    is dropped; only such suspect samples wait a tick, so everything else is integrated as it comes."""
    clean, _ = _live([])
    glitched, events = _live([{"at": 60.5, "gpu": 0, "kind": "garbage", "field": "temperature", "value": 0}])
    assert [e.detail for e in events if e.kind == "reading_dropped"] == [
        {"field": "temperature_gpu_celsius", "reason": "spike", "value": 0.0}]
    assert "0" not in glitched.temperature_seconds["gpu"]
    assert glitched.all_cycles("gpu") == clean.all_cycles("gpu")  # no phantom cycle
    assert glitched.observed_seconds == clean.observed_seconds  # the held tick's time is still observed
    assert sum(glitched.temperature_seconds["gpu"].values()) == pytest.approx(
        sum(clean.temperature_seconds["gpu"].values()) - 1.0)  # only its die reading is missing


def test_a_live_memory_spike_is_judged_the_same_way() -> None:
    """HBM readings (an H100's) go through the same rule, apart from the die's: a lone 0 °C memory reading is
    dropped, the die reading of that tick is kept."""
    clean, _ = _live([], gpu=1)
    glitched, events = _live([{"at": 60.5, "gpu": 1, "kind": "garbage", "field": "memory_temperature", "value": 0}],
                             gpu=1)
    assert [e.detail for e in events if e.kind == "reading_dropped"] == [
        {"field": "temperature_memory_celsius", "reason": "spike", "value": 0.0}]
    assert "0" not in glitched.temperature_seconds["memory"]
    assert glitched.all_cycles("memory") == clean.all_cycles("memory")
    assert glitched.temperature_seconds["gpu"] == clean.temperature_seconds["gpu"]


def test_a_real_jump_is_held_one_tick_then_believed() -> None:
    clean, _ = _live([])
    jumped, events = _live([{"at": 60.5, "gpu": 0, "kind": "garbage", "field": "temperature", "value": 0},
                            {"at": 61.5, "gpu": 0, "kind": "garbage", "field": "temperature", "value": 0}])
    assert not [e for e in events if e.kind == "reading_dropped"]  # two readings agree: not a lone spike
    assert jumped.temperature_seconds["gpu"].get("0") == pytest.approx(2.0)
    assert jumped.observed_seconds == clean.observed_seconds


@pytest.mark.slow
@pytest.mark.parametrize("detail", [True, False], ids=["detail", "default"])
def test_views_from_kept_sums_equal_views_computed_afresh(detail: bool) -> None:
    """The views a scrape reads keep each histogram's weighted sums from view to view, taking what the bins gained;
    at every step they equal views computed from nothing as bins appear, and after the accumulators are replaced by a
    merge (new dicts, perhaps at a freed one's address): the counters bit for bit (a rounding must never take one
    down), the estimates to the last digits of a float."""
    from dataclasses import replace

    from gpuwear.tracker import view

    rig = make_rig("stress")
    params = WearConfig()
    tracker = WearTracker({}, params)
    tracker.set_detail(detail)
    compared = 0
    for tick in range(1500):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        if tick == 700:  # what adopting a ledger opened late does: every accumulator a new object
            tracker.adopt({uuid: GpuWear(uuid) for uuid in tracker._wears}, {})
        views = tracker.views  # derived at every tick: the kept factors grow bin by bin
        if tick % 97 == 0 or tick == 701:
            for uuid, shown in views.items():
                w = tracker._shown(uuid)
                assert w.weighed or not w.observed_seconds  # the sums are kept with a history that has bins
                afresh = view(replace(w, weighed={}, residues={}, days=None), params, shown.jobs, detail)
                blank = {"estimates": {}, "attributed": {}, **({} if detail else {"busy_seconds": 0.0})}
                assert shown._replace(**blank) == afresh._replace(**blank)
                assert shown.busy_seconds == pytest.approx(afresh.busy_seconds, rel=1e-12)  # not exported by default
                for name, bands in afresh.estimates.items():
                    for part, value in bands.items():
                        assert shown.estimates[name][part] == pytest.approx(value, rel=1e-12)
                for kind, (seconds, joules, aging) in afresh.attributed.items():
                    assert shown.attributed[kind][:2] == (seconds, joules)
                    assert shown.attributed[kind][2] == pytest.approx(aging, rel=1e-12)
                assert shown.attributed.keys() == afresh.attributed.keys()
                _check_cycle_figures(w, shown, params, detail)
                compared += 1
    assert compared > 20
    bins = {len(w.temperature_seconds["gpu"]) for w in tracker._wears.values()}
    assert min(bins) > 20  # the stress scenario swept the die through many degrees: bins were added on the way


def _check_cycle_figures(w: GpuWear, shown: WearView, params: WearConfig, detail: bool = True) -> None:
    """A view's cycles by range and cycle fatigue against direct sums over the history's bins (no kept sums): every
    range and band with metrics.detail, else the die's BASIC_CYCLE_RANGES and the central band."""
    from gpuwear.tracker import BASIC_CYCLE_RANGES, CYCLE_RANGES, cycle_range_label

    c = params.cycles
    for sensor, bins in w.cycles.items():
        for i, (lo, hi) in enumerate(CYCLE_RANGES):
            direct = sum(n for key, n in bins.items() if lo <= int(key.split(":")[0]) < hi)
            label = (sensor, cycle_range_label(lo, hi))
            if detail or (sensor == "gpu" and i in BASIC_CYCLE_RANGES):
                assert shown.cycles[label] == pytest.approx(direct, rel=1e-12, abs=1e-12)
            else:
                assert label not in shown.cycles
    fatigue = shown.estimates["cycle_fatigue_equivalent_cycles"]
    for band, exponent in c.exponent.items():
        if not detail and band != "central":
            assert band not in fatigue
            continue
        q = getattr(c.peak_term_kelvin, band)
        direct = 0.0
        for key, n in [*w.cycles.get("gpu", {}).items(), *w.residue_cycles("gpu").items()]:
            rng, peak = (int(v) for v in key.split(":"))
            if rng > 0:
                direct += n * (rng / c.reference_range_celsius) ** exponent * math.exp(
                    q * (1 / (c.reference_peak_celsius + 273.15) - 1 / (peak + 273.15)))
        assert fatigue[band] == pytest.approx(direct, rel=1e-9)


def test_default_views_hold_what_the_default_metrics_read() -> None:
    from gpuwear.tracker import view

    rig = make_rig("demo")
    tracker = WearTracker({}, WearConfig())
    for _ in range(300):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    for uuid, full in tracker.views.items():
        basic = view(tracker._shown(uuid), WearConfig(), full.jobs, detail=False)
        assert not basic.above_celsius and full.above_celsius
        aging = basic.estimates["thermal_aging_equivalent_hours"]
        assert set(aging) - {"memory"} == {"central"}
        assert aging["central"] == full.estimates["thermal_aging_equivalent_hours"]["central"]
        assert (basic.verdict, basic.attributed) == (full.verdict, full.attributed)
        assert set(basic.cycles) == {k for k in full.cycles if k in {("gpu", "20-40"), ("gpu", "40+")}}
        assert basic.cycles.items() <= full.cycles.items()
        assert set(basic.above_threshold) <= {("gpu", "slowdown"), ("memory", "memory_max")}
        assert basic.above_threshold.items() <= full.above_threshold.items()
        assert ("gpu", "gpu_max") in full.above_threshold


def _trend_afresh(w: GpuWear) -> dict[str, Any] | None:
    """resistance_trend as a direct formula over every day with data (the oracle)."""
    days = sorted((d, v) for d, v in w.thermal_resistance.items() if v[0] > 0)
    if not days:
        return None
    first = sum(v[1] for _, v in days[:3]) / sum(v[0] for _, v in days[:3])
    last = sum(v[1] for _, v in days[-3:]) / sum(v[0] for _, v in days[-3:])
    return {"days": len(days), "first_celsius_per_watt": round(first, 6), "last_celsius_per_watt": round(last, 6),
            "rise_ratio": round(last / first - 1, 4) if len(days) >= 6 else None}


def test_the_resistance_trend_follows_a_growing_record() -> None:
    """The sorted days are kept from scrape to scrape (a year-old card's 365 days were sorted at every scrape); the
    trend equals the direct formula as days come in any order, a kept day's figures grow, a day held without data
    gets some, and a merge replaces the map."""
    import datetime

    from gpuwear.wear.models import resistance_trend

    rng = random.Random(7)
    w = GpuWear("GPU-trend")
    start = datetime.date(2025, 1, 1)
    order = list(range(400))
    rng.shuffle(order)
    for step, n in enumerate(order):
        day = (start + datetime.timedelta(days=n)).isoformat()
        w.thermal_resistance[day] = [0.0, 0.0, 0.0] if step % 50 == 3 else [60.0, 60.0 * 0.2, 60.0 * 0.04]
        held = list(w.thermal_resistance.values())
        for v in rng.sample(held, min(3, len(held))):  # days already held grow (the current one)
            if step % 7:
                r = rng.uniform(0.1, 0.4)
                v[0], v[1], v[2] = v[0] + 30.0, v[1] + 30.0 * r, v[2] + 30.0 * r * r
        if step % 9 == 0:
            assert resistance_trend(w) == _trend_afresh(w), step
            assert resistance_trend(w) == _trend_afresh(w)  # kept: the same again
    empty = [v for v in w.thermal_resistance.values() if v[0] == 0]
    assert empty and resistance_trend(w) == _trend_afresh(w)
    empty[0][:] = [45.0, 45.0 * 0.9, 45.0 * 0.81]  # a day held without data gets some, no day added
    assert resistance_trend(w) == _trend_afresh(w)
    merged = w.merged(GpuWear("GPU-trend", thermal_resistance={"2024-12-31": [10.0, 1.0, 0.1]}))
    assert resistance_trend(merged) == _trend_afresh(merged) and resistance_trend(merged)["days"] > 350


def test_observed_intervals_stay_bounded_and_never_cover_less() -> None:
    """A card whose readings stop and start all day long added an interval at each gap: its record grew toward the
    ledger's cap (100,000 intervals), where every card's save was refused."""
    from gpuwear.ledger.records import _compact
    from gpuwear.wear.accumulate import COVERED_KEPT
    from gpuwear.wear.schema import check_wear

    w = GpuWear("GPU-x", name="x")
    rng = random.Random(3)
    observed, t = [], 1.75e9
    for _ in range(3 * COVERED_KEPT):
        start, end = t, t + rng.uniform(1, 60)
        w.cover(start, end)
        observed.append((start, end))
        t = end + rng.choice([2.0, 5.0, 30.0, 600.0])  # a gap: a new interval
    kept = w.intervals()
    assert len(kept) <= COVERED_KEPT and kept == sorted(kept)
    starts = [a for a, _ in kept]
    for s, e in observed:  # never covers less: each observed interval lies in one kept
        a, b = kept[bisect.bisect_right(starts, s) - 1]
        assert a <= s and e <= b, (s, e, a, b)
    assert all(b < a2 for (_, b), (a2, _) in itertools.pairwise(kept))  # still disjoint
    doc = w.to_json()
    check_wear(_compact(doc), "", doc["schema"])


def test_merging_many_histories_at_once_is_merging_them_one_after_the_other() -> None:
    """GpuWear.merged_all (a GPU's imports, read by every report and page) against merged() in a chain."""
    import json
    import random

    rnd = random.Random(11)

    def history(k: int) -> GpuWear:
        start = 1.7e9 + k * 7 * 86400
        w = GpuWear("GPU-many", name=rnd.choice(["", "card"]), first_seen=start, last_seen=start + 3600)
        w.observed_seconds = 3600.0
        w.energy_joules = rnd.uniform(1e5, 1e6)
        w.temperature_seconds = {"gpu": {str(t): rnd.uniform(1, 300) for t in rnd.sample(range(30, 90), 6)}}
        w.cycles = {"gpu": {f"{r}:{60 + r}": float(rnd.randint(0, 3)) for r in rnd.sample(range(3, 30), 3)}}
        w.thresholds = {"slowdown": float(rnd.randint(80, 95))}
        w.xids = {str(rnd.choice([13, 31, 79])): 1}
        w.covered = {repr(start): start + 1800, repr(start + 2000): start + 3600}
        return w

    others = [history(k) for k in range(40)]
    chained = GpuWear("GPU-many")
    for other in others:
        chained = chained.merged(other)
    at_once = GpuWear.merged_all(GpuWear("GPU-many"), others)
    assert json.dumps(at_once.to_json(), sort_keys=True) == json.dumps(chained.to_json(), sort_keys=True)



def test_every_verdict_reason_names_its_rule_and_whose_it_is() -> None:
    """The verdict's reasons did not say which rule they apply: NVIDIA's (memory errors, page retirement, the XID
    catalog, DCGM's retired-page limit) or gpuwear's own thresholds (heat, throttling, cooling)."""
    from gpuwear.health import RULES, rule

    w = GpuWear("GPU-x", name="card")
    w.health.update({"remapped_rows_failure": True, "retired_pages_single_bit": 61, "ecc_uncorrected_volatile": 1,
                     "recovery_action": 1})
    w.xids = {"79": 1, "13": 2}
    w.last_seen = 1.8e9
    w.health_days = {"2027-01-15": {"busy": 1000.0, "throttled": 500.0}}
    v = verdict(w, WearConfig(), None)
    rules = {r["code"]: r["rule"] for r in v["reasons"]}
    assert {"row_remap_failure", "retired_pages_limit", "uncorrectable_ecc", "recovery_action", "xid_79", "xid_13",
            "thermal_throttling"} <= set(rules), rules
    assert all(r for r in rules.values())
    assert rules["row_remap_failure"].startswith("NVIDIA") and "DCGM" in rules["retired_pages_limit"]
    assert "XID catalog" in rules["xid_79"] and rules["thermal_throttling"].startswith("gpuwear's own rule")
    assert all(code in RULES for code in rules if not code.startswith("xid_")) and rule("xid_48") == rules["xid_79"]


def test_a_gpu_that_needs_repairs_again_within_a_week_is_a_repeat_offender() -> None:
    """NVSentinel's MultipleRemediations rule, per GPU: five incidents calling for a reset, a reboot or service
    within 7 days make the verdict act (repairs are not holding); four do not, nor five spread over 8 days; a repeat
    long past is history (watch), then ends. Issue 51: two incidents within an hour, no reset between, gave act
    while NVSentinel counts five remediated events in 7 days. Before issue 29 the verdict weighed each incident
    alone and kept no history of them."""
    from gpuwear.health import RULES
    from gpuwear.wear.schema import check_wear

    day = 86400.0
    t0 = 1.79e9

    def card(*incidents: tuple[float, str], last_seen: float) -> dict[str, Any]:
        w = GpuWear("GPU-x", name="card")
        w.first_seen, w.last_seen = t0, last_seen
        for wall, what in incidents:
            w.add_incident(wall, what)
        w2 = GpuWear.from_json(json.loads(json.dumps(w.to_json())), 2.0)  # kept in the record as saved
        check_wear(w2.to_json())
        return verdict(w2, WearConfig(), None)

    def codes(v: dict[str, Any]) -> set[str]:
        return {r["code"] for r in v["reasons"]}

    five = [(t0 + i * day, "xid 48") for i in range(4)] + [(t0 + 3.5 * day, "gpu lost")]
    v = card(*five, last_seen=t0 + 3.5 * day)
    (repeat,) = [r for r in v["reasons"] if r["code"] == "repeat_incidents"]
    assert repeat["severity"] == "act" and v["status"] == "act"
    assert "5 times within 7 day(s)" in repeat["text"] and "xid 48, gpu lost" in repeat["text"]
    assert repeat["rule"] == RULES["repeat_incidents"] and "NVSentinel" in repeat["rule"]
    assert v["incidents"]["kept"] == 5 and v["incidents"]["mean_seconds_between"] == pytest.approx(3.5 * day / 4)
    assert "repeat_incidents" not in codes(card(*five[:4], last_seen=t0 + 3.5 * day))
    apart = card(*[(t0 + 2 * i * day, "xid 48") for i in range(5)], last_seen=t0 + 8 * day)
    assert "repeat_incidents" not in codes(apart) and apart["status"] == "ok"
    past = card(*five, last_seen=t0 + 20 * day)
    assert [r["severity"] for r in past["reasons"] if r["code"] == "repeat_incidents"] == ["watch"]
    ended = card(*five, last_seen=t0 + 34 * day)  # issue 51: it ends
    assert "repeat_incidents" not in codes(ended) and ended["status"] == "ok"
    # one fault seen several ways within 10 minutes is one incident: not a repeat on its own
    w = GpuWear("GPU-x")
    for wall, what in ((t0, "xid 79"), (t0 + 2, "gpu lost"), (t0 + 40, "xid 79")):
        w.add_incident(wall, what)
    assert w.incident_list() == [(t0, "xid 79, gpu lost")]
    # a sticky XID (NVSentinel's: it keeps reporting until a reset) within 3 hours of one is the same burst;
    # an XID that is not sticky, or one 3 hours on, is a new incident
    for wall, what in ((t0 + 3600, "xid 119"), (t0 + 7000, "xid 79")):
        w.add_incident(wall, what)
    assert w.incident_list() == [(t0, "xid 79, gpu lost, xid 119")]
    w.add_incident(t0 + 7200, "xid 48")
    w.add_incident(t0 + 7200 + 3 * 3600 + 1, "xid 79")
    assert [what for _, what in w.incident_list()] == ["xid 79, gpu lost, xid 119", "xid 48", "xid 79"]
    # the record keeps the newest 64, however many there were
    for i in range(1, 100):
        w.add_incident(t0 + 10 * 3600 + i * 3600, f"xid {i}")
    assert len(w.incidents) == 64 and w.incident_list()[0] == (t0 + 46 * 3600, "xid 36")


def test_repeated_uncorrectable_errors_through_fake_nvml_make_a_repeat_offender() -> None:
    """Through the fake NVML and the tracker: five uncorrectable ECC errors 12 minutes apart are five incidents
    (each asks for a reset), and the verdict names the repeat; four are not a repeat."""
    for faults, repeat in ((5, True), (4, False)):
        rig = make_rig(fault_scenario("h100-sxm", *({"at": 20 + 720 * i, "gpu": 0, "kind": "ecc", "uncorrected": 1}
                                                   for i in range(faults))), slow_interval=5)
        tracker = WearTracker({}, WearConfig())
        for _ in range(750):
            rig.run(5, interval=5)
            tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        w = tracker.wear(rig.sampler.snapshot.gpus[0].identity.uuid)
        assert w is not None and list(w.incidents.values()) == ["uncorrectable ecc"] * faults
        codes = {r["code"]: r["severity"] for r in verdict(w, WearConfig(), resistance_trend(w))["reasons"]}
        assert (codes.get("repeat_incidents") == "act") is repeat, codes


def test_a_gpu_that_bleeds_corrected_errors_under_load_is_watched_against_its_peers() -> None:
    """NVIDIA/DCGM #313: a GB200 leaked ~17,700 corrected ECC errors a second under load, 0 at idle, while every
    peer read 0, and every monitor called it healthy. Here two H100s train; one leaks 20 corrected errors a second
    at full load (fault ecc_bleed). Its rate per loaded hour is kept in its record (error_counts), the verdict
    watches it with its evidence and its rule (gpuwear's own, citing the field case), and its peer stays ok. A
    driver reload (the counter back to 0) is a new baseline, never negative errors. Without a peer of its product
    it is judged against its own past, which two hours do not make (test_a_gpu_alone_is_judged_against_its_own_past)."""
    from gpuwear.health import RULES, peer_rates

    train = [{"kind": "train", "seconds": 4 * 3600, "utilization": 1.0}]
    rig = make_rig({"gpus": [{"product": "h100-sxm", "schedule": train}, {"product": "h100-sxm", "schedule": train}],
                    "faults": [{"at": 10, "gpu": 0, "kind": "ecc_bleed", "corrected_per_second": 20},
                               {"at": 3000, "gpu": 0, "kind": "driver_reload"}]}, slow_interval=30)
    params = replace(WearConfig(), max_gap_seconds=60.0)
    tracker = WearTracker({}, params)
    for _ in range(2 * 3600 // 10):
        rig.run(10, interval=10)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    uuids = [g.identity.uuid for g in rig.sampler.snapshot.gpus]
    wears = {u: tracker.wear(u) for u in uuids}
    bleeding, peer = wears[uuids[0]], wears[uuids[1]]
    assert bleeding is not None and peer is not None
    loaded, _ = bleeding.error_rates(3600)["ecc_corrected"]
    assert loaded is not None and 60_000 <= loaded <= 80_000, loaded  # 20 a second at full load: 72,000 an hour
    assert peer.error_rates(3600)["ecc_corrected"][0] == 0.0
    peers = peer_rates(wears, params)  # type: ignore[arg-type]
    v = verdict(bleeding, params, None, peers=peers[uuids[0]])
    (reason,) = [r for r in v["reasons"] if r["code"] == "bleeding_errors"]
    assert reason["severity"] == "watch" and "corrected ECC errors per loaded hour" in reason["text"]
    assert "1 peer(s) of the same product over theirs: 0 (median)" in reason["text"]
    assert reason["rule"] == RULES["bleeding_errors"]
    assert "gpuwear's own rule" in reason["rule"] and "DCGM #313" in reason["rule"]
    assert "bleeding_errors" not in {r["code"] for r in verdict(peer, params, None, peers=peers[uuids[1]])["reasons"]}
    # without its peer, alone: 72,000 an hour is over the absolute floor of a card without peers (issue 51)
    (alone,) = [r for r in verdict(bleeding, params, None)["reasons"] if r["code"] == "bleeding_errors"]
    assert "no peer of the same product; no past of its own to compare with" in alone["text"], alone
    # the live verdict, as /metrics and the page show it, judges it the same way
    assert "bleeding_errors" in {r["code"] for r in tracker.views[uuids[0]].verdict["reasons"]}
    # and the counts behind the rates, with metrics.detail
    from gpuwear.collector import encode
    from gpuwear.metrics import DaemonInfo, Published

    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="")
    text = encode(Published(rig.sampler.snapshot, tracker.views, None, info), False, detail=True).decode()
    events = re.search(rf'^gpuwear_lifetime_error_events_total{{counter="ecc_corrected",gpu="0",load="loaded",'
                       rf'uuid="{uuids[0]}"}} (\S+)$', text, re.M)
    assert events is not None and float(events.group(1)) == bleeding.error_counts["ecc_corrected"][1] > 0
    assert "bleeding_errors" not in {r["code"] for r in tracker.views[uuids[1]].verdict["reasons"]}


def test_nvlink_replays_and_correctable_row_remaps_are_kept_as_rates_too() -> None:
    """Issue 38 item 1 names NVLink replays and rows remapped for correctable errors beside corrected ECC errors, PCIe
    replays and NVLink CRC errors: their events by load are kept in the record too (error_counts, through its JSON),
    and an H100 whose NVLink replays run at 5,000 per loaded hour while its peer's read 0 is watched, in words."""
    from gpuwear.health import peer_rates
    from gpuwear.health.signals import ERROR_WORDS
    from gpuwear.wear.accumulate import ERROR_COUNTERS

    assert set(ERROR_WORDS) == set(ERROR_COUNTERS)
    params = replace(WearConfig(), max_gap_seconds=900.0)
    wears = {}
    for uuid, replays_per_hour, rows in (("GPU-bad", 5000.0, 2), ("GPU-good", 0.0, 0)):
        w = GpuWear(uuid, name="NVIDIA H100 80GB HBM3")
        for k in range(4 * 6 + 1):  # four loaded hours, a sample every 10 minutes
            t = 600.0 * k
            w.add(GpuSample(timestamp=1.8e9 + t, monotonic=t, temperature_gpu_celsius=60.0, utilization_gpu_ratio=1.0,
                            nvlink_replay_errors=int(replays_per_hour * t / 3600),
                            remapped_rows_corrected=rows if k >= 12 else 0), 0.0 if k == 0 else 600.0)
        wears[uuid] = GpuWear.from_json(json.loads(json.dumps(w.to_json())), 2.0)
    bad = wears["GPU-bad"]
    assert bad.error_counts["nvlink_replay"][1] == 20000.0 and bad.error_counts["nvlink_replay"][0] == 4 * 3600.0
    assert bad.error_counts["remapped_rows_correctable"][1] == 2.0
    assert wears["GPU-good"].error_counts["nvlink_replay"][1] == 0.0
    peers = peer_rates(wears, params)
    reasons = verdict(bad, params, None, peers=peers["GPU-bad"])["reasons"]
    (reason,) = [r for r in reasons if r["code"] == "bleeding_errors"]
    assert "5000 NVLink replays per loaded hour" in reason["text"], reason["text"]
    assert "remapped" not in reason["text"]  # 0.5 an hour: far below the floor
    good = verdict(wears["GPU-good"], params, None, peers=peers["GPU-good"])
    assert "bleeding_errors" not in {r["code"] for r in good["reasons"]}


def _lone_gpu(rates_by_day: list[float], hours_a_day: float = 8.0) -> GpuWear:
    return card_by_day(rates_by_day, hours_a_day=hours_a_day)


def test_a_gpu_alone_is_judged_against_its_own_past() -> None:
    """Issue 38: a GPU with no peer of its product (alone on its host) is watched when its corrected errors per
    loaded hour over its last two UTC days are 10 x its own over the 30 days before, and above the floor. Kept
    through the ledger's JSON, merged record by record. Not watched: a steady rate under the absolute floor for a
    lone card (its own normal; issue 51: at or above it, watched however long it lasts, tests/test_health.py), a
    rise below the floor, too little load, a GPU with peers (judged against them)."""
    from gpuwear.health import RULES, peer_rates
    from gpuwear.wear.accumulate import SCHEMA
    from gpuwear.wear.schema import check_wear

    p = WearConfig()
    bleeding = _lone_gpu([20.0] * 31 + [20_000.0] * 2)
    recent, before = bleeding.own_error_rates(30, 3600)["ecc_corrected"]
    assert recent is not None and before is not None
    assert 19_000 <= recent <= 20_000 and 15 <= before <= 25, (recent, before)
    assert len(bleeding.error_days) == 33
    v = verdict(bleeding, p, None, peers=peer_rates({"GPU-lone": bleeding}, p)["GPU-lone"])
    (reason,) = [r for r in v["reasons"] if r["code"] == "bleeding_errors"]
    assert "per loaded hour over its last two days" in reason["text"], reason
    assert "its own over the 30 days before: 20" in reason["text"] and reason["rule"] == RULES["bleeding_errors"]
    assert "bleeding_baseline_days" in reason["rule"]
    # its record carries the days through the ledger's JSON, and a merge adds day to day
    back = GpuWear.from_json(json.loads(json.dumps(bleeding.to_json())), bleeding.gate_celsius)
    assert back.error_days == bleeding.error_days
    check_wear(json.loads(json.dumps(bleeding.to_json())), schema=SCHEMA)
    twice = back.merged(bleeding)
    day = max(bleeding.error_days)
    assert twice.error_days[day]["ecc_corrected"] == [2 * x for x in bleeding.error_days[day]["ecc_corrected"]]
    # the newest 62 days are kept, however long the record
    assert len(_lone_gpu([20.0] * 70, hours_a_day=1).error_days) == 62
    # the two windows follow the record's last day (made once a day and kept): two days on, the bleeding days are
    # its past, and its last two days hold nothing to judge
    later = GpuWear.from_json(json.loads(json.dumps(bleeding.to_json())), bleeding.gate_celsius)
    assert later.last_seen is not None
    later.last_seen += 2 * 86400
    lately, past = later.own_error_rates(30, 3600)["ecc_corrected"]
    assert lately is None and past is not None and 1_000 <= past <= 2_000, (lately, past)

    def codes(w: GpuWear, peers: dict[str, list[float]] | None = None) -> set[str]:
        return {r["code"] for r in verdict(w, p, None, peers=peers)["reasons"]}

    assert "bleeding_errors" not in codes(_lone_gpu([5_000.0] * 33))  # steady under the absolute floor: its normal
    assert "bleeding_errors" not in codes(_lone_gpu([20.0] * 31 + [900.0] * 2))  # 45 x, below the floor
    assert "bleeding_errors" not in codes(_lone_gpu([5_000.0] * 2))  # no past to compare with, under the floor
    assert "bleeding_errors" not in codes(_lone_gpu([20.0] * 31 + [20_000.0] * 2, hours_a_day=0.5))  # too little load
    # with a peer of its product reading the counter, the peer is the judge: one bleeding as much is no outlier
    assert "bleeding_errors" not in codes(bleeding, peers={"ecc_corrected": [19_000.0]})


def _hanging_h100(hang_seconds: float, deadline: float, pause: float = 0.0) -> tuple[GpuWear, GpuWear]:
    """An RTX 4090 and an H100 training, three of the H100's NVML calls held ``hang_seconds`` each (the fake's
    fault "hang") under a sampler ``deadline``, 16 ticks (``pause`` wall seconds after each): their histories."""
    import time

    rig = make_rig({"gpus": [{"product": "rtx4090", "schedule": [{"kind": "train", "seconds": 3600}]},
                             {"product": "h100-sxm", "schedule": [{"kind": "train", "seconds": 3600,
                                                                   "utilization": 1.0}]}],
                    "faults": [{"at": 3.5 + 4 * i, "gpu": 1, "kind": "hang", "seconds": hang_seconds}
                               for i in range(3)]})
    rig.sampler.deadline = deadline
    rig.sampler.timer = time.perf_counter
    tracker = WearTracker({}, WearConfig())
    for _ in range(16):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        time.sleep(pause)
    rig.sampler.close()
    rtx, h100 = (tracker.wear(g.identity.uuid) for g in rig.sampler.snapshot.gpus)
    assert h100 is not None and rtx is not None
    return rtx, h100


@pytest.mark.slow
def test_driver_calls_that_stall_under_load_are_remembered_and_watched() -> None:
    """NVIDIA/DCGM #313: the GB200's driver calls hung only under load. Three hangs of the H100's NVML calls while
    it trains, each past the sampler's deadline (one hang counted once, however many ticks it lasts), are kept in
    its record by load and make the verdict watch, saying they came only under load; the RTX 4090 beside it, not."""

    rtx, h100 = _hanging_h100(0.6, 0.2, pause=0.3)  # a hung call returns within two ticks
    assert h100.error_counts["nvml_stalls"][1:4:2] == [3.0, 0.0], h100.error_counts  # 3 under load, 0 idle
    (reason,) = [r for r in verdict(h100, WearConfig(), None)["reasons"] if r["code"] == "stalled_calls"]
    assert "3 times (3 under load, 0 idle) in its last 7 days only under load" in reason["text"]
    assert "gpuwear's own" in reason["rule"]
    assert "stalled_calls" not in {r["code"] for r in verdict(rtx, WearConfig(), None)["reasons"]}


def test_slow_driver_calls_are_kept_by_load_in_the_gpus_record() -> None:
    """Issue 38 item 3: the latency history of a GPU's NVML reads, in its record. Three reads of the H100 held
    0.15 s each while it trains (under the sampler's deadline: slow, not stalled) are kept as slow reads under
    load, through the ledger's JSON and its validator; they are said in the verdict's stalled_calls reason and in
    `report`; the RTX 4090 beside it has none."""

    from gpuwear.health import slow_reads_text
    from gpuwear.wear.accumulate import SCHEMA
    from gpuwear.wear.schema import check_wear

    rtx, h100 = _hanging_h100(0.15, 2.0)
    assert h100.slow_reads == {"loaded": {"0.1": 3}} and rtx.slow_reads == {}, (h100.slow_reads, rtx.slow_reads)
    assert "nvml_stalls" not in h100.error_counts or h100.error_counts["nvml_stalls"][1] == 0
    doc = json.loads(json.dumps(h100.to_json()))
    check_wear(doc, schema=SCHEMA)
    assert GpuWear.from_json(doc, h100.gate_celsius).slow_reads == h100.slow_reads
    assert GpuWear.from_json(doc, 2.0).merged(h100).slow_reads == {"loaded": {"0.1": 6}}
    assert slow_reads_text(h100.slow_reads) == "reads of 0.1 s or more: 3 under load, 0 idle"
    w = GpuWear("GPU-x")
    for seconds, loaded in ((0.05, True), (0.1, True), (1.5, True), (12.0, False), (0.3, False)):
        w.add_read(seconds, loaded)
    assert w.slow_reads == {"loaded": {"0.1": 1, "1": 1}, "idle": {"10": 1, "0.1": 1}}
    assert slow_reads_text(w.slow_reads) == ("reads of 0.1 s or more: 2 under load (1 of 1 s or more), 2 idle "
                                             "(1 of 1 s or more)")
    w.last_seen = 1.8e9
    w.add_stalls(3, True, 1.8e9)
    (reason,) = [r for r in verdict(w, WearConfig(), None)["reasons"] if r["code"] == "stalled_calls"]
    assert "; reads of 0.1 s or more: 2 under load" in reason["text"], reason


def test_a_card_that_runs_just_below_its_slowdown_temperature_is_watched_for_headroom() -> None:
    """Issue 29's margins: the verdict watched time above the slowdown temperature only, so a card held at 1-5 °C
    below it for most of its busy time, one warm day from slowing down, read ok. Now 25 % or more of busy time
    within 5 °C below it is a watch (gpuwear's own rule); 10 °C below is not."""
    from gpuwear.health import RULES

    for celsius, watched in ((86, True), (79, False)):
        w = GpuWear("GPU-x", name="card")
        for k in range(41):  # 3,000 s busy at ``celsius``, then 1,000 s idle at 40 °C
            hot = k <= 30
            w.add(GpuSample(timestamp=1.8e9 + 100.0 * k, monotonic=100.0 * k, threshold_slowdown_celsius=89.0,
                            temperature_gpu_celsius=float(celsius if hot else 40), utilization_gpu_ratio=float(hot)),
                  0.0 if k == 0 else 100.0)
        v = verdict(w, WearConfig(), None)
        reasons = {r["code"]: r for r in v["reasons"]}
        assert ("close_to_slowdown" in reasons) is watched, v
        if watched:
            assert reasons["close_to_slowdown"]["severity"] == "watch"
            assert "100 % of busy time within 5 °C below its slowdown temperature (89 °C)" in \
                reasons["close_to_slowdown"]["text"]
            assert reasons["close_to_slowdown"]["rule"] == RULES["close_to_slowdown"]
            # in `report` and on the page too (issue 29's done-when), from the record as a ledger gives it
            from gpuwear import page
            from gpuwear.report import document, text_report

            doc = document([w], WearConfig(), {}, "test", False)
            words = reasons["close_to_slowdown"]["text"]
            assert words in text_report(doc) and words.replace("'", "&#x27;") in page.render(doc)


def test_a_single_corrected_error_or_a_busy_gpu_among_idle_peers_is_not_bleeding() -> None:
    """Issue 38's negative cases beside the reload and the lone GPU (above): one corrected error in hours of load is
    a single event, not a rate (under the floor, even against peers at 0); a busy GPU with a few errors among peers
    that were idle (none read under load for the hour a rate needs; its own 1,800 an hour, above the floor) has no
    peer rate to be judged against, and its
    record is too young for its own baseline. Samples every 10 minutes through GpuWear.add."""
    from gpuwear.health import peer_rates

    p = WearConfig()

    def card(uuid: str, errors: list[int], busy: bool) -> GpuWear:
        w = GpuWear(uuid, name="NVIDIA H100 80GB HBM3")
        for k, count in enumerate(errors):
            w.add(GpuSample(timestamp=1.8e9 + 600.0 * k, monotonic=600.0 * k, temperature_gpu_celsius=60.0,
                            utilization_gpu_ratio=1.0 if busy else 0.0, ecc_corrected_volatile=count),
                  0.0 if k == 0 else 600.0)
        return w

    hours = 4 * 6 + 1
    single = {"GPU-a": card("GPU-a", [0] * 12 + [1] * (hours - 12), True),
              "GPU-b": card("GPU-b", [0] * hours, True)}
    assert single["GPU-a"].error_counts["ecc_corrected"][1] == 1.0
    peers = peer_rates(single, p)
    assert "bleeding_errors" not in {r["code"] for r in verdict(single["GPU-a"], p, None, peers=peers["GPU-a"])
                                     ["reasons"]}
    idle_peers = {"GPU-busy": card("GPU-busy", [300 * k for k in range(hours)], True),
                  "GPU-i1": card("GPU-i1", [0] * hours, False), "GPU-i2": card("GPU-i2", [0] * hours, False)}
    peers = peer_rates(idle_peers, p)
    assert "ecc_corrected" not in peers["GPU-busy"], peers  # the idle peers have no loaded rate
    busy = verdict(idle_peers["GPU-busy"], p, None, peers=peers["GPU-busy"])
    assert "bleeding_errors" not in {r["code"] for r in busy["reasons"]}, busy


def test_peer_rates_are_the_other_gpus_of_the_same_product() -> None:
    """health.peer_rates gathers each product's rates once (the pairwise pass cost 1.7 ms at 64 GPUs on the scrape
    path); against the pairwise definition, on mixed products, equal rates and a GPU read too briefly under load."""
    from gpuwear.health import peer_rates
    from gpuwear.health.signals import recent_rates

    p = WearConfig()
    wears = {}
    for i in range(12):
        w = GpuWear(f"GPU-{i}", name=("NVIDIA H100 80GB HBM3", "nvidia h100 80gb hbm3 ", "NVIDIA A100")[i % 3])
        loaded = 600.0 if i == 4 else 7200.0  # GPU-4: under the hour of load a rate needs
        w.last_seen = 1.8e9
        w.error_days = {"2027-01-15": {"ecc_corrected": [loaded, float(i % 5)], "pcie_replays": [7200.0, 2.0]}}
        wears[w.uuid] = w
    fast = peer_rates(wears, p)
    for uuid, w in wears.items():
        pairwise: dict[str, list[float]] = {}
        for other, o in wears.items():
            if other != uuid and o.name.strip().lower() == w.name.strip().lower():
                for counter, (loaded, _) in recent_rates(o, p).items():
                    if loaded is not None:
                        pairwise.setdefault(counter, []).append(loaded)
        assert {c: sorted(v) for c, v in fast[uuid].items()} == {c: sorted(v) for c, v in pairwise.items()}, uuid


def test_every_verdict_reason_code_is_given_once() -> None:
    """A code labels one series of gpuwear_health_reason: a GPU bleeding corrected errors and PCIe replays at once
    gave two bleeding_errors reasons, two samples of one series, which Prometheus refuses as a scrape."""
    from gpuwear.health import peer_rates

    p = WearConfig()
    wears = {}
    for i in range(3):
        w = GpuWear(f"GPU-{i}", name="NVIDIA H100 80GB HBM3")
        events = 1e6 if i == 0 else 0.0
        w.last_seen = 1.8e9
        w.error_days = {"2027-01-15": {"ecc_corrected": [7200.0, events], "pcie_replays": [7200.0, events]}}
        wears[w.uuid] = w
    v = verdict(wears["GPU-0"], p, None, peers=peer_rates(wears, p)["GPU-0"])
    codes = [r["code"] for r in v["reasons"]]
    assert len(codes) == len(set(codes)) and codes.count("bleeding_errors") == 1, codes
    (bleed,) = [r for r in v["reasons"] if r["code"] == "bleeding_errors"]
    assert "corrected ECC errors per loaded hour" in bleed["text"] and "PCIe replays per loaded hour" in bleed["text"]
