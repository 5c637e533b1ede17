"""The NVIDIA GPUs on the PCI bus, read from Linux sysfs: what NVML should list.

A GPU the nvidia driver is bound to but cannot bring up (``RmInitAdapter failed`` in the kernel log, a GPU fallen
off the bus before the start) is on the bus yet missing from NVML's list, and nothing else says so: dcgm-exporter
and nvidia-smi simply show one GPU fewer (dcgm-exporter #348). Each function under ``/sys/bus/pci/devices/`` holds
``vendor`` ("0x10de": NVIDIA), ``class`` ("0x030200": a 3D controller, "0x030000": VGA-compatible, the two classes a
GPU has; an NVSwitch is a bridge, an HDMI audio function 0x0403) and ``driver``, a link to the driver bound to it.
Only functions bound to ``nvidia`` count: one bound to vfio-pci is handed to a virtual machine, one bound to
nouveau or to nothing is not NVML's to list, and an SR-IOV virtual function (``physfn`` links to its GPU: a vGPU
host's) is not a GPU of its own. One this process may not see is left out too: the driver's
``/proc/driver/nvidia/gpus/<address>/information`` gives its ``Device Minor``, and a container or a unit given only
some GPUs has no ``/dev/nvidia<minor>`` for the others (and nvidia-container-runtime masks their procfs entries).
A tree that cannot be listed reads as None (unknown), never as "no GPU". No NVML, no clock.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from gpuwear.backends.aer import SYSFS_PCI_DEVICES, read_small, sysfs_address

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # PCI base class 03 (display): VGA-compatible and 3D controllers (pci_ids.h)
NVIDIA_DRIVER = "nvidia"
PROC_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
DEV = Path("/dev")
MAX_DEVICES = 4096  # PCI functions listed at most
_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_MINOR = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.M)


def unlisted_text(address: str) -> str:
    """How a GPU on the bus that NVML does not list is named to a person (/healthz, the page, doctor)."""
    return f"an NVIDIA GPU at PCI {address} is on the bus, bound to the nvidia driver, but NVML does not list it"


class NvidiaBus:
    """The NVIDIA GPUs bound to the nvidia driver under ``root`` (the kernel's /sys/bus/pci/devices; a test or a
    replay gives its own tree, and its own ``proc`` and ``dev``)."""

    def __init__(self, root: Path = SYSFS_PCI_DEVICES, proc: Path = PROC_NVIDIA_GPUS, dev: Path = DEV) -> None:
        self.root, self.proc, self.dev = root, proc, dev

    @classmethod
    def under(cls, host: Path, dev: Path = DEV) -> NvidiaBus:
        """The bus of a host tree laid out as / (health.host_root): its sysfs and the driver's procfs there."""
        return cls(host / SYSFS_PCI_DEVICES.relative_to("/"), host / PROC_NVIDIA_GPUS.relative_to("/"), dev)

    def unlisted(self, bus_ids: Iterable[str | None]) -> tuple[str, ...] | None:
        """Those of :meth:`gpus` that are not among NVML's ``bus_ids`` (nvmlPciInfo_t.busId); None when the tree
        cannot be listed."""
        found = self.gpus()
        if found is None:
            return None
        listed = {sysfs_address(bus_id) for bus_id in bus_ids}
        return tuple(address for address in found if address not in listed)

    def gpus(self) -> list[str] | None:
        """Their sysfs addresses ("0000:3b:00.0"), sorted; None when the tree cannot be listed."""
        try:
            names = sorted(os.listdir(self.root))[:MAX_DEVICES]
        except OSError:
            return None
        return [name for name in names if _ADDRESS.fullmatch(name) and self._ours(name)]

    def _ours(self, address: str) -> bool:
        folder = self.root / address
        if (read_small(folder / "vendor") != NVIDIA_VENDOR
                or not (read_small(folder / "class") or "").startswith(GPU_CLASSES)):
            return False
        try:
            if os.path.basename(os.readlink(folder / "driver")) != NVIDIA_DRIVER:
                return False
        except OSError:
            return False
        if os.path.lexists(folder / "physfn"):  # an SR-IOV virtual function (a vGPU host's): not a GPU NVML lists
            return False
        info = read_small(self.proc / address / "information")
        if info is None:  # the driver's procfs has no entry for it: masked (a container given other GPUs), unless
            return not self.proc.is_dir()  # there is no such procfs at all, and nothing to judge visibility by
        minor = _MINOR.search(info)
        return minor is None or (self.dev / f"nvidia{int(minor.group(1))}").exists()
