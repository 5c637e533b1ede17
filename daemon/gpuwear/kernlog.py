"""XIDs from the kernel log: the NVIDIA driver's ``NVRM: Xid (PCI:0000:17:00): 79, pid=..., ...`` lines, and the
NVSwitch driver's ``nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, ...`` lines.

NVML's event API does not report every XID (an NVIDIA maintainer: not 79, 119 or 120, NVIDIA/DCGM #162); the driver
writes each one to the kernel log. :class:`KernelLogXids` follows a source on a thread of its own and hands each XID
line to a callback with the GPU's PCI bus id (the sampler maps it to the GPU and counts it once, whichever of NVML and
the kernel log told it first). Sources (``health.kernel_log``):

- ``kmsg``: /dev/kmsg, from its end (the records before the start were counted by the run that saw them);
- ``journal``: ``journalctl --dmesg --follow --lines=0 --output=cat`` (systemd's copy of the kernel log, readable
  by the members of systemd-journal without root);
- a path: a file of /dev/kmsg records (``PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE``) or of plain log lines,
  read from its start and followed as it grows (replays and tests);
- ``auto``: the journal under systemd (``$INVOCATION_ID`` set) where journalctl exists, else /dev/kmsg;
- ``off``: none.

Where it stopped reading is a position (told to ``on_position`` line by line: the journal's cursor, /dev/kmsg's boot and
record sequence number, a file's inode and offset) the daemon commits with the counts it covers, in the same ledger
transaction; started again with it (``resume``), the reader goes on after it, so an XID that made the daemon restart,
or logged at boot before it started, is counted (a journal cursor the journal no longer holds: from now on; /dev/kmsg
of another boot: its records from the boot on; a file replaced or cut: from its start).

A source that cannot be read (no permission, no such file, a journalctl that ends) is said once in the log and tried
again after 1 s, then twice as long each time up to :data:`RETRY_MAX_SECONDS`; meanwhile XIDs come from NVML's events
alone, and :meth:`KernelLogXids.problem` says why (/healthz and ``gpuwear_kernel_log_following``). A journalctl
started again goes on after the last entry read (``--after-cursor``), so nothing logged meanwhile is lost.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SOURCES = ("auto", "journal", "kmsg", "off")
KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
POLL_SECONDS = 0.5  # how often a followed file is looked at for new lines (/dev/kmsg and the journal wake on a line)
RETRY_FIRST_SECONDS = 1.0  # a source that failed is tried again after this, then twice as long each time...
RETRY_MAX_SECONDS = 300.0  # ... up to this

# The driver's forms (src/nvidia/src/kernel/gpu/rc/kernel_rc.c, krcReportXid): "NVRM: Xid (PCI:%04x:%02x:%02x):
# %d, pid=%s, name=%s, %s", and on a MIG GPU the XID attributed to its GPU instance, "(PCI:%04x:%02x:%02x GPU-I:%02u)",
# or to a compute instance too, "(PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u)"; e.g. "NVRM: Xid (PCI:0000:17:00): 79,
# pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?"
                  r"(?: GPU-I:\d{1,3}(?: GPU-CI:\d{1,3})?)?\): (\d{1,5}),")
# the driver's own line when a GPU falls off the bus, which may come without an Xid 79 line (kernel-open's
# NV_DEV_PRINTF: "NVRM: GPU %04x:%02x:%02x.%x: " format; os-interface.c: "GPU has fallen off the bus.")
_LOST = re.compile(r"NVRM: GPU ([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-7]: GPU has fallen off the bus")
# an NVSwitch's: "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error"
# (its PCI id is the switch's, not a GPU's), then lines of the same SXid without a severity ("12028, Severity 1 Engine
# instance 32 ...", "12028, Data {...}": the NVSwitch driver's _nvswitch_dump_error_entry), which are not more errors
_SXID = re.compile(r"nvidia-nvswitch\d*:? SXid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\): "
                   r"(\d{1,5})(?:, (Fatal|Non-fatal))?")


# the process krcReportXid names: "pid=%s, name=%s, " (the host's PID and the process's 15-character comm; the GPU's own
# faults give "pid='<unknown>', name=<unknown>")
_PROCESS = re.compile(r"(?: GPU-I:(\d{1,3})(?: GPU-CI:(\d{1,3}))?)?\): \d{1,5}, "
                      r"pid=(?:'?<unknown>'?|(\d{1,10}))(?:, name=([^,]{0,64}?))?,")
UNKNOWN_PROCESS = "<unknown>"


def parse_process(message: str) -> tuple[int | None, str, str] | None:
    """(the PID, the process name, the MIG instance) an XID line names: None and :data:`UNKNOWN_PROCESS` where it
    says the process is unknown, the instance the driver attributes the XID to on a MIG GPU ("GPU-I 5 GPU-CI 1";
    "" on a whole GPU); None where the line names no process (older drivers, some codes). The name is made
    printable (a character that is not: "?")."""
    m = _PROCESS.search(message)
    if m is None:
        return None
    gi, ci = m.group(1), m.group(2)
    where = "" if gi is None else f"GPU-I {int(gi)}" + ("" if ci is None else f" GPU-CI {int(ci)}")
    name = (m.group(4) or "").strip().strip("'")
    pid = int(m.group(3)) if m.group(3) else None
    shown = "".join(c if c.isprintable() else "?" for c in name)[:64]  # the line's bytes, as another program wrote
    return pid, (UNKNOWN_PROCESS if name in ("", "<unknown>") else shown), where


# where on the chip an XID 13 (graphics engine exception) came: "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0)"
_UNIT = re.compile(r"\(GPC (\d{1,3}), TPC (\d{1,3})(?:, SM (\d{1,3}))?\)")


def parse_unit(message: str) -> str:
    """Where on the chip an XID line says its fault came ("GPC 2 TPC 1": NVIDIA's Xid 13 workflow compares repeats
    at the same GPC and TPC), else ""."""
    m = _UNIT.search(message)
    return "" if m is None else f"GPC {int(m.group(1))} TPC {int(m.group(2))}"


def parse_xid(message: str) -> tuple[str, int] | None:
    """(the GPU's PCI bus id as NVML writes it, ``00000000:17:00.0``; the XID) of a driver's XID line, else None."""
    m = _XID.search(message)
    if m is None:
        return None
    domain, bus, device, code = m.groups()
    return bus_key(f"{domain}:{bus}:{device}"), int(code)


# XID 74's text: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", the link and
# seven registers (NVIDIA/NVSentinel's design 022, from the driver's lines); older lines may end at the link
_NVLINK = re.compile(r"detected on link (\d{1,3}) ?\(((?:0x[0-9A-Fa-f]{1,16}, ?){6}0x[0-9A-Fa-f]{1,16})\)")


# The NVLink5 XIDs' text (144-150, Blackwell): "149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000
# 0x00000000 0x00000000 0x00000000 0x00000000)": the unit, its severity, the link and the values NVIDIA's decode reads
# (the interrupt info, then the error status); older drivers wrote one value in brackets
_NVLINK5 = re.compile(r"\b(?:Fatal|Nonfatal|Non-fatal)\s+XC ?\d+\s+i ?\d+\s+Link (\d{1,3}) ?"
                      r"[(\[]((?:0x[0-9A-Fa-f]{1,16}[ ,]*){1,8})[)\]]")
NVLINK_LINE_CODES = frozenset({74, *range(144, 151)})  # the codes whose line gives a link and the values judged


def parse_nvlink(message: str, code: int = 74) -> tuple[int, tuple[int, ...]] | None:
    """(the link, its values) an NVLink XID's line gives, else None: for XID 74 its seven registers, for 144-150
    (:data:`NVLINK_LINE_CODES`) the values NVIDIA's NVLink5 decode reads."""
    m = (_NVLINK if code == 74 else _NVLINK5).search(message)
    if m is None:
        return None
    return int(m.group(1)), tuple(int(r, 16) for r in re.findall(r"0x[0-9A-Fa-f]+", m.group(2)))


def parse_lost(message: str) -> str | None:
    """The GPU's PCI bus id (as :func:`parse_xid` writes it) of the driver's line saying it fell off the bus, else
    None."""
    m = _LOST.search(message)
    return None if m is None else bus_key(":".join(m.groups()))


def parse_sxid(message: str) -> tuple[str, int, bool] | None:
    """(the NVSwitch's PCI bus id, as :func:`bus_key` writes it; the SXid; whether the driver calls it fatal) of an
    NVSwitch driver's SXid line, else None. A line without its severity is one more line of the SXid before it
    (its severity, engine and data): None."""
    m = _SXID.search(message)
    if m is None or m.group(3) is None:
        return None
    switch, code, severity = m.groups()
    return bus_key(switch), int(code), severity == "Fatal"


@functools.lru_cache(maxsize=256)  # a host's few GPUs, asked for every XID line: a pure function of the text
def bus_key(pci_bus_id: str) -> str:
    """A PCI bus id as :func:`parse_xid` writes it, from NVML's (``00000000:17:00.0``; older drivers wrote a 4-digit
    domain), to compare the two."""
    parts = pci_bus_id.strip().split(":")
    try:
        return f"{int(parts[0], 16):08X}:{parts[1].upper()}:{parts[2].split('.')[0].upper()}.0"
    except (ValueError, IndexError):
        return pci_bus_id.strip().upper()


def _kmsg_head(record: str) -> tuple[list[str], str] | None:
    """The header's fields and the message of a /dev/kmsg record (``PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE``),
    None for a line that is not one."""
    head, sep, message = record.partition(";")
    fields = head.split(",")
    return (fields, message) if sep and len(fields) >= 4 and fields[0].isdigit() else None


def kmsg_message(record: str) -> str:
    """The message of a /dev/kmsg record; a line that is not one is its own message (a plain log file)."""
    parsed = _kmsg_head(record)
    return record if parsed is None else parsed[1]


def resolve(source: str, env: Mapping[str, str] | None = None) -> str:
    """``auto`` made concrete: the journal under systemd where journalctl exists, else /dev/kmsg."""
    if source != "auto":
        return source
    environ: Mapping[str, str] = os.environ if env is None else env
    return "journal" if environ.get("INVOCATION_ID") and shutil.which("journalctl") else "kmsg"


def _boot_id() -> str | None:
    """This boot's id (the kernel's random boot_id), None where it cannot be read."""
    try:
        return Path(BOOT_ID).read_text().strip()[:64] or None
    except OSError:
        return None


def _kmsg_sequence(record: str) -> int | None:
    """The sequence number of a /dev/kmsg record, else None."""
    parsed = _kmsg_head(record)
    return int(parsed[0][1]) if parsed is not None and parsed[0][1].isdigit() else None


def unreadable(source: str, timeout: float = 10.0) -> str | None:
    """Why a source (:func:`resolve`'d) cannot be read by this process, in words; None when it can (``gpuwear
    doctor``: the daemon's own user may differ)."""
    try:
        if source == "kmsg":
            os.close(os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        elif source == "journal":
            journalctl = shutil.which("journalctl")
            if journalctl is None:
                return "journalctl not found"
            done = subprocess.run([journalctl, "--dmesg", "--lines=1", "--output=json", "--quiet"], timeout=timeout,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                  check=False)
            if done.returncode != 0:
                return f"journalctl ended with exit status {done.returncode} (no journal, or no right to read it)"
        elif source not in ("off", "simulation"):
            with open(source, "rb"):
                pass
    except subprocess.TimeoutExpired:
        return f"journalctl did not answer within {timeout:g} s"
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


class KernelLogXids:
    """Follows one kernel-log source on a thread of its own, calling ``on_xid(pci_bus_id, xid)`` for each driver XID
    line, ``on_lost(pci_bus_id)`` for each line of the driver saying a GPU fell off the bus, and
    ``on_sxid(switch_pci_bus_id, sxid, fatal)`` for each NVSwitch SXid line, and ``on_nvlink(pci_bus_id, code,
    link, registers)`` for an NVLink XID's line that gives them (:func:`parse_nvlink`) and ``on_process(pci_bus_id,
    code, pid, name, instance, unit)`` for one that names its process (:func:`parse_process`, :func:`parse_unit`),
    each just before its ``on_xid``.
    /dev/kmsg and the journal are waited on until a line comes (no wake-up while the log is quiet: an idle daemon's
    periodic wake-ups are most of its CPU); :meth:`stop` wakes the wait, and ends a followed file within about
    :data:`POLL_SECONDS`. ``lines`` with ``wake``: a source of lines of its own (the simulated driver's log), read
    until stopped, and what wakes its wait.
    """

    def __init__(self, source: str, on_xid: Callable[[str, int], None],
                 lines: Callable[[threading.Event], Iterator[str]] | None = None,
                 wake: Callable[[], None] | None = None,
                 on_sxid: Callable[[str, int, bool], None] | None = None,
                 on_lost: Callable[[str], None] | None = None,
                 resume: Mapping[str, Any] | None = None,
                 on_position: Callable[[dict[str, Any]], None] | None = None,
                 on_nvlink: Callable[[str, int, int, tuple[int, ...]], None] | None = None,
                 lock: AbstractContextManager[Any] | None = None,
                 on_process: Callable[[str, int, int | None, str, str, str], None] | None = None) -> None:
        self.source = resolve(source) if lines is None else source
        # a position of this source to go on after (another source's is not)
        self._resume = dict(resume) if resume and resume.get("source") == self.source else None
        self._position: dict[str, Any] | None = None  # the line just read's
        self._on_position = on_position
        # held while a line's position is told and its XID counted: the owner of both sees them together
        self._lock = lock if lock is not None else nullcontext()
        self._on_xid = on_xid
        self._on_sxid = on_sxid
        self._on_lost = on_lost
        self._on_nvlink = on_nvlink
        self._on_process = on_process
        self._given = lines
        self._wake_given = wake
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # stop() writes: /dev/kmsg's wait ends
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._problem: str | None = None  # why the source is not followed now (None: followed, or off)
        self._cursor: str | None = None  # the journal's last entry read: where a journalctl started again goes on

    def start(self) -> None:
        if self.source == "off":
            return
        self._thread = threading.Thread(target=self._run, name="kernel-log", daemon=True)
        self._thread.start()

    def running(self) -> bool:
        """Whether the thread following the source runs (False: stopped or off; a source that cannot be read is
        tried again, see :meth:`problem`)."""
        return self._thread is not None and self._thread.is_alive()

    def problem(self) -> str | None:
        """Why the source is not being followed now (it is tried again meanwhile), in one line; None while it is,
        or when it is off."""
        return self._problem

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):  # the pipe full or closed: the wait has been woken already
            os.write(self._wake_w, b"x")
        if self._wake_given is not None:
            self._wake_given()
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
        if self._thread is not None:
            self._thread.join(timeout=2 * POLL_SECONDS + 1.0)
        if self._thread is None or not self._thread.is_alive():
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_r = self._wake_w = -1

    def _run(self) -> None:
        delay = RETRY_FIRST_SECONDS
        while not self._stop.is_set():
            try:
                self._follow()
                return  # stopped
            except OSError as exc:
                why = str(exc.strerror or exc)
            except Exception as exc:  # a bug here must not end the daemon, nor the reading for good
                log.exception("kernel log %s: reading stopped", self.source)
                why = f"{type(exc).__name__}: {exc}"
            if self._problem is None:  # it was read until now: a new failure starts the back-off again
                delay = RETRY_FIRST_SECONDS
            if self._problem != why:
                log.warning("kernel log %s cannot be read (%s): XIDs come from NVML's events alone, which do not "
                            "report XID 79, 119 or 120; trying again in %g s, then less often", self.source, why,
                            delay)
            self._problem = why
            if self._position is not None:  # tried again: from where this run got to
                self._resume = self._position
            if self._stop.wait(delay):
                return
            delay = min(2 * delay, RETRY_MAX_SECONDS)

    def _follow(self) -> None:
        for line in self._lines():
            if self._problem is not None:  # read again: said once
                log.warning("kernel log %s is read again", self.source)
                self._problem = None
            with self._lock:
                if self._on_position is not None and self._position is not None:
                    self._on_position(dict(self._position))
                self._handle(kmsg_message(line))

    def _handle(self, message: str) -> None:
        found = parse_xid(message)
        if found is not None:
            if found[1] in NVLINK_LINE_CODES and self._on_nvlink is not None \
                    and (nvlink := parse_nvlink(message, found[1])) is not None:
                self._on_nvlink(found[0], found[1], *nvlink)  # before its XID: the owner sees the two together
            if self._on_process is not None and (process := parse_process(message)) is not None:
                self._on_process(found[0], found[1], *process, parse_unit(message))  # likewise
            self._on_xid(*found)
        elif self._on_sxid is not None and (switch := parse_sxid(message)) is not None:
            self._on_sxid(*switch)
        elif self._on_lost is not None and (lost := parse_lost(message)) is not None:
            self._on_lost(lost)

    def _lines(self) -> Iterator[str]:
        if self._given is not None:
            return self._given(self._stop)
        if self.source == "kmsg":
            return self._kmsg()
        if self.source == "journal":
            return self._journal()
        return self._file(Path(self.source))

    def _kmsg(self) -> Iterator[str]:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            boot = _boot_id()
            after = -1  # the sequence number of the last record counted before (same boot), -1: every record
            if self._resume is None:
                os.lseek(fd, 0, os.SEEK_END)  # no position: from now on
            else:
                if self._resume.get("boot") == boot and isinstance(self._resume.get("seq"), int):
                    after = self._resume["seq"]
                os.lseek(fd, 0, os.SEEK_SET)  # the records the kernel still holds, from the oldest
                self._resume = None
            while not self._stop.is_set():
                ready, _, _ = select.select([fd, self._wake_r], [], [])
                if fd not in ready:
                    continue
                try:
                    record = os.read(fd, 8192)  # one record per read
                except BlockingIOError:
                    continue
                except BrokenPipeError:  # EPIPE: records overwritten before they were read; go on with the next
                    continue
                line = record.decode("utf-8", "replace").split("\n", 1)[0]
                seq = _kmsg_sequence(line)
                if seq is not None:
                    if seq <= after:
                        continue
                    self._position = {"source": "kmsg", "boot": boot, "seq": seq}
                yield line
        finally:
            os.close(fd)

    def _journal(self) -> Iterator[str]:
        journalctl = shutil.which("journalctl")
        if journalctl is None:
            raise FileNotFoundError(2, "journalctl not found")
        resumed = self._cursor is None and self._resume is not None and isinstance(self._resume.get("cursor"), str)
        if resumed:
            assert self._resume is not None
            self._cursor = self._resume["cursor"]
        self._resume = None
        read = False
        where = "--lines=0" if self._cursor is None else f"--after-cursor={self._cursor}"
        self._process = process = subprocess.Popen(
            [journalctl, "--dmesg", "--follow", where, "--output=json", "--quiet"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        assert process.stdout is not None
        try:
            for raw in process.stdout:
                if self._stop.is_set():
                    break
                message = self._entry(raw)
                read = True
                if message is not None:
                    yield message
        finally:
            if process.poll() is None:
                process.terminate()
            process.wait(timeout=5)
        if not self._stop.is_set():  # journalctl ended by itself: no journal, or not allowed to read it
            if resumed and not read:  # a cursor the journal no longer holds (rotated, vacuumed): from now on
                self._cursor = None
                raise OSError(0, f"journalctl refused the position saved by the last run (exit status "
                                 f"{process.returncode}): going on from now, entries logged meanwhile are not counted")
            raise OSError(0, f"journalctl ended (exit status {process.returncode})")

    def _entry(self, raw: bytes) -> str | None:
        """The message of one journal entry (``--output=json``: one object a line; a MESSAGE that is not UTF-8 is a
        list of its bytes), keeping its cursor; None for a line that is not an entry."""
        try:
            entry = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(entry, dict):
            return None
        if isinstance(cursor := entry.get("__CURSOR"), str) and cursor.isprintable() and len(cursor) <= 512:
            self._cursor = cursor
            self._position = {"source": "journal", "cursor": cursor}
        message = entry.get("MESSAGE")
        if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
            return bytes(message).decode("utf-8", "replace")
        return message if isinstance(message, str) else None

    def _file(self, path: Path) -> Iterator[str]:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            offset = 0
            resume, self._resume = self._resume, None
            if (resume is not None and resume.get("inode") == stat.st_ino and isinstance(resume.get("offset"), int)
                    and 0 <= resume["offset"] <= stat.st_size):  # the same file, not cut: go on after it
                offset = resume["offset"]
                f.seek(offset)
            pending = b""
            while not self._stop.is_set():
                chunk = f.read(65536)
                if not chunk:
                    time.sleep(POLL_SECONDS)
                    continue
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    offset += len(raw) + 1
                    self._position = {"source": self.source, "inode": stat.st_ino, "offset": offset}
                    yield raw.decode("utf-8", "replace")
