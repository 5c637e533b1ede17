#!/usr/bin/env python3
"""A fleet, simulated end to end: N gpuwear daemons, one Prometheus scraping them with the shipped rules, a second
receiving its remote_write (the stand-in for a long-term store), and what that costs per node.

    python bench/fleet.py                                  # full run: 50 nodes x 8 GPUs, 600 s window
    python bench/fleet.py --nodes 3 --gpus 2 --duration 20 --scrape-interval 1 --out /tmp/fleet.md

Everything listens on loopback only. Prints a markdown report and writes it to --out (bench/fleet_results.md).
See bench/README.md ("A fleet") for what is measured and how; tests/test_fleet.py runs the same code, CI-sized.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gen  # noqa: E402
from common import free_port  # noqa: E402

RULES = (ROOT / "deploy" / "prometheus" / "gpuwear-rules.yml", ROOT / "deploy" / "prometheus" / "dcgm-compat-rules.yml")
DASHBOARD = ROOT / "grafana" / "dashboards" / "fleet.json"
JOB = "gpuwear"  # the job name the shipped rules and the dashboard expect
KINDS = ("idle", "training", "stress", "mixed")  # the kinds of node (scenario_doc); by default node i runs KINDS[i % 4]
FROZEN_INTERVAL_SECONDS = 3600.0  # sampling.interval_seconds written before the SIGHUP that stops sampling
MiB = 2**20

# Time limits (wall seconds) of every wait; each fails with a message saying what it waited for.
DAEMON_READY_SECONDS = 60.0  # plus 2 s per node: they start together on few cores
PROMETHEUS_READY_SECONDS = 60.0
DAEMON_EXIT_SECONDS = 15.0
POLL_SECONDS = 0.2
REMOTE_BATCH_DEADLINE_SECONDS = 5.0  # Prometheus' default remote_write queue_config.batch_send_deadline

_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only: never through a proxy


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


T = TypeVar("T")


def poll(what: str, seconds: float, attempt: Callable[[], T | None], check: Callable[[], None] | None = None,
         interval: float = POLL_SECONDS) -> T:
    """Call ``attempt`` until it returns something other than None; ``check`` (raising) first each round, e.g. that
    the processes waited on still run. Raises TimeoutError after ``seconds`` (wall)."""
    deadline = time.monotonic() + seconds
    while True:
        if check is not None:
            check()
        result = attempt()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {seconds:g} s waiting for {what}")
        time.sleep(interval)


# -- HTTP ------------------------------------------------------------------------------------------------------------

def http_get(url: str, timeout: float = 10.0) -> str | None:
    """The body, or None when nothing answers (connection refused, timeout) or the status is not 2xx."""
    try:
        with _HTTP.open(url, timeout=timeout) as response:
            body: bytes = response.read()
            return body.decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


def parse_exposition(text: str) -> dict[str, float]:
    """Sum of the samples of each metric name in a text exposition (labels dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1] if "}" not in line else line.rsplit("}", 1)[1].split()[0])
        except (IndexError, ValueError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


@dataclass
class QueryResult:
    """One PromQL evaluation: wall seconds, result or error."""
    seconds: float
    result: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def api(address: str, path: str, params: dict[str, str] | list[tuple[str, str]], timeout: float = 60.0) -> QueryResult:
    """GET http://address/api/v1/<path>?params; the reply's data (as a list: the result of a query, the values of a
    label, the series), or its error."""
    url = f"http://{address}/api/v1/{path}?" + urllib.parse.urlencode(params)
    started = time.perf_counter()
    try:
        with _HTTP.open(url, timeout=timeout) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        return QueryResult(time.perf_counter() - started, error=f"HTTP {exc.code}: {body[:300]}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return QueryResult(time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - started
    if reply.get("status") != "success":
        return QueryResult(seconds, error=f"{reply.get('errorType')}: {reply.get('error')}")
    data = reply["data"]
    result = data["result"] if isinstance(data, dict) and "result" in data else data
    return QueryResult(seconds, result=list(result))


def instant(address: str, promql: str) -> list[dict[str, Any]]:
    """An instant query that must succeed (RuntimeError otherwise)."""
    q = api(address, "query", {"query": promql})
    if q.error is not None:
        raise RuntimeError(f"{address}: {promql}: {q.error}")
    return q.result


def scalar(address: str, promql: str) -> float | None:
    """The value of a query returning one series, None when it returns none."""
    result = instant(address, promql)
    return float(result[0]["value"][1]) if result else None


def by_label(address: str, promql: str, label: str) -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in instant(address, promql)}


# -- processes -------------------------------------------------------------------------------------------------------

class Proc:
    """A child process in its own process group (so that stopping it stops whatever it started), output to a log."""

    def __init__(self, name: str, args: list[str], log_path: Path, cwd: Path, stage: int) -> None:
        self.name, self.args, self.log_path = name, args, log_path
        self.stage = stage  # the order in which Fleet.close stops its processes
        self.stopping = False
        with log_path.open("wb") as out:
            self.popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=cwd,
                                          start_new_session=True)
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited with code {self.popen.returncode}; last lines of "
                               f"{self.log_path}:\n{tail(self.log_path)}")

    def signal(self, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
            self.stopping = True
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self, timeout: float = DAEMON_EXIT_SECONDS) -> int:
        """SIGTERM the group (unless already sent), SIGKILL after ``timeout`` s; the exit code (negative: the signal
        that ended it)."""
        if not self.stopping:
            self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"{self.name} (pid {self.pid}) did not stop within {timeout:g} s of SIGTERM: killing it")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            return self.popen.wait()


def tail(path: Path, lines: int = 20) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def node_host(i: int) -> str:
    """Node i's own loopback address (127.0.1.1, 127.0.1.2, ...), so that `instance` labels look like a fleet's."""
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


# -- scenarios -------------------------------------------------------------------------------------------------------

def scenario_doc(kind: str, gpus: int, folder: Path) -> dict[str, Any]:
    """A node's simulated GPUs (``gpus`` of them) by kind: phase lengths in simulated seconds.

    idle: RTX 4090 / RTX 6000 Ada workstations doing nothing; training: H100 / A100 in one data-parallel job with
    evaluation pauses; stress: V100 / H100 burn-in, 5 minutes on, 5 off, staggered; mixed: bench/gen.py's mix
    (RTX 4090, H100, V100 training, stress and idle, staggered)."""
    def cards(products: tuple[str, ...], schedule: list[dict[str, Any]], stagger: float) -> list[dict[str, Any]]:
        return [{"product": products[i % len(products)], "offset_seconds": i * stagger, "schedule": schedule}
                for i in range(gpus)]

    if kind == "idle":
        doc = {"ambient_celsius": 24, "gpus": cards(("rtx4090", "rtx6000ada"), [{"kind": "idle", "seconds": 3600}],
                                                    0)}
    elif kind == "training":
        doc = {"ambient_celsius": 30, "gpus": cards(("h100-sxm", "a100-sxm"), [
            {"kind": "train", "seconds": 1800, "utilization": 0.97, "eval_every": 300, "eval_seconds": 30,
             "eval_utilization": 0.3, "job": "llm-pretrain"},
            {"kind": "idle", "seconds": 120}], 0)}
    elif kind == "stress":
        doc = {"ambient_celsius": 33, "gpus": cards(("v100", "h100-sxm"), [
            {"kind": "stress", "seconds": 300, "job": "burn-in"}, {"kind": "idle", "seconds": 300}], 37),
               # an incident for the fleet's answer to count: a double-bit ECC error on each stress node's first card
               "faults": [{"at": 20, "gpu": 0, "kind": "xid", "xid": 48}]}
    elif kind == "mixed":
        doc = yaml.safe_load(gen.scenario(gpus, folder).read_text())
    else:
        raise ValueError(f"unknown node kind {kind!r}")
    doc["description"] = f"fleet node: {kind}, {gpus} GPUs"
    doc.setdefault("faults", [])
    return doc


def write_scenarios(gpus: int, folder: Path) -> dict[str, Path]:
    """One scenario file per kind (nodes of a kind run the same one; each node has its own state directory)."""
    out = {}
    for kind in KINDS:
        path = folder / f"fleet-{kind}.yaml"
        path.write_text(yaml.safe_dump(scenario_doc(kind, gpus, folder), sort_keys=False))
        out[kind] = path
    return out


# -- the fleet -------------------------------------------------------------------------------------------------------

@dataclass
class Options:
    """What one run does. Times are wall seconds unless named simulated."""
    nodes: int = 50
    gpus: int = 8
    duration: float = 600.0  # the measurement window, after warm-up
    speed: float = 10.0  # simulated seconds per wall second
    sampling_interval: float | None = None  # simulated seconds between ticks; None: = speed (a tick per wall second)
    scrape_interval: float = 15.0  # Prometheus' scrape and rule evaluation interval
    warmup_scrapes: int = 4  # scrape intervals waited after every target is up, before the window
    query_repeats: int = 20  # evaluations of each dashboard query per server
    baseline: bool = True  # a Prometheus pair with no targets, to subtract from
    kinds: tuple[str, ...] = KINDS  # node i runs kinds[i % len(kinds)]
    work: Path | None = None  # the work directory (default: a new temporary one, removed at the end)

    @property
    def interval(self) -> float:
        return self.sampling_interval if self.sampling_interval is not None else self.speed


@dataclass
class Node:
    index: int
    kind: str
    scenario: Path
    address: str  # host:port, Prometheus' `instance`
    state: Path
    proc: Proc | None = None
    stopped_code: int | None = None


@dataclass
class Results:
    """Everything measured, for the report and the test."""
    options: Options
    commit: str = ""
    started: str = ""
    machine: dict[str, str] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    up: dict[str, float] = field(default_factory=dict)  # instance -> up at the end of the window
    series_exposed: dict[str, float] = field(default_factory=dict)  # instance -> scrape_samples_scraped
    series_stored: dict[str, float] = field(default_factory=dict)  # instance -> series with that instance label
    servers: dict[str, dict[str, float]] = field(default_factory=dict)  # p1, p2, p0, p0r -> figures
    daemons: dict[str, dict[str, float]] = field(default_factory=dict)  # instance -> rss_bytes, cpu_share
    load: dict[str, Any] = field(default_factory=dict)
    names_p1: set[str] = field(default_factory=set)
    names_p2: set[str] = field(default_factory=set)
    queries: list[dict[str, Any]] = field(default_factory=list)
    lifetime: list[dict[str, Any]] = field(default_factory=list)
    freeze: dict[str, Any] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)  # `gpuwear fleet --json` against p2, the long-term store
    notes: list[str] = field(default_factory=list)
    elapsed: float = 0.0


class Fleet(contextlib.AbstractContextManager["Fleet"]):
    """The nodes and the Prometheus servers of one run; leaving the block stops every process it started."""

    def __init__(self, opts: Options, work: Path) -> None:
        self.opts, self.work = opts, work
        self.procs: list[Proc] = []
        self.nodes: list[Node] = []
        self.prom: dict[str, str] = {}  # p1, p2, p0, p0r -> host:port
        self.prom_procs: dict[str, Proc] = {}
        self.config = work / "gpuwear.yaml"

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process still running, in stages: the daemons (they save their ledgers), then the servers that
        remote_write (they flush to their receivers, which must still be up), then the receivers."""
        for stage in sorted({p.stage for p in self.procs}):
            group = [p for p in self.procs if p.stage == stage]
            for p in group:
                p.signal(signal.SIGTERM)
            for p in group:
                if p.alive():
                    p.stop()
        self.procs.clear()

    def _start(self, name: str, args: list[str], stage: int) -> Proc:
        proc = Proc(name, args, self.work / f"{name}.log", self.work, stage)
        self.procs.append(proc)
        return proc

    def check(self) -> None:
        """Raise when a process of the run has died (one asked to stop is not checked)."""
        for p in self.procs:
            if not p.stopping:
                p.check()

    # daemons
    def write_daemon_config(self, interval: float) -> None:
        self.config.write_text(yaml.safe_dump({"sampling": {"interval_seconds": interval}}, sort_keys=False))

    def start_nodes(self) -> None:
        o = self.opts
        scenarios = write_scenarios(o.gpus, self.work)
        self.write_daemon_config(o.interval)
        for i in range(o.nodes):
            kind = o.kinds[i % len(o.kinds)]
            host = node_host(i)
            scenario = self.work / f"fleet-{kind}-node{i:03d}.yaml"  # the kind's, with the node's own cards (seed)
            scenario.write_text(yaml.safe_dump({**yaml.safe_load(scenarios[kind].read_text()), "seed": i + 1},
                                               sort_keys=False))
            node = Node(i, kind, scenario, f"{host}:{free_port(host)}", self.work / f"node{i:03d}")
            node.proc = self._start(f"node{i:03d}", [
                sys.executable, "-m", "gpuwear", "run", "--simulate", str(node.scenario), "--listen", node.address,
                "--state-dir", str(node.state), "--speed", f"{o.speed:g}", "--config", str(self.config)], 0)
            self.nodes.append(node)
        pending = {n.address for n in self.nodes}

        def all_serving() -> bool | None:
            for address in sorted(pending):
                body = http_get(f"http://{address}/metrics", timeout=5)
                if body is not None and "gpuwear_lifetime_observed_seconds_total" in body:
                    pending.discard(address)
            return True if not pending else None

        poll(f"{o.nodes} daemons to serve their wear metrics", DAEMON_READY_SECONDS + 2 * o.nodes, all_serving,
             self.check, 0.5)

    # Prometheus
    def prometheus_config(self, name: str, targets: list[str], remote_write: str | None) -> Path:
        """The shipped example config and rules, at this run's interval, scraping ``targets``."""
        folder = self.work / name
        folder.mkdir()
        config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
        interval = f"{self.opts.scrape_interval:g}s"
        config["global"].update({"scrape_interval": interval, "evaluation_interval": interval})
        config["rule_files"] = [r.name for r in RULES]
        for rules in RULES:
            (folder / rules.name).write_text(rules.read_text())
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == JOB]
        job["static_configs"] = [{"targets": targets}]
        if remote_write is not None:
            config["remote_write"] = [{"url": f"http://{remote_write}/api/v1/write"}]
        path = folder / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start_prometheus(self, binary: str) -> None:
        """p2 receives p1's remote_write; p0 (same config, no targets) writes to p0r: the baseline pair."""
        names = ("p2", "p1", "p0r", "p0") if self.opts.baseline else ("p2", "p1")
        for name in names:
            self.prom[name] = f"127.0.0.1:{free_port('127.0.0.1')}"
        for name in names:
            tsdb = self.work / name / "tsdb"
            if name in ("p2", "p0r"):
                (self.work / name).mkdir()
                config = self.work / name / "prometheus.yml"
                config.write_text("global: {}\n")
                extra = ["--web.enable-remote-write-receiver"]
            else:
                targets = [n.address for n in self.nodes] if name == "p1" else []
                config = self.prometheus_config(name, targets, self.prom["p2" if name == "p1" else "p0r"])
                extra = []
            self.prom_procs[name] = self._start(name, [
                binary, f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address={self.prom[name]}", *extra], 2 if extra else 1)
        for name, address in self.prom.items():
            poll(f"Prometheus {name} on {address} to be ready", PROMETHEUS_READY_SECONDS,
                 lambda a=address: True if http_get(f"http://{a}/-/ready", 2) is not None else None, self.check)

    def targets(self) -> dict[str, dict[str, Any]]:
        """p1's active targets by instance (empty when p1 does not answer)."""
        body = http_get(f"http://{self.prom['p1']}/api/v1/targets?state=active")
        active = json.loads(body)["data"]["activeTargets"] if body else []
        return {t["labels"]["instance"]: t for t in active}


def last_scrape(target: dict[str, Any]) -> float:
    """Unix seconds of a target's last scrape (Prometheus gives RFC 3339 with nanoseconds)."""
    text = re.sub(r"(\.\d{6})\d+", r"\1", target["lastScrape"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(text).timestamp()


# -- measurements ----------------------------------------------------------------------------------------------------

SERVER_FIGURES = ("prometheus_tsdb_head_series", "prometheus_tsdb_head_samples_appended_total",
                  "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes",
                  "prometheus_remote_storage_samples_total", "prometheus_remote_storage_samples_failed_total",
                  "prometheus_remote_storage_samples_dropped_total", "prometheus_remote_storage_samples_retried_total",
                  "prometheus_remote_storage_samples_pending", "prometheus_remote_storage_bytes_total",
                  "prometheus_remote_storage_shards", "prometheus_remote_storage_highest_timestamp_in_seconds",
                  "prometheus_remote_storage_queue_highest_sent_timestamp_seconds",
                  "prometheus_rule_evaluation_failures_total", "prometheus_rule_group_last_duration_seconds")


def server_figures(address: str, proc: Proc) -> dict[str, float]:
    """A server's own metrics (those above that it has) and its RSS from /proc (bytes)."""
    body = http_get(f"http://{address}/metrics")
    if body is None:
        raise RuntimeError(f"Prometheus at {address} did not serve /metrics")
    values = parse_exposition(body)
    out = {k: values[k] for k in SERVER_FIGURES if k in values}
    out["proc_rss_bytes"] = float(psutil.Process(proc.pid).memory_info().rss)
    out["wall"] = time.time()
    return out


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    t = psutil.cpu_times()
    total = sum(t)
    return total - t.idle - getattr(t, "iowait", 0.0), total


def substitute(expr: str, step: str) -> str:
    """A dashboard query as Grafana sends it with every node and GPU selected: the template variables as `.*` (each
    is used with =~), Grafana's interval variables as ``step``-sized windows."""
    for name, value in (("$__rate_interval", f"{4 * float(step[:-1]):g}s"), ("$__interval", step),
                        ("$__range", "24h"), ("${instance}", ".*"), ("${gpu}", ".*"), ("$instance", ".*"),
                        ("$gpu", ".*")):
        expr = expr.replace(name, value)
    if "$" in expr:
        raise ValueError(f"a variable left in {expr!r}")
    return expr


def dashboard_queries(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    """Every query of the dashboard: panel targets (instant and/or range, as the panel asks) and the template
    variables' label_values() look-ups."""
    board = json.loads(path.read_text())
    out: list[dict[str, Any]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for t in panel.get("targets", []):
                modes = [m for m in ("instant", "range") if t.get(m)] or ["range"]
                for mode in modes:
                    out.append({"panel": panel.get("title", ""), "ref": t.get("refId", ""), "mode": mode,
                                "expr": t["expr"]})

    walk(board["panels"])
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
        if m:
            out.append({"panel": f"variable ${var['name']}", "ref": "", "mode": "label_values",
                        "expr": m.group(1), "label": m.group(2)})
    return out


# Queries that may rightly return nothing on this fleet (the reason): anything else returning nothing is a finding.
MAY_BE_EMPTY = {
    "gpuwear_health_reason{instance=~\"$instance\",gpu=~\"$gpu\"} == 1":
        "only GPUs with a reason behind their verdict have one; simulated healthy cards may have none",
}


def time_queries(address: str, queries: list[dict[str, Any]], repeats: int, scrape_interval: float,
                 range_seconds: float = 86400.0) -> list[dict[str, Any]]:
    """Each query ``repeats`` times, one after the other: median and p95 latency (ms, client side), series
    returned, errors. Range queries cover the dashboard's 24 h at Grafana's step for a ~1000-point panel."""
    step = max(scrape_interval, range_seconds / 1000.0)
    step_text = f"{step:g}"  # seconds: Prometheus takes a float, but not "86.4s"
    out = []
    for q in queries:
        expr = substitute(q["expr"], f"{scrape_interval:g}s")
        times: list[float] = []
        errors: list[str] = []
        count = 0
        for _ in range(repeats):
            now = time.time()
            if q["mode"] == "instant":
                r = api(address, "query", {"query": expr, "time": f"{now:.3f}"})
            elif q["mode"] == "range":
                r = api(address, "query_range", {"query": expr, "start": f"{now - range_seconds:.3f}",
                                                 "end": f"{now:.3f}", "step": step_text})
            else:
                r = api(address, f"label/{q['label']}/values",
                        [("match[]", expr), ("start", f"{now - range_seconds:.3f}"), ("end", f"{now:.3f}")])
            times.append(r.seconds)
            if r.error is not None:
                errors.append(r.error)
            count = len(r.result)
        times.sort()
        out.append({**q, "sent": expr, "median_ms": statistics.median(times) * 1e3,
                    "p95_ms": times[max(0, math.ceil(0.95 * len(times)) - 1)] * 1e3, "series": count,
                    "errors": errors[:1], "error_count": len(errors), "may_be_empty": MAY_BE_EMPTY.get(q["expr"])})
    return out


@dataclass(frozen=True)
class Figure:
    """A lifetime figure compared between the ledgers and Prometheus. ``of_gpu``: its value for one GPU from that
    GPU's `gpuwear report --json` document and its closed rainflow cycles from the ledger ({sensor: {"range:peak":
    count}}); by ``label`` value (a dict) where the metric has one. ``rate``: the most it grows per simulated observed
    second. ``required``: must be exported; others may be left out of the default exposition (reported, not failed)."""
    name: str
    selector: str
    of_gpu: Callable[[dict[str, Any], dict[str, dict[str, float]]], Any]
    rate: float
    unit: str
    required: bool = False
    label: str | None = None


def _closed_cycles_by_range(cycles: dict[str, dict[str, float]]) -> dict[str, float]:
    """Closed die cycles by the metric's range label (the daemon's own bins and labels)."""
    from gpuwear.tracker import CYCLE_RANGES, cycle_range_label

    bins = cycles.get("gpu", {})
    return {cycle_range_label(lo, hi): sum(n for k, n in bins.items() if lo <= int(k.split(":")[0]) < hi)
            for lo, hi in CYCLE_RANGES}


LIFETIME = (
    Figure("observed time", "gpuwear_lifetime_observed_seconds_total", lambda g, c: g["observed_seconds"], 1.0, "s",
           required=True),
    Figure("energy", "gpuwear_lifetime_energy_joules_total", lambda g, c: g["energy_joules"], 1000.0, "J",
           required=True),
    Figure("thermal aging, central (die)", 'gpuwear_thermal_aging_equivalent_seconds{sensor="gpu",band="central"}',
           lambda g, c: g["thermal_aging_equivalent_hours"]["central"] * 3600.0, 25.0, "s", required=True),
    Figure("cycle fatigue, central (die)", 'gpuwear_cycle_fatigue_equivalent_cycles{sensor="gpu",band="central"}',
           lambda g, c: g["cycle_fatigue_equivalent_cycles"]["central"], 10.0, ""),
    Figure("closed thermal cycles (die)", 'gpuwear_lifetime_thermal_cycles_total{sensor="gpu"}',
           lambda g, c: _closed_cycles_by_range(c), 1.0, "", label="range"),
    Figure("throttle time", "gpuwear_lifetime_throttle_seconds_total", lambda g, c: g["throttle_seconds"], 1.0, "s",
           label="reason"),
    Figure("busy time", "gpuwear_lifetime_busy_seconds_total", lambda g, c: g["busy_seconds"], 1.0, "s"),
    Figure("time at the power limit", "gpuwear_lifetime_power_limit_seconds_total",
           lambda g, c: g["power_limit_seconds"], 1.0, "s"),
)
ROUNDING = 0.0005  # `gpuwear report --json` rounds most figures to 3 decimals: per GPU and figure


@dataclass
class Ledgers:
    """One node's ledger: its report document, and the closed cycles of each GPU (by UUID)."""
    report: dict[str, Any]
    cycles: dict[str, dict[str, dict[str, float]]]


def read_ledger(node: Node, config: Path) -> Ledgers:
    """A node's ledger read with the project's own code: `gpuwear report --json` run in this process through the
    CLI's entry point, and the closed rainflow cycles (the report gives closed plus open residue) from the Ledger."""
    from gpuwear.cli import main as gpuwear_main
    from gpuwear.config import load_config
    from gpuwear.ledger import Ledger

    files = sorted((node.state / "simulated").glob("*/ledger.sqlite"))
    if len(files) != 1:
        raise RuntimeError(f"node {node.index}: expected one simulated ledger in {node.state}, found {files}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = gpuwear_main(["report", "--json", "--simulated", files[0].parent.name, "--state-dir",
                             str(node.state), "--config", str(config)])
    if code != 0:
        raise RuntimeError(f"node {node.index}: gpuwear report --json exited with {code}")
    ledger = Ledger.open_read_only(files[0])
    try:
        wears = ledger.load_all(load_config(str(config)).wear.cycles.hysteresis_celsius)
    finally:
        ledger.close()
    return Ledgers(json.loads(out.getvalue()), {u: {s: dict(b) for s, b in w.cycles.items()} for u, w in wears.items()})


def compare_lifetime(fleet: Fleet, ledgers: dict[str, Ledgers], window: float,
                     declared: set[str]) -> list[dict[str, Any]]:
    """Each lifetime figure summed over the nodes' ledgers against sum(last value) in p1 and in p2.

    After the freeze the last scrape of every node saw its final state, so p1 and p2 must equal each other exactly
    and the ledgers must equal p1 within the report's rounding, except for what the stop adds: a sample held back as
    a suspected spike is integrated at stop. So observed time may grow by at most one sampling interval per GPU, and
    every other figure by at most its largest rate times the observed time that the ledgers hold beyond p1. A
    figure with a label is compared over the label values Prometheus holds (the default exposition keeps some)."""
    gpus = sum(len(x.report["gpus"]) for x in ledgers.values())
    extra_observed = 0.0  # simulated s the ledgers hold beyond p1 (the first figure is observed time)
    out = []
    for fig in LIFETIME:
        by = f"instance, {fig.label}" if fig.label else "instance"
        promql = f"sum by ({by}) (last_over_time({fig.selector}[{int(window)}s]))"
        held = {server: [s for s in instant(fleet.prom[server], promql) if s["metric"].get("instance") in ledgers]
                for server in ("p1", "p2")}
        values = sorted({s["metric"].get(fig.label, "") for srv in held.values() for s in srv}) if fig.label else []
        ledger_by_node = {}
        for addr, x in ledgers.items():
            total = 0.0
            for g in x.report["gpus"]:
                v = fig.of_gpu(g, x.cycles.get(g["uuid"], {}))
                total += sum(v.get(k, 0.0) for k in values) if fig.label else v
            ledger_by_node[addr] = total
        ledger = sum(ledger_by_node.values())
        per_node = {srv: {} for srv in held}  # type: dict[str, dict[str, float]]
        for srv, series in held.items():
            for s in series:
                per_node[srv][s["metric"]["instance"]] = per_node[srv].get(s["metric"]["instance"], 0.0) \
                    + float(s["value"][1])
        p1 = sum(per_node["p1"].values()) if per_node["p1"] else None
        p2 = sum(per_node["p2"].values()) if per_node["p2"] else None
        tolerance = gpus * (ROUNDING + fleet.opts.interval) if not out else gpus * ROUNDING + fig.rate * extra_observed
        tolerance += 1e-9 * abs(ledger)
        family = fig.selector.split("{")[0]
        if p1 is None and p2 is None and family in declared and abs(ledger) <= gpus * ROUNDING:
            verdict = "PASS (no series yet, 0 in the ledgers)"
        elif p1 is None and p2 is None and family not in declared and not fig.required:
            verdict = "not exported"
        elif p1 is None or p2 is None or abs(p1 - p2) > 1e-9 * max(1.0, abs(p1)) or abs(ledger - p1) > tolerance:
            verdict = "FAIL"
        else:
            verdict = "PASS"
        if not out and p1 is not None:
            extra_observed = max(0.0, ledger - p1)
        worst = max(((abs(ledger_by_node[a] - v), a) for a, v in per_node["p1"].items()), default=None)
        name = f"{fig.name} ({fig.label}: {', '.join(values)})" if fig.label and values else fig.name
        out.append({"figure": name, "metric": fig.selector, "unit": fig.unit, "ledgers": ledger, "p1": p1, "p2": p2,
                    "tolerance": tolerance, "verdict": verdict, "ok": verdict != "FAIL",
                    "nodes_in_p1": len(per_node["p1"]), "nodes_in_p2": len(per_node["p2"]), "worst_node": worst})
    return out


# -- one run ---------------------------------------------------------------------------------------------------------

def run(opts: Options) -> Results:
    """Start the fleet, measure, freeze, stop and compare; every process is stopped on leaving, whatever happened."""
    if opts.nodes < 1 or opts.gpus < 1:
        raise ValueError("--nodes and --gpus must be at least 1")
    if not opts.kinds or set(opts.kinds) - set(KINDS):
        raise ValueError(f"kinds must be among {', '.join(KINDS)}")
    binary = _which("prometheus")
    res = Results(opts, commit=_commit(), started=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  machine=_machine())
    t_start = time.monotonic()
    work = opts.work or Path(tempfile.mkdtemp(prefix="gpuwear-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    try:
        _measure(opts, res, work, t_start, binary, load0)
    except BaseException:
        log(f"failed: the logs of every process are in {work}")
        raise
    if opts.work is None:
        shutil.rmtree(work, ignore_errors=True)
    res.elapsed = time.monotonic() - t_start
    return res


def _measure(opts: Options, res: Results, work: Path, t_start: float, binary: str,
             load0: tuple[float, float, float]) -> None:
    with Fleet(opts, work) as fleet:
        log(f"work directory {work}; starting {opts.nodes} daemons ({opts.gpus} GPUs each, speed {opts.speed:g}, "
            f"sampling every {opts.interval:g} simulated s)")
        fleet.start_nodes()
        res.nodes = fleet.nodes
        log(f"daemons serving after {time.monotonic() - t_start:.0f} s; starting Prometheus")
        fleet.start_prometheus(binary)
        p1 = fleet.prom["p1"]
        poll(f"p1 to scrape all {opts.nodes} nodes successfully", 3 * opts.scrape_interval + 30,
             lambda: True if scalar(p1, f'count(up{{job="{JOB}"}} == 1)') == opts.nodes else None, fleet.check)
        warm = opts.warmup_scrapes * opts.scrape_interval
        log(f"all nodes up in p1; warm-up {warm:g} s, then a {opts.duration:g} s window")
        time.sleep(warm)  # a fixed warm-up: series and chunks settle
        before = {n: server_figures(a, fleet.prom_procs[n]) for n, a in fleet.prom.items()}
        cpu0 = {n.address: cpu_seconds(n.proc.pid) for n in fleet.nodes if n.proc}
        busy0 = machine_busy()
        peak_rss: dict[str, float] = {}
        end = time.monotonic() + opts.duration
        while (left := end - time.monotonic()) > 0:  # the window: a progress line (and RSS peaks) every 30 s
            time.sleep(min(30.0, left))
            fleet.check()
            for n in fleet.prom:
                peak_rss[n] = max(peak_rss.get(n, 0.0), psutil.Process(fleet.prom_procs[n].pid).memory_info().rss)
            log(f"window: {max(0.0, end - time.monotonic()):.0f} s left; load {_load()}; p1 RSS "
                f"{peak_rss['p1'] / MiB:.0f} MiB")
        after = {n: server_figures(a, fleet.prom_procs[n]) for n, a in fleet.prom.items()}
        busy1 = machine_busy()
        for node in fleet.nodes:
            assert node.proc is not None
            p = psutil.Process(node.proc.pid)
            res.daemons[node.address] = {
                "rss_bytes": float(p.memory_info().rss),
                "cpu_share": (cpu_seconds(node.proc.pid) - cpu0[node.address]) / (after["p1"]["wall"]
                                                                                  - before["p1"]["wall"])}
        res.load = {"start": load0, "window_end": os.getloadavg(),
                    "machine_busy_share": (busy1[0] - busy0[0]) / max(1e-9, busy1[1] - busy0[1]),
                    "cores": psutil.cpu_count()}
        res.servers = _server_summary(before, after, peak_rss)
        res.up = by_label(p1, f'up{{job="{JOB}"}}', "instance")
        res.series_exposed = by_label(p1, f'scrape_samples_scraped{{job="{JOB}"}}', "instance")
        res.series_stored = by_label(p1, 'count by (instance) ({instance=~".+"})', "instance")
        log("timing the dashboard's queries on p1 and p2")
        queries = dashboard_queries()
        res.queries = ([{**q, "server": "p1"} for q in time_queries(p1, queries, opts.query_repeats,
                                                                    opts.scrape_interval)]
                       + [{**q, "server": "p2"} for q in time_queries(fleet.prom["p2"], queries, opts.query_repeats,
                                                                      opts.scrape_interval)])
        res.freeze = freeze_and_stop(fleet)
        ledgers = {n.address: read_ledger(n, fleet.config) for n in fleet.nodes}
        wait_remote_write(fleet, res.freeze["stopped_at"])
        res.names_p1 = set(instant_names(p1))
        res.names_p2 = set(instant_names(fleet.prom["p2"]))
        res.lifetime = compare_lifetime(fleet, ledgers, time.monotonic() - t_start + 60, res.freeze["declared"])
        log("the fleet's answer: gpuwear fleet against p2")
        res.answer = fleet_answer(fleet.prom["p2"], time.monotonic() - t_start + 3600)
        res.notes += findings(res)


def fleet_answer(address: str, span: float) -> dict[str, Any]:
    """`gpuwear fleet --json` against the store at ``address`` over the last ``span`` seconds, through the CLI's
    entry point in this process (its queries, seconds and bytes with it)."""
    from gpuwear.cli import main as gpuwear_main

    out = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out):
        code = gpuwear_main(["fleet", "--prometheus", f"http://{address}", "--span", f"{int(span)}s", "--json"])
    if code != 0:
        raise RuntimeError(f"gpuwear fleet exited with {code}")
    doc: dict[str, Any] = json.loads(out.getvalue())
    doc["cost"]["seconds"] = time.monotonic() - t0
    return doc


def findings(res: Results) -> list[str]:
    """What in the run is wrong, in words (empty when nothing is)."""
    out = []
    down = sorted(a for a, v in res.up.items() if v != 1) + sorted({n.address for n in res.nodes} - set(res.up))
    if down:
        out.append(f"nodes not up in p1 at the end of the window: {down}")
    for kind, counts in series_by_kind(res).items():  # one gpuwear_job_info per GPU running a job may come and go
        if max(counts) - min(counts) > res.options.gpus:
            out.append(f"nodes of kind {kind} (same scenario) expose numbers of series further apart than one per "
                       f"GPU: {sorted(counts)}")
    by = {(q["panel"], q["ref"], q["mode"], q["server"]): q for q in res.queries}
    for q in res.queries:
        if q["server"] == "p1":
            status = query_status(q, by.get((q["panel"], q["ref"], q["mode"], "p2"), {}))
            if not status.startswith("ok"):
                out.append(f"dashboard query {q['panel']} {q['ref']} ({q['mode']}): {status}")
    if res.names_p1 != res.names_p2:
        out.append(f"metric names only in p1: {sorted(res.names_p1 - res.names_p2)}, only in p2: "
                   f"{sorted(res.names_p2 - res.names_p1)}")
    for x in res.lifetime:
        if not x["ok"]:
            out.append(f"lifetime figure {x['figure']}: ledgers {x['ledgers']:.3f}, p1 {x['p1']}, p2 {x['p2']}, "
                       f"tolerance {x['tolerance']:.3f}; worst node {x['worst_node']}")
    if res.freeze.get("moved_after_last_scrape"):
        out.append(f"observed time moved after the last scrape on {res.freeze['moved_after_last_scrape']}")
    codes = {a: c for a, c in res.freeze.get("exit_codes", {}).items() if c != 0}
    if codes:
        out.append(f"daemons that did not exit 0 on SIGTERM: {codes}")
    p1 = res.servers.get("p1", {})
    for key in ("prometheus_remote_storage_samples_failed_total", "prometheus_remote_storage_samples_dropped_total",
                "prometheus_rule_evaluation_failures_total"):
        if p1.get(key):
            out.append(f"p1 {key} = {p1[key]:g}")
    return out


def instant_names(address: str) -> list[str]:
    q = api(address, "label/__name__/values", {})
    if q.error is not None:
        raise RuntimeError(f"{address}: metric names: {q.error}")
    return [str(x) for x in q.result]


def freeze_and_stop(fleet: Fleet) -> dict[str, Any]:
    """Stop sampling on every node (sampling.interval_seconds = 3600 and SIGHUP: the daemon keeps serving its last
    state), wait for p1 to scrape each node once more, check that each serves the observed time p1 last scraped, then
    SIGTERM them (each saves its ledger) and wait. Also collects the metric families the daemons declare.

    Then the last value p1 holds of every lifetime series is the final state the ledger saves (bar a held-back
    sample, see compare_lifetime), with no window between the last scrape and the stop to allow for."""
    p1, interval = fleet.prom["p1"], fleet.opts.scrape_interval
    fleet.write_daemon_config(FROZEN_INTERVAL_SECONDS)
    for node in fleet.nodes:
        assert node.proc is not None
        node.proc.signal(signal.SIGHUP)
    reloaded: dict[str, float] = {}

    def all_reloaded() -> bool | None:
        for node in fleet.nodes:
            if node.address not in reloaded and "SIGHUP: reloaded" in node.proc.log_path.read_text(errors="replace"):  # type: ignore[union-attr]
                reloaded[node.address] = time.time()
        return True if len(reloaded) == len(fleet.nodes) else None

    poll("every daemon to log its SIGHUP reload", 30, all_reloaded, fleet.check)
    frozen_at = max(reloaded.values()) + 1.0  # a tick that was in flight at the reload has ended by then

    def scraped_after_freeze() -> bool | None:
        t = fleet.targets()
        fresh = [a for a in reloaded if a in t and last_scrape(t[a]) > frozen_at and t[a]["health"] == "up"]
        return True if len(fresh) == len(reloaded) else None

    poll("p1 to scrape every node after it stopped sampling", 2 * interval + 30, scraped_after_freeze, fleet.check,
         min(1.0, interval / 4))
    # the check of the freeze: each daemon's tick count now equals the last one p1 holds
    observed = "gpuwear_lifetime_observed_seconds_total"
    held = by_label(p1, f'sum by (instance) (last_over_time({observed}{{job="{JOB}"}}[5m]))', "instance")
    served, declared = {}, set()
    for node in fleet.nodes:
        body = http_get(f"http://{node.address}/metrics") or ""
        served[node.address] = parse_exposition(body).get(observed, math.nan)
        declared |= set(re.findall(r"^# TYPE (\S+)", body, re.MULTILINE))
    moved = sorted(a for a in served if not math.isclose(served[a], held.get(a, math.nan), rel_tol=1e-12))
    for node in fleet.nodes:
        assert node.proc is not None
        node.proc.signal(signal.SIGTERM)
    for node in fleet.nodes:
        assert node.proc is not None
        node.stopped_code = node.proc.stop()
    stopped_at = time.time()
    return {"frozen_at": frozen_at, "stopped_at": stopped_at, "moved_after_last_scrape": moved, "declared": declared,
            "exit_codes": {n.address: n.stopped_code for n in fleet.nodes}}


def wait_remote_write(fleet: Fleet, since: float) -> None:
    """Wait until p1 has sent p2 every sample up to ``since`` (Unix s).

    p1 goes on scraping the stopped nodes (up = 0 samples) and evaluating rules, so samples keep coming and each
    shard holds its batch up to the batch deadline: ``samples_pending`` is seldom 0 for long. Once the highest sent
    timestamp passes ``since``, every sample before it has been read from the WAL into a shard, and each shard sends
    what it holds within the deadline. So: wait for that, then for pending to read 0 or one deadline (plus a scrape
    interval) to pass, whichever comes first."""
    p1 = fleet.prom["p1"]
    passed: list[float] = []

    def caught_up() -> bool | None:
        v = parse_exposition(http_get(f"http://{p1}/metrics") or "")
        if not passed:
            if v.get("prometheus_remote_storage_queue_highest_sent_timestamp_seconds", 0.0) <= since:
                return None
            passed.append(time.monotonic())
        pending = v.get("prometheus_remote_storage_samples_pending", 0.0)
        flushed = time.monotonic() - passed[0] > REMOTE_BATCH_DEADLINE_SECONDS + fleet.opts.scrape_interval
        return True if flushed or pending == 0 else None

    poll("p1's remote_write to reach p2 past the stop", 2 * fleet.opts.scrape_interval + 60, caught_up, fleet.check)
    log(f"p1's remote_write passed the stop; {time.monotonic() - passed[0]:.1f} s more for its shards to flush")


def _server_summary(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                    peak_rss: dict[str, float]) -> dict[str, dict[str, float]]:
    out = {}
    for name in after:
        b, a = before[name], after[name]
        seconds = a["wall"] - b["wall"]
        fig = dict(a)
        fig["window_seconds"] = seconds
        fig["appended_per_second"] = (a.get("prometheus_tsdb_head_samples_appended_total", 0.0)
                                      - b.get("prometheus_tsdb_head_samples_appended_total", 0.0)) / seconds
        fig["remote_sent_per_second"] = (a.get("prometheus_remote_storage_samples_total", 0.0)
                                         - b.get("prometheus_remote_storage_samples_total", 0.0)) / seconds
        fig["peak_proc_rss_bytes"] = max(peak_rss.get(name, 0.0), a["proc_rss_bytes"])
        out[name] = fig
    return out


def _which(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise RuntimeError(f"`{tool}` is not on PATH: install Debian's prometheus package")
    return path


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "daemon", "deploy", "grafana", "bench"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes in daemon/, deploy/, grafana/ or bench/)" if dirty else "")


def _machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    prom = subprocess.run([_which("prometheus"), "--version"], capture_output=True, text=True,
                          check=False).stdout.splitlines()
    return {"cpu": cpu, "cores": str(psutil.cpu_count()), "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
            "os": platform.platform(), "python": platform.python_version(),
            "prometheus": prom[0] if prom else "unknown"}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- the report ------------------------------------------------------------------------------------------------------

def per_node(res: Results) -> dict[str, float]:
    """The headline figures per node (and per GPU): differences against the baseline pair where there is one."""
    o, s = res.options, res.servers
    n = o.nodes
    base = s.get("p0", {})
    base_r = s.get("p0r", {})

    def diff(server: dict[str, float], baseline: dict[str, float], key: str) -> float:
        return (server.get(key, 0.0) - baseline.get(key, 0.0)) / n

    exposed = list(res.series_exposed.values())
    return {
        "series_exposed": statistics.mean(exposed) if exposed else 0.0,
        "series_stored": statistics.mean(res.series_stored.values()) if res.series_stored else 0.0,
        "head_series": diff(s["p1"], base, "prometheus_tsdb_head_series"),
        "scraped_per_second": (statistics.mean(exposed) if exposed else 0.0) / o.scrape_interval,
        "appended_per_second": diff(s["p1"], base, "appended_per_second"),
        "p1_rss": diff(s["p1"], base, "proc_rss_bytes"),
        "p1_heap": diff(s["p1"], base, "go_memstats_heap_inuse_bytes"),
        "p2_head_series": diff(s["p2"], base_r, "prometheus_tsdb_head_series"),
        "p2_appended_per_second": diff(s["p2"], base_r, "appended_per_second"),
        "p2_rss": diff(s["p2"], base_r, "proc_rss_bytes"),
        "p2_heap": diff(s["p2"], base_r, "go_memstats_heap_inuse_bytes"),
        "remote_sent_per_second": s["p1"].get("remote_sent_per_second", 0.0) / n,
        "daemon_rss": statistics.median(d["rss_bytes"] for d in res.daemons.values()),
        "daemon_cpu": statistics.median(d["cpu_share"] for d in res.daemons.values()),
    }


def series_by_kind(res: Results) -> dict[str, list[float]]:
    """Exposed series of each node, grouped by the node's kind (nodes of a kind run the same scenario)."""
    out: dict[str, list[float]] = {}
    for node in res.nodes:
        out.setdefault(node.kind, []).append(res.series_exposed.get(node.address, math.nan))
    return out


def command_line(o: Options) -> str:
    parts = ["python bench/fleet.py", f"--nodes {o.nodes}", f"--gpus {o.gpus}", f"--duration {o.duration:g}",
             f"--speed {o.speed:g}", f"--scrape-interval {o.scrape_interval:g}"]
    if o.sampling_interval is not None:
        parts.append(f"--sampling-interval {o.sampling_interval:g}")
    if not o.baseline:
        parts.append("--no-baseline")
    if o.kinds != KINDS:
        parts.append(f"--kinds {','.join(o.kinds)}")
    return " ".join(parts)


def report(res: Results) -> str:
    o, f = res.options, per_node(res)
    g = o.gpus
    mib = lambda b: f"{b / MiB:.1f} MiB"  # noqa: E731
    lines = [f"# gpuwear fleet: {o.nodes} nodes × {g} simulated GPUs", "",
             f"`{command_line(o)}` — {res.started}, commit {res.commit}, {res.elapsed / 60:.1f} min in all", "",
             f"Machine: {res.machine.get('cpu')}, {res.machine.get('cores')} cores, {res.machine.get('memory')}; "
             f"{res.machine.get('os')}; Python {res.machine.get('python')}; {res.machine.get('prometheus')}.", "",
             f"Each node: one `gpuwear run --simulate` daemon on its own loopback address, {g} GPUs, at --speed "
             f"{o.speed:g}, sampling every {o.interval:g} simulated s (one tick per "
             f"{max(o.interval / o.speed, 0.02):g} wall s); kinds in turn {', '.join(o.kinds)} (`scenario_doc`). "
             f"p1: Prometheus scraping every node every {o.scrape_interval:g} s with "
             "deploy/prometheus/gpuwear-rules.yml and "
             f"dcgm-compat-rules.yml (evaluated every {o.scrape_interval:g} s), remote_write to p2 "
             "(`--web.enable-remote-write-receiver`, no scrapes, no rules)."
             + (" p0 → p0r: the same pair with no targets, measured in the same run; per-node server figures are "
                "(p1 − p0) / nodes and (p2 − p0r) / nodes." if o.baseline else "")
             + f" Figures at the end of a {res.servers['p1']['window_seconds']:.0f} s window after "
             f"{o.warmup_scrapes} scrape intervals of warm-up.", "",
             "## Per node", "",
             "| figure | per node | per GPU | whole fleet |", "|---|---|---|---|",
             f"| series exposed (`scrape_samples_scraped`) | {f['series_exposed']:.0f} | {f['series_exposed'] / g:.1f} "
             f"| {f['series_exposed'] * o.nodes:.0f} |",
             f"| series in p1 with the node's `instance` (exposed + `up`/`scrape_*` + recording rules + ALERTS) | "
             f"{f['series_stored']:.0f} | {f['series_stored'] / g:.1f} | {f['series_stored'] * o.nodes:.0f} |",
             f"| p1 head series (`prometheus_tsdb_head_series`, less p0) | {f['head_series']:.0f} | "
             f"{f['head_series'] / g:.1f} | {res.servers['p1'].get('prometheus_tsdb_head_series', 0):.0f} |",
             f"| samples/s scraped (exposed ÷ {o.scrape_interval:g} s) | {f['scraped_per_second']:.1f} | "
             f"{f['scraped_per_second'] / g:.2f} | {f['scraped_per_second'] * o.nodes:.0f} |",
             f"| samples/s appended in p1 (`prometheus_tsdb_head_samples_appended_total`, rules included) | "
             f"{f['appended_per_second']:.1f} | {f['appended_per_second'] / g:.2f} | "
             f"{res.servers['p1']['appended_per_second']:.0f} |",
             f"| p1 resident memory (/proc, less p0) | {mib(f['p1_rss'])} | {mib(f['p1_rss'] / g)} | "
             f"{mib(res.servers['p1']['proc_rss_bytes'])} (peak {mib(res.servers['p1']['peak_proc_rss_bytes'])}) |",
             f"| p1 Go heap in use (less p0) | {mib(f['p1_heap'])} | {mib(f['p1_heap'] / g)} | "
             f"{mib(res.servers['p1'].get('go_memstats_heap_inuse_bytes', 0))} |",
             f"| remote_write samples/s sent (p1) | {f['remote_sent_per_second']:.1f} | "
             f"{f['remote_sent_per_second'] / g:.2f} | {res.servers['p1']['remote_sent_per_second']:.0f} |",
             f"| p2 head series (less p0r) | {f['p2_head_series']:.0f} | {f['p2_head_series'] / g:.1f} | "
             f"{res.servers['p2'].get('prometheus_tsdb_head_series', 0):.0f} |",
             f"| p2 samples/s appended (received) | {f['p2_appended_per_second']:.1f} | "
             f"{f['p2_appended_per_second'] / g:.2f} | {res.servers['p2']['appended_per_second']:.0f} |",
             f"| p2 resident memory (/proc, less p0r) | {mib(f['p2_rss'])} | {mib(f['p2_rss'] / g)} | "
             f"{mib(res.servers['p2']['proc_rss_bytes'])} |",
             f"| daemon resident memory (median of nodes) | {mib(f['daemon_rss'])} | | "
             f"{mib(sum(d['rss_bytes'] for d in res.daemons.values()))} |",
             f"| daemon CPU, share of a core (median of nodes) | {f['daemon_cpu'] * 100:.2f} % | | "
             f"{sum(d['cpu_share'] for d in res.daemons.values()) * 100:.0f} % |", ""]
    p1 = res.servers["p1"]
    lines += [f"Remote write over the window: {p1.get('prometheus_remote_storage_samples_failed_total', 0):.0f} "
              f"failed, {p1.get('prometheus_remote_storage_samples_dropped_total', 0):.0f} dropped, "
              f"{p1.get('prometheus_remote_storage_samples_retried_total', 0):.0f} retried (totals since start); "
              f"{p1.get('prometheus_remote_storage_shards', 0):.0f} shard(s). Rule evaluation failures in p1: "
              f"{p1.get('prometheus_rule_evaluation_failures_total', 0):.0f}. Baseline p0 (no targets): "
              f"{mib(res.servers.get('p0', {}).get('proc_rss_bytes', 0))} RSS, "
              f"{res.servers.get('p0', {}).get('prometheus_tsdb_head_series', 0):.0f} series; p0r "
              f"{mib(res.servers.get('p0r', {}).get('proc_rss_bytes', 0))}.", "",
              "Series exposed per node, by kind (nodes of a kind run the same scenario, each at its own simulated "
              "time: `gpuwear_job_info` exists only while a GPU runs a job, so counts may differ by up to one per "
              "GPU): "
              + "; ".join(f"{k}: {min(v):.0f}" + (f"–{max(v):.0f}" if max(v) > min(v) else "")
                          for k, v in series_by_kind(res).items())
              + ". Nodes up in p1: " + f"{sum(1 for v in res.up.values() if v == 1)} of {o.nodes}.", "",
              f"Load: load average {' '.join(f'{x:.2f}' for x in res.load['start'])} at the start, "
              f"{' '.join(f'{x:.2f}' for x in res.load['window_end'])} at the end of the window; the machine's CPUs "
              f"were {res.load['machine_busy_share'] * 100:.0f} % busy over the window ({res.load['cores']} cores).",
              ""]
    lines += ["## fleet.json queries, over the whole fleet", "",
              f"Each query {o.query_repeats} times in a row, client-side latency; every node and GPU selected "
              "(`$instance`, `$gpu` → `.*`); range queries over the dashboard's 24 h at a step of "
              f"{max(o.scrape_interval, 86.4):g} s.", "",
              "| panel | mode | p1 median / p95 ms | p2 median / p95 ms | series p1 / p2 | status |",
              "|---|---|---|---|---|---|"]
    by = {(q["panel"], q["ref"], q["mode"], q["server"]): q for q in res.queries}
    for q in (q for q in res.queries if q["server"] == "p1"):
        q2 = by.get((q["panel"], q["ref"], q["mode"], "p2"), {})
        lines.append(f"| {q['panel']} {q['ref']} | {q['mode']} | {q['median_ms']:.1f} / {q['p95_ms']:.1f} | "
                     f"{q2.get('median_ms', math.nan):.1f} / {q2.get('p95_ms', math.nan):.1f} | "
                     f"{q['series']} / {q2.get('series', 0)} | {query_status(q, q2)} |")
    lines += ["", "<details><summary>the queries as sent</summary>", ""]
    lines += [f"- {q['panel']} {q['ref']} ({q['mode']}): `{q['sent']}`" for q in res.queries if q["server"] == "p1"]
    lines += ["", "</details>", ""]
    fr = res.freeze
    lines += ["## Lifetime figures: the ledgers against Prometheus", "",
              "Sampling stopped on every node (SIGHUP with sampling.interval_seconds 3600: the daemons go on serving "
              "their last state), p1 scraped each node once more, then SIGTERM (each saves its ledger). Ledgers read "
              "with `gpuwear report --json` (the CLI's own code, in process) and summed over GPUs and nodes; "
              "Prometheus: `sum(last_over_time(METRIC[…]))` in p1 and in p2 once p1's remote_write had passed the "
              "stop. Expected: p1 = p2 exactly; ledgers = p1 within the report's rounding (0.0005 per GPU), plus "
              "what a sample held back as a suspected spike and integrated at stop adds: observed time at most one "
              f"sampling interval ({o.interval:g} simulated s) per GPU, the other figures at most their largest rate "
              "(1000 W, 25× aging, ...) times the observed time the ledgers hold beyond p1. \"not exported\": "
              "absent from the default exposition (`metrics.detail`), so not compared.", "",
              "Nodes whose observed time moved after p1's last scrape (should be none): "
              f"{fr.get('moved_after_last_scrape') or 'none'}; daemon exit codes: "
              f"{sorted(set(fr.get('exit_codes', {}).values()), key=str)}.", "",
              "| figure | sum of ledgers | sum in p1 | sum in p2 | tolerance | result |", "|---|---|---|---|---|---|"]
    for x in res.lifetime:
        p1v, p2v = x["p1"], x["p2"]
        lines.append(f"| {x['figure']} (`{x['metric']}`) | {x['ledgers']:,.3f} {x['unit']} | "
                     f"{'missing' if p1v is None else f'{p1v:,.3f}'} | {'missing' if p2v is None else f'{p2v:,.3f}'} "
                     f"| ±{x['tolerance']:,.3f} | {x['verdict']} |")
    names_only_p1 = sorted(res.names_p1 - res.names_p2)
    names_only_p2 = sorted(res.names_p2 - res.names_p1)
    lines += ["", f"Metric names: p1 {len(res.names_p1)}, p2 {len(res.names_p2)}; "
              f"only in p1: {names_only_p1 or 'none'}; only in p2: {names_only_p2 or 'none'}.", ""]
    a = res.answer
    if a:
        cost = a["cost"]
        stress = sum(1 for n in res.nodes if n.kind == "stress")
        found = sum(p["total"]["incidents"] for p in a["products"])
        lines += ["## The fleet's answer (`gpuwear fleet --json` against p2)", "",
                  f"{len(a['cards'])} cards of {o.nodes * g} from its {a['source']}; {found} incident(s) found, "
                  f"{stress} scripted (an XID 48 on each stress node's first card); {cost['queries']} queries, "
                  f"{cost['bytes']:,} bytes read, {cost['seconds']:.2f} s. The queries are as many whatever the "
                  f"fleet's size; the bytes grow with the cards ({cost['bytes'] / max(1, len(a['cards'])):.0f} a "
                  "card here: on paper, 8,000 cards read about "
                  f"{cost['bytes'] / max(1, len(a['cards'])) * 8000 / MiB:.0f} MiB and 80,000 about "
                  f"{cost['bytes'] / max(1, len(a['cards'])) * 80000 / MiB:.0f} MiB, each query's series as many as "
                  "the cards).", ""]
    lines += ["## Findings", "", *(f"- {n}" for n in res.notes or ["none: every check above passed"]), ""]
    return "\n".join(lines)


def query_status(q1: dict[str, Any], q2: dict[str, Any]) -> str:
    """ok, or what is wrong: errors, or nothing returned where something should be."""
    problems = []
    for server, q in (("p1", q1), ("p2", q2)):
        if q.get("error_count"):
            problems.append(f"{server}: {q['error_count']} errors ({q['errors'][0][:120]})")
        elif not q.get("series") and not q.get("may_be_empty"):
            problems.append(f"{server}: EMPTY")
    if problems:
        return "; ".join(problems)
    return "ok" if q1.get("series") else f"ok (empty: {q1.get('may_be_empty')})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50, help="simulated nodes (daemons); default 50")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs per node; default 8")
    parser.add_argument("--duration", type=float, default=600.0, help="measurement window, wall seconds; default 600")
    parser.add_argument("--speed", type=float, default=10.0, help="simulated seconds per wall second; default 10")
    parser.add_argument("--sampling-interval", type=float, help="simulated seconds between the daemons' ticks "
                        "(default: --speed, i.e. one tick per wall second as in production)")
    parser.add_argument("--scrape-interval", type=float, default=15.0, help="Prometheus scrape and rule evaluation "
                        "interval, seconds; default 15")
    parser.add_argument("--warmup-scrapes", type=int, default=4, help="scrape intervals before the window; default 4")
    parser.add_argument("--repeats", type=int, default=20, help="evaluations of each dashboard query; default 20")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated node kinds, taken in turn; "
                        f"default {','.join(KINDS)}")
    parser.add_argument("--no-baseline", action="store_true", help="no baseline Prometheus pair (figures per node "
                        "are then whole-server figures / nodes)")
    parser.add_argument("--out", default=str(HERE / "fleet_results.md"), help="markdown report; default "
                        "bench/fleet_results.md")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (logs, ledgers, TSDBs)")
    args = parser.parse_args(argv)
    opts = Options(nodes=args.nodes, gpus=args.gpus, duration=args.duration, speed=args.speed,
                   sampling_interval=args.sampling_interval, scrape_interval=args.scrape_interval,
                   warmup_scrapes=args.warmup_scrapes, query_repeats=args.repeats, baseline=not args.no_baseline,
                   kinds=tuple(args.kinds.split(",")),
                   work=Path(args.keep) if args.keep else None)
    signal.signal(signal.SIGTERM, _interrupted)  # `kill` of a background run cleans up like Ctrl-C
    res = run(opts)
    text = report(res)
    print(text)
    Path(args.out).write_text(text + "\n")
    log(f"wrote {args.out}")
    failed = [x["figure"] for x in res.lifetime if not x["ok"]]
    return 1 if failed else 0


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
