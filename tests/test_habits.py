"""The habits users bring: `--gpu 0` (an index, a UUID or the start of one, everywhere), `jobs` that does not print a
day of lines, `doctor` counting every GPU the ledger knows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_simulated, slow_fixture

TRACE = Path(__file__).parent / "fixtures" / "traces" / "rtx6000ada_burst-then-idle_1s_llm-gpu-stress.csv"
RTX, H100 = "GPU-00000001-5111-4a7e-9c3d-000000000000", "GPU-00000001-5111-4a7e-9c3d-000000000001"


def gpuwear(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwear", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
@slow_fixture
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two simulated GPUs (index 0 and 1) running short jobs for about six simulated hours, and one imported
    trace."""
    folder = tmp_path_factory.mktemp("state")
    run_simulated(folder, str(Path(__file__).parent / "scenarios" / "short-jobs.yaml"), 3600.0, 6.0)
    r = gpuwear("import", "nvidia-smi", str(TRACE), "--gpu", "GPU-trace-0001", "--timezone", "UTC",
                "--state-dir", str(folder), "--simulated", "short-jobs")
    assert r.returncode == 0, r.stderr
    return folder


def _report(state: Path, gpu: str) -> subprocess.CompletedProcess[str]:
    return gpuwear("report", "--state-dir", str(state), "--simulated", "short-jobs", "--json", "--gpu", gpu)


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "uuid"), [("0", RTX), ("1", H100), (H100, H100), (H100.lower(), H100),
                                           ("GPU-trace", "GPU-trace-0001"), ("trace", "GPU-trace-0001")])
def test_gpu_by_index_uuid_or_its_start(state: Path, spec: str, uuid: str) -> None:
    """Before: only the full UUID (`--gpu 0` was refused)."""
    r = _report(state, spec)
    assert r.returncode == 0, r.stderr
    assert [g["uuid"] for g in json.loads(r.stdout)["gpus"]] == [uuid]


@pytest.mark.parametrize(("spec", "says"), [("GPU-00000001", "the start of 2 GPUs' UUIDs"), ("7", "no such GPU"),
                                            ("GPU-nope", "no such GPU")])
def test_a_gpu_that_is_not_one_is_refused_with_the_known_ones(state: Path, spec: str, says: str) -> None:
    r = _report(state, spec)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    if "no such" in says:
        assert f"0 {RTX}" in r.stderr and "GPU-trace-0001" in r.stderr  # the known GPUs, with their indexes


def test_jobs_and_export_take_the_same_gpu(state: Path) -> None:
    by_index = gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs", "--json", "--gpu", "1")
    by_uuid = gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs", "--json", "--gpu", H100)
    assert by_index.returncode == 0 and json.loads(by_index.stdout) == json.loads(by_uuid.stdout)
    assert {s["uuid"] for j in json.loads(by_index.stdout)["jobs"] for s in j["gpus"]} == {H100}
    exported = gpuwear("export", "0", "--state-dir", str(state), "--simulated", "short-jobs")
    assert exported.returncode == 0 and json.loads(exported.stdout)["uuid"] == RTX


@pytest.mark.slow
def test_jobs_lists_the_newest_and_says_how_many_more(state: Path) -> None:
    """Before: 119 lines for 20 simulated hours, with no limit."""
    full = json.loads(gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs", "--json").stdout)
    assert len(full["jobs"]) > 20 and full["jobs_in_window"] == len(full["jobs"])
    text = gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs").stdout
    rows = [line for line in text.splitlines() if line[:1] not in ("", " ") and "JOB" not in line
            and not line.startswith(("Jobs,", "idle", "GPU's", "...", "Hottest", "Share"))]
    assert len({row[:44] for row in rows}) <= 20
    assert f"... and {len(full['jobs']) - 20} older line(s)" in text
    everything = gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs", "--all").stdout
    assert "older line(s)" not in everything and len(everything) > len(text)
    five = json.loads(gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs", "--json", "--limit",
                              "5").stdout)
    assert [j["record"] for j in five["jobs"]] == [j["record"] for j in full["jobs"][:5]]
    assert five["totals"] == full["totals"] and five["jobs_in_window"] == len(full["jobs"])  # shares: the window's
    bad = gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs", "--limit", "0")
    assert bad.returncode == 2 and "--limit" in bad.stderr


def test_jobs_show_the_index_nvidia_smi_gives(state: Path) -> None:
    doc = json.loads(gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs", "--json", "--gpu",
                             "0").stdout)
    text = gpuwear("jobs", "--state-dir", str(state), "--simulated", "short-jobs", "--gpu", "0", "--limit", "3").stdout
    rows = text.splitlines()
    line = rows[next(i for i, row in enumerate(rows) if row.startswith("JOB")) + 1]  # the newest line, under the header
    assert doc["jobs"] and line.split()[line.split().index("h") + 1] == "0"  # the GPU column, after the duration


def test_doctor_counts_every_gpu_of_the_ledger(state: Path) -> None:
    """Before: "0 GPU(s) recorded" while report listed the imported ones too."""
    out = gpuwear("doctor", "--simulate", str(Path(__file__).parent / "scenarios" / "short-jobs.yaml"), "--state-dir",
                  str(state)).stdout
    assert "3 GPU(s) recorded (1 known from imported logs only)" in out, out
