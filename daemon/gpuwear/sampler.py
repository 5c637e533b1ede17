"""One tick: read every GPU, validate, and publish an immutable snapshot.

Failures are isolated per GPU: a lost GPU or a failing call marks that GPU's sample as
failed and never stops the others. Readings outside physical ranges are dropped and
counted. The snapshot is replaced atomically; readers (the collector) never wait on NVML.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol

from gpuwear.clock import Clock
from gpuwear.kernlog import bus_key
from gpuwear.sample import PHYSICAL_RANGES, GpuIdentity, GpuSample, SystemInfo, validated
from gpuwear.wear.plausibility import DEFAULT_SHUTDOWN_CELSIUS, above_shutdown

log = logging.getLogger(__name__)


class Backend(Protocol):
    """Where samples come from (``backends.nvml.NvmlBackend``)."""

    def open(self) -> list[GpuIdentity]: ...

    def close(self) -> None: ...

    def system_info(self) -> SystemInfo: ...

    def read(self, index: int, slow: bool) -> Any: ...

    def reopen(self) -> list[GpuIdentity]: ...

    def join(self) -> list[GpuIdentity]: ...

    def start_events(self, on_xid: Callable[[int, int], None], wait_ms: int = 500) -> None: ...


# (reading or None, the lost/driver error or None, wall seconds, the clock's monotonic time as the read began and
# as it ended)
Read = tuple[Any, BaseException | None, float, float, float]


class _Batch:
    """The reads of one tick, done in order by one reader thread."""

    def __init__(self, items: list[tuple[int, bool]]) -> None:
        self.items = items  # (GPU index, slow read?)
        self.results: dict[int, Read] = {}  # position in items -> what its read gave
        self.current = -1  # position of the read in progress; -1 before the first
        self.started = 0.0  # time.monotonic() when that read began
        self.finished = False
        self.failure: BaseException | None = None  # what a read raised that is not a lost GPU or driver: re-raised
        self.abandoned = False  # the sampler gave up waiting: the thread exits once its read returns


class _Deadlined:
    """A backend call (join, reopen) on a thread of its own: the tick that starts it waits at most the deadline, and
    a later tick takes its answer once it returned, raising what it raised; one at a time. ``what`` names it in the
    log, said once when past the deadline (``then``: what goes on meanwhile) and once when it returned."""

    def __init__(self, what: str, then: str) -> None:
        self.what, self.then = what, then
        self._done: threading.Event | None = None  # None: no call under way
        self._said = False
        self._result: Any = None
        self._failure: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._done is not None

    @property
    def returned(self) -> bool:
        return self._done is not None and self._done.is_set()

    def answer(self, fn: Callable[[], Any], deadline: float) -> tuple[bool, Any]:
        """(whether it has answered, its answer): ``fn`` started here where no call is under way."""
        if self._done is None:
            done = self._done = threading.Event()
            self._said = False

            def run() -> None:
                try:
                    self._result, self._failure = fn(), None
                except BaseException as exc:  # raised on the sampler's thread below
                    self._result, self._failure = None, exc
                done.set()

            threading.Thread(target=run, name="nvml-call", daemon=True).start()
            done.wait(deadline)
        if not self._done.is_set():
            if not self._said:
                self._said = True
                log.warning("%s is past the %g s deadline: %s", self.what, deadline, self.then)
            return False, None
        self._done = None
        if self._said:
            log.warning("%s returned", self.what)
        if self._failure is not None:
            raise self._failure
        return True, self._result


class _Reader:
    """One thread that reads the GPUs one after the other, so that a tick costs one hand-over between threads
    rather than one per GPU; the sampler waits with a deadline per read, and gives up on a thread stuck in NVML
    (it leaves once the call returns) to go on with the next GPU on a new one."""

    def __init__(self, fetch: Callable[[int, bool], Read], cond: threading.Condition) -> None:
        self._fetch = fetch
        self.cond = cond
        self._batch: _Batch | None = None
        self._closed = False
        threading.Thread(target=self._run, name="nvml-read", daemon=True).start()

    def submit(self, batch: _Batch) -> None:
        with self.cond:
            self._batch = batch
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self._closed = True
            self.cond.notify_all()

    def _run(self) -> None:
        while True:
            with self.cond:
                while self._batch is None and not self._closed:
                    self.cond.wait()
                if self._closed:
                    return
                batch, self._batch = self._batch, None
            assert batch is not None
            for position, (index, slow) in enumerate(batch.items):
                with self.cond:
                    if batch.abandoned:  # given up on between two reads: the sampler reads the rest elsewhere
                        return
                    batch.current, batch.started = position, time.monotonic()
                try:
                    result = self._fetch(index, slow)
                except BaseException as exc:  # a bug, not a GPU fault: the sampler's thread raises it
                    batch.failure = exc  # published with ``finished`` below
                    break
                with self.cond:
                    batch.results[position] = result
                    if batch.abandoned:
                        return
            with self.cond:
                batch.finished = True
                self.cond.notify_all()


@dataclass(frozen=True)
class GpuStatus:
    """Everything known about one GPU at the last tick; immutable."""

    identity: GpuIdentity
    up: bool  # False once the GPU answered GPU_IS_LOST
    sample: GpuSample | None  # the last sample; None before the first and while down
    last_success: bool  # the last read had no error and gave at least one reading
    last_duration_seconds: float  # wall time the last read took
    errors: Mapping[str, int]  # read errors by kind, since start
    dropped: Mapping[str, int]  # readings dropped as out of range, by field, since start
    xids: Mapping[int, int]  # XID events by code, since start
    energy_joules_total: float | None  # energy counter, continued across counter resets
    unavailable: Mapping[str, str]  # readings the GPU cannot give now -> why (backends.nvml.REASONS)
    readings: int  # readings (not None) the last read gave; 0: the GPU yields nothing
    last_xid: int | None = None  # the code of the last XID event since start
    # the kernel log's XID 74 lines with their registers since start, (74, link, registers) -> lines; each explains
    # one XID 74 event of ``xids`` (its own, or NVML's told of the same); (74, -1, ()): past XID_LINES_KEPT kinds
    xid_lines: Mapping[tuple[int, int, tuple[int, ...]], int] = field(default_factory=lambda: MappingProxyType({}))
    # the processes the kernel log's XID lines named since start, (code, pid or None, name, MIG instance, unit on
    # the chip) -> lines (name kernlog.UNKNOWN_PROCESS: the line says it is unknown); (code, None, "", "", "") past
    # XID_LINES_KEPT kinds
    xid_processes: Mapping[tuple[int, int | None, str, str, str], int] = field(
        default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Snapshot:
    """The state served at scrape time."""

    gpus: tuple[GpuStatus, ...]
    system: SystemInfo | None
    ticks: int
    # SXid lines of this host's NVSwitches in the kernel log since start, by severity ("fatal", "non_fatal")
    sxids: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # where the kernel log was read up to, covering the XIDs counted here (kernlog: its source's position), or None
    kernel_position: Mapping[str, Any] | None = None
    # XID lines of the kernel log since start for a PCI address NVML does not list here (before NVML opened, or a
    # GPU it cannot bring up): the host's, no GPU's
    unlisted_xids: int = 0


EMPTY = Snapshot(gpus=(), system=None, ticks=0)


def _frozen(now: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """A read-only copy of a count or map, for the published status (the sampler goes on changing its own)."""
    return MappingProxyType(dict(now))


@dataclass
class _Gpu:
    identity: GpuIdentity
    up: bool = True
    stalled: bool = False  # a read is past the deadline
    sample: GpuSample | None = None
    slow_values: dict[str, Any] = field(default_factory=dict)
    last_slow: float | None = None
    last_success: bool = False
    last_duration: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    xids: Counter[int] = field(default_factory=Counter)
    last_xid: int | None = None
    # XIDs counted lately by (the sources that told of each, code): their monotonic times (s), at most
    # XID_RECENT_KEPT each; the same XID from NVML, the kernel log's Xid line and its fallen-off-the-bus line is
    # counted once
    recent_xids: dict[tuple[frozenset[str], int], deque[float]] = field(default_factory=dict)
    # by code: when it was last said in the log (monotonic s) and how many came since, not said one by one
    xid_said: dict[int, list[float]] = field(default_factory=dict)
    xid_lines: Counter[tuple[int, int, tuple[int, ...]]] = field(default_factory=Counter)  # GpuStatus.xid_lines
    xid_processes: Counter[tuple[int, int | None, str, str, str]] = field(default_factory=Counter)  # GpuStatus.
    energy_offset: float = 0.0
    energy_last: float | None = None
    energy_at: float = 0.0  # monotonic time of energy_last
    energy_reset_expected: bool = False  # the driver came back: its counter restarted from zero
    energy_doubt: tuple[float, float] | None = None  # the first of the readings rejected in a row: (value, at)
    energy_doubts: int = 0  # readings rejected in a row, each continuing from the one before
    energy_total: float | None = None
    unavailable: Mapping[str, str] = field(default_factory=dict)
    readings: int = -1  # -1 before the first read

    def status(self) -> GpuStatus:
        return GpuStatus(
            identity=self.identity, up=self.up, sample=self.sample, last_success=self.last_success,
            last_duration_seconds=self.last_duration, errors=_frozen(self.errors),
            dropped=_frozen(self.dropped), xids=_frozen(self.xids),
            energy_joules_total=self.energy_total, unavailable=_frozen(self.unavailable),
            readings=max(self.readings, 0), last_xid=self.last_xid, xid_lines=_frozen(self.xid_lines),
            xid_processes=_frozen(self.xid_processes),
        )


XID_SAME_SECONDS = 10.0  # an XID from NVML and one of the same code from the kernel log this close are one event
XID_SOURCES = ("nvml", "kernel", "bus")  # NVML's events, the kernel log's Xid lines, its fallen-off-the-bus lines
# for each source, the sets of other sources whose XID it may be the twin of (a set without it)
_TOLD_BY = {source: [frozenset(c) for n in range(1, len(XID_SOURCES)) for c in itertools.combinations(XID_SOURCES, n)
                     if source not in c] for source in XID_SOURCES}
XID_LINES_KEPT = 256  # kinds of XID 74 lines (link, registers) kept apart per GPU: hostile lines stay bounded
XID_RECENT_KEPT = 1024  # XIDs of one code and source kept for that matching: a storm keeps it bounded
XID_SAY_EVERY_SECONDS = 60.0  # an XID code of a GPU is said in the log once, then at most once a minute with a count


class Sampler:
    """Reads all GPUs of a backend on each :meth:`tick` and publishes a :class:`Snapshot`.

    ``lost_errors``: the exception types that mean "GPU fallen off the bus".
    ``timer``: a high-resolution timer for durations (real seconds even under ``--speed``).
    ``deadline_seconds``: the longest a GPU's read may take before it counts as stalled.
    """

    def __init__(self, backend: Backend, clock: Clock, slow_interval_seconds: float,
                 lost_errors: tuple[type[BaseException], ...],
                 timer: Callable[[], float] = time.perf_counter, deadline_seconds: float = 0.0,
                 driver_errors: tuple[type[BaseException], ...] = (),
                 unavailable_errors: tuple[type[BaseException], ...] = (),
                 fatal_errors: tuple[type[BaseException], ...] = (),
                 aer: Callable[[str | None], dict[str, int]] | None = None) -> None:
        self.backend = backend
        # the PCIe AER counts of a GPU's PCI function by its bus id, asked with each slow read (backends/aer.py)
        self.aer = aer
        self.clock = clock
        # NVML's event thread and the kernel log's race in real time, whatever the clock of the samples (--speed):
        # the window in which the two report one XID is measured on this
        self.xid_clock: Callable[[], float] = time.monotonic
        self.slow_interval = slow_interval_seconds  # may change on reload
        self.lost_errors = lost_errors
        self.timer = timer
        self._lock = threading.RLock()  # re-entrant: the kernel log holds it across a line's position and count
        self._gpus: list[_Gpu] = []
        self._system: SystemInfo | None = None
        self._ticks = 0
        self._snapshot = EMPTY
        self._logged_drops: set[tuple[int, str]] = set()
        self._sxids: dict[str, int] = {}
        self._sxid_said: dict[int, list[float]] = {}  # SXid -> [when said, lines since]
        self._kernel_position: Mapping[str, Any] | None = None  # note_kernel_position's
        self._unlisted_xids = 0  # Snapshot.unlisted_xids
        # XIDs of PCI addresses NVML does not list: by address, XID -> [when said, lines since] (said once a minute)
        self._unlisted_said: dict[str, dict[int, list[float]]] = {}
        self.deadline = deadline_seconds  # 0: read the GPUs on the calling thread, no deadline
        self.driver_errors = driver_errors  # the driver went away: reopen the backend
        self.unavailable_errors = unavailable_errors  # reopening failed: still gone
        self.fatal_errors = fatal_errors  # raised out of tick(): only a new process can recover (driver upgrade)
        self._driver_gone = False
        self._next_reopen = 0.0
        self._next_join = math.inf  # monotonic (the sampler's clock): when to ask for GPUs not read yet
        self.reopen_interval = 5.0  # seconds between tries to get the driver back
        self._active = 0  # the first this many GPUs are the backend's; the rest are gone
        self._reader: _Reader | None = None
        # the backend's join() and reopen() (after the driver went away), each on a thread of its own
        self._joining = _Deadlined("NVML's listing of new GPUs (nvmlDeviceGetCount, their handles)",
                                   "sampling goes on; GPUs it finds join once it returns")
        self._reopening = _Deadlined("NVML's (re-)initialisation", "the GPUs stay marked until it returns")
        self._opened = False  # the backend opened once in this process (a mismatch after that is fatal)
        self.waiting: str | None = None  # why there are no GPUs yet: NVML not usable at start, retried
        self._reads = threading.Condition()
        self._stuck: dict[int, tuple[_Batch, int]] = {}  # GPU index -> the batch and position of its stuck read

    def open(self, deadline: float = 0.0) -> None:
        """Open the backend and learn the GPUs (raises what the backend raises). With a ``deadline`` (s), the open
        runs on a thread of its own: one that has not answered by then (nvmlInit or a GPU's first calls hung) leaves
        the sampler waiting with no GPU, and a later tick takes its GPUs once it returns."""
        if deadline > 0:
            answered, opened = self._reopening.answer(self._open_backend, deadline)
            if not answered:
                self.wait_for_driver(f"NVML has not answered gpuwear's first open in {deadline:g} s (nvmlInit or a "
                                     "GPU's first calls hung); its GPUs are taken once it returns")
                return
        else:
            opened = self._open_backend()
        identities, system = opened
        with self._lock:
            self._gpus = [_Gpu(identity) for identity in identities]
            self._active = len(self._gpus)
            self._system = system
            self._opened = True
            self._next_join = self.clock.monotonic() + self.slow_interval
            self._publish()

    def _open_backend(self, again: bool = False) -> tuple[list[GpuIdentity], SystemInfo]:
        """backend.open() (``again``: reopen()) and the system it found."""
        identities = self.backend.reopen() if again else self.backend.open()
        return identities, self.backend.system_info()

    def wait_for_driver(self, reason: str) -> None:
        """Start with no GPU while NVML cannot be used yet (a driver upgrade waiting for its module): every
        ``reopen_interval`` the backend is opened again, and the GPUs appear once it opens."""
        with self._lock:
            self._gpus, self._active, self._driver_gone, self.waiting = [], 0, True, reason
            self._publish()

    def start_events(self, wait_ms: int = 500) -> None:
        self.backend.start_events(self.record_xid, wait_ms)

    @property
    def snapshot(self) -> Snapshot:
        """The latest published snapshot (an atomic reference read; never blocks)."""
        return self._snapshot

    def record_xid(self, index: int, xid: int) -> None:
        """Count an XID event from NVML (called from the event thread)."""
        with self._lock:
            if 0 <= index < len(self._gpus):
                self._count_xid(self._gpus[index], xid, "nvml")

    def record_kernel_xid(self, pci_bus_id: str, xid: int) -> None:
        """Count an XID line of the kernel log (:mod:`gpuwear.kernlog`: ``pci_bus_id`` as it writes them), on the
        GPU at that bus id; one NVML reported too within :data:`XID_SAME_SECONDS` is counted once."""
        with self._lock:
            gpu = self._gpu_at(pci_bus_id)
            if gpu is None:
                key = pci_bus_id if pci_bus_id in self._unlisted_said or len(self._unlisted_said) < 64 else "others"
                said = self._unlisted_said.setdefault(key, {})  # bounded: hostile lines name any address
                if (more := _to_say(said, xid, self.xid_clock())) is not None:  # a storm: once a minute
                    log.warning("XID %d on PCI %s, a GPU NVML does not list here%s", xid, pci_bus_id, more)  # hex
                self._unlisted_xids += 1
                old = self._snapshot
                self._snapshot = Snapshot(gpus=old.gpus, system=old.system, ticks=old.ticks, sxids=old.sxids,
                                          kernel_position=self._kernel_position, unlisted_xids=self._unlisted_xids)
                return
            self._count_xid(gpu, xid, "kernel")

    @property
    def lock(self) -> threading.RLock:
        """Held by the kernel log's reader across a line's position and its count, so that a snapshot holds both or
        neither."""
        return self._lock

    def note_kernel_position(self, position: Mapping[str, Any]) -> None:
        """Where the kernel log has been read to (a line about to be counted). Not while no GPU is listed: a line
        read then names none, and a later run reads it again."""
        with self._lock:
            if self._gpus:
                self._kernel_position = MappingProxyType(dict(position))

    def record_kernel_lost(self, pci_bus_id: str) -> None:
        """Count the kernel log's line of a GPU fallen off the bus (:func:`gpuwear.kernlog.parse_lost`) as XID 79 on
        the GPU at that bus id: the driver may write it without an Xid line; with one (or NVML's event) within
        :data:`XID_SAME_SECONDS`, counted once."""
        with self._lock:
            gpu = self._gpu_at(pci_bus_id)
            if gpu is not None:
                self._count_xid(gpu, 79, "bus")

    def record_kernel_nvlink(self, pci_bus_id: str, code: int, link: int, registers: tuple[int, ...]) -> None:
        """Keep an NVLink XID line's link and values (:func:`gpuwear.kernlog.parse_nvlink`), told just before its
        XID, for the GPU at that bus id (GpuStatus.xid_lines): what NVIDIA's workflow reads to judge it."""
        with self._lock:
            gpu = self._gpu_at(pci_bus_id)
            if gpu is not None:
                key = (code, link, registers)
                full = key not in gpu.xid_lines and len(gpu.xid_lines) >= XID_LINES_KEPT
                gpu.xid_lines[(code, -1, ()) if full else key] += 1

    def record_kernel_process(self, pci_bus_id: str, code: int, pid: int | None, name: str, instance: str,
                              unit: str = "") -> None:
        """Keep the process an XID line names (:func:`gpuwear.kernlog.parse_process`), told just before its XID, for
        the GPU at that bus id (GpuStatus.xid_processes): which run raised it."""
        with self._lock:
            gpu = self._gpu_at(pci_bus_id)
            if gpu is not None:
                key = (code, pid, name, instance, unit)
                full = key not in gpu.xid_processes and len(gpu.xid_processes) >= XID_LINES_KEPT
                gpu.xid_processes[(code, None, "", "", "") if full else key] += 1

    def _gpu_at(self, pci_bus_id: str) -> _Gpu | None:
        """The GPU read here at a PCI bus id as the kernel log's lines give it (:func:`gpuwear.kernlog.bus_key`)."""
        return next((g for g in self._gpus if g.identity.pci_bus_id and bus_key(g.identity.pci_bus_id) == pci_bus_id),
                    None)

    def record_sxid(self, switch: str, sxid: int, fatal: bool) -> None:
        """Count an NVSwitch's SXid line of the kernel log (:func:`gpuwear.kernlog.parse_sxid`), for the host: an
        NVSwitch is not a GPU, and an SXid names no GPU. Said in the log as XIDs are: once, then once a minute."""
        severity = "fatal" if fatal else "non_fatal"
        with self._lock:
            self._sxids[severity] = self._sxids.get(severity, 0) + 1
            more = _to_say(self._sxid_said, sxid, self.xid_clock())
            if more is not None:
                log.warning("NVSwitch at PCI %s: SXid %d (%s, kernel log)%s", switch, sxid,
                            severity.replace("_", "-"), more)
            self._publish()

    def _count_xid(self, gpu: _Gpu, xid: int, source: str) -> None:
        now = self.xid_clock()
        for told in _TOLD_BY.get(source, ()):  # an XID another source told of within XID_SAME_SECONDS is this one
            other = gpu.recent_xids.get((told, xid))
            while other and now - other[0] > XID_SAME_SECONDS:
                other.popleft()
            if other:
                when = other.popleft()
                if len(told) + 1 < len(XID_SOURCES):  # a source yet to tell of it may still match it
                    gpu.recent_xids.setdefault((told | {source}, xid), deque(maxlen=XID_RECENT_KEPT)).append(when)
                return
        mine = gpu.recent_xids.setdefault((frozenset({source}), xid), deque(maxlen=XID_RECENT_KEPT))
        while mine and now - mine[0] > XID_SAME_SECONDS:
            mine.popleft()
        mine.append(now)
        gpu.xids[xid] += 1
        gpu.last_xid = xid
        more = _to_say(gpu.xid_said, xid, now)
        if more is not None:
            log.warning("GPU %d (%s): XID %d (%s)%s", gpu.identity.index, gpu.identity.uuid, xid,
                        "NVML event" if source == "nvml" else "kernel log", more)
        self._publish(gpu)

    def tick(self) -> Snapshot:
        """Read every GPU once; returns the new snapshot.

        With a deadline, the GPUs are read on a reader thread: a GPU whose read takes longer is
        marked stalled (and not asked again until that read returns), and the others are read on
        a new reader and published on time."""
        now = self.clock.monotonic()
        if self._driver_gone:
            self._reopen()
        elif now >= self._next_join or self._joining.returned:
            self._next_join = now + self.slow_interval  # every slow interval: GPUs refused at start, or new, join
            self._join()
        if self._driver_gone:
            pass  # every GPU stays marked by the error that revealed it
        elif self.deadline <= 0:
            for i, gpu in enumerate(self._gpus[:self._active]):
                slow = self._slow_due(gpu, now)
                self._apply(gpu, now, slow, *self._fetch(i, slow))
        else:
            self._tick_with_deadline(now)
        with self._lock:
            self._ticks += 1
            self._publish()
            return self._snapshot

    def _tick_with_deadline(self, now: float) -> None:
        items: list[tuple[int, bool]] = []
        for i, gpu in enumerate(self._gpus[:self._active]):
            stuck = self._stuck.get(i)
            if stuck is not None and stuck[1] not in stuck[0].results:
                batch = stuck[0]
                if not (batch.finished and batch.failure is not None):
                    self._stall(gpu)
                    continue
                self._stuck.pop(i)  # the stuck read ended by raising: raised here, as a read that is not stuck
                raise batch.failure
            self._stuck.pop(i, None)
            items.append((i, self._slow_due(gpu, now)))
        while items:
            if self._reader is None:
                self._reader = _Reader(self._fetch, self._reads)
            batch = _Batch(items)
            self._reader.submit(batch)
            with self._reads:
                while not batch.finished:  # the deadline runs from the start of the read in progress
                    left = self.deadline if batch.current < 0 else batch.started + self.deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._reads.wait(left)
                if not batch.finished:
                    batch.abandoned = True
                results = dict(batch.results)
                position = batch.current
            for done in sorted(results):
                index, slow = items[done]
                self._apply(self._gpus[index], now, slow, *results[done])
            if batch.failure is not None:
                raise batch.failure
            if not batch.abandoned:
                return
            self._reader = None  # stuck in NVML: the next reads go to a new thread
            index = items[position][0]
            if position not in results:
                self._stuck[index] = (batch, position)
                self._stall(self._gpus[index])
            items = items[position + 1:]

    def _join(self) -> None:
        """GPUs NVML lists that are not read yet (refused at start: lost, a cgroup; or new) join, after the GPUs
        read now; one that was read before (by UUID) takes its place back. With a deadline, NVML is asked on a
        thread of its own: a listing or handle call that hangs holds no tick past the deadline, and its GPUs join
        at the tick after it returns (no other is asked meanwhile)."""
        joined = self.backend.join() if self.deadline <= 0 else self._join_within_deadline()
        if not joined:
            return
        with self._lock:
            gone = {g.identity.uuid: g for g in self._gpus[self._active:]}
            for identity in joined:
                gpu = gone.pop(identity.uuid, None)
                if gpu is not None:
                    self._gpus.remove(gpu)
                    gpu.identity, gpu.last_slow, gpu.energy_reset_expected = identity, None, True
                self._gpus.insert(self._active, gpu or _Gpu(identity))
                self._active += 1
            self._publish()

    def _join_within_deadline(self) -> list[GpuIdentity] | None:
        answered, joined = self._joining.answer(self.backend.join, self.deadline)
        return joined if answered else None

    def _slow_due(self, gpu: _Gpu, now: float) -> bool:
        return gpu.last_slow is None or now - gpu.last_slow >= self.slow_interval

    def _fetch(self, i: int, slow: bool) -> Read:
        """One backend read, its wall duration and when it began and ended on the clock; a lost GPU is returned, not
        raised."""
        began, start = self.clock.monotonic(), self.timer()
        try:
            reading, error = self.backend.read(i, slow), None
        except self.lost_errors + self.driver_errors as exc:
            reading, error = None, exc
        return reading, error, self.timer() - start, began, self.clock.monotonic()

    def _reopen(self) -> None:
        """Try to get the GPUs back after the driver went away (every ``reopen_interval``); history
        follows the UUID whatever index a GPU comes back at."""
        try:
            if self.deadline <= 0:
                if time.monotonic() < self._next_reopen:
                    return
                self._next_reopen = time.monotonic() + self.reopen_interval
                identities, system = self._open_backend(again=True)
            elif (answered := self._reopen_within_deadline()) is None:
                return
            else:
                identities, system = answered
        except self.unavailable_errors + self.driver_errors as exc:
            if isinstance(exc, self.fatal_errors) and self._opened:
                raise  # the library this process loaded worked, and never will again
            log.debug("NVML still unavailable: %s", exc)
            return
        with self._lock:
            by_uuid = {g.identity.uuid: g for g in self._gpus}
            back = []
            for identity in identities:
                gpu = by_uuid.pop(identity.uuid, None) or _Gpu(identity)
                gpu.identity, gpu.last_slow = identity, None  # energy_last stays: the counter restarted
                gpu.energy_reset_expected = True
                back.append(gpu)
            for gpu in by_uuid.values():  # not there any more: reported down
                gpu.up, gpu.sample, gpu.last_success = False, None, False
            self._gpus = back + list(by_uuid.values())
            self._active = len(back)
            self._stuck.clear()
            self._driver_gone, self._opened, self.waiting = False, True, None
            self._system = system
            self._next_join = self.clock.monotonic() + self.slow_interval
        log.warning("NVML is back: %d GPU(s) (%s)", len(back), ", ".join(g.identity.uuid for g in back))

    def _reopen_within_deadline(self) -> tuple[list[GpuIdentity], SystemInfo] | None:
        """backend.reopen() on a thread of its own (every ``reopen_interval``): its answer once it returned (raising
        what it raised), None while it runs past the deadline or is not due. The call under way may be the first
        open, past its deadline: its answer is taken the same way."""
        if not self._reopening.running:
            if time.monotonic() < self._next_reopen:
                return None
            self._next_reopen = time.monotonic() + self.reopen_interval
        answered, opened = self._reopening.answer(lambda: self._open_backend(again=True), self.deadline)
        return opened if answered else None

    def _stall(self, gpu: _Gpu) -> None:
        with self._lock:
            if not gpu.stalled:
                log.error("GPU %d (%s): NVML read stalled past %gs; the GPU is skipped until it answers",
                          gpu.identity.index, gpu.identity.uuid, self.deadline)
            gpu.stalled = True
            gpu.last_success = False
            gpu.sample = None
            gpu.last_duration = self.deadline
            gpu.errors["stalled"] += 1

    def close(self) -> None:
        """Stop the reader thread (a stalled read is abandoned) and the backend."""
        if self._reader is not None:
            self._reader.close()
        self.backend.close()

    def _apply(self, gpu: _Gpu, now: float, slow: bool, reading: Any, error: BaseException | None,
               duration: float, began: float | None = None, ended: float | None = None) -> None:
        if error is not None:
            driver = isinstance(error, self.driver_errors)
            with self._lock:
                gpu.last_duration = duration
                gpu.last_success = False
                gpu.errors["driver_gone" if driver else "gpu_lost"] += 1
                gpu.sample = None
                if driver:
                    if not self._driver_gone:
                        log.error("NVML lost the driver (%s): re-initialising as soon as it is back", error)
                    self._driver_gone = True
                else:
                    if gpu.up:
                        log.error("GPU %d (%s) is lost: %s", gpu.identity.index, gpu.identity.uuid, error)
                    gpu.up = False
            return
        values = self._validated(gpu, reading.values)
        die = values.get("temperature_gpu_celsius")
        shutdown = values.get("threshold_shutdown_celsius", gpu.slow_values.get("threshold_shutdown_celsius"))
        if die is not None and above_shutdown(die, shutdown):  # the card powers off before its die gets there
            self._drop(gpu, "temperature_gpu_celsius", die, f"above the card's shutdown threshold "
                       f"({shutdown if shutdown is not None else DEFAULT_SHUTDOWN_CELSIUS:g} °C) and its margin")
            values["temperature_gpu_celsius"] = None
        energy = values.get("energy_joules")
        # the counter is judged by the times its reads began and ended, not the tick's start: a tick's later reads,
        # and a slow call inside one, come later (at x600 a read 75 ms into a loaded tick: 45 simulated seconds)
        if energy is not None and not self._energy(gpu, energy, now if began is None else began, values,
                                                   now if ended is None else ended):
            self._drop(gpu, "energy_joules", energy, "implausible next to the counter's last value")
            values["energy_joules"] = None
        if slow:  # a slow read holds every field; fast reads reuse its slow ones
            if self.aer is not None:
                values.update(self._validated(gpu, dict(self.aer(gpu.identity.pci_bus_id))))
            gpu.last_slow = now
            gpu.slow_values = values
        merged = {**gpu.slow_values, **values}
        sample = GpuSample.of(self.clock.wall(), now, merged)
        with self._lock:
            if not gpu.up or (gpu.errors.get("stalled") and not gpu.last_success and gpu.sample is None):
                log.warning("GPU %d (%s) answers again", gpu.identity.index, gpu.identity.uuid)
            gpu.up = True
            gpu.sample = sample
            gpu.last_duration = duration
            readings = sum(v is not None for v in reading.values.values())
            if readings == 0 and gpu.readings != 0:
                log.error("GPU %d (%s) yields no readings: %s", gpu.identity.index, gpu.identity.uuid,
                          _why_nothing(reading))
            elif readings and gpu.readings == 0:
                log.warning("GPU %d (%s) yields readings again", gpu.identity.index, gpu.identity.uuid)
            gpu.readings = readings
            gpu.unavailable = dict(reading.unavailable)
            gpu.last_success = not reading.errors and readings > 0
            if reading.errors:
                gpu.errors.update(reading.errors)
            if readings == 0:
                gpu.errors["no_readings"] += 1
            if sample.energy_joules is not None:
                gpu.energy_total = gpu.energy_offset + sample.energy_joules

    def _validated(self, gpu: _Gpu, values: dict[str, Any]) -> dict[str, Any]:
        clean, dropped = validated(values)
        for name in dropped:
            self._drop(gpu, name, values[name], f"outside the physical range {PHYSICAL_RANGES[name]}")
        return clean

    def _drop(self, gpu: _Gpu, name: str, value: Any, why: str) -> None:
        with self._lock:
            gpu.dropped[name] += 1
        if (gpu.identity.index, name) not in self._logged_drops:
            self._logged_drops.add((gpu.identity.index, name))
            log.warning("GPU %d (%s): dropped %s=%r, %s (logged once)",
                        gpu.identity.index, gpu.identity.uuid, name, value, why)

    ENERGY_SLACK_JOULES = 1000.0
    MAX_POWER_WATTS = 5000.0  # the physical range of power_watts: the limit when the card does not say its own

    CONFIRMING_READINGS = 2  # a counter that went back is believed once the next reading continues from it
    REBASING_READINGS = 3  # a counter that jumped forward, once this many readings continue from the jump

    def _energy(self, gpu: _Gpu, energy: float, now: float, values: dict[str, Any], ended: float | None = None,
                ) -> bool:
        """Whether to keep an energy counter reading, continuing ``energy_offset`` across real resets. ``now``: when
        its read began (kept as the reading's time), ``ended``: when it ended.

        Since the last kept reading the counter may move forward by what the card can draw (twice its power limit
        over the time since, and a little); anything else is doubted and dropped. A reset is believed at once
        after the driver came back, else once the reading after a lower one continues from it (one backwards
        glitch is dropped, never taken for a reset that would count the whole counter again). A forward jump is
        rebased on (not counted) once several readings continue from it. The dropped intervals' energy is
        integrated from power by the accumulators, so lifetime energy loses nothing either way."""
        limit = values.get("power_limit_watts") or gpu.slow_values.get("power_limit_watts") or self.MAX_POWER_WATTS

        until = now if ended is None else ended  # this read's end: the counter moved at most until then

        def continues(frm: float, at: float) -> bool:
            return frm <= energy <= frm + 2.0 * limit * max(0.0, until - at) + self.ENERGY_SLACK_JOULES

        last = gpu.energy_last
        if last is None or gpu.energy_reset_expected or continues(last, gpu.energy_at):
            if last is not None and energy < last:  # the driver came back: its counter restarted
                gpu.energy_offset += last
            self._energy_kept(gpu, energy, now)
            return True
        doubt = gpu.energy_doubt
        if doubt is not None and continues(*doubt):
            gpu.energy_doubts += 1
        else:
            gpu.energy_doubt, gpu.energy_doubts = (energy, now), 1
            doubt = gpu.energy_doubt
        if doubt[0] < last and gpu.energy_doubts >= self.CONFIRMING_READINGS:
            log.warning("GPU %d (%s): energy counter restarted (%.0f J -> %.0f J); continuing from the last value",
                        gpu.identity.index, gpu.identity.uuid, last, doubt[0])
            gpu.energy_offset += last
        elif doubt[0] > last and gpu.energy_doubts >= self.REBASING_READINGS:
            log.warning("GPU %d (%s): energy counter jumped (%.0f J -> %.0f J); counting from there on",
                        gpu.identity.index, gpu.identity.uuid, last, doubt[0])
            gpu.energy_offset -= doubt[0] - last
        else:
            return False
        self._energy_kept(gpu, energy, now)
        return True

    @staticmethod
    def _energy_kept(gpu: _Gpu, energy: float, now: float) -> None:
        gpu.energy_last, gpu.energy_at, gpu.energy_reset_expected = energy, now, False
        gpu.energy_doubt, gpu.energy_doubts = None, 0

    def _publish(self, xids_of: _Gpu | None = None) -> None:
        """A new snapshot of every GPU; with ``xids_of``, the last published with that GPU's XIDs as they are now
        (an XID counted: an XID storm rebuilt every GPU's status per line)."""
        old = self._snapshot
        if xids_of is not None and len(old.gpus) == len(self._gpus):
            i = next((k for k, g in enumerate(self._gpus) if g is xids_of), -1)
            if i >= 0 and old.gpus[i].identity is xids_of.identity:
                status = replace(old.gpus[i], xids=_frozen(xids_of.xids), last_xid=xids_of.last_xid,
                                 xid_lines=_frozen(xids_of.xid_lines) if xids_of.xid_lines else old.gpus[i].xid_lines,
                                 xid_processes=_frozen(xids_of.xid_processes) if xids_of.xid_processes
                                 else old.gpus[i].xid_processes)
                self._snapshot = Snapshot(gpus=(*old.gpus[:i], status, *old.gpus[i + 1:]), system=old.system,
                                          ticks=old.ticks, sxids=old.sxids, kernel_position=self._kernel_position,
                                          unlisted_xids=self._unlisted_xids)
                return
        self._snapshot = Snapshot(gpus=tuple(g.status() for g in self._gpus), system=self._system,
                                  ticks=self._ticks, sxids=_frozen(self._sxids), kernel_position=self._kernel_position,
                                  unlisted_xids=self._unlisted_xids)


def _to_say(said: dict[int, list[float]], code: int, now: float) -> str | None:
    """Whether an event's code is to be said in the log now, with what to add ("; N more of it since it was last
    said"): a storm is said once a :data:`XID_SAY_EVERY_SECONDS`, not line by line (``said``: code -> [when last
    said, events since], kept up to date); None: counted in ``said``, not said."""
    last = said.get(code)
    if last is not None and now - last[0] < XID_SAY_EVERY_SECONDS:
        last[1] += 1
        return None
    said[code] = [now, 0.0]
    return f"; {int(last[1])} more of it since it was last said" if last and last[1] else ""


def _why_nothing(reading: Any) -> str:
    """Why a read gave no reading at all, in words: the reasons of what is unavailable, and the errors."""
    reasons = sorted(set(reading.unavailable.values()))
    parts = []
    if reasons:
        parts.append(f"{len(reading.unavailable)} readings unavailable ({', '.join(reasons)})")
    if reading.errors:
        parts.append(f"errors: {', '.join(sorted(set(reading.errors)))}")
    return "; ".join(parts) or "nothing asked"
