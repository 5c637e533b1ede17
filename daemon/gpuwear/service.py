"""Wiring: backend, sampler, the periodic loops (sampling, ledger save, watchdog), HTTP server, signals, shutdown."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sqlite3
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpuwear import __version__
from gpuwear.backends.aer import AerCounters, host_root, sysfs_address
from gpuwear.backends.nvml import (
    DEFAULT_LIBRARY,
    GpuLostError,
    NvmlBackend,
    NvmlDriverError,
    NvmlUnavailableError,
    NvmlVersionMismatchError,
)
from gpuwear.backends.pcibus import NvidiaBus, unlisted_text
from gpuwear.clock import Clock, ScaledClock, SystemClock
from gpuwear.collector import Exposition
from gpuwear.config import Config, ConfigError, OtlpConfig, WearConfig, load_config
from gpuwear.health import mode_problems, past_cards
from gpuwear.jobs.attribute import JobRecord
from gpuwear.jobs.kubelet import PodResourcesWatch
from gpuwear.jobs.lines import Summariser
from gpuwear.jobs.resolve import JobWatcher, ProcessResolver, SimulatedJobs, Unseen, foreign_pids
from gpuwear.kernlog import KernelLogXids
from gpuwear.ledger import Ledger, LedgerError, LedgerRefusedError, StateLock, StateLockedError, ledger_path, printable
from gpuwear.metrics import DaemonInfo, LedgerStatus, MissingGpu, Published
from gpuwear.notify import sd_notify, tell_systemd_recovering
from gpuwear.runtime import give_back_freed_memory, settle_collector
from gpuwear.sample import GpuSample
from gpuwear.sampler import Sampler, Snapshot
from gpuwear.tracker import WearTracker
from gpuwear.web import FrontDoor, Limits
from gpuwear.webconfig import WebConfig, WebConfigError, load_web_config

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gpuwear.families import GpuwearCollector
    from gpuwear.sim.simulated import Simulation

log = logging.getLogger(__name__)

SIMULATION_LEAD = "simulation_lead_seconds"  # ledger meta: ScaledClock.lead() at the last save
# ledger meta: where the kernel log was read to (kernlog's position, JSON), saved with the XID counts it covers
KERNEL_LOG_POSITION = "kernel_log_position"
LEAD_SAVE_STEP_SECONDS = 3600  # the lead is written again once it moved this far (ScaledClock.resume's slack)


def _lead(text: str | None) -> float | None:
    """A stored simulation lead (seconds, a whole number), None where absent or not one."""
    return float(text) if text is not None and text.isdigit() and len(text) <= 12 else None


# Under --speed, ticks never come faster than this (wall seconds); each covers more
# simulated time instead. Ledger saves likewise.
MIN_WALL_INTERVAL_SECONDS = 0.02
MIN_PERSIST_SECONDS = 1.0


def mig_places(sample: GpuSample) -> dict[int, str]:
    """PID -> the MIG device (UUID) it runs on, of the processes NVML places on one (empty outside MIG)."""
    if not sample.process_instances or not sample.mig_devices:
        return {}
    by_instance = {(gi, ci): mig for gi, ci, mig in sample.mig_devices}
    return {pid: by_instance[gi, ci] for pid, gi, ci in sample.process_instances if (gi, ci) in by_instance}


def _processes_unseen(reason: str | None) -> str:
    """Why a GPU's processes are unknown for a tick, for its unattributed line (NVML's answer, or its absence)."""
    return {"no_permission": "processes not readable without root (NVML: no permission)",
            "not_supported": "processes not reported by this driver (NVML: not supported; a vGPU guest or WSL2?)",
            "function_not_found": "processes not reported by this driver (NVML: function not found)",
            }.get(reason or "", f"processes not read ({reason})" if reason else "processes not read this tick")


@dataclass
class Source:
    """An opened sampler, the clock it runs on and what it is (for the info metric)."""

    sampler: Sampler
    clock: Clock
    info: DaemonInfo
    speed: float
    simulation: Simulation | None = None  # the simulated GPUs, when not real ones
    # why the PIDs NVML names are not this process's to look up (jobs.resolve.foreign_pids), None when they are:
    # a GPU with processes is then booked as unattributed, with this reason
    foreign_pids: str | None = None


def _info(backend: str, scenario: str) -> DaemonInfo:
    return DaemonInfo(version=__version__, python_version=sys.version.split()[0], backend=backend,
                      scenario=scenario)


def _sampler(backend: NvmlBackend, clock: Clock, config: Config, simulated: bool = True) -> Sampler:
    """The sampler of ``backend``'s GPUs; ``simulated``: their AER counts are read only from a tree that
    health.host_root names (backends.aer.host_root)."""
    root = host_root(config.health.host_root, simulated)
    return Sampler(backend, clock, config.sampling.slow_interval_seconds, (GpuLostError,),
                   deadline_seconds=config.sampling.nvml_deadline_seconds, driver_errors=(NvmlDriverError,),
                   unavailable_errors=(NvmlUnavailableError,), fatal_errors=(NvmlVersionMismatchError,),
                   aer=None if root is None else AerCounters.under(root).read)


DRIVER_RETRY_SECONDS = 2.0
# the longest the first open of NVML may take before gpuwear serves without GPUs (with sampling deadlines on): well
# above nvmlInit's seconds on a large box without persistence mode, below systemd's default 90 s start timeout,
# past which a start hung in NVML would be killed and restarted into the same hang
FIRST_OPEN_SECONDS = 60.0
START_BUSY_SECONDS = 1.0  # how long the start waits for a lock another process holds on the ledger


def _open_waiting(sampler: Sampler, wait_seconds: float, override: float | None = None,
                  first_open: float = FIRST_OPEN_SECONDS) -> None:
    """Open NVML, retrying for up to ``wait_seconds`` while the driver is not there yet
    (a box that boots the daemon before the driver); ``override`` replaces the wait. With sampling deadlines on,
    an open that has not answered in ``first_open`` s leaves the daemon serving without GPUs, saying why."""
    wait = wait_seconds if override is None else override
    deadline = time.monotonic() + wait
    while True:
        try:
            sampler.open(first_open if sampler.deadline > 0 else 0.0)
            if sampler.waiting is not None:
                log.error("%s; gpuwear serves without GPUs meanwhile", sampler.waiting)
            return
        except NvmlVersionMismatchError as exc:  # exiting would restart into the same mismatch: wait, serving
            log.error("%s; gpuwear serves without GPUs and opens NVML again every %.0f s", exc,
                      sampler.reopen_interval)
            sampler.wait_for_driver(str(exc))
            return
        except NvmlUnavailableError as exc:
            if time.monotonic() + DRIVER_RETRY_SECONDS > deadline:
                raise
            log.warning("NVML not available yet (%s); retrying for up to %.0f s more", exc,
                        deadline - time.monotonic())
            time.sleep(DRIVER_RETRY_SECONDS)


def open_source(config: Config, simulate: str | None, speed: float, simulate_if_no_gpu: bool,
                library: object | str = DEFAULT_LIBRARY) -> Source:
    """Open real GPUs, or simulated ones (``simulate``: scenario name or file).

    With ``simulate_if_no_gpu``, a machine without an NVIDIA driver falls back to the
    configured simulation scenario. Raises ``NvmlUnavailableError`` or ``ScenarioError``.
    """
    if simulate is None:
        clock: Clock = SystemClock()
        sampler = _sampler(NvmlBackend(library), clock, config, simulated=False)
        try:
            _open_waiting(sampler, config.sampling.driver_wait_seconds, 0.0 if simulate_if_no_gpu else None)
            return Source(sampler, clock, _info("nvml", ""), 1.0, foreign_pids=foreign_pids())
        except NvmlUnavailableError as exc:
            if not simulate_if_no_gpu:
                raise
            log.warning("no usable NVIDIA driver here (%s)", exc)
            simulate = config.simulation.scenario
    # imported here: a daemon on real GPUs never loads the simulation (memory)
    from gpuwear.sim.fakenvml import FakeNvmlLibrary
    from gpuwear.sim.simulated import load_scenario

    simulation = load_scenario(simulate)
    clock = ScaledClock(speed)  # even at x1: the daemon moves it on to where the scenario's history ends
    backend = NvmlBackend(FakeNvmlLibrary(simulation, clock))
    sampler = _sampler(backend, clock, config)
    _open_waiting(sampler, 0.0)  # as on real GPUs: a driver upgrade not finished is waited for, serving
    log.warning("SIMULATED GPUs (scenario %r, %d GPUs, speed x%g): these are not real hardware",
                simulation.name, len(simulation.gpus), speed)
    return Source(sampler, clock, _info("simulated", simulation.name), speed, simulation)


class Daemon:
    """Samples on a schedule, keeps the wear ledger and serves /metrics until :meth:`stop`.

    A ledger that cannot be opened does not stop it (wear is kept in memory and saved when
    the ledger can be opened); raises ``WebConfigError`` for an unusable web config.
    """

    def __init__(self, config: Config, source: Source, registry: CollectorRegistry | None = None,
                 config_path: str | None = None, limits: Limits | None = None,
                 overrides: dict[str, Any] | None = None) -> None:
        self.config = config
        self.overrides = overrides or {}  # config keys the command line sets (--listen, --state-dir): kept at reloads
        self.limits = limits or Limits()  # what one HTTP client may take
        self.config_path = config_path  # re-read on SIGHUP
        self.source = source
        self.web = load_web_config(config.web_config_file) if config.web_config_file else WebConfig()
        self.ledger_file = ledger_path(config, None if source.simulation is None else source.simulation.name)
        self.ledger: Ledger | None = None
        self._lock: StateLock | None = None  # the state directory, held for the daemon's life
        self._history_loaded = False  # the ledger's history is in the tracker (never merged twice)
        self._saved_lead: int | None = None  # the simulated clock's lead last written to the ledger
        self._saved_position: str | None = None  # the kernel log position last written to the ledger (JSON)
        self._replaced_said: set[str] = set()  # past cards whose replacement was said in the log
        gate = config.wear.cycles.hysteresis_celsius
        wears, imported, running = {}, {}, []
        try:
            self._lock = StateLock.acquire(self.ledger_file.parent)
            # a lock another process holds (a sqlite3 shell, a backup) is said at once: sampling and serving start,
            # and the ledger is opened again at the next save
            self.ledger = Ledger.open(self.ledger_file, tell_systemd_recovering, busy_seconds=START_BUSY_SECONDS)
            wears, imported = self.ledger.load(gate), self.ledger.load_imported(gate)
            running = [JobRecord.from_json(d) for d in self.ledger.jobs(running_only=True)]
            self._history_loaded = True
            if isinstance(source.clock, ScaledClock):  # a simulation goes on with the lead its last run gained
                source.clock.resume(_lead(self.ledger.meta(SIMULATION_LEAD)),
                                    max((w.last_seen or 0.0 for w in wears.values()), default=0.0),
                                    2 * LEAD_SAVE_STEP_SECONDS)
        except (StateLockedError, LedgerRefusedError):  # another daemon, or a ledger not to be written: refuse to run
            if self.ledger is not None:
                self.ledger.close()
            if self._lock is not None:
                self._lock.release()
            raise
        except (OSError, sqlite3.Error, LedgerError) as exc:  # unwritable state directory, I/O error: sample anyway
            log.error("cannot open the wear ledger %s (%s); sampling and serving go on, wear is kept in memory "
                      "and saved as soon as the ledger can be opened", self.ledger_file, exc)
            if self.ledger is not None:
                self.ledger.close()
                self.ledger = None
        self.tracker = WearTracker(wears, self._wear_params(config), imported, running,
                                   config.jobs.end_grace_seconds, config.jobs.user_in_metrics)
        resolver = ProcessResolver(show_users=config.jobs.record_users).resolve
        if source.foreign_pids:
            log.warning("job attribution: NVML's process IDs are not this process's to look up (%s): the time of a "
                        "GPU with processes is booked as unattributed", source.foreign_pids)
        if source.simulation is not None:
            resolver = SimulatedJobs(source.simulation.jobs, resolver).resolve
        # pod names from the kubelet once its socket exists (a Kubernetes node; grpc is imported only then)
        # MIG devices as NVML lists them (slow reads): the kubelet names a MIG device a pod holds by its MIG UUID
        self._mig_parents: dict[str, str] = {}
        # the NVIDIA GPUs on the PCI bus that NVML does not list, read every slow interval (None: not read)
        root = host_root(config.health.host_root, source.simulation is not None)
        self._bus = None if root is None else NvidiaBus.under(root)
        self._unlisted: tuple[str, ...] | None = None
        self._next_bus = -math.inf
        pods = None if source.simulation is not None else PodResourcesWatch(
            config.kubernetes.pod_resources_socket, config.kubernetes.pod_resources_refresh_seconds,
            mig_parent=lambda mig: self._mig_parents.get(mig))
        self.job_watcher = JobWatcher(resolver, None if pods is None else pods.by_gpu)
        # ((the save it shows, the missing GPUs it names, the NVSwitch errors it names), its HTML)
        self._page: tuple[tuple[float | None, tuple[str, ...], tuple[str, ...]], bytes] | None = None
        self._summariser = Summariser(config.wear)  # each job record's lines, kept with it in the ledger
        self._lines_filled: int | None = None  # the key under which every record's lines are kept
        self._lines_verified = False  # the kept lines checked against what was written (verify_lines)
        self._fill_failed = False
        self._ledger_status = LedgerStatus(None if self.ledger else False, None, 0,
                                           self.ledger is not None and self.ledger.recovered is not None,
                                           self.ledger.set_aside if self.ledger is not None else 0)
        self.tracker.set_detail(config.metrics.detail)
        self._collector: GpuwearCollector | None = None  # made when asked for (prometheus_client loaded then)
        self._registry = registry
        if registry is not None:
            registry.register(self.collector)
        self.exposition = Exposition(self.published, detail=config.metrics.detail)
        self._stopped = threading.Event()
        self._timers = threading.Condition()  # notified on stop and reload: the periodic loops re-read their interval
        self._tick_lock = threading.Lock()
        self._persist_lock = threading.Lock()
        self._wake = threading.Event()
        self._reload = threading.Event()
        watchdog_usec = os.environ.get("WATCHDOG_USEC", "")
        self._watchdog_interval = int(watchdog_usec) / 2e6 if watchdog_usec.isdigit() else None
        self._tick_started: float | None = None  # monotonic, while a tick runs
        self._tick_done = time.monotonic()
        self._tick_failures = 0  # ticks that raised in a row
        self._tick_failure = ""  # what the last one raised
        self.fatal: str | None = None  # why the daemon must exit non-zero (a new process is the only cure)
        self._server: FrontDoor | None = None
        self._kernel_log: KernelLogXids | None = None
        self._otlp: Any = None  # gpuwear.otlp.push.Pusher while OTLP is on (the SDK is imported only then)
        self._otlp_loop = False  # the pushing loop runs (started with the first pusher)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.port

    def _tick(self) -> None:
        with self._tick_lock:
            if self._stopped.is_set():
                return
            self._tick_started = time.monotonic()
            try:
                snapshot = self.source.sampler.tick()
                samples = [(g.identity.uuid, g.sample) for g in snapshot.gpus if g.sample is not None]
                self._mig_parents = {mig: uuid for uuid, s in samples for _, _, mig in s.mig_devices or ()}
                jobs = self.job_watcher.jobs(
                    ((g.identity.uuid, self._pids(g.sample.processes, g.unavailable.get("processes")))
                     for g in snapshot.gpus if g.sample is not None),
                    {uuid: places for uuid, s in samples if (places := mig_places(s))},
                    {uuid: (dict(s.mig_slices), s.mig_slice_count) for uuid, s in samples
                     if s.mig_slices and s.mig_slice_count})
                self.tracker.observe(snapshot, self.source.clock.monotonic(), self.source.clock.wall(), jobs)
                if self._bus is not None and self.source.clock.monotonic() >= self._next_bus:
                    self._next_bus = self.source.clock.monotonic() + self.config.sampling.slow_interval_seconds
                    self._unlisted = self._not_enumerated(self._bus, snapshot)
                self._tick_failures = 0
            except NvmlVersionMismatchError as exc:  # only a restart loads the new library: exit non-zero
                self.fatal = f"{exc}; exiting so that gpuwear is started again with the library installed now"
                log.error("%s", self.fatal)
                self._wake.set()
            except Exception as exc:  # a bug in one tick must not end the sampling
                log.exception("sampling tick failed")
                self._tick_failures += 1
                self._tick_failure = f"{type(exc).__name__}: {exc}"
            self._tick_done, self._tick_started = time.monotonic(), None

    def _not_enumerated(self, bus: NvidiaBus, snapshot: Snapshot) -> tuple[str, ...] | None:
        """The NVIDIA GPUs on the PCI bus that NVML does not list (said in the log when that changes)."""
        unlisted = bus.unlisted(g.identity.pci_bus_id for g in snapshot.gpus)
        if unlisted and unlisted != self._unlisted:
            log.error("NVIDIA GPU(s) on the PCI bus, bound to the nvidia driver, that NVML does not list: %s (the "
                      "driver could not bring them up? the kernel log says why)", ", ".join(unlisted))
        return unlisted

    def _pids(self, processes: tuple[tuple[int, float | None], ...] | None, why: str | None) -> list[int] | Unseen:
        """A GPU's PIDs for the job watcher, or why its jobs cannot be seen: its processes not read (NVML's answer
        ``why``), or PIDs that are not this process's to look up (Source.foreign_pids)."""
        if processes is None:
            return Unseen(_processes_unseen(why))
        if processes and self.source.foreign_pids:
            return Unseen(self.source.foreign_pids)
        return [pid for pid, _ in processes]

    def sampling_problem(self) -> str | None:
        """Why the sampling loop looks stuck (for the watchdog and /healthz), or None.

        Stuck: a tick running for much longer than the NVML deadline allows, or no tick
        finished within a few sampling intervals. A GPU past the deadline alone is not a
        stuck loop: the other GPUs are still sampled."""
        now = time.monotonic()
        wall_interval = self._intervals(self.config)[0]
        started = self._tick_started
        if started is not None and now - started > 2 * self.config.sampling.nvml_deadline_seconds + 10:
            return f"a sampling tick has been running for {now - started:.0f}s"
        if now - self._tick_done > 3 * wall_interval + 10:
            return f"no sampling tick finished for {now - self._tick_done:.0f}s"
        if self._tick_failures >= self.FAILED_TICKS:
            return f"the last {self._tick_failures} sampling ticks failed ({self._tick_failure})"
        return None

    FAILED_TICKS = 3  # ticks failing in a row before the daemon calls itself unhealthy

    def health_problem(self) -> str | None:
        """What /healthz reports: a stuck or failing sampling loop, or a GPU that yields no readings (lost, stalled,
        failing every read, or answering nothing at all), named. The watchdog and /livez (Kubernetes' probes) look
        at the loop only (:meth:`sampling_problem`): a restart cannot bring back a GPU's readings (a lost GPU is
        not even listed after one) and a watchdog kill skips the final save of the ledger."""
        problem = self.sampling_problem()
        if problem is not None or self.source.sampler.snapshot.ticks == 0:
            return problem
        if self.source.sampler.waiting is not None:
            return f"no GPU: {self.source.sampler.waiting}"
        snapshot = self.source.sampler.snapshot
        silent = [f"GPU {g.identity.index} ({g.identity.uuid}) "
                  + ("is lost" if not g.up else "gave no sample (stalled, or the driver is gone)" if g.sample is None
                     else "yields no readings" + (" (every reading unavailable)" if g.unavailable else ""))
                  for g in snapshot.gpus if not g.up or g.sample is None or g.readings == 0]
        reader = self._kernel_log
        unread = [] if reader is None or (why := reader.problem()) is None else [
            f"the kernel log ({reader.source}) cannot be read ({why}): XIDs come from NVML's events alone, which do "
            "not report 79, 119 or 120; tried again with back-off (health.kernel_log: off to do without it)"]
        return "; ".join(silent + self.missing_gpus() + unread) or None

    def missing_gpus(self) -> list[str]:
        """The GPUs this host's ledger holds that NVML does not list now (one fallen off the bus before the start,
        one a cgroup keeps away, one taken out), each named with when it was last seen: they stay missing until
        they come back or are forgotten (`gpuwear forget`)."""
        unlisted = list(self._unlisted or ())
        lines = []
        for m in self._missing(self.source.sampler.snapshot):
            address, on_bus = sysfs_address(m.pci_bus_id), ""
            if address in unlisted:
                unlisted.remove(address)
                on_bus = f"; it is still on the PCI bus at {address}, bound to the nvidia driver"
            lines.append(f"GPU {m.uuid} ({printable(m.name)}) is missing: this host's ledger has it (last seen "
                         f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(m.last_seen)) if m.last_seen else 'never'})"
                         f" but NVML does not list it{on_bus} (`gpuwear forget {m.uuid}` if it was taken out on "
                         "purpose)")
        return lines + [f"{unlisted_text(address)}: the driver could not bring it up? (the kernel log says why)"
                        for address in unlisted]

    def fabric_problems(self) -> list[str]:
        """The NVSwitch SXid lines of the kernel log since the start, by severity (the host's, not a GPU's), in
        words: what the GpuwearNvswitchFatalSxid alert and its runbook say."""
        sxids = self.source.sampler.snapshot.sxids
        lines = []
        if fatal := sxids.get("fatal", 0):
            lines.append(f"{fatal} fatal NVSwitch SXid error(s) in the kernel log since gpuwear started: a failure "
                         "of the NVLink fabric between this host's GPUs, where jobs that span them fail or hang. Read "
                         "the lines (journalctl -k | grep SXid) and nv-fabricmanager's log; resetting the GPUs and "
                         "switches (a reboot) usually brings the fabric back, one that fails again needs service")
        if non_fatal := sxids.get("non_fatal", 0):
            lines.append(f"{non_fatal} non-fatal NVSwitch SXid error(s) in the kernel log since gpuwear started: "
                         "watch for them growing or turning fatal")
        return lines

    def _missing(self, snapshot: Snapshot) -> tuple[MissingGpu, ...]:
        """The GPUs this host's ledger holds that NVML does not list, but its past cards: one whose PCI address (its
        slot) held another card first seen after it was last seen there was replaced (said once in the log when
        that card is listed), not lost."""
        listed = {g.identity.uuid for g in snapshot.gpus}
        known = self.tracker.known()
        past = past_cards((uuid, bus, first, seen) for uuid, (_, seen, bus, first) in known.items())
        missing = []
        for uuid, (name, seen, bus, _) in sorted(known.items()):
            if uuid in listed:
                continue
            by = past.get(uuid)
            if by is None:
                missing.append(MissingGpu(uuid, name, seen, bus))
            elif by in listed and uuid not in self._replaced_said:
                self._replaced_said.add(uuid)
                log.warning("GPU %s at PCI %s replaces GPU %s (%s, last seen %s) in its slot: the old card's history "
                            "is kept as a past card (`gpuwear forget %s` to drop it)", by, bus, uuid,
                            printable(name), time.strftime("%Y-%m-%d %H:%M", time.localtime(seen)) if seen else
                            "never", uuid)
        return tuple(missing)

    def _watchdog(self) -> None:
        """Ping systemd's watchdog while the sampling loop is alive; a stuck loop stops the pings."""
        problem = self.sampling_problem()
        if problem is None:
            sd_notify("WATCHDOG=1")
        else:
            log.error("not pinging the systemd watchdog: %s", problem)

    def _kernel_resume(self) -> dict[str, Any] | None:
        """Where the last run read the kernel log to, as its ledger holds it with the counts it covers; None when
        there is none (or it does not read)."""
        text = self.ledger.meta(KERNEL_LOG_POSITION) if self.ledger is not None else None
        try:
            position = json.loads(text) if text else None
        except ValueError:
            position = None
        if text and not isinstance(position, dict):
            log.warning("the ledger's kernel log position does not read (%s): the kernel log is read from now on",
                        printable(text[:80]))
            return None
        return position

    def _reopen_ledger(self) -> Ledger:
        """Open the ledger again after a failed save or open (a fresh connection: one opened while the directory
        was read-only stays read-only), taking the state directory's lock if it could not be taken at start; the
        history it holds is folded into the one kept in memory unless it was loaded at start (raises what
        opening raises)."""
        if self._lock is None:
            self._lock = StateLock.acquire(self.ledger_file.parent)
        ledger = Ledger.open(self.ledger_file, tell_systemd_recovering)
        if self._history_loaded:
            return ledger
        try:
            gate = self.config.wear.cycles.hysteresis_celsius
            self.tracker.adopt(ledger.load(gate), ledger.load_imported(gate))
        except BaseException:
            ledger.close()
            raise
        self._history_loaded = True
        log.warning("the wear ledger %s could be opened; its history and the one kept in memory are merged",
                    self.ledger_file)
        return ledger

    RUNNING_JOBS_EVERY_SECONDS = 600.0  # a running job's record is saved this often, and when it ends

    def page(self) -> bytes:
        """The page at / (gpuwear.page): the ledger as last saved, rendered again only after the next save."""
        saved = self._ledger_status.last_success_wall
        missing = tuple(self.missing_gpus())
        fabric = tuple(self.fabric_problems())
        cached = self._page
        if cached is not None and cached[0] == (saved, missing, fabric):
            return cached[1]
        from gpuwear import page
        from gpuwear.report import documents

        try:
            ledger = Ledger.open_read_only(self.ledger_file)
            try:
                doc, jobs = documents(ledger, self.config.wear, str(self.ledger_file),
                                      self.source.simulation is not None)
                left_out = ledger.left_out_note()
            finally:
                ledger.close()
        except (LedgerError, sqlite3.Error, OSError) as exc:  # not saved yet, or unreadable: say so, cache nothing
            doc = {"ledger": str(self.ledger_file), "simulated": self.source.simulation is not None, "gpus": []}
            return page.render(doc, note=f"the ledger cannot be read yet ({exc})", missing=missing,
                               fabric=fabric).encode()
        note = "as of the last save" + (f", {time.strftime('%H:%M:%S', time.localtime(saved))}" if saved else "")
        if left_out:
            note += f"; {left_out}"
        body = page.render(doc, jobs, note=note, missing=missing, fabric=fabric).encode()
        self._page = ((saved, missing, fabric), body)
        return body

    def persist(self, final: bool = False) -> bool:
        """Save the accumulators, events and jobs in one transaction; on failure keep them for the next try. A
        running job's record is saved every RUNNING_JOBS_EVERY_SECONDS (a crash loses at most that of its
        detail; each GPU's own figures are saved every time), every one at the ``final`` save of a stop."""
        with self._persist_lock:  # the schedule, a stop and a caller may ask at once; one connection
            return self._persist(0.0 if final else self.RUNNING_JOBS_EVERY_SECONDS)

    def _persist(self, running_jobs_every: float) -> bool:
        status = self._ledger_status
        try:
            if self.ledger is None:
                self.ledger = self._reopen_ledger()
            wears, events, jobs = self.tracker.take(running_jobs_every)
            try:
                lead = self._simulation_lead()
                meta = dict(lead)
                position = self.tracker.taken_kernel_position
                if position is not None and (text := json.dumps(position, sort_keys=True)) != self._saved_position:
                    meta[KERNEL_LOG_POSITION] = text
                self.ledger.save(wears, events, jobs=jobs, forget_jobs_before=self._forget_before(
                    self.config.jobs.retention_days), forget_events_before=self._forget_before(
                    self.config.wear.event_retention_days), meta=meta, lines=self._summariser)
                if lead:  # written: the next is due once the lead moved on from this one
                    self._saved_lead = int(lead[SIMULATION_LEAD])
                self._saved_position = meta.get(KERNEL_LOG_POSITION, self._saved_position)
            except BaseException:
                self.tracker.give_back(events, jobs)
                raise
        except (OSError, sqlite3.Error, LedgerError) as exc:
            if self.ledger is not None:  # the next try opens a fresh connection
                self.ledger.close()
                self.ledger = None
            if status.failures == 0 or status.last_success is not False:
                log.error("cannot save the wear ledger %s (%s); sampling goes on and the save is retried",
                          self.ledger_file, exc)
            self._ledger_status = replace(status, last_success=False, failures=status.failures + 1)
            return False
        if status.last_success is False:
            log.warning("the wear ledger %s is saved again", self.ledger_file)
        self._ledger_status = replace(status, last_success=True, last_success_wall=time.time())
        give_back_freed_memory()  # what the save and the minute's ticks and scrapes freed
        return True

    FILL_LINES_PER_CHUNK = 500  # job records whose lines one transaction keeps (a save waits for at most one)

    def _index(self) -> None:
        """Keep the lines of job records that have none under the wear parameters in force (saved by a release
        before lines were kept, by a migration or a recovery that derives none, or under other parameters before a
        reload), in one pass right after serving starts: chunk after chunk, each under the persist lock, until none
        is left; then again after a reload changes the parameters. Listings answer from what is kept meanwhile.
        Derived data: a failure is logged once and tried again a save interval later, never a failed save."""
        began, indexed = None, 0  # the pass under way: when it began (monotonic s), the records it kept lines of
        while not self._stopped.is_set():
            chunk = time.monotonic()
            with self._persist_lock:
                state, kept = self._fill_lines()
            if kept and began is None:
                log.info("ledger %s: indexing the job records kept without their lines (after an upgrade, a "
                         "recovery or new wear parameters); listings count them once indexed", self.ledger_file)
                began = chunk
            indexed += kept
            if state == "done" and began is not None:
                log.info("ledger %s: %d job record(s) indexed in %.1f s", self.ledger_file, indexed,
                         time.monotonic() - began)
                began, indexed = None, 0
            if state == "more":
                continue
            with self._timers:  # notified on stop and reload
                if not self._stopped.is_set() and (state == "later" or self._lines_filled == self._summariser.key):
                    self._timers.wait(self._intervals(self.config)[1] if state == "later" else None)

    def _fill_lines(self) -> tuple[str, int]:
        """One chunk of :meth:`_index`: ("more" (records left), "done" or "later" (no ledger, or it failed); the
        records whose lines it kept)."""
        if self._lines_filled == self._summariser.key:
            return "done", 0
        if self.ledger is None or self._stopped.is_set():  # stopping: the final save, then the ledger closes
            return "later", 0
        try:
            if not self._lines_verified:  # once a start, off the start's path: a pass over every kept line
                dropped = self.ledger.verify_lines()
                self._lines_verified = True
                if dropped:
                    log.warning("ledger %s: the kept lines of %d job record(s) failed their check; they are counted "
                                "from the records and kept again", self.ledger_file, dropped)
            kept = self.ledger.fill_lines(self._summariser, self.FILL_LINES_PER_CHUNK)
            self._fill_failed = False
        except (sqlite3.Error, LedgerError) as exc:
            if not self._fill_failed:
                log.warning("ledger %s: the lines of older job records cannot be kept yet (%s); tried again later",
                            self.ledger_file, exc)
            self._fill_failed = True
            return "later", 0
        if kept < self.FILL_LINES_PER_CHUNK:
            self._lines_filled = self._summariser.key
            return "done", kept
        return "more", kept

    def _forget_before(self, days: float) -> float | None:
        """The Unix time before which records go (retention of ``days``; None: keep them). No retention on a clock
        that jumped in this process, or that starts further from the ledger's last sight than the retention itself (a
        clock ahead at start): one save would forget every record."""
        trusted = not self.tracker.clock_jumped and self.tracker.largest_start_gap < days * 86400
        return self.source.clock.wall() - days * 86400 if days and trusted else None

    def _simulation_lead(self) -> dict[str, str]:
        """The simulated clock's lead over the real one, for the ledger (ScaledClock.resume), when it moved by
        LEAD_SAVE_STEP_SECONDS since it was last written (and at the first save): never again at --speed 1, and at
        --speed 60 once a wall minute, not at every save."""
        clock = self.source.clock
        if not isinstance(clock, ScaledClock):
            return {}
        lead = max(0, round(clock.lead()))
        if self._saved_lead is not None and abs(lead - self._saved_lead) < LEAD_SAVE_STEP_SECONDS:
            return {}
        return {SIMULATION_LEAD: str(lead)}

    def _every(self, seconds: Callable[[], float], action: Callable[[], object]) -> None:
        """Run ``action`` at a fixed rate on the monotonic clock until stopped (the sampling tick, the ledger save,
        the watchdog ping: one thread each, asleep in between). ``seconds()`` is read again after a reload, which
        applies from the last run; a run that overruns makes the missed ones one, never a burst."""
        last = time.monotonic()
        while True:
            with self._timers:
                while True:
                    if self._stopped.is_set():
                        return
                    interval = seconds()
                    due, now = last + interval, time.monotonic()
                    if now >= due:
                        break
                    self._timers.wait(due - now)
            last = due + math.floor((now - due) / interval) * interval
            try:
                action()
            except Exception:  # a bug in one run must not end the loop
                log.exception("periodic %s failed", getattr(action, "__name__", action))

    def start(self) -> None:
        """First sample, event listener, HTTP server, then the periodic schedule."""
        sampler = self.source.sampler
        self._tick()
        settle_collector()
        give_back_freed_memory()  # what start-up freed: the imports' and the ledger's reading
        sampler.start_events(self.config.sampling.event_wait_milliseconds)
        source, simulation = self.config.health.kernel_log, self.source.simulation
        if simulation is None or source == "off" or source.startswith("/"):
            self._kernel_log = KernelLogXids(source, sampler.record_kernel_xid, on_sxid=sampler.record_sxid,
                                             on_lost=sampler.record_kernel_lost, resume=self._kernel_resume(),
                                             on_position=sampler.note_kernel_position, lock=sampler.lock,
                                             on_nvlink=sampler.record_kernel_nvlink,
                                             on_process=sampler.record_kernel_process)
        else:  # simulated GPUs are in no real kernel log: their driver's own
            self._kernel_log = KernelLogXids("simulation", sampler.record_kernel_xid, simulation.kernel_log,
                                             simulation.wake_kernel_log, sampler.record_sxid,
                                             sampler.record_kernel_lost, on_nvlink=sampler.record_kernel_nvlink,
                                             on_process=sampler.record_kernel_process)
        self._kernel_log.start()
        host, port = self.config.listen_address
        self._server = FrontDoor((host, port), self.exposition, self.web, self.health_problem, self.sampling_problem,
                                  self.limits, self.page)
        self._server.start()
        wall_interval = self._intervals(self.config)[0]
        loops: list[tuple[str, Callable[[], float], Callable[[], object]]] = [
            ("sampling", lambda: self._intervals(self.config)[0], self._tick),
            ("persist", lambda: self._intervals(self.config)[1], self.persist)]
        threading.Thread(target=self._index, name="index", daemon=True).start()
        if self._watchdog_interval is not None:
            watchdog_interval = self._watchdog_interval
            loops.append(("watchdog", lambda: watchdog_interval, self._watchdog))
        self._otlp = self._start_otlp()
        for name, seconds, action in loops:
            threading.Thread(target=self._every, args=(seconds, action), name=name, daemon=True).start()
        if self._otlp is not None:
            self._start_otlp_loop()
        sd_notify(f"READY=1\nSTATUS=sampling {len(sampler.snapshot.gpus)} GPU(s)")
        if not self.config.listen_is_loopback and not (self.web.users and self.web.tls):
            log.warning("serving /metrics on a non-loopback address %s without TLS and basic auth "
                        "(web_config_file)", self.config.listen)
        for note in self.web.notes:
            log.info("web config: %s", note)
        where = f"{host}:{self.port}" if host and ":" not in host else f"[{host}]:{self.port}" if host else \
            f"every interface, port {self.port}"
        log.info("gpuwear %s: %d GPU(s), backend %s; sampling every %gs (wall %gs); ledger %s; serving %s /metrics "
                 "on %s%s", __version__, len(sampler.snapshot.gpus), self.source.info.backend,
                 self.config.sampling.interval_seconds, wall_interval, self.ledger_file,
                 "HTTPS" if self.web.tls else "HTTP", where, " with basic auth" if self.web.users else "")

    def _start_otlp(self) -> Any:
        """The OTLP pusher where otlp is on (gpuwear.config.OtlpConfig.on), else None; where it cannot push (the SDK
        not installed, a protocol this release does not speak), one line says why and /metrics is served as ever."""
        if not self.config.otlp.on(os.environ):
            return None
        try:
            from gpuwear.otlp.push import Pusher, UnsupportedError
        except ImportError as exc:
            log.error("otlp is on, but the OpenTelemetry SDK cannot be imported (%s): pip install 'gpuwear[otlp]'; "
                      "nothing is pushed, /metrics is served as ever", exc)
            return None
        try:
            pusher = Pusher(self.config.otlp, self.collector.collect)
        except UnsupportedError as exc:
            log.error("otlp: %s; nothing is pushed, /metrics is served as ever", exc)
            return None
        log.info("pushing OTLP (%s) to %s every %gs", pusher.protocol, pusher.endpoint,
                 self.config.otlp.interval_seconds)
        return pusher

    def _start_otlp_loop(self) -> None:
        """The loop that pushes (once, where OTLP is on at start or a reload turns it on): each push the pusher of
        the moment, at the interval of the moment (a reload may change both)."""
        if self._otlp_loop:
            return
        self._otlp_loop = True

        def push() -> object:
            otlp = self._otlp
            return None if otlp is None else otlp.push()

        threading.Thread(target=self._every, args=(lambda: self.config.otlp.interval_seconds, push), name="otlp",
                         daemon=True).start()

    def _reload_otlp(self, before: OtlpConfig) -> None:
        """A reload whose otlp section changed (``before``: the old one): a new pusher from the new section (or none,
        OTLP off now), its counts carried on from the old one's, the old one closed; the loop started if it was not."""
        old, new = self._otlp, self._start_otlp()
        if old is not None and new is not None:
            new.pushed, new.failed, new.partial = old.pushed, old.failed, old.partial
        self._otlp = new
        if old is not None:
            old.close()
        if new is not None:
            self._start_otlp_loop()
        elif before.on(os.environ):
            log.info("SIGHUP: OTLP pushes stop")

    @property
    def collector(self) -> GpuwearCollector:
        """The published state as prometheus_client families (the OTLP pusher's; /metrics writes its own text):
        made at the first ask, which loads prometheus_client."""
        if self._collector is None:
            from gpuwear.families import GpuwearCollector

            self._collector = GpuwearCollector(self.published, self.config.metrics.detail)
        return self._collector

    @property
    def registry(self) -> CollectorRegistry:
        """A prometheus_client registry holding :attr:`collector` (the one given, or one made at the first ask)."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(self.collector)
        return self._registry

    def published(self) -> Published:
        """What a scrape reads now: each part an immutable object, read by reference."""
        snapshot = self.source.sampler.snapshot
        reader = self._kernel_log
        following = None if reader is None or reader.source == "off" else reader.problem() is None
        otlp = self._otlp
        return Published(snapshot, self.tracker.views, self._ledger_status, self.source.info,
                         self._missing(snapshot), self._unlisted, following,
                         None if otlp is None else (otlp.pushed, otlp.failed, otlp.partial))

    def _wear_params(self, config: Config) -> WearConfig:
        """The wear parameters, with the gap limit at least as many ticks as it is at 1 s
        sampling (30 by default): under --speed a tick covers more simulated time, and a
        little scheduling jitter is many simulated seconds."""
        tick = self._intervals(config)[0] * self.source.speed
        ticks = config.wear.max_gap_seconds / config.sampling.interval_seconds
        return replace(config.wear, max_gap_seconds=max(config.wear.max_gap_seconds, ticks * tick))

    def _intervals(self, config: Config) -> tuple[float, float]:
        """Wall seconds between ticks and between ledger saves (simulated time runs faster)."""
        speed = self.source.speed
        return (max(config.sampling.interval_seconds / speed, MIN_WALL_INTERVAL_SECONDS),
                max(config.wear.persist_interval_seconds / speed, MIN_PERSIST_SECONDS))

    def reload(self) -> bool:
        """Re-read the config file and the web config file it names (SIGHUP): sampling intervals,
        thresholds, model parameters, OTLP, TLS, users and headers apply at once, without losing state; an
        invalid file is refused and the old one kept (the log says which). True when both were taken."""
        if self.config_path is None:
            log.warning("SIGHUP: no --config file to reload")
            return False
        sd_notify("RELOADING=1")
        try:
            config_ok = self._reload_config(self.config_path)
            web_ok = self._reload_web()
        except Exception:  # nothing a file holds may stop the daemon
            log.exception("SIGHUP: reload failed; keeping the running configuration")
            config_ok = web_ok = False
        sd_notify("READY=1")
        return config_ok and web_ok

    def _reload_web(self) -> bool:
        path = self.config.web_config_file
        if not path:
            if self.web.path is not None and self._server is not None:
                log.warning("SIGHUP: web_config_file removed: plain HTTP without basic auth from now on")
                self.web = WebConfig()
                self._server.configure(self.web)
            return True
        try:
            web = load_web_config(path)
            if self._server is not None:
                self._server.configure(web)
        except (WebConfigError, OSError, ssl.SSLError) as exc:
            log.error("SIGHUP: web config %s refused, keeping the running one: %s", path, exc)
            return False
        if (web.tls is None) != (self.web.tls is None):
            log.warning("SIGHUP: web config %s: new connections use %s", path, "HTTPS" if web.tls else "plain HTTP")
        self.web = web
        for note in web.notes:
            log.info("web config: %s", note)
        log.info("SIGHUP: reloaded web config %s (%s, %d basic auth user(s))", path,
                 "TLS" if web.tls else "no TLS", len(web.users))
        return True

    def _reload_config(self, config_path: str) -> bool:
        try:
            new = replace(load_config(config_path), **self.overrides)
            if problems := mode_problems(dict(new.wear.health.rules)):
                raise ConfigError(problems)
        except ConfigError as exc:
            log.error("SIGHUP: %s refused, keeping the running config: %s", config_path, exc)
            return False
        for key in ("listen", "state_dir", "kubernetes"):
            if getattr(new, key) != getattr(self.config, key):
                log.warning("SIGHUP: %s changed; it takes effect at the next restart", key)
                new = replace(new, **{key: getattr(self.config, key)})
        self.source.sampler.slow_interval = new.sampling.slow_interval_seconds
        self.source.sampler.deadline = new.sampling.nvml_deadline_seconds
        self.tracker.set_params(self._wear_params(new))
        self._summariser = Summariser(new.wear)  # other model parameters: the lines are kept anew under their key
        self.tracker.set_detail(new.metrics.detail)
        self.exposition.detail = new.metrics.detail
        if self._collector is not None:
            self._collector.detail = new.metrics.detail
        logging.getLogger().setLevel(new.log_level.upper())
        before, self.config = self.config, new
        if new.otlp != before.otlp:
            self._reload_otlp(before.otlp)
        with self._timers:  # the sampling and persist loops take their new intervals
            self._timers.notify_all()
        log.info("SIGHUP: reloaded %s (sampling every %gs)", config_path, new.sampling.interval_seconds)
        return True

    def stop(self) -> None:
        """Stop sampling, serving and NVML; idempotent, returns within about a second."""
        if self._stopped.is_set():
            return
        with self._timers:
            self._stopped.set()
            self._timers.notify_all()
        sd_notify("STOPPING=1")
        if self._server is not None:
            self._server.close()
        if self._kernel_log is not None:
            self._kernel_log.stop()
        if self._otlp is not None:
            self._otlp.close()
        # let a tick in flight finish (not a hung one), so the last save holds what was served
        if self._tick_lock.acquire(timeout=1.0):
            self._tick_lock.release()
        self.source.sampler.close()
        self.tracker.flush()  # a sample held back to judge it as a spike is believed: nothing follows it
        if self.source.simulation is not None:  # the simulated jobs end with the simulation (`jobs`: not "running")
            self.tracker.end_jobs()
        self.persist(final=True)
        if self.ledger is not None:
            self.ledger.close()
        if self._lock is not None:
            self._lock.release()
        log.info("gpuwear stopped")

    def handle_signals(self) -> None:
        """Make SIGTERM and SIGINT end :meth:`wait`; call before :meth:`start`, so that a
        signal arriving during start-up still stops the daemon cleanly."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("received %s, stopping", signal.Signals(signum).name)
            self._wake.set()

        def hangup(signum: int, frame: FrameType | None) -> None:
            self._reload.set()
            self._wake.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGHUP, hangup)

    def wait(self) -> None:
        """Block until SIGTERM/SIGINT, then stop; reload the config on each SIGHUP meanwhile."""
        while True:
            # a signal interrupts the wait at once (its handler sets the event); the timeout is only a safety
            # net, long enough not to wake an idle daemon twice a second
            self._wake.wait(5.0)
            if self._reload.is_set():
                self._reload.clear()
                self._wake.clear()
                self.reload()
            elif self._wake.is_set():
                break
        self.stop()
