"""End to end: the real daemon (simulated GPUs) scraped by a real Prometheus server.

Needs Debian's ``prometheus`` package (``prometheus`` and ``promtool`` on PATH); ./test.sh installs it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import free_ports, logs_on_failure, poll_until, require, started

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
JOB = "gpuwear"

DAEMON_READY_SECONDS = 20.0
PROMETHEUS_READY_SECONDS = 60.0
DAEMON_EXIT_SECONDS = 2.0
POLL_SECONDS = 0.2

# urllib would send even loopback requests through $http_proxy: never use a proxy here.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))

Series = list[dict[str, Any]]






def write_prometheus_config(path: Path, target: str) -> Path:
    """The example config, scraping ``target`` every second."""
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == JOB]
    job["static_configs"] = [{"targets": [target]}]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    rules = REPO / "deploy" / "prometheus" / "gpuwear-rules.yml"  # the example loads the rules beside it
    (path.parent / rules.name).write_text(rules.read_text())
    return path










def _get(url: str) -> str | None:
    try:
        with _HTTP.open(url, timeout=2) as response:
            body: bytes = response.read()
            return body.decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _query(prometheus: str, promql: str) -> Series:
    body = _get(f"http://{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if body is None:
        return []
    reply = json.loads(body)
    assert reply["status"] == "success", f"{promql}: {reply}"
    result: Series = reply["data"]["result"]
    return result


def _labels(series: Series, label: str) -> set[str]:
    return {s["metric"][label] for s in series}


@pytest.mark.slow
@pytest.mark.e2e
def test_prometheus_scrapes_simulated_daemon(tmp_path: Path) -> None:
    prometheus_bin = require("prometheus")
    daemon_port, prometheus_port = free_ports(2)
    daemon_addr, prometheus_addr = f"127.0.0.1:{daemon_port}", f"127.0.0.1:{prometheus_port}"
    daemon_log, prometheus_log = tmp_path / "gpuwear.log", tmp_path / "prometheus.log"
    config = write_prometheus_config(tmp_path / "prometheus.yml", daemon_addr)

    with ExitStack() as stack:
        stack.enter_context(logs_on_failure(daemon_log, prometheus_log))
        daemon = stack.enter_context(started(
            [sys.executable, "-m", "gpuwear", "run", "--simulate", "--listen", daemon_addr,
             "--state-dir", str(tmp_path / "state")],
            daemon_log, tmp_path, stdout_to_log=False))

        def daemon_ready() -> bool | None:
            body = _get(f"http://{daemon_addr}/metrics")
            return True if body is not None and 'gpuwear_backend_info{backend="simulated"' in body else None

        poll_until("the daemon's /metrics", DAEMON_READY_SECONDS, {"gpuwear": daemon}, daemon_ready, POLL_SECONDS)

        prometheus = stack.enter_context(started(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address={prometheus_addr}"],
            prometheus_log, tmp_path, stdout_to_log=True))

        def both_gpus_scraped() -> Series | None:
            series = _query(prometheus_addr, 'gpuwear_temperature_celsius{sensor="gpu"}')
            return series if len(_labels(series, "uuid")) == 2 else None

        poll_until("Prometheus to hold the temperatures of both GPUs", PROMETHEUS_READY_SECONDS,
                   {"gpuwear": daemon, "prometheus": prometheus}, both_gpus_scraped, POLL_SECONDS)

        up = _query(prometheus_addr, f'up{{job="{JOB}"}}')
        assert [s["value"][1] for s in up] == ["1"], up
        assert _query(prometheus_addr, 'gpuwear_backend_info{backend="simulated"}')
        # demo scenario: GPU 0 is an RTX 4090 (fans, no memory temperature), GPU 1 an H100 (HBM temperature, no fans)
        memory = _query(prometheus_addr, 'gpuwear_temperature_celsius{sensor="memory"}')
        assert len(_labels(memory, "uuid")) == 1, memory
        fans = _query(prometheus_addr, "gpuwear_fan_speed_ratio")
        assert fans and _labels(fans, "gpu") == {"0"}, fans
        power = _query(prometheus_addr, "gpuwear_power_watts")
        assert len(power) == 2, power

        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(timeout=DAEMON_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the daemon did not exit within {DAEMON_EXIT_SECONDS:g}s of SIGTERM") from None
        assert code == 0, f"the daemon exited with code {code} on SIGTERM"


@pytest.mark.e2e
@pytest.mark.parametrize("generated", [False, True], ids=["example", "generated"])
def test_promtool_accepts_config(tmp_path: Path, generated: bool) -> None:
    promtool = require("promtool")
    config = write_prometheus_config(tmp_path / "prometheus.yml", "127.0.0.1:9941") if generated else EXAMPLE_CONFIG
    check = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
