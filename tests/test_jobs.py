"""Job attribution: cgroup parsing, real processes through the fake NVML, and the shares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import make_rig
from gpuwear.config import WearConfig
from gpuwear.jobs.resolve import Job, JobWatcher, ProcessResolver, SimulatedJobs, job_from_cgroup
from gpuwear.tracker import WearTracker
from gpuwear.wear.models import thermal_aging_hours
from helpers import slow_fixture

SHORT_JOBS = str(Path(__file__).parent / "scenarios" / "short-jobs.yaml")  # many jobs in little time

# Recorded /proc/PID/cgroup contents (the ids are made up in the shapes real systems use).
CGROUPS = {
    "slurm_v1": ("12:memory:/slurm/uid_1000/job_4242/step_0/task_1\n11:devices:/slurm/uid_1000/job_4242/step_0\n"
                 "1:name=systemd:/system.slice/slurmd.service\n", Job("slurm", "4242")),
    "slurm_v2": ("0::/system.slice/slurmstepd.scope/job_977/step_batch/user/task_0\n", Job("slurm", "977")),
    "kubernetes_cgroupfs": ("12:memory:/kubepods/burstable/pod6f1c2b2e-3d4a-4b5c-9d8e-0f1a2b3c4d5e/"
                            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
                            Job("kubernetes", "6f1c2b2e-3d4a-4b5c-9d8e-0f1a2b3c4d5e")),
    "kubernetes_systemd": ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1c2b2e_3d4a_4b5c_9d8e_"
                           "0f1a2b3c4d5e.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
                           "abcdef.scope\n", Job("kubernetes", "6f1c2b2e-3d4a-4b5c-9d8e-0f1a2b3c4d5e")),
    "docker_v1": ("4:memory:/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n",
                  Job("docker", "0123456789ab")),
    "docker_v2": ("0::/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n",
                  Job("docker", "0123456789ab")),
    "containerd": ("0::/system.slice/containerd.service/cri-containerd-fedcba9876543210fedcba9876543210fedcba9876543"
                   "210fedcba9876543210.scope\n", Job("container", "fedcba987654")),
    "podman": ("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
               "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.scope/container\n", Job("container", "aaaaaaaaaaaa")),
    "systemd_unit": ("0::/system.slice/train-resnet.service\n",
                     Job("systemd", "train-resnet.service", name="train-resnet.service")),
    "systemd_run_user": ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r3b1c.scope\n",
                         Job("systemd", "run-r3b1c.scope", name="run-r3b1c.scope")),
    "session": ("0::/user.slice/user-1000.slice/session-3.scope\n", Job("session", "user-1000/session-3")),
    "plain_v2": ("0::/\n", None),
    "container_without_namespace": ("4:memory:/process_api/9473f333c6363e36a8722cb850c3f801\n0::/\n", None),
}


@pytest.mark.parametrize("case", sorted(CGROUPS))
def test_cgroup_parsing(case: str) -> None:
    text, expected = CGROUPS[case]
    assert job_from_cgroup(text) == expected


def test_hostile_cgroup_paths_are_clipped_and_printable() -> None:
    job = job_from_cgroup("0::/system.slice/" + "x" * 500 + "\x1b[31m.service\n")
    assert job is not None and len(job.id) <= 128 and "\x1b" not in job.id
    assert job_from_cgroup("garbage without colons\n\n") is None


def spawn(script: str, new_session: bool = True) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=new_session)


LAUNCHER = """
import subprocess, sys, time

ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)]
print(" ".join(str(r.pid) for r in ranks), flush=True)
time.sleep(120)
"""


@pytest.fixture
@slow_fixture
def ddp() -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A launcher (like torchrun) in a session of its own with two rank processes."""
    launcher = spawn(LAUNCHER)
    assert launcher.stdout is not None
    ranks = [int(p) for p in launcher.stdout.readline().split()]
    yield launcher, ranks
    os.killpg(launcher.pid, 9)
    launcher.wait()


def test_ranks_of_one_launcher_are_one_job(ddp: tuple[subprocess.Popen[str], list[int]]) -> None:
    launcher, ranks = ddp
    resolver = ProcessResolver(cgroup=lambda pid: "0::/\n")  # no job in the cgroup: the session decides
    jobs = {resolver.resolve(pid) for pid in [*ranks, launcher.pid]}
    assert len(jobs) == 1
    job = jobs.pop()
    assert job.kind == "process" and job.id.endswith(f"@{launcher.pid}")  # the launcher leads the session
    assert job.user  # the owner of the processes
    other = spawn("import time; time.sleep(60)")
    try:
        assert resolver.resolve(other.pid).key != job.key  # another session, another job
    finally:
        other.kill()
        other.wait()


def test_cgroup_decides_over_the_session_and_users_can_be_hidden(
        ddp: tuple[subprocess.Popen[str], list[int]]) -> None:
    _, ranks = ddp
    resolver = ProcessResolver(show_users=False, cgroup=lambda pid: CGROUPS["slurm_v2"][0])
    job = resolver.resolve(ranks[0])
    assert (job.kind, job.id, job.user) == ("slurm", "977", None) and job.name and job.name.startswith("python")


def test_process_names_and_users_are_the_ones_psutil_gives(tmp_path: Path) -> None:
    """The resolver reads /proc itself (issue 52: psutil was 0.9 MiB of a daemon's memory for a name and a user):
    for every process on this machine, and for one whose command name the kernel cut at 15 characters (an
    executable called a-very-long-process-name, its full name from its command line), the name and user
    psutil.Process gives. Processes that end while being read are passed over."""
    import shutil

    import psutil

    from gpuwear.jobs.resolve import process_name, process_user

    long = tmp_path / "a-very-long-process-name"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", long)
    sleeper = subprocess.Popen([str(long), "60"])
    try:
        pids = [*psutil.pids(), sleeper.pid]
        compared = 0
        for pid in pids:
            try:
                p = psutil.Process(pid)
                theirs = (p.name(), p.username())
                ours = (process_name(pid), process_user(pid))
                if (p.name(), p.username()) != theirs or not p.is_running():
                    continue
            except (psutil.Error, FileNotFoundError, ProcessLookupError):
                continue
            assert ours == theirs, pid
            compared += 1
        assert compared >= 3
        assert process_name(sleeper.pid) == "a-very-long-process-name"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_whose_session_leader_ends_while_read_is_named_by_itself(tmp_path: Path) -> None:
    """A session's leader that ends between the resolver's look at /proc and its read (its directory there, its
    files gone: the kernel removes them as it reaps) leaves the running process named by itself, as a leader that
    ended before the look does, never "process gone" for a process that is running (it was, with psutil too)."""
    proc = tmp_path / "proc"
    me = proc / "4242"
    me.mkdir(parents=True)
    (me / "stat").write_text("4242 (trainer) S 4000 4100 4100 0 -1 4194560 0 0 0 0\n")
    (me / "status").write_text(f"Name:\ttrainer\nUid:\t{os.getuid()}\t{os.getuid()}\t0\t0\n")
    (me / "cgroup").write_text("0::/\n")
    resolver = ProcessResolver(proc=proc)
    assert resolver.resolve(4242).id == "trainer@4100"  # the leader ended before the look
    (proc / "4100").mkdir()  # ... or while it was read
    job = resolver.resolve(4242)
    assert (job.kind, job.id, job.name) == ("process", "trainer@4100", "trainer")
    (proc / "4100" / "stat").write_text("4100 (torchrun) S 1 4100 4100 0 -1 4194560 0 0 0 0\n")
    assert resolver.resolve(4242).id == "torchrun@4100"  # a leader there names the session


def test_unreadable_processes_are_attributed_as_unknown() -> None:
    def denied(pid: int) -> str:
        raise PermissionError(13, "Permission denied")

    assert ProcessResolver(cgroup=denied).resolve(os.getpid()).name == "unknown (no permission)"
    gone = spawn("pass")
    gone.wait()
    assert ProcessResolver().resolve(gone.pid).name == "unknown (process gone)"


def run_with_jobs(scenario: dict[str, Any], seconds: int, resolver: Any = None) -> tuple[Any, WearTracker]:
    rig = make_rig(scenario)
    tracker = WearTracker({}, WearConfig(), job_grace_seconds=60)
    watcher = JobWatcher(resolver or SimulatedJobs(rig.simulation.jobs, ProcessResolver().resolve).resolve)
    for _ in range(seconds):
        snap = rig.run(1)
        jobs = watcher.jobs((g.identity.uuid, [pid for pid, _ in g.sample.processes or ()])
                            for g in snap.gpus if g.sample is not None)
        tracker.observe(snap, rig.clock.monotonic(), rig.clock.wall(), jobs)
    return rig, tracker


def test_real_ddp_job_across_two_gpus_through_fake_nvml(ddp: tuple[subprocess.Popen[str], list[int]]) -> None:
    launcher, ranks = ddp
    other = spawn("import time; time.sleep(60)")
    try:
        scenario = {"gpus": [
            {"product": "h100-sxm", "schedule": [{"kind": "train", "seconds": 300, "pids": [ranks[0]]},
                                                 {"kind": "idle", "seconds": 30},  # a restart within the grace
                                                 {"kind": "train", "seconds": 300, "pids": [ranks[0]]},
                                                 {"kind": "train", "seconds": 300, "pids": [other.pid]},
                                                 {"kind": "idle", "seconds": 9000}]},
            {"product": "rtx4090", "schedule": [{"kind": "train", "seconds": 630, "pids": [ranks[1]]},
                                                {"kind": "idle", "seconds": 9300}]}]}
        rig, tracker = run_with_jobs(scenario, 1200, ProcessResolver(cgroup=lambda pid: "0::/\n").resolve)
        records = tracker.jobs.take()
    finally:
        other.kill()
        other.wait()
    jobs = [r for r in records if r["kind"] == "process"]
    assert len(jobs) == 2, [r["record"] for r in jobs]
    ddp_job = next(r for r in jobs if r["id"].endswith(f"@{launcher.pid}"))
    assert len(ddp_job["gpus"]) == 2 and ddp_job["end"] is not None
    h100 = rig.sampler.snapshot.gpus[0].identity.uuid
    slice_ = next(g for g in ddp_job["gpus"] if g["uuid"] == h100)
    assert slice_["wear"]["observed_seconds"] == pytest.approx(600, abs=2)  # both runs, not the 30 s restart
    idle = [r for r in records if r["kind"] == "idle" and r["gpus"][0]["uuid"] == h100]
    assert sum(r["gpus"][0]["wear"]["observed_seconds"] for r in idle) == pytest.approx(1199 - 900, abs=2)


@pytest.mark.slow
def test_jobs_and_idle_add_up_to_the_gpu_totals() -> None:
    """A simulated multi-hour schedule: every GPU's job and idle lines reconcile with its totals."""
    rig, tracker = run_with_jobs(SHORT_JOBS, 4500)  # type: ignore[arg-type]  # the schedule's loop and a bit
    records = tracker.jobs.take()
    p = WearConfig()
    for status in rig.sampler.snapshot.gpus:
        uuid = status.identity.uuid
        w = tracker.wear(uuid)
        assert w is not None
        slices = [g["wear"] for r in records for g in r["gpus"] if g["uuid"] == uuid]
        assert sum(s["observed_seconds"] for s in slices) == pytest.approx(w.observed_seconds)
        assert sum(s["energy_joules"] for s in slices) == pytest.approx(w.energy_joules)
        aging = sum(thermal_aging_hours(s["temperature_seconds"]["gpu"], 60, 0.7) for s in slices)
        assert aging == pytest.approx(thermal_aging_hours(w.temperature_seconds["gpu"], 60, 0.7))
        closed = sum(n for s in slices for n in s["cycles"].get("gpu", {}).values())
        assert closed == pytest.approx(sum(w.cycles["gpu"].values()))
        kinds = {k: v["seconds"] for k, v in w.kinds.items()}
        assert sum(kinds.values()) == pytest.approx(w.observed_seconds) and kinds["job"] > kinds["idle"] > 0
        assert p.busy_utilization_ratio  # (parameters only matter at read time)
    names = {r["id"] for r in records if r["kind"] == "simulated"}
    assert names == {"resnet50-ddp", "llama-lora"}
    ddp = [r for r in records if r["id"] == "resnet50-ddp"]
    assert all(len(r["gpus"]) == 2 for r in ddp)  # one job spanning both GPUs
    shown = {uuid: {j.id for j in v.jobs} for uuid, v in tracker.views.items()}
    running = [r for r in records if r["end"] is None and r["kind"] == "simulated"]
    for r in running:  # the info metric names a running job on every GPU it runs on
        for g in r["gpus"]:
            if g["end"] == max(s["end"] for rec in records for s in rec["gpus"] if s["uuid"] == g["uuid"]):
                assert r["id"] in shown[g["uuid"]], (r["id"], shown)


@pytest.mark.slow
def test_gpuwear_jobs_command(tmp_path: Path) -> None:
    """Most of a simulated working day: which job ran the card hottest, shares, and totals that match the report.
    (Run until the daemon has ticked enough for 6.7 simulated hours, not for a fixed 20 s of wall time: issue 53's
    trap, and 13 s of the suite.)"""
    from helpers import run_simulated

    run_simulated(tmp_path, SHORT_JOBS, 3000.0, 8.0)  # 400 ticks of 60 simulated s

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpuwear", *args, "--state-dir", str(tmp_path), "--simulated",
                               "short-jobs"],
                              capture_output=True, text=True, timeout=60, check=False)

    doc = json.loads(run("jobs", "--json").stdout)
    report = json.loads(run("report", "--json").stdout)
    assert all(g["observed_seconds"] > 6 * 3600 and g["gaps"] == 0 for g in report["gpus"])
    assert len([j for j in doc["jobs"] if j["id"] == "llama-lora"]) >= 4  # a loop of 83 simulated minutes
    assert doc["hottest"]["max_celsius"] >= 75
    starts = [j["start"] for j in doc["jobs"]]
    assert starts == sorted(starts, reverse=True)  # newest first
    for gpu in report["gpus"]:
        total = doc["totals"][gpu["uuid"]]
        assert total["observed_seconds"] == pytest.approx(gpu["observed_seconds"], rel=1e-6)
        assert total["energy_joules"] == pytest.approx(gpu["energy_joules"], rel=1e-6)
        assert total["thermal_aging_equivalent_hours"] == pytest.approx(
            gpu["thermal_aging_equivalent_hours"]["central"], rel=1e-6)
        shares = [s["share"]["thermal_aging"] for j in doc["jobs"] for s in j["gpus"] if s["uuid"] == gpu["uuid"]]
        assert sum(shares) == pytest.approx(1.0, abs=1e-4)
    text = run("jobs").stdout
    assert "Hottest:" in text and "Share of all GPUs' thermal aging" in text and "resnet50-ddp" in text
    one = json.loads(run("jobs", "llama-lora", "--json").stdout)
    assert len(one["jobs"]) == 1 and one["jobs"][0]["id"] == "llama-lora"
    bad = run("jobs", "--since", "yesterday")
    assert bad.returncode == 2 and "--since: expected a duration" in bad.stderr


def test_a_listing_that_shows_some_lines_counts_all_of_them_as_one_that_shows_all() -> None:
    """jobs.report.document(shown=N) keeps N lines whole and only the totals of the others (the memory a listing
    of a busy box's months takes is what it shows): every figure it gives is the whole listing's, byte for byte."""
    import json as _json
    import random

    from gpuwear.config import WearConfig
    from gpuwear.jobs import report as jobreport
    from gpuwear.wear.accumulate import GpuWear

    rnd = random.Random(3)
    records = []
    for k in range(300):
        uuid = f"GPU-{k % 3}"
        w = GpuWear(uuid, name="card", first_seen=1.75e9 + k * 600, last_seen=1.75e9 + k * 600 + 500)
        w.observed_seconds = 500.0
        w.energy_joules = rnd.uniform(1e4, 1e5)
        w.temperature_seconds = {"gpu": {str(t): rnd.uniform(1, 50) for t in rnd.sample(range(30, 90), 8)}}
        w.cycles = {"gpu": {f"{r}:{60 + r}": rnd.uniform(0, 3) for r in rnd.sample(range(3, 30), 4)}}
        kind = rnd.choice(["slurm", "idle", "slurm"])
        records.append({"record": f"r{k}", "kind": kind, "id": str(k), "user": None, "name": f"n{k % 7}",
                        "start": w.first_seen, "end": w.last_seen, "last_seen": w.last_seen,
                        "gpus": [{"uuid": uuid, "start": w.first_seen, "end": w.last_seen, "wear": w.to_json(),
                                  "max_celsius": {"gpu": float(max(int(t) for t in w.temperature_seconds["gpu"]))},
                                  "events": {}}]})
    records.reverse()  # newest first
    every = jobreport.document(iter(records), {}, WearConfig(), None)
    for shown in (0, 1, 20, 299, 300, 500):
        part = jobreport.document(iter(records), {}, WearConfig(), None, shown=shown)
        assert _json.dumps(part["jobs"]) == _json.dumps(every["jobs"][:shown])
        assert _json.dumps({k: v for k, v in part.items() if k != "jobs"}) == \
            _json.dumps({k: v for k, v in every.items() if k != "jobs"})
        assert jobreport.text(part, {}, shown) == jobreport.text(every, {}, shown)
    assert every["jobs_in_window"] == 300 and every["hottest_label"]


def test_mig_shares_follow_the_compute_slices_of_each_jobs_mig_devices() -> None:
    """Issue 54, item 4 (gpuwear.jobs.mig): a job holds its MIG devices' slices, shared equally with the jobs on the
    same device, summed over several devices; where some job's place or some device's slices are unknown, or they
    add up past the GPU, no share is given (the jobs are then shared equally: never a guess)."""
    from gpuwear.jobs.mig import slice_shares

    slices = {"MIG-a": 1, "MIG-b": 4, "MIG-c": 2}
    assert slice_shares({"small": {"MIG-a"}, "large": {"MIG-b"}}, slices, 7) == pytest.approx(
        {"small": 1 / 7, "large": 4 / 7})
    assert slice_shares({"x": {"MIG-b"}, "y": {"MIG-b"}, "z": {"MIG-a", "MIG-c"}}, slices, 7) == pytest.approx(
        {"x": 2 / 7, "y": 2 / 7, "z": 3 / 7})
    assert slice_shares({"x": {"MIG-a"}, "y": {"MIG-unknown"}}, slices, 7) is None
    assert slice_shares({"x": {"MIG-a"}, "y": set()}, slices, 7) is None
    assert slice_shares({"x": {"MIG-b"}, "y": {"MIG-c"}}, slices, 4) is None  # 6 slices of a 4-slice GPU
    assert slice_shares({}, slices, 7) is None


def test_a_job_not_placed_on_a_mig_device_leaves_the_gpu_shared_equally() -> None:
    """JobWatcher gives shares on a MIG GPU only where every process is placed on a MIG device NVML names."""
    names = {101: "small", 102: "large", 103: "elsewhere"}
    watcher = JobWatcher(lambda pid: Job("simulated", names[pid]))
    places = {"GPU-a": {101: "MIG-a", 102: "MIG-b"}}
    slices = {"GPU-a": ({"MIG-a": 1, "MIG-b": 4}, 7)}
    placed = watcher.jobs([("GPU-a", [101, 102])], places, slices)["GPU-a"]
    assert isinstance(placed, list) and {j.id: j.share for j in placed} == pytest.approx({"small": 1 / 7,
                                                                                          "large": 4 / 7})
    unplaced = watcher.jobs([("GPU-a", [101, 102, 103])], places, slices)["GPU-a"]
    assert isinstance(unplaced, list) and [j.share for j in unplaced] == [None, None, None]
