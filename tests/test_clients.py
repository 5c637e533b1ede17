"""Third-party pynvml programs judge the fake NVML library: gpustat, nvitop, nvitop-exporter, NVIDIA's example.py
and py3nvml's XmlDeviceQuery (through its own binding).

Each client runs in-process over a test rig's fake (``make_rig``), wrapped by a recorder that
notes every C function the client looks up, whether the fake has it, and the nvmlReturn of
every call. The tests assert that each client (a) does not crash, (b) meets no
FUNCTION_NOT_FOUND for a function that real drivers export (``DRIVER_HAS``), and (c) reads
the same temperature, power, memory, fan speed and process PIDs as gpuwear's own sampler on
the same simulated GPU at the same simulated instant (the rig's clock stands still while the
client runs). nvitop-exporter and ``nvitop --once`` also run as the user would, through
``python -m gpuwear.sim.fakenvml``.

The clients are test dependencies (pyproject's ``test`` extra), pinned: their NVML calls are what
these tests judge the fake by.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pynvml
import pytest

from conftest import make_rig
from gpuwear.backends.nvml import install_library
from gpuwear.sim.drivers import NEWEST, PROFILES


def driver_has(scenario: str) -> frozenset[str]:
    """The C functions the scenario's driver release exports (its nvml.h, sim.nvml_symbols): a client that
    meets FUNCTION_NOT_FOUND for one of these fails, because that real driver would have answered."""
    return make_rig(scenario_source(scenario)).library.profile.symbols


SCENARIOS = ("demo", "training", "pids", "r470", "mig", "wsl2", "vgpu")
# the judges of the fake (NVIDIA's example.py, py3nvml) also over every other driver profile's library
JUDGED = SCENARIOS + tuple(f"driver-{d}" for d in PROFILES if d not in ("r470", NEWEST))
SETTLE_SECONDS = 200.0  # demo: both GPUs training (fans spinning, a job's process on each)
MiB = 2**20
ERROR_UNKNOWN = 999  # the fake answers this when one of its functions raised


def scenario_source(name: str) -> str | dict[str, object]:
    """A built-in scenario, or "pids": the demo's two cards running this (real) test process,
    so that clients which look PIDs up on the host (psutil) keep them."""
    if name not in ("pids", "r470", "mig", "wsl2", "vgpu") and not name.startswith("driver-"):
        return name
    run = [{"kind": "train", "seconds": 3600, "utilization": 0.9, "pids": [os.getpid()]}]
    if name == "mig":  # an A100 with MIG on and two MIG devices, read as root, the test process on the first
        return {"description": "an A100 with two MIG devices beside an H100, the test process on each",
                "privileged": True, "gpus": [{"product": "a100-sxm", "mig": True, "mig_devices": ["3g.40gb", "4g.40gb"],
                                              "schedule": run}, {"product": "h100-sxm", "schedule": run}]}
    if name == "r470":  # a Pascal box on the last Kepler-era branch: no _v3 process functions, no NumFans
        return {"description": "R470 driver, GTX 1080 Ti and V100 running the test process", "driver": "r470",
                "gpus": [{"product": "gtx1080ti", "schedule": run}, {"product": "v100", "schedule": run}]}
    if name == "wsl2":  # a GeForce under WSL2: the library says the Windows driver's version, has no minor number
        return {"description": "WSL2: an RTX 4090 through the Windows driver", "driver": "r550",
                "windows_driver": "552.55", "gpus": [{"product": "rtx4090", "schedule": run}]}
    if name.startswith("driver-"):  # the demo's cards on that release's library
        return {"description": f"the demo's cards on {name[7:]}", "driver": name[7:],
                "gpus": [{"product": "rtx4090", "schedule": run}, {"product": "h100-sxm", "schedule": run}]}
    if name == "vgpu":  # a virtual machine's vGPU of an A100 (nvmlDeviceGetVirtualizationMode: VGPU)
        return {"description": "a vGPU guest: an A100-40C running the test process",
                "gpus": [{"product": "a100-sxm", "vgpu": "NVIDIA A100-40C", "schedule": run}]}
    return {"description": "the demo's cards running the test process",
            "gpus": [{"product": "rtx4090", "schedule": run}, {"product": "h100-sxm", "schedule": run}]}


class RecordingLibrary:
    """Wraps a fake library: which C functions the client asked for, which were missing, and
    the nvmlReturn of each call. Only the recording thread counts (gpuwear's own event thread
    may call the same library meanwhile)."""

    def __init__(self, library: object) -> None:
        self._library = library
        self._thread = threading.get_ident()
        self.asked: Counter[str] = Counter()
        self.missing: set[str] = set()
        self.returns: defaultdict[str, Counter[Any]] = defaultdict(Counter)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        mine = threading.get_ident() == self._thread
        if mine:
            self.asked[name] += 1
        try:
            fn = getattr(self._library, name)
        except AttributeError:
            if mine:
                self.missing.add(name)
            raise

        def call(*args: Any) -> Any:
            ret = fn(*args)
            if threading.get_ident() == self._thread:
                self.returns[name][ret if isinstance(ret, int) else type(ret).__name__] += 1
            return ret

        call.__name__ = name
        return call

    def table(self) -> str:
        return "\n".join(f"  {name:50s} {'MISSING' if name in self.missing else dict(self.returns.get(name, {}))}"
                         for name in sorted(self.asked))


@dataclass
class ClientRun:
    client: str
    scenario: str
    result: Any  # what the client produced (None when it crashed)
    error: str | None  # the crash, as a traceback or message
    problems: list[str]  # per-member errors (nvitop's Device API)
    recorder: RecordingLibrary
    truth: list[dict[str, Any]]  # gpuwear's readings per GPU index


def gpuwear_view(rig: Any) -> list[dict[str, Any]]:
    """What gpuwear read at the rig's current instant, per GPU, in the clients' terms."""
    view = []
    for status in rig.sampler.snapshot.gpus:
        s = status.sample
        assert s is not None, f"gpuwear has no sample of GPU {status.identity.index}"
        fans = s.fan_speed_ratio or ()
        view.append({
            "index": status.identity.index,
            "name": status.identity.name,
            "temperature": s.temperature_gpu_celsius,
            "power_watts": s.power_watts,
            "memory_used": s.memory_used_bytes,
            "memory_total": status.identity.memory_total_bytes,
            "fan_percent": None if not fans or fans[0] is None else fans[0] * 100,
            "pids": {pid for pid, _ in (s.processes or ())},
        })
    return view


def run_client(client: str, scenario: str, body: Callable[[], tuple[Any, list[str]]]) -> ClientRun:
    """Run ``body`` over a fresh rig of ``scenario``, settled, with the recorder installed."""
    rig = make_rig(scenario_source(scenario))
    previous = pynvml.nvmlLib
    try:
        rig.run(SETTLE_SECONDS)
        truth = gpuwear_view(rig)
        recorder = RecordingLibrary(rig.library)
        install_library(recorder)
        result, problems, error = None, [], None
        try:
            result, problems = body()
        except BaseException as exc:
            if isinstance(exc, pytest.skip.Exception):
                raise
            error = traceback.format_exc()[-1500:]
        install_library(rig.library)
        return ClientRun(client, scenario, result, error, problems, recorder, truth)
    finally:
        rig.backend.close()
        install_library(previous)


# -- the clients ------------------------------------------------------------------------------


def _gpustat() -> tuple[Any, list[str]]:
    """``gpustat --json``, in-process. gpustat patches two pynvml attributes on import; they are
    undone at once and applied only while gpustat runs, so gpuwear's own tests never see them."""
    saved = {name: getattr(pynvml, name) for name in ("_nvmlGetFunctionPointer", "nvmlDeviceGetMemoryInfo")}
    try:
        cli = pytest.importorskip("gpustat.cli")
        patches = pytest.importorskip("gpustat.nvml").pynvml_monkeypatch
    finally:
        for name, value in saved.items():
            setattr(pynvml, name, value)
    out, err = io.StringIO(), io.StringIO()
    sigpipe = signal.getsignal(signal.SIGPIPE)  # gpustat's main sets SIG_DFL: a later EPIPE would kill pytest
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pynvml, "_nvmlGetFunctionPointer", patches._nvmlGetFunctionPointer)
        mp.setattr(pynvml, "nvmlDeviceGetMemoryInfo", patches.nvmlDeviceGetMemoryInfo)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main("gpustat", "--json")
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise RuntimeError(f"gpustat --json exited {exc.code}: {err.getvalue().strip()}") from exc
            finally:
                signal.signal(signal.SIGPIPE, sigpipe)
    return json.loads(out.getvalue()), []


def _reset_nvitop() -> Any:
    """nvitop caches the physical devices and the CUDA_VISIBLE_DEVICES parse per process."""
    device_module = pytest.importorskip("nvitop.api.device")
    device_module._PHYSICAL_DEVICE_ATTRS = None
    device_module._parse_cuda_visible_devices.cache_clear()
    return device_module


# Members that call no NVML function or only enter a context; everything else public is read.
NVITOP_SKIPPED = {"oneshot", "GPU_PROCESS_CLASS", "SNAPSHOT_KEYS", "UUID_PATTERN", "cuda", "from_indices",
                  "from_cuda_indices", "normalize_cuda_visible_devices", "parse_cuda_visible_devices"}


def _nvitop_members(cls: type) -> list[tuple[str, str]]:
    """(name, kind) of each public member of ``cls`` readable without arguments."""
    import inspect

    members = []
    for name in sorted(dir(cls)):
        if name.startswith("_") or name in NVITOP_SKIPPED:
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, property):
            members.append((name, "property"))
            continue
        fn = getattr(cls, name)
        if not callable(fn) or isinstance(static, type):
            continue
        bound = isinstance(static, (staticmethod, classmethod))
        params = list(inspect.signature(fn).parameters.values())[0 if bound else 1:]
        if all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            members.append((name, "static" if bound else "method"))
    return members


def _nvitop_device_api() -> tuple[Any, list[str]]:
    """Every public property and no-argument method of every ``nvitop.Device``."""
    _reset_nvitop()
    from nvitop import Device

    problems: list[str] = []
    result: dict[str, Any] = {"static": {}, "devices": []}
    for name, kind in _nvitop_members(Device):
        if kind == "static":
            try:
                result["static"][name] = getattr(Device, name)()
            except Exception:
                problems.append(f"Device.{name}(): {traceback.format_exc(limit=-3)}")
    for device in Device.all():
        values: dict[str, Any] = {}
        for name, kind in _nvitop_members(type(device)):
            if kind == "static":
                continue
            try:
                value = getattr(device, name)
                values[name] = value() if kind == "method" else value
            except Exception:
                problems.append(f"Device({device.index}).{name}: {traceback.format_exc(limit=-3)}")
        with device.oneshot():  # the snapshot path nvitop's own UI and the exporter use
            values["oneshot"] = (device.temperature(), device.power_usage(), device.memory_used())
        result["devices"].append(values)
    return result, problems


def _nvitop_exporter() -> tuple[Any, list[str]]:
    """nvitop-exporter's collector, as its CLI builds it, serving one scrape of /metrics."""
    _reset_nvitop()
    exporter_module = pytest.importorskip("nvitop_exporter.exporter")
    from nvitop import Device
    from prometheus_client import CollectorRegistry, start_http_server

    physical = Device.from_indices(range(Device.count()))
    devices = physical + [mig for device in physical for mig in device.mig_devices()]
    registry = CollectorRegistry()
    exporter = exporter_module.PrometheusExporter(devices, "gpuwear-test", registry=registry, interval=1.0)
    exporter.update_host()
    for device in devices:
        exporter.update_device(device)
    httpd, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{httpd.server_port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
    return text, []


CLIENTS: dict[str, Callable[[], tuple[Any, list[str]]]] = {
    "gpustat": _gpustat, "nvitop": _nvitop_device_api, "nvitop-exporter": _nvitop_exporter}


@cache
def client_run(client: str, scenario: str) -> ClientRun:
    return run_client(client, scenario, CLIENTS[client])


# -- what each client read, in common terms ----------------------------------------------------


def _none_if_na(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "N/A":
        return None
    return value


def readings(run: ClientRun) -> list[dict[str, Any]]:
    """Per GPU index: temperature °C, power W, memory used/total B, fan %, PIDs."""
    if run.client == "gpustat":
        return [{"index": g["index"], "temperature": g["temperature.gpu"], "power_watts": g["power.draw"],
                 "memory_used_mib": g["memory.used"], "memory_total_mib": g["memory.total"],
                 "fan_percent": g["fan.speed"],
                 "pids": None if g["processes"] is None else {p["pid"] for p in g["processes"]}}
                for g in run.result["gpus"]]
    if run.client == "nvitop":
        out = []
        for d in run.result["devices"]:
            power = _none_if_na(d["power_usage"])
            out.append({"index": d["index"], "temperature": _none_if_na(d["temperature"]),
                        "power_watts": None if power is None else power / 1000,
                        "memory_used": _none_if_na(d["memory_used"]), "memory_total": _none_if_na(d["memory_total"]),
                        "fan_percent": _none_if_na(d["fan_speed"]), "pids": set(d["processes"])})
        return out
    from prometheus_client.parser import text_string_to_metric_families

    per_gpu: dict[int, dict[str, Any]] = {}
    for family in text_string_to_metric_families(run.result):
        for sample in family.samples:
            if "index" not in sample.labels or ":" in sample.labels["index"]:
                continue
            gpu = per_gpu.setdefault(int(sample.labels["index"]), {"pids": set()})
            if "pid" in sample.labels:  # process_info_info and the per-process gauges
                gpu["pids"].add(int(sample.labels["pid"]))
            else:
                gpu[sample.name] = _none_if_na(sample.value)
    out = []
    for index, g in sorted(per_gpu.items()):
        used, total = g.get("gpu_memory_used_MiB"), g.get("gpu_memory_total_MiB")
        out.append({"index": index, "temperature": g.get("gpu_temperature_C"),
                    "power_watts": g.get("gpu_power_usage_W"),
                    "memory_used": None if used is None else used * MiB,
                    "memory_total": None if total is None else total * MiB,
                    "fan_percent": g.get("gpu_fan_speed_Percentage"), "pids": g["pids"]})
    return out


def _close(a: Any, b: Any, tolerance: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(float(a) - float(b)) <= tolerance


def disagreements(run: ClientRun) -> list[str]:
    """Where the client's readings differ from gpuwear's, one line each."""
    seen = readings(run)
    problems = []
    if [g["index"] for g in seen] != [t["index"] for t in run.truth]:
        return [f"GPU indexes {[g['index'] for g in seen]} != gpuwear's {[t['index'] for t in run.truth]}"]
    # PIDs that do not exist on this host: gpustat drops them (psutil says NoSuchProcess)
    host_only = run.client == "gpustat"
    for got, truth in zip(seen, run.truth, strict=True):
        where = f"GPU {truth['index']} ({truth['name']})"
        checks: list[tuple[str, Any, Any, float]] = [
            ("temperature °C", got["temperature"], truth["temperature"], 1.0),
            ("power W", got["power_watts"], truth["power_watts"], 1.0),
            ("fan %", got["fan_percent"], truth["fan_percent"], 1.0),
        ]
        if "memory_used_mib" in got:  # gpustat: whole MiB
            used, total = truth["memory_used"], truth["memory_total"]
            checks += [("memory used MiB", got["memory_used_mib"], None if used is None else int(used) // MiB, 0),
                       ("memory total MiB", got["memory_total_mib"], None if total is None else total // MiB, 0)]
        else:
            checks += [("memory used B", got["memory_used"], truth["memory_used"], 1024),
                       ("memory total B", got["memory_total"], truth["memory_total"], 1024)]
        for what, value, expected, tolerance in checks:
            if not _close(value, expected, tolerance):
                problems.append(f"{where}: {what} {value!r}, gpuwear {expected!r}")
        expected_pids = {p for p in truth["pids"] if not host_only or _pid_exists(p)}
        if got["pids"] != expected_pids:
            problems.append(f"{where}: PIDs {got['pids']!r}, gpuwear {expected_pids!r}")
    return problems


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid < 2**22
    return True


# -- the tests ----------------------------------------------------------------------------------

# The newest driver for every client; R470 for gpustat (nvitop's Device API asks R510+ functions by design).
PARAMS = [pytest.param(client, scenario, id=f"{client}-{scenario}") for client in CLIENTS for scenario in SCENARIOS
          if scenario != "r470" or client == "gpustat"]


@pytest.mark.parametrize(("client", "scenario"), PARAMS)
def test_client_runs_without_crashing(client: str, scenario: str) -> None:
    run = client_run(client, scenario)
    assert run.error is None, f"{client} crashed over the fake ({scenario}):\n{run.error}\n{run.recorder.table()}"
    problems = run.problems
    if scenario == "mig":  # nvitop follows CUDA's enumeration: with a GPU in MIG mode first, CUDA sees its first MIG
        # device and no whole GPU (NVIDIA's MIG user guide, "CUDA Device Enumeration"): by design, not the fake
        problems = [p for p in problems if not ("cuda_index" in p and "not visible to CUDA applications" in p)]
    assert not problems, f"{client} raised over the fake ({scenario}):\n" + "\n".join(problems)
    unknown = sorted(name for name, codes in run.recorder.returns.items() if ERROR_UNKNOWN in codes)
    assert not unknown, f"the fake failed inside {unknown} (NVML_ERROR_UNKNOWN); see its log"


@pytest.mark.parametrize(("client", "scenario"), PARAMS)
def test_client_meets_no_missing_driver_function(client: str, scenario: str) -> None:
    run = client_run(client, scenario)
    missing = sorted(run.recorder.missing & driver_has(scenario))
    assert not missing, (f"{client} ({scenario}) met FUNCTION_NOT_FOUND for functions its driver exports: "
                         f"{missing}\nall it asked for:\n{run.recorder.table()}")


# nvitop remembers for the life of its process whether the library exports a function (libnvml's
# _nvml_has_function): after a run over the newest driver it asks nvmlDeviceGetTemperatureV of the WSL2 scenario's
# R550 library, which lacks it, and reads N/A. One process over two libraries is this test's doing, not a user's:
# its readings are compared on the scenarios of the newest driver only (it still runs over WSL2's, above).
READ_PARAMS = [p for p in PARAMS if not (p.values[1] == "wsl2" and str(p.values[0]).startswith("nvitop"))]


@pytest.mark.parametrize(("client", "scenario"), READ_PARAMS)
def test_client_reads_what_gpuwear_reads(client: str, scenario: str) -> None:
    run = client_run(client, scenario)
    assert run.result is not None, f"{client} produced nothing ({scenario}):\n{run.error}"
    problems = disagreements(run)
    assert not problems, f"{client} and gpuwear disagree ({scenario}):\n" + "\n".join(problems)


def _nvidia_example() -> tuple[Any, list[str]]:
    """NVIDIA's own sample client, example.py as nvidia-ml-py ships it beside pynvml: its deviceQuery() (an XML
    text; it writes each NVMLError in place of the value)."""
    import importlib.util

    path = Path(pynvml.__file__).with_name("example.py")
    spec = importlib.util.spec_from_file_location("nvidia_ml_py_example", path)
    assert spec is not None and spec.loader is not None, f"no example.py beside {pynvml.__file__}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.deviceQuery(), []


@pytest.mark.parametrize("scenario", JUDGED)
def test_nvidias_example_names_every_gpu_without_a_missing_function(scenario: str) -> None:
    """NVIDIA's example.py met FUNCTION_NOT_FOUND for nvmlDeviceGetVirtualizationMode (every branch exports it)
    and for nvmlDeviceGetGridLicensableFeatures_v4: the fake answers both as a bare-metal GPU does."""
    run = run_client("nvidia-example", scenario, _nvidia_example)
    assert run.error is None, run.error
    missing = sorted(run.recorder.missing & driver_has(scenario))
    assert not missing, f"FUNCTION_NOT_FOUND for functions the driver exports: {missing}\n{run.recorder.table()}"
    gpus = re.findall(r"<product_name>(.*?)</product_name>.*?<uuid>(.*?)</uuid>.*?<virtualization_mode>(.*?)<",
                      run.result, re.S)
    mode = "VGPU" if scenario == "vgpu" else "None"  # what example.py writes for a guest's vGPU and bare metal
    assert [(name, m) for name, _, m in gpus] == [(t["name"], mode) for t in run.truth], run.result
    assert "Not Found" not in run.result and "Unknown" not in run.result, run.result
    brands = re.findall(r"<product_brand>(.*?)</product_brand>", run.result)
    expected = {"NVIDIA GeForce RTX 4090": "GeForce", "NVIDIA H100 80GB HBM3": "NVIDIA",
                "NVIDIA A100-SXM4-80GB": "NVIDIA", "NVIDIA GeForce GTX 1080 Ti": "GeForce",
                "Tesla V100-PCIE-16GB": "Tesla", "NVIDIA A100-40C": "NVIDIA vGPU for Compute"}  # a C-series vGPU
    assert brands == [expected[t["name"]] for t in run.truth], run.result  # the product line, not the fan count


PY3NVML_BRANDS = 5  # py3nvml 0.2.7 (2022) knows nvmlBrandType_t up to GEFORCE (5); its XmlDeviceQuery raises
# KeyError on a newer brand (NVIDIA 14, an H100's) before anything after it is asked, over a real driver as here
# (pynvml's old smi.DeviceQuery met the same on brand 10: rapidsai-community/notebooks-contrib #338)


def _py3nvml() -> tuple[Any, list[str]]:
    """py3nvml's XmlDeviceQuery (its nvidia-smi -q in XML, NVMLError text in place of a value): py3nvml carries its
    own ctypes binding, pointed at the same library the recorder wraps. Its brand table is widened to "Unknown"
    for brands it predates (PY3NVML_BRANDS), so that the query goes on past them."""
    from py3nvml import nvidia_smi
    from py3nvml import py3nvml as binding

    binding.nvmlLib = pynvml.nvmlLib
    binding._nvmlGetFunctionPointer_cache = {}  # each run's library, not the one a previous run cached
    brand = binding.nvmlDeviceGetBrand
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nvidia_smi, "nvmlDeviceGetBrand", lambda h: (lambda b: b if b <= PY3NVML_BRANDS else 0)(brand(h)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "this function is deprecated"
            warnings.simplefilter("ignore", DeprecationWarning)  # its logger.warn
            return nvidia_smi.XmlDeviceQuery(), []


# the boards' PCI device IDs (pci.ids, vendor 10de): GP102 [GeForce GTX 1080 Ti] 1b06, GV100GL [Tesla V100 PCIe 16GB]
# 1db4, GA100 [A100 SXM4 80GB] 20b2, AD102 [GeForce RTX 4090] 2684, GH100 [H100 SXM5 80GB] 2330; a vGPU of an A100 as
# the A100 it shares
PCI_DEVICE_IDS = {"NVIDIA GeForce GTX 1080 Ti": 0x1B06, "Tesla V100-PCIE-16GB": 0x1DB4, "NVIDIA A100-SXM4-80GB": 0x20B2,
                  "NVIDIA GeForce RTX 4090": 0x2684, "NVIDIA H100 80GB HBM3": 0x2330, "NVIDIA A100-40C": 0x20B2}


@pytest.mark.parametrize("scenario", JUDGED)
def test_py3nvml_device_query_meets_no_missing_function(scenario: str) -> None:
    """py3nvml's XmlDeviceQuery met FUNCTION_NOT_FOUND for nvmlDeviceGetPciInfo_v2 (every branch exports it) and,
    past it, for 18 more functions its driver exports (accounting, applications clocks, board id, inforom, VBIOS,
    memory error counter by location, supported clocks, the process name): the fake answers each as nvml.h says for
    the product (NOT_SUPPORTED where it says the product has no such feature)."""
    run = run_client("py3nvml", scenario, _py3nvml)
    assert run.error is None, f"{run.error}\n{run.recorder.table()}"
    missing = sorted(run.recorder.missing & driver_has(scenario))
    assert not missing, f"FUNCTION_NOT_FOUND for functions the driver exports: {missing}\n{run.recorder.table()}"
    unknown = sorted(name for name, codes in run.recorder.returns.items() if ERROR_UNKNOWN in codes)
    assert not unknown, f"the fake failed inside {unknown} (NVML_ERROR_UNKNOWN); see its log"
    names = re.findall(r"<product_name>(.*?)</product_name>", run.result)
    assert names == [t["name"] for t in run.truth], run.result
    errors = set(re.findall(r">([^<>]*(?:Error|Not Found|Function|Permission|Argument)[^<>]*)<", run.result))
    assert not errors, f"NVML errors in place of values: {errors}"
    for gpu, truth in zip(re.findall(r"<gpu id=.*?</gpu>", run.result, re.S), run.truth, strict=True):
        temperature = re.search(r"<gpu_temp>(\d+) C</gpu_temp>", gpu)
        assert temperature is not None and abs(int(temperature.group(1)) - truth["temperature"]) <= 1, gpu
        geforce = "GeForce" in truth["name"]
        clocks = re.search(r"<applications_clocks>\s*<graphics_clock>(.*?)</graphics_clock>", gpu, re.S)
        assert clocks is not None and (clocks.group(1) == "N/A") == geforce, gpu  # applications clocks: not GeForce
        memory = re.search(r"<supported_clocks>\s*(<supported_mem_clock>|N/A)", gpu)  # nor clocks to lock to
        assert memory is not None and (memory.group(1) == "N/A") == geforce, gpu
        assert "<accounting_mode_buffer_size>4000</accounting_mode_buffer_size>" in gpu, gpu
        # the PCI device ID as the pci.ids database has it for the board, NVIDIA's vendor ID below (it was 0)
        assert f"<pci_device_id>{PCI_DEVICE_IDS[truth['name']]:04X}10DE</pci_device_id>" in gpu, gpu
        if truth["pids"] and scenario == "pids":  # processes on this host are named (nvmlSystemGetProcessName)
            assert re.search(r"<process_name>[^<]*python[^<]*</process_name>", gpu), gpu


def test_gpuwear_view_is_meaningful() -> None:
    """The comparisons above are not vacuous: at the settled instant the demo's cards are busy,
    the fan-cooled card's fans turn, and each card runs a job's process."""
    rig = make_rig("demo")
    try:
        rig.run(SETTLE_SECONDS)
        rtx, h100 = truth = gpuwear_view(rig)
    finally:
        rig.backend.close()
    assert rtx["fan_percent"] and rtx["fan_percent"] > 0 and h100["fan_percent"] is None
    assert all(t["power_watts"] > 100 and t["pids"] and t["memory_used"] > 0 for t in truth)


# -- as the user runs them: python -m gpuwear.sim.fakenvml PROGRAM ----------------------------

_FNF = re.compile(r"FunctionNotFound error occurred while calling nvmlQuery\(<function (\w+)")
# nvitop's own wrappers whose names are not the C function they call
_C_NAME = {"nvmlDeviceGetGraphicsRunningProcesses": "nvmlDeviceGetGraphicsRunningProcesses_v3",
           "nvmlDeviceGetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses_v3",
           "nvmlDeviceGetMPSComputeRunningProcesses": "nvmlDeviceGetMPSComputeRunningProcesses_v3",
           "nvmlDeviceGetCurrentDriverModel": "nvmlDeviceGetDriverModel",
           "nvmlDeviceGetPendingDriverModel": "nvmlDeviceGetDriverModel",
           "nvmlDeviceGetCount": "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
           "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3"}


def _missing_in_log(stderr: str) -> set[str]:
    """The C functions nvitop logged FUNCTION_NOT_FOUND for (it logs each once per process)."""
    return {_C_NAME.get(name, name) for name in _FNF.findall(stderr)}


def _console_env() -> dict[str, str]:
    """Console scripts of the clients sit next to this interpreter."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["demo", "training"])
def test_nvitop_exporter_command_serves_metrics(scenario: str) -> None:
    pytest.importorskip("nvitop_exporter")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwear.sim.fakenvml", "--scenario", scenario,
         "nvitop-exporter", "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "0.5"],
        env=_console_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    text = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                    text = reply.read().decode()
                if "gpu_temperature_C{" in text:
                    time.sleep(1.0)  # one whole collection pass: every device's gauges set
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                        text = reply.read().decode()
                    break
            except OSError:
                time.sleep(0.2)
        alive = proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:  # its log is what is read; an exporter not out within 5 s of ^C is killed (in the whole suite both
            _, stderr = proc.communicate(timeout=5)  # took the old 20 s every run, alone 0.04 s: not the test's)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
    assert alive, f"nvitop-exporter died over the fake (rc {proc.returncode}):\n{stderr[-4000:]}"
    temperatures = re.findall(r'^gpu_temperature_C\{[^}]*index="(\d+)"[^}]*\} (\S+)$', text, re.M)
    assert sorted(i for i, _ in temperatures) == ["0", "1"], text[-2000:]
    assert all(not math.isnan(float(v)) for _, v in temperatures), temperatures
    missing = sorted(_missing_in_log(stderr) & driver_has(scenario))
    assert not missing, f"nvitop-exporter met FUNCTION_NOT_FOUND for {missing}"


@pytest.mark.parametrize("scenario", ["demo", "training"])
def test_nvitop_once_prints_every_gpu(scenario: str) -> None:
    pytest.importorskip("nvitop")
    result = subprocess.run(
        [sys.executable, "-m", "gpuwear.sim.fakenvml", "--scenario", scenario, "nvitop", "--once"],
        env=_console_env(), capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    names = {"demo": ["GeForce RTX 4090", "H100 80GB HBM3"], "training": ["H100 80GB HBM3", "V100-PCIE-16GB"]}
    for name in names[scenario]:
        assert name in result.stdout, result.stdout
    assert f"Driver Version: {PROFILES[NEWEST].driver_version}" in result.stdout
    missing = sorted(_missing_in_log(result.stderr) & driver_has(scenario))
    assert not missing, f"nvitop --once met FUNCTION_NOT_FOUND for {missing}"
