"""The production NVML backend and the sampler, over the fake library."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from conftest import Rig, make_rig
from gpuwear.backends.nvml import ALL_FIELDS, NvmlBackend, NvmlUnavailableError
from gpuwear.sample import GpuSample


def scenario(*faults: dict[str, Any], products: tuple[str, ...] = ("rtx4090", "h100-sxm"),
             unsupported: tuple[str, ...] = ()) -> dict[str, Any]:
    train = [{"kind": "train", "seconds": 3600}]
    gpus: list[dict[str, Any]] = [{"product": p, "schedule": train} for p in products]
    gpus[0]["unsupported"] = list(unsupported)
    return {"gpus": gpus, "faults": list(faults)}


def test_identity_and_system_info(demo: Rig) -> None:
    snap = demo.sampler.snapshot
    rtx, h100 = (g.identity for g in snap.gpus)
    assert (rtx.index, rtx.architecture, rtx.cuda_capability, rtx.fan_count) == (0, "ada", "8.9", 2)
    assert rtx.serial is None  # GeForce: NOT_SUPPORTED, so absent, not ""
    assert h100.uuid.startswith("GPU-") and h100.serial and h100.pci_bus_id == "00000000:37:00.0"
    assert h100.memory_total_bytes == 80 * 2**30 and h100.fan_count == 0
    assert snap.system is not None and snap.system.driver_version == "610.43.02"  # the newest driver profile
    assert snap.system.cuda_driver_version == "13.3" and snap.system.nvml_version == "13.610.43.02"


def test_datacenter_card_reports_every_field_but_fans_and_page_retirement(demo: Rig) -> None:
    sample = demo.run(5).gpus[1].sample
    assert sample is not None
    missing = {f for f in ALL_FIELDS if getattr(sample, f) is None}
    assert missing == {"fan_speed_ratio", "fan_speed_rpm", "retired_pages_single_bit",
                       "retired_pages_double_bit", "retired_pages_pending", "retired_pages_oldest_wall",
                       "retired_pages_newest_wall", "fabric_health_summary",  # the summary: Blackwell's fabric
                       "power_smoothing_life_percent"}  # Blackwell's too (field 258)
    assert sample.ecc_enabled is True and sample.remapped_rows_failure is False
    assert sample.threshold_slowdown_celsius == 89.0 and sample.threshold_memory_max_celsius == 95.0
    assert sample.power_limit_watts == 700.0


def test_consumer_card_unsupported_fields_are_none_logged_once_and_asked_again_on_the_slow_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuwear.backends.nvml")
    rig = make_rig("demo", slow_interval=2.0)
    rig.run(10)
    status = rig.sampler.snapshot.gpus[0]
    sample = status.sample
    assert sample is not None and status.last_success
    for name in ("temperature_memory_celsius", "ecc_enabled", "ecc_corrected_volatile", "mig_enabled",
                 "remapped_rows_pending", "retired_pages_pending", "violation_power_seconds",
                 "threshold_memory_max_celsius"):
        assert getattr(sample, name) is None, name
    assert status.unavailable["ecc_mode"] == "not_supported"
    assert status.unavailable["temperature_memory_celsius"] == "not_supported"
    assert sample.fan_speed_ratio is not None and len(sample.fan_speed_ratio) == 2
    assert sample.fan_speed_rpm is not None and all(r and r > 0 for r in sample.fan_speed_rpm)
    ecc_lines = [r for r in caplog.records if "GPU 0" in r.getMessage() and "ecc_mode (not_supported)" in r.message]
    assert len(ecc_lines) == 1  # logged when it became unavailable, not at each probe, with the others of that read
    # one start-up line per GPU says all it does not support (before: a line per field, 14 at each start)
    lines = [r.getMessage().split(" (")[0] for r in caplog.records if "): unavailable:" in r.getMessage()]
    assert sorted(lines) == ["GPU 0", "GPU 1"], lines
    # Ten ticks with a 2 s slow interval: five slow reads. What is unsupported is asked again on each slow read
    # only (a MIG toggle changes what is supported), never on the fast ones: ECC mode 5 times per GPU, the
    # RTX's violation counters (a fast reading) 5 times per policy against the H100's 10.
    assert rig.library.calls["nvmlDeviceGetEccMode"] == 5 + 5
    assert rig.library.calls["nvmlDeviceGetViolationStatus"] == 2 * 10 + 2 * 5


def test_slow_values_are_polled_less_and_carried_between_reads(demo: Rig) -> None:
    demo.run(1)  # the first tick reads everything
    before = demo.library.calls["nvmlDeviceGetTemperatureThreshold"]
    assert before == 2 * 4  # four thresholds per GPU (the RTX answers NOT_SUPPORTED for one)
    demo.run(29)  # the slow interval is 30 s: no new threshold reads
    assert demo.library.calls["nvmlDeviceGetTemperatureThreshold"] == before
    sample = demo.sampler.snapshot.gpus[1].sample
    assert sample is not None and sample.threshold_shutdown_celsius == 92.0
    demo.run(1)
    assert demo.library.calls["nvmlDeviceGetTemperatureThreshold"] > before


def test_field_values_are_batched(demo: Rig) -> None:
    before = demo.library.calls.copy()
    demo.run(1)
    calls = demo.library.calls - before
    assert calls["nvmlDeviceGetFieldValues"] == 2  # memory temperature and energy, one call per GPU
    assert calls["nvmlDeviceGetTotalEnergyConsumption"] == 0


def test_lost_gpu_is_down_and_the_other_keeps_reporting(caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(scenario({"at": 30, "gpu": 0, "kind": "lost"}, {"at": 60, "gpu": 0, "kind": "recover"}))
    rig.run(20)
    snap = rig.run(20)
    rtx, h100 = snap.gpus
    assert not rtx.up and rtx.sample is None and not rtx.last_success
    assert rtx.errors["gpu_lost"] == 11  # ticks at t = 30 .. 40
    assert h100.up and h100.last_success and h100.sample is not None
    assert h100.sample.timestamp == rig.clock.wall()
    assert sum("is lost" in r.getMessage() for r in caplog.records) == 1  # logged on the transition only
    snap = rig.run(30)
    assert snap.gpus[0].up and snap.gpus[0].sample is not None


def test_xid_events_are_counted_per_code() -> None:
    rig = make_rig(scenario({"at": 5, "gpu": 1, "kind": "xid", "xid": 48},
                            {"at": 6, "gpu": 1, "kind": "xid", "xid": 48},
                            {"at": 7, "gpu": 0, "kind": "xid", "xid": 13}))
    rig.sampler.start_events(wait_ms=20)
    try:
        rig.run(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            gpus = rig.sampler.snapshot.gpus
            if gpus[1].xids.get(48) == 2 and gpus[0].xids.get(13) == 1:
                break
            time.sleep(0.02)
        assert dict(rig.sampler.snapshot.gpus[1].xids) == {48: 2}
        assert dict(rig.sampler.snapshot.gpus[0].xids) == {13: 1}
    finally:
        rig.backend.close()


def test_out_of_range_readings_are_dropped_and_counted() -> None:
    rig = make_rig(scenario({"at": 9.5, "gpu": 0, "kind": "garbage", "field": "temperature", "value": 82505},
                            {"at": 9.5, "gpu": 0, "kind": "garbage", "field": "power", "value": -5}))
    rig.run(9)
    snap = rig.run(1)
    sample = snap.gpus[0].sample
    assert sample is not None
    assert sample.temperature_gpu_celsius is None and sample.power_watts is None
    assert dict(snap.gpus[0].dropped) == {"temperature_gpu_celsius": 1, "power_watts": 1}
    assert sample.clock_sm_hz is not None  # the rest of the sample is kept
    sample = rig.run(1).gpus[0].sample
    assert sample is not None and sample.temperature_gpu_celsius is not None


def test_a_die_reading_above_the_shutdown_threshold_is_dropped_and_counted() -> None:
    """The same rule as imports (docs/wear-model.md §1): the card powers off before its die gets there."""
    rig = make_rig(scenario({"at": 9.5, "gpu": 0, "kind": "garbage", "field": "temperature", "value": 140}))
    rig.run(9)
    snap = rig.run(1)
    sample = snap.gpus[0].sample
    assert sample is not None and sample.temperature_gpu_celsius is None
    assert sample.threshold_shutdown_celsius is not None and sample.threshold_shutdown_celsius < 135
    assert dict(snap.gpus[0].dropped) == {"temperature_gpu_celsius": 1}
    sample = rig.run(1).gpus[0].sample
    assert sample is not None and sample.temperature_gpu_celsius is not None


def test_thresholds_the_threshold_calls_do_not_give_come_from_the_margin_and_the_tlimit_fields() -> None:
    """nvml.h: nvmlDeviceGetTemperatureThreshold is "no longer the preferred interface" for the shutdown, slowdown
    and maximum operating temperatures on Ada and later, and is to lose them; nvidia-smi shows an H100's on the
    T.Limit scale (its margin, slowdown -2, shutdown -5). An H100 whose threshold calls answer NOT_SUPPORTED gets
    them from nvmlDeviceGetMarginTemperature (R570+) and the *_TLIMIT fields, equal to its product's; its margin is
    its maximum operating temperature less its die's reading. An A100 (no T.Limit scale) and an H100 on R550 (no
    margin function) get none: they are not guessed."""
    from gpuwear.sim.simulated import PRODUCTS

    run = [{"kind": "train", "seconds": 3600, "utilization": 0.9}]
    for driver, product, derived in (("r610", "h100-sxm", True), ("r610", "a100-sxm", False),
                                     ("r550", "h100-sxm", False)):
        rig = make_rig({"driver": driver, "gpus": [{"product": product, "schedule": run,
                                                    "unsupported": ["thresholds"]},
                                                   {"product": product, "schedule": run}]}, slow_interval=30)
        snap = rig.run(31)
        without, native = (g.sample for g in snap.gpus)
        assert without is not None and native is not None
        p = PRODUCTS[product]
        if derived:
            assert (without.threshold_shutdown_celsius, without.threshold_slowdown_celsius,
                    without.threshold_gpu_max_celsius) == (p.shutdown_celsius, p.slowdown_celsius, p.gpu_max_celsius)
            assert without.threshold_memory_max_celsius is None  # no T.Limit field is read for it
            assert native.temperature_margin_celsius is not None
        else:
            assert without.threshold_slowdown_celsius is None and without.threshold_gpu_max_celsius is None
            assert native.temperature_margin_celsius is None
        assert (native.threshold_slowdown_celsius, native.threshold_gpu_max_celsius) == (p.slowdown_celsius,
                                                                                         p.gpu_max_celsius)
    rig = make_rig({"gpus": [{"product": "h100-sxm", "schedule": run}]}, slow_interval=1)
    for _ in range(20):  # read on the same (slow) pass as the die: the margin is measured from that reading
        s = rig.run(1).gpus[0].sample
        assert s is not None and s.temperature_gpu_celsius is not None and s.temperature_margin_celsius is not None
        assert s.temperature_gpu_celsius + s.temperature_margin_celsius == PRODUCTS["h100-sxm"].gpu_max_celsius


def test_field_turning_unsupported_mid_run() -> None:
    rig = make_rig(scenario({"at": 5, "gpu": 1, "kind": "not_supported", "field": "power"}))
    assert (s := rig.run(3).gpus[1].sample) is not None and s.power_watts is not None
    snap = rig.run(5)
    assert (s := snap.gpus[1].sample) is not None and s.power_watts is None
    assert snap.gpus[1].last_success  # NOT_SUPPORTED is not an error


def test_energy_counter_reset_is_continued() -> None:
    rig = make_rig(scenario({"at": 100.5, "gpu": 1, "kind": "driver_reload"}))
    before = rig.run(100).gpus[1].energy_joules_total
    assert before is not None and before > 50_000
    after = rig.run(10).gpus[1]
    assert after.sample is not None and after.sample.energy_joules is not None
    assert after.sample.energy_joules < 10 * 700  # the raw counter restarted
    assert after.energy_joules_total is not None and after.energy_joules_total > before


def test_hung_call_delays_one_read_only() -> None:
    rig = make_rig(scenario({"at": 2.5, "gpu": 0, "kind": "hang", "seconds": 0.3}))
    rig.sampler.timer = time.perf_counter
    rig.run(2)
    start = time.perf_counter()
    snap = rig.run(1)
    assert time.perf_counter() - start >= 0.3
    assert snap.gpus[0].last_duration_seconds >= 0.3
    assert snap.gpus[1].last_duration_seconds < 0.3 and snap.gpus[1].sample is not None


def test_pre_ampere_card_reports_retired_pages() -> None:
    rig = make_rig(scenario({"at": 5, "gpu": 0, "kind": "retire_pages", "double_bit": 2, "pending": True},
                            {"at": 5, "gpu": 0, "kind": "ecc", "uncorrected": 2, "corrected": 7},
                            products=("v100",)), slow_interval=1.0)
    sample = rig.run(10).gpus[0].sample
    assert sample is not None
    assert (sample.retired_pages_double_bit, sample.retired_pages_single_bit, sample.retired_pages_pending) == (
        2, 0, True)
    assert (sample.ecc_uncorrected_aggregate, sample.ecc_corrected_volatile) == (2, 7)
    assert sample.remapped_rows_pending is None


def test_row_remap_failure_is_reported() -> None:
    rig = make_rig(scenario({"at": 5, "gpu": 0, "kind": "remap_rows", "uncorrected": 3, "failure": True},
                            products=("h100-sxm",)), slow_interval=1.0)
    sample = rig.run(10).gpus[0].sample
    assert sample is not None
    assert (sample.remapped_rows_uncorrected, sample.remapped_rows_failure) == (3, True)


def test_the_row_remappers_histogram_moves_a_bank_per_remap_as_a_real_a100s_does() -> None:
    """Issue 55, item 6: nvmlDeviceGetRowRemapperHistogram, through the real pynvml binding over the fake: a
    never-remapped H100 has its 2560 banks at max; one remap moves a bank to high (a real A100's nvidia-smi -q after
    its first correctable remap: 639 max, 1 high), and the sample keeps the banks at low and none; a card that
    remaps no rows (the V100) answers NOT_SUPPORTED."""
    import pynvml

    rig = make_rig(scenario({"at": 5, "gpu": 0, "kind": "remap_rows", "corrected": 1},
                            products=("h100-sxm", "v100")), slow_interval=1.0)
    rig.run(2)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = pynvml.nvmlDeviceGetRowRemapperHistogram(h)
    assert (before.max, before.high, before.partial, before.low, before.none) == (2560, 0, 0, 0, 0)
    snap = rig.run(10)
    after = pynvml.nvmlDeviceGetRowRemapperHistogram(h)
    assert (after.max, after.high, after.partial, after.low, after.none) == (2559, 1, 0, 0, 0)
    sample = snap.gpus[0].sample
    assert sample is not None and (sample.remap_banks_low, sample.remap_banks_none) == (0, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRowRemapperHistogram(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert snap.gpus[1].unavailable.get("remap_histogram") == "not_supported"


def test_missing_nvml_library_is_a_clear_error() -> None:
    with pytest.raises(NvmlUnavailableError, match=r"install the NVIDIA driver.*--simulate"):
        NvmlBackend("/nonexistent/libnvidia-ml.so.1").open()


def test_all_fields_are_sample_fields() -> None:
    names = set(GpuSample.__dataclass_fields__)
    assert set(ALL_FIELDS) <= names
    from gpuwear.backends.aer import FILES

    assert names - set(ALL_FIELDS) == {"timestamp", "monotonic", *(field for field, _, _ in FILES)}  # AER: sysfs


@pytest.mark.slow
def test_a_hung_gpu_is_stalled_past_the_deadline_and_the_others_keep_reporting(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(scenario({"at": 2.5, "gpu": 0, "kind": "hang", "seconds": 1.5}))
    rig.sampler.deadline = 0.3
    rig.sampler.timer = time.perf_counter
    rig.run(2)
    start = time.perf_counter()
    snap = rig.run(1)
    assert time.perf_counter() - start < 0.6  # the tick did not wait for the hung call
    rtx, h100 = snap.gpus
    assert rtx.sample is None and not rtx.last_success and rtx.errors["stalled"] == 1 and rtx.up
    assert h100.sample is not None and h100.last_success
    snap = rig.run(1)  # still hung: skipped, not asked again
    assert snap.gpus[0].errors["stalled"] == 2 and snap.gpus[1].sample is not None
    time.sleep(1.3)  # the hung call returns
    snap = rig.run(1)
    assert snap.gpus[0].sample is not None and snap.gpus[0].last_success
    assert sum("stalled past" in r.getMessage() for r in caplog.records) == 1
    assert sum("answers again" in r.getMessage() for r in caplog.records) == 1
    rig.sampler.close()


@pytest.mark.slow
def test_a_hung_gpu_between_others_costs_one_reader_thread_until_its_call_returns() -> None:
    """The GPUs are read one after the other on one reader thread: a hang in the middle hands the GPUs after it
    to a new reader (on time), and the stuck thread leaves once its call returns."""
    import threading

    earlier = set(threading.enumerate())  # other tests' readers may still be leaving: not counted

    def readers() -> int:
        return sum(t.name == "nvml-read" and t.is_alive() and t not in earlier for t in threading.enumerate())

    def settles_at(count: int) -> bool:  # a thread that was told to leave takes a moment to end
        deadline = time.monotonic() + 2.0
        while readers() != count and time.monotonic() < deadline:
            time.sleep(0.01)
        return readers() == count

    rig = make_rig(scenario({"at": 2.5, "gpu": 1, "kind": "hang", "seconds": 1.0},
                            products=("rtx4090", "h100-sxm", "v100")))
    rig.sampler.deadline = 0.3
    rig.run(2)
    assert readers() == 1
    start = time.perf_counter()
    snap = rig.run(1)
    assert time.perf_counter() - start < 0.6
    assert [g.sample is not None for g in snap.gpus] == [True, False, True]
    assert snap.gpus[1].errors["stalled"] == 1 and snap.gpus[2].last_success
    assert readers() == 2  # the stuck one and its successor
    time.sleep(1.0)
    snap = rig.run(1)
    assert all(g.sample is not None and g.last_success for g in snap.gpus)
    assert settles_at(1)  # the stuck one left once its call returned
    rig.sampler.close()
    assert settles_at(0)


def test_a_read_that_raises_a_bug_reaches_the_caller() -> None:
    """Only lost-GPU and driver errors are GPU faults; anything else a read raises is a bug and is raised by tick()
    (the reader thread survives it), after the GPUs read before it were applied."""
    rig = make_rig(scenario(products=("rtx4090", "h100-sxm")))
    rig.sampler.deadline = 0.3
    rig.run(1)
    real = rig.sampler.backend.read

    def broken(index: int, slow: bool) -> Any:
        if index == 1:
            raise ZeroDivisionError("bug")
        return real(index, slow)

    rig.sampler.backend.read = broken  # type: ignore[method-assign]
    with pytest.raises(ZeroDivisionError):
        rig.run(1)
    rig.sampler.backend.read = real  # type: ignore[method-assign]
    snap = rig.run(1)
    assert all(g.sample is not None for g in snap.gpus)
    rig.sampler.close()


def test_driver_reload_reacquires_the_gpus_and_the_energy_reset_is_handled(
        caplog: pytest.LogCaptureFixture) -> None:
    from gpuwear.config import WearConfig
    from gpuwear.tracker import WearTracker

    rig = make_rig(scenario({"at": 20.5, "kind": "driver_unload"}, {"at": 29.5, "kind": "driver_load"}))
    rig.sampler.reopen_interval = 0.0
    tracker = WearTracker({}, WearConfig())
    energy_before = None
    for t in range(1, 41):
        snap = rig.run(1)
        tracker.observe(snap, rig.clock.monotonic(), rig.clock.wall())
        if t == 20:
            energy_before = [g.energy_joules_total for g in snap.gpus]
        if 21 <= t <= 29:
            assert all(g.sample is None and g.errors["driver_gone"] for g in snap.gpus), t
    assert all(g.sample is not None and g.last_success for g in snap.gpus)
    assert energy_before is not None
    for before, g in zip(energy_before, snap.gpus, strict=True):
        assert g.sample is not None and g.sample.energy_joules is not None
        assert g.sample.energy_joules < 15 * 700  # the driver's counter restarted
        assert before is not None and g.energy_joules_total is not None and g.energy_joules_total > before
        w = tracker.wear(g.identity.uuid)
        assert w is not None and w.observed_seconds == pytest.approx(39 - 9, abs=1)
    assert sum("lost the driver" in r.getMessage() for r in caplog.records) == 1
    assert sum("NVML is back" in r.getMessage() for r in caplog.records) == 1


def test_nvml_absent_at_start_and_indices_reshuffled_between_restarts() -> None:
    """History follows the UUID: a GPU at another index after a restart keeps its ledger entry."""
    from gpuwear.config import WearConfig
    from gpuwear.tracker import WearTracker

    first = make_rig(scenario(products=("rtx4090", "h100-sxm")))
    tracker = WearTracker({}, WearConfig())
    for _ in range(30):
        tracker.observe(first.run(1), first.clock.monotonic(), first.clock.wall())
    wears, _, _ = tracker.take()
    by_uuid = {w["uuid"]: w for w in wears}
    swapped = make_rig(scenario(products=("h100-sxm", "rtx4090")))
    for sim_gpu, old in zip(swapped.simulation.gpus, reversed(first.simulation.gpus), strict=True):
        sim_gpu.uuid = old.uuid  # the same cards, in the other slots
    swapped.sampler.open()
    from gpuwear.wear.accumulate import GpuWear
    again = WearTracker({u: GpuWear.from_json(w, 2.0) for u, w in by_uuid.items()}, WearConfig())
    for _ in range(30):
        again.observe(swapped.run(1), swapped.clock.monotonic(), swapped.clock.wall())
    for status in swapped.sampler.snapshot.gpus:
        w = again.wear(status.identity.uuid)
        assert w is not None and w.observed_seconds >= by_uuid[status.identity.uuid]["observed_seconds"] + 29
        assert w.name == status.identity.name
    assert swapped.sampler.snapshot.gpus[0].identity.name == "NVIDIA H100 80GB HBM3"


@pytest.mark.slow
def test_start_waits_for_the_driver_when_configured(caplog: pytest.LogCaptureFixture) -> None:
    from gpuwear.clock import SystemClock
    from gpuwear.config import Config, SamplingConfig
    from gpuwear.service import open_source
    from gpuwear.sim.fakenvml import FakeNvmlLibrary
    from gpuwear.sim.simulated import parse_scenario

    doc = scenario({"at": 0, "kind": "driver_unload"}, {"at": 1.5, "kind": "driver_load"})
    late = FakeNvmlLibrary(parse_scenario(doc, "late"), SystemClock())
    with pytest.raises(NvmlUnavailableError, match="Driver Not Loaded"):
        open_source(Config(), None, 1.0, False, library=late)  # no wait configured: a clear error at once
    late = FakeNvmlLibrary(parse_scenario(doc, "late"), SystemClock())
    config = Config(sampling=SamplingConfig(driver_wait_seconds=10))
    start = time.monotonic()
    source = open_source(config, None, 1.0, False, library=late)
    assert 1.5 <= time.monotonic() - start < 6
    assert len(source.sampler.snapshot.gpus) == 2 and source.info.backend == "nvml"
    assert "NVML not available yet" in caplog.text
    source.sampler.close()
