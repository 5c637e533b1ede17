"""The simulated GPUs behave physically enough to be useful, and scenarios are validated."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from gpuwear.backends.simulated import (
    REASON_GPU_IDLE,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    parse_scenario,
)


def one_gpu(product: str, *phases: dict[str, Any], ambient: float = 25) -> dict[str, Any]:
    return {"ambient_celsius": ambient, "gpus": [{"product": product, "schedule": list(phases)}]}


def test_builtin_scenarios_have_two_different_cards() -> None:
    from gpuwear.cli import BUILTIN_SCENARIOS

    assert tuple(builtin_scenarios()) == BUILTIN_SCENARIOS == ("demo", "idle", "stress", "training")
    for name in builtin_scenarios():
        sim = load_scenario(name)
        assert len(sim.gpus) == 2 and sim.gpus[0].product != sim.gpus[1].product, name


def test_die_heats_with_a_first_order_time_constant() -> None:
    sim = parse_scenario(one_gpu("h100-sxm", {"kind": "stress", "seconds": 10_000}), "t")
    gpu = sim.gpus[0]
    start = gpu.state.die_celsius
    sim.advance_to(2000)
    steady, power = gpu.state.die_celsius, gpu.state.power_watts
    assert steady == pytest.approx(25 + power * gpu.product.r_th_best, abs=0.5)
    sim = parse_scenario(one_gpu("h100-sxm", {"kind": "stress", "seconds": 10_000}), "t")
    sim.advance_to(gpu.product.tau_die_seconds)
    risen = (sim.gpus[0].state.die_celsius - start) / (steady - start)
    assert risen == pytest.approx(1 - math.exp(-1), abs=0.05)  # 63 % after one time constant


def test_idle_card_cools_towards_ambient_and_reports_idle() -> None:
    sim = parse_scenario(one_gpu("rtx4090", {"kind": "stress", "seconds": 600}, {"kind": "idle", "seconds": 5000}),
                         "t")
    sim.advance_to(600)
    hot = sim.gpus[0].state.die_celsius
    sim.advance_to(1500)
    state = sim.gpus[0].state
    assert state.die_celsius < hot - 30 and state.die_celsius < 30
    assert state.reasons & REASON_GPU_IDLE and state.fan_ratio == pytest.approx(0.3)


def test_fan_follows_the_temperature() -> None:
    sim = parse_scenario(one_gpu("rtx4090", {"kind": "stress", "seconds": 5000}), "t")
    assert sim.gpus[0].state.fan_ratio == pytest.approx(0.3)
    sim.advance_to(600)
    assert sim.gpus[0].state.fan_ratio > 0.8


def test_hot_room_and_dusty_heatsink_throttle_near_the_limits() -> None:
    sim = load_scenario("stress")
    sim.advance_to(900)
    rtx = sim.gpus[0]
    assert rtx.state.reasons & REASON_SW_THERMAL
    assert rtx.state.clock_factor < 1.0
    assert rtx.product.gpu_max_celsius - 3 <= rtx.state.die_celsius < rtx.product.slowdown_celsius


def test_power_is_capped_at_the_limit() -> None:
    sim = parse_scenario(one_gpu("rtx4090", {"kind": "stress", "seconds": 5000}, ambient=10), "t")
    sim.advance_to(300)
    state = sim.gpus[0].state
    assert state.power_watts == 450.0 and state.reasons & REASON_SW_POWER_CAP


def test_training_has_evaluation_dips() -> None:
    sim = load_scenario("demo")
    gpu = sim.gpus[0]
    utils = {round(gpu.utilization_at(t), 2) for t in range(120, 1920, 10)}
    assert utils == {0.97, 0.3}


@pytest.mark.parametrize(("doc", "message"), [
    ([], "expected a mapping at the top level"),
    ({"gpus": []}, "gpus: expected a non-empty list"),
    ({"gpus": [{"product": "gtx480"}]}, "gpus[0].product: expected one of"),
    ({"gpus": [{"product": "v100", "schedule": [{"kind": "nap", "seconds": 1}]}]}, "schedule[0].kind"),
    ({"gpus": [{"product": "v100", "schedule": [{"kind": "idle", "seconds": -1}]}]}, "schedule[0].seconds"),
    ({"gpus": [{"product": "v100", "colour": "red"}]}, "gpus[0].colour: unknown key"),
    ({"gpus": [{"product": "v100"}], "faults": [{"kind": "meteor", "at": 1}]}, "faults[0]"),
    ({"gpus": [{"product": "v100"}], "faults": [{"kind": "lost", "at": 1, "gpu": 3}]}, "faults[0].gpu"),
])
def test_bad_scenarios_are_named(doc: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(doc, "bad")


def test_missing_scenario_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such file and not a built-in scenario"):
        load_scenario(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize(("doc", "problem"), [
    ({"gpus": [{"product": [1]}]}, "gpus[0].product: expected one of"),
    ({"driver": [1], "gpus": [{"product": "rtx4090"}]}, "driver: expected one of"),
    ({"gpus": [{"product": "rtx4090", 1: 2, "x": 3}]}, "gpus[0].1: unknown key"),
])
def test_values_of_the_wrong_type_are_scenario_errors(doc: dict[Any, Any], problem: str) -> None:
    """Before: a list where a name was expected raised TypeError (a traceback from `gpuwear run --simulate`)."""
    with pytest.raises(ScenarioError, match=re.escape(problem)):
        parse_scenario(doc, "t", 0)
