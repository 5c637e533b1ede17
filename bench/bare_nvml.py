"""The bare-NVML baseline: the pynvml calls gpuwear makes, in a 1 Hz loop, with no processing.

Run it over the fake library like any pynvml program::

    python -m gpuwear.sim.fakenvml --scenario SCENARIO bench/bare_nvml.py [--interval 1]

Per GPU and tick it makes the calls ``gpuwear.backends.nvml.NvmlBackend.read`` makes (written
out here in plain pynvml, independently of the daemon's code):

* fast set, every tick: temperature, power, clock info x3, performance state, clock event
  reasons, violation status (power, thermal), utilization, memory info, compute processes,
  one batched ``nvmlDeviceGetFieldValues`` (memory temperature, total energy), and per fan
  ``nvmlDeviceGetFanSpeed_v2`` and ``nvmlDeviceGetFanSpeedRPM``;
* slow set, every ``--slow-interval`` seconds (30): temperature thresholds x4, enforced and
  default power limit, max clock info x3, MIG mode, ECC mode, retired pages x2 and pending
  status, remapped rows and the row remapper's histogram, and the slow field values (ECC x4,
  PCIe replays, recovery action) batched into the same ``nvmlDeviceGetFieldValues`` call as the
  fast ones;
* like the daemon, a call that answers NOT_SUPPORTED / FUNCTION_NOT_FOUND is not made again
  for that GPU;
* like the daemon, an XID event listener thread waits in ``nvmlEventSetWait`` (500 ms)
  (``--no-events`` leaves it out);
* identity once at start: architecture, compute capability, memory, PCI info, serial, UUID,
  name, fan count.

The values read are thrown away. ``--ready-file`` is created after the first tick.
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

_UNSUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

FAST_FIELDS = (pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
SLOW_FIELDS = (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
               pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
               pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230))


def _clocks(read: Callable[..., Any]) -> Callable[[Any], Any]:
    return lambda h: [read(h, k) for k in (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM)]


FAST: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("temperature", lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
    ("power", pynvml.nvmlDeviceGetPowerUsage),
    ("clocks", _clocks(pynvml.nvmlDeviceGetClockInfo)),
    ("pstate", pynvml.nvmlDeviceGetPerformanceState),
    ("reasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons),
    ("violation_power", lambda h: pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER)),
    ("violation_thermal", lambda h: pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL)),
    ("utilization", pynvml.nvmlDeviceGetUtilizationRates),
    ("memory", pynvml.nvmlDeviceGetMemoryInfo),
    ("processes", pynvml.nvmlDeviceGetComputeRunningProcesses),
)
def _threshold(kind: int) -> Callable[[Any], Any]:
    return lambda h: pynvml.nvmlDeviceGetTemperatureThreshold(h, kind)


SLOW: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    *((f"threshold_{k}", _threshold(k))
      for k in (pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
                pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX, pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)),
    ("power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit),
    ("power_default_limit", pynvml.nvmlDeviceGetPowerManagementDefaultLimit),
    ("max_clocks", _clocks(pynvml.nvmlDeviceGetMaxClockInfo)),
    ("mig", pynvml.nvmlDeviceGetMigMode),
    ("ecc", pynvml.nvmlDeviceGetEccMode),
    ("retired_pages", lambda h: (
        pynvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        pynvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h))),
    ("remapped_rows", pynvml.nvmlDeviceGetRemappedRows),
    ("remap_histogram", pynvml.nvmlDeviceGetRowRemapperHistogram),
)


def _fan_rpm(h: Any, fan: int) -> int:
    info = pynvml.c_nvmlFanSpeedInfo_t()
    info.version = pynvml.nvmlFanSpeedInfo_v1
    info.fan = fan
    pynvml._nvmlCheckReturn(pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFanSpeedRPM")(h, ctypes.byref(info)))
    return int(info.speed)


class Gpu:
    def __init__(self, index: int) -> None:
        h = self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.unsupported: set[Any] = set()
        for fn in (pynvml.nvmlDeviceGetArchitecture, pynvml.nvmlDeviceGetCudaComputeCapability,
                   pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlDeviceGetPciInfo, pynvml.nvmlDeviceGetSerial):
            try:
                fn(h)
            except pynvml.NVMLError:
                pass
        pynvml.nvmlDeviceGetUUID(h)
        pynvml.nvmlDeviceGetName(h)
        try:
            self.fans = pynvml.nvmlDeviceGetNumFans(h)
        except pynvml.NVMLError:
            self.fans = 0

    def _call(self, key: Any, fn: Callable[[], Any]) -> None:
        if key in self.unsupported:
            return
        try:
            fn()
        except pynvml.NVMLError as exc:
            if exc.value in _UNSUPPORTED:
                self.unsupported.add(key)

    def read(self, slow: bool) -> None:
        h = self.handle
        for key, fn in FAST + (SLOW if slow else ()):
            self._call(key, lambda fn=fn: fn(h))  # type: ignore[misc]
        wanted = [f for f in FAST_FIELDS + (SLOW_FIELDS if slow else ()) if f not in self.unsupported]
        if wanted:
            try:
                for f, fv in zip(wanted, pynvml.nvmlDeviceGetFieldValues(h, wanted), strict=False):
                    if fv.nvmlReturn in _UNSUPPORTED:
                        self.unsupported.add(f)
            except pynvml.NVMLError as exc:
                if exc.value in _UNSUPPORTED:
                    self.unsupported.update(wanted)
        for i in range(self.fans):
            self._call("fan_speed", lambda i=i: pynvml.nvmlDeviceGetFanSpeed_v2(h, i))  # type: ignore[misc]
            self._call("fan_rpm", lambda i=i: _fan_rpm(h, i))  # type: ignore[misc]


def listen_events(gpus: list[Gpu], wait_ms: int) -> None:
    event_set = pynvml.nvmlEventSetCreate()
    for g in gpus:
        try:
            if pynvml.nvmlDeviceGetSupportedEventTypes(g.handle) & pynvml.nvmlEventTypeXidCriticalError:
                pynvml.nvmlDeviceRegisterEvents(g.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        except pynvml.NVMLError:
            pass
    while True:
        try:
            pynvml.nvmlEventSetWait(event_set, wait_ms)
        except pynvml.NVMLError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--slow-interval", type=float, default=30.0)
    parser.add_argument("--no-events", action="store_true")
    parser.add_argument("--ready-file")
    args = parser.parse_args()
    pynvml.nvmlInit()
    gpus = [Gpu(i) for i in range(pynvml.nvmlDeviceGetCount())]
    if not args.no_events:
        threading.Thread(target=listen_events, args=(gpus, 500), daemon=True, name="events").start()
    next_tick = last_slow = time.monotonic()
    slow = True
    while True:
        for g in gpus:
            g.read(slow)
        if args.ready_file:
            Path(args.ready_file).touch()
            args.ready_file = None
        next_tick += args.interval
        now = time.monotonic()
        slow = next_tick - last_slow >= args.slow_interval
        if slow:
            last_slow = next_tick
        time.sleep(max(0.0, next_tick - now))


if __name__ == "__main__":
    main()
