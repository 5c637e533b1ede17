"""Attributing each GPU's wear to the jobs that ran on it, and to idle time between them.

Every integrated interval of a GPU goes, whole, to somebody: shared equally by the jobs
whose processes were on the GPU (on a MIG GPU, by the compute slices of the MIG devices they ran on,
:mod:`gpuwear.jobs.mig`, the slices no job held going to the idle line), to the GPU's current "idle"
line when there were none, or to its "unattributed" line, named with the reason, when its processes
could not be read (MIG without root, a vGPU guest): a job may have run then, so that time is never idle.
So the jobs, idle and unattributed lines of a GPU add up to its totals (closed thermal cycles included;
the GPU's still-open rainflow residue belongs to nobody yet). No clock and no I/O here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gpuwear.jobs.resolve import Job, Unseen
from gpuwear.wear.accumulate import GpuWear, Interval

IDLE = "idle"
UNATTRIBUTED = "unattributed"
WHO_CHARS = 240  # JobAccounts.who: an event's detail stays small


@dataclass
class JobGpu:
    """One job (or idle line) on one GPU: its slice of the GPU's accumulators."""

    uuid: str
    start: float
    end: float
    wear: GpuWear
    max_celsius: dict[str, float] = field(default_factory=dict)  # sensor -> highest reading
    events: dict[str, int] = field(default_factory=dict)  # "xid 79", "health remapped_rows_pending" -> count
    container: str | None = None  # Kubernetes: the container the GPU is allocated to (in memory, not saved)

    def to_json(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "start": self.start, "end": self.end, "wear": self.wear.to_json(),
                "max_celsius": self.max_celsius, "events": self.events}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobGpu:
        return cls(d["uuid"], d["start"], d["end"], GpuWear.from_json(d["wear"], 0.0), dict(d["max_celsius"]),
                   dict(d["events"]))


@dataclass
class JobRecord:
    """A job's whole run (or one idle or unattributed period of one GPU); ``end`` is None while it runs."""

    record: str  # unique: the job key and its start
    kind: str
    id: str
    user: str | None
    name: str | None
    start: float
    last_seen: float
    end: float | None = None
    gpus: dict[str, JobGpu] = field(default_factory=dict)
    # Kubernetes: the pod's namespace and name from the kubelet (in memory, not saved: its name, "namespace/pod",
    # is; a running job loaded from the ledger has them again at its first interval with a kubelet answer)
    namespace: str | None = None
    pod: str | None = None

    @property
    def idle(self) -> bool:
        return self.kind == IDLE

    @property
    def per_gpu(self) -> bool:
        """An idle or unattributed line: one GPU's, closed at a gap or a restart."""
        return self.kind in (IDLE, UNATTRIBUTED)

    def to_json(self) -> dict[str, Any]:
        return {"record": self.record, "kind": self.kind, "id": self.id, "user": self.user, "name": self.name,
                "start": self.start, "last_seen": self.last_seen, "end": self.end,
                "gpus": [g.to_json() for g in self.gpus.values()]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobRecord:
        rec = cls(d["record"], d["kind"], d["id"], d.get("user"), d.get("name"), d["start"], d["last_seen"],
                  d.get("end"))
        rec.gpus = {g["uuid"]: JobGpu.from_json(g) for g in d["gpus"]}
        return rec


class JobAccounts:
    """The running jobs and idle lines, and the records changed since the last take."""

    def __init__(self, grace_seconds: float, running: list[JobRecord] | None = None) -> None:
        self.grace = grace_seconds
        self.active: dict[str, JobRecord] = {}  # job key -> record
        self.lines: dict[str, JobRecord] = {}  # GPU uuid -> its open idle or unattributed line
        self._dirty: dict[str, JobRecord] = {}
        self._written: dict[str, float] = {}  # running record -> its last_seen when last taken for a save
        self._last_wall: dict[str, float] = {}  # GPU uuid -> end of its last accounted interval
        for rec in running or []:
            if rec.per_gpu:
                rec.end = rec.last_seen  # an idle or unattributed line never spans a restart
                self._dirty[rec.record] = rec
            else:
                self.active[f"{rec.kind}:{rec.id}"] = rec

    def current(self, uuid: str) -> list[JobRecord]:
        """The jobs running on a GPU now (for the info metric): those given its last interval."""
        return self.running().get(uuid, [])

    def running(self) -> dict[str, list[JobRecord]]:
        """The jobs running on each GPU now (:meth:`current`), by GPU UUID, in one pass over the jobs (a view of every
        GPU at a scrape: not a pass per GPU)."""
        out: dict[str, list[JobRecord]] = {}
        last = self._last_wall
        for rec in self.active.values():
            for uuid, share in rec.gpus.items():
                if share.end == last.get(uuid):
                    out.setdefault(uuid, []).append(rec)
        return out

    def account(self, uuid: str, wall: float, interval: Interval, temps: dict[str, float],
                jobs: list[Job] | Unseen, gpu_wear: GpuWear) -> None:
        """Give one interval of a GPU (ending at ``wall``) to its jobs, to idle, or, where its processes could not
        be read, to its unattributed line."""
        start = wall - interval.dt
        self._last_wall[uuid] = wall
        if isinstance(jobs, Unseen) or not jobs:
            kind, name = (UNATTRIBUTED, f"unattributed: {jobs.reason}") if isinstance(jobs, Unseen) else (IDLE, IDLE)
            self._line(uuid, kind, name, start, wall, interval, temps, 1.0, gpu_wear)
            return
        shares = [job.share for job in jobs if job.share is not None]
        if len(shares) < len(jobs):
            shares = [1.0 / len(jobs)] * len(jobs)
        rest = 1.0 - math.fsum(shares)  # (jobs.mig) a MIG GPU's slices no job holds: its idle line's
        if rest > 1e-9:
            self._line(uuid, IDLE, IDLE, start, wall, interval, temps, rest, gpu_wear)
        elif uuid in self.lines:
            self._close(self.lines.pop(uuid), start)
        for job, share in zip(jobs, shares, strict=True):
            rec = self.active.get(job.key)
            if rec is None:
                rec = self.active[job.key] = JobRecord(f"{job.key}@{start:.0f}", job.kind, job.id, job.user,
                                                       job.name, start, wall)
            self._give(rec, uuid, start, wall, interval, temps, share, gpu_wear)
            if job.pod is not None:  # the kubelet's names: they replace a process name taken before it answered
                rec.name, rec.namespace, rec.pod = job.name, job.namespace, job.pod
                rec.gpus[uuid].container = job.container
            self._bucket(gpu_wear, "job", interval, share)

    def _line(self, uuid: str, kind: str, name: str, start: float, wall: float, interval: Interval,
              temps: dict[str, float], share: float, gpu_wear: GpuWear) -> None:
        """Give ``share`` of the interval to the GPU's idle or unattributed line (a new one where it had the other)."""
        rec = self.lines.get(uuid)
        if rec is not None and rec.kind != kind:
            self._close(self.lines.pop(uuid), start)
            rec = None
        if rec is None:
            rec = self.lines[uuid] = JobRecord(f"{kind}:{uuid}@{start:.0f}", kind, uuid, None, name, start, wall)
        self._give(rec, uuid, start, wall, interval, temps, share, gpu_wear)
        self._bucket(gpu_wear, kind, interval, share)

    def _give(self, rec: JobRecord, uuid: str, start: float, wall: float, interval: Interval,
              temps: dict[str, float], share: float, gpu_wear: GpuWear) -> None:
        slice_ = rec.gpus.get(uuid)
        if slice_ is None:
            slice_ = rec.gpus[uuid] = JobGpu(uuid, start, wall, GpuWear(uuid, gpu_wear.name, gpu_wear.serial))
        slice_.wear.apply(interval, share)
        slice_.end = wall
        for sensor, t in temps.items():
            slice_.max_celsius[sensor] = max(slice_.max_celsius.get(sensor, t), t)
        rec.last_seen = max(rec.last_seen, wall)
        self._dirty[rec.record] = rec

    @staticmethod
    def _bucket(w: GpuWear, kind: str, interval: Interval, share: float) -> None:
        """Per-GPU totals split by kind (job / idle / unattributed), for the bounded-cardinality metrics."""
        k = w.kinds.setdefault(kind, {"seconds": 0.0, "energy_joules": 0.0, "temperature_seconds": {}})
        k["seconds"] += interval.dt * share
        k["energy_joules"] += interval.energy_joules * share
        b = interval.temperature_bins.get("gpu")
        if b is not None:
            w.tally(k["temperature_seconds"], b, interval.dt * share)

    def event(self, uuid: str, what: str) -> None:
        """Count an event (XID, memory-error change) against whoever runs on the GPU now."""
        for rec in [*self.current(uuid), *([self.lines[uuid]] if uuid in self.lines else [])]:
            events = rec.gpus[uuid].events if uuid in rec.gpus else None
            if events is not None:
                events[what] = events.get(what, 0) + 1
                self._dirty[rec.record] = rec

    def who(self, uuid: str) -> str:
        """Who runs on a GPU now, in words for an event (an XID): its jobs ("slurm 4242 (train)"; several joined by
        "; "), else its line ("idle", "unattributed: REASON"), else "not known yet" (before its first interval);
        at most WHO_CHARS characters."""
        jobs = [f"{rec.kind} {rec.id}" + (f" ({rec.name})" if rec.name and rec.name != rec.id else "")
                for rec in self.current(uuid)]
        line = self.lines.get(uuid)
        words = "; ".join(jobs) if jobs else (line.name or line.kind) if line is not None else "not known yet"
        return words if len(words) <= WHO_CHARS else words[:WHO_CHARS - 1] + "…"

    def applications(self, uuid: str) -> list[str]:
        """The applications running on a GPU now: the names of its jobs (a Slurm job's name, a pod's, a container's:
        what recurs from run to run); a job without a name is none."""
        return sorted({rec.name for rec in self.current(uuid) if rec.name})

    def end_all(self) -> None:
        """End every running job, idle and unattributed line where it was last seen (a simulation that stops: its
        jobs end with it, where a real daemon's go on running and are taken up again at its next start)."""
        for rec in [*self.active.values(), *self.lines.values()]:
            self._close(rec, rec.last_seen)
        self.active.clear()
        self.lines.clear()

    def expire(self, wall: float) -> None:
        """End the jobs whose processes have been gone longer than the grace period (a
        restart within it continues the same job)."""
        for key, rec in list(self.active.items()):
            if wall - rec.last_seen > self.grace:
                del self.active[key]
                self._close(rec, rec.last_seen)

    def clock_set_back(self, wall: float) -> None:
        """The wall clock was ahead and is now ``wall``: running records seen later than now come back to now (a
        job last seen "in the future" would otherwise never pass its grace period)."""
        for rec in [*self.active.values(), *self.lines.values()]:
            if rec.last_seen > wall:
                rec.last_seen = max(rec.start, wall)
                for gpu in rec.gpus.values():
                    gpu.end = max(gpu.start, min(gpu.end, wall))
        for uuid, last in self._last_wall.items():
            self._last_wall[uuid] = min(last, wall)

    def stop_gpu(self, uuid: str, wall: float) -> None:
        """A gap on a GPU (lost, daemon stopping): its idle or unattributed line ends."""
        if uuid in self.lines:
            self._close(self.lines.pop(uuid), wall)

    def _close(self, rec: JobRecord, end: float) -> None:
        rec.end = max(end, rec.start)
        self._dirty[rec.record] = rec

    def take(self, running_every: float = 0.0) -> list[dict[str, Any]]:
        """The records changed since the last take, as JSON, for the ledger; a running record only when it was not
        taken in the last ``running_every`` seconds of its own time (it changes at every tick: a save of every
        running job at every save was most of what the ledger wrote). Ended records always."""
        taken = []
        for key, rec in list(self._dirty.items()):
            if rec.end is None and rec.last_seen - self._written.get(key, -math.inf) < running_every:
                continue
            taken.append(rec)
            del self._dirty[key]
            if rec.end is None:
                self._written[key] = rec.last_seen
            else:
                self._written.pop(key, None)
        return [rec.to_json() for rec in taken]

    def give_back(self, records: list[dict[str, Any]]) -> None:
        for d in records:
            if d["record"] not in self._dirty:
                self._dirty[d["record"]] = JobRecord.from_json(d)
