"""`gpuwear doctor`: checks what the daemon needs on this machine and says what to fix."""

from __future__ import annotations

import os
import socket
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwear.backends.aer import AerCounters, host_root
from gpuwear.backends.nvml import GpuLostError, NvmlBackend, NvmlUnavailableError
from gpuwear.backends.pcibus import NvidiaBus, unlisted_text
from gpuwear.config import Config
from gpuwear.jobs.resolve import foreign_pids, wsl2
from gpuwear.kernlog import resolve, unreadable
from gpuwear.ledger import Ledger, LedgerError, printable
from gpuwear.sample import VGPU_GUEST, GpuIdentity

# What makes a GPU's processes readable, by NVML's answer (jobs attribution: gpuwear.jobs.attribute)
PROCESS_FIXES = {
    "no_permission": "NVML lists this GPU's processes to root only (with MIG on, the GPU's list needs root and its "
                     "MIG devices' own lists did not answer either): run gpuwear as root (a drop-in with "
                     "DynamicUser=no and User=root; docs/deployment.md), or accept unattributed time on it",
    "not_supported": "this driver does not list processes (a vGPU guest, WSL2): jobs cannot be attributed here",
    "function_not_found": "this driver is too old to list processes: upgrade it to attribute jobs",
}


@dataclass
class Finding:
    ok: bool
    what: str
    fix: str = ""  # what to do, where not ok: a thing to fix
    note: str = ""  # a remark on a finding that is ok, but worth knowing (never counted as a thing to fix)


@dataclass
class Doctor:
    """Runs the checks; ``backend`` is the NVML backend to examine (real, or over the fake library)."""

    config: Config
    backend: NvmlBackend
    ledger_file: Path
    dev: Path = Path("/dev")
    proc: Path | None = Path("/proc")  # None: simulated GPUs, whose processes are the simulation's
    findings: list[Finding] = field(default_factory=list)

    def check(self, ok: bool, what: str, fix: str = "") -> None:
        self.findings.append(Finding(ok, what, "" if ok else fix))

    def remark(self, what: str, note: str) -> None:
        """Something to know that no change here would mend (a simulated card, WSL2, this host's own daemon)."""
        self.findings.append(Finding(True, what, "", note))

    def run(self) -> list[Finding]:
        self._nvml()
        self._kernel_log()
        self._ledger()
        self._port()
        return self.findings

    def _kernel_log(self) -> None:
        """Whether the kernel log (health.kernel_log) can be read: the XIDs NVML's events do not report (79, 119,
        120) come from it alone."""
        source = resolve(self.config.health.kernel_log)
        if self.proc is None and not source.startswith("/"):  # simulated GPUs: their driver's own log, nothing to check
            return
        if source == "off":
            self.remark("kernel log: off (health.kernel_log)", "XIDs come from NVML's events alone, which do not "
                        "report 79, 119 or 120")
            return
        why = unreadable(source)
        self.check(why is None, f"kernel log ({source}) readable" if why is None else
                   f"kernel log ({source}) cannot be read by this user: {printable(why)}",
                   "XIDs 79, 119 and 120 come from it alone: run the daemon as a member of systemd-journal (journal) "
                   "or with CAP_SYSLOG (kmsg), or set health.kernel_log")

    def _nvml(self) -> None:
        try:
            gpus = self.backend.open()
        except NvmlUnavailableError as exc:
            self.check(False, f"NVML: {exc}", "install or load the NVIDIA driver; `nvidia-smi` must list the GPUs")
            self._pci([])  # GPUs bound to the driver that NVML cannot reach are named
            return
        info = self.backend.system_info()
        self.check(True, f"NVIDIA driver {info.driver_version}, NVML {info.nvml_version}, "
                         f"CUDA {info.cuda_driver_version}")
        self.check(bool(gpus), f"{len(gpus)} GPU(s) found", "NVML lists no GPU: check `nvidia-smi` and the driver")
        self._devices()
        if self.proc is not None:
            foreign = foreign_pids(self.proc)
            if foreign is not None and wsl2(self.proc):  # nothing here changes which PIDs NVML names
                self.remark(f"job attribution: {foreign}", "GPU time with processes is booked as unattributed")
            else:
                self.check(foreign is None, "job attribution: NVML's process IDs are this process's" if foreign
                           is None else f"job attribution: {foreign}", "GPU time with processes is booked as "
                           "unattributed until then")
        for i, gpu in enumerate(gpus):
            persistent = self.backend.persistence_mode(i)
            state = "on" if persistent else "off" if persistent is False else "unknown"
            mode = f"GPU {gpu.index} {gpu.name}: persistence mode {state}"
            if self.proc is None and persistent is False:  # a simulated card: its driver settings are the scenario's
                self.remark(mode, "a simulated card: on a real one, enable nvidia-persistenced")
            else:
                self.check(persistent is not False, mode,
                           "enable it (`systemctl enable --now nvidia-persistenced`): without it each NVML call "
                           "may re-initialise the GPU, calls are slow and polling keeps the GPU awake")
            if gpu.virtualization_mode == VGPU_GUEST:
                self.remark(f"GPU {gpu.index} {gpu.name}: a vGPU, this virtual machine's share of a physical GPU "
                            "(NVML: virtualization mode VGPU)",
                            "its temperatures, power and fans are the physical GPU's, under every virtual machine "
                            "on it: its wear figures are the card's under all their work, not this machine's "
                            "alone; its utilization is this vGPU's share")
            try:
                reading = self.backend.read(i, slow=True)
            except GpuLostError as exc:
                self.check(False, f"GPU {gpu.index} {gpu.name}: lost ({exc})", "reset the GPU or reboot; check "
                           "`dmesg` for XID 79")
                continue
            by_reason: dict[str, list[str]] = {}
            for key, reason in sorted(reading.unavailable.items()):
                by_reason.setdefault(reason, []).append(key)
            unavailable = "".join(f"; {reason.replace('_', ' ')}: {', '.join(keys)}"
                                  for reason, keys in sorted(by_reason.items()))
            supported = sorted(k for k, v in reading.values.items() if v is not None)
            where = f"GPU {gpu.index} {gpu.name} ({gpu.uuid})"
            if not supported:
                self.check(False, f"{where}: yields no readings{unavailable}",
                           "NVML answers nothing for this device (a Jetson/Tegra board, or a driver without "
                           "NVML support for it): gpuwear cannot estimate its wear" if not reading.errors else
                           f"NVML errors while reading: {', '.join(sorted(set(reading.errors)))}")
                continue
            self.check(not reading.errors, f"{where}: {len(supported)} fields read{unavailable}",
                       f"NVML errors while reading: {', '.join(sorted(set(reading.errors)))}")
            self._mig(where, reading.values)
            why = reading.unavailable.get("processes")
            if why is not None:
                self.check(False, f"{where}: its processes cannot be read ({why.replace('_', ' ')}): its time is "
                           "booked as unattributed, not to jobs",
                           PROCESS_FIXES.get(why, "NVML does not list this GPU's processes here: jobs on it cannot "
                                                  "be told apart"))

        self._pci(gpus)
        self.backend.close()

    def _mig(self, where: str, values: dict[str, Any]) -> None:
        """How a MIG GPU's jobs are charged (gpuwear.jobs.mig): by their MIG devices' compute slices, where NVML
        gives them."""
        if not values.get("mig_enabled"):
            return
        slices, total = values.get("mig_slices"), values.get("mig_slice_count")
        if slices and total:
            held = sum(n for _, n in slices)
            self.remark(f"{where}: MIG on, {len(slices)} MIG device(s) holding {held} of its {total} compute slices",
                        "each job is charged for the slices of the MIG devices it runs on (a 1g device: 1/"
                        f"{total} of the card's wear); the slices no job holds go to the GPU's idle line")
        else:
            self.remark(f"{where}: MIG on, no MIG device's compute slices read",
                        "the jobs on it share its wear equally, as on a GPU without MIG")

    def _pci(self, gpus: list[GpuIdentity]) -> None:
        """What the host's sysfs tells beyond NVML (health.host_root): each GPU's PCIe AER counts, and NVIDIA GPUs
        on the bus that NVML does not list."""
        root = host_root(self.config.health.host_root, self.proc is None)
        if root is None:
            return
        aer = AerCounters.under(root)
        read = {gpu.index: aer.read(gpu.pci_bus_id) for gpu in gpus}
        why = ("the kernel does not expose them here (AER handled by the firmware, a VM, or no /sys): uncorrectable "
               "PCIe errors are not watched")
        if gpus and not any(read.values()):  # one remark for the host, not one per GPU
            self.remark("no PCIe AER counts in sysfs for any GPU", why)
        for gpu in gpus:
            counts = read[gpu.index]
            where = f"GPU {gpu.index} {gpu.name}"
            if not counts:
                if any(read.values()):
                    self.remark(f"{where}: no PCIe AER counts in sysfs", why)
                continue
            bad = counts.get("pcie_aer_nonfatal", 0) + counts.get("pcie_aer_fatal", 0)
            self.check(bad == 0, f"{where}: PCIe AER counts since boot: " + ", ".join(
                f"{field.removeprefix('pcie_aer_')} {n}" for field, n in counts.items()),
                "uncorrectable PCIe errors: reseat the card or try another slot if they grow; `journalctl -k | grep "
                "-i aer` says when")
        for address in NvidiaBus.under(root, self.dev).unlisted(g.pci_bus_id for g in gpus) or ():
            self.check(False, unlisted_text(address), "the driver could not bring it up: read the kernel log "
                       "(`journalctl -k | grep -i -e NVRM -e Xid`), then reboot or reset it")

    def _devices(self) -> None:
        if self.proc is not None and wsl2(self.proc):
            self._wsl2()
            return
        nodes = [self.dev / "nvidiactl", *sorted(self.dev.glob("nvidia[0-9]*"))]
        for node in nodes:
            if node.exists():
                self.check(os.access(node, os.R_OK | os.W_OK), f"{node} readable and writable",
                           f"give the daemon's user access to {node} (systemd: DeviceAllow=; or the video group)")

    def _wsl2(self) -> None:
        """Under WSL2 the GPU is /dev/dxg (the Windows driver's paravirtual device, no /dev/nvidia* node) and
        libnvidia-ml comes from /usr/lib/wsl/lib: opened here, as NVML opens it (a device policy refuses the open,
        not the mode bits)."""
        node = self.dev / "dxg"
        try:
            os.close(os.open(node, os.O_RDWR | os.O_CLOEXEC))
            opened = True
        except OSError:
            opened = False
        self.check(opened, f"WSL2: {node} opens for reading and writing",
                   "under systemd, install the drop-in deploy/systemd/wsl2.conf as "
                   "/etc/systemd/system/gpuwear.service.d/wsl2.conf (install.sh does on WSL2), then "
                   "`systemctl daemon-reload`; elsewhere give the daemon's user access to it")
        self.check(True, "WSL2: NVML answers through the Windows driver: its version is the Windows driver's, the "
                         "processes it lists are Windows processes (jobs unattributed), and what it does not answer "
                         "is listed per GPU below")

    def _ledger(self) -> None:
        folder = self.ledger_file.parent
        for moved in sorted(folder.glob(f"{self.ledger_file.name}.unreadable-*")):
            if not moved.name.endswith(("-wal", "-shm")):
                self.check(False, f"a ledger the daemon could not read was moved aside: {moved}",
                           "its history is not counted: restore it from a backup, or delete it once it is not "
                           "needed (the daemon's log at that time says which record was bad)")
        for kept in sorted(folder.glob(f"{self.ledger_file.name}.damaged-*")):
            if not kept.name.endswith(("-wal", "-shm")):
                self.check(False, f"the ledger was damaged and recovered: the damaged file is kept as {kept}",
                           "the live ledger holds what SQLite could still read of it; delete the damaged copy once "
                           "the history looks right (gpuwear report)")
        if not self.ledger_file.exists():
            existing = next(p for p in (folder, *folder.parents) if p.exists())
            writable = os.access(existing, os.W_OK)
            self.check(writable, f"ledger {self.ledger_file} not created yet; its folder is "
                       f"{'writable' if writable else 'not writable'}",
                       f"make {folder} writable by the daemon's user (systemd: StateDirectory=gpuwear)")
            return
        try:
            ledger = Ledger.open_read_only(self.ledger_file)
            try:
                live, every = ledger.load(2.0), ledger.load_all(2.0)
                rows = ledger.rows()
            finally:
                ledger.close()
            imported = len(every) - len(live)
            self.check(True, f"ledger {self.ledger_file}: {len(every)} GPU(s) recorded"
                       + (f" ({imported} known from imported logs only)" if imported else ""))
            size = sum(p.stat().st_size for p in (self.ledger_file, Path(f"{self.ledger_file}-wal")) if p.exists())
            self.check(True, f"ledger size {size / 2**20:.1f} MiB: " + ", ".join(
                f"{n} {table.replace('_', ' ')} rows" for table, n in rows.items() if table != "set_aside"))
            if rows.get("set_aside"):
                self.check(False, f"ledger: {rows['set_aside']} record(s) failed validation and were set aside "
                           "(its set_aside table; the daemon's log at that time names them)",
                           "their figures are not counted; the rest of the history is")
        except (LedgerError, sqlite3.Error) as exc:
            self.check(False, f"ledger: {printable(str(exc))[:300]}", "the daemon recovers a damaged ledger and "
                       "sets bad records aside at start; restore it from a backup if you have one")
        self.check(os.access(folder, os.W_OK), f"{folder} writable", f"make {folder} writable by the daemon")

    def _port(self) -> None:
        host, port = self.config.listen_address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
                self.check(True, f"{self.config.listen} is free for /metrics")
            except OSError as exc:
                if _gpuwear_serves(host, port):
                    self.remark(f"{self.config.listen}: a gpuwear daemon serves /metrics there",
                                "a second daemon with this configuration could not listen: stop this one first")
                else:
                    self.check(False, f"{self.config.listen}: {exc.strerror}",
                               "another process holds the port: `ss -ltnp` shows which")


def _gpuwear_serves(host: str, port: int) -> bool:
    """Whether a gpuwear daemon answers /healthz on ``host:port`` (plain HTTP, within a second)."""
    import http.client

    try:
        conn = http.client.HTTPConnection(host, port, timeout=1.0)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            return response.status == 200 and b"gpuwear_build_info" in response.read(1 << 20)
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return False


def render(findings: list[Finding], say: Callable[[str], None] = print) -> bool:
    """Print each finding with what to fix, and the remarks apart from them; True when nothing needs fixing."""
    for f in findings:
        say(f"[{'FIX' if not f.ok else 'note' if f.note else 'ok'}] {f.what}")
        if f.fix or f.note:
            say(f"      -> {f.fix or f.note}")
    bad = sum(not f.ok for f in findings)
    notes = sum(bool(f.note) for f in findings)
    say(("nothing to fix" if not bad else f"{bad} thing(s) to fix") + (f"; {notes} note(s)" if notes else ""))
    return bad == 0
