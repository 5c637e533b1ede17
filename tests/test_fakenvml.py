"""The fake NVML library serves any pynvml client, as a driver would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from conftest import Rig, make_rig
from gpuwear.backends.nvml import install_library


def test_plain_pynvml_client_reads_simulated_gpus(demo: Rig) -> None:
    # Only pynvml calls here: a client that knows nothing of gpuwear.
    assert pynvml.nvmlDeviceGetCount() == 2
    names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]
    assert names == ["NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3"]
    h100 = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetPciInfo(h100).busId == "00000000:37:00.0"
    assert pynvml.nvmlDeviceGetMemoryInfo(h100).total == 80 * 2**30
    assert 0 < pynvml.nvmlDeviceGetTemperature(h100, pynvml.NVML_TEMPERATURE_GPU) < 100
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h100) == []


def test_unknown_function_is_function_not_found(demo: Rig) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetBoardPartNumber(handle)


def test_not_supported_like_a_consumer_card(demo: Rig) -> None:
    rtx = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetEccMode(rtx)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperatureThreshold(rtx, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
    assert pynvml.nvmlDeviceGetNumFans(rtx) == 2
    h100 = pynvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed_v2(h100, 0)


def test_geforce_boards_give_no_serial_as_real_ones_do() -> None:
    """Issue 55: the fake answered a serial on two of its three GeForce products (the RTX 4060 Laptop, the GTX 1080
    Ti), where a real GeForce board gives none: nvidia_gpu_exporter's recorded query of an RTX 2080 SUPER
    (internal/exporter/testdata/query.txt) reads "serial [N/A]", nvidia-smi's word for NOT_SUPPORTED. Every GeForce
    product of the fake now refuses nvmlDeviceGetSerial; the others answer one."""
    from gpuwear.sim.simulated import PRODUCTS

    keys = [k for k, p in PRODUCTS.items() if not p.name.startswith("Orin")]
    rig = make_rig({"gpus": [{"product": k} for k in keys]})
    try:
        for i, key in enumerate(keys):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            if "GeForce" in PRODUCTS[key].name:
                with pytest.raises(pynvml.NVMLError_NotSupported):
                    pynvml.nvmlDeviceGetSerial(handle)
            else:
                assert pynvml.nvmlDeviceGetSerial(handle), key
        assert sum("GeForce" in PRODUCTS[k].name for k in keys) == 3
    finally:
        rig.backend.close()


def test_calls_before_init_are_uninitialized(demo: Rig) -> None:
    pynvml.nvmlShutdown()
    try:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlInit()


def test_error_strings_come_from_the_library(demo: Rig) -> None:
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "GPU is lost"


def test_library_can_be_uninstalled(demo: Rig) -> None:
    install_library(None)
    assert pynvml.nvmlLib is None
    install_library(demo.library)
    assert pynvml.nvmlDeviceGetCount() == 2


def test_any_pynvml_program_runs_over_the_fake_unchanged(tmp_path: Path) -> None:
    client = tmp_path / "client.py"
    client.write_text(
        "import sys, pynvml\n"
        "pynvml.nvmlInit()\n"
        "for i in range(pynvml.nvmlDeviceGetCount()):\n"
        "    h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
        "    print(pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetPowerUsage(h) > 0, sys.argv[1])\n"
        "sys.exit(3)\n")
    result = subprocess.run([sys.executable, "-m", "gpuwear.sim.fakenvml", "--scenario", "training",
                             str(client), "hello"], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == ["NVIDIA H100 80GB HBM3 True hello", "Tesla V100-PCIE-16GB True hello"]


def test_the_energy_counter_answers_from_volta_on_as_nvml_h_says() -> None:
    """nvml.h gives nvmlDeviceGetTotalEnergyConsumption (and its field) "for Volta or newer": the fake's Pascal
    card answered it. A GTX 1080 Ti now reports it not supported, and gpuwear integrates its power instead; the V100
    beside it keeps its counter."""
    run = [{"kind": "train", "seconds": 3600, "utilization": 0.9}]
    rig = make_rig({"description": "Pascal and Volta", "driver": "r470",
                    "gpus": [{"product": "gtx1080ti", "schedule": run}, {"product": "v100", "schedule": run}]})
    rig.run(30)
    pascal, volta = rig.sampler.snapshot.gpus
    assert pascal.unavailable.get("energy_joules") == "not_supported" and pascal.energy_joules_total is None
    assert "energy_joules" not in volta.unavailable and (volta.energy_joules_total or 0) > 0
    assert pascal.sample is not None and (pascal.sample.power_watts or 0) > 0  # what its energy is integrated from
