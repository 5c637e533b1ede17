"""Which job a GPU process belongs to: from its cgroup (/proc/PID/cgroup), else its session.

A *job* is what a person started: a Slurm job, a Kubernetes pod, a Docker/containerd/
podman container, a systemd unit or user session, else the process's session (a launcher
such as torchrun and its ranks and data-loader workers share one). Several processes of a
job map to one key; a process we may not inspect is "unknown (no permission)". Nothing
here keeps state; :class:`ProcessResolver` reads /proc and psutil when asked. On a Kubernetes
node a pod's jobs are also named namespace/pod/container after the pod the kubelet allocated
their GPU to (:func:`with_pod_names`, from :mod:`gpuwear.jobs.kubelet`).
"""

from __future__ import annotations

import logging
import os
import pwd
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from gpuwear.jobs.mig import slice_shares

log = logging.getLogger(__name__)

MAX_FIELD = 128  # job ids and names are clipped: they come from other users' processes


@dataclass(frozen=True)
class Job:
    """A job's identity. ``key`` is unique and stable across the job's processes and restarts."""

    kind: str  # slurm, kubernetes, docker, container, systemd, session, process, simulated, unknown
    id: str
    user: str | None = None
    name: str | None = None  # a short label for people (process name, unit name); never a command line
    # Kubernetes only, from the kubelet's pod-resources API (None without its answer): the pod's namespace and
    # name, and the container the job's GPU is allocated to (None when several of the pod's share it)
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    # on a MIG GPU, its share of the GPU by its MIG devices' compute slices (jobs.mig; None: the GPU's jobs share it
    # equally, as without MIG); per GPU, set in the watcher's answer only
    share: float | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"


@dataclass(frozen=True)
class Unseen:
    """A GPU whose processes gpuwear could not read for an interval: its time is *unattributed*, with the reason
    (never idle: a job may have run). ``reason``: the NVML answer (``no_permission``: a list NVML gives root only,
    such as a MIG GPU's whose MIG devices do not answer theirs; ``not_supported``: a vGPU guest, WSL2) or why the
    read gave nothing."""

    reason: str


PROC_PID_INIT_INO = 0xEFFFFFFC  # the initial PID namespace's inode number (linux/proc_ns.h), since Linux 3.8


def wsl2(proc: Path = Path("/proc")) -> bool:
    """Whether this is WSL2 (its kernel's release names Microsoft: "5.15.153.1-microsoft-standard-WSL2")."""
    try:
        return "microsoft" in (proc / "sys/kernel/osrelease").read_text(errors="replace").lower()
    except OSError:
        return False


def foreign_pids(proc: Path = Path("/proc")) -> str | None:
    """Why the PIDs NVML names cannot be looked up in this process's /proc (None: they can). NVML names a GPU's
    processes by their PIDs in the host's (initial) PID namespace, and under WSL2 by their Windows PIDs
    (nvidia-docker #1483, #1458): a local process that happens to bear the number would be taken for the job."""
    if wsl2(proc):
        return "WSL2: NVML names processes by their Windows PIDs"
    try:
        namespace = (proc / "self/ns/pid").stat().st_ino
    except OSError:
        return None  # no way to tell (an old kernel): the PIDs are taken as this namespace's
    if namespace != PROC_PID_INIT_INO:
        return ("PIDs of the host's namespace (gpuwear runs in a PID namespace of its own: give its container "
                "--pid=host, or hostPID: true)")
    return None


def clip(text: str) -> str:
    """Printable, single-line, bounded: ids come from paths other users control."""
    cleaned = "".join(ch if ch.isprintable() and ch not in "\n\r\t" else "?" for ch in text)
    return cleaned[:MAX_FIELD]


_SLURM = re.compile(r"/job_(\d+)(?:/|$)")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_DOCKER = re.compile(r"(?:/docker/|docker-)([0-9a-f]{64})")
_CONTAINER = re.compile(r"(?:cri-containerd|crio|libpod|containerd)-([0-9a-f]{64})\.scope")
_UNIT = re.compile(r"/([^/]+\.(?:service|scope))$")
_SESSION = re.compile(r"/user-(\d+)\.slice/session-([^/]+)\.scope")


def job_from_cgroup(text: str) -> Job | None:
    """The job a /proc/PID/cgroup content names (cgroup v1 or v2), or None when it names none.

    Checked in order of specificity over every line: Slurm, Kubernetes pod (cgroupfs and
    systemd drivers), Docker, other containers, user session, systemd unit."""
    paths = [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
    for path in paths:
        if m := _SLURM.search(path):
            return Job("slurm", m.group(1))
    for path in paths:
        if "kubepods" in path and (m := _POD.search(path)):
            return Job("kubernetes", m.group(1).replace("_", "-"))
    for path in paths:
        if m := _DOCKER.search(path):
            return Job("docker", m.group(1)[:12])
    for path in paths:
        if m := _CONTAINER.search(path):
            return Job("container", m.group(1)[:12])
    for path in paths:
        if m := _SESSION.search(path):
            return Job("session", clip(f"user-{m.group(1)}/session-{m.group(2)}"))
    for path in paths:
        if (m := _UNIT.search(path)) and "user@" not in m.group(1) and not m.group(1).startswith("init."):
            return Job("systemd", clip(m.group(1)), name=clip(m.group(1)))
    return None


def read_cgroup(pid: int, proc: Path = Path("/proc")) -> str:
    return (proc / str(pid) / "cgroup").read_text(errors="replace")


def session_of(pid: int, proc: Path = Path("/proc")) -> int:
    """The session id (field 6 of /proc/PID/stat)."""
    stat = (proc / str(pid) / "stat").read_text(errors="replace")
    return int(stat.rsplit(")", 1)[1].split()[3])


TASK_COMM_LEN = 15  # the characters of a command name the kernel keeps (linux/sched.h: 16 with its NUL)


def process_name(pid: int, proc: Path = Path("/proc")) -> str:
    """A process's name as psutil.Process.name() gives it on Linux (tested against it): its command name
    (/proc/PID/stat), and where the kernel cut that at TASK_COMM_LEN, the base name of its command line's first
    word when that begins with it ("gnome-keyring-d": "gnome-keyring-daemon"). A command line rewritten with spaces
    instead of NULs (setproctitle) is split at its spaces, as psutil does; one that cannot be read leaves the cut
    name. FileNotFoundError or ProcessLookupError once the process is gone."""
    stat = (proc / str(pid) / "stat").read_text(errors="replace")
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    if len(name) < TASK_COMM_LEN:
        return name
    try:
        line = (proc / str(pid) / "cmdline").read_text(errors="replace")
    except PermissionError:
        return name
    sep = "\0" if line.endswith("\0") else " "
    words = line.removesuffix(sep).split(sep)
    if sep == "\0" and len(words) == 1:
        words = words[0].split(" ")
    full = os.path.basename(words[0]) if line else ""
    return full if full.startswith(name) else name


def process_user(pid: int, proc: Path = Path("/proc")) -> str:
    """The name of the user a process runs as (its real uid, /proc/PID/status), as psutil.Process.username()
    gives it: the uid itself where the system has no name for it."""
    for row in (proc / str(pid) / "status").read_text(errors="replace").splitlines():
        if row.startswith("Uid:"):
            uid = int(row.split()[1])
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return str(uid)
    raise ValueError(f"no Uid line in {proc}/{pid}/status")


class ProcessResolver:
    """Maps a PID to its :class:`Job`. ``cgroup`` reads a PID's cgroup file (injectable for
    tests that fake cgroup paths); ``show_users`` off records no user names."""

    def __init__(self, show_users: bool = True, proc: Path = Path("/proc"),
                 cgroup: Callable[[int], str] | None = None) -> None:
        self.show_users = show_users
        self.proc = proc
        self._cgroup = cgroup or (lambda pid: read_cgroup(pid, proc))

    def _leader(self, sid: int) -> str | None:
        """The name of a session's leader; None where it has ended (before or while it is read: the process's own
        name stands for the session then, not "process gone" for a process that is running)."""
        try:
            return process_name(sid, self.proc)
        except (FileNotFoundError, ProcessLookupError):
            return None

    def resolve(self, pid: int) -> Job:
        try:
            user = clip(process_user(pid, self.proc)) if self.show_users else None
            own = process_name(pid, self.proc)
            name = clip(own)
            job = job_from_cgroup(self._cgroup(pid))
            if job is None:
                sid = session_of(pid, self.proc)
                leader = self._leader(sid) if sid > 0 else None
                job = Job("process", clip(f"{leader or own}@{sid or pid}"), name=clip(leader or own))
            return Job(job.kind, job.id, user, job.name or name)
        except PermissionError:
            return Job("unknown", "no-permission", name="unknown (no permission)")
        except (FileNotFoundError, ProcessLookupError):
            return Job("unknown", "process-gone", name="unknown (process gone)")
        except (OSError, ValueError, IndexError) as exc:
            log.debug("cannot resolve PID %d: %s", pid, exc)
            return Job("unknown", "unreadable", name="unknown (unreadable)")


@dataclass(frozen=True)
class Allocation:
    """A GPU (or a MIG instance or shared replica of it) the kubelet allocated to a pod's container."""

    namespace: str
    pod: str
    container: str
    device: str = ""  # the device id the kubelet names (a GPU UUID, a MIG-<uuid>, GPU-<uuid>::<replica>)


def with_pod_names(jobs: list[Job], allocations: Iterable[Allocation],
                   places: Mapping[str, frozenset[str]] | None = None) -> list[Job]:
    """The jobs of one GPU, its Kubernetes jobs named after the pods the GPU is allocated to.

    The kubelet's pod-resources API (v1) names no pod UID, so a pod is matched by device only: only
    where the GPU is allocated to exactly one pod and the processes on it belong to one pod (a GPU
    shared by pods, or used by a pod it is not allocated to, names none). ``container`` is set when
    one container of the pod holds the GPU.

    ``places`` (job key -> the MIG devices, by UUID, its processes run on; NVML's gpuInstanceId and
    computeInstanceId of each process) matches MIG devices instead of the whole GPU: a job is named after the
    one pod its MIG devices are allocated to, where no other pod's processes run on them (several pods on MIG
    devices of one GPU are each named)."""
    allocations = list(allocations)
    if places:
        return [_on_mig(job, allocations, places, jobs) if job.kind == "kubernetes" else job for job in jobs]
    pods = {(a.namespace, a.pod) for a in allocations}
    uids = {job.id for job in jobs if job.kind == "kubernetes"}
    if len(pods) != 1 or len(uids) != 1:
        return jobs
    return [_named(job, allocations) if job.kind == "kubernetes" else job for job in jobs]


def _on_mig(job: Job, allocations: list[Allocation], places: Mapping[str, frozenset[str]],
            jobs: list[Job]) -> Job:
    """A Kubernetes job on MIG devices, named after the one pod they are allocated to (else as it was)."""
    mine = places.get(job.key, frozenset())
    shared = any(other.kind == "kubernetes" and other.id != job.id and places.get(other.key, frozenset()) & mine
                 for other in jobs)
    held = [a for a in allocations if a.device in mine]
    if not mine or shared or len({(a.namespace, a.pod) for a in held}) != 1:
        return job
    return _named(job, held)


def _named(job: Job, allocations: list[Allocation]) -> Job:
    """The job named after the one pod of ``allocations``; its container where one container holds them all."""
    namespace, pod = allocations[0].namespace, allocations[0].pod
    containers = {a.container for a in allocations}
    container = containers.pop() if len(containers) == 1 else None
    return replace(job, name=clip(f"{namespace}/{pod}"), namespace=namespace, pod=pod, container=container)


class JobWatcher:
    """The jobs on each GPU of a snapshot; a PID is resolved once while it keeps running.

    ``pods`` (a :class:`gpuwear.jobs.kubelet.PodResources`' ``by_gpu``, None off Kubernetes) gives, when
    asked, the kubelet's allocations by GPU UUID, or None while it has no answer: pods' jobs are then named
    by UID only, as without it."""

    def __init__(self, resolve: Callable[[int], Job],
                 pods: Callable[[], Mapping[str, frozenset[Allocation]] | None] | None = None) -> None:
        self._resolve = resolve
        self._pods = pods
        self._cache: dict[int, Job] = {}

    def jobs(self, gpus: Iterable[tuple[str, Iterable[int] | Unseen]],
             instances: Mapping[str, Mapping[int, str]] | None = None,
             slices: Mapping[str, tuple[Mapping[str, int], int]] | None = None) -> dict[str, list[Job] | Unseen]:
        """``gpus``: (UUID, PIDs on it, or :class:`Unseen` where they could not be read) pairs; returns the
        distinct jobs per UUID (Unseen passed through). ``instances``: GPU UUID -> PID -> the MIG device (UUID)
        the process runs on, where NVML says (pods are then matched by MIG device). ``slices``: GPU UUID -> (MIG
        device -> its compute slices, the GPU's slices): each job there gets its ``share`` (:mod:`gpuwear.jobs.mig`)."""
        out: dict[str, list[Job] | Unseen] = {}
        seen: set[int] = set()
        allocated = None
        for uuid, pids in gpus:
            if isinstance(pids, Unseen):
                out[uuid] = pids
                continue
            found: dict[str, Job] = {}
            on = (instances or {}).get(uuid, {})
            places: dict[str, set[str]] = {}
            unplaced: set[str] = set()
            for pid in pids:
                seen.add(pid)
                job = self._cache.get(pid)
                if job is None:
                    job = self._cache[pid] = self._resolve(pid)
                found.setdefault(job.key, job)
                if pid in on:
                    places.setdefault(job.key, set()).add(on[pid])
                else:
                    unplaced.add(job.key)
            jobs = list(found.values())
            if self._pods is not None and any(job.kind == "kubernetes" for job in jobs):
                if allocated is None:
                    allocated = self._pods() or {}  # asked once per snapshot, and only with a pod on a GPU
                jobs = with_pod_names(jobs, allocated.get(uuid, frozenset()),
                                      {key: frozenset(devices) for key, devices in places.items()})
            if jobs and slices and uuid in slices and not unplaced:
                shares = slice_shares(places, *slices[uuid])
                if shares is not None and all(job.key in shares for job in jobs):
                    jobs = [replace(job, share=shares[job.key]) for job in jobs]
            out[uuid] = jobs
        self._cache = {pid: job for pid, job in self._cache.items() if pid in seen}
        return out


class SimulatedJobs:
    """Resolves the synthetic PIDs of simulated jobs; real PIDs go to ``real``."""

    def __init__(self, jobs: dict[int, str], real: Callable[[int], Job]) -> None:
        self._jobs = jobs
        self._real = real

    def resolve(self, pid: int) -> Job:
        name = self._jobs.get(pid)
        return Job("simulated", name, "simulated", name) if name else self._real(pid)
