"""Faults and bad input the daemon survives: clock jumps, a long soak, hostile configs and paths."""

from __future__ import annotations

import gc
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_rig
from gpuwear.config import ConfigError, WearConfig, load_config
from gpuwear.jobs.resolve import JobWatcher, SimulatedJobs, job_from_cgroup
from gpuwear.tracker import WearTracker
from helpers import examples

PRODUCTS = ("rtx4090", "h100-sxm", "v100")


def eight_gpus() -> dict[str, Any]:
    schedule = [{"kind": "idle", "seconds": 3600}, {"kind": "train", "seconds": 14400, "job": "week-long"},
                {"kind": "stress", "seconds": 1800, "job": "burn"}, {"kind": "idle", "seconds": 600}]
    return {"gpus": [{"product": PRODUCTS[i % 3], "offset_seconds": 977 * i, "schedule": schedule}
                     for i in range(8)],
            "faults": [{"at": 86400 * d + 5000, "gpu": d % 8, "kind": "xid", "xid": 13} for d in range(7)]}


def test_clock_jumps_keep_integration_and_timestamps_ordered() -> None:
    rig = make_rig("demo")
    tracker = WearTracker({}, WearConfig())
    walls = []
    for t in range(1, 601):
        if t == 200:
            rig.clock.set_wall(rig.clock.wall() - 3600)  # set back an hour
        if t == 400:
            rig.clock.set_wall(rig.clock.wall() + 7200)  # then forward two
        snap = rig.run(1)
        tracker.observe(snap, rig.clock.monotonic(), rig.clock.wall())
        w = tracker.wear(snap.gpus[0].identity.uuid)
        assert w is not None and w.last_seen is not None
        walls.append(w.last_seen)
    # set back: the times recorded were ahead, last_seen comes back with the clock (never left in the future);
    # otherwise it only moves forward
    assert walls[:199] == sorted(walls[:199]) and walls[199:] == sorted(walls[199:]) and walls[199] < walls[198]
    w = tracker.wear(rig.sampler.snapshot.gpus[0].identity.uuid)
    assert w is not None and w.observed_seconds == pytest.approx(599)  # integrated on the monotonic clock
    assert w.gap_seconds == 0 and w.coverage() == pytest.approx(1.0, abs=0.01)  # the jumps are neither
    _, events, _ = tracker.take()
    assert [e.wall for e in events] == sorted(e.wall for e in events)


@pytest.mark.slow
def test_soak_a_simulated_week_on_eight_gpus_stays_flat() -> None:
    """Memory, threads and file descriptors stay flat over a simulated week (15-min ticks)."""
    rig = make_rig(eight_gpus(), slow_interval=900)
    rig.simulation.max_step_seconds = 30.0  # the thermal model integrates exactly; a week in seconds
    tracker = WearTracker({}, WearConfig(max_gap_seconds=3600))
    watcher = JobWatcher(SimulatedJobs(rig.simulation.jobs, lambda pid: None).resolve)  # type: ignore[arg-type,return-value]

    def day() -> None:
        for _ in range(96):
            snap = rig.run(900, interval=900)
            jobs = watcher.jobs((g.identity.uuid, [p for p, _ in g.sample.processes or ()])
                                for g in snap.gpus if g.sample is not None)
            tracker.observe(snap, rig.clock.monotonic(), rig.clock.wall(), jobs)
        tracker.take()  # what the daemon's persistence does every minute

    day()
    gc.collect()
    tracemalloc.start()
    threads, fds = set(threading.enumerate()), len(os.listdir("/proc/self/fd"))
    day()
    gc.collect()
    after_one, _ = tracemalloc.get_traced_memory()
    for _ in range(5):
        day()
    gc.collect()
    after_six, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert after_six - after_one < 512 * 1024, (after_one, after_six)  # flat: days 2 to 7 add < 0.5 MB
    # no thread started since day 1 is still running (other tests' threads that end meanwhile do not count)
    assert not set(threading.enumerate()) - threads and len(os.listdir("/proc/self/fd")) <= fds
    for status in rig.sampler.snapshot.gpus:
        w = tracker.wear(status.identity.uuid)
        assert w is not None and w.observed_seconds == pytest.approx(7 * 86400 - 900, rel=0.01)


def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
    lines.append("sampling: *i")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    tracemalloc.start()
    with pytest.raises(ConfigError) as info:
        load_config(bomb)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.monotonic() - start < 2 and peak < 20 * 2**20
    assert info.value.problems == [f"{bomb}: aliases expand to more than 100000 values (an alias bomb?)"]


def test_a_huge_config_file_is_refused(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    huge.write_text("# padding\n" * 200_000)
    with pytest.raises(ConfigError, match="larger than"):
        load_config(huge)


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=2000))
def test_cgroup_parser_never_fails_on_hostile_text(text: str) -> None:
    job = job_from_cgroup(text)
    if job is not None:
        assert len(job.id) <= 128 and "\n" not in job.id and job.id.isprintable()
