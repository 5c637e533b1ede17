"""gpuwear over every driver profile and device kind of the fake NVML library, and the NVML faults real drivers
give: the production code must sample every GPU, raise no alert for what is merely unsupported or unprivileged,
find every process, and say so when a GPU yields nothing."""

from __future__ import annotations

import ctypes
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from conftest import REPO, make_rig
from gpuwear.backends.nvml import NvmlBackend, NvmlVersionMismatchError, ProcessInfoCc
from gpuwear.cli import main
from gpuwear.clock import ManualClock
from gpuwear.config import Config, SamplingConfig, WearConfig
from gpuwear.metrics import DaemonInfo
from gpuwear.service import Daemon, Source, _open_waiting, _sampler
from gpuwear.sim import nvml_symbols
from gpuwear.sim.drivers import NEWEST, PROFILES
from gpuwear.sim.fakenvml import FakeNvmlLibrary
from gpuwear.sim.simulated import PRODUCTS, ScenarioError, parse_scenario, synthetic_pid
from helpers import free_port

# Device kinds as real cards behave; (product, MIG enabled, privileged client). R470 cannot drive an Ada card.
KINDS: dict[str, tuple[str, bool, bool]] = {
    "geforce": ("rtx4090", False, False),
    "datacenter": ("h100-sxm", False, False),
    "mig-unprivileged": ("a100-sxm", True, False),
    "mig-root": ("a100-sxm", True, True),
    "jetson": ("jetson-orin", False, False),
    "gh200": ("gh200", False, False),
    "wsl2": ("rtx4090", False, False),
    "vgpu-guest": ("a100-sxm", False, False),  # a VM's vGPU of an A100 (scenario vgpu)
}
VGPU = "NVIDIA A100-40C"  # a vGPU type's name, as NVIDIA's driver tables give them
OLD_CARDS = {"rtx4090": "gtx1080ti", "h100-sxm": "v100"}  # what an R470 box has instead
# WSL2: the library says the Windows driver's version; the two pairings seen in public reports (the 535.54 library
# as 536.25: the process-layout issue; 550.90 as 552.55: microsoft/WSL #11277)
WINDOWS_DRIVERS = {"r535.54": "536.25", "r550": "552.55"}


def product_for(kind: str, driver: str) -> str:
    product = KINDS[kind][0]
    branch = nvml_symbols.BRANCHES.index(PROFILES[driver].branch)
    if branch < nvml_symbols.BRANCHES.index(PRODUCTS[product].min_branch):
        return OLD_CARDS.get(product, "")
    return product


MATRIX = [pytest.param(driver, kind, id=f"{driver}-{kind}") for driver in PROFILES for kind in KINDS
          if product_for(kind, driver) and (kind != "wsl2" or driver in WINDOWS_DRIVERS)]


def scenario_doc(driver: str, kind: str, faults: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    _, mig, privileged = KINDS[kind]
    train = [{"kind": "train", "seconds": 3600, "utilization": 0.9, "job": "matrix-job"}]
    windows = {"windows_driver": WINDOWS_DRIVERS[driver]} if kind == "wsl2" else {}
    return {"driver": driver, "privileged": privileged, "faults": faults or [], **windows,
            "gpus": [{"product": product_for(kind, driver), "mig": mig, "schedule": train,
                      **({"mig_devices": ["3g.40gb", "4g.40gb"]} if mig else {}),
                      **({"vgpu": VGPU} if kind == "vgpu-guest" else {})},
                     {"product": "v100" if driver == "r470" else "h100-sxm", "schedule": train}]}


@contextmanager
def daemon_over(doc: dict[str, Any], state_dir: Path, slow_interval: float = 10.0, seed: int = 1,
                start: float = 0.0) -> Iterator[tuple[Daemon, ManualClock]]:
    """The daemon in-process over a scenario on a manual clock: ticks are driven by the test (``Daemon._tick``),
    scrapes read ``daemon.exposition``, health ``daemon.health_problem``. ``seed``: another seed, other cards (UUIDs)
    in the same slots; ``start``: seconds the clock is moved on before it starts."""
    simulation = parse_scenario(doc, "matrix", seed)
    clock = ManualClock()
    clock.advance(start)
    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(state_dir))
    backend = NvmlBackend(FakeNvmlLibrary(simulation, clock))
    sampler = _sampler(backend, clock, config)
    sampler.slow_interval = slow_interval
    sampler.open()
    daemon = Daemon(config, Source(sampler, clock, DaemonInfo("test", "3", "simulated", "matrix"), 1.0, simulation))
    try:
        yield daemon, clock
    finally:
        daemon.stop()


def run(daemon: Daemon, clock: ManualClock, seconds: int) -> None:
    for _ in range(seconds):
        clock.advance(1.0)
        daemon._tick()


def series(body: str, name: str, gpu: str) -> list[float]:
    return [float(v) for v in re.findall(rf'^{name}\{{[^}}]*gpu="{gpu}"[^}}]*\}} (\S+)$', body, re.M)]


@pytest.mark.parametrize(("driver", "kind"), MATRIX)
def test_the_daemon_samples_every_profile_and_device_kind(driver: str, kind: str, tmp_path: Path) -> None:
    with daemon_over(scenario_doc(driver, kind), tmp_path) as (daemon, clock):
        run(daemon, clock, 25)
        gpu = daemon.source.sampler.snapshot.gpus[0]
        body = daemon.exposition.render(False).decode()
        other = daemon.source.sampler.snapshot.gpus[1]
        assert other.last_success and other.sample is not None  # the card beside it is never hidden
        if kind == "jetson":  # NVML answers its name and nothing else: said so, never "ok"
            assert gpu.readings == 0 and not gpu.last_success
            assert set(gpu.unavailable.values()) == {"not_supported"}
            assert series(body, "gpuwear_sample_success", "0") == [0.0]
            problem = daemon.health_problem()
            assert problem is not None and "GPU 0" in problem and "yields no readings" in problem
            return
        sample = gpu.sample
        assert sample is not None and gpu.last_success, (gpu.errors, gpu.unavailable)
        assert not gpu.errors, gpu.errors
        assert sample.temperature_gpu_celsius is not None and sample.power_watts is not None
        assert sample.clock_event_reasons is not None
        assert series(body, "gpuwear_sample_success", "0") == [1.0]  # the sampling alert's input: not firing
        assert not series(body, "gpuwear_sample_errors_total", "0")
        assert daemon.health_problem() is None
        assert set(gpu.unavailable.values()) <= {"not_supported", "no_permission", "function_not_found",
                                                 "unknown_field", "module_scope"}
        pid = synthetic_pid("matrix-job")
        if kind == "mig-unprivileged":  # the GPU's own list needs root; each MIG device answers its own (nvml.h)
            assert "processes" not in gpu.unavailable, gpu.unavailable
            assert sample.utilization_gpu_ratio is None and gpu.unavailable["utilization"] == "not_supported"
            assert 'reason="not_supported"' not in body  # what every board has: with metrics.detail only
        assert sample.processes is not None and [p for p, _ in sample.processes] == [pid]
        if kind.startswith("mig-"):  # the MIG devices, and the one the process runs on (the first: GPU instance 2)
            assert sample.mig_devices is not None and [d[:2] for d in sample.mig_devices] == [(2, 0), (1, 0)]
            assert all(uuid.startswith("MIG-") for _, _, uuid in sample.mig_devices)
            assert sample.process_instances == ((pid, 2, 0),)
        else:
            assert sample.process_instances == ()
        view = daemon.tracker.views[gpu.identity.uuid]
        assert "matrix-job" in str(view), "job attribution found no job"
        if PROFILES[driver].exports("nvmlDeviceGetMemoryInfo_v2"):  # MIG unprivileged: its MIG devices' summed
            assert sample.memory_used_bytes is not None
        if kind == "vgpu-guest":  # read as a physical GPU but for what nvml.h says a vGPU guest does not give
            assert gpu.identity.name == VGPU and sample.temperature_gpu_celsius is not None
        if kind == "wsl2":  # the Windows driver's version, as WSL2's library says it; every reading still read
            system = daemon.source.sampler.snapshot.system
            assert system is not None and system.driver_version == WINDOWS_DRIVERS[driver]


def _no_mig_devices(doc: dict[str, Any]) -> dict[str, Any]:
    """The scenario with MIG on but no MIG device made on its first GPU: nothing answers its processes unprivileged."""
    doc["gpus"][0].pop("mig_devices", None)
    return doc


@pytest.mark.parametrize("privileged", [True, False], ids=["root", "unprivileged"])
def test_mig_jobs_are_charged_for_their_slices_and_the_rest_is_idle(privileged: bool, tmp_path: Path) -> None:
    """Issue 54, item 4: on MIG a job was booked the whole card's wear (shared equally by the GPU's jobs): one job
    on a 1g device of an idle A100 took 100 %, a 1g job beside a 4g job half. Each job now holds its MIG devices'
    compute slices (nvmlDeviceGetAttributes_v2), the slices no job holds go to the GPU's idle line, and the lines
    still add up to the card: a 1g and a 4g job are charged 1/7 and 4/7, idle 2/7; the H100 beside it, without
    MIG, books its job whole. Root reads the GPU's process list, an unprivileged daemon each MIG device's."""
    train = {"kind": "train", "seconds": 3600, "utilization": 0.9}
    doc = {"driver": "r550", "privileged": privileged, "faults": [],
           "gpus": [{"product": "a100-sxm", "mig": True, "mig_devices": ["1g.10gb", "4g.40gb"],
                     "schedule": [{**train, "job": ["small-job", "large-job"]}]},  # first on 1g, second on 4g
                    {"product": "h100-sxm", "schedule": [{**train, "job": "whole-job"}]}]}
    with daemon_over(doc, tmp_path) as (daemon, clock):
        run(daemon, clock, 60)
        a100, h100 = (g.identity.uuid for g in daemon.source.sampler.snapshot.gpus)
        sample = daemon.source.sampler.snapshot.gpus[0].sample
        assert sample is not None and sample.mig_slice_count == 7 and sorted(n for _, n in sample.mig_slices or ()) \
            == [1, 4]
        card = daemon.tracker.wear(a100)
        assert card is not None and card.observed_seconds > 50
        jobs = {rec.id: rec.gpus for rec in daemon.tracker.jobs.active.values()}
        idle = daemon.tracker.jobs.lines[a100].gpus[a100].wear
        for name, part in (("small-job", 1 / 7), ("large-job", 4 / 7)):
            wear = jobs[name][a100].wear
            assert wear.observed_seconds == pytest.approx(part * card.observed_seconds)
            assert wear.energy_joules == pytest.approx(part * card.energy_joules)
        assert idle.observed_seconds == pytest.approx(2 / 7 * card.observed_seconds)
        assert card.kinds["job"]["seconds"] == pytest.approx(5 / 7 * card.observed_seconds)
        assert card.kinds["idle"]["seconds"] == pytest.approx(2 / 7 * card.observed_seconds)
        whole = daemon.tracker.wear(h100)
        assert whole is not None and h100 not in daemon.tracker.jobs.lines
        assert jobs["whole-job"][h100].wear.observed_seconds == pytest.approx(whole.observed_seconds)


def test_time_on_a_gpu_whose_processes_cannot_be_read_is_unattributed_never_idle(tmp_path: Path) -> None:
    """MIG on and the daemon not root (the shipped unit): NVML answers NO_PERMISSION for the GPU's processes (and
    here no MIG device answers its own: none was made), and the A100 trained while its time went to its idle line.
    Now it goes to an unattributed line that says why; the H100 beside it, whose processes are read, books the
    job."""
    with daemon_over(_no_mig_devices(scenario_doc("r550", "mig-unprivileged")), tmp_path) as (daemon, clock):
        run(daemon, clock, 30)
        mig, whole = (g.identity.uuid for g in daemon.source.sampler.snapshot.gpus)
        assert daemon.source.sampler.snapshot.gpus[0].unavailable.get("processes") == "no_permission"
        wear, beside = daemon.tracker.wear(mig), daemon.tracker.wear(whole)
        assert wear is not None and beside is not None
        assert set(wear.kinds) == {"unattributed"}  # neither idle nor a job
        assert wear.kinds["unattributed"]["seconds"] == pytest.approx(wear.observed_seconds) and wear.observed_seconds
        assert set(beside.kinds) == {"job"}
        body = daemon.exposition.render(False).decode()
        shown = [line for line in body.splitlines() if line.startswith("gpuwear_lifetime_attributed_seconds_total{")
                 and 'gpu="0"' in line]
        assert len(shown) == 1 and 'kind="unattributed"' in shown[0] and float(shown[0].split()[-1]) > 0, shown
        daemon.persist(final=True)
        records = daemon.ledger.jobs() if daemon.ledger is not None else []
    lines = [r for r in records if mig in {g["uuid"] for g in r["gpus"]}]
    assert [r["kind"] for r in lines] == ["unattributed"], lines
    assert "no permission" in lines[0]["name"]
    assert main(["jobs", "--simulated", "matrix", "--state-dir", str(tmp_path)]) == 0


def test_a_struct_version_the_library_refuses_falls_back_to_the_older_call(tmp_path: Path) -> None:
    """A libnvidia-ml built against another nvml.h than the binding answers NVML_ERROR_ARGUMENT_VERSION_MISMATCH for
    a versioned struct (go-nvml #138). Every tick counted a sampling error and the die temperature and memory were
    lost, though nvmlDeviceGetTemperature and nvmlDeviceGetMemoryInfo answer; the fan's RPM has no older call: it
    is unavailable, with that reason, and not asked again."""
    doc = scenario_doc("r610", "geforce")
    doc["struct_versions"] = {"memory": 3, "temperature": 2, "fan_speed_info": 2}
    with daemon_over(doc, tmp_path) as (daemon, clock):
        run(daemon, clock, 25)
        gpu = daemon.source.sampler.snapshot.gpus[0]
        assert gpu.sample is not None
        assert gpu.sample.temperature_gpu_celsius is not None and gpu.sample.memory_used_bytes is not None
        assert not gpu.errors, gpu.errors
        assert gpu.unavailable.get("fan_speed_rpm") == "version_mismatch"
        assert "temperature" not in gpu.unavailable and "memory_used" not in gpu.unavailable
        backend = daemon.source.sampler.backend
        assert isinstance(backend, NvmlBackend) and backend.api is not None
        # (bindings before nvmlDeviceGetTemperatureV, nvidia-ml-py 11.515 among them, ask the old call only)
        assert backend.api.refused == {"memory_v2", *(("temperature_v",) if backend.api.temperature_v else ())}
        body = daemon.exposition.render(False).decode()
        assert not series(body, "gpuwear_sample_errors_total", "0")


def test_a_gpu_refused_at_start_joins_once_it_answers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A GPU whose handle NVML refuses at start (lost: GPU_IS_LOST; a cgroup: NO_PERMISSION) was left out until the
    daemon restarted. It is asked again every slow interval and joins, its history under its UUID, after the GPUs
    already read; its refusal is logged once, not at every try."""
    doc = scenario_doc("r610", "datacenter")
    doc["faults"] = [{"at": 40, "gpu": 1, "kind": "recover"}]
    simulation = parse_scenario(doc, "join")
    simulation.gpus[1].state.lost = True  # fallen off the bus before gpuwear started
    clock = ManualClock()
    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path))
    sampler = _sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.slow_interval = 10.0
    sampler.open()
    daemon = Daemon(config, Source(sampler, clock, DaemonInfo("test", "3", "simulated", "join"), 1.0, simulation))
    try:
        with caplog.at_level("ERROR", logger="gpuwear.backends.nvml"):
            run(daemon, clock, 35)
        assert [g.identity.index for g in sampler.snapshot.gpus] == [0]
        assert len([r for r in caplog.records if "GPU 1 cannot be opened" in r.getMessage()]) == 1
        run(daemon, clock, 25)  # recovered at 40 s, asked again at the next slow interval
        gpus = sampler.snapshot.gpus
        assert [(g.identity.index, g.sample is not None) for g in gpus] == [(0, True), (1, True)]
        assert gpus[1].identity.uuid.endswith("000000000001")
        body = daemon.exposition.render(False).decode()
        assert series(body, "gpuwear_temperature_celsius", "1")
    finally:
        daemon.stop()


@pytest.mark.slow
def test_a_gpu_that_joins_does_not_hold_the_tick_for_the_event_listeners_wait() -> None:
    """Issue 51: join() stopped the XID listener and started it again on the tick's thread, which waited out the
    listener's nvmlEventSetWait (up to sampling.event_wait_milliseconds, 5 s): a GPU coming back stalled the ticks.
    Now join() asks the listener to take the new GPU in when its wait ends: it returns at once (here within 2.5 s
    of a 5 s wait that had just begun; it took about 5 s before), and the new GPU's XIDs reach the listener."""
    doc = scenario_doc("r610", "datacenter")
    doc["faults"] = [{"at": 5, "gpu": 1, "kind": "recover"}, {"at": 20, "gpu": 1, "kind": "xid", "xid": 48}]
    simulation = parse_scenario(doc, "join")
    simulation.gpus[1].state.lost = True  # fallen off the bus before gpuwear started
    clock = ManualClock()
    backend = NvmlBackend(FakeNvmlLibrary(simulation, clock))
    assert [g.index for g in backend.open()] == [0]
    seen: list[tuple[int, int]] = []
    backend.start_events(lambda index, xid: seen.append((index, xid)), 5000)
    try:
        deadline = time.monotonic() + 30
        while "nvmlEventSetWait_v2" not in backend._library.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        clock.advance(10.0)  # the GPU answers again
        began = time.monotonic()
        joined = backend.join()
        took = time.monotonic() - began
        assert [g.index for g in joined] == [1] and took < 2.5, took
        clock.advance(15.0)  # its XID
        deadline = time.monotonic() + 30
        while (1, 48) not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (1, 48) in seen, seen
    finally:
        backend.close()


@pytest.mark.slow
def test_a_join_that_hangs_in_nvml_holds_no_tick_past_the_deadline(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 51: join()'s NVML calls (the GPU count, a new GPU's handle and identity) ran on the tick's thread
    without a deadline: a GPU coming back whose calls hang stalled every GPU's sampling until they returned (or the
    watchdog). Now they run on a thread of their own: the tick that asks goes on after the deadline (here 0.5 s,
    where the hang is 3 s), the others are read on time meanwhile, and the GPU joins at the tick after it returns;
    said once each way."""
    doc = scenario_doc("r610", "datacenter")
    doc["faults"] = [{"at": 5, "gpu": 1, "kind": "recover"}, {"at": 5, "gpu": 1, "kind": "hang", "seconds": 3.0}]
    simulation = parse_scenario(doc, "join")
    simulation.gpus[1].state.lost = True  # fallen off the bus before gpuwear started
    clock = ManualClock()
    config = Config(sampling=SamplingConfig(nvml_deadline_seconds=0.5, slow_interval_seconds=10.0))
    sampler = _sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.open()
    longest, ticks = 0.0, 0
    try:
        with caplog.at_level("WARNING", logger="gpuwear.sampler"):
            deadline = time.monotonic() + 30
            while len(sampler.snapshot.gpus) < 2 and time.monotonic() < deadline:
                clock.advance(1.0)
                began = time.monotonic()
                sampler.tick()
                longest, ticks = max(longest, time.monotonic() - began), ticks + 1
                time.sleep(0.05)
        gpus = sampler.snapshot.gpus
        assert [g.identity.index for g in gpus] == [0, 1] and gpus[0].sample is not None
        assert longest < 2.0, longest  # the deadline, not the 3 s hang
        said = [r.getMessage() for r in caplog.records if "listing of new GPUs" in r.getMessage()]
        assert len(said) == 2 and "past the 0.5 s deadline" in said[0] and said[1].endswith("returned"), said
    finally:
        sampler.close()


@pytest.mark.slow
def test_a_reopen_that_hangs_in_nvml_holds_no_tick_past_the_deadline(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 51: after a driver reload, NVML's re-initialisation (nvmlInit, the GPUs' handles and identities) ran on
    the tick's thread without a deadline: a call that hangs there held the tick, and the watchdog's ping with it. It
    now runs on a thread of its own: no tick waits past the deadline (0.5 s, where the hang is 3 s), and the GPUs come
    back at the tick after it returns; said once each way."""
    doc = scenario_doc("r610", "datacenter")
    doc["faults"] = [{"at": 5, "kind": "driver_unload"}, {"at": 9, "kind": "driver_load"},
                     {"at": 9, "gpu": 1, "kind": "hang", "seconds": 3.0}]
    simulation = parse_scenario(doc, "reopen")
    clock = ManualClock()
    config = Config(sampling=SamplingConfig(nvml_deadline_seconds=0.5, slow_interval_seconds=10.0))
    sampler = _sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.open()
    sampler.reopen_interval = 0.0
    longest = 0.0
    try:
        with caplog.at_level("WARNING", logger="gpuwear.sampler"):
            for _ in range(8):  # the driver goes at 5 s
                clock.advance(1.0)
                sampler.tick()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(g.sample for g in sampler.snapshot.gpus):
                clock.advance(1.0)
                began = time.monotonic()
                sampler.tick()
                longest = max(longest, time.monotonic() - began)
                time.sleep(0.05)
        assert all(g.sample is not None for g in sampler.snapshot.gpus), sampler.snapshot.gpus
        assert longest < 2.0, longest  # the deadline, not the 3 s hang
        said = [r.getMessage() for r in caplog.records if "(re-)initialisation" in r.getMessage()]
        assert len(said) == 2 and "past the 0.5 s deadline" in said[0] and said[1].endswith("returned"), said
    finally:
        sampler.close()


@pytest.mark.slow
def test_a_first_open_that_hangs_in_nvml_leaves_the_daemon_serving(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 51, item 4: the first open of NVML (nvmlInit, the GPUs' handles and identities) had no deadline: one
    that hung held the start until systemd killed it and restarted it into the same hang. With sampling deadlines
    on, an open past its deadline (here 0.5 s, where a GPU's first calls hang 3 s) leaves the sampler serving without
    GPUs, saying why (what /healthz and doctor show), and the GPUs, with the driver's versions, are taken at a tick
    after it returns."""
    doc = scenario_doc("r610", "datacenter")
    simulation = parse_scenario(doc, "first-open")
    simulation.gpus[1].state.hang_seconds = 3.0
    clock = ManualClock()
    config = Config(sampling=SamplingConfig(nvml_deadline_seconds=0.5, slow_interval_seconds=10.0))
    sampler = _sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    try:
        with caplog.at_level("WARNING"):
            began = time.monotonic()
            _open_waiting(sampler, 0.0, first_open=0.5)
            assert time.monotonic() - began < 2.5  # the deadline, not the 3 s hang
            assert sampler.snapshot.gpus == () and "first open in 0.5 s" in (sampler.waiting or "")
            assert sampler.snapshot.system is None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not ((gpus := sampler.snapshot.gpus) and all(g.sample for g in gpus)):
                clock.advance(1.0)
                sampler.tick()
                time.sleep(0.05)
        gpus, system = sampler.snapshot.gpus, sampler.snapshot.system
        assert [g.identity.index for g in gpus] == [0, 1] and all(g.sample for g in gpus), gpus
        assert sampler.waiting is None and system is not None and system.driver_version == "610.43.02"
        said = [r.getMessage() for r in caplog.records]
        assert any("serves without GPUs meanwhile" in m for m in said), said
        assert any("(re-)initialisation" in m and m.endswith("returned") for m in said), said
    finally:
        sampler.close()


def test_pids_of_another_namespace_are_never_looked_up_here(tmp_path: Path) -> None:
    """In a container without the host's PID namespace (or under WSL2) NVML names processes by PIDs that are not
    this process's: a local process bearing the number was named as the job. The time of a GPU with processes is
    unattributed, with the reason; a GPU without any stays idle."""
    from gpuwear.jobs.resolve import PROC_PID_INIT_INO, foreign_pids

    (tmp_path / "proc/self/ns").mkdir(parents=True)
    (tmp_path / "proc/self/ns/pid").write_text("")  # an inode that is not the initial namespace's
    assert (tmp_path / "proc/self/ns/pid").stat().st_ino != PROC_PID_INIT_INO
    reason = foreign_pids(tmp_path / "proc")
    assert reason is not None and "hostPID" in reason and "--pid=host" in reason
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("5.15.153.1-microsoft-standard-WSL2\n")
    assert (foreign_pids(tmp_path / "proc") or "").startswith("WSL2")
    assert foreign_pids(tmp_path / "nothing") is None  # no way to tell: taken as this namespace's

    doc = scenario_doc("r610", "datacenter")
    doc["gpus"][1]["schedule"] = [{"kind": "idle", "seconds": 3600}]
    simulation = parse_scenario(doc, "pidns")
    clock = ManualClock()
    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path / "state"))
    sampler = _sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.open()
    daemon = Daemon(config, Source(sampler, clock, DaemonInfo("test", "3", "simulated", "pidns"), 1.0, simulation,
                                   foreign_pids=reason))
    try:
        run(daemon, clock, 30)
        training, idle = (g.identity.uuid for g in sampler.snapshot.gpus)
        assert sampler.snapshot.gpus[0].sample is not None and sampler.snapshot.gpus[0].sample.processes
        wear, quiet = daemon.tracker.wear(training), daemon.tracker.wear(idle)
        assert wear is not None and quiet is not None
        assert set(wear.kinds) == {"unattributed"} and set(quiet.kinds) == {"idle"}
        daemon.persist(final=True)
        assert daemon.ledger is not None
        names = {r["name"] for r in daemon.ledger.jobs() if r["kind"] == "unattributed"}
        assert names == {f"unattributed: {reason}"}
    finally:
        daemon.stop()


def test_a_gpu_of_the_last_run_that_nvml_no_longer_lists_is_reported_missing(tmp_path: Path) -> None:
    """A GPU present in one run and absent in the next (the same state directory): /healthz said nothing, as if the
    host never had it. It is named missing until it comes back (or is forgotten)."""
    two = scenario_doc("r610", "datacenter")
    one = scenario_doc("r610", "datacenter", faults=[{"at": 0, "gpu": 0, "kind": "gpu_missing"}])
    with daemon_over(two, tmp_path) as (daemon, clock):
        run(daemon, clock, 5)
        assert daemon.health_problem() is None
        gone, *_, stays = (g.identity for g in daemon.source.sampler.snapshot.gpus)
    with daemon_over(one, tmp_path) as (daemon, clock):  # GPU 0 absent from the bus: the H100 is NVML's GPU 0 now
        run(daemon, clock, 5)
        assert [(g.identity.index, g.identity.uuid) for g in daemon.source.sampler.snapshot.gpus] == [(0, stays.uuid)]
        gone_name = gone.name
        gone = gone.uuid
        problem = daemon.health_problem()
        assert problem is not None and f"GPU {gone} ({gone_name}) is missing" in problem, problem
        assert f"gpuwear forget {gone}" in problem and problem.count("is missing") == 1
        body = daemon.exposition.render(False).decode()  # and the metric the alert GpuwearGpuMissing reads
        assert "\ngpuwear_gpus_missing 1.0\n" in body, body
        assert f'\ngpuwear_gpu_missing_last_seen_timestamp_seconds{{uuid="{gone}"}} ' in body
        page = daemon.page().decode()  # and the page says so first
        assert "Missing GPU." in page and f"GPU {gone} ({gone_name}) is missing" in page, page[:2000]
    with daemon_over(two, tmp_path) as (daemon, clock):
        run(daemon, clock, 5)
        assert daemon.health_problem() is None
        body = daemon.exposition.render(False).decode()
        assert "\ngpuwear_gpus_missing 0.0\n" in body and "gpuwear_gpu_missing_last_seen_timestamp_seconds{" not in body
        assert "Missing GPU." not in daemon.page().decode()


def test_a_new_card_in_a_missing_cards_slot_is_its_replacement_not_a_missing_gpu(tmp_path: Path,
                                                                                   caplog: pytest.LogCaptureFixture
                                                                                   ) -> None:
    """Issue 51, slice 4: a new UUID at the PCI address of a card the ledger holds stayed "missing" (503, the alert)
    until forgotten. Now it is that card's replacement, said once in the log; the old card a past card, kept in the
    ledger and in `report` as such, never missing again, even when its slot is empty later."""
    import logging

    from gpuwear.report import document

    doc = scenario_doc("r610", "datacenter")
    with daemon_over(doc, tmp_path) as (daemon, clock):
        run(daemon, clock, 5)
        old = [g.identity for g in daemon.source.sampler.snapshot.gpus]
    with caplog.at_level(logging.WARNING, logger="gpuwear.service"), \
            daemon_over(doc, tmp_path, seed=2, start=3600.0) as (daemon, clock):  # other cards in both slots
        run(daemon, clock, 5)
        new = [g.identity for g in daemon.source.sampler.snapshot.gpus]
        assert {g.uuid for g in new}.isdisjoint(g.uuid for g in old)
        assert daemon.health_problem() is None and daemon.missing_gpus() == []
        body = daemon.exposition.render(False).decode()
        assert "\ngpuwear_gpus_missing 0.0\n" in body
        daemon.health_problem()
        said = [r.getMessage() for r in caplog.records if "replaces GPU" in r.getMessage()]
        assert len(said) == 2 and f"GPU {new[0].uuid} at PCI {old[0].pci_bus_id} replaces GPU {old[0].uuid}" in \
            said[0] + said[1], said
        daemon.persist(final=True)
        assert daemon.ledger is not None
        wears = daemon.ledger.load(2.0)
    report = document(list(wears.values()), WearConfig(), {}, "ledger", False)
    gpus = {g["uuid"]: g for g in report["gpus"]}
    past = gpus[old[0].uuid]
    from gpuwear import page
    from gpuwear.report import text_report

    assert f"PAST CARD: {new[0].uuid} took its slot (PCI {new[0].pci_bus_id})" in text_report(report)
    assert page.render(report).count("A past card:") == 2
    assert past["replaced_by"]["uuid"] == new[0].uuid and "not_seen" not in past
    assert "gpu_missing" not in {r["code"] for r in past["health"]["reasons"]}
    # its slot empty later: the new card is missing, the past card is not
    gone = scenario_doc("r610", "datacenter", faults=[{"at": 0, "gpu": 0, "kind": "gpu_missing"}])
    with daemon_over(gone, tmp_path, seed=2, start=7200.0) as (daemon, clock):
        run(daemon, clock, 5)
        problem = daemon.health_problem()
        assert problem is not None and f"GPU {new[0].uuid}" in problem and old[0].uuid not in problem, problem


def test_the_matrix_covers_both_ends_of_the_supported_branches() -> None:
    drivers = {p.values[0] for p in MATRIX}  # type: ignore[index]
    assert {"r470", NEWEST} <= drivers and len(drivers) == len(PROFILES)
    assert PROFILES["r470"].branch == nvml_symbols.BRANCHES[0]


# -- what each profile exports, against what pynvml itself would do ----------------------------------------


def test_r470_has_no_v3_process_functions_and_pynvml_raises_a_plain_exception_there() -> None:
    rig = make_rig(scenario_doc("r470", "datacenter"))
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        # nvidia-ml-py >= 12.550 raises a plain Exception here (not an NVMLError: it used to end every tick)
        mismatch = getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError_FunctionNotFound)
        with pytest.raises((mismatch, pynvml.NVMLError_FunctionNotFound)):
            pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        sample = rig.run(3).gpus[0].sample
        assert sample is not None and [p for p, _ in sample.processes or ()] == [synthetic_pid("matrix-job")]
        assert rig.backend.api is not None and rig.backend.api.processes.endswith("_v2")
        assert not rig.backend.api.event_reasons and sample.clock_event_reasons is not None  # ...ThrottleReasons
        assert rig.library.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] > 0
    finally:
        rig.backend.close()


def test_r470_fans_are_counted_without_num_fans() -> None:
    doc = scenario_doc("r470", "geforce")
    rig = make_rig(doc)
    try:
        identity = rig.sampler.snapshot.gpus[0].identity
        assert identity.name == "NVIDIA GeForce GTX 1080 Ti" and identity.fan_count == 1
        sample = rig.run(5).gpus[0].sample
        assert sample is not None and sample.fan_speed_ratio is not None and sample.fan_speed_ratio[0]
        assert rig.library.missing["nvmlDeviceGetNumFans"] >= 1
    finally:
        rig.backend.close()


def two_jobs(driver: str) -> dict[str, Any]:
    """One H100 running two jobs' processes at once (two CUDA contexts)."""
    doc = scenario_doc(driver, "datacenter")
    sim_doc = dict(doc)
    sim_doc["gpus"] = [dict(doc["gpus"][1])]
    return sim_doc


@pytest.mark.parametrize("windows", [None, "536.25"])
def test_the_32_byte_process_struct_of_535_54_reads_every_pid(windows: str | None, tmp_path: Path) -> None:
    """Under WSL2 (``windows``) the library built as 535.54.03 says the Windows driver's version, 536.25: the layout
    chosen from that string read the PIDs [4242, 0, 4294967295]; told by the library's exports, it reads them."""
    doc = scenario_doc("r535.54", "datacenter")
    if windows:
        doc["windows_driver"] = windows
    rig = make_rig(doc)
    try:
        gpu = rig.simulation.gpus[0]
        rig.run(2)
        gpu.schedule = [gpu.schedule[0].__class__(kind="train", seconds=3600, utilization=0.9,
                                                  pids=(4242, 4343, 4444))]
        sample = rig.run(2).gpus[0].sample
        assert sample is not None
        assert [p for p, _ in sample.processes or ()] == [4242, 4343, 4444]
        assert rig.backend.api is not None and rig.backend.api.process_layout is ProcessInfoCc
        assert rig.backend.system_info().driver_version == (windows or "535.54.03")
        if ctypes.sizeof(pynvml.c_nvmlProcessInfo_t) == 24:  # every binding but 12.535.77, which read 32 bytes
            # what pynvml's own wrapper makes of the same answer: its 24-byte stride reads garbage after the first
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)][1:] != [4343, 4444]
    finally:
        rig.backend.close()


def test_memory_used_is_nvidia_smis_without_the_reserved_memory() -> None:
    idle = {"driver": NEWEST, "gpus": [{"product": "a100-sxm", "schedule": [{"kind": "idle", "seconds": 3600}]}]}
    rig = make_rig(idle)
    try:
        sample = rig.run(2).gpus[0].sample
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        assert sample is not None and sample.memory_used_bytes is not None
        assert v1.used > 800e6 and sample.memory_used_bytes < 10e6  # ~0.9 GB reserved vs nothing allocated
    finally:
        rig.backend.close()
    old = make_rig({**idle, "driver": "r470"})  # no _v2: the v1 figure, the only one there is
    try:
        sample = old.run(2).gpus[0].sample
        assert sample is not None and sample.memory_used_bytes is not None and sample.memory_used_bytes > 800e6
    finally:
        old.backend.close()


def test_a_field_the_driver_does_not_know_is_unavailable_and_not_an_error() -> None:
    rig = make_rig(scenario_doc("r550", "datacenter"), slow_interval=2.0)
    try:
        snap = rig.run(12)
        h100 = snap.gpus[0]
        assert h100.unavailable["recovery_action"] == "unknown_field" and h100.last_success and not h100.errors
        fast_fields = [name for _, name, _, _ in rig.backend._devices[0].plan(False)[1]]
        assert "recovery_action" not in fast_fields  # a slow field, and asked only on the slow interval
        assert h100.unavailable["recovery_action"] == "unknown_field" and not h100.errors  # after six slow reads
    finally:
        rig.backend.close()
    newer = make_rig(scenario_doc("r570", "datacenter"), slow_interval=2.0)
    try:
        sample = newer.run(3).gpus[0].sample
        assert sample is not None and sample.recovery_action == 0
    finally:
        newer.backend.close()


def test_mig_toggled_at_run_time_is_followed_on_the_slow_interval() -> None:
    doc = scenario_doc(NEWEST, "datacenter", faults=[{"at": 10.5, "gpu": 0, "kind": "mig", "enabled": True},
                                                     {"at": 30.5, "gpu": 0, "kind": "mig", "enabled": False}])
    doc["gpus"][0]["product"] = "a100-sxm"
    rig = make_rig(doc, slow_interval=5.0)
    try:
        snap = rig.run(20)
        gpu = snap.gpus[0]
        assert gpu.sample is not None and gpu.sample.utilization_gpu_ratio is None and gpu.sample.mig_enabled
        assert gpu.unavailable["utilization"] == "not_supported" and gpu.last_success
        snap = rig.run(20)
        gpu = snap.gpus[0]
        assert gpu.sample is not None and gpu.sample.utilization_gpu_ratio is not None  # asked again, back
        assert "utilization" not in gpu.unavailable and gpu.sample.mig_enabled is False
    finally:
        rig.backend.close()


def test_a_binding_that_raises_costs_one_reading_not_the_tick(caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(scenario_doc(NEWEST, "datacenter"))
    try:
        device = rig.backend._devices[0]

        def broken(h: Any, api: Any) -> dict[str, Any]:
            raise TypeError("c_nvmlFanSpeedInfo_t is not defined")  # what nvidia-ml-py 12.560 raised

        device.readers = tuple(r.__class__(r.key, r.slow, broken, r.fields) if r.key == "power" else r
                               for r in device.readers)
        device._plans.clear()
        snap = rig.run(70)  # two slow reads ask the broken reading again: counted and logged once all the same
        h100, other = snap.gpus
        assert h100.sample is not None and h100.sample.power_watts is None
        assert h100.sample.temperature_gpu_celsius is not None and other.last_success
        assert h100.errors["binding_error"] == 1 and h100.unavailable["power"] == "binding_error"
        assert sum("raised TypeError" in r.getMessage() for r in caplog.records) == 1
    finally:
        rig.backend.close()


@pytest.mark.parametrize("back_joules", [30_000, 1e9])  # a step back, and back to about zero (a reset's look)
def test_an_energy_counter_glitch_is_dropped_not_counted_twice(back_joules: float) -> None:
    doc = scenario_doc(NEWEST, "datacenter", faults=[{"at": 60.5, "gpu": 0, "kind": "energy_glitch",
                                                      "back_joules": back_joules}])
    rig = make_rig(doc)
    try:
        before = rig.run(60).gpus[0].energy_joules_total
        snap = rig.run(5)
        after = snap.gpus[0]
        assert before is not None and after.energy_joules_total is not None
        assert after.dropped["energy_joules"] == 1
        assert 0 < after.energy_joules_total - before < 5 * 700 + 1000  # not the whole counter again
    finally:
        rig.backend.close()


def test_a_slow_call_inside_a_read_does_not_make_the_energy_counter_implausible() -> None:
    """Issue 53: the README's --speed 600 logged "dropped energy_joules=..., implausible next to the counter's last
    value" for healthy simulated cards on a busy machine: the counter was judged against the time since the last
    tick's start, while a read delayed inside the tick (the machine busy; at x600, 75 ms is 45 simulated seconds)
    reads it later. It is now judged from the previous read's start to this read's end. Here a call in GPU 0's read
    takes 120 simulated seconds: nothing dropped, and its energy counted, not lost."""
    from conftest import StepTimer
    from gpuwear.backends.nvml import GpuLostError, NvmlDriverError, NvmlUnavailableError
    from gpuwear.sampler import Sampler

    class Jumping(ManualClock):  # a clock that leaps once, at a chosen call: a slow call
        def __init__(self) -> None:
            super().__init__()
            self.calls, self.leap_at, self.leap = 0, -1, 0.0

        def monotonic(self) -> float:
            self.calls += 1
            if self.calls == self.leap_at:
                self.advance(self.leap)
            return super().monotonic()

    simulation = parse_scenario(scenario_doc(NEWEST, "datacenter"), "slow-call")
    clock = Jumping()
    backend = NvmlBackend(FakeNvmlLibrary(simulation, clock))
    sampler = Sampler(backend, clock, 30.0, (GpuLostError,), timer=StepTimer(), driver_errors=(NvmlDriverError,),
                      unavailable_errors=(NvmlUnavailableError,), fatal_errors=(NvmlVersionMismatchError,))
    sampler.open()
    try:
        for _ in range(40):
            clock.advance(1.0)
            sampler.tick()
        before = sampler.snapshot.gpus[0].energy_joules_total
        clock.calls, clock.leap_at, clock.leap = 0, 3, 120.0  # the tick's start, GPU 0's read begins, then its call
        clock.advance(1.0)
        sampler.tick()
        for _ in range(5):
            clock.advance(1.0)
            sampler.tick()
        after = sampler.snapshot.gpus[0]
        assert not after.dropped.get("energy_joules"), after.dropped
        watts = simulation.gpus[0].state.power_watts
        assert before is not None and after.energy_joules_total is not None
        assert after.energy_joules_total - before > 0.5 * watts * 120  # the leap's energy counted
    finally:
        backend.close()


def test_a_driver_reload_is_still_a_reset_of_the_counter() -> None:
    rig = make_rig(scenario_doc(NEWEST, "datacenter", faults=[{"at": 100.5, "gpu": 0, "kind": "driver_reload"}]))
    try:
        before = rig.run(100).gpus[0].energy_joules_total
        after = rig.run(10).gpus[0]
        assert before is not None and after.energy_joules_total is not None
        assert before < after.energy_joules_total < before + 10 * 700 + 1000
        assert after.dropped["energy_joules"] == 1  # the first low reading, believed once the next continued it
        assert after.sample is not None and after.sample.energy_joules is not None
    finally:
        rig.backend.close()


def test_a_counter_that_jumps_forward_for_good_is_rebased_not_counted() -> None:
    rig = make_rig(scenario_doc(NEWEST, "datacenter"))
    try:
        before = rig.run(30).gpus[0].energy_joules_total
        rig.simulation.gpus[0].state.energy_mj += 5e9  # 5 MJ more than any card could draw in a second
        after = rig.run(10).gpus[0]
        assert before is not None and after.energy_joules_total is not None
        assert after.dropped["energy_joules"] == 2  # doubted twice, then counted from the jump on
        assert 0 < after.energy_joules_total - before < 10 * 700 + 1000
    finally:
        rig.backend.close()


def test_gh200_module_energy_counter_is_not_taken_for_the_gpus() -> None:
    rig = make_rig(scenario_doc(NEWEST, "gh200"))
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        rig.run(10)
        first = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
        snap = rig.run(60)
        module = (pynvml.nvmlDeviceGetTotalEnergyConsumption(h) - first) / 1000 / 60  # W, the module's counter
        gpu = snap.gpus[0]
        assert gpu.sample is not None and gpu.sample.power_watts is not None
        assert module == pytest.approx(gpu.sample.power_watts + PRODUCTS["gh200"].module_extra_watts, rel=0.05)
        assert gpu.sample.energy_joules is None and gpu.unavailable["energy_joules"] == "module_scope"
        assert gpu.last_success and gpu.readings > 0
    finally:
        rig.backend.close()


# -- events ------------------------------------------------------------------------------------------------


def test_xids_of_the_other_gpus_are_counted_while_one_is_lost() -> None:
    doc = scenario_doc(NEWEST, "datacenter", faults=[
        {"at": 3, "gpu": 0, "kind": "lost"}, {"at": 4, "gpu": 1, "kind": "xid", "xid": 48},
        {"at": 5, "gpu": 1, "kind": "xid", "xid": 94}])
    rig = make_rig(doc)
    rig.sampler.start_events(wait_ms=20)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rig.run(1)
            if rig.sampler.snapshot.gpus[1].xids.get(94):
                break
            time.sleep(0.02)
        assert dict(rig.sampler.snapshot.gpus[1].xids) == {48: 1, 94: 1}
    finally:
        rig.backend.close()


def test_the_event_listener_never_spins_on_an_empty_set() -> None:
    doc = {"driver": NEWEST, "gpus": [{"product": "jetson-orin"}]}  # no GPU supports events
    rig = make_rig(doc)
    # a daemon stopped by an earlier test may leave its listener finishing a long wait (NvmlBackend.close)
    before = {t for t in threading.enumerate() if t.name == "nvml-events"}
    rig.sampler.start_events(wait_ms=5)
    try:
        time.sleep(0.5)
        assert rig.library.calls["nvmlEventSetWait_v2"] == 0
        assert any(t.name == "nvml-events" for t in set(threading.enumerate()) - before)
    finally:
        rig.backend.close()
    assert not any(t.name == "nvml-events" and t.is_alive() for t in set(threading.enumerate()) - before)


# -- a driver upgraded under the daemon ----------------------------------------------------------------------


def test_a_driver_upgrade_stops_the_sampler_with_the_reason() -> None:
    """The module is swapped for another release's: the session ends (UNINITIALIZED), and nvmlInit of the library
    this process loaded answers LIB_RM_VERSION_MISMATCH: fatal, since that library worked and never will again."""
    rig = make_rig(scenario_doc(NEWEST, "datacenter", faults=[{"at": 3.5, "kind": "driver_upgrade"}]))
    rig.sampler.reopen_interval = 0.0
    try:
        rig.run(3)
        with pytest.raises(NvmlVersionMismatchError, match="different driver releases"):
            rig.run(2)
    finally:
        rig.backend.close()


@pytest.mark.slow
def test_a_driver_upgrade_makes_the_daemon_exit_non_zero_after_saving(tmp_path: Path) -> None:
    doc = scenario_doc(NEWEST, "datacenter", faults=[{"at": 20.0, "kind": "driver_upgrade"}])
    scenario = tmp_path / "upgrade.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    state = tmp_path / "state"
    result = subprocess.run([sys.executable, "-m", "gpuwear", "run", "--simulate", str(scenario), "--speed", "10",
                             "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(state)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "exiting so that gpuwear is started again" in result.stderr.splitlines()[-1]
    from gpuwear.ledger import Ledger

    ledger = Ledger.open_read_only(state / "simulated" / "upgrade" / "ledger.sqlite")
    try:
        saved = ledger.load(2.0)
    finally:
        ledger.close()
    assert len(saved) == 2 and all(w.observed_seconds >= 15 for w in saved.values())  # the final save ran


@pytest.mark.slow
def test_a_daemon_started_into_an_unfinished_upgrade_waits_serving_instead_of_restarting(tmp_path: Path) -> None:
    from helpers import fetch, wait_for

    doc = scenario_doc(NEWEST, "datacenter", faults=[{"at": 0.0, "kind": "driver_upgrade"}])
    scenario = tmp_path / "upgraded.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", str(scenario), "--listen",
                             f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state")],
                            stderr=subprocess.PIPE, text=True)
    try:
        body = wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_gpus 0.0", 30)
        assert "gpuwear_sampler_ticks_total" in body
        status, text = fetch(f"http://127.0.0.1:{port}/healthz")
        assert status == 503 and "driver upgrade is not finished" in text
        assert fetch(f"http://127.0.0.1:{port}/livez") == (200, "ok\n")  # no restart loop from the kubelet
        time.sleep(1.0)
        assert proc.poll() is None
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "serves without GPUs and opens NVML again" in log


@pytest.mark.slow
def test_a_stalled_read_that_ends_by_raising_is_raised_not_stalled_for_good() -> None:
    rig = make_rig(scenario_doc(NEWEST, "datacenter"))
    rig.sampler.deadline = 0.2
    real = rig.sampler.backend.read
    broken = [True]

    def read(index: int, slow: bool) -> Any:
        if index == 0 and broken[0]:
            broken[0] = False
            time.sleep(0.6)
            raise ZeroDivisionError("a bug after a long call")
        return real(index, slow)

    rig.sampler.backend.read = read  # type: ignore[method-assign]
    try:
        rig.run(1)
        assert rig.sampler.snapshot.gpus[0].errors["stalled"] == 1
        time.sleep(0.8)
        with pytest.raises(ZeroDivisionError):
            rig.run(1)
        snap = rig.run(1)
        assert all(g.sample is not None and g.last_success for g in snap.gpus)
    finally:
        rig.sampler.close()


def test_a_driver_without_get_violation_status_reads_the_policy_fields() -> None:
    """NVML 13 deprecates nvmlDeviceGetViolationStatus; without it the same counters come as field values."""
    simulation = parse_scenario(scenario_doc(NEWEST, "datacenter"), "no-violation")
    clock = ManualClock()
    library = FakeNvmlLibrary(simulation, clock)
    del library._functions["nvmlDeviceGetViolationStatus"]  # this library instance's driver lacks it
    from gpuwear.backends.nvml import NvmlBackend as Backend
    from gpuwear.sampler import Sampler

    backend = Backend(library)
    sampler = Sampler(backend, clock, 30.0, ())
    sampler.open()
    try:
        for _ in range(30):
            clock.advance(1.0)
            snap = sampler.tick()
        h100 = snap.gpus[0]
        assert backend.api is not None and not backend.api.violation
        assert h100.sample is not None and h100.sample.violation_power_seconds is not None and h100.last_success
    finally:
        backend.close()


def test_a_scenario_cannot_put_a_card_under_a_driver_too_old_for_it() -> None:
    with pytest.raises(ScenarioError, match="needs a driver of branch r525"):
        parse_scenario({"driver": "r470", "gpus": [{"product": "rtx4090"}]}, "old")
    with pytest.raises(ScenarioError, match="driver: expected one of"):
        parse_scenario({"driver": "r999", "gpus": [{"product": "v100"}]}, "bad")


# -- health that cannot lie -------------------------------------------------------------------------------


def test_failing_ticks_make_the_daemon_unhealthy(tmp_path: Path) -> None:
    with daemon_over(scenario_doc(NEWEST, "datacenter"), tmp_path) as (daemon, clock):
        run(daemon, clock, 2)
        assert daemon.sampling_problem() is None
        real = daemon.tracker.observe

        def broken(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("boom")

        daemon.tracker.observe = broken  # type: ignore[method-assign]
        run(daemon, clock, 3)
        problem = daemon.sampling_problem()
        assert problem is not None and "the last 3 sampling ticks failed (RuntimeError: boom)" in problem
        daemon.tracker.observe = real  # type: ignore[method-assign]
        run(daemon, clock, 1)
        assert daemon.sampling_problem() is None


def test_doctor_says_a_jetson_yields_nothing(tmp_path: Path) -> None:
    from gpuwear.doctor import Doctor

    simulation = parse_scenario({"gpus": [{"product": "jetson-orin"}, {"product": "h100-sxm"}]}, "jetson")
    doctor = Doctor(Config(state_dir=str(tmp_path)), NvmlBackend(FakeNvmlLibrary(simulation, ManualClock())),
                    tmp_path / "ledger.sqlite", dev=tmp_path)
    text = "\n".join(f"{f.ok} {f.what} {f.fix}" for f in doctor.run())
    assert re.search(r"False GPU 0 Orin \(nvgpu\) \(GPU-[^)]+\): yields no readings; not supported: ", text), text
    assert "Jetson" in text
    assert re.search(r"True GPU 1 NVIDIA H100 80GB HBM3 .*fields read", text)


def test_doctor_says_what_makes_a_mig_gpus_processes_readable(tmp_path: Path) -> None:
    from gpuwear.doctor import Doctor

    simulation = parse_scenario(_no_mig_devices(scenario_doc("r550", "mig-unprivileged")), "mig")
    doctor = Doctor(Config(state_dir=str(tmp_path)), NvmlBackend(FakeNvmlLibrary(simulation, ManualClock())),
                    tmp_path / "ledger.sqlite", dev=tmp_path)
    findings = doctor.run()
    unseen = [f for f in findings if "processes cannot be read" in f.what]
    assert len(unseen) == 1 and not unseen[0].ok, findings  # the A100 with MIG, not the H100 beside it
    assert "GPU 0" in unseen[0].what and "no permission" in unseen[0].what and "unattributed" in unseen[0].what
    assert "root" in unseen[0].fix
    mig = [f for f in findings if "MIG on" in f.what]
    assert len(mig) == 1 and "no MIG device's compute slices read" in mig[0].what and "equally" in mig[0].note


def test_doctor_says_how_a_mig_gpus_jobs_are_charged(tmp_path: Path) -> None:
    """Issue 54, item 4: doctor says a MIG GPU's jobs are charged for their slices, and how many are held."""
    from gpuwear.doctor import Doctor

    simulation = parse_scenario(scenario_doc("r550", "mig-unprivileged"), "mig")  # 3g.40gb and 4g.40gb
    doctor = Doctor(Config(state_dir=str(tmp_path)), NvmlBackend(FakeNvmlLibrary(simulation, ManualClock())),
                    tmp_path / "ledger.sqlite", dev=tmp_path)
    mig = [f for f in doctor.run() if "MIG on" in f.what]
    assert len(mig) == 1 and mig[0].ok and "GPU 0" in mig[0].what, mig  # the A100, not the H100 beside it
    assert "2 MIG device(s) holding 7 of its 7 compute slices" in mig[0].what
    assert "charged for the slices" in mig[0].note and "1/7" in mig[0].note


def test_doctor_says_a_vgpu_is_a_share_of_a_physical_gpu(tmp_path: Path) -> None:
    """Issue 28's vGPU guest: NVML reads there as on the physical GPU (NVIDIA's vGPU Management SDK guide), so a
    VM's gpuwear would give the card's wear under every VM on it as if its own. doctor now says what NVML's
    virtualization mode tells (a note: nothing here changes it); the bare-metal H100 beside it gets none."""
    from gpuwear.doctor import Doctor

    simulation = parse_scenario(scenario_doc("r550", "vgpu-guest"), "vgpu")
    doctor = Doctor(Config(state_dir=str(tmp_path)), NvmlBackend(FakeNvmlLibrary(simulation, ManualClock())),
                    tmp_path / "ledger.sqlite", dev=tmp_path)
    shares = [f for f in doctor.run() if "a vGPU" in f.what]
    assert len(shares) == 1 and shares[0].ok and f"GPU 0 {VGPU}" in shares[0].what, shares
    assert "under every virtual machine on it" in shares[0].note


@pytest.mark.parametrize("dxg", [True, False])
def test_doctor_on_wsl2_checks_dxg_not_the_nvidia_nodes(dxg: bool, tmp_path: Path) -> None:
    """Under WSL2 the GPU is /dev/dxg and no /dev/nvidia* exists: doctor opens dxg (the unit's device policy
    refuses it without the drop-in) and says what NVML there cannot give, instead of passing on nodes it never
    looked for."""
    from gpuwear.doctor import Doctor

    doc = scenario_doc("r550", "datacenter")
    doc["windows_driver"] = "552.55"  # the WSL2 library says the Windows driver's version
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    (proc / "sys/kernel").mkdir(parents=True)
    (proc / "sys/kernel/osrelease").write_text("5.15.153.1-microsoft-standard-WSL2\n")
    dev.mkdir()
    if dxg:
        (dev / "dxg").write_bytes(b"")
    doctor = Doctor(Config(state_dir=str(tmp_path)), NvmlBackend(FakeNvmlLibrary(parse_scenario(doc, "wsl2"),
                                                                                  ManualClock())),
                    tmp_path / "ledger.sqlite", dev=dev, proc=proc)
    findings = {f.what: f for f in doctor.run()}
    opened = findings[f"WSL2: {dev / 'dxg'} opens for reading and writing"]
    assert opened.ok is dxg and (dxg or "deploy/systemd/wsl2.conf" in opened.fix)
    pids = findings["job attribution: WSL2: NVML names processes by their Windows PIDs"]
    assert pids.ok and "unattributed" in pids.note  # nothing on this host would change it: a remark, not a fix
    assert any(w.startswith("NVIDIA driver 552.55") for w in findings)


def test_docs_tell_operators_to_stop_gpuwear_before_a_gpu_reset() -> None:
    for path in [*(REPO / "docs").glob("*.md"), REPO / "README.md"]:
        for paragraph in path.read_text().split("\n\n"):
            if "nvidia-smi -r" in paragraph:
                assert "stop gpuwear" in paragraph.lower(), (path, paragraph)


def test_fake_process_layout_is_the_drivers_not_the_callers() -> None:
    """The fake writes the driver's 32-byte records into whatever the caller allocated, bounded by its size."""
    rig = make_rig(scenario_doc("r535.54", "datacenter"))
    try:
        fn = rig.library.nvmlDeviceGetComputeRunningProcesses_v3
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        count = ctypes.c_uint(1)
        buffer = (ctypes.c_ubyte * 40)()  # room for one 32-byte record and a little more
        assert fn(h, ctypes.byref(count), buffer) == 0 and count.value == 1
        assert ProcessInfoCc.from_buffer(buffer).pid == synthetic_pid("matrix-job")
        assert bytes(buffer[32:]) == bytes(8)
    finally:
        rig.backend.close()


def test_logs_of_unavailable_readings_name_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuwear.backends.nvml")
    rig = make_rig(_no_mig_devices(scenario_doc(NEWEST, "mig-unprivileged")))
    try:
        rig.run(2)
        assert any("processes (no_permission)" in r.getMessage() for r in caplog.records)
    finally:
        rig.backend.close()


def test_the_readme_states_the_supported_range_that_is_tested() -> None:
    import importlib.metadata

    readme = (REPO / "README.md").read_text()
    bindings = re.search(r"nvidia-ml-py \(module `pynvml`\): (\d+(?:\.\d+)+) to (\d+(?:\.\d+)+)", readme)
    drivers = re.search(r"NVIDIA drivers: R(\d+) to R(\d+)", readme)
    floor = re.search(r'"nvidia-ml-py>=([\d.]+)"', (REPO / "pyproject.toml").read_text())
    assert bindings and drivers and floor
    assert bindings.group(1) == floor.group(1)  # pyproject accepts exactly what the README states
    assert '"nvidia-ml-py==$nvml"' in (REPO / "test.sh").read_text()  # and test.sh runs this file on it
    assert importlib.metadata.version("nvidia-ml-py") in bindings.groups()  # this run is at one of the two ends
    assert (f"r{drivers.group(1)}", f"r{drivers.group(2)}") == (nvml_symbols.BRANCHES[0], NEWEST)
    assert NEWEST == [p.branch for p in PROFILES.values()][-1]
