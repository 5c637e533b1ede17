"""PCIe AER counts from sysfs (issue 29 item 3): read from a tree laid out as the kernel's, to the verdict and the
metric."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from conftest import make_rig
from gpuwear.backends.aer import AerCounters, sysfs_address, total
from gpuwear.config import Config, HostHealthConfig, WearConfig
from gpuwear.health import RULES, verdict
from gpuwear.tracker import WearTracker

# the sample outputs of Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats (Linux 4.19)
ABI_CORRECTABLE = """Receiver Error 2
Bad TLP 0
Bad DLLP 0
RELAY_NUM Rollover 0
Replay Timer Timeout 0
Advisory Non-Fatal 0
Corrected Internal Error 0
Header Log Overflow 0
TOTAL_ERR_COR 2
"""
# later kernels' aer.c names the errors in short (aer_uncorrectable_error_string); the totals keep their names
SHORT_NONFATAL = """Undefined 0
DLP 0
SDES 0
TLP 0
FCP 0
CmpltTO 1
CmpltAbrt 0
UnxCmplt 0
RxOF 0
MalfTLP 0
ECRC 0
UnsupReq 0
ACSViol 0
UncorrIntErr 0
BlockedTLP 0
AtomicOpBlocked 0
TLPBlockedErr 0
PoisonTLPBlocked 0
TOTAL_ERR_NONFATAL 1
"""


def tree(root: Path, address: str, **files: str) -> Path:
    folder = root / address
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return root


def test_the_kernels_files_are_read_by_their_totals(tmp_path: Path) -> None:
    assert sysfs_address("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_address("0000:3b:00.0") == "0000:3b:00.0"  # the 4-digit domain of older bindings
    assert sysfs_address("00010000:3B:00.0") is None  # no such domain (16 bits)
    for bad in (None, "", "../../etc:00:00.0", "3B:00.0", "00000000:3B:00.8", "00000000:3B:00.0/x"):
        assert sysfs_address(bad) is None, bad
    assert total(ABI_CORRECTABLE, "TOTAL_ERR_COR") == 2 and total(SHORT_NONFATAL, "TOTAL_ERR_NONFATAL") == 1
    assert total("TOTAL_ERR_COR -1\n", "TOTAL_ERR_COR") is None and total("", "TOTAL_ERR_COR") is None
    root = tree(tmp_path, "0000:3b:00.0", aer_dev_correctable=ABI_CORRECTABLE, aer_dev_nonfatal=SHORT_NONFATAL,
                aer_dev_fatal="TOTAL_ERR_FATAL garbage\n")
    aer = AerCounters(root)
    # a count that cannot be read is absent, never 0
    assert aer.read("00000000:3B:00.0") == {"pcie_aer_correctable": 2, "pcie_aer_nonfatal": 1}
    assert aer.read("00000000:5E:00.0") == {} and aer.read(None) == {}
    (root / "0000:3b:00.0" / "aer_dev_correctable").unlink()
    (root / "0000:3b:00.0" / "aer_dev_correctable").mkdir()  # unreadable as a file
    assert aer.read("00000000:3B:00.0") == {"pcie_aer_nonfatal": 1}


def test_an_uncorrectable_pcie_error_reaches_the_verdict_and_the_detail_metric(tmp_path: Path) -> None:
    """Two H100s over the fake NVML, the kernel's AER counts of their PCI functions in a tree: the one whose
    function counted a non-fatal uncorrectable error is watched with its rule, the other is not; the counts are
    exported with metrics.detail only (the default health budget is full on NVLink GPUs). Simulated GPUs are
    not this machine's devices: health.host_root auto reads nothing for them, a path does."""
    from gpuwear import service
    from gpuwear.backends.nvml import NvmlBackend
    from gpuwear.collector import encode
    from gpuwear.metrics import DaemonInfo, Published

    rig = make_rig({"gpus": [{"product": "h100-sxm"}, {"product": "h100-sxm"}]}, slow_interval=5)
    bus = [g.identity.pci_bus_id for g in rig.sampler.snapshot.gpus]
    root = tmp_path / "host" / "sys" / "bus" / "pci" / "devices"
    for i, bus_id in enumerate(bus):
        address = sysfs_address(bus_id)
        assert address is not None
        tree(root, address, aer_dev_correctable=ABI_CORRECTABLE, aer_dev_fatal="TOTAL_ERR_FATAL 0\n",
             aer_dev_nonfatal=SHORT_NONFATAL if i == 0 else "TOTAL_ERR_NONFATAL 0\n")
    config = replace(Config(), health=HostHealthConfig(host_root=str(tmp_path / "host")))
    assert service._sampler(NvmlBackend(rig.library), rig.clock, config).aer is not None
    assert service._sampler(NvmlBackend(rig.library), rig.clock, Config()).aer is None  # auto, simulated
    rig.sampler.aer = AerCounters(root).read
    tracker = WearTracker({}, WearConfig())
    for _ in range(30):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    uuids = [g.identity.uuid for g in rig.sampler.snapshot.gpus]
    first, second = (tracker.wear(u) for u in uuids)
    assert first is not None and second is not None
    (reason,) = [r for r in verdict(first, WearConfig(), None)["reasons"] if r["code"] == "pcie_aer_uncorrectable"]
    assert reason["severity"] == "watch" and "1 uncorrectable PCIe error(s) since boot (0 fatal, 1 non-fatal)" \
        in reason["text"] and reason["rule"] == RULES["pcie_aer_uncorrectable"]
    assert "pcie_aer_uncorrectable" not in {r["code"] for r in verdict(second, WearConfig(), None)["reasons"]}
    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="")
    published = Published(rig.sampler.snapshot, tracker.views, None, info)
    default = encode(published, False).decode()
    detail = encode(published, False, detail=True).decode()
    assert "gpuwear_pcie_aer_errors_total" not in default
    assert re.search(rf'^gpuwear_health_reason{{[^}}]*code="pcie_aer_uncorrectable"[^}}]*uuid="{uuids[0]}"', default,
                     re.M)
    assert not re.search(rf'code="pcie_aer_uncorrectable"[^}}]*uuid="{uuids[1]}"', default)
    for severity, value in (("correctable", 2), ("nonfatal", 1), ("fatal", 0)):
        assert re.search(rf'^gpuwear_pcie_aer_errors_total{{gpu="0",severity="{severity}",uuid="{uuids[0]}"}} '
                         rf'{value}\.0$', detail, re.M), severity
    # report and the page, from the GPUs' records as a ledger gives them (issue 29's done-when): that GPU's alone
    from gpuwear import page
    from gpuwear.report import document, text_report

    doc = document([first, second], WearConfig(), {}, "test", True)
    words = "1 uncorrectable PCIe error(s) since boot (0 fatal, 1 non-fatal)"
    text = text_report(doc)
    mine, theirs = text.split(second.uuid, 1)
    assert words in mine and words not in theirs, text
    sections = page.render(doc).split('class="gpu"')[1:]
    assert [words in section for section in sections] == [True, False]
    rig.backend.close()


def _function(root: Path, address: str, vendor: str = "0x10de", cls: str = "0x030200",
              driver: str | None = "nvidia") -> None:
    """A PCI function as sysfs shows it: vendor, class and the link to its driver."""
    folder = root / "devices" / address
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(vendor + "\n")
    (folder / "class").write_text(cls + "\n")
    if driver is not None:
        (root / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        (folder / "driver").symlink_to(Path("..", "..", "drivers", driver))


def test_the_nvidia_gpus_on_the_bus_are_those_nvml_should_list(tmp_path: Path) -> None:
    """Issue 29 item 2: an NVIDIA GPU on the PCI bus that NVML does not enumerate. Counted: a display or 3D
    controller of vendor 10de bound to the nvidia driver, which this process may see. Not counted: an HDMI audio
    function, a GPU bound to vfio-pci (a VM's) or to no driver, an SR-IOV virtual function, another vendor's
    device, one whose /dev/nvidiaN this process does not have or whose procfs entry is masked (a container given
    other GPUs), a name that is no PCI address."""
    from gpuwear.backends.pcibus import NvidiaBus

    _function(tmp_path, "0000:17:00.0")
    _function(tmp_path, "0000:17:00.1", cls="0x040300", driver="snd_hda_intel")
    _function(tmp_path, "0000:19:00.0", driver="vfio-pci")
    _function(tmp_path, "0000:1a:00.0", driver=None)
    _function(tmp_path, "0000:1b:00.0", vendor="0x8086", cls="0x030000", driver="i915")
    _function(tmp_path, "0000:1c:00.0", cls="0x030000")  # VGA-compatible: counted, if this process may see it
    _function(tmp_path, "0000:1d:00.0")
    _function(tmp_path, "0000:1d:00.4")  # an SR-IOV virtual function of it (a vGPU host's)
    (tmp_path / "devices" / "0000:1d:00.4" / "physfn").symlink_to(Path("..", "0000:1d:00.0"))
    (tmp_path / "devices" / "not-an-address").mkdir()
    _function(tmp_path, "0000:1e:00.0")  # no entry in the driver's procfs: masked (a container's)
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    for address, minor in (("0000:17:00.0", 0), ("0000:1c:00.0", 3), ("0000:1d:00.0", 4)):
        (proc / address).mkdir(parents=True)
        (proc / address / "information").write_text(
            f"Model: \t\t NVIDIA H100\nIRQ:   \t\t 42\nDevice Minor: \t {minor}\n")
    dev.mkdir()
    (dev / "nvidia0").touch()
    (dev / "nvidia4").touch()  # this process sees minors 0 and 4, not minor 3
    bus = NvidiaBus(tmp_path / "devices", proc, dev)
    assert bus.gpus() == ["0000:17:00.0", "0000:1d:00.0"]
    (dev / "nvidia3").touch()
    assert bus.gpus() == ["0000:17:00.0", "0000:1c:00.0", "0000:1d:00.0"]
    # without the driver's procfs there is nothing to judge visibility by: every GPU bound to nvidia counts
    assert NvidiaBus(tmp_path / "devices", tmp_path / "no-proc", dev).gpus() == [
        "0000:17:00.0", "0000:1c:00.0", "0000:1d:00.0", "0000:1e:00.0"]
    assert NvidiaBus(tmp_path / "nowhere").gpus() is None  # unknown, not "no GPU"


def test_a_gpu_on_the_bus_that_nvml_does_not_list_is_named(tmp_path: Path) -> None:
    """The daemon over the demo's two simulated GPUs, with a host tree (health.host_root) whose sysfs holds them
    and a third NVIDIA GPU bound to the nvidia driver: that one is exported by address and named by /healthz (503);
    the two NVML lists are not."""
    import sys

    from helpers import fetch, free_port, started, wait_for

    for address in ("0000:17:00.0", "0000:37:00.0", "0000:99:00.0"):
        _function(tmp_path / "host" / "sys" / "bus" / "pci", address)
    config = tmp_path / "config.yaml"
    config.write_text(f"health:\n  host_root: {tmp_path / 'host'}\n  kernel_log: \"off\"\n")
    port = free_port()
    with started([sys.executable, "-m", "gpuwear", "run", "--simulate", "demo", "--config", str(config), "--listen",
                  f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state")], tmp_path / "daemon.log", tmp_path):
        body = wait_for(f"http://127.0.0.1:{port}/metrics", 'gpuwear_gpu_not_enumerated{pci_address=', 60.0)
        status, health = fetch(f"http://127.0.0.1:{port}/healthz")
    assert re.search(r'^gpuwear_gpu_not_enumerated\{pci_address="0000:99:00\.0"\} 1\.0$', body, re.M), body
    assert body.count("gpuwear_gpu_not_enumerated{") == 1
    assert status == 503 and "an NVIDIA GPU at PCI 0000:99:00.0 is on the bus" in health, (status, health)


def test_doctor_says_what_the_hosts_sysfs_tells(tmp_path: Path) -> None:
    """`gpuwear doctor` with a host tree (health.host_root): the demo's H100 with a fatal AER count is a thing to
    fix, the RTX 4090 without AER files a note (its errors not watched), and a third NVIDIA GPU on the bus that NVML
    does not list a thing to fix; with the default (auto), simulated GPUs' bus ids are not read at all."""
    from gpuwear.backends.nvml import NvmlBackend
    from gpuwear.clock import SystemClock
    from gpuwear.doctor import Doctor
    from gpuwear.sim.fakenvml import FakeNvmlLibrary
    from gpuwear.sim.simulated import load_scenario

    pci = tmp_path / "host" / "sys" / "bus" / "pci"
    for address in ("0000:17:00.0", "0000:37:00.0", "0000:99:00.0"):
        _function(pci, address)
    tree(pci / "devices", "0000:37:00.0", aer_dev_correctable=ABI_CORRECTABLE, aer_dev_nonfatal=SHORT_NONFATAL,
         aer_dev_fatal="TOTAL_ERR_FATAL 1\n")

    def findings(host: str) -> dict[str, tuple[bool, str, str]]:
        config = replace(Config(state_dir=str(tmp_path)), health=HostHealthConfig(host_root=host))
        doctor = Doctor(config, NvmlBackend(FakeNvmlLibrary(load_scenario("demo"), SystemClock())),
                        tmp_path / "ledger.sqlite", proc=None)
        return {f.what: (f.ok, f.fix, f.note) for f in doctor.run()}

    seen = findings(str(tmp_path / "host"))
    (aer,) = [k for k in seen if k.startswith("GPU 1 NVIDIA H100 80GB HBM3: PCIe AER counts since boot")]
    assert aer.endswith("correctable 2, nonfatal 1, fatal 1") and not seen[aer][0] and "reseat" in seen[aer][1]
    assert seen["GPU 0 NVIDIA GeForce RTX 4090: no PCIe AER counts in sysfs"][0]
    assert "not watched" in seen["GPU 0 NVIDIA GeForce RTX 4090: no PCIe AER counts in sysfs"][2]
    bus = seen["an NVIDIA GPU at PCI 0000:99:00.0 is on the bus, bound to the nvidia driver, but NVML does not list it"]
    assert not bus[0] and "kernel log" in bus[1]
    assert not [k for k in findings("auto") if "PCI" in k]
    (tmp_path / "host" / "sys" / "bus" / "pci" / "devices" / "0000:37:00.0" / "aer_dev_fatal").unlink()
    for name in ("aer_dev_correctable", "aer_dev_nonfatal"):
        (tmp_path / "host" / "sys" / "bus" / "pci" / "devices" / "0000:37:00.0" / name).unlink()
    none = findings(str(tmp_path / "host"))  # no GPU with counts: one note for the host, not one per GPU
    assert [k for k in none if "AER" in k] == ["no PCIe AER counts in sysfs for any GPU"]
