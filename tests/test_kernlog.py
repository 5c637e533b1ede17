"""XIDs from the kernel log (gpuwear.kernlog): the driver's lines parsed, followed as they come, mapped to the GPU by
its PCI bus id, counted once when NVML reports the same XID, and served by the running daemon."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import REPO, make_rig
from gpuwear.kernlog import KernelLogXids, bus_key, kmsg_message, parse_sxid, parse_xid, resolve
from helpers import free_port, logs_on_failure, started, wait_for

# The driver's words, as they reach dmesg and the journal (XID 79 with an unknown process, 119 from a process;
# older drivers wrote the PCI domain with four digits, NVML with eight)
LINES = [
    ("NVRM: Xid (PCI:0000:37:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     ("00000000:37:00.0", 79)),
    ("NVRM: Xid (PCI:0000:ca:00): 119, pid=2745, name=python3, Timeout after 6s of waiting for RPC response from "
     "GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).", ("00000000:CA:00.0", 119)),
    ("[ 1234.567890] NVRM: Xid (PCI:0000:17:00.0): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)",
     ("00000000:17:00.0", 13)),
    ("NVRM: Xid (PCI:00000001:3b:00): 48, pid=1, name=x, An uncorrectable double bit error", ("00000001:3B:00.0", 48)),
    ("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 24 egress non-posted PRIV error", None),
    ("NVRM: GPU at PCI:0000:37:00: GPU-5a8a94f9-cd51-8ba7-0b32-2dba1a0e3b47", None),
    ("NVRM: Xid (PCI:0000:37:00): not-a-number, x", None),
    # issue 51: on a MIG GPU the driver attributes the XID to a GPU instance, or to a compute instance too
    # (kernel_rc.c's krcReportXid: "(PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, %s")
    ("NVRM: Xid (PCI:0000:4e:00 GPU-I:05): 31, pid=4242, name=python3, Ch 00000008, intr 00000000. MMU Fault",
     ("00000000:4E:00.0", 31)),
    ("NVRM: Xid (PCI:0000:4e:00 GPU-I:05 GPU-CI:01): 13, pid=4242, name=python3, Graphics Exception",
     ("00000000:4E:00.0", 13)),
    ("NVRM: GPU 0000:37:00.0: GPU has fallen off the bus.", None),  # read apart, as XID 79 (below)
]


@pytest.mark.parametrize(("line", "expected"), [
    ("NVRM: GPU 0000:37:00.0: GPU has fallen off the bus.", "00000000:37:00.0"),  # kernel-open's NV_DEV_PRINTF
    ("[ 99.1] NVRM: GPU 0001:ca:00.0: GPU has fallen off the bus.", "00000001:CA:00.0"),
    ("NVRM: Xid (PCI:0000:37:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", None),
    ("NVRM: GPU at PCI:0000:37:00: GPU-5a8a94f9-cd51-8ba7-0b32-2dba1a0e3b47", None),
])
def test_the_drivers_fallen_off_the_bus_line_is_read(line: str, expected: str | None) -> None:
    """Issue 51: the driver's own line for a GPU gone from the bus, which may come without an Xid 79 line (GPUd and
    NVSentinel read it too), was not read."""
    from gpuwear.kernlog import parse_lost

    assert parse_lost(line) == expected


@pytest.mark.parametrize(("line", "expected"), LINES)
def test_the_drivers_xid_lines_are_read_and_nothing_else(line: str, expected: tuple[str, int] | None) -> None:
    assert parse_xid(line) == expected


# NVSwitch SXid lines as public logs show them (GPUd's parser, NVSentinel's and other tests): none is a GPU's XID
SXID_LINES = [
    ("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
     ("00000000:05:00.0", 12028, False)),
    ("kernel: [123.456791] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error",
     ("00000000:C3:00.0", 24007, True)),
    ("nvidia-nvswitch1 SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04", ("00000000:06:00.0", 20009, False)),
    ("nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 11001, Fatal, ingress invalid command", ("00000000:00:00.0", 11001,
                                                                                          True)),
    ("nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): garbled, Fatal", None),
    # the lines the NVSwitch driver writes after an SXid's first (its _nvswitch_dump_error_entry): the same error,
    # not more non-fatal ones (issue 51)
    ("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 32 Sub-engine instance 00", None),
    ("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Data {0x00000000, 0x00000000, 0x00000000, 0x00000000, "
     "0x00000000, 0x00000000, 0x00000000, 0x00000000}", None),
    ("NVRM: Xid (PCI:0000:37:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", None),
]


@pytest.mark.parametrize(("line", "expected"), SXID_LINES)
def test_the_nvswitch_sxid_lines_are_read_apart(line: str, expected: tuple[str, int, bool] | None) -> None:
    assert parse_sxid(line) == expected
    if expected is not None:
        assert parse_xid(line) is None


def test_kmsg_records_and_bus_ids_compare_with_nvmls() -> None:
    assert kmsg_message("3,1207,5693318421,-;NVRM: Xid (PCI:0000:37:00): 79, x") == "NVRM: Xid (PCI:0000:37:00): 79, x"
    assert kmsg_message("NVRM: Xid (PCI:0000:37:00): 79, a; b") == "NVRM: Xid (PCI:0000:37:00): 79, a; b"
    assert bus_key("00000000:37:00.0") == bus_key("0000:37:00.0") == "00000000:37:00.0"
    assert bus_key("00000000:ca:00.0") == parse_xid("NVRM: Xid (PCI:0000:CA:00): 1, x")[0]  # type: ignore[index]
    assert resolve("auto", {}) == "kmsg" and resolve("journal", {}) == "journal" and resolve("/x", {}) == "/x"


def test_a_file_is_followed_as_it_grows(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("3,1,1,-;NVRM: Xid (PCI:0000:37:00): 79, first\nunrelated line\n")
    seen: list[tuple[str, int]] = []
    follower = KernelLogXids(str(log), lambda bus, code: seen.append((bus, code)))
    follower.start()
    try:
        deadline = time.monotonic() + 30
        while len(seen) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        with log.open("a") as f:
            f.write("NVRM: Xid (PCI:0000:17:00): 119, pid=1, name=x, appended later\nNVRM: Xid (PCI:00")  # a cut line
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen == [("00000000:37:00.0", 79), ("00000000:17:00.0", 119)]
    finally:
        follower.stop()


def test_a_source_that_cannot_be_read_is_said_once_and_ends_quietly(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    follower = KernelLogXids(str(tmp_path / "absent.log"), lambda bus, code: None)
    follower.start()
    follower.stop()
    assert "cannot be read" in caplog.text and "XID 79, 119 or 120" in caplog.text


def test_a_quiet_simulated_kernel_log_never_wakes_its_reader_and_stop_still_ends_it() -> None:
    """An idle daemon's periodic wake-ups are most of its CPU: the simulated driver's kernel-log reader woke once a
    second to look at its stop request (4.8 ms of CPU a minute, 6 % of an idle 1-GPU daemon's). It now waits until
    a GPU writes a line or stop() wakes it: no wake-up over 2.5 quiet seconds, a line still read, the thread ended
    by stop()."""
    import threading

    from gpuwear.sim.simulated import parse_scenario

    class Counting(threading.Event):
        woken = 0

        def wait(self, timeout: float | None = None) -> bool:
            got = super().wait(timeout)
            Counting.woken += 1
            return got

    sim = parse_scenario({"gpus": [{"product": "h100-sxm"}]}, "test")
    sim.kernel_written = sim.gpus[0].kernel_written = Counting()
    seen: list[tuple[str, int]] = []
    follower = KernelLogXids("simulation", lambda bus, code: seen.append((bus, code)), sim.kernel_log,
                             sim.wake_kernel_log)
    follower.start()
    time.sleep(2.5)
    assert Counting.woken == 0, f"woken {Counting.woken} times while the log was quiet"
    sim.gpus[0].xid(79)
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [(bus_key(sim.gpus[0].pci_bus_id), 79)], seen
    follower.stop()
    assert not follower.running()


def test_an_xid_storm_is_counted_whole_said_once_a_minute_and_kept_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """An application in a fault loop can make thousands of XIDs a minute (XID 13, 31). Each was a WARNING line,
    and each searched every XID of the last 10 s for its twin from the other source (quadratic: 10,000 XIDs of one
    code took 0.86 s of CPU, the second 5,000 2.6 times the first). Now every one is counted, the log says the
    code once and then once a minute with how many came meanwhile, and what is kept for the twin matching is
    bounded; the twin matching itself still holds (the test above)."""
    import logging

    from gpuwear.sampler import XID_RECENT_KEPT

    rig = make_rig("demo")
    try:
        rig.run(2)
        sampler = rig.sampler
        now = [0.0]
        sampler.xid_clock = lambda: now[0]
        with caplog.at_level(logging.WARNING, logger="gpuwear.sampler"):
            for _ in range(5000):
                sampler.record_xid(1, 13)
                now[0] += 0.001
            now[0] += 60.0
            sampler.record_xid(1, 13)
        assert sampler.snapshot.gpus[1].xids[13] == 5001
        said = [r.getMessage() for r in caplog.records if "XID 13" in r.getMessage()]
        assert len(said) == 2 and said[1].endswith("; 4999 more of it since it was last said"), said
        assert all(len(kept) <= XID_RECENT_KEPT for kept in sampler._gpus[1].recent_xids.values())
    finally:
        rig.backend.close()


def test_an_xid_both_nvml_and_the_kernel_log_report_is_counted_once() -> None:
    rig = make_rig("demo")
    try:
        rig.run(2)
        sampler = rig.sampler
        now = [0.0]
        sampler.xid_clock = lambda: now[0]  # the real-time window, on a clock of the test's
        gpu = sampler.snapshot.gpus[1]
        bus = bus_key(gpu.identity.pci_bus_id or "")
        sampler.record_xid(1, 13)  # NVML's event first, then the driver's line: one XID
        sampler.record_kernel_xid(bus, 13)
        assert dict(sampler.snapshot.gpus[1].xids) == {13: 1}
        sampler.record_kernel_xid(bus, 79)  # the kernel log first (NVML never reports 79)
        sampler.record_kernel_xid(bus, 79)  # a second 79 a moment later is a second XID
        assert dict(sampler.snapshot.gpus[1].xids) == {13: 1, 79: 2} and sampler.snapshot.gpus[1].last_xid == 79
        now[0] += 30.0  # a later 13, told by both: one more
        sampler.record_xid(1, 13)
        sampler.record_kernel_xid(bus, 13)
        assert dict(sampler.snapshot.gpus[1].xids) == {13: 2, 79: 2}
        now[0] += 30.0  # and one the kernel log alone tells of, well after: one more again
        sampler.record_kernel_xid(bus, 13)
        assert dict(sampler.snapshot.gpus[1].xids) == {13: 3, 79: 2}
        assert dict(sampler.snapshot.gpus[0].xids) == {}  # the other GPU's bus id: nothing
        sampler.record_kernel_xid("0000000F:01:00.0", 79)  # a bus id no GPU has here: said, not counted
        assert all(not g.xids or g.identity.index == 1 for g in sampler.snapshot.gpus)
    finally:
        rig.backend.close()


def test_a_gpu_off_the_bus_told_three_ways_is_one_xid_79_and_an_unlisted_storm_is_said_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 51: the driver's fallen-off-the-bus line counts as XID 79 (it may come without the Xid line); told by
    the Xid line, NVML and that line within 10 s, it is one XID, in any order; two such lines 30 s apart are two.
    20,000 XID lines for a PCI address NVML does not list wrote 20,000 warnings: now the first, then once a
    minute."""
    import logging

    rig = make_rig("demo")
    try:
        rig.run(2)
        sampler = rig.sampler
        now = [0.0]
        sampler.xid_clock = lambda: now[0]
        bus = bus_key(sampler.snapshot.gpus[1].identity.pci_bus_id or "")
        sampler.record_kernel_lost(bus)
        assert dict(sampler.snapshot.gpus[1].xids) == {79: 1}
        for told in (lambda: sampler.record_kernel_xid(bus, 79), lambda: sampler.record_xid(1, 79),
                     lambda: sampler.record_kernel_lost(bus)):
            now[0] += 30.0
            told()
        assert dict(sampler.snapshot.gpus[1].xids) == {79: 4}  # three, 30 s apart: three more
        now[0] += 30.0
        for told in (lambda: sampler.record_xid(1, 79), lambda: sampler.record_kernel_lost(bus),
                     lambda: sampler.record_kernel_xid(bus, 79)):
            told()
            now[0] += 2.0
        assert dict(sampler.snapshot.gpus[1].xids) == {79: 5}  # told three ways within 10 s: one
        with caplog.at_level(logging.WARNING, logger="gpuwear.sampler"):
            for _ in range(20_000):
                sampler.record_kernel_xid("0000000F:01:00.0", 79)
                now[0] += 0.001
        said = [r.getMessage() for r in caplog.records if "does not list" in r.getMessage()]
        assert len(said) == 1, said
        now[0] += 60.0
        with caplog.at_level(logging.WARNING, logger="gpuwear.sampler"):
            sampler.record_kernel_xid("0000000F:01:00.0", 79)
        said = [r.getMessage() for r in caplog.records if "does not list" in r.getMessage()]
        assert len(said) == 2 and said[1].endswith("; 19999 more of it since it was last said"), said
        assert all(not g.xids or g.identity.index == 1 for g in sampler.snapshot.gpus)
        # counted for the host, in a series of its own (issue 51), at once
        assert sampler.snapshot.unlisted_xids == 20_001
        from gpuwear.collector import encode
        from gpuwear.metrics import DaemonInfo, Published

        info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="")
        text = encode(Published(sampler.snapshot, {}, None, info), False).decode()
        assert "\ngpuwear_xid_unlisted_events_total 20001.0\n" in text
    finally:
        rig.backend.close()


@contextmanager
def _daemon_following(tmp_path: Path, kern: Path, state: Path | None = None) -> Iterator[tuple[str, Path]]:
    """`gpuwear run --simulate demo` following the kernel-log file ``kern`` (health.kernel_log): its base URL and
    its log."""
    config = tmp_path / "config.yaml"
    config.write_text(f"health:\n  kernel_log: {kern}\nmetrics:\n  detail: true\n")  # each XID's code
    port = free_port()
    log = tmp_path / "daemon.log"
    with started([sys.executable, "-m", "gpuwear", "run", "--simulate", "demo", "--config", str(config),
                  "--listen", f"127.0.0.1:{port}", "--state-dir", str(state or tmp_path / "state")], log, REPO), \
            logs_on_failure(log):
        yield f"http://127.0.0.1:{port}", log


@pytest.mark.slow
def test_the_daemon_counts_an_xid_79_from_a_kernel_log_it_follows(tmp_path: Path) -> None:
    """NVML's events never carry XID 79 (the GPU has fallen off the bus): before, gpuwear never counted one."""
    kern = tmp_path / "kern.log"
    kern.write_text("")
    with _daemon_following(tmp_path, kern) as (url, log):
        body = wait_for(f"{url}/metrics", "gpuwear_gpu_info")
        assert 'xid="79"' not in body
        # the demo's H100 is at PCI 00000000:37:00.0
        with kern.open("a") as f:
            f.write("6,4242,123456789,-;NVRM: Xid (PCI:0000:37:00): 79, pid='<unknown>', name=<unknown>, GPU has "
                    "fallen off the bus.\n")
        body = wait_for(f"{url}/metrics", 'xid="79"')
        line = next(ln for ln in body.splitlines() if ln.startswith("gpuwear_xid_events_total{") and 'xid="79"' in ln)
        assert 'gpu="1"' in line and line.endswith(" 1.0"), line
        # by default too, in the card's lifetime count (the ledger's: at the tick after the line)
        body = wait_for(f"{url}/metrics", 'gpuwear_xid_tier_events_total{gpu="1",tier="act",uuid="GPU-00000001-5111-'
                                          '4a7e-9c3d-000000000001"} 1.0')
        # an NVSwitch's SXids (issue 29): counted for the host by severity, never as a GPU's XID
        assert "gpuwear_nvswitch_sxid_events_total{" not in body
        page = wait_for(f"{url}/", "</html>")  # rendered, and kept until what it shows changes
        assert "NVSwitch" not in page
        with kern.open("a") as f:
            f.write("4,4243,123456790,-;nvidia-nvswitch2: SXid (PCI:0000:0b:00.0): 12028, Non-fatal, Link 32 egress "
                    "non-posted PRIV error (First)\n"
                    "4,4244,123456791,-;nvidia-nvswitch2: SXid (PCI:0000:0b:00.0): 24007, Fatal, Link 30 sourcetrack "
                    "timeout error\n")
        body = wait_for(f"{url}/metrics", 'gpuwear_nvswitch_sxid_events_total{severity="fatal"}')
        assert 'gpuwear_nvswitch_sxid_events_total{severity="fatal"} 1.0' in body
        assert 'gpuwear_nvswitch_sxid_events_total{severity="non_fatal"} 1.0' in body
        assert 'xid="12028"' not in body and 'xid="24007"' not in body
        # and on the page, as the host's: the page kept before them is not served again
        page = wait_for(f"{url}/", "fatal NVSwitch SXid")
        fabric = re.findall(r"<strong>NVSwitch fabric.</strong> ([^<]*)</p>", page)
        assert [line.split(" in the kernel log")[0] for line in fabric] == [
            "1 fatal NVSwitch SXid error(s)", "1 non-fatal NVSwitch SXid error(s)"], fabric
        assert "journalctl -k | grep SXid" in fabric[0]
    assert "SXid 24007 (fatal, kernel log)" in log.read_text()


@pytest.mark.slow
def test_a_simulated_xid_is_counted_once_and_79_from_the_kernel_log_alone(tmp_path: Path) -> None:
    """The fake's scripted XIDs: each a kernel-log line of its driver; 13 an NVML event too (counted once), 79 not
    (NVML cannot report it): before, the fake delivered 79 as an NVML event, which a real driver never does."""
    scenario = tmp_path / "xids.yaml"
    scenario.write_text("gpus:\n  - product: rtx4090\n  - product: h100-sxm\n"
                        "faults:\n  - {at: 2, gpu: 1, kind: xid, xid: 13}\n  - {at: 4, gpu: 1, kind: xid, xid: 79}\n")
    config = tmp_path / "config.yaml"
    config.write_text("metrics:\n  detail: true\n")  # each XID's code
    port = free_port()
    log = tmp_path / "daemon.log"
    with started([sys.executable, "-m", "gpuwear", "run", "--simulate", str(scenario), "--config", str(config),
                  "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state")], log, REPO), \
            logs_on_failure(log):
        body = wait_for(f"http://127.0.0.1:{port}/metrics", 'xid="79"')
        time.sleep(1.0)  # the twin of XID 13, had it been counted twice, would show by now
        body = wait_for(f"http://127.0.0.1:{port}/metrics", 'xid="79"')
        counts = {ln.split('xid="')[1].split('"')[0]: ln.rsplit(" ", 1)[1] for ln in body.splitlines()
                  if ln.startswith("gpuwear_xid_events_total{")}
        assert counts == {"13": "1.0", "79": "1.0"}, counts
    text = log.read_text()
    assert "XID 13 (NVML event)" in text or "XID 13 (kernel log)" in text
    assert "XID 79 (kernel log)" in text and "XID 79 (NVML event)" not in text


JOURNAL_READER = """
import sys, time
sys.path.insert(0, {daemon!r})
from gpuwear.kernlog import KernelLogXids
seen = []
follower = KernelLogXids("journal", lambda bus, code: seen.append((bus, code)))
follower.start()
deadline = time.monotonic() + 30
while not seen and follower.problem() is None and time.monotonic() < deadline:
    time.sleep(0.02)
follower.stop()
print(seen)
"""


@pytest.mark.parametrize("ends", [False, True], ids=["follows", "ends"])
def test_the_journal_is_read_through_journalctl(ends: bool, tmp_path: Path) -> None:
    """The journal source runs `journalctl --dmesg --follow --lines=0 --output=json`: a journalctl of the test's
    on PATH answers as the real one does (one object per entry); one that ends by itself (no journal, no right to
    read it) is said once in the log, and the reader says why (problem)."""
    fake = tmp_path / "bin" / "journalctl"
    fake.parent.mkdir()
    args = tmp_path / "args"
    tail = "exit 1" if ends else "sleep 60"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {args}\n"
                    + ("" if ends else "echo '{\"__CURSOR\": \"s=1;i=2\", \"MESSAGE\": \"NVRM: Xid (PCI:0000:37:00): "
                       "79, pid=<unknown>, name=<unknown>, GPU has fallen off the bus.\"}'\n") + f"{tail}\n")
    fake.chmod(0o755)
    import os
    import subprocess
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ.get('PATH', '')}"}
    run = subprocess.run([sys.executable, "-c", JOURNAL_READER.format(daemon=str(REPO / "daemon"))], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert args.read_text().split() == ["--dmesg", "--follow", "--lines=0", "--output=json", "--quiet"]
    if ends:
        assert run.stdout.strip() == "[]" and "journalctl ended (exit status 1)" in run.stderr, run.stderr
    else:
        assert run.stdout.strip() == "[('00000000:37:00.0', 79)]", (run.stdout, run.stderr)


def test_a_journalctl_that_ends_is_started_again_after_the_last_entry_read(tmp_path: Path) -> None:
    """Issue 51: a journalctl that exited was never started again, and nothing showed the XID source was gone. Now
    the reader says why (problem), tries again after 1 s, and the new journalctl goes on after the last entry read
    (--after-cursor): the XID logged meanwhile is counted, and the problem cleared."""
    fake = tmp_path / "bin" / "journalctl"
    fake.parent.mkdir()
    calls = tmp_path / "calls"
    first = '{"__CURSOR": "s=a;i=1", "MESSAGE": "NVRM: Xid (PCI:0000:37:00): 13, pid=1, name=x, Graphics Exception"}'
    second = ('{"__CURSOR": "s=a;i=2", "MESSAGE": [78, 86, 82, 77, 58, 32, 88, 105, 100, 32, 40, 80, 67, 73, 58, 48, '
              '48, 48, 48, 58, 51, 55, 58, 48, 48, 41, 58, 32, 55, 57, 44, 32, 255]}')  # not UTF-8: a list of bytes
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                    f"case \"$*\" in *--after-cursor=s=a\\;i=1*) echo '{second}'; exec sleep 60;;\n"
                    f"*) echo '{first}'; echo 'not json'; exit 1;; esac\n")
    fake.chmod(0o755)
    import os

    seen: list[tuple[str, int]] = []
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{fake.parent}:{old_path}"
    follower = KernelLogXids("journal", lambda bus, code: seen.append((bus, code)))
    try:
        follower.start()
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen == [("00000000:37:00.0", 13), ("00000000:37:00.0", 79)], (seen, calls.read_text())
        wait = time.monotonic() + 30
        while follower.problem() is not None and time.monotonic() < wait:
            time.sleep(0.02)
        assert follower.problem() is None and follower.running()
        lines = calls.read_text().splitlines()
        assert lines[0].split() == ["--dmesg", "--follow", "--lines=0", "--output=json", "--quiet"]
        assert lines[1].split() == ["--dmesg", "--follow", "--after-cursor=s=a;i=1", "--output=json", "--quiet"]
    finally:
        follower.stop()
        os.environ["PATH"] = old_path
    assert not follower.running()


def test_a_kernel_log_file_that_cannot_be_read_is_tried_again_and_said_why(tmp_path: Path) -> None:
    """A source that cannot be read is not given up: the reader says why (what /healthz and
    gpuwear_kernel_log_following show), tries again with back-off, and follows it once it can."""
    path = tmp_path / "kern.log"
    seen: list[tuple[str, int]] = []
    follower = KernelLogXids(str(path), lambda bus, code: seen.append((bus, code)))
    try:
        follower.start()
        deadline = time.monotonic() + 30
        while follower.problem() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert follower.problem() == "No such file or directory" and follower.running()
        path.write_text("NVRM: Xid (PCI:0000:37:00): 48, pid=1, name=x, An uncorrectable double bit error\n")
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [("00000000:37:00.0", 48)] and follower.problem() is None
    finally:
        follower.stop()


def test_the_kernel_logs_state_is_a_metric() -> None:
    """gpuwear_kernel_log_following: 1 while followed, 0 while it cannot be read, absent when off."""
    from gpuwear.collector import encode
    from gpuwear.metrics import DaemonInfo, Published
    from gpuwear.sampler import EMPTY

    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="")
    for following, line in ((True, "gpuwear_kernel_log_following 1.0"), (False, "gpuwear_kernel_log_following 0.0"),
                            (None, None)):
        text = encode(Published(EMPTY, {}, None, info, kernel_log_following=following), False).decode()
        samples = [ln for ln in text.splitlines() if ln.startswith("gpuwear_kernel_log_following")]
        assert samples == ([line] if line else []), samples


@pytest.mark.slow
def test_a_kernel_log_the_daemon_cannot_read_is_in_healthz_and_the_metric_until_it_can(tmp_path: Path) -> None:
    """Issue 51: nothing showed the XID source was gone. A kernel log file that is not there yet: /healthz names it
    (503) and gpuwear_kernel_log_following is 0; once it exists, both clear and its XIDs count."""
    from helpers import fetch

    kern = tmp_path / "kern.log"
    with _daemon_following(tmp_path, kern) as (url, log):
        wait_for(f"{url}/metrics", "gpuwear_kernel_log_following 0.0")
        status, body = fetch(f"{url}/healthz")
        assert status == 503 and f"the kernel log ({kern}) cannot be read (No such file or directory)" in body, body
        kern.write_text("NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the "
                        "bus.\n")
        wait_for(f"{url}/metrics", "gpuwear_kernel_log_following 1.0")
        deadline = time.monotonic() + 60
        while (healthz := fetch(f"{url}/healthz"))[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert healthz[0] == 200, healthz
    assert "kernel log" in log.read_text() and "is read again" in log.read_text()


@pytest.mark.slow
def test_the_kernel_log_is_resumed_where_the_last_run_stopped_with_the_counts_it_covers(tmp_path: Path) -> None:
    """Issue 51: the reader started at "now" (a file: at its start), so an XID that made the daemon restart, or was
    logged while it was stopped, was never counted (a file's, counted again). Now the position it read to is
    committed with the counts it covers (the ledger's meta, in the save's transaction) and the next run goes on
    after it: the XID logged while it was stopped is counted, the one before is not counted again; the card's
    lifetime counts by tier hold both (issue 56)."""
    import json as _json

    kern = tmp_path / "kern.log"
    kern.write_text("NVRM: Xid (PCI:0000:37:00): 13, pid=1, name=x, Graphics Exception\n")  # a watch reason
    state = tmp_path / "state"

    def run(severity: str) -> str:
        with _daemon_following(tmp_path, kern, state) as (url, _):
            # the verdict's reason: in the tracker's records, saved at stop
            return wait_for(f"{url}/metrics", f'code="xid_N",gpu="1",severity="{severity}"')

    first = run("watch")
    assert 'xid="13"' in first
    with kern.open("a") as f:  # while the daemon is stopped
        f.write("NVRM: Xid (PCI:0000:37:00): 48, pid=7, name=python3, An uncorrectable double bit error\n")
    second = run("act")
    since_start = {ln.split('xid="')[1].split('"')[0]: ln.rsplit(" ", 1)[1] for ln in second.splitlines()
                   if ln.startswith("gpuwear_xid_events_total{")}
    assert since_start == {"48": "1.0"}, since_start  # the 13 before the stop is not read again
    # issue 56: by tier over the card's life, the 13 of the first run kept and the 48 read at this start counted
    lifetime = {ln.split('tier="')[1].split('"')[0]: ln.rsplit(" ", 1)[1] for ln in second.splitlines()
                if ln.startswith('gpuwear_xid_tier_events_total{gpu="1"')}
    assert lifetime == {"act": "1.0", "watch": "1.0"}, lifetime
    report = subprocess.run([sys.executable, "-m", "gpuwear", "report", "--json", "--state-dir", str(state),
                             "--simulated", "demo"], capture_output=True, text=True, timeout=60, check=True)
    h100 = next(g for g in _json.loads(report.stdout)["gpus"] if "H100" in g["name"])
    codes = {r["code"] for r in h100["health"]["reasons"]}
    assert {"xid_13", "xid_48"} <= codes, codes


def test_a_journal_position_is_resumed_and_one_the_journal_no_longer_holds_is_dropped(tmp_path: Path) -> None:
    """The position a last run saved: journalctl goes on after its cursor; a cursor it refuses (the journal rotated
    or vacuumed it away) is said, and the reader goes on from now. A /dev/kmsg record's sequence number, what its
    position keeps, is read from the record."""
    import os

    from gpuwear.kernlog import _kmsg_sequence

    fake = tmp_path / "bin" / "journalctl"
    fake.parent.mkdir()
    calls = tmp_path / "calls"
    entry = '{"__CURSOR": "s=b;i=3", "MESSAGE": "NVRM: Xid (PCI:0000:37:00): 79, pid=1, name=x, off the bus"}'
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                    f"case \"$*\" in *--after-cursor=gone*) exit 1;; *--after-cursor=*) echo '{entry}'; exec sleep 60;;"
                    f"\n*) exec sleep 60;; esac\n")
    fake.chmod(0o755)
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{fake.parent}:{old_path}"
    try:
        for cursor, first in (("s=b;i=2", "--after-cursor=s=b;i=2"), ("gone", "--after-cursor=gone")):
            calls.write_text("")
            seen: list[tuple[str, int]] = []
            positions: list[dict[str, object]] = []
            follower = KernelLogXids("journal", lambda bus, code, seen=seen: seen.append((bus, code)),
                                     resume={"source": "journal", "cursor": cursor}, on_position=positions.append)
            follower.start()
            deadline = time.monotonic() + 30
            # kept: an XID after the cursor; refused: journalctl started again from now
            while not (seen if cursor != "gone" else len(calls.read_text().splitlines()) >= 2) \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
            follower.stop()
            lines = [ln.split()[2] for ln in calls.read_text().splitlines()]
            assert lines[0] == first, lines
            if cursor == "gone":
                assert lines[1] == "--lines=0" and not seen, lines
            else:
                assert seen == [("00000000:37:00.0", 79)] and positions == [{"source": "journal", "cursor": "s=b;i=3"}]
        # another source's position is not resumed
        calls.write_text("")
        other = KernelLogXids("journal", lambda bus, code: None, resume={"source": "kmsg", "boot": "x", "seq": 4})
        other.start()
        deadline = time.monotonic() + 30
        while not calls.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        other.stop()
        assert calls.read_text().split()[2] == "--lines=0"
    finally:
        os.environ["PATH"] = old_path
    assert _kmsg_sequence("6,4242,123456789,-;NVRM: Xid (PCI:0000:37:00): 79, x") == 4242
    assert _kmsg_sequence("NVRM: Xid (PCI:0000:37:00): 79, x") is None and _kmsg_sequence("6,x,1,-;m") is None


CORPUS = REPO / "tests" / "fixtures" / "kernel-log" / "corpus.yaml"


def _corpus() -> list[dict[str, object]]:
    import yaml

    entries: list[dict[str, object]] = yaml.safe_load(CORPUS.read_text())
    assert len(entries) >= 20 and all(e.get("source") for e in entries)
    assert all(sum(k in e for k in ("xid", "lost", "sxid", "none")) == 1 for e in entries), entries
    return entries


def test_the_corpus_of_real_kernel_log_lines_is_read_as_each_line_says() -> None:
    """Issue 51, slice 6: lines NVIDIA's drivers write, gathered from public sources (each cited in the fixture),
    each read as what it is: a GPU's XID (MIG-attributed too), a GPU off the bus, an NVSwitch's SXid (not its
    continuation lines), or nothing."""
    from gpuwear.kernlog import NVLINK_LINE_CODES, parse_lost, parse_nvlink, parse_process, parse_unit

    for e in _corpus():
        message = kmsg_message(str(e["line"]))
        xid = parse_xid(message)
        nvlink = parse_nvlink(message, xid[1]) if xid is not None and xid[1] in NVLINK_LINE_CODES else None
        assert (None if nvlink is None else [nvlink[0], list(nvlink[1])]) == e.get("nvlink"), e
        process = parse_process(message) if xid is not None else None
        unit = [parse_unit(message)] if process is not None and parse_unit(message) else []
        assert (None if process is None else list(process) + unit) == e.get("process"), e
        assert parse_xid(message) == (tuple(e["xid"]) if "xid" in e else None), e  # type: ignore[arg-type]
        assert parse_lost(message) == e.get("lost"), e
        assert parse_sxid(message) == (tuple(e["sxid"]) if "sxid" in e else None), e  # type: ignore[arg-type]


def test_the_corpus_replayed_through_the_reader_end_to_end(tmp_path: Path) -> None:
    """The whole corpus, written to a file the reader follows as the daemon does (health.kernel_log: a path), gives
    the callbacks each line's finding, in order, and nothing else."""
    entries = _corpus()
    path = tmp_path / "kern.log"
    path.write_text("".join(f"{e['line']}\n" for e in entries))
    found: list[tuple[str, object]] = []
    follower = KernelLogXids(str(path), lambda bus, code: found.append(("xid", [bus, code])),
                             on_sxid=lambda switch, code, fatal: found.append(("sxid", [switch, code, fatal])),
                             on_lost=lambda bus: found.append(("lost", bus)),
                             on_nvlink=lambda bus, code, link, values: found.append(("nvlink", [link, list(values)])),
                             on_process=lambda bus, code, pid, name, gi, unit: found.append(
                                 ("process", [pid, name, gi] + ([unit] if unit else []))))
    expected = [(kind, e[kind]) for e in entries for kind in ("nvlink", "process", "xid", "lost", "sxid") if kind in e]
    try:
        follower.start()
        deadline = time.monotonic() + 30
        while len(found) < len(expected) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        follower.stop()
    assert found == expected


def test_a_counted_xid_publishes_what_a_whole_new_snapshot_would() -> None:
    """An XID counted publishes the last snapshot with that GPU's XIDs updated (an XID storm rebuilt every GPU's
    status per line: 25.7 us a line at 8 GPUs, bench/kernlog_storm.py): after XIDs on several GPUs from every source,
    between ticks, it equals a snapshot made whole from the sampler's state."""
    rig = make_rig("demo")
    try:
        rig.run(2)
        sampler = rig.sampler
        now = [0.0]
        sampler.xid_clock = lambda: now[0]
        buses = [bus_key(g.identity.pci_bus_id or "") for g in sampler.snapshot.gpus]
        for step in range(40):
            now[0] += 7.0
            gpu = step % len(buses)
            (sampler.record_kernel_xid(buses[gpu], 13 + step % 3) if step % 3 == 0 else
             sampler.record_xid(gpu, 31) if step % 3 == 1 else sampler.record_kernel_lost(buses[gpu]))
            if step % 10 == 9:
                rig.run(1)
            whole = tuple(g.status() for g in sampler._gpus)
            assert sampler.snapshot.gpus == whole, step
        assert sum(sum(g.xids.values()) for g in sampler.snapshot.gpus) > 20
    finally:
        rig.backend.close()


@pytest.mark.slow
def test_a_source_read_again_starts_its_back_off_anew(tmp_path: Path) -> None:
    """The back-off doubles while a source keeps failing (1 s, 2 s, ...), and starts again at 1 s once it was read:
    a journalctl that fails twice, then reads an entry and ends, is started again about 1 s later, not 4 s."""
    import os

    fake = tmp_path / "bin" / "journalctl"
    fake.parent.mkdir()
    calls = tmp_path / "calls"
    calls.write_text("")
    entry = '{"__CURSOR": "s=c;i=1", "MESSAGE": "NVRM: Xid (PCI:0000:37:00): 13, pid=1, name=x, Graphics Exception"}'
    fake.write_text(f"#!/bin/sh\ndate +%s.%N >> {calls}\nn=$(wc -l < {calls})\n"
                    f"if [ \"$n\" -eq 3 ]; then echo '{entry}'; fi\nexit 1\n")
    fake.chmod(0o755)
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{fake.parent}:{old_path}"
    follower = KernelLogXids("journal", lambda bus, code: None)
    try:
        follower.start()
        deadline = time.monotonic() + 60
        while len(calls.read_text().splitlines()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        follower.stop()
        os.environ["PATH"] = old_path
    starts = [float(t) for t in calls.read_text().split()]
    assert len(starts) >= 4, starts
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert 0.8 < gaps[0] and 1.8 < gaps[1] and gaps[2] < 3.0, gaps  # 1 s, 2 s, then 1 s again (4 s before)


def test_the_body_kept_between_ticks_follows_the_kernel_logs_state() -> None:
    """The exposition keeps one body per published state: the kernel log's state is part of that state, so a source
    that stops being read between two ticks (the same snapshot) is not served as followed (the body was kept on the
    snapshot, the views, the ledger's status and the missing GPUs alone)."""
    from gpuwear.collector import Exposition
    from gpuwear.metrics import DaemonInfo, Published
    from gpuwear.sampler import EMPTY

    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="")
    state = {"following": True}
    views: dict[str, object] = {}
    exposition = Exposition(lambda: Published(EMPTY, views, None, info,  # type: ignore[arg-type]
                                              kernel_log_following=state["following"]), process=False)
    assert "gpuwear_kernel_log_following 1.0" in exposition.render(False).decode()
    state["following"] = False
    assert "gpuwear_kernel_log_following 0.0" in exposition.render(False).decode()
