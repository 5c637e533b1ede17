"""Simulated history that stays apart and in order: one ledger per scenario, simulated time that never goes back into
an earlier run, jobs that end with the simulation, and simulated cards that never pass for real ones."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from gpuwear.ledger import Ledger
from helpers import run_simulated


def gpuwear(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwear", *args], capture_output=True, text=True, timeout=120)


def last_seen(path: Path) -> dict[str, tuple[float, float]]:
    with closing(Ledger.open_read_only(path)) as ledger:
        return {u: (w.first_seen or 0.0, w.last_seen or 0.0) for u, w in ledger.load(2.0).items()}


@pytest.mark.slow
def test_each_scenario_keeps_its_own_history_and_its_time_goes_on(tmp_path: Path) -> None:
    """Before: every scenario and speed shared one ledger; after a run at x3600, simulated time was hours ahead
    and the next run went back into it."""
    run_simulated(tmp_path, "demo", 3600.0, 3.0)  # about 3 simulated hours, ending well ahead of the real clock
    demo = tmp_path / "simulated" / "demo" / "ledger.sqlite"
    first = last_seen(demo)
    assert all(end - time.time() > 3600 for _, end in first.values())  # ahead of the real clock
    run_simulated(tmp_path, "demo", 1.0, 2.0)
    second = last_seen(demo)
    for uuid, (start, end) in second.items():
        assert start == first[uuid][0] and end > first[uuid][1]  # the same history, going on after the first run
    run_simulated(tmp_path, "idle", 60.0, 2.0)
    assert (tmp_path / "simulated" / "idle" / "ledger.sqlite").exists()
    assert last_seen(demo) == second  # the idle scenario did not touch the demo's history
    report = json.loads(gpuwear("report", "--state-dir", str(tmp_path), "--simulated", "idle", "--json").stdout)
    assert report["simulated"] and all(g["busy_seconds"] == 0 for g in report["gpus"])


@pytest.mark.slow
def test_a_stopped_simulation_leaves_no_job_running(tmp_path: Path) -> None:
    """Before: `jobs` listed the job of a stopped simulated run as "(running)"."""
    run_simulated(tmp_path, "demo", 600.0, 3.0)  # 30 simulated minutes: resnet50-ddp runs when it stops
    doc = json.loads(gpuwear("jobs", "--state-dir", str(tmp_path), "--simulated", "--json").stdout)
    assert any(j["id"] == "resnet50-ddp" for j in doc["jobs"])
    assert not [j for j in doc["jobs"] if j["running"]]
    assert "(running)" not in gpuwear("jobs", "--state-dir", str(tmp_path), "--simulated").stdout


@pytest.mark.slow
def test_a_simulated_card_never_passes_for_a_real_one(tmp_path: Path) -> None:
    """Before: `export --simulated` then `import ledger` put a simulated card into the real ledger, unmarked."""
    run_simulated(tmp_path, "demo", 600.0, 2.0)
    exported = gpuwear("export", "0", "--state-dir", str(tmp_path), "--simulated")
    assert exported.returncode == 0, exported.stderr
    doc = json.loads(exported.stdout)
    assert doc["simulated"] is True
    file = tmp_path / "card.json"
    file.write_text(exported.stdout)
    real = tmp_path / "real"
    refused = gpuwear("import", "ledger", str(file), "--state-dir", str(real))
    assert refused.returncode == 1 and "the history of a simulated GPU" in refused.stderr
    assert not (real / "ledger.sqlite").exists() or not json.loads(gpuwear(
        "report", "--state-dir", str(real), "--json").stdout)["gpus"]
    other = gpuwear("import", "ledger", str(file), "--state-dir", str(tmp_path / "other"), "--simulated", "lab")
    assert other.returncode == 0, other.stderr  # into a simulation's ledger: taken
    allowed = gpuwear("import", "ledger", str(file), "--state-dir", str(real), "--allow-simulated")
    assert allowed.returncode == 0 and "1 part(s) imported" in allowed.stdout
    real_export = json.loads(gpuwear("export", doc["uuid"], "--state-dir", str(real)).stdout)
    assert "simulated" not in real_export  # (a real ledger's exports carry no mark)


@pytest.mark.slow
def test_forget_removes_one_gpu_and_nothing_else(tmp_path: Path) -> None:
    """`gpuwear forget GPU`: its record, imports, events and job shares go; the other GPU's figures stay exactly;
    without a terminal it needs --yes. Before: no way to forget a GPU."""
    run_simulated(tmp_path, "demo", 600.0, 3.0)
    real = Path(__file__).parent / "fixtures" / "traces" / "rtx6000ada_burst-then-idle_1s_llm-gpu-stress.csv"
    # the real log, named as the simulated H100 it is imported under (a log of another card is refused: never
    # merged into this one)
    trace = tmp_path / "h100.csv"
    trace.write_text(real.read_text().replace("NVIDIA RTX 6000 Ada Generation", "NVIDIA H100 80GB HBM3"))
    h100 = "GPU-00000001-5111-4a7e-9c3d-000000000001"
    assert gpuwear("import", "nvidia-smi", str(trace), "--gpu", h100, "--timezone", "UTC", "--state-dir",
                   str(tmp_path), "--simulated").returncode == 0
    before = json.loads(gpuwear("report", "--state-dir", str(tmp_path), "--simulated", "--json").stdout)
    asked = gpuwear("forget", "1", "--state-dir", str(tmp_path), "--simulated")
    assert asked.returncode == 2 and "pass --yes" in asked.stderr  # no terminal here: nothing is removed
    assert json.loads(gpuwear("report", "--state-dir", str(tmp_path), "--simulated", "--json").stdout) == before
    done = gpuwear("forget", "1", "--state-dir", str(tmp_path), "--simulated", "--yes")
    assert done.returncode == 0 and "forgot GPU " + h100 in done.stdout and "1 imports" in done.stdout, done
    after = json.loads(gpuwear("report", "--state-dir", str(tmp_path), "--simulated", "--json").stdout)
    assert [g["uuid"] for g in after["gpus"]] == [g["uuid"] for g in before["gpus"] if g["uuid"] != h100]
    assert after["gpus"][0] == next(g for g in before["gpus"] if g["uuid"] != h100)  # the other one, exactly
    jobs = json.loads(gpuwear("jobs", "--state-dir", str(tmp_path), "--simulated", "--json").stdout)
    assert jobs["jobs"] and all(s["uuid"] != h100 for j in jobs["jobs"] for s in j["gpus"])
    again = gpuwear("forget", h100, "--state-dir", str(tmp_path), "--simulated", "--yes")
    assert again.returncode == 2 and "no such GPU" in again.stderr
