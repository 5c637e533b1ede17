"""PCIe Advanced Error Reporting (AER) counts of a GPU's PCI function, read from Linux sysfs.

The kernel's AER driver counts the errors each PCIe device reports (Documentation/ABI/testing/
sysfs-bus-pci-devices-aer_stats, Linux 4.19 and later): ``/sys/bus/pci/devices/<domain:bus:dev.fn>/`` holds
``aer_dev_correctable``, ``aer_dev_nonfatal`` and ``aer_dev_fatal``, each a list of ``<error name> <count>`` lines
ending with its total (``TOTAL_ERR_COR``, ``TOTAL_ERR_NONFATAL``, ``TOTAL_ERR_FATAL``), counted since boot. The
error names changed across kernels ("Receiver Error" in the ABI document's sample, "RxErr" in later kernels'
aer.c); only the totals are read. NVML does not report these: a link that fails, a riser or a slot shows here
first. The files are absent without AER (firmware-first platforms, most virtual machines and containers without
/sys); a count that cannot be read is absent, never 0. No NVML, no clock: the sampler asks on its slow interval.
"""

from __future__ import annotations

import re
from pathlib import Path

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")
# sample field, sysfs file, the total's name in it
FILES = (("pcie_aer_correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
         ("pcie_aer_nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
         ("pcie_aer_fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL"))
MAX_FILE_BYTES = 4096  # the kernel writes a page at most
_NVML_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")


def host_root(value: str, simulated: bool) -> Path | None:
    """Where the host's /sys and the driver's /proc are read (health.host_root's ``value``), None for nowhere: off,
    or auto for simulated GPUs (their bus ids are not this machine's devices)."""
    if value == "off" or (value == "auto" and simulated):
        return None
    return Path("/" if value == "auto" else value)


def sysfs_address(bus_id: str | None) -> str | None:
    """The sysfs name of a PCI function from NVML's bus id ("00000000:3B:00.0", nvmlPciInfo_t.busId: an 8-digit
    domain, capitals) -> "0000:3b:00.0"; None for anything else."""
    m = _NVML_BUS_ID.fullmatch((bus_id or "").strip())
    if m is None or int(m.group(1), 16) > 0xFFFF:
        return None
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def read_small(path: Path) -> str | None:
    """The text of a small sysfs or procfs file (at most MAX_FILE_BYTES), stripped; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES).decode("ascii", "replace").strip()
    except OSError:
        return None


def total(text: str, name: str) -> int | None:
    """The count on the ``name`` line of an aer_dev_* file (its last whitespace-separated field), None when the
    line is missing or not a count."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name and parts[1].isdigit() and len(parts[1]) <= 19:
            return int(parts[1])
    return None


class AerCounters:
    """Reads the AER totals of GPUs' PCI functions under ``root`` (the kernel's /sys/bus/pci/devices; a test or a
    replay gives its own tree)."""

    def __init__(self, root: Path = SYSFS_PCI_DEVICES) -> None:
        self.root = root

    @classmethod
    def under(cls, host: Path) -> AerCounters:
        """The counts of a host tree laid out as / (health.host_root)."""
        return cls(host / SYSFS_PCI_DEVICES.relative_to("/"))

    def read(self, bus_id: str | None) -> dict[str, int]:
        """The totals of the function NVML names ``bus_id``, by sample field: those readable, none elsewhere."""
        address = sysfs_address(bus_id)
        if address is None:
            return {}
        out: dict[str, int] = {}
        for field, filename, name in FILES:
            value = total(read_small(self.root / address / filename) or "", name)
            if value is not None:
                out[field] = value
        return out
