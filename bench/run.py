#!/usr/bin/env python3
"""gpuwear benchmark: CPU, memory, scrape latency, import throughput and ledger writes, side by
side with nvitop-exporter and a bare NVML loop, all over the fake NVML library.

    python bench/run.py            # full run (about 8-10 minutes on 2 slow cores)
    python bench/run.py --quick    # 8 GPUs only, shorter windows (under about 2 minutes)

Prints one markdown table (and the details under it) and writes it to bench/results.md.
See bench/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gen  # noqa: E402
import spy  # noqa: E402
from common import free_port  # noqa: E402

PY = sys.executable
BIN = Path(PY).parent
LAUNCH = str(HERE / "launch.py")
BARE = str(HERE / "bare_nvml.py")
TOOLS = ("gpuwear", "nvitop-exporter", "bare")
MiB = 2**20
DEFAULT_PARTS = "cpu,tick,scrape,week,memgrowth,persist,import,rss"
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

SETTINGS: dict[str, dict[str, Any]] = {
    "full": {
        "gpus": (1, 8, 64), "warmup": 5, "window": 20, "rate": 1000,
        "scrape": (4, 200), "scrape_64": (4, 25), "scrape_seq": 50, "scrape_rerender": {8: 200, 64: 100},
        "week_gpus": 8, "week_speed": 20000, "week_warmup": 5, "week_window": 31,
        "import_rows": 500_000, "profile_rows": 100_000,
        "persist": {1: 1800, 8: 1800, 64: 360},
        "ticks": {1: 300, 8: 300, 64: 60},
        "memgrowth_days": 7,
    },
    "quick": {
        "gpus": (8,), "warmup": 3, "window": 8, "rate": 1000,
        "scrape": (4, 50), "scrape_64": None, "scrape_seq": 20, "scrape_rerender": {8: 50},
        "week_gpus": 8, "week_speed": 20000, "week_warmup": 2, "week_window": 8,
        "import_rows": 50_000, "profile_rows": 20_000,
        "persist": {8: 600},
        "ticks": {8: 150},
        "memgrowth_days": 0,
    },
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONUNBUFFERED"] = "1"
    return e


# -- processes ------------------------------------------------------------------------------------


def _on_cpu_seconds(pid: int) -> float:
    tasks = list(Path(f"/proc/{pid}/task").iterdir())
    return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9


class Proc:
    """A benchmarked process: CPU and RSS of it and its children, FakeNvmlLibrary.calls via SIGUSR1."""

    running: ClassVar[list[Proc]] = []

    def __init__(self, name: str, argv: list[str], workdir: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = workdir / f"{name}.log"
        self.calls_path = workdir / f"{name}.calls.jsonl"
        e = env()
        e["BENCH_CALLS_FILE"] = str(self.calls_path)
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=e,
                                      start_new_session=True)
        self.ps = psutil.Process(self.popen.pid)
        Proc.running.append(self)

    def _all(self) -> list[psutil.Process]:
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu(self) -> float:
        """CPU seconds of the process and its children so far: the sum of the scheduler's per-thread on-CPU time
        (/proc/PID/task/TID/schedstat, nanoseconds) where the kernel keeps it, because user+sys times count
        in 10 ms clock ticks, as coarse as a 0.25 % share over a 4 s window. Threads that ended are not in it:
        no window measured here starts or ends threads (no scrapes, no stalls)."""
        total = 0.0
        for i, p in enumerate(self._all()):
            try:
                total += _on_cpu_seconds(p.pid)
            except (OSError, ValueError, IndexError):
                try:
                    t = p.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += t.user + t.system + (t.children_user + t.children_system if i == 0 else 0.0)
        return total

    def rss(self) -> int:
        total = 0
        for p in self._all():
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def threads(self) -> int:
        try:
            return int(self.ps.num_threads())
        except psutil.NoSuchProcess:
            return 0

    def alive(self) -> bool:
        return self.popen.poll() is None

    def calls(self) -> dict[str, int] | None:
        """Ask the process for FakeNvmlLibrary.calls (summed); None when it does not answer."""
        before = self.calls_path.read_text().count("\n") if self.calls_path.exists() else 0
        try:
            os.kill(self.popen.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.calls_path.exists():
                lines = self.calls_path.read_text().splitlines()
                if len(lines) > before:
                    return json.loads(lines[-1])["calls"]  # type: ignore[no-any-return]
            time.sleep(0.05)
        return None

    def log_tail(self, n: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        if self in Proc.running:
            Proc.running.remove(self)


def http_get(port: int, path: str = "/metrics", timeout: float = 10.0,
             accept: str = PROMETHEUS_ACCEPT) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": accept})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def wait_ready(proc: Proc, port: int | None, ready_file: Path | None, timeout: float = 180.0) -> float:
    """Seconds until the process serves /metrics (or created its ready file)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        if ready_file is not None and ready_file.exists():
            return time.monotonic() - start
        if port is not None:
            try:
                if http_get(port, timeout=2)[0] == 200:
                    return time.monotonic() - start
            except OSError:
                pass
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not ready after {timeout:.0f}s:\n{proc.log_tail()}")


# -- commands -------------------------------------------------------------------------------------


def command(tool: str, scenario: Path, port: int, state: Path, config: Path, ready: Path,
            speed: float | None = None) -> tuple[list[str], str]:
    """(argv actually run, the equivalent documented command)."""
    if tool == "gpuwear":
        args = ["run", "--simulate", str(scenario), "--listen", f"127.0.0.1:{port}", "--state-dir", str(state),
                "--config", str(config)] + (["--speed", f"{speed:g}"] if speed else [])
        return [PY, LAUNCH, "gpuwear", *args], "python -m gpuwear " + " ".join(args)
    if tool == "nvitop-exporter":
        exe = shutil.which("nvitop-exporter", path=str(BIN)) or str(BIN / "nvitop-exporter")
        args = ["--scenario", str(scenario), exe, "--bind-address", "127.0.0.1", "--port", str(port),
                "--interval", "1.0"]
        return [PY, LAUNCH, "fakenvml", *args], "python -m gpuwear.sim.fakenvml " + " ".join(args)
    args = ["--scenario", str(scenario), BARE, "--interval", "1.0", "--ready-file", str(ready)]
    return [PY, LAUNCH, "fakenvml", *args], "python -m gpuwear.sim.fakenvml " + " ".join(args)


# -- measurements ---------------------------------------------------------------------------------


@dataclass
class Window:
    tool: str
    gpus: int
    cpu_per_s: float = float("nan")
    rss_start: int = 0
    rss_end: int = 0
    rss_max: int = 0
    threads: int = 0
    ready_s: float = 0.0
    calls_per_s: float | None = None
    calls_per_s_by_fn: dict[str, float] = field(default_factory=dict)
    profile: spy.Profile | None = None
    profile_path: Path | None = None
    command: str = ""
    error: str | None = None
    scrape: dict[str, Any] | None = None
    scrape_seq: dict[str, Any] | None = None
    scrape_profile: spy.Profile | None = None
    scrape_seq_text: dict[str, Any] | None = None
    metrics_bytes: int = 0
    metrics_series: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def own_cpu_per_s(self) -> float:
        """CPU per second without the share spent in the fake library and simulation (py-spy)."""
        if self.profile is None or not self.profile.total:
            return float("nan")
        return self.cpu_per_s * (1.0 - self.profile.fake_share)


def start_pyspy(pid: int, seconds: int, rate: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy on a running process: only the thread holding the GIL is sampled (``--gil``), so the
    samples measure Python execution time (py-spy's idle detection counts threads blocked in
    lock waits as busy); ``--nonblocking``: the target is never paused."""
    exe = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if exe is None:
        return None
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate),
                             "--nonblocking", "--gil", "--format", "raw", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop_pyspy(proc: subprocess.Popen[bytes] | None, interrupt: bool = False) -> str:
    """Wait for py-spy to write its output (SIGINT first when ``interrupt``); its stderr."""
    if proc is None:
        return "py-spy not installed"
    if interrupt and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err.decode(errors="replace")


def scrape_latency(port: int, threads: int, per_thread: int, accept: str = PROMETHEUS_ACCEPT) -> dict[str, Any]:
    """``threads`` clients each scraping /metrics ``per_thread`` times back to back (a new
    connection per scrape, the Accept header Prometheus sends); client-side latencies."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def client() -> None:
        mine = []
        barrier.wait()
        for _ in range(per_thread):
            t = time.perf_counter()
            try:
                status, _ = http_get(port, accept=accept)
                if status != 200:
                    errors.append(f"HTTP {status}")
            except OSError as exc:
                errors.append(str(exc))
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    latencies.sort()
    q = statistics.quantiles(latencies, n=100, method="inclusive") if len(latencies) > 1 else latencies * 99
    return {"n": len(latencies), "threads": threads, "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3,
            "max_ms": latencies[-1] * 1e3, "mean_ms": statistics.fmean(latencies) * 1e3,
            "per_s": len(latencies) / wall, "errors": len(errors), "first_error": errors[0] if errors else None}


def measure_window(tool: str, n: int, scenario: Path, work: Path, s: dict[str, Any], config: Path) -> Window:
    res = Window(tool, n)
    port = free_port()
    tag = f"{tool}-{n}gpu"
    ready = work / f"{tag}.ready"
    argv, res.command = command(tool, scenario, port, work / f"{tag}-state", config, ready)
    log(f"{tag}: starting")
    proc = Proc(tag, argv, work)
    try:
        res.ready_s = wait_ready(proc, None if tool == "bare" else port, ready if tool == "bare" else None)
        time.sleep(s["warmup"])
        calls0 = proc.calls()
        res.profile_path = work / f"{tag}.pyspy.txt"
        spy_proc = start_pyspy(proc.popen.pid, s["window"], s["rate"], res.profile_path)
        t0, c0 = time.monotonic(), proc.cpu()
        res.rss_start = res.rss_max = proc.rss()
        end = t0 + s["window"]
        while (now := time.monotonic()) < end:
            time.sleep(min(1.0, end - now))
            if not proc.alive():
                raise RuntimeError(f"{tag} exited during the window:\n{proc.log_tail()}")
            res.rss_max = max(res.rss_max, proc.rss())
        c1, t1 = proc.cpu(), time.monotonic()
        res.rss_end = proc.rss()
        res.rss_max = max(res.rss_max, res.rss_end)
        res.threads = proc.threads()
        calls1 = proc.calls()
        res.cpu_per_s = (c1 - c0) / (t1 - t0)
        if calls0 is not None and calls1 is not None:
            span = t1 - t0
            res.calls_per_s_by_fn = {k: (v - calls0.get(k, 0)) / span for k, v in calls1.items()
                                     if v - calls0.get(k, 0) > 0}
            res.calls_per_s = sum(res.calls_per_s_by_fn.values())
        if spy_proc is not None:
            err = stop_pyspy(spy_proc)
            res.profile = spy.read(res.profile_path)
            if not res.profile.total:
                res.notes.append(f"py-spy recorded nothing: {err.strip()[-300:]}")
        if tool != "bare":
            _, body = http_get(port)
            res.metrics_bytes = len(body)
            res.metrics_series = sum(1 for line in body.decode(errors="replace").splitlines()
                                     if line and not line.startswith("#"))
            plan = s["scrape"] if n == 8 else (s["scrape_64"] if n == 64 else None)
            if plan:
                log(f"{tag}: scrape latency, {plan[0]} threads x {plan[1]}")
                res.scrape_seq = scrape_latency(port, 1, s["scrape_seq"])
                res.scrape_seq_text = scrape_latency(port, 1, s["scrape_seq"], accept="text/plain;version=0.0.4")
                scrape_prof = work / f"{tag}-scrape.pyspy.txt" if tool == "gpuwear" else None
                sp = start_pyspy(proc.popen.pid, 600, s["rate"], scrape_prof) if scrape_prof else None
                res.scrape = scrape_latency(port, *plan)
                if scrape_prof is not None:
                    stop_pyspy(sp, interrupt=True)
                    res.scrape_profile = spy.read(scrape_prof)
        if tool == "nvitop-exporter":
            missing = sorted(set(re.findall(r"FunctionNotFound error occurred while calling nvmlQuery\(<function (\w+)",
                                            proc.log_path.read_text(errors="replace"))))
            if missing:
                res.notes.append("NVML functions nvitop-exporter calls that the fake does not implement "
                                 "(FunctionNotFound, series NaN): " + ", ".join(missing))
        log(f"{tag}: {res.cpu_per_s * 100:.2f} % of a core, RSS {res.rss_end / MiB:.1f} MiB"
            + (f", fake share {res.profile.fake_share * 100:.0f} %" if res.profile and res.profile.total else ""))
    except Exception as exc:  # one tool failing must not end the benchmark
        res.error = f"{type(exc).__name__}: {exc}"
        log(f"{tag}: FAILED: {res.error}")
    finally:
        proc.stop()
    return res


def metric_max(body: bytes, name: str) -> float | None:
    values = [float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$",
                                                      body.decode(errors="replace"), re.M)]
    return max(values) if values else None


def ledger_bytes(state: Path) -> dict[str, int]:
    """db and WAL file sizes, and the logical size (page_count x page_size seen by a reader: what
    the database holds once the WAL is checkpointed)."""
    from persist_bench import logical_size

    base = state / "simulated" / "ledger.sqlite"
    out = {}
    for suffix in ("", "-wal"):
        p = Path(str(base) + suffix)
        out[suffix or "db"] = p.stat().st_size if p.exists() else 0
    out["logical"] = logical_size(base)
    return out


def week_run(scenario: Path, work: Path, s: dict[str, Any], config: Path) -> dict[str, Any]:
    """gpuwear at --speed high enough for a simulated week in the window: RSS flatness, ledger growth."""
    port = free_port()
    state = work / "week-state"
    argv, cmd = command("gpuwear", scenario, port, state, config, work / "week.ready", speed=s["week_speed"])
    out: dict[str, Any] = {"command": cmd, "speed": s["week_speed"], "gpus": s["week_gpus"]}
    log(f"week: gpuwear --speed {s['week_speed']}, {s['week_window']} s window")
    proc = Proc("gpuwear-week", argv, work)
    try:
        wait_ready(proc, port, None)
        time.sleep(s["week_warmup"])
        sim0 = metric_max(http_get(port)[1], "gpuwear_sample_timestamp_seconds")
        led0, rss0, t0, c0 = ledger_bytes(state), proc.rss(), time.monotonic(), proc.cpu()
        samples = [(0.0, rss0)]
        end = t0 + s["week_window"]
        while (now := time.monotonic()) < end:
            time.sleep(min(1.0, end - now))
            if not proc.alive():
                raise RuntimeError(f"gpuwear exited during the week run:\n{proc.log_tail()}")
            samples.append((time.monotonic() - t0, proc.rss()))
        c1, t1 = proc.cpu(), time.monotonic()
        sim1 = metric_max(http_get(port)[1], "gpuwear_sample_timestamp_seconds")
        led1, rss1 = ledger_bytes(state), proc.rss()
        sim_days = (sim1 - sim0) / 86400 if sim0 and sim1 else s["week_speed"] * (t1 - t0) / 86400
        half = [r for t, r in samples if t >= (t1 - t0) / 2]
        mid = min(samples, key=lambda tr: abs(tr[0] - (t1 - t0) / 2))
        out.update({
            "sim_days": sim_days, "rss_start": rss0, "rss_end": rss1, "rss_max": max(r for _, r in samples),
            "rss_min": min(r for _, r in samples), "rss_second_half_spread": (max(half) - min(half)) if half else 0,
            "rss_mid": mid[1], "rss_second_half_growth": rss1 - mid[1],
            "cpu_per_s": (c1 - c0) / (t1 - t0), "ledger_start": led0, "ledger_end": led1,
            "ledger_growth_per_day_per_gpu": (led1["db"] + led1["-wal"] - led0["db"] - led0["-wal"]) / sim_days
            / s["week_gpus"],
            "logical_growth_per_day_per_gpu": (led1["logical"] - led0["logical"]) / sim_days / s["week_gpus"],
            "rss_samples_mib": [round(r / MiB, 2) for _, r in samples],
        })
        log(f"week: {sim_days:.2f} simulated days, RSS {rss0 / MiB:.1f} -> {rss1 / MiB:.1f} MiB")
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        log(f"week: FAILED: {out['error']}")
    finally:
        proc.stop()
    return out


def persist_runs(scenarios: dict[int, Path], work: Path, s: dict[str, Any]) -> dict[int, dict[str, Any]]:
    out = {}
    for n, ticks in s["persist"].items():
        log(f"persist: {n} GPUs, {ticks} ticks in-process")
        state = work / f"persist-{n}"
        r = subprocess.run([PY, str(HERE / "persist_bench.py"), str(scenarios[n]), str(state), str(ticks)],
                           capture_output=True, text=True, cwd=ROOT, env=env())
        if r.returncode != 0:
            out[n] = {"error": r.stderr[-2000:]}
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        p = d["persists"]
        walls = sorted(x["wall"] for x in p)
        writes = [x["write_bytes"] for x in p]
        grown = d["sizes_end"]["logical"] - d["sizes_start"]["logical"]
        d.update({
            "persist_p50_ms": statistics.median(walls) * 1e3, "persist_max_ms": walls[-1] * 1e3,
            "write_per_persist": statistics.fmean(writes),
            "write_per_day_per_gpu": statistics.fmean(writes) * 86400 / 60 / n,
            "growth_per_day_per_gpu_extrapolated": grown / d["simulated_seconds"] * 86400 / n,
        })
        out[n] = d
    return out


def tick_runs(scenarios: dict[int, Path], work: Path, s: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """In-process CPU per tick, bare calls and gpuwear's tick interleaved in one process: gpuwear as configured
    (reads on its reader thread, with the NVML deadline) and with sequential reads (no deadline). Three rounds of
    each; the round with the median gpuwear / bare ratio is kept."""
    out: dict[int, dict[str, Any]] = {}
    for n, ticks in s["ticks"].items():
        log(f"tick: {n} GPUs, {ticks} ticks in-process, 3 rounds")
        out[n] = {}
        runs: dict[str, list[dict[str, Any]]] = {"gpuwear": [], "gpuwear_sequential": []}
        for round_ in range(3):
            for key, runs_ in runs.items():
                argv = [PY, str(HERE / "tick_bench.py"), "interleaved", str(scenarios[n]), str(ticks),
                        str(work / f"tick-{key}-{n}-{round_}")] + (["0"] if key == "gpuwear_sequential" else [])
                r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env())
                runs_.append(json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {
                    "error": r.stderr[-2000:]})
        for key, runs_ in runs.items():
            failed = [x for x in runs_ if "error" in x]
            out[n][key] = failed[0] if failed else sorted(runs_, key=lambda x: x["tick"] / x["bare"])[1]
        r = subprocess.run([PY, str(HERE / "tick_bench.py"), "events", str(scenarios[n]), "3"], capture_output=True,
                           text=True, cwd=ROOT, env=env())
        out[n]["fake_event_wait"] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {
            "error": r.stderr[-2000:]}
    return out


def mem_growth(scenario: Path, work: Path, days: float) -> dict[str, Any]:
    log(f"memgrowth: {days:g} simulated days in-process (live objects, tracemalloc over the last day)")
    r = subprocess.run([PY, str(HERE / "mem_growth.py"), str(scenario), str(work / "memgrowth-state"), "--days",
                        f"{days:g}"], capture_output=True, text=True, cwd=ROOT, env=env())
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def rss_imports() -> dict[str, Any]:
    out = {}
    for program in ("gpuwear", "nvitop-exporter"):
        r = subprocess.run([PY, str(HERE / "rss_imports.py"), program], capture_output=True, text=True, cwd=ROOT,
                           env=env())
        out[program] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"error": r.stderr}
    return out


def scrape_runs(s: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """bench/scrape_bench.py per GPU count: a simulated week of history, then scrapes each after a new tick (what
    Prometheus sees at a 15 s interval over a 1 s tick): CPU, series per GPU, bytes, HTTP latency."""
    out: dict[int, dict[str, Any]] = {}
    for n, rounds in s["scrape_rerender"].items():
        log(f"scrape: {n} GPUs, a simulated week, then {rounds} re-rendering scrapes")
        r = subprocess.run([PY, str(HERE / "scrape_bench.py"), str(n), "--rounds", str(rounds)], capture_output=True,
                           text=True, timeout=1800, check=False)
        out[n] = json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-2000:]}
    return out


def import_runs(work: Path, s: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rows, prof_rows = s["import_rows"], s["profile_rows"]
    log(f"import: generating {rows} rows of nvidia-smi CSV (8 GPUs interleaved)")
    big = gen.smi_csv(rows, 8, work / f"smi-{rows}.csv")
    small = gen.smi_csv(prof_rows, 8, work / f"smi-{prof_rows}.csv")
    out.update({"rows": rows, "file_bytes": big.stat().st_size, "profile_rows": prof_rows})
    cmd = ["-m", "gpuwear", "import", "nvidia-smi", str(big), "--state-dir", str(work / "import-state"),
           "--timezone", "UTC"]
    out["command"] = "python " + " ".join(cmd)
    log("import: end to end (CLI)")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([PY, *cmd], capture_output=True, text=True, cwd=ROOT, env=env())
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    imported = sum(int(x) for x in re.findall(r": (\d+) row\(s\) imported", r.stdout))
    out["e2e"] = {"wall": wall, "cpu": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                  "imported": imported, "rc": r.returncode, "samples_per_s": imported / wall if wall else 0.0,
                  "stderr": r.stderr[-1000:]}
    out["modes"] = {}
    for mode in ("floats", "rows", "columns", "parse", "csv"):  # on the same file as the CLI: ratios in one run
        log(f"import: {mode}, {rows} rows")
        r = subprocess.run([PY, str(HERE / "import_bench.py"), mode, str(big)], capture_output=True, text=True,
                           cwd=ROOT, env=env())
        out["modes"][mode] = (json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0
                              else {"error": r.stderr[-1000:]})
    exe = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if exe:
        log(f"import: py-spy profile of the CLI on {prof_rows} rows")
        prof_path = work / "import.pyspy.txt"
        subprocess.run([exe, "record", "--rate", "200", "--nonblocking", "--format", "raw", "--output", str(prof_path),
                        "--", PY, "-m", "gpuwear", "import", "nvidia-smi", str(small), "--state-dir",
                        str(work / "import-prof-state"), "--timezone", "UTC"],
                       capture_output=True, cwd=ROOT, env=env())
        out["profile"] = spy.read(prof_path)
        out["profile_path"] = prof_path
    return out


# -- report ---------------------------------------------------------------------------------------


def pct(x: float) -> str:
    return "n/a" if x != x else f"{x * 100:.2f} %"


def ratio(a: float, b: float) -> float:
    return a / b if b and a == a and b == b else float("nan")


def fmt_ratio(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"


def met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def mib(x: float) -> str:
    return f"{x / MiB:.1f} MiB"


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "daemon"], capture_output=True, text=True,
                           cwd=ROOT).stdout.strip()
    versions = {}
    for pkg in ("nvitop-exporter", "nvitop", "nvidia-ml-py", "prometheus_client", "py-spy"):
        try:
            from importlib.metadata import version
            versions[pkg] = version(pkg)
        except Exception:
            versions[pkg] = "not installed"
    return {
        "cpu": f"{model}, {os.cpu_count()} logical cores",
        "python": f"{platform.python_implementation()} {platform.python_version()} ({PY})",
        "os": platform.platform(),
        "gpuwear": f"commit {commit}" + (" + uncommitted changes under daemon/" if dirty else ""),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
    }


Row = tuple[str, str, str, str, str, str, str]  # a row of the report's table


def _cell(x: Window | None, f: Any) -> str:
    """A window's figure for the table, or why it has none."""
    if x is None:
        return "not run"
    if x.error:
        return "failed (see below)"
    return str(f(x))


def _cpu_rows(s: dict[str, Any], windows: dict[tuple[str, int], Window]) -> list[Row]:
    """CPU per wall second against nvitop-exporter and bare reads."""
    rows: list[Row] = []
    w = windows.get
    for n in s["gpus"]:
        g, v, b = w(("gpuwear", n)), w(("nvitop-exporter", n)), w(("bare", n))
        for label, get in ((f"CPU per wall second (share of one core), {n} GPU{'s' if n > 1 else ''}",
                            lambda x: x.cpu_per_s),
                           (f"↳ same, net of the fake NVML + simulation (py-spy est.), {n} GPU{'s' if n > 1 else ''}",
                            lambda x: x.own_cpu_per_s)):
            gv = get(g) if g and not g.error else float("nan")
            vv = get(v) if v and not v.error else float("nan")
            bv = get(b) if b and not b.error else float("nan")
            r1, r2 = ratio(gv, vv), ratio(gv, bv)
            rows.append((label, _cell(g, lambda x, get=get: pct(get(x))), _cell(v, lambda x, get=get: pct(get(x))),
                         _cell(b, lambda x, get=get: pct(get(x))),
                         f"gw/nvx {fmt_ratio(r1)} · gw/bare {fmt_ratio(r2)}", "≤ 0.5 · ≤ 1.25",
                         f"{met(None if r1 != r1 else r1 <= 0.5)} · {met(None if r2 != r2 else r2 <= 1.25)}"))
    g8 = w(("gpuwear", 8))
    if g8 is not None and not g8.error:
        rows.append(("CPU share of one core at 1 Hz, 8 GPUs", pct(g8.cpu_per_s), "", "", "", "< 0.5 %",
                     met(g8.cpu_per_s < 0.005)))
        rows.append(("↳ same, net of the fake (py-spy est.)", pct(g8.own_cpu_per_s), "", "", "", "< 0.5 %",
                     met(None if g8.own_cpu_per_s != g8.own_cpu_per_s else g8.own_cpu_per_s < 0.005)))
    return rows


def _tick_rows(ticks: dict[int, dict[str, Any]] | None) -> list[Row]:
    """CPU per tick in process, and per rendering scrape."""
    rows: list[Row] = []
    for n, d in (ticks or {}).items():
        g, q = d.get("gpuwear", {}), d.get("gpuwear_sequential", {})
        if "tick" not in g or "tick" not in q:
            rows.append((f"CPU per tick in-process, {n} GPUs", "failed (see below)", "", "", "", "≤ 1.25", "n/a"))
            continue
        r, rq = g["tick"] / g["bare"], q["tick"] / q["bare"]
        rows.append((f"↳ CPU per tick in-process, bare calls and gpuwear's tick interleaved, {n} "
                     f"GPU{'s' if n > 1 else ''} (gpuwear: Sampler.tick + jobs + WearTracker.observe)",
                     f"{g['tick'] * 1e3:.2f} ms ({g['tick'] * 100:.2f} % at 1 Hz); sequential reads "
                     f"{q['tick'] * 1e3:.2f} ms", "n/a", f"{g['bare'] * 1e3:.2f} ms; {q['bare'] * 1e3:.2f} ms",
                     f"gw/bare {r:.2f} (sequential {rq:.2f})", "≤ 1.25", met(r <= 1.25)))
    for n, d in (ticks or {}).items():
        g = d.get("gpuwear", {})
        if "render" in g:
            total = g["views"] + g["render"]
            rows.append((f"CPU of a scrape that renders (the first after a tick; later ones get the cached body), {n} "
                         f"GPU{'s' if n > 1 else ''}: wear views + text exposition",
                         f"{total * 1e3:.1f} ms ({g['views'] * 1e3:.1f} + {g['render'] * 1e3:.1f}); "
                         f"{total / 15 * 100:.3f} % of a core at a 15 s scrape interval", "", "", "", "(report)", ""))
    return rows


def _scrape_rows(scrapes: dict[int, dict[str, Any]] | None) -> list[Row]:
    """The re-rendering scrapes (bench/scrape_bench.py)."""
    rows: list[Row] = []
    for n, d in (scrapes or {}).items():
        if "error" in d:
            rows.append((f"Re-rendering scrape, {n} GPUs", "failed (see below)", "", "", "", "", "n/a"))
            continue
        c, series = d["cpu_ms"], d["series"]
        rows.append((f"Series per GPU after a simulated week, {n} GPUs, default metrics (`metrics.detail: false`; "
                     f"+{series['daemon']} for the daemon)", f"{series['per_gpu']:.1f}", "", "", "", "≤ 50",
                     met(series["per_gpu"] <= 50)))
        rows.append((f"CPU of a re-rendering scrape (a new tick before each, as Prometheus sees it), {n} GPUs: wear "
                     "views + OpenMetrics text + gzip (bench/scrape_bench.py)",
                     f"{c['total']:.2f} ms ({c['views']:.2f} + {c['text']:.2f} + {c['gzip']:.2f})", "", "", "",
                     "≤ 2 ms" if n <= 8 else "≤ 10 ms", met(c["total"] <= (2 if n <= 8 else 10))))
        rows.append((f"↳ the same against the calibration workload timed after each scrape (its CPU: "
                     f"{d['calibration_ms']:.2f} ms; compares runs on days the VM runs at other speeds)",
                     f"{d['per_calibration']:.2f} x", "", "", "", "(report)", ""))
        rows.append((f"↳ bytes per scrape, {n} GPUs, gzip'd (plain)",
                     f"{d['bytes']['gzip']:,} ({d['bytes']['plain']:,})", "", "", "", "(report)", ""))
        rows.append((f"↳ latency of a re-rendering scrape over HTTP (new connection, Prometheus' headers), {n} GPUs",
                     f"p50 {d['http_ms']['p50']:.1f} ms / p99 {d['http_ms']['p99']:.1f} ms", "", "", "", "(report)",
                     ""))
    return rows


def _event_rows(ticks: dict[int, dict[str, Any]] | None) -> list[Row]:
    """The XID listener's wait over the fake."""
    rows: list[Row] = []
    for n, d in (ticks or {}).items():
        ev = d.get("fake_event_wait", {})
        if "cpu_per_s" in ev:
            rows.append((f"↳ of which the XID listener's nvmlEventSetWait over the fake (gpuwear and bare have one, "
                         f"nvitop-exporter not), {n} GPU{'s' if n > 1 else ''}", pct(ev["cpu_per_s"]), "0",
                         pct(ev["cpu_per_s"]), "", "(fake artefact)", ""))
    return rows


def _calls_and_rss_rows(s: dict[str, Any], windows: dict[tuple[str, int], Window]) -> list[Row]:
    """NVML calls per second and RSS after start."""
    rows: list[Row] = []
    w = windows.get
    for n in s["gpus"]:
        g, v, b = w(("gpuwear", n)), w(("nvitop-exporter", n)), w(("bare", n))
        rows.append((f"NVML calls per second (FakeNvmlLibrary.calls), {n} GPU{'s' if n > 1 else ''}",
                     _cell(g, lambda x: f"{x.calls_per_s:.0f}" if x.calls_per_s is not None else "n/a"),
                     _cell(v, lambda x: f"{x.calls_per_s:.0f}" if x.calls_per_s is not None else "n/a"),
                     _cell(b, lambda x: f"{x.calls_per_s:.0f}" if x.calls_per_s is not None else "n/a"), "", "", ""))
    for n in s["gpus"]:
        g, v, b = w(("gpuwear", n)), w(("nvitop-exporter", n)), w(("bare", n))
        ok = None
        r = float("nan")
        if g and v and not g.error and not v.error:
            r = g.rss_end / v.rss_end
            ok = g.rss_end < 60e6 and g.rss_end <= v.rss_end
        rows.append((f"RSS after start ({s['warmup'] + s['window']} s), {n} GPU{'s' if n > 1 else ''}",
                     _cell(g, lambda x: mib(x.rss_end)), _cell(v, lambda x: mib(x.rss_end)),
                     _cell(b, lambda x: mib(x.rss_end)), f"gw/nvx {fmt_ratio(r)}", "< 60 MB and ≤ nvitop-exporter",
                     met(ok)))
    return rows


def _week_rows(week: dict[str, Any] | None, windows: dict[tuple[str, int], Window]) -> list[Row]:
    """RSS over a simulated week."""
    rows: list[Row] = []
    w = windows.get
    if week:
        if "error" in week:
            rows.append(("RSS over a simulated week", "failed (see below)", "", "", "", "flat, < 60 MiB", "n/a"))
        else:
            growth = week["rss_end"] - week["rss_start"]
            late = week["rss_second_half_growth"]
            flat = late < 0.01 * week["rss_start"]  # no trend once warmed up: < 1 % over the last half
            v8 = w(("nvitop-exporter", week["gpus"]))
            rows.append((f"RSS start → after {week['sim_days']:.1f} simulated days ({week['gpus']} GPUs, "
                         f"--speed {week['speed']})",
                         f"{mib(week['rss_start'])} → {mib(week['rss_end'])} (max {mib(week['rss_max'])}; "
                         f"{growth / MiB:+.1f} MiB in all, {late / MiB:+.2f} MiB over the last "
                         f"{week['sim_days'] / 2:.1f} days)",
                         _cell(v8, lambda x: f"{mib(x.rss_end)} (no simulated time)") if v8 else "", "",
                         "", "flat (< +1 % over the second half), < 60 MB",
                         met(flat and week["rss_max"] < 60e6)))
    return rows


def _latency_rows(windows: dict[tuple[str, int], Window]) -> list[Row]:
    """/metrics latency under concurrent scrapers."""
    rows: list[Row] = []
    w = windows.get
    for n in (8, 64):
        g, v = w(("gpuwear", n)), w(("nvitop-exporter", n))
        if g is None or (g.scrape is None and not g.error):
            continue

        def sc(x: Window) -> str:
            if x.scrape is None:
                return "n/a"
            return (f"p50 {x.scrape['p50_ms']:.1f} ms / p99 {x.scrape['p99_ms']:.1f} ms"
                    + (f" ({x.scrape['errors']} errors)" if x.scrape["errors"] else ""))

        r = float("nan")
        if g.scrape and v and v.scrape:
            r = g.scrape["p99_ms"] / v.scrape["p99_ms"]
        plan = g.scrape["threads"] if g.scrape else 0
        per = (g.scrape["n"] // plan) if g.scrape and plan else 0
        rows.append((f"/metrics latency, {plan} threads × {per} scrapes back to back, {n} GPUs (most served from the "
                     "per-tick cache: see the re-rendering scrape rows)",
                     _cell(g, sc), _cell(v, sc) if v else "not run", "", f"p99 gw/nvx {fmt_ratio(r)}",
                     "p99 < 10 ms" if n == 8 else "(info)",
                     met(g.scrape["p99_ms"] < 10) if (g.scrape and n == 8) else ""))
    return rows


def _import_rows(imp: dict[str, Any] | None) -> list[Row]:
    """Import throughput against its floor."""
    rows: list[Row] = []
    if imp:
        e, f = imp["e2e"], imp["modes"].get("floats", {})
        floor = f.get("rows_per_s", float("nan"))
        rows.append(("↳ floor: stdlib `csv.reader` plus `float()` of the numeric columns (reads, no validation, no "
                     "wear), same file", "", "", f"{floor:,.0f} rows/s" if floor == floor else "failed", "", "", ""))
        ratio_e2e = ratio(e["samples_per_s"], floor) if e["rc"] == 0 else float("nan")
        rows.append((f"`gpuwear import nvidia-smi`, end to end (CLI: start, imports, {imp['rows']:,} rows of 8 GPUs, "
                     "ledger write)", f"{e['samples_per_s']:,.0f} rows/s ({e['wall']:.1f} s)" if e["rc"] == 0
                     else "failed", "", "", f"/floor {fmt_ratio(ratio_e2e)}", "≥ 1.5 × floor",
                     met(ratio_e2e >= 1.5) if ratio_e2e == ratio_e2e else "n/a"))
        for mode, label in (("columns", "↳ in process, columnar path (`import_file`)"),
                            ("rows", "↳ in process, row path (`import_rows`, the reference)"),
                            ("parse", "↳ row parser alone (`read_telemetry_csv` iteration)")):
            d = imp["modes"].get(mode, {})
            x = ratio(d.get("rows_per_s", float("nan")), floor)
            rows.append((label, f"{d['rows_per_s']:,.0f} rows/s" if "rows_per_s" in d else "failed", "", "",
                         f"/floor {fmt_ratio(x)}", "(info)", ""))
    return rows


def _persist_rows(persist: dict[int, dict[str, Any]] | None, week: dict[str, Any] | None) -> list[Row]:
    """Saves, ledger writes and in-process memory over days."""
    rows: list[Row] = []
    for n, d in (persist or {}).items():
        live = d.get("live") or []
        if len(live) >= 3:
            a, b = live[1], live[-1]  # from the second save on: the first minute still warms up
            per_tick = (b[1] - a[1]) / (b[0] - a[0])
            rows.append((f"↳ at 1× cadence, {n} GPU{'s' if n > 1 else ''}: live Python objects and RSS from tick "
                         f"{a[0]} to {b[0]}", f"{a[1]:,} → {b[1]:,} objects ({per_tick:+.2f} per tick); RSS "
                         f"{mib(a[2])} → {mib(b[2])}", "", "", "", "no growth per tick",
                         met(abs(b[1] - a[1]) < 0.01 * a[1])))
    if persist:
        for n, d in persist.items():
            if "error" in d:
                rows.append((f"Daemon.persist(), {n} GPUs", "failed (see below)", "", "", "", "(report)", ""))
                continue
            rows.append((f"Daemon.persist() wall time, {n} GPU{'s' if n > 1 else ''} (p50 / max of "
                         f"{len(d['persists'])})", f"{d['persist_p50_ms']:.1f} / {d['persist_max_ms']:.1f} ms",
                         "", "", "", "(report)", ""))
        for n, d in persist.items():
            if "error" in d:
                continue
            rows.append((f"Ledger bytes written per day per GPU at the 60 s persist (write() volume), {n} GPU"
                         f"{'s' if n > 1 else ''}", f"{d['write_per_day_per_gpu'] / MiB:.2f} MiB/day "
                         f"({d['write_per_persist'] / 1024:.1f} KiB per save)", "", "", "", "(report)", ""))
    mg = (week or {}).get("memgrowth")
    if mg and "error" not in mg and len(mg["per_day"]) >= 2:
        d0, d1 = mg["per_day"][0], mg["per_day"][-1]
        traced = sum(g["size_diff"] for g in mg["growth"])
        objects_flat = (d1["objects"] - d0["objects"]) < 0.01 * d0["objects"]
        by_day = ", ".join(f"{x['rss'] / MiB:.1f}" for x in mg["per_day"])
        rows.append((f"↳ in-process, {mg['gpus']} GPUs: live Python objects and RSS, day 1 → day {d1['day']}; heap "
                     "growth over the last day (tracemalloc)",
                     f"{d0['objects']:,} → {d1['objects']:,} objects; RSS {mib(d0['rss'])} → {mib(d1['rss'])} "
                     f"(day by day: {by_day}); "
                     f"{traced / 1024:+.1f} KiB last day", "", "", "", "no growth once warmed up", met(objects_flat)))
    elif mg and "error" in mg:
        rows.append(("↳ in-process heap growth over simulated days", "failed (see below)", "", "", "", "", "n/a"))
    if week and "error" not in week:
        rows.append((f"Ledger file growth per simulated day per GPU (db + WAL, week run, {week['gpus']} GPUs)",
                     f"{week['ledger_growth_per_day_per_gpu'] / 1024:.1f} KiB/day (content once checkpointed: "
                     f"{week['logical_growth_per_day_per_gpu'] / 1024:.1f} KiB/day)", "", "", "", "(report)", ""))
    return rows


def build_report(args: argparse.Namespace, s: dict[str, Any], windows: dict[tuple[str, int], Window],
                 ticks: dict[int, dict[str, Any]] | None, week: dict[str, Any] | None,
                 persist: dict[int, dict[str, Any]] | None,
                 imp: dict[str, Any] | None, rss: dict[str, Any] | None, info: dict[str, str],
                 load: tuple[str, str], elapsed: float, scrapes: dict[int, dict[str, Any]] | None = None) -> str:
    """The report: the table, its rows gathered part by part, then the details and the per-part sections."""
    rows = [*_cpu_rows(s, windows), *_tick_rows(ticks), *_scrape_rows(scrapes), *_event_rows(ticks),
            *_calls_and_rss_rows(s, windows), *_week_rows(week, windows), *_latency_rows(windows),
            *_import_rows(imp), *_persist_rows(persist, week)]
    head = ("| metric | gpuwear | nvitop-exporter | bare | ratio | target | met? |\n"
            "|---|---|---|---|---|---|---|\n")
    rows = [r for r in rows if r[1] != "not run"]  # parts left out with --only
    table = head + "\n".join("| " + " | ".join(r) + " |" for r in rows)
    out = [f"# gpuwear benchmark{' (quick)' if args.quick else ''}", "",
           f"Command: `python bench/run.py{' --quick' if args.quick else ''}"
           f"{'' if args.only == DEFAULT_PARTS else f' --only {args.only}'}"
           f"{'' if Path(args.out) == HERE / 'results.md' else ' --out ' + os.path.relpath(args.out, HERE.parent)}"
           "` · run "
           f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} · took {elapsed / 60:.1f} min", "",
           f"Machine: {info['cpu']}; {info['python']}; {info['os']}; load average at start {load[0]}, at end "
           f"{load[1]} (other work on the machine inflates wall-clock figures, not CPU seconds)", "",
           f"gpuwear {info['gpuwear']}; {info['versions']}", "",
           f"Windows: {s['warmup']} s warm-up, then {s['window']} s measured (psutil user+sys CPU of the process and "
           f"its children); 1 s sampling interval for all three; same scenario file per GPU count. "
           "gw = gpuwear, nvx = nvitop-exporter.", "", table, ""]
    out += details(s, windows, week, persist, imp)
    if ticks:
        out += ["## CPU per tick, in-process (manual clock, the fake's simulation advanced outside the timing; "
                "bare calls and gpuwear's tick timed one after the other, tick by tick)", ""]
        for n, d in ticks.items():
            parts = []
            for key, x in d.items():
                if key == "fake_event_wait":
                    continue
                if "error" in x:
                    parts.append(f"{key}: failed\n```\n{x['error']}\n```")
                else:
                    parts.append(f"{key}: bare calls {x['bare'] * 1e3:.2f} ms, gpuwear {x['tick'] * 1e3:.2f} ms "
                                 f"(Sampler.tick {x['sampler'] * 1e3:.2f}, jobs {x['jobs'] * 1e3:.2f}, "
                                 f"WearTracker.observe {x['tracker'] * 1e3:.2f}), gw/bare {x['tick'] / x['bare']:.2f}")
            out.append(f"- {n} GPUs, {next(iter(d.values())).get('ticks', '?')} ticks: " + "; ".join(parts))
        out += ["- gpuwear_sequential = the same with `sampling.nvml_deadline_seconds: 0` (GPUs read one after the "
                "other on the tick thread instead of on the reader thread that enforces the deadline)", ""]
    if rss:
        out += ["## Where resident memory comes from (RSS increase per import, fresh interpreter)", ""]
        for program, d in rss.items():
            if "error" in d:
                out += [f"- {program}: failed", "```", d["error"][-2000:], "```"]
                continue
            steps = ", ".join(f"{m} +{b / MiB:.1f}" for m, b, _ in d["steps"] if b >= 0.05 * MiB)
            out.append(f"- {program}: interpreter {d['interpreter'] / MiB:.1f} MiB; {steps}; total "
                       f"{d['total'] / MiB:.1f} MiB (shared by every process over the fake: "
                       f"{', '.join(d['shared'])})")
            if program == "gpuwear":
                loaded = d.get("columnar_loaded", [])
                out.append(f"  - numpy / pyarrow (the import command's columnar reader) loaded by the daemon's "
                           f"modules: {', '.join(loaded) if loaded else 'neither'}")
        out.append("")
    return "\n".join(out) + "\n"


def details(s: dict[str, Any], windows: dict[tuple[str, int], Window], week: dict[str, Any] | None,
            persist: dict[int, dict[str, Any]] | None, imp: dict[str, Any] | None) -> list[str]:
    out = ["## Commands", ""]
    seen = set()
    for (tool, n), x in sorted(windows.items(), key=lambda kv: (kv[0][1], TOOLS.index(kv[0][0]))):
        if tool not in seen:
            seen.add(tool)
            out.append(f"- {tool} ({n} GPUs): `{x.command}`")
    out += ["- (each run through `bench/launch.py`, the same entry point plus a SIGUSR1 handler that dumps "
            "`FakeNvmlLibrary.calls`)"]
    if week and "command" in week:
        out.append(f"- week run: `{week['command']}`")
    if imp:
        out.append(f"- import: `{imp['command']}`")
    out.append("")
    out += ["## Where the CPU goes (py-spy, share of on-CPU samples in the window)", ""]
    for (tool, n), x in sorted(windows.items(), key=lambda kv: (kv[0][1], TOOLS.index(kv[0][0]))):
        if x.error:
            out += [f"### {tool}, {n} GPUs: FAILED", "", "```", x.error[-3000:], "```", ""]
            continue
        p = x.profile
        out.append(f"### {tool}, {n} GPUs — {pct(x.cpu_per_s)} of a core, {x.threads} threads, ready after "
                   f"{x.ready_s:.1f} s")
        out.append("")
        if p and p.total:
            comps = ", ".join(f"{k} {v / p.total * 100:.0f} %" for k, v in p.by_component.most_common())
            out.append(f"- {p.total} samples: {comps}")
            if tool == "gpuwear":
                out.append("- gpuwear's own code (stacks not through the fake), % of all samples:")
                out += ["```", *spy.format_top(p, 12, own=True), "```"]
        if x.calls_per_s_by_fn:
            top = sorted(x.calls_per_s_by_fn.items(), key=lambda kv: -kv[1])[:8]
            out.append("- NVML calls/s: " + ", ".join(f"{k} {v:.1f}" for k, v in top))
        if x.scrape:
            sc, sq = x.scrape, x.scrape_seq or {}
            out.append(f"- /metrics: {x.metrics_bytes:,} bytes, {x.metrics_series} samples; concurrent "
                       f"{sc['threads']}×{sc['n'] // sc['threads']}: p50 {sc['p50_ms']:.1f} ms, p99 "
                       f"{sc['p99_ms']:.1f} ms, max {sc['max_ms']:.1f} ms, {sc['per_s']:.0f} scrapes/s, "
                       f"{sc['errors']} errors; sequential ×{sq.get('n', 0)}: p50 {sq.get('p50_ms', 0):.1f} ms, "
                       f"p99 {sq.get('p99_ms', 0):.1f} ms (OpenMetrics, Prometheus' Accept header); sequential with "
                       f"Accept text/plain;version=0.0.4: p50 {(x.scrape_seq_text or {}).get('p50_ms', 0):.1f} ms")
        elif x.metrics_bytes:
            out.append(f"- /metrics: {x.metrics_bytes:,} bytes, {x.metrics_series} samples")
        sp = x.scrape_profile
        if sp and sp.total:
            comps = ", ".join(f"{k} {v / sp.total * 100:.0f} %" for k, v in sp.by_component.most_common())
            out += [f"- py-spy during the concurrent scrapes ({sp.total} samples): {comps}", "```",
                    *spy.format_top(sp, 15), "```"]
        for note in x.notes:
            out.append(f"- {note}")
        out.append("")
    if week:
        out += ["## Simulated week (RSS flatness, ledger growth)", ""]
        if "error" in week:
            out += ["```", week["error"][-3000:], "```", ""]
        else:
            out += [f"- {week['sim_days']:.2f} simulated days in {s['week_window']} s at --speed {week['speed']}, "
                    f"{week['gpus']} GPUs; gpuwear used {pct(week['cpu_per_s'])} of a core meanwhile",
                    f"- RSS (MiB, every second): {week['rss_samples_mib']}",
                    f"- spread of RSS over the second half: {week['rss_second_half_spread'] / MiB:.2f} MiB",
                    f"- ledger bytes {week['ledger_start']} → {week['ledger_end']} (logical = page_count × "
                    "page_size, what the file holds once the WAL is checkpointed); under --speed a save covers "
                    f"{week['speed']:g}× more simulated time than at 1×, so the WAL here is not the write volume "
                    "at 1× (see the persist rows)"]
            mg = week.get("memgrowth")
            if mg and "error" in mg:
                out += ["- in-process heap growth: failed", "```", mg["error"], "```"]
            elif mg:
                out.append(f"- in-process ({mg['tick_seconds']:g} simulated s per tick, as at --speed 20000): object "
                           f"types whose count grew from day 1 to the end: {mg['types_grown']}; allocation sites "
                           f"that grew over the last day: "
                           + ("; ".join(f"{g['size_diff']:+d} B in {g['count_diff']:+d} blocks at "
                                        f"{' < '.join(reversed(g['where']))}" for g in mg["growth"][:5]) or "none"))
            out.append("")
    if persist:
        out += ["## Ledger persist (in-process, manual clock, 1 s ticks, a save every 60 ticks)", ""]
        for n, d in persist.items():
            if "error" in d:
                out += [f"- {n} GPUs: failed", "```", d["error"], "```"]
                continue
            out.append(f"- {n} GPUs, {d['ticks']} ticks: persist p50 {d['persist_p50_ms']:.2f} ms, max "
                       f"{d['persist_max_ms']:.2f} ms; {d['write_per_persist'] / 1024:.1f} KiB written per save → "
                       f"{d['write_per_day_per_gpu'] / MiB:.2f} MiB/day/GPU; files (and logical size) "
                       f"{d['sizes_start']} → {d['sizes_end']}; a tick (sampler + wear tracker, fake advanced once "
                       "per tick) costs "
                       f"{d['tick_cpu_median'] * 1e3:.2f} ms CPU (median) = {d['tick_cpu_median'] * 100:.2f} % "
                       "of a core at 1 Hz")
        out.append("")
    if imp:
        out += ["## Import", ""]
        e = imp["e2e"]
        out.append(f"- file: {imp['rows']:,} rows, {imp['file_bytes'] / MiB:.1f} MiB; CLI: {e['imported']:,} rows "
                   f"imported in {e['wall']:.1f} s wall, {e['cpu']:.1f} s CPU, exit {e['rc']}")
        for mode in ("floats", "csv", "parse", "rows", "columns"):
            d = imp["modes"].get(mode, {})
            if "rows_per_s" in d:
                out.append(f"- {mode}: {d['rows']:,} rows in {d['wall']:.1f} s ({d['rows_per_s']:,.0f} rows/s, "
                           f"{d['problems']} problems)")
        if e["rc"] != 0:
            out += ["```", e["stderr"], "```"]
        p = imp.get("profile")
        if p and p.total:
            comps = ", ".join(f"{k} {v / p.total * 100:.0f} %" for k, v in p.by_component.most_common())
            out += [f"- py-spy of the CLI on {imp['profile_rows']:,} rows ({p.total} samples): {comps}"]
            split = []
            for label, needle in (("read + convert cells (columnar._blocks)", "_blocks (gpuwear/columnar.py)"),
                                  ("order, ranges, readings (columnar._readings)", "_readings (gpuwear/columnar.py)"),
                                  ("wear (batch.integrate)", "integrate (gpuwear/wear/batch.py)"),
                                  ("Ledger.save", "Ledger.save (gpuwear/ledger/store.py)"),
                                  ("module imports (start-up)", "_find_and_load (<frozen importlib._bootstrap>)")):
                share = next((v for k, v in p.top(p.inclusive, 10_000) if k.endswith(needle)), 0.0)
                split.append(f"{label} {share * 100:.0f} %")
            out += ["- time split (inclusive): " + ", ".join(split), "```", *spy.format_top(p, 15), "```"]
        out.append("")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 GPUs only, short windows (about 2 minutes)")
    parser.add_argument("--only", default=DEFAULT_PARTS,
                        help="comma-separated parts to run (cpu, tick, scrape, week, memgrowth, persist, import, rss); "
                             "--quick leaves memgrowth out")
    parser.add_argument("--out", default=str(HERE / "results.md"), help="where to write the table")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, profiles)")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    s = SETTINGS["quick" if args.quick else "full"]
    started = time.monotonic()
    load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="gpuwear-bench-"))
    keep_dir = HERE / "out"
    config = work / "config.yaml"
    config.write_text("sampling:\n  interval_seconds: 1\n")
    counts = sorted(set(s["gpus"]) | set(s["persist"]) | set(s["ticks"]) | {s["week_gpus"]})
    scenarios = {n: gen.scenario(n, work) for n in counts}
    windows: dict[tuple[str, int], Window] = {}
    week = persist = imp = rss = ticks = scrapes = None
    try:
        if "cpu" in parts:
            for n in s["gpus"]:
                for tool in TOOLS:
                    windows[(tool, n)] = measure_window(tool, n, scenarios[n], work, s, config)
        if "tick" in parts:
            ticks = tick_runs(scenarios, work, s)
        if "scrape" in parts:
            scrapes = scrape_runs(s)
        if "week" in parts:
            week = week_run(scenarios[s["week_gpus"]], work, s, config)
        if "memgrowth" in parts and s["memgrowth_days"] and week is not None:
            week["memgrowth"] = mem_growth(scenarios[s["week_gpus"]], work, s["memgrowth_days"])
        if "persist" in parts:
            persist = persist_runs(scenarios, work, s)
        if "import" in parts:
            imp = import_runs(work, s)
        if "rss" in parts:
            rss = rss_imports()
    finally:
        for p in list(Proc.running):
            p.stop()
    elapsed = time.monotonic() - started
    load1 = " ".join(f"{x:.2f}" for x in os.getloadavg())
    report = build_report(args, s, windows, ticks, week, persist, imp, rss, info, (load0, load1), elapsed, scrapes)
    print(report)
    Path(args.out).write_text(report)
    keep_dir.mkdir(exist_ok=True)
    for f in work.glob("*.pyspy.txt"):
        shutil.copy(f, keep_dir / f.name)
    for f in work.glob("*.log"):
        shutil.copy(f, keep_dir / f.name)
    log(f"wrote {args.out}; py-spy profiles and logs in {keep_dir}")
    if args.keep:
        log(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
